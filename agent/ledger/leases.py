"""Runners, task claims with fencing tokens, and named leases: their ledger records (DESIGN.md "Runners, leases
and fencing").

- ``runners``: one row per runner (a home on a host). ``beat_runner`` registers or beats it.
- Task claims: ``tasks.claim_owner/claim_pid/claim_runner/claim_token/lease_until`` and ``tasks.fence``. A new
  claim increments ``fence`` in the claiming UPDATE and its token is made from it, so a task's tokens strictly
  increase; ``check_claim`` is the fencing check every task write runs inside its own transaction.
- ``leases``: named leases (``source:<key>`` for a source's cursor, ``pr-open`` around the PR limits and the PR
  create) taken with one atomic upsert; their token too increases on every new holder.

SQL here is portable (``?`` placeholders, ``ON CONFLICT``, ``RETURNING``, no SQLite-only functions); on PostgreSQL
the claim's read locks the row (``FOR UPDATE SKIP LOCKED``), on SQLite ``BEGIN IMMEDIATE`` serialises already.

**One clock.** Every lease deadline (``tasks.lease_until``, ``leases.until``) and heartbeat is set and compared with
the ledger's own clock (``dialect.clock``: PostgreSQL's ``clock_timestamp()``, SQLite's ``'now'``) inside the
statement that uses it; a runner's clock never enters a deadline. A heartbeat records how far the runner's clock
is off the ledger's (``runners.clock_offset_s``).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator

from agent import AgentError
from agent.ledger.clock import claim_lease_s


class ClaimLost(AgentError):
    """A worker's claim token no longer matches the task's: someone else owns it now."""


class LeaseLost(ClaimLost):
    """A write carried a fencing token that is no longer the current one (the lease expired and another runner
    took it): nothing was written."""


def skip_locked(ledger) -> str:
    """The row-lock clause a claim's read takes: ``FOR UPDATE SKIP LOCKED`` on PostgreSQL (a row another
    transaction is claiming is skipped, not waited for), nothing on SQLite (``BEGIN IMMEDIATE`` serialises)."""
    return ledger.dialect.for_update_skip_locked


def clock_of(conn) -> str:
    """The ledger clock's SQL for a raw connection (PostgreSQL's wrapper, or sqlite3's)."""
    from agent.ledger.backend import POSTGRES, SQLITE

    return (SQLITE if hasattr(conn, "create_function") else POSTGRES).clock


def db_clock(conn) -> float:
    """The ledger's time now, in epoch seconds (through any connection of either backend)."""
    return float(conn.execute(f"SELECT {clock_of(conn)}").fetchone()[0])


def check_claim(conn, task_id: int, token: str | None, lease_s: float | None = None) -> None:
    """The fencing check, inside the write's own transaction ``conn``: raise LeaseLost unless ``token`` is the
    task's current claim token (None: a write that needs no claim, e.g. a human's). A holder whose lease expired
    (on the ledger's clock) but whom nobody replaced still holds the task: its lease is renewed here and the write
    goes on."""
    if token is None:
        return
    clock = clock_of(conn)
    row = conn.execute(f"SELECT claim_token, lease_until < {clock} AS expired FROM tasks WHERE id = ?",
                       (task_id,)).fetchone()
    if row is None or row["claim_token"] != token:
        raise LeaseLost(f"task {task_id}: claim lost to another worker; result not written")
    if row["expired"]:
        conn.execute(f"UPDATE tasks SET lease_until = {clock} + ? WHERE id = ? AND claim_token = ?",
                     (lease_s or claim_lease_s(), task_id, token))


_OLD_RUNNER_COLUMNS = "id, host, home, pid, pid_start, version, started_at, heartbeat_at"
_RUNNER_COLUMNS = _OLD_RUNNER_COLUMNS + ", clock_offset_s, stopped_at, machine, scope"
RUNNERS_SQL = f"SELECT {_RUNNER_COLUMNS} FROM runners ORDER BY id"
CLAIMS_SQL = ("SELECT id AS task_id, state, claim_runner, claim_owner, claim_pid, claim_token, lease_until "
              "FROM tasks WHERE claim_token IS NOT NULL ORDER BY id")
LEASES_SQL = "SELECT name, holder, runner, token, until FROM leases WHERE holder IS NOT NULL ORDER BY name"


