"""The application layer: the context (home, config, ledger), the scan registry, the daemon, the demo, doctor,
status, the server and the bench. Imports flows and everything below; the CLI imports it."""
