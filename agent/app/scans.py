"""The scan registry: what `agent watch SCAN`, `agent watch all`, the daemon and the demo run.

A scan is a function ``scan(app, jobs=1) -> list[dict]`` returning one item per thing it touched; each item has a
human ``line``. ``SCANS`` maps scan names to ``module:function`` in the order `watch all` runs them; a scan's
module is imported only when that scan runs. This module is below the CLI layer (``agent.cli`` imports it,
never the other way), so the daemon and the demo run scans without importing any command.
"""

from __future__ import annotations

import importlib
import os

SCANS: dict[str, tuple[str, str]] = {
    # name: (module:function, one-line help)
    "errors": ("agent.intake.sources:scan", "Pull configured error sources (cursor persisted)."),
    "error-decide": ("agent.flows.decide:decide_scan", "Run the decider lane on undecided errors past the thresholds."),
    "error-fix": ("agent.flows.fixer.scans:fix_scan", "Turn confirmed error.fix conclusions into tasks with worktrees."),
    "pr-feedback": ("agent.flows.feedback:scan_pr_feedback",
                    "Read reviews, review comments and CI on open agent PRs; they start the next round."),
    "error-fix-work": ("agent.flows.fixer.scans:work_scan",
                       "Drive every open task through the chain as far as it can go now."),
    "pr-merged": ("agent.flows.followup:scan_pr_merged", "Follow PR states (merged, closed, branch pruning); retry owed PR texts; remove finished worktrees."),
    "notify": ("agent.flows.notify:scan", "Deliver pending notifications (outbox), retrying failed ones with backoff."),
}


def run_scan(app, name: str, jobs: int = 1) -> list[dict]:
    """Run one scan under its file lock; a scan already running elsewhere is skipped with a line saying so."""
    from agent.coord.locks import ScanBusy, scan_lock

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
