"""Push rules against a real local bare repository and a real clone (no mocks)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.git.push import PushError, check_branch, delete_remote_branch, push_branch, remote_branch_sha, safe_url
from conftest import git

PREFIX = "agent/fix-"
BRANCH = "agent/fix-0a1b2c3d"


@pytest.fixture
def repos(tmp_path) -> tuple[Path, Path]:
    """A bare 'remote' with main, and a clone with the task branch checked out and one commit on it."""
    remote = tmp_path / "remote.git"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(remote))
    seed = tmp_path / "seed"
    git(tmp_path, "init", "-q", "-b", "main", str(seed))
    (seed / "app.py").write_text("print('hi')\n")
    git(seed, "add", ".")
    git(seed, "commit", "-q", "-m", "init")
    git(seed, "push", "-q", str(remote), "main")
    work = tmp_path / "work"
    git(tmp_path, "clone", "-q", str(remote), str(work))
    git(work, "checkout", "-q", "-b", BRANCH)
    commit(work, "fix.py", "x = 1\n", "fix")
    return remote, work


def commit(work: Path, name: str, text: str, msg: str) -> str:
    (work / name).write_text(text)
    git(work, "add", name)
    git(work, "commit", "-q", "-m", msg)
    return git(work, "rev-parse", "HEAD")


def test_first_push_then_repeat_is_detected(repos):
    remote, work = repos
    head = git(work, "rev-parse", "HEAD")
    r = push_branch(work, str(remote), BRANCH, "main", PREFIX, None)
    assert (r.sha, r.pushed, r.forced) == (head, True, False)
    assert git(remote, "rev-parse", f"refs/heads/{BRANCH}") == head
    again = push_branch(work, str(remote), BRANCH, "main", PREFIX, head)
    assert (again.sha, again.pushed, again.forced) == (head, False, False)


def test_fast_forward_is_a_plain_push(repos):
    remote, work = repos
    first = push_branch(work, str(remote), BRANCH, "main", PREFIX, None).sha
    second = commit(work, "fix2.py", "y = 2\n", "round 2")
    r = push_branch(work, str(remote), BRANCH, "main", PREFIX, first)
    assert (r.sha, r.pushed, r.forced) == (second, True, False)
    assert remote_branch_sha(str(remote), BRANCH) == second


def test_rewritten_history_uses_force_with_lease(repos):
    remote, work = repos
    first = push_branch(work, str(remote), BRANCH, "main", PREFIX, None).sha
    git(work, "commit", "-q", "--amend", "-m", "fix, reworded in round 2")
    rewritten = git(work, "rev-parse", "HEAD")
    assert rewritten != first
    r = push_branch(work, str(remote), BRANCH, "main", PREFIX, first)
    assert (r.sha, r.pushed, r.forced) == (rewritten, True, True)
    assert remote_branch_sha(str(remote), BRANCH) == rewritten


def test_someone_elses_push_is_never_overwritten(repos, tmp_path):
    remote, work = repos
    ours = push_branch(work, str(remote), BRANCH, "main", PREFIX, None).sha
    other = tmp_path / "other"
    git(tmp_path, "clone", "-q", "-b", BRANCH, str(remote), str(other))
    theirs = commit(other, "human.py", "z = 3\n", "a human's commit")
    git(other, "push", "-q", "origin", BRANCH)
    git(work, "commit", "-q", "--amend", "-m", "rewrite")
    with pytest.raises(PushError) as exc:
        push_branch(work, str(remote), BRANCH, "main", PREFIX, ours)
    msg = str(exc.value)
    assert "someone else pushed there" in msg and "\n" not in msg
    assert remote_branch_sha(str(remote), BRANCH) == theirs


@pytest.mark.parametrize("branch,why", [
    ("main", "base or a protected branch"),
    ("master", "base or a protected branch"),
    ("release", "base or a protected branch"),
    ("feature/x", "must start with the prefix"),
    ("agent/fix-", "must start with the prefix"),
    ("refs/heads/agent/fix-1", "plain branch name"),
    ("", "no branch"),
])
def test_only_task_branches_are_pushed(repos, branch, why):
    remote, work = repos
    before = git(remote, "for-each-ref")
    with pytest.raises(PushError, match=why):
        push_branch(work, str(remote), branch, "release" if branch == "release" else "main", PREFIX, None)
    assert git(remote, "for-each-ref") == before


def test_missing_branch_and_bad_remote_are_clear(repos, tmp_path):
    remote, work = repos
    with pytest.raises(PushError, match="has no local branch"):
        push_branch(work, str(remote), "agent/fix-none", "main", PREFIX, None)
    with pytest.raises(PushError, match="cannot read the remote"):
        push_branch(work, str(tmp_path / "nowhere.git"), BRANCH, "main", PREFIX, None)
    with pytest.raises(PushError, match="not a git worktree"):
        push_branch(tmp_path / "empty", str(remote), BRANCH, "main", PREFIX, None)


def test_delete_remote_branch(repos):
    remote, work = repos
    push_branch(work, str(remote), BRANCH, "main", PREFIX, None)
    assert delete_remote_branch(str(remote), BRANCH, "main", PREFIX) is True
    assert remote_branch_sha(str(remote), BRANCH) is None
    assert delete_remote_branch(str(remote), BRANCH, "main", PREFIX) is False
    with pytest.raises(PushError):
        delete_remote_branch(str(remote), "main", "main", PREFIX)
    assert remote_branch_sha(str(remote), "main") is not None


def test_check_branch_and_safe_url():
    check_branch("agent/fix-1234", "main", PREFIX)
    assert safe_url("https://user:pw@github.com/a/b.git") == "https://***@github.com/a/b.git"
    assert safe_url("/srv/git/a.git") == "/srv/git/a.git"


def test_a_refused_push_gate_blocks_the_task_and_is_not_a_forge_error(tmp_path):
    """Someone else pushed to the task's branch before the agent's first push: the fixer's push step refuses to
    overwrite it and gate-blocks the task with the reason (real watcher processes, real git remote). A PushError is
    not a ForgeAuthError: an ``except`` for a forge's 401 never catches "refusing to push"."""
    from agent.forge import ForgeAuthError
    from chaos_support import build, run_to_end, watcher
    from conftest import ledger_conn

    assert not issubclass(PushError, ForgeAuthError)
    p = build(tmp_path / "w", tasks=1)
    home, remote = p["home"], p["remote"]
    crashed = watcher(home, env={"AGENT_CRASHPOINT": "commit.recorded"}, log=tmp_path / "crash.log")
    assert crashed.wait(120) == 137, (tmp_path / "crash.log").read_text()[-2000:]
    con = ledger_conn(home)
    branch = con.execute("SELECT branch FROM tasks").fetchone()[0]
    con.close()
    other = tmp_path / "someone"
    git(tmp_path, "clone", "-q", str(remote), str(other))
    git(other, "checkout", "-q", "-b", branch)
    (other / "theirs.txt").write_text("their work\n")
    git(other, "add", "theirs.txt")
    git(other, "-c", "user.name=them", "-c", "user.email=them@example.com", "commit", "-q", "-m", "theirs")
    git(other, "push", "-q", "origin", branch)

    run_to_end(home, log=tmp_path / "run.log")
    con = ledger_conn(home)
    state, why = con.execute("SELECT state, blocked_reason FROM tasks").fetchone()
    con.close()
    assert state == "gate-blocked", (state, why)
    assert why.startswith("push refused: refusing to push " + branch), why
    assert git(remote, "log", "-1", "--format=%s", branch) == "theirs"     # their work is still there