def holdings(conn, version: int | None = None) -> tuple[list[dict], list[dict], list[dict], float]:
    """The runners, every recorded task claim and every held named lease, read through ``conn`` (any connection
    of either backend with rows by name: `agent doctor` reads through its own read-only one, health.py), and the
    ledger's time they are to be judged by. A ledger from before m012 (``version`` < 12: it is the 12th migration)
    lacks the runners' clock and liveness columns: they read as NULL."""
    runners_sql = RUNNERS_SQL if version is None or version >= 12 else \
        f"SELECT {_OLD_RUNNER_COLUMNS} FROM runners ORDER BY id"
    rows = tuple([dict(r) for r in conn.execute(sql).fetchall()] for sql in (runners_sql, CLAIMS_SQL, LEASES_SQL))
    return (*rows, db_clock(conn))   # type: ignore[return-value]


# ------------------------------------------------------------------ runners


def beat_runner(ledger, runner: dict[str, Any]) -> dict[str, Any]:
    """Register (first time, with a ``runner.registered`` event) or beat a runner. ``runner`` has id, host,
    home, pid, pid_start, version, machine, scope. The heartbeat is the ledger's time; the runner's clock
    (read right before the statement, inside the transaction) minus the ledger's is recorded as its
    ``clock_offset_s``. A beat clears a clean stop. Returns ``{"new": registered now, "clock_offset_s": ...}``."""
    from agent.ledger.clock import now

    clock = ledger.dialect.clock
    with ledger.tx() as c:
        row = c.execute(
            f"UPDATE runners SET host = ?, home = ?, pid = ?, pid_start = ?, version = ?, machine = ?, scope = ?, "
            f"heartbeat_at = {clock}, clock_offset_s = ? - {clock}, stopped_at = NULL WHERE id = ? "
            "RETURNING clock_offset_s",
            (runner["host"], runner["home"], runner.get("pid"), runner.get("pid_start"), runner.get("version"),
             runner.get("machine"), runner.get("scope"), time.time(), runner["id"])).fetchone()
        if row is not None:
            return {"new": False, "clock_offset_s": row[0]}
        row = c.execute(
            "INSERT INTO runners (id, host, home, pid, pid_start, version, machine, scope, started_at, "
            f"heartbeat_at, clock_offset_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, {clock}, ? - {clock}) "
            "ON CONFLICT (id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at RETURNING clock_offset_s",
            (runner["id"], runner["host"], runner["home"], runner.get("pid"), runner.get("pid_start"),
             runner.get("version"), runner.get("machine"), runner.get("scope"), now(), time.time())).fetchone()
        ledger.event(c, "runner.registered", "script", {k: runner.get(k) for k in ("id", "host", "home",
                                                                                   "version")})
        return {"new": True, "clock_offset_s": row[0]}


def beat_runner_at(ledger, conn, runner_id: str) -> None:
    """Inside the caller's transaction: the runner is alive now (the lease keeper beats with each renewal)."""
    clock = ledger.dialect.clock
    conn.execute(f"UPDATE runners SET heartbeat_at = {clock}, clock_offset_s = ? - {clock}, stopped_at = NULL "
                 "WHERE id = ?", (time.time(), runner_id))


def stop_runner(ledger, runner_id: str, pid: int) -> bool:
    """A clean stop: mark the runner stopped (the ledger's time) if ``pid`` was the last process to beat for
    it (another process of the same runner that beat since keeps it alive). True when marked."""
    with ledger.tx() as c:
        return c.execute(f"UPDATE runners SET stopped_at = {ledger.dialect.clock} WHERE id = ? AND pid = ?",
                         (runner_id, pid)).rowcount == 1


def clock_now(ledger) -> float:
    """The ledger's time, in epoch seconds."""
    return float(ledger.scalar(f"SELECT {ledger.dialect.clock}"))


def runner_rows(ledger) -> list[dict]:
    return ledger.all(RUNNERS_SQL)


def held_claims(ledger) -> list[dict]:
    """Every task claim currently recorded (live or expired), with the runner holding it."""
    return ledger.all(CLAIMS_SQL)


def held_leases(ledger) -> list[dict]:
    """Every named lease someone holds (live or expired, not released), with its runner."""
    return ledger.all(LEASES_SQL)


