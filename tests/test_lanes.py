"""run_lane end to end with `command` vendors: small Python agents run as real subprocesses in
real git repos, recorded in a real SQLite ledger.  No mocks."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from agent import AgentError
from agent.lanes.lane import CAPABILITY_DRIFT, LaneRequest, run_lane
from agent.lanes.vendors import VENDORS, CommandVendor, get_vendor
from agent.ledger import Ledger, eventlog
from lane_helpers import FakeAgent, make_config, make_repo, report_impl, report_review


@pytest.fixture
def env(tmp_path):
    class Env:
        pass

    e = Env()
    e.tmp = tmp_path
    e.home = tmp_path / "home"
    e.home.mkdir()
    e.repo = make_repo(tmp_path / "repo")
    e.spec = tmp_path / "spec.md"
    e.spec.write_text("# Task\nFix total() for carts without items.\n")
    e.ledger = Ledger.open(e.home / "ledger.db")
    e.agent = FakeAgent(tmp_path)
    yield e
    e.ledger.close()


def lane(e, role, config, **kw):
    kw.setdefault("ledger", e.ledger)
    return run_lane(LaneRequest(config=config, home=e.home, role=role, spec_path=e.spec, cwd=e.repo, **kw))


def cfg(e, resume=True, lanes=None, limits=None, env=None, **extra):
    return make_config({"fake": e.agent.vendor_config(resume=resume, env=env)},
                       lanes or {r: {"vendor": "fake"} for r in
                                 ("implementer", "reviewer", "pr-quality", "pr-logic", "decider")},
                       limits, **extra)


# ----------------------------------------------------------------------------- happy paths

def test_implementer_edits_file_in_git_repo_and_is_recorded(env):
    env.agent.set({"edit": {"app.py": "def total(cart):\n    return sum(cart.get('items', []))\n"},
                   "session": "sess-impl-1", "cost": 0.0123, "print": report_impl()})
    res = lane(env, "implementer", cfg(env), task_id=None, round=1, head_sha="abc123")
    assert res.status == "complete", res.reason
    assert "cart.get('items', [])" in (env.repo / "app.py").read_text()
    assert res.summary == "Guarded the missing key." and res.lesson == "carts can be empty"
    assert res.session_id == "sess-impl-1"
    assert res.cost_usd == pytest.approx(0.0123)
    assert res.exit_code == 0 and res.repairs == []
    # the agent ran in the worktree with the spec path filled in
    call = env.agent.calls[0]
    assert Path(call["cwd"]) == env.repo.resolve()
    assert call["spec"].startswith("# Task")
    # ledger row + events
    row = env.ledger.one("SELECT * FROM lane_runs WHERE id = ?", (res.run_id,))
    assert row["status"] == "complete" and row["session_id"] == "sess-impl-1"
    assert row["cost_usd"] == pytest.approx(0.0123) and row["round"] == 1 and row["head_sha"] == "abc123"
    assert row["pid"] and row["started_at"] and row["ended_at"] and row["manifest_hash"] == res.manifest_hash
    manifest = json.loads(row["manifest"])
    assert manifest["vendor"] == "fake" and manifest["role"] == "implementer"
    assert manifest["bin"] == str(Path(sys.executable).resolve()) or Path(manifest["bin"]).name.startswith("python")
    assert len(manifest["spec_sha256"]) == 64 and "{spec}" in manifest["argv"]
    kinds = [ev["kind"] for ev in eventlog.events(env.ledger)]
    assert kinds == ["lane.started", "lane.finished"]
    assert eventlog.events(env.ledger)[-1]["payload"]["status"] == "complete"
    # logs on disk under $AGENT_HOME/lanes/<run-id>/
    assert res.log_dir == env.home / "lanes" / str(res.run_id)
    assert (res.log_dir / "01-turn.stdout").read_text().startswith("SESSION: ")   # stored redacted
    assert json.loads((res.log_dir / "result.json").read_text())["status"] == "complete"


def test_reviewer_findings_reject_and_clean_review_approves(env):
    env.agent.set({"print": report_review(["no test for empty cart"])})
    res = lane(env, "reviewer", cfg(env))
    assert res.status == "complete" and res.findings == 1 and res.verdict == "reject"
    assert res.findings_text == "- no test for empty cart"
    env.agent.set({"print": report_review()})
    res = lane(env, "reviewer", cfg(env))
    assert res.findings == 0 and res.verdict == "approve"
    row = env.ledger.one("SELECT * FROM lane_runs WHERE id = ?", (res.run_id,))
    assert row["findings_count"] == 0 and row["attempt"] == 2


def test_works_without_a_ledger(env):
    env.agent.set({"print": report_review()})
    res = lane(env, "pr-logic", cfg(env), ledger=None)
    assert res.run_id is None and res.status == "complete"
    assert res.log_dir.parent == env.home / "lanes" and res.log_dir.name.startswith("adhoc-")


def test_decider_report_fields(env):
    env.agent.set({"print": "STATUS: complete\nDECISION: fix\nBRIEF: KeyError in total(); use .get\n"})
    res = lane(env, "decider", cfg(env))
    assert res.status == "complete" and res.report.decision == "fix" and "KeyError" in res.report.brief
    assert res.to_json()["report"]["brief"].startswith("KeyError")


# ----------------------------------------------------------------------------- read-only verification

# The runner's own worktree check is the line behind the sandbox (which mounts a read-only lane's worktree
# read-only, and then needs no picture: the sandboxed tests below); these run without it (`sandbox: none`) to prove
# the check alone.


def test_read_only_reviewer_that_edits_is_rejected(env):
    env.agent.set({"edit": {"app.py": "hacked\n"}, "print": report_review()})
    res = lane(env, "reviewer", cfg(env, sandbox="none"))
    assert res.status == "rejected"
    assert "read-only lane changed the worktree" in res.reason and "app.py" in res.reason
    assert res.verdict is None
    row = env.ledger.one("SELECT status, reason FROM lane_runs WHERE id = ?", (res.run_id,))
    assert row["status"] == "rejected" and "app.py" in row["reason"]


def test_read_only_catches_new_untracked_and_edit_of_already_dirty_file(env):
    (env.repo / "app.py").write_text("dirty before the lane\n")
    env.agent.set({"edit": {"app.py": "dirty, then changed by the lane\n"}, "print": report_review()})
    res = lane(env, "pr-quality", cfg(env, sandbox="none"))
    assert res.status == "rejected" and "app.py" in res.reason
    env.agent.set({"edit": {"notes/new.txt": "x"}, "print": report_review()})
    res = lane(env, "pr-logic", cfg(env, sandbox="none"))
    assert res.status == "rejected" and "notes/new.txt" in res.reason


def test_read_only_ignores_gitignored_files(env):
    env.agent.set({"edit": {"__pycache__/app.cpython.pyc": "bytes"}, "print": report_review()})
    res = lane(env, "reviewer", cfg(env, sandbox="none"))
    assert res.status == "complete"


def test_read_only_in_non_git_dir_uses_content_hash(env, tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "a.txt").write_text("a")
    env.agent.set({"edit": {"a.txt": "b"}, "print": "STATUS: complete\nDECISION: skip\nREASON: noise\n"})
    res = run_lane(LaneRequest(config=cfg(env, sandbox="none"), home=env.home, role="decider", spec_path=env.spec,
                               cwd=plain, ledger=env.ledger))
    assert res.status == "rejected" and "a.txt" in res.reason


def test_a_sandboxed_read_only_worktree_refuses_the_write_itself_and_is_not_pictured(env, monkeypatch):
    """In bwrap a read-only lane's worktree is a read-only mount: the write fails in the lane and the file is
    unchanged.  The runner then takes no picture of it (two ``git status`` runs, one on the start's critical path:
    issue 34); the picture is back where a writable path lies inside the worktree (next test)."""
    import agent.lanes.lane as lane_mod
    from agent.lanes.sandbox import bwrap_path

    if bwrap_path() is None:
        pytest.skip("bubblewrap (bwrap) is not installed; scripts/ci-bwrap installs it")
    pictures = []
    real = lane_mod.worktree_state
    monkeypatch.setattr(lane_mod, "worktree_state", lambda cwd: pictures.append(cwd) or real(cwd))
    env.agent.set({"edit": {"app.py": "hacked\n"}, "print": report_review()})
    res = lane(env, "reviewer", cfg(env))
    assert "hacked" not in (env.repo / "app.py").read_text()
    assert res.status != "complete"          # the fake agent's write raised (a read-only file system)
    assert "Read-only file system" in (res.log_dir / "01-turn.stderr").read_text()
    assert pictures == []


def test_a_writable_path_inside_a_read_only_worktree_brings_the_picture_back(env):
    """``vendors.X.writable`` naming a dir inside the worktree: the lane can write there, so the runner's picture
    judges the read-only lane again, in the sandbox too."""
    from agent.lanes.sandbox import bwrap_path, lane_plan

    if bwrap_path() is None:
        pytest.skip("bubblewrap (bwrap) is not installed; scripts/ci-bwrap installs it")
    (env.repo / "scratch").mkdir()
    config = make_config({"fake": {**env.agent.vendor_config(), "writable": [str(env.agent.dir),
                                                                             str(env.repo / "scratch")]}},
                         {"reviewer": {"vendor": "fake"}})
    env.agent.set({"edit": {"scratch/out.txt": "written\n"}, "print": report_review()})
    res = lane(env, "reviewer", config)
    assert (env.repo / "scratch" / "out.txt").read_text() == "written\n"
    assert res.status == "rejected" and "read-only lane changed the worktree: scratch/out.txt" in res.reason
    # the plan's own answer, a link into the worktree included
    (env.tmp / "link").symlink_to(env.repo / "scratch")
    common = dict(agent_home=env.home, run_dir=env.tmp, spec_paths=[], state_paths=[], homes=[])
    assert lane_plan(cwd=env.repo, writable=False, extra_writable=[], **common).worktree_read_only()
    assert not lane_plan(cwd=env.repo, writable=False, extra_writable=[env.tmp / "link"], **common).worktree_read_only()
    assert not lane_plan(cwd=env.repo, writable=True, extra_writable=[], **common).worktree_read_only()


def test_read_only_committing_lane_is_rejected(env):
    # a reviewer that commits leaves a clean tree but moves HEAD
    script = env.tmp / "committer.py"
    script.write_text(
        "import subprocess, sys\n"
        "open('app.py', 'a').write('# x\\n')\n"
        "subprocess.run(['git', '-c', 'user.email=a@b', '-c', 'user.name=a', 'commit', '-qam', 'x'], check=True)\n"
        "print('STATUS: complete\\nFINDINGS: none')\n")
    config = make_config({"committer": {"command": [sys.executable, str(script)]}},
                         {"reviewer": {"vendor": "committer"}}, sandbox="none")
    res = lane(env, "reviewer", config)
    assert res.status == "rejected" and "HEAD" in res.reason


# ----------------------------------------------------------------------------- repair

def test_malformed_report_repairs_by_resuming_same_session(env):
    env.agent.set(
        {"session": "sess-rev-42", "cost": 0.01, "print": "Looks fine to me, ship it!\n"},
        {"expect_session": "sess-rev-42", "session": "sess-rev-42", "cost": 0.002, "print": report_review()},
    )
    res = lane(env, "reviewer", cfg(env, limits={"repair": 1}), round=2)
    assert res.status == "complete", res.reason
    assert res.session_id == "sess-rev-42"
    assert len(res.repairs) == 1
    rep = res.repairs[0]
    assert rep["label"] == "reviewer repair 1/1" and rep["kind"] == "resume"
    assert rep["resumed_session"] == "sess-rev-42" and rep["outcome"] == "complete"
    assert rep["round"] == 2 and rep["cost_usd"] == pytest.approx(0.002)
    assert "no final report" in rep["problem"] and "no final report" in rep["note"]
    assert res.cost_usd == pytest.approx(0.012)  # the repair's cost is the attempt's cost
    calls = env.agent.calls
    assert len(calls) == 2
    assert calls[1]["session"] == "sess-rev-42"
    assert "could not be accepted" in calls[1]["note"] and "FINDINGS" in calls[1]["note"]
    row = env.ledger.one("SELECT repairs, status FROM lane_runs WHERE id = ?", (res.run_id,))
    assert json.loads(row["repairs"])[0]["label"] == "reviewer repair 1/1"
    kinds = [ev["kind"] for ev in eventlog.events(env.ledger)]
    assert kinds == ["lane.started", "lane.repair", "lane.finished"]


def test_repair_budget_zero_is_malformed(env):
    env.agent.set({"session": "s1", "print": "STATUS: completed\nFINDINGS: none\n"},
                  {"print": report_review()})
    res = lane(env, "reviewer", cfg(env, limits={"repair": 0}))
    assert res.status == "malformed"
    assert "got 'completed'" in res.reason
    assert res.repairs == [] and len(env.agent.calls) == 1
    assert res.report is not None and not res.report.ok


def test_lane_repair_setting_overrides_limits_and_runs_out(env):
    env.agent.set({"session": "s1", "print": "```\nSTATUS: complete\nFINDINGS: none\n```\n"})
    res = lane(env, "pr-quality", cfg(env, lanes={"pr-quality": {"vendor": "fake", "repair": 2}},
                                      limits={"repair": 0}))
    assert res.status == "malformed" and "code fence" in res.reason
    assert [r["label"] for r in res.repairs] == ["pr-quality repair 1/2", "pr-quality repair 2/2"]
    assert len(env.agent.calls) == 3


def test_vendor_without_resume_gets_one_fresh_retry(env):
    env.agent.set({"print": "done, trust me\n"}, {"print": report_impl()})
    res = lane(env, "implementer", cfg(env, resume=False, limits={"repair": 3}))
    assert res.status == "complete"
    assert len(res.repairs) == 1 and res.repairs[0]["kind"] == "fresh"
    assert res.repairs[0]["label"] == "implementer repair 1/1"
    calls = env.agent.calls
    assert len(calls) == 2
    assert "Fix total()" in calls[1]["spec"] and "could not be accepted" in calls[1]["spec"]


def test_fresh_retry_is_only_one_even_if_still_bad(env):
    env.agent.set({"print": "nope\n"})
    res = lane(env, "implementer", cfg(env, resume=False, limits={"repair": 3}))
    assert res.status == "malformed" and len(res.repairs) == 1 and len(env.agent.calls) == 2


def test_resume_without_session_falls_back_to_fresh_retry(env):
    env.agent.set({"print": "no report and no session\n"}, {"print": report_review()})
    res = lane(env, "reviewer", cfg(env, limits={"repair": 2}))
    assert res.status == "complete" and res.repairs[0]["kind"] == "fresh"


# ----------------------------------------------------------------------------- deadline / timeout

def test_lane_timeout_kills_and_reports_timeout(env):
    env.agent.set({"session": "s", "progress": ["working..."], "sleep": 60, "print": report_review()})
    t0 = time.monotonic()
    res = lane(env, "reviewer", cfg(env, lanes={"reviewer": {"vendor": "fake", "timeout": 1}}))
    assert res.status == "timeout" and "timed out" in res.reason
    assert time.monotonic() - t0 < 15
    assert env.ledger.one("SELECT status FROM lane_runs WHERE id = ?", (res.run_id,))["status"] == "timeout"


def test_deadline_is_shared_by_repair_turns(env):
    env.agent.set({"session": "s9", "print": "no report\n"},
                  {"session": "s9", "sleep": 60, "print": report_review()})
    t0 = time.monotonic()
    res = lane(env, "reviewer", cfg(env, limits={"repair": 2}), deadline=time.time() + 2.5)
    elapsed = time.monotonic() - t0
    assert res.status == "timeout"
    assert elapsed < 12, "the repair turn did not share the attempt's deadline"
    assert len(res.repairs) == 1 and res.repairs[0]["outcome"] == "timeout"


def test_no_repair_starts_after_the_deadline(env):
    env.agent.set({"session": "s", "sleep": 1.2, "print": "no report\n"}, {"print": report_review()})
    res = lane(env, "reviewer", cfg(env, limits={"repair": 2}), deadline=time.time() + 1.9)
    assert res.status == "malformed" and "no time left" in res.reason
    assert len(env.agent.calls) == 1


# ----------------------------------------------------------------------------- manifest

def test_capability_drift_when_manifest_changed(env):
    env.agent.set({"session": "sess-A", "print": report_impl()})
    first = lane(env, "implementer", cfg(env))
    assert first.status == "complete"
    # same manifest: resuming the run resumes its session
    env.agent.set({"expect_session": "sess-A", "session": "sess-A", "print": report_impl("resumed")})
    again = lane(env, "implementer", cfg(env), resume_run_id=first.run_id)
    assert again.status == "complete" and again.summary == "resumed"
    assert again.manifest_hash == first.manifest_hash
    assert env.agent.calls[0]["session"] == "sess-A"
    # the spec changed: the manifest differs -> fail closed, nothing runs
    env.spec.write_text("# Task\nA different task now.\n")
    env.agent.set({"print": report_impl()})
    drift = lane(env, "implementer", cfg(env), resume_run_id=first.run_id)
    assert drift.status == "rejected" and drift.reason == CAPABILITY_DRIFT
    assert env.agent.calls == []
    row = env.ledger.one("SELECT status, reason FROM lane_runs WHERE id = ?", (drift.run_id,))
    assert row == {"status": "rejected", "reason": "capability_drift"}


def test_manifest_changes_with_argv_template_and_model(env):
    env.agent.set({"print": report_review()})
    a = lane(env, "reviewer", cfg(env))
    b = lane(env, "reviewer", cfg(env, lanes={"reviewer": {"vendor": "fake", "model": "m-2"}}))
    config = cfg(env)
    config.vendors["fake"] = type(config.vendors["fake"])(
        name="fake", command=tuple(env.agent.command()) + ("--extra",), resume=None)
    c = lane(env, "reviewer", config)
    assert len({a.manifest_hash, b.manifest_hash, c.manifest_hash}) == 3
    d = lane(env, "reviewer", cfg(env))
    assert d.manifest_hash == a.manifest_hash


# ----------------------------------------------------------------------------- unavailable

def test_missing_binary_is_unavailable(env):
    config = make_config({"ghost": {"command": ["definitely-missing-agent-bin", "{spec}"]}},
                         {"implementer": {"vendor": "ghost"}})
    res = lane(env, "implementer", config)
    assert res.status == "unavailable" and "not found" in res.reason
    assert res.exit_code is None and res.repairs == []
    row = env.ledger.one("SELECT status FROM lane_runs WHERE id = ?", (res.run_id,))
    assert row["status"] == "unavailable"
    assert [e["kind"] for e in eventlog.events(env.ledger)] == ["lane.started", "lane.finished"]


def test_exit_127_is_unavailable(env):
    env.agent.set({"print": "sh: 1: real-agent: not found\n", "exit": 127})
    res = lane(env, "implementer", cfg(env, limits={"repair": 2}))
    assert res.status == "unavailable" and res.exit_code == 127 and res.repairs == []


def test_auth_failure_from_adapter_is_unavailable(env, monkeypatch):
    class AuthFail(CommandVendor):
        def read_turn(self, stdout, stderr, exit_code, ctx):
            out = super().read_turn(stdout, stderr, exit_code, ctx)
            out.auth_failed = "401" in stdout
            return out

    monkeypatch.setitem(VENDORS, "authfail", AuthFail("authfail", env.agent.command()))
    env.agent.set({"print": "API error 401 Unauthorized\n", "exit": 1})
    res = lane(env, "implementer", make_config({}, {}), vendor="authfail")
    assert res.status == "unavailable" and "authentication" in res.reason


def test_api_error_with_no_report_is_malformed_without_repair(env, monkeypatch):
    class ApiErr(CommandVendor):
        def read_turn(self, stdout, stderr, exit_code, ctx):
            out = super().read_turn(stdout, stderr, exit_code, ctx)
            out.api_error = "500 from model server" if exit_code else None
            return out

    monkeypatch.setitem(VENDORS, "apierr", ApiErr("apierr", env.agent.command(), env.agent.resume()))
    env.agent.set({"session": "s", "print": "boom\n", "exit": 1})
    res = lane(env, "reviewer", make_config({}, {}, {"repair": 2}), vendor="apierr")
    assert res.status == "malformed" and "500 from model server" in res.reason and res.repairs == []


# ----------------------------------------------------------------------------- environment and secrets

def test_canary_secret_never_reaches_the_lane(env, monkeypatch):
    monkeypatch.setenv("GITHUB_TOKEN", "canary-ghp-0123456789abcdef")
    monkeypatch.setenv("LOKI_TOKEN", "canary-loki-0123456789")
    monkeypatch.setenv("FAKE_API_KEY", "vendor-key-passes-through")
    env.agent.set({"print": report_impl()})
    config = cfg(env, env=["FAKE_API_KEY", "GITHUB_TOKEN"],
                 sources=[{"kind": "loki", "url": "http://127.0.0.1:9", "query": "{a=\"b\"}",
                           "auth_env": "LOKI_TOKEN"}])
    res = lane(env, "implementer", config)
    assert res.status == "complete"
    seen = env.agent.calls[0]["env"]
    assert "GITHUB_TOKEN" not in seen and "LOKI_TOKEN" not in seen
    assert not any("canary-" in v for v in seen.values())
    assert seen["FAKE_API_KEY"] == "vendor-key-passes-through"
    # the log files hold nothing of it either
    for f in res.log_dir.iterdir():
        text = f.read_text(errors="replace")
        assert "canary-ghp-0123456789abcdef" not in text and "canary-loki-0123456789" not in text


def test_gitlab_and_gitea_tokens_never_reach_the_lane_even_when_listed(env, monkeypatch):
    monkeypatch.setenv("GITLAB_TOKEN", "canary-glpat-0123456789")
    monkeypatch.setenv("MY_GITEA", "canary-gitea-0123456789")
    env.agent.set({"print": report_impl()})
    config = cfg(env, env=["GITLAB_TOKEN", "MY_GITEA"], gitea={"token_env": "MY_GITEA"})
    res = lane(env, "implementer", config)
    assert res.status == "complete"
    seen = env.agent.calls[0]["env"]
    assert "GITLAB_TOKEN" not in seen and "MY_GITEA" not in seen
    assert not any("canary-" in v for v in seen.values())


def test_secret_echoed_by_agent_is_redacted_in_ledger(env, monkeypatch):
    monkeypatch.setenv("FAKE_API_KEY", "sk-live-abcdefghijklmnopqrstuvwxyz")
    env.agent.set({"echo_env": ["FAKE_API_KEY"],
                   "print": "my key is {FAKE_API_KEY}\n\nSTATUS: complete\nSUMMARY: used key {FAKE_API_KEY}\n"})
    res = lane(env, "implementer", cfg(env, env=["FAKE_API_KEY"]))
    assert res.status == "complete"
    assert "abcdefghij" not in res.summary and "[REDACTED]" in res.summary
    assert "abcdefghij" not in res.excerpt
    row = env.ledger.one("SELECT summary FROM lane_runs WHERE id = ?", (res.run_id,))
    assert "abcdefghij" not in row["summary"]


# ----------------------------------------------------------------------------- caller errors, registry, progress

def test_caller_errors_raise_agent_error(env):
    env.agent.set({"print": report_impl()})
    with pytest.raises(AgentError, match="unknown role"):
        lane(env, "tester", cfg(env))
    with pytest.raises(AgentError, match="spec file"):
        run_lane(LaneRequest(config=cfg(env), home=env.home, role="implementer", spec_path=env.tmp / "nope.md",
                             cwd=env.repo))
    with pytest.raises(AgentError, match="no vendor configured"):
        lane(env, "implementer", make_config({}, {}))
    with pytest.raises(AgentError, match="unknown vendor"):
        lane(env, "implementer", make_config({}, {}), vendor="nonesuch")


def test_lost_claim_refuses_to_start(env):
    from agent.ledger.tasks import ClaimLost, create_task

    task_id, _ = create_task(env.ledger, "acme/widgets", "fix it")
    with env.ledger.tx() as c:
        c.execute("UPDATE tasks SET claim_token = 'tok-A' WHERE id = ?", (task_id,))
    env.agent.set({"print": report_impl()})
    with pytest.raises(ClaimLost):
        lane(env, "implementer", cfg(env), task_id=task_id, claim_token="tok-B")
    assert env.agent.calls == []
    res = lane(env, "implementer", cfg(env), task_id=task_id, claim_token="tok-A", round=1)
    assert res.status == "complete"
    assert [e["task_id"] for e in eventlog.events(env.ledger) if e["kind"].startswith("lane.")] == [task_id, task_id]


def test_a_claim_lost_before_a_repair_turn_never_starts_it(env):
    """Fencing reaches the side effect: the claim is taken over between the first turn (a malformed report) and
    the repair turn; the repair turn's process never starts, and nothing more of the run is recorded."""
    from agent.ledger import ledger_path
    from agent.ledger.tasks import ClaimLost, create_task
    from conftest import on_postgres

    led = Ledger.open(ledger_path(env.home))     # PostgreSQL under --ledger=postgres
    assert led.postgres == on_postgres()
    task_id, _ = create_task(led, "acme/widgets", "fix it")
    with led.tx() as c:
        c.execute("UPDATE tasks SET claim_token = 'tok-A' WHERE id = ?", (task_id,))

    class TakenOver:
        """The progress object the fixer passes; its set_label runs in the runner right before a repair turn: here
        another runner takes the task over at that moment."""

        def __call__(self, line):
            pass

        def set_label(self, label):
            with led.tx() as c:
                c.execute("UPDATE tasks SET claim_token = 'tok-B' WHERE id = ?", (task_id,))

    # unsandboxed, so its first turn can plant a git hook: the lost run still restores git's own files
    env.agent.set({"session": "s1", "edit": {".git/hooks/post-checkout": "#!/bin/sh\n"}, "print": "no report\n"},
                  {"print": report_impl()})
    with pytest.raises(ClaimLost) as lost:
        lane(env, "implementer", cfg(env, sandbox="none"), task_id=task_id, claim_token="tok-A", round=1,
             on_progress=TakenOver(), ledger=led)
    assert len(env.agent.calls) == 1                      # the repair turn's process never ran
    run = led.one("SELECT * FROM lane_runs WHERE task_id = ?", (task_id,))
    log_dir = env.home / "lanes" / str(run["id"])
    assert (log_dir / "01-turn.stdout").exists() and not (log_dir / "02-repair-1.stdout").exists()
    assert "repair-1 turn was not started" in str(lost.value)
    assert not (env.repo / ".git" / "hooks" / "post-checkout").exists()
    assert run["status"] == "running" and run["repairs"] in (None, "", "[]")   # nothing recorded after the loss
    assert [e["kind"] for e in eventlog.events(led) if e["kind"].startswith("lane.")] == ["lane.started"]
    led.close()


