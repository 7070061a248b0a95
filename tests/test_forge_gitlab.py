"""The GitLab forge against the GitLab simulator (tests/forge_sim/gitlab.py) on 127.0.0.1.

Every request the forge sends and every answer the simulator gives is checked against the schema derived from
GitLab's API description (tests/forge_sim/gitlab_schema.py cites file and commit); each test ends with
``sim.assert_clean()``.  Faults (5xx, 429 with GitLab's RateLimit-*/Retry-After headers, slow answers past the
client's timeout, a connection dropped after the create happened) are injected per request by the simulator;
nothing between the forge module and the socket is mocked.  The sleep function is injected and recorded, so
backoff and rate-limit waits are asserted without waiting.
What every forge must do (5xx, 429, timeouts, a lost create answer, "it exists", a crash before the ledger
write, answers of the wrong shape, origins) is tests/test_forge_contract.py; here only GitLab's own ways.
"""

from __future__ import annotations

import pytest
import requests

from agent.forge import ForgeAuthError, ForgeRateLimited, get_forge
from agent.forge.gitlab import GitlabForge, strip_draft
from forge_sim import FakeClock
from forge_sim.gitlab import GitlabSim

TOKEN = "glpat-" + "s3cr3t" * 4
REPO = "acme/widgets"


@pytest.fixture
def sim():
    s = GitlabSim(token=TOKEN)
    s.add_project(REPO)
    with s:
        yield s


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def forge(sim, clock):
    return GitlabForge(REPO, api_url=sim.url, token=TOKEN, sleep=clock.sleep, clock=clock, retries=2,
                       max_wait=120, timeout=(2.0, 0.3))


def one_line(exc) -> str:
    msg = str(exc.value)
    assert "\n" not in msg and TOKEN not in msg and "s3cr3t" not in msg
    return msg


# ---------------------------------------------------------------------------------------------- the simulator


def test_simulator_refuses_requests_and_answers_the_schema_does_not_allow(sim):
    """The guarantee every other test leans on, proven live: a bad request and a bad answer are caught."""
    hdr = {"PRIVATE-TOKEN": TOKEN}
    bad = requests.post(f"{sim.url}/projects/acme%2Fwidgets/merge_requests", headers=hdr, timeout=10,
                        json={"title": "t", "source_branch": "a", "target_branch": "main", "draft": True})
    assert bad.status_code == 400 and "draft" in bad.text and "Additional properties" in bad.text
    missing = requests.post(f"{sim.url}/projects/acme%2Fwidgets/merge_requests", headers=hdr, timeout=10,
                            json={"title": "t", "source_branch": "a"})
    assert missing.status_code == 400 and "target_branch" in missing.text
    unknown_q = requests.get(f"{sim.url}/projects/acme%2Fwidgets/merge_requests", headers=hdr, timeout=10,
                             params={"head": "x"})
    assert unknown_q.status_code == 400 and "head" in unknown_q.text
    nowhere = requests.get(f"{sim.url}/projects/acme%2Fwidgets/pulls", headers=hdr, timeout=10)
    assert nowhere.status_code == 404 and "no such operation" in nowhere.text
    assert len(sim.violations) == 4
    sim.violations.clear()

    ok = requests.post(f"{sim.url}/projects/acme%2Fwidgets/merge_requests", headers=hdr, timeout=10,
                       json={"title": "Draft: t", "source_branch": "a", "target_branch": "main"})
    assert ok.status_code == 201 and ok.json()["iid"] == 1 and ok.json()["draft"] is True
    corrupt = requests.get(f"{sim.url}/projects/acme%2Fwidgets/merge_requests/1", timeout=10,
                           headers={**hdr, "X-Sim-Corrupt-Response": "1"})
    assert corrupt.status_code == 502 and "is not of type 'integer'" in corrupt.text
    assert requests.get(f"{sim.url}/user", timeout=10).status_code == 401
    sim.assert_clean()


# ---------------------------------------------------------------------------------------------- the interface


