"""`agent lesson list|show|forget|accept`: what the agent remembers, decided by a human (logic: agent.flows.lessons)."""

from __future__ import annotations

import click

from agent.cli.common import emit, get_app, json_option
from agent.ledger.lessons import STATES


@click.group()
def lesson():
    """Lessons lanes left: candidates until a human merges their PR; only accepted ones reach later specs."""


def _line(r: dict) -> str:
    why = f"  ({r['reason']})" if r.get("reason") and r["state"] != "candidate" else ""
    return f"lesson {r['id']:>4}  {r['state']:<9}  {r['origin']}  {r['text']}{why}"


@lesson.command("list")
@click.option("--state", type=click.Choice(STATES), default=None, help="Only lessons in this state.")
@json_option
def lesson_list(state, as_json):
    """List lessons with their state and origin (task, PR).

    \b
    Example:
      agent lesson list --state candidate
    """
    from agent.flows.lessons import list_lessons

    rows = list_lessons(get_app().ledger, state)

    def human(rows):
        if not rows:
            click.echo("no lessons" + (f" in state {state}" if state else ""))
        for r in rows:
            click.echo(_line(r))

    emit(rows, as_json, human)


@lesson.command("show")
@click.argument("lesson_id", type=int)
@json_option
def lesson_show(lesson_id, as_json):
    """Show one lesson, where it came from and every change to it.

    \b
    Example:
      agent lesson show 4
    """
    from agent.flows.lessons import show_lesson

    data = show_lesson(get_app().ledger, lesson_id)

    def human(d):
        click.echo(_line(d))
        for e in d["events"]:
            click.echo(f"  {e['ts'][:19]}  {e['actor']:<6}  {e['kind']}"
                       + (f"  {e['payload']['reason']}" if e["payload"].get("reason") else ""))

    emit(data, as_json, human)


@lesson.command("forget")
@click.argument("lesson_id", type=int)
@click.option("--reason", default=None, help="Why (kept in the event).")
@json_option
def lesson_forget(lesson_id, reason, as_json):
    """Forget a lesson: it never reaches a spec again.

    \b
    Example:
      agent lesson forget 4 --reason "no longer true since the v2 API"
    """
    from agent.flows.lessons import forget

    _decide(forget, lesson_id, reason, as_json, lambda d: f"lesson {lesson_id} forgotten")


@lesson.command("accept")
@click.argument("lesson_id", type=int)
@click.option("--reason", default=None, help="Why (kept in the event).")
@json_option
def lesson_accept(lesson_id, reason, as_json):
    """Accept a lesson without a merge: later specs of its service carry it.

    \b
    Example:
      agent lesson accept 4
    """
    from agent.flows.lessons import accept

    _decide(accept, lesson_id, reason, as_json,
            lambda d: f"lesson {lesson_id} accepted: later specs of {d['service'] or 'its service'} carry it")


def _decide(decide, lesson_id: int, reason: str | None, as_json: bool, said) -> None:
    data = decide(get_app().ledger, lesson_id, reason)
    emit(data, as_json,
         lambda d: click.echo(said(d) if d["changed"] else f"lesson {lesson_id} was {d['state']} already"))
