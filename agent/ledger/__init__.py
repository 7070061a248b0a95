"""The ledger: every error, task, step, lane run and event, in one SQLite file (the embedded default) or one
PostgreSQL database (``ledger.url`` / ``AGENT_LEDGER_URL``; agent/ledger/backend.py).

``Ledger`` is the connection and its transactions (open, migrate, ``tx``, ``event``, ``insert``/``update``/``delete``,
``one``/``all``/``scalar``); every record operation is a function in one module of this package that takes the ledger
first, e.g. ``tasks.get_task(ledger, task_id)``.

Rules (see DESIGN.md "Ledger"):
- SQLite: WAL journal, a busy timeout, foreign keys on. PostgreSQL: autocommit outside ``tx()``.
- Every write goes through ``Ledger.tx()``, which opens ``BEGIN IMMEDIATE`` (PostgreSQL: a transaction holding
  the ledger's advisory write lock) so two writers serialise at the start of the transaction instead of failing
  half-way.
- Every state change writes its event with ``Ledger.event()`` inside the same transaction.
- A file from a newer schema, a corrupt file, or a SQLite file that is not a ledger is refused
  with a one-line error; nothing is recreated or overwritten.
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from agent import AgentError
from agent.ledger import backend, outbox
from agent.ledger.backend import POSTGRES, SQLITE, LedgerError
from agent.ledger.clock import now

APP_ID = 0x41474E54  # "AGNT" in PRAGMA application_id marks a ledger
ACTORS = ("script", "lane", "human")


class StorageError(LedgerError):
    """The disk is full, the ledger is read-only, or it stayed busy past the wait: nothing more can be recorded, so
    the command stops with this one line (a scan does not go on to the next task)."""


# Seconds a write waits for the ledger's write lock in total (SQLite's busy handler plus our retries), then it
# stops with "ledger is busy". AGENT_LEDGER_BUSY_TIMEOUT overrides it (operators, tests).
BUSY_TIMEOUT_S = 30.0
_FULL_ERRNOS = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


def busy_timeout() -> float:
    try:
        return max(0.1, float(os.environ.get("AGENT_LEDGER_BUSY_TIMEOUT", BUSY_TIMEOUT_S)))
    except ValueError:
        return BUSY_TIMEOUT_S


def _free_bytes(path: Path) -> int | None:
    for p in (path, *path.parents):
        try:
            st = os.statvfs(p)
        except OSError:
            continue
        return st.f_bavail * st.f_frsize
    return None


def _read_only_fs(path: Path) -> bool:
    for p in (path, *path.parents):
        try:
            return bool(os.statvfs(p).f_flag & os.ST_RDONLY)
        except OSError:
            continue
    return False


def disk_full(path: Path | str) -> StorageError:
    return StorageError(f"{path}: no space left on the device; free some space there (or move AGENT_HOME), "
                        "then run again; nothing recorded so far is lost")


def read_only(path: Path | str, detail: str = "") -> StorageError:
    return StorageError(f"{path}: cannot write there: {detail or 'read-only'}; make the home and its ledger.db "
                        "writable (or remount the file system read-write), or point AGENT_HOME at a writable home")


def storage_fault(exc: BaseException, path: Path | str) -> StorageError | None:
    """The StorageError for an SQLite or OS error caused by the disk (full, read-only) or a busy ledger, else None.

    A full disk is named as such: SQLite often reports it as "disk I/O error" or "unable to open database file"
    (it cannot create ledger.db-shm), and that must never read as a corrupt ledger."""
    if isinstance(exc, StorageError):
        return exc
    if backend.is_url(path):  # PostgreSQL: only the home's own files can fill a disk here, never the ledger
        if not isinstance(exc, OSError) or isinstance(exc, sqlite3.Error) or not getattr(exc, "filename", None):
            return None
        path = Path(exc.filename)
    path = Path(path)
    if isinstance(exc, OSError) and not isinstance(exc, sqlite3.Error):
        where = Path(exc.filename) if getattr(exc, "filename", None) else path
        if exc.errno in _FULL_ERRNOS:
            return disk_full(where.parent if where.suffix else where)
        if exc.errno == errno.EROFS:
            return read_only(where, "read-only file system")
        return None
    if not isinstance(exc, sqlite3.OperationalError):
        return None
    msg = str(exc).lower()
    if "locked" in msg or "busy" in msg:
        return StorageError(f"{path}: ledger is busy: another agent process held its write lock for "
                            f"{busy_timeout():.0f} s; let it finish or stop it (`fuser {path}` names it), "
                            "then run again")
    if "readonly" in msg or "read-only" in msg:
        return read_only(path, "read-only file system" if _read_only_fs(path) else str(exc))
    if "disk is full" in msg or any(k in msg for k in ("disk i/o error", "unable to open database file")):
        free = _free_bytes(path.parent)
        if "disk is full" in msg or (free is not None and free < 1024 * 1024):
            return disk_full(path.parent)
        if _read_only_fs(path):
            return read_only(path, "read-only file system")
        if "disk i/o error" in msg:
            return StorageError(f"{path}: the disk reported an I/O error ({exc}); check the device and free "
                                "space, then run again")
    return None


def _known_migrations() -> list[str]:
    from agent.ledger.migrations import MIGRATIONS

    return [name for name, _ in MIGRATIONS]


# Bumped with every migration; checked without importing sqlite_utils so a cron tick stays cheap.
SCHEMA_VERSION = 15


class Ledger:
    def __init__(self, path: Path | str, conn, dialect: backend.Dialect = SQLITE, location: Path | str | None = None):
        self.path = path                      # SQLite: the file; PostgreSQL: the URL without its password (shown)
        self.location = location or path      # what Ledger.open() takes again (another thread's connection)
        self.conn = conn                      # sqlite3.Connection or backend.PgConnection (the same interface)
        self.dialect = dialect
        self._locked = False                  # PostgreSQL: this transaction holds the advisory write lock

    @property
    def postgres(self) -> bool:
        return self.dialect is POSTGRES

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(cls, path: Path | str, create: bool = True) -> "Ledger":
        """Open (and migrate) the ledger at a SQLite path or a ``postgresql://`` URL."""
        if backend.is_url(path):
            return cls._open_pg(str(path), create)
        path = Path(path)
        if path.is_dir():
            raise LedgerError(f"{path}: is a directory, not a ledger; point AGENT_HOME at the folder holding ledger.db")
        if not path.exists() and not create:
            raise LedgerError(f"{path}: no ledger here; run `agent init` first")
        wait = busy_timeout()
        try:
            conn = sqlite3.connect(str(path), timeout=wait, isolation_level=None, check_same_thread=False)
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {int(wait * 1000)}")
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            fault = storage_fault(exc, path)
            if fault is not None:  # a full disk or read-only file system is not a broken ledger
                raise fault from None
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
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA foreign_keys = ON")
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise storage_fault(exc, path) or LedgerError(f"{path}: cannot open the ledger ({exc})") from None
        ledger = cls(path, conn)
        if version < SCHEMA_VERSION:
            try:
                ledger.migrate()
            except BaseException:
                conn.close()
                raise
        return ledger

    @classmethod
    def _open_pg(cls, url: str, create: bool) -> "Ledger":
        """PostgreSQL: the schema version is the number of rows in ``_migrations`` (one query per open)."""
        import psycopg

        shown = backend.display(url)
        conn = backend.connect_pg(url)
        ledger = cls(shown, conn, POSTGRES, location=url)
        try:
            lock_timeout = f"SET lock_timeout = {int(busy_timeout() * 1000)}"   # a write waits as long as on SQLite
            try:  # one round trip: the session setting and the schema version
                cur = conn.execute(f"{lock_timeout}; SELECT count(*) FROM _migrations")
                cur.nextset()
                version = cur.fetchone()[0]
            except psycopg.errors.UndefinedTable:
                conn.execute(lock_timeout)
                version = None
            conn.session.append(lock_timeout)
            if version is None:  # (or another process is creating it right now: then _migrations is there)
                ours, tables = conn.execute(
                    "SELECT count(*) FILTER (WHERE table_name = '_migrations'), count(*) "
                    "FROM information_schema.tables WHERE table_schema = current_schema()").fetchone()
                if tables and not ours:
                    raise LedgerError(f"{shown}: is a PostgreSQL database but not an agent ledger (it has tables "
                                      "and no _migrations); point ledger.url / AGENT_LEDGER_URL at an empty "
                                      "database or your ledger")
                if not create:
                    raise LedgerError(f"{shown}: no ledger in this database yet; run `agent init` first")
                version = 0
            if version > SCHEMA_VERSION:
                raise LedgerError(f"{shown}: ledger schema {version} is newer than this agent supports "
                                  f"({SCHEMA_VERSION}); upgrade agent-fixer")
            if version < SCHEMA_VERSION:
                ledger.migrate()
        except BaseException:
            conn.close()
            raise
        return ledger

    def close(self) -> None:
        self.conn.close()

    def migrate(self) -> list[str]:
        """Apply pending migrations, each in its own write transaction. Returns the names applied.

        On PostgreSQL the migrations get ``agent.ledger.pg.PgDatabase`` instead of a ``sqlite_utils.Database``, and
        the version is the count of ``_migrations`` rows (no PRAGMA); each migration re-checks inside its
        transaction whether another process applied it meanwhile."""
        from agent.ledger.migrations import MIGRATIONS

        if self.postgres:
            from agent.ledger.pg import MIGRATIONS_TABLE, PgDatabase

            db = PgDatabase(self.conn)
            setup = [MIGRATIONS_TABLE]
        else:
            import sqlite_utils

            db = sqlite_utils.Database(self.conn)
            setup = ["CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)",
                     f"PRAGMA application_id = {APP_ID}"]
        applied: list[str] = []
        if len(MIGRATIONS) != SCHEMA_VERSION:  # a developer forgot to bump SCHEMA_VERSION
            raise LedgerError(f"internal: {len(MIGRATIONS)} migrations but SCHEMA_VERSION={SCHEMA_VERSION}")
        with self.tx() as c:
            for sql in setup:
                c.execute(sql)
        done = {r[0] for r in self.conn.execute("SELECT name FROM _migrations")}
        unknown = done - set(_known_migrations())
        if unknown:
            raise LedgerError(f"{self.path}: ledger has migrations this agent does not know "
                              f"({', '.join(sorted(unknown))}); upgrade agent-fixer")
        for index, (name, fn) in enumerate(MIGRATIONS, start=1):
            if name in done:
                continue
            with self.tx() as c:
                if c.execute("SELECT 1 FROM _migrations WHERE name = ?", (name,)).fetchone():
                    continue  # another process applied it while we waited for the write lock
                fn(db)
                c.execute("INSERT INTO _migrations (name, applied_at) VALUES (?, ?)", (name, now()))
                if not self.postgres:
                    c.execute(f"PRAGMA user_version = {index}")
            applied.append(name)
        return applied

    def migrations(self) -> list[str]:
        order = "seq" if self.postgres else "rowid"
        return [r[0] for r in self.conn.execute(f"SELECT name FROM _migrations ORDER BY {order}")]

    def schema_version(self) -> int:
        if self.postgres:
            return self.scalar("SELECT count(*) FROM _migrations")
        return self.scalar("PRAGMA user_version")

    def journal_mode(self) -> str:
        """SQLite's journal mode (``wal``); ``postgresql`` for a PostgreSQL ledger."""
        return "postgresql" if self.postgres else self.scalar("PRAGMA journal_mode")

    def durable_commits(self) -> None:
        """Every commit waits for the disk (SQLite ``synchronous=FULL``; PostgreSQL commits are durable already)."""
        if not self.postgres:
            self.conn.execute("PRAGMA synchronous = FULL")

    def read_only(self) -> None:
        """This connection may only read (a GET handler): ``query_only`` / a read-only session."""
        if self.postgres:
            self.conn.set_session("SET default_transaction_read_only = on")
        else:
            self.conn.execute("PRAGMA query_only = ON")

    # ------------------------------------------------------------------ writing

    @contextmanager
    def tx(self, exclusive: bool = True) -> Iterator[sqlite3.Connection]:
        """One write transaction, opened with BEGIN IMMEDIATE; commits on success, rolls back on error.

        On PostgreSQL: a transaction (READ COMMITTED) that first takes the ledger's advisory write lock, so writers
        serialise at the start as on SQLite. ``exclusive=False`` skips that lock on PostgreSQL, for record
        operations written for concurrent writers (``SELECT ... FOR UPDATE SKIP LOCKED`` claims); on SQLite every
        write transaction is exclusive anyway."""
        if self.conn.in_transaction:  # nested use joins the outer transaction
            yield self.conn
            return
        if self.postgres:   # a lost server is waited for at the start (backend.PgConnection.begin), not mid-body
            lock = ("SELECT pg_advisory_xact_lock(?)", (backend.WRITE_LOCK_KEY,)) if exclusive else (None, ())
            try:
                with self.conn.begin(*lock):
                    self._locked = exclusive
                    yield self.conn
            finally:
                self._locked = False
            return
        # SQLite's busy handler already waits up to busy_timeout() inside BEGIN; a retry only uses what is left
        # of that one budget (a lock released and re-taken between attempts), never a fresh wait per attempt.
        deadline = time.monotonic() + busy_timeout()
        shortened = False
        try:
            while True:
                try:
                    self.conn.execute("BEGIN IMMEDIATE")
                    break
                except sqlite3.OperationalError as exc:
                    fault = storage_fault(exc, self.path)
                    busy = "locked" in str(exc) or "busy" in str(exc)
                    if not busy or time.monotonic() + 0.05 >= deadline:
                        raise (fault or LedgerError(f"{self.path}: cannot start a write ({exc})")) from None
                    time.sleep(0.05)
                    shortened = True
                    self.conn.execute(f"PRAGMA busy_timeout = {int(max(0.0, deadline - time.monotonic()) * 1000)}")
        finally:
            if shortened:
                self.conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout() * 1000)}")
        try:
            yield self.conn
        except BaseException as exc:
            self._rollback()
            fault = storage_fault(exc, self.path) if isinstance(exc, sqlite3.OperationalError) else None
            if fault is not None:
                raise fault from None
            raise
        try:
            self.conn.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            self._rollback()
            raise (storage_fault(exc, self.path) or LedgerError(f"{self.path}: commit failed ({exc})")) from None

    def _rollback(self) -> None:
        if self.conn.in_transaction:
            try:
                self.conn.execute("ROLLBACK")
            except sqlite3.Error:  # SQLite may already have rolled back (e.g. on a full disk)
                pass

    def event(self, conn: sqlite3.Connection, kind: str, actor: str, payload: dict | None = None,
              task_id: int | None = None, error_id: str | None = None) -> int:
        """Append one event. Call inside ``tx()`` together with the change it records."""
        if actor not in ACTORS:
            raise ValueError(f"actor must be one of {ACTORS}, got {actor!r}")
        if not conn.in_transaction:
            raise RuntimeError("Ledger.event() must be called inside Ledger.tx()")
        ts = now()
        values = (ts, task_id, error_id, kind, actor, json.dumps(payload or {}, sort_keys=True, default=str))
        if self.postgres:
            # Gapless ids as on SQLite (a sequence would skip the ids of rolled-back transactions, and `agent
            # doctor` reads a gap as a deleted event): the next id under the write lock, which an exclusive tx()
            # holds already and a non-exclusive one takes here.
            if not self._locked:
                conn.execute("SELECT pg_advisory_xact_lock(?)", (backend.WRITE_LOCK_KEY,))
                self._locked = True
            event_id = conn.execute(
                "INSERT INTO events (id, ts, task_id, error_id, kind, actor, payload) VALUES "
                "((SELECT coalesce(max(id), 0) + 1 FROM events), ?, ?, ?, ?, ?, ?) RETURNING id", values
            ).fetchall()[0][0]
        else:
            event_id = conn.execute(
                "INSERT INTO events (ts, task_id, error_id, kind, actor, payload) VALUES (?, ?, ?, ?, ?, ?) "
                "RETURNING id", values).fetchall()[0][0]
        # the notification outbox row (if this event is one a human hears about), in this same transaction
        outbox.on_event(conn, event_id, ts, kind, payload or {}, task_id, error_id)
        return event_id

    def insert(self, conn: sqlite3.Connection, table: str, row: dict[str, Any]) -> int | None:
        """Insert one row; returns its ``id`` (SQLite: its rowid; PostgreSQL: None for a table without ``id``)."""
        cols = ", ".join(f'"{k}"' for k in row)
        marks = ", ".join("?" for _ in row)
        sql = f'INSERT INTO "{table}" ({cols}) VALUES ({marks})'
        if not self.postgres:
            return conn.execute(sql, tuple(row.values())).lastrowid
        if not self._has_id(table):
            conn.execute(sql, tuple(row.values()))
            return None
        new_id = conn.execute(sql + " RETURNING id", tuple(row.values())).fetchall()[0][0]
        if "id" in row and isinstance(row["id"], int):  # an explicit id: the identity must not hand it out again
            conn.execute(f"SELECT setval(pg_get_serial_sequence(?, 'id'), (SELECT max(id) FROM \"{table}\"))",
                         (table,))
        return new_id

    def _has_id(self, table: str) -> bool:
        cache = self.__dict__.setdefault("_id_tables", {})
        if table not in cache:
            cache[table] = self.conn.execute(
                "SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = ? "
                "AND column_name = 'id'", (table,)).fetchone() is not None
        return cache[table]

    def delete(self, conn: sqlite3.Connection, table: str, where: dict[str, Any]) -> int:
        conds = " AND ".join(f'"{k}" = ?' for k in where)
        return conn.execute(f'DELETE FROM "{table}" WHERE {conds}', tuple(where.values())).rowcount

    def update(self, conn: sqlite3.Connection, table: str, where: dict[str, Any], values: dict[str, Any]) -> int:
        sets = ", ".join(f'"{k}" = ?' for k in values)
        conds = " AND ".join(f'"{k}" = ?' for k in where)
        return conn.execute(f'UPDATE "{table}" SET {sets} WHERE {conds}',
                            (*values.values(), *where.values())).rowcount

    # ------------------------------------------------------------------ reading

    def _read(self, sql: str, params: tuple, first: bool = False) -> list[sqlite3.Row]:
        try:
            cur = self.conn.execute(sql, params)
            if first:
                row = cur.fetchone()
                return [row] if row is not None else []
            return cur.fetchall()
        except sqlite3.OperationalError as exc:
            fault = storage_fault(exc, self.path)
            if fault is None:
                raise
            raise fault from None

    def one(self, sql: str, params: tuple = ()) -> dict | None:
        rows = self._read(sql, params, first=True)
        return dict(rows[0]) if rows else None

    def all(self, sql: str, params: tuple = ()) -> list[dict]:
        return [dict(r) for r in self._read(sql, params)]

    def scalar(self, sql: str, params: tuple = ()) -> Any:
        rows = self._read(sql, params, first=True)
        return rows[0][0] if rows else None

    def integrity(self) -> str:
        """``ok`` or SQLite's first finding; PostgreSQL checks its pages itself (``ok`` once it answers)."""
        if self.postgres:
            return "ok" if self.scalar("SELECT 1") == 1 else "no answer"
        return self.scalar("PRAGMA integrity_check")


def ledger_path(home: Path) -> Path | str:
    """Where the home's ledger is: ``AGENT_LEDGER_URL`` (a PostgreSQL URL), else ``ledger.url`` in the home's
    config.yaml (or the ``--config`` file an ``App`` named for that home), else the SQLite file
    ``home/ledger.db``. What ``Ledger.open`` takes; a bad URL is a one-line error naming where it came from."""
    home = Path(home)
    return backend.resolve(home, _CONFIG_FILES.get(home))


def sqlite_path(home: Path) -> Path:
    """The home's SQLite ledger file (whether or not the home uses it)."""
    return Path(home) / "ledger.db"


# home -> the config file an App was given with --config (so every connection of that process, threads
# included, resolves ledger.url from the same file)
_CONFIG_FILES: dict[Path, Path] = {}


def use_config_file(home: Path, config_path: Path) -> None:
    _CONFIG_FILES[Path(home)] = Path(config_path)
