"""Shared fixtures: a fresh AGENT_HOME, its ledger, a CLI runner, and real git repositories.

``--ledger=postgres`` runs the tests against a real PostgreSQL server the session starts itself
(tests/pgserver.py): the ``home`` fixture then sets AGENT_LEDGER_URL to a fresh database of its own, so in-process
CLI calls, library calls through ``ledger_path(home)`` and subprocesses all use it. Tests about the SQLite file
itself are marked ``sqlite_only`` and deselected there (they ran in the SQLite pass).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.ledger import Ledger, ledger_path

ROOT = Path(__file__).resolve().parent.parent
# A lane for every chain role: a config must serve the open tasks (else it is refused like invalid YAML).
LANES_YAML = "lanes: {implementer: codex, reviewer: claude, pr-quality: claude, pr-logic: codex}\n"


def pytest_addoption(parser):
    parser.addoption("--ledger", choices=("sqlite", "postgres"), default="sqlite",
                     help="the ledger backend the `home` and `ledger` fixtures use (postgres: a real server the "
                          "session starts itself)")


def pytest_collection_modifyitems(config, items):
    """Under --ledger=postgres, tests about the SQLite file itself (``sqlite_only``) are deselected, not skipped:
    they ran in the SQLite pass, and a skip in CI means something could not run. Likewise tests of what only a
    server ledger has (``postgres_only``: its own clock, apart from a runner's) are deselected in the SQLite pass."""
    other = "sqlite_only" if config.getoption("--ledger") == "postgres" else "postgres_only"
    keep, drop = [], []
    for item in items:
        (drop if item.get_closest_marker(other) is not None else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


FORBID_SKIPS = "AGENT_TEST_FORBID_SKIPS"   # set by .ci/run: CI here has every system package, so nothing may skip


def pytest_sessionfinish(session, exitstatus):
    """With $AGENT_TEST_FORBID_SKIPS set, a run that skipped any test fails, naming each skip and its reason."""
    if not os.environ.get(FORBID_SKIPS) or hasattr(session.config, "workerinput"):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = (reporter.stats.get("skipped", []) if reporter else [])
    if skipped and session.exitstatus == 0:
        for rep in skipped:
            reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
            print(f"\n!! skipped in CI: {rep.nodeid}: {reason}", file=sys.stderr)
        print(f"!! {len(skipped)} test(s) skipped while {FORBID_SKIPS} is set: install what they need "
              "(scripts/ci-*) instead", file=sys.stderr)
        session.exitstatus = 1


def postgres_mode(config) -> bool:
    return config.getoption("--ledger") == "postgres"


@pytest.fixture(scope="session")
def pg_server():
    """One PostgreSQL cluster for the session (tests/pgserver.py), or a skip saying why there is none."""
    from pgserver import PgServer, Unavailable

    try:
        server = PgServer.start()
    except Unavailable as exc:
        pytest.skip(f"no PostgreSQL server can be started here: {exc}")
    try:
        server.migrate_template()
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_url(pg_server) -> str:
    """A fresh, migrated PostgreSQL ledger database of this test's own."""
    url = pg_server.fresh()
    yield url
    pg_server.drop(url)


@pytest.fixture(autouse=True)
def _ledger_backend(request, monkeypatch):
    """SQLite: no AGENT_LEDGER_URL leaks in from the shell. --ledger=postgres: every test (but sqlite_only ones)
    gets a fresh PostgreSQL database in AGENT_LEDGER_URL, so ``ledger_path(any home)`` and every subprocess use it."""
    monkeypatch.delenv("AGENT_LEDGER_URL", raising=False)
    if postgres_mode(request.config) and request.node.get_closest_marker("sqlite_only") is None:
        monkeypatch.setenv("AGENT_LEDGER_URL", request.getfixturevalue("pg_url"))


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    h = tmp_path / "home"
    h.mkdir(exist_ok=True)  # every command but `agent init` refuses a home that does not exist
    monkeypatch.setenv("AGENT_HOME", str(h))
    for var in ("GITHUB_TOKEN", "GH_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    return h


@pytest.fixture
def ledger(home) -> Ledger:
    home.mkdir(parents=True, exist_ok=True)
    led = Ledger.open(ledger_path(home))
    yield led
    led.close()


def on_postgres() -> bool:
    """Whether this test's ledger is PostgreSQL (--ledger=postgres)."""
    return bool(os.environ.get("AGENT_LEDGER_URL"))


# What a constraint or trigger violation raises, on either backend.
def db_errors() -> tuple[type[BaseException], ...]:
    import sqlite3

    import psycopg

    return (sqlite3.DatabaseError, psycopg.DatabaseError)


def add_failing_trigger(conn, name: str, table: str, event: str = "UPDATE") -> None:
    """A trigger that makes every ``event`` on ``table`` fail (a fault in the middle of a transaction)."""
    if on_postgres():
        conn.execute(f"CREATE FUNCTION {name}_fn() RETURNS trigger LANGUAGE plpgsql AS "
                     f"$$ BEGIN RAISE EXCEPTION '{name}'; END $$")
        conn.execute(f"CREATE TRIGGER {name} BEFORE {event} ON {table} FOR EACH ROW EXECUTE FUNCTION {name}_fn()")
    else:
        conn.execute(f"CREATE TRIGGER {name} BEFORE {event} ON {table} BEGIN SELECT RAISE(ABORT, '{name}'); END")


def drop_trigger(conn, name: str, table: str) -> None:
    if on_postgres():
        conn.execute(f"DROP TRIGGER {name} ON {table}")
        conn.execute(f"DROP FUNCTION {name}_fn()")
    else:
        conn.execute(f"DROP TRIGGER {name}")


def ledger_bytes(home: Path) -> bytes:
    """Everything the home's ledger stores, as bytes (SQLite: the files, WAL included; PostgreSQL: every row of
    every table), for tests asserting a secret never reached it."""
    where = ledger_path(home)
    if not isinstance(where, str):
        return b"".join(p.read_bytes() for p in Path(home).glob("ledger.db*"))
    con = ledger_conn(home)
    try:
        out = []
        for (table,) in con.execute("SELECT table_name FROM information_schema.tables "
                                    "WHERE table_schema = current_schema()").fetchall():
            out += [repr(tuple(r)) for r in con.execute(f'SELECT * FROM "{table}"').fetchall()]
        return "\n".join(out).encode()
    finally:
        con.close()


def ledger_conn(home: Path):
    """A raw connection to the home's ledger, whichever backend (tests that read or poke rows directly): rows
    read by name and index, ``?`` placeholders, writes committed at once. Close it when done."""
    where = ledger_path(home)
    if isinstance(where, str):
        from agent.ledger.backend import PgConnection, connect_pg

        class TestConnection(PgConnection):
            """What tests written against sqlite3 also call: commit() (autocommit here) and ``with`` (closes)."""

            def commit(self):
                pass

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.close()

        conn = connect_pg(where)
        conn.__class__ = TestConnection
        return conn
    import sqlite3

    con = sqlite3.connect(where, timeout=30, isolation_level=None)
    con.row_factory = sqlite3.Row
    return con


class Agent:
    """Runs `agent ...` in-process through click's CliRunner against the test's home."""

    def __init__(self, home: Path):
        self.home = home
        self.runner = CliRunner()

    def __call__(self, *args: str, input: str | None = None):
        from agent.cli import cli

        return self.runner.invoke(cli, ["--home", str(self.home), *args], input=input)

    def json(self, *args: str):
        r = self(*args, "--json")
        assert r.exit_code == 0, (r.output, r.stderr)
        return json.loads(r.stdout)


@pytest.fixture
def agent(home) -> Agent:
    return Agent(home)


def agent_bin() -> list[str]:
    """The installed console script if it is on this interpreter's path, else `python -m agent`."""
    exe = Path(sys.executable).parent / "agent"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "agent"]


@pytest.fixture
def agent_proc(home):
    """Runs the installed `agent` binary as a real subprocess."""

    def run(*args: str, input: str | None = None, env: dict | None = None, timeout: float = 120):
        full_env = {**os.environ, "AGENT_HOME": str(home), **(env or {})}
        return subprocess.run([*agent_bin(), *args], input=input, capture_output=True, text=True,
                              env=full_env, timeout=timeout)

    return run


def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@localhost",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@localhost"}
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True, env=env).stdout.strip()


