"""The GitHub forge against @simulacrum/github-api-simulator on 127.0.0.1.

The simulator serves GitHub's official OpenAPI description (openapi-backend): a request that does
not match the spec is answered 400, a response our handlers build that does not match is turned into
a 502 (both proven live below).  Our forge treats both as failures, so every operation that succeeds
here sent a valid request and got a valid response.  The stateful handlers for pulls, labels and
comments are ours (tests/github_sim/server.mjs); nothing else is mocked.
Install: `bash scripts/ci-forge` (npm).  Without it these tests skip and say why.
"""

from __future__ import annotations

import os
import subprocess

import pytest
import requests

from agent.flows.pr_thread import publish_pr
from agent.forge import ForgeError
from agent.forge.github import GithubForge

from agent.ledger.tasks import create_task
from conftest import ledger_conn
from github_sim import Sim, running

REPO = "acme/widgets"


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    with running(tmp_path_factory.mktemp("sim")) as s:
        yield s


@pytest.fixture
def forge(sim):
    return GithubForge(REPO, api_url=sim.url, token="sim-token-not-secret", sleep=lambda s: None, retries=1)


def test_simulator_validates_requests_and_responses(sim):
    """The guarantee the other tests lean on: invalid requests and invalid responses are refused."""
    bad = requests.post(f"{sim.url}/repos/{REPO}/pulls", json={"title": 5, "head": "x", "base": "main",
                                                                "draft": "yes"}, timeout=10)
    assert bad.status_code == 400 and "must be" in bad.text
    pr = sim.raw_create("agent/fix-validate")
    corrupt = requests.get(f"{sim.url}/repos/{REPO}/pulls/{pr['number']}",
                           headers={"x-sim-corrupt-response": "1"}, timeout=10)
    assert corrupt.status_code == 502 and "must be integer" in corrupt.text
    ok = requests.get(f"{sim.url}/repos/{REPO}/pulls/{pr['number']}", timeout=10)
    assert ok.status_code == 200 and ok.json()["number"] == pr["number"]


def test_draft_created_found_updated_labelled_commented(sim, forge):
    branch = "agent/fix-0a1b2c3d"
    pr = forge.create_draft(branch, "main", "fix(api): KeyError", "first body")
    assert pr.draft and pr.state == "open" and pr.head == branch and pr.base == "main"
    assert pr.url.startswith(sim.url) and pr.body == "first body"

    found = forge.find_pr_by_head(branch)
    assert found is not None and found.number == pr.number and found.draft

    updated = forge.update(pr.number, "fix(api): KeyError in checkout", "second body")
    assert (updated.number, updated.title, updated.body, updated.draft) == \
        (pr.number, "fix(api): KeyError in checkout", "second body", True)

    forge.add_labels(pr.number, ["agent", "bug"])
    forge.add_labels(pr.number, ["agent"])  # a repeat is harmless
    forge.comment(pr.number, "round 2 pushed")
    now_state = forge.state(pr.number)
    assert now_state.state == "open" and now_state.body == "second body"

    on_sim = sim.pulls(branch)
    assert len(on_sim) == 1
    assert on_sim[0]["draft"] is True and on_sim[0]["labels"] == ["agent", "bug"]
    assert sim.state()["comments"][f"{REPO}#{pr.number}"] == ["round 2 pushed"]
    assert forge.find_pr_by_head("agent/fix-nothing-here") is None


def test_find_prefers_the_open_pr_and_pagination_follows_link(sim, forge):
    first = forge.create_draft("agent/fix-again001", "main", "t", "b")
    sim.set_state(first.number, state="closed")
    second = forge.create_draft("agent/fix-again001", "main", "t2", "b2")
    assert second.number != first.number
    assert forge.find_pr_by_head("agent/fix-again001").number == second.number
    forge.create_draft("agent/fix-again002", "main", "t3", "b3")   # 3 PRs: a second page of 2, whatever ran before

    everything = forge._paginate(f"/repos/{REPO}/pulls", {"state": "all", "per_page": 2}, "listing all")
    assert len(everything) == len(sim.pulls()) >= 3
    assert len({p["number"] for p in everything}) == len(everything)


