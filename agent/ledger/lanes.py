"""Record operations of lane runs (``lane_runs``): started, its process, finished, interrupted; the reads the fixer,
the PR text and the budgets need.

A lane run of a task is a task write: every operation here takes the task's claim token and checks it in the
same transaction (``agent.ledger.leases.check_claim``), so a worker that lost its claim records nothing. A lane run
without a task (the decider on an error, `agent lane run` by hand) has no claim to check. A run's final status
and its ``lane.finished`` event are one transaction.

The daily budget across runners: a fixer lane passes a ``DailyBudget`` to ``start_run``, which checks in the
transaction that records the run ``running`` that the day's spend, plus what lanes in flight reserved, plus this
lane's estimate fits, and stores the estimate as the run's reservation (``reserved_usd``); else it raises
``BudgetRefused`` and records nothing (DESIGN.md "The daily budget across runners").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent import AgentError
from agent.ledger import Ledger, now

ESTIMATE_RUNS = 20   # a lane's estimate: the median cost of this many recent ended runs of its role and vendor
# ended runs that say nothing about what a lane costs: cut off (interrupted), or never started (unavailable)
_NOT_ESTIMATES = ("running", "interrupted", "unavailable")
_EPS = 1e-9          # float sums of cents: $0.01 + $0.01 + $0.01 must fit a $0.03 budget


@dataclass(frozen=True)
class DailyBudget:
    """What ``start_run`` checks before it records a fixer lane ``running``."""
    limit_usd: float        # limits.daily_budget_usd
    since: str              # the window's start (now - 24 h, as ``now()`` text)
    fallback_usd: float     # the estimate when the lane has no history (the task's remaining budget)


class BudgetRefused(AgentError):
    """The daily budget has no room for this lane now: nothing was recorded, the task waits."""

    def __init__(self, spent: float, reserved: float, inflight: int, estimate: float, limit: float):
        self.spent, self.reserved, self.inflight = spent, reserved, inflight
        self.estimate, self.limit = estimate, limit
        super().__init__(f"daily budget: ${spent + reserved:g} of ${limit:g} spent or reserved; "
                         f"the lane is estimated at ${estimate:g}")


def lane_estimate(conn, role: str, vendor: str, fallback: float) -> float:
    """What a lane of ``role`` on ``vendor`` is expected to cost: the median of its last ``ESTIMATE_RUNS`` ended
    runs (interrupted and unavailable ones say nothing about it), else ``fallback``."""
    marks = ", ".join("?" for _ in _NOT_ESTIMATES)
    costs = sorted(float(r[0]) for r in conn.execute(
        f"SELECT cost_usd FROM lane_runs WHERE role = ? AND vendor = ? AND status NOT IN ({marks}) "
        "AND cost_usd IS NOT NULL ORDER BY id DESC LIMIT ?", (role, vendor, *_NOT_ESTIMATES, ESTIMATE_RUNS)))
    if not costs:
        return max(0.0, float(fallback))
    mid = len(costs) // 2
    return costs[mid] if len(costs) % 2 else (costs[mid - 1] + costs[mid]) / 2


def _daily_spend_query(since: str, exclude_run: int | None, clock: str) -> tuple[str, tuple]:
    """``clock``: the ledger clock's SQL (a claim's lease is judged on the ledger's time, never a runner's)."""
    live = f"r.status = 'running' AND r.reserved_usd IS NOT NULL AND t.lease_until >= {clock} AND r.id <> ?"
    other = exclude_run or 0
    return ("SELECT coalesce(sum(r.cost_usd), 0) AS spent, "
            f"coalesce(sum(CASE WHEN {live} THEN r.reserved_usd ELSE 0 END), 0) AS reserved, "
            f"coalesce(sum(CASE WHEN {live} THEN 1 ELSE 0 END), 0) AS inflight "
            "FROM lane_runs r LEFT JOIN tasks t ON t.id = r.task_id WHERE r.started_at >= ?",
            (other, other, since))


def _spend(row) -> tuple[float, float, int]:
    return float(row["spent"] or 0.0), float(row["reserved"] or 0.0), int(row["inflight"] or 0)


def daily_spend(conn, since: str, exclude_run: int | None = None) -> tuple[float, float, int]:
    """Inside the caller's transaction: (spent, reserved, in flight) since ``since``: the cost of every lane run
    started in the window, and the reservations (and their count) of the runs still ``running`` whose task's claim
    is live. A run whose runner died stops reserving when its claim's lease runs out, or when it is marked
    interrupted or superseded, whichever is first. ``exclude_run``: a run the one about to start supersedes."""
    from agent.ledger.leases import clock_of

    return _spend(conn.execute(*_daily_spend_query(since, exclude_run, clock_of(conn))).fetchone())


def daily_spend_since(ledger: Ledger, since: str) -> tuple[float, float, int]:
    """``daily_spend`` as one read (the fixer's check before it prepares a lane)."""
    return _spend(ledger.one(*_daily_spend_query(since, None, ledger.dialect.clock)))


def _reserve(c, budget: DailyBudget, role: str, vendor: str, supersedes: int | None) -> float:
    """The check and the reservation's amount, inside ``start_run``'s transaction (the ledger's write lock makes
    it atomic across runners). A lane fits while something is left and either its estimate fits in what is left
    or no other lane is in flight: then it may use the rest, as before reservations, and reserves the rest."""
    estimate = lane_estimate(c, role, vendor, budget.fallback_usd)
    spent, reserved, inflight = daily_spend(c, budget.since, supersedes)
    used = spent + reserved
    if used >= budget.limit_usd - _EPS or (inflight and used + estimate > budget.limit_usd + _EPS):
        raise BudgetRefused(spent, reserved, inflight, estimate, budget.limit_usd)
    return min(estimate, budget.limit_usd - used)


def _claimed(c, task_id: int | None, token: str | None) -> None:
    from agent.ledger.leases import check_claim

    if task_id is not None:
        check_claim(c, task_id, token)


def start_run(ledger: Ledger, *, task_id: int | None, error_id: str | None, round: int | None, role: str,
              vendor: str, head_sha: str | None, claim_token: str | None, budget: DailyBudget | None = None,
              supersedes: int | None = None) -> int:
    """A new ``running`` row (its attempt counted per task, round and role) and ``lane.started``.

    ``budget``: reserve the lane's estimate of the daily budget in the same transaction, or raise
    ``BudgetRefused`` (nothing recorded) when it does not fit; ``supersedes``: the ``running`` run this one
    replaces (resumed), whose reservation does not count against it."""
    with ledger.tx() as c:
        _claimed(c, task_id, claim_token)
        reserved = _reserve(c, budget, role, vendor, supersedes) if budget is not None else None
        # the attempt: runs before this one of the same task, round and role (NULL matching NULL)
        keys = {"task_id": task_id, "round": round, "role": role}
        where = " AND ".join(f"{k} IS NULL" if v is None else f"{k} = ?" for k, v in keys.items())
        n = c.execute(f"SELECT count(*) FROM lane_runs WHERE {where}",
                      tuple(v for v in keys.values() if v is not None)).fetchone()[0]
        run_id = ledger.insert(c, "lane_runs", {
            "task_id": task_id, "error_id": error_id, "round": round, "role": role, "vendor": vendor,
            "attempt": 1 + (n or 0), "status": "running", "head_sha": head_sha, "started_at": now(),
            "cost_usd": 0.0, "reserved_usd": reserved})
        payload = {"run_id": run_id, "role": role, "vendor": vendor, "round": round, "head_sha": head_sha}
        if reserved is not None:
            payload["reserved_usd"] = round_usd(reserved)
        ledger.event(c, "lane.started", "lane", payload, task_id=task_id, error_id=error_id)
        return run_id


def round_usd(x: float) -> float:
    return float(f"{x:.6f}")


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
