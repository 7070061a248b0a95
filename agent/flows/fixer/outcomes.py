"""How a step ends, in a leaf the step handlers, the limits and the driver share: ``Ctx`` (everything one worker
needs to advance one task) and the outcomes ``block``, ``fail``, ``wait`` (each raises ``Stop``), ``reject_round``
and ``close_step`` (through the one guard, ``tasks.set_step``). It imports nothing of the fixer."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from agent.domain import chain
from agent.ledger import Ledger
from agent.ledger.tasks import get_task, set_step, start_next_round, transition

if TYPE_CHECKING:  # a no-op cron tick (no open task) must not pay for the config module
    from agent.config import Config, RepoConfig
    from agent.coord.claims import Claim


@dataclass
class Ctx:
    """Everything one worker needs to advance one task; one Ledger connection per worker thread."""
    home: Path
    config: Config
    ledger: Ledger
    task_id: int
    token: str | None = None
    claim: Claim | None = None           # the claim advance took: its fencing token and whom it took the task from
    lines: list[str] = field(default_factory=list)
    progress: bool = False               # show a live line (elapsed, last output) while a lane runs, on a TTY
    waiting: str | None = None           # why this pass stopped to wait (recorded as tasks.wait_reason)

    def load_task(self) -> dict:
        """The task's row, read from the ledger now (each call is a query: keep the row while it is current)."""
        return get_task(self.ledger, self.task_id)

    def say(self, text: str) -> None:
        t = self.load_task()
        self.lines.append(f"task {self.task_id} round {t['round']}: {text}")


class Stop(Exception):
    """Stop advancing this task for now (blocked, failed, waiting or done); the message says why."""


def redact_text(text: str) -> str:
    """Text that came from an error or a lane, as it may be stored or shown: redacted, escape sequences removed."""
    from agent.infra.redact import redact
    from agent.infra.text import strip_controls

    return strip_controls(redact(text or ""))


def block(ctx: Ctx, reason: str) -> None:
    transition(ctx.ledger, ctx.task_id, chain.BLOCKED, "script", reason, claim_token=ctx.token)
    ctx.say(f"gate-blocked: {reason}")
    raise Stop()


def fail(ctx: Ctx, reason: str) -> None:
    transition(ctx.ledger, ctx.task_id, chain.FAILED, "script", reason, claim_token=ctx.token)
    ctx.say(f"failed: {reason}")
    raise Stop()


def wait(ctx: Ctx, line: str) -> None:
    """The task waits (a limit, a busy forge, a lane still running): record why, say it only when it changed."""
    from agent.ledger.tasks import note_wait

    ctx.waiting = line
    if note_wait(ctx.ledger, ctx.task_id, line, ctx.token):
        ctx.say(line)
    raise Stop()


def reject_round(ctx: Ctx, what: str, feedback: str) -> None:
    """A rejected round: next round with the feedback in the spec, or failed at the round cap."""
    started, rnd = start_next_round(ctx.ledger, ctx.task_id, feedback, claim_token=ctx.token)
    if started:
        ctx.lines.append(f"task {ctx.task_id} round {rnd - 1}: {what}")
    else:
        ctx.say(f"{what}; round cap reached, failed")
        raise Stop()


def close_step(ctx: Ctx, key: str, evidence: str, source: str = "script") -> None:
    set_step(ctx.ledger, ctx.task_id, key, chain.StepStatus.DONE, evidence, source=source, actor="script", claim_token=ctx.token)


def repo_config(ctx: Ctx) -> RepoConfig:
    t = ctx.load_task()
    repo = ctx.config.repos.get(t["repo"])
    if repo is None:
        block(ctx, f"{chain.CONFIG_BLOCK} repository {t['repo']} is not configured; add it under repos: in "
                    "config.yaml (the task goes on by itself once it is there)")
    return repo


def repo_settings(ctx: Ctx):
    """The repository's .agent/config.yaml from the task's base commit (never from the worktree a lane wrote)."""
    from agent.config.repo import load_repo_settings
    from agent.git.workspace import mirror_path

    t = ctx.load_task()
    return load_repo_settings(mirror_path(ctx.home, t["repo"]), t["base_sha"]) if t["base_sha"] else None


def task_git(ctx: Ctx):
    """Hardened git on the task's worktree, with its git dir taken from the mirror (agent.git.workspace.TaskGit)."""
    from agent.git.workspace import TaskGit, mirror_path

    t = ctx.load_task()
    return TaskGit(t["worktree"], mirror_path(ctx.home, t["repo"]))
