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


@click.command()
@json_option
@click.option("--html", "html_file", type=click.Path(dir_okay=False), help="Also write a self-contained HTML page.")
def status(as_json, html_file):
    """Errors, tasks and PRs by state; gate-blocked tasks with their reason and reset command.

    \b
    Example:
      agent status
      agent status --html status.html
    """
    from pathlib import Path

    from agent.status import gather, render_html, render_text

    ledger = get_app().ledger
    data = gather(ledger)
    if html_file:
        Path(html_file).write_text(render_html(ledger, data), encoding="utf-8")
        data["html"] = str(Path(html_file).resolve())
    emit(data, as_json, lambda d: click.echo(render_text(d) + (f"\n\nwrote {d['html']}" if html_file else "")))
