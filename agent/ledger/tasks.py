"""Record operations of the tasks aggregate: tasks, their steps and the artifacts the guard reads (spec, commit,
check, gate, push), rounds, resets, the workspace a task has.

Every function here that writes opens one ``Ledger.tx()`` (or joins the caller's), checks the caller's claim token
in it (``check_claim``: a worker that lost its claim writes nothing), asks ``agent.domain.chain`` (the one guard, the one
state machine) inside it, and writes its event in the same transaction. ``claim_token=None`` is the explicit
"acting without a claim": a human command (``agent task close-step``, ``checklist set``, ``task reset``), the
follow-up of a PR's final state, the scan that lifts a config block; the fixer always passes its token.
``snapshot`` is the guard's one read: every input of ``chain.close_reasons`` from one transaction.
"""

from __future__ import annotations

import sqlite3
from contextlib import contextmanager
from typing import Any, Iterator

from agent import AgentError

from agent.domain import chain
from agent.ledger import Ledger, now
from agent.ledger.listing import Listing
# ClaimLost (a claim token that is not the task's) and LeaseLost (a ClaimLost: what the fencing check raises) live
# with the claim records in agent.ledger.leases, and so does check_claim, the fencing check every write here runs
from agent.ledger.leases import ClaimLost, LeaseLost, check_claim, claimed_tx  # noqa: F401


HUMAN_STEP_PENDING = "human step pending:"


class Refused(AgentError):
    """The guard or the state machine said no; ``reasons`` lists every reason."""

    def __init__(self, reasons: list[str], prefix: str = ""):
        self.reasons = reasons
        super().__init__(prefix + "; ".join(reasons))


def get_task(ledger: Ledger, task_id: int, conn: sqlite3.Connection | None = None) -> dict:
    c = conn or ledger.conn
    row = c.execute("SELECT * FROM tasks WHERE id = ?", (task_id,)).fetchone()
    if row is None:
        raise AgentError(f"no task {task_id}; see `agent task list`")
    return dict(row)


def claim_held(ledger: Ledger, task_id: int, token: str | None) -> bool:
    """Whether ``token`` is the task's claim now (a check before starting work; every write checks again)."""
    return ledger.scalar("SELECT claim_token FROM tasks WHERE id = ?", (task_id,)) == token


def create_task(ledger: Ledger, repo: str, title: str, error_id: str | None = None,
                conclusion_id: int | None = None, base: str = "main", branch: str | None = None,
                round_cap: int = 5, actor: str = "human") -> tuple[int, bool]:
    """Find or create the task for an error (never two); returns (task_id, created)."""
    from agent.domain.names import repo_key_problem
    from agent.infra.text import one_line

    if repo_key_problem(repo):
        raise AgentError(f"repo {repo!r}: {repo_key_problem(repo)}; pass e.g. --repo acme/widgets")
    title = one_line(title, 200)     # a title is one line: it reaches email subjects, messages and the PR
    if not title:
        raise AgentError("title is empty; pass --title TEXT")
    with ledger.tx() as c:
        if error_id is not None:
            if c.execute("SELECT 1 FROM errors WHERE id = ?", (error_id,)).fetchone() is None:
                raise AgentError(f"no error with id {error_id!r}; see `agent error list`")
            found = c.execute("SELECT id FROM tasks WHERE error_id = ?", (error_id,)).fetchone()
            if found:
                return found[0], False
        ts = now()
        task_id = ledger.insert(c, "tasks", {
            "error_id": error_id, "conclusion_id": conclusion_id, "repo": repo, "base": base,
            "branch": branch, "title": title, "state": chain.OPEN, "round": 1,
            "round_cap": round_cap, "created_at": ts, "updated_at": ts,
        })
        for step in chain.STEPS:
            ledger.insert(c, "steps", {"task_id": task_id, "key": step.key, "kind": step.kind,
                                       "status": chain.StepStatus.PENDING.value, "round": 1})
        ledger.event(c, "task.created", actor, {"repo": repo, "title": title.strip(), "base": base,
                                                "branch": branch, "conclusion_id": conclusion_id,
                                                "round_cap": round_cap},
                     task_id=task_id, error_id=error_id)
        return task_id, True


