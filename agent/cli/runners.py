"""`agent runners`: the runners sharing this ledger, their heartbeats and what each holds; `--prune` removes the
stale ones that hold nothing."""

from __future__ import annotations

import click

from agent.cli.common import emit, get_app, json_option


@click.command()
@json_option
@click.option("--prune", is_flag=True, help="Remove stale runners that hold nothing (no task claim, no named "
              "lease) and print them; each removal is a runner.pruned event.")
@click.option("--older-than", "older_than", metavar="DURATION",
              help="With --prune: remove runners silent for longer than this (90s, 30m, 12h, 7d) instead of the "
              "stale threshold (3 task leases, 6m).")
def runners(as_json, prune, older_than):
    """Runners sharing the ledger: id, host, state and why, clock offset, what each holds; --prune drops gone ones.

    A runner is a home on a machine (id: AGENT_RUNNER_ID, else HOSTNAME:CRC32 of the machine id, the home's random
    id and its path); every scan, daemon pass, waiting daemon and running lane beats its heartbeat on the ledger's
    clock. State: alive; stopped (a clean stop); dead (on this machine: its pid with its start time is gone; its
    claims are free at once); silent (no heartbeat for 3 task leases, 6 min; on another machine, or a pid that
    stopped beating). A clock more than 5 s off the ledger's is flagged. `agent doctor` warns about dead and silent
    runners. Rows of runners that are gone stay until --prune removes them; a runner that still holds a task claim
    or a named lease is never removed, and a pruned runner that comes back registers again.

    \b
    Example:
      agent runners
      agent runners --json
      agent runners --prune
      agent runners --prune --older-than 7d --json
    """
    from agent.coord.runners import parse_duration
    from agent.coord.runners import prune as prune_runners
    from agent.coord.runners import runners as list_runners
    from agent.app.status import runner_lines

    if older_than is not None and not prune:
        raise click.exceptions.UsageError("--older-than goes with --prune")
    app = get_app()
    if prune:
        limit = parse_duration(older_than) if older_than is not None else None
        removed = prune_runners(app.ledger, limit)

        def pruned(rows):
            if not rows:
                click.echo("no runner removed: none is stale and idle (`agent runners` shows who holds what)")
            for r in rows:
                click.echo(f"removed {r['id']}  {r['host']}  {r['home']}  last heartbeat {r['heartbeat_at']}")

        emit(removed, as_json, pruned)
        return
    rows = list_runners(app.ledger)

    def human(rows):
        if not rows:
            click.echo("no runner has registered yet (every `agent watch` and `agent daemon` pass registers one)")
            return
        click.echo("\n".join(line[2:] if not line.startswith("    ") else line for line in runner_lines(rows)))

    emit(rows, as_json, human)
