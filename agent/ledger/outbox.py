"""The notification outbox: which events a human hears about, written with the event that causes them.

``Ledger.event`` calls :func:`on_event` inside the transaction that writes the event, so the outbox row and the
event (and the state change they record) commit or roll back together: a crash can neither lose a notification
whose event happened nor send one for an event that never committed. Delivery (``agent/flows/notify.py``) happens after,
from these rows. This module is pure mapping plus one INSERT; it imports nothing heavy (every event pays for it).
"""

from __future__ import annotations

import json
import sqlite3

# What a channel can ask for in `notify: [{on: [...]}]`.
KINDS = ("gate-blocked", "failed", "pr-opened", "pr-merged", "pr-closed", "budget")

# A delivery's states: pending -> sending -> delivered | failed (refused for good) | dead (attempts used up)
DEAD = "dead"
DELIVERY_STATES = ("pending", "sending", "delivered", "failed", DEAD)

# The fixer's reason when a task's own budget is spent; such a gate-block is also a "budget" notification.
TASK_BUDGET_SPENT = "task budget spent"


def kinds_for(kind: str, payload: dict) -> tuple[str, ...]:
    """The notification kinds an event stands for (empty for almost every event)."""
    if kind == "task.state":
        to = payload.get("to")
        if to == "gate-blocked":
            reason = str(payload.get("reason") or "")
            return ("gate-blocked", "budget") if reason.startswith(TASK_BUDGET_SPENT) else ("gate-blocked",)
        if to == "failed":
            return ("failed",)
        return ()
    if kind in ("pr.created", "pr.adopted"):   # adopted: created by a scan that died before recording it
        return ("pr-opened",)
    if kind == "pr.merged":
        return ("pr-merged",)
    if kind == "pr.closed":
        return ("pr-closed",)
    if kind == "budget.reached":
        return ("budget",)
    return ()


def on_event(conn: sqlite3.Connection, event_id: int, ts: str, kind: str, payload: dict,
             task_id: int | None, error_id: str | None) -> None:
    """Called by ``Ledger.event`` in the event's transaction: one outbox row if the event is worth a message."""
    kinds = kinds_for(kind, payload)
    if not kinds:
        return
    conn.execute("INSERT INTO outbox (event_id, kinds, task_id, error_id, payload, created_at, expanded) "
                 "VALUES (?, ?, ?, ?, ?, ?, 0)",
                 (event_id, ",".join(kinds), task_id, error_id,
                  json.dumps({"event": kind, **payload}, sort_keys=True, default=str), ts))


def daily_budget_reached(ledger, spent: float, limit: float) -> bool:
    """Record ``budget.reached`` (scope daily) once per UTC day; True when this call recorded it."""
    day = ledger_now()[:10]
    with ledger.tx() as c:
        today = c.execute("SELECT payload FROM outbox WHERE kinds = 'budget' AND created_at >= ?", (day,)).fetchall()
        if any(json.loads(r["payload"] or "{}").get("scope") == "daily" for r in today):
            return False
        ledger.event(c, "budget.reached", "script", {"scope": "daily", "spent_usd": round(spent, 4),
                                                     "limit_usd": limit, "day": day})
        return True


def ledger_now() -> str:
    from agent.ledger.clock import now

    return now()


# --------------------------------------------------------------------------- delivery bookkeeping
# (the SQL of agent/flows/notify.py's delivery passes; sending happens there, outside any transaction)

def expand(ledger, wants: dict[str, tuple[str, ...]]) -> int:
    """Give every unexpanded outbox row one delivery per channel that wants one of its kinds
    (``wants``: channel id -> kinds). Returns the number of delivery rows created."""
    made = 0
    with ledger.tx() as c:
        rows = c.execute("SELECT id, event_id, kinds, created_at FROM outbox WHERE expanded = 0 ORDER BY id").fetchall()
        for row in rows:
            kinds = set(row["kinds"].split(","))
            for channel, on in wants.items():
                if kinds & set(on):
                    made += c.execute(
                        "INSERT INTO notify_deliveries (outbox_id, channel, key, state, attempts, next_at, "
                        "created_at) VALUES (?, ?, ?, 'pending', 0, 0, ?) ON CONFLICT DO NOTHING",
                        (row["id"], channel, f"agent-{row['event_id']}-{channel}", ledger_now())).rowcount
            c.execute("UPDATE outbox SET expanded = 1 WHERE id = ?", (row["id"],))
    return made


def claim_due(ledger, token: str, lease_s: float, dead: "callable", limit: int = 50) -> list[dict]:
    """Claim deliveries that are due: pending past their ``next_at``, or stuck in ``sending`` by a claimant
    whose lease ran out or whose process is dead (``dead(claimed_by)``). Each claim counts an attempt.

    One clock: ``next_at`` and ``lease_until`` are the ledger's time (``dialect.clock``), set and compared by the
    claiming UPDATE itself, which takes a row only if it is still due then (so a runner whose clock is off never
    takes a live delivery, and of two runners claiming at once on PostgreSQL one gets the row)."""
    clock = ledger.dialect.clock
    claimed = []
    with ledger.tx() as c:
        due = [(r["id"], None, False) for r in c.execute(
            f"SELECT id FROM notify_deliveries WHERE state = 'pending' AND next_at <= {clock} ORDER BY id LIMIT ?",
            (limit,))]
        for r in c.execute(f"SELECT id, claimed_by, coalesce(lease_until, 0) < {clock} AS expired "
                           "FROM notify_deliveries WHERE state = 'sending' ORDER BY id").fetchall():
            gone = dead(r["claimed_by"] or "")
            if r["expired"] or gone:
                due.append((r["id"], r["claimed_by"] or "", gone))
        for did, holder, gone in due:
            still = f"state = 'pending' AND next_at <= {clock}" if holder is None else \
                f"state = 'sending' AND coalesce(claimed_by, '') = ? AND (coalesce(lease_until, 0) < {clock} OR ? = 1)"
            n = c.execute(f"UPDATE notify_deliveries SET state = 'sending', claimed_by = ?, lease_until = {clock} + ?, "
                          f"attempts = attempts + 1 WHERE id = ? AND {still}",
                          (token, lease_s, did, *(() if holder is None else (holder, int(gone))))).rowcount
            if n:
                claimed.append(did)
        if not claimed:
            return []
        marks = ",".join("?" for _ in claimed)
        return [dict(r) for r in c.execute(
            "SELECT d.*, o.event_id, o.kinds, o.task_id, o.error_id, o.payload, o.created_at AS event_at "
            f"FROM notify_deliveries d JOIN outbox o ON o.id = d.outbox_id WHERE d.id IN ({marks}) ORDER BY d.id",
            claimed)]


