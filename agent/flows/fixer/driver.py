"""The fixer's driver: ``advance`` drives one task one step at a time under its claim.

``Ctx`` is everything one worker needs; the outcomes (``block``, ``fail``, ``wait``, ``reject_round``,
``close_step``, in ``agent.flows.fixer.outcomes``) are how a step handler (``agent.flows.fixer.steps``) ends. For every step the handler does the work,
records the artifact and then asks the one guard to close the step through ``tasks.set_step``; the driver never
writes step state itself. Every write carries the task's claim token, so a worker that lost its claim writes
nothing. The task's workspace is made (and made again when it was lost) before the first step, and unexpected
errors are counted: the third in a row without progress gate-blocks the task. Everything is re-derivable from the
ledger and the worktree, so a kill at any point is continued by the next scan (see DESIGN.md "Crash safety").
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from agent import AgentError

from agent.domain import chain
from agent.ledger import Ledger, ledger_path
from agent.ledger.tasks import forget_commits, record_workspace, task_commits, wait_reason
from agent.infra.shutdown import STOP
from agent.ledger.tasks import ClaimLost, Refused, transition_in, get_task, snapshot, start_next_round
from agent.ledger.leases import claimed_tx
from agent.flows.fixer.outcomes import Ctx, Stop, redact_text, repo_config, task_git

if TYPE_CHECKING:  # a no-op cron tick (no open task) must not pay for the config module
    from agent.config import Config

# STOP: set on the first SIGTERM/SIGINT (agent.infra.shutdown): finish the running step, start no new one.


def ensure_workspace(ctx: Ctx) -> None:
    """Make sure the task has a working worktree in this runner's home: made once, made again when it (or the whole
    mirror) was deleted, and rebuilt when another runner's home advanced the task last (a takeover). A rebuilt
    worktree starts at the task's last recorded commit, fetched from the remote's hidden ref ``refs/agent/task-N``
    (DESIGN.md "Takeover"). A failure is an event; ``limits.workspace_failures`` in a row gate-block the task with
    git's first error line and the fix."""
    import os
    import shutil

    from agent.git.workspace import (WorkspaceError, branch_name, ensure_worktree, intact, mirror_lock, mirror_path,
                                 own_worktree, remove_worktree)

    t = ctx.load_task()
    own = own_worktree(ctx.home, ctx.task_id)
    mirror = mirror_path(ctx.home, t["repo"])
    # the worktree the ledger names lives in another runner's home: that runner advanced the task last (and may be
    # dead); its folder is never touched from here
    foreign = bool(t["worktree"]) and os.path.realpath(t["worktree"]) != os.path.realpath(own)
    # the claim's takeover hook: another runner held the task last (DESIGN.md "Runners, leases and fencing")
    moved = bool(getattr(getattr(ctx, "claim", None), "moved", False))
    lost = bool(t["worktree"])  # it had a workspace: anything we make now replaces a lost one
    if not foreign and t["worktree"] and own.exists():
        if intact(own, mirror):
            if not moved and _holds_head(own, mirror, t["head_sha"]):
                return
            # another runner advanced the task since (its claim says so, or this home's worktree lacks the
            # recorded head): a runner elsewhere whose home has the same path (one systemd unit on two machines);
            # rebuilt like a takeover, so nothing of this home's older state is taken for the task's
            foreign = True
        else:
            # the mirror was deleted (or the worktree's link into it): the folder is no git worktree any more and
            # every git command in it fails; what it held is unreachable without its git data, so it goes
            shutil.rmtree(own, ignore_errors=True)
    repo = repo_config(ctx)
    branch = t["branch"] or branch_name(repo.branch_prefix, t["error_id"], ctx.task_id)
    start_at = None
    try:
        with mirror_lock(ctx.home, t["repo"]):   # the other --jobs threads of this runner use the same mirror
            if lost or t["head_sha"]:   # (a reset task whose worktree was removed has a head, no worktree)
                start_at = _rebuild_point(ctx, repo)
                if foreign and start_at is None and own.exists():
                    remove_worktree(mirror, own)   # this home's own old worktree of the task is stale: made again
            ws = ensure_worktree(ctx.home, t["repo"], repo.url, t["base"] or repo.base, branch, ctx.task_id,
                                 start_at=start_at)
    except WorkspaceError as exc:
        _workspace_failed(ctx, str(exc))
    from agent.git.workspace import has_commit

    # the ledger never keeps a commit the repository lacks: a base that a re-cloned mirror no longer has is replaced
    base_sha = t["base_sha"] if has_commit(ws.mirror, t["base_sha"]) else ws.base_sha
    interrupted = record_workspace(ctx.ledger, ctx.task_id, path=str(ws.path), branch=ws.branch, base_sha=base_sha,
                     old_base_sha=t["base_sha"], created=ws.created, replaced_lost=lost and ws.created,
                     claim_token=ctx.token, start_at=start_at, taken_over_from=t["worktree"] if foreign else None,
                     head=t["head_sha"],
                     # another runner held it last: every run still `running` is that runner's (its home may have
                     # the same path as this one on another machine); else only runs outside this home's lanes/
                     own_lanes=None if moved else str(Path(ctx.home).resolve() / "lanes") + "/")
    if interrupted:
        _end_interrupted_lanes(ctx, interrupted)
    if foreign:
        ctx.say(f"taken over from {Path(t['worktree']).parent.parent}: worktree rebuilt at "
                f"{(start_at or 'the pushed branch or base')[:12]}")
    if (lost or t["head_sha"]) and ws.created:
        _reconcile_lost_work(ctx, ws)


