"""`agent lane list` / `agent lane run`: click's CliRunner and a real `.venv/bin/agent` subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from agent.cli import cli
from agent.ledger import ledger_path
from lane_helpers import FakeAgent, make_repo, report_impl, report_review

AGENT_BIN = Path(sys.executable).parent / "agent"


@pytest.fixture
def setup(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    agent = FakeAgent(tmp_path)
    config = {"vendors": {"fake": agent.vendor_config()},
              "lanes": {"reviewer": {"vendor": "fake"}, "implementer": {"vendor": "fake", "repair": 1}},
              "limits": {"repair": 1}}
    (home / "config.yaml").write_text(yaml.safe_dump(config))
    repo = make_repo(tmp_path / "repo")
    spec = tmp_path / "spec.md"
    spec.write_text("# Review the change\n")
    return home, agent, repo, spec


def invoke(home, *args):
    return CliRunner().invoke(cli, ["--home", str(home), *args], catch_exceptions=False)


def test_lane_run_json_has_contract_fields(setup):
    home, agent, repo, spec = setup
    agent.set({"session": "s-1", "print": "oops no report\n"},
              {"session": "s-1", "expect_session": "s-1", "cost": 0.5, "print": report_review(["nit: naming"])})
    res = invoke(home, "lane", "run", "--role", "reviewer", "--vendor", "fake", "--spec-file", str(spec),
                 "--cwd", str(repo), "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    for key in ("status", "findings", "findings_text", "session_id", "exit_code", "cost", "repairs"):
        assert key in doc
    assert doc["status"] == "complete" and doc["findings"] == 1 and doc["findings_text"] == "- nit: naming"
    assert doc["session_id"] == "s-1" and doc["exit_code"] == 0 and doc["cost"] == 0.5
    assert [r["label"] for r in doc["repairs"]] == ["reviewer repair 1/1"]
    assert doc["verdict"] == "reject"
    # recorded in the home's ledger
    from agent.ledger import Ledger

    led = Ledger.open(ledger_path(home))
    try:
        assert led.one("SELECT status, role FROM lane_runs WHERE id = ?", (doc["run_id"],)) == \
            {"status": "complete", "role": "reviewer"}
    finally:
        led.close()


def test_lane_run_uses_configured_vendor_and_human_output(setup):
    home, agent, repo, spec = setup
    agent.set({"session": "s-2", "print": report_impl(), "edit": {"app.py": "x = 1\n"}})
    res = invoke(home, "lane", "run", "--role", "implementer", "--spec-file", str(spec), "--cwd", str(repo))
    assert res.exit_code == 0, res.output
    assert "implementer fake -> complete" in res.output and "session: s-2" in res.output
    assert (repo / "app.py").read_text() == "x = 1\n"


def test_lane_run_failure_exits_1_with_json_still_one_document(setup, capsys):
    from agent.cli import main

    home, agent, repo, spec = setup
    config = yaml.safe_load((home / "config.yaml").read_text())
    config["sandbox"] = "none"        # the runner's worktree check (the sandbox would refuse the write itself)
    (home / "config.yaml").write_text(yaml.safe_dump(config))
    agent.set({"edit": {"app.py": "changed by reviewer\n"}, "print": report_review()})
    with pytest.raises(SystemExit) as exit_info:
        main(["--home", str(home), "lane", "run", "--role", "reviewer", "--spec-file", str(spec),
              "--cwd", str(repo), "--json"])
    assert exit_info.value.code == 1
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["status"] == "rejected"
    assert err.startswith("agent: lane rejected: read-only lane changed the worktree: app.py")


def test_lane_run_usage_errors_exit_2(setup):
    home, agent, repo, spec = setup
    res = invoke(home, "lane", "run", "--role", "tester", "--spec-file", str(spec), "--cwd", str(repo))
    assert res.exit_code == 2
    res = invoke(home, "lane", "run", "--role", "reviewer", "--spec-file", str(repo / "nope.md"))
    assert res.exit_code == 2


def test_lane_list_json(setup):
    home, agent, repo, spec = setup
    res = invoke(home, "lane", "list", "--json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    by = {r["vendor"]: r for r in rows}
    assert by["fake"]["kind"] == "command" and by["fake"]["found"] is True
    assert by["fake"]["roles"] == ["implementer", "reviewer"] and by["fake"]["can_resume"] is True
    assert by["fake"]["version"].startswith("sha256:")
    for name in ("codex", "claude", "opencode", "aider", "grok", "gemini"):
        assert name in by and by[name]["kind"] == "builtin"


def test_real_agent_subprocess_lane_run_and_list(setup, tmp_path):
    """The installed console script, as cron or a human would run it; a canary token in its
    environment must not reach the lane."""
    home, agent, repo, spec = setup
    agent.set({"session": "sub-1", "print": report_review()})
    env = {**os.environ, "AGENT_HOME": str(home), "GITHUB_TOKEN": "canary-subprocess-token-xyz"}
    proc = subprocess.run([str(AGENT_BIN), "lane", "run", "--role", "reviewer", "--vendor", "fake",
                           "--spec-file", str(spec), "--cwd", str(repo), "--json"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["status"] == "complete" and doc["findings"] == 0 and doc["session_id"] == "sub-1"
    assert "GITHUB_TOKEN" not in agent.calls[0]["env"]
    proc = subprocess.run([str(AGENT_BIN), "lane", "list", "--json"], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert any(r["vendor"] == "fake" for r in json.loads(proc.stdout))
    # a missing vendor binary: exit 1, one JSON document, status unavailable
    cfg = yaml.safe_load((home / "config.yaml").read_text())
    cfg["vendors"]["ghost"] = {"command": ["no-such-agent-binary-here", "{spec}"]}
    (home / "config.yaml").write_text(yaml.safe_dump(cfg))
    proc = subprocess.run([str(AGENT_BIN), "lane", "run", "--role", "implementer", "--vendor", "ghost",
                           "--spec-file", str(spec), "--cwd", str(repo), "--json"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["status"] == "unavailable"
    assert proc.stderr.startswith("agent: lane unavailable")


def test_version_probe_is_cached_across_processes_and_redone_when_the_binary_changes(setup, tmp_path):
    """A cron tick is a new process: the vendor's `--version` runs once per binary, not once per process; a
    touched or replaced binary (new mtime/size) is probed again."""
    home, agent, repo, spec = setup
    log = tmp_path / "version-calls.log"
    codex = tmp_path / "bin" / "codex"
    codex.parent.mkdir()
    codex.write_text(f"#!/bin/sh\necho probed >> {log}\necho 'codex-cli 9.9.1'\n")
    codex.chmod(0o755)
    cfg = yaml.safe_load((home / "config.yaml").read_text())
    cfg["vendors"]["codex"] = {"bin": str(codex)}
    cfg["sandbox"] = "none"              # the probe's log is outside any sandbox (a sandboxed probe: test_lane_start)
    (home / "config.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "AGENT_HOME": str(home)}

    def listed() -> str:
        proc = subprocess.run([str(AGENT_BIN), "lane", "list", "--json"], capture_output=True, text=True, env=env,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr
        return {r["vendor"]: r for r in json.loads(proc.stdout)}["codex"]["version"]

    def calls() -> int:
        return len(log.read_text().splitlines()) if log.exists() else 0

    assert listed() == "codex-cli 9.9.1" and calls() == 1
    assert listed() == "codex-cli 9.9.1" and calls() == 1          # second process: from the home's cache
    st = codex.stat()
    os.utime(codex, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))   # touched
    assert listed() == "codex-cli 9.9.1" and calls() == 2
    codex.write_text(f"#!/bin/sh\necho probed >> {log}\necho 'codex-cli 9.9.2 (new)'\n")   # replaced
    assert listed() == "codex-cli 9.9.2 (new)" and calls() == 3
    assert listed() == "codex-cli 9.9.2 (new)" and calls() == 3
    # a garbage cache file is ignored (probed again), never trusted as a version
    (home / "lanes" / "versions.json").write_text("[not, a dict")
    assert listed() == "codex-cli 9.9.2 (new)" and calls() == 4
