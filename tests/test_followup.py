"""`agent watch pr-merged`: real ledger, real bare remote, the local forge's merge/close button."""

from __future__ import annotations

import pytest

from agent.domain import chain
from agent.config import parse_config
from agent.flows.followup import follow_prs
from agent.flows.pr_thread import publish_pr
from agent.forge import get_forge
from agent.ledger import eventlog, now
from agent.git.push import push_branch, remote_branch_sha, remote_ref_sha
from agent.ledger.tasks import create_task, transition
from conftest import LANES_YAML, add_failing_trigger, db_errors, drop_trigger, git, remote_with_branch

EID = "0a1b2c3d4e5f6789"
BRANCH = "agent/fix-0a1b2c3d"


@pytest.fixture
def setup(tmp_path, ledger, home):
    remote, work = remote_with_branch(tmp_path, BRANCH)
    head = push_branch(work, str(remote), BRANCH, "main", "agent/fix-", None).sha

    with ledger.tx() as c:
        ledger.insert(c, "errors", {"id": EID, "fingerprint": "fp", "service": "widgets-api", "class": "KeyError",
                                    "count": 3, "state": "fixing", "first_seen": now(), "last_seen": now()})
        cid = ledger.insert(c, "conclusions", {"error_id": EID, "kind": "fix", "brief": "b", "decided_by": "human",
                                               "created_at": now()})
    task_id, _ = create_task(ledger, "acme/widgets", "fix it", error_id=EID, conclusion_id=cid, branch=BRANCH)
    transition(ledger, task_id, chain.WORKING, "script", "started")
    git(remote, "update-ref", f"refs/agent/task-{task_id}", head)    # the round commits' hidden ref (DESIGN.md "Takeover")
    config = parse_config({"repos": {"acme/widgets": {"url": str(remote), "forge": "local"}}})
    forge = get_forge(config.repos["acme/widgets"], config, home, ledger)
    pr, _ = publish_pr(ledger, forge, task_id, BRANCH, "main", "fix: it", "body", head)
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text(f"repos:\n  acme/widgets:\n    url: {remote}\n    forge: local\n"
                                      + LANES_YAML)
    return {"task_id": task_id, "forge": forge, "pr": pr, "config": config, "remote": remote}


def states(ledger, task_id):
    return (ledger.scalar("SELECT state FROM prs WHERE task_id = ?", (task_id,)),
            ledger.scalar("SELECT state FROM errors WHERE id = ?", (EID,)),
            ledger.scalar("SELECT state FROM tasks WHERE id = ?", (task_id,)))


def test_open_pr_is_left_alone(setup, ledger, home):
    items = follow_prs(ledger, setup["config"], home)
    assert [i["line"] for i in items] == [f"task {setup['task_id']}: acme/widgets#1 still open"]
    assert states(ledger, setup["task_id"]) == ("open", "fixing", "working")


def test_merged_resolves_error_and_closes_task(setup, ledger, home):
    setup["forge"].mark(1, "merged")
    items = follow_prs(ledger, setup["config"], home)
    assert len(items) == 1 and items[0]["state"] == "merged" and items[0]["changed"]
    assert states(ledger, setup["task_id"]) == ("merged", "resolved", "done")
    assert ledger.scalar("SELECT state_reason FROM errors WHERE id = ?", (EID,)) == "PR acme/widgets#1 merged"
    kinds = [e["kind"] for e in eventlog.events(ledger, task_id=setup["task_id"])]
    assert {"pr.merged", "error.state", "task.state"} <= set(kinds)
    assert remote_branch_sha(str(setup["remote"]), BRANCH) is not None   # merged branches are not pruned
    assert remote_ref_sha(str(setup["remote"]), f"refs/agent/task-{setup['task_id']}") is None   # the hidden ref is
    assert "hidden ref pruned" in items[0]["line"]
    assert follow_prs(ledger, setup["config"], home) == []               # nothing left to follow


def test_closed_skips_error_fails_task_and_prunes_branch(setup, ledger, home):
    setup["forge"].mark(1, "closed")
    items = follow_prs(ledger, setup["config"], home)
    assert items[0]["state"] == "closed" and f"branch {BRANCH} pruned" in items[0]["line"]
    assert states(ledger, setup["task_id"]) == ("closed", "skipped", "failed")
    assert ledger.scalar("SELECT state_reason FROM errors WHERE id = ?", (EID,)) == \
        "PR acme/widgets#1 closed without merge"
    assert "closed without merge" in ledger.scalar("SELECT failed_reason FROM tasks WHERE id = ?",
                                                   (setup["task_id"],))
    assert remote_branch_sha(str(setup["remote"]), BRANCH) is None
    assert remote_ref_sha(str(setup["remote"]), f"refs/agent/task-{setup['task_id']}") is None   # pruned with the branch
    assert remote_branch_sha(str(setup["remote"]), "main") is not None
    assert follow_prs(ledger, setup["config"], home) == []