def test_draft_mr_created_found_updated_labelled_commented(sim, forge):
    branch = "agent/fix-0a1b2c3d"
    pr = forge.create_draft(branch, "main", "fix(api): KeyError", "first body")
    assert pr.draft and pr.state == "open" and pr.head == branch and pr.base == "main" and pr.number == 1
    assert pr.title == "fix(api): KeyError" and pr.body == "first body"
    assert pr.url.endswith("/acme/widgets/-/merge_requests/1")
    [mr] = sim.mrs(REPO)
    assert mr["title"] == "Draft: fix(api): KeyError"            # GitLab has no draft flag: the title says it
    create = sim.calls_to("POST", r"/merge_requests$")[0]
    assert create.headers["PRIVATE-TOKEN"] == TOKEN and "Authorization" not in create.headers
    assert create.raw_path == "/projects/acme%2Fwidgets/merge_requests"   # the project path, URL-encoded
    assert create.body == {"source_branch": branch, "target_branch": "main", "title": "Draft: fix(api): KeyError",
                           "description": "first body", "remove_source_branch": False}

    found = forge.find_pr_by_head(branch)
    assert found == pr
    lookup = sim.calls_to("GET", r"/merge_requests$")[-1]
    assert lookup.query["source_branch"] == branch and lookup.query["target_branch"] == "main"

    updated = forge.update(pr.number, "fix(api): KeyError in checkout", "second body")
    assert (updated.number, updated.title, updated.body, updated.draft) == \
        (1, "fix(api): KeyError in checkout", "second body", True)
    assert sim.mrs(REPO)[0]["title"] == "Draft: fix(api): KeyError in checkout"

    forge.add_labels(pr.number, ["agent", "bug"])
    forge.add_labels(pr.number, ["agent"])
    forge.comment(pr.number, "round 2 pushed")
    assert sim.mrs(REPO)[0]["labels"] == ["agent", "bug"]
    assert [n["body"] for n in sim.notes(REPO, 1)] == ["round 2 pushed"]
    assert forge.find_pr_by_head("agent/fix-nothing") is None
    assert forge.user()["username"] == "agent-bot"
    assert TOKEN not in repr(forge)
    sim.assert_clean()


def test_an_mr_a_human_marked_ready_stays_ready_when_updated(sim, forge):
    pr = forge.create_draft("agent/fix-ready", "main", "t", "b")
    with sim.lock:
        sim.projects[REPO]["mrs"][pr.number]["title"] = "t"      # "Mark as ready" removes the prefix
    assert forge.state(pr.number).draft is False
    forge.update(pr.number, "t2", "b2")
    assert sim.mrs(REPO)[0]["title"] == "t2"                     # never re-drafted, never marked ready by us
    sim.assert_clean()


@pytest.mark.parametrize("title,expected", [
    ("Draft: x", ("x", True)), ("draft:x", ("x", True)), ("[Draft] x", ("x", True)), ("(Draft) x", ("x", True)),
    ("Drafting x", ("Drafting x", False)), ("x", ("x", False))])
def test_draft_prefixes(title, expected):
    assert strip_draft(title) == expected


def test_pagination_follows_link_and_x_next_page(sim, forge):
    for i in range(5):
        first = forge.create_draft("agent/fix-many", "main", f"t{i}", "b")
        sim.close(REPO, first.number)
    last = forge.create_draft("agent/fix-many", "main", "open one", "b")
    items = forge.api.paginate("/projects/acme%2Fwidgets/merge_requests", {"per_page": 2, "state": "all"}, "all")
    assert [i["iid"] for i in items] == [6, 5, 4, 3, 2, 1]
    assert len(sim.calls_to("GET", r"/merge_requests$")) >= 3
    assert forge.find_pr_by_head("agent/fix-many").number == last.number  # the open one wins

    # Without a Link header (GitLab drops some headers above 10,000 rows), X-Next-Page is followed
    sim.page_links = False
    orig = sim.paginate

    def no_link(*a, **kw):
        chunk, headers = orig(*a, **kw)
        headers.pop("Link", None)
        return chunk, headers

    sim.paginate = no_link
    items = forge.api.paginate("/projects/acme%2Fwidgets/merge_requests", {"per_page": 4, "state": "all"}, "all")
    assert [i["iid"] for i in items] == [6, 5, 4, 3, 2, 1]
    sim.assert_clean()