def test_get_vendor_registry():
    config = make_config({"mine": {"command": ["python3", "x.py", "{spec}"]}})
    v = get_vendor("mine", config)
    assert isinstance(v, CommandVendor) and v.can_resume is False and v.default_bin == "python3"
    with pytest.raises(AgentError):
        get_vendor("no-such-vendor", config)


def test_progress_callback_sees_output_lines(env):
    lines = []
    env.agent.set({"progress": ["step one", "step two"], "sleep": 0.5, "print": report_review()})
    res = lane(env, "reviewer", cfg(env), on_progress=lines.append)
    assert res.status == "complete"
    assert "step two" in lines and lines[-1] == "FINDINGS: none"


def test_progress_display_only_on_tty():
    import io

    from agent.lanes.progress import LaneProgress, format_line

    buf = io.StringIO()
    with LaneProgress("reviewer fake", stream=buf, interval=0.05) as p:
        p("hello")
        time.sleep(0.2)
    assert buf.getvalue() == ""  # not a TTY: silent

    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty = Tty()
    with LaneProgress("reviewer fake", stream=tty, interval=0.05) as p:
        p("running tests")
        time.sleep(0.3)
    assert "[reviewer fake 00:00] running tests" in tty.getvalue()
    assert format_line("x", 125, "z" * 500, width=40).startswith("[x 02:05] ")
    assert len(format_line("x", 125, "z" * 500, width=40)) == 40


