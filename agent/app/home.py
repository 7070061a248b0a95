"""Setting up a home: folders, ledger, a commented config."""

from __future__ import annotations

import os

from agent.app.context import App, ensure_home
from agent.config import DEFAULT_CONFIG
from agent.ledger import SCHEMA_VERSION


def init_home(app: App) -> dict:
    from agent.coord.runners import home_id

    ensure_home(app.home)  # the one command that creates a home
    home_id(app.home, create=True)   # the random half of this runner's id (fence.runner_id), made once
    ledger = app.ledger  # opens (and migrates) or refuses a bad file
    config_created = False
    if not app.config_path.exists():
        fd = os.open(app.config_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(DEFAULT_CONFIG)
        config_created = True
    app.config  # validate what is there
    return {
        "home": str(app.home),
        "ledger": str(ledger.path),
        "schema": SCHEMA_VERSION,
        "journal_mode": ledger.journal_mode(),
        "config": str(app.config_path),
        "config_created": config_created,
    }