# The guard's read as one statement: one consistent view on both backends (a statement sees one snapshot on
# PostgreSQL; SQLite runs it in one implicit transaction) without a transaction, the write lock or one round trip
# per part. Rows are (part, a, b, c, d, e, f); every value is text so the branches share one type on PostgreSQL.
_SNAPSHOT_SQL = """
SELECT 'task' AS part, state AS a, CAST(round AS TEXT) AS b, head_sha AS c, base_sha AS d, pushed_sha AS e,
       spec_path AS f FROM tasks WHERE id = ?
UNION ALL SELECT 'conclusion', c.kind, NULL, NULL, NULL, NULL, NULL FROM tasks t
       JOIN conclusions c ON c.id = t.conclusion_id AND c.error_id = t.error_id WHERE t.id = ?
UNION ALL SELECT 'step', key, status, NULL, NULL, NULL, NULL FROM steps WHERE task_id = ?
UNION ALL SELECT 'implementer', NULL, NULL, NULL, NULL, NULL, NULL FROM tasks t WHERE t.id = ? AND EXISTS (
       SELECT 1 FROM lane_runs l WHERE l.task_id = t.id AND l.round = t.round AND l.role = 'implementer'
       AND l.status = 'complete')
UNION ALL SELECT 'committed', NULL, NULL, NULL, NULL, NULL, NULL FROM tasks t WHERE t.id = ?
       AND t.head_sha IS NOT NULL AND EXISTS (
       SELECT 1 FROM commits m WHERE m.task_id = t.id AND m.round = t.round AND m.sha = t.head_sha)
UNION ALL SELECT 'check', head_sha, NULL, NULL, NULL, NULL, NULL FROM checks WHERE task_id = ? AND passed = 1
UNION ALL SELECT 'approval', stage, dimension, head_sha, NULL, NULL, NULL FROM gates
       WHERE task_id = ? AND verdict = 'approve'
UNION ALL SELECT 'pr', head_sha, NULL, NULL, NULL, NULL, NULL FROM prs WHERE task_id = ? AND state = 'open'
UNION ALL SELECT 'refused', head_sha, NULL, NULL, NULL, NULL, NULL FROM proofs
       WHERE task_id = ? AND verdict = 'rejected'
"""
_SNAPSHOT_PARAMS = _SNAPSHOT_SQL.count("?")


def snapshot(ledger: Ledger, task_id: int, conn: sqlite3.Connection | None = None) -> chain.Snapshot:
    """The guard's one read: every input of ``chain.close_reasons`` in one statement (on the caller's ``conn``
    inside its transaction, else on its own), so no write can land between two of its parts."""
    params = (task_id,) * _SNAPSHOT_PARAMS
    rows = conn.execute(_SNAPSHOT_SQL, params).fetchall() if conn is not None else \
        [tuple(r.values()) for r in ledger.all(_SNAPSHOT_SQL, params)]
    task = next((r for r in rows if r[0] == "task"), None)
    if task is None:
        get_task(ledger, task_id, conn)            # raises the one-line "no task N"
    _, state, round_, head, base, pushed, spec = task
    parts: dict[str, list] = {}
    for r in rows:
        parts.setdefault(r[0], []).append(r)
    approvals: dict[str, set[str]] = {}
    for _, stage, dim, sha, *_rest in parts.get("approval", []):
        approvals.setdefault(f"{stage}:{dim}", set()).add(sha)
    prs = parts.get("pr", [])
    return chain.Snapshot(
        task_id=task_id, state=state, round=int(round_), head_sha=head, base_sha=base, pushed_sha=pushed,
        spec_path=spec, from_conclusion=any(r[1] == "fix" for r in parts.get("conclusion", [])),
        steps={r[1]: r[2] for r in parts.get("step", [])}, implementer_complete="implementer" in parts,
        committed_round="committed" in parts, checks_passed={r[1] for r in parts.get("check", [])},
        approvals=approvals, pr_head=prs[0][1] if prs else None,
        proofs_refused={r[1] for r in parts.get("refused", [])})


