"""Where the home is (``--home``, ``AGENT_HOME``, the user data dir): a leaf that imports only ``os`` and ``sys``,
so the console script's fork-server client (agent.app.forkclient) finds the home without importing the ledger, or
even pathlib (~3 ms of a fresh process's start)."""

from __future__ import annotations

import os
import sys


def default_home_path() -> str:
    """The platform's user data directory for agent."""
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or os.path.join(os.path.expanduser("~"), "AppData", "Local")
    elif sys.platform == "darwin":
        base = os.path.join(os.path.expanduser("~"), "Library", "Application Support")
    else:
        base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "agent")


def home_path(home: str | os.PathLike | None) -> str:
    """The home: ``home`` (``--home``), else ``AGENT_HOME``, else the user data dir; absolute, links resolved."""
    if home:
        return os.path.realpath(os.path.expanduser(os.fspath(home)))
    if os.environ.get("AGENT_HOME"):
        return os.path.realpath(os.path.expanduser(os.environ["AGENT_HOME"]))
    return default_home_path()


def resolve_home(home: str | os.PathLike | None):
    """``home_path`` as a ``pathlib.Path``."""
    from pathlib import Path

    return Path(home_path(home))
