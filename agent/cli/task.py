"""`agent task ...`, `agent checklist set`, `agent events`."""

from __future__ import annotations

import json
import time

import click

from agent import AgentError
from agent.cli.common import (emit, emit_rows, get_app, json_option, limit_option, listing_args, since_option,
                                   warn_broken_config)

STATES = ("open", "working", "gate-blocked", "done", "failed")


@click.group()
def task():
    """Tasks: one per error.fix conclusion, each with its checklist of steps."""


@task.command("create")
@click.option("--repo", required=True, help="OWNER/NAME of the repository to fix.")
@click.option("--title", required=True, help="One line saying what the task is.")
@click.option("--error-id", help="The error this task fixes (id or unique prefix).")
@click.option("--base", default="main", show_default=True, help="Base branch.")
@json_option
def task_create(repo, title, error_id, base, as_json):
    """Create a task by hand (for humans and tests).

    \b
    Example:
      agent task create --repo acme/widgets --title "Fix KeyError in checkout"
    """
    from agent.ledger.errors import resolve_error
    from agent.ledger.tasks import create_task

    app = get_app()
    if repo not in app.config.repos:  # a task the config cannot serve would make every later config refused
        raise AgentError(f"repository {repo} is not configured; add it under repos: in config.yaml first")
    eid = resolve_error(app.ledger, error_id)["id"] if error_id else None
    task_id, created = create_task(app.ledger, repo, title, error_id=eid, base=base,
                                   round_cap=app.config.limits.round_cap, actor="human")
    emit({"id": task_id, "created": created}, as_json,
         lambda r: click.echo(f"task {r['id']} {'created' if r['created'] else 'exists'}"))


@task.command("list")
@click.option("--state", type=click.Choice(STATES), help="Only tasks in this state.")
@since_option("tasks updated")
@limit_option("tasks, the newest (still in id order)")
@json_option
def task_list(state, since, limit, as_json):
    """List tasks.

    \b
    Example:
      agent task list --state gate-blocked --json
    """
    from agent.app.status import one_line
    from agent.ledger.tasks import iter_tasks

    app = get_app()
    warn_broken_config(app)

    def line(r):  # one line per task, whatever a reason or title holds
        why = one_line(r["blocked_reason"] or r["failed_reason"] or r["wait_reason"], 200)
        click.echo(f"{r['id']:>5}  {r['state']:<12} round {r['round']}/{r['round_cap']}  {r['repo']}  "
                   f"{one_line(r['title'], 100)}{'  -- ' + why if why else ''}")

    emit_rows(iter_tasks(app.ledger, state, **listing_args(limit, since)), as_json, line, "no tasks", "tasks")


@task.command("show")
@click.argument("task_id", type=int)
@json_option
def task_show(task_id, as_json):
    """Show a task with its steps, lane runs, checks, gates, PR and the PR feedback read.

    \b
    Example:
      agent task show 12
    """
    from agent.ledger.tasks import task_detail

    t = task_detail(get_app().ledger, task_id)

    def human(t):
        click.echo(f"task {t['id']}  {t['state']}  round {t['round']}/{t['round_cap']}  {t['repo']}  {t['title']}")
        for k in ("error_id", "branch", "worktree", "head_sha", "blocked_reason", "failed_reason"):
            if t.get(k):
                click.echo(f"  {k}: {t[k]}")
        for s in t["steps"]:
            click.echo(f"  [{s['status']:<7}] {s['key']:<20} {s['source'] or '':<6} {(s['evidence'] or '')[:80]}")
        for r in t["lane_runs"]:
            click.echo(f"  lane #{r['id']} r{r['round']} {r['role']}/{r['vendor']}: {r['status']} "
                       f"findings={r['findings_count']} cost={r['cost_usd']}")
        for ch in t["checks"]:
            click.echo(f"  check r{ch['round']} {'pass' if ch['passed'] else 'FAIL'} at {(ch['head_sha'] or '')[:12]}")
        if t.get("proof"):
            click.echo(f"  proof: {t['proof']['summary']}")
        if t["pr"]:
            click.echo(f"  pr: {t['pr']['url']} ({t['pr']['state']}, draft)")
        for f in t.get("pr_feedback") or []:
            where = f" {f['path']}" + (f":{f['line']}" if f["line"] else "") if f["path"] else ""
            why = f" ({f['reason']})" if f["reason"] else ""
            click.echo(f"  pr feedback {f['key']} by {f['author']}{where}: {f['decision']} r{f['round']}{why}")

    emit(t, as_json, human)


