"""Workspaces: one bare mirror per repository, one git worktree per task.

- The mirror (``$AGENT_HOME/mirrors/OWNER__NAME.git``) is cloned once and fetched after. Remote branches land in
  ``refs/remotes/origin/*`` so a fetch never touches the task branches that live in the mirror.
- A task's worktree is added on branch ``<prefix><error-id8>`` from ``origin/<base>`` in a staging path and then
  moved into place with ``git worktree move`` (a rename), so a crash never leaves a half-made workspace at the final
  path. A leftover staging worktree is removed and made again on the next scan.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from agent import AgentError


class WorkspaceError(AgentError):
    pass


@dataclass(frozen=True)
class Workspace:
    path: Path
    branch: str
    base_sha: str
    mirror: Path
    created: bool


def _slug(repo: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", repo.replace("/", "__"))


def mirror_path(home: Path, repo: str) -> Path:
    return Path(home) / "mirrors" / f"{_slug(repo)}.git"


def branch_name(prefix: str, error_id: str | None, task_id: int) -> str:
    return f"{prefix}{error_id[:8]}" if error_id else f"{prefix}task-{task_id}"


def _git(path: Path):
    import git  # GitPython: imported on use so cron ticks that need no git stay light

    return git.Repo(str(path)).git


def _write_excludes(mirror: Path) -> None:
    """Files vendor CLIs write into any worktree (caches, settings) are never committed nor count as edits.

    ``info/exclude`` of the mirror applies to every worktree made from it, and read-only lane verification
    skips ignored files too.
    """
    from agent.lanes.builtin import ADAPTERS

    litter = sorted({p for a in ADAPTERS.values() for p in getattr(a, "worktree_litter", ())})
    path = mirror / "info" / "exclude"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "# written by agent: files vendor CLIs leave in a worktree\n" + "".join(f"/{p}\n" for p in litter)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def ensure_mirror(home: Path, repo: str, url: str) -> Path:
    """Clone the bare mirror once (into a staging path, then rename); fetch it every later time."""
    import git

    mirror = mirror_path(home, repo)
    try:
        if mirror.exists():
            _git(mirror).fetch("origin", "+refs/heads/*:refs/remotes/origin/*", "--prune", "--quiet")
            _write_excludes(mirror)
            return mirror
        mirror.parent.mkdir(parents=True, exist_ok=True)
        staging = mirror.with_name(mirror.name + ".staging")
        shutil.rmtree(staging, ignore_errors=True)
        git.Repo.clone_from(url, str(staging), bare=True, no_tags=False)
        g = _git(staging)
        g.config("remote.origin.fetch", "+refs/heads/*:refs/remotes/origin/*")
        g.fetch("origin", "--quiet")
        _write_excludes(staging)
        staging.rename(mirror)
        return mirror
    except git.GitCommandError as exc:
        detail = (exc.stderr or "").strip().splitlines()
        raise WorkspaceError(f"{repo}: cannot clone or fetch {url}: {detail[-1] if detail else exc}; "
                             "check repos.<name>.url and access") from None


def _worktree_branches(mirror: Path) -> dict[str, str]:
    """path -> branch for every worktree registered in the mirror."""
    out: dict[str, str] = {}
    current = None
    for line in _git(mirror).worktree("list", "--porcelain").splitlines():
        if line.startswith("worktree "):
            current = line[len("worktree "):]
        elif line.startswith("branch ") and current:
            out[current] = line[len("branch refs/heads/"):]
    return out


def ensure_worktree(home: Path, repo: str, url: str, base: str, branch: str, task_id: int) -> Workspace:
    """Find or make the task's worktree. Idempotent; safe to call again after a crash at any point."""
    import git

    mirror = ensure_mirror(home, repo, url)
    root = Path(home) / "worktrees"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"task-{task_id}"
    staging = root / f".staging-task-{task_id}"
    g = _git(mirror)
    try:
        base_sha = g.rev_parse(f"refs/remotes/origin/{base}")
    except git.GitCommandError:
        raise WorkspaceError(f"{repo}: base branch {base!r} not found on the remote; check repos.{repo}.base") \
            from None
    registered = _worktree_branches(mirror)
    if final.exists():
        if registered.get(str(final.resolve())) != branch:
            raise WorkspaceError(f"{final}: exists but is not the worktree of branch {branch}; move it aside")
        return Workspace(final, branch, base_sha, mirror, created=False)
    # a crash left a staging worktree: throw it away and make it again
    if staging.exists() or str(staging.resolve()) in registered:
        shutil.rmtree(staging, ignore_errors=True)
    g.worktree("prune")
    _restore_kept_branch(mirror, branch, task_id)
    branch_exists = bool(g.branch("--list", branch).strip())
    try:
        if branch_exists:  # made by an earlier attempt whose worktree was lost: keep its commits
            g.worktree("add", str(staging), branch)
        else:
            g.worktree("add", "-b", branch, str(staging), f"refs/remotes/origin/{base}")
        g.worktree("move", str(staging), str(final))
    except git.GitCommandError as exc:
        detail = (exc.stderr or "").strip().splitlines()
        raise WorkspaceError(f"task {task_id}: cannot create worktree: {detail[-1] if detail else exc}") from None
    return Workspace(final, branch, base_sha, mirror, created=True)


