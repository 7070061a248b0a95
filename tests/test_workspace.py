"""Mirrors and worktrees on real git repositories."""

from __future__ import annotations


import pytest

from agent.git.workspace import WorkspaceError, branch_name, ensure_worktree, mirror_path
from conftest import git


@pytest.fixture
def remote(tmp_path):
    """A bare remote with a few commits on main."""
    src = tmp_path / "src"
    src.mkdir()
    git(src, "init", "-q", "-b", "main")
    (src / "app.py").write_text("x = 1\n")
    git(src, "add", "-A")
    git(src, "commit", "-qm", "one")
    bare = tmp_path / "remote.git"
    git(tmp_path, "clone", "-q", "--bare", str(src), str(bare))
    return bare, src


def test_branch_name():
    assert branch_name("agent/fix-", "0123456789abcdef", 7) == "agent/fix-01234567"
    assert branch_name("agent/fix-", None, 7) == "agent/fix-task-7"


def test_worktree_is_made_once_and_found_again(tmp_path, remote):
    bare, _ = remote
    home = tmp_path / "home"
    ws = ensure_worktree(home, "acme/widgets", str(bare), "main", "agent/fix-01234567", 1)
    assert ws.created and (ws.path / "app.py").read_text() == "x = 1\n"
    assert git(ws.path, "rev-parse", "--abbrev-ref", "HEAD") == "agent/fix-01234567"
    assert ws.base_sha == git(bare, "rev-parse", "main")
    again = ensure_worktree(home, "acme/widgets", str(bare), "main", "agent/fix-01234567", 1)
    assert not again.created and again.path == ws.path
    assert mirror_path(home, "acme/widgets").exists()


def test_fetch_brings_new_base_commits_and_keeps_task_branches(tmp_path, remote):
    bare, src = remote
    home = tmp_path / "home"
    ws = ensure_worktree(home, "acme/widgets", str(bare), "main", "agent/fix-aaaa0000", 1)
    (ws.path / "fix.py").write_text("fixed = True\n")
    git(ws.path, "add", "-A")
    git(ws.path, "commit", "-qm", "task work")
    (src / "app.py").write_text("x = 2\n")
    git(src, "commit", "-qam", "two")
    git(src, "push", "-q", str(bare), "main")
    ws2 = ensure_worktree(home, "acme/widgets", str(bare), "main", "agent/fix-bbbb0000", 2)
    assert (ws2.path / "app.py").read_text() == "x = 2\n"
    assert git(mirror_path(home, "acme/widgets"), "log", "-1", "--format=%s", "agent/fix-aaaa0000") == "task work"


def test_crash_in_staging_is_cleaned_up(tmp_path, remote):
    bare, _ = remote
    home = tmp_path / "home"
    ensure_worktree(home, "acme/widgets", str(bare), "main", "agent/fix-11111111", 1)
    mirror = mirror_path(home, "acme/widgets")
    staging = home / "worktrees" / ".staging-task-2"
    # simulate a crash after `worktree add` into staging and before the move into place
    git(mirror, "worktree", "add", "-q", "-b", "agent/fix-22222222", str(staging), "refs/remotes/origin/main")
    assert not (home / "worktrees" / "task-2").exists()
    ws = ensure_worktree(home, "acme/widgets", str(bare), "main", "agent/fix-22222222", 2)
    assert ws.path == home / "worktrees" / "task-2" and ws.path.exists()
    assert not staging.exists()
    listed = git(mirror, "worktree", "list", "--porcelain")
    assert ".staging" not in listed and str(ws.path) in listed


def test_bad_url_and_missing_base_are_clear(tmp_path, remote):
    bare, _ = remote
    with pytest.raises(WorkspaceError, match="cannot clone or fetch"):
        ensure_worktree(tmp_path / "h1", "acme/nope", str(tmp_path / "missing.git"), "main", "agent/fix-x", 1)
    with pytest.raises(WorkspaceError, match="base branch 'develop' not found"):
        ensure_worktree(tmp_path / "h2", "acme/widgets", str(bare), "develop", "agent/fix-x", 1)


def test_vendor_cli_litter_is_ignored_in_every_worktree(tmp_path, remote):
    bare, _ = remote
    ws = ensure_worktree(tmp_path / "home", "acme/widgets", str(bare), "main", "agent/fix-33333333", 3)
    (ws.path / ".grok").mkdir()
    (ws.path / ".grok" / "settings.json").write_text("{}")
    (ws.path / ".aider.tags.cache.v4").mkdir()
    (ws.path / ".aider.tags.cache.v4" / "x").write_text("cache")
    (ws.path / "real.py").write_text("edit = 1\n")
    assert git(ws.path, "status", "--porcelain") == "?? real.py"
