"""The PostgreSQL ledger, always run (whatever --ledger says) against a real server the session starts itself:
migrations make the same tables and columns as on SQLite, events are append-only in the database, `agent doctor`
checks it, a bad URL is one line without the password, the environment wins over config.yaml, and the product's
own flow (init, ingest, decide, a task to a draft PR in the demo) runs on it."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest

from agent.ledger import SCHEMA_VERSION, Ledger, LedgerError, backend, eventlog, health, pg
from agent.ledger.migrations import expected_schema
from agent.ledger.migrations import MIGRATIONS
from conftest import agent_bin


@pytest.fixture
def pg_home(tmp_path, monkeypatch, pg_url):
    """A home whose ledger is a fresh PostgreSQL database (named by AGENT_LEDGER_URL)."""
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("AGENT_HOME", str(h))
    monkeypatch.setenv("AGENT_LEDGER_URL", pg_url)
    for var in ("GITHUB_TOKEN", "GH_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    return h


def run_agent(*args, env=None, timeout=120):
    full = {**os.environ, **(env or {})}
    return subprocess.run([*agent_bin(), *args], capture_output=True, text=True, env=full, timeout=timeout)


def sqlite_columns() -> dict[str, list[str]]:
    led = Ledger.open(":memory:")
    try:
        tables = [r[0] for r in led.conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]
        return {t: [r[1] for r in led.conn.execute(f'PRAGMA table_info("{t}")')] for t in tables}
    finally:
        led.close()


# ------------------------------------------------------------------ migrations


def test_migrations_on_empty_database_make_the_sqlite_tables_and_columns(pg_server):
    url = pg_server.empty()
    try:
        led = Ledger.open(url)
        assert led.postgres and led.schema_version() == SCHEMA_VERSION
        assert led.migrations() == [name for name, _ in MIGRATIONS]
        cols: dict[str, list[str]] = {}
        for t, c in led.conn.execute("SELECT table_name, column_name FROM information_schema.columns "
                                     "WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position"):
            cols.setdefault(t, []).append(c)
        want = sqlite_columns()
        assert cols.pop("_migrations") == ["name", "applied_at", "seq"]
        want.pop("_migrations")
        assert cols == want
        types = dict(led.conn.execute("SELECT column_name, data_type FROM information_schema.columns "
                                      "WHERE table_name = 'lane_runs'").fetchall())
        assert (types["id"], types["role"], types["cost_usd"]) == ("bigint", "text", "double precision")
        identity = led.scalar("SELECT is_identity FROM information_schema.columns WHERE table_name = 'tasks' "
                              "AND column_name = 'id'")
        assert identity == "YES"
        # defaults and NOT NULL as sqlite-utils made them
        assert led.scalar("SELECT column_default FROM information_schema.columns WHERE table_name = 'errors' "
                          "AND column_name = 'state'") == "'open'::text"
        with pytest.raises(psycopg.errors.NotNullViolation):
            with led.tx() as c:
                c.execute("INSERT INTO errors (id, service) VALUES ('e1', 's')")
        # the catalog matches what the migrations record (what doctor compares against)
        assert pg.schema_objects(led.conn) == expected_schema(SCHEMA_VERSION)
        led.close()
        # reopening applies nothing
        again = Ledger.open(url)
        assert again.migrate() == []
        again.close()
    finally:
        pg_server.drop(url)


def test_two_processes_migrating_one_empty_database_apply_each_migration_once(pg_server):
    url = pg_server.empty()
    try:
        code = "import sys; from agent.ledger import Ledger; Ledger.open(sys.argv[1]).close()"
        procs = [subprocess.Popen([sys.executable, "-c", code, url], stderr=subprocess.PIPE, text=True)
                 for _ in range(3)]
        for p in procs:
            assert p.wait(60) == 0, p.stderr.read()
        led = Ledger.open(url)
        assert led.migrations() == [name for name, _ in MIGRATIONS]
        led.close()
    finally:
        pg_server.drop(url)


def test_the_shim_refuses_what_it_does_not_implement_and_records_without_a_database():
    db = pg.PgDatabase()
    with pytest.raises(TypeError, match="not in the subset"):
        db["t"].create({"id": int}, pk="id", replace=True)
    with pytest.raises(TypeError, match="no PostgreSQL type"):
        db["t"].create({"blob": dict}, pk=None)
    with pytest.raises(TypeError, match=r"\(column, table, column\)"):
        db["t"].create({"id": int, "u": int}, pk="id", foreign_keys=["u"])
    db["t"].create({"id": int, "name": str, "n": float}, pk="id", not_null={"name"}, defaults={"n": 1.5})
    db["t"].create_index(["name"], unique=True)
    db["t"].add_column("extra", int)
    assert db.objects == {"table t": {"id": "bigint not null", "name": "text not null", "n": "double precision",
                                      "extra": "bigint"},
                          "index t_pkey": "unique t (id)", "index idx_t_name": "unique t (name)"}


def test_config_yaml_ledger_url_is_validated_without_echoing_the_password(tmp_path):
    from agent.config import ConfigError, parse_config

    assert parse_config({"ledger": {"url": "postgresql://a@db/x"}}).ledger_url == "postgresql://a@db/x"
    assert parse_config({}).ledger_url is None
    for bad, says in [({"url": "mysql://a:hunter2@db/x"}, "expected a postgresql://"),
                      ({"url": 5}, "ledger.url"), ({"host": "db"}, "ledger.host"),
                      ({"url": "postgresql://a:hunter2@db:port/x"}, "malformed URL")]:
        with pytest.raises(ConfigError) as exc:
            parse_config({"ledger": bad}, filename="config.yaml")
        assert says in str(exc.value) and "hunter2" not in str(exc.value), str(exc.value)


def test_a_database_that_is_not_a_ledger_is_refused(pg_server):
    url = pg_server.empty()
    try:
        with psycopg.connect(url, autocommit=True) as c:
            c.execute("CREATE TABLE customers (id int)")
        with pytest.raises(LedgerError, match="not an agent ledger"):
            Ledger.open(url)
        with psycopg.connect(url, autocommit=True) as c:   # untouched
            assert c.execute("SELECT count(*) FROM information_schema.tables "
                             "WHERE table_schema = 'public'").fetchone()[0] == 1
    finally:
        pg_server.drop(url)


def test_a_newer_schema_is_refused(pg_url):
    with psycopg.connect(pg_url, autocommit=True) as c:
        c.execute("INSERT INTO _migrations (name, applied_at) VALUES ('m999_future', 'x')")
    with pytest.raises(LedgerError, match="newer than this agent"):
        Ledger.open(pg_url)


# ------------------------------------------------------------------ the connection interface


def test_rows_placeholders_returning_and_booleans(pg_url):
    led = Ledger.open(pg_url)
    with led.tx() as c:
        eid = led.event(c, "x.y", "script", {"why": "100% sure"})
        row = c.execute("SELECT id, kind, payload FROM events WHERE kind = ? AND payload LIKE '%100%'",
                        ("x.y",)).fetchone()
        assert row["id"] == row[0] == eid and dict(row)["kind"] == "x.y"
        tid = led.insert(c, "tasks", {"repo": "o/r", "state": "open", "round": 1, "round_cap": 5})
        assert c.execute("UPDATE tasks SET wait_reason = ? WHERE id = ?", ("w", tid)).rowcount == 1
        cid = led.insert(c, "checks", {"task_id": tid, "passed": True, "duration_s": 1.5})
    assert led.one("SELECT passed FROM checks WHERE id = ?", (cid,)) == {"passed": 1}
    assert led.scalar("SELECT sum(round) FROM tasks") == 1          # numeric comes back as int
    assert led.dialect.for_update_skip_locked.strip() == "FOR UPDATE SKIP LOCKED"
    led.close()


def test_event_ids_stay_gapless_after_a_rolled_back_transaction(pg_url):
    led = Ledger.open(pg_url)
    with led.tx() as c:
        led.event(c, "a", "script")
    with pytest.raises(RuntimeError):
        with led.tx() as c:
            led.event(c, "b", "script")
            raise RuntimeError("boom")
    with led.tx(exclusive=False) as c:
        led.event(c, "c", "script")
    assert [(e["id"], e["kind"]) for e in eventlog.events(led)] == [(1, "a"), (2, "c")]
    assert health.tamper(pg_url) == []
    led.close()


def test_writers_serialise_and_a_held_write_lock_is_one_busy_line(pg_url, monkeypatch):
    monkeypatch.setenv("AGENT_LEDGER_BUSY_TIMEOUT", "0.5")
    a, b = Ledger.open(pg_url), Ledger.open(pg_url)
    with a.tx():
        with pytest.raises(LedgerError, match="ledger is busy") as exc:
            with b.tx() as c:
                c.execute("SELECT 1")
        assert "\n" not in str(exc.value)
    # many threads incrementing through read-then-write: no lost update
    with a.tx() as c:
        c.execute("INSERT INTO cursors (source, value) VALUES ('n', '0')")
    monkeypatch.setenv("AGENT_LEDGER_BUSY_TIMEOUT", "30")

    def bump():
        led = Ledger.open(pg_url)
        for _ in range(20):
            with led.tx() as c:
                n = int(c.execute("SELECT value FROM cursors WHERE source = 'n'").fetchone()[0])
                c.execute("UPDATE cursors SET value = ? WHERE source = 'n'", (str(n + 1),))
        led.close()

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert a.scalar("SELECT value FROM cursors WHERE source = 'n'") == "80"
    a.close()
    b.close()


def test_a_lost_connection_is_replaced_and_an_unreachable_server_is_one_line(pg_server, pg_url, monkeypatch):
    from chaos_support import CuttableProxy
    from urllib.parse import urlsplit

    led = Ledger.open(pg_url)
    pid = led.scalar("SELECT pg_backend_pid()")
    pg_server.admin(f"SELECT pg_terminate_backend({pid})")
    # a read that finds its connection gone runs again on a replacement connection with the same session settings
    assert led.all("SELECT * FROM tasks") == []
    assert led.scalar("SELECT pg_backend_pid()") != pid
    assert led.scalar("SHOW lock_timeout") == f"{int(30)}s"
    # a write transaction starts on a replacement too: nothing of it ran on the lost one
    pg_server.admin(f"SELECT pg_terminate_backend({led.scalar('SELECT pg_backend_pid()')})")
    with led.tx() as c:
        led.event(c, "task.created", "script", {})
    assert [e["kind"] for e in eventlog.events(led)] == ["task.created"]
    led.close()
    # a server that stays unreachable past AGENT_LEDGER_OUTAGE_S: one line naming the database, no password
    monkeypatch.setenv("AGENT_LEDGER_OUTAGE_S", "0.5")
    target = urlsplit(pg_url)
    proxy = CuttableProxy(target.hostname, target.port)
    led = Ledger.open(proxy.url(pg_url))
    try:
        proxy.cut()
        with pytest.raises(LedgerError) as exc:
            led.all("SELECT * FROM tasks")
        msg = str(exc.value)
        assert "stayed unreachable" in msg and pg_url.rsplit("/", 1)[1] in msg and "\n" not in msg
        proxy.restore()
        assert led.scalar("SELECT count(*) FROM events") == 1     # back: the process's outage is over
    finally:
        led.close()
        proxy.close()


# ------------------------------------------------------------------ append-only


def test_events_update_delete_and_truncate_are_refused(pg_url):
    led = Ledger.open(pg_url)
    with led.tx() as c:
        led.event(c, "task.created", "script", {"round_cap": 5})
    for sql in ("UPDATE events SET kind = 'x'", "DELETE FROM events", "TRUNCATE events"):
        with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
            with led.tx() as c:
                c.execute(sql)
    assert [e["kind"] for e in eventlog.events(led)] == ["task.created"]
    led.close()


# ------------------------------------------------------------------ doctor


def test_doctor_on_postgres_clean_then_a_dropped_trigger_and_a_deleted_event(pg_home, pg_url):
    from agent.app.doctor import check_ledger, check_ledger_tamper

    led = Ledger.open(pg_url)
    with led.tx() as c:
        for k in ("a", "b", "c"):
            led.event(c, k, "script")
    led.close()
    r = run_agent("doctor", "--json")
    checks = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
    assert checks["ledger"]["ok"], checks["ledger"]
    assert "PostgreSQL 1" in checks["ledger"]["detail"] and f"schema {SCHEMA_VERSION}" in checks["ledger"]["detail"]
    assert checks["ledger trust"]["ok"], checks["ledger trust"]

    with psycopg.connect(pg_url, autocommit=True) as c:
        c.execute("DROP TRIGGER events_no_delete ON events")
        c.execute("DELETE FROM events WHERE kind = 'b'")
        c.execute("ALTER TABLE events DISABLE TRIGGER events_no_update")
    (trust,) = check_ledger_tamper(pg_home)
    assert not trust.ok
    assert "missing trigger events_no_delete" in trust.detail
    assert "changed: trigger events_no_update" in trust.detail
    assert "events deleted: 1 id(s) missing" in trust.detail
    assert check_ledger(pg_home).ok          # still readable: the trust check is what fails
    r = run_agent("doctor")
    assert r.returncode == 1 and "ledger trust" in r.stdout


def test_doctor_names_an_unreachable_server_and_unknown_migrations(pg_home, pg_url, monkeypatch):
    from agent.app.doctor import check_ledger

    with psycopg.connect(pg_url, autocommit=True) as c:
        c.execute("INSERT INTO _migrations (name, applied_at) VALUES ('m900_other', 'x')")
    check = check_ledger(pg_home)
    assert not check.ok and "m900_other" in check.detail and "upgrade" in check.fix

    monkeypatch.setenv("AGENT_LEDGER_URL", "postgresql://agent:s3cret@127.0.0.1:1/ledger")
    check = check_ledger(pg_home)
    assert not check.ok and "127.0.0.1:1/ledger" in check.detail and "s3cret" not in check.detail + check.fix
    r = run_agent("doctor", env={"AGENT_LEDGER_URL": "postgresql://agent:s3cret@127.0.0.1:1/ledger"})
    assert r.returncode == 1 and "s3cret" not in r.stdout + r.stderr and "Traceback" not in r.stderr


# ------------------------------------------------------------------ selection


@pytest.mark.parametrize("url, says", [
    ("postgresql://agent:hunter2@127.0.0.1:1/ledger", "127.0.0.1:1/ledger"),
    ("mysql://agent:hunter2@db/ledger", "expected a postgresql://"),
    ("postgresql://agent:hunter2@db:notaport/ledger", "malformed URL"),
])
def test_a_bad_ledger_url_is_one_line_without_the_password(pg_home, url, says):
    r = run_agent("status", env={"AGENT_LEDGER_URL": url})
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "AGENT_LEDGER_URL" in lines[0], lines
    assert "hunter2" not in r.stderr + r.stdout and "Traceback" not in r.stderr


def test_a_bad_url_in_config_yaml_names_the_file_and_key(pg_home, monkeypatch):
    monkeypatch.delenv("AGENT_LEDGER_URL")
    (pg_home / "config.yaml").write_text("ledger: {url: 'sqlite:///tmp/x?password=hunter2'}\n")
    r = run_agent("status", env={"AGENT_LEDGER_URL": ""})
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert "config.yaml: ledger.url: expected a postgresql://" in r.stderr
    (pg_home / "config.yaml").write_text("ledger: {url: 5}\n")
    r = run_agent("status", env={"AGENT_LEDGER_URL": ""})
    assert r.returncode == 1 and "config.yaml: ledger.url: expected a postgresql://" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (pg_home / "ledger.db").exists()


def test_environment_wins_over_config_and_config_alone_selects_postgres(pg_server, tmp_path, monkeypatch):
    a, b = pg_server.fresh(), pg_server.fresh()
    try:
        home = tmp_path / "h"
        home.mkdir()
        (home / "config.yaml").write_text(f"ledger:\n  url: {a}\n")
        env = {"AGENT_HOME": str(home), "AGENT_LEDGER_URL": ""}
        line = '{"message": "KeyError: qty", "class": "KeyError", "service": "svc"}\n'
        r = subprocess.run([*agent_bin(), "error", "ingest", "-"], input=line, capture_output=True, text=True,
                           env={**os.environ, **env}, timeout=60)
        assert r.returncode == 0, r.stderr
        r = subprocess.run([*agent_bin(), "error", "ingest", "-"], input=line.replace("qty", "sku"),
                           capture_output=True, text=True, env={**os.environ, **env, "AGENT_LEDGER_URL": b},
                           timeout=60)
        assert r.returncode == 0, r.stderr
        msgs = {u: [row[0] for row in psycopg.connect(u).execute("SELECT message FROM errors")] for u in (a, b)}
        assert msgs == {a: ["KeyError: qty"], b: ["KeyError: sku"]}
        assert not (home / "ledger.db").exists()      # SQLite was never touched
    finally:
        pg_server.drop(a)
        pg_server.drop(b)


def test_resolution_order_and_display():
    home = Path("/nonexistent-home")
    assert backend.resolve(home, environ={}) == home / "ledger.db"
    assert backend.resolve(home, environ={"AGENT_LEDGER_URL": "postgresql://u@h/db"}) == "postgresql://u@h/db"
    assert backend.display("postgresql://u:pw@h:5/db") == "postgresql://u:***@h:5/db"
    assert backend.translate("SELECT '?', \"a%\" FROM t WHERE x LIKE 'a%' AND y = ? AND z % 2 = 0") == \
        "SELECT '?', \"a%%\" FROM t WHERE x LIKE 'a%%' AND y = %s AND z %% 2 = 0"


def test_ledger_url_never_reaches_a_lane(monkeypatch):
    from agent.infra.env import lane_env

    monkeypatch.setenv("AGENT_LEDGER_URL", "postgresql://u:pw@h/db")
    monkeypatch.setenv("PGPASSWORD", "pw")
    env = lane_env(("AGENT_LEDGER_URL", "PGPASSWORD"), deny=())
    assert "AGENT_LEDGER_URL" not in env and "PGPASSWORD" not in env


# ------------------------------------------------------------------ the product on PostgreSQL


def test_init_ingest_decide_status_on_postgres(pg_home, pg_url):
    r = run_agent("init", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["journal_mode"] == "postgresql" and out["ledger"] == pg_url and out["schema"] == SCHEMA_VERSION
    assert not (pg_home / "ledger.db").exists()
    r = subprocess.run([*agent_bin(), "error", "ingest", "-"], capture_output=True, text=True, timeout=60,
                       input='{"message": "KeyError: qty", "class": "KeyError", "service": "svc"}\n' * 3)
    assert r.returncode == 0 and "new 1, deduplicated 2" in r.stdout, (r.stdout, r.stderr)
    errors = json.loads(run_agent("error", "list", "--json").stdout)
    assert len(errors) == 1 and errors[0]["count"] == 3
    r = run_agent("error", "decide", errors[0]["id"][:8], "--skip", "--reason", "known")
    assert r.returncode == 0, r.stderr
    status = json.loads(run_agent("status", "--json").stdout)
    assert status["errors"] == {"fixing": 0, "open": 0, "resolved": 0, "skipped": 1}
    kinds = [e["kind"] for e in json.loads(run_agent("events", "--json").stdout)]
    assert kinds[:1] == ["error.ingested"] and "error.decided" in kinds, kinds
    assert health.tamper(pg_url) == []


@pytest.mark.slow
def test_demo_on_postgres_ends_in_a_draft_pr(pg_url, tmp_path):
    t0 = time.monotonic()
    r = run_agent("demo", "--dir", str(tmp_path / "demo"), env={"AGENT_LEDGER_URL": pg_url}, timeout=300)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    with psycopg.connect(pg_url) as c:
        prs = c.execute("SELECT state, draft FROM prs").fetchall()
        tasks = c.execute("SELECT state FROM tasks").fetchall()
    assert prs and all(p[1] == 1 for p in prs), prs
    assert tasks and tasks[0][0] == "done", tasks
    assert not list((tmp_path / "demo").rglob("ledger.db")), "the demo wrote a SQLite ledger"
    assert time.monotonic() - t0 < 300
