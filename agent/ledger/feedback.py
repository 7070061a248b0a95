"""The ledger's queries for PR feedback and PR CI (`agent watch pr-feedback`), each taking the ``Ledger``.

Tables (migration ``m004_pr_feedback``): ``pr_watch`` (per task: the forge's feedback cursor, the head whose CI
was last acted on), ``pr_feedback`` (every item read, with its decision), ``pr_feedback_rounds`` (rounds started
by feedback or CI) and ``pr_replies`` (comments the agent owes on a PR, posted at most once).
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any


def feedback_tasks(ledger) -> list[dict]:
    """Tasks whose PR is open and who may take feedback now (or soon: a working task may be stopped)."""
    return ledger.all("SELECT t.id AS task_id, t.state, p.number FROM prs p JOIN tasks t ON t.id = p.task_id "
                      "WHERE p.state = 'open' AND t.state IN ('open', 'working', 'done') ORDER BY t.id")


def tasks_with_owed_replies(ledger) -> list[int]:
    return [r["task_id"] for r in ledger.all("SELECT DISTINCT task_id FROM pr_replies WHERE reply_id IS NULL "
                                             "ORDER BY task_id")]


def pr_watch(ledger, task_id: int) -> dict:
    row = ledger.one("SELECT * FROM pr_watch WHERE task_id = ?", (task_id,))
    if row is None:
        return {"task_id": task_id, "cursor": None, "ci_sha": None, "ci_state": None, "ci_results": None}
    return row


def set_pr_watch(ledger, c: sqlite3.Connection, task_id: int, **values: Any) -> None:
    from agent.ledger.clock import now

    values["updated_at"] = now()
    if c.execute("SELECT 1 FROM pr_watch WHERE task_id = ?", (task_id,)).fetchone():
        ledger.update(c, "pr_watch", {"task_id": task_id}, values)
    else:
        ledger.insert(c, "pr_watch", {"task_id": task_id, **values})


def feedback_keys(ledger, task_id: int, conn: sqlite3.Connection | None = None) -> set[str]:
    c = conn or ledger.conn
    return {r[0] for r in c.execute("SELECT key FROM pr_feedback WHERE task_id = ?", (task_id,))}


def set_feedback_round(ledger, c: sqlite3.Connection, task_id: int, keys: list[str], round: int) -> None:
    """The round these feedback items started (inside that round's transaction)."""
    for key in keys:
        ledger.update(c, "pr_feedback", {"task_id": task_id, "key": key}, {"round": round})


def add_feedback(ledger, c: sqlite3.Connection, row: dict) -> None:
    from agent.ledger.clock import now

    ledger.insert(c, "pr_feedback", {**row, "created_at": now()})


def feedback_items(ledger, task_id: int, decision: str | None = None, round: int | None = None) -> list[dict]:
    sql, params = "SELECT * FROM pr_feedback WHERE task_id = ?", [task_id]
    if decision:
        sql += " AND decision = ?"
        params.append(decision)
    if round is not None:
        sql += " AND round = ?"
        params.append(round)
    return ledger.all(sql + " ORDER BY id", tuple(params))


def feedback_rounds(ledger, task_id: int) -> list[dict]:
    rows = ledger.all("SELECT * FROM pr_feedback_rounds WHERE task_id = ? ORDER BY round", (task_id,))
    for r in rows:
        r["keys"] = json.loads(r["keys"] or "[]")
    return rows


def resets(ledger, task_id: int, conn: sqlite3.Connection | None = None) -> int:
    c = conn or ledger.conn
    return c.execute("SELECT count(*) FROM events WHERE task_id = ? AND kind = 'task.reset'",
                     (task_id,)).fetchone()[0]


def feedback_rounds_since_reset(ledger, c: sqlite3.Connection, task_id: int) -> int:
    """Feedback rounds counted against ``limits.feedback_rounds``: those since the task's last human reset."""
    return c.execute("SELECT count(*) FROM pr_feedback_rounds WHERE task_id = ? AND resets = ?",
                     (task_id, resets(ledger, task_id, c))).fetchone()[0]


def add_feedback_round(ledger, c: sqlite3.Connection, task_id: int, round: int, trigger: str, keys: list[str],
                       base_head: str | None) -> None:
    from agent.ledger.clock import now

    ledger.insert(c, "pr_feedback_rounds", {"task_id": task_id, "round": round, "trigger": trigger,
                                            "keys": json.dumps(keys), "base_head": base_head,
                                            "resets": resets(ledger, task_id, c), "created_at": now()})


def owe_reply(ledger, c: sqlite3.Connection, task_id: int, key: str, kind: str, round: int, text: str = "") -> None:
    from agent.ledger.clock import now

    if c.execute("SELECT 1 FROM pr_replies WHERE key = ?", (key,)).fetchone() is None:
        ledger.insert(c, "pr_replies", {"task_id": task_id, "key": key, "kind": kind, "round": round,
                                        "text": text, "created_at": now()})


def owed_replies(ledger, task_id: int) -> list[dict]:
    return ledger.all("SELECT * FROM pr_replies WHERE task_id = ? AND reply_id IS NULL ORDER BY id", (task_id,))


def replies(ledger, task_id: int) -> list[dict]:
    return ledger.all("SELECT * FROM pr_replies WHERE task_id = ? ORDER BY id", (task_id,))


def record_reply(ledger, task_id: int, key: str, reply_id: str, head_sha: str | None, found: bool) -> bool:
    """Record a posted reply once; False if it was recorded already."""
    from agent.ledger.clock import now

    with ledger.tx() as c:
        if c.execute("SELECT 1 FROM pr_replies WHERE key = ? AND reply_id IS NULL", (key,)).fetchone() is None:
            return False
        ledger.update(c, "pr_replies", {"key": key}, {"reply_id": reply_id, "head_sha": head_sha,
                                                      "posted_at": now()})
        ledger.event(c, "pr.replied", "script", {"key": key, "reply_id": reply_id, "head": head_sha,
                                                 "found_after_crash": found}, task_id=task_id)
        return True
