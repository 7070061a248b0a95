"""The fixer's limits: a task's budget and wall time (gate-block), the daily budget, open drafts per repository
and PRs per hour (the task waits; a line says why, nothing is dropped)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from agent.fixer.driver import Ctx, block, wait
from agent.ledger import Ledger
from agent.ledger.lanes import cost_since
from agent.ledger.prs import open_drafts as open_drafts_in, prs_opened_since
from agent.ledger.outbox import TASK_BUDGET_SPENT, daily_budget_reached


def daily_cost(ledger: Ledger) -> float:
    since = (datetime.now(timezone.utc) - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%S")
    return cost_since(ledger, since)


def usd(x: float) -> str:
    """$3, $0.25, $0.005: enough digits to tell a small budget from what was spent."""
    return "$" + f"{x:,.4f}".rstrip("0").rstrip(".")


def check_budgets(ctx: Ctx) -> None:
    from agent.tasks import task_budget

    limits = ctx.config.limits
    spent, budget, since_reset = task_budget(ctx.ledger, ctx.task_id, limits.task_budget_usd)
    if spent >= budget:
        block(ctx, f"{TASK_BUDGET_SPENT} ({usd(spent)} of {usd(budget)}{' since the last reset' if since_reset else ''}"
                    f"); `agent task reset {ctx.task_id} --reason ... --budget USD` lets it spend USD more "
                    "(or raise limits.task_budget_usd)")
    t = ctx.task
    started = datetime.strptime(t["created_at"][:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)
    if (datetime.now(timezone.utc) - started).total_seconds() > limits.task_wall_time:
        block(ctx, f"task wall time {limits.task_wall_time}s exceeded")
    daily = daily_cost(ctx.ledger)
    if daily >= limits.daily_budget_usd:
        daily_budget_reached(ctx.ledger, daily, limits.daily_budget_usd)  # once a day: the "budget" notification
        wait(ctx, f"waiting: daily budget spent ({usd(daily)} of {usd(limits.daily_budget_usd)})")


PR_OPEN_LEASE = "pr-open"   # held across runners around the PR limits' check and the PR create (steps.step_pr_opened)
PR_OPEN_LEASE_S = 60.0
PR_OPEN_WAIT_S = 10.0      # how long a runner waits for another runner's PR create before it waits a tick


def pr_limits_reached(ctx: Ctx, repo: str) -> str | None:
    limits = ctx.config.limits
    open_drafts = open_drafts_in(ctx.ledger, repo, ctx.task_id)
    if open_drafts >= limits.open_drafts_per_repo:
        return f"{open_drafts} open drafts in {repo} (limits.open_drafts_per_repo={limits.open_drafts_per_repo})"
    since = (datetime.now(timezone.utc) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S")
    recent = prs_opened_since(ctx.ledger, since)
    if recent >= limits.prs_per_hour:
        return f"{recent} PRs opened in the last hour (limits.prs_per_hour={limits.prs_per_hour})"
    return None
