"""`agent daemon` as a real process: a bounded run, SIGTERM lets the running step finish, a second signal kills the
running lane's process group, and the next scan resumes. Scripted lanes log their pid/start/end (--log)."""

from __future__ import annotations

import json
import signal
import time

from chaos_support import ROOT, build, check_invariants, lane_host_pid, read_log, run_to_end, wait_for, watcher
from conftest import ledger_conn


def _steps(home) -> dict:
    con = ledger_conn(home)
    try:
        return dict(con.execute("SELECT key, status FROM steps WHERE task_id = 1").fetchall())
    finally:
        con.close()


def test_daemon_max_ticks_runs_a_task_to_done(tmp_path):
    p = build(tmp_path / "w", tasks=1)
    d = watcher(p["home"], command=("daemon", "--interval", "0.2", "--max-ticks", "2"), log=tmp_path / "d.log")
    assert d.wait(120) == 0
    out = (tmp_path / "d.log").read_text()
    assert "daemon: stopped after 2 pass(es)" in out, out
    check_invariants(p["home"], p["remote"], tasks=1)


def test_sigterm_lets_the_running_step_finish_then_exits_0(tmp_path):
    log = tmp_path / "lanes.log"
    p = build(tmp_path / "w", tasks=1, lane_args=("--sleep", "1.0", "--log", str(log)))
    d = watcher(p["home"], command=("daemon", "--interval", "0.2"), log=tmp_path / "d.log")
    assert wait_for(lambda: read_log(log)), (tmp_path / "d.log").read_text()
    d.send_signal(signal.SIGTERM)
    assert d.wait(60) == 0
    out = (tmp_path / "d.log").read_text()
    assert "SIGTERM received; finishing the running step" in out and "daemon: stopped after" in out, out
    records = read_log(log)
    assert [(r["role"], r["event"]) for r in records] == [("implementer", "start"), ("implementer", "end")]
    steps = _steps(p["home"])
    assert steps["implementer_done"] == "ja" and steps["committed"] == "pending"  # finished, nothing new started
    con = ledger_conn(p["home"])
    assert con.execute("SELECT claim_token FROM tasks").fetchone()[0] is None
    con.close()


def test_second_signal_kills_the_lane_group_and_the_next_scan_resumes(tmp_path):
    from agent.app.demo import write_config
    from agent.coord.runners import pid_alive

    log = tmp_path / "lanes.log"
    p = build(tmp_path / "w", tasks=1, lane_args=("--sleep", "60", "--log", str(log)))
    d = watcher(p["home"], command=("daemon", "--interval", "0.2"), log=tmp_path / "d.log")
    assert wait_for(lambda: read_log(log)), (tmp_path / "d.log").read_text()
    lane_pid = lane_host_pid(p["home"])
    d.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert pid_alive(lane_pid)  # the first signal waits for the step
    d.send_signal(signal.SIGINT)
    assert wait_for(lambda: not pid_alive(lane_pid), timeout=10), "the second signal did not kill the lane"
    assert d.wait(30) == 0
    out = (tmp_path / "d.log").read_text()
    assert "second signal, killed 1 running process group(s)" in out, out
    con = ledger_conn(p["home"])
    runs = [dict(r) for r in con.execute("SELECT status, reason FROM lane_runs")]
    state = con.execute("SELECT state FROM tasks").fetchone()[0]
    con.close()
    # one child only (no repair turn started after the kill), recorded as interrupted; the task is not judged
    assert len([r for r in read_log(log) if r["event"] == "start"]) == 1
    assert runs == [{"status": "interrupted", "reason": "interrupted by shutdown"}], runs
    assert state in ("open", "working")

    # the next scan resumes (lanes fast now)
    write_config(p["home"], p["remote"], p["playbook"], lane_args=("--log", str(log)),
                 limits={"prs_per_hour": 100, "open_drafts_per_repo": 100})
    run_to_end(p["home"], log=tmp_path / "w.log")
    check_invariants(p["home"], p["remote"], tasks=1)


def test_service_and_crontab_examples_are_shipped():
    unit = (ROOT / "scripts" / "agent.service").read_text()
    assert "ExecStart=" in unit and "agent daemon" in unit and "KillSignal=SIGTERM" in unit
    cron = (ROOT / "scripts" / "crontab.example").read_text()
    assert "agent watch all" in cron
    assert json.dumps(unit)  # plain text


def test_a_broken_config_edit_skips_passes_and_the_daemon_keeps_running(tmp_path):
    from agent.app.context import App
    from agent.app.daemon import run_daemon

    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text("limits: {round_cap: five}\n")
    lines: list[str] = []
    ticks = run_daemon(App(home=home), interval=0, max_ticks=3, echo=lines.append)
    assert ticks == 3
    skipped = [line for line in lines if line.startswith("daemon: config not loaded, pass skipped")]
    assert len(skipped) == 3 and "limits.round_cap: expected an integer" in skipped[0]