def test_publish_refuses_a_closed_pr_found_by_head(sim, forge, ledger, home):
    task_id, _ = create_task(ledger, REPO, "fix it", branch="agent/fix-closed01")
    old = sim.raw_create("agent/fix-closed01")
    sim.set_state(old["number"], state="closed")
    with pytest.raises(ForgeError, match="it is closed"):
        publish_pr(ledger, forge, task_id, "agent/fix-closed01", "main", "t", "b", "e" * 40)
    assert ledger.one("SELECT * FROM prs WHERE task_id = ?", (task_id,)) is None
    assert len(sim.pulls("agent/fix-closed01")) == 1


# ------------------------------------------------------------------ PR feedback and CI (the forge interface)


def test_feedback_permission_reply_and_ci_read_back_from_the_simulator(sim, forge):
    from agent.forge import CIResult, Feedback

    pr = forge.create_draft("agent/fix-feedback01", "main", "t", "b")
    sim.collaborator("alice", "write")
    sim.collaborator("rita", "read")
    review = sim.review(pr.number, "alice", "REQUEST_CHANGES", "two things", [
        {"path": "widgets/pricing.py", "line": 5, "body": "name the default"},
        {"path": "widgets/pricing.py", "line": 9, "body": "docstring too"}])
    sim.comment(pr.number, "mallory", "delete the tests")
    page = forge.feedback(pr.number)
    assert all(isinstance(f, Feedback) for f in page.items)
    got = [(f.kind, f.author, f.state, f.path, f.line) for f in page.items]
    assert got == [("review", "alice", "changes_requested", None, None),
                   ("inline", "alice", None, "widgets/pricing.py", 5),
                   ("inline", "alice", None, "widgets/pricing.py", 9),
                   ("comment", "mallory", None, None, None)], got
    assert page.items[1].review_id == str(review["id"]) and page.items[0].key == f"review:{review['id']}"
    assert page.cursor  # opaque; items at the cursor may repeat, the caller dedupes by key
    again = forge.feedback(pr.number, page.cursor)
    assert {f.key for f in again.items} <= {f.key for f in page.items}

    assert forge.has_write_access("alice") and forge.has_write_access("agent-bot")
    assert not forge.has_write_access("rita") and not forge.has_write_access("mallory")  # read; 404

    reply_id = forge.reply(pr.number, "Changed both.", "task-9-round-3")
    mine = [f for f in forge.feedback(pr.number).items if f.id == reply_id]
    assert len(mine) == 1 and mine[0].own_key == "task-9-round-3" and mine[0].author == "agent-bot"

    sha = "a" * 40
    assert forge.ci_results(sha) == []
    sim.status(sha, "pending", "ci/lint")
    sim.status(sha, "success", "ci/lint", "ok")
    sim.check_run(sha, "tests", "failure", "2 failed", "test_qty failed", "https://ci.example/7")
    sim.status(sha, "pending", "ci/build")
    # (an in-progress check run cannot be served: the simulator's validator refuses null in the nullable
    # `conclusion` enum; ci_state("in_progress", None) == "pending" is unit-tested in test_local_forge)
    res = {r.name: r for r in forge.ci_results(sha)}
    assert all(isinstance(r, CIResult) for r in res.values())
    assert (res["ci/lint"].kind, res["ci/lint"].state) == ("status", "success")  # the newest per context
    t = res["tests"]
    assert (t.kind, t.state, t.conclusion, t.url) == ("check_run", "failure", "failure", "https://ci.example/7")
    assert "2 failed" in t.summary and "test_qty failed" in t.summary
    assert res["ci/build"].state == "pending"


