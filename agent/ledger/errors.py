"""Record operations of the errors aggregate: errors, their occurrences (intake), conclusions, the error state.

Every change of an error's state goes through ``transition_error``: it asks ``chain.check_error_transition`` (the
one table of allowed moves), writes the state and its ``error.state`` event in the caller's transaction, and
raises ``ErrorStateRefused`` for a move the table does not allow.
"""

from __future__ import annotations

import json
import secrets
from typing import Any, Callable

from agent import AgentError

from agent.domain import chain
from agent.ledger import Ledger, now
from agent.ledger.listing import Listing


class ErrorStateRefused(AgentError):
    """An error state change the error state machine (``chain.ERROR_TRANSITIONS``) does not allow."""


# ------------------------------------------------------------------ reading


def get_error(ledger: Ledger, error_id: str, conn=None) -> dict | None:
    c = conn or ledger.conn
    row = c.execute("SELECT * FROM errors WHERE id = ?", (error_id,)).fetchone()
    return dict(row) if row is not None else None


def resolve_error(ledger: Ledger, ref: str) -> dict:
    """An error by full id or unique id prefix (at least 4 characters)."""
    ref = (ref or "").strip().lower()
    row = ledger.one("SELECT * FROM errors WHERE id = ?", (ref,))
    if row:
        return row
    if len(ref) >= 4:
        rows = ledger.all("SELECT * FROM errors WHERE id LIKE ? LIMIT 2", (ref + "%",))
        if len(rows) == 1:
            return rows[0]
        if len(rows) > 1:
            raise AgentError(f"error id {ref!r} is ambiguous; give more characters")
    raise AgentError(f"no error with id {ref!r}; see `agent error list`")


ERROR_COLUMNS = ("id, fingerprint, service, environment, class, message, count, first_seen, last_seen, state, repo, "
                 "level")


def iter_errors(ledger: Ledger, state: str | None = None, since: str | None = None,
                limit: int | None = None) -> Listing:
    """Errors most recently seen first (``since``: seen at or after that ledger timestamp), read page by page."""
    return Listing(ledger, ERROR_COLUMNS, "errors", [("state = ?", state), ("last_seen >= ?", since)],
                   [("last_seen", "last_seen", True), ("id", "id", False)], limit)


def list_errors(ledger: Ledger, state: str | None = None) -> list[dict]:
    return list(iter_errors(ledger, state))


def error_detail(ledger: Ledger, error_id: str) -> dict:
    e = ledger.one("SELECT * FROM errors WHERE id = ?", (error_id,))
    if e is None:
        raise AgentError(f"no error with id {error_id!r}; see `agent error list`")
    e["frames"] = json.loads(e["frames"] or "[]")
    e["conclusion"] = ledger.one("SELECT id, kind, brief, reason, decided_by, lane_run_id, created_at "
                                 "FROM conclusions WHERE error_id = ?", (error_id,))
    e["task"] = ledger.one("SELECT id, repo, branch, state FROM tasks WHERE error_id = ?", (error_id,))
    return e


def first_error(ledger: Ledger) -> dict | None:
    """The oldest error (the demo's one)."""
    return ledger.one("SELECT id, fingerprint, count FROM errors ORDER BY created_at LIMIT 1")


def conclusion_brief(ledger: Ledger, conclusion_id: int | None) -> str | None:
    if conclusion_id is None:
        return None
    return ledger.scalar("SELECT brief FROM conclusions WHERE id = ?", (conclusion_id,))


def conclusion_of(ledger: Ledger, error_id: str, conn=None) -> dict | None:
    c = conn or ledger.conn
    row = c.execute("SELECT id, kind, decided_by, created_at FROM conclusions WHERE error_id = ?",
                    (error_id,)).fetchone()
    return dict(row) if row is not None else None


