"""Issue 13 case 14: forge calls that failed for now are remembered across scans.

Real parts: the GitHub REST simulator (OpenAPI-validated) behind a real fault-injecting HTTP proxy on 127.0.0.1
(tests/fault_proxy.py: the simulator cannot answer 503 or rate limits on demand), the demo project with a real
bare remote, scripted lanes as real subprocesses, `agent watch ...` through the CLI."""

from __future__ import annotations
import time

import pytest

from chaos_support import build, run_to_end
from fault_proxy import Fault, FaultProxy
from test_forge_github_sim import sim  # noqa: F401  (the module-scoped simulator fixture)
from conftest import ledger_conn

pytestmark = pytest.mark.slow

ENV = {"GITHUB_TOKEN": "sim-token-not-secret"}


@pytest.fixture
def proxy(sim):  # noqa: F811
    p = FaultProxy(sim.url).start()
    yield p
    p.stop()


@pytest.fixture
def world(tmp_path, proxy, monkeypatch):
    monkeypatch.setenv("GITHUB_TOKEN", ENV["GITHUB_TOKEN"])
    return build(tmp_path / "w", tasks=1, forge="github", github_api_url=proxy.url)


def cli(home, *args):
    from click.testing import CliRunner

    from agent.cli import cli as root

    return CliRunner().invoke(root, ["--home", str(home), *args])


def the_pr(home, sim):  # noqa: F811
    with ledger_conn(home) as c:
        number = c.execute("SELECT number FROM prs WHERE task_id = 1").fetchone()[0]
    (pr,) = [p for p in sim.pulls() if p["number"] == number]
    return pr


def test_pr_text_update_that_failed_all_retries_is_retried_on_later_scans(world, proxy, sim):  # noqa: F811
    home = world["home"]
    # every PR text update (PATCH) answers 503: the final update with the PR reviewers' verdicts fails all
    # its in-pass retries
    proxy.faults.append(Fault("PATCH", r"/pulls/\d+$", 503, body={"message": "Service Unavailable"}))
    run_to_end(home, env=ENV)
    patches = [c for c in proxy.calls if c[0] == "PATCH"]
    assert len(patches) >= 4 and all(c[2] == 503 for c in patches), proxy.calls
    created = the_pr(home, sim)["body"]
    assert "pr:quality" not in created and "pr:logic" not in created   # the text from before the PR reviews
    owed = cli(home, "events", "--json")
    assert "pr.text_pending" in owed.stdout
    # still failing: the next scan tries again; it failed the same way, so it prints nothing (no news)
    calls = len(proxy.calls)
    r = cli(home, "watch", "pr-merged")
    assert r.exit_code == 0 and r.output == "", r.output
    assert [c for c in proxy.calls[calls:] if c[0] == "PATCH"]
    with ledger_conn(home) as c:
        attempts, reason = c.execute("SELECT attempts, reason FROM forge_pending WHERE key = 'pr_text:1'").fetchone()
    assert attempts == 2 and "503" in reason
    # the forge is back: the next scan lands the text (old: never retried, the PR kept its creation text)
    proxy.faults.clear()
    r = cli(home, "watch", "pr-merged")
    assert r.exit_code == 0 and "text updated" in r.output, r.output
    pr = the_pr(home, sim)
    assert pr["body"] != created and pr["body"] in cli(home, "pr", "show", "1").output
    assert "`pr:quality`" in pr["body"] and "`pr:logic`" in pr["body"]     # the PR reviewers' verdicts
    calls = len(proxy.calls)
    assert cli(home, "watch", "pr-merged").output == ""          # nothing owed now, nothing printed
    assert not [c for c in proxy.calls[calls:] if c[0] == "PATCH"]
    import requests  # leave the shared simulator clean for the next test: close this PR

    requests.post(f"{sim.url}/_sim/pulls/demo/widgets/{pr['number']}/state", json={"state": "closed"}, timeout=10)


def test_rate_limit_reset_is_remembered_and_no_call_is_made_before_it(world, proxy, sim):  # noqa: F811
    home = world["home"]
    run_to_end(home, env=ENV)
    reset = int(time.time()) + 3600
    proxy.faults.append(Fault("GET", r"/pulls/\d+$", 403, headers={"X-RateLimit-Remaining": "0",
                                                                   "X-RateLimit-Reset": str(reset)},
                              body={"message": "API rate limit exceeded"}))
    r = cli(home, "watch", "pr-merged")
    assert "rate limited" in r.output and "no call before then" in r.output, r.output
    calls = len(proxy.calls)
    # later scans make no call to that forge before the reset (old: called again at once)
    r = cli(home, "watch", "all")
    assert r.exit_code == 0 and r.output == "", r.output              # remembered: no news either
    r = cli(home, "watch", "pr-merged", "--json")
    assert "remembered from an earlier call" in r.output
    assert proxy.calls[calls:] == []
    # once the reset time has passed, calls resume (the test moves the remembered reset into the past)
    with ledger_conn(home) as c:
        assert c.execute("SELECT count(*) FROM forge_pending WHERE kind = 'rate_limit' AND until >= ?",
                         (reset,)).fetchone()[0] == 1
        c.execute("UPDATE forge_pending SET until = ? WHERE kind = 'rate_limit'", (time.time() - 1,))
    proxy.faults.clear()
    r = cli(home, "watch", "pr-merged", "--json")
    assert r.exit_code == 0 and '"still open' not in r.output and proxy.calls[calls:], r.output
