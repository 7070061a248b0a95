"""The on-call summary: what needs a human, what is stuck (one rule: agent.app.status.stuck_reason), PRs waiting for
review, errors waiting for a decision, runners; finished tasks paged; a task's timeline in words on /tasks/N.
Real ledger (both backends), real runners' rows and claims, the real server over 127.0.0.1."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone

import pytest

from agent.domain import chain

from agent.coord import claims, runners
from agent.config import parse_config
from agent.ledger import leases
from agent.ledger.tasks import note_wait
from agent.app.serve import HookApp, Server
from agent.app.status import gather, render_text, stuck_reason
from agent.ledger.tasks import create_task, transition


def _ts(ago_s: float) -> str:
    return datetime.fromtimestamp(time.time() - ago_s, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _old_event(ledger, task_id: int, ago_s: float) -> None:
    """The task's newest event, ``ago_s`` seconds old (events are append-only: a new row with an old time)."""
    with ledger.tx() as c:
        c.execute("INSERT INTO events (id, ts, task_id, kind, actor, payload) VALUES "
                  "((SELECT coalesce(max(id), 0) + 1 FROM events), ?, ?, 'step.closed', 'script', ?)",
                  (_ts(ago_s), task_id, json.dumps({"key": "spec_written", "status": "ja", "source": "script",
                                                    "evidence": "spec"})))


def _working(ledger, title: str) -> int:
    tid, _ = create_task(ledger, "acme/widgets", title)
    transition(ledger, tid, chain.WORKING, "script", "spec_written closed")
    return tid


@pytest.fixture
def fleet(ledger, home):
    """A live runner (this home's), a dead one (heartbeat 2 h old), and tasks in every situation."""
    live = runners.beat(ledger, home)
    leases.beat_runner(ledger, {"id": "db-host:dead", "host": "db-host", "home": "/srv/agent", "pid": 4242,
                                "pid_start": 1, "version": "0.1.0"})
    with ledger.tx() as c:
        c.execute("UPDATE runners SET heartbeat_at = ? WHERE id = 'db-host:dead'", (time.time() - 7200,))
    t = {"dead_holder": _working(ledger, "held by a dead runner"),
         "live_holder": _working(ledger, "held by the live runner"),
         "silent": _working(ledger, "no event for three hours"),
         "waiting": _working(ledger, "waits for the daily budget"),
         "fresh": _working(ledger, "just moved")}
    claims.claim(ledger, t["dead_holder"], runner="db-host:dead")
    claims.claim(ledger, t["live_holder"], runner=live)
    _old_event(ledger, t["silent"], 3 * 3600)
    note_wait(ledger, t["waiting"], "daily budget spent")
    _old_event(ledger, t["waiting"], 3 * 3600)
    t["blocked"], _ = create_task(ledger, "acme/widgets", "Fix <b>KeyError</b>")
    transition(ledger, t["blocked"], chain.BLOCKED, "script", "lane implementer (codex): not logged in")
    return live, t


def test_stuck_is_a_dead_holder_or_silence_longer_than_the_lane_timeout(ledger, fleet):
    live, t = fleet
    data = gather(ledger, config=parse_config({"limits": {"lane_timeout": 1800, "check_timeout": 900}}))
    stuck = {s["id"]: s["stuck"] for s in data["stuck"]}
    assert set(stuck) == {t["dead_holder"], t["silent"]}, stuck
    assert "db-host:dead" in stuck[t["dead_holder"]] and "not live" in stuck[t["dead_holder"]]
    assert stuck[t["silent"]].startswith("no event for 3h00m")
    rows = {r["id"]: r for r in data["active"]}
    assert rows[t["live_holder"]]["held_by"] == live and rows[t["live_holder"]]["stuck"] is None
    assert rows[t["fresh"]]["step"] == "spec_written" and rows[t["fresh"]]["age_s"] < 600
    assert [b["id"] for b in data["gate_blocked"]] == [t["blocked"]]
    assert {r["id"]: r["alive"] for r in data["runners"]} == {live: True, "db-host:dead": False}
    text = render_text(data)
    sections = [ln for ln in text.splitlines() if ln and not ln.startswith(" ") and ln.endswith(":")]
    assert sections[:4] == ["needs a human (gate-blocked):", "stuck:", "runners (2, 1 dead or silent):", "working:"], sections
    assert f"task {t['dead_holder']} acme/widgets (" in text and "step spec_written" in text
    # a longer lane timeout: the silent task is not stuck yet
    data = gather(ledger, config=parse_config({"limits": {"lane_timeout": 4 * 3600}}))
    assert {s["id"] for s in data["stuck"]} == {t["dead_holder"]}


def test_stuck_when_nothing_holds_it_and_no_runner_is_live():
    task = {"state": "working", "claim_token": None, "claim_runner": None, "last_event_at": _ts(5),
            "updated_at": _ts(5), "wait_reason": None}
    assert stuck_reason(task, {}, False, time.time(), 1800).startswith("no live runner")
    assert stuck_reason(task, {}, True, time.time(), 1800) is None
    assert stuck_reason({**task, "state": "gate-blocked"}, {}, False, time.time(), 1800) is None


