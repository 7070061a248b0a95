"""`agent watch SCAN`: one-shot scans for cron, and `agent watch all`.

A scan is a function ``scan(app, jobs=1) -> list[dict]`` returning one item per thing it touched;
each item has a human ``line``.  The registry maps scan names to ``module:function`` in the order
`watch all` runs them; a scan's module is imported only when that scan runs.
"""

from __future__ import annotations

import importlib
import os

import click

from agent.commands.common import emit, get_app, json_option

SCANS: dict[str, tuple[str, str]] = {
    # name: (module:function, one-line help)
    "errors": ("agent.intake.sources:scan", "Pull configured error sources (cursor persisted)."),
    "error-decide": ("agent.decide:decide_scan", "Run the decider lane on undecided errors past the thresholds."),
    "error-fix": ("agent.fixer:fix_scan", "Turn confirmed error.fix conclusions into tasks with worktrees."),
    "pr-feedback": ("agent.feedback:scan_pr_feedback",
                    "Read reviews, review comments and CI on open agent PRs; they start the next round."),
    "error-fix-work": ("agent.fixer:work_scan", "Drive every open task through the chain as far as it can go now."),
    "pr-merged": ("agent.followup:scan_pr_merged", "Follow PR states (merged, closed, branch pruning); retry owed PR texts; remove finished worktrees."),
    "notify": ("agent.notify:scan", "Deliver pending notifications (outbox), retrying failed ones with backoff."),
}


def run_scan(app, name: str, jobs: int = 1) -> list[dict]:
    """Run one scan under its file lock; a scan already running elsewhere is skipped with a line saying so."""
    from agent.fence import ScanBusy, scan_lock

    module, attr = SCANS[name][0].split(":")
    try:
        with scan_lock(app.home, name) as lock:
            items = getattr(importlib.import_module(module), attr)(app, jobs=jobs)
        if lock.took_over and lock.took_over.get("pid") != os.getpid():
            items.insert(0, {"line": f"scan {name}: took the lock over from pid {lock.took_over.get('pid')} "
                                     "(dead, or no heartbeat within its lease)"})
    except ScanBusy as exc:
        items = [{"skipped": True, "line": f"{exc}; skipped"}]
    for item in items:
        item.setdefault("scan", name)
    return items


def news(items) -> list[str]:
    """The lines to print for ``items``: a ``quiet`` item (nothing changed: a PR still open, a task waiting for
    the same reason as last time, a source with nothing new) prints nothing, so a cron tick mails only news."""
    return [item.get("line") or str(item) for item in items if not item.get("quiet")]


def _print(items):
    for line in news(items):
        click.echo(line)


def run_scans(names: list[str], jobs: int, as_json: bool) -> None:
    """Run scans in order and print them; SIGINT/SIGTERM stop like the daemon (agent.shutdown), then exit 128+N."""
    from agent.shutdown import STOP, graceful_stop

    from agent.fence import beat

    app = get_app()
    app.require_home()
    beat(app.ledger, app.home)  # this runner is alive (`agent runners`)
    items: list[dict] = []
    with graceful_stop(lambda line: click.echo(line, err=True)) as stopping:
        for name in names:
            if STOP.is_set():
                break
            items.extend(run_scan(app, name, jobs=jobs))
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
def daemon(interval, jobs, max_ticks, with_serve, host, port):
    """Loop `agent watch all` until SIGTERM/SIGINT.

    The first signal stops new work and lets the running step finish; a second one kills running lanes.
    With --serve the webhook/status/metrics server runs in the same process and stops with it.

    \b
    Example:
      agent daemon --interval 60 --jobs 4 --serve --port 8080
    """
    from agent.daemon import run_daemon

    run_daemon(get_app(), interval=interval, jobs=jobs, max_ticks=max_ticks, echo=click.echo,
               serve=(host, port) if with_serve else None)
