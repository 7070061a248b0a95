"""Record operations of lane runs (``lane_runs``): started, its process, finished, interrupted; the reads the fixer,
the PR text and the budgets need.

A lane run of a task is a task write: every operation here takes the task's claim token and checks it in the
same transaction (``agent.ledger.tasks.check_claim``), so a worker that lost its claim records nothing. A lane run
without a task (the decider on an error, `agent lane run` by hand) has no claim to check. A run's final status
and its ``lane.finished`` event are one transaction.
"""

from __future__ import annotations

from typing import Any

from agent.ledger import Ledger, now


def _claimed(c, task_id: int | None, token: str | None) -> None:
    from agent.ledger.tasks import check_claim

    if task_id is not None:
        check_claim(c, task_id, token)


def start_run(ledger: Ledger, *, task_id: int | None, error_id: str | None, round: int | None, role: str,
              vendor: str, head_sha: str | None, claim_token: str | None) -> int:
    """A new ``running`` row (its attempt counted per task, round and role) and ``lane.started``."""
    with ledger.tx() as c:
        _claimed(c, task_id, claim_token)
        # the attempt: runs before this one of the same task, round and role (NULL matching NULL)
        keys = {"task_id": task_id, "round": round, "role": role}
        where = " AND ".join(f"{k} IS NULL" if v is None else f"{k} = ?" for k, v in keys.items())
        n = c.execute(f"SELECT count(*) FROM lane_runs WHERE {where}",
                      tuple(v for v in keys.values() if v is not None)).fetchone()[0]
        run_id = ledger.insert(c, "lane_runs", {
            "task_id": task_id, "error_id": error_id, "round": round, "role": role, "vendor": vendor,
            "attempt": 1 + (n or 0), "status": "running", "head_sha": head_sha, "started_at": now(),
            "cost_usd": 0.0})
        ledger.event(c, "lane.started", "lane", {"run_id": run_id, "role": role, "vendor": vendor,
                                                 "round": round, "head_sha": head_sha},
                     task_id=task_id, error_id=error_id)
        return run_id


def update_run(ledger: Ledger, run_id: int, values: dict[str, Any], *, task_id: int | None,
               claim_token: str | None) -> None:
    """What a running lane learned (its log dir, manifest, process id and start time)."""
    with ledger.tx() as c:
        _claimed(c, task_id, claim_token)
        ledger.update(c, "lane_runs", {"id": run_id}, values)


def finish_run(ledger: Ledger, run_id: int, values: dict[str, Any], event: dict, *, task_id: int | None,
               error_id: str | None, claim_token: str | None) -> None:
    """The run's outcome (status, report, cost, ...) and its ``lane.finished`` event, in one transaction."""
    with ledger.tx() as c:
        _claimed(c, task_id, claim_token)
        ledger.update(c, "lane_runs", {"id": run_id}, {**values, "ended_at": now()})
        ledger.event(c, "lane.finished", "lane", event, task_id=task_id, error_id=error_id)


def interrupt_run(ledger: Ledger, run_id: int, reason: str, *, task_id: int | None, claim_token: str | None,
                  only_running: bool = True, ended: bool = True, conn=None) -> bool:
    """Mark a run ``interrupted`` (never a verdict: the next scan runs it again), with a ``lane.interrupted``
    event. ``only_running``: only while it is still ``running``. ``conn``: inside that open transaction (whose
    caller checked the claim). Returns whether a row changed."""
    from contextlib import nullcontext

    with (nullcontext(conn) if conn is not None else ledger.tx()) as c:
        if conn is None:
            _claimed(c, task_id, claim_token)
        where: dict[str, Any] = {"id": run_id}
        if only_running:
            where["status"] = "running"
        values: dict[str, Any] = {"status": "interrupted", "reason": reason}
        if ended:
            values["ended_at"] = now()
        changed = ledger.update(c, "lane_runs", where, values) > 0
        if changed:
            ledger.event(c, "lane.interrupted", "script", {"run_id": run_id, "reason": reason}, task_id=task_id)
        return changed


def get_run(ledger: Ledger, run_id: int) -> dict | None:
    return ledger.one("SELECT * FROM lane_runs WHERE id = ?", (run_id,))


def inflight_run(ledger: Ledger, task_id: int, round: int, role: str) -> dict | None:
    """The newest ``running`` run of the task's round and role (a run whose worker died), or None."""
    return ledger.one("SELECT id, pid, pid_start, started_at FROM lane_runs WHERE task_id = ? AND round = ? "
                      "AND role = ? AND status = 'running' ORDER BY id DESC LIMIT 1", (task_id, round, role))


def implementer_summary(ledger: Ledger, task_id: int, round: int | None = None) -> str | None:
    """The SUMMARY of the newest complete implementer run (of ``round``, else of any round)."""
    if round is None:
        return ledger.scalar("SELECT summary FROM lane_runs WHERE task_id = ? AND role = 'implementer' "
                             "AND status = 'complete' ORDER BY id DESC LIMIT 1", (task_id,))
    return ledger.scalar("SELECT summary FROM lane_runs WHERE task_id = ? AND round = ? AND role = 'implementer' "
                         "AND status = 'complete' ORDER BY id DESC LIMIT 1", (task_id, round))


def implementer_summaries_since(ledger: Ledger, task_id: int, round: int) -> list[dict]:
    """``round`` and ``summary`` of every complete implementer run from ``round`` on (a PR reply's rounds)."""
    return ledger.all("SELECT round, summary FROM lane_runs WHERE task_id = ? AND role = 'implementer' "
                      "AND status = 'complete' AND round >= ? ORDER BY id", (task_id, round))


def cost_since(ledger: Ledger, since: str, task_id: int | None = None) -> float:
    """USD spent by lane runs started at or after ``since`` (of one task, or of all)."""
    if task_id is None:
        return float(ledger.scalar("SELECT coalesce(sum(cost_usd), 0) FROM lane_runs WHERE started_at >= ?",
                                   (since,)) or 0.0)
    return float(ledger.scalar("SELECT coalesce(sum(cost_usd), 0) FROM lane_runs WHERE task_id = ? AND "
                               "started_at >= ?", (task_id, since)) or 0.0)
