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
"""

from __future__ import annotations

import time
from typing import Any

from agent import AgentError


class ClaimLost(AgentError):
    """A worker's claim token no longer matches the task's: someone else owns it now."""


class LeaseLost(ClaimLost):
    """A write carried a fencing token that is no longer the current one (the lease expired and another runner
    took it): nothing was written."""


def skip_locked(ledger) -> str:
    """The row-lock clause a claim's read takes: ``FOR UPDATE SKIP LOCKED`` on PostgreSQL (a row another
    transaction is claiming is skipped, not waited for), nothing on SQLite (``BEGIN IMMEDIATE`` serialises)."""
    return ledger.dialect.for_update_skip_locked


CLAIM_LEASE_S = 120.0   # a task claim's lease (agent.fence.LEASE_S); renewed every third of it while a lane runs
LEASE_ENV = "AGENT_CLAIM_LEASE_S"


def claim_lease_s() -> float:
    """A task claim's lease in seconds: ``$AGENT_CLAIM_LEASE_S`` (operators, tests) or 120."""
    import os

    try:
        return max(0.05, float(os.environ.get(LEASE_ENV, CLAIM_LEASE_S)))
    except ValueError:
        return CLAIM_LEASE_S


def check_claim(conn, task_id: int, token: str | None, lease_s: float | None = None) -> None:
    """The fencing check, inside the write's own transaction ``conn``: raise LeaseLost unless ``token`` is the
    task's current claim token (None: a write that needs no claim, e.g. a human's). A holder whose lease expired
    but whom nobody replaced still holds the task: its lease is renewed here and the write goes on."""
    if token is None:
        return
    row = conn.execute("SELECT claim_token, lease_until FROM tasks WHERE id = ?", (task_id,)).fetchone()
    if row is None or row["claim_token"] != token:
        raise LeaseLost(f"task {task_id}: claim lost to another worker; result not written")
    now = time.time()
    if row["lease_until"] is not None and row["lease_until"] < now:
        conn.execute("UPDATE tasks SET lease_until = ? WHERE id = ? AND claim_token = ?",
                     (now + (lease_s or claim_lease_s()), task_id, token))


_RUNNER_COLUMNS = "id, host, home, pid, pid_start, version, started_at, heartbeat_at"
RUNNERS_SQL = f"SELECT {_RUNNER_COLUMNS} FROM runners ORDER BY id"
CLAIMS_SQL = ("SELECT id AS task_id, state, claim_runner, claim_owner, claim_pid, claim_token, lease_until "
              "FROM tasks WHERE claim_token IS NOT NULL ORDER BY id")
LEASES_SQL = "SELECT name, holder, runner, token, until FROM leases WHERE holder IS NOT NULL ORDER BY name"


def holdings(conn) -> tuple[list[dict], list[dict], list[dict]]:
    """The runners, every recorded task claim and every held named lease, read through ``conn`` (any connection
    of either backend with rows by name: `agent doctor` reads through its own read-only one, health.py)."""
    return tuple([dict(r) for r in conn.execute(sql).fetchall()]   # type: ignore[return-value]
                 for sql in (RUNNERS_SQL, CLAIMS_SQL, LEASES_SQL))


