"""The application context: the home (found by agent.app.homedir), and lazily opened config and ledger.

Commands receive an ``App``; library functions receive the pieces they need (a Ledger, a
Config, a Path), so they can be tested without the CLI.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from agent.ledger import Ledger, ledger_path, use_config_file

if TYPE_CHECKING:  # agent.config costs ~8 ms of import: only a tick that reads the config pays it
    from agent.config import Config


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

    def require_home(self) -> Path:
        """Refuse a home that does not exist: only `agent init` creates one (a mistyped AGENT_HOME must not
        silently become a new, empty home that every scan and status then calls healthy)."""
        if not self.home.is_dir():
            from agent import AgentError

            what = "is not a folder" if self.home.exists() else "does not exist"
            raise AgentError(f"home {self.home} {what}; check AGENT_HOME / --home, or run `agent init` to create "
                             "a new home there")
        return self.home

    @property
    def config(self) -> Config:
        if self._config is None:
            self.require_home()
            from agent.config import CONFIG_CACHE, load_config
            from agent.config.repo import check_open_tasks

            # the home's own config.yaml is kept parsed in the home (never a --config file's text: it may live
            # somewhere more private than the home)
            config = load_config(self.config_path, required=self.config_file is not None,
                                 cache=self.home / CONFIG_CACHE if self.config_file is None else None)
            where = self.ledger_location
            if isinstance(where, str) or where.is_file():  # a config must still serve the tasks that are open
                from agent.ledger.tasks import open_task_needs

                check_open_tasks(config, self.home, open_task_needs(self.ledger), str(self.config_path))
            self._config = config
        return self._config

    def shutdown_grace(self) -> float:
        """``limits.shutdown_grace``: of the config already loaded, else of the config file alone (no ledger read:
        it is asked when a signal comes); the default when the config does not load, since stopping must not
        depend on a config being fixed."""
        from agent.infra.shutdown import DEFAULT_GRACE_S

        try:
            config = self._config
            if config is None:
                from agent.config import load_config

                config = load_config(self.config_path, required=self.config_file is not None)
            return float(config.limits.shutdown_grace)
        except Exception:  # noqa: BLE001 - any failure to load the config: the default
            return float(DEFAULT_GRACE_S)

    def config_problem(self) -> str | None:
        """Why the config file cannot be used (its one line), or None: for commands that work without it
        (`status`, listings), which still say so."""
        from agent.config import ConfigError, load_config

        try:
            load_config(self.config_path, required=self.config_file is not None)
        except ConfigError as exc:
            return str(exc)
        return None

    def reload_config(self) -> Config:
        """Read the config file again (the daemon does before every pass)."""
        self._config = None
        return self.config

    @property
    def ledger_location(self) -> Path | str:
        """``AGENT_LEDGER_URL``, else ``ledger.url`` of this App's config file (read as raw YAML: the full config
        needs the ledger, never the other way round), else ``home/ledger.db``."""
        if self.config_file is not None:   # threads and scans that open their own connection resolve the same
            use_config_file(self.home, self.config_file)
        return ledger_path(self.home)

    @property
    def ledger(self) -> Ledger:
        if self._ledger is None:
            self.require_home()
            self._ledger = Ledger.open(self.ledger_location)
        return self._ledger

    def path(self, *parts: str) -> Path:
        """A folder under the home (created on demand), e.g. app.path("lanes")."""
        p = self.require_home().joinpath(*parts)
        p.mkdir(parents=True, exist_ok=True)
        return p

    def close(self) -> None:
        if self._ledger is not None:
            self._ledger.close()
            self._ledger = None
