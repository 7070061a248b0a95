"""The forge contract: what every hosted forge must do, as one suite run over the GitHub, GitLab and Gitea simulators.

Each ``Harness`` gives the same handles on its simulator: ``make()`` (a forge pointed at it, with an injected clock),
``inject(...)`` (answer the next matching request with a chosen status, headers and body, JSON or not) and
``calls(...)`` (what reached the forge's origin).  GitHub's simulator (node, tests/github_sim) sits behind
tests/fault_proxy.py for the injections; GitLab's and Gitea's (tests/forge_sim) inject themselves.  A second
server on another port of 127.0.0.1 (another origin) plays the host a hostile answer points to and records
anything that reaches it.  Forge-specific behaviour stays in tests/test_forge_{github_sim,gitlab,gitea}.py.
"""

from __future__ import annotations

import re

import pytest

from agent.forge import ForgeBadAnswer, ForgeError, ForgeTransient, publish_pr
from agent.tasks import create_task
from fault_proxy import Fault, FaultProxy
from forge_sim import FakeClock
from intake_support import LocalServer

REPO = "acme/widgets"
SHA = "c" * 40
TOKENS = {"github": "ghp_" + "s3cr3t" * 6, "gitlab": "glpat-" + "s3cr3t" * 4, "gitea": "gta_" + "s3cr3t" * 5}
HTML = b"<html><body><h1>502 Bad Gateway</h1><p>nginx</p></body></html>"


class Harness:
    name = ""
    pr_path = r"/(pulls|merge_requests)/\d+(\?|$)"          # reading one PR / MR
    statuses_path = r"statuses"                            # listing a commit's statuses (paginated everywhere)

    def __init__(self, url: str, clock: FakeClock):
        self.url = url
        self.clock = clock
        self.token = TOKENS[self.name]

    def make(self, **kw):
        from agent.forge import forge_class

        return forge_class(self.name)(REPO, api_url=self.url, token=self.token, sleep=self.clock.sleep,
                                      clock=self.clock, retries=1, **kw)

    def statuses_url(self, sha: str) -> str:
        raise NotImplementedError

    def inject(self, method: str, path_re: str, status: int, headers: dict | None = None, body=None,
               raw: bytes | None = None, times: int = 1) -> None:
        raise NotImplementedError

    def calls(self, method: str, path_re: str) -> list[dict]:
        """Requests that reached the simulator: ``{"path", "status", "auth"}`` (auth: a credential was sent)."""
        raise NotImplementedError


class GithubHarness(Harness):
    name = "github"

    def __init__(self, sim, proxy: FaultProxy, clock):
        super().__init__(proxy.url, clock)
        self.sim, self.proxy = sim, proxy

    def statuses_url(self, sha):
        return f"{self.url}/repos/{REPO}/commits/{sha}/statuses?per_page=100"

    def inject(self, method, path_re, status, headers=None, body=None, raw=None, times=1):
        self.proxy.faults.append(Fault(method, path_re, status, headers=headers or {},
                                       body={"message": "x"} if body is None else body, times=times, raw=raw))

    def calls(self, method, path_re):
        return [{"path": p, "status": st} for m, p, st in self.proxy.calls if m == method and re.search(path_re, p)]


class SimHarness(Harness):
    def __init__(self, sim, clock):
        super().__init__(sim.url, clock)
        self.sim = sim

    def inject(self, method, path_re, status, headers=None, body=None, raw=None, times=1):
        self.sim.fault(method, path_re, status=status, headers=headers or {},
                       body={"message": "x"} if body is None else body, raw=raw, times=times)

    def calls(self, method, path_re):
        return [{"path": c.path, "status": c.status} for c in self.sim.calls_to(method, path_re)]


class GitlabHarness(SimHarness):
    name = "gitlab"

    def statuses_url(self, sha):
        return f"{self.url}/projects/acme%2Fwidgets/repository/commits/{sha}/statuses?per_page=100"


class GiteaHarness(SimHarness):
    name = "gitea"

    def statuses_url(self, sha):
        return f"{self.url}/repos/{REPO}/statuses/{sha}?limit=50"


@pytest.fixture(scope="module")
def github_node(tmp_path_factory):
    from github_sim import running

    with running(tmp_path_factory.mktemp("ghsim")) as s:
        yield s


@pytest.fixture(params=["github", "gitlab", "gitea"])
def hub(request):
    clock = FakeClock()
    if request.param == "github":
        proxy = FaultProxy(request.getfixturevalue("github_node").url).start()
        try:
            yield GithubHarness(request.getfixturevalue("github_node"), proxy, clock)
        finally:
            proxy.stop()
        return
    if request.param == "gitlab":
        from forge_sim.gitlab import GitlabSim

        sim = GitlabSim(token=TOKENS["gitlab"])
        sim.add_project(REPO)
        harness = GitlabHarness
    else:
        from forge_sim.gitea import GiteaSim

        sim = GiteaSim(token=TOKENS["gitea"])
        sim.add_repo(REPO)
        harness = GiteaHarness
    with sim:
        yield harness(sim, clock)
        sim.assert_clean()


@pytest.fixture
def elsewhere():
    """Another origin (another port): records every request that reaches it."""
    with LocalServer(lambda *a: (200, {}, [])) as srv:
        yield srv


def one_line(exc, hub) -> str:
    msg = str(exc.value)
    assert "\n" not in msg and hub.token not in msg and "s3cr3t" not in msg
    return msg


