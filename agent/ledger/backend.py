"""Where a ledger lives and how the rest of ``agent/ledger`` talks to it: SQLite (the embedded default) or
PostgreSQL (psycopg 3, chosen by ``ledger.url`` in config.yaml or ``AGENT_LEDGER_URL``; the environment wins).

Both give the ledger one connection interface: ``conn.execute(sql, params)`` with ``?`` placeholders, returning a
cursor with ``fetchone``/``fetchall``/``rowcount`` whose rows read by name and by index; ``conn.in_transaction``.
For SQLite that is ``sqlite3.Connection`` itself (nothing changes for its users). For PostgreSQL it is
:class:`PgConnection`: ``?`` becomes ``%s`` (a literal ``%`` is escaped), Python booleans are stored as 0/1
integers like SQLite's, ``numeric`` results (``sum`` of integers) come back as int or float, the connection is in
autocommit outside ``Ledger.tx()``, and a lost or refused connection is one line naming the URL without its
password. What differs in SQL between the two is asked of :class:`Dialect` (``ledger.dialect``).

This module imports psycopg only when a PostgreSQL URL is opened: a SQLite tick never pays for it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from contextlib import contextmanager
from typing import Any, Iterator, Sequence
from urllib.parse import urlsplit, urlunsplit

from agent import AgentError

ENV_URL = "AGENT_LEDGER_URL"
PG_SCHEMES = ("postgresql", "postgres")
CONNECT_TIMEOUT_S = 10
# The transaction-scoped advisory lock every PostgreSQL ``tx()`` takes: PostgreSQL's BEGIN IMMEDIATE (one writer
# at a time), so every read-then-write the ledger code does inside a transaction means the same on both backends.
WRITE_LOCK_KEY = 0x41474E54   # "AGNT", the SQLite ledger's application_id


class LedgerError(AgentError):
    """A ledger that cannot be opened or used; always one line (re-exported as ``agent.ledger.LedgerError``)."""


class BackendError(LedgerError):
    """A ledger URL that is malformed, of an unknown scheme, or whose server cannot be reached."""


class LedgerUnreachable(BackendError):
    """The PostgreSQL ledger's server stayed unreachable for longer than a process waits for it (``outage_wait_s``)."""


OUTAGE_ENV = "AGENT_LEDGER_OUTAGE_S"


def outage_wait_s() -> float:
    """How long a transaction waits for a lost PostgreSQL ledger to come back before it fails: one task claim's
    lease (``$AGENT_LEDGER_OUTAGE_S`` changes it). An outage shorter than that loses nothing: the claims and their
    tokens are kept, renewed and written under once the server is back."""
    try:
        return max(0.0, float(os.environ[OUTAGE_ENV]))
    except (KeyError, ValueError):
        from agent.ledger.clock import claim_lease_s

        return claim_lease_s()


class Outage:
    """This process's view of the ledger's reachability, shared by every connection and thread: one line when the
    ledger is lost, one a minute while it stays lost, one when it is back (``echo``: the daemon's log, else stderr).
    """

    EVERY_S = 60.0

    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()
        self.since: float | None = None     # time.monotonic() of the loss
        self.said: float = 0.0
        self.echo = None
        self.lines = 0

    def _say(self, line: str) -> None:
        self.lines += 1
        if self.echo is not None:
            self.echo(line)
        else:
            import sys

            print(f"agent: {line}", file=sys.stderr, flush=True)

    @property
    def down(self) -> bool:
        return self.since is not None

    def lost(self, url: str, why: str) -> None:
        import time

        with self.lock:
            now = time.monotonic()
            if self.since is None:
                self.since = self.said = now
                self._say(f"ledger {display(url)} unreachable ({why}); waiting for it, claims and their tokens are "
                          f"kept (up to {outage_wait_s():.0f}s per write)")
            elif now - self.said >= self.EVERY_S:
                self.said = now
                self._say(f"ledger {display(url)} still unreachable after {now - self.since:.0f}s ({why})")

    def back(self, url: str) -> None:
        import time

        with self.lock:
            if self.since is not None:
                self._say(f"ledger {display(url)} is back after {time.monotonic() - self.since:.1f}s")
                self.since = None