def dead_letter_stuck(ledger, dead: "callable", max_attempts: int) -> list[dict]:
    """Deliveries stuck in ``sending`` (lease over on the ledger's clock, or claimant dead) that used up their
    attempts: each claim was lost mid-send (a crash every time), so they go to ``dead`` instead of being claimed
    again."""
    clock = ledger.dialect.clock
    out = []
    with ledger.tx() as c:
        for r in c.execute("SELECT d.id, d.key, d.attempts, d.lease_until, d.claimed_by, o.kinds, o.task_id, "
                           f"coalesce(d.lease_until, 0) < {clock} AS expired "
                           "FROM notify_deliveries d JOIN outbox o ON o.id = d.outbox_id "
                           "WHERE d.state = 'sending' AND d.attempts >= ?", (max_attempts,)).fetchall():
            if r["expired"] or dead(r["claimed_by"] or ""):
                error = f"{r['attempts']} attempts never finished (the sender died each time)"
                c.execute("UPDATE notify_deliveries SET state = ?, last_error = ?, claimed_by = NULL, "
                          "lease_until = NULL WHERE id = ?", (DEAD, error, r["id"]))
                ledger.event(c, "notify.dead", "script", {"key": r["key"], "kinds": r["kinds"],
                                                          "attempts": r["attempts"], "error": error},
                             task_id=r["task_id"])
                out.append({k: r[k] for k in ("id", "key", "attempts", "lease_until", "claimed_by", "kinds",
                                              "task_id")})
    return out


def deliveries(ledger, state: str | None, limit: int) -> list[dict]:
    where, params = ("WHERE d.state = ?", (state,)) if state else ("", ())
    return ledger.all("SELECT d.key, d.channel, d.state, d.attempts, d.last_error, d.created_at, d.delivered_at, "
                      f"o.kinds, o.task_id, o.error_id FROM notify_deliveries d JOIN outbox o ON o.id = d.outbox_id "
                      f"{where} ORDER BY d.id DESC LIMIT ?", (*params, int(limit)))


def requeue(ledger, keys: tuple[str, ...], every: bool) -> list[dict]:
    """Failed or dead deliveries (``keys``, or all with ``every``) back to pending, due now, attempts 0."""
    with ledger.tx() as c:
        if every:
            rows = c.execute("SELECT id, key, state FROM notify_deliveries WHERE state IN ('failed', ?) "
                             "ORDER BY id", (DEAD,)).fetchall()
        else:
            marks = ",".join("?" for _ in keys)
            rows = c.execute(f"SELECT id, key, state FROM notify_deliveries WHERE state IN ('failed', ?) "
                             f"AND key IN ({marks}) ORDER BY id", (DEAD, *keys)).fetchall()
        out = []
        for r in rows:
            c.execute("UPDATE notify_deliveries SET state = 'pending', attempts = 0, next_at = 0, last_error = NULL "
                      "WHERE id = ?", (r["id"],))
            ledger.event(c, "notify.retry", "human", {"key": r["key"], "was": r["state"]})
            out.append({"key": r["key"], "was": r["state"], "state": "pending"})
        return out


def record(ledger, delivery_id: int, token: str, state: str, error: str | None = None,
           retry_in: float | None = None) -> bool:
    """Record a claimed delivery's outcome (delivered | pending, due again ``retry_in`` seconds from now on the
    ledger's clock | failed); False if the claim was lost."""
    due = "next_at" if retry_in is None else f"{ledger.dialect.clock} + ?"
    with ledger.tx() as c:
        n = c.execute(f"UPDATE notify_deliveries SET state = ?, last_error = ?, next_at = {due}, "
                      "claimed_by = NULL, lease_until = NULL, delivered_at = ? WHERE id = ? AND claimed_by = ?",
                      (state, error, *(() if retry_in is None else (retry_in,)),
                       ledger_now() if state == "delivered" else None, delivery_id, token)).rowcount
        if n and state in ("delivered", "failed", DEAD):
            row = c.execute("SELECT d.channel, d.key, d.attempts, o.task_id, o.kinds FROM notify_deliveries d "
                            "JOIN outbox o ON o.id = d.outbox_id WHERE d.id = ?", (delivery_id,)).fetchone()
            ledger.event(c, f"notify.{state}", "script", {"channel": row["channel"], "key": row["key"],
                                                          "kinds": row["kinds"], "attempts": row["attempts"],
                                                          "error": error}, task_id=row["task_id"])
        return bool(n)


def delivery_counts(ledger) -> list[dict]:
    return ledger.all("SELECT channel, state, count(*) AS n FROM notify_deliveries GROUP BY channel, state "
                      "ORDER BY channel, state")
