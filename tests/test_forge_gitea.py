"""The Gitea/Forgejo forge against the Gitea simulator (tests/forge_sim/gitea.py) on 127.0.0.1.

Every request and answer is checked against the schema derived from Gitea's swagger description
(tests/forge_sim/gitea_schema.py cites file and commit); each test ends with ``sim.assert_clean()``.  Faults are
injected per request by the simulator; nothing between the forge module and the socket is mocked.  The sleep
function is injected and recorded, so backoff waits are asserted without waiting.
What every forge must do (5xx, 429, timeouts, a lost create answer, "it exists", a crash before the ledger
write, answers of the wrong shape, origins) is tests/test_forge_contract.py; here only Gitea's own ways.
"""

from __future__ import annotations

import pytest
import requests

from agent.forge import ForgeAuthError, get_forge
from agent.forge.gitea import GiteaForge, strip_wip
from forge_sim import FakeClock
from forge_sim.gitea import GiteaSim

TOKEN = "gta_" + "s3cr3t" * 5
REPO = "acme/widgets"


@pytest.fixture
def sim():
    s = GiteaSim(token=TOKEN)
    s.add_repo(REPO)
    with s:
        yield s


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def forge(sim, clock):
    return GiteaForge(REPO, api_url=sim.url, token=TOKEN, sleep=clock.sleep, clock=clock, retries=2,
                      max_wait=120, timeout=(2.0, 0.3))


def one_line(exc) -> str:
    msg = str(exc.value)
    assert "\n" not in msg and TOKEN not in msg and "s3cr3t" not in msg
    return msg


HDR = {"Authorization": f"token {TOKEN}"}