OUTAGE = Outage()


# ------------------------------------------------------------------ locations


def is_url(where: Any) -> bool:
    """True for a PostgreSQL URL (``postgresql://`` or ``postgres://``); a Path or plain path is SQLite."""
    return isinstance(where, str) and where.split("://", 1)[0].lower() in PG_SCHEMES and "://" in where


def display(where: Any) -> str:
    """The location as it may be shown or logged: a URL without its password (``user:***@host``)."""
    if not isinstance(where, str) or "://" not in where:
        return str(where)
    try:
        parts = urlsplit(where)
    except ValueError:
        return where.split("://", 1)[0] + "://(unparsable URL)"
    if parts.password is None:
        return where
    netloc = parts.netloc.rsplit("@", 1)
    user = netloc[0].split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[1]}"))


def check_url(url: str, source: str) -> str:
    """A usable PostgreSQL URL, or a one-line BackendError naming ``source`` (the variable or config key)."""
    url = url.strip()
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme not in PG_SCHEMES:
        shown = display(url) if "://" in url else (url[:60] or "(empty)")
        raise BackendError(f"{source}: expected a postgresql://USER@HOST[:PORT]/DB URL, got {shown!r}; unset it to "
                           "use the SQLite ledger in the home")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        raise BackendError(f"{source}: malformed URL {display(url)!r} ({exc})") from None
    if not parts.hostname and "host=" not in (parts.query or ""):
        raise BackendError(f"{source}: {display(url)!r} names no host; write postgresql://USER@HOST[:PORT]/DB")
    return url


_LEDGER_KEY = re.compile(r"^ledger\s*:", re.M)


def configured_url(config_path: Path) -> str | None:
    """``ledger.url`` from a config file, read before (and without) the full config validation, so opening the
    ledger never needs the config that itself needs the ledger (open tasks). A file without a top-level
    ``ledger:`` key is not even parsed as YAML, so a config broken elsewhere still lets `status`, `task list` and
    `doctor` open the ledger (they say the config is broken). One whose YAML cannot be read at all while it has
    a ``ledger:`` key is refused: where the ledger is cannot be known. A malformed value is config validation's
    to report."""
    from agent.infra.textio import InputError, decode, load_yaml, one_newline

    try:
        raw = Path(config_path).read_bytes()
    except OSError:
        return None
    text = decode(raw, str(config_path), strict=False).text   # a bad byte elsewhere does not hide ledger.url
    if not _LEDGER_KEY.search(one_newline(text)):
        return None
    try:
        data = load_yaml(text, str(config_path))
    except InputError as exc:
        raise BackendError(f"{exc} (the ledger's location, ledger.url, is read from it)") from None
    if not isinstance(data, dict) or data.get("ledger") is None:
        return None
    section = data["ledger"]
    url = section.get("url") if isinstance(section, dict) else section
    if url is None:
        return None
    if not isinstance(url, str) or not url.strip():
        raise BackendError(f"{config_path}: ledger.url: expected a postgresql://USER@HOST[:PORT]/DB URL, got "
                           f"{type(url).__name__ if not isinstance(url, str) else 'an empty string'}")
    return url


def resolve(home: Path, config_path: Path | None = None, environ: dict | None = None) -> Path | str:
    """Where the home's ledger is: ``AGENT_LEDGER_URL``, else ``ledger.url`` in the config, else
    ``home/ledger.db``. A URL is checked (scheme, port) and refused with one line naming where it came from."""
    env = os.environ if environ is None else environ
    url = (env.get(ENV_URL) or "").strip()
    if url:
        return check_url(url, ENV_URL)
    config_path = Path(config_path) if config_path is not None else Path(home) / "config.yaml"
    url = configured_url(config_path)
    if url:
        return check_url(url, f"{config_path}: ledger.url")
    return Path(home) / "ledger.db"


