"""The one close guard and the one state machine, through the library and both CLI commands."""

from __future__ import annotations

import itertools

import pytest

from agent.domain import chain
from agent.ledger import eventlog, ledger_path, now
from agent.ledger.tasks import Refused, create_task, reset_task, set_step, snapshot, start_next_round, transition

HEAD = "a" * 40
BASE = "b" * 40


def make_error(ledger, eid="0123456789abcdef"):
    with ledger.tx() as c:
        ledger.insert(c, "errors", {"id": eid, "fingerprint": "fp", "service": "svc", "environment": "prod",
                                    "class": "KeyError", "count": 3, "state": "open", "first_seen": now(),
                                    "last_seen": now()})
    return eid


def make_task(ledger, from_conclusion=False, kind="fix"):
    eid = make_error(ledger)
    cid = None
    if from_conclusion:
        with ledger.tx() as c:
            cid = ledger.insert(c, "conclusions", {"error_id": eid, "kind": kind, "brief": "b",
                                                   "decided_by": "human", "created_at": now()})
    tid, _ = create_task(ledger, "acme/widgets", "fix it", error_id=eid, conclusion_id=cid)
    return tid


def record(ledger, tid, what, head=HEAD):
    """Record an artifact the way the fixer will (lane run, commit, check, gate, push, PR)."""
    with ledger.tx() as c:
        rnd = c.execute("SELECT round FROM tasks WHERE id = ?", (tid,)).fetchone()[0]
        if what == "spec":
            ledger.update(c, "tasks", {"id": tid}, {"spec_path": "/tmp/spec.md"})
        elif what == "implementer":
            ledger.insert(c, "lane_runs", {"task_id": tid, "round": rnd, "role": "implementer", "vendor": "command",
                                           "status": "complete"})
        elif what == "commit":
            ledger.update(c, "tasks", {"id": tid}, {"head_sha": head, "base_sha": BASE})
            ledger.insert(c, "commits", {"task_id": tid, "round": rnd, "sha": head})
        elif what == "check":
            ledger.insert(c, "checks", {"task_id": tid, "round": rnd, "passed": 1, "head_sha": head})
        elif what.startswith("gate:"):
            _, stage, dim = what.split(":")
            run = ledger.insert(c, "lane_runs", {"task_id": tid, "round": rnd, "role": "reviewer",
                                                 "vendor": "command", "status": "complete"})
            ledger.insert(c, "gates", {"task_id": tid, "round": rnd, "stage": stage, "dimension": dim,
                                       "verdict": "approve", "head_sha": head, "lane_run_id": run})
        elif what == "push":
            ledger.update(c, "tasks", {"id": tid}, {"pushed_sha": head})
        elif what == "pr":
            ledger.insert(c, "prs", {"task_id": tid, "forge": "local", "repo": "acme/widgets", "number": 1,
                                     "state": "open", "head_sha": head})


ARTIFACT = {"spec_written": "spec", "implementer_done": "implementer", "committed": "commit",
            "local_check_pass": "check", "reviewer_approved": "gate:review:code", "pushed": "push",
            "pr_opened": "pr", "pr_quality_approved": "gate:pr:quality", "pr_logic_approved": "gate:pr:logic"}


def test_steps_are_ordered_with_kinds_and_needs():
    assert chain.STEP_KEYS[0] == "spec_written" and chain.STEP_BY_KEY["spec_written"].kind == "human"
    assert chain.STEP_BY_KEY["implementer_done"].kind == "lane"
    assert chain.STEP_BY_KEY["pr_quality_approved"].needs == chain.STEP_BY_KEY["pr_logic_approved"].needs
    for i, step in enumerate(chain.STEPS):
        for need in step.needs:
            assert chain.STEP_KEYS.index(need) < i


def test_unknown_step_and_missing_evidence(ledger):
    tid = make_task(ledger)
    snap = snapshot(ledger, tid)
    assert "unknown step" in chain.close_reasons(snap, "deploy", "ja", "human", "x")[0]
    assert any("evidence missing" in r for r in chain.close_reasons(snap, "spec_written", "ja", "human", "  "))