def _end_interrupted_lanes(ctx: Ctx, run_ids: list[int]) -> None:
    """A taken-over task's interrupted lanes whose processes still run in this pid scope (their runner died on this
    host; a SIGKILL that lands before bwrap arms its parent-death signal leaves the sandbox running): end their
    process groups, each pinned by its recorded pid and start time. Nothing reads their output any more, and a
    lane must not outlive its runner. Processes of another host or container are never touched."""
    from agent.coord.runners import pid_scope
    from agent.infra.proc import kill_group_if_same
    from agent.ledger.lanes import get_run
    from agent.ledger.leases import runner_rows

    previous = getattr(getattr(ctx, "claim", None), "previous_runner", None)
    scopes = {r["id"]: r.get("scope") for r in runner_rows(ctx.ledger)}
    if previous is not None and scopes.get(previous) != pid_scope():
        return
    for run_id in run_ids:
        run = get_run(ctx.ledger, run_id) or {}
        if kill_group_if_same(run.get("pid"), run.get("pid_start"), grace=1.0):
            ctx.say(f"{run.get('role')} lane of the runner it was taken from (pid {run.get('pid')}) still ran; ended")


def _holds_head(worktree: Path, mirror: Path, head: str | None) -> bool:
    """Whether the worktree's HEAD is the recorded head or goes on from it (an unrecorded child: a commit made just
    before a crash, which the commit step adopts)."""
    from agent.git.workspace import TaskGit, is_ancestor

    if not head:
        return True
    try:
        return is_ancestor(mirror, head, TaskGit(worktree, mirror).head())
    except AgentError:
        return False


def _rebuild_point(ctx: Ctx, repo) -> str | None:
    """The commit a rebuilt worktree starts at: the task's last recorded commit (its head, else its base), fetched
    from the remote's hidden ref; or that ref's tip when it is an unrecorded child of it (pushed, then the runner
    died before recording it: the commit step adopts it). None when the mirror cannot have the recorded head (the
    remote has no hidden ref for the task): the caller starts from the local or pushed branch, else the base, and
    the lost round starts again."""
    from agent.git.workspace import (GitError, WorkspaceError, ensure_mirror, fetch_task_ref, has_commit, parent_of,
                                 git_error_line)

    t = ctx.load_task()
    mirror = ensure_mirror(ctx.home, t["repo"], repo.url)
    try:
        tip = fetch_task_ref(mirror, repo.url, ctx.task_id)
    except GitError as exc:
        raise WorkspaceError(f"task {ctx.task_id}: cannot fetch its commits from {repo.url}: "
                             f"{git_error_line(exc)}") from None
    previous = t["head_sha"] or t["base_sha"]
    if not previous or not has_commit(mirror, previous):
        return None
    if tip and tip != previous and parent_of(mirror, tip) == previous:
        return tip
    return previous


