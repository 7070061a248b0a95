"""A host socket that goes away between the sandbox plan and bwrap's start (a service restarting, a test removing its
own): the plan blanked it (``--ro-bind /dev/null SOCKET``), bwrap cannot make that mount point in the read-only root
and exits before the command runs.  That used to make the lane ``unavailable`` (its task gate-blocked) or a check
"fail" with bwrap's message; now the sandbox is planned and started again (agent.lanes.sandbox.vanished_mount).

Real bubblewrap, the real lane runner and check runner.  What cannot be timed from here, the socket vanishing in
the few milliseconds between the scan and bwrap's start, is made certain: the scan (``egress.host_sockets``) is
replaced so that its first answer names a socket that no longer exists, and later answers are the real scan's.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from agent.ledger.eventlog import events
from agent.lanes import egress
from agent.lanes.lane import LaneRequest, run_lane
from agent.lanes.sandbox import (SETUP_RETRIES, bwrap_path, check_argv, lane_plan, sandboxed_check, vanished_mount,
                                 with_argv_files, wrap)
from agent.infra.env import lane_env
from agent.infra.proc import run
from lane_helpers import make_config, make_repo

pytestmark = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap is not installed; scripts/ci-bwrap "
                                "installs it (apt-get install bubblewrap as root)")

REPORT = "printf 'done\\n\\nSTATUS: complete\\nSUMMARY: ran\\nFINDINGS: none\\n'\n"


def _gone() -> Path:
    """A socket path under /var/lib (one of the scanned places) whose directory does not exist."""
    return Path("/var/lib") / f"agent-test-gone-{uuid.uuid4().hex[:10]}" / "mysqld.sock"


@pytest.fixture
def vanishing(monkeypatch):
    """The host scan's first answers name a vanished socket (``times`` of them); then the real scan answers."""
    real = egress.host_sockets
    calls = {"n": 0, "times": 1, "gone": _gone()}

    def scan(hidden, *args, **kwargs):
        calls["n"] += 1
        found = real(hidden, *args, **kwargs)
        return [calls["gone"], *found] if calls["n"] <= calls["times"] else found

    monkeypatch.setattr(egress, "host_sockets", scan)
    return calls


def test_bwraps_failure_on_a_vanished_mount_point_is_recognised(tmp_path):
    gone_dir, gone_file = _gone(), Path("/var/lib") / f"agent-test-gone-{uuid.uuid4().hex[:10]}.sock"
    net = egress.Net(mode="none", hide=[], blank=[gone_dir, gone_file])
    repo = make_repo(tmp_path / "repo")
    for d in ("run", "home"):
        (tmp_path / d).mkdir()
    plan = lane_plan(cwd=repo, writable=False, agent_home=tmp_path / "home", run_dir=tmp_path / "run",
                     spec_paths=[], state_paths=[], extra_writable=[])
    plan.unix_sockets = "allow"
    env = lane_env(())
    argv, env = wrap(bwrap_path(), ["true"], with_argv_files(plan, ["true"], env), env, net)
    res = run(argv, cwd=repo, env=env, timeout=60, stdout_path=tmp_path / "o", stderr_path=tmp_path / "e")
    assert res.exit_code != 0 and "bwrap: Can't" in res.stderr_text()
    assert vanished_mount(argv, res.stderr_text()) in (str(gone_dir), str(gone_file))
    # the same message for a path that exists again, or one the plan never blanked, is not a vanished mount
    assert vanished_mount(argv, f"bwrap: Can't create file at {repo}/app.py: Read-only file system") is None
    assert vanished_mount(["bwrap", "--", "true"], res.stderr_text()) is None
    assert vanished_mount(argv, "bwrap: execvp true: No such file or directory") is None
    assert vanished_mount(argv, "") is None


def _review(tmp_path, ledger):
    """A reviewer lane (a command vendor printing its report) in bwrap, recorded in ``ledger``."""
    script = tmp_path / "report.sh"
    script.write_text("#!/bin/sh\n" + REPORT)
    script.chmod(0o755)
    config = make_config({"p": {"command": [str(script)]}}, {"reviewer": {"vendor": "p", "repair": 0}})
    spec = tmp_path / "spec.md"
    spec.write_text("review\n")
    return run_lane(LaneRequest(config=config, home=tmp_path / "home", role="reviewer", spec_path=spec,
                                cwd=make_repo(tmp_path / "repo"), ledger=ledger))


def test_a_lane_whose_blanked_socket_vanished_is_started_again_not_unavailable(tmp_path, ledger, vanishing):
    res = _review(tmp_path, ledger)
    assert res.status == "complete", (res.status, res.reason)
    assert vanishing["n"] == 2                                   # the first plan's scan, then the new one
    restarted = [e for e in events(ledger) if e["kind"] == "lane.sandbox_restarted"]
    assert [e["payload"]["gone"] for e in restarted] == [str(vanishing["gone"])]


def test_a_socket_that_keeps_vanishing_is_retried_a_bounded_number_of_times(tmp_path, ledger, vanishing):
    vanishing["times"] = 100
    res = _review(tmp_path, ledger)
    assert res.status == "unavailable" and "kept vanishing" in (res.reason or ""), (res.status, res.reason)
    assert str(vanishing["gone"]) in res.reason
    assert vanishing["n"] == SETUP_RETRIES + 1


def test_a_check_whose_blanked_socket_vanished_runs_and_is_judged_on_its_own_exit(tmp_path, vanishing):
    config = make_config({})
    repo = make_repo(tmp_path / "repo")
    argv, _ = check_argv(config, tmp_path / "home", repo, "true", tmp_path / "plan-only")
    assert str(vanishing["gone"]) in argv                        # the scan's first answer is in the plan
    vanishing["n"] = 0
    check = sandboxed_check(config, tmp_path / "home", repo, "exit 3", tmp_path / "scratch")
    res = check(timeout=60, stdout_path=tmp_path / "check.out", stderr_path=tmp_path / "check.err")
    assert res.exit_code == 3, res.stderr_text()                 # the check's own status, not bwrap's
    assert "bwrap" not in res.stderr_text()
    assert vanishing["n"] == 2
