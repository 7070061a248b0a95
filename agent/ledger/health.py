"""What `agent doctor` asks of the ledger, on either backend; it only looks (never creates or migrates).

- :func:`status`: can it be opened, is it an agent ledger, its schema version against this agent's migrations
  (unknown migrations, a newer schema), SQLite's ``integrity_check`` and WAL, PostgreSQL's server version.
- :func:`runners`: the runners, the task claims and the named leases they hold (doctor's stale-runner check).
- :func:`tamper`: evidence that something other than agent wrote it: schema objects (the append-only triggers
  included) missing, added or changed against what the migrations make; deleted events (gaps in their ids,
  which are gapless on both backends); a task whose round cap its events do not explain.

Each returns plain values; agent/app/doctor.py turns them into checks with their one-line fixes.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

from agent.ledger import APP_ID, SCHEMA_VERSION, backend

T = TypeVar("T")


@dataclass
class Status:
    ok: bool
    detail: str
    fix: str | None = None


def status(where: Path | str) -> Status:
    return _pg_status(where) if backend.is_url(where) else _sqlite_status(Path(where))


def tamper(where: Path | str) -> list[str] | None:
    """Findings (empty: nothing looks tampered with), or None when the ledger cannot be read (``status`` says)."""
    def read(conn, version: int) -> list[str]:
        if backend.is_url(where):
            from agent.ledger import pg
            from agent.ledger.migrations import expected_schema

            return _findings(conn, expected_schema(version), pg.schema_objects(conn))
        return _findings(conn, expected_sqlite_schema(version), sqlite_schema_objects(conn))

    return _read_only(where, read)


def runners(where: Path | str) -> tuple[list[dict], list[dict], list[dict], float] | None:
    """(runners, task claims, held named leases, the ledger's time) read through a read-only connection, or None
    when the ledger cannot be read (``status`` says why) or predates runners."""
    from agent.ledger.leases import holdings

    return _read_only(where, holdings)


def _read_only(where: Path | str, read: Callable[[Any, int], T]) -> T | None:
    """``read(conn, schema version)`` through a read-only connection of either backend (rows by name and index),
    or None when the ledger cannot be opened or read, is not an agent ledger, or is newer than this agent (``status``
    says which)."""
    if backend.is_url(where):
        conn = _pg_connect(where)
        if conn is None:
            return None
        try:
            version = _pg_version(conn)
            if version is None or version > SCHEMA_VERSION:
                return None
            return read(conn, version)
        except Exception:  # noqa: BLE001 - status() reports an unreadable ledger
            return None
        finally:
            conn.close()
    path = Path(where)
    if not path.exists():
        return None
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5.0)
    except sqlite3.Error:
        return None
    try:
        conn.row_factory = sqlite3.Row
        if conn.execute("PRAGMA application_id").fetchone()[0] != APP_ID:
            return None
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            return None
        return read(conn, version)
    except sqlite3.DatabaseError:
        return None
    finally:
        conn.close()


# ------------------------------------------------------------------ SQLite


def _sqlite_status(path: Path) -> Status:
    if not path.exists():
        return Status(False, f"{path}: no ledger yet", "run `agent init` to create the home and ledger")
    aside = f"move {path} aside (keep it for forensics) and run `agent init`, or restore a backup"
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5.0)
    except sqlite3.Error as exc:
        return Status(False, f"{path}: cannot open ({exc})", aside)
    try:
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if app_id != APP_ID:
            return Status(False, f"{path}: a SQLite file but not an agent ledger",
                          "point AGENT_HOME / --home at the folder that holds your ledger.db")
        if version > SCHEMA_VERSION:
            return Status(False, f"{path}: schema {version} is newer than this agent ({SCHEMA_VERSION})",
                          "upgrade agent-fixer to the version that wrote this ledger")
        problems = [r[0] for r in conn.execute("PRAGMA integrity_check").fetchall()]
        if problems != ["ok"]:
            return Status(False, f"{path}: integrity_check failed: {'; '.join(problems[:3])[:300]}", aside)
        journal = conn.execute("PRAGMA journal_mode").fetchone()[0]
        tasks = conn.execute("SELECT count(*) FROM tasks").fetchone()[0]
    except sqlite3.DatabaseError as exc:
        return Status(False, f"{path}: not a readable SQLite ledger ({exc})", aside)
    finally:
        conn.close()
    if journal.lower() != "wal":
        return Status(False, f"{path}: journal mode {journal}, expected wal",
                      f"run `sqlite3 {path} 'PRAGMA journal_mode=WAL'` (or any agent command, which sets it)")
    pending = f"; {SCHEMA_VERSION - version} migration(s) pending, applied by the next command" \
        if version < SCHEMA_VERSION else ""
    return Status(True, f"{path}: schema {version}, integrity ok, WAL, {tasks} task(s){pending}")


def sqlite_schema_objects(conn: sqlite3.Connection) -> dict[str, str]:
    """``type name`` -> normalised SQL of every table, index and trigger (what a migration made)."""
    out = {}
    for typ, name, sql in conn.execute("SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' "
                                       "ORDER BY type, name"):
        out[f"{typ} {name}"] = " ".join((sql or "").split())
    return out


def expected_sqlite_schema(version: int) -> dict[str, str]:
    """The schema objects the first ``version`` migrations make, built in memory."""
    import sqlite_utils

    from agent.ledger.migrations import MIGRATIONS

    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        conn.execute("CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)")
        db = sqlite_utils.Database(conn)
        for _, fn in MIGRATIONS[:version]:
            fn(db)
        return sqlite_schema_objects(conn)
    finally:
        conn.close()


# ------------------------------------------------------------------ PostgreSQL


def _pg_connect(url: str):
    try:
        conn = backend.connect_pg(url)
    except backend.BackendError:
        return None
    conn.execute("SET default_transaction_read_only = on")
    return conn


def _pg_version(conn) -> int | None:
    import psycopg

    try:
        return conn.execute("SELECT count(*) FROM _migrations").fetchone()[0]
    except psycopg.errors.UndefinedTable:
        return None


def _pg_status(url: str) -> Status:
    import psycopg

    from agent.ledger import _known_migrations

    shown = backend.display(url)
    try:
        conn = backend.connect_pg(url)
    except backend.BackendError as exc:
        return Status(False, str(exc).split("; check ")[0],
                      f"start the server or fix ledger.url / {backend.ENV_URL} (host, port, database, user; a "
                      "password belongs in PGPASSWORD or ~/.pgpass)")
    try:
        conn.execute("SET default_transaction_read_only = on")
        server = conn.execute("SHOW server_version").fetchone()[0].split()[0]
        version = _pg_version(conn)
        if version is None:
            return Status(False, f"{shown}: no ledger in this database yet (no _migrations table)",
                          "run `agent init` with this ledger.url / AGENT_LEDGER_URL")
        names = [r[0] for r in conn.execute("SELECT name FROM _migrations ORDER BY seq").fetchall()]
        unknown = sorted(set(names) - set(_known_migrations()))
        if unknown:
            return Status(False, f"{shown}: migrations this agent does not know: {', '.join(unknown[:5])}",
                          "upgrade agent-fixer to the version that wrote this ledger")
        if version > SCHEMA_VERSION:
            return Status(False, f"{shown}: schema {version} is newer than this agent ({SCHEMA_VERSION})",
                          "upgrade agent-fixer to the version that wrote this ledger")
        tasks = conn.execute("SELECT count(*) FROM tasks").fetchone()[0]
    except psycopg.Error as exc:
        return Status(False, f"{shown}: cannot read the ledger ({' '.join(str(exc).split())[:200]})",
                      "check the database user's privileges on the ledger's tables")
    finally:
        conn.close()
    pending = f"; {SCHEMA_VERSION - version} migration(s) pending, applied by the next command" \
        if version < SCHEMA_VERSION else ""
    return Status(True, f"{shown}: PostgreSQL {server}, schema {version}, {tasks} task(s){pending}")


# ------------------------------------------------------------------ both


def _findings(conn, want: dict, have: dict) -> list[str]:
    found: list[str] = []
    missing = sorted(set(want) - set(have))
    extra = sorted(set(have) - set(want))
    changed = sorted(k for k in set(want) & set(have) if want[k] != have[k])
    if missing:
        found.append("missing " + ", ".join(missing[:6]))
    if extra:
        found.append("not made by a migration: " + ", ".join(extra[:6]))
    if changed:
        found.append("changed: " + ", ".join(changed[:6]))
    if "table events" in have:
        lo, hi, n = conn.execute("SELECT min(id), max(id), count(*) FROM events").fetchone()
        if n and (lo != 1 or hi - lo + 1 != n):
            found.append(f"events deleted: {hi - n} id(s) missing between 1 and {hi}")
    if "table tasks" in have and "table events" in have:
        caps: dict[int, int] = {}
        for task_id, payload in conn.execute(
                "SELECT task_id, payload FROM events WHERE kind IN ('task.created', 'task.reset') "
                "AND task_id IS NOT NULL ORDER BY id").fetchall():
            try:
                cap = json.loads(payload or "{}").get("round_cap")
            except (ValueError, AttributeError):
                continue
            if cap is not None:
                caps[task_id] = cap
        odd = [f"task {tid} ({cap}, events say {caps[tid]})"
               for tid, cap in conn.execute("SELECT id, round_cap FROM tasks ORDER BY id").fetchall()
               if tid in caps and cap != caps[tid]]
        if odd:
            found.append("round cap changed outside `agent task reset`: " + ", ".join(odd[:5]))
    return found