def set_step(ledger: Ledger, task_id: int, key: str, status: str, evidence: str | None,
             source: str = "human", actor: str | None = None, claim_token: str | None = None) -> dict:
    """Close (ja), mark not applicable (n_a) or reopen (nein) a step, through the one guard.

    Both ``agent task close-step`` and ``agent checklist set`` call this; so does the fixer.
    """
    actor = actor or (source if source in ("human", "script", "lane") else "human")
    with ledger.tx() as c:
        check_claim(c, task_id, claim_token)
        snap = snapshot(ledger, task_id, c)
        reasons = chain.close_reasons(snap, key, status, source, evidence)
        if reasons:
            raise Refused(reasons, prefix=f"task {task_id} step {key}: ")
        head = snap.head_sha if status == chain.StepStatus.DONE else None
        ledger.update(c, "steps", {"task_id": task_id, "key": key}, {
            "status": str(status), "evidence": evidence.strip(), "source": source, "head_sha": head,
            "round": snap.round, "closed_at": now() if status in chain.CLOSED else None})
        if snap.state == chain.OPEN and status in chain.CLOSED:
            transition_in(ledger, c, task_id, snap.state, chain.WORKING, actor, f"{key} closed")
        if snap.state == chain.BLOCKED and status in chain.CLOSED and source == "human":
            # the task waited for exactly this human step: closing it is the human's go-ahead
            why = c.execute("SELECT blocked_reason FROM tasks WHERE id = ?", (task_id,)).fetchone()[0] or ""
            if why.startswith(f"{HUMAN_STEP_PENDING} {key}"):
                transition_in(ledger, c, task_id, snap.state, chain.WORKING, "human", f"{key} closed by a human")
        ledger.event(c, "step.reopened" if status == chain.StepStatus.NOT_DONE else "step.closed", actor,
                     {"key": key, "status": status, "source": source, "evidence": evidence.strip(),
                      "head": head, "round": snap.round}, task_id=task_id)
        return {"task_id": task_id, "key": key, "status": status, "head": head, "round": snap.round}


def transition_in(ledger: Ledger, c: sqlite3.Connection, task_id: int, current: str, target: str,
                  actor: str, reason: str, evidence: list[str] | None = None, **fields: Any) -> None:
    """Change a task's state inside the caller's transaction ``c``, if the state machine allows it, with its event."""
    blocked_reason = None
    if current == chain.BLOCKED:
        blocked_reason = c.execute("SELECT blocked_reason FROM tasks WHERE id = ?", (task_id,)).fetchone()[0]
    why = chain.check_transition(current, target, actor, evidence, blocked_reason)
    if why:
        raise Refused([why], prefix=f"task {task_id}: ")
    values = {"state": target, "updated_at": now(), **fields}
    if target == chain.BLOCKED:
        values["blocked_reason"] = reason
    elif target == chain.FAILED:
        values["failed_reason"] = reason
    elif target == chain.WORKING:
        values.setdefault("blocked_reason", None)
    ledger.update(c, "tasks", {"id": task_id}, values)
    ledger.event(c, "task.state", actor, {"from": current, "to": target, "reason": reason,
                                          **({"evidence": list(evidence)} if evidence else {})}, task_id=task_id)
    if target == chain.FAILED:  # a failed task's lesson never steers a lane (a reset makes a new one)
        from agent.ledger.lessons import discard_in

        discard_in(ledger, c, task_id, f"task failed: {reason[:200]}")


def transition(ledger: Ledger, task_id: int, target: str, actor: str, reason: str,
               claim_token: str | None = None, **fields: Any) -> None:
    """Move a task to another state through the state machine, with its event."""
    with ledger.tx() as c:
        check_claim(c, task_id, claim_token)
        t = get_task(ledger, task_id, c)
        transition_in(ledger, c, task_id, t["state"], target, actor, reason, **fields)


def note_wait(ledger: Ledger, task_id: int, reason: str | None, claim_token: str | None = None) -> bool:
    """Record why a working task waits (None: it moves again), with an event when the reason changes.

    Returns True when it changed: a scan prints a wait only then, so a cron tick that changed nothing is silent.
    """
    reason = " ".join(reason.split())[:500] if reason else None
    with ledger.tx() as c:
        check_claim(c, task_id, claim_token)
        row = c.execute("SELECT wait_reason FROM tasks WHERE id = ?", (task_id,)).fetchone()
        if row is None or row[0] == reason:
            return False
        ledger.update(c, "tasks", {"id": task_id}, {"wait_reason": reason})
        ledger.event(c, "task.waiting" if reason else "task.moving", "script",
                     {"reason": reason} if reason else {"waited_for": row[0]}, task_id=task_id)
        return True


