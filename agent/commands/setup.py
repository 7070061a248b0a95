"""`agent init` (and later doctor, demo, status)."""

from __future__ import annotations

import click

from agent.commands.common import emit, get_app, json_option


@click.command()
@json_option
def init(as_json):
    """Create the home, the ledger (WAL) and a commented config.yaml. Idempotent.

    \b
    Example:
      AGENT_HOME=~/agent-home agent init
    """
    from agent.setup import init_home

    result = init_home(get_app())
    emit(result, as_json, lambda r: click.echo(
        f"home {r['home']}\nledger {r['ledger']} (schema {r['schema']}, journal {r['journal_mode']})\n"
        f"config {r['config']}{' (created)' if r['config_created'] else ''}"))
