"""Takeover: runner home A advances a task and dies; home B (its own mirrors and worktrees, the same ledger and the
same bare remote) claims the task, rebuilds the worktree from the remote's hidden ref `refs/agent/task-N` at the
task's last recorded commit, and finishes it with exactly one PR whose branch contains A's commit.

Real parts: the demo project and a real bare remote, one ledger shared by two homes (PostgreSQL with
--ledger=postgres; else one SQLite file each home's ledger.db links to, as two runners on one machine), the installed `agent` binary as real processes killed with
SIGKILL (or at exact points with AGENT_CRASHPOINT), scripted lanes as real subprocesses. A's home is deleted after
it died, so B can only get A's commit from the remote.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ledger_conn
from chaos_support import (ONE_ROUND, add_home, agent_bin, build, check_invariants, git, kill_group, lane_launches, run_to_end,
                           share_ledger, wait_for, watcher)


def db(home):
    return ledger_conn(home)   # the shared ledger, whichever backend (--ledger=postgres: every home uses it)


def payload(row) -> dict:
    value = row["payload"]
    return json.loads(value) if isinstance(value, str) else dict(value)


def task(home, tid=1) -> dict:
    con = db(home)
    try:
        return dict(con.execute("SELECT * FROM tasks WHERE id = ?", (tid,)).fetchone())
    finally:
        con.close()


def events(home, tid=1) -> list:
    con = db(home)
    try:
        return con.execute("SELECT kind, payload FROM events WHERE task_id = ? ORDER BY id", (tid,)).fetchall()
    finally:
        con.close()


def contains(remote, ancestor: str, ref: str) -> bool:
    return subprocess.run(["git", "merge-base", "--is-ancestor", ancestor, ref], cwd=remote).returncode == 0


@pytest.mark.parametrize("point", ["commit.recorded", "commit.ref_pushed"])
def test_a_second_home_takes_over_mid_round_from_the_remotes_hidden_ref(tmp_path, point):
    """commit.recorded: A's round-1 commit is recorded (so it is on the remote's hidden ref) and its step not closed.
    commit.ref_pushed: A pushed the commit to the hidden ref and died before recording it (harmless: B adopts it)."""
    p = build(tmp_path / "w", tasks=1)
    share_ledger(p)
    a, b = p["home"], add_home(p, "home-b")
    w = watcher(a, env={"AGENT_CRASHPOINT": point}, log=tmp_path / "a.log")
    assert w.wait(120) == 137, (tmp_path / "a.log").read_text()
    t = task(a)
    tip = git(p["remote"], "rev-parse", "refs/agent/task-1")
    if point == "commit.recorded":
        assert t["head_sha"] == tip        # recorded => on the remote
    else:
        assert t["head_sha"] is None and tip   # on the remote, not recorded: nothing points at it yet
    a_commit = tip
    assert t["worktree"].startswith(str(a))
    shutil.rmtree(a / "mirrors")           # A's machine is gone: its mirror and worktree with it
    shutil.rmtree(a / "worktrees")
    run_to_end(b, log=tmp_path / "b.log")
    done = task(b)
    assert done["state"] == "done" and done["worktree"].startswith(str(b))
    kinds = [e["kind"] for e in events(b)]
    assert kinds.count("task.taken_over") == 1 and "commit.lost" not in kinds
    assert done["round_cap"] == t["round_cap"]     # nothing was lost, so no free round was granted
    check_invariants(b, p["remote"], tasks=1)      # one PR, one commit per round, branch == head == hidden ref
    assert contains(p["remote"], a_commit, done["branch"])
    con = db(b)
    first = con.execute("SELECT sha, round FROM commits WHERE task_id = 1 ORDER BY id LIMIT 1").fetchone()
    con.close()
    assert (first["sha"], first["round"]) == (a_commit, 1)   # A's commit is the task's round-1 commit
    assert git(p["remote"], "rev-parse", "refs/agent/task-1") == done["head_sha"]


def _lane_running_in_a(tmp_path, lane_args: tuple[str, ...], sandbox: str | None = None):
    """One task, two homes on one ledger: A's watcher started and its first lane running (sleeping), B configured
    with lanes that do not sleep (a fresh run, nothing is resumed). Returns p, A, B, A's watcher and the running
    lane's (id, pid, pid_start)."""
    import yaml

    p = build(tmp_path / "w", tasks=1, lane_args=lane_args)
    p["playbook"].write_text(json.dumps(ONE_ROUND))
    share_ledger(p)
    a, b = p["home"], add_home(p, "home-b")
    for home in (a, b):
        cfg = yaml.safe_load((home / "config.yaml").read_text())
        if sandbox is not None:
            cfg["sandbox"] = sandbox
        if home == b:
            for vendor in cfg["vendors"].values():
                argv = vendor["command"]
                i = argv.index("--sleep")
                vendor["command"] = argv[:i] + argv[i + 2:]
        (home / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    w = watcher(a, log=tmp_path / "a.log")

    def lane_running():
        con = db(a)
        try:
            return con.execute("SELECT id, pid, pid_start FROM lane_runs WHERE status = 'running' "
                               "AND pid IS NOT NULL").fetchone()
        finally:
            con.close()

    assert wait_for(lane_running, 60), (tmp_path / "a.log").read_text()
    return p, a, b, w, tuple(lane_running())


def test_a_lane_left_running_by_a_killed_runner_is_interrupted_and_run_once_more(tmp_path):
    lanes_log = tmp_path / "lanes.log"
    p, a, b, w, (run_id, _, _) = _lane_running_in_a(tmp_path, ("--sleep", "30", "--log", str(lanes_log)))
    kill_group(w)                                   # SIGKILL mid-lane
    run_to_end(b, log=tmp_path / "b.log")
    check_invariants(b, p["remote"], tasks=1)
    con = db(b)
    row = dict(con.execute("SELECT status, reason, round, role FROM lane_runs WHERE id = ?", (run_id,)).fetchone())
    again = con.execute("SELECT count(*) FROM lane_runs WHERE task_id = 1 AND round = ? AND role = ? AND id > ?",
                        (row["round"], row["role"], run_id)).fetchone()[0]
    con.close()
    assert row["status"] == "interrupted" and "taken over" in row["reason"]
    assert again == 1                               # launched once more, in B
    assert all(n == 1 for n in lane_launches(b).values()), lane_launches(b)
    payloads = [payload(e) for e in events(b) if e["kind"] == "task.taken_over"]
    assert len(payloads) == 1 and run_id in payloads[0]["interrupted_runs"]


def test_a_runner_never_removes_a_worktree_in_another_runners_home(tmp_path):
    """`watch pr-merged` removes finished tasks' worktrees after the grace, but only those in its own home."""
    import yaml

    p = build(tmp_path / "w", tasks=1, limits={"worktree_grace": 0})
    share_ledger(p)
    a, b = p["home"], add_home(p, "home-b")
    run_to_end(a, log=tmp_path / "a.log")
    worktree = task(a)["worktree"]
    con = db(a)
    con.execute("UPDATE prs SET state = 'merged'")           # as follow-up records a merged PR
    con.close()
    for home in (a, b):
        cfg = yaml.safe_load((home / "config.yaml").read_text())
        assert cfg["limits"]["worktree_grace"] == 0
    out = subprocess.run([*agent_bin(), "--home", str(b), "watch", "pr-merged"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert task(b)["worktree"] == worktree and (Path(worktree) / ".git").exists()   # B left A's worktree alone
    out = subprocess.run([*agent_bin(), "--home", str(a), "watch", "pr-merged"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert task(a)["worktree"] is None and not Path(worktree).exists()             # A removes its own


def test_an_own_worktree_that_lacks_the_recorded_head_is_rebuilt(tmp_path):
    """Two machines whose runner homes have the same path (one systemd unit on both): the ledger names "my" path,
    but the runner elsewhere advanced the task since. The worktree here lacks the recorded head, so it is reset to
    it from the remote, not worked on as it is."""
    p = build(tmp_path / "w", tasks=1)
    share_ledger(p)
    a, b = p["home"], add_home(p, "home-b")
    env = {"AGENT_CRASHPOINT": "commit.recorded"}
    assert watcher(a, env=env, log=tmp_path / "a.log").wait(120) == 137           # round 1 commit recorded by A
    a_worktree, first = task(a)["worktree"], task(a)["head_sha"]
    assert watcher(b, env=env, log=tmp_path / "b.log").wait(120) == 137           # B goes on: round 2 recorded
    second = task(b)["head_sha"]
    assert second != first and task(b)["round"] == 2
    con = db(a)   # "B's home is at A's path on its machine": the ledger names A's path again
    con.execute("UPDATE tasks SET worktree = ? WHERE id = 1", (a_worktree,))
    con.close()
    run_to_end(a, log=tmp_path / "a2.log")
    done = task(a)
    assert done["state"] == "done" and done["worktree"] == a_worktree
    kinds = [e["kind"] for e in events(a)]
    assert kinds.count("task.taken_over") == 2 and "commit.lost" not in kinds
    check_invariants(a, p["remote"], tasks=1, homes=[a, b])
    assert contains(p["remote"], second, done["branch"]) and contains(p["remote"], first, done["branch"])


def test_a_commit_is_not_recorded_while_the_remote_refuses_its_hidden_ref(tmp_path):
    """Recorded but not on the remote must be impossible: a remote whose hook refuses refs/agent/* (as a host that
    takes only branches would) leaves the round's commit unrecorded and the task waiting with the reason; once the
    remote takes it, the next scan adopts the commit, pushes and records it."""
    p = build(tmp_path / "w", tasks=1)
    home, remote = p["home"], p["remote"]
    hook = remote / "hooks" / "pre-receive"
    hook.write_text("#!/bin/sh\nwhile read old new ref; do case $ref in refs/agent/*) "
                    "echo \"refs outside branches and tags are not accepted here\" >&2; exit 1;; esac; done\n")
    hook.chmod(0o755)
    out = subprocess.run([*agent_bin(), "--home", str(home), "watch", "error-fix-work"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    t = task(home)
    assert t["state"] == "working" and t["head_sha"] is None
    assert "not recorded until it is on the remote" in (t["wait_reason"] or ""), t["wait_reason"]
    assert "not accepted here" in t["wait_reason"]
    con = db(home)
    assert con.execute("SELECT count(*) FROM commits").fetchone()[0] == 0
    con.close()
    made = subprocess.run(["git", "-C", t["worktree"], "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert made.strip() != t["base_sha"]            # the commit exists in the worktree, not in the ledger
    hook.unlink()
    run_to_end(home, log=tmp_path / "w.log")
    check_invariants(home, remote, tasks=1)
    con = db(home)
    first = con.execute("SELECT sha FROM commits WHERE task_id = 1 ORDER BY id LIMIT 1").fetchone()[0]
    con.close()
    assert first == made.strip()                    # adopted, not made again


def test_a_commit_its_runner_never_pushed_dies_with_it_and_the_round_is_redone_free(tmp_path):
    """Killed between `git commit` and the push: the commit lived only in the dead home. The other home goes on from
    the recorded state (the base), its implementer runs again in a round that does not count against the cap."""
    p = build(tmp_path / "w", tasks=1)
    share_ledger(p)
    a, b = p["home"], add_home(p, "home-b")
    assert watcher(a, env={"AGENT_CRASHPOINT": "commit.done"}, log=tmp_path / "a.log").wait(120) == 137
    t = task(a)
    lost = subprocess.run(["git", "-C", t["worktree"], "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    assert t["head_sha"] is None and lost != t["base_sha"]
    assert subprocess.run(["git", "rev-parse", "--verify", "-q", "refs/agent/task-1"], cwd=p["remote"],
                          capture_output=True).returncode != 0          # never pushed
    shutil.rmtree(a / "mirrors")
    shutil.rmtree(a / "worktrees")
    run_to_end(b, log=tmp_path / "b.log")
    done = task(b)
    assert done["state"] == "done" and done["round_cap"] == t["round_cap"] + 1   # the redone round was free
    check_invariants(b, p["remote"], tasks=1)
    assert not contains(p["remote"], lost, done["branch"])


def test_a_worker_that_lost_its_claim_pushes_nothing_to_the_hidden_ref(tmp_path):
    """The fencing check runs right before the hidden-ref push: a worker whose claim another one took (it stalled
    past its lease) neither pushes its commit nor records it, so it cannot put a sibling on the ref the new holder
    pushes to."""
    from agent.config import load_config
    from agent.coord.claims import claim, release
    from agent.flows.fixer.outcomes import Ctx
    from agent.flows.fixer.steps import _push_task_ref
    from agent.ledger import Ledger, ledger_path
    from agent.ledger.tasks import ClaimLost
    from agent.git.workspace import TaskGit

    p = build(tmp_path / "w", tasks=1)
    home = p["home"]
    worktree = task(home)["worktree"]
    g = TaskGit(worktree)
    (Path(worktree) / "stale.txt").write_text("work of a worker that stalled\n")
    g("add", "-A")
    g("-c", "user.name=t", "-c", "user.email=t@localhost", "commit", "-q", "--no-verify", "-m", "stale")
    sha = g.head()
    led = Ledger.open(ledger_path(home), create=False)
    try:
        config = load_config(home / "config.yaml")
        mine = claim(led, 1)
        release(led, 1, mine)
        newer = claim(led, 1)                       # another worker holds the task now
        with pytest.raises(ClaimLost):
            _push_task_ref(Ctx(home, config, led, 1, token=mine), sha)
        assert subprocess.run(["git", "rev-parse", "--verify", "-q", "refs/agent/task-1"], cwd=p["remote"],
                              capture_output=True).returncode != 0
        _push_task_ref(Ctx(home, config, led, 1, token=newer), sha)      # the holder's push goes through
        assert git(p["remote"], "rev-parse", "refs/agent/task-1") == sha
    finally:
        led.close()


def test_a_reset_task_whose_worktree_was_removed_goes_on_from_its_head_in_another_home(tmp_path):
    """A failed task's worktree is removed after the grace (its head kept only in that home's mirror); after
    `agent task reset` another runner picks it up: its worktree starts at the task's recorded head, fetched from
    the remote, and the next round builds on it."""
    p = build(tmp_path / "w", tasks=1, limits={"round_cap": 1, "worktree_grace": 0})
    share_ledger(p)
    a, b = p["home"], add_home(p, "home-b")
    run_to_end(a, log=tmp_path / "a.log")
    failed = task(a)
    assert failed["state"] == "failed" and failed["head_sha"]       # round 1 rejected at the round cap
    out = subprocess.run([*agent_bin(), "--home", str(a), "watch", "pr-merged"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and task(a)["worktree"] is None, out.stdout + out.stderr
    out = subprocess.run([*agent_bin(), "--home", str(b), "task", "reset", "1", "--reason", "one more round",
                          "--rounds", "1"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    run_to_end(b, log=tmp_path / "b.log")
    done = task(b)
    assert done["state"] == "done" and done["round"] == 2, (done["failed_reason"], done["blocked_reason"])
    check_invariants(b, p["remote"], tasks=1)
    assert contains(p["remote"], failed["head_sha"], done["branch"])     # round 2 built on round 1's commit


def test_the_claims_hook_makes_a_home_rebuild_when_another_runner_held_the_task_last(tmp_path, monkeypatch):
    """The runners' claim says who held the task last (`claim.moved`). Runner m2 (its home at the same path as
    m1's on its machine) made round 2's edits and died before pushing them; m1's own worktree still holds the
    recorded head, so only the claim tells m1 that its worktree is not the task's state: it rebuilds, and the lost
    edits are redone in a free round instead of a rejected one ("the implementer made no change")."""
    monkeypatch.setenv("AGENT_RUNNER_ID", "m1")    # the batch is built by runner m1 too
    p = build(tmp_path / "w", tasks=1)
    share_ledger(p)
    a, b = p["home"], add_home(p, "home-b")
    m1, m2 = {"AGENT_RUNNER_ID": "m1"}, {"AGENT_RUNNER_ID": "m2"}
    assert watcher(a, env={**m1, "AGENT_CRASHPOINT": "commit.recorded"}, log=tmp_path / "a.log").wait(120) == 137
    a_worktree = task(a)["worktree"]
    assert watcher(b, env={**m2, "AGENT_CRASHPOINT": "commit.done"}, log=tmp_path / "b.log").wait(120) == 137
    before = task(b)
    assert before["round"] == 2 and before["head_sha"] == git(p["remote"], "rev-parse", "refs/agent/task-1")
    con = db(a)   # on m2's machine its home has m1's path: the ledger names that path
    con.execute("UPDATE tasks SET worktree = ? WHERE id = 1", (a_worktree,))
    con.close()
    run_to_end(a, env=m1, log=tmp_path / "a2.log")
    done = task(a)
    assert done["state"] == "done" and done["round_cap"] == before["round_cap"] + 1   # a free round
    kinds = [e["kind"] for e in events(a)]
    assert kinds.count("task.taken_over") == 2
    feedback = " ".join(payload(e).get("feedback", "") for e in events(a) if e["kind"] == "round.started")
    assert "changed no file" not in feedback and "workspace was lost" in feedback
    check_invariants(a, p["remote"], tasks=1, homes=[a, b])


def test_a_taken_over_lane_that_outlived_its_killed_runner_is_ended(tmp_path):
    """A lane that outlives its SIGKILLed runner (here unsandboxed, so deterministic: its own process group; under
    bwrap a kill that lands before bwrap arms its parent-death signal does the same) is ended by the runner that
    takes the task over: its pid and start time pinned, its whole group, and B says so."""
    from agent.infra.proc import same_process

    p, a, b, w, (_, pid, pid_start) = _lane_running_in_a(tmp_path, ("--sleep", "60"), sandbox="none")
    kill_group(w)                                   # SIGKILL the runner; its lane runs on
    assert same_process(pid, pid_start)
    run_to_end(b, log=tmp_path / "b.log")
    check_invariants(b, p["remote"], tasks=1)
    assert not same_process(pid, pid_start), "the orphan lane outlived the takeover"
    assert f"(pid {pid}) still ran; ended" in (tmp_path / "b.log").read_text()