def _reopen_round_steps(ledger: Ledger, c: sqlite3.Connection, task_id: int, new_round: int, feedback: str) -> None:
    """A new round: every step after ``spec_written`` reopened (``nein``) with the feedback as evidence."""
    for key in chain.ROUND_STEPS:
        ledger.update(c, "steps", {"task_id": task_id, "key": key},
                      {"status": chain.StepStatus.NOT_DONE.value, "evidence": f"round {new_round}: {feedback[:200]}",
                       "source": "script", "head_sha": None, "round": new_round, "closed_at": None})


def start_next_round(ledger: Ledger, task_id: int, feedback: str, actor: str = "script",
                     claim_token: str | None = None, free: bool = False, **fields: Any) -> tuple[bool, int]:
    """A rejected round: reopen the round steps and count up, or fail the task at the round cap.

    ``free``: the round is not the work's fault (its workspace was lost): the cap grows by one with it.
    ``fields`` are written to the task with the new round (e.g. the head the round starts from).
    Returns (started, round) — started is False when the cap failed the task.
    """
    with ledger.tx() as c:
        check_claim(c, task_id, claim_token)
        t = get_task(ledger, task_id, c)
        if not free and chain.round_exhausted(t["round"], t["round_cap"]):
            transition_in(ledger, c, task_id, t["state"], chain.FAILED, actor,
                        f"round cap {t['round_cap']} reached; last feedback: {feedback[:300]}")
            return False, t["round"]
        new_round = t["round"] + 1
        if free:
            fields["round_cap"] = t["round_cap"] + 1
        _reopen_round_steps(ledger, c, task_id, new_round, feedback)
        transition_in(ledger, c, task_id, t["state"], chain.WORKING, actor,
                    f"round {new_round}", round=new_round, **fields)
        ledger.event(c, "round.started", actor, {"round": new_round, "feedback": feedback[:2000], "free": free,
                                                 **{k: v for k, v in fields.items() if k != "round_cap"}},
                     task_id=task_id)
        return True, new_round


def start_feedback_round(ledger: Ledger, c: sqlite3.Connection, task_id: int, evidence: list[str], feedback: str,
                         trigger: str, actor: str = "script") -> int:
    """Inside the caller's transaction: a done task's PR got feedback (or its CI failed): reopen the round steps
    and count up, done -> working with the item keys as evidence.  The caller checked the caps
    (``chain.feedback_round_refusal``).  Returns the new round."""
    t = get_task(ledger, task_id, c)
    new_round = t["round"] + 1
    why = chain.check_transition(t["state"], chain.WORKING, actor, evidence)
    if why:
        raise Refused([why], prefix=f"task {task_id}: ")
    _reopen_round_steps(ledger, c, task_id, new_round, feedback)
    transition_in(ledger, c, task_id, t["state"], chain.WORKING, actor, f"round {new_round}: {feedback[:300]}",
                  evidence=evidence, round=new_round)
    ledger.event(c, "round.started", actor, {"round": new_round, "feedback": feedback[:2000], "trigger": trigger,
                                             "evidence": list(evidence)}, task_id=task_id)
    return new_round


def task_budget(ledger: Ledger, task_id: int, default_usd: float) -> tuple[float, float, bool]:
    """(spent, budget, since_reset): lane spend counted since the task's last reset (all of it if never reset),
    against the budget that reset set (``--budget``) or ``default_usd`` (limits.task_budget_usd)."""
    import json

    last = ledger.one("SELECT ts, payload FROM events WHERE task_id = ? AND kind = 'task.reset' "
                      "ORDER BY id DESC LIMIT 1", (task_id,))
    since = last["ts"] if last else ""
    budget = json.loads(last["payload"] or "{}").get("budget") if last else None
    spent = ledger.scalar("SELECT coalesce(sum(cost_usd), 0) FROM lane_runs WHERE task_id = ? AND started_at >= ?",
                          (task_id, since)) or 0.0
    return float(spent), float(budget if budget is not None else default_usd), last is not None