# ------------------------------------------------------------------ dialects


class Dialect:
    """The SQL that differs between the backends; record operations ask ``ledger.dialect`` instead of
    writing either one's syntax."""

    name = "sqlite"
    for_update_skip_locked = ""        # appended to a SELECT that claims rows (PostgreSQL: FOR UPDATE SKIP LOCKED)
    for_update = ""                    # appended to a SELECT whose rows the transaction will update
    # The ledger's clock in epoch seconds, read by the statement that uses it: lease deadlines are set and compared
    # with it, never with a runner's clock (SQLite: the one machine's; PostgreSQL: the server's, at the moment the
    # statement runs, so a transaction that waited for the write lock does not use its start time).
    clock = "((julianday('now') - 2440587.5) * 86400.0)"

    def greatest(self, *exprs: str) -> str:
        """The largest of several values (SQLite's scalar max(a, b), PostgreSQL's GREATEST)."""
        return f"max({', '.join(exprs)})"

    def least(self, *exprs: str) -> str:
        return f"min({', '.join(exprs)})"

    def indexed_by(self, index: str) -> str:
        """A planner hint SQLite needs for partial indexes; PostgreSQL's planner finds them itself."""
        return f"INDEXED BY {index}"

    def json_text(self, column: str, key: str) -> str:
        """The text value of a top-level key of a JSON text column (NULL when absent)."""
        return f"json_extract({column}, '$.{key}')"

    def seconds_between(self, start: str, end: str) -> str:
        """Seconds from one ``now()`` timestamp column to another."""
        return f"((julianday({end}) - julianday({start})) * 86400.0)"


class PostgresDialect(Dialect):
    name = "postgresql"
    for_update_skip_locked = " FOR UPDATE SKIP LOCKED"
    for_update = " FOR UPDATE"
    clock = "(EXTRACT(EPOCH FROM clock_timestamp())::float8)"

    def greatest(self, *exprs: str) -> str:
        return f"GREATEST({', '.join(exprs)})"

    def least(self, *exprs: str) -> str:
        return f"LEAST({', '.join(exprs)})"

    def indexed_by(self, index: str) -> str:
        return ""

    def json_text(self, column: str, key: str) -> str:
        return f"(({column})::jsonb ->> '{key}')"

    def seconds_between(self, start: str, end: str) -> str:
        return f"EXTRACT(EPOCH FROM (({end})::timestamptz - ({start})::timestamptz))"


SQLITE = Dialect()
POSTGRES = PostgresDialect()


# ------------------------------------------------------------------ PostgreSQL connection


_CACHE: dict[str, str] = {}


_IS_PARAM = re.compile(r"\bIS\s+(NOT\s+)?\?", re.I)


def _is_param(m: re.Match) -> str:
    return "IS DISTINCT FROM ?" if m.group(1) else "IS NOT DISTINCT FROM ?"


def translate(sql: str) -> str:
    """``?`` placeholders -> ``%s``, a literal ``%`` -> ``%%``; quoted strings and identifiers are left alone.
    SQLite's null-safe ``IS ?`` / ``IS NOT ?`` become the standard ``IS [NOT] DISTINCT FROM``."""
    done = _CACHE.get(sql)
    if done is not None:
        return done
    key, sql = sql, _IS_PARAM.sub(_is_param, sql)
    out: list[str] = []
    quote = None
    for ch in sql:
        if quote:
            out.append("%%" if ch == "%" else ch)
            if ch == quote:
                quote = None
        elif ch in ("'", '"'):
            quote = ch
            out.append(ch)
        elif ch == "?":
            out.append("%s")
        elif ch == "%":
            out.append("%%")
        else:
            out.append(ch)
    done = "".join(out)
    if len(_CACHE) < 4096:
        _CACHE[key] = done
    return done


