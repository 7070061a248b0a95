"""GitHub forge error paths, with HTTP answered by the `responses` library.

Mocked: the HTTP layer only (GitHub's error answers — 401/403/404/422, rate limits, 5xx, timeouts —
cannot be produced by the simulator on demand).  The sleep function is injected and recorded, so
backoff waits are asserted without waiting.  Token commands run as real subprocesses.
"""

from __future__ import annotations

import json
import sys

import pytest
import requests
import responses
from responses.registries import OrderedRegistry

from agent.forge import ForgeAuthError, ForgeError
from agent.forge.github import ForgeRateLimited, ForgeTransient, GithubForge, resolve_token

API = "https://api.github.com"
PULLS = f"{API}/repos/acme/widgets/pulls"
TOKEN = "ghp_" + "s3cr3t" * 6


def pr_json(number=7, head="agent/fix-1", state="open", draft=True, title="t", body="b", merged_at=None):
    return {"number": number, "html_url": f"https://github.com/acme/widgets/pull/{number}", "state": state,
            "draft": draft, "title": title, "body": body, "merged_at": merged_at,
            "head": {"ref": head, "sha": "a" * 40}, "base": {"ref": "main", "sha": "b" * 40}}


class Clock:
    def __init__(self, t=1_700_000_000.0):
        self.t = t
        self.sleeps: list[float] = []

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.sleeps.append(s)
        self.t += s


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def forge(clock):
    return GithubForge("acme/widgets", api_url=API, token=TOKEN, sleep=clock.sleep, clock=clock, retries=2,
                       max_wait=120)


def one_line(exc) -> str:
    msg = str(exc.value)
    assert "\n" not in msg and TOKEN not in msg and "s3cr3t" not in msg
    return msg


@responses.activate
def test_headers_and_token_are_sent_but_never_shown(forge):
    responses.add(responses.GET, f"{PULLS}/7", json=pr_json())
    pr = forge.state(7)
    assert pr.number == 7 and pr.draft and pr.state == "open"
    sent = responses.calls[0].request
    assert sent.headers["Authorization"] == f"Bearer {TOKEN}"
    assert sent.headers["Accept"] == "application/vnd.github+json"
    assert sent.headers["X-GitHub-Api-Version"] == "2022-11-28"
    assert TOKEN not in repr(forge) and "s3cr3t" not in repr(forge)


@responses.activate
def test_github_enterprise_base_url(clock):
    ghe = GithubForge("acme/widgets", api_url="https://ghe.example.com/api/v3/", token="t", sleep=clock.sleep)
    responses.add(responses.GET, "https://ghe.example.com/api/v3/repos/acme/widgets/pulls/3", json=pr_json(3))
    assert ghe.state(3).number == 3


@responses.activate
def test_merged_state_from_merged_at(forge):
    responses.add(responses.GET, f"{PULLS}/7", json=pr_json(state="closed", merged_at="2024-01-01T00:00:00Z"))
    assert forge.state(7).state == "merged"


@responses.activate
def test_pagination_follows_link_header(forge):
    page2 = f"{PULLS}?head=acme%3Aagent%2Ffix-1&state=all&per_page=100&page=2"
    responses.add(responses.GET, PULLS, json=[pr_json(1, head="agent/fix-1", state="closed")],
                  headers={"Link": f'<{page2}>; rel="next", <{page2}>; rel="last"'},
                  match=[responses.matchers.query_param_matcher(
                      {"head": "acme:agent/fix-1", "state": "all", "per_page": "100"})])
    responses.add(responses.GET, PULLS, json=[pr_json(9, head="agent/fix-1", state="open")],
                  match=[responses.matchers.query_param_matcher(
                      {"head": "acme:agent/fix-1", "state": "all", "per_page": "100", "page": "2"})])
    found = forge.find_pr_by_head("agent/fix-1")
    assert found.number == 9 and found.state == "open"  # the open one on page 2 wins over the closed one
    assert len(responses.calls) == 2


@responses.activate(registry=OrderedRegistry)
def test_422_already_exists_adopts_the_open_draft(forge):
    responses.add(responses.POST, PULLS, status=422, json={
        "message": "Validation Failed", "documentation_url": "x",
        "errors": [{"resource": "PullRequest", "code": "custom",
                    "message": "A pull request already exists for acme:agent/fix-1."}]})
    responses.add(responses.GET, PULLS, json=[pr_json(7, title="old", body="old")])
    responses.add(responses.PATCH, f"{PULLS}/7", json=pr_json(7, title="new", body="new"))
    pr = forge.create_draft("agent/fix-1", "main", "new", "new")
    assert (pr.number, pr.title, pr.body) == (7, "new", "new")
    assert json.loads(responses.calls[0].request.body)["draft"] is True
    assert json.loads(responses.calls[2].request.body) == {"title": "new", "body": "new"}