def host(url: str) -> str:
    return url.split("//", 1)[1].split("/", 1)[0]


# ------------------------------------------------------------------ credentials go only to the configured origin


def test_link_next_to_another_origin_is_refused_and_never_sent_the_token(hub, elsewhere):
    forge = hub.make()
    hub.inject("GET", hub.statuses_path, 200, body=[],
               headers={"Link": f'<{elsewhere.url}/steal?page=2>; rel="next"'})
    with pytest.raises(ForgeError) as exc:
        forge.ci_results(SHA)
    msg = one_line(exc, hub)
    assert host(elsewhere.url) in msg and host(hub.url) in msg and "refusing to send credentials" in msg
    assert elsewhere.requests == []


@pytest.mark.parametrize("status", [302, 307])
def test_redirect_to_another_origin_is_refused_with_both_origins(hub, elsewhere, status):
    forge = hub.make()
    hub.inject("GET", hub.statuses_path, status, headers={"Location": f"{elsewhere.url}/api/statuses"})
    with pytest.raises(ForgeError) as exc:
        forge.ci_results(SHA)
    msg = one_line(exc, hub)
    assert f"redirected to http://{host(elsewhere.url)}" in msg and host(hub.url) in msg
    assert elsewhere.requests == []


def test_redirect_within_the_origin_is_followed(hub):
    forge = hub.make()
    hub.inject("GET", hub.statuses_path, 301, headers={"Location": hub.statuses_url(SHA)})
    assert [r for r in forge.ci_results(SHA) if r.kind == "status"] == []
    assert [c["status"] for c in hub.calls("GET", hub.statuses_path)] == [301, 200]


# ------------------------------------------------------------------ answers are parsed, never trusted


def _opened(hub):
    forge = hub.make()
    return forge, forge.create_draft("agent/fix-shape01", "main", "t", "b")


@pytest.mark.parametrize("answer,needle", [
    ({"raw": HTML}, "not JSON (text/html"),
    ({"body": [{"number": 1}]}, "expected an object, got a list"),
    ({"body": {"message": "ok"}}, "is missing"),
    ({"body": {"number": "1", "iid": "1", "state": "open"}}, "expected an integer"),
])
def test_an_answer_of_the_wrong_shape_is_a_one_line_transient_forge_error(hub, answer, needle):
    forge, pr = _opened(hub)
    hub.inject("GET", hub.pr_path, 200, **answer)
    with pytest.raises(ForgeBadAnswer) as exc:
        forge.state(pr.number)
    msg = one_line(exc, hub)
    assert needle in msg and f"/{pr.number}" in msg and "retried on the next scan" in msg
    assert isinstance(exc.value, ForgeTransient)           # waits for the next scan, like a 5xx
    assert forge.state(pr.number).number == pr.number       # and the next call reads it fine


def test_a_list_answer_that_is_an_object_is_refused(hub):
    forge = hub.make()
    hub.inject("GET", hub.statuses_path, 200, body={"statuses": []})
    with pytest.raises(ForgeBadAnswer) as exc:
        forge.ci_results(SHA)
    assert "expected a list, got an object" in one_line(exc, hub)


def test_html_answers_never_stop_a_follow_up_pass(hub, ledger, tmp_path):
    """`watch pr-merged` over two PRs: a proxy's HTML page for the first is one item with an error; the second
    PR is still followed (it was merged), nothing raises."""
    from agent.config import parse_config
    from agent.followup import follow_prs

    forge = hub.make()
    config = parse_config({"repos": {REPO: {"url": str(tmp_path / "r.git"), "forge": hub.name}}})
    numbers = []
    for i in (1, 2):
        task_id, _ = create_task(ledger, REPO, f"fix {i}", branch=f"agent/fix-pass0{i}")
        pr, _ = publish_pr(ledger, forge, task_id, f"agent/fix-pass0{i}", "main", "t", "b", SHA)
        numbers.append(pr.number)
    hub.inject("GET", rf"/(pulls|merge_requests)/{numbers[0]}(\?|$)", 200, raw=HTML)
    items = follow_prs(ledger, config, tmp_path, forge_factory=lambda *a: forge, prune=lambda *a, **k: False)
    by_number = {i["number"]: i for i in items}
    assert "not JSON" in by_number[numbers[0]]["error"] and "\n" not in by_number[numbers[0]]["line"]
    assert by_number[numbers[1]]["state"] == "open" and "error" not in by_number[numbers[1]]


@pytest.mark.parametrize("name", ["github", "gitlab", "gitea"])
def test_forges_timeout_from_config_bounds_every_call(name, tmp_path, monkeypatch):
    import time

    from agent.config import parse_config
    from agent.forge import get_forge

    def slow(*a):
        time.sleep(1.0)
        return 200, {}, {}

    with LocalServer(slow) as srv:
        cfg = parse_config({"repos": {REPO: {"url": "x", "forge": name}}, name: {"api_url": srv.url},
                            "forges": {"timeout": {"connect": 2, "read": 0.2}}})
        monkeypatch.setenv(f"{name.upper()}_TOKEN", TOKENS[name])
        forge = get_forge(cfg.repos[REPO], cfg, tmp_path)
        assert forge.api.timeout == (2.0, 0.2)
        forge.api.sleep = lambda s: None                    # the backoff between retries is not under test
        with pytest.raises(ForgeTransient, match="timed out"):
            forge.state(1)
        assert len(srv.requests) == forge.api.retries + 1
