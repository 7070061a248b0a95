"""The fixer's limits: a task's budget and wall time (gate-block), the daily budget, open drafts per repository
and PRs per hour (the task waits; a line says why, nothing is dropped)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from agent.domain.budget import daily_wait_line, day_start, usd
from agent.flows.fixer.outcomes import Ctx, block, wait
from agent.ledger.lanes import BudgetRefused, DailyBudget, daily_spend_since
from agent.ledger.prs import open_drafts as open_drafts_in, prs_opened_since
from agent.ledger.outbox import TASK_BUDGET_SPENT, daily_budget_reached


def lane_budget(ctx: Ctx) -> DailyBudget:
    """What a fixer lane checks and reserves when it is recorded ``running`` (``ledger.lanes.start_run``): the
    daily limit, its window, and the estimate for a lane without history: what is left of the task's budget."""
    from agent.ledger.tasks import task_budget

    limits = ctx.config.limits
    spent, budget, _ = task_budget(ctx.ledger, ctx.task_id, limits.task_budget_usd)
    return DailyBudget(limit_usd=limits.daily_budget_usd, since=day_start(), fallback_usd=max(0.0, budget - spent))


def budget_refused(ctx: Ctx, role: str, exc: BudgetRefused) -> None:
    """The lane did not fit in the daily budget (checked atomically with its launch): the task waits."""
    if exc.spent + exc.reserved >= exc.limit:
        daily_budget_reached(ctx.ledger, exc.spent + exc.reserved, exc.limit)
    wait(ctx, daily_wait_line(exc.spent, exc.reserved, exc.inflight, exc.limit, role, exc.estimate))


def check_budgets(ctx: Ctx) -> None:
    from agent.ledger.tasks import task_budget

    limits = ctx.config.limits
    spent, budget, since_reset = task_budget(ctx.ledger, ctx.task_id, limits.task_budget_usd)
    if spent >= budget:
        block(ctx, f"{TASK_BUDGET_SPENT} ({usd(spent)} of {usd(budget)}{' since the last reset' if since_reset else ''}"
                    f"); `agent task reset {ctx.task_id} --reason ... --budget USD` lets it spend USD more "
                    "(or raise limits.task_budget_usd)")
    t = ctx.load_task()
    started = datetime.strptime(t["created_at"][:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)
    if (datetime.now(timezone.utc) - started).total_seconds() > limits.task_wall_time:
        block(ctx, f"task wall time {limits.task_wall_time}s exceeded")
    # spent, plus what the lanes in flight (any runner's) reserved; the launch itself checks again, atomically
    daily, reserved, inflight = daily_spend_since(ctx.ledger, day_start())
    if daily + reserved >= limits.daily_budget_usd:
        daily_budget_reached(ctx.ledger, daily + reserved, limits.daily_budget_usd)  # once a day: "budget" notice
        wait(ctx, daily_wait_line(daily, reserved, inflight, limits.daily_budget_usd))


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