@pytest.mark.parametrize("existing,reason", [
    (pr_json(7, state="closed", draft=True), "it is closed"),
    (pr_json(7, state="open", draft=False), "it is not a draft"),
])
@responses.activate(registry=OrderedRegistry)
def test_422_already_exists_refuses_with_the_reason(forge, existing, reason):
    responses.add(responses.POST, PULLS, status=422, json={
        "message": "Validation Failed", "errors": [{"code": "custom", "message": "A pull request already exists"}]})
    responses.add(responses.GET, PULLS, json=[existing])
    with pytest.raises(ForgeError) as exc:
        forge.create_draft("agent/fix-1", "main", "t", "b")
    msg = one_line(exc)
    assert reason in msg and "#7" in msg and "refusing to adopt" in msg
    assert not any(c.request.method == "PATCH" for c in responses.calls)


@responses.activate
def test_422_other_validation_error_is_a_clear_refusal(forge):
    responses.add(responses.POST, PULLS, status=422, json={
        "message": "Validation Failed", "errors": [{"resource": "PullRequest", "field": "head", "code": "invalid"}]})
    with pytest.raises(ForgeError) as exc:
        forge.create_draft("agent/fix-1", "main", "t", "b")
    msg = one_line(exc)
    assert "422" in msg and "invalid" in msg and "branch exists on the remote" in msg
    assert len(responses.calls) == 1


@pytest.mark.parametrize("status,needle", [
    (401, "token was refused (401)"),
    (403, "access denied (403)"),
    (404, "not found (404)"),
])
@responses.activate
def test_auth_errors_are_forge_auth_errors_with_one_line(forge, clock, status, needle):
    responses.add(responses.GET, f"{PULLS}/7", status=status, json={"message": "Bad credentials"})
    with pytest.raises(ForgeAuthError) as exc:
        forge.state(7)
    msg = one_line(exc)
    assert needle in msg and "acme/widgets" in msg
    assert len(responses.calls) == 1 and clock.sleeps == []  # never retried


