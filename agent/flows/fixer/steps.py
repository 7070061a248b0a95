"""The fixer's step handlers: ``STEP_HANDLERS`` maps every chain step to the function that does its work, records
the artifact (lane run, commit, check, gate, push, PR) and asks the guard to close the step (DESIGN.md
"The fixer"); ``finish`` marks the task done once every step is closed on one head."""

from __future__ import annotations

import threading
from contextlib import nullcontext
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from agent import AgentError

from agent.domain import chain
from agent.infra.faults import crashpoint, pausepoint
from agent.flows.fixer.outcomes import (Ctx, Stop, block, close_step, fail, redact_text, reject_round, repo_config,
                                        repo_settings, task_git, wait)
from agent.flows.fixer.limits import (PR_OPEN_LEASE, PR_OPEN_LEASE_S, PR_OPEN_WAIT_S, budget_refused, check_budgets,
                                      lane_budget, pr_limits_reached)
from agent.ledger import Ledger, eventlog, feedback, leases, ledger_path
from agent.ledger.errors import conclusion_brief, get_error
from agent.ledger.lanes import BudgetRefused, inflight_run, interrupt_run
from agent.domain.pr_text import commit_message
from agent.ledger.prs import has_pr
from agent.ledger.tasks import (finish_task, passing_check, record_check, record_commit, record_gate,
                                record_push, record_spec, task_commits)
from agent.infra.shutdown import STOP
from agent.ledger.tasks import ClaimLost, LeaseLost, Refused, snapshot
from agent.ledger.leases import claimed_tx

if TYPE_CHECKING:
    from agent.config import RepoConfig


def _error(ctx: Ctx) -> dict | None:
    t = ctx.load_task()
    return get_error(ctx.ledger, t["error_id"]) if t["error_id"] else None


def _brief(ctx: Ctx) -> str:
    t = ctx.load_task()
    if t["conclusion_id"]:
        brief = conclusion_brief(ctx.ledger, t["conclusion_id"])
        if brief:
            return brief
    return t["title"]


def _feedback(ctx: Ctx) -> list[str]:
    return [e["payload"].get("feedback", "") for e in eventlog.events(ctx.ledger, task_id=ctx.task_id)
            if e["kind"] == "round.started" and e["payload"].get("feedback")]


def _lessons(ctx: Ctx, error: dict | None) -> list[str]:
    """Accepted lessons only (a human merged their PR or accepted them), each with its origin."""
    from agent.flows.lessons import for_spec

    return for_spec(ctx.ledger, ctx.config, error, ctx.task_id)


def _check_command(ctx: Ctx, repo: RepoConfig) -> str | None:
    if repo.check:
        return repo.check
    settings = repo_settings(ctx)
    return settings.check if settings else None


def _blocked_paths(ctx: Ctx, repo: RepoConfig) -> tuple[str, ...]:
    settings = repo_settings(ctx)
    extra = settings.blocked_paths if settings else ()
    return tuple(dict.fromkeys(repo.blocked_paths + extra))


def _proof_wanted(ctx: Ctx) -> bool:
    """Whether the repository wants the proof (``proof:`` in its .agent/config.yaml at the base; default yes)."""
    settings = repo_settings(ctx)
    return settings is None or settings.proof.mode != "off"


def _require_lane(ctx: Ctx, role: str) -> None:
    """No lane for the role is a config problem: gate-block at once with the fix; it clears by itself once the
    config has the lane again (see ``lift_config_blocks``)."""
    from agent.lanes.lane import LaneNotConfigured, _lane_settings

    settings = repo_settings(ctx)
    try:
        _lane_settings(ctx.config, role, settings.lanes if settings else None, None)
    except LaneNotConfigured as exc:
        block(ctx, f"{chain.CONFIG_BLOCK} {exc}; the task goes on by itself once it is there")


def _runner(ctx: Ctx) -> str:
    from agent.coord.runners import runner_id

    return ctx.claim.runner if ctx.claim is not None else runner_id(ctx.home)


def _lease_held(ctx: Ctx, keeper, what: str) -> None:
    """After a lane or check: if its lease keeper found the claim gone (another runner took the task over while it
    ran, and the keeper killed it), stop here; nothing of its result is written (the fencing check would refuse
    it anyway)."""
    if keeper is not None and keeper.lost.is_set():
        raise LeaseLost(f"task {ctx.task_id}: lease lost while its {what} ran (another runner took the task over); "
                        "stopped it, result not written")