def get(url, path, headers=None):
    req = urllib.request.Request(url + path, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode(), resp.headers
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), exc.headers


@pytest.fixture
def server(ledger, home):
    s = Server(HookApp(home, parse_config({}), {}), "127.0.0.1", 0).start()
    yield s
    s.close()


def test_page_summary_first_and_json_for_live_updates(server, ledger, fleet):
    _, t = fleet
    code, page, _ = get(server.url, "/")
    assert code == 200
    order = [page.index(f"id='{sid}'") for sid in ("s-human", "s-stuck", "s-review", "s-decide", "s-runners",
                                                      "s-working", "finished")]
    assert order == sorted(order)
    stuck = page[page.index("id='stuck'"):]
    stuck = stuck[:stuck.index("</table>")]
    assert f"tasks/{t['dead_holder']}'" in stuck and "db-host:dead" in stuck and "step spec_written" in stuck
    assert "Fix &lt;b&gt;KeyError&lt;/b&gt;" in page and "<b>KeyError" not in page
    code, body, headers = get(server.url, "/status.json")
    doc = json.loads(body)
    assert code == 200 and headers["Content-Type"] == "application/json"
    assert set(doc["sections"]) >= {"s-human", "s-stuck", "s-review", "s-decide", "s-runners", "s-working"}
    assert doc["sections"]["s-stuck"] in page  # the same fragments the page was built from
    assert len(body) < 20_000


def test_finished_tasks_are_paged_and_a_timeline_reads_in_words(server, ledger):
    ids = []
    for i in range(55):
        tid = _working(ledger, f"task number {i}")
        transition(ledger, tid, chain.DONE if i % 5 else chain.FAILED, "script", "all steps closed on one head")
        ids.append(tid)
    code, page, _ = get(server.url, "/")
    finished = page[page.index("id='finished'"):]
    assert finished.count("<tr class=") == 50 and f"tasks/{ids[-1]}'" in finished and f"tasks/{ids[4]}'" not in finished
    older = finished[finished.index("id='older' href='") + 17:]
    older = older[:older.index("'")]
    assert older == f"?before={ids[5]}"
    code, page, _ = get(server.url, "/" + older)
    finished = page[page.index("id='finished'"):]
    assert code == 200 and finished.count("<tr class=") == 5 and "id='older'" not in finished
    code, page, headers = get(server.url, f"/tasks/{ids[0]}")
    assert code == 200 and headers["Content-Type"].startswith("text/html")
    assert "open → working: spec_written closed" in page and "working → failed: all steps closed" in page
    assert '{"' not in page and "&quot;" not in page  # words, not JSON
    assert get(server.url, "/tasks/99999")[0] == 404
    assert get(server.url, "/?before=abc")[0] == 400


def test_task_pages_and_status_json_need_the_read_token(ledger, home):
    tid = _working(ledger, "a task")
    s = Server(HookApp(home, parse_config({"serve": {"read_token_env": "T"}}), {"T": "tok"}), "127.0.0.1", 0).start()
    try:
        for path in (f"/tasks/{tid}", "/status.json", "/"):
            assert get(s.url, path)[0] == 401
            assert get(s.url, path, {"Authorization": "Bearer tok"})[0] == 200
    finally:
        s.close()


@pytest.mark.slow
def test_live_updates_patch_the_page_in_chromium_and_keep_what_a_person_opened(ledger, home):
    """Real headless Chromium (scripts/ci-chromium) runs the page's script: a task blocked after the page loaded
    appears in "Needs a human" without a reload, and the Failed list a person opened stays open."""
    from cdp import Browser, chromium

    if chromium() is None:
        pytest.skip("chromium not installed: run scripts/ci-chromium (needs root and Debian's registry)")
    first = _working(ledger, "failed before the page loaded")
    transition(ledger, first, chain.FAILED, "script", "round cap reached")
    app = HookApp(home, parse_config({}), {})
    app.refresh_s = 0.5  # the page's own timer, shortened for the test
    server = Server(app, "127.0.0.1", 0).start()
    browser = Browser()
    try:
        browser.open(server.url + "/")
        assert browser.eval("document.querySelectorAll('#blocked tr.blocked').length") == 0
        browser.eval("window.__loaded_once = 1; document.getElementById('d-failed').open = true; 1")
        later = _working(ledger, "blocked after the page loaded")
        transition(ledger, later, chain.BLOCKED, "script", "lane reviewer (claude): not logged in")
        second = _working(ledger, "failed after the page loaded")
        transition(ledger, second, chain.FAILED, "script", "round cap reached again")
        browser.wait_for("document.querySelectorAll('#blocked tr.blocked').length === 1", timeout=30)
        browser.wait_for("document.querySelectorAll('#failed tr.failed').length === 2", timeout=30)
        assert browser.eval("window.__loaded_once") == 1  # the same document: not reloaded
        assert browser.eval("document.getElementById('d-failed').open") is True
        assert "not logged in" in browser.eval("document.getElementById('blocked').textContent")
        assert "update failed" not in browser.eval("document.getElementById('live').textContent")
    finally:
        browser.close()
        server.close()
