"""The fixer end to end: real git repositories, real subprocess lanes (scripted stand-ins), the local forge.

Lanes are `command` vendors running agent/app/demo_lanes scripts (or small scripts written here) as real processes;
nothing is mocked. The project is agent.app.demo's: a real bug (KeyError 'qty') and a failing test.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agent.app import demo
from agent.app.context import App
from agent.ledger import Ledger, ledger_path

from conftest import git, ledger_bytes


@pytest.fixture
def world(tmp_path, monkeypatch):
    paths = demo.setup(tmp_path / "w")
    monkeypatch.setenv("AGENT_HOME", str(paths["home"]))
    return paths


@pytest.fixture
def home(world):
    """The CLI fixtures (agent, agent_proc) use the demo world's home."""
    return world["home"]


def edit_config(paths, change):
    path = paths["home"] / "config.yaml"
    cfg = yaml.safe_load(path.read_text())
    change(cfg)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))


def script_vendor(paths, name, body: str):
    """A command vendor running a small Python script written by the test (a real subprocess)."""
    script = paths["root"] / f"{name}.py"
    script.write_text(body)
    return {"command": [sys.executable, str(script), "{spec}", "{cwd}"]}


def run_with_implementer(paths, name: str, script: str, round_cap: int | None = None) -> list[str]:
    """Swap the implementer for a script written here, then ingest, decide and drive the task to rest."""
    def change(cfg):
        cfg["vendors"]["demo-implementer"] = script_vendor(paths, name, script)
        if round_cap is not None:
            cfg["limits"]["round_cap"] = round_cap

    edit_config(paths, change)
    ingest_and_decide(paths)
    scan(paths, "error-fix")
    return run_until_settled(paths)


def ingest_and_decide(paths, service=demo.SERVICE, brief=demo.BRIEF, events=None) -> str:
    from agent.flows.decide import decide
    from agent.intake.store import ingest_text

    app = App(home=paths["home"])
    try:
        result, _ = ingest_text(app.ledger, events or demo.error_events(), "auto")
        eid = result.error_ids[0] if result.error_ids else app.ledger.scalar("SELECT id FROM errors LIMIT 1")
        decide(app.ledger, app.config, eid, "fix", brief=brief)
        return eid
    finally:
        app.close()


def scan(paths, name, jobs=1):
    from agent.app.scans import run_scan

    app = App(home=paths["home"])
    try:
        return run_scan(app, name, jobs=jobs)
    finally:
        app.close()


def run_until_settled(paths, passes=8):
    lines = []
    for _ in range(passes):
        lines += [i["line"] for i in scan(paths, "error-fix-work")]
        led = Ledger.open(ledger_path(paths["home"]))
        busy = led.scalar("SELECT count(*) FROM tasks WHERE state IN ('open', 'working')")
        led.close()
        if not busy:
            break
    return lines


def ledger(paths) -> Ledger:
    return Ledger.open(ledger_path(paths["home"]))


def events_snapshot(paths):
    led = ledger(paths)
    try:
        return (led.scalar("SELECT count(*) FROM events"), led.scalar("SELECT max(id) FROM events"),
                led.all("SELECT id, state, round, head_sha, pushed_sha FROM tasks ORDER BY id"))
    finally:
        led.close()


# ---------------------------------------------------------------------------------------------- end to end


