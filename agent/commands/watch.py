"""`agent watch SCAN`: one-shot scans for cron, and `agent watch all`.

A scan is a function ``scan(app, jobs=1) -> list[dict]`` returning one item per thing it touched;
each item has a human ``line``.  The registry maps scan names to ``module:function`` in the order
`watch all` runs them; a scan's module is imported only when that scan runs.
"""

from __future__ import annotations

import importlib

import click

from agent.commands.common import emit, get_app, json_option

SCANS: dict[str, tuple[str, str]] = {
    # name: (module:function, one-line help)
    "errors": ("agent.intake.sources:scan", "Pull configured error sources (cursor persisted)."),
    "error-decide": ("agent.decide:decide_scan", "Run the decider lane on undecided errors past the thresholds."),
}


def run_scan(app, name: str, jobs: int = 1) -> list[dict]:
    module, attr = SCANS[name][0].split(":")
    items = getattr(importlib.import_module(module), attr)(app, jobs=jobs)
    for item in items:
        item.setdefault("scan", name)
    return items


def _print(items):
    for item in items:
        click.echo(item.get("line") or str(item))


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
            emit(run_scan(get_app(), name, jobs=jobs), as_json, _print)

        return one


@click.group(cls=WatchGroup)
def watch():
    """One-shot scans for cron: each can be killed at any point and the next one continues.

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
    app = get_app()
    items: list[dict] = []
    for name in SCANS:
        items.extend(run_scan(app, name, jobs=jobs))
    emit(items, as_json, _print)