def reset_task(ledger: Ledger, task_id: int, reason: str, rounds: int | None = None,
               budget: float | None = None) -> dict:
    """A human puts a gate-blocked or failed task back to work; ``rounds`` grants N more rounds.

    Budget spend is counted from the reset on, so a budget gate-block does not come straight back; ``budget``
    sets what the task may spend from now (default: limits.task_budget_usd).
    """
    if not (reason or "").strip():
        raise AgentError("reason is empty; say why the task may go on (--reason TEXT)")
    if rounds is not None and rounds < 1:
        raise AgentError(f"--rounds must be >= 1, got {rounds}")
    if budget is not None and not budget > 0:
        raise AgentError(f"--budget must be a number of USD > 0, got {budget:g}")
    with ledger.tx() as c:
        t = get_task(ledger, task_id, c)
        if t["state"] not in (chain.BLOCKED, chain.FAILED):
            raise Refused([f"task {task_id} is {t['state']}; only gate-blocked or failed tasks are reset"])
        fields: dict[str, Any] = {"failed_reason": None, "blocked_reason": None,
                                  "claim_owner": None, "claim_pid": None, "claim_token": None, "lease_until": None}
        cap = t["round_cap"]
        if rounds is not None:
            cap = t["round"] + rounds
        elif t["state"] == chain.FAILED and chain.round_exhausted(t["round"], cap):
            cap = t["round"] + 1
        fields["round_cap"] = cap
        transition_in(ledger, c, task_id, t["state"], chain.WORKING, "human", reason.strip(), **fields)
        ledger.event(c, "task.reset", "human", {"reason": reason.strip(), "rounds": rounds, "budget": budget,
                                                "from": t["state"], "round_cap": cap}, task_id=task_id)
        return {"task_id": task_id, "state": chain.WORKING, "round": t["round"], "round_cap": cap, "budget": budget}


def open_task_needs(ledger: Ledger) -> list[dict]:
    """Open and working tasks with what they need from the config: their repository (and base commit, for the
    repository's own .agent/config.yaml lanes)."""
    return ledger.all("SELECT id, repo, base_sha FROM tasks WHERE state IN (?, ?) ORDER BY id",
                      (chain.OPEN, chain.WORKING))


def config_blocked_tasks(ledger: Ledger) -> list[dict]:
    """Gate-blocked tasks whose block the config caused (``chain.CONFIG_BLOCK``)."""
    return ledger.all("SELECT id, repo, base_sha, blocked_reason FROM tasks WHERE state = ? AND "
                      "substr(blocked_reason, 1, ?) = ? ORDER BY id",
                      (chain.BLOCKED, len(chain.CONFIG_BLOCK), chain.CONFIG_BLOCK))


def lift_config_block(ledger: Ledger, task_id: int, why: str) -> bool:
    """Put a config-blocked task back to work (the config is valid for it again); False if it is no longer one."""
    with ledger.tx() as c:
        t = get_task(ledger, task_id, c)
        if t["state"] != chain.BLOCKED or not (t["blocked_reason"] or "").startswith(chain.CONFIG_BLOCK):
            return False
        transition_in(ledger, c, task_id, t["state"], chain.WORKING, "script", why)
        ledger.event(c, "task.unblocked", "script", {"reason": why, "was": t["blocked_reason"]}, task_id=task_id)
        return True


TASK_COLUMNS = ("t.id, t.error_id, t.repo, t.branch, t.state, t.round, t.round_cap, t.title, t.blocked_reason, "
                "t.failed_reason, t.wait_reason, t.head_sha, t.updated_at, p.url AS pr_url, "
                "(SELECT coalesce(sum(cost_usd), 0) FROM lane_runs r WHERE r.task_id = t.id) AS cost_usd")


def iter_tasks(ledger: Ledger, state: str | None = None, since: str | None = None,
               limit: int | None = None) -> Listing:
    """Tasks in id order; with ``limit``, the newest ``limit`` of them (``since``: updated at or after then)."""
    return Listing(ledger, TASK_COLUMNS, "tasks t LEFT JOIN prs p ON p.task_id = t.id",
                   [("t.state = ?", state), ("t.updated_at >= ?", since)], [("t.id", "id", False)], limit, tail=True)


def list_tasks(ledger: Ledger, state: str | None = None) -> list[dict]:
    return list(iter_tasks(ledger, state))


