"""The ledger file: WAL, migrations pinned, events append-only and atomic, bad files refused."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from agent.ledger import SCHEMA_VERSION, Ledger, LedgerError, eventlog, ledger_path
from agent.ledger.migrations import MIGRATIONS
from conftest import db_errors, on_postgres

PINNED = Path(__file__).parent / "data" / "schema.sql"


def schema_text(led: Ledger) -> str:
    """The schema as SQLite reports it (columns, keys, indexes, triggers), independent of DDL formatting."""
    out = []
    tables = [r[0] for r in led.conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")]
    for t in tables:
        out.append(f"table {t}")
        for cid, name, typ, notnull, default, pk in led.conn.execute(f'PRAGMA table_info("{t}")'):
            out.append(f"  {name} {typ}{' NOT NULL' if notnull else ''}"
                       f"{' DEFAULT ' + str(default) if default is not None else ''}{' PK' + str(pk) if pk else ''}")
        for row in led.conn.execute(f'PRAGMA foreign_key_list("{t}")'):
            out.append(f"  fk {row[3]} -> {row[2]}.{row[4]}")
        for _, iname, unique, origin, _partial in led.conn.execute(f'PRAGMA index_list("{t}")'):
            cols = [r[2] for r in led.conn.execute(f'PRAGMA index_info("{iname}")')]
            out.append(f"  index {'unique ' if unique else ''}({', '.join(cols)}) {origin}")
    for (name,) in led.conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' ORDER BY name"):
        out.append(f"trigger {name}")
    return "\n".join(out) + "\n"


def test_init_makes_wal_ledger_and_is_idempotent(agent, home):
    first = agent.json("init")
    assert first["journal_mode"] == ("postgresql" if on_postgres() else "wal") and first["config_created"] is True
    assert (home.stat().st_mode & 0o777) == 0o700
    config_before = (home / "config.yaml").read_text()
    second = agent.json("init")
    assert second["config_created"] is False
    assert (home / "config.yaml").read_text() == config_before
    led = Ledger.open(ledger_path(home))
    assert led.migrations() == [name for name, _ in MIGRATIONS]
    assert led.postgres or led.scalar("PRAGMA foreign_keys") == 1
    led.close()


@pytest.mark.sqlite_only("the pinned SQLite schema; tests/test_ledger_pg.py checks PostgreSQL's against it")
def test_migrations_from_empty_database_match_pinned_schema(tmp_path):
    led = Ledger.open(tmp_path / "ledger.db")
    assert led.scalar("PRAGMA user_version") == SCHEMA_VERSION == len(MIGRATIONS)
    assert schema_text(led) == PINNED.read_text(), \
        "schema drifted: add a migration (never edit a shipped one) and re-pin tests/data/schema.sql"
    led.close()


def test_migration_names_are_append_only():
    # The pinned schema was made by exactly these migrations, in this order.
    names = [name for name, _ in MIGRATIONS]
    assert names[0] == "m001_initial"
    assert names == sorted(names), "migrations must keep their numbered order"


@pytest.mark.sqlite_only("PRAGMA user_version of the file; test_ledger_pg has the PostgreSQL case")
def test_newer_schema_is_refused_and_file_untouched(tmp_path):
    path = tmp_path / "ledger.db"
    Ledger.open(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    before = path.read_bytes()
    with pytest.raises(LedgerError, match="newer than this agent supports"):
        Ledger.open(path)
    assert path.read_bytes() == before


@pytest.mark.sqlite_only("a corrupt SQLite file")
def test_corrupt_file_is_refused_not_recreated(tmp_path):
    path = tmp_path / "ledger.db"
    path.write_bytes(b"this is not sqlite at all, just bytes" * 200)
    before = path.read_bytes()
    with pytest.raises(LedgerError, match="not a readable SQLite ledger"):
        Ledger.open(path)
    assert path.read_bytes() == before


@pytest.mark.sqlite_only("a foreign SQLite file; test_ledger_pg has the PostgreSQL case")
def test_foreign_sqlite_file_is_refused(tmp_path):
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE recipes (name TEXT)")
    conn.commit()
    conn.close()
    with pytest.raises(LedgerError, match="not an agent ledger"):
        Ledger.open(path)
    assert sqlite3.connect(path).execute("SELECT name FROM sqlite_master").fetchall() == [("recipes",)]


@pytest.mark.sqlite_only("a directory where the SQLite file should be")
def test_directory_is_refused(tmp_path):
    with pytest.raises(LedgerError, match="is a directory"):
        Ledger.open(tmp_path)


@pytest.mark.sqlite_only("a garbage ledger.db file")
def test_bad_ledger_gives_one_line_error_and_exit_1(agent, home):
    home.mkdir(parents=True, exist_ok=True)
    (home / "ledger.db").write_bytes(b"garbage" * 100)
    r = agent("task", "list")
    assert r.exit_code == 1
    assert r.stderr.count("\n") == 1 and "not a readable SQLite ledger" in r.stderr


def test_events_are_append_only(ledger):
    with ledger.tx() as c:
        ledger.event(c, "test.kind", "script", {"a": 1})
    with pytest.raises(db_errors(), match="append-only"):
        with ledger.tx() as c:
            c.execute("UPDATE events SET kind = 'x'")
    with pytest.raises(db_errors(), match="append-only"):
        with ledger.tx() as c:
            c.execute("DELETE FROM events")
    assert [e["kind"] for e in eventlog.events(ledger)] == ["test.kind"]


def test_change_and_event_commit_or_roll_back_together(ledger):
    with pytest.raises(RuntimeError):
        with ledger.tx() as c:
            ledger.insert(c, "cursors", {"source": "s", "value": "1", "updated_at": "t"})
            ledger.event(c, "cursor.moved", "script", {"source": "s"})
            raise RuntimeError("crash between change and commit")
    assert ledger.scalar("SELECT count(*) FROM cursors") == 0
    assert eventlog.events(ledger) == []


def test_event_outside_transaction_is_a_bug(ledger):
    with pytest.raises(RuntimeError):
        ledger.event(ledger.conn, "x", "script", {})


def test_concurrent_writers_serialise(tmp_path):
    path = ledger_path(tmp_path)
    Ledger.open(path).close()
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        led = Ledger.open(path)
        try:
            for i in range(50):
                with led.tx() as c:
                    count = c.execute("SELECT count(*) FROM cursors").fetchone()[0]
                    led.insert(c, "cursors", {"source": f"{n}-{i}-{count}", "value": "v", "updated_at": "t"})
                    led.event(c, "cursor.moved", "script", {"n": n})
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            led.close()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    led = Ledger.open(path)
    assert led.scalar("SELECT count(*) FROM cursors") == 200
    assert led.scalar("SELECT count(*) FROM events") == 200
    assert led.integrity() == "ok"
    led.close()
