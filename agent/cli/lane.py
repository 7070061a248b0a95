"""`agent lane list` and `agent lane run`: see and run lanes by hand."""

from __future__ import annotations

from pathlib import Path

import click

from agent.cli.common import emit, get_app, json_option


@click.group()
def lane():
    """Lanes: CLI coding agents (codex, claude, ..., or any command) run on a spec."""


@lane.command("list")
@json_option
def lane_list(as_json):
    """List vendors with the roles they serve, whether the binary is found, and its version.

    \b
    Example:
      agent lane list --json
    """
    from agent.lanes.lane import list_lanes

    app = get_app()
    rows = list_lanes(app.config, app.path("lanes"))

    def human(rows):
        width = max((len(r["vendor"]) for r in rows), default=8)
        for r in rows:
            found = r["path"] or "NOT FOUND"
            roles = ",".join(r["roles"]) or "-"
            click.echo(f"{r['vendor']:<{width}}  {r['kind']:<8} roles={roles:<30} {found}  {r['version'] or ''}"
                       .rstrip())

    emit(rows, as_json, human)


@lane.command("run")
@click.option("--role", required=True, type=click.Choice(
    ["implementer", "reviewer", "pr-quality", "pr-logic", "decider"]), help="The lane's role.")
@click.option("--vendor", help="Vendor to run (default: lanes.ROLE.vendor in config).")
@click.option("--spec-file", required=True, type=click.Path(exists=True, dir_okay=False),
              help="The spec the agent works from.")
@click.option("--cwd", default=".", show_default=True, type=click.Path(exists=True, file_okay=False),
              help="Working directory (the worktree).")
@click.option("--timeout", type=click.IntRange(1), help="Seconds before the lane is killed (default: config).")
@json_option
def lane_run(role, vendor, spec_file, cwd, timeout, as_json):
    """Run one lane by hand and print its outcome; exits 1 unless the agent gave a valid report.

    \b
    Example:
      agent lane run --role reviewer --vendor claude --spec-file spec.md --cwd ./repo --json
    """
    import time

    from agent import AgentError
    from agent.lanes.lane import LaneNotConfigured, LaneRequest, run_lane
    from agent.lanes.progress import LaneProgress

    app = get_app()
    deadline = time.time() + timeout if timeout else None
    try:
        with LaneProgress(f"{role} {vendor or ''}".strip()) as progress:
            result = run_lane(LaneRequest(config=app.config, home=app.home, ledger=app.ledger, role=role,
                                          vendor=vendor, spec_path=Path(spec_file), cwd=Path(cwd), deadline=deadline,
                                          on_progress=progress))
    except LaneNotConfigured as exc:  # this command, unlike watch, can name the vendor itself
        raise AgentError(f"{exc}, or pass --vendor") from None

    def human(d):
        click.echo(f"lane run {d['run_id']}: {d['role']} {d['vendor']} -> {d['status']}"
                   + (f" ({d['verdict']})" if d["verdict"] else ""))
        if d["summary"]:
            click.echo(f"summary: {d['summary']}")
        if d["findings"] is not None:
            click.echo(f"findings: {d['findings']}")
            if d["findings_text"]:
                click.echo(d["findings_text"])
        for rep in d["repairs"]:
            click.echo(f"{rep['label']}: {rep['outcome']}")
        click.echo(f"session: {d['session_id'] or '-'}  exit: {d['exit_code']}  cost: ${d['cost']:.4f}  "
                   f"logs: {d['log_dir']}")

    emit(result.to_json(), as_json, human)
    if not result.ok:
        raise AgentError(f"lane {result.status}: {result.reason or 'no valid report'}")