class Row:
    """A result row read by column name or by index, like ``sqlite3.Row`` (``dict(row)`` works too)."""

    __slots__ = ("_keys", "_index", "_values")

    def __init__(self, keys: tuple[str, ...], index: dict[str, int], values: Sequence[Any]):
        self._keys, self._index, self._values = keys, index, values

    def __getitem__(self, key):
        if isinstance(key, str):
            return self._values[self._index[key]]
        return self._values[key]

    def keys(self) -> list[str]:
        return list(self._keys)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __eq__(self, other) -> bool:
        if isinstance(other, Row):
            return self._keys == other._keys and tuple(self._values) == tuple(other._values)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self._values))

    def __repr__(self) -> str:
        return f"Row({dict(zip(self._keys, self._values))!r})"


def _row_factory(cursor):
    desc = cursor.description
    if desc is None:
        return tuple
    keys = tuple(d.name for d in desc)
    index: dict[str, int] = {}
    for i, k in enumerate(keys):
        index.setdefault(k, i)

    def make(values):
        return Row(keys, index, values)

    return make


def _adapters(conn) -> None:
    """Booleans as 0/1 integers (the ledger's columns are integers on both backends); numeric as int or float."""
    import struct
    from decimal import Decimal

    from psycopg.adapt import Dumper, Loader
    from psycopg.postgres import types
    from psycopg.pq import Format

    int8 = types["int8"].oid

    class BoolText(Dumper):
        oid = int8

        def dump(self, obj):
            return b"1" if obj else b"0"

    class BoolBinary(Dumper):
        format = Format.BINARY
        oid = int8

        def dump(self, obj):
            return struct.pack(">q", 1 if obj else 0)

    class Numeric(Loader):
        def load(self, data):
            d = Decimal(bytes(data).decode())
            return int(d) if d == d.to_integral_value() else float(d)

    conn.adapters.register_dumper(bool, BoolText)
    conn.adapters.register_dumper(bool, BoolBinary)
    conn.adapters.register_loader("numeric", Numeric)


def _first_line(exc: BaseException, url: str) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    password = None
    try:
        password = urlsplit(url).password
    except ValueError:
        pass
    if password:
        text = text.replace(password, "***")
    return text[:300]


def _reason(exc: BaseException, url: str) -> str:
    """The driver's own short reason for a failed connect (``Connection refused``), without the hints."""
    inner = exc.__context__ if isinstance(exc, BackendError) and exc.__context__ is not None else exc
    text = _first_line(inner, url)
    for cut in (" Is the server", " This probably"):
        text = text.split(cut, 1)[0]
    return text[:160]


def connection_error(url: str, exc: BaseException, doing: str = "cannot connect to the PostgreSQL ledger") \
        -> BackendError:
    return BackendError(f"{display(url)}: {doing} ({_first_line(exc, url)}); check ledger.url / {ENV_URL} and "
                        "that the server is up and accepts this user")


