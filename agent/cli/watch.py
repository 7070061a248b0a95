"""`agent watch SCAN`: one-shot scans for cron, and `agent watch all` (the registry is ``agent.app.scans``)."""

from __future__ import annotations

import click

from agent.cli.common import emit, get_app, json_option
from agent.app.scans import SCANS, news, run_scan


def _print(items):
    for line in news(items):
        click.echo(line)


def run_scans(names: list[str], jobs: int, as_json: bool) -> None:
    """Run scans in order and print them; SIGINT/SIGTERM stop like the daemon (agent.infra.shutdown), then exit 128+N."""
    from agent.coord.runners import beat, stop
    from agent.infra.shutdown import STOP, graceful_stop

    app = get_app()
    app.require_home()
    beat(app.ledger, app.home, lambda line: click.echo(f"agent: {line}", err=True))  # alive (`agent runners`)
    items: list[dict] = []
    with graceful_stop(lambda line: click.echo(line, err=True), grace=app.shutdown_grace) as stopping:
        for name in names:
            if STOP.is_set():
                break
            items.extend(run_scan(app, name, jobs=jobs))
    stop(app.ledger, app.home)   # a clean stop (a scan that raised leaves it alive until its pid is gone: dead)
    emit(items, as_json, _print)
    if stopping.signum:
        click.echo(f"agent: stopped by {stopping.name}; the running step was recorded, the next scan goes on",
                   err=True)
        raise click.exceptions.Exit(stopping.exit_code)


class WatchGroup(click.Group):
    def list_commands(self, ctx):
        return list(SCANS) + ["all"]

    def get_command(self, ctx, name):
        if name == "all":
            return watch_all
        if name not in SCANS:
            return None

        @click.command(name, help=SCANS[name][1] + "\n\n\b\nExample:\n  agent watch " + name)
        @click.option("--jobs", type=int, default=1, show_default=True, help="Tasks advanced in parallel.")
        @json_option
        def one(jobs, as_json):
            run_scans([name], jobs, as_json)

        return one


@click.group(cls=WatchGroup)
def watch():
    """One-shot scans for cron: each can be killed at any point and the next one continues.

    SIGINT/SIGTERM (Ctrl-C) lets the running step finish and record itself, then exits 130/143; a second signal kills
    running lanes (recorded as interrupted; the next scan runs them again).

    \b
    Example:
      */5 * * * * agent watch all
    """


@click.command("all")
@click.option("--jobs", type=int, default=1, show_default=True, help="Tasks advanced in parallel.")
@json_option
def watch_all(jobs, as_json):
    """Run every scan once, in order.

    \b
    Example:
      agent watch all --json
    """
    run_scans(list(SCANS), jobs, as_json)


@click.command()
@click.option("--interval", type=float, default=60.0, show_default=True, help="Seconds between passes.")
@click.option("--jobs", type=int, default=1, show_default=True, help="Tasks advanced in parallel.")
@click.option("--max-ticks", type=int, help="Stop after N passes (for tests and benchmarks).")
@click.option("--serve", "with_serve", is_flag=True, help="Also run `agent serve` in this process.")
@click.option("--host", default="127.0.0.1", show_default=True, help="With --serve: address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True,
              help="With --serve: TCP port.")
@click.option("--public", is_flag=True, help="With --serve: allow a non-loopback --host without "
                                             "serve.read_token_env (prints a warning).")
@click.option("--no-forkserver", is_flag=True, help="Do not start the fork server, which runs `agent lane run` "
                                                    "for this home without Python's start and imports.")
def daemon(interval, jobs, max_ticks, with_serve, host, port, public, no_forkserver):
    """Loop `agent watch all` until SIGTERM/SIGINT.

    The first signal stops new work and lets the running step finish; a second one kills running lanes.
    With --serve the webhook/status/metrics server runs in the same process and stops with it.
    While it runs, its fork server (HOME/run/forkserver.sock) starts `agent lane run` for this home in a
    process that has already imported what a lane run needs.

    \b
    Example:
      agent daemon --interval 60 --jobs 4 --serve --port 8080
    """
    from agent.app.daemon import run_daemon
    from agent.cli.forkserver import running

    app = get_app()
    app.require_home()
    with running(app.home, click.echo, enabled=not no_forkserver):
        run_daemon(app, interval=interval, jobs=jobs, max_ticks=max_ticks, echo=click.echo,
                   serve=(host, port) if with_serve else None, public=public)
