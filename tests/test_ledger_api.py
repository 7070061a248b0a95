"""The ledger API's rules, each on a real SQLite ledger (DESIGN.md "Ledger API"):

- every task write takes the claim token and checks it in its own transaction: a wrong token writes nothing;
- every write's event is in the same transaction as the change: an event that cannot be written takes the change
  with it (a lane run's outcome and ``lane.finished`` included);
- the guard's snapshot is one read (one transaction), and each of the guard's inputs has exactly one writer;
- `watch error-fix` prepares a task's worktree only under the task's claim;
- errors move only along ``chain.ERROR_TRANSITIONS`` (``transition_error``), each move with its event.
"""

from __future__ import annotations

import ast
import sqlite3
import time
from pathlib import Path

import pytest

from agent.domain import chain
from agent.coord.claims import claim
from agent.ledger import Ledger, errors, eventlog, lanes, ledger_path, lessons, prs, tasks
from agent.ledger.errors import ErrorStateRefused, transition_error
from agent.ledger.tasks import ClaimLost

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def led(tmp_path):
    ledger = Ledger.open(ledger_path(tmp_path))
    yield ledger
    ledger.close()


def _error(led, state="open") -> str:
    eid = errors.new_error_id()
    with led.tx() as c:
        led.insert(c, "errors", {"id": eid, "fingerprint": "fp-" + eid, "service": "svc", "count": 1,
                                 "state": state, "created_at": "2026-01-01T00:00:00Z",
                                 "first_seen": "2026-01-01T00:00:00Z", "last_seen": "2026-01-01T00:00:00Z"})
    return eid


def _task(led) -> tuple[int, str]:
    """A task made from a confirmed fix conclusion, and the error it fixes."""
    eid = _error(led)
    with led.tx() as c:
        cid = errors.insert_conclusion(led, c, eid, "fix", "the brief", "human", None)
    task_id, _ = tasks.create_task(led, "acme/widgets", "fix it", error_id=eid, conclusion_id=cid, actor="script")
    return task_id, eid


def _connect(where):
    if isinstance(where, str):   # a PostgreSQL ledger (--ledger=postgres)
        from agent.ledger.backend import connect_pg

        return connect_pg(where)
    return sqlite3.connect(where)


def _dump(where) -> dict:
    """Every row of every table, read through a connection of its own (what is committed)."""
    con = _connect(where)
    try:
        if isinstance(where, str):
            names = [r[0] for r in con.execute("SELECT table_name FROM information_schema.tables "
                                               "WHERE table_schema = current_schema() ORDER BY table_name")]
            return {n: sorted(tuple(r) for r in con.execute(f'SELECT * FROM "{n}"').fetchall()) for n in names}
        names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                           "AND name NOT LIKE 'sqlite_%' ORDER BY name")]
        return {n: con.execute(f'SELECT * FROM "{n}"').fetchall() for n in names}
    finally:
        con.close()


def _events(where) -> int:
    con = _connect(where)
    try:
        return con.execute("SELECT count(*) FROM events").fetchone()[0]
    finally:
        con.close()


def _run(led, t, tok):
    return lanes.start_run(led, task_id=t, error_id=None, round=1, role="implementer", vendor="v",
                           head_sha=None, claim_token=tok)


def _pr_values():
    return {"forge": "local", "repo": "acme/widgets", "number": 1, "url": "file:///pr/1", "head_branch": "agent/x",
            "head_sha": "a" * 40, "base": "main", "state": "open", "draft": 1, "title": "t", "body": "b",
            "body_hash": "h"}