def test_interrupted_run_is_superseded_on_resume(env):
    env.agent.set({"session": "sess-X", "print": report_impl()})
    first = lane(env, "implementer", cfg(env))
    with env.ledger.tx() as c:  # simulate a crash mid-run: the row is still 'running'
        c.execute("UPDATE lane_runs SET status = 'running', ended_at = NULL WHERE id = ?", (first.run_id,))
    env.agent.set({"expect_session": "sess-X", "print": report_impl("continued")})
    again = lane(env, "implementer", cfg(env), resume_run_id=first.run_id)
    assert again.status == "complete" and again.summary == "continued"
    old = env.ledger.one("SELECT status, reason FROM lane_runs WHERE id = ?", (first.run_id,))
    assert old["status"] == "interrupted" and str(again.run_id) in old["reason"]


def test_deadline_in_the_past_starts_nothing(env):
    env.agent.set({"print": report_impl()})
    res = lane(env, "implementer", cfg(env), deadline=time.time() - 1)
    assert res.status == "timeout" and env.agent.calls == []


def test_huge_output_with_report_at_end(env):
    script = env.tmp / "loud.py"
    script.write_text("import sys\nfor i in range(100000):\n    sys.stdout.write('noise line %06d ' % i + 'x' * 40 + '\\n')\n"
                      "print('STATUS: complete')\nprint('FINDINGS:')\nprint('- one real finding')\n")
    config = make_config({"loud": {"command": [sys.executable, str(script)]}}, {"reviewer": {"vendor": "loud"}})
    res = lane(env, "reviewer", config)
    assert res.status == "complete" and res.findings == 1
    assert (res.log_dir / "01-turn.stdout").stat().st_size > 5_000_000


