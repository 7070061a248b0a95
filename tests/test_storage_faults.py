"""Issue 13 cases 7, 9 and 12: a full disk, a read-only ledger, a busy ledger and a home that does not exist each end
in one line naming the cause and a non-zero exit, never a traceback, never a ledger called corrupt.

Real parts: the installed `agent` binary as a subprocess, a real SQLite ledger, and a real file system for the
faults: a small tmpfs mounted for the test (as root; CI runs as root), filled to the last block for "disk full"
and remounted read-only for "read-only". Nothing about the disk is simulated. A busy ledger is a second real
process holding SQLite's write lock (BEGIN IMMEDIATE).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chaos_support import agent_bin, build, check_invariants, run_to_end
from conftest import ROOT

pytestmark = pytest.mark.sqlite_only("faults of the SQLite file's disk, permissions and write lock")


def run(home: Path, *args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    full = {**os.environ, "AGENT_HOME": str(home), **(env or {})}
    full.pop("AGENT_CRASHPOINT", None)
    return subprocess.run([*agent_bin(), *args], env=full, capture_output=True, text=True, timeout=timeout,
                          cwd=str(ROOT))


def one_line(p: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in p.stderr + p.stdout, p.stderr
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("agent: "), p.stderr
    return lines[0]


@pytest.fixture
def tmpfs(tmp_path):
    mnt = tmp_path / "fs"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root, as in CI): {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill(mnt: Path) -> Path:
    """Write zeros until the file system has no block left; returns the filler file."""
    filler = mnt / "filler"
    chunk = b"\0" * (1 << 16)
    with open(filler, "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(chunk)
        except OSError:
            pass
        try:
            while True:
                fh.write(b"\0" * 512)
        except OSError:
            pass
    assert os.statvfs(mnt).f_bavail == 0
    return filler


NOT_CORRUPT = ("not a readable SQLite ledger", "restore a backup", "corrupt", "malformed")


@pytest.mark.slow
def test_disk_full_one_line_exit_1_nothing_lost_and_reads_never_say_corrupt(tmpfs, tmp_path):
    p = build(tmpfs / "w", tasks=1)
    home = p["home"]
    events = tmp_path / "events.jsonl"
    from agent.app.demo import error_events

    events.write_text(error_events(3, distinct=True))
    filler = fill(tmpfs)

    for args in (("watch", "error-fix-work"), ("watch", "all"), ("error", "ingest", str(events))):
        started = time.monotonic()
        r = run(home, *args)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        assert "no space left on the device" in one_line(r), (args, r.stderr)
        assert time.monotonic() - started < 30
    for args in (("status",), ("task", "list"), ("error", "list")):
        r = run(home, *args)
        assert not any(s in r.stderr for s in NOT_CORRUPT), (args, r.stderr)
        if r.returncode != 0:  # a read may need room for ledger.db-shm: then it names the full disk, nothing else
            assert "no space left on the device" in one_line(r), (args, r.stderr)

    # space back: the same home goes on to the end; every invariant holds, nothing was lost
    filler.unlink()
    r = run(home, "error", "ingest", str(events))
    assert r.returncode == 0 and r.stdout.startswith("new 2,"), r.stdout + r.stderr
    run_to_end(home, log=tmp_path / "w.log")
    check_invariants(home, p["remote"], tasks=1)


def test_read_only_ledger_one_line_exit_1(tmpfs, tmp_path):
    home = tmpfs / "home"
    assert run(home, "init").returncode == 0
    events = tmp_path / "events.jsonl"
    from agent.app.demo import error_events

    events.write_text(error_events(1))
    assert run(home, "error", "ingest", str(events)).returncode == 0
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    for args in (("error", "ingest", str(events)), ("watch", "all"), ("watch", "error-fix-work")):
        r = run(home, *args)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        line = one_line(r)
        assert "read-only file system" in line and "writable" in line, (args, line)
    r = run(home, "error", "list")
    assert not any(s in r.stderr for s in NOT_CORRUPT), r.stderr
    subprocess.run(["mount", "-o", "remount,rw", str(tmpfs)], check=True)
    r = run(home, "error", "list", "--json")
    assert r.returncode == 0 and '"count": 1' in r.stdout  # nothing lost


def _hold_write_lock(path: Path) -> subprocess.Popen:
    code = ("import sqlite3, sys, time\n"
            "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "c.execute('BEGIN IMMEDIATE')\n"
            "print('locked', flush=True)\n"
            "time.sleep(120)\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    return holder


def test_busy_ledger_waits_one_bounded_budget_then_says_busy(home, tmp_path):
    """Old main retried BEGIN 50 times, each on top of a 30 s busy timeout (up to ~26 minutes). The budget is one
    total wait (30 s; AGENT_LEDGER_BUSY_TIMEOUT shortens it here so the test is quick)."""
    from agent.app.demo import error_events

    assert run(home, "init").returncode == 0
    events = tmp_path / "events.jsonl"
    events.write_text(error_events(1))
    assert run(home, "error", "ingest", str(events)).returncode == 0
    eid = json.loads(run(home, "error", "list", "--json").stdout)[0]["id"]
    holder = _hold_write_lock(home / "ledger.db")
    try:
        for args in (("error", "ingest", str(events)), ("error", "decide", eid[:8], "--skip", "--reason", "x")):
            started = time.monotonic()
            r = run(home, *args, env={"AGENT_LEDGER_BUSY_TIMEOUT": "2"}, timeout=25)
            waited = time.monotonic() - started
            assert r.returncode == 1, (args, r.stdout, r.stderr)
            line = one_line(r)
            assert "ledger is busy" in line and "fuser" in line and "then run again" in line, line
            assert 1.5 <= waited < 20, waited  # it did wait its budget, and only once
    finally:
        holder.kill()
        holder.wait()
    r = run(home, "error", "ingest", str(events))
    assert r.returncode == 0, r.stderr


def test_ledger_tx_bounds_its_total_wait(tmp_path, monkeypatch):
    from agent.ledger import Ledger, StorageError

    Ledger.open(tmp_path / "ledger.db").close()
    monkeypatch.setenv("AGENT_LEDGER_BUSY_TIMEOUT", "1")
    led = Ledger.open(tmp_path / "ledger.db")
    holder = _hold_write_lock(tmp_path / "ledger.db")
    try:
        started = time.monotonic()
        with pytest.raises(StorageError, match="ledger is busy"):
            with led.tx():
                pass
        assert time.monotonic() - started < 10
    finally:
        holder.kill()
        holder.wait()
    with led.tx() as c:  # the lock is gone: writes work again on the same connection, with the full budget
        led.event(c, "test.kind", "script", {})
    assert led.scalar("PRAGMA busy_timeout") == 1000
    led.close()


@pytest.mark.parametrize("args", [("status",), ("watch", "all"), ("task", "list"), ("error", "list"),
                                  ("doctor",), ("events",), ("lane", "list"), ("daemon", "--max-ticks", "1")])
def test_a_home_that_does_not_exist_is_refused_not_created(tmp_path, args):
    typo = tmp_path / "agent-hoem"
    r = run(typo, *args)
    assert r.returncode == 1, (args, r.stdout, r.stderr)
    line = one_line(r)
    assert f"home {typo} does not exist" in line and "agent init" in line and "AGENT_HOME" in line, line
    assert not typo.exists()


def test_init_creates_the_home_and_then_commands_work(tmp_path):
    home = tmp_path / "new-home"
    r = run(home, "init")
    assert r.returncode == 0 and home.is_dir(), r.stderr
    assert run(home, "status").returncode == 0