def remove_worktree(mirror: Path, path: Path) -> None:
    import git

    try:
        _git(mirror).worktree("remove", "--force", str(path))
    except git.GitCommandError:
        shutil.rmtree(path, ignore_errors=True)
        _git(mirror).worktree("prune")


def kept_ref(task_id: int) -> str:
    """Where a failed task's head is kept when its worktree and branch are removed (a reset brings it back)."""
    return f"refs/agent/kept/task-{task_id}"


def _restore_kept_branch(mirror: Path, branch: str, task_id: int) -> None:
    """A reset task whose branch was removed gets it back at the kept head, so its recorded commits are there."""
    import git

    g = _git(mirror)
    if g.branch("--list", branch).strip():
        return
    try:
        sha = g.rev_parse("--verify", "--quiet", kept_ref(task_id))
    except git.GitCommandError:
        return
    g.branch(branch, sha)
    g.update_ref("-d", kept_ref(task_id))


def remove_task_workspace(home: Path, repo: str, task_id: int, path: Path, branch: str | None,
                          keep_sha: str | None = None) -> None:
    """Remove a finished task's worktree and its local branch, then prune the mirror's worktree list.

    ``keep_sha`` (a failed task's head, which a human may still reset) is kept under ``kept_ref(task_id)``.
    """
    import git

    mirror = mirror_path(home, repo)
    path = Path(path)
    if not (mirror / "HEAD").exists():   # no mirror (deleted by hand): only the folder is left to remove
        shutil.rmtree(path, ignore_errors=True)
        return
    g = _git(mirror)
    if keep_sha:
        try:
            g.update_ref(kept_ref(task_id), keep_sha)
        except git.GitCommandError:
            pass  # the commit is gone already: nothing to keep
    try:
        g.worktree("remove", "--force", str(path))
    except git.GitCommandError:
        shutil.rmtree(path, ignore_errors=True)
    g.worktree("prune")
    if branch and g.branch("--list", branch).strip():
        g.branch("-D", branch)


def disk_use(home: Path) -> dict:
    """Bytes and counts of task worktrees and mirrors under the home (what `status` and `doctor` show)."""
    import os

    def size(root: Path) -> int:
        total = 0
        for dirpath, dirnames, filenames in os.walk(root):
            for name in filenames:
                try:
                    total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
                except OSError:
                    pass
        return total

    out = {}
    for key, folder, pattern in (("worktrees", "worktrees", "task-*"), ("mirrors", "mirrors", "*.git")):
        found = sorted(p for p in (Path(home) / folder).glob(pattern) if p.is_dir())
        out[key] = {"count": len(found), "bytes": sum(size(p) for p in found)}
    return out


def human_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"
