"""`agent init`, `agent status`, `agent demo`, `agent doctor`."""

from __future__ import annotations

import click

from agent.cli.common import emit, get_app, json_option


@click.command()
@json_option
def init(as_json):
    """Create the home, the ledger (WAL) and a commented config.yaml. Idempotent.

    \b
    Example:
      AGENT_HOME=~/agent-home agent init
    """
    from agent.app.home import init_home

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

    from agent.app.status import gather, render_html, render_text, status_config, write_page

    app = get_app()
    ledger = app.ledger   # a home or ledger that cannot be opened is the one error, not a config warning first
    config, problem = status_config(app)
    if problem:
        click.echo(f"status: {problem}", err=True)
    data = gather(ledger, app.home, config=config)
    data["config_error"] = problem   # status works without the config (the line above said so); JSON says it too
    if html_file:
        data["html"] = write_page(Path(html_file), render_html(ledger, data))
    emit(data, as_json, lambda d: click.echo(render_text(d) + (f"\n\nwrote {d['html']}" if html_file else "")))


@click.command()
@click.option("--dir", "directory", type=click.Path(file_okay=False),
              help="An empty or new folder for the demo (default: a new temporary folder).")
@json_option
def demo(directory, as_json):
    """Run the whole path on an embedded example project, offline, ending in a draft PR.

    It makes a project with a real bug and a failing test, a local bare remote, a home with its own ledger and
    config (DIR/home, not your usual home), ingests an error, decides it, and runs the fixer with scripted stand-in
    lanes (plain scripts, no model, no API key). The scripted reviewer rejects round 1 so a second round shows.

    \b
    Example:
      agent demo
      agent demo --dir /tmp/agent-demo
    """
    import tempfile
    from pathlib import Path

    from agent.app.demo import run_demo

    root = Path(directory).resolve() if directory else Path(tempfile.mkdtemp(prefix="agent-demo-"))
    result = run_demo(root, echo=(lambda s: click.echo(s, err=True)) if as_json else click.echo)
    emit(result, as_json)


@click.command()
@json_option
@click.option("--online", is_flag=True, help="Also ask GitHub who the token belongs to (GET /user) and "
              "ls-remote network remotes.")
def doctor(as_json, online):
    """Check git, the ledger, the config, each lane (binary, version, auth), forge credentials and disk.

    Exits 1 listing every problem with its fix; 0 when healthy. It only looks: nothing is created or migrated.

    \b
    Example:
      agent doctor
      agent doctor --online --json
    """
    from agent.app.doctor import render_text, run_doctor

    app = get_app()
    app.require_home()
    result = run_doctor(app.home, app.config_path, config_required=app.config_file is not None, online=online)
    emit(result, as_json, lambda r: click.echo(render_text(r)))
    if not result["ok"]:
        raise click.exceptions.Exit(1)
