"""Reads of the event log: the events in id order, and a task's streak of one kind of event. The one writer is
``Ledger.event()``, which every write transaction calls with the change it records."""

from __future__ import annotations

import json
import sqlite3
from typing import Any


def events(ledger, task_id: int | None = None, after_id: int = 0, limit: int | None = None,
           newest: bool = False) -> list[dict]:
    """Events in id order; ``limit`` keeps the first N, or with ``newest`` the last N (still oldest first)."""
    sql = "SELECT * FROM events WHERE id > ?"
    params: list[Any] = [after_id]
    if task_id is not None:
        sql += " AND task_id = ?"
        params.append(task_id)
    sql += " ORDER BY id DESC" if limit and newest else " ORDER BY id"
    if limit:
        sql += f" LIMIT {int(limit)}"
    rows = ledger.all(sql, tuple(params))
    if limit and newest:
        rows.reverse()
    for r in rows:
        r["payload"] = json.loads(r["payload"] or "{}")
    return rows


def event_streak(ledger, conn: sqlite3.Connection, task_id: int, kind: str, reset_kinds: tuple[str, ...]) -> int:
    """How many ``kind`` events the task has had since its last event of one of ``reset_kinds``."""
    marks = ", ".join("?" for _ in reset_kinds)
    last = conn.execute(f"SELECT coalesce(max(id), 0) FROM events WHERE task_id = ? AND kind IN ({marks})",
                        (task_id, *reset_kinds)).fetchone()[0]
    return conn.execute("SELECT count(*) FROM events WHERE task_id = ? AND kind = ? AND id > ?",
                        (task_id, kind, last)).fetchone()[0]
