"""What `agent bench` reads back from a run's ledger: the task's outcome and what its lanes cost."""

from __future__ import annotations

import json

from agent.ledger import Ledger


def run_outcome(ledger: Ledger, error_id: str | None) -> dict:
    """The task made for ``error_id`` (the newest), its PR, reviewer verdicts and every lane run of the error
    (the decider's included): count, cost, tokens. Empty values when no task was made."""
    from agent.domain.prices import tokens

    task = ledger.one("SELECT * FROM tasks WHERE error_id = ? ORDER BY id DESC LIMIT 1", (error_id,)) \
        if error_id else None
    task_id = task["id"] if task else None
    runs = ledger.all("SELECT role, vendor, status, cost_usd, usage FROM lane_runs WHERE error_id = ? "
                      "OR (task_id IS NOT NULL AND task_id = ?) ORDER BY id", (error_id, task_id))
    inp = out = 0
    for r in runs:
        try:
            counted = tokens(json.loads(r["usage"] or "{}") or {})
        except (ValueError, TypeError, AttributeError):
            counted = None
        if counted:
            inp, out = inp + counted[0], out + counted[1]
    gates = ledger.all("SELECT round, stage, dimension, verdict, findings_count FROM gates WHERE task_id = ? "
                       "ORDER BY id", (task_id,)) if task_id else []
    pr = ledger.one("SELECT number, url, head_branch, head_sha, state, draft FROM prs WHERE task_id = ?",
                    (task_id,)) if task_id else None
    conclusion = ledger.one("SELECT kind, decided_by FROM conclusions WHERE error_id = ?", (error_id,)) \
        if error_id else None
    return {"task": task, "pr": pr, "gates": gates, "conclusion": conclusion,
            "lanes": len(runs), "lanes_by_role": _by_role(runs),
            "cost_usd": round(sum(r["cost_usd"] or 0 for r in runs), 6),
            "tokens": {"input": inp, "output": out}}


def _by_role(runs: list[dict]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in runs:
        out[r["role"]] = out.get(r["role"], 0) + 1
    return out