def test_wrong_source_for_human_step_and_the_carve_out(ledger):
    plain = make_task(ledger)
    record(ledger, plain, "spec")
    reasons = chain.close_reasons(snapshot(ledger, plain), "spec_written", "ja", "script", "auto spec")
    assert any("human step" in r for r in reasons)
    assert chain.close_reasons(snapshot(ledger, plain), "spec_written", "ja", "human", "read it") == []


def test_script_may_write_spec_only_for_confirmed_fix_conclusion(home):
    from agent.ledger import Ledger

    for kind, allowed in (("fix", True), ("skip", False)):
        led = Ledger.open(home.parent / f"{kind}.db")
        tid = make_task(led, from_conclusion=True, kind=kind)
        record(led, tid, "spec")
        reasons = chain.close_reasons(snapshot(led, tid), "spec_written", "ja", "script", "auto spec")
        assert (reasons == []) is allowed, reasons
        led.close()


def test_needs_not_closed(ledger):
    tid = make_task(ledger)
    for what in ARTIFACT.values():
        record(ledger, tid, what)
    for key in chain.STEP_KEYS[1:]:
        reasons = chain.close_reasons(snapshot(ledger, tid), key, "ja", "script", "e")
        assert any("needs not closed" in r for r in reasons), key


@pytest.mark.parametrize("key", chain.STEP_KEYS)
def test_artifact_must_be_recorded_for_current_head(ledger, key):
    tid = make_task(ledger, from_conclusion=True)
    # close every earlier step with its artifact
    for k in chain.STEP_KEYS[: chain.STEP_KEYS.index(key)]:
        record(ledger, tid, ARTIFACT[k])
        set_step(ledger, tid, k, "ja", "done", source="script" if k != "spec_written" else "script")
    reasons = chain.close_reasons(snapshot(ledger, tid), key, "ja", "script", "done")
    assert len(reasons) == 1 and ("no " in reasons[0] or "not recorded" in reasons[0]), reasons
    record(ledger, tid, ARTIFACT[key])
    assert chain.close_reasons(snapshot(ledger, tid), key, "ja", "script", "done") == []


def test_artifact_for_an_old_head_does_not_count(ledger):
    tid = make_task(ledger, from_conclusion=True)
    for k in ("spec_written", "implementer_done", "committed"):
        record(ledger, tid, ARTIFACT[k])
        set_step(ledger, tid, k, "ja", "done", source="script")
    record(ledger, tid, "check", head="c" * 40)  # a check of some other head
    reasons = chain.close_reasons(snapshot(ledger, tid), "local_check_pass", "ja", "script", "ok")
    assert reasons == [f"no passing check recorded for head {HEAD[:12]}"]


def test_terminal_task_refuses_every_step(ledger):
    tid = make_task(ledger)
    transition(ledger, tid, chain.FAILED, "script", "test")
    for key in chain.STEP_KEYS:
        assert any("failed; reset it first" in r
                   for r in chain.close_reasons(snapshot(ledger, tid), key, "ja", "human", "e"))


def test_n_a_is_human_only(ledger):
    tid = make_task(ledger)
    assert any("only a human" in r for r in chain.close_reasons(snapshot(ledger, tid), "pushed", "n_a", "script", "e"))


def test_nein_reopens_a_closed_step(ledger):
    tid = make_task(ledger, from_conclusion=True)
    record(ledger, tid, "spec")
    set_step(ledger, tid, "spec_written", "ja", "auto spec", source="script")
    assert snapshot(ledger, tid).steps["spec_written"] == "ja"
    set_step(ledger, tid, "spec_written", "nein", "spec misses the repro", source="human")
    snap = snapshot(ledger, tid)
    assert snap.steps["spec_written"] == "nein"
    assert "implementer_done" not in chain.next_steps(snap)
    kinds = [e["kind"] for e in eventlog.events(ledger, task_id=tid)]
    assert kinds.count("step.closed") == 1 and kinds.count("step.reopened") == 1


