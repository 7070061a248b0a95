"""GitHub's own error answers, with HTTP answered by the `responses` library.

Mocked: the HTTP layer only, for what only GitHub says (403/404, a 422 that is not "already exists", the primary
rate limit's X-RateLimit-* headers, GitHub Enterprise's URL).  What every forge must do with 5xx, 429, timeouts, a
lost create answer and "it exists" runs for real against the simulators in tests/test_forge_contract.py.  The sleep function is injected and recorded, so
backoff waits are asserted without waiting.  Token commands run as real subprocesses.
"""

from __future__ import annotations

import sys

import pytest
import responses
from responses.registries import OrderedRegistry

from agent.forge import ForgeAuthError, ForgeError
from agent.forge.github import ForgeRateLimited, GithubForge, resolve_token

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
