"""Record operations of lessons (``lessons``): what a lane proposes to remember, and what a human accepted.

A lesson is a ``candidate`` from the moment its implementer run reports it until a human accepts the work: its
task's PR merged (``accept_merged_in``, in the transaction that records the merge) or `agent lesson accept`. A
closed-unmerged PR or a failed task discards it (``discard_in``); a lesson the vetting refused stays ``refused``
and is never offered. Only ``accepted`` lessons reach a spec (``accepted_for``). Every change is one transaction
with its ``lesson.<state>`` event naming its actor.
"""

from __future__ import annotations

import sqlite3

from agent import AgentError
from agent.ledger import Ledger, now

STATES = ("candidate", "accepted", "refused", "discarded", "forgotten")
OPEN = ("candidate", "refused")          # what the newest implementer round of a task may still replace

# every read names where a lesson came from: its task and that task's PR (if it has one)
_ROWS = ("SELECT l.id, l.state, l.text, l.reason, l.service, l.fingerprint, l.task_id, l.lane_run_id, "
         "l.decided_by, l.created_at, l.updated_at, p.repo AS pr_repo, p.number AS pr_number, p.url AS pr_url, "
         "p.state AS pr_state FROM lessons l LEFT JOIN prs p ON p.task_id = l.task_id")


def _event(ledger: Ledger, c: sqlite3.Connection, lesson_id: int, state: str, actor: str, task_id: int | None,
           payload: dict) -> None:
    ledger.event(c, f"lesson.{state}", actor, {"lesson_id": lesson_id, **payload}, task_id=task_id)


def _set_in(ledger: Ledger, c: sqlite3.Connection, row: dict, state: str, actor: str, reason: str | None) -> None:
    ledger.update(c, "lessons", {"id": row["id"]}, {"state": state, "reason": reason, "decided_by": actor,
                                                     "updated_at": now()})
    _event(ledger, c, row["id"], state, actor, row["task_id"],
           {"from": row["state"], **({"reason": reason} if reason else {})})


def _task_rows(c: sqlite3.Connection, task_id: int, states: tuple[str, ...]) -> list[dict]:
    marks = ", ".join("?" for _ in states)
    cur = c.execute(f"SELECT id, state, text, task_id FROM lessons WHERE task_id = ? AND state IN ({marks}) "
                    "ORDER BY id", (task_id, *states))
    return [dict(zip(("id", "state", "text", "task_id"), r)) for r in cur.fetchall()]


def propose_lesson(ledger: Ledger, task_id: int, text: str | None, refused: str | None, *, lane_run_id: int | None,
                   round_: int, claim_token: str | None) -> int | None:
    """The task's newest implementer run left ``text``: it becomes the task's one open lesson, a ``candidate`` (or
    ``refused`` with the reason), replacing the one an earlier round left (None: no lesson, that one stays).
    Returns its id."""
    from agent.ledger.leases import claimed_tx

    with claimed_tx(ledger, task_id, claim_token) as c:
        open_rows = _task_rows(c, task_id, OPEN)
        if text is None:   # a round that left no lesson keeps the one an earlier round left (the PR body shows it)
            return open_rows[-1]["id"] if open_rows else None
        state = "refused" if refused else "candidate"
        decided = c.execute("SELECT id FROM lessons WHERE task_id = ? AND text = ? AND state IN ('accepted', "
                            "'forgotten')", (task_id, text)).fetchone()
        if decided:   # a human decided this very text already (accepted, or forgot it): a later round keeps that
            for row in open_rows:
                _set_in(ledger, c, row, "discarded", "script", f"round {round_} repeats lesson {decided[0]}")
            return decided[0]
        current = open_rows[-1] if open_rows else None
        for row in open_rows[:-1]:
            _set_in(ledger, c, row, "discarded", "script", f"replaced in round {round_}")
        if current and current["text"] == text and current["state"] == state:
            return current["id"]
        values = {"text": text, "state": state, "reason": refused, "lane_run_id": lane_run_id,
                  "decided_by": "script" if refused else "lane", "updated_at": now()}
        if current:
            ledger.update(c, "lessons", {"id": current["id"]}, values)
            lesson_id = current["id"]
        else:
            err = c.execute("SELECT e.service, e.fingerprint FROM tasks t JOIN errors e ON e.id = t.error_id "
                            "WHERE t.id = ?", (task_id,)).fetchone()
            lesson_id = ledger.insert(c, "lessons", {"service": err[0] if err else None,
                                                     "fingerprint": err[1] if err else None, "task_id": task_id,
                                                     "created_at": now(), **values})
            if lesson_id is None:  # pragma: no cover - lessons has an id column on both backends
                raise AgentError("lessons: no id returned")
        _event(ledger, c, lesson_id, state, "script" if refused else "lane", task_id,
               {"text": text, "lane_run_id": lane_run_id, "round": round_,
                **({"reason": refused} if refused else {}),
                **({"replaces": current["text"]} if current and current["text"] != text else {})})
        return lesson_id


