"""Issue 13 case 8: budgets that stop every vendor and a reset that does not bounce straight back into the block.

Real ledger, real git remote, the demo's scripted lanes as real subprocesses (each reports COST: 0.01).
Pricing of token-only vendors with the real codex and gemini CLIs is in tests/test_vendor_clis.py."""

from __future__ import annotations

import pytest

from agent.config import ConfigError, parse_config
from agent.lanes.prices import DEFAULT_PRICES, Price, price_for, priced_cost, tokens
from test_fixer import edit_config, home, ingest_and_decide, ledger, run_until_settled, scan, world  # noqa: F401


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
