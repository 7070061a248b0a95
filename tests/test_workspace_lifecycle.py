"""Issue 13 case 11: a finished task's worktree and local branch are removed (after a grace), the mirror's
worktree list is pruned, disk use is shown, and a failed task reset later gets its commits back.

Real git mirror and worktrees, real bare remote, scripted lanes as real subprocesses, the local forge."""

from __future__ import annotations

import subprocess
from pathlib import Path

from agent.app import demo
from agent.git.workspace import kept_ref, mirror_path
from test_fixer import edit_config, home, ingest_and_decide, ledger, run_until_settled, scan, world  # noqa: F401


def task(world, task_id=1) -> dict:
    led = ledger(world)
    try:
        return led.one("SELECT * FROM tasks WHERE id = ?", (task_id,))
    finally:
        led.close()


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True).stdout.strip()


def test_merged_tasks_worktree_and_branch_go_after_the_grace(world, agent):
    ingest_and_decide(world)
    scan(world, "error-fix")
    run_until_settled(world)
    t = task(world)
    worktree, mirror = Path(t["worktree"]), mirror_path(world["home"], demo.REPO)
    assert t["state"] == "done" and worktree.exists()
    assert git(mirror, "branch", "--list", t["branch"])
    disk = agent.json("status")["disk"]
    assert disk["worktrees"]["count"] == 1 and disk["worktrees"]["bytes"] > 0 and disk["mirrors"]["count"] == 1
    assert "task worktrees 1 (" in agent("doctor").output
    assert agent("pr", "mark", "1", "merged").exit_code == 0
    r = agent("watch", "pr-merged")
    assert "merged" in r.output and worktree.exists()     # within the grace (limits.worktree_grace, 1 day)
    edit_config(world, lambda c: c["limits"].update(worktree_grace=0))
    r = agent("watch", "pr-merged")
    assert r.output == f"task 1: worktree and branch {t['branch']} removed (task done, PR merged)\n", r.output
    assert not worktree.exists() and not git(mirror, "branch", "--list", t["branch"])
    assert len(git(mirror, "worktree", "list").splitlines()) == 1      # only the bare mirror itself
    assert task(world)["worktree"] is None
    assert agent.json("status")["disk"]["worktrees"] == {"count": 0, "bytes": 0}
    assert "task worktrees 0 (0 B)" in agent("doctor").output
    assert agent("watch", "pr-merged").output == ""


def test_failed_tasks_worktree_goes_and_a_reset_brings_its_commits_back(world, agent):
    edit_config(world, lambda c: c["limits"].update(round_cap=1, worktree_grace=0))
    ingest_and_decide(world)
    scan(world, "error-fix")
    run_until_settled(world)
    t = task(world)
    assert t["state"] == "failed" and "round cap 1 reached" in t["failed_reason"], t
    head, mirror = t["head_sha"], mirror_path(world["home"], demo.REPO)
    r = agent("watch", "pr-merged")
    assert "removed (task failed)" in r.output, r.output
    assert not Path(t["worktree"]).exists() and not git(mirror, "branch", "--list", t["branch"])
    assert git(mirror, "rev-parse", kept_ref(1)) == head          # kept for a reset, not as a branch
    assert agent("task", "reset", "1", "--reason", "two more rounds", "--rounds", "2").exit_code == 0
    run_until_settled(world)
    t = task(world)
    assert t["state"] == "done", t
    # the branch came back at the failed round's commit and the new round built on it
    assert subprocess.run(["git", "merge-base", "--is-ancestor", head, t["branch"]], cwd=mirror).returncode == 0
    assert git(mirror, "rev-parse", "--verify", "--quiet", kept_ref(1)) == ""
