"""Forge calls owed (table ``forge_pending``): a PR text to write again (``pr_text:<task>``), a forge's rate limit
to wait out (``rate_limit:<forge>``)."""

from __future__ import annotations

import sqlite3

from agent.ledger.clock import now


def pending(ledger, key: str) -> dict | None:
    """The ``forge_pending`` row for ``key`` (``pr_text:<task>`` | ``rate_limit:<forge>``), or None."""
    return ledger.one("SELECT * FROM forge_pending WHERE key = ?", (key,))


def pending_of(ledger, kind: str) -> list[dict]:
    return ledger.all("SELECT * FROM forge_pending WHERE kind = ? ORDER BY key", (kind,))


def set_pending(ledger, conn: sqlite3.Connection, key: str, kind: str, reason: str, task_id: int | None = None,
                until: float | None = None) -> None:
    """Record (or count again) a forge call owed; call inside ``tx()`` with its event."""
    conn.execute("INSERT INTO forge_pending (key, kind, task_id, until, reason, attempts, updated_at) "
                 "VALUES (?, ?, ?, ?, ?, 1, ?) ON CONFLICT(key) DO UPDATE SET until = excluded.until, "
                 "reason = excluded.reason, attempts = forge_pending.attempts + 1, "
                 "updated_at = excluded.updated_at",
                 (key, kind, task_id, until, reason, now()))


def clear_pending(ledger, conn: sqlite3.Connection, key: str) -> bool:
    return conn.execute("DELETE FROM forge_pending WHERE key = ?", (key,)).rowcount > 0
