"""The implement chain: its steps, the one task state machine, the one close guard, the round cap.

Everything here is pure: it takes a ``Snapshot`` of a task (read from the ledger by
``agent.ledger.tasks.snapshot``) and answers questions.  Every write path (the fixer,
``agent task close-step``, ``agent checklist set``) asks ``close_reasons`` before it closes or
reopens a step, and ``check_transition`` before it changes a task's state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

HUMAN, SCRIPT, LANE = "human", "script", "lane"
SOURCES = (HUMAN, SCRIPT, LANE)


class StepStatus(StrEnum):
    """A step's status. The values are what the ledger stores and `agent task close-step --status` takes (kept as
    they were: no data migration); a member compares equal to its value."""
    PENDING = "pending"
    DONE = "ja"                  # closed: the step's work is done and its artifact recorded for the current head
    NOT_DONE = "nein"            # reopened: a rejection or a new round
    NOT_APPLICABLE = "n_a"       # closed by a human decision


STATUSES = tuple(StepStatus)
CLOSED = (StepStatus.DONE, StepStatus.NOT_APPLICABLE)


@dataclass(frozen=True)
class Step:
    key: str
    kind: str                    # human | script | lane
    needs: tuple[str, ...]
    artifact: str                # what must be recorded for the task's current head
    title: str


STEPS: tuple[Step, ...] = (
    Step("spec_written", HUMAN, (), "spec", "five-part spec written"),
    Step("implementer_done", LANE, ("spec_written",), "implementer report", "implementer lane reported complete"),
    Step("committed", SCRIPT, ("implementer_done",), "commit", "lane edits committed"),
    Step("local_check_pass", SCRIPT, ("committed",), "check result", "repo check passed on head"),
    Step("reviewer_approved", LANE, ("local_check_pass",), "review verdict", "reviewer approved head"),
    Step("pushed", SCRIPT, ("reviewer_approved",), "pushed sha", "head pushed to the task branch"),
    Step("pr_opened", SCRIPT, ("pushed",), "PR", "draft PR opened or updated"),
    Step("pr_quality_approved", LANE, ("pr_opened",), "PR quality verdict", "PR quality reviewer approved head"),
    Step("pr_logic_approved", LANE, ("pr_opened",), "PR logic verdict", "PR logic reviewer approved head"),
)
STEP_BY_KEY = {s.key: s for s in STEPS}
STEP_KEYS = tuple(s.key for s in STEPS)
# Steps redone in every round: everything from the implementer on.
ROUND_STEPS = STEP_KEYS[1:]

# ------------------------------------------------------------------ the task state machine

OPEN, WORKING, BLOCKED, DONE, FAILED = "open", "working", "gate-blocked", "done", "failed"
TASK_STATES = (OPEN, WORKING, BLOCKED, DONE, FAILED)
TERMINAL = (DONE, FAILED)
TRANSITIONS: dict[str, tuple[str, ...]] = {
    OPEN: (WORKING, BLOCKED, FAILED),
    WORKING: (WORKING, DONE, FAILED, BLOCKED),      # WORKING -> WORKING is a new round
    BLOCKED: (WORKING, FAILED),                     # back to work only through a human reset
    FAILED: (WORKING,),                             # a human reset
    DONE: (FAILED, WORKING, BLOCKED),               # FAILED: its PR was closed without merge (watch pr-merged);
}                                                   # WORKING: a PR feedback round; BLOCKED: /agent stop or a cap
HUMAN_ONLY_TRANSITIONS = {(BLOCKED, WORKING), (FAILED, WORKING)}
# A gate-block whose reason starts with this was caused by the config (repository not configured, no lane for a
# role): the one back-to-work move a script may make, once the config is valid again (no human decision is needed).
CONFIG_BLOCK = "config:"
# Transitions that need evidence: a done task goes back to work only for PR feedback (the item keys).
EVIDENCE_TRANSITIONS = {(DONE, WORKING): "the PR feedback (review, comment or CI ids) that starts the round"}


def check_transition(current: str, target: str, actor: str, evidence: list[str] | None = None,
                     blocked_reason: str | None = None) -> str | None:
    """Return why ``current -> target`` by ``actor`` (with ``evidence``) is not allowed, or None.
    ``blocked_reason`` is the task's current one (a config block may be lifted by the script)."""
    if target not in TASK_STATES:
        return f"unknown task state {target!r}"
    if target not in TRANSITIONS.get(current, ()):
        return f"a task may not go from {current} to {target}"
    if (current, target) in HUMAN_ONLY_TRANSITIONS and actor != HUMAN:
        if (current, target) == (BLOCKED, WORKING) and (blocked_reason or "").startswith(CONFIG_BLOCK):
            return None
        return f"only a human may move a task from {current} back to {target} (agent task reset)"
    if (current, target) in EVIDENCE_TRANSITIONS and not [e for e in evidence or () if str(e).strip()]:
        return f"a task goes from {current} back to {target} only with evidence: " \
               f"{EVIDENCE_TRANSITIONS[(current, target)]}"
    return None


