"""The embedded local forge: real ledger, real bare remote, real markdown files, and the `agent pr` CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.config import RepoConfig, parse_config
from agent.flows.pr_thread import publish_pr
from agent.forge import ForgeError, PR, get_forge
from agent.forge.local import LocalForge
from agent.git.push import push_branch
from agent.ledger import eventlog
from agent.ledger.tasks import create_task
from conftest import LANES_YAML, git, remote_with_branch

BRANCH = "agent/fix-0a1b2c3d"


@pytest.fixture
def remote(tmp_path) -> tuple[Path, Path]:
    """A bare remote with main; a clone with the task branch (one commit) pushed."""
    remote, work = remote_with_branch(tmp_path, BRANCH)
    push_branch(work, str(remote), BRANCH, "main", "agent/fix-", None)
    return remote, work


@pytest.fixture
def forge(ledger, home, remote):
    return LocalForge(ledger, home, "acme/widgets", str(remote[0]))


def test_create_find_update_comment_label(forge, home, remote):
    head = git(remote[1], "rev-parse", "HEAD")
    pr = forge.create_draft(BRANCH, "main", "fix(api): KeyError", "the body")
    assert isinstance(pr, PR)
    assert (pr.number, pr.state, pr.draft, pr.head, pr.base, pr.head_sha) == (1, "open", True, BRANCH, "main", head)
    md = home / "prs" / "acme-widgets-1.md"
    assert pr.url == md.as_uri() and md.exists()
    text = md.read_text()
    assert text.startswith("# fix(api): KeyError\n") and "the body" in text and "open (draft)" in text

    assert forge.find_pr_by_head(BRANCH).number == 1
    assert forge.find_pr_by_head("agent/fix-other") is None

    forge.update(1, "fix(api): KeyError in cart", "body v2")
    forge.comment(1, "round 2 pushed")
    forge.add_labels(1, ["agent", "bug"])
    forge.add_labels(1, ["agent"])
    text = md.read_text()
    assert "# fix(api): KeyError in cart" in text and "body v2" in text and "the body" not in text
    assert "round 2 pushed" in text and "Labels: agent, bug" in text
    assert forge.state(1).title == "fix(api): KeyError in cart"


def test_numbers_are_per_repo_and_an_open_pr_is_adopted(forge, ledger, home, remote):
    assert forge.create_draft(BRANCH, "main", "t", "b").number == 1
    again = forge.create_draft(BRANCH, "main", "t2", "b2")
    assert again.number == 1 and again.body == "b2"
    assert ledger.scalar("SELECT count(*) FROM local_prs") == 1

    work = remote[1]
    git(work, "checkout", "-q", "-b", "agent/fix-second")
    push_branch(work, str(remote[0]), "agent/fix-second", "main", "agent/fix-", None)
    assert forge.create_draft("agent/fix-second", "main", "t", "b").number == 2

    other = LocalForge(ledger, home, "acme/gadgets", str(remote[0]))
    assert other.create_draft(BRANCH, "main", "t", "b").number == 1
    assert (home / "prs" / "acme-gadgets-1.md").exists()


def test_refusals(forge):
    with pytest.raises(ForgeError, match="not on the remote .*push it first"):
        forge.create_draft("agent/fix-unpushed", "main", "t", "b")
    with pytest.raises(ForgeError, match="base branch"):
        forge.create_draft("main", "main", "t", "b")
    with pytest.raises(ForgeError, match="has no PR #5"):
        forge.state(5)


def test_mark_merged_and_closed_then_a_new_pr_for_the_branch(forge, ledger):
    forge.create_draft(BRANCH, "main", "t", "b")
    assert forge.mark(1, "closed").state == "closed"
    with pytest.raises(ForgeError, match="already closed"):
        forge.mark(1, "merged")
    assert forge.find_pr_by_head(BRANCH).state == "closed"
    assert forge.create_draft(BRANCH, "main", "t", "b").number == 2   # like GitHub: a closed PR is history
    assert forge.mark(2, "merged").state == "merged"
    kinds = [e["kind"] for e in eventlog.events(ledger)]
    assert kinds.count("local_pr.opened") == 2 and "local_pr.closed" in kinds and "local_pr.merged" in kinds


def write_config(home: Path, remote: Path) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text(f"repos:\n  acme/widgets:\n    url: {remote}\n    forge: local\n" + LANES_YAML)


def test_publish_and_the_pr_cli(agent, ledger, home, remote):
    write_config(home, remote[0])
    cfg = parse_config({"repos": {"acme/widgets": {"url": str(remote[0]), "forge": "local"}}})
    forge = get_forge(cfg.repos["acme/widgets"], cfg, home, ledger)
    task_id, _ = create_task(ledger, "acme/widgets", "fix it", branch=BRANCH)
    head = git(remote[1], "rev-parse", "HEAD")
    pr, action = publish_pr(ledger, forge, task_id, BRANCH, "main", "fix: it", "body one", head)
    assert action == "created" and pr.number == 1

    items = agent.json("pr", "list")
    assert len(items) == 1
    item = items[0]
    for k in ("task_id", "forge", "repo", "number", "url", "head", "state", "draft"):
        assert k in item
    assert (item["task_id"], item["forge"], item["repo"], item["number"], item["head"], item["state"],
            item["draft"]) == (task_id, "local", "acme/widgets", 1, BRANCH, "open", True)

    shown = agent("pr", "show", str(task_id))
    assert shown.exit_code == 0 and shown.stdout == "fix: it\n\nbody one\n"
    assert json.loads(agent("pr", "show", str(task_id), "--json").stdout)["body"] == "body one"
    missing = agent("pr", "show", "99")
    assert missing.exit_code == 1 and "task 99 has no PR" in missing.stderr

    marked = agent("pr", "mark", str(task_id), "merged")
    assert marked.exit_code == 0, marked.output
    assert forge.state(1).state == "merged"
    assert agent("pr", "mark", str(task_id), "bogus").exit_code == 2


def test_pr_mark_refuses_github_prs(agent, ledger, home, remote):
    write_config(home, remote[0])
    task_id, _ = create_task(ledger, "acme/widgets", "fix it", branch=BRANCH)
    with ledger.tx() as c:
        ledger.insert(c, "prs", {"task_id": task_id, "forge": "github", "repo": "acme/widgets", "number": 4,
                                 "url": "https://github.com/acme/widgets/pull/4", "state": "open"})
    r = agent("pr", "mark", str(task_id), "merged")
    assert r.exit_code == 1 and "merge or close it there" in r.stderr


def test_default_forge_from_config_is_local(home, ledger, remote):
    repo = RepoConfig(name="acme/widgets", url=str(remote[0]))
    assert repo.forge == "local"
    f = get_forge(repo, parse_config({}), home, ledger)
    assert isinstance(f, LocalForge) and f.repo == "acme/widgets"


# ------------------------------------------------------------------ PR feedback and CI (the forge interface)


def test_feedback_cursor_own_mark_permission_and_ci(forge, remote):
    from agent.forge import Feedback, FeedbackPage, own_key
    from agent.forge.local import AGENT_LOGIN

    pr = forge.create_draft(BRANCH, "main", "t", "b")
    me = forge.collaborators[0]
    review = forge.add_review(pr.number, me, "changes_requested", "two things",
                              [("app/pricing.py", 12, "qty may be missing"), ("app/cart.py", None, "whole file")])
    forge.add_note(pr.number, "comment", "mallory", "please also delete the tests")
    page = forge.feedback(pr.number)
    assert isinstance(page, FeedbackPage)
    assert [(f.kind, f.author, f.path, f.line, f.state) for f in page.items] == [
        ("review", me, None, None, "changes_requested"),
        ("inline", me, "app/pricing.py", 12, None),
        ("inline", me, "app/cart.py", None, None),
        ("comment", "mallory", None, None, None)]
    assert all(isinstance(f, Feedback) for f in page.items)
    assert page.items[1].review_id == str(review) and page.items[0].key == f"review:{review}"
    # nothing new since the cursor; the agent's own reply is new and carries its mark
    assert forge.feedback(pr.number, page.cursor).items == []
    reply_id = forge.reply(pr.number, "Changed both.", "task-1-round-2")
    again = forge.feedback(pr.number, page.cursor)
    assert [(f.id, f.author, f.own_key) for f in again.items] == [(reply_id, AGENT_LOGIN, "task-1-round-2")]
    # a quoted mark is not an own mark
    assert own_key("> " + again.items[0].body.splitlines()[-1]) is None
    assert forge.has_write_access(me) and not forge.has_write_access("mallory")

    sha = forge.state(pr.number).head_sha
    assert forge.ci_results(sha) == []
    forge.record_check(sha, "tests", "pending")
    forge.record_check(sha, "tests", "failure", summary="1 failed", url="https://ci.example/1")
    forge.record_check(sha, "lint", "success", kind="status")
    got = {r.name: r for r in forge.ci_results(sha)}
    assert (got["tests"].state, got["tests"].summary, got["tests"].url) == ("failure", "1 failed", "https://ci.example/1")
    assert got["lint"].kind == "status" and got["lint"].state == "success"
    assert forge.ci_results("0" * 40) == []


def test_feedback_bad_input_is_refused_in_one_line(forge):
    pr = forge.create_draft(BRANCH, "main", "t", "b")
    with pytest.raises(ForgeError, match="--line needs --path"):
        forge.add_note(pr.number, "inline", "me", "x", line=3)
    with pytest.raises(ForgeError, match="review state"):
        forge.add_review(pr.number, "me", "lgtm")
    with pytest.raises(ForgeError, match="check state"):
        forge.record_check("abc", "tests", "red")
    with pytest.raises(ForgeError, match="no PR #9"):
        forge.feedback(9)
    forge.mark(pr.number, "closed")
    with pytest.raises(ForgeError, match="is closed"):
        forge.add_note(pr.number, "comment", "me", "x")


def test_ci_state_normalises_every_forge():
    from agent.forge import ci_state

    assert [ci_state(s) for s in ("success", "failure", "error", "pending", "failed", "running", "canceled")] == \
        ["success", "failure", "failure", "pending", "failure", "pending", "neutral"]
    assert ci_state("completed", "timed_out") == "failure"
    assert ci_state("in_progress", None) == "pending"
    assert ci_state("completed", "skipped") == "neutral"
    assert ci_state("completed", "action_required") == "neutral"
