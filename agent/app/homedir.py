"""Where the home is (``--home``, ``AGENT_HOME``, the user data dir): a leaf that imports only the standard
library, so the console script's fork-server client (agent.cli.forkserver) finds the home without importing the
ledger."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def default_home() -> Path:
    """The platform's user data directory for agent."""
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = str(Path.home() / "Library" / "Application Support")
    else:
        base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "agent"


def resolve_home(home: str | os.PathLike | None) -> Path:
    if home:
        return Path(home).expanduser().resolve()
    if os.environ.get("AGENT_HOME"):
        return Path(os.environ["AGENT_HOME"]).expanduser().resolve()
    return default_home()
