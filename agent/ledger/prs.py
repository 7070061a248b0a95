"""Record operations of PRs (``prs``): the task's draft PR as the forge has it, its final state, the counts the PR
limits need, and what the PR text is rendered from.

``record_pr`` is a task write: it takes the task's claim token and checks it in its transaction (a worker that
lost its claim records no PR). ``record_pr_final`` is the follow-up of a forge-side fact (merged or closed by a
human on the forge) and acts without a claim; it moves the PR, the error (through the error state machine) and
the task (through the task state machine) in one transaction, each with its event.
"""

from __future__ import annotations

from typing import Any

from agent.domain import chain
from agent.ledger import Ledger, now
from agent.ledger.listing import Listing


def get_pr(ledger: Ledger, task_id: int) -> dict | None:
    return ledger.one("SELECT * FROM prs WHERE task_id = ?", (task_id,))


def has_pr(ledger: Ledger, task_id: int) -> bool:
    return ledger.one("SELECT 1 FROM prs WHERE task_id = ?", (task_id,)) is not None


def iter_prs(ledger: Ledger, state: str | None = None, since: str | None = None,
             limit: int | None = None) -> Listing:
    """PRs in task order; with ``limit``, the newest ``limit`` of them (``since``: updated at or after then)."""
    return Listing(ledger, "task_id, forge, repo, number, url, head_branch AS head, head_sha, base, state, draft, "
                           "title, updated_at", "prs", [("state = ?", state), ("updated_at >= ?", since)],
                   [("task_id", "task_id", False)], limit, tail=True, convert=_draft_bool)


def _draft_bool(row: dict) -> dict:
    row["draft"] = bool(row["draft"])
    return row


def list_prs(ledger: Ledger) -> list[dict]:
    return list(iter_prs(ledger))


def demo_pr(ledger: Ledger, task_id: int) -> dict | None:
    return ledger.one("SELECT number, url, head_branch, head_sha FROM prs WHERE task_id = ?", (task_id,))


def open_drafts(ledger: Ledger, repo: str, other_than_task: int) -> int:
    """Open PRs in ``repo`` of tasks other than ``other_than_task`` (limits.open_drafts_per_repo)."""
    return ledger.scalar("SELECT count(*) FROM prs WHERE repo = ? AND state = 'open' AND task_id != ?",
                         (repo, other_than_task)) or 0


def prs_opened_since(ledger: Ledger, since: str) -> int:
    """PRs recorded at or after ``since`` (limits.prs_per_hour)."""
    return ledger.scalar("SELECT count(*) FROM prs WHERE created_at >= ?", (since,)) or 0


def prs_to_follow(ledger: Ledger) -> list[dict]:
    """Open PRs, and closed ones whose branch is not pruned yet (`watch pr-merged`)."""
    return ledger.all(
        "SELECT * FROM prs p WHERE p.state = 'open' OR (p.state = 'closed' AND NOT EXISTS ("
        "SELECT 1 FROM events e WHERE e.task_id = p.task_id AND e.kind = 'pr.branch_pruned')) ORDER BY p.id")


def record_pr(ledger: Ledger, task_id: int, values: dict[str, Any], action: str, actor: str, *,
              claim_token: str | None) -> None:
    """The task's PR as the forge returned it (created, updated, adopted or unchanged), with ``pr.<action>``."""
    from agent.ledger.leases import check_claim

    ts = now()
    values = {**values, "updated_at": ts}
    with ledger.tx() as c:
        check_claim(c, task_id, claim_token)
        if c.execute("SELECT 1 FROM prs WHERE task_id = ?", (task_id,)).fetchone():
            ledger.update(c, "prs", {"task_id": task_id}, values)
        else:
            ledger.insert(c, "prs", {"task_id": task_id, **values, "created_at": ts})
        ledger.event(c, f"pr.{action}", actor, {"forge": values["forge"], "repo": values["repo"],
                                                "number": values["number"], "url": values["url"],
                                                "head": values["head_branch"], "head_sha": values["head_sha"],
                                                "body_hash": values["body_hash"]}, task_id=task_id)


