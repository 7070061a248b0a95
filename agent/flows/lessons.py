"""What the agent remembers: a lane's ``LESSON:`` steers later lanes only once a human accepted its work.

An implementer's LESSON is vetted (``vet``) and recorded as its task's candidate (``propose``); merging the task's
PR accepts it (``agent.ledger.prs.record_pr_final``), a closed-unmerged PR or a failed task discards it, and
`agent lesson accept|forget` lets a human decide directly. A lesson holding a URL, a shell pipeline or an
instruction to run something, or longer than ``lessons.max_chars``, is refused: recorded, shown in the PR body,
never offered. Specs carry only accepted lessons (``for_spec``), at most ``lessons.per_service``, each labelled
with its origin; reviewer specs none unless ``lessons.reviewers``.
"""

from __future__ import annotations

import re

from agent import AgentError
from agent.ledger import Ledger, eventlog, status
from agent.ledger import lessons as store

# Refused outright: a lesson is a note about the code, never a way to make a later lane fetch or run something.
_REFUSALS: tuple[tuple[re.Pattern, str], ...] = (
    (re.compile(r"(?i)\b[a-z][a-z0-9+.-]{1,20}://|\bwww\.|\b(?:mailto|data|file|javascript):(?=\S)"
                r"|\b(?:\d{1,3}\.){3}\d{1,3}\b|\b(?:[a-z0-9-]+\.)+[a-z]{2,}(?::\d+)?/"), "it holds a URL"),
    (re.compile(r"\|\s*(?:sudo\s+)?(?:sh|bash|zsh|dash|ksh|fish|python[0-9.]*|perl|ruby|node|php|xargs|tee|"
                r"source|eval|exec|base64|nc)\b|\$\(|<\(|&&|\|\||;\s*(?:sh|bash|curl|wget|rm|chmod)\b|>\s*/"),
     "it holds a shell pipeline"),
    (re.compile(r"(?i)\b(?:run|execute|exec|eval|invoke|install|download|curl|wget|sudo|chmod|pip3?|npm|npx|"
                r"apt(?:-get)?|brew|bash|sh|zsh|powershell|pwsh|ssh|scp|netcat)\b"),
     "it tells a lane to run something"),
    (re.compile(r"(?i)\b(?:ignore|disregard|forget|override)\b.{0,40}\b(?:instructions?|rules?|spec|constraints?)\b"),
     "it tells a lane to ignore its instructions"),
)


def one_line(text: str) -> str:
    """One line, no control or format characters (escapes, bidi overrides): what is stored, shown and offered."""
    return "".join(ch for ch in " ".join(str(text or "").split()) if ch.isprintable())


def vet(text: str, max_chars: int) -> str | None:
    """Why ``text`` is refused as a lesson, or None when it may become a candidate."""
    if len(text) > max_chars:
        return f"it is longer than lessons.max_chars ({len(text)} > {max_chars} characters)"
    for pattern, why in _REFUSALS:
        if pattern.search(text):
            return why
    return None


def propose(ledger: Ledger, task_id: int, lesson: str | None, *, max_chars: int, lane_run_id: int | None,
            round_: int, claim_token: str | None, clean=str) -> int | None:
    """Record the LESSON of the task's newest complete implementer run (``clean``: the redactor) as its candidate,
    refused with the reason when ``vet`` says so; no LESSON keeps an earlier round's."""
    text = one_line(clean(lesson)) if lesson else ""
    if not text:
        return store.propose_lesson(ledger, task_id, None, None, lane_run_id=lane_run_id, round_=round_,
                                    claim_token=claim_token)
    refused = vet(text, max_chars)
    if refused and len(text) > max_chars:
        text = text[:max_chars] + "…"          # kept short in the ledger and the PR body all the same
    return store.propose_lesson(ledger, task_id, text, refused, lane_run_id=lane_run_id, round_=round_,
                                claim_token=claim_token)


def origin(row: dict) -> str:
    """``task 12, PR acme/widgets#4`` (or ``task 12, no PR``): where a lesson came from."""
    where = f"task {row['task_id']}" if row.get("task_id") is not None else "no task"
    pr = f"PR {row['pr_repo']}#{row['pr_number']}" if row.get("pr_number") is not None else "no PR"
    return f"{where}, {pr}"


def for_spec(ledger: Ledger, config, error: dict | None, task_id: int) -> list[str]:
    """The accepted lessons a spec of ``task_id`` carries, each labelled with its origin (inside the spec's fence)."""
    if not error:
        return []
    rows = store.accepted_for(ledger, error.get("service"), error.get("fingerprint"), task_id,
                              config.lessons.per_service)
    return [f"lesson {r['id']} ({origin(r)}): {one_line(r['text'])}" for r in rows]


# ------------------------------------------------------------------ `agent lesson ...` (logic; click is thin)


def _shown(row: dict) -> dict:
    return {**row, "origin": origin(row)}


def list_lessons(ledger: Ledger, state: str | None = None) -> list[dict]:
    if state is not None and state not in store.STATES:
        raise AgentError(f"unknown lesson state {state!r}; use one of {', '.join(store.STATES)}")
    return [_shown(r) for r in store.list_lessons(ledger, state)]


def show_lesson(ledger: Ledger, lesson_id: int) -> dict:
    row = store.get_lesson(ledger, lesson_id)
    if row is None:
        raise AgentError(f"no lesson {lesson_id}; see `agent lesson list`")
    return {**_shown(row), "events": [e for e in eventlog.events(ledger, task_id=row["task_id"])
                                      if e["kind"].startswith("lesson.")
                                      and e["payload"].get("lesson_id") == lesson_id]
            if row["task_id"] is not None else []}


def forget(ledger: Ledger, lesson_id: int, reason: str | None = None) -> dict:
    """A human: this lesson never reaches a spec again (whatever its state)."""
    _row, changed = store.decide_lesson(ledger, lesson_id, "forgotten", "human", reason or "forgotten by a human",
                                        allowed_from=("candidate", "accepted", "refused", "discarded"))
    return {**_shown(store.get_lesson(ledger, lesson_id)), "changed": changed}


def accept(ledger: Ledger, lesson_id: int, reason: str | None = None) -> dict:
    """A human: this lesson may steer later lanes. A refused lesson stays refused (it held a URL, a pipeline or
    a command): write such guidance into the repository instead."""
    found = store.get_lesson(ledger, lesson_id)
    if found is not None and found["state"] == "refused":
        raise AgentError(f"lesson {lesson_id} was refused ({found['reason']}); a lane never gets it: put such "
                         "guidance in the repository (README, .agent/config.yaml) instead")
    _row, changed = store.decide_lesson(ledger, lesson_id, "accepted", "human", reason or "accepted by a human",
                                        allowed_from=("candidate", "discarded", "forgotten"))
    return {**_shown(store.get_lesson(ledger, lesson_id)), "changed": changed}


def counts(ledger: Ledger) -> dict[str, int]:
    """Lessons by state, every state named (for `agent status` and the page)."""
    found = status.state_counts(ledger, "lessons")
    return {s: found.get(s, 0) for s in store.STATES}