# ------------------------------------------------------------------ the error state machine

# An error is open until a conclusion or a PR moves it: a fix conclusion (or its task) -> fixing, a skip
# conclusion or a PR closed without merge -> skipped, a merged PR -> resolved. Resolved is final: a recurrence
# opens a new error row (agent.intake.store). ``agent.ledger.errors.transition_error`` asks this for every write.
E_OPEN, E_FIXING, E_RESOLVED, E_SKIPPED = "open", "fixing", "resolved", "skipped"
ERROR_STATES = (E_OPEN, E_FIXING, E_RESOLVED, E_SKIPPED)
ERROR_TRANSITIONS: dict[str, tuple[str, ...]] = {
    E_OPEN: (E_FIXING, E_SKIPPED, E_RESOLVED),      # decided (fix/skip), or a hand-made task's PR merged
    E_FIXING: (E_RESOLVED, E_SKIPPED),              # its PR merged, or closed without merge
    E_SKIPPED: (E_FIXING, E_RESOLVED),              # a skip without conclusion (PR closed) decided again; a merge
    E_RESOLVED: (),                                 # final
}


def check_error_transition(current: str, target: str) -> str | None:
    """Return why an error may not go from ``current`` to ``target``, or None."""
    if target not in ERROR_STATES:
        return f"unknown error state {target!r}"
    if target not in ERROR_TRANSITIONS.get(current, ()):
        return f"an error may not go from {current} to {target}"
    return None


# ------------------------------------------------------------------ rounds


def round_exhausted(round_no: int, round_cap: int) -> bool:
    """True when starting round ``round_no + 1`` would pass the cap."""
    return round_no >= round_cap


def feedback_round_refusal(round_no: int, round_cap: int, feedback_used: int, feedback_cap: int) -> str | None:
    """Why a round started by PR feedback or PR CI may not start, or None.

    Feedback rounds count toward the round cap, and at most ``feedback_cap`` (``limits.feedback_rounds``) of
    them run between human resets."""
    if feedback_used >= feedback_cap:
        return f"feedback round cap {feedback_cap} reached (limits.feedback_rounds)"
    if round_exhausted(round_no, round_cap):
        return f"round cap {round_cap} reached (limits.round_cap)"
    return None


# ------------------------------------------------------------------ the close guard


@dataclass
class Snapshot:
    """What the guard needs to know about one task, read in one go from the ledger."""
    task_id: int
    state: str
    round: int
    from_conclusion: bool                 # created from a confirmed error.fix conclusion
    head_sha: str | None = None
    base_sha: str | None = None
    pushed_sha: str | None = None
    spec_path: str | None = None
    steps: dict[str, str] = field(default_factory=dict)          # key -> status
    implementer_complete: bool = False    # an implementer lane run of this round reported complete
    committed_round: bool = False         # a commit of this round is recorded as the head
    checks_passed: set[str] = field(default_factory=set)        # heads with a passing check
    approvals: dict[str, set[str]] = field(default_factory=dict)  # "review:code" -> heads approved
    pr_head: str | None = None            # head sha recorded on the task's open PR
    proofs_refused: set[str] = field(default_factory=set)      # heads whose proof found no flipping test


