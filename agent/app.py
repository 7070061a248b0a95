"""The application context: where the home is, and lazily opened config and ledger.

Commands receive an ``App``; library functions receive the pieces they need (a Ledger, a
Config, a Path), so they can be tested without the CLI.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from agent.ledger import Ledger, ledger_path

if TYPE_CHECKING:  # agent.config costs ~8 ms of import: only a tick that reads the config pays it
    from agent.config import Config


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


def ensure_home(home: Path) -> Path:
    """Create the home with mode 0700 (it holds logs and specs of production errors)."""
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(home, 0o700)
    return home


@dataclass
class App:
    home: Path
    config_file: Path | None = None
    _config: Config | None = field(default=None, repr=False)
    _ledger: Ledger | None = field(default=None, repr=False)

    @property
    def config_path(self) -> Path:
        return self.config_file or self.home / "config.yaml"

    @property
    def config(self) -> Config:
        if self._config is None:
            from agent.config import load_config

            self._config = load_config(self.config_path, required=self.config_file is not None)
        return self._config

    @property
    def ledger(self) -> Ledger:
        if self._ledger is None:
            ensure_home(self.home)
            self._ledger = Ledger.open(ledger_path(self.home))
        return self._ledger

    def path(self, *parts: str) -> Path:
        """A folder under the home (created on demand), e.g. app.path("lanes")."""
        p = self.home.joinpath(*parts)
        p.mkdir(parents=True, exist_ok=True)
        return p

    def close(self) -> None:
        if self._ledger is not None:
            self._ledger.close()
            self._ledger = None
