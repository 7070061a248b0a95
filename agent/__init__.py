"""agent: turns production errors into reviewed draft pull requests."""

__version__ = "0.1.0"


class AgentError(Exception):
    """A refusal or failure with a one-line, human-actionable message (exit code 1)."""