def test_worktree_state_sees_head_edits_renames_and_untracked(tmp_path):
    import os
    import subprocess

    from agent.lanes.lane import worktree_state

    def g(*a):
        subprocess.run(["git", *a], cwd=tmp_path, check=True, capture_output=True,
                       env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@l",
                            "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@l"})

    g("init", "-q", "-b", "main")
    assert worktree_state(tmp_path)[":HEAD"] == "(no commits)"
    (tmp_path / "a.py").write_text("a = 1\n")
    g("add", "-A")
    g("commit", "-qm", "one")
    clean = worktree_state(tmp_path)
    assert set(clean) == {":HEAD"} and len(clean[":HEAD"]) == 40
    g("mv", "a.py", "b.py")
    renamed = worktree_state(tmp_path)
    assert "b.py" in renamed and renamed != clean
    g("mv", "b.py", "a.py")
    assert worktree_state(tmp_path) == clean
    (tmp_path / "new file.txt").write_text("x")
    assert "new file.txt" in worktree_state(tmp_path)


def test_usage_adds_across_turns_unless_the_vendor_reports_cumulative_usage():
    from agent.lanes.builtin import ADAPTERS
    from agent.lanes.lane import Tally
    from agent.lanes.protocol import TurnOutput

    def turns(vendor, outs):
        tally = Tally(vendor)
        for out in outs:
            tally.add(None, out)
        return tally

    first = TurnOutput(message="", session_id="s1", cost_usd=0.25, usage={"input_tokens": 100})
    resumed = TurnOutput(message="", session_id="s1", cost_usd=0.5, usage={"input_tokens": 160})
    fresh = TurnOutput(message="", session_id="s2", cost_usd=None, usage={"input_tokens": 40})
    claude = turns(ADAPTERS["claude"], [first, resumed])
    assert claude.usage == {"input_tokens": 260} and claude.cost == 0.75
    codex = turns(ADAPTERS["codex"], [first, resumed])  # codex's resumed turn reports the thread's total
    assert codex.usage == {"input_tokens": 160} and codex.cost == 0.75
    codex_fresh = turns(ADAPTERS["codex"], [first, fresh])  # a fresh retry is a new thread: it adds
    assert codex_fresh.usage == {"input_tokens": 140}
