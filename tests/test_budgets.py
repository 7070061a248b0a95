"""Issue 13 case 8: budgets that stop every vendor and a reset that does not bounce straight back into the block.
Issue 14: the daily budget holds across runners (a lane reserves its estimate when it is recorded running).

Real ledger (SQLite, or PostgreSQL with ``--ledger=postgres``), real git remote, the demo's scripted lanes as real
subprocesses (the implementer reports COST: 0.01), real `agent watch` processes as runners with their own homes on
one shared ledger. Pricing of token-only vendors with the real codex and gemini CLIs is in tests/test_vendor_clis.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from agent.config import ConfigError, parse_config
from agent.coord.claims import take
from agent.domain.budget import day_start, daily_wait_line
from agent.domain.prices import DEFAULT_PRICES, Price, price_for, priced_cost, tokens
from agent.ledger import Ledger, leases, ledger_path
from agent.ledger.lanes import (BudgetRefused, DailyBudget, daily_spend_since, finish_run, interrupt_run,
                                lane_estimate, start_run)
from agent.ledger.tasks import create_task
from conftest import ledger_conn
from test_fixer import edit_config, home, ingest_and_decide, ledger, run_until_settled, scan, world  # noqa: F401
from test_runners import two_runners  # noqa: F401 (shared_homes: conftest)


def task_row(world):
    led = ledger(world)
    try:
        t = led.one("SELECT state, blocked_reason FROM tasks WHERE id = 1")
        t["runs"] = led.scalar("SELECT count(*) FROM lane_runs WHERE task_id = 1")
        return t
    finally:
        led.close()


def test_budget_block_does_not_come_straight_back_after_reset(world, agent):
    edit_config(world, lambda c: c["limits"].update(task_budget_usd=0.005))
    ingest_and_decide(world)
    scan(world, "error-fix")
    run_until_settled(world, passes=2)
    t = task_row(world)
    assert t["state"] == "gate-blocked" and t["runs"] == 1, t
    assert "--budget USD" in t["blocked_reason"]
    r = agent("task", "reset", "1", "--reason", "worth one more lane", "--budget", "-1")
    assert r.exit_code == 1 and "--budget must be a number of USD > 0" in r.stderr
    assert agent("task", "reset", "1", "--reason", "worth one more lane").exit_code == 0
    run_until_settled(world, passes=1)
    t = task_row(world)
    # spend is counted from the reset: a lane ran before the budget blocked again (old: blocked at once, 0 lanes)
    assert t["runs"] == 2 and t["state"] == "gate-blocked", t
    assert t["blocked_reason"].startswith("task budget spent ($0.005 of $0.005 since the last reset)"), t
    r = agent("task", "reset", "1", "--reason", "give it room", "--budget", "1", "--json")
    assert r.exit_code == 0 and '"budget": 1.0' in r.stdout
    run_until_settled(world)
    assert task_row(world)["state"] == "done"


def test_token_only_usage_is_priced_from_the_table():
    # codex: input_tokens include the cached ones; gemini: prompt + candidates + thoughts; opencode: + reasoning
    assert tokens({"input_tokens": 1000, "cached_input_tokens": 400, "output_tokens": 200}) == (1000, 200)
    assert tokens({"input": 300, "prompt": 360, "candidates": 90, "thoughts": 10, "total": 460}) == (360, 100)
    assert tokens({"input": 5, "output": 7, "reasoning": 3, "cache_read": 2, "cache_write": 0}) == (7, 10)
    assert tokens({"tool_calls": 3}) is None and tokens({}) is None
    usd, why = priced_cost("codex", None, {"input_tokens": 1_000_000, "output_tokens": 100_000})
    assert usd == pytest.approx(1.25 + 1.0) and why.startswith("prices.codex")
    # config wins over the defaults, a model over its vendor
    table = parse_config({"prices": {"codex": {"input": 2, "output": 20}, "my-model": {"input": 0, "output": 1}}}).prices
    assert price_for("codex", None, table) == ("codex", Price(2.0, 20.0))
    assert price_for("codex", "my-model", table) == ("my-model", Price(0.0, 1.0))
    assert price_for("gemini", "gemini-2.5-flash", table) == ("gemini-2.5-flash", DEFAULT_PRICES["gemini-2.5-flash"])
    assert priced_cost("in-house", None, {"input_tokens": 10}) is None   # no price known: the vendor's own cost
    for bad, msg in (({"codex": {"input": 1}}, "prices.codex.output: expected a number >= 0"),
                     ({"codex": {"input": "cheap", "output": 1}}, "prices.codex.input: expected a number >= 0"),
                     ({"codex": {"input": 1, "output": 1, "cache": 0}}, "prices.codex.cache: unknown key")):
        with pytest.raises(ConfigError, match=msg.replace(".", r"\.")):
            parse_config({"prices": bad})


# --------------------------------------------------------------------------- the daily budget across runners


def _start(led, task_id, claim, budget, role="implementer", vendor="codex", supersedes=None):
    return start_run(led, task_id=task_id, error_id=None, round=1, role=role, vendor=vendor, head_sha=None,
                     claim_token=claim.token, budget=budget, supersedes=supersedes)


def _finish(led, run_id, task_id, claim, usd, status="complete"):
    finish_run(led, run_id, {"status": status, "cost_usd": usd}, {"run_id": run_id}, task_id=task_id, error_id=None,
               claim_token=claim.token)


def test_a_lane_reserves_its_estimate_until_its_run_ends_or_is_interrupted(shared_homes, monkeypatch):
    """Two runners (two homes, two connections, one ledger) and a $0.05 daily budget; a lane without history is
    estimated at what is left of its task's budget ($0.02 here). A lane recorded running reserves it: the other
    runner sees it and its third lane, which would not fit, is refused before anything is recorded. The reservation
    ends when the run is marked interrupted (a takeover), is superseded (resumed), or finishes (then its real cost
    counts); a runner that died without anyone taking its task over stops reserving when its claim's lease runs
    out."""
    led_a, led_b = two_runners(shared_homes)
    try:
        ids = [create_task(led, "acme/widgets", f"task {i}")[0] for i, led in enumerate((led_a, led_b, led_b, led_b))]
        ca = take(led_a, ids[0], runner="runner-a")
        cb = [take(led_b, t, runner="runner-b") for t in ids[1:]]
        budget = DailyBudget(limit_usd=0.05, since=day_start(), fallback_usd=0.02)

        ra = _start(led_a, ids[0], ca, budget)
        assert led_b.scalar("SELECT reserved_usd FROM lane_runs WHERE id = ?", (ra,)) == pytest.approx(0.02)
        assert daily_spend_since(led_b, day_start()) == (0.0, pytest.approx(0.02), 1)   # B sees A's reservation
        rb = _start(led_b, ids[1], cb[0], budget)                                       # 0.04 of 0.05: fits
        runs = led_b.scalar("SELECT count(*) FROM lane_runs")
        with pytest.raises(BudgetRefused) as refused:
            _start(led_b, ids[2], cb[1], budget)                                        # 0.06 > 0.05
        assert (refused.value.spent, refused.value.reserved, refused.value.inflight) == (0.0, pytest.approx(0.04), 2)
        assert led_b.scalar("SELECT count(*) FROM lane_runs") == runs                   # nothing recorded
        assert daily_wait_line(refused.value.spent, refused.value.reserved, refused.value.inflight, 0.05,
                               "implementer", refused.value.estimate) == (
            "waiting: daily budget spent ($0.04 of $0.05, $0.04 of it reserved by 2 running lanes; a implementer "
            "lane is estimated at $0.02)")

        # A's run is marked interrupted (its runner stopped, the task was taken over): its reservation ends
        assert interrupt_run(led_a, ra, "its runner stopped; the task was taken over", task_id=ids[0],
                             claim_token=ca.token)
        assert daily_spend_since(led_b, day_start()) == (0.0, pytest.approx(0.02), 1)
        rc = _start(led_b, ids[2], cb[1], budget)                                       # fits now

        # a resumed run supersedes the running one: the old reservation passes to it, it is not counted twice
        with pytest.raises(BudgetRefused):
            _start(led_b, ids[3], cb[2], budget)                                        # 0.04 + 0.02 > 0.05
        rc2 = _start(led_b, ids[2], cb[1], budget, supersedes=rc)
        interrupt_run(led_b, rc, f"interrupted; resumed as run {rc2}", task_id=ids[2], claim_token=cb[1].token)

        # B's first run finishes at $0.03: its real cost replaces its reservation; the codex implementer has a
        # history now, so its next lane is estimated at the median of it ($0.03), no longer at the fallback
        _finish(led_b, rb, ids[1], cb[0], 0.03)
        assert daily_spend_since(led_a, day_start()) == (pytest.approx(0.03), pytest.approx(0.02), 1)
        with pytest.raises(BudgetRefused) as refused:
            _start(led_b, ids[3], cb[2], budget)
        assert refused.value.estimate == pytest.approx(0.03)

        # runner B dies with rc2 running and nobody takes its task over: once the claim's lease has run out, the
        # run no longer reserves anything
        led_b.conn.execute("UPDATE tasks SET lease_until = ? WHERE id = ?", (time.time() - 1, ids[2]))
        assert daily_spend_since(led_a, day_start()) == (pytest.approx(0.03), 0.0, 0)
        _start(led_b, ids[3], cb[2], budget)                                            # 0.03 + 0.02 fits
    finally:
        led_a.close()
        led_b.close()


def test_the_estimate_is_the_median_of_the_lanes_recent_runs(ledger_home):
    led = Ledger.open(ledger_path(ledger_home))
    try:
        def run(role, vendor, usd, status="complete"):
            rid = start_run(led, task_id=None, error_id=None, round=None, role=role, vendor=vendor, head_sha=None,
                            claim_token=None)
            finish_run(led, rid, {"status": status, "cost_usd": usd}, {"run_id": rid}, task_id=None, error_id=None,
                       claim_token=None)

        c = led.conn
        assert lane_estimate(c, "reviewer", "claude", 0.7) == 0.7                  # no history: the fallback
        for usd in (0.10, 0.30, 9.00):                                             # an outlier does not move it
            run("reviewer", "claude", usd)
        run("reviewer", "claude", 0.0, "unavailable")                              # never started: not a sample
        run("reviewer", "claude", 0.0, "interrupted")                              # cut off: not a sample
        run("reviewer", "codex", 5.0)                                              # another vendor
        run("implementer", "claude", 5.0)                                          # another role
        assert lane_estimate(c, "reviewer", "claude", 0.7) == pytest.approx(0.30)
        run("reviewer", "claude", 0.50)
        assert lane_estimate(c, "reviewer", "claude", 0.7) == pytest.approx(0.40)  # even count: the middle two
    finally:
        led.close()


@pytest.fixture
def ledger_home(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    Ledger.open(ledger_path(home)).close()
    return home


def _limit(home: Path, **limits) -> None:
    path = home / "config.yaml"
    cfg = yaml.safe_load(path.read_text())
    cfg["limits"].update(limits)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))


def _task_lanes(home: Path) -> list[dict]:
    con = ledger_conn(home)
    try:
        return [dict(r) for r in con.execute("SELECT id, task_id, role, status, cost_usd, reserved_usd, log_dir "
                                             "FROM lane_runs WHERE task_id IS NOT NULL ORDER BY id")]
    finally:
        con.close()


def _seed_history(home: Path, usd: float, runs: int = 3) -> None:
    """What the demo implementer cost before the daily window (so its lanes are estimated at ``usd`` and the day's
    spend starts at $0)."""
    led = Ledger.open(ledger_path(home), create=False)
    try:
        for _ in range(runs):
            rid = start_run(led, task_id=None, error_id=None, round=None, role="implementer",
                            vendor="demo-implementer", head_sha=None, claim_token=None)
            finish_run(led, rid, {"status": "complete", "cost_usd": usd}, {"run_id": rid}, task_id=None,
                       error_id=None, claim_token=None)
    finally:
        led.close()
    con = ledger_conn(home)
    con.execute("UPDATE lane_runs SET started_at = ? WHERE task_id IS NULL", ("2000-01-01T00:00:00.000000Z",))
    con.commit()
    con.close()


@pytest.mark.slow
def test_two_runners_racing_for_the_last_of_the_daily_budget_launch_only_the_lanes_that_fit(tmp_path):
    """Two real `agent watch error-fix-work --jobs 3` processes (own homes, one ledger), 6 tasks, the daily budget
    $0.04 and the implementer lane known to cost $0.01 (its history: three runs two days ago). The lanes sleep 2 s,
    so all six tasks reach their implementer while nothing has been spent yet: each runner's check sees $0 of $0.04.
    Only four lanes fit, and only four launch (before reservations: six, $0.06 spent of $0.04); the other tasks
    wait with the reason; a second pass of both launches nothing more."""
    from chaos_support import runner_homes, watcher

    p, homes = runner_homes(tmp_path / "w", runners=2, tasks=6, sleep="2")
    for h in homes:
        _limit(h, daily_budget_usd=0.04, task_budget_usd=3.0)
    _seed_history(homes[0], 0.01)

    for n in (1, 2):   # two passes of both runners at once
        procs = [watcher(h, jobs=3, log=tmp_path / f"runner-{i}.log") for i, h in enumerate(homes)]
        for proc in procs:
            assert proc.wait(180) == 0, [(tmp_path / f"runner-{i}.log").read_text()[-3000:] for i in range(2)]
        lanes = _task_lanes(homes[0])
        assert len(lanes) == 4 and all(r["role"] == "implementer" for r in lanes), \
            (n, lanes, (tmp_path / "runner-0.log").read_text()[-3000:])
        assert sum(r["cost_usd"] for r in lanes) == pytest.approx(0.04)
        assert all(r["reserved_usd"] == pytest.approx(0.01) and r["status"] == "complete" for r in lanes), lanes
    con = ledger_conn(homes[0])
    try:
        tasks = [dict(r) for r in con.execute("SELECT id, state, wait_reason FROM tasks ORDER BY id")]
        reached = con.execute("SELECT count(*) FROM events WHERE kind = 'budget.reached'").fetchone()[0]
    finally:
        con.close()
    launched = {r["task_id"] for r in lanes}
    for t in tasks:   # every task waits for tomorrow's budget, nothing is dropped, blocked or failed
        assert t["state"] == "working" and t["wait_reason"].startswith("waiting: daily budget spent ($0.04 of "
                                                                       "$0.04"), t
    assert len(launched) == 4
    assert reached == 1          # the "budget" notification, once a day, whichever runner saw it first
    by_home = {str(h): sum(1 for r in lanes if r["log_dir"].startswith(f"{h}/")) for h in homes}
    print(f"daily budget race: 6 tasks, 2 runners x 3 jobs, lanes launched {len(lanes)} "
          f"(per runner {list(by_home.values())})")


@pytest.mark.slow
def test_a_killed_runners_reservation_ends_when_its_run_is_marked_interrupted(tmp_path):
    """Runner A (a real `agent watch error-fix-work`) launches task 1's implementer, which reserves the whole daily
    budget ($0.01, the lane's history), and is SIGKILLed mid-lane. Its run stays `running` with a live lease (A's
    claim has ~120 s left), so its reservation still counts: a launch for another task is refused. Runner B (own
    home, same ledger) takes task 1 over: A's run is marked interrupted, its reservation ends, and B's lane for
    task 1 launches at once (not after the lease), while the budget still holds for task 2."""
    from chaos_support import kill_group, runner_homes, wait_for, watcher

    p, homes = runner_homes(tmp_path / "w", runners=2, tasks=2, sleep="3")
    for h in homes:
        _limit(h, daily_budget_usd=0.01, task_budget_usd=3.0)
    _seed_history(homes[0], 0.01)

    def running():
        return [r for r in _task_lanes(homes[0]) if r["status"] == "running"]

    a = watcher(homes[0], jobs=1, log=tmp_path / "runner-a.log")
    try:
        assert wait_for(lambda: bool(running()), 60), (tmp_path / "runner-a.log").read_text()
    finally:
        kill_group(a)                                    # SIGKILL mid-lane (the sandboxed lane dies with it)
    (held,) = running()
    assert held["reserved_usd"] == pytest.approx(0.01)
    led = Ledger.open(ledger_path(homes[1]), create=False)
    try:
        assert daily_spend_since(led, day_start()) == (0.0, pytest.approx(0.01), 1)   # still reserved
        other = 2 if held["task_id"] == 1 else 1
        claim = take(led, other, runner="probe")
        with pytest.raises(BudgetRefused):               # no room for another lane while A's run reserves it
            start_run(led, task_id=other, error_id=None, round=1, role="implementer", vendor="demo-implementer",
                      head_sha=None, claim_token=claim.token,
                      budget=DailyBudget(limit_usd=0.01, since=day_start(), fallback_usd=3.0))
        leases.release_claim(led, other, claim.token)
    finally:
        led.close()

    b = watcher(homes[1], jobs=1, log=tmp_path / "runner-b.log")
    assert b.wait(120) == 0, (tmp_path / "runner-b.log").read_text()
    lanes = _task_lanes(homes[0])
    by_id = {r["id"]: r for r in lanes}
    assert by_id[held["id"]]["status"] == "interrupted"
    redo = [r for r in lanes if r["id"] != held["id"]]
    assert [(r["task_id"], r["status"], r["log_dir"].startswith(f"{homes[1]}/")) for r in redo] == \
        [(held["task_id"], "complete", True)], ((tmp_path / "runner-b.log").read_text(), lanes)
    con = ledger_conn(homes[0])
    try:
        waiting = con.execute("SELECT wait_reason FROM tasks WHERE id = ?", (other,)).fetchone()[0]
    finally:
        con.close()
    assert waiting.startswith("waiting: daily budget spent ($0.01 of $0.01"), waiting


def test_the_two_pr_reviewers_racing_for_the_last_of_the_daily_budget_launch_one(world):
    """The PR quality and logic reviewers start together in two threads after one budget check. The demo's rounds
    before them cost $0.03 (two implementer runs at $0.01, two reviewer runs at $0.005); with a $0.035 daily budget
    there is room for one more lane: one PR reviewer launches and reserves the rest, the other is refused at its
    launch and the task waits, with the reason; raising the budget lets the other one run, and the task ends done
    with one run of each (before reservations both launched at once: $0.04 of $0.035)."""
    edit_config(world, lambda c: c["limits"].update(daily_budget_usd=0.035))
    ingest_and_decide(world)
    scan(world, "error-fix")
    run_until_settled(world, passes=2)

    def runs():
        led = ledger(world)
        try:
            return (led.all("SELECT role, cost_usd, reserved_usd FROM lane_runs ORDER BY id"),
                    led.one("SELECT state, wait_reason FROM tasks WHERE id = 1"))
        finally:
            led.close()

    lanes, task = runs()
    before = [r for r in lanes if not r["role"].startswith("pr-")]
    assert sum(r["cost_usd"] for r in before) == pytest.approx(0.03), lanes
    pr = [r for r in lanes if r["role"].startswith("pr-")]
    assert len(pr) == 1 and pr[0]["reserved_usd"] == pytest.approx(0.005), lanes   # the rest of the day, no more
    assert task["state"] == "working" and task["wait_reason"] == "waiting: daily budget spent ($0.035 of $0.035)", task
    edit_config(world, lambda c: c["limits"].update(daily_budget_usd=1.0))
    run_until_settled(world)
    lanes, task = runs()
    assert task["state"] == "done", task
    assert sorted(r["role"] for r in lanes if r["role"].startswith("pr-")) == ["pr-logic", "pr-quality"]