# (name, setup(led, task, error, good_token) -> context, write(led, task, error, token, context), writes an event)
TASK_WRITES = [
    ("record_spec", None, lambda led, t, e, tok, x: tasks.record_spec(led, t, "/s/round-1.md", 1, claim_token=tok),
     True),
    ("record_commit", None, lambda led, t, e, tok, x: tasks.record_commit(led, t, 1, "a" * 40, None, "msg",
                                                                         claim_token=tok), True),
    ("forget_commits",
     lambda led, t, e, tok: tasks.record_commit(led, t, 1, "a" * 40, None, "msg", claim_token=tok),
     lambda led, t, e, tok, x: tasks.forget_commits(led, t, tasks.task_commits(led, t), claim_token=tok), True),
    ("record_check", None, lambda led, t, e, tok, x: tasks.record_check(
        led, t, 1, command="make test", exit_code=0, passed=True, head="a" * 40, output_path="/o", duration_s=1.0,
        status="ok", claim_token=tok), True),
    ("record_gate", lambda led, t, e, tok: _run(led, t, tok), lambda led, t, e, tok, run: tasks.record_gate(
        led, t, 1, stage="review", dimension="code", verdict="approve", findings=0, head="a" * 40, lane_run_id=run,
        claim_token=tok), True),
    ("record_push", None, lambda led, t, e, tok, x: tasks.record_push(
        led, t, sha="a" * 40, pushed=True, forced=False, branch="agent/x", claim_token=tok), True),
    ("record_workspace", None, lambda led, t, e, tok, x: tasks.record_workspace(
        led, t, path="/w", branch="agent/x", base_sha="b" * 40, old_base_sha=None, created=True,
        replaced_lost=False, claim_token=tok), True),
    ("record_workspace_removed", None, lambda led, t, e, tok, x: tasks.record_workspace_removed(
        led, t, path="/w", branch="agent/x", why="done", kept_head=None, claim_token=tok), True),
    ("begin_fix", None, lambda led, t, e, tok, x: tasks.begin_fix(led, t, e, "agent/fix-x", claim_token=tok), True),
    ("finish_task", lambda led, t, e, tok: tasks.transition(led, t, chain.WORKING, "script", "go", claim_token=tok),
     lambda led, t, e, tok, x: tasks.finish_task(led, t, "all approved", claim_token=tok), True),
    ("set_step", lambda led, t, e, tok: tasks.record_spec(led, t, "/s/round-1.md", 1, claim_token=tok),
     lambda led, t, e, tok, x: tasks.set_step(led, t, "spec_written", "ja", "auto spec", source="script",
                                              actor="script", claim_token=tok), True),
    ("transition", None, lambda led, t, e, tok, x: tasks.transition(led, t, chain.BLOCKED, "script", "why",
                                                                    claim_token=tok), True),
    ("note_wait", None, lambda led, t, e, tok, x: tasks.note_wait(led, t, "waiting for a slot", tok), True),
    ("start_next_round", None, lambda led, t, e, tok, x: tasks.start_next_round(led, t, "again", claim_token=tok),
     True),
    ("lane start_run", None, lambda led, t, e, tok, x: _run(led, t, tok), True),
    ("lane update_run", lambda led, t, e, tok: _run(led, t, tok),
     lambda led, t, e, tok, run: lanes.update_run(led, run, {"pid": 4242}, task_id=t, claim_token=tok), False),
    ("lane finish_run", lambda led, t, e, tok: _run(led, t, tok),
     lambda led, t, e, tok, run: lanes.finish_run(led, run, {"status": "complete", "summary": "done"},
                                                  {"run_id": run, "status": "complete"}, task_id=t, error_id=None,
                                                  claim_token=tok), True),
    ("lane interrupt_run", lambda led, t, e, tok: _run(led, t, tok),
     lambda led, t, e, tok, run: lanes.interrupt_run(led, run, "killed", task_id=t, claim_token=tok), True),
    ("record_pr", None, lambda led, t, e, tok, x: prs.record_pr(led, t, _pr_values(), "created", "script",
                                                                claim_token=tok), True),
    ("propose_lesson", None, lambda led, t, e, tok, x: lessons.propose_lesson(
        led, t, "carts can be empty", None, lane_run_id=None, round_=1, claim_token=tok), True),
]


@pytest.mark.parametrize("name,setup,write,evented", TASK_WRITES, ids=[w[0] for w in TASK_WRITES])
def test_a_task_write_with_a_lost_claim_writes_nothing(led, name, setup, write, evented):
    t, e = _task(led)
    good = claim(led, t)
    context = setup(led, t, e, good) if setup else None
    before = _dump(led.location)
    with pytest.raises(ClaimLost):
        write(led, t, e, "someone-else", context)
    assert _dump(led.location) == before, f"{name} wrote with a token that is not the claim"
    write(led, t, e, good, context)       # the holder's write goes through, with its event
    after = _dump(led.location)
    assert after != before
    assert (len(after["events"]) > len(before["events"])) == evented


@pytest.mark.parametrize("name,setup,write,evented", [w for w in TASK_WRITES if w[3]],
                         ids=[w[0] for w in TASK_WRITES if w[3]])
def test_a_write_and_its_event_are_one_transaction(led, monkeypatch, name, setup, write, evented):
    """If the event cannot be written, the change is not either (``lane finish_run``: the run's final status and
    ``lane.finished``)."""
    t, e = _task(led)
    good = claim(led, t)
    context = setup(led, t, e, good) if setup else None
    before = _dump(led.location)

    def no_event(*args, **kwargs):
        raise RuntimeError("event log unavailable")

    monkeypatch.setattr(led, "event", no_event)
    with pytest.raises(RuntimeError, match="event log unavailable"):
        write(led, t, e, good, context)
    assert _dump(led.location) == before, f"{name} kept its change without its event"