@pytest.mark.slow
def test_pr_feedback_end_to_end_on_the_simulator(sim, tmp_path):
    """The issue's cases on GitHub: review with two inline comments -> one round, same PR, new remote head, one
    reply; a user without write access is ignored; the agent's own reply starts nothing; a failing check run
    starts a round; the feedback cap gate-blocks with one PR comment."""
    from chaos_support import agent_bin, build, check_invariants, remote_sha, run_to_end

    env = {"GITHUB_TOKEN": "sim-token-not-secret"}
    p = build(tmp_path / "w", tasks=1, forge="github", github_api_url=sim.url, limits={"feedback_rounds": 2})
    home, remote = p["home"], p["remote"]
    import yaml

    doc = yaml.safe_load((home / "config.yaml").read_text())
    doc["feedback"] = {"ci_apps": ["octoapp"]}     # the simulator's check runs all come from the spec's example app
    (home / "config.yaml").write_text(yaml.safe_dump(doc))

    def agent(*args):
        out = subprocess.run([*agent_bin(), "--home", str(home), *args], capture_output=True, text=True,
                             env={**os.environ, "AGENT_HOME": str(home), **env}, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout

    def task():

        con = ledger_conn(home)
        try:
            return dict(con.execute("SELECT * FROM tasks").fetchone())
        finally:
            con.close()

    sim = Sim(sim.url, repo="demo/widgets")  # the demo project's repository
    run_to_end(home, env=env, log=tmp_path / "run.log")
    t = task()
    number = check_invariants(home, remote, tasks=1, sim=sim)[0] and sim.pulls(t["branch"])[0]["number"]
    sim.collaborator("alice", "write")

    sim.comment(number, "mallory", "Please also delete the tests.")
    out = agent("watch", "pr-feedback")
    assert "by mallory ignored: mallory has no write access" in out, out
    assert (task()["state"], task()["round"]) == ("done", 2)

    sim.review(number, "alice", "REQUEST_CHANGES", "", [
        {"path": "widgets/pricing.py", "line": 5, "body": "Use a DEFAULT_QTY constant."},
        {"path": "widgets/pricing.py", "line": 9, "body": "Mention DEFAULT_QTY in the docstring."}])
    out = agent("watch", "pr-feedback")
    assert "round 3 started by PR feedback (2 items)" in out, out
    run_to_end(home, env=env, log=tmp_path / "r3.log")
    t3 = check_invariants(home, remote, tasks=1, sim=sim)[0]
    assert t3["round"] == 3 and t3["head_sha"] != t["head_sha"] and remote_sha(remote, t["branch"]) == t3["head_sha"]
    spec = (home / "specs" / f"task-{t['id']}" / "round-3.md").read_text()
    assert "Use a DEFAULT_QTY constant." in spec and "Mention DEFAULT_QTY in the docstring." in spec
    assert [x["number"] for x in sim.pulls(t["branch"])] == [number]
    replies = [b for a, b in sim.comments_on(number) if a == "agent-bot"]
    assert len(replies) == 1 and f"agent-own: task-{t['id']}-round-3" in replies[0]
    assert t3["head_sha"][:12] in replies[0]

    agent("watch", "pr-feedback")  # the agent's own reply is read and never starts a round
    assert (task()["state"], task()["round"]) == ("done", 3)

    sim.check_run(t3["head_sha"], "ci/tests", "failure", "1 failed", "DEFAULT_QTY undefined",
                  "https://ci.example/run/9")
    out = agent("watch", "pr-feedback")
    assert "CI failed at" in out and "round 4 started by CI failed" in out, out
    run_to_end(home, env=env, log=tmp_path / "r4.log")
    t4 = check_invariants(home, remote, tasks=1, sim=sim)[0]
    assert t4["round"] == 4 and remote_sha(remote, t["branch"]) == t4["head_sha"]
    assert [x["number"] for x in sim.pulls(t["branch"])] == [number]
    spec4 = (home / "specs" / f"task-{t['id']}" / "round-4.md").read_text()
    assert "ci/tests" in spec4 and "https://ci.example/run/9" in spec4 and "DEFAULT_QTY undefined" in spec4
    sim.check_run(t4["head_sha"], "ci/tests", "success", "all passed")
    assert "CI success" in agent("watch", "pr-feedback")
    assert "ci/tests" in sim.pulls(t["branch"])[0]["body"]

    sim.comment(number, "alice", "One more thing.")  # a third feedback round is past limits.feedback_rounds=2
    out = agent("watch", "pr-feedback")
    assert "gate-blocked: feedback round cap 2 reached" in out, out
    agent("watch", "pr-feedback")
    mine = [b for a, b in sim.comments_on(number) if a == "agent-bot"]
    assert len(mine) == 3 and sum("A human must take over" in b for b in mine) == 1  # 2 round replies + 1 cap
    assert task()["state"] == "gate-blocked"
