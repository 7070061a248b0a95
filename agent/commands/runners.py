"""`agent runners`: the runners sharing this ledger, their heartbeats and the tasks each holds."""

from __future__ import annotations

import click

from agent.commands.common import emit, get_app, json_option


@click.command()
@json_option
def runners(as_json):
    """Runners sharing the ledger: id, host, home, pid, last heartbeat, alive or stale, tasks held.

    A runner is a home on a host (id: AGENT_RUNNER_ID, else HOSTNAME:CRC32-OF-HOME); every scan, daemon pass and
    running lane beats its heartbeat. Stale: no heartbeat for 3 task leases (6 min). A task held by a stale runner
    is taken over by another runner once its lease expires.

    \b
    Example:
      agent runners
      agent runners --json
    """
    from agent.fence import runners as list_runners
    from agent.status import runner_lines

    app = get_app()
    rows = list_runners(app.ledger)

    def human(rows):
        if not rows:
            click.echo("no runner has registered yet (every `agent watch` and `agent daemon` pass registers one)")
            return
        click.echo("\n".join(line[2:] if not line.startswith("    ") else line for line in runner_lines(rows)))

    emit(rows, as_json, human)
