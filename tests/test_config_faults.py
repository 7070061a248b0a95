"""Issue 13 case 3: an empty or partial config no longer gate-blocks every task; blocks the config caused clear by
themselves once it is valid again; "no vendor configured" blocks at once with the real fix.

Real parts: the demo project and bare remote, real git worktrees, scripted lanes as subprocesses, the installed
`agent` binary. Where a test needs a scan to run with a config that the CLI would now refuse (the race of an edit
landing between a scan's config load and its use), it calls the scan function in-process with that Config object.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess

import pytest
import yaml

from chaos_support import build, check_invariants, run_to_end

from conftest import LANES_YAML, agent_bin, ledger_conn


def agent(home, *args):
    env = {k: v for k, v in os.environ.items() if k != "AGENT_CRASHPOINT"}
    env["AGENT_HOME"] = str(home)
    return subprocess.run([*agent_bin(), *args], env=env, capture_output=True, text=True, timeout=120)


def tasks(home):
    con = ledger_conn(home)
    try:
        return [dict(r) for r in con.execute("SELECT id, state, blocked_reason FROM tasks ORDER BY id")]
    finally:
        con.close()


def events(home, kind):
    con = ledger_conn(home)
    try:
        return [json.loads(p) for (p,) in con.execute("SELECT payload FROM events WHERE kind = ? ORDER BY id",
                                                      (kind,))]
    finally:
        con.close()


@pytest.mark.parametrize("text, missing", [
    ("", ["repos.demo/widgets (open tasks 1, 2)", "lanes.implementer (open tasks 1, 2)"]),
    ("# everything commented out\n", ["repos.demo/widgets (open tasks 1, 2)"]),
    (None, ["lanes.reviewer (open tasks 1, 2)"]),  # the real config without its reviewer lane
])
def test_a_config_that_drops_what_open_tasks_need_is_refused_naming_them(tmp_path, text, missing):
    p = build(tmp_path / "w", tasks=2)
    home = p["home"]
    good = (home / "config.yaml").read_text()
    if text is None:
        cfg = yaml.safe_load(good)
        del cfg["lanes"]["reviewer"]
        text = yaml.safe_dump(cfg)
    (home / "config.yaml").write_text(text)
    for args in (("watch", "error-fix-work"), ("watch", "all"), ("lane", "list")):  # as invalid YAML is
        r = agent(home, *args)
        assert r.returncode == 1 and "Traceback" not in r.stderr, (args, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "which open tasks need" in lines[0], r.stderr
        for m in missing:
            assert m in lines[0], (m, lines[0])
    r = agent(home, "daemon", "--interval", "0", "--max-ticks", "2")
    assert r.stdout.count("config not loaded, pass skipped") == 2, r.stdout
    # nothing was blocked: the tasks are exactly as they were
    assert [t["state"] for t in tasks(home)] == ["open", "open"]
    (home / "config.yaml").write_text(good)
    run_to_end(home, log=tmp_path / "w.log")
    check_invariants(home, p["remote"], tasks=2)


def _bad(config, what):
    if what == "lane":
        return dataclasses.replace(config, lanes={k: v for k, v in config.lanes.items() if k != "implementer"})
    return dataclasses.replace(config, repos={})


@pytest.mark.parametrize("what, reason", [
    ("lane", "config: no vendor configured for role implementer; add lanes.implementer: {vendor: NAME} to "
             "config.yaml"),
    ("repo", "config: repository demo/widgets is not configured; add it under repos: in config.yaml"),
])
def test_a_config_block_is_immediate_and_clears_itself_once_the_config_is_valid(tmp_path, what, reason):
    from agent.config import load_config
    from agent.flows.fixer import advance

    p = build(tmp_path / "w", tasks=1)
    home = p["home"]
    config = load_config(home / "config.yaml")
    advance(home, _bad(config, what), 1)  # one pass with the config as that scan loaded it
    (t,) = tasks(home)
    assert t["state"] == "gate-blocked", t  # at once, not after three passes
    assert t["blocked_reason"].startswith(reason), t
    assert "--vendor" not in t["blocked_reason"]  # watch has no such flag
    assert "task.error" not in [e for e in events(home, "task.error")]

    # while the config still lacks it, the block stays and nothing is logged as lifted
    good = (home / "config.yaml").read_text()
    cfg = yaml.safe_load(good)
    if what == "lane":
        del cfg["lanes"]["implementer"]
    else:
        cfg["repos"] = {}
    (home / "config.yaml").write_text(yaml.safe_dump(cfg))
    r = agent(home, "watch", "error-fix-work")
    assert r.returncode == 0, r.stderr
    assert tasks(home)[0]["state"] == "gate-blocked" and events(home, "task.unblocked") == []

    # fixed: the next scan puts it back to work by itself (an event says why) and it runs to the end
    (home / "config.yaml").write_text(good)
    r = agent(home, "watch", "error-fix-work")
    assert r.returncode == 0 and "task 1: config fixed, back to work" in r.stdout, r.stdout + r.stderr
    (lifted,) = events(home, "task.unblocked")
    assert lifted["was"].startswith(reason)
    run_to_end(home, log=tmp_path / "w.log")
    check_invariants(home, p["remote"], tasks=1)


def test_only_config_blocks_are_lifted_by_the_script(ledger):
    from agent.domain import chain
    from agent.ledger.tasks import Refused, create_task, lift_config_block, transition

    tid, _ = create_task(ledger, "acme/widgets", "t")
    transition(ledger, tid, chain.BLOCKED, "script", "task budget spent")
    assert lift_config_block(ledger, tid, "x") is False
    with pytest.raises(Refused, match="only a human"):
        transition(ledger, tid, chain.WORKING, "script", "trying")
    assert "only a human" in chain.check_transition("gate-blocked", "working", "script",
                                                    blocked_reason="task budget spent")
    assert chain.check_transition("gate-blocked", "working", "script", blocked_reason="config: no lane") is None


def test_lane_run_by_hand_still_offers_its_vendor_flag(tmp_path, agent):
    (tmp_path / "spec.md").write_text("do it\n")
    r = agent("lane", "run", "--role", "reviewer", "--spec-file", str(tmp_path / "spec.md"), "--cwd", str(tmp_path))
    assert r.exit_code == 1 and "no vendor configured for role reviewer" in r.stderr and "--vendor" in r.stderr


def test_task_create_refuses_a_repository_the_config_does_not_have(agent, home):
    (home / "config.yaml").write_text("repos: {acme/widgets: {url: /srv/widgets.git}}\n" + LANES_YAML)
    r = agent("task", "create", "--repo", "acme/gadgets", "--title", "t")
    assert r.exit_code == 1 and "repository acme/gadgets is not configured" in r.stderr
    assert agent("task", "create", "--repo", "acme/widgets", "--title", "t").exit_code == 0
