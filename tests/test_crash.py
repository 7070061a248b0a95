"""Deterministic crash points: kill `agent watch error-fix-work` at an exact place, run it again, lose nothing.

`AGENT_CRASHPOINT=NAME` makes the process `os._exit(137)` at the named place (agent.infra.faults.crashpoint: no finally,
no atexit, exactly what SIGKILL leaves behind). The mid-lane crash is a real SIGKILL of the watcher's process group
while a scripted lane sleeps. Everything is real: subprocesses, git remote, SQLite file, local forge, and the
GitHub REST simulator on 127.0.0.1 when it is installed (`bash scripts/ci-forge`; else those cases skip).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from chaos_support import (build, check_invariants, git, kill_group, lane_launches, read_log, remote_sha,
                           run_to_end, watcher)
from test_forge_github_sim import sim  # noqa: F401  (the module-scoped simulator fixture)
from conftest import ledger_conn

POINTS = ["commit.done", "commit.recorded", "push.done", "pr.created", "lane.finished", "proof.recorded"]


def _db(home):
    con = ledger_conn(home)
    return con


def _crash(home, point: str, tmp_path) -> None:
    p = watcher(home, env={"AGENT_CRASHPOINT": point}, log=tmp_path / "crash.log")
    rc = p.wait(120)
    assert rc == 137, f"expected the crash point {point} to kill the watcher, exit {rc}: " \
                      f"{(tmp_path / 'crash.log').read_text()[-2000:]}"


@pytest.mark.parametrize("point", POINTS)
def test_crash_point_then_resume_local_forge(tmp_path, point):
    p = build(tmp_path / "w", tasks=1)
    home, remote = p["home"], p["remote"]
    _crash(home, point, tmp_path)

    con = _db(home)
    t = dict(con.execute("SELECT * FROM tasks").fetchone())
    # what the crash left behind is exactly the window the crash point names
    if point == "commit.done":
        head = git(t["worktree"], "rev-parse", "HEAD")
        assert head != t["base_sha"] and con.execute("SELECT count(*) FROM commits").fetchone()[0] == 0
    elif point == "commit.recorded":
        assert con.execute("SELECT count(*) FROM commits").fetchone()[0] == 1
        assert con.execute("SELECT status FROM steps WHERE task_id = ? AND key = 'committed'",
                           (t["id"],)).fetchone()[0] == "pending"
    elif point == "push.done":
        assert t["pushed_sha"] is None and remote_sha(remote, t["branch"]) == t["head_sha"]
    elif point == "pr.created":
        assert con.execute("SELECT count(*) FROM prs").fetchone()[0] == 0
        assert con.execute("SELECT count(*) FROM local_prs").fetchone()[0] == 1
    elif point == "proof.recorded":
        assert con.execute("SELECT count(*) FROM proofs WHERE verdict = 'proven'").fetchone()[0] == 1
        assert con.execute("SELECT status FROM steps WHERE task_id = ? AND key = 'local_check_pass'",
                           (t["id"],)).fetchone()[0] == "pending"
    con.close()

    run_to_end(home, log=tmp_path / "resume.log")
    rows = check_invariants(home, remote, tasks=1)
    resumed = (tmp_path / "resume.log").read_text()
    assert "made no change" not in resumed and "error:" not in resumed, resumed
    if point != "lane.finished":  # the same two rounds as an uninterrupted run (a re-run lane may do more)
        assert rows[0]["round"] == 2
    con = _db(home)
    kinds = [r[0] for r in con.execute("SELECT kind FROM events ORDER BY id")]
    if point == "commit.done":
        ev = con.execute("SELECT count(*) FROM steps WHERE evidence LIKE '%recovered after a crash%'").fetchone()[0]
        assert ev == 1 or "round.started" in kinds  # round 1 was closed from the adopted commit
    if point == "pr.created":
        assert "pr.adopted" in kinds and kinds.count("pr.created") == 0
    if point == "proof.recorded":  # the proof recorded before the crash closes the step: never proven twice
        heads = [r[0] for r in con.execute("SELECT head_sha FROM proofs ORDER BY id")]
        assert len(heads) == len(set(heads)) == 2, heads
    if point == "push.done":
        pushed = [r[0] for r in con.execute("SELECT payload FROM events WHERE kind = 'branch.pushed'")]
        assert any('"pushed": false' in x for x in pushed), pushed  # found on the remote, not pushed again
    con.close()


@pytest.mark.parametrize("point", ["pr.created", "push.done"])
def test_crash_point_then_resume_github_simulator(tmp_path, sim, point):  # noqa: F811
    p = build(tmp_path / "w", tasks=1, forge="github", github_api_url=sim.url)
    env = {"GITHUB_TOKEN": "sim-token-not-secret"}
    _crash_env = {**env, "AGENT_CRASHPOINT": point}
    w = watcher(p["home"], env=_crash_env, log=tmp_path / "crash.log")
    assert w.wait(120) == 137, (tmp_path / "crash.log").read_text()[-2000:]
    branch = _db(p["home"]).execute("SELECT branch FROM tasks").fetchone()[0]
    if point == "pr.created":
        assert len(sim.pulls(branch)) == 1
    run_to_end(p["home"], env=env, log=tmp_path / "resume.log")
    check_invariants(p["home"], p["remote"], tasks=1, sim=sim)


def test_killed_before_the_lane_process_started_is_rerun_not_drift(tmp_path):
    """Found by scripts/chaos: a kill between recording the lane run ('running', no manifest, no pid) and starting
    its process left a row that was resumed and compared against a missing manifest -> capability_drift -> the task
    failed. Now such a row is superseded and a fresh run starts."""
    p = build(tmp_path / "w", tasks=1)
    _crash(p["home"], "commit.recorded", tmp_path)  # round 1 implementer done and committed
    con = _db(p["home"])
    with con:  # what the kill leaves: the reviewer's row inserted, nothing else
        con.execute("INSERT INTO lane_runs (task_id, round, role, vendor, attempt, status, started_at, cost_usd) "
                    "VALUES (1, 1, 'reviewer', 'demo-reviewer', 1, 'running', '2026-01-01T00:00:00Z', 0)")
    con.close()
    run_to_end(p["home"], log=tmp_path / "resume.log")
    check_invariants(p["home"], p["remote"], tasks=1)
    con = _db(p["home"])
    rows = [dict(r) for r in con.execute("SELECT status, reason FROM lane_runs WHERE role = 'reviewer' ORDER BY id")]
    con.close()
    assert rows[0] == {"status": "interrupted", "reason": "interrupted before its process started"}
    assert all(r["status"] != "rejected" for r in rows), rows


def test_stale_git_index_lock_from_a_kill_is_cleared(tmp_path):
    """A SIGKILL inside a git command leaves index.lock behind; the next scan (holding the claim) removes it."""
    p = build(tmp_path / "w", tasks=1)
    _crash(p["home"], "lane.finished", tmp_path)  # implementer edits are in the worktree, uncommitted
    con = _db(p["home"])
    worktree = con.execute("SELECT worktree FROM tasks").fetchone()[0]
    con.close()
    git_dir = git(worktree, "rev-parse", "--absolute-git-dir")
    lock = os.path.join(git_dir, "index.lock")
    open(lock, "w").close()
    run_to_end(p["home"], log=tmp_path / "resume.log")
    check_invariants(p["home"], p["remote"], tasks=1)
    assert not os.path.exists(lock)
    assert "removed stale index.lock" in (tmp_path / "resume.log").read_text()


def _unsandboxed(home: Path) -> None:
    """`sandbox: none`: an unsandboxed lane can outlive its watcher (a sandboxed one dies with it)."""
    with open(home / "config.yaml", "a") as fh:
        fh.write("\nsandbox: none\n")


def test_sigkill_mid_lane_waits_for_live_lane_then_reruns_same_attempt(tmp_path):
    """SIGKILL the watcher's group while the implementer lane sleeps. Unsandboxed, the lane runs in its own process
    group, so it outlives the watcher: the next scan sees a live in-flight run and waits; once it is gone the next
    scan re-runs it as a resume of the interrupted run (manifest checked) and the task finishes with one PR."""
    log = tmp_path / "lanes.log"
    p = build(tmp_path / "w", tasks=1, lane_args=("--sleep", "1.5", "--log", str(log)))
    home = p["home"]
    _unsandboxed(home)
    w = watcher(home, log=tmp_path / "w1.log")
    deadline = time.monotonic() + 30
    while not read_log(log) and time.monotonic() < deadline:
        time.sleep(0.02)
    starts = read_log(log)
    assert starts and starts[0]["role"] == "implementer", starts
    lane_pid = starts[0]["pid"]
    kill_group(w)

    from agent.coord.runners import pid_alive

    assert pid_alive(lane_pid), "the lane should outlive the killed watcher (own process group)"
    con = _db(home)
    row = dict(con.execute("SELECT id, pid, status FROM lane_runs").fetchone())
    assert row["status"] == "running" and row["pid"] == lane_pid
    con.close()

    w2 = watcher(home, log=tmp_path / "w2.log")
    assert w2.wait(60) == 0
    out = (tmp_path / "w2.log").read_text()
    assert f"implementer lane still running (pid {lane_pid}); waiting" in out, out
    con = _db(home)
    assert con.execute("SELECT count(*) FROM lane_runs").fetchone()[0] == 1  # nothing started twice
    con.close()

    deadline = time.monotonic() + 30
    while pid_alive(lane_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(lane_pid)
    run_to_end(home, log=tmp_path / "w3.log")
    check_invariants(home, p["remote"], tasks=1)
    con = _db(home)
    runs = [dict(r) for r in con.execute("SELECT id, round, role, status, reason, manifest_hash FROM lane_runs "
                                         "WHERE role = 'implementer' ORDER BY id")]
    con.close()
    assert runs[0]["status"] == "interrupted" and f"resumed as run {runs[1]['id']}" in runs[0]["reason"]
    assert runs[1]["round"] == 1 and runs[1]["status"] == "complete"
    assert runs[1]["manifest_hash"] == runs[0]["manifest_hash"]
    assert all(n == 1 for n in lane_launches(home).values())


def test_orphan_lane_past_its_timeout_is_killed_and_rerun(tmp_path):
    """An orphaned lane that outlives its lane timeout is not waited for forever: its group is killed."""
    log = tmp_path / "lanes.log"
    p = build(tmp_path / "w", tasks=1, lane_args=("--sleep", "30", "--log", str(log)))
    home = p["home"]
    _unsandboxed(home)
    w = watcher(home, log=tmp_path / "w1.log")
    deadline = time.monotonic() + 30
    while not read_log(log) and time.monotonic() < deadline:
        time.sleep(0.02)
    lane_pid = read_log(log)[0]["pid"]
    kill_group(w)
    con = _db(home)  # pretend it started long ago (the demo lane timeout is 60 s)
    with con:
        con.execute("UPDATE lane_runs SET started_at = '2000-01-01T00:00:00Z'")
    con.close()
    w2 = watcher(home, log=tmp_path / "w2.log")
    deadline = time.monotonic() + 20  # it kills the orphan, then re-runs the lane (which sleeps 30 s again)
    while len({r["pid"] for r in read_log(log)}) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    kill_group(w2)
    con = _db(home)
    killed = [r[0] for r in con.execute("SELECT payload FROM events WHERE kind = 'lane.orphan_killed'")]
    con.close()
    assert len(killed) == 1 and f'"pid": {lane_pid}' in killed[0], killed
    from agent.coord.runners import pid_alive

    assert not pid_alive(lane_pid)
    for rec in read_log(log):
        if rec["pid"] != lane_pid:
            try:
                os.killpg(rec["pid"], 9)
            except ProcessLookupError:
                pass


def _descendants(pid: int) -> dict[int, str]:
    """Live descendants of ``pid`` (not zombies), each with its start time (``/proc/PID/stat`` field 22), so a
    reused pid is never mistaken for a survivor."""
    parents: dict[int, int] = {}
    info: dict[int, tuple[str, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        parents[int(entry)] = int(fields[1])
        info[int(entry)] = (fields[0], fields[19])
    found, todo = {}, [pid]
    while todo:
        p = todo.pop()
        for child, parent in parents.items():
            if parent == p and child not in found:
                if info[child][0] != "Z":
                    found[child] = info[child][1]
                todo.append(child)
    return found


def _still_alive(procs: dict[int, str]) -> list[str]:
    alive = []
    for pid, start in procs.items():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:200].decode(errors="replace")
        except OSError:
            continue
        if fields[19] == start and fields[0] != "Z":
            alive.append(f"{pid} {fields[0]} {cmd}")
    return alive


@pytest.mark.parametrize("network", ["proxy", "none"])
def test_sigkill_mid_lane_ends_the_sandboxed_lane(tmp_path, network):
    """A sandboxed lane dies with its watcher: SIGKILL the watcher's group while the implementer lane sleeps in
    bwrap (its own process group) and nothing the lane started outlives it: not bwrap, not the lane, not a process
    the lane put in a new session (network: proxy runs no bridge process in the sandbox: the agent serves the
    lane's proxy port itself)."""
    log = tmp_path / "lanes.log"
    p = build(tmp_path / "w", tasks=1, lane_args=("--sleep", "60", "--log", str(log)))
    home = p["home"]
    with open(home / "config.yaml", "a") as fh:
        fh.write(f"\nsandbox: {{mode: bwrap, network: {network}}}\n")
    w = watcher(home, log=tmp_path / "w1.log")
    deadline = time.monotonic() + 60
    while not read_log(log) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert read_log(log), (tmp_path / "w1.log").read_text()[-2000:]
    procs = _descendants(w.pid)
    names = " ".join(Path(f"/proc/{p}/comm").read_text().strip() for p in procs if Path(f"/proc/{p}/comm").exists())
    assert "bwrap" in names and "socat" not in names, names
    kill_group(w)
    deadline = time.monotonic() + 10
    while _still_alive(procs) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _still_alive(procs), _still_alive(procs)