def task_detail(ledger: Ledger, task_id: int) -> dict:
    from agent.ledger.feedback import feedback_items

    t = get_task(ledger, task_id)
    order = {k: i for i, k in enumerate(chain.STEP_KEYS)}
    steps = sorted(ledger.all("SELECT key, kind, status, source, evidence, head_sha AS head, round, closed_at "
                              "FROM steps WHERE task_id = ?", (task_id,)), key=lambda s: order.get(s["key"], 99))
    t["steps"] = steps
    t["lane_runs"] = ledger.all("SELECT id, round, role, vendor, status, findings_count, session_id, exit_code, "
                                "cost_usd, head_sha, reason, started_at, ended_at FROM lane_runs "
                                "WHERE task_id = ? ORDER BY id", (task_id,))
    t["checks"] = ledger.all("SELECT id, round, command, exit_code, passed, head_sha, duration_s, created_at "
                             "FROM checks WHERE task_id = ? ORDER BY id", (task_id,))
    t["gates"] = ledger.all("SELECT id, round, stage, dimension, verdict, findings_count, head_sha, lane_run_id "
                            "FROM gates WHERE task_id = ? ORDER BY id", (task_id,))
    t["pr"] = ledger.one("SELECT forge, repo, number, url, head_sha, state, draft FROM prs WHERE task_id = ?",
                         (task_id,))
    from agent.ledger.proofs import proof_for_head, summary

    p = proof_for_head(ledger, task_id, t["head_sha"]) if t["head_sha"] else None
    t["proof"] = None if p is None else {
        "verdict": p["verdict"], "proven": p["verdict"] == "proven", "summary": summary(p),
        "reproduces": p["reproduces"], "flipped": p["flipped"], "command": p["command"], "head_sha": p["head_sha"]}
    t["pr_feedback"] = [{k: r[k] for k in ("key", "kind", "author", "path", "line", "state", "decision", "reason",
                                           "round")} for r in feedback_items(ledger, task_id)]
    return t


# ------------------------------------------------------------------ reads the fixer, the demo and notify need


def find_task(ledger: Ledger, task_id: int) -> dict | None:
    return ledger.one("SELECT * FROM tasks WHERE id = ?", (task_id,))


def work_queue(ledger: Ledger) -> tuple[list[dict], list[int]]:
    """What `watch error-fix-work` looks at, in one read (one round trip on PostgreSQL): the config-blocked tasks
    (as ``config_blocked_tasks``) and the open and working task ids (as ``active_task_ids``), oldest first."""
    rows = ledger.all("SELECT id, state, repo, base_sha, blocked_reason FROM tasks WHERE state IN (?, ?) "
                      "OR (state = ? AND substr(blocked_reason, 1, ?) = ?) ORDER BY id",
                      (chain.OPEN, chain.WORKING, chain.BLOCKED, len(chain.CONFIG_BLOCK), chain.CONFIG_BLOCK))
    blocked = [{k: r[k] for k in ("id", "repo", "base_sha", "blocked_reason")} for r in rows
               if r["state"] == chain.BLOCKED]
    return blocked, [r["id"] for r in rows if r["state"] != chain.BLOCKED]


def active_task_ids(ledger: Ledger) -> list[int]:
    """Open and working tasks, oldest first (`watch error-fix-work`)."""
    return [r["id"] for r in ledger.all("SELECT id FROM tasks WHERE state IN (?, ?) ORDER BY id",
                                        (chain.OPEN, chain.WORKING))]


def first_task(ledger: Ledger) -> dict | None:
    return ledger.one("SELECT id, state, round FROM tasks ORDER BY id LIMIT 1")


def task_state(ledger: Ledger, task_id: int) -> dict | None:
    return ledger.one("SELECT state, round FROM tasks WHERE id = ?", (task_id,))


def wait_reason(ledger: Ledger, task_id: int) -> str | None:
    return ledger.scalar("SELECT wait_reason FROM tasks WHERE id = ?", (task_id,))


def task_commits(ledger: Ledger, task_id: int) -> list[dict]:
    """The task's recorded commits (``id``, ``sha``, ``round``) in order."""
    return ledger.all("SELECT id, sha, round FROM commits WHERE task_id = ? ORDER BY id", (task_id,))


def passing_check(ledger: Ledger, task_id: int, head: str | None) -> dict | None:
    """The newest passing check of ``head`` (command, exit code)."""
    return ledger.one("SELECT command, exit_code FROM checks WHERE task_id = ? AND head_sha = ? AND passed = 1 "
                      "ORDER BY id DESC LIMIT 1", (task_id, head))


def latest_check(ledger: Ledger, task_id: int, head: str | None) -> dict | None:
    """The newest check of ``head`` (command, passed, duration)."""
    return ledger.one("SELECT command, passed, duration_s FROM checks WHERE task_id = ? AND head_sha = ? "
                      "ORDER BY id DESC LIMIT 1", (task_id, head))