def record_pr_final(ledger: Ledger, row: dict, state: str, draft: bool) -> str | None:
    """A PR merged or closed on the forge: the PR row, its error (merged: resolved; closed: skipped) and its task
    (merged: done; closed: failed, claim cleared) in one transaction. Returns the new state, or None when another
    scan recorded it first."""
    from agent.ledger.errors import transition_error
    from agent.ledger.lessons import accept_merged_in, discard_in
    from agent.ledger.tasks import get_task, transition_in

    task_id = row["task_id"]
    with ledger.tx() as c:
        cur = c.execute("SELECT state FROM prs WHERE id = ?", (row["id"],)).fetchone()
        if cur is None or cur[0] != "open":
            return None  # another scan got here first
        ledger.update(c, "prs", {"id": row["id"]}, {"state": state, "draft": 1 if draft else 0, "updated_at": now()})
        task = get_task(ledger, task_id, c)
        error_id = task["error_id"]
        ref = f"{row['repo']}#{row['number']}"
        ledger.event(c, f"pr.{state}", "script", {"forge": row["forge"], "repo": row["repo"],
                                                   "number": row["number"], "url": row["url"]},
                     task_id=task_id, error_id=error_id)
        if state == "merged":
            error_state, reason, target = chain.E_RESOLVED, f"PR {ref} merged", chain.DONE
            accept_merged_in(ledger, c, task_id, ref)      # a human accepted the work: its lesson may steer lanes
        else:
            error_state, reason, target = chain.E_SKIPPED, f"PR {ref} closed without merge", chain.FAILED
            discard_in(ledger, c, task_id, reason)
        if error_id:
            current = c.execute("SELECT state FROM errors WHERE id = ?", (error_id,)).fetchone()
            if current is not None and chain.check_error_transition(current[0], error_state) is None:
                transition_error(ledger, c, error_id, error_state, "script", reason=reason,
                                 payload={"reason": reason}, task_id=task_id)
            elif current is not None and current[0] != error_state:
                ledger.event(c, "error.state_kept", "script",
                             {"state": current[0], "wanted": error_state, "reason": reason}, task_id=task_id,
                             error_id=error_id)
        if task["state"] != target:
            why = chain.check_transition(task["state"], target, "script")
            if why is None:
                transition_in(ledger, c, task_id, task["state"], target, "script", reason, claim_owner=None,
                              claim_pid=None, claim_token=None, lease_until=None)
            else:
                ledger.event(c, "task.state_kept", "script",
                             {"state": task["state"], "wanted": target, "reason": reason, "why": why},
                             task_id=task_id)
        return state


def pr_inputs(ledger: Ledger, task_id: int) -> dict | None:
    """Everything the PR title and body are rendered from (``pr_data_from_ledger``), read-only; None for
    an unknown task."""
    t = ledger.one("SELECT * FROM tasks WHERE id = ?", (task_id,))
    if t is None:
        return None
    e = ledger.one("SELECT * FROM errors WHERE id = ?", (t["error_id"],)) if t["error_id"] else None
    concl = ledger.one("SELECT brief FROM conclusions WHERE id = ?", (t["conclusion_id"],)) \
        if t["conclusion_id"] else None
    summary = ledger.scalar("SELECT summary FROM lane_runs WHERE task_id = ? AND role = 'implementer' "
                            "AND status = 'complete' ORDER BY id DESC LIMIT 1", (task_id,)) or ""
    gates = ledger.all("SELECT g.round, g.stage, g.dimension, g.verdict, g.findings_count, g.head_sha, "
                       "l.vendor, l.findings_text FROM gates g LEFT JOIN lane_runs l ON l.id = g.lane_run_id "
                       "WHERE g.task_id = ? ORDER BY g.id", (task_id,))
    checks = ledger.all("SELECT * FROM checks WHERE task_id = ? ORDER BY id", (task_id,))
    cost = ledger.scalar("SELECT coalesce(sum(cost_usd), 0) FROM lane_runs WHERE task_id = ?", (task_id,)) or 0.0
    from agent.ledger.lessons import task_lesson
    from agent.ledger.proofs import proof_for_head

    return {"task": t, "error": e, "brief": (concl or {}).get("brief"), "gates": gates, "checks": checks,
            "cost_usd": cost, "summary": summary, "lesson": task_lesson(ledger, task_id),
            "proof": proof_for_head(ledger, task_id, t["head_sha"])}


def pr_data_from_ledger(ledger, task_id: int):
    """What ``agent.domain.pr_text.render_pr`` needs for one task (a ``PRData``), from the ledger (read-only)."""
    import json

    from agent.domain.pr_text import pr_data_from_rows
    from agent.ledger import feedback

    inputs = pr_inputs(ledger, task_id)
    if inputs is None:
        from agent import AgentError

        raise AgentError(f"no task {task_id}; see `agent task list`")
    t = inputs["task"]
    watch = feedback.pr_watch(ledger, task_id)
    ci_head = watch["ci_sha"] if watch["ci_sha"] and watch["ci_sha"] == t["head_sha"] else None
    return pr_data_from_rows({**inputs,
                              "ci": json.loads(watch["ci_results"] or "[]") if ci_head else [],
                              "ci_head": ci_head, "ci_state": watch["ci_state"] if ci_head else None,
                              "feedback_rounds": feedback.feedback_rounds(ledger, task_id)})
