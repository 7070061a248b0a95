"""Pushing a task's branch, with the rules that keep a fixer from damaging a repository.

- Only the task's own branch: it must start with the repo's ``branch_prefix`` and is never the base.
- A push that already happened (remote ref == local head) is detected and not repeated.
- A fast-forward is a plain push.  A rewritten history (the remote head is not an ancestor of the
  local head) is pushed with ``--force-with-lease`` bound to the sha agent itself pushed last
  (``expected_remote_sha``); if the remote moved to anything else, someone else pushed there and
  agent refuses rather than overwrite their work.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agent import AgentError

GIT_TIMEOUT = 120  # seconds for one network git command


class PushError(AgentError):
    """A push refused or failed.  A human must look (foreign commits on the branch, a wrong prefix,
    credentials or a remote that cannot be read): the fixer gate-blocks. Not a forge error: git speaks to the remote,
    not the forge's API (the local forge, which reads its remote through git, turns it into a ForgeAuthError)."""


@dataclass(frozen=True)
class PushResult:
    sha: str
    pushed: bool       # False when the remote already had this head
    forced: bool       # True when history was rewritten (pushed with --force-with-lease)


def check_branch(branch: str, base: str, prefix: str) -> None:
    """Raise PushError unless ``branch`` is a task branch that may be pushed."""
    b = (branch or "").strip()
    if not b:
        raise PushError("no branch to push; the task has no branch recorded")
    if b.startswith("refs/"):
        raise PushError(f"branch {b!r} must be a plain branch name, not a ref")
    if b == base or b in ("main", "master", "HEAD"):
        raise PushError(f"refusing to push {b!r}: it is the base or a protected branch; agent pushes only "
                        "its task branches")
    if not prefix or not b.startswith(prefix) or b == prefix:
        raise PushError(f"refusing to push {b!r}: task branches must start with the prefix {prefix!r} "
                        "(repos.<name>.branch_prefix)")


def remote_branch_sha(remote_url: str, branch: str) -> str | None:
    """The sha of ``refs/heads/<branch>`` on the remote, or None if the branch is not there."""
    return remote_ref_sha(remote_url, f"refs/heads/{branch}")


def remote_ref_sha(remote_url: str, ref: str) -> str | None:
    """The sha of the full ``ref`` on the remote, or None if it is not there."""
    from agent.git.workspace import GitError, ls_remote_ref

    try:
        return ls_remote_ref(remote_url, ref)
    except GitError as exc:
        raise PushError(f"cannot read the remote {safe_url(remote_url)}: {_stderr(exc)}; check the URL and credentials") \
            from None


def push_task_ref(mirror: Path, remote_url: str, task_id: int, sha: str, expected: str | None) -> PushResult:
    """Put the round commit ``sha`` at the task's hidden ref (``refs/agent/task-N``) on the remote, before the
    commit is recorded (DESIGN.md "Takeover": a recorded commit is always on the remote).

    The ref only moves forward: it is pushed with ``--force-with-lease`` bound to ``expected`` (the head the ledger
    recorded before this commit; None: no ref yet) when that is in ``sha``'s history; if the remote holds
    something else, it is read: ``sha`` itself (pushed before a crash) is done, an ancestor of ``sha`` is leased
    on; anything else (a commit not in this history: another runner pushed there) is refused, never overwritten,
    so no recorded commit ever drops out of the ref's history. Pushed from the mirror's own git dir through the
    hardened git (never a worktree's config a lane could have written; a mirror config with keys agent never writes
    is refused)."""
    from agent.git.workspace import GitError, audit_config, git, is_ancestor, task_ref

    ref = task_ref(task_id)
    bad = audit_config(mirror)
    if bad:
        raise PushError(f"refusing to push {ref}: the repository config holds {', '.join(bad[:5])}, which agent "
                        "never writes; restore it, then `agent task reset`")

    up_to_date = []

    def attempt(lease: str | None) -> str | None:
        """Push with the lease; None when it went through, else git's complaint."""
        try:
            out = git("push", "--porcelain", "--no-verify", f"--force-with-lease={ref}:{lease or ''}", "--",
                      remote_url, f"{sha}:{ref}", git_dir=mirror, cwd=mirror, push=True, timeout=GIT_TIMEOUT)
            up_to_date.append(any(line.startswith("=") for line in out.splitlines()))
            return None
        except GitError as exc:
            return _stderr(exc)

    lease = expected if expected is None or is_ancestor(mirror, expected, sha) else "?"
    for _ in range(2):
        failed = attempt(lease) if lease != "?" else "not tried"
        if failed is None:
            return PushResult(sha=sha, pushed=not up_to_date[-1], forced=False)
        remote = remote_ref_sha(remote_url, ref)
        if remote == sha:                  # pushed already (by us, before a crash)
            return PushResult(sha=sha, pushed=False, forced=False)
        if remote == lease:                # the lease held and the push still failed: not a race
            raise PushError(f"push of {ref} to {safe_url(remote_url)} failed: {failed}")
        if remote is not None and not is_ancestor(mirror, remote, sha):
            raise PushError(f"refusing to move {ref} from {remote[:12]} to {sha[:12]}: {remote[:12]} is not in "
                            "the history of this round's commit (another runner pushed there); inspect it, then "
                            "`agent task reset`")
        lease = remote                     # absent, or behind us: lease on what is there now
    raise PushError(f"push of {ref} lost a race twice: the remote moved while pushing {sha[:12]}; the next scan "
                    "looks again")