def test_nested_group_and_self_managed_url_under_a_sub_path(clock):
    with GitlabSim(token=TOKEN, prefix="/gitlab") as s:
        s.add_project("platform/backend/widgets")
        f = GitlabForge("platform/backend/widgets", api_url=s.url, token=TOKEN, sleep=clock.sleep)
        assert s.url.endswith("/gitlab/api/v4")
        pr = f.create_draft("agent/fix-1", "main", "t", "b")
        assert pr.number == 1
        assert s.calls[0].raw_path == "/projects/platform%2Fbackend%2Fwidgets/merge_requests"
        s.assert_clean()


def test_forge_from_config_uses_gitlab_keys(sim, monkeypatch):
    from agent.config import parse_config

    monkeypatch.setenv("MY_GITLAB", TOKEN)
    cfg = parse_config({"repos": {"grp/sub/widgets": {"url": "https://gl.example/grp/sub/widgets.git",
                                                      "forge": "gitlab", "base": "develop"}},
                        "gitlab": {"api_url": sim.url + "/", "token_env": "MY_GITLAB"}})
    f = get_forge(cfg.repos["grp/sub/widgets"], cfg, "/nonexistent-home")
    assert isinstance(f, GitlabForge) and f.base == "develop" and f.api_url == sim.url
    assert f._auth_headers() == {"PRIVATE-TOKEN": TOKEN}
    monkeypatch.delenv("MY_GITLAB")
    g = get_forge(cfg.repos["grp/sub/widgets"], cfg, "/nonexistent-home")
    with pytest.raises(ForgeAuthError, match="no GitLab token: set MY_GITLAB"):
        g.state(1)


# ---------------------------------------------------------------------------------------------- errors and faults


def test_not_found_and_forbidden(sim, forge, clock):
    sim.add_project("acme/secret", bot_access=0)
    hidden = GitlabForge("acme/secret", api_url=sim.url, token=TOKEN, sleep=clock.sleep)
    with pytest.raises(ForgeAuthError) as exc:
        hidden.find_pr_by_head("agent/fix-1")
    assert "not found (404)" in one_line(exc)
    sim.add_project("acme/readonly", bot_access=20)  # Reporter: can read, cannot open MRs
    ro = GitlabForge("acme/readonly", api_url=sim.url, token=TOKEN, sleep=clock.sleep)
    with pytest.raises(ForgeAuthError) as exc:
        ro.create_draft("agent/fix-1", "main", "t", "b")
    assert "access denied (403)" in one_line(exc) and "Developer" in str(exc.value)
    sim.assert_clean()


def test_429_retry_after_and_ratelimit_reset_are_honoured_and_bounded(sim, forge, clock):
    pr = forge.create_draft("agent/fix-429", "main", "t", "b")
    sim.fault("GET", r"/merge_requests/1$", status=429, times=2, headers=GitlabSim.rate_limit_headers(7, clock.t),
              body={"message": "Retry later"})
    assert forge.state(pr.number).number == 1
    assert clock.sleeps == [7.0, 7.0]
    # RateLimit-Reset alone (no Retry-After): wait until the reset, plus a second
    clock.sleeps.clear()
    headers = {k: v for k, v in GitlabSim.rate_limit_headers(30, clock.t).items() if k != "Retry-After"}
    sim.fault("GET", r"/merge_requests/1$", status=429, times=1, headers=headers)
    forge.state(pr.number)
    assert clock.sleeps == [31.0]
    # a wait longer than max_wait is not slept: the next scan retries, told when
    clock.sleeps.clear()
    sim.fault("GET", r"/merge_requests/1$", status=429, times=1, headers=GitlabSim.rate_limit_headers(3600, clock.t))
    with pytest.raises(ForgeRateLimited) as exc:
        forge.state(pr.number)
    assert "rate limited" in one_line(exc) and "GitLab allows the next call in 3600s" in str(exc.value)
    assert clock.sleeps == []
    sim.assert_clean()