def test_a_lane_run_outcome_and_lane_finished_commit_together(led):
    t, _ = _task(led)
    tok = claim(led, t)
    run = _run(led, t, tok)
    lanes.finish_run(led, run, {"status": "complete", "summary": "s"}, {"run_id": run, "status": "complete"},
                     task_id=t, error_id=None, claim_token=tok)
    row = lanes.get_run(led, run)
    finished = [ev for ev in eventlog.events(led, task_id=t) if ev["kind"] == "lane.finished"]
    assert row["status"] == "complete" and row["ended_at"] and len(finished) == 1
    assert finished[0]["payload"]["run_id"] == run


@pytest.mark.sqlite_only("reads the statements through SQLite's trace callback")
def test_the_guards_snapshot_is_one_read(led):
    """``snapshot`` is one statement: one consistent view without a transaction (no BEGIN IMMEDIATE, so no write
    lock for a read) and one round trip on PostgreSQL."""
    t, _ = _task(led)
    seen: list[str] = []
    led.conn.set_trace_callback(lambda sql: seen.append(" ".join(sql.split())))
    try:
        snap = tasks.snapshot(led, t)
    finally:
        led.conn.set_trace_callback(None)
    assert snap.task_id == t and snap.from_conclusion and snap.round == 1 and snap.state == "open"
    assert len(seen) == 1 and seen[0].upper().startswith("SELECT"), seen


def test_the_guards_snapshot_reads_while_a_writer_holds_the_lock(led, monkeypatch):
    """Runners read the guard's snapshot while another holds the ledger's write lock (PostgreSQL's advisory lock,
    SQLite's BEGIN IMMEDIATE) and see only what that writer committed: the read neither waits for it nor sees
    its uncommitted step."""
    t, _ = _task(led)
    monkeypatch.setenv("AGENT_LEDGER_BUSY_TIMEOUT", "1")
    reader, writer = Ledger.open(led.location), Ledger.open(led.location)
    try:
        before = tasks.snapshot(reader, t)
        with writer.tx() as c:
            writer.update(c, "steps", {"task_id": t, "key": "spec_written"}, {"status": "ja"})
            start = time.monotonic()
            snap = tasks.snapshot(reader, t)
            waited = time.monotonic() - start
        assert snap.steps == before.steps and snap.steps["spec_written"] != "ja"
        assert waited < 1.0, waited
        assert tasks.snapshot(reader, t).steps["spec_written"] == "ja"
    finally:
        reader.close()
        writer.close()


# The guard's inputs (chain.Snapshot) and the one record operation that adds each (an INSERT of its table).
GUARD_INPUT_WRITERS = {
    "steps": {"create_task"},             # closed/reopened only by set_step and _reopen_round_steps (below)
    "lane_runs": {"start_run"},
    "commits": {"record_commit"},
    "checks": {"record_check"},
    "gates": {"record_gate"},
    "prs": {"record_pr"},
    "conclusions": {"insert_conclusion"},
}


