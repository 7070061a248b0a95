"""A real PostgreSQL server for the tests, started by the tests themselves (no mocks, no shared service).

``PgServer.start()`` makes a throw-away cluster in a temporary folder with Debian's ``postgresql`` binaries
(``scripts/ci-postgres`` installs them), owned by an unprivileged user: PostgreSQL refuses to run as root, so as
root the cluster belongs to ``nobody`` and ``initdb``/``pg_ctl`` run through ``runuser``. It listens on 127.0.0.1
on a free port (and on a unix socket in the same folder), trusts local connections (a test cluster nobody else
can reach), and is stopped and removed at the end of the session.

Each test gets a fresh database: ``CREATE DATABASE ... TEMPLATE`` of a template that was migrated once, which
costs a few milliseconds instead of running every migration again.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import threading
from pathlib import Path

UNPRIVILEGED = "nobody"
TEMPLATE = "agent_template"


class Unavailable(Exception):
    """No PostgreSQL can be had here; the message says why (tests skip with it)."""


def find_bindir() -> Path | None:
    """Debian's /usr/lib/postgresql/N/bin (the newest), else wherever ``initdb`` is on PATH."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0)
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgServer:
    def __init__(self, bindir: Path, root: Path, port: int, user: str | None, socket_dirs: tuple[Path, ...] = ()):
        self.bindir, self.root, self.port, self.user = bindir, root, port, user
        self.data = root / "data"
        self.sockets = root / "sock"
        self.socket_dirs = tuple(socket_dirs)     # more unix socket dirs (made by the caller; chowned here)
        self._counter = 0
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def start(cls, socket_dirs: tuple[Path, ...] = ()) -> "PgServer":
        bindir = find_bindir()
        if bindir is None:
            raise Unavailable("PostgreSQL is not installed (no initdb); run `bash scripts/ci-postgres` as root, "
                              "or `apt-get install postgresql`")
        user = None
        if os.geteuid() == 0:
            if shutil.which("runuser") is None:
                raise Unavailable("running as root and `runuser` is missing: cannot start PostgreSQL as an "
                                  "unprivileged user")
            user = UNPRIVILEGED
        root = Path(tempfile.mkdtemp(prefix="agent-pg-"))
        server = cls(bindir, root, free_port(), user, socket_dirs)
        try:
            server._init()
        except BaseException:
            server.stop()
            raise
        return server

    def _run(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
        cmd = [str(self.bindir / argv[0]), *argv[1:]]
        if self.user:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "LANG": "C"}
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd="/")

    def _init(self) -> None:
        self.sockets.mkdir()
        if self.user:
            import pwd

            pw = pwd.getpwnam(self.user)
            for p in (self.root, self.sockets, *self.socket_dirs):
                os.chown(p, pw.pw_uid, pw.pw_gid)
        os.chmod(self.root, 0o700)
        res = self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
                        "--locale=C", "--no-sync", "--no-instructions")
        if res.returncode != 0:
            raise Unavailable(f"initdb failed: {(res.stderr or res.stdout).strip()[-400:]}")
        res = self._pg_start()
        if res.returncode != 0:
            log = (self.root / "server.log")
            tail = log.read_text(errors="replace")[-400:] if log.exists() else ""
            raise Unavailable(f"pg_ctl start failed: {(res.stderr or res.stdout).strip()[-300:]} {tail}")
        self.admin(f"CREATE DATABASE {TEMPLATE}")
        self._watchdog()

    def _pg_start(self) -> subprocess.CompletedProcess:
        dirs = ",".join(str(d) for d in (self.sockets, *self.socket_dirs))
        opts = (f"-p {self.port} -k {dirs} -c listen_addresses=127.0.0.1 -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off -c max_connections=400 "
                "-c shared_buffers=64MB")
        return self._run("pg_ctl", "-D", str(self.data), "-o", opts, "-l", str(self.root / "server.log"), "-w",
                         "-t", "60", "start")

    def pause(self) -> None:
        """Stop the server (a real outage: every connection is closed, new ones are refused) until ``resume``."""
        res = self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop", timeout=60)
        if res.returncode != 0:
            raise Unavailable(f"pg_ctl stop failed: {(res.stderr or res.stdout).strip()[-300:]}")

    def resume(self) -> None:
        res = self._pg_start()
        if res.returncode != 0:
            raise Unavailable(f"pg_ctl start failed: {(res.stderr or res.stdout).strip()[-300:]}")

    def _watchdog(self) -> None:
        """A tiny process that stops the cluster and removes its folder if this process dies without ``stop()``
        (a killed test run must not leave a server behind)."""
        import sys

        stop = [str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"]
        if self.user:
            stop = ["runuser", "-u", self.user, "--", *stop]
        code = ("import os, shutil, subprocess, sys, time\n"
                "parent, root, stop = int(sys.argv[1]), sys.argv[2], sys.argv[3:]\n"
                "while os.path.isdir(root):\n"
                "    try:\n        os.kill(parent, 0)\n    except ProcessLookupError:\n        break\n"
                "    time.sleep(1)\n"
                "if os.path.isdir(root):\n"
                "    subprocess.run(stop, capture_output=True)\n    shutil.rmtree(root, ignore_errors=True)\n")
        subprocess.Popen([sys.executable, "-c", code, str(os.getpid()), str(self.root), *stop],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)

    def stop(self) -> None:
        if self.data.exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop", timeout=60)
        shutil.rmtree(self.root, ignore_errors=True)

    # ------------------------------------------------------------------ databases

    def url(self, db: str = "postgres", password: str | None = None) -> str:
        auth = f"postgres:{password}" if password else "postgres"
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{db}"

    def admin(self, *statements: str) -> None:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            for sql in statements:
                conn.execute(sql)

    def migrate_template(self) -> None:
        """Run every migration once in the template database (fresh databases copy it)."""
        from agent.ledger import Ledger

        Ledger.open(self.url(TEMPLATE)).close()

    def fresh(self, template: str = TEMPLATE) -> str:
        """A new empty-but-migrated database; returns its URL."""
        with self._lock:
            self._counter += 1
            name = f"t{os.getpid()}_{self._counter}"
        self.admin(f"CREATE DATABASE {name} TEMPLATE {template} STRATEGY FILE_COPY")
        return self.url(name)

    def empty(self) -> str:
        """A new database with no agent tables at all (for migration tests)."""
        return self.fresh(template="template0")

    def drop(self, url: str) -> None:
        name = url.rsplit("/", 1)[1]
        try:
            self.admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        except Exception:  # noqa: BLE001 - best effort: the whole cluster goes at session end
            pass