# ------------------------------------------------------------------ artifacts: each written by one operation


def set_branch_if_unset(ledger: Ledger, c: sqlite3.Connection, task_id: int, branch: str) -> None:
    """Inside the caller's transaction: the task's branch name, once (`watch error-fix` names it)."""
    if c.execute("SELECT branch FROM tasks WHERE id = ?", (task_id,)).fetchone()[0] is None:
        ledger.update(c, "tasks", {"id": task_id}, {"branch": branch})


def begin_fix(ledger: Ledger, task_id: int, error_id: str, branch: str, *, claim_token: str | None) -> None:
    """A task made from a fix conclusion: its branch named (once) and its error ``fixing`` (through the error state
    machine), in one transaction under the task's claim."""
    from agent.ledger.errors import transition_error

    with claimed_tx(ledger, task_id, claim_token) as c:
        set_branch_if_unset(ledger, c, task_id, branch)
        transition_error(ledger, c, error_id, chain.E_FIXING, "script", payload={"task_id": task_id})


def record_spec(ledger: Ledger, task_id: int, path: str, round: int, *, claim_token: str | None) -> None:
    """The spec of a round (the guard's artifact of ``spec_written``)."""
    with claimed_tx(ledger, task_id, claim_token) as c:
        ledger.update(c, "tasks", {"id": task_id}, {"spec_path": path, "updated_at": now()})
        ledger.event(c, "spec.written", "script", {"path": path, "round": round}, task_id=task_id)


def record_commit(ledger: Ledger, task_id: int, round: int, sha: str, parent: str | None, message: str, *,
                  claim_token: str | None) -> None:
    """A round's commit, which becomes the task's head (the artifact of ``committed``)."""
    with claimed_tx(ledger, task_id, claim_token) as c:
        ledger.insert(c, "commits", {"task_id": task_id, "round": round, "sha": sha, "parent": parent,
                                     "message": message, "created_at": now()})
        ledger.update(c, "tasks", {"id": task_id}, {"head_sha": sha, "updated_at": now()})
        ledger.event(c, "commit.recorded", "script", {"sha": sha, "round": round}, task_id=task_id)


def forget_commits(ledger: Ledger, task_id: int, commits: list[dict], *, claim_token: str | None) -> None:
    """Commits the repository no longer has leave the commits table (a lost workspace); the events keep them."""
    with claimed_tx(ledger, task_id, claim_token) as c:
        for r in commits:
            ledger.delete(c, "commits", {"id": r["id"]})
            ledger.event(c, "commit.lost", "script", {"sha": r["sha"], "round": r["round"]}, task_id=task_id)


def record_check(ledger: Ledger, task_id: int, round: int, *, command: str, exit_code: int | None, passed: bool,
                 head: str, output_path: str, duration_s: float, status: str, claim_token: str | None) -> None:
    """A check result bound to the head it ran on (the artifact of ``local_check_pass``)."""
    with claimed_tx(ledger, task_id, claim_token) as c:
        ledger.insert(c, "checks", {"task_id": task_id, "round": round, "command": command,
                                    "exit_code": exit_code, "passed": int(passed), "head_sha": head,
                                    "output_path": output_path, "duration_s": duration_s,
                                    "created_at": now()})
        ledger.event(c, "check.recorded", "script", {"passed": passed, "exit_code": exit_code, "head": head,
                                                      "status": status}, task_id=task_id)


def record_gate(ledger: Ledger, task_id: int, round: int, *, stage: str, dimension: str, verdict: str,
                findings: int | None, head: str | None, lane_run_id: int | None, claim_token: str | None) -> None:
    """A reviewer's verdict on a head (the artifact of the review steps)."""
    with claimed_tx(ledger, task_id, claim_token) as c:
        ledger.insert(c, "gates", {"task_id": task_id, "round": round, "stage": stage, "dimension": dimension,
                                   "verdict": verdict, "findings_count": findings, "head_sha": head,
                                   "lane_run_id": lane_run_id, "created_at": now()})
        ledger.event(c, "gate.recorded", "lane", {"stage": stage, "dimension": dimension, "verdict": verdict,
                                                  "findings": findings, "head": head, "lane_run_id": lane_run_id},
                     task_id=task_id)