def _writers() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Per table: the functions under agent/ that INSERT into it, and those that UPDATE it."""
    inserts: dict[str, set[str]] = {}
    updates: dict[str, set[str]] = {}
    for path in (ROOT / "agent").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and len(node.args) >= 3 \
                        and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                    kind = {"insert": inserts, "update": updates}.get(node.func.attr)
                    if kind is not None:
                        kind.setdefault(node.args[1].value, set()).add(fn.name)
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    words = node.value.split()
                    if len(words) > 2 and words[:2] == ["INSERT", "INTO"]:
                        inserts.setdefault(words[2].split("(")[0], set()).add(fn.name)
                    if len(words) > 2 and words[0] == "UPDATE" and words[2] == "SET":
                        updates.setdefault(words[1], set()).add(fn.name)
    return inserts, updates


def test_each_guard_input_has_exactly_one_writer():
    inserts, updates = _writers()
    for table, writers in GUARD_INPUT_WRITERS.items():
        assert inserts.get(table, set()) == writers, (table, inserts.get(table))
    assert updates["steps"] == {"set_step", "_reopen_round_steps"}, updates["steps"]
    # a lane run's status: started running, then finished, or interrupted (never written anywhere else)
    assert updates["lane_runs"] == {"update_run", "finish_run", "interrupt_run"}, updates["lane_runs"]
    assert updates["prs"] == {"record_pr", "record_pr_final"}, updates["prs"]
    assert updates["errors"] == {"transition_error"}, updates["errors"]


# ---------------------------------------------------------------------------------------------- error states


ALL_PAIRS = [(a, b) for a in chain.ERROR_STATES for b in chain.ERROR_STATES if a != b]


@pytest.mark.parametrize("current,target", ALL_PAIRS, ids=[f"{a}->{b}" for a, b in ALL_PAIRS])
def test_error_transitions_follow_the_one_table(led, current, target):
    eid = _error(led, current)
    allowed = target in chain.ERROR_TRANSITIONS[current]
    before = _events(led.location)
    if allowed:
        with led.tx() as c:
            assert transition_error(led, c, eid, target, "human", reason="because") is True
        row = errors.get_error(led, eid)
        assert row["state"] == target and row["state_reason"] == "because"
        ev = [e for e in eventlog.events(led) if e["kind"] == "error.state"][-1]
        assert ev["error_id"] == eid and ev["payload"]["from"] == current and ev["payload"]["to"] == target
        assert _events(led.location) == before + 1
    else:
        with pytest.raises(ErrorStateRefused, match=f"error {eid}: an error may not go from {current} to {target}"):
            with led.tx() as c:
                transition_error(led, c, eid, target, "human")
        assert errors.get_error(led, eid)["state"] == current and _events(led.location) == before


def test_error_transition_table_and_refusals(led):
    assert chain.ERROR_TRANSITIONS[chain.E_RESOLVED] == ()          # resolved is final: a recurrence is a new row
    assert chain.check_error_transition("open", "fixing") is None
    assert chain.check_error_transition("resolved", "open") == "an error may not go from resolved to open"
    assert chain.check_error_transition("open", "gone") == "unknown error state 'gone'"
    eid = _error(led, "fixing")
    with led.tx() as c:   # already there: nothing written, no event
        assert transition_error(led, c, eid, "fixing", "script") is False
    assert not [e for e in eventlog.events(led) if e["kind"] == "error.state"]
    with pytest.raises(Exception, match="no error with id 'nope'"):
        with led.tx() as c:
            transition_error(led, c, "nope", "fixing", "script")


def test_a_pr_merged_after_its_error_was_resolved_keeps_the_state_and_says_so(led):
    """The follow-up of a closed PR on an error already resolved: the state machine refuses resolved -> skipped,
    so the error keeps its state and an ``error.state_kept`` event says why (the PR and task still move)."""
    t, e = _task(led)
    tok = claim(led, t)
    prs.record_pr(led, t, _pr_values(), "created", "script", claim_token=tok)
    with led.tx() as c:
        transition_error(led, c, e, "fixing", "script")
        transition_error(led, c, e, "resolved", "script")
    row = prs.get_pr(led, t)
    assert prs.record_pr_final(led, row, "closed", True) == "closed"
    assert errors.get_error(led, e)["state"] == "resolved"
    kept = [ev for ev in eventlog.events(led) if ev["kind"] == "error.state_kept"]
    assert kept and kept[0]["payload"]["wanted"] == "skipped"
    assert prs.get_pr(led, t)["state"] == "closed"


# ---------------------------------------------------------------------------------------------- fix_scan


def test_fix_scan_prepares_a_worktree_only_under_the_tasks_claim(tmp_path, monkeypatch):
    """`watch error-fix` claims the new task before it names its branch, moves its error and makes its worktree
    (the git work is watched through the real ``ensure_worktree``: the claim is held while it runs), and releases
    the claim after."""
    from test_fixer import ingest_and_decide, scan

    from agent.app import demo

    from agent.git import workspace

    paths = demo.setup(tmp_path / "w")
    monkeypatch.setenv("AGENT_HOME", str(paths["home"]))
    eid = ingest_and_decide(paths)
    held_during: list = []
    real = workspace.ensure_worktree

    def watched(home, repo, url, base, branch, task_id, *args, **kwargs):
        con = _connect(ledger_path(paths["home"]))
        try:
            held_during.append(con.execute("SELECT claim_token, claim_pid FROM tasks WHERE id = ?",
                                           (task_id,)).fetchone())
        finally:
            con.close()
        return real(home, repo, url, base, branch, task_id, *args, **kwargs)

    monkeypatch.setattr(workspace, "ensure_worktree", watched)
    items = scan(paths, "error-fix")
    assert "task 1 created" in items[0]["line"], items
    import os

    assert held_during and held_during[0][0] and held_during[0][1] == os.getpid(), held_during
    led = Ledger.open(ledger_path(paths["home"]))
    try:
        t = tasks.get_task(led, 1)
        assert t["worktree"] and Path(t["worktree"]).is_dir() and t["branch"]
        assert t["claim_token"] is None                      # released after
        assert errors.get_error(led, eid)["state"] == "fixing"
        ready = [e for e in eventlog.events(led, task_id=1) if e["kind"] == "workspace.ready"]
        assert len(ready) == 1
    finally:
        led.close()
