"""Overlapping watchers, the per-task claim, and `--jobs N`.

Real processes (`agent watch error-fix-work`), real threads calling `fixer.advance`, scripted lanes that log their
start/end to a shared file (agent/app/demo_lanes --log), one SQLite ledger.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

from agent.ledger import eventlog, ledger_path
from chaos_support import build, check_invariants, lane_launches, open_tasks, read_log, watcher
from conftest import ledger_conn


def test_overlapping_watchers_launch_each_lane_once_per_round(tmp_path):
    log = tmp_path / "lanes.log"
    p = build(tmp_path / "w", tasks=3, lane_args=("--sleep", "0.05:0.2", "--log", str(log)))
    home = p["home"]
    for _ in range(10):
        procs = [watcher(home, jobs=2, log=tmp_path / "watch.log") for _ in range(3)]
        assert [w.wait(120) for w in procs] == [0, 0, 0]
        if open_tasks(home) == 0:
            break
    check_invariants(home, p["remote"], tasks=3)
    out = (tmp_path / "watch.log").read_text()
    assert "scan error-fix-work is already running" in out  # they did overlap, and the scan lock said so
    launches = lane_launches(home)
    assert launches and all(n == 1 for n in launches.values()), launches
    starts = Counter((r["spec"], r["role"]) for r in read_log(log) if r["event"] == "start")
    assert starts and max(starts.values()) == 1, starts  # the lane processes agree: each started once
    con = ledger_conn(home)
    assert con.execute("SELECT count(*) FROM lane_runs WHERE status = 'interrupted'").fetchone()[0] == 0
    con.close()


def _app(home):
    from agent.app.context import App

    return App(home=home)


def test_two_workers_on_one_task_one_works_the_other_is_refused(tmp_path):
    """Bypass the scan lock: two threads call fixer.advance on the same task at the same moment."""
    from agent.flows import fixer

    log = tmp_path / "lanes.log"
    p = build(tmp_path / "w", tasks=1, lane_args=("--sleep", "0.4", "--log", str(log)))
    app = _app(p["home"])
    config = app.config
    barrier = threading.Barrier(2)
    out: list[list[str]] = []

    def worker():
        barrier.wait()
        out.append(fixer.advance(p["home"], config, 1, max_steps=2))

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    app.close()
    refused = [lines for lines in out if lines == ["task 1: claimed by another worker; skipped"]]
    worked = [lines for lines in out if lines != ["task 1: claimed by another worker; skipped"]]
    assert len(refused) == 1 and len(worked) == 1, out
    assert [r["role"] for r in read_log(log) if r["event"] == "start"] == ["implementer"]
    con = ledger_conn(p["home"])
    assert con.execute("SELECT claim_token FROM tasks").fetchone()[0] is None  # released
    con.close()


def test_two_processes_on_one_task(tmp_path):
    """The same with two real processes, each running `advance` (the claim lives in the ledger, not in memory)."""
    import subprocess
    import sys

    log = tmp_path / "lanes.log"
    p = build(tmp_path / "w", tasks=1, lane_args=("--sleep", "0.5", "--log", str(log)))
    code = ("import sys; from pathlib import Path; from agent.app.context import App; from agent.flows import fixer; "
            "h = Path(sys.argv[1]); print('\\n'.join(fixer.advance(h, App(home=h).config, 1, max_steps=2)))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(p["home"])], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [pr.communicate(timeout=60)[0] for pr in procs]
    assert sum("claimed by another worker; skipped" in o for o in outs) == 1, outs
    assert [r["role"] for r in read_log(log) if r["event"] == "start"] == ["implementer"]


def test_worker_whose_claim_was_stolen_cannot_write_its_result(tmp_path):
    """While the worker's lane runs, its claim is taken over (token changed): the lane's result is not
    written as step state, and the worker says so."""
    from agent.flows import fixer
    from agent.ledger.tasks import ClaimLost, set_step

    log = tmp_path / "lanes.log"
    p = build(tmp_path / "w", tasks=1, lane_args=("--sleep", "0.8", "--log", str(log)))
    app = _app(p["home"])
    config = app.config
    out: list[str] = []
    th = threading.Thread(target=lambda: out.extend(fixer.advance(p["home"], config, 1, max_steps=3)))
    th.start()
    deadline = time.monotonic() + 30
    while not read_log(log) and time.monotonic() < deadline:
        time.sleep(0.02)
    con = ledger_conn(p["home"])
    old = con.execute("SELECT claim_token FROM tasks WHERE id = 1").fetchone()[0]
    assert old
    con.execute("UPDATE tasks SET claim_token = 'thief', claim_pid = 1, lease_until = ? WHERE id = 1",
                (time.time() + 600,))
    th.join(60)
    app.close()
    assert any("claim lost to another worker; result not written" in line for line in out), out
    steps = dict(con.execute("SELECT key, status FROM steps WHERE task_id = 1").fetchall())
    assert steps["implementer_done"] == "pending"
    assert con.execute("SELECT claim_token FROM tasks WHERE id = 1").fetchone()[0] == "thief"  # not released
    con.close()
    from agent.ledger import Ledger

    led = Ledger.open(ledger_path(p["home"]), create=False)
    try:
        import pytest

        with pytest.raises(ClaimLost):
            set_step(led, 1, "spec_written", "ja", "x", source="script", claim_token=old)
    finally:
        led.close()


def test_stale_claims_are_reclaimed_live_ones_are_not(tmp_path):
    from agent.coord.claims import claim, release
    from agent.ledger import Ledger

    p = build(tmp_path / "w", tasks=1)
    led = Ledger.open(ledger_path(p["home"]), create=False)
    try:
        with led.tx() as c:  # a dead process on this host holds it
            c.execute("UPDATE tasks SET claim_owner = ?, claim_pid = 999999999, claim_token = 'dead', "
                      "lease_until = ? WHERE id = 1", (f"{__import__('socket').gethostname()}:999999999:1",
                                                        time.time() + 600))
        tok = claim(led, 1)
        assert tok and tok != "dead"
        assert claim(led, 1) is None  # we (alive) hold it now
        with led.tx() as c:  # another host's worker whose lease expired
            c.execute("UPDATE tasks SET claim_owner = 'elsewhere:1:1', claim_pid = 1, claim_token = 'x', "
                      "lease_until = ? WHERE id = 1", (time.time() - 1,))
        tok2 = claim(led, 1)
        assert tok2
        release(led, 1, tok2)
        kinds = [e["kind"] for e in eventlog.events(led, task_id=1)]
        assert kinds.count("task.claim_reclaimed") == 2
    finally:
        led.close()


def test_jobs_runs_task_lanes_in_parallel(tmp_path):
    """`--jobs 4` with 4 tasks: their implementer lanes overlap in time (start/end from the lanes' own log)."""
    log = tmp_path / "lanes.log"
    p = build(tmp_path / "w", tasks=4, lane_args=("--sleep", "0.4", "--log", str(log)))
    w = watcher(p["home"], jobs=4, log=tmp_path / "watch.log")
    assert w.wait(120) == 0
    ends = [r for r in read_log(log) if r["event"] == "end" and r["role"] == "implementer"]
    first = {}
    for r in ends:
        first.setdefault(r["cwd"], r)
    spans = sorted((r["start"], r["end"]) for r in first.values())
    assert len(spans) == 4
    overlapping = sum(1 for a, b in zip(spans, spans[1:]) if b[0] < a[1])
    assert overlapping >= 1, spans
    check_invariants(p["home"], p["remote"], tasks=4, require_done=False)
