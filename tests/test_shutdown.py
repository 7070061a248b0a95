"""Issue 13 case 1: `agent watch ...` stops like the daemon. Real processes throughout: the watcher is the installed
`agent` binary in its own process group, lanes are scripted stand-ins run as subprocesses that log their pid, start
and end (--log), and the signals are real SIGINT/SIGTERM sent to the watcher only (as Ctrl-C in a terminal or a
service manager would; lanes run in their own sessions, so they never see them).

On old main the first signal printed "Aborted.", exited 1 at once and left the lane running (an orphan)."""

from __future__ import annotations

import signal
import time

import pytest

from chaos_support import build, check_invariants, lane_host_pid, read_log, run_to_end, wait_for, watcher
from conftest import ledger_conn


def _ledger(home):
    con = ledger_conn(home)
    return con


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_first_signal_finishes_and_records_the_running_step_then_exits_128_plus_n(tmp_path, sig, code):
    from agent.coord.runners import pid_alive

    log = tmp_path / "lanes.log"
    p = build(tmp_path / "w", tasks=1, lane_args=("--sleep", "1.0", "--log", str(log)))
    w = watcher(p["home"], command=("watch", "error-fix-work"), log=tmp_path / "w.log")
    assert wait_for(lambda: read_log(log)), (tmp_path / "w.log").read_text()
    lane_pid = lane_host_pid(p["home"])
    w.send_signal(sig)
    assert w.wait(60) == code
    out = (tmp_path / "w.log").read_text()
    assert "Aborted" not in out and "Traceback" not in out, out
    assert f"{sig.name} received; finishing the running step" in out, out
    assert f"stopped by {sig.name}" in out, out
    # the running lane finished (start and end logged), was recorded, and nothing new started after it
    assert [(r["role"], r["event"]) for r in read_log(log)] == [("implementer", "start"), ("implementer", "end")]
    assert not pid_alive(lane_pid)
    con = _ledger(p["home"])
    steps = dict(con.execute("SELECT key, status FROM steps WHERE task_id = 1").fetchall())
    runs = [dict(r) for r in con.execute("SELECT role, status FROM lane_runs")]
    task = dict(con.execute("SELECT state, claim_token FROM tasks WHERE id = 1").fetchone())
    con.close()
    assert runs == [{"role": "implementer", "status": "complete"}]
    assert steps["implementer_done"] == "ja" and steps["committed"] == "pending"
    assert task == {"state": "working", "claim_token": None}  # claim released, task neither failed nor blocked
    # and the next scan goes on from there to the end
    run_to_end(p["home"], log=tmp_path / "w2.log")
    check_invariants(p["home"], p["remote"], tasks=1)


def test_second_signal_kills_the_lane_group_records_it_interrupted_and_leaves_no_orphan(tmp_path):
    from agent.coord.runners import pid_alive

    log = tmp_path / "lanes.log"
    p = build(tmp_path / "w", tasks=1, lane_args=("--sleep", "60", "--log", str(log)))
    w = watcher(p["home"], command=("watch", "all"), log=tmp_path / "w.log")
    assert wait_for(lambda: read_log(log)), (tmp_path / "w.log").read_text()
    lane_pid = lane_host_pid(p["home"])
    w.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert pid_alive(lane_pid)  # the first signal waits for the running step
    w.send_signal(signal.SIGINT)
    assert w.wait(30) == 143  # the first signal decides the exit code
    assert not pid_alive(lane_pid), "the lane outlived its watcher"
    out = (tmp_path / "w.log").read_text()
    assert "second signal, killed 1 running process group(s)" in out and "Traceback" not in out, out
    con = _ledger(p["home"])
    runs = [dict(r) for r in con.execute("SELECT status, reason FROM lane_runs")]
    state = con.execute("SELECT state FROM tasks").fetchone()[0]
    con.close()
    assert runs == [{"status": "interrupted", "reason": "interrupted by shutdown"}], runs
    assert state in ("open", "working")  # not judged: the next scan runs the lane again


def test_first_signal_stops_a_long_lane_after_the_grace_and_logs_only_the_interruption(tmp_path):
    """limits.shutdown_grace: the first signal lets the 60 s lane run for 1 s, then stops it. It is recorded as
    interrupted, with no "malformed" report and no refused repair turn before that, and runs again next time."""
    from agent.coord.runners import pid_alive

    log = tmp_path / "lanes.log"
    p = build(tmp_path / "w", tasks=1, lane_args=("--sleep", "60", "--log", str(log)), limits={"shutdown_grace": 1})
    w = watcher(p["home"], command=("watch", "error-fix-work"), log=tmp_path / "w.log")
    assert wait_for(lambda: read_log(log)), (tmp_path / "w.log").read_text()
    lane_pid = lane_host_pid(p["home"])
    w.send_signal(signal.SIGINT)  # once
    assert w.wait(30) == 130
    assert not pid_alive(lane_pid)
    assert [(r["role"], r["event"]) for r in read_log(log)] == [("implementer", "start")]  # stopped, not finished
    out = (tmp_path / "w.log").read_text()
    assert "SIGINT received; finishing the running step for up to 1 s" in out, out
    assert "1 s grace over (limits.shutdown_grace), stopping 1 running process group(s)" in out, out
    assert "Traceback" not in out and "malformed" not in out and "refused" not in out, out
    con = _ledger(p["home"])
    runs = [dict(r) for r in con.execute("SELECT status, reason FROM lane_runs")]
    events = [(r[0], r[1]) for r in con.execute("SELECT kind, payload FROM events WHERE task_id = 1 AND kind LIKE "
                                                "'lane.%' ORDER BY id")]
    state = con.execute("SELECT state FROM tasks").fetchone()[0]
    con.close()
    assert runs == [{"status": "interrupted", "reason": "interrupted by shutdown"}], runs
    kinds = [k for k, _ in events]
    assert kinds == ["lane.started", "lane.finished", "lane.interrupted"], events
    assert '"status": "interrupted"' in events[1][1] and "malformed" not in events[1][1]
    assert state == "working"  # not judged: the next scan runs the lane again