def open_draft_for_fingerprint(ledger: Ledger, fingerprint: str, conn=None) -> dict | None:
    """An open draft PR of a task whose error has ``fingerprint`` (a second fix would duplicate it)."""
    c = conn or ledger.conn
    row = c.execute(
        "SELECT p.url, p.number, p.task_id, e.id AS error_id FROM prs p JOIN tasks t ON p.task_id = t.id "
        "JOIN errors e ON t.error_id = e.id WHERE e.fingerprint = ? AND p.state = 'open' AND p.draft = 1 "
        "ORDER BY p.id LIMIT 1", (fingerprint,)).fetchone()
    return dict(row) if row else None


def fix_candidates(ledger: Ledger) -> list[dict]:
    """Confirmed ``error.fix`` conclusions whose error has no task yet (`watch error-fix`)."""
    return ledger.all("SELECT c.id AS conclusion_id, c.error_id, e.service, e.class, e.message, e.repo, e.state "
                      "FROM conclusions c JOIN errors e ON e.id = c.error_id "
                      "LEFT JOIN tasks t ON t.error_id = c.error_id "
                      "WHERE c.kind = 'fix' AND t.id IS NULL AND e.state IN ('open', 'fixing') ORDER BY c.id")


def decide_candidates(ledger: Ledger, min_count: int, seen_since: str, max_lane_attempts: int) -> list[dict]:
    """Open, undecided errors seen at least ``min_count`` times since ``seen_since`` that the decider lane has
    not concluded on and has not tried ``max_lane_attempts`` times."""
    return ledger.all(
        "SELECT e.* FROM errors e LEFT JOIN conclusions c ON c.error_id = e.id "
        "WHERE c.id IS NULL AND e.state = 'open' AND e.count >= ? AND e.last_seen >= ? "
        "AND NOT EXISTS (SELECT 1 FROM lane_runs r WHERE r.error_id = e.id AND r.role = 'decider' "
        "                AND r.status = 'complete') "
        "AND (SELECT count(*) FROM lane_runs r WHERE r.error_id = e.id AND r.role = 'decider') < ? "
        "ORDER BY e.count DESC, e.last_seen DESC", (min_count, seen_since, max_lane_attempts))


# ------------------------------------------------------------------ the error state machine


def transition_error(ledger: Ledger, c, error_id: str, target: str, actor: str, reason: str | None = None,
                     payload: dict | None = None, task_id: int | None = None) -> bool:
    """Move an error to ``target`` inside the caller's transaction ``c``, with its ``error.state`` event.

    Returns False (and writes nothing) when the error is already there; raises ``ErrorStateRefused`` when the
    error state machine does not allow the move, and ``AgentError`` for an unknown error."""
    row = c.execute("SELECT state FROM errors WHERE id = ?", (error_id,)).fetchone()
    if row is None:
        raise AgentError(f"no error with id {error_id!r}; see `agent error list`")
    current = row[0]
    if current == target:
        return False
    why = chain.check_error_transition(current, target)
    if why:
        raise ErrorStateRefused(f"error {error_id}: {why}")
    values: dict[str, Any] = {"state": target}
    if reason is not None:
        values["state_reason"] = reason
    ledger.update(c, "errors", {"id": error_id}, values)
    ledger.event(c, "error.state", actor, {"from": current, "to": target, **(payload or {})},
                 task_id=task_id, error_id=error_id)
    return True


# ------------------------------------------------------------------ conclusions


def insert_conclusion(ledger: Ledger, c, error_id: str, kind: str, text: str, decided_by: str,
                      lane_run_id: int | None) -> int:
    """The one conclusion row of an error (the caller validated it, in the same transaction)."""
    return ledger.insert(c, "conclusions", {
        "error_id": error_id, "kind": kind, "brief": text if kind == "fix" else None,
        "reason": text if kind == "skip" else None, "decided_by": decided_by, "lane_run_id": lane_run_id,
        "created_at": now()})


# ------------------------------------------------------------------ occurrences (intake)

_FIND = ("SELECT id, first_seen, last_seen FROM errors WHERE fingerprint = ? "
         "AND state IN ('open', 'fixing', 'skipped') ORDER BY created_at DESC LIMIT 1")