def record_push(ledger: Ledger, task_id: int, *, sha: str, pushed: bool, forced: bool, branch: str,
                claim_token: str | None) -> None:
    """The head on the task's remote branch (the artifact of ``pushed``)."""
    with claimed_tx(ledger, task_id, claim_token) as c:
        ledger.update(c, "tasks", {"id": task_id}, {"pushed_sha": sha, "updated_at": now()})
        ledger.event(c, "branch.pushed", "script", {"sha": sha, "pushed": pushed, "forced": forced,
                                                    "branch": branch}, task_id=task_id)


def record_workspace(ledger: Ledger, task_id: int, *, path: str, branch: str, base_sha: str | None,
                     old_base_sha: str | None, created: bool, replaced_lost: bool, claim_token: str | None,
                     start_at: str | None = None, taken_over_from: str | None = None, head: str | None = None,
                     own_lanes: str | None = None) -> list[int]:
    """The task's worktree is ready (made, or made again), with the base commit it starts from.

    ``taken_over_from`` (the worktree of another runner's home, which advanced the task last): in the same
    transaction the lane runs of the task that are still ``running`` and were not started by this home (their run
    dir is not under ``own_lanes``) become ``interrupted``, and ``task.taken_over`` names them. Returns their ids."""
    from agent.ledger.lanes import interrupt_run

    interrupted: list[int] = []
    with claimed_tx(ledger, task_id, claim_token) as c:
        ledger.update(c, "tasks", {"id": task_id}, {"worktree": path, "branch": branch, "base_sha": base_sha,
                                                    "updated_at": now()})
        ledger.event(c, "workspace.ready", "script", {"path": path, "branch": branch, "created": created,
                                                      "replaced_lost": replaced_lost, "start_at": start_at},
                     task_id=task_id)
        if taken_over_from:
            reason = "its runner stopped; the task was taken over"
            for r in c.execute("SELECT id, log_dir FROM lane_runs WHERE task_id = ? AND status = 'running'",
                               (task_id,)).fetchall():
                if own_lanes and (r["log_dir"] or "").startswith(own_lanes):
                    continue
                if interrupt_run(ledger, r["id"], reason, task_id=task_id, claim_token=claim_token, conn=c):
                    interrupted.append(r["id"])
            ledger.event(c, "task.taken_over", "script", {"from_worktree": taken_over_from, "to": path, "head": head,
                                                          "start_at": start_at, "interrupted_runs": interrupted},
                         task_id=task_id)
        if old_base_sha and base_sha != old_base_sha:
            ledger.event(c, "workspace.base_replaced", "script", {"old": old_base_sha, "new": base_sha},
                         task_id=task_id)
    return interrupted


def finished_worktrees(ledger: Ledger, finished_before: str) -> list[dict]:
    """Tasks that still have a worktree though they are over: failed, or their PR merged or closed, and that
    since before ``finished_before`` (a ``now()`` timestamp)."""
    d, pr_updated = ledger.dialect, "coalesce(p.updated_at, '')"
    return ledger.all(
        "SELECT t.id, t.repo, t.state, t.worktree, t.branch, t.head_sha, p.state AS pr_state "
        f"FROM tasks t {d.indexed_by('idx_tasks_with_worktree')} LEFT JOIN prs p ON p.task_id = t.id "
        "WHERE t.worktree IS NOT NULL "
        "AND (t.state = 'failed' OR (t.state IN ('done', 'gate-blocked') AND p.state IN ('merged', 'closed'))) "
        f"AND {d.greatest('t.updated_at', pr_updated)} < ? ORDER BY t.id",
        (finished_before,))


def record_workspace_removed(ledger: Ledger, task_id: int, *, path: str, branch: str | None, why: str,
                             kept_head: str | None, claim_token: str | None) -> None:
    """A finished task's worktree is gone (`watch pr-merged`)."""
    with claimed_tx(ledger, task_id, claim_token) as c:
        ledger.update(c, "tasks", {"id": task_id}, {"worktree": None})
        ledger.event(c, "workspace.removed", "script", {"path": path, "branch": branch, "why": why,
                                                        "kept_head": kept_head}, task_id=task_id)


def finish_task(ledger: Ledger, task_id: int, reason: str, *, claim_token: str | None) -> None:
    """All steps closed on one head: the task is done. (Its lesson stays a candidate until its PR is merged.)"""
    with claimed_tx(ledger, task_id, claim_token) as c:
        t = get_task(ledger, task_id, c)
        transition_in(ledger, c, task_id, t["state"], chain.DONE, "script", reason)