def _artifact_missing(snap: Snapshot, key: str) -> str | None:
    head = snap.head_sha
    if key == "spec_written":
        return None if snap.spec_path else "no spec recorded for the task"
    if key == "implementer_done":
        return None if snap.implementer_complete else \
            f"no implementer lane run reported STATUS: complete in round {snap.round}"
    if key == "committed":
        if not head or head == snap.base_sha or not snap.committed_round:
            return f"no commit recorded for round {snap.round}"
        return None
    if not head:
        return "the task has no head commit"
    if key == "local_check_pass":
        if head in snap.proofs_refused:  # DESIGN.md "The proof": no test fails on the base and passes here
            return f"no test proves head {head[:12]}: nothing that fails on the base passes here"
        return None if head in snap.checks_passed else f"no passing check recorded for head {head[:12]}"
    if key == "reviewer_approved":
        return None if head in snap.approvals.get("review:code", set()) else \
            f"no reviewer approval recorded for head {head[:12]}"
    if key == "pushed":
        return None if snap.pushed_sha == head else f"head {head[:12]} is not recorded as pushed"
    if key == "pr_opened":
        return None if snap.pr_head == head else f"no open PR recorded at head {head[:12]}"
    if key in ("pr_quality_approved", "pr_logic_approved"):
        dim = key.split("_")[1]
        return None if head in snap.approvals.get(f"pr:{dim}", set()) else \
            f"no PR {dim} approval recorded for head {head[:12]}"
    return None


def close_reasons(snap: Snapshot, key: str, status: str, source: str, evidence: str | None) -> list[str]:
    """Every reason ``key`` may not be set to ``status`` by ``source``; empty means allowed.

    ``DONE`` (``ja``) closes a step, ``NOT_APPLICABLE`` (``n_a``) marks it not applicable (a human decision),
    ``NOT_DONE`` (``nein``) reopens it.
    """
    step = STEP_BY_KEY.get(key)
    if step is None:
        return [f"unknown step {key!r}; steps are: {', '.join(STEP_KEYS)}"]
    reasons: list[str] = []
    if status not in (StepStatus.DONE, StepStatus.NOT_DONE, StepStatus.NOT_APPLICABLE):
        reasons.append(f"unknown status {status!r}; expected ja, nein or n_a")
    if source not in SOURCES:
        reasons.append(f"unknown source {source!r}; expected human or script")
    if not (evidence or "").strip():
        reasons.append("evidence missing: say what shows the step is done (--evidence TEXT)")
    if snap.state in TERMINAL:
        reasons.append(f"task {snap.task_id} is {snap.state}; reset it first")
    if reasons or status == StepStatus.NOT_DONE:
        return reasons
    if status == StepStatus.NOT_APPLICABLE and source != HUMAN:
        reasons.append("only a human may mark a step not applicable (--source human)")
    if step.kind == HUMAN and source != HUMAN:
        carve_out = key == "spec_written" and source == SCRIPT and snap.from_conclusion
        if not carve_out:
            reasons.append(f"{key} is a human step: it needs --source human "
                           "(a script may write the spec only for a task from a confirmed error.fix)")
    missing = [n for n in step.needs if snap.steps.get(n, StepStatus.PENDING) not in CLOSED]
    if missing:
        reasons.append(f"needs not closed: {', '.join(missing)}")
    if status == StepStatus.DONE:
        why = _artifact_missing(snap, key)
        if why:
            reasons.append(why)
    return reasons


def next_steps(snap: Snapshot) -> list[str]:
    """Open steps whose needs are all closed, in chain order (the two PR reviews come together)."""
    return [s.key for s in STEPS
            if snap.steps.get(s.key, StepStatus.PENDING) not in CLOSED
            and all(snap.steps.get(n, StepStatus.PENDING) in CLOSED for n in s.needs)]


def all_closed(snap: Snapshot) -> bool:
    return all(snap.steps.get(k, StepStatus.PENDING) in CLOSED for k in STEP_KEYS)