@responses.activate(registry=OrderedRegistry)
def test_403_rate_limit_waits_until_reset(forge, clock):
    reset = int(clock.t) + 30
    responses.add(responses.GET, f"{PULLS}/7", status=403, json={"message": "API rate limit exceeded"},
                  headers={"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(reset)})
    responses.add(responses.GET, f"{PULLS}/7", json=pr_json())
    assert forge.state(7).number == 7
    assert clock.sleeps == [31.0]  # until the reset, plus a second of slack


@responses.activate
def test_403_rate_limit_too_far_away_is_not_waited(forge, clock):
    responses.add(responses.GET, f"{PULLS}/7", status=403, json={"message": "API rate limit exceeded"},
                  headers={"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(int(clock.t) + 3600)})
    with pytest.raises(ForgeRateLimited) as exc:
        forge.state(7)
    assert "rate limited" in one_line(exc) and "3601s" in str(exc.value)
    assert clock.sleeps == [] and len(responses.calls) == 1


@responses.activate(registry=OrderedRegistry)
def test_429_retry_after_is_honoured_and_bounded(forge, clock):
    for _ in range(2):
        responses.add(responses.POST, f"{API}/repos/acme/widgets/issues/7/labels", status=429,
                      headers={"Retry-After": "7"}, json={"message": "secondary rate limit"})
    responses.add(responses.POST, f"{API}/repos/acme/widgets/issues/7/labels", json=[])
    forge.add_labels(7, ["agent"])
    assert clock.sleeps == [7.0, 7.0] and len(responses.calls) == 3

    responses.reset()
    for _ in range(5):
        responses.add(responses.GET, f"{PULLS}/8", status=429, headers={"Retry-After": "5"}, json={})
    clock.sleeps.clear()
    with pytest.raises(ForgeRateLimited):
        forge.state(8)
    assert clock.sleeps == [5.0, 5.0] and len(responses.calls) == 3  # retries=2: bounded


@responses.activate(registry=OrderedRegistry)
def test_5xx_retried_for_reads_then_gives_up(forge, clock):
    responses.add(responses.GET, f"{PULLS}/7", status=502, body="bad gateway")
    responses.add(responses.GET, f"{PULLS}/7", json=pr_json())
    assert forge.state(7).number == 7 and clock.sleeps == [1.0]

    responses.reset()
    for _ in range(3):
        responses.add(responses.GET, f"{PULLS}/7", status=503, body="unavailable")
    clock.sleeps.clear()
    with pytest.raises(ForgeTransient) as exc:
        forge.state(7)
    assert "503" in one_line(exc) and clock.sleeps == [1.0, 2.0] and len(responses.calls) == 3


@responses.activate(registry=OrderedRegistry)
def test_5xx_on_create_looks_up_by_head_before_creating_again(forge):
    responses.add(responses.POST, PULLS, status=502, body="bad gateway")
    responses.add(responses.GET, PULLS, json=[])                       # proven not applied
    responses.add(responses.POST, PULLS, status=201, json=pr_json(11))
    pr = forge.create_draft("agent/fix-1", "main", "t", "b")
    assert pr.number == 11
    assert [c.request.method for c in responses.calls] == ["POST", "GET", "POST"]


@responses.activate(registry=OrderedRegistry)
def test_timeout_on_create_that_was_applied_adopts_instead_of_creating_twice(forge):
    responses.add(responses.POST, PULLS, body=requests.exceptions.ReadTimeout("read timed out"))
    responses.add(responses.GET, PULLS, json=[pr_json(12, title="t", body="b")])
    pr = forge.create_draft("agent/fix-1", "main", "t", "b")
    assert pr.number == 12
    assert [c.request.method for c in responses.calls] == ["POST", "GET"]


@responses.activate(registry=OrderedRegistry)
def test_timeouts_retried_only_for_idempotent_calls(forge, clock):
    responses.add(responses.GET, f"{PULLS}/7", body=requests.exceptions.ConnectTimeout("connect timed out"))
    responses.add(responses.GET, f"{PULLS}/7", json=pr_json())
    assert forge.state(7).number == 7 and clock.sleeps == [1.0]

    responses.add(responses.POST, f"{API}/repos/acme/widgets/issues/7/comments",
                  body=requests.exceptions.ReadTimeout("read timed out"))
    with pytest.raises(ForgeTransient) as exc:
        forge.comment(7, "hello")
    assert "timed out" in one_line(exc)
    assert sum(1 for c in responses.calls if c.request.method == "POST") == 1  # a comment is never re-posted


def test_token_sources(monkeypatch, tmp_path):
    for var in ("GITHUB_TOKEN", "GH_TOKEN", "MY_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ForgeAuthError, match="no GitHub token: set GITHUB_TOKEN"):
        resolve_token()
    monkeypatch.setenv("GH_TOKEN", "from-gh")
    assert resolve_token() == "from-gh"
    monkeypatch.setenv("MY_TOKEN", "from-mine")
    assert resolve_token("MY_TOKEN") == "from-mine"
    monkeypatch.delenv("GH_TOKEN")
    monkeypatch.delenv("MY_TOKEN")
    cmd = (sys.executable, "-c", "print('from-command')")
    assert resolve_token(token_command=cmd) == "from-command"
    bad = (sys.executable, "-c", "import sys; sys.stderr.write('not logged in\\n'); sys.exit(1)")
    with pytest.raises(ForgeAuthError, match=r"exited 1 without a token \(not logged in\)"):
        resolve_token(token_command=bad)
    with pytest.raises(ForgeAuthError, match="not found"):
        resolve_token(token_command=(str(tmp_path / "no-such-tool"),))


@responses.activate
def test_token_command_is_used_lazily_by_the_forge(clock, monkeypatch):
    for var in ("GITHUB_TOKEN", "GH_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    from agent.config import parse_config

    cfg = parse_config({"repos": {"acme/widgets": {"url": "https://github.com/acme/widgets.git", "forge": "github"}},
                        "github": {"token_command": [sys.executable, "-c", "print('cmd-token')"]}})
    from agent.forge import get_forge

    forge = get_forge(cfg.repos["acme/widgets"], cfg, "/nonexistent-home")
    assert isinstance(forge, GithubForge) and "cmd-token" not in repr(forge)
    responses.add(responses.GET, f"{PULLS}/7", json=pr_json())
    forge.state(7)
    assert responses.calls[0].request.headers["Authorization"] == "Bearer cmd-token"