class LeaseQueries:
    """Mixed into ``Ledger``: the record operations of runners, task claims and named leases."""

    # ------------------------------------------------------------------ runners

    def beat_runner(self, runner: dict[str, Any]) -> bool:
        """Register (first time, with a ``runner.registered`` event) or beat a runner. ``runner`` has id, host,
        home, pid, pid_start, version. Returns True when it was new."""
        from agent.ledger import now

        ts = time.time()
        with self.tx() as c:
            changed = c.execute(
                "UPDATE runners SET host = ?, home = ?, pid = ?, pid_start = ?, version = ?, heartbeat_at = ? "
                "WHERE id = ?", (runner["host"], runner["home"], runner.get("pid"), runner.get("pid_start"),
                                 runner.get("version"), ts, runner["id"])).rowcount
            if changed:
                return False
            c.execute("INSERT INTO runners (id, host, home, pid, pid_start, version, started_at, heartbeat_at) "
                      "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET heartbeat_at = "
                      "excluded.heartbeat_at",
                      (runner["id"], runner["host"], runner["home"], runner.get("pid"), runner.get("pid_start"),
                       runner.get("version"), now(), ts))
            self.event(c, "runner.registered", "script", {k: runner.get(k) for k in ("id", "host", "home",
                                                                                      "version")})
            return True

    def beat_runner_at(self, conn, runner_id: str) -> None:
        """Inside the caller's transaction: the runner is alive now (the lease keeper beats with each renewal)."""
        conn.execute("UPDATE runners SET heartbeat_at = ? WHERE id = ?", (time.time(), runner_id))

    def runner_rows(self) -> list[dict]:
        return self.all(RUNNERS_SQL)

    def held_claims(self) -> list[dict]:
        """Every task claim currently recorded (live or expired), with the runner holding it."""
        return self.all(CLAIMS_SQL)

    def held_leases(self) -> list[dict]:
        """Every named lease someone holds (live or expired, not released), with its runner."""
        return self.all(LEASES_SQL)

    def prune_runners(self, heartbeat_before: float, why: dict[str, Any] | None = None) -> list[dict]:
        """Remove the runners whose heartbeat is older than ``heartbeat_before`` (epoch seconds) and that hold
        nothing: no task claim (live or expired) and no named lease. One transaction, a ``runner.pruned`` event
        per removed row (its payload: the row, plus ``why``). Returns the removed rows. The DELETE re-checks both
        conditions itself, so a runner that beat or took a claim meanwhile stays."""
        idle = ("heartbeat_at < ? AND NOT EXISTS (SELECT 1 FROM tasks WHERE tasks.claim_runner = runners.id AND "
                "tasks.claim_token IS NOT NULL) AND NOT EXISTS (SELECT 1 FROM leases WHERE leases.runner = "
                "runners.id AND leases.holder IS NOT NULL)")
        removed = []
        with self.tx() as c:
            rows = c.execute(f"SELECT {_RUNNER_COLUMNS} FROM runners WHERE {idle} ORDER BY id",
                             (heartbeat_before,)).fetchall()
            for row in rows:
                if c.execute(f"DELETE FROM runners WHERE id = ? AND {idle}",
                             (row["id"], heartbeat_before)).rowcount != 1:
                    continue
                removed.append(dict(row))
                self.event(c, "runner.pruned", "human", {**dict(row), **(why or {})})
        return removed

    # ------------------------------------------------------------------ task claims

    def claim_row(self, conn, task_id: int) -> dict | None:
        """The task's claim as it stands, read for a claim (row-locked on PostgreSQL; None: no such task, or
        another transaction is claiming it right now)."""
        row = conn.execute("SELECT claim_owner, claim_pid, claim_runner, claim_token, lease_until, fence "
                           f"FROM tasks WHERE id = ?{skip_locked(self)}", (task_id,)).fetchone()
        return dict(row) if row is not None else None

    def take_claim(self, conn, task_id: int, fence: int, owner: str, pid: int, runner: str,
                   lease_until: float) -> str | None:
        """Inside the caller's transaction: set a new claim whose fencing counter is ``fence`` (the previous one
        + 1). Compare-and-set on the previous counter, so two claims can never both win. Returns the token."""
        token = str(fence)
        done = conn.execute(
            "UPDATE tasks SET claim_owner = ?, claim_pid = ?, claim_runner = ?, claim_token = ?, lease_until = ?, "
            "fence = ? WHERE id = ? AND coalesce(fence, 0) = ?",
            (owner, pid, runner, token, lease_until, fence, task_id, fence - 1)).rowcount
        return token if done == 1 else None

    def renew_claim(self, task_id: int, token: str, lease_until: float, runner: str | None = None) -> bool:
        """Extend a claim's lease if ``token`` still holds it (and beat its runner); False: the claim is lost."""
        with self.tx() as c:
            ok = c.execute("UPDATE tasks SET lease_until = ? WHERE id = ? AND claim_token = ?",
                           (lease_until, task_id, token)).rowcount == 1
            if ok and runner:
                self.beat_runner_at(c, runner)
            return ok

    def release_claim(self, task_id: int, token: str) -> None:
        """Drop the claim if ``token`` holds it. ``claim_runner`` stays: the runner that last held the task."""
        with self.tx() as c:
            c.execute("UPDATE tasks SET claim_owner = NULL, claim_pid = NULL, claim_token = NULL, "
                      "lease_until = NULL WHERE id = ? AND claim_token = ?", (task_id, token))

    def check_claim(self, conn, task_id: int, token: str | None, lease_s: float | None = None) -> None:
        check_claim(conn, task_id, token, lease_s)

    # ------------------------------------------------------------------ named leases

    def take_lease(self, name: str, holder: str, runner: str | None, ttl: float,
                   stale_token: int | None = None) -> int | None:
        """Take the named lease for ``ttl`` seconds if it is free, expired, already ``holder``'s, or still held
        under ``stale_token`` (a holder the caller found dead: ``agent.fence.named_lease``). Returns its token (one
        more than the last holder's), or None while someone else holds it. One atomic statement."""
        from agent.ledger import now

        ts = time.time()
        with self.tx() as c:
            row = c.execute(
                "INSERT INTO leases (name, holder, runner, token, until, updated_at) VALUES (?, ?, ?, 1, ?, ?) "
                "ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, runner = excluded.runner, "
                "token = leases.token + 1, until = excluded.until, updated_at = excluded.updated_at "
                "WHERE leases.until < ? OR leases.holder = ? OR leases.holder IS NULL OR leases.token = ? "
                "RETURNING token",
                (name, holder, runner, ts + ttl, now(), ts, holder,
                 -1 if stale_token is None else int(stale_token))).fetchone()
            return int(row[0]) if row is not None else None

    def lease_row(self, name: str) -> dict | None:
        return self.one("SELECT name, holder, runner, token, until, updated_at FROM leases WHERE name = ?", (name,))

    def renew_lease(self, name: str, token: int, ttl: float) -> bool:
        with self.tx() as c:
            return c.execute("UPDATE leases SET until = ? WHERE name = ? AND token = ?",
                             (time.time() + ttl, name, token)).rowcount == 1

    def release_lease(self, name: str, token: int) -> None:
        """Free the lease if ``token`` holds it; the row (and its token counter) stays."""
        with self.tx() as c:
            c.execute("UPDATE leases SET holder = NULL, runner = NULL, until = 0 WHERE name = ? AND token = ?",
                      (name, token))

    def check_lease(self, conn, name: str, token: int) -> None:
        """The fencing check of a named lease inside the caller's write transaction: raise LeaseLost unless
        ``token`` is still the lease's current token (expired but not taken by anyone still counts)."""
        row = conn.execute("SELECT token, holder FROM leases WHERE name = ?", (name,)).fetchone()
        if row is None or row["holder"] is None or int(row["token"]) != int(token):
            raise LeaseLost(f"lease {name}: taken over by another runner; nothing written")

    def check_cursor(self, conn, source: str, expected: str | None) -> None:
        """Inside the caller's write transaction: raise LeaseLost unless the source's cursor is still ``expected``
        (the value the pull started from): a page another runner already stored is never stored again."""
        row = conn.execute("SELECT value FROM cursors WHERE source = ?", (source,)).fetchone()
        if (row["value"] if row is not None else None) != expected:
            raise LeaseLost(f"source {source}: its cursor moved while this pull ran (another runner stored that "
                            "page); nothing written")

    def lease_rows(self) -> list[dict]:
        return self.all("SELECT name, holder, runner, token, until, updated_at FROM leases ORDER BY name")
