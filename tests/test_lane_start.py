"""A lane starts wherever its vendor CLI is installed and fails clearly: real node CLIs installed as npm does (a
``node_modules/.bin`` link into the package tree) under the test's /tmp directory, run in real bubblewrap through
``run_lane`` with the built-in codex adapter."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.lanes.builtin import crash_reason
from agent.lanes.lane import LaneRequest, run_lane
from agent.lanes.sandbox import bwrap_path
from agent.ledger import Ledger
from lane_helpers import make_config, make_repo

SECRET = "sk-canary-9f8e7d6c5b4a39281706f5e4d3c2b1a0"

CLI = "#!/usr/bin/env node\nrequire('../lib/main.js').run();\n"
LIB = """exports.run = async () => {
  if (process.argv.includes('--version')) { console.log('codex-cli 0.0.1'); return; }
  await Promise.resolve();
  throw new Error('boom: model config missing for key ' + process.env.OPENAI_API_KEY);
};
"""


@pytest.fixture
def env(tmp_path, monkeypatch):
    assert bwrap_path(), "bubblewrap is installed by scripts/ci-sandbox"
    assert str(tmp_path).startswith("/tmp/"), "the point is a CLI under /tmp, which the sandbox's private /tmp hides"
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    home = tmp_path / "home"
    home.mkdir()
    repo = make_repo(tmp_path / "repo")
    spec = tmp_path / "spec.md"
    spec.write_text("# Task\nFix it.\n")
    led = Ledger.open(home / "ledger.db")
    yield tmp_path, home, repo, spec, led
    led.close()


def npm_install(root: Path) -> Path:
    """An npm-style install: the package tree plus its ``.bin`` link, as ``npm install --prefix root`` lays it out."""
    pkg = root / "node_modules" / "fakecodex"
    (pkg / "bin").mkdir(parents=True)
    (pkg / "lib").mkdir()
    (pkg / "bin" / "codex.js").write_text(CLI)
    (pkg / "bin" / "codex.js").chmod(0o755)
    (pkg / "lib" / "main.js").write_text(LIB)
    (root / "node_modules" / ".bin").mkdir()
    link = root / "node_modules" / ".bin" / "codex"
    link.symlink_to("../fakecodex/bin/codex.js")
    return link


def run(env, bin_path: Path, network: str = "proxy"):
    tmp, home, repo, spec, led = env
    config = make_config({"codex": {"bin": str(bin_path), "env": ["OPENAI_API_KEY"]}},
                         {"implementer": {"vendor": "codex", "repair": 0}},
                         sandbox={"mode": "bwrap", "network": network})
    return run_lane(LaneRequest(config=config, home=home, role="implementer", spec_path=spec, cwd=repo, ledger=led))


def test_cli_installed_under_tmp_starts_in_bwrap_and_its_crash_names_the_error(env):
    """The .bin link and its node_modules under /tmp are bound into the sandbox (old: `bwrap: execvp ...: No such
    file or directory`), and the crash's reason is node's error line with the exit code, redacted, not the
    `Node.js vNN` banner that ends the stack."""
    res = run(env, npm_install(env[0] / "cli"))
    assert res.status == "malformed", res.reason
    assert "Error: boom: model config missing for key" in res.reason and "(exit 1)" in res.reason
    assert "Node.js" not in res.reason and " at " not in res.reason and "execvp" not in res.reason
    assert SECRET not in res.reason and SECRET not in (res.excerpt or "")


@pytest.mark.parametrize("network", ["none", "proxy"])
def test_sandbox_that_cannot_exec_the_vendor_is_unavailable_with_the_cause(env, network):
    """bwrap's own exec failure (exit 1, `bwrap: execvp ...`) is `unavailable` with one line naming the cause and
    the fix (the fixer gate-blocks on it), never a malformed report."""
    home = env[1]
    cli = home / "bin" / "codex"           # inside the agent home, which the sandbox hides and never binds back
    cli.parent.mkdir()
    cli.write_text("#!/bin/sh\necho never\n")
    cli.chmod(0o755)
    res = run(env, cli, network)
    assert res.status == "unavailable", (res.status, res.reason)
    assert "bwrap: execvp " in res.reason and "not found inside the lane" not in res.reason and "vendors.codex.bin" in res.reason
    assert "\n" not in res.reason and res.repairs == []
    row = env[4].one("SELECT status FROM lane_runs WHERE id = ?", (res.run_id,))
    assert row["status"] == "unavailable"


def test_crash_reason_picks_the_first_error_line():
    node = ("/x/lib/main.js:4\n  throw new Error('boom');\n  ^\n\nError: boom\n    at Object.run (/x/lib/main.js:4:9)\n"
            "    at async main (/x/bin/cli.js:2:1)\n\nNode.js v20.20.2\n")
    assert crash_reason(node, 1) == "Error: boom (exit 1)"
    py = "Traceback (most recent call last):\n  File \"/x/a.py\", line 1, in <module>\nValueError: bad key\n"
    assert crash_reason(py, 2) == "ValueError: bad key (exit 2)"
    assert crash_reason("warning: slow\nsomething odd happened\n", 3) == "warning: slow (exit 3)"
    assert crash_reason("", None) == "no exit code"


def test_doctor_and_lane_list_probe_the_binary_in_the_lanes_sandbox(env):
    """`agent doctor` and `agent lane list` run the version probe in the sandbox the lane gets: a CLI the sandbox
    cannot start (here: inside the agent home, which every lane has hidden) is not "ok"; one under /tmp is."""
    from agent.app.doctor import check_vendor
    from agent.lanes.lane import list_lanes

    tmp, home = env[0], env[1]
    hidden = home / "bin" / "codex"
    hidden.parent.mkdir()
    hidden.write_text("#!/bin/sh\necho 'codex-cli 1.2.3'\n")
    hidden.chmod(0o755)
    visible = npm_install(tmp / "cli")

    def config(bin_path):
        return make_config({"codex": {"bin": str(bin_path)}}, {"implementer": {"vendor": "codex"}},
                           sandbox={"mode": "bwrap", "network": "none"})

    bad = check_vendor(config(hidden), "codex", ["implementer"], home)
    assert not bad.ok and "sandbox cannot start it" in bad.detail and "bwrap: execvp " in bad.detail, bad.detail
    good = check_vendor(config(visible), "codex", ["implementer"], home)
    assert good.ok and "codex-cli 0.0.1" in good.detail, good.detail
    rows = {r["vendor"]: r for r in list_lanes(config(hidden), home / "lanes")}
    assert rows["codex"]["version"].startswith("sha256:")          # the probe failed in the sandbox
    rows = {r["vendor"]: r for r in list_lanes(config(visible), home / "lanes")}
    assert rows["codex"]["version"] == "codex-cli 0.0.1"
