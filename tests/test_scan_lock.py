"""Issue 13 case 6: the scan lock has a lease and a heartbeat, and names its holder by pid and process start time.

Real processes: the holder is a separate Python process taking the real lock (`agent.coord.locks.scan_lock`, with a short
lease so the test is quick), stopped with a real SIGSTOP; the contender is the installed `agent watch` binary on
the demo project. On old main the lock was a flock with no lease: a stopped holder blocked every other watcher for
as long as it stayed stopped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from chaos_support import build, check_invariants, run_to_end

from conftest import agent_bin

HOLD = """
import sys, time
from pathlib import Path
from agent.coord.locks import scan_lock
try:
    lock = scan_lock(Path(sys.argv[1]), "error-fix-work", lease=float(sys.argv[2]))
except TypeError:  # old main's lock had no lease: hold it the only way it offered
    lock = scan_lock(Path(sys.argv[1]), "error-fix-work")
with lock:
    print("held", flush=True)
    time.sleep(120)
"""


def watch(home):
    env = {k: v for k, v in os.environ.items() if k != "AGENT_CRASHPOINT"}
    env["AGENT_HOME"] = str(home)
    return subprocess.run([*agent_bin(), "watch", "error-fix-work"], env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def holder():
    procs = []

    def start(home, lease=1.0):
        p = subprocess.Popen([sys.executable, "-c", HOLD, str(home), str(lease)], stdout=subprocess.PIPE, text=True)
        procs.append(p)
        assert p.stdout.readline().strip() == "held"
        return p

    yield start
    for p in procs:
        try:
            os.kill(p.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        p.kill()
        p.wait()


def test_a_live_holder_keeps_the_lock_past_its_lease_by_its_heartbeat_a_stopped_one_loses_it(tmp_path, holder):
    p = build(tmp_path / "w", tasks=1)
    home = p["home"]
    h = holder(home, lease=1.0)
    time.sleep(2.5)  # well past the lease: only the heartbeat keeps it
    r = watch(home)
    assert r.returncode == 0 and "scan error-fix-work is already running" in r.stdout, r.stdout
    assert str(h.pid) in r.stdout
    os.kill(h.pid, signal.SIGSTOP)  # e.g. a watcher suspended with Ctrl-Z, or a frozen VM
    time.sleep(1.5)
    r = watch(home)
    assert r.returncode == 0, r.stderr
    assert "already running" not in r.stdout, r.stdout
    assert f"scan error-fix-work: took the lock over from pid {h.pid}" in r.stdout, r.stdout
    assert "task 1 round 1:" in r.stdout, r.stdout  # it did the work

    # the stopped holder resumes, sees it was replaced, and neither crashes nor removes another holder's lock
    os.kill(h.pid, signal.SIGCONT)
    time.sleep(0.5)
    assert h.poll() is None
    run_to_end(home, log=tmp_path / "w.log")
    check_invariants(home, p["remote"], tasks=1)


def test_a_dead_holder_or_a_reused_pid_never_blocks(tmp_path, holder):
    p = build(tmp_path / "w", tasks=1)
    home = p["home"]
    h = holder(home, lease=60.0)
    h.kill()
    h.wait()
    r = watch(home)  # at once, not after the 60 s lease: the holder is dead
    assert "already running" not in r.stdout and "took the lock over from pid" in r.stdout, r.stdout

    # a record naming a live pid (ours) with another start time: that pid was reused by someone else
    from agent.coord.runners import HOST

    now = time.time()
    (home / "locks" / "error-fix-work.lock").write_text(json.dumps(
        {"pid": os.getpid(), "start": 1, "host": HOST, "token": "t", "since": now, "heartbeat": now, "lease": 60}))
    r = watch(home)
    assert "already running" not in r.stdout, r.stdout


def test_the_lock_is_released_and_a_foreign_lock_file_is_not_a_holder(tmp_path):
    from agent.coord.locks import ScanBusy, scan_lock

    (tmp_path / "locks").mkdir()
    (tmp_path / "locks" / "x.lock").write_text("pid=1 token=abc since=0\n")  # an older agent's format
    with scan_lock(tmp_path, "x", lease=5.0) as lock:
        from agent.infra.proc import start_time

        record = json.loads((tmp_path / "locks" / "x.lock").read_text())
        assert record["pid"] == os.getpid() and record["start"] == start_time(os.getpid()) and record["start"]
        assert record["lease"] == 5.0 and record["token"] == lock.token and lock.took_over is None
        with pytest.raises(ScanBusy, match="already running"):
            with scan_lock(tmp_path, "x"):
                pass
    assert not (tmp_path / "locks" / "x.lock").exists()