SOURCE = click.option("--source", type=click.Choice(["human", "script"]), default="human", show_default=True,
                      help="Who closes the step.")


@task.command("close-step")
@click.argument("task_id", type=int)
@click.argument("key")
@click.option("--evidence", required=True, help="What shows the step is done.")
@SOURCE
@json_option
def close_step(task_id, key, evidence, source, as_json):
    """Close one step of a task, if the guard allows it (same guard as `checklist set`).

    \b
    Example:
      agent task close-step 12 spec_written --evidence "spec reviewed" --source human
    """
    from agent.domain.chain import StepStatus
    from agent.ledger.tasks import set_step

    r = set_step(get_app().ledger, task_id, key, StepStatus.DONE, evidence, source=source)
    emit(r, as_json, lambda r: click.echo(f"task {task_id} {key}: ja"))


@task.command("reset")
@click.argument("task_id", type=int)
@click.option("--reason", required=True, help="Why the task may go on (recorded as a human event).")
@click.option("--rounds", type=int, help="Grant N more rounds (round cap becomes current round + N).")
@click.option("--budget", type=float, metavar="USD",
              help="What the task may spend from now on (default limits.task_budget_usd); spend is counted "
                   "from each reset, so a budget gate-block does not come straight back.")
@json_option
def task_reset(task_id, reason, rounds, budget, as_json):
    """Put a gate-blocked or failed task back to work.

    \b
    Example:
      agent task reset 12 --reason "installed codex and logged in" --rounds 2
      agent task reset 12 --reason "worth another try" --budget 5
    """
    from agent.ledger.tasks import reset_task

    r = reset_task(get_app().ledger, task_id, reason, rounds, budget)
    emit(r, as_json, lambda r: click.echo(f"task {task_id} back to work (round {r['round']}/{r['round_cap']})"))


@click.group()
def checklist():
    """A task's checklist (same guard as `task close-step`)."""


@checklist.command("set")
@click.argument("task_id", type=int)
@click.argument("key")
@click.option("--status", type=click.Choice(["ja", "nein", "n_a"]), required=True,
              help="ja closes, nein reopens, n_a marks not applicable (human only).")
@click.option("--evidence", required=True, help="What shows it.")
@SOURCE
@json_option
def checklist_set(task_id, key, status, evidence, source, as_json):
    """Set one checklist step; refused exactly when `task close-step` would refuse.

    \b
    Example:
      agent checklist set 12 reviewer_approved --status nein --evidence "reviewer missed a case"
    """
    from agent.ledger.tasks import set_step

    r = set_step(get_app().ledger, task_id, key, status, evidence, source=source)
    emit(r, as_json, lambda r: click.echo(f"task {task_id} {key}: {status}"))


@click.command()
@click.option("--task", "task_id", type=int, help="Only events of this task.")
@click.option("--follow", is_flag=True, help="Keep printing new events (Ctrl-C stops).")
@since_option("events")
@limit_option("events, the newest (still oldest first)")
@json_option
def events(task_id, follow, since, limit, as_json):
    """The append-only event log.

    With --follow it keeps printing; with --follow --json, one JSON object per line (a stream, not one document).

    \b
    Example:
      agent events --task 12
      agent events --follow
    """
    from agent.ledger import eventlog
    from agent.ledger.listing import iter_events

    app = get_app()
    warn_broken_config(app)
    rows = iter_events(app.ledger, task_id, **listing_args(limit, since))
    last = 0

    def line(e):
        nonlocal last
        last = e["id"]
        if as_json:
            click.echo(json.dumps(e, default=str))
            return
        who = f"task {e['task_id']}" if e["task_id"] else (f"error {e['error_id'][:8]}" if e["error_id"] else "-")
        click.echo(f"{e['id']:>6} {e['ts']} {e['actor']:<6} {who:<10} {e['kind']} "
                   f"{json.dumps(e['payload'], sort_keys=True)[:160]}")

    if as_json and not follow:
        emit_rows(rows, True, line, "", "events")
        return
    emit_rows(rows, False, line, "" if follow else "no events", "events")
    while follow:
        time.sleep(0.5)
        for e in eventlog.events(app.ledger, task_id=task_id, after_id=last):
            line(e)