def delete_task_ref(remote_url: str, task_id: int) -> bool:
    """Prune the task's hidden ref from the remote (when its branch is pruned). False if it was already gone."""
    from agent.git.workspace import task_ref

    return _delete_remote_ref(remote_url, task_ref(task_id))


def push_branch(worktree: Path, remote_url: str, branch: str, base: str, prefix: str,
                expected_remote_sha: str | None) -> PushResult:
    """Push the local ``branch`` of ``worktree`` to ``remote_url`` under the same name.

    ``expected_remote_sha`` is the sha agent last pushed for this task (``tasks.pushed_sha``), or None
    if it never pushed.  Returns what happened; raises PushError with a one-line reason when refused.
    """
    from agent import AgentError
    from agent.git.workspace import GitError, TaskGit, audit_config, git

    check_branch(branch, base, prefix)
    try:
        repo = TaskGit(worktree)
    except AgentError:
        raise PushError(f"{worktree}: not a git worktree; recreate the task's workspace") from None
    bad = audit_config(repo.mirror)
    if bad:   # e.g. url.<x>.pushInsteadOf would send the push elsewhere; credential.helper would see the token
        raise PushError(f"refusing to push {branch}: the repository config holds {', '.join(bad[:5])}, which agent "
                        "never writes; restore it, then `agent task reset`")
    try:
        local = repo("rev-parse", "--verify", "--quiet", f"refs/heads/{branch}^{{commit}}")
    except GitError:
        raise PushError(f"{worktree}: has no local branch {branch!r}; nothing to push") from None

    remote = remote_branch_sha(remote_url, branch)
    if remote == local:
        return PushResult(sha=local, pushed=False, forced=False)

    refspec = f"{local}:refs/heads/{branch}"
    forced = False
    args: list[str] = []
    if remote is None:
        # The branch is new (or was deleted): lease on "absent" so a concurrent creator is not overwritten.
        args.append(f"--force-with-lease=refs/heads/{branch}:")
    elif _is_ancestor(repo, remote, local):
        args.append(f"--force-with-lease=refs/heads/{branch}:{remote}")
    elif expected_remote_sha and remote == expected_remote_sha:
        forced = True
        args.append(f"--force-with-lease=refs/heads/{branch}:{expected_remote_sha}")
    else:
        raise PushError(f"refusing to push {branch}: the remote head {remote[:12]} is not one agent pushed "
                        f"(expected {expected_remote_sha[:12] if expected_remote_sha else 'none'}) and is not "
                        "in the local history; someone else pushed there: inspect it, then `agent task reset`")
    try:
        # the only git command that sees credentials; to the configured URL, never a remote name from config
        git("push", "--porcelain", "--no-verify", *args, "--", remote_url, refspec, git_dir=repo.git_dir,
            cwd=worktree, push=True, timeout=GIT_TIMEOUT)
    except GitError as exc:
        raise PushError(f"push of {branch} to {safe_url(remote_url)} failed: {_stderr(exc)}") from None
    after = remote_branch_sha(remote_url, branch)
    if after != local:
        raise PushError(f"push of {branch} reported success but the remote has {after or 'nothing'}, "
                        f"not {local[:12]}; check the remote's hooks")
    return PushResult(sha=local, pushed=True, forced=forced)


def delete_remote_branch(remote_url: str, branch: str, base: str, prefix: str) -> bool:
    """Prune a task branch from the remote.  Returns False if it was already gone."""
    check_branch(branch, base, prefix)
    return _delete_remote_ref(remote_url, f"refs/heads/{branch}")


def _delete_remote_ref(remote_url: str, ref: str) -> bool:
    import tempfile

    from agent.git.workspace import GitError, git

    sha = remote_ref_sha(remote_url, ref)
    if sha is None:
        return False
    # `git push` needs a repository to run in, even to delete: an empty throwaway one, so pruning works from
    # any directory (cron's cwd is $HOME, not a git folder) and never depends on the caller's cwd
    with tempfile.TemporaryDirectory(prefix="agent-prune-") as scratch:
        try:
            git("init", "--bare", "-q", scratch, cwd=scratch)
            git("push", "--no-verify", f"--force-with-lease={ref}:{sha}", "--delete", "--",
                remote_url, ref, git_dir=scratch, cwd=scratch, push=True, timeout=GIT_TIMEOUT)
        except GitError as exc:
            raise PushError(f"could not delete {ref.removeprefix('refs/heads/')} on {safe_url(remote_url)}: "
                            f"{_stderr(exc)}") from None
    return True


def _is_ancestor(repo, ancestor: str, descendant: str) -> bool:
    from agent.git.workspace import GitError

    try:
        repo("merge-base", "--is-ancestor", ancestor, descendant)
        return True
    except GitError:
        return False  # not an ancestor, or an object we never had (someone else's commit)


def _stderr(exc) -> str:
    lines = [ln for ln in (getattr(exc, "stderr", "") or str(exc)).strip().splitlines() if ln.strip()]
    text = " ".join(lines[-3:])
    text = text.removeprefix("stderr: ").strip("' ")
    return text[:300] or "git failed"


def safe_url(url: str) -> str:
    """``url`` without any user:password part, for messages."""
    import re

    return re.sub(r"^([a-z][a-z0-9+.-]*://)[^/@]*@", r"\1***@", url)