def _reconcile_lost_work(ctx: Ctx, ws) -> None:
    """The worktree was made again (its folder or the whole mirror was deleted, or another runner's home advanced
    the task). If the round's work did not survive (edits not yet committed, or a commit from before hidden refs
    that no remote has), the ledger must not go on from it: the round starts again from what the repository still
    has (the last recorded commit, else the base), without counting against the cap."""
    from agent.git.workspace import TaskGit, has_commit

    from agent.git.workspace import parent_of

    t = ctx.load_task()
    head = TaskGit(ws.path, ws.mirror).head()
    snap = snapshot(ctx.ledger, ctx.task_id)
    done_this_round = [k for k in chain.ROUND_STEPS if snap.steps.get(k) in chain.CLOSED]
    uncommitted = "implementer_done" in done_this_round and "committed" not in done_this_round \
        and not (snap.committed_round and t["head_sha"] == head)   # a recorded commit whose step is not closed yet
    if not uncommitted and (t["head_sha"] == head or (t["head_sha"] is None and not done_this_round)):
        return  # nothing was lost: the recorded head is what the new worktree holds
    known = {r["sha"] for r in task_commits(ctx.ledger, ctx.task_id)}
    if uncommitted and head not in known and parent_of(ws.mirror, head) == (t["head_sha"] or t["base_sha"]):
        return  # the round's commit was pushed to the task's ref before its runner died: the commit step adopts it
    new_head = head if head in known else None
    pushed = t["pushed_sha"] if has_commit(ws.mirror, t["pushed_sha"]) else None
    lost = t["head_sha"][:12] if t["head_sha"] and t["head_sha"] != head else "the uncommitted edits"
    source = "the last recorded commit" if new_head else "the base"
    gone = [r for r in task_commits(ctx.ledger, ctx.task_id) if not has_commit(ws.mirror, r["sha"])]
    if gone:  # commits the repository no longer has leave the commits table; the events keep their history
        forget_commits(ctx.ledger, ctx.task_id, gone, claim_token=ctx.token)
    _, rnd = start_next_round(ctx.ledger, ctx.task_id,
                              f"The workspace was lost and made again from {source}; the previous round's work "
                              f"({lost}) is gone. Make the change again.", claim_token=ctx.token, free=True,
                              head_sha=new_head, pushed_sha=pushed)
    ctx.say(f"workspace made again; {lost} was lost, round {rnd} starts from {source} "
            "(not counted against the round cap)")


def _workspace_failed(ctx: Ctx, error: str) -> None:
    """One workspace failure: an event; the Nth in a row (limits.workspace_failures) gate-blocks the task."""
    from agent.ledger import eventlog

    limit = ctx.config.limits.workspace_failures
    error = redact_text(error)[:600]
    with claimed_tx(ctx.ledger, ctx.task_id, ctx.token) as c:
        ctx.ledger.event(c, "workspace.failed", "script", {"error": error}, task_id=ctx.task_id)
        streak = eventlog.event_streak(ctx.ledger, c, ctx.task_id, "workspace.failed",
                                       ("workspace.ready", "task.reset"))
        state = get_task(ctx.ledger, ctx.task_id, c)["state"]
        blocked = streak >= limit and state in (chain.OPEN, chain.WORKING)
        if blocked:
            transition_in(ctx.ledger, c, ctx.task_id, state, chain.BLOCKED, "script",
                          f"workspace failed {streak} times in a row: {error}")
    if blocked:
        ctx.say(f"gate-blocked: workspace failed {streak} times in a row: {error}")
    else:
        ctx.say(f"workspace not ready ({streak} of {limit} failures before it gate-blocks), will retry: {error}")
    raise Stop()