def test_simulator_refuses_requests_and_answers_the_schema_does_not_allow(sim):
    bad = requests.post(f"{sim.url}/repos/acme/widgets/pulls", headers=HDR, timeout=10,
                        json={"title": "t", "head": "a", "base": "main", "draft": True})
    assert bad.status_code == 422 and "draft" in bad.text
    typed = requests.post(f"{sim.url}/repos/acme/widgets/pulls", headers=HDR, timeout=10,
                          json={"title": 5, "head": "a", "base": "main"})
    assert typed.status_code == 422 and "is not of type 'string'" in typed.text
    unknown_q = requests.get(f"{sim.url}/repos/acme/widgets/pulls", headers=HDR, timeout=10, params={"head": "a"})
    assert unknown_q.status_code == 422 and "head" in unknown_q.text
    assert len(sim.violations) == 3
    sim.violations.clear()
    ok = requests.post(f"{sim.url}/repos/acme/widgets/pulls", headers=HDR, timeout=10,
                       json={"title": "WIP: t", "head": "a", "base": "main"})
    assert ok.status_code == 201 and ok.json()["number"] == 1
    corrupt = requests.get(f"{sim.url}/repos/acme/widgets/pulls/1", timeout=10,
                           headers={**HDR, "X-Sim-Corrupt-Response": "1"})
    assert corrupt.status_code == 502 and "is not of type 'integer'" in corrupt.text
    assert requests.get(f"{sim.url}/user", timeout=10,
                        headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 401   # "token <t>" only here
    sim.assert_clean()


def test_draft_pr_created_found_updated_labelled_commented(sim, forge):
    branch = "agent/fix-0a1b2c3d"
    pr = forge.create_draft(branch, "main", "fix(api): KeyError", "first body")
    assert pr.draft and pr.state == "open" and pr.head == branch and pr.base == "main" and pr.number == 1
    assert (pr.title, pr.body) == ("fix(api): KeyError", "first body")
    assert sim.pulls(REPO)[0]["title"] == "WIP: fix(api): KeyError"     # no draft flag: the WIP prefix says it
    create = sim.calls_to("POST", r"/pulls$")[0]
    assert create.headers["Authorization"] == f"token {TOKEN}"
    assert create.body == {"head": branch, "base": "main", "title": "WIP: fix(api): KeyError", "body": "first body"}

    assert forge.find_pr_by_head(branch) == pr
    lookup = sim.calls_to("GET", r"/pulls/main/")[-1]         # {head} is one escaped path parameter, slash and all
    assert lookup.raw_path == "/repos/acme/widgets/pulls/main/agent%2Ffix-0a1b2c3d" and branch == "agent/fix-0a1b2c3d"

    updated = forge.update(pr.number, "fix(api): KeyError in checkout", "second body")
    assert (updated.title, updated.body, updated.draft) == ("fix(api): KeyError in checkout", "second body", True)
    assert sim.pulls(REPO)[0]["title"] == "WIP: fix(api): KeyError in checkout"

    forge.add_labels(pr.number, ["agent", "bug"])
    forge.add_labels(pr.number, ["agent"])
    forge.comment(pr.number, "round 2 pushed")
    labels = [lb["name"] for lb in sim.repos[REPO]["labels"]
              if lb["id"] in sim.repos[REPO]["issue_labels"][pr.number]]
    assert labels == ["agent", "bug"]                       # created once by name, added by id
    created = [c.body["name"] for c in sim.calls_to("POST", r"/repos/acme/widgets/labels$")]
    assert created == ["agent", "bug"]                     # the second call found "agent" and created nothing
    assert [c.body for c in sim.calls_to("POST", r"/issues/1/labels$")] == [
        {"labels": [lb["id"] for lb in sim.repos[REPO]["labels"]]}, {"labels": [sim.repos[REPO]["labels"][0]["id"]]}]
    assert [c["body"] for c in sim.comments(REPO, 1)] == ["round 2 pushed"]
    assert forge.find_pr_by_head("agent/fix-nothing") is None
    assert forge.user()["login"] == "agent-bot"
    assert TOKEN not in repr(forge)
    sim.assert_clean()


def test_wip_prefixes_are_case_insensitive_and_configurable(sim, clock):
    assert strip_wip("WIP: x") == ("x", True)
    assert strip_wip("[wip] x") == ("x", True)
    assert strip_wip("wip:x") == ("x", True)
    assert strip_wip("Wipe x") == ("Wipe x", False)
    f = GiteaForge(REPO, api_url=sim.url, token=TOKEN, sleep=clock.sleep, wip_prefix="🚧")
    pr = f.create_draft("agent/fix-emoji", "main", "t", "b")
    assert sim.pulls(REPO)[0]["title"] == "🚧 t" and pr.draft and pr.title == "t"
    sim.assert_clean()


def test_a_pr_a_human_marked_ready_stays_ready_when_updated(sim, forge):
    pr = forge.create_draft("agent/fix-ready", "main", "t", "b")
    with sim.lock:
        sim.repos[REPO]["pulls"][pr.number]["title"] = "t"
    assert forge.state(pr.number).draft is False
    forge.update(pr.number, "t2", "b2")
    assert sim.pulls(REPO)[0]["title"] == "t2"
    sim.assert_clean()


def test_merged_and_closed_are_told_apart_by_merged(sim, forge):
    a = forge.create_draft("agent/fix-merge01", "main", "t", "b")
    b = forge.create_draft("agent/fix-close01", "main", "t", "b")
    sim.merge(REPO, a.number)
    sim.close(REPO, b.number)
    ra = requests.get(f"{sim.url}/repos/acme/widgets/pulls/{a.number}", headers=HDR, timeout=10).json()
    rb = requests.get(f"{sim.url}/repos/acme/widgets/pulls/{b.number}", headers=HDR, timeout=10).json()
    assert ra["state"] == rb["state"] == "closed"           # Gitea says closed for both
    assert forge.state(a.number).state == "merged"
    assert forge.state(b.number).state == "closed"
    sim.assert_clean()


def test_pagination_follows_link(sim, forge):
    for name in [f"l{i}" for i in range(7)]:
        requests.post(f"{sim.url}/repos/acme/widgets/labels", headers=HDR, timeout=10,
                      json={"name": name, "color": "#000000"})
    labels = forge.api.paginate("/repos/acme/widgets/labels", {"limit": 3}, "labels")
    assert [lb["name"] for lb in labels] == [f"l{i}" for i in range(7)]
    assert len(sim.calls_to("GET", r"/labels$")) == 3
    sim.assert_clean()


def test_forge_from_config_uses_gitea_keys(sim, monkeypatch):
    from agent.config import parse_config

    monkeypatch.setenv("MY_GITEA", TOKEN)
    cfg = parse_config({"repos": {REPO: {"url": "https://git.example/acme/widgets.git", "forge": "gitea",
                                         "base": "develop"}},
                        "gitea": {"api_url": sim.url, "token_env": "MY_GITEA", "wip_prefix": "[WIP]"}})
    f = get_forge(cfg.repos[REPO], cfg, "/nonexistent-home")
    assert isinstance(f, GiteaForge) and f.base == "develop" and f.wip_prefix == "[WIP] "
    assert f._auth_headers() == {"Authorization": f"token {TOKEN}"}
    monkeypatch.delenv("MY_GITEA")
    with pytest.raises(ForgeAuthError, match="no Gitea token: set MY_GITEA"):
        get_forge(cfg.repos[REPO], cfg, "/nonexistent-home").state(1)


def test_auth_errors_are_one_line_and_never_retried(sim, clock):
    f = GiteaForge(REPO, api_url=sim.url, token="wrong", sleep=clock.sleep)
    with pytest.raises(ForgeAuthError) as exc:
        f.state(1)
    assert "token was refused (401)" in one_line(exc) and clock.sleeps == []
    sim.add_repo("acme/secret", bot_permission="none")
    hidden = GiteaForge("acme/secret", api_url=sim.url, token=TOKEN, sleep=clock.sleep)
    with pytest.raises(ForgeAuthError) as exc:
        hidden.create_draft("agent/fix-1", "main", "t", "b")
    assert "not found (404)" in one_line(exc)
    sim.assert_clean()


def test_write_access_from_collaborator_permission(sim, forge, clock):
    sim.set_permission(REPO, "alice", "write")
    sim.set_permission(REPO, "root", "owner")
    sim.set_permission(REPO, "reader", "read")
    sim.add_user("stranger")
    assert forge.has_write_access("alice") and forge.has_write_access("root")
    assert not forge.has_write_access("reader") and not forge.has_write_access("stranger")
    assert not forge.has_write_access("no-such-user")        # 404: none
    # a token that is not admin on the repository may only ask about itself: a clear one-line refusal
    sim.add_repo("acme/other", bot_permission="write")
    other = GiteaForge("acme/other", api_url=sim.url, token=TOKEN, sleep=clock.sleep)
    assert other.has_write_access("agent-bot")
    with pytest.raises(ForgeAuthError) as exc:
        other.has_write_access("acme")
    assert "refused (403)" in one_line(exc) and "admin" in str(exc.value)
    sim.assert_clean()


def test_feedback_is_reviews_inline_and_issue_comments(sim, forge):
    pr = forge.create_draft("agent/fix-fb", "main", "t", "b")
    sim.set_permission(REPO, "alice", "write")
    sim.review(REPO, pr.number, "alice", "REQUEST_CHANGES", "needs a test",
               comments=(("app/pricing.py", 12, "qty can be 0 here"),))
    sim.review(REPO, pr.number, "bob", "PENDING", "draft review")  # not submitted: not feedback
    sim.human_comment(REPO, pr.number, "alice", "also rename total()")
    forge.comment(pr.number, "round 2 pushed")                      # own, unmarked: never feedback
    reply_id = forge.reply(pr.number, "Handled in the next round.", key="review:1")
    page = forge.feedback(pr.number)
    got = [(f.kind, f.author, f.state, f.path, f.line, f.body.splitlines()[0]) for f in page.items]
    assert got == [("review", "alice", "changes_requested", None, None, "needs a test"),
                   ("inline", "alice", None, "app/pricing.py", 12, "qty can be 0 here"),
                   ("comment", "alice", None, None, None, "also rename total()"),
                   ("comment", "agent-bot", None, None, None, "Handled in the next round.")]
    assert page.items[1].review_id == page.items[0].id
    assert page.items[3].id == reply_id and page.items[3].own_key == "review:1"
    sim.human_comment(REPO, pr.number, "alice", "and one more")
    later = forge.feedback(pr.number, since=page.cursor)
    assert "and one more" in [f.body for f in later.items]
    assert sim.calls_to("GET", r"/issues/1/comments$")[-1].query == {"since": page.cursor}
    sim.assert_clean()


def test_ci_results_newest_status_per_context(sim, forge):
    sha = "c" * 40
    sim.add_status(REPO, sha, "ci/test", "failure", "3 tests failed")
    sim.add_status(REPO, sha, "ci/lint", "warning")
    sim.add_status(REPO, sha, "ci/test", "success")
    sim.add_status(REPO, sha, "ci/build", "pending")
    results = {r.name: (r.state, r.conclusion) for r in forge.ci_results(sha)}
    assert results == {"ci/test": ("success", "success"), "ci/lint": ("neutral", "warning"),
                       "ci/build": ("pending", "pending")}
    assert forge.ci_results("e" * 40) == []
    sim.assert_clean()