def accept_merged_in(ledger: Ledger, c: sqlite3.Connection, task_id: int, pr_ref: str) -> None:
    """Inside the transaction recording a merged PR: the task's candidate lesson is accepted."""
    for row in _task_rows(c, task_id, ("candidate",)):
        _set_in(ledger, c, row, "accepted", "script", f"PR {pr_ref} merged")


def discard_in(ledger: Ledger, c: sqlite3.Connection, task_id: int, reason: str) -> None:
    """Inside the transaction that closes a task's PR unmerged or fails the task: its candidate is discarded."""
    for row in _task_rows(c, task_id, ("candidate",)):
        _set_in(ledger, c, row, "discarded", "script", reason)


def decide_lesson(ledger: Ledger, lesson_id: int, state: str, actor: str, reason: str | None,
                  allowed_from: tuple[str, ...]) -> tuple[dict, bool]:
    """A human's ``accepted`` or ``forgotten`` for one lesson: ``(row, changed)``. A lesson in a state outside
    ``allowed_from`` (other than ``state`` itself) is refused with one line saying why."""
    with ledger.tx() as c:
        found = c.execute("SELECT id, state, text, task_id FROM lessons WHERE id = ?", (lesson_id,)).fetchone()
        if found is None:
            raise AgentError(f"no lesson {lesson_id}; see `agent lesson list`")
        row = dict(zip(("id", "state", "text", "task_id"), found))
        if row["state"] == state:
            return row, False
        if row["state"] not in allowed_from:
            raise AgentError(f"lesson {lesson_id} is {row['state']}: it cannot become {state}")
        _set_in(ledger, c, row, state, actor, reason)
    return {**row, "state": state}, True


def get_lesson(ledger: Ledger, lesson_id: int) -> dict | None:
    return ledger.one(f"{_ROWS} WHERE l.id = ?", (lesson_id,))


def list_lessons(ledger: Ledger, state: str | None = None) -> list[dict]:
    if state is None:
        return ledger.all(f"{_ROWS} ORDER BY l.id")
    return ledger.all(f"{_ROWS} WHERE l.state = ? ORDER BY l.id", (state,))


def accepted_for(ledger: Ledger, service: str | None, fingerprint: str | None, task_id: int,
                 limit: int) -> list[dict]:
    """The newest ``limit`` accepted lessons of other tasks on the same service or fingerprint, with their origin."""
    if limit <= 0:
        return []
    return ledger.all(f"{_ROWS} WHERE l.state = 'accepted' AND (l.service = ? OR l.fingerprint = ?) "
                      f"AND (l.task_id IS NULL OR l.task_id != ?) ORDER BY l.id DESC LIMIT {int(limit)}",
                      (service, fingerprint, task_id))


def task_lesson(ledger: Ledger, task_id: int) -> dict | None:
    """What a task's PR body says about memory: its newest candidate, refused or accepted lesson."""
    return ledger.one(f"{_ROWS} WHERE l.task_id = ? AND l.state IN ('candidate', 'refused', 'accepted') "
                      "ORDER BY l.id DESC LIMIT 1", (task_id,))
