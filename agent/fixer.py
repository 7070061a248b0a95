"""The fixer: confirmed error.fix conclusions -> tasks with worktrees -> rounds -> a reviewed draft PR.

Two scans:
- ``fix_scan`` (`agent watch error-fix`): each confirmed fix conclusion becomes a task (found or created, never
  two per error) with its workspace.
- ``work_scan`` (`agent watch error-fix-work`): drives every open task through the chain as far as it can go now.

``advance`` drives one task one step at a time. For every step it does the work, records the artifact (lane run,
commit, check, gate, push, PR) and then asks the one guard to close the step through ``tasks.set_step``; it never
writes step state itself. Every write carries the task's claim token, so a worker that lost its claim writes
nothing. Everything is re-derivable from the ledger and the worktree, so a kill at any point is continued by the
next scan (see DESIGN.md "Crash safety").
"""

from __future__ import annotations

import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from agent import AgentError, chain
from agent.fence import crashpoint
from agent.ledger import Ledger, ledger_path, now
from agent.ledger.outbox import TASK_BUDGET_SPENT, daily_budget_reached
from agent.shutdown import STOP
from agent.tasks import (ClaimLost, Refused, transition_in, claimed_tx, get_task, set_step, snapshot,
                         start_next_round, transition)

if TYPE_CHECKING:  # a no-op cron tick (no open task) must not pay for the config module or a thread pool
    from agent.config import Config, RepoConfig

# STOP: set on the first SIGTERM/SIGINT (agent.shutdown): finish the running step, start no new one.


@dataclass
class Ctx:
    """Everything one worker needs to advance one task; one Ledger connection per worker thread."""
    home: Path
    config: Config
    ledger: Ledger
    task_id: int
    token: str | None = None
    lines: list[str] = field(default_factory=list)
    progress: bool = False               # show a live line (elapsed, last output) while a lane runs, on a TTY
    waiting: str | None = None           # why this pass stopped to wait (recorded as tasks.wait_reason)

    @property
    def task(self) -> dict:
        return get_task(self.ledger, self.task_id)

    def say(self, text: str) -> None:
        t = self.task
        self.lines.append(f"task {self.task_id} round {t['round']}: {text}")


class Stop(Exception):
    """Stop advancing this task for now (blocked, failed, waiting or done); the message says why."""


def _redact(text: str) -> str:
    from agent.intake.redact import redact

    return redact(text or "")


# ---------------------------------------------------------------------------------------------- outcomes


def _block(ctx: Ctx, reason: str) -> None:
    transition(ctx.ledger, ctx.task_id, chain.BLOCKED, "script", reason, claim_token=ctx.token)
    ctx.say(f"gate-blocked: {reason}")
    raise Stop()


def _fail(ctx: Ctx, reason: str) -> None:
    transition(ctx.ledger, ctx.task_id, chain.FAILED, "script", reason, claim_token=ctx.token)
    ctx.say(f"failed: {reason}")
    raise Stop()


def _wait(ctx: Ctx, line: str) -> None:
    """The task waits (a limit, a busy forge, a lane still running): record why, say it only when it changed."""
    from agent.tasks import note_wait

    ctx.waiting = line
    if note_wait(ctx.ledger, ctx.task_id, line, ctx.token):
        ctx.say(line)
    raise Stop()


def _reject_round(ctx: Ctx, what: str, feedback: str) -> None:
    """A rejected round: next round with the feedback in the spec, or failed at the round cap."""
    started, rnd = start_next_round(ctx.ledger, ctx.task_id, feedback, claim_token=ctx.token)
    if started:
        ctx.lines.append(f"task {ctx.task_id} round {rnd - 1}: {what}")
    else:
        ctx.say(f"{what}; round cap reached, failed")
        raise Stop()


def _close(ctx: Ctx, key: str, evidence: str, source: str = "script") -> None:
    set_step(ctx.ledger, ctx.task_id, key, "ja", evidence, source=source, actor="script", claim_token=ctx.token)


# ---------------------------------------------------------------------------------------------- helpers


def _repo_config(ctx: Ctx) -> RepoConfig:
    t = ctx.task
    repo = ctx.config.repos.get(t["repo"])
    if repo is None:
        _block(ctx, f"{chain.CONFIG_BLOCK} repository {t['repo']} is not configured; add it under repos: in "
                    "config.yaml (the task goes on by itself once it is there)")
    return repo


def _error(ctx: Ctx) -> dict | None:
    t = ctx.task
    return ctx.ledger.one("SELECT * FROM errors WHERE id = ?", (t["error_id"],)) if t["error_id"] else None


def _brief(ctx: Ctx) -> str:
    t = ctx.task
    if t["conclusion_id"]:
        row = ctx.ledger.one("SELECT brief FROM conclusions WHERE id = ?", (t["conclusion_id"],))
        if row and row["brief"]:
            return row["brief"]
    return t["title"]


def _feedback(ctx: Ctx) -> list[str]:
    return [e["payload"].get("feedback", "") for e in ctx.ledger.events(task_id=ctx.task_id)
            if e["kind"] == "round.started" and e["payload"].get("feedback")]


def _lessons(ctx: Ctx, error: dict | None) -> list[str]:
    if not error:
        return []
    rows = ctx.ledger.all("SELECT text FROM lessons WHERE (service = ? OR fingerprint = ?) AND task_id IS NOT ? "
                          "ORDER BY id DESC LIMIT 5", (error["service"], error["fingerprint"], ctx.task_id))
    return [r["text"] for r in rows]


def _settings(ctx: Ctx):
    """The repository's .agent/config.yaml from the task's base commit (never from the worktree a lane wrote)."""
    from agent.config import load_repo_settings
    from agent.workspace import mirror_path

    t = ctx.task
    return load_repo_settings(mirror_path(ctx.home, t["repo"]), t["base_sha"]) if t["base_sha"] else None


def _check_command(ctx: Ctx, repo: RepoConfig) -> str | None:
    if repo.check:
        return repo.check
    settings = _settings(ctx)
    return settings.check if settings else None


def _blocked_paths(ctx: Ctx, repo: RepoConfig) -> tuple[str, ...]:
    settings = _settings(ctx)
    extra = settings.blocked_paths if settings else ()
    return tuple(dict.fromkeys(repo.blocked_paths + extra))