def test_close_step_and_checklist_set_refuse_exactly_alike(agent, home):
    """Every (step, source, evidence, artifacts) combination: both commands agree, with the same reasons."""
    from agent.ledger import Ledger

    agent("init")
    led = Ledger.open(ledger_path(home))
    tid = make_task(led, from_conclusion=True)
    led.close()
    cases = list(itertools.product(chain.STEP_KEYS + ("bogus",), ("human", "script"), ("", "evidence")))
    refusals = 0
    for key, source, evidence in cases:
        a = agent("task", "close-step", str(tid), key, "--evidence", evidence, "--source", source)
        led = Ledger.open(ledger_path(home))
        if a.exit_code == 0:  # undo so the other command sees the same state
            set_step(led, tid, key, "nein", "undo for parity test", source="human")
        led.close()
        b = agent("checklist", "set", str(tid), key, "--status", "ja", "--evidence", evidence, "--source", source)
        led = Ledger.open(ledger_path(home))
        if b.exit_code == 0:
            set_step(led, tid, key, "nein", "undo for parity test", source="human")
        led.close()
        assert a.exit_code == b.exit_code, (key, source, evidence, a.stderr, b.stderr)
        assert a.stderr == b.stderr
        refusals += a.exit_code == 1
        if a.exit_code == 1:
            assert a.stderr.startswith("agent: task") and a.stderr.count("\n") == 1
    assert refusals >= len(cases) - 2  # without artifacts nearly everything is refused
    # now with artifacts: the same parity holds for allowed closes
    led = Ledger.open(ledger_path(home))
    record(led, tid, "spec")
    led.close()
    a = agent("task", "close-step", str(tid), "spec_written", "--evidence", "auto", "--source", "script")
    assert a.exit_code == 0, a.stderr


def test_state_machine():
    assert chain.check_transition("open", "working", "script") is None
    assert "may not go" in chain.check_transition("done", "open", "human")
    # a done task goes back to work only for PR feedback, with its keys as evidence
    assert "only with evidence" in chain.check_transition("done", "working", "script")
    assert "only with evidence" in chain.check_transition("done", "working", "script", ["  "])
    assert chain.check_transition("done", "working", "script", ["inline:12"]) is None
    assert chain.check_transition("done", "gate-blocked", "script") is None
    assert "only a human" in chain.check_transition("gate-blocked", "working", "script")
    assert chain.check_transition("gate-blocked", "working", "human") is None
    assert "unknown task state" in chain.check_transition("open", "paused", "human")


def test_round_cap_fails_task_with_reason(ledger):
    tid = make_task(ledger)
    with ledger.tx() as c:
        ledger.update(c, "tasks", {"id": tid}, {"round_cap": 2, "state": "working"})
    started, rnd = start_next_round(ledger, tid, "reviewer: 2 findings")
    assert started and rnd == 2
    started, rnd = start_next_round(ledger, tid, "reviewer: 1 finding")
    assert not started
    t = ledger.one("SELECT state, failed_reason FROM tasks WHERE id = ?", (tid,))
    assert t["state"] == "failed" and "round cap 2 reached" in t["failed_reason"]
    # a human reset grants more rounds
    r = reset_task(ledger, tid, "looked at it, try again", rounds=2)
    assert r["round_cap"] == 4
    assert ledger.one("SELECT state FROM tasks WHERE id = ?", (tid,))["state"] == "working"
    human = [e for e in eventlog.events(ledger, task_id=tid) if e["kind"] == "task.reset"]
    assert human and human[0]["actor"] == "human"


def test_reset_refuses_a_working_task(ledger):
    tid = make_task(ledger)
    with pytest.raises(Refused, match="only gate-blocked or failed"):
        reset_task(ledger, tid, "why not")


def test_task_for_an_error_is_never_created_twice(ledger):
    eid = make_error(ledger)
    a, created_a = create_task(ledger, "acme/widgets", "t", error_id=eid)
    b, created_b = create_task(ledger, "acme/widgets", "t", error_id=eid)
    assert a == b and created_a and not created_b
    assert ledger.scalar("SELECT count(*) FROM tasks") == 1


def test_unknown_status_and_source_are_reasons_too(ledger):
    tid = make_task(ledger)
    reasons = chain.close_reasons(snapshot(ledger, tid), "spec_written", "done", "robot", "e")
    assert any("unknown status 'done'" in r for r in reasons)
    assert any("unknown source 'robot'" in r for r in reasons)