def prune_runners(ledger, older_than_s: float, why: dict[str, Any] | None = None) -> list[dict]:
    """Remove the runners whose heartbeat is older than ``older_than_s`` seconds (on the ledger's clock) and
    that hold nothing: no task claim (live or expired) and no named lease. One transaction, a
    ``runner.pruned`` event per removed row (its payload: the row, plus ``why``). Returns the removed rows. The
    DELETE re-checks both conditions itself, so a runner that beat or took a claim meanwhile stays."""
    idle = (f"heartbeat_at < {ledger.dialect.clock} - ? AND NOT EXISTS (SELECT 1 FROM tasks WHERE tasks.claim_runner = runners.id AND "
            "tasks.claim_token IS NOT NULL) AND NOT EXISTS (SELECT 1 FROM leases WHERE leases.runner = "
            "runners.id AND leases.holder IS NOT NULL)")
    removed = []
    with ledger.tx() as c:
        rows = c.execute(f"SELECT {_RUNNER_COLUMNS} FROM runners WHERE {idle} ORDER BY id",
                         (older_than_s,)).fetchall()
        for row in rows:
            if c.execute(f"DELETE FROM runners WHERE id = ? AND {idle}",
                         (row["id"], older_than_s)).rowcount != 1:
                continue
            removed.append(dict(row))
            ledger.event(c, "runner.pruned", "human", {**dict(row), **(why or {})})
    return removed


# ------------------------------------------------------------------ task claims


def claim_row(ledger, conn, task_id: int) -> dict | None:
    """The task's claim as it stands, read for a claim (row-locked on PostgreSQL; None: no such task, or
    another transaction is claiming it right now), with ``expired``: whether its lease ended on the ledger's
    clock, judged in the same statement."""
    row = conn.execute("SELECT claim_owner, claim_pid, claim_runner, claim_token, claim_scope, lease_until, fence, "
                       f"lease_until < {ledger.dialect.clock} AS expired "
                       f"FROM tasks WHERE id = ?{skip_locked(ledger)}", (task_id,)).fetchone()
    return dict(row) if row is not None else None


def take_claim(ledger, conn, task_id: int, fence: int, owner: str, pid: int, runner: str,
               lease_s: float, scope: str | None = None) -> str | None:
    """Inside the caller's transaction: set a new claim whose fencing counter is ``fence`` (the previous one
    + 1), its lease ``lease_s`` seconds from the ledger's now. Compare-and-set on the previous counter, so
    two claims can never both win. Returns the token."""
    token = str(fence)
    done = conn.execute(
        "UPDATE tasks SET claim_owner = ?, claim_pid = ?, claim_runner = ?, claim_token = ?, claim_scope = ?, "
        f"lease_until = {ledger.dialect.clock} + ?, fence = ? WHERE id = ? AND coalesce(fence, 0) = ?",
        (owner, pid, runner, token, scope, lease_s, fence, task_id, fence - 1)).rowcount
    return token if done == 1 else None


def renew_claim(ledger, task_id: int, token: str, lease_s: float, runner: str | None = None) -> bool:
    """Extend a claim's lease to ``lease_s`` seconds from the ledger's now if ``token`` still holds it (and
    beat its runner); False: the claim is lost."""
    with ledger.tx() as c:
        ok = c.execute(f"UPDATE tasks SET lease_until = {ledger.dialect.clock} + ? WHERE id = ? AND claim_token = ?",
                       (lease_s, task_id, token)).rowcount == 1
        if ok and runner:
            beat_runner_at(ledger, c, runner)
        return ok


def release_claim(ledger, task_id: int, token: str) -> None:
    """Drop the claim if ``token`` holds it. ``claim_runner`` stays: the runner that last held the task."""
    with ledger.tx() as c:
        c.execute("UPDATE tasks SET claim_owner = NULL, claim_pid = NULL, claim_token = NULL, "
                  "lease_until = NULL WHERE id = ? AND claim_token = ?", (task_id, token))