class PgConnection:
    """The ledger's PostgreSQL connection: the ``sqlite3.Connection`` subset the ledger code uses."""

    def __init__(self, raw, url: str):
        self.raw = raw
        self.url = url
        self.session: list[str] = []     # session settings, replayed on a replacement connection

    def set_session(self, sql: str) -> None:
        """Run a session setting (``SET ...``) now and on any replacement connection."""
        self.execute(sql)
        self.session.append(sql)

    def _fault(self, exc: BaseException) -> BaseException:
        import psycopg

        if isinstance(exc, psycopg.errors.LockNotAvailable):
            return BackendError(f"{display(self.url)}: ledger is busy: another agent process held its write lock "
                                "past the wait; let it finish, then run again")
        if isinstance(exc, psycopg.OperationalError) and not isinstance(exc, psycopg.errors.QueryCanceled):
            return connection_error(self.url, exc, "lost the connection to the PostgreSQL ledger")
        return exc

    def usable(self) -> None:
        """Outside a transaction: if the connection was lost, connect again, waiting out an outage for up to
        ``outage_wait_s`` (reported once by ``OUTAGE``); LedgerUnreachable after that."""
        import time

        if not self.raw.broken:
            return
        deadline = time.monotonic() + outage_wait_s()
        while True:
            try:
                fresh = connect_pg(self.url)
                for sql in self.session:
                    fresh.raw.execute(sql)
            except Exception as exc:  # noqa: BLE001 - refused, reset, timed out: the server is not there yet
                OUTAGE.lost(self.url, _reason(exc, self.url))
                if time.monotonic() >= deadline:
                    raise LedgerUnreachable(f"{display(self.url)}: the PostgreSQL ledger stayed unreachable for "
                                            f"{outage_wait_s():.0f}s; check that the server is up "
                                            f"({_first_line(exc, self.url)})") from None
                time.sleep(0.5)
                continue
            self.raw = fresh.raw
            OUTAGE.back(self.url)
            return

    @contextmanager
    def begin(self, lock_sql: str | None = None, lock_params: Sequence[Any] = ()) -> Iterator["PgConnection"]:
        """A transaction (with ``lock_sql`` as its first statement). A connection found lost when it starts (the
        server restarted or was unreachable) is replaced and the start tried again, waiting out an outage
        (``usable``): nothing of the body ran yet, so nothing is written twice. A loss inside the body fails it."""
        import psycopg

        while True:
            self.usable()
            tx = self.raw.transaction()
            try:
                tx.__enter__()
                if lock_sql:
                    self.raw.execute(translate(lock_sql), tuple(lock_params))
            except psycopg.OperationalError as exc:
                try:
                    tx.__exit__(type(exc), exc, exc.__traceback__)
                except Exception:  # noqa: BLE001 - a lost connection cannot roll back; the server already did
                    pass
                if self.raw.broken:   # connect again (usable): only a server that cannot be reached is an outage
                    continue
                raise self._fault(exc) from None
            break
        try:
            yield self
        except BaseException as exc:
            try:
                if not tx.__exit__(type(exc), exc, exc.__traceback__):
                    raise
            except psycopg.OperationalError as fault:
                raise self._fault(fault) from None
        else:
            try:
                tx.__exit__(None, None, None)
            except psycopg.OperationalError as fault:
                raise self._fault(fault) from None

    def execute(self, sql: str, params: Sequence[Any] | None = ()):
        import psycopg

        outside = not self.in_transaction
        if self.raw.broken and outside:
            self.usable()
        try:
            return self._execute(sql, params)
        except psycopg.OperationalError as exc:
            if outside and self.raw.broken:   # the server went away: a read is tried again once it is back
                if sql.lstrip()[:6].upper() == "SELECT":
                    self.usable()
                    return self._execute(sql, params)
            fault = self._fault(exc)
            if fault is exc:
                raise
            raise fault from None

    def _execute(self, sql: str, params: Sequence[Any] | None):
        if params:
            return self.raw.execute(translate(sql), tuple(params))
        return self.raw.execute(sql)

    def executemany(self, sql: str, seq: Sequence[Sequence[Any]]):
        cur = self.raw.cursor()
        cur.executemany(translate(sql), [tuple(p) for p in seq])
        return cur

    @property
    def in_transaction(self) -> bool:
        from psycopg.pq import TransactionStatus

        return self.raw.info.transaction_status in (TransactionStatus.INTRANS, TransactionStatus.INERROR,
                                                    TransactionStatus.ACTIVE)

    def transaction(self):
        return self.raw.transaction()

    def close(self) -> None:
        self.raw.close()

    @property
    def closed(self) -> bool:
        return self.raw.closed


def connect_pg(url: str) -> PgConnection:
    """Connect in autocommit mode (``Ledger.tx()`` opens the transactions); a one-line BackendError if not."""
    try:
        import psycopg
    except ImportError:
        raise BackendError(f"{display(url)}: the PostgreSQL driver is not installed; "
                           "`pip install 'psycopg[binary]>=3'`") from None
    try:
        raw = psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S, application_name="agent",
                              row_factory=_row_factory)
    except (psycopg.Error, ValueError) as exc:
        raise connection_error(url, exc) from None
    _adapters(raw)
    return PgConnection(raw, url)
