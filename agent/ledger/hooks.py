"""Webhook deliveries accepted by `agent serve`: stored with the events they carry, in one transaction.

A delivery is known by its hook and key (the sender's delivery id, else the SHA-256 of the body). The key is
written in the same transaction as the ingest, so a replay is recognised exactly when its events were stored:
a crash before the commit stores neither (the sender retries), after it both (a retry is a replay).
"""

from __future__ import annotations

from typing import Callable


def accept(ledger, hook: str, key: str, store: Callable[[], object]) -> tuple[bool, object | None]:
    """Run ``store()`` (an ingest joining this transaction) unless ``(hook, key)`` was accepted before.

    Returns (replay, what store returned)."""
    from agent.ledger import now

    with ledger.tx() as c:
        if c.execute("SELECT 1 FROM hook_deliveries WHERE hook = ? AND key = ?", (hook, key)).fetchone():
            return True, None
        result = store()
        c.execute("INSERT INTO hook_deliveries (hook, key, events, new, deduplicated, received_at) "
                  "VALUES (?, ?, ?, ?, ?, ?)",
                  (hook, key, getattr(result, "new", 0) + getattr(result, "deduplicated", 0),
                   getattr(result, "new", 0), getattr(result, "deduplicated", 0), now()))
        return False, result


def accept_batch(ledger, deliveries: list[tuple[str, str, Callable[[], object]]]) -> list[tuple[bool, object | None]]:
    """Several deliveries in ONE transaction: one commit (one fsync) for requests that arrived together (group
    commit). Each is ``accept``ed in turn, so a key seen before, or earlier in the same batch, is a replay. Any
    failure rolls the whole batch back; the caller then retries each delivery alone."""
    with ledger.tx():
        return [accept(ledger, hook, key, store) for hook, key, store in deliveries]
