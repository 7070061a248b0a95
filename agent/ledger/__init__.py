"""The ledger: one SQLite file holding every error, task, step, lane run and event.

Rules (see DESIGN.md "Ledger"):
- WAL journal, a busy timeout, foreign keys on.
- Every write goes through ``Ledger.tx()``, which opens ``BEGIN IMMEDIATE`` so two writers
  serialise at the start of the transaction instead of failing half-way.
- Every state change writes its event with ``Ledger.event()`` inside the same transaction.
- A file from a newer schema, a corrupt file, or a SQLite file that is not a ledger is refused
  with a one-line error; nothing is recreated or overwritten.
"""

from __future__ import annotations

import json
import sqlite3
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from agent import AgentError
from agent.ledger.feedback import FeedbackQueries

APP_ID = 0x41474E54  # "AGNT" in PRAGMA application_id marks a ledger
ACTORS = ("script", "lane", "human")


class LedgerError(AgentError):
    pass


def now() -> str:
    """UTC timestamp with microseconds, sortable as text."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _known_migrations() -> list[str]:
    from agent.ledger.migrations import MIGRATIONS

    return [name for name, _ in MIGRATIONS]


# Bumped with every migration; checked without importing sqlite_utils so a cron tick stays cheap.
SCHEMA_VERSION = 5


class Ledger(FeedbackQueries):
    def __init__(self, path: Path, conn: sqlite3.Connection):
        self.path = path
        self.conn = conn

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(cls, path: Path | str, create: bool = True) -> "Ledger":
        path = Path(path)
        if path.is_dir():
            raise LedgerError(f"{path}: is a directory, not a ledger; point AGENT_HOME at the folder holding ledger.db")
        if not path.exists() and not create:
            raise LedgerError(f"{path}: no ledger here; run `agent init` first")
        try:
            conn = sqlite3.connect(str(path), timeout=30.0, isolation_level=None, check_same_thread=False)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA busy_timeout = 30000")
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            raise LedgerError(f"{path}: not a readable SQLite ledger ({exc}); move it aside or restore a backup") \
                from None
        if app_id != APP_ID and (tables or version):
            conn.close()
            raise LedgerError(f"{path}: is a SQLite database but not an agent ledger; "
                              "choose another AGENT_HOME or --home")
        if version > SCHEMA_VERSION:
            conn.close()
            raise LedgerError(f"{path}: ledger schema {version} is newer than this agent supports "
                              f"({SCHEMA_VERSION}); upgrade agent-fixer")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        ledger = cls(path, conn)
        if version < SCHEMA_VERSION:
            ledger.migrate()
        return ledger

    def close(self) -> None:
        self.conn.close()

    def migrate(self) -> list[str]:
        """Apply pending migrations, each in its own immediate transaction. Returns the names applied."""
        import sqlite_utils

        db = sqlite_utils.Database(self.conn)
        applied: list[str] = []
        from agent.ledger.migrations import MIGRATIONS

        if len(MIGRATIONS) != SCHEMA_VERSION:  # a developer forgot to bump SCHEMA_VERSION
            raise LedgerError(f"internal: {len(MIGRATIONS)} migrations but SCHEMA_VERSION={SCHEMA_VERSION}")
        with self.tx() as c:
            c.execute("CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)")
            c.execute(f"PRAGMA application_id = {APP_ID}")
        done = {r[0] for r in self.conn.execute("SELECT name FROM _migrations")}
        unknown = done - set(_known_migrations())
        if unknown:
            raise LedgerError(f"{self.path}: ledger has migrations this agent does not know "
                              f"({', '.join(sorted(unknown))}); upgrade agent-fixer")
        for index, (name, fn) in enumerate(MIGRATIONS, start=1):
            if name in done:
                continue
            with self.tx() as c:
                fn(db)
                c.execute("INSERT INTO _migrations (name, applied_at) VALUES (?, ?)", (name, now()))
                c.execute(f"PRAGMA user_version = {index}")
            applied.append(name)
        return applied

    def migrations(self) -> list[str]:
        return [r[0] for r in self.conn.execute("SELECT name FROM _migrations ORDER BY rowid")]

    # ------------------------------------------------------------------ writing

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, opened with BEGIN IMMEDIATE; commits on success, rolls back on error."""
        if self.conn.in_transaction:  # nested use joins the outer transaction
            yield self.conn
            return
        for attempt in range(50):
            try:
                self.conn.execute("BEGIN IMMEDIATE")
                break
            except sqlite3.OperationalError as exc:  # busy beyond busy_timeout: back off and retry
                if "locked" not in str(exc) or attempt == 49:
                    raise LedgerError(f"{self.path}: ledger is busy ({exc}); try again") from None
                time.sleep(0.05 * (attempt + 1))
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        else:
            self.conn.execute("COMMIT")

    def event(self, conn: sqlite3.Connection, kind: str, actor: str, payload: dict | None = None,
              task_id: int | None = None, error_id: str | None = None) -> int:
        """Append one event. Call inside ``tx()`` together with the change it records."""
        if actor not in ACTORS:
            raise ValueError(f"actor must be one of {ACTORS}, got {actor!r}")
        if not conn.in_transaction:
            raise RuntimeError("Ledger.event() must be called inside Ledger.tx()")
        cur = conn.execute(
            "INSERT INTO events (ts, task_id, error_id, kind, actor, payload) VALUES (?, ?, ?, ?, ?, ?)",
            (now(), task_id, error_id, kind, actor, json.dumps(payload or {}, sort_keys=True, default=str)))
        return cur.lastrowid

    def insert(self, conn: sqlite3.Connection, table: str, row: dict[str, Any]) -> int:
        cols = ", ".join(f'"{k}"' for k in row)
        marks = ", ".join("?" for _ in row)
        return conn.execute(f'INSERT INTO "{table}" ({cols}) VALUES ({marks})', tuple(row.values())).lastrowid

    def update(self, conn: sqlite3.Connection, table: str, where: dict[str, Any], values: dict[str, Any]) -> int:
        sets = ", ".join(f'"{k}" = ?' for k in values)
        conds = " AND ".join(f'"{k}" = ?' for k in where)
        return conn.execute(f'UPDATE "{table}" SET {sets} WHERE {conds}',
                            (*values.values(), *where.values())).rowcount

    # ------------------------------------------------------------------ reading

    def one(self, sql: str, params: tuple = ()) -> dict | None:
        row = self.conn.execute(sql, params).fetchone()
        return dict(row) if row is not None else None

    def all(self, sql: str, params: tuple = ()) -> list[dict]:
        return [dict(r) for r in self.conn.execute(sql, params).fetchall()]

    def scalar(self, sql: str, params: tuple = ()) -> Any:
        row = self.conn.execute(sql, params).fetchone()
        return row[0] if row is not None else None

    def events(self, task_id: int | None = None, after_id: int = 0, limit: int | None = None,
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
        rows = self.all(sql, tuple(params))
        if limit and newest:
            rows.reverse()
        for r in rows:
            r["payload"] = json.loads(r["payload"] or "{}")
        return rows

    # ------------------------------------------------------------------ forge calls owed (forge_pending)

    def pending(self, key: str) -> dict | None:
        """The ``forge_pending`` row for ``key`` (``pr_text:<task>`` | ``rate_limit:<forge>``), or None."""
        return self.one("SELECT * FROM forge_pending WHERE key = ?", (key,))

    def pending_of(self, kind: str) -> list[dict]:
        return self.all("SELECT * FROM forge_pending WHERE kind = ? ORDER BY key", (kind,))

    def set_pending(self, conn: sqlite3.Connection, key: str, kind: str, reason: str, task_id: int | None = None,
                    until: float | None = None) -> None:
        """Record (or count again) a forge call owed; call inside ``tx()`` with its event."""
        conn.execute("INSERT INTO forge_pending (key, kind, task_id, until, reason, attempts, updated_at) "
                     "VALUES (?, ?, ?, ?, ?, 1, ?) ON CONFLICT(key) DO UPDATE SET until = excluded.until, "
                     "reason = excluded.reason, attempts = attempts + 1, updated_at = excluded.updated_at",
                     (key, kind, task_id, until, reason, now()))

    def clear_pending(self, conn: sqlite3.Connection, key: str) -> bool:
        return conn.execute("DELETE FROM forge_pending WHERE key = ?", (key,)).rowcount > 0

    def integrity(self) -> str:
        return self.scalar("PRAGMA integrity_check")


def ledger_path(home: Path) -> Path:
    return Path(home) / "ledger.db"

