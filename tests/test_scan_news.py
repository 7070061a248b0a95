"""Issue 13 case 13: an operator's view of an unattended run — why working tasks wait, reset commands on the HTML
page, one line per `task list` row, `events --limit` takes the newest, and a cron tick that changed nothing
prints nothing.  Real ledger, real git remote, scripted lanes as real subprocesses, the local forge."""

from __future__ import annotations

import json

from agent.domain import chain

from agent.app import demo
from agent.ledger import Ledger, ledger_path
from agent.ledger.tasks import create_task, transition
from test_fixer import edit_config, home, ingest_and_decide, run_until_settled, scan, world  # noqa: F401
from test_status import Page


def second_error(world):
    other = demo.error_events(1).replace("line_total", "order_total_v2").replace("KeyError", "ValueError")
    ingest_and_decide(world, events=other, brief="another bug")
    scan(world, "error-fix")


def test_status_says_why_a_working_task_waits_and_an_unchanged_tick_prints_nothing(world, agent):
    edit_config(world, lambda c: c["limits"].update(prs_per_hour=1))
    ingest_and_decide(world)
    scan(world, "error-fix")
    run_until_settled(world)                    # task 1: done, its draft PR open (the hour's one PR)
    second_error(world)
    first = agent("watch", "all")
    assert first.exit_code == 0, first.output
    assert "task 2 round 2: waiting to open a PR: 1 PRs opened in the last hour" in first.output, first.output
    assert "still open" not in first.output     # task 1's PR is still open: no news
    data = agent.json("status")
    assert [(w["id"], w["state"]) for w in data["waiting"]] == [(2, "working")]
    assert "(limits.prs_per_hour=1)" in data["waiting"][0]["wait_reason"]
    text = agent("status").output
    assert "\nworking:\n  task 2 demo/widgets working" in text and "; waiting: waiting to open a PR" in text
    # the next cron tick changes nothing: it prints nothing (old: "no progress possible now", "still open")
    second = agent("watch", "all")
    assert second.exit_code == 0 and second.output == "", second.output
    items = agent.json("watch", "all")          # --json still reports every item, marked quiet
    assert {i["scan"] for i in items} == {"pr-feedback", "error-fix-work", "pr-merged"} and all(i.get("quiet") for i in items)
    led = Ledger.open(ledger_path(world["home"]))
    waits = led.all("SELECT payload FROM events WHERE task_id = 2 AND kind = 'task.waiting'")
    led.close()
    assert len(waits) == 1                      # one event when it began to wait, not one per tick
    # once the limit allows it the task moves on, and the wait is cleared
    edit_config(world, lambda c: c["limits"].update(prs_per_hour=5))
    third = agent("watch", "error-fix-work")
    assert "task 2" in third.output and "draft PR created" in third.output, third.output
    assert agent.json("status")["waiting"] == []


def seed_failures(home):
    led = Ledger.open(ledger_path(home))
    a, _ = create_task(led, "acme/widgets", "Fix KeyError\nin checkout")
    b, _ = create_task(led, "acme/widgets", "Fix TypeError")
    transition(led, a, chain.BLOCKED, "script", "check failed:\nTraceback (most recent call last):\n  boom")
    transition(led, b, chain.FAILED, "script", "implementer report unparseable; output tail:\nline one\nline two")
    led.close()
    return a, b


def test_task_list_keeps_one_line_per_task_and_html_has_reset_commands(agent, home, tmp_path):
    agent("init")
    a, b = seed_failures(home)
    out = agent("task", "list")
    assert out.exit_code == 0
    rows = out.output.splitlines()
    assert len(rows) == 2, rows
    assert rows[0].split()[0] == str(a) and "check failed: Traceback (most recent call last): boom" in rows[0]
    assert rows[1].split()[0] == str(b) and "output tail: line one line two" in rows[1]
    text = agent("status").output
    assert "implementer report unparseable; output tail: line one line two" in text
    page_path = tmp_path / "status.html"
    assert agent("status", "--html", str(page_path)).exit_code == 0
    page = Page()
    page.feed(page_path.read_text())
    ids = [attrs.get("id") for _, attrs in page.tags]
    assert "failed" in ids and "blocked" in ids
    html_text = "".join(page.text)
    assert f"agent task reset {b} --reason 'why it may go on' --rounds 2" in html_text   # the failed task's
    assert f"agent task reset {a} --reason 'what you fixed'" in html_text


def test_events_limit_shows_the_newest(agent, home):
    agent("init")
    a, b = seed_failures(home)
    newest = agent.json("events", "--limit", "1")
    assert len(newest) == 1 and newest[0]["kind"] == "task.state" and newest[0]["task_id"] == b
    two = agent.json("events", "--limit", "2")
    assert [e["id"] for e in two] == sorted(e["id"] for e in two) and two[-1]["id"] == newest[0]["id"]
    first_of_a = agent("events", "--task", str(a), "--limit", "1").output.splitlines()
    assert len(first_of_a) == 1 and "task.state" in first_of_a[0]
    assert agent("events", "--limit", "-1").exit_code == 2
    every = agent.json("events", "--limit", "0")          # 0: every event (as for every listing)
    assert [e["id"] for e in every] == list(range(1, len(every) + 1)) and every[-1]["id"] == newest[0]["id"]
    assert json.loads(agent("events", "--json").stdout)[0]["kind"] == "task.created"