@contextmanager
def holding_claim(ledger, task_id: int, token: str | None, doing: str = "nothing pushed") -> Iterator[None]:
    """The fence around a side effect outside the ledger (a push): one transaction checks that ``token`` is
    still the task's claim and keeps the task's row locked while the body runs, so no other runner takes the
    claim between the check and the side effect (PostgreSQL: a row lock, which a claim's ``FOR UPDATE SKIP
    LOCKED`` read passes over, without the ledger's write lock; SQLite: its write lock). LeaseLost before the
    body when the claim is gone; an expired lease nobody took is renewed, as in ``check_claim``. The body must
    not write the ledger. ``token=None`` (acting without a claim): no fence."""
    if token is None:
        yield
        return
    clock = ledger.dialect.clock
    with ledger.tx(exclusive=False) as c:
        row = c.execute(f"SELECT claim_token, lease_until < {clock} AS expired FROM tasks WHERE id = ?"
                        f"{ledger.dialect.for_update}", (task_id,)).fetchone()
        if row is None or row["claim_token"] != token:
            raise LeaseLost(f"task {task_id}: claim lost to another worker; {doing}")
        if row["expired"]:
            c.execute(f"UPDATE tasks SET lease_until = {clock} + ? WHERE id = ? AND claim_token = ?",
                      (claim_lease_s(), task_id, token))
        yield


# ------------------------------------------------------------------ named leases


def take_lease(ledger, name: str, holder: str, runner: str | None, ttl: float,
               stale_token: int | None = None, scope: str | None = None) -> int | None:
    """Take the named lease for ``ttl`` seconds (on the ledger's clock) if it is free, expired, already
    ``holder``'s, or still held under ``stale_token`` (a holder the caller found dead:
    ``agent.coord.claims.named_lease``). Returns its token (one more than the last holder's), or None while someone
    else holds it. One atomic statement."""
    from agent.ledger.clock import now

    clock = ledger.dialect.clock
    with ledger.tx() as c:
        row = c.execute(
            "INSERT INTO leases (name, holder, runner, scope, token, until, updated_at) "
            f"VALUES (?, ?, ?, ?, 1, {clock} + ?, ?) "
            "ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, runner = excluded.runner, "
            "scope = excluded.scope, token = leases.token + 1, until = excluded.until, "
            f"updated_at = excluded.updated_at WHERE leases.until < {clock} OR leases.holder = ? "
            "OR leases.holder IS NULL OR leases.token = ? RETURNING token",
            (name, holder, runner, scope, ttl, now(), holder,
             -1 if stale_token is None else int(stale_token))).fetchone()
        return int(row[0]) if row is not None else None


def lease_row(ledger, name: str) -> dict | None:
    return ledger.one("SELECT name, holder, runner, scope, token, until, updated_at FROM leases WHERE name = ?",
                      (name,))


def renew_lease(ledger, name: str, token: int, ttl: float) -> bool:
    with ledger.tx() as c:
        return c.execute(f"UPDATE leases SET until = {ledger.dialect.clock} + ? WHERE name = ? AND token = ?",
                         (ttl, name, token)).rowcount == 1


def release_lease(ledger, name: str, token: int) -> None:
    """Free the lease if ``token`` holds it; the row (and its token counter) stays."""
    with ledger.tx() as c:
        c.execute("UPDATE leases SET holder = NULL, runner = NULL, until = 0 WHERE name = ? AND token = ?",
                  (name, token))


def check_lease(ledger, conn, name: str, token: int) -> None:
    """The fencing check of a named lease inside the caller's write transaction: raise LeaseLost unless
    ``token`` is still the lease's current token (expired but not taken by anyone still counts)."""
    row = conn.execute("SELECT token, holder FROM leases WHERE name = ?", (name,)).fetchone()
    if row is None or row["holder"] is None or int(row["token"]) != int(token):
        raise LeaseLost(f"lease {name}: taken over by another runner; nothing written")


def check_cursor(ledger, conn, source: str, expected: str | None) -> None:
    """Inside the caller's write transaction: raise LeaseLost unless the source's cursor is still ``expected``
    (the value the pull started from): a page another runner already stored is never stored again."""
    row = conn.execute("SELECT value FROM cursors WHERE source = ?", (source,)).fetchone()
    if (row["value"] if row is not None else None) != expected:
        raise LeaseLost(f"source {source}: its cursor moved while this pull ran (another runner stored that "
                        "page); nothing written")


def lease_rows(ledger) -> list[dict]:
    return ledger.all("SELECT name, holder, runner, token, until, updated_at FROM leases ORDER BY name")


@contextmanager
def claimed_tx(ledger, task_id: int, token: str | None) -> Iterator[Any]:
    """A write transaction that first proves the caller still holds the task's claim."""
    with ledger.tx() as c:
        check_claim(c, task_id, token)
        yield c