def remote_with_branch(tmp_path: Path, branch: str) -> tuple[Path, Path]:
    """A bare remote with one commit on main, and a clone ``work`` on ``branch`` with one more commit (not pushed)."""
    remote = tmp_path / "remote.git"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(remote))
    work = tmp_path / "work"
    git(tmp_path, "init", "-q", "-b", "main", str(work))
    (work / "a.py").write_text("a = 1\n")
    git(work, "add", ".")
    git(work, "commit", "-q", "-m", "init")
    git(work, "push", "-q", str(remote), "main")
    git(work, "checkout", "-q", "-b", branch)
    (work / "a.py").write_text("a = 2\n")
    git(work, "commit", "-q", "-am", "fix")
    return remote, work


@pytest.fixture(autouse=True)
def _process_wide_state_reset():
    """Tests that exercise shutdown (proc.kill_all halts the runner, shutdown.STOP) must not leak into the next."""
    yield
    if "agent.infra.proc" in sys.modules:
        sys.modules["agent.infra.proc"].resume_starting()
    if "agent.infra.shutdown" in sys.modules:
        sys.modules["agent.infra.shutdown"].STOP.clear()


@pytest.fixture
def shared_homes(tmp_path, monkeypatch):
    """Two runner homes sharing one ledger (SQLite: the second home's ledger.db is a symlink to the first's, as two
    runners on one machine; PostgreSQL: both use the test's database through AGENT_LEDGER_URL)."""
    for var in ("GITHUB_TOKEN", "GH_TOKEN", "AGENT_RUNNER_ID", "AGENT_CLAIM_LEASE_S"):
        monkeypatch.delenv(var, raising=False)
    a, b = tmp_path / "runner-a", tmp_path / "runner-b"
    for h in (a, b):
        h.mkdir()
    Ledger.open(ledger_path(a)).close()
    if not on_postgres():
        (b / "ledger.db").symlink_to(a / "ledger.db")
    return a, b


@pytest.fixture(scope="session")
def github_node(tmp_path_factory):
    """One GitHub simulator (tests/github_sim) for the forge contract and GitHub App tests of a session (each uses
    its own branch names); modules that need a fresh one start their own."""
    from github_sim import running

    with running(tmp_path_factory.mktemp("github-node")) as s:
        yield s