def _lane(ctx: Ctx, role: str, spec_path: Path, head: str | None):
    """Run one lane for this task (re-attaching the same attempt if an earlier run died in flight)."""
    from agent.coord.claims import lease_keeper
    from agent.lanes.lane import LaneRequest, run_lane
    from agent.infra.proc import kill_group_if_same, same_process

    _require_lane(ctx, role)
    t = ctx.load_task()
    settings = repo_settings(ctx)
    inflight = inflight_run(ctx.ledger, ctx.task_id, t["round"], role)
    if inflight and same_process(inflight["pid"], inflight["pid_start"]):
        # We hold the claim, so its worker is gone: the orphan's output is unreachable. Let it end (it may still
        # be editing the worktree), but not past its own timeout: then end its process group (pgid == pid).
        # A pid alone proves nothing (it may have been reused): only the recorded pid AND start time count.
        from agent.lanes.lane import _lane_settings

        timeout = _lane_settings(ctx.config, role, settings.lanes if settings else None, None)[2]
        started = datetime.strptime(inflight["started_at"][:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)
        if (datetime.now(timezone.utc) - started).total_seconds() <= timeout + 30:
            wait(ctx, f"{role} lane still running (pid {inflight['pid']}); waiting")
        kill_group_if_same(inflight["pid"], inflight["pid_start"])
        with claimed_tx(ctx.ledger, ctx.task_id, ctx.token) as c:
            ctx.ledger.event(c, "lane.orphan_killed", "script", {"run_id": inflight["id"], "pid": inflight["pid"],
                                                                 "role": role, "timeout": timeout}, task_id=ctx.task_id)
        ctx.say(f"{role} lane (pid {inflight['pid']}) outlived its {timeout}s timeout; killed, running it again")
    if inflight and not inflight["pid"]:
        # killed before its child started (its manifest may not even be recorded): nothing to resume or to compare
        # against, so it is superseded and a fresh run starts (resuming it would be a false capability_drift)
        interrupt_run(ctx.ledger, inflight["id"], "interrupted before its process started", task_id=ctx.task_id,
                      claim_token=ctx.token)
        inflight = None
    from agent.lanes.progress import LaneProgress

    keeping = lease_keeper(ledger_path(ctx.home), ctx.task_id, ctx.token, runner=_runner(ctx)) if ctx.token \
        else nullcontext()
    try:
        with keeping as keeper, \
                LaneProgress(f"task {ctx.task_id} {role}", force=None if ctx.progress else False) as progress:
            # the daily budget is checked and this lane's estimate reserved in the transaction that records it
            # running, so runners (and --jobs threads) racing for the last of it launch only the lanes that fit
            result = run_lane(LaneRequest(
                config=ctx.config, home=ctx.home, role=role, spec_path=spec_path, cwd=Path(t["worktree"]),
                ledger=ctx.ledger, task_id=ctx.task_id, error_id=t["error_id"], round=t["round"], head_sha=head,
                repo_lanes=settings.lanes if settings else None, claim_token=ctx.token,
                resume_run_id=inflight["id"] if inflight else None, on_progress=progress, budget=lane_budget(ctx)))
    except BudgetRefused as exc:
        budget_refused(ctx, role, exc)
    _lease_held(ctx, keeper, f"{role} lane")
    crashpoint("lane.finished")  # fault injection (tests): the run is recorded, its step not closed yet
    if STOP.is_set() and result.status not in ("complete", "partial", "blocked"):
        # the daemon's second signal killed it (or no report came while shutting down): not a verdict on the
        # work; mark the run interrupted so the next scan runs it again instead of failing or blocking the task
        why = "interrupted by shutdown" + ("" if result.status == "interrupted" else f" ({result.status})")
        interrupt_run(ctx.ledger, result.run_id, why, task_id=ctx.task_id,
                      claim_token=ctx.token, only_running=False, ended=False)
        ctx.say(f"{role} lane interrupted by shutdown; the next scan runs it again")
        raise Stop()
    return result


def _lane_outcome(ctx: Ctx, role: str, result) -> None:
    """The shared handling of a lane that did not produce a usable report."""
    from agent.lanes.lane import MIRROR_TAMPERED, SETID_BITS, WORKTREE_TOO_LARGE

    if result.status == "unavailable":
        block(ctx, f"{role} lane unavailable ({result.vendor}): {result.reason or 'binary missing or auth refused'}")
    if result.status == "malformed":
        excerpt = redact_text(result.excerpt or "")[-1500:]
        fail(ctx, f"{role} report unparseable after {len(result.repairs)} repair turn(s): {result.reason}; "
                   f"output tail: {excerpt}")
    if result.status == "rejected" and (result.reason or "").startswith(MIRROR_TAMPERED):
        # the mirror is restored already; the round's work is not trusted (the next round starts afresh)
        reject_round(ctx, f"{role} lane rejected: it changed git's config, hooks or .git ({result.vendor})",
                      f"The {role} lane changed git's own files ({redact_text(result.reason or '')}); they were "
                      "restored. Never touch .git, hooks or git config.")
        raise Stop()
    if result.status == "rejected" and (result.reason or "").startswith((SETID_BITS, WORKTREE_TOO_LARGE)):
        # the bits are removed already; the round's work is dropped and the next round starts from the last commit
        g = task_git(ctx)
        g("reset", "-q", "--hard", "HEAD")
        g("clean", "-fdqx")
        reject_round(ctx, f"{role} lane rejected: {result.reason}",
                     f"The {role} lane's round was dropped: {redact_text(result.reason or '')}.")
        raise Stop()
    if result.status == "rejected":
        fail(ctx, f"{role} lane rejected: {result.reason}")


def step_spec_written(ctx: Ctx) -> None:
    from agent.domain.spec import implementer_spec, write_spec

    t = ctx.load_task()
    repo = repo_config(ctx)
    error = _error(ctx)
    text = implementer_spec(t, error, _brief(ctx), _check_command(ctx, repo), _blocked_paths(ctx, repo),
                            [], _lessons(ctx, error), proof=_proof_wanted(ctx))
    path = write_spec(ctx.home, ctx.task_id, f"round-{t['round']}", text)
    record_spec(ctx.ledger, ctx.task_id, str(path), t["round"], claim_token=ctx.token)
    snap = snapshot(ctx.ledger, ctx.task_id)
    if not snap.from_conclusion:
        from agent.ledger.tasks import HUMAN_STEP_PENDING

        block(ctx, f"{HUMAN_STEP_PENDING} spec_written; read {path}, then run "
                    f"`agent task close-step {ctx.task_id} spec_written --source human --evidence ...`")
    eid = (t["error_id"] or "")[:8]
    close_step(ctx, "spec_written", f"auto spec from error.fix brief (error_id={eid}): {path}")


def _round_spec(ctx: Ctx) -> Path:
    """The implementer spec for the current round (round 1 is the one spec_written recorded)."""
    from agent.domain.spec import implementer_spec, write_spec

    t = ctx.load_task()
    path = Path(ctx.home) / "specs" / f"task-{ctx.task_id}" / f"round-{t['round']}.md"
    if path.exists():
        return path
    repo = repo_config(ctx)
    error = _error(ctx)
    from agent.flows.feedback import spec_findings

    text = implementer_spec(t, error, _brief(ctx), _check_command(ctx, repo), _blocked_paths(ctx, repo),
                            _feedback(ctx), _lessons(ctx, error),
                            pr_feedback=spec_findings(ctx.ledger, ctx.task_id), proof=_proof_wanted(ctx))
    path = write_spec(ctx.home, ctx.task_id, f"round-{t['round']}", text)
    record_spec(ctx.ledger, ctx.task_id, str(path), t["round"], claim_token=ctx.token)
    return path


def step_implementer_done(ctx: Ctx) -> None:
    check_budgets(ctx)
    spec = _round_spec(ctx)
    result = _lane(ctx, "implementer", spec, ctx.load_task()["head_sha"] or ctx.load_task()["base_sha"])
    _lane_outcome(ctx, "implementer", result)
    if result.status == "complete":
        from agent.flows.lessons import propose

        propose(ctx.ledger, ctx.task_id, result.lesson, max_chars=ctx.config.lessons.max_chars,
                lane_run_id=result.run_id, round_=ctx.load_task()["round"], claim_token=ctx.token, clean=redact_text)
        close_step(ctx, "implementer_done", f"lane run #{result.run_id}: {(result.summary or '')[:300]}")
        return
    if result.status == "timeout":
        reject_round(ctx, "implementer timed out", "The previous attempt timed out; make a smaller, focused change.")
    else:
        summary = redact_text(result.summary or result.reason or "")
        reject_round(ctx, f"implementer reported {result.status}",
                      f"The implementer reported STATUS: {result.status}: {summary}")


def _record_commit(ctx: Ctx, sha: str, parent: str | None, message: str) -> None:
    record_commit(ctx.ledger, ctx.task_id, ctx.load_task()["round"], sha, parent, message, claim_token=ctx.token)


def _push_task_ref(ctx: Ctx, sha: str) -> None:
    """Put the round's commit on the remote's hidden ref ``refs/agent/task-N`` before it is recorded, so a recorded
    commit is always reachable for any runner (DESIGN.md "Takeover"). A crash after the push and before the record
    leaves an unrecorded child of the head there, which the next commit step adopts (here or in another home).
    A ref that moved to a commit outside this history (another runner pushed) gate-blocks; a remote that cannot be
    reached now makes the task wait (the commit is adopted and pushed on the next scan). A worker that lost its
    claim pushes nothing (the fencing check, right before the push: the new holder may be working on the task)."""
    from agent.git.push import PushError, push_task_ref
    from agent.git.workspace import mirror_path, task_ref

    t = ctx.load_task()
    repo_cfg = repo_config(ctx)
    try:   # the claim is checked, and held still, in the step that pushes (ClaimLost: not ours, nothing pushed)
        with leases.holding_claim(ctx.ledger, ctx.task_id, ctx.token):
            push_task_ref(mirror_path(ctx.home, t["repo"]), repo_cfg.url, ctx.task_id, sha, expected=t["head_sha"])
    except PushError as exc:
        if "refusing" in str(exc):
            block(ctx, f"commit {sha[:12]} not recorded: {exc}")
        wait(ctx, f"waiting: commit {sha[:12]} not recorded until it is on the remote as {task_ref(ctx.task_id)}: "
                   f"{exc}")
    crashpoint("commit.ref_pushed")


def step_committed(ctx: Ctx) -> None:
    from agent.infra.text import strip_controls
    from agent.git.workspace import unsafe_changes

    t = ctx.load_task()
    repo_cfg = repo_config(ctx)
    g = task_git(ctx)
    head = g.head()
    if head == t["head_sha"] and snapshot(ctx.ledger, ctx.task_id).committed_round:
        # a crash after the commit was recorded and before the step closed: close it, do not commit again
        close_step(ctx, "committed", f"commit {head[:12]} (recorded before a crash)")
        return
    known = {r["sha"] for r in task_commits(ctx.ledger, ctx.task_id)}
    previous = t["head_sha"] or t["base_sha"]
    if head not in known and head != previous:
        parents = g("rev-list", "--parents", "-n", "1", head).split()[1:]
        if parents and parents[0] == previous and not g("status", "--porcelain", "--untracked-files=all"):
            # a crash after `git commit` and before the ledger write: adopt that commit, do not commit again
            _push_task_ref(ctx, head)
            _record_commit(ctx, head, previous, g("log", "-1", "--format=%B", head) + "\n")
            close_step(ctx, "committed", f"commit {head[:12]} (recovered after a crash)")
            return
    g("add", "-A")
    changes = g.staged_changes()
    changed = [c.path for c in changes]
    if not changed:
        reject_round(ctx, "implementer made no change",
                      "The previous round changed no file. The fix needs a code change.")
        return
    blocked = [p for p in changed for b in _blocked_paths(ctx, repo_cfg) if p == b.rstrip("/") or p.startswith(b)]
    blocked += unsafe_changes(g, changes)
    if blocked:
        g("reset", "-q", "--hard", "HEAD")
        g("clean", "-fdq")
        shown = strip_controls(", ".join(sorted(set(blocked))))     # file names the lane chose
        reject_round(ctx, f"touched blocked paths {shown}",
                      f"The previous round made blocked changes ({shown}); never touch these paths, never add "
                      "symlinks that point outside the repository and never add submodules.")
        return
    bidi = [] if repo_cfg.allow_bidi else _bidi_in_change(g)
    if bidi:
        g("reset", "-q", "--hard", "HEAD")
        g("clean", "-fdq")
        shown = ", ".join(f"{path} ({', '.join(chars)})" for path, chars in bidi[:10])
        reject_round(ctx, f"added bidi control characters in {shown}",
                     f"The previous round added invisible bidirectional control characters ({shown}); they make "
                     "code read differently than it runs. Never write them; use plain text or escapes.")
        return
    error = _error(ctx) or {}
    # the agent's own words only: the lane's SUMMARY goes to the PR's fenced sections, never into history
    message = commit_message(ctx.task_id, t["round"], error.get("class"), error.get("service"), t["error_id"])
    subject = message.splitlines()[0]
    name, email = ctx.config.git.author_name, ctx.config.git.author_email
    # hardened git: no hooks (core.hooksPath=/dev/null, --no-verify); COMMIT_EDITMSG lands in the worktree's own
    # git dir, so parallel tasks (--jobs) never share it
    g("-c", f"user.name={name}", "-c", f"user.email={email}", "commit", "-q", "--no-verify", "--no-gpg-sign",
      "--cleanup=verbatim", "-F", "-", input=message.encode())
    sha = g.head()
    crashpoint("commit.done")
    # the parent git really used (never a recorded head the repository may no longer hold)
    parent = (g("rev-list", "--parents", "-n", "1", sha).split()[1:] or [previous])[0]
    _push_task_ref(ctx, sha)
    _record_commit(ctx, sha, parent, message)
    crashpoint("commit.recorded")
    close_step(ctx, "committed", f"commit {sha[:12]}: {subject}")


def _bidi_in_change(g) -> list[tuple[str, list[str]]]:
    """``(path, [U+XXXX, ...])`` for every staged file whose added lines (or new name) hold bidi controls."""
    from agent.infra.text import bidi_controls

    found: dict[str, set[str]] = {}
    path = None
    diff = g("-c", "core.quotePath=false", "diff", "--cached", "--no-color", "--no-ext-diff", "--no-textconv",
             "-U0", "--no-renames", "--text")
    for line in diff.splitlines():
        if line.startswith("+++ "):
            path = line[4:].removeprefix("b/")
            chars = bidi_controls(path)
        elif line.startswith("+") and path is not None:
            chars = bidi_controls(line[1:])
        else:
            continue
        if chars:
            found.setdefault(path, set()).update(chars)
    return [(p, sorted(c)) for p, c in sorted(found.items())]


def step_local_check_pass(ctx: Ctx) -> None:
    from agent.coord.claims import lease_keeper
    from agent.lanes.sandbox import sandboxed_check
    from agent.git.workspace import human_bytes, walk_tree

    t = ctx.load_task()
    repo_cfg = repo_config(ctx)
    command = _check_command(ctx, repo_cfg)
    if not command:
        block(ctx, f"no check command for {t['repo']}; set repos.{t['repo']}.check or check: in the "
                    "repository's .agent/config.yaml")
    head = t["head_sha"]
    folder = Path(ctx.home) / "checks" / f"task-{ctx.task_id}"
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"round-{t['round']}-{head[:8]}.log"
    try:
        check = sandboxed_check(ctx.config, ctx.home, Path(t["worktree"]), command, folder / "sandbox")
    except AgentError as exc:
        block(ctx, f"check not started: {exc}")
    keeping = lease_keeper(ledger_path(ctx.home), ctx.task_id, ctx.token, runner=_runner(ctx)) if ctx.token \
        else nullcontext()
    with keeping as keeper:
        res = check(timeout=ctx.config.limits.check_timeout, stdout_path=out, stderr_path=out.with_suffix(".err"))
    _lease_held(ctx, keeper, "check")
    passed = res.status == "ok"
    if STOP.is_set() and not passed:  # killed by the daemon's second signal: run it again next scan
        ctx.say("check interrupted by shutdown; the next scan runs it again")
        raise Stop()
    task_git(ctx)("clean", "-fdq")  # what the check left behind must not be committed by the next round
    size, setid = walk_tree(Path(t["worktree"]), strip_setid=True)   # code the lane wrote ran: no setuid file stays
    if size > ctx.config.limits.worktree_max_mb << 20:
        task_git(ctx)("clean", "-fdqx")
        reject_round(ctx, f"worktree_too_large after the check ({human_bytes(size)})",
                     f"The check left the worktree at {human_bytes(size)}, past limits.worktree_max_mb "
                     f"({ctx.config.limits.worktree_max_mb} MB); keep generated files out of it.")
        return
    record_check(ctx.ledger, ctx.task_id, t["round"], command=command, exit_code=res.exit_code, passed=passed,
                 head=head, output_path=str(out), duration_s=round(res.duration_s, 3), status=res.status,
                 claim_token=ctx.token)
    if passed:
        proven = _prove(ctx, command, folder)
        if proven is None:
            return
        close_step(ctx, "local_check_pass", f"`{command}` passed at {head[:12]} in {res.duration_s:.1f}s; {proven}")
        return
    tail = redact_text(res.tail(2500))
    what = "timed out" if res.timed_out else f"exit {res.exit_code}"
    reject_round(ctx, f"check failed ({what})", f"The check `{command}` failed ({what}) on the previous round's "
                                                f"commit. Its output ends with:\n{tail}")


def _prove(ctx: Ctx, command: str, folder: Path) -> str | None:
    """The proof of the head (DESIGN.md "The proof"): the check once more on the base plus the round's test
    changes, in the check's sandbox. Returns its summary line, or None when the round was sent back."""
    from agent.flows import proof as P
    from agent.config import ProofSettings
    from agent.coord.claims import lease_keeper
    from agent.lanes.sandbox import sandboxed_check
    from agent.ledger.proofs import proof_for_head, record_proof
    from agent.git.workspace import mirror_path

    t = ctx.load_task()
    head = t["head_sha"]
    done = proof_for_head(ctx.ledger, ctx.task_id, head)
    if done is not None and done["verdict"] != P.REJECTED:   # recorded before a crash: never run twice
        return P.summary(done)
    settings = repo_settings(ctx)
    wanted = settings.proof if settings else ProofSettings()

    def run_check(tree: Path, cmd: str, name: str):
        try:
            check = sandboxed_check(ctx.config, ctx.home, tree, cmd, folder / "sandbox")
        except AgentError as exc:
            block(ctx, f"proof not started: {exc}")
        out = folder / f"round-{t['round']}-{head[:8]}-{name}.log"
        keeping = lease_keeper(ledger_path(ctx.home), ctx.task_id, ctx.token, runner=_runner(ctx)) if ctx.token \
            else nullcontext()
        with keeping as keeper:
            res = check(timeout=ctx.config.limits.check_timeout, stdout_path=out, stderr_path=out.with_suffix(".err"))
        _lease_held(ctx, keeper, "proof")
        return res

    p = P.prove(mode=wanted.mode, globs=wanted.tests, command=command, mirror=mirror_path(ctx.home, t["repo"]),
                tree=folder / f"proof-task-{ctx.task_id}", base=t["base_sha"], head=head, run_check=run_check,
                error=_error(ctx), redact=redact_text)
    if STOP.is_set():  # killed by the daemon's second signal: prove it again next scan
        ctx.say("proof interrupted by shutdown; the next scan runs it again")
        raise Stop()
    record_proof(ctx.ledger, ctx.task_id, t["round"], head=head, base=t["base_sha"], mode=p.mode,
                 verdict=p.verdict, reproduces=p.reproduces, reproduces_why=p.reproduces_why, command=p.command,
                 narrowed=p.narrowed, lists=p.lists(), base_exit=p.base_exit, base_status=p.base_status,
                 base_tail=p.base_tail, duration_s=p.duration_s, claim_token=ctx.token)
    crashpoint("proof.recorded")
    if p.verdict == P.REJECTED:
        reject_round(ctx, "no test proves the fix", P.feedback(p))
        return None
    return P.summary(p)


def _diff(ctx: Ctx) -> str:
    t = ctx.load_task()
    return task_git(ctx).diff(t["base_sha"], t["head_sha"])


def _record_gate(ctx: Ctx, result, stage: str, dimension: str, verdict: str) -> None:
    t = ctx.load_task()
    record_gate(ctx.ledger, ctx.task_id, t["round"], stage=stage, dimension=dimension, verdict=verdict,
                findings=result.findings, head=t["head_sha"], lane_run_id=result.run_id, claim_token=ctx.token)


def _proof_text(ctx: Ctx) -> str | None:
    from agent.ledger.proofs import proof_for_head
    from agent.flows.proof import spec_text

    return spec_text(proof_for_head(ctx.ledger, ctx.task_id, ctx.load_task()["head_sha"]))


def _review_spec(ctx: Ctx, dimension: str) -> Path:
    from agent.domain.spec import reviewer_spec, without_section, write_spec

    t = ctx.load_task()
    spec_text = _round_spec(ctx).read_text(encoding="utf-8")   # this home's copy (another runner may have written it)
    check = passing_check(ctx.ledger, ctx.task_id, t["head_sha"])
    summary = f"`{check['command']}` passed (exit {check['exit_code']})" if check else None
    if not ctx.config.lessons.reviewers:   # a reviewer judges the diff, not what earlier lanes left behind
        spec_text = without_section(spec_text, "Lessons")
    text = reviewer_spec(spec_text, _diff(ctx), summary, dimension, proof=_proof_text(ctx))
    return write_spec(ctx.home, ctx.task_id, f"review-{dimension}-round-{t['round']}", text)


def step_reviewer_approved(ctx: Ctx) -> None:
    from agent.lanes.report import verdict

    check_budgets(ctx)
    t = ctx.load_task()
    result = _lane(ctx, "reviewer", _review_spec(ctx, "code"), t["head_sha"])
    _lane_outcome(ctx, "reviewer", result)
    if result.status == "timeout":
        reject_round(ctx, "reviewer timed out", "The review timed out; keep the change small and easy to review.")
        return
    v = verdict(result.report)
    _record_gate(ctx, result, "review", "code", v or "reject")
    if v == "approve":
        close_step(ctx, "reviewer_approved", f"lane run #{result.run_id}: approved {t['head_sha'][:12]}")
        return
    n = result.findings or 0
    reject_round(ctx, f"reviewer rejected, {n} finding{'s' if n != 1 else ''}",
                  f"The reviewer rejected the previous round (STATUS: {result.status}). Findings:\n"
                  f"{redact_text(result.findings_text or result.summary or '')}")


def step_pushed(ctx: Ctx) -> None:
    from agent.git.push import PushError, push_branch

    t = ctx.load_task()
    repo_cfg = repo_config(ctx)
    try:   # only under the current claim, checked and held still in the same step (ClaimLost: nothing pushed)
        with leases.holding_claim(ctx.ledger, ctx.task_id, ctx.token):
            res = push_branch(Path(t["worktree"]), repo_cfg.url, t["branch"], t["base"], repo_cfg.branch_prefix,
                              expected_remote_sha=t["pushed_sha"])
    except PushError as exc:
        block(ctx, f"push refused: {exc}")
    crashpoint("push.done")
    record_push(ctx.ledger, ctx.task_id, sha=res.sha, pushed=res.pushed, forced=res.forced, branch=t["branch"],
                claim_token=ctx.token)
    close_step(ctx, "pushed", f"{t['branch']} at {res.sha[:12]}" + ("" if res.pushed else " (already on the remote)"))


def _publish(ctx: Ctx):
    """Create or update the task's draft PR with the current text (found by head after a crash, never twice)."""
    from agent.forge import get_forge
    from agent.flows.pr_thread import publish_pr
    from agent.domain.pr_text import render_pr
    from agent.ledger.prs import pr_data_from_ledger

    t = ctx.load_task()
    title, body = render_pr(pr_data_from_ledger(ctx.ledger, ctx.task_id))
    forge = get_forge(repo_config(ctx), ctx.config, ctx.home, ledger=ctx.ledger)
    with claimed_tx(ctx.ledger, ctx.task_id, ctx.token):  # a worker that lost its claim must not touch the PR
        pass
    return publish_pr(ctx.ledger, forge, ctx.task_id, t["branch"], t["base"], title, body, t["head_sha"],
                      claim_token=ctx.token)


def step_pr_opened(ctx: Ctx) -> None:
    from agent.forge import ForgeAuthError, ForgeError, ForgeRateLimited, ForgeTransient

    from agent.coord.claims import LeaseBusy, named_lease

    t = ctx.load_task()
    try:
        # runners sharing the ledger take turns here: the limits count every runner's PRs, and the count and the
        # create happen under one `pr-open` lease, so two runners can never both pass the check for one slot
        with named_lease(ctx.ledger, PR_OPEN_LEASE, ttl=PR_OPEN_LEASE_S, wait=PR_OPEN_WAIT_S,
                         runner=_runner(ctx)):
            if not has_pr(ctx.ledger, ctx.task_id):
                why = pr_limits_reached(ctx, t["repo"])
                if why:
                    wait(ctx, f"waiting to open a PR: {why}")
                pausepoint("pr.limits_checked")  # fault injection (tests): widen the check -> create window
            pr, action = _publish(ctx)
    except LeaseBusy as exc:
        wait(ctx, f"waiting to open a PR: {exc} (another runner is opening one)")
    except ForgeAuthError as exc:
        block(ctx, f"forge refused: {exc}")
    except (ForgeRateLimited, ForgeTransient) as exc:
        wait(ctx, f"forge busy, will retry next scan: {exc}")
    except ForgeError as exc:  # e.g. a PR on our branch that we may not adopt: a human decides
        block(ctx, f"forge: {exc}")
    close_step(ctx, "pr_opened", f"draft PR {pr.url} at {t['head_sha'][:12]} ({action})")
    ctx.say(f"draft PR {action}: {pr.url}")


def step_pr_reviews(ctx: Ctx) -> None:
    """The PR quality and logic reviewers run in parallel on the pushed head."""
    from agent.lanes.report import verdict

    check_budgets(ctx)
    t = ctx.load_task()
    snap = snapshot(ctx.ledger, ctx.task_id)
    todo = [d for d in ("quality", "logic") if snap.steps.get(f"pr_{d}_approved") not in chain.CLOSED]
    for d in todo:  # a missing lane blocks here, on the task's own thread, before either reviewer starts
        _require_lane(ctx, f"pr-{d}")
    specs = {d: _review_spec(ctx, d) for d in todo}
    results: dict[str, object] = {}
    stopped_dims: set[str] = set()
    raised: dict[str, BaseException] = {}

    def one(dimension: str) -> None:
        led = Ledger.open(ledger_path(ctx.home), create=False)
        try:
            sub = Ctx(ctx.home, ctx.config, led, ctx.task_id, ctx.token)
            results[dimension] = _lane(sub, f"pr-{dimension}", specs[dimension], t["head_sha"])
        except Stop:  # waiting for an orphan, or interrupted by shutdown: this scan stops, the next goes on
            stopped_dims.add(dimension)
            ctx.lines.extend(sub.lines)
            ctx.waiting = ctx.waiting or sub.waiting
        except BaseException as exc:  # e.g. no vendor for the role: handed to this thread, never a "crash"
            raised[dimension] = exc
        finally:
            led.close()

    threads = [threading.Thread(target=one, args=(d,)) for d in todo]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    rejected: list[str] = []
    stopped = False
    for d in todo:
        result = results.get(d)
        if d in stopped_dims or d in raised:
            stopped = stopped or d in stopped_dims
            continue
        if result is None:
            fail(ctx, f"pr-{d} lane crashed; see the lane logs")
        _lane_outcome(ctx, f"pr-{d}", result)
        if result.status == "timeout":
            rejected.append(f"PR {d} review timed out")
            continue
        v = verdict(result.report)
        _record_gate(ctx, result, "pr", d, v or "reject")
        if v == "approve":
            close_step(ctx, f"pr_{d}_approved", f"lane run #{result.run_id}: approved {t['head_sha'][:12]}")
        else:
            rejected.append(f"PR {d} reviewer ({result.findings or 0} findings):\n"
                            f"{redact_text(result.findings_text or result.summary or '')}")
    if stopped:
        raise Stop()
    if raised:
        # what went wrong in a reviewer thread is handled here, on the task's own thread: a one-line AgentError
        # (a config error: unknown vendor, no lane for the role; no lane ran) gate-blocks the task with that
        # reason for a human; anything else goes the way of any unexpected error in a step
        d = next(d for d in todo if d in raised)
        if isinstance(raised[d], AgentError) and not isinstance(raised[d], (ClaimLost, Refused)):
            block(ctx, f"pr-{d} lane not started: {raised[d]}")
        raise raised[d]
    if rejected:
        n = len(rejected)
        reject_round(ctx, f"PR review rejected ({n} reviewer{'s' if n > 1 else ''})", "\n\n".join(rejected))


def finish(ctx: Ctx) -> None:
    from agent.forge import ForgeError

    try:  # the PR body gets the PR reviewers' verdicts too
        _publish(ctx)
    except ForgeError as exc:  # owed to the forge: `watch pr-merged` retries it on later scans until it lands
        from agent.flows.followup import owe_pr_text

        owe_pr_text(ctx.ledger, ctx.task_id, str(exc), ctx.token)
        ctx.lines.append(f"task {ctx.task_id}: PR text not refreshed ({exc}); later scans retry it")
    t = ctx.load_task()
    finish_task(ctx.ledger, ctx.task_id, f"all reviewers approved {t['head_sha'][:12]}", claim_token=ctx.token)
    ctx.say(f"done: all reviewers approved {t['head_sha'][:12]}")
    _reply_on_pr(ctx)


def _reply_on_pr(ctx: Ctx) -> None:
    """A round started by PR feedback replies once on the PR when it is done (else `watch pr-feedback` retries)."""
    from agent.flows.feedback import post_owed_replies
    from agent.forge import ForgeError, get_forge

    if not feedback.owed_replies(ctx.ledger, ctx.task_id):
        return
    try:
        forge = get_forge(repo_config(ctx), ctx.config, ctx.home, ledger=ctx.ledger)
        ctx.lines.extend(post_owed_replies(ctx.ledger, forge, ctx.task_id))
    except ForgeError as exc:
        ctx.lines.append(f"task {ctx.task_id}: PR reply not posted now ({exc}); `watch pr-feedback` retries")


STEP_HANDLERS = {
    "spec_written": step_spec_written,
    "implementer_done": step_implementer_done,
    "committed": step_committed,
    "local_check_pass": step_local_check_pass,
    "reviewer_approved": step_reviewer_approved,
    "pushed": step_pushed,
    "pr_opened": step_pr_opened,
    "pr_quality_approved": step_pr_reviews,
    "pr_logic_approved": step_pr_reviews,
}