def test_cli_end_to_end_ingest_decide_fix_to_draft_pr(world, agent_proc, tmp_path):
    events = tmp_path / "events.jsonl"
    events.write_text(demo.error_events())
    r = agent_proc("error", "ingest", str(events))
    assert r.returncode == 0, r.stderr
    errors = json.loads(agent_proc("error", "list", "--json").stdout)
    assert len(errors) == 1 and errors[0]["count"] == 3
    eid = errors[0]["id"]
    r = agent_proc("error", "decide", eid[:8], "--fix", "--brief", demo.BRIEF)
    assert r.returncode == 0, r.stderr
    r = agent_proc("watch", "error-fix")
    assert r.returncode == 0 and "task 1 created" in r.stdout, r.stdout + r.stderr
    for _ in range(4):
        r = agent_proc("watch", "error-fix-work", "--json")
        assert r.returncode == 0, r.stderr
        items = json.loads(r.stdout)
        if items and items[0]["state"] == "done":
            break
    task = json.loads(agent_proc("task", "show", "1", "--json").stdout)
    assert task["state"] == "done" and task["round"] == 2
    assert all(s["status"] == "ja" for s in task["steps"])
    prs = json.loads(agent_proc("pr", "list", "--json").stdout)
    assert len(prs) == 1 and prs[0]["draft"] and prs[0]["state"] == "open"
    branch = task["branch"]
    assert branch == f"agent/fix-{eid[:8]}"
    # the pushed branch holds the fix and passes the project's own check
    check = tmp_path / "check"
    git(tmp_path, "clone", "-q", "-b", branch, str(world["remote"]), str(check))
    assert 'item.get("qty", 1)' in (check / "widgets" / "pricing.py").read_text()
    assert "print(" not in (check / "widgets" / "pricing.py").read_text()
    res = subprocess.run([sys.executable, "-m", "unittest", "discover", "-s", "tests", "-q"], cwd=check,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    # and the base still has the bug: the fixer never pushes the base
    base = tmp_path / "base"
    git(tmp_path, "clone", "-q", "-b", "main", str(world["remote"]), str(base))
    assert 'item["qty"]' in (base / "widgets" / "pricing.py").read_text()
    # the PR text as sent: draft, EN + DE, the marker
    body = agent_proc("pr", "show", "1").stdout
    assert "<!-- agent-task: 1 -->" in body and "Dieser Entwurf" in body


def test_rejection_starts_next_round_with_findings_in_spec(world):
    ingest_and_decide(world)
    scan(world, "error-fix")
    lines = run_until_settled(world)
    assert any("round 1: reviewer rejected, 1 finding" in line for line in lines), lines
    spec2 = (world["home"] / "specs" / "task-1" / "round-2.md").read_text()
    assert "# Prior findings" in spec2 and "leftover print() call" in spec2
    spec1 = (world["home"] / "specs" / "task-1" / "round-1.md").read_text()
    assert "# Prior findings" not in spec1
    led = ledger(world)
    gates = led.all("SELECT round, stage, dimension, verdict, head_sha FROM gates ORDER BY id")
    commits = led.all("SELECT round, sha FROM commits ORDER BY id")
    led.close()
    assert [g["verdict"] for g in gates if g["stage"] == "review"] == ["reject", "approve"]
    assert [c["round"] for c in commits] == [1, 2]
    # every verdict is bound to the head it judged
    assert gates[0]["head_sha"] == commits[0]["sha"] and gates[1]["head_sha"] == commits[1]["sha"]


def test_every_scan_twice_changes_nothing_the_second_time(world):
    ingest_and_decide(world)
    scan(world, "error-fix")
    before = events_snapshot(world)
    scan(world, "error-fix")
    assert events_snapshot(world) == before
    run_until_settled(world)
    before = events_snapshot(world)
    for name in ("error-fix", "error-fix-work", "error-decide", "errors"):
        scan(world, name)
        assert events_snapshot(world) == before, name


def test_round_cap_fails_task_with_reason(world):
    edit_config(world, lambda c: c["limits"].update(round_cap=1))
    ingest_and_decide(world)
    scan(world, "error-fix")
    lines = run_until_settled(world)
    led = ledger(world)
    t = led.one("SELECT state, round, failed_reason FROM tasks WHERE id = 1")
    prs = led.scalar("SELECT count(*) FROM prs")
    led.close()
    assert t["state"] == "failed" and t["round"] == 1
    assert "round cap 1 reached" in t["failed_reason"] and "leftover print() call" in t["failed_reason"]
    assert prs == 0
    assert any("round cap reached, failed" in line for line in lines)


def test_unavailable_lane_gate_blocks_then_reset_finishes(world, agent):
    good = None

    def break_it(cfg):
        nonlocal good
        good = cfg["vendors"]["demo-implementer"]["command"]
        cfg["vendors"]["demo-implementer"]["command"] = ["/nonexistent/coding-agent", "{spec}"]

    edit_config(world, break_it)
    ingest_and_decide(world)
    scan(world, "error-fix")
    run_until_settled(world)
    led = ledger(world)
    t = led.one("SELECT state, round, blocked_reason FROM tasks WHERE id = 1")
    led.close()
    assert t["state"] == "gate-blocked" and t["round"] == 1  # no round consumed
    assert "implementer lane unavailable" in t["blocked_reason"]
    status = agent.json("status")
    assert status["gate_blocked"][0]["reset_command"].startswith("agent task reset 1")
    # a blocked task is not advanced by further scans
    before = events_snapshot(world)
    scan(world, "error-fix-work")
    assert events_snapshot(world) == before
    edit_config(world, lambda c: c["vendors"]["demo-implementer"].update(command=good))
    r = agent("task", "reset", "1", "--reason", "installed the coding agent")
    assert r.exit_code == 0, r.stderr
    run_until_settled(world)
    led = ledger(world)
    t = led.one("SELECT state, round FROM tasks WHERE id = 1")
    human = led.all("SELECT actor FROM events WHERE kind = 'task.reset'")
    led.close()
    assert t["state"] == "done" and human == [{"actor": "human"}]


NO_CHANGE = """
import sys
print("SESSION: s1")
print("looked around, changed nothing")
print("STATUS: complete")
print("SUMMARY: nothing needed changing")
"""


def test_implementer_that_changes_nothing_fails_the_round(world):
    lines = run_with_implementer(world, "noop", NO_CHANGE, round_cap=2)
    assert any("implementer made no change" in line for line in lines), lines
    led = ledger(world)
    t = led.one("SELECT state, failed_reason FROM tasks WHERE id = 1")
    led.close()
    assert t["state"] == "failed" and "changed no file" in t["failed_reason"]


BREAKS_TEST = """
import sys
from pathlib import Path
cwd = Path(sys.argv[2])
p = cwd / "widgets" / "pricing.py"
p.write_text(p.read_text().replace('item["qty"]', 'item.get("qty", 0)'))
print("STATUS: complete")
print("SUMMARY: default qty to zero")
"""


def test_failing_check_rejects_the_round_with_its_output(world):
    lines = run_with_implementer(world, "wrong", BREAKS_TEST, round_cap=2)
    assert any("check failed (exit 1)" in line for line in lines), lines
    led = ledger(world)
    checks = led.all("SELECT passed, head_sha FROM checks ORDER BY id")
    feedback = [json.loads(e["payload"])["feedback"] for e in
                led.all("SELECT payload FROM events WHERE kind = 'round.started'")]
    led.close()
    assert checks and not checks[0]["passed"] and checks[0]["head_sha"]
    assert "test_missing_qty_means_one_unit" in feedback[0]  # the failing test's name reaches the next spec
    spec2 = (world["home"] / "specs" / "task-1" / "round-2.md").read_text()
    assert "test_missing_qty_means_one_unit" in spec2


PARTIAL = """
print("STATUS: partial")
print("SUMMARY: could not find where qty is read; need the caller")
"""


def test_partial_report_is_a_rejected_round_with_its_summary(world):
    lines = run_with_implementer(world, "partial", PARTIAL, round_cap=2)
    assert any("implementer reported partial" in line for line in lines), lines
    spec2 = (world["home"] / "specs" / "task-1" / "round-2.md").read_text()
    assert "could not find where qty is read" in spec2


GARBLED = """
import os
print("SESSION: s9")
print("I fixed it, trust me. token ghp_" + "A" * 36)
"""


def test_report_still_unparseable_after_repairs_fails_with_redacted_excerpt(world):
    run_with_implementer(world, "garbled", GARBLED)
    led = ledger(world)
    t = led.one("SELECT state, failed_reason FROM tasks WHERE id = 1")
    led.close()
    assert t["state"] == "failed" and "report unparseable" in t["failed_reason"]
    assert "I fixed it, trust me" in t["failed_reason"]
    assert "ghp_" + "A" * 36 not in t["failed_reason"]
    raw = ledger_bytes(world["home"])
    assert b"ghp_" + b"A" * 36 not in raw


BLOCKED_PATH = """
import sys
from pathlib import Path
cwd = Path(sys.argv[2])
(cwd / ".github").mkdir(exist_ok=True)
(cwd / ".github" / "ci.yml").write_text("on: push\\n")
p = cwd / "widgets" / "pricing.py"
p.write_text(p.read_text().replace('item["qty"]', 'item.get("qty", 1)'))
print("STATUS: complete")
print("SUMMARY: fixed and tweaked CI")
"""


def test_touching_a_blocked_path_rejects_the_round(world):
    lines = run_with_implementer(world, "ci", BLOCKED_PATH, round_cap=1)
    assert any("touched blocked paths .github/ci.yml" in line for line in lines), lines
    led = ledger(world)
    assert led.scalar("SELECT count(*) FROM commits") == 0
    led.close()


def test_lesson_of_a_done_task_is_a_candidate_that_no_later_spec_carries_until_its_pr_is_merged(world):
    ingest_and_decide(world)
    scan(world, "error-fix")
    run_until_settled(world)
    led = ledger(world)
    lessons = led.all("SELECT service, text, task_id, state FROM lessons")
    led.close()
    assert lessons == [{"service": demo.SERVICE, "text": "widgets-api: order lines may omit qty; it means one unit",
                        "task_id": 1, "state": "candidate"}]
    other = json.dumps({"service": demo.SERVICE, "environment": "production", "level": "error",
                        "message": "TypeError: unsupported operand", "class": "TypeError",
                        "stack": 'Traceback (most recent call last):\n  File "/srv/widgets/widgets/pricing.py", '
                                 'line 9, in order_total\nTypeError: unsupported operand'}) + "\n"
    ingest_and_decide(world, events=other, brief="prices may be strings; convert them")
    scan(world, "error-fix")
    scan(world, "error-fix-work")
    spec = (world["home"] / "specs" / "task-2" / "round-1.md").read_text()
    assert "# Lessons" not in spec and "order lines may omit qty" not in spec   # tests/test_lessons.py: merged


def test_pr_limits_make_a_task_wait_not_drop(world):
    edit_config(world, lambda c: c["limits"].update(prs_per_hour=1))
    ingest_and_decide(world)
    scan(world, "error-fix")
    run_until_settled(world)
    other = demo.error_events(1).replace("line_total", "order_total_v2").replace("KeyError", "ValueError")
    ingest_and_decide(world, events=other, brief="another bug")
    scan(world, "error-fix")
    lines = run_until_settled(world, passes=3)
    assert any("waiting to open a PR: 1 PRs opened in the last hour" in line for line in lines), lines
    led = ledger(world)
    t = led.one("SELECT state FROM tasks WHERE id = 2")
    led.close()
    assert t["state"] == "working"


def test_one_tasks_failure_does_not_stop_the_others(world):
    ingest_and_decide(world)
    other = demo.error_events(1).replace("KeyError", "LookupError")
    ingest_and_decide(world, events=other, brief="second")
    scan(world, "error-fix")
    led = ledger(world)
    led.conn.execute("UPDATE tasks SET base_sha = ? WHERE id = 1", ("f" * 40,))  # git diff will blow up for task 1
    led.close()
    lines = run_until_settled(world, passes=2)
    led = ledger(world)
    states = {r["id"]: r["state"] for r in led.all("SELECT id, state FROM tasks")}
    errors = led.all("SELECT task_id FROM events WHERE kind = 'task.error'")
    led.close()
    assert states == {1: "working", 2: "done"}, lines
    assert any(line.startswith("task 1: error: GitError") for line in lines), lines
    assert errors and all(e["task_id"] == 1 for e in errors)
    # the same unexpected error three times in a row without progress: a human has to look
    run_until_settled(world, passes=2)
    led = ledger(world)
    t = led.one("SELECT state, blocked_reason FROM tasks WHERE id = 1")
    led.close()
    assert t["state"] == "gate-blocked" and t["blocked_reason"].startswith("unexpected error 3 times in a row")


def test_secrets_never_reach_spec_or_pr(world):
    canary = "AKIA" + "Z" * 16
    events = demo.error_events(1).replace("user demo0@example.com", f"key {canary} password=hunter2")
    ingest_and_decide(world, events=events, brief=f"fix it; the aws key {canary} is unrelated")
    scan(world, "error-fix")
    run_until_settled(world)
    texts = [p.read_text() for p in (world["home"] / "specs").rglob("*.md")]
    texts += [p.read_text() for p in (world["home"] / "prs").glob("*.md")]
    assert texts and not any(canary in t or "hunter2" in t for t in texts)
    raw = ledger_bytes(world["home"])
    assert canary.encode() not in raw


def test_hand_made_task_waits_for_a_human_to_approve_the_spec(world, agent):
    r = agent("task", "create", "--repo", demo.REPO, "--title", "order_total fails without qty; default it to 1")
    assert r.exit_code == 0, r.stderr
    run_until_settled(world, passes=1)
    led = ledger(world)
    t = led.one("SELECT state, blocked_reason, spec_path FROM tasks WHERE id = 1")
    led.close()
    assert t["state"] == "gate-blocked" and t["blocked_reason"].startswith("human step pending: spec_written")
    assert "order_total fails without qty" in Path(t["spec_path"]).read_text()
    # a script may not close it (no confirmed error.fix behind this task)
    r = agent("task", "close-step", "1", "spec_written", "--evidence", "auto", "--source", "script")
    assert r.exit_code == 1 and "human step" in r.stderr
    r = agent("task", "close-step", "1", "spec_written", "--evidence", "read the spec, fine", "--source", "human")
    assert r.exit_code == 0, r.stderr
    run_until_settled(world)
    led = ledger(world)
    assert led.one("SELECT state FROM tasks WHERE id = 1")["state"] == "done"
    led.close()


def test_task_budget_gate_blocks_and_daily_budget_waits(world):
    edit_config(world, lambda c: c["limits"].update(task_budget_usd=0.005))
    ingest_and_decide(world)
    scan(world, "error-fix")
    run_until_settled(world, passes=2)
    led = ledger(world)
    t = led.one("SELECT state, blocked_reason FROM tasks WHERE id = 1")
    runs = led.scalar("SELECT count(*) FROM lane_runs")
    led.close()
    assert t["state"] == "gate-blocked" and t["blocked_reason"].startswith("task budget spent ($0.01 of $0.005)")
    assert runs == 1  # the implementer ran once (it cost $0.01); nothing started after the budget was spent
    # the daily budget makes another task wait, with a line saying why, and drops nothing
    edit_config(world, lambda c: c["limits"].update(task_budget_usd=5.0, daily_budget_usd=0.01))
    other = demo.error_events(1).replace("KeyError", "LookupError")
    ingest_and_decide(world, events=other, brief="second")
    scan(world, "error-fix")
    lines = run_until_settled(world, passes=2)
    assert any("task 2 round 1: waiting: daily budget spent ($0.01 of $0.01)" in line for line in lines), lines
    led = ledger(world)
    assert led.one("SELECT state FROM tasks WHERE id = 2")["state"] in ("open", "working")
    led.close()


def test_config_error_in_a_pr_review_thread_blocks_with_its_reason_not_a_lane_crash(world):
    """Issue 13 case 10: the repository's own .agent/config.yaml names a vendor nobody defined for pr-logic.
    The error happens inside the parallel PR-review thread before any lane starts: the task is gate-blocked
    with that reason (old: failed with "pr-logic lane crashed; see the lane logs")."""
    project = world["project"]
    (project / ".agent" / "config.yaml").write_text('blocked_paths: [".github/"]\n'
                                                    "lanes: {pr-logic: {vendor: in-house}}\n")
    git(project, "commit", "-qam", "review logic with the in-house agent")
    git(project, "push", "-q", str(world["remote"]), "main")
    ingest_and_decide(world)
    scan(world, "error-fix")
    run_until_settled(world)
    led = ledger(world)
    t = led.one("SELECT state, blocked_reason, failed_reason FROM tasks WHERE id = 1")
    roles = [r["role"] for r in led.all("SELECT role FROM lane_runs WHERE task_id = 1")]
    led.close()
    assert t["state"] == "gate-blocked", t
    assert t["blocked_reason"].startswith("pr-logic lane not started: unknown vendor 'in-house'"), t
    assert "crashed" not in (t["failed_reason"] or "") + t["blocked_reason"]
    assert "pr-quality" in roles and "pr-logic" not in roles   # no pr-logic lane ran; the other one did