def test_prune_failure_is_retried_on_the_next_scan(setup, ledger, home, tmp_path):
    setup["forge"].mark(1, "closed")
    broken = parse_config({"repos": {"acme/widgets": {"url": str(tmp_path / "gone.git"), "forge": "local"}}})
    # the forge lookup works (local forge state lives in the ledger); only the prune hits the broken URL
    items = follow_prs(ledger, broken, home, forge_factory=lambda *a: setup["forge"])
    assert "cannot read the remote" in items[0]["error"]
    assert states(ledger, setup["task_id"]) == ("closed", "skipped", "failed")   # the state change stuck
    items = follow_prs(ledger, setup["config"], home)
    assert "pruned" in items[0]["line"] and remote_branch_sha(str(setup["remote"]), BRANCH) is None


def test_state_change_and_its_events_are_one_transaction(setup, ledger, home):
    setup["forge"].mark(1, "merged")
    add_failing_trigger(ledger.conn, "boom", "tasks")
    with pytest.raises(db_errors()):
        follow_prs(ledger, setup["config"], home)
    assert states(ledger, setup["task_id"]) == ("open", "fixing", "working")   # all or nothing
    assert "pr.merged" not in [e["kind"] for e in eventlog.events(ledger)]
    drop_trigger(ledger.conn, "boom", "tasks")
    follow_prs(ledger, setup["config"], home)
    assert states(ledger, setup["task_id"]) == ("merged", "resolved", "done")


def test_gate_blocked_task_keeps_its_state_but_error_resolves(setup, ledger, home):
    transition(ledger, setup["task_id"], chain.BLOCKED, "script", "forge credentials refused")
    setup["forge"].mark(1, "merged")
    follow_prs(ledger, setup["config"], home)
    assert states(ledger, setup["task_id"]) == ("merged", "resolved", "gate-blocked")
    kept = [e for e in eventlog.events(ledger, task_id=setup["task_id"]) if e["kind"] == "task.state_kept"]
    assert kept and kept[0]["payload"]["wanted"] == "done"


def test_repo_missing_from_config_is_reported(setup, ledger, home):
    items = follow_prs(ledger, parse_config({}), home)
    assert items[0]["error"] == "repo not in config" and "not in config.yaml" in items[0]["line"]


def test_watch_pr_merged_cli(setup, agent, ledger):
    r = agent("pr", "mark", str(setup["task_id"]), "closed")
    assert r.exit_code == 0, r.output
    items = agent.json("watch", "pr-merged")
    assert len(items) == 1 and items[0]["scan"] == "pr-merged" and items[0]["state"] == "closed"
    assert agent.json("pr", "list")[0]["state"] == "closed"
    again = agent("watch", "pr-merged")
    assert again.exit_code == 0 and again.stdout == ""


def test_closed_pr_of_a_done_task_fails_it_and_prunes_from_any_directory(setup, ledger, home, tmp_path,
                                                                         monkeypatch, agent):
    """Issue 13 case 4: all reviewers approved (task done), then a human closes the PR without merging.
    The task ends failed with the reason (old: it stayed done), status counts it, and the branch is pruned
    though the scan runs outside any git folder (old: `git push --delete` needed a repository in the cwd)."""
    tid = setup["task_id"]
    transition(ledger, tid, chain.DONE, "script", "all reviewers approved")
    setup["forge"].mark(1, "closed")
    elsewhere = tmp_path / "cron-cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))   # git may not find a repository above it
    items = follow_prs(ledger, setup["config"], home)
    assert "error" not in items[0], items
    assert f"branch {BRANCH} pruned" in items[0]["line"]
    assert remote_branch_sha(str(setup["remote"]), BRANCH) is None
    assert states(ledger, tid) == ("closed", "skipped", "failed")
    assert ledger.scalar("SELECT failed_reason FROM tasks WHERE id = ?", (tid,)) == \
        "PR acme/widgets#1 closed without merge"
    status = agent.json("status")
    assert status["tasks"]["failed"] == 1 and status["tasks"]["done"] == 0
    assert [t["id"] for t in status["failed"]] == [tid]
