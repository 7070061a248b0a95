"""Per-ledger secrets (migration ``m013_ledger_keys``): made once, at first use, by whichever runner asks first."""

from __future__ import annotations

import secrets


def ledger_key(ledger, name: str) -> str:
    """The ledger's secret ``name`` (64 hex characters), made now if it does not exist yet."""
    from agent.ledger import now

    row = ledger.one("SELECT value FROM ledger_keys WHERE name = ?", (name,))
    if row is not None:
        return row["value"]
    with ledger.tx() as c:
        c.execute("INSERT INTO ledger_keys (name, value, created_at) VALUES (?, ?, ?) ON CONFLICT(name) DO NOTHING",
                  (name, secrets.token_hex(32), now()))
        return c.execute("SELECT value FROM ledger_keys WHERE name = ?", (name,)).fetchone()["value"]