def clear_stale_git_locks(ctx: Ctx) -> None:
    """A kill during a git command leaves ``index.lock``/``HEAD.lock`` in the task's worktree git dir, and every
    later git command there fails. We hold the task's claim and the worktree is the task's own, so no live git
    process of ours is using it: remove them (with an event)."""
    t = ctx.load_task()
    if not t["worktree"] or not Path(t["worktree"]).exists():
        return
    try:
        git_dir = Path(task_git(ctx).git_dir)   # from the mirror's records, not the worktree's .git file
    except Exception:
        return
    for name in ("index.lock", "HEAD.lock"):
        lock = git_dir / name
        if lock.exists():
            lock.unlink(missing_ok=True)
            with claimed_tx(ctx.ledger, ctx.task_id, ctx.token) as c:
                ctx.ledger.event(c, "workspace.stale_lock_removed", "script", {"path": str(lock)},
                                 task_id=ctx.task_id)
            ctx.say(f"removed stale {name} left by a killed git command")


MAX_UNEXPECTED = 3


def _record_unexpected(ledger: Ledger, task_id: int, token: str | None, error: str) -> None:
    """Record an unexpected error; the third in a row without progress gate-blocks the task for a human."""
    from agent.ledger import eventlog

    with claimed_tx(ledger, task_id, token) as c:
        ledger.event(c, "task.error", "script", {"error": redact_text(error)[:1000]}, task_id=task_id)
        streak = eventlog.event_streak(ledger, c, task_id, "task.error", ("step.closed", "round.started", "task.reset"))
        state = get_task(ledger, task_id, c)["state"]
        if streak >= MAX_UNEXPECTED and state in (chain.OPEN, chain.WORKING):
            transition_in(ledger, c, task_id, state, chain.BLOCKED, "script",
                          f"unexpected error {streak} times in a row: {redact_text(error)[:300]}")


def advance(home: Path, config: Config, task_id: int, max_steps: int = 100, progress: bool = False,
            ledger: Ledger | None = None) -> list[str]:
    """Drive one task as far as it can go now, on ``ledger`` (a connection of this thread, which it leaves open)
    or else on a connection of its own; never raises for a task problem."""
    from agent.coord.claims import release_quietly, take
    from agent.coord.runners import runner_id
    from agent.flows.fixer.steps import STEP_HANDLERS, finish

    own = ledger is None
    ledger = Ledger.open(ledger_path(home), create=False) if own else ledger
    ctx = Ctx(home, config, ledger, task_id, progress=progress)
    token = None
    try:
        got = take(ledger, task_id, runner=runner_id(home))
        if got is None:
            return [f"task {task_id}: claimed by another worker; skipped"]
        # ctx.claim.moved / .took_over: the takeover hook (DESIGN.md "Runners, leases and fencing")
        ctx.claim, ctx.token = got, got.token
        token = got.token
        if ctx.load_task()["state"] not in (chain.OPEN, chain.WORKING):
            return []
        ensure_workspace(ctx)
        clear_stale_git_locks(ctx)
        for _ in range(max_steps):
            if STOP.is_set():
                ctx.say("stopping: shutdown requested")
                break
            t = ctx.load_task()
            if t["state"] not in (chain.OPEN, chain.WORKING):
                break
            snap = snapshot(ledger, task_id)
            todo = chain.next_steps(snap)
            if not todo:
                if chain.all_closed(snap):
                    finish(ctx)
                break
            STEP_HANDLERS[todo[0]](ctx)
    except Stop:
        pass
    except ClaimLost as exc:
        ctx.lines.append(f"task {task_id}: {exc}")
    except Refused as exc:
        ctx.lines.append(f"task {task_id}: guard refused: {exc}")
    except Exception as exc:  # one task's failure never stops the others
        from agent.ledger import storage_fault

        fault = storage_fault(exc, ledger.path)
        if fault is not None:  # ... but a full or read-only disk or a busy ledger stops them all, in one line
            raise fault from None
        ctx.lines.append(f"task {task_id}: error: {type(exc).__name__}: {exc}")
        try:
            _record_unexpected(ledger, task_id, token, f"{type(exc).__name__}: {exc}")
        except Exception:
            pass
    finally:
        if token and ctx.waiting is None:
            try:  # it moved (or stopped for another reason): it no longer waits
                if wait_reason(ledger, task_id) is not None:
                    from agent.ledger.tasks import note_wait

                    note_wait(ledger, task_id, None, token)
            except Exception:
                pass
        release_quietly(ledger, task_id, token)
        if own:
            ledger.close()
    return ctx.lines
