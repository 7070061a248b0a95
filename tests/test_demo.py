"""`agent demo` as a new user runs it: the installed binary, offline, to a draft PR in the local forge."""

from __future__ import annotations

import json
import subprocess

from conftest import agent_bin


def test_demo_runs_to_a_draft_pr_and_a_third_round_from_a_review_comment(tmp_path):
    out = tmp_path / "demo"
    r = subprocess.run([*agent_bin(), "demo", "--dir", str(out)], capture_output=True, text=True, timeout=120,
                       env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "round 1: reviewer rejected, 1 finding" in r.stdout
    assert "task 1: round 3 started by PR feedback (1 item)" in r.stdout
    assert "task 1: replied on PR #1 (round 3)" in r.stdout
    assert "task 1: done after 3 round(s)" in r.stdout
    assert "look next:" in r.stdout
    # the printed commands work as printed (agent is not on this PATH, so the full path is shown)
    shown = [line.strip() for line in r.stdout.splitlines() if line.strip().endswith(" status")][0]
    assert shown.startswith(agent_bin()[0]) and f"--home {out / 'home'} status" in shown
    pr_files = list((out / "home" / "prs").glob("*.md"))
    assert len(pr_files) == 1 and "(draft)" in pr_files[0].read_text()
    md = pr_files[0].read_text()
    assert "DEFAULT_QTY" in md and "agent-own: task-1-round-3" in md  # the review comment and the one reply
    # the PR proves itself: the demo's failing test at the base flips, and its base run shows the production error
    assert "proof: proven: 1 test fails on the base and passes on the head (reproduces the error)" in r.stdout
    assert "**Proof:** 1 test fails on the base commit and passes with this change; the base failure reproduces " \
           "the production error." in md
    assert "test_pricing.OrderTotal.test_missing_qty_means_one_unit" in md and "KeyError: 'qty'" in md
    status = subprocess.run([*agent_bin(), "--home", str(out / "home"), "status", "--json"], capture_output=True,
                            text=True, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    data = json.loads(status.stdout)
    assert data["tasks"]["done"] == 1 and data["prs"]["open"] == 1 and data["errors"]["fixing"] == 1


def test_demo_refuses_a_non_empty_dir(tmp_path, agent):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    r = agent("demo", "--dir", str(tmp_path / "full"))
    assert r.exit_code == 1 and "is not empty" in r.stderr
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"


def test_demo_runs_without_bubblewrap_and_says_so(tmp_path, monkeypatch):
    """A fresh machine has no bubblewrap: the README's first command must still reach a draft PR.  The demo's lanes
    are its own scripted stand-ins, so it runs them unsandboxed and says so.  bwrap's absence is simulated by
    patching its lookup (it is installed here, and removing it would break concurrent tests)."""
    from agent.app.demo import run_demo
    from agent.lanes import sandbox

    monkeypatch.setattr(sandbox, "bwrap_path", lambda: None)
    lines: list[str] = []
    run_demo(tmp_path / "demo", echo=lines.append)
    text = "\n".join(lines)
    assert "bubblewrap is not installed" in text and "task 1: done after 3 round(s)" in text, text
    assert "sandbox: none" in (tmp_path / "demo" / "home" / "config.yaml").read_text()