def _repo(ctx: Ctx):
    """Hardened git on the task's worktree, with its git dir taken from the mirror (agent.workspace.TaskGit)."""
    from agent.workspace import TaskGit, mirror_path

    t = ctx.task
    return TaskGit(t["worktree"], mirror_path(ctx.home, t["repo"]))


def _daily_cost(ledger: Ledger) -> float:
    since = (datetime.now(timezone.utc) - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%S")
    return ledger.scalar("SELECT coalesce(sum(cost_usd), 0) FROM lane_runs WHERE started_at >= ?", (since,)) or 0.0


def _usd(x: float) -> str:
    """$3, $0.25, $0.005: enough digits to tell a small budget from what was spent."""
    return "$" + f"{x:,.4f}".rstrip("0").rstrip(".")


def _check_budgets(ctx: Ctx) -> None:
    from agent.tasks import task_budget

    limits = ctx.config.limits
    spent, budget, since_reset = task_budget(ctx.ledger, ctx.task_id, limits.task_budget_usd)
    if spent >= budget:
        _block(ctx, f"{TASK_BUDGET_SPENT} ({_usd(spent)} of {_usd(budget)}{' since the last reset' if since_reset else ''}"
                    f"); `agent task reset {ctx.task_id} --reason ... --budget USD` lets it spend USD more "
                    "(or raise limits.task_budget_usd)")
    t = ctx.task
    started = datetime.strptime(t["created_at"][:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)
    if (datetime.now(timezone.utc) - started).total_seconds() > limits.task_wall_time:
        _block(ctx, f"task wall time {limits.task_wall_time}s exceeded")
    daily = _daily_cost(ctx.ledger)
    if daily >= limits.daily_budget_usd:
        daily_budget_reached(ctx.ledger, daily, limits.daily_budget_usd)  # once a day: the "budget" notification
        _wait(ctx, f"waiting: daily budget spent ({_usd(daily)} of {_usd(limits.daily_budget_usd)})")


def _require_lane(ctx: Ctx, role: str) -> None:
    """No lane for the role is a config problem: gate-block at once with the fix; it clears by itself once the
    config has the lane again (see ``lift_config_blocks``)."""
    from agent.lanes.lane import LaneNotConfigured, _lane_settings

    settings = _settings(ctx)
    try:
        _lane_settings(ctx.config, role, settings.lanes if settings else None, None)
    except LaneNotConfigured as exc:
        _block(ctx, f"{chain.CONFIG_BLOCK} {exc}; the task goes on by itself once it is there")


def _lane(ctx: Ctx, role: str, spec_path: Path, head: str | None):
    """Run one lane for this task (re-attaching the same attempt if an earlier run died in flight)."""
    from agent.fence import lease_keeper
    from agent.lanes.lane import run_lane
    from agent.proc import kill_group_if_same, same_process

    _require_lane(ctx, role)
    t = ctx.task
    settings = _settings(ctx)
    inflight = ctx.ledger.one("SELECT id, pid, pid_start, started_at FROM lane_runs WHERE task_id = ? AND round = ? "
                              "AND role = ? AND status = 'running' ORDER BY id DESC LIMIT 1",
                              (ctx.task_id, t["round"], role))
    if inflight and same_process(inflight["pid"], inflight["pid_start"]):
        # We hold the claim, so its worker is gone: the orphan's output is unreachable. Let it end (it may still
        # be editing the worktree), but not past its own timeout: then end its process group (pgid == pid).
        # A pid alone proves nothing (it may have been reused): only the recorded pid AND start time count.
        from agent.lanes.lane import _lane_settings

        timeout = _lane_settings(ctx.config, role, settings.lanes if settings else None, None)[2]
        started = datetime.strptime(inflight["started_at"][:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)
        if (datetime.now(timezone.utc) - started).total_seconds() <= timeout + 30:
            _wait(ctx, f"{role} lane still running (pid {inflight['pid']}); waiting")
        kill_group_if_same(inflight["pid"], inflight["pid_start"])
        with ctx.ledger.tx() as c:
            ctx.ledger.event(c, "lane.orphan_killed", "script", {"run_id": inflight["id"], "pid": inflight["pid"],
                                                                 "role": role, "timeout": timeout}, task_id=ctx.task_id)
        ctx.say(f"{role} lane (pid {inflight['pid']}) outlived its {timeout}s timeout; killed, running it again")
    if inflight and not inflight["pid"]:
        # killed before its child started (its manifest may not even be recorded): nothing to resume or to compare
        # against, so it is superseded and a fresh run starts (resuming it would be a false capability_drift)
        with ctx.ledger.tx() as c:
            ctx.ledger.update(c, "lane_runs", {"id": inflight["id"], "status": "running"},
                              {"status": "interrupted", "reason": "interrupted before its process started",
                               "ended_at": now()})
        inflight = None
    from agent.lanes.progress import LaneProgress

    with lease_keeper(ledger_path(ctx.home), ctx.task_id, ctx.token) if ctx.token else nullcontext(), \
            LaneProgress(f"task {ctx.task_id} {role}", force=None if ctx.progress else False) as progress:
        result = run_lane(config=ctx.config, home=ctx.home, role=role, spec_path=spec_path, cwd=Path(t["worktree"]),
                          ledger=ctx.ledger, task_id=ctx.task_id, error_id=t["error_id"], round=t["round"],
                          head_sha=head, repo_lanes=settings.lanes if settings else None,
                          claim_token=ctx.token, resume_run_id=inflight["id"] if inflight else None,
                          on_progress=progress)
    crashpoint("lane.finished")  # fault injection (tests): the run is recorded, its step not closed yet
    if STOP.is_set() and result.status not in ("complete", "partial", "blocked"):
        # the daemon's second signal killed it (or no report came while shutting down): not a verdict on the
        # work; mark the run interrupted so the next scan runs it again instead of failing or blocking the task
        with ctx.ledger.tx() as c:
            ctx.ledger.update(c, "lane_runs", {"id": result.run_id},
                              {"status": "interrupted", "reason": f"interrupted by shutdown ({result.status})"})
        ctx.say(f"{role} lane interrupted by shutdown; the next scan runs it again")
        raise Stop()
    return result


def _lane_outcome(ctx: Ctx, role: str, result) -> None:
    """The shared handling of a lane that did not produce a usable report."""
    from agent.lanes.lane import MIRROR_TAMPERED

    if result.status == "unavailable":
        _block(ctx, f"{role} lane unavailable ({result.vendor}): {result.reason or 'binary missing or auth refused'}")
    if result.status == "malformed":
        excerpt = _redact(result.excerpt or "")[-1500:]
        _fail(ctx, f"{role} report unparseable after {len(result.repairs)} repair turn(s): {result.reason}; "
                   f"output tail: {excerpt}")
    if result.status == "rejected" and (result.reason or "").startswith(MIRROR_TAMPERED):
        # the mirror is restored already; the round's work is not trusted (the next round starts afresh)
        _reject_round(ctx, f"{role} lane rejected: it changed git's config, hooks or .git ({result.vendor})",
                      f"The {role} lane changed git's own files ({_redact(result.reason or '')}); they were "
                      "restored. Never touch .git, hooks or git config.")
        raise Stop()
    if result.status == "rejected":
        _fail(ctx, f"{role} lane rejected: {result.reason}")


# ---------------------------------------------------------------------------------------------- steps


def step_spec_written(ctx: Ctx) -> None:
    from agent.spec import implementer_spec, write_spec

    t = ctx.task
    repo = _repo_config(ctx)
    error = _error(ctx)
    text = implementer_spec(t, error, _brief(ctx), _check_command(ctx, repo), _blocked_paths(ctx, repo),
                            [], _lessons(ctx, error))
    path = write_spec(ctx.home, ctx.task_id, f"round-{t['round']}", text)
    with ctx.ledger.tx() as c:
        ctx.ledger.update(c, "tasks", {"id": ctx.task_id}, {"spec_path": str(path), "updated_at": now()})
        ctx.ledger.event(c, "spec.written", "script", {"path": str(path), "round": t["round"]}, task_id=ctx.task_id)
    snap = snapshot(ctx.ledger, ctx.task_id)
    if not snap.from_conclusion:
        from agent.tasks import HUMAN_STEP_PENDING

        _block(ctx, f"{HUMAN_STEP_PENDING} spec_written; read {path}, then run "
                    f"`agent task close-step {ctx.task_id} spec_written --source human --evidence ...`")
    eid = (t["error_id"] or "")[:8]
    _close(ctx, "spec_written", f"auto spec from error.fix brief (error_id={eid}): {path}")


def _round_spec(ctx: Ctx) -> Path:
    """The implementer spec for the current round (round 1 is the one spec_written recorded)."""
    from agent.spec import implementer_spec, write_spec

    t = ctx.task
    path = Path(ctx.home) / "specs" / f"task-{ctx.task_id}" / f"round-{t['round']}.md"
    if path.exists():
        return path
    repo = _repo_config(ctx)
    error = _error(ctx)
    from agent.feedback import spec_findings

    text = implementer_spec(t, error, _brief(ctx), _check_command(ctx, repo), _blocked_paths(ctx, repo),
                            _feedback(ctx), _lessons(ctx, error),
                            pr_feedback=spec_findings(ctx.ledger, ctx.task_id))
    path = write_spec(ctx.home, ctx.task_id, f"round-{t['round']}", text)
    with ctx.ledger.tx() as c:
        ctx.ledger.update(c, "tasks", {"id": ctx.task_id}, {"spec_path": str(path), "updated_at": now()})
        ctx.ledger.event(c, "spec.written", "script", {"path": str(path), "round": t["round"]}, task_id=ctx.task_id)
    return path


def step_implementer_done(ctx: Ctx) -> None:
    _check_budgets(ctx)
    spec = _round_spec(ctx)
    result = _lane(ctx, "implementer", spec, ctx.task["head_sha"] or ctx.task["base_sha"])
    _lane_outcome(ctx, "implementer", result)
    if result.status == "complete":
        _close(ctx, "implementer_done", f"lane run #{result.run_id}: {(result.summary or '')[:300]}")
        return
    if result.status == "timeout":
        _reject_round(ctx, "implementer timed out", "The previous attempt timed out; make a smaller, focused change.")
    else:
        summary = _redact(result.summary or result.reason or "")
        _reject_round(ctx, f"implementer reported {result.status}",
                      f"The implementer reported STATUS: {result.status}: {summary}")


def _record_commit(ctx: Ctx, sha: str, parent: str | None, message: str) -> None:
    t = ctx.task
    with claimed_tx(ctx.ledger, ctx.task_id, ctx.token) as c:
        ctx.ledger.insert(c, "commits", {"task_id": ctx.task_id, "round": t["round"], "sha": sha, "parent": parent,
                                         "message": message, "created_at": now()})
        ctx.ledger.update(c, "tasks", {"id": ctx.task_id}, {"head_sha": sha, "updated_at": now()})
        ctx.ledger.event(c, "commit.recorded", "script", {"sha": sha, "round": t["round"]}, task_id=ctx.task_id)


def _push_task_ref(ctx: Ctx, sha: str) -> None:
    """Put the round's commit on the remote's hidden ref ``refs/agent/task-N`` before it is recorded, so a recorded
    commit is always reachable for any runner (DESIGN.md "Takeover"). A crash after the push and before the record
    leaves an unrecorded child of the head there, which the next commit step adopts (here or in another home).
    A ref that moved to a commit outside this history (another runner pushed) gate-blocks; a remote that cannot be
    reached now makes the task wait (the commit is adopted and pushed on the next scan)."""
    from agent.push import PushError, push_task_ref
    from agent.workspace import mirror_path, task_ref

    t = ctx.task
    repo_cfg = _repo_config(ctx)
    try:
        push_task_ref(mirror_path(ctx.home, t["repo"]), repo_cfg.url, ctx.task_id, sha, expected=t["head_sha"])
    except PushError as exc:
        if "refusing" in str(exc):
            _block(ctx, f"commit {sha[:12]} not recorded: {exc}")
        _wait(ctx, f"waiting: commit {sha[:12]} not recorded until it is on the remote as {task_ref(ctx.task_id)}: "
                   f"{exc}")
    crashpoint("commit.ref_pushed")


def step_committed(ctx: Ctx) -> None:
    from agent.workspace import unsafe_changes

    t = ctx.task
    repo_cfg = _repo_config(ctx)
    g = _repo(ctx)
    head = g.head()
    if head == t["head_sha"] and snapshot(ctx.ledger, ctx.task_id).committed_round:
        # a crash after the commit was recorded and before the step closed: close it, do not commit again
        _close(ctx, "committed", f"commit {head[:12]} (recorded before a crash)")
        return
    known = {r["sha"] for r in ctx.ledger.all("SELECT sha FROM commits WHERE task_id = ?", (ctx.task_id,))}
    previous = t["head_sha"] or t["base_sha"]
    if head not in known and head != previous:
        parents = g("rev-list", "--parents", "-n", "1", head).split()[1:]
        if parents and parents[0] == previous and not g("status", "--porcelain", "--untracked-files=all"):
            # a crash after `git commit` and before the ledger write: adopt that commit, do not commit again
            _push_task_ref(ctx, head)
            _record_commit(ctx, head, previous, g("log", "-1", "--format=%B", head) + "\n")
            _close(ctx, "committed", f"commit {head[:12]} (recovered after a crash)")
            return
    g("add", "-A")
    changes = g.staged_changes()
    changed = [c.path for c in changes]
    if not changed:
        _reject_round(ctx, "implementer made no change",
                      "The previous round changed no file. The fix needs a code change.")
        return
    blocked = [p for p in changed for b in _blocked_paths(ctx, repo_cfg) if p == b.rstrip("/") or p.startswith(b)]
    blocked += unsafe_changes(g, changes)
    if blocked:
        g("reset", "-q", "--hard", "HEAD")
        g("clean", "-fdq")
        shown = ", ".join(sorted(set(blocked)))
        _reject_round(ctx, f"touched blocked paths {shown}",
                      f"The previous round made blocked changes ({shown}); never touch these paths, never add "
                      "symlinks that point outside the repository and never add submodules.")
        return
    run = ctx.ledger.one("SELECT summary FROM lane_runs WHERE task_id = ? AND round = ? AND role = 'implementer' "
                         "AND status = 'complete' ORDER BY id DESC LIMIT 1", (ctx.task_id, t["round"]))
    summary = _redact((run or {}).get("summary") or t["title"]).strip()
    subject = summary.splitlines()[0] if summary else t["title"]
    subject = subject if len(subject) <= 72 else subject[:69].rstrip() + "..."
    message = f"{subject}\n\n{summary}\n\nagent task {ctx.task_id}, round {t['round']}\n"
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
    _close(ctx, "committed", f"commit {sha[:12]}: {subject}")


def step_local_check_pass(ctx: Ctx) -> None:
    from agent.fence import lease_keeper
    from agent.lanes.sandbox import check_argv
    from agent.proc import run

    t = ctx.task
    repo_cfg = _repo_config(ctx)
    command = _check_command(ctx, repo_cfg)
    if not command:
        _block(ctx, f"no check command for {t['repo']}; set repos.{t['repo']}.check or check: in the "
                    "repository's .agent/config.yaml")
    head = t["head_sha"]
    folder = Path(ctx.home) / "checks" / f"task-{ctx.task_id}"
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"round-{t['round']}-{head[:8]}.log"
    try:
        argv, env = check_argv(ctx.config, ctx.home, Path(t["worktree"]), command, folder / "sandbox")
    except AgentError as exc:
        _block(ctx, f"check not started: {exc}")
    with lease_keeper(ledger_path(ctx.home), ctx.task_id, ctx.token) if ctx.token else nullcontext():
        res = run(argv, cwd=Path(t["worktree"]), env=env, timeout=ctx.config.limits.check_timeout,
                  stdout_path=out, stderr_path=out.with_suffix(".err"))
    passed = res.status == "ok"
    if STOP.is_set() and not passed:  # killed by the daemon's second signal: run it again next scan
        ctx.say("check interrupted by shutdown; the next scan runs it again")
        raise Stop()
    _repo(ctx)("clean", "-fdq")  # what the check left behind must not be committed by the next round
    with claimed_tx(ctx.ledger, ctx.task_id, ctx.token) as c:
        ctx.ledger.insert(c, "checks", {"task_id": ctx.task_id, "round": t["round"], "command": command,
                                        "exit_code": res.exit_code, "passed": int(passed), "head_sha": head,
                                        "output_path": str(out), "duration_s": round(res.duration_s, 3),
                                        "created_at": now()})
        ctx.ledger.event(c, "check.recorded", "script", {"passed": passed, "exit_code": res.exit_code,
                                                          "head": head, "status": res.status}, task_id=ctx.task_id)
    if passed:
        _close(ctx, "local_check_pass", f"`{command}` passed at {head[:12]} in {res.duration_s:.1f}s")
        return
    tail = _redact(res.tail(2500))
    what = "timed out" if res.timed_out else f"exit {res.exit_code}"
    _reject_round(ctx, f"check failed ({what})", f"The check `{command}` failed ({what}) on the previous round's "
                                                f"commit. Its output ends with:\n{tail}")


def _diff(ctx: Ctx) -> str:
    t = ctx.task
    return _repo(ctx).diff(t["base_sha"], t["head_sha"])


def _record_gate(ctx: Ctx, result, stage: str, dimension: str, verdict: str) -> None:
    t = ctx.task
    with claimed_tx(ctx.ledger, ctx.task_id, ctx.token) as c:
        ctx.ledger.insert(c, "gates", {"task_id": ctx.task_id, "round": t["round"], "stage": stage,
                                       "dimension": dimension, "verdict": verdict,
                                       "findings_count": result.findings, "head_sha": t["head_sha"],
                                       "lane_run_id": result.run_id, "created_at": now()})
        ctx.ledger.event(c, "gate.recorded", "lane", {"stage": stage, "dimension": dimension, "verdict": verdict,
                                                      "findings": result.findings, "head": t["head_sha"],
                                                      "lane_run_id": result.run_id}, task_id=ctx.task_id)


def _review_spec(ctx: Ctx, dimension: str) -> Path:
    from agent.spec import reviewer_spec, write_spec

    t = ctx.task
    spec_text = _round_spec(ctx).read_text(encoding="utf-8")   # this home's copy (another runner may have written it)
    check = ctx.ledger.one("SELECT command, exit_code FROM checks WHERE task_id = ? AND head_sha = ? AND passed = 1 "
                           "ORDER BY id DESC LIMIT 1", (ctx.task_id, t["head_sha"]))
    summary = f"`{check['command']}` passed (exit {check['exit_code']})" if check else None
    text = reviewer_spec(spec_text, _diff(ctx), summary, dimension)
    return write_spec(ctx.home, ctx.task_id, f"review-{dimension}-round-{t['round']}", text)


def step_reviewer_approved(ctx: Ctx) -> None:
    from agent.lanes.report import verdict

    _check_budgets(ctx)
    t = ctx.task
    result = _lane(ctx, "reviewer", _review_spec(ctx, "code"), t["head_sha"])
    _lane_outcome(ctx, "reviewer", result)
    if result.status == "timeout":
        _reject_round(ctx, "reviewer timed out", "The review timed out; keep the change small and easy to review.")
        return
    v = verdict(result.report)
    _record_gate(ctx, result, "review", "code", v or "reject")
    if v == "approve":
        _close(ctx, "reviewer_approved", f"lane run #{result.run_id}: approved {t['head_sha'][:12]}")
        return
    n = result.findings or 0
    _reject_round(ctx, f"reviewer rejected, {n} finding{'s' if n != 1 else ''}",
                  f"The reviewer rejected the previous round (STATUS: {result.status}). Findings:\n"
                  f"{_redact(result.findings_text or result.summary or '')}")


def step_pushed(ctx: Ctx) -> None:
    from agent.forge import ForgeAuthError
    from agent.push import push_branch

    t = ctx.task
    repo_cfg = _repo_config(ctx)
    try:
        res = push_branch(Path(t["worktree"]), repo_cfg.url, t["branch"], t["base"], repo_cfg.branch_prefix,
                          expected_remote_sha=t["pushed_sha"])
    except ForgeAuthError as exc:
        _block(ctx, f"push refused: {exc}")
    crashpoint("push.done")
    with claimed_tx(ctx.ledger, ctx.task_id, ctx.token) as c:
        ctx.ledger.update(c, "tasks", {"id": ctx.task_id}, {"pushed_sha": res.sha, "updated_at": now()})
        ctx.ledger.event(c, "branch.pushed", "script", {"sha": res.sha, "pushed": res.pushed, "forced": res.forced,
                                                        "branch": t["branch"]}, task_id=ctx.task_id)
    _close(ctx, "pushed", f"{t['branch']} at {res.sha[:12]}" + ("" if res.pushed else " (already on the remote)"))


def _pr_limits_reached(ctx: Ctx, repo: str) -> str | None:
    limits = ctx.config.limits
    open_drafts = ctx.ledger.scalar("SELECT count(*) FROM prs WHERE repo = ? AND state = 'open' AND task_id != ?",
                                    (repo, ctx.task_id))
    if open_drafts >= limits.open_drafts_per_repo:
        return f"{open_drafts} open drafts in {repo} (limits.open_drafts_per_repo={limits.open_drafts_per_repo})"
    since = (datetime.now(timezone.utc) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S")
    recent = ctx.ledger.scalar("SELECT count(*) FROM prs WHERE created_at >= ?", (since,))
    if recent >= limits.prs_per_hour:
        return f"{recent} PRs opened in the last hour (limits.prs_per_hour={limits.prs_per_hour})"
    return None


def _publish(ctx: Ctx):
    """Create or update the task's draft PR with the current text (found by head after a crash, never twice)."""
    from agent.forge import get_forge, publish_pr
    from agent.pr import pr_data_from_ledger, render_pr

    t = ctx.task
    title, body = render_pr(pr_data_from_ledger(ctx.ledger, ctx.task_id))
    forge = get_forge(_repo_config(ctx), ctx.config, ctx.home, ledger=ctx.ledger)
    with claimed_tx(ctx.ledger, ctx.task_id, ctx.token):  # a worker that lost its claim must not touch the PR
        pass
    return publish_pr(ctx.ledger, forge, ctx.task_id, t["branch"], t["base"], title, body, t["head_sha"])


def step_pr_opened(ctx: Ctx) -> None:
    from agent.forge import ForgeAuthError, ForgeError, ForgeRateLimited, ForgeTransient

    t = ctx.task
    if ctx.ledger.one("SELECT 1 FROM prs WHERE task_id = ?", (ctx.task_id,)) is None:
        why = _pr_limits_reached(ctx, t["repo"])
        if why:
            _wait(ctx, f"waiting to open a PR: {why}")
    try:
        pr, action = _publish(ctx)
    except ForgeAuthError as exc:
        _block(ctx, f"forge refused: {exc}")
    except (ForgeRateLimited, ForgeTransient) as exc:
        _wait(ctx, f"forge busy, will retry next scan: {exc}")
    except ForgeError as exc:  # e.g. a PR on our branch that we may not adopt: a human decides
        _block(ctx, f"forge: {exc}")
    _close(ctx, "pr_opened", f"draft PR {pr.url} at {t['head_sha'][:12]} ({action})")
    ctx.say(f"draft PR {action}: {pr.url}")


def step_pr_reviews(ctx: Ctx) -> None:
    """The PR quality and logic reviewers run in parallel on the pushed head."""
    from agent.lanes.report import verdict

    _check_budgets(ctx)
    t = ctx.task
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
            _fail(ctx, f"pr-{d} lane crashed; see the lane logs")
        _lane_outcome(ctx, f"pr-{d}", result)
        if result.status == "timeout":
            rejected.append(f"PR {d} review timed out")
            continue
        v = verdict(result.report)
        _record_gate(ctx, result, "pr", d, v or "reject")
        if v == "approve":
            _close(ctx, f"pr_{d}_approved", f"lane run #{result.run_id}: approved {t['head_sha'][:12]}")
        else:
            rejected.append(f"PR {d} reviewer ({result.findings or 0} findings):\n"
                            f"{_redact(result.findings_text or result.summary or '')}")
    if stopped:
        raise Stop()
    if raised:
        # what went wrong in a reviewer thread is handled here, on the task's own thread: a one-line AgentError
        # (a config error: unknown vendor, no lane for the role; no lane ran) gate-blocks the task with that
        # reason for a human; anything else goes the way of any unexpected error in a step
        d = next(d for d in todo if d in raised)
        if isinstance(raised[d], AgentError) and not isinstance(raised[d], (ClaimLost, Refused)):
            _block(ctx, f"pr-{d} lane not started: {raised[d]}")
        raise raised[d]
    if rejected:
        n = len(rejected)
        _reject_round(ctx, f"PR review rejected ({n} reviewer{'s' if n > 1 else ''})", "\n\n".join(rejected))


def _finish(ctx: Ctx) -> None:
    from agent.forge import ForgeError

    try:  # the PR body gets the PR reviewers' verdicts too
        _publish(ctx)
    except ForgeError as exc:  # owed to the forge: `watch pr-merged` retries it on later scans until it lands
        from agent.followup import owe_pr_text

        owe_pr_text(ctx.ledger, ctx.task_id, str(exc))
        ctx.lines.append(f"task {ctx.task_id}: PR text not refreshed ({exc}); later scans retry it")
    t = ctx.task
    with claimed_tx(ctx.ledger, ctx.task_id, ctx.token) as c:
        lesson = c.execute("SELECT lesson FROM lane_runs WHERE task_id = ? AND role = 'implementer' AND "
                           "status = 'complete' AND lesson IS NOT NULL AND lesson != '' ORDER BY id DESC LIMIT 1",
                           (ctx.task_id,)).fetchone()
        error = c.execute("SELECT service, fingerprint FROM errors WHERE id = ?", (t["error_id"],)).fetchone() \
            if t["error_id"] else None
        if lesson and not c.execute("SELECT 1 FROM lessons WHERE task_id = ?", (ctx.task_id,)).fetchone():
            ctx.ledger.insert(c, "lessons", {"service": error[0] if error else None,
                                             "fingerprint": error[1] if error else None,
                                             "text": _redact(lesson[0])[:500], "task_id": ctx.task_id,
                                             "created_at": now()})
        transition_in(ctx.ledger, c, ctx.task_id, t["state"], chain.DONE, "script",
                    f"all reviewers approved {t['head_sha'][:12]}")
    ctx.say(f"done: all reviewers approved {t['head_sha'][:12]}")
    _reply_on_pr(ctx)


def _reply_on_pr(ctx: Ctx) -> None:
    """A round started by PR feedback replies once on the PR when it is done (else `watch pr-feedback` retries)."""
    from agent.feedback import post_owed_replies
    from agent.forge import ForgeError, get_forge

    if not ctx.ledger.owed_replies(ctx.task_id):
        return
    try:
        forge = get_forge(_repo_config(ctx), ctx.config, ctx.home, ledger=ctx.ledger)
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


def _ensure_workspace(ctx: Ctx) -> None:
    """Make sure the task has a working worktree in this runner's home: made once, made again when it (or the whole
    mirror) was deleted, and rebuilt when another runner's home advanced the task last (a takeover). A rebuilt
    worktree starts at the task's last recorded commit, fetched from the remote's hidden ref ``refs/agent/task-N``
    (DESIGN.md "Takeover"). A failure is an event; ``limits.workspace_failures`` in a row gate-block the task with
    git's first error line and the fix."""
    import os
    import shutil

    from agent.workspace import (WorkspaceError, branch_name, ensure_worktree, intact, mirror_lock, mirror_path,
                                 own_worktree, remove_worktree)

    t = ctx.task
    own = own_worktree(ctx.home, ctx.task_id)
    mirror = mirror_path(ctx.home, t["repo"])
    # the worktree the ledger names lives in another runner's home: that runner advanced the task last (and may be
    # dead); its folder is never touched from here
    foreign = bool(t["worktree"]) and os.path.realpath(t["worktree"]) != os.path.realpath(own)
    lost = bool(t["worktree"])  # it had a workspace: anything we make now replaces a lost one
    if not foreign and t["worktree"] and own.exists():
        if intact(own, mirror):
            return
        # the mirror was deleted (or the worktree's link into it): the folder is no git worktree any more and
        # every git command in it fails; what it held is unreachable without its git data, so it goes
        shutil.rmtree(own, ignore_errors=True)
    repo = _repo_config(ctx)
    branch = t["branch"] or branch_name(repo.branch_prefix, t["error_id"], ctx.task_id)
    start_at = None
    try:
        with mirror_lock(ctx.home, t["repo"]):   # the other --jobs threads of this runner use the same mirror
            if lost:
                start_at = _rebuild_point(ctx, repo)
                if foreign and start_at is None and own.exists():
                    remove_worktree(mirror, own)   # this home's own old worktree of the task is stale: made again
            ws = ensure_worktree(ctx.home, t["repo"], repo.url, t["base"] or repo.base, branch, ctx.task_id,
                                 start_at=start_at)
    except WorkspaceError as exc:
        _workspace_failed(ctx, str(exc))
    from agent.workspace import has_commit

    # the ledger never keeps a commit the repository lacks: a base that a re-cloned mirror no longer has is replaced
    base_sha = t["base_sha"] if has_commit(ws.mirror, t["base_sha"]) else ws.base_sha
    with claimed_tx(ctx.ledger, ctx.task_id, ctx.token) as c:
        ctx.ledger.update(c, "tasks", {"id": ctx.task_id}, {
            "worktree": str(ws.path), "branch": ws.branch, "base_sha": base_sha, "updated_at": now()})
        ctx.ledger.event(c, "workspace.ready", "script", {"path": str(ws.path), "branch": ws.branch,
                                                         "created": ws.created, "replaced_lost": lost and ws.created,
                                                         "start_at": start_at},
                         task_id=ctx.task_id)
        if foreign:
            interrupted = _interrupt_foreign_lanes(ctx, c)
            ctx.ledger.event(c, "task.taken_over", "script", {"from_worktree": t["worktree"], "to": str(ws.path),
                                                              "head": t["head_sha"], "start_at": start_at,
                                                              "interrupted_runs": interrupted},
                             task_id=ctx.task_id)
        if t["base_sha"] and base_sha != t["base_sha"]:
            ctx.ledger.event(c, "workspace.base_replaced", "script", {"old": t["base_sha"], "new": base_sha},
                             task_id=ctx.task_id)
    if foreign:
        ctx.say(f"taken over from {Path(t['worktree']).parent.parent}: worktree rebuilt at "
                f"{(start_at or 'the pushed branch or base')[:12]}")
    if lost and ws.created:
        _reconcile_lost_work(ctx, ws)


def _rebuild_point(ctx: Ctx, repo) -> str | None:
    """The commit a rebuilt worktree starts at: the task's last recorded commit (its head, else its base), fetched
    from the remote's hidden ref; or that ref's tip when it is an unrecorded child of it (pushed, then the runner
    died before recording it: the commit step adopts it). None when the mirror cannot have the recorded head (a
    task from before hidden refs): the old way then (the local or pushed branch, else the base) and the lost
    round starts again."""
    from agent.workspace import (GitError, WorkspaceError, ensure_mirror, fetch_task_ref, has_commit, parent_of,
                                 git_error_line)

    t = ctx.task
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


def _interrupt_foreign_lanes(ctx: Ctx, c) -> list[int]:
    """Lane runs of this task left ``running`` by another runner's home (it died or lost its claim): marked
    ``interrupted``, so the step runs its lane again here. The only case in which a (task, round, role) lane
    launches twice; their vendor sessions live in that other home, so nothing is resumed."""
    own_lanes = str(Path(ctx.home).resolve() / "lanes") + "/"
    rows = c.execute("SELECT id, log_dir FROM lane_runs WHERE task_id = ? AND status = 'running'",
                     (ctx.task_id,)).fetchall()
    ids = [r[0] for r in rows if not (r[1] or "").startswith(own_lanes)]
    for run_id in ids:
        ctx.ledger.update(c, "lane_runs", {"id": run_id, "status": "running"},
                          {"status": "interrupted", "reason": "its runner stopped; the task was taken over",
                           "ended_at": now()})
    return ids


def _reconcile_lost_work(ctx: Ctx, ws) -> None:
    """The worktree was made again (its folder or the whole mirror was deleted). If the round's work did not
    survive (an unpushed commit, or edits not yet committed), the ledger must not go on from it: the round starts
    again from what the repository still has (the pushed head, else the base), without counting against the cap."""
    from agent.workspace import TaskGit, has_commit

    from agent.workspace import parent_of

    t = ctx.task
    head = TaskGit(ws.path, ws.mirror).head()
    snap = snapshot(ctx.ledger, ctx.task_id)
    done_this_round = [k for k in chain.ROUND_STEPS if snap.steps.get(k) in chain.CLOSED]
    uncommitted = "implementer_done" in done_this_round and "committed" not in done_this_round \
        and not (snap.committed_round and t["head_sha"] == head)   # a recorded commit whose step is not closed yet
    if not uncommitted and (t["head_sha"] == head or (t["head_sha"] is None and not done_this_round)):
        return  # nothing was lost: the recorded head is what the new worktree holds
    known = {r["sha"] for r in ctx.ledger.all("SELECT sha FROM commits WHERE task_id = ?", (ctx.task_id,))}
    if uncommitted and head not in known and parent_of(ws.mirror, head) == (t["head_sha"] or t["base_sha"]):
        return  # the round's commit was pushed to the task's ref before its runner died: the commit step adopts it
    new_head = head if head in known else None
    pushed = t["pushed_sha"] if has_commit(ws.mirror, t["pushed_sha"]) else None
    lost = t["head_sha"][:12] if t["head_sha"] and t["head_sha"] != head else "the uncommitted edits"
    source = "the last recorded commit" if new_head else "the base"
    gone = [r for r in ctx.ledger.all("SELECT id, sha, round FROM commits WHERE task_id = ? ORDER BY id",
                                      (ctx.task_id,)) if not has_commit(ws.mirror, r["sha"])]
    if gone:  # commits the repository no longer has leave the commits table; the events keep their history
        with claimed_tx(ctx.ledger, ctx.task_id, ctx.token) as c:
            for r in gone:
                ctx.ledger.delete(c, "commits", {"id": r["id"]})
                ctx.ledger.event(c, "commit.lost", "script", {"sha": r["sha"], "round": r["round"]},
                                 task_id=ctx.task_id)
    _, rnd = start_next_round(ctx.ledger, ctx.task_id,
                              f"The workspace was lost and made again from {source}; the previous round's work "
                              f"({lost}) is gone. Make the change again.", claim_token=ctx.token, free=True,
                              head_sha=new_head, pushed_sha=pushed)
    ctx.say(f"workspace made again; {lost} was lost, round {rnd} starts from {source} "
            "(not counted against the round cap)")


def _workspace_failed(ctx: Ctx, error: str) -> None:
    """One workspace failure: an event; the Nth in a row (limits.workspace_failures) gate-blocks the task."""
    limit = ctx.config.limits.workspace_failures
    error = _redact(error)[:600]
    with claimed_tx(ctx.ledger, ctx.task_id, ctx.token) as c:
        ctx.ledger.event(c, "workspace.failed", "script", {"error": error}, task_id=ctx.task_id)
        streak = ctx.ledger.event_streak(c, ctx.task_id, "workspace.failed", ("workspace.ready", "task.reset"))
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


def _clear_stale_git_locks(ctx: Ctx) -> None:
    """A kill during a git command leaves ``index.lock``/``HEAD.lock`` in the task's worktree git dir, and every
    later git command there fails. We hold the task's claim and the worktree is the task's own, so no live git
    process of ours is using it: remove them (with an event)."""
    t = ctx.task
    if not t["worktree"] or not Path(t["worktree"]).exists():
        return
    try:
        git_dir = Path(_repo(ctx).git_dir)   # from the mirror's records, not the worktree's .git file
    except Exception:
        return
    for name in ("index.lock", "HEAD.lock"):
        lock = git_dir / name
        if lock.exists():
            lock.unlink(missing_ok=True)
            with ctx.ledger.tx() as c:
                ctx.ledger.event(c, "workspace.stale_lock_removed", "script", {"path": str(lock)},
                                 task_id=ctx.task_id)
            ctx.say(f"removed stale {name} left by a killed git command")


MAX_UNEXPECTED = 3


def _record_unexpected(ledger: Ledger, task_id: int, token: str | None, error: str) -> None:
    """Record an unexpected error; the third in a row without progress gate-blocks the task for a human."""
    with claimed_tx(ledger, task_id, token) as c:
        ledger.event(c, "task.error", "script", {"error": _redact(error)[:1000]}, task_id=task_id)
        streak = ledger.event_streak(c, task_id, "task.error", ("step.closed", "round.started", "task.reset"))
        state = get_task(ledger, task_id, c)["state"]
        if streak >= MAX_UNEXPECTED and state in (chain.OPEN, chain.WORKING):
            transition_in(ledger, c, task_id, state, chain.BLOCKED, "script",
                        f"unexpected error {streak} times in a row: {_redact(error)[:300]}")


def advance(home: Path, config: Config, task_id: int, max_steps: int = 100, progress: bool = False) -> list[str]:
    """Drive one task as far as it can go now. Opens its own ledger connection; never raises for a task problem."""
    from agent.fence import claim, release

    ledger = Ledger.open(ledger_path(home), create=False)
    ctx = Ctx(home, config, ledger, task_id, progress=progress)
    token = None
    try:
        token = claim(ledger, task_id)
        if token is None:
            return [f"task {task_id}: claimed by another worker; skipped"]
        ctx.token = token
        if ctx.task["state"] not in (chain.OPEN, chain.WORKING):
            return []
        _ensure_workspace(ctx)
        _clear_stale_git_locks(ctx)
        for _ in range(max_steps):
            if STOP.is_set():
                ctx.say("stopping: shutdown requested")
                break
            t = ctx.task
            if t["state"] not in (chain.OPEN, chain.WORKING):
                break
            snap = snapshot(ledger, task_id)
            todo = chain.next_steps(snap)
            if not todo:
                if chain.all_closed(snap):
                    _finish(ctx)
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
                if ledger.scalar("SELECT wait_reason FROM tasks WHERE id = ?", (task_id,)) is not None:
                    from agent.tasks import note_wait

                    note_wait(ledger, task_id, None, token)
            except Exception:
                pass
        if token:
            try:
                release(ledger, task_id, token)
            except Exception:
                pass
        ledger.close()
    return ctx.lines


def lift_config_blocks(ledger: Ledger, home: Path, config: Config, blocked: list[dict]) -> list[dict]:
    """Tasks gate-blocked by the config (repository not configured, no lane for a role; ``blocked`` from
    ``tasks.config_blocked_tasks``) go back to work, with an event, once the config has what they need again."""
    from agent.config import task_gaps
    from agent.tasks import lift_config_block

    items = []
    for t in blocked:
        if task_gaps(config, home, t):
            continue
        if lift_config_block(ledger, t["id"], "the config has what it needs again"):
            items.append({"task_id": t["id"], "line": f"task {t['id']}: config fixed, back to work "
                                                      f"(was: {t['blocked_reason']})"})
    return items


def work_scan(app, jobs: int = 1) -> list[dict]:
    """`agent watch error-fix-work`: advance every open or working task, up to ``jobs`` at once (first putting
    back to work the tasks whose config block the config no longer causes)."""
    from agent.tasks import config_blocked_tasks

    blocked = config_blocked_tasks(app.ledger)  # the config is loaded only when there is something to check
    lifted = lift_config_blocks(app.ledger, app.home, app.config, blocked) if blocked else []
    ids = [r["id"] for r in app.ledger.all("SELECT id FROM tasks WHERE state IN ('open', 'working') ORDER BY id")]
    if not ids:
        return lifted
    config = app.config

    def one(task_id: int) -> dict:
        if STOP.is_set():
            return {"task_id": task_id, "line": f"task {task_id}: not started: shutting down"}
        lines = advance(app.home, config, task_id, progress=jobs <= 1)
        t = app_task_state(app.home, task_id)
        # nothing to say (no progress, the same wait as last time): quiet, so a cron tick mails only news
        return {"task_id": task_id, "state": t["state"], "round": t["round"], "lines": lines,
                "line": "\n".join(lines) if lines else f"task {task_id}: no progress possible now",
                **({} if lines else {"quiet": True})}

    if jobs <= 1 or len(ids) == 1:
        return lifted + [one(i) for i in ids]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return lifted + list(pool.map(one, ids))


def app_task_state(home: Path, task_id: int) -> dict:
    led = Ledger.open(ledger_path(home), create=False)
    try:
        return led.one("SELECT state, round FROM tasks WHERE id = ?", (task_id,)) or {"state": "?", "round": 0}
    finally:
        led.close()


# ---------------------------------------------------------------------------------------------- error-fix


def fix_scan(app, jobs: int = 1) -> list[dict]:
    """`agent watch error-fix`: every confirmed error.fix conclusion without a task gets one, with its workspace."""
    ledger, config = app.ledger, app.config
    rows = ledger.all("SELECT c.id AS conclusion_id, c.error_id, e.service, e.class, e.message, e.repo, e.state "
                      "FROM conclusions c JOIN errors e ON e.id = c.error_id "
                      "LEFT JOIN tasks t ON t.error_id = c.error_id "
                      "WHERE c.kind = 'fix' AND t.id IS NULL AND e.state IN ('open', 'fixing') ORDER BY c.id")
    items = []
    for r in rows:
        if STOP.is_set():  # SIGINT/SIGTERM: the workspace being made is finished, no new one is started
            break
        repo = config.repo_for_service(r["service"]) or config.repos.get(r["repo"] or "")
        if repo is None:
            items.append({"error_id": r["error_id"], "line": f"error {r['error_id'][:8]}: no repository configured "
                          f"for service {r['service']!r}; add it to repos.<name>.services"})
            continue
        title = f"Fix {r['class'] or 'error'} in {r['service']}"
        if r["message"]:
            title += f": {r['message'].splitlines()[0]}"
        from agent.tasks import create_task
        from agent.workspace import branch_name

        task_id, created = create_task(ledger, repo.name, title[:200], error_id=r["error_id"],
                                       conclusion_id=r["conclusion_id"], base=repo.base,
                                       round_cap=config.limits.round_cap, actor="script")
        with ledger.tx() as c:
            if c.execute("SELECT branch FROM tasks WHERE id = ?", (task_id,)).fetchone()[0] is None:
                ledger.update(c, "tasks", {"id": task_id},
                              {"branch": branch_name(repo.branch_prefix, r["error_id"], task_id)})
            if r["state"] == "open":
                ledger.update(c, "errors", {"id": r["error_id"]}, {"state": "fixing"})
                ledger.event(c, "error.state", "script", {"from": "open", "to": "fixing", "task_id": task_id},
                             error_id=r["error_id"])
        lines = advance_workspace_only(app.home, config, task_id)
        items.append({"task_id": task_id, "error_id": r["error_id"], "created": created,
                      "line": f"task {task_id} {'created' if created else 'found'} for error {r['error_id'][:8]}"
                              + (f"; {lines}" if lines else "")})
    return items


def advance_workspace_only(home: Path, config: Config, task_id: int) -> str:
    """Prepare the task's workspace now (so `watch error-fix` leaves it ready); errors are retried later."""
    ledger = Ledger.open(ledger_path(home), create=False)
    ctx = Ctx(home, config, ledger, task_id)
    try:
        if ctx.task["worktree"]:  # prepared already (maybe in another runner's home): the work scan, under the
            return f"worktree {ctx.task['worktree']}"   # task's claim, is what takes a task over
        _ensure_workspace(ctx)
        return f"worktree {ctx.task['worktree']}"
    except Stop:
        return "; ".join(ctx.lines)
    finally:
        ledger.close()
