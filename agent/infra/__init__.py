"""Infrastructure every layer may use: the process runner, the HTTP module, redaction, text and input decoding,
shutdown. Imports nothing of agent but ``agent.AgentError``."""
