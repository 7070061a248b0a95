"""The task's hidden ref on the shared remote (`refs/agent/task-N`): pushed before a round commit is recorded,
only ever moved forward, fetched back by another runner's mirror, pruned with the branch. Real bare repositories,
real clones, the agent's hardened git; no mocks."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.git.push import PushError, delete_task_ref, push_task_ref, remote_ref_sha
from agent.git.workspace import TaskGit, ensure_mirror, ensure_worktree, fetch_task_ref, fetched_task_ref, mirror_path, task_ref
from conftest import git

REPO = "acme/widgets"
BRANCH = "agent/fix-0a1b2c3d"


@pytest.fixture
def remote(tmp_path) -> Path:
    remote = tmp_path / "remote.git"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(remote))
    seed = tmp_path / "seed"
    git(tmp_path, "init", "-q", "-b", "main", str(seed))
    (seed / "app.py").write_text("print('hi')\n")
    git(seed, "add", ".")
    git(seed, "commit", "-q", "-m", "init")
    git(seed, "push", "-q", str(remote), "main")
    return remote


def commit(worktree: Path, name: str, text: str) -> str:
    g = TaskGit(worktree)
    (worktree / name).write_text(text)
    g("add", "-A")
    g("-c", "user.name=t", "-c", "user.email=t@localhost", "commit", "-q", "--no-verify", "-m", f"add {name}")
    return g.head()


def test_the_ref_is_created_moved_forward_and_a_repeat_is_detected(tmp_path, remote):
    ws = ensure_worktree(tmp_path / "home", REPO, str(remote), "main", BRANCH, 7)
    c1 = commit(ws.path, "a.py", "a = 1\n")
    r = push_task_ref(ws.mirror, str(remote), 7, c1, expected=None)
    assert (r.sha, r.pushed) == (c1, True)
    assert git(remote, "rev-parse", "refs/agent/task-7") == c1
    assert push_task_ref(ws.mirror, str(remote), 7, c1, expected=None).pushed is False   # pushed before a crash
    c2 = commit(ws.path, "b.py", "b = 2\n")
    assert push_task_ref(ws.mirror, str(remote), 7, c2, expected=c1).pushed is True
    assert remote_ref_sha(str(remote), task_ref(7)) == c2
    # hidden: not a branch on the remote
    assert git(remote, "for-each-ref", "--format=%(refname)", "refs/heads") == "refs/heads/main"


def test_the_ref_never_moves_back_nor_sideways(tmp_path, remote):
    ws = ensure_worktree(tmp_path / "home", REPO, str(remote), "main", BRANCH, 7)
    base = TaskGit(ws.path).head()
    c1 = commit(ws.path, "a.py", "a = 1\n")
    push_task_ref(ws.mirror, str(remote), 7, c1, expected=None)
    # a stale runner's sibling of c1 (made from the same parent) must not replace the recorded c1
    g = TaskGit(ws.path)
    g("reset", "-q", "--hard", base)
    sibling = commit(ws.path, "other.py", "x = 1\n")
    for expected in (None, base, c1):
        with pytest.raises(PushError, match="not in the history"):
            push_task_ref(ws.mirror, str(remote), 7, sibling, expected=expected)
    with pytest.raises(PushError, match="not in the history"):
        push_task_ref(ws.mirror, str(remote), 7, base, expected=c1)        # a rewind
    assert git(remote, "rev-parse", "refs/agent/task-7") == c1


def test_a_stale_expectation_is_checked_against_the_remote(tmp_path, remote):
    """The ledger's head is behind the remote's ref (pushed, then killed before the record): the next commit on top
    of the pushed one goes through; a lease on a ref that vanished (pruned) recreates it."""
    ws = ensure_worktree(tmp_path / "home", REPO, str(remote), "main", BRANCH, 7)
    c1 = commit(ws.path, "a.py", "a = 1\n")
    push_task_ref(ws.mirror, str(remote), 7, c1, expected=None)
    c2 = commit(ws.path, "b.py", "b = 2\n")
    assert push_task_ref(ws.mirror, str(remote), 7, c2, expected=None).pushed   # expected absent, remote at c1
    assert delete_task_ref(str(remote), 7) is True
    assert delete_task_ref(str(remote), 7) is False
    c3 = commit(ws.path, "c.py", "c = 3\n")
    assert push_task_ref(ws.mirror, str(remote), 7, c3, expected=c2).pushed
    assert git(remote, "rev-parse", "refs/agent/task-7") == c3


def test_a_mirror_config_agent_never_writes_refuses_the_push(tmp_path, remote):
    ws = ensure_worktree(tmp_path / "home", REPO, str(remote), "main", BRANCH, 7)
    c1 = commit(ws.path, "a.py", "a = 1\n")
    elsewhere = tmp_path / "elsewhere.git"
    git(tmp_path, "init", "-q", "--bare", str(elsewhere))
    with open(ws.mirror / "config", "a") as fh:   # what a lane without the sandbox could write
        fh.write(f'[url "{elsewhere}"]\n\tpushInsteadOf = {remote}\n')
    with pytest.raises(PushError, match="never writes"):
        push_task_ref(ws.mirror, str(remote), 7, c1, expected=None)
    assert remote_ref_sha(str(remote), task_ref(7)) is None
    assert git(elsewhere, "for-each-ref") == ""


def test_another_home_fetches_the_ref_and_builds_the_worktree_at_it(tmp_path, remote):
    a = ensure_worktree(tmp_path / "a", REPO, str(remote), "main", BRANCH, 7)
    c1 = commit(a.path, "a.py", "a = 1\n")
    push_task_ref(a.mirror, str(remote), 7, c1, expected=None)
    mirror_b = mirror_path(tmp_path / "b", REPO)
    b = ensure_worktree(tmp_path / "b", REPO, str(remote), "main", BRANCH, 7)     # an old worktree at the base
    assert TaskGit(b.path).head() != c1 and git(mirror_b, "for-each-ref", "refs/agent") == ""
    assert fetch_task_ref(mirror_b, str(remote), 7) == c1
    assert git(mirror_b, "rev-parse", fetched_task_ref(7)) == c1
    (b.path / "leftover.txt").write_text("from a dead lane\n")
    again = ensure_worktree(tmp_path / "b", REPO, str(remote), "main", BRANCH, 7, start_at=c1)
    assert again.created and again.path == b.path
    assert TaskGit(b.path).head() == c1 and (b.path / "a.py").read_text() == "a = 1\n"
    assert not (b.path / "leftover.txt").exists()
    assert git(mirror_b, "rev-parse", f"refs/heads/{BRANCH}") == c1
    # a home without any worktree of the task makes one at the commit
    mirror_c = ensure_mirror(tmp_path / "c", REPO, str(remote))
    c = ensure_worktree(tmp_path / "c", REPO, str(remote), "main", BRANCH, 7,
                        start_at=fetch_task_ref(mirror_c, str(remote), 7))
    assert TaskGit(c.path).head() == c1
    assert fetch_task_ref(mirror_b, str(remote), 8) is None