_INSERT = ("INSERT INTO errors (id, fingerprint, service, environment, class, message, excerpt, signature, frames, "
           "repo, level, release, count, first_seen, last_seen, state, created_at) "
           "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'open', ?)")
# In an UPDATE every expression sees the old row, so the CASEs compare against the old first_seen/last_seen.
_UPDATE = ("UPDATE errors SET count = count + ?, "
           "first_seen = CASE WHEN ? < first_seen THEN ? ELSE first_seen END, "
           "last_seen = CASE WHEN ? > last_seen THEN ? ELSE last_seen END, "
           "excerpt = CASE WHEN ? >= last_seen THEN ? ELSE excerpt END, "
           "message = CASE WHEN ? >= last_seen THEN ? ELSE message END, "
           "release = CASE WHEN ? >= last_seen THEN coalesce(?, release) ELSE release END WHERE id = ?")
_CURSOR = ("INSERT INTO cursors (source, value, updated_at) VALUES (?, ?, ?) "
           "ON CONFLICT(source) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at")


def new_error_id() -> str:
    """16 lowercase hex characters; branches use the first 8."""
    return secrets.token_hex(8)


def record_occurrences(ledger: Ledger, touched: dict[str, dict], actor: str, source: str | None,
                       cursor: tuple[str, str] | None, result, guard: Callable[[Any], None] | None = None) -> None:
    """One intake batch in one transaction: per fingerprint a new error row (``error.ingested``) or the live one
    counted up (``error.seen``), and the source's cursor with them. ``touched`` maps a fingerprint to its prepared
    group (``agent.intake.store._prepare_batch``); ``result`` (an ``IngestResult``) is counted. ``guard(conn)``
    runs first and may raise to write nothing."""
    if not touched and cursor is None:
        return
    with ledger.tx() as c:
        if guard is not None:
            guard(c)
        for fp, t in touched.items():
            row = c.execute(_FIND, (fp,)).fetchone()
            t["id"], t["new"] = (row[0], False) if row else (new_error_id(), True)
            result.error_ids.append(t["id"])
        inserts, updates = [], []
        created = now()
        for fp, t in touched.items():
            p = t["latest"]
            excerpt = t["excerpt"]
            if t["new"]:
                first = t["p"]
                inserts.append((t["id"], fp, first.service, first.environment, first.cls, p.message, excerpt,
                                first.signature, json.dumps(first.frames), p.repo or first.repo, p.level, p.release,
                                t["count"], t["first"], t["last"], created))
                result.new += 1
                result.deduplicated += t["count"] - 1
            else:
                last = t["last"]
                updates.append((t["count"], t["first"], t["first"], last, last, last, excerpt, last, p.message,
                                last, p.release, t["id"]))
                result.deduplicated += t["count"]
        if inserts:
            c.executemany(_INSERT, inserts)
        if updates:
            c.executemany(_UPDATE, updates)
        for fp, t in touched.items():
            p = t["p"]
            if t["new"]:
                ledger.event(c, "error.ingested", actor, {
                    "fingerprint": fp, "service": p.service, "environment": p.environment, "class": p.cls,
                    "count": t["count"], "source": source}, error_id=t["id"])
            else:
                ledger.event(c, "error.seen", actor, {"fingerprint": fp, "count": t["count"],
                                                      "last_seen": t["last"], "source": source}, error_id=t["id"])
        if cursor is not None:
            c.execute(_CURSOR, (cursor[0], cursor[1], now()))


# ------------------------------------------------------------------ source cursors


def get_cursor(ledger: Ledger, key: str) -> str | None:
    return ledger.scalar("SELECT value FROM cursors WHERE source = ?", (key,))


def write_cursor(c, key: str, value: str) -> None:
    """Inside the caller's transaction: a source's cursor (written with the batch it ends)."""
    c.execute(_CURSOR, (key, value, now()))


def set_cursor(ledger: Ledger, key: str, value: str, guard: Callable[[Any], None] | None = None) -> None:
    with ledger.tx() as c:
        if guard is not None:
            guard(c)
        write_cursor(c, key, value)