def test_write_access_is_effective_access_level_30_or_more(sim, forge):
    sim.set_access(REPO, "maintainer", 40)
    sim.set_access(REPO, "dev", 30)
    sim.set_access(REPO, "reporter", 20)
    sim.add_user("stranger")
    assert forge.has_write_access("maintainer") and forge.has_write_access("dev")
    assert not forge.has_write_access("reporter")
    assert not forge.has_write_access("stranger")            # no member at all: GitLab answers 404
    assert not forge.has_write_access("nobody-by-that-name")  # no such user
    assert forge.has_write_access("agent-bot")                # itself, without a user lookup
    assert any(c.raw_path.startswith("/projects/acme%2Fwidgets/members/all/") for c in sim.calls)
    assert not any(c.query.get("username") == "agent-bot" for c in sim.calls_to("GET", r"^/users$"))
    sim.assert_clean()


# ---------------------------------------------------------------------------------------------- feedback and CI


def test_feedback_is_notes_and_diff_threads_without_system_or_unmarked_own_notes(sim, forge):
    pr = forge.create_draft("agent/fix-fb", "main", "t", "b")
    sim.set_access(REPO, "alice", 40)
    sim.note(REPO, pr.number, "alice", "please also handle qty=None")
    sim.note(REPO, pr.number, "agent-bot", "added 1 commit", system=True)
    sim.note(REPO, pr.number, "alice", "changed the description", system=True)
    sim.diff_note(REPO, pr.number, "alice", "app/pricing.py", 12, "qty can be 0 here")
    forge.comment(pr.number, "round 2 pushed")                     # the agent's own, unmarked: never feedback
    reply_id = forge.reply(pr.number, "Handled in the next round.", key="comment:7")
    page = forge.feedback(pr.number)
    got = [(f.kind, f.author, f.body.splitlines()[0], f.path, f.line) for f in page.items]
    assert got == [("comment", "alice", "please also handle qty=None", None, None),
                   ("inline", "alice", "qty can be 0 here", "app/pricing.py", 12),
                   ("comment", "agent-bot", "Handled in the next round.", None, None)]
    inline = page.items[1]
    assert inline.review_id and inline.url.endswith(f"/-/merge_requests/{pr.number}#note_{inline.id}")
    own = page.items[2]
    assert own.id == reply_id and own.own_key == "comment:7"       # recognised by the caller as its own reply
    assert page.cursor == max(f.created_at for f in page.items)

    sim.note(REPO, pr.number, "alice", "one more thing")
    later = forge.feedback(pr.number, since=page.cursor)
    assert "one more thing" in [f.body for f in later.items]
    assert all(f.created_at >= page.cursor for f in later.items)  # older notes are not read again
    assert sim.calls_to("GET", r"/discussions$")[0].query == {"per_page": "100"}
    sim.assert_clean()


def test_ci_results_newest_status_per_job_and_the_pipeline(sim, forge):
    sha = "c" * 40
    sim.add_status(REPO, sha, "test", "failed", "3 tests failed")
    sim.add_status(REPO, sha, "lint", "success")
    sim.add_status(REPO, sha, "test", "success")                   # re-run: the newest wins
    sim.add_status(REPO, sha, "deploy", "manual")
    results = {r.name: r for r in forge.ci_results(sha)}
    assert results["test"].state == "success" and results["lint"].state == "success"
    assert results["deploy"].state == "neutral" and results["deploy"].conclusion == "manual"
    pipeline = [r for r in results.values() if r.kind == "pipeline"]
    assert len(pipeline) == 1 and pipeline[0].conclusion == "manual" and pipeline[0].url.endswith(pipeline[0].id)
    sim.add_status(REPO, "d" * 40, "test", "failed", "KeyError in test_total")
    [failed, pl] = forge.ci_results("d" * 40)
    assert failed.state == pl.state == "failure" and failed.summary == "KeyError in test_total"
    assert forge.ci_results("e" * 40) == []
    sim.assert_clean()
