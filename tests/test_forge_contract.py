"""The forge contract: what every hosted forge must do, as one suite run over the GitHub, GitLab and Gitea simulators.

Each ``Harness`` gives the same handles on its simulator: ``make()`` (a forge pointed at it, with an injected clock),
``inject(...)`` (answer the next matching request with a chosen status, headers and body, JSON or not) and
``calls(...)`` (what reached the forge's origin).  GitHub's simulator (node, tests/github_sim) sits behind
tests/fault_proxy.py for the injections; GitLab's and Gitea's (tests/forge_sim) inject themselves.  A second
server on another port of 127.0.0.1 (another origin) plays the host a hostile answer points to and records
anything that reaches it.  Forge-specific behaviour stays in tests/test_forge_{github_sim,github_errors,gitlab,gitea}.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest
import requests

from agent.flows.pr_thread import publish_pr
from agent.forge import ForgeAuthError, ForgeBadAnswer, ForgeError, ForgeRateLimited, ForgeTransient
from agent.ledger import eventlog
from agent.ledger.tasks import create_task
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

    create_path = r"/(pulls|merge_requests)(\?|$)"           # creating a PR / MR (POST)
    comment_path = r"/(comments|notes)(\?|$)"                 # a conversation comment (POST)
    word = {"github": "GitHub", "gitlab": "GitLab", "gitea": "Gitea"}

    def make(self, token: str | None = None, **kw):
        from agent.forge import forge_class

        kw = {"retries": 1, "timeout": (2.0, 10.0), **kw}
        return forge_class(self.name)(REPO, api_url=self.url, token=token or self.token, sleep=self.clock.sleep,
                                      clock=self.clock, **kw)

    def by_hand(self, head: str, draft: bool) -> int:
        """A PR opened by a person on ``head`` (a draft or not); its number."""
        raise NotImplementedError

    def finish(self, number: int, merged: bool) -> None:
        raise NotImplementedError

    def count(self, head: str) -> int:
        """How many PRs the forge has on ``head``."""
        raise NotImplementedError

    def mark(self) -> int:
        return len(self.log())

    def since(self, mark: int) -> list[tuple[str, int]]:
        """(method, status) of every request that reached the forge after ``mark``; status -1: answer dropped."""
        return self.log()[mark:]

    def log(self) -> list[tuple[str, int]]:
        raise NotImplementedError

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

    def by_hand(self, head, draft):
        return self.sim.raw_create(head, draft=draft)["number"]

    def finish(self, number, merged):
        self.sim.set_state(number, **({"merged": True} if merged else {"state": "closed"}))

    def count(self, head):
        return len(self.sim.pulls(head))

    def log(self):
        return [(m, st) for m, _p, st in self.proxy.calls]

    def inject_kind(self, method, path_re, kind, delay=0.0):
        self.proxy.faults.append(Fault(method, path_re, 0, kind=kind, delay=delay, times=1))


class SimHarness(Harness):
    def __init__(self, sim, clock):
        super().__init__(sim.url, clock)
        self.sim = sim

    def inject(self, method, path_re, status, headers=None, body=None, raw=None, times=1):
        self.sim.fault(method, path_re, status=status, headers=headers or {},
                       body={"message": "x"} if body is None else body, raw=raw, times=times)

    def calls(self, method, path_re):
        return [{"path": c.path, "status": c.status} for c in self.sim.calls_to(method, path_re)]

    def log(self):
        return [(c.method, c.status) for c in self.sim.calls]

    def inject_kind(self, method, path_re, kind, delay=0.0):
        self.sim.fault(method, path_re, kind=kind, delay=delay, times=1)

    def finish(self, number, merged):
        (self.sim.merge if merged else self.sim.close)(REPO, number)


class GitlabHarness(SimHarness):
    name = "gitlab"

    def by_hand(self, head, draft):
        r = requests.post(f"{self.url}/projects/acme%2Fwidgets/merge_requests", headers={"PRIVATE-TOKEN": self.token},
                          json={"title": ("Draft: " if draft else "") + "by hand", "source_branch": head,
                                "target_branch": "main"}, timeout=10)
        assert r.status_code == 201, r.text
        return r.json()["iid"]

    def count(self, head):
        return len(self.sim.mrs(REPO, head))

    def statuses_url(self, sha):
        return f"{self.url}/projects/acme%2Fwidgets/repository/commits/{sha}/statuses?per_page=100"


class GiteaHarness(SimHarness):
    name = "gitea"

    def by_hand(self, head, draft):
        r = requests.post(f"{self.url}/repos/{REPO}/pulls", headers={"Authorization": f"token {self.token}"},
                          json={"title": ("WIP: " if draft else "") + "by hand", "head": head, "base": "main"},
                          timeout=10)
        assert r.status_code == 201, r.text
        return r.json()["number"]

    def count(self, head):
        return len(self.sim.pulls(REPO, head))

    def statuses_url(self, sha):
        return f"{self.url}/repos/{REPO}/statuses/{sha}?limit=50"


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
    answered = [c["status"] for c in hub.calls("GET", hub.statuses_path) if c["status"] is not None]
    assert answered[0] == 301 and answered[-1] == 200


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
    from agent.flows.followup import follow_prs

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


# ------------------------------------------------------------------ the PR life cycle every forge keeps


def test_merged_and_closed_are_told_apart(hub):
    forge = hub.make()
    a = forge.create_draft("agent/fix-merge01", "main", "t", "b")
    b = forge.create_draft("agent/fix-close01", "main", "t", "b")
    hub.finish(a.number, merged=True)
    hub.finish(b.number, merged=False)
    assert (forge.state(a.number).state, forge.state(b.number).state) == ("merged", "closed")
    assert forge.find_pr_by_head("agent/fix-merge01").state == "merged"


def test_an_existing_pr_is_adopted_only_when_it_is_an_open_draft_on_our_branch(hub):
    forge = hub.make()
    mine = hub.by_hand("agent/fix-adopt01", draft=True)
    pr = forge.create_draft("agent/fix-adopt01", "main", "our title", "our body")   # "it exists" (409 / 422)
    assert (pr.number, pr.title, pr.body, pr.draft) == (mine, "our title", "our body", True)
    assert hub.count("agent/fix-adopt01") == 1
    hub.by_hand("agent/fix-ready01", draft=False)
    with pytest.raises(ForgeError) as exc:
        forge.create_draft("agent/fix-ready01", "main", "t", "b")
    msg = one_line(exc, hub)
    assert "not a draft" in msg and "refusing to adopt" in msg and hub.count("agent/fix-ready01") == 1


def test_a_refused_token_is_one_line_and_never_retried(hub):
    forge = hub.make(token="ghs_wrong" + "s3cr3t")     # (the GitHub simulator refuses unknown ghs_ tokens)
    mark = hub.mark()
    with pytest.raises(ForgeAuthError) as exc:
        forge.state(1)
    assert "token was refused (401)" in one_line(exc, hub)
    assert len(hub.since(mark)) == 1 and hub.clock.sleeps == []


def test_5xx_is_retried_for_reads_then_a_transient_error(hub):
    forge = hub.make(retries=2)
    pr = forge.create_draft("agent/fix-5xx01", "main", "t", "b")
    hub.inject("GET", hub.pr_path, 502)
    assert forge.state(pr.number).number == pr.number and hub.clock.sleeps == [1.0]
    hub.clock.sleeps.clear()
    hub.inject("GET", hub.pr_path, 503, times=3)
    with pytest.raises(ForgeTransient) as exc:
        forge.state(pr.number)
    assert "503" in one_line(exc, hub) and hub.clock.sleeps == [1.0, 2.0]


def test_5xx_on_create_looks_up_before_creating_again(hub):
    forge = hub.make()
    mark = hub.mark()
    hub.inject("POST", hub.create_path, 500)
    pr = forge.create_draft("agent/fix-c5xx01", "main", "t", "b")
    assert pr.draft and hub.count("agent/fix-c5xx01") == 1
    calls = hub.since(mark)
    assert [m for m, _ in calls] == ["POST", "GET", "POST"] and (calls[0][1], calls[-1][1]) == (500, 201)


def test_a_dropped_answer_after_the_create_is_adopted_never_duplicated(hub):
    forge = hub.make()
    mark = hub.mark()
    hub.inject_kind("POST", hub.create_path, "drop")
    pr = forge.create_draft("agent/fix-drop01", "main", "t", "b")
    assert pr.draft and hub.count("agent/fix-drop01") == 1         # created once, the answer lost, then found
    assert [m for m, _ in hub.since(mark)] == ["POST", "GET"]


def test_timeouts_are_retried_only_for_idempotent_calls(hub):
    pr = hub.make().create_draft("agent/fix-slow01", "main", "t", "b")   # set up with the default timeouts
    forge = hub.make(timeout=(2.0, 1.0))
    hub.inject_kind("GET", hub.pr_path, "delay", delay=2.0)          # past the read timeout of 1 s
    assert forge.state(pr.number).number == pr.number and hub.clock.sleeps == [1.0]
    mark = hub.mark()
    hub.inject_kind("POST", hub.comment_path, "delay", delay=2.0)
    with pytest.raises(ForgeTransient) as exc:
        forge.comment(pr.number, "hello")
    assert "timed out" in one_line(exc, hub)
    assert [m for m, _ in hub.since(mark)] == ["POST"]              # a comment is never posted twice


def test_429_retry_after_is_honoured_and_bounded(hub):
    forge = hub.make(retries=2)
    pr = forge.create_draft("agent/fix-429a01", "main", "t", "b")
    hub.inject("GET", hub.pr_path, 429, headers={"Retry-After": "7"}, times=2)
    assert forge.state(pr.number).number == pr.number and hub.clock.sleeps == [7.0, 7.0]
    hub.clock.sleeps.clear()
    hub.inject("GET", hub.pr_path, 429, headers={"Retry-After": "900"})
    with pytest.raises(ForgeRateLimited) as exc:
        forge.state(pr.number)
    assert f"{hub.word[hub.name]} allows the next call in 900s" in one_line(exc, hub) and hub.clock.sleeps == []


CRASH_CHILD = textwrap.dedent("""
    import os, sys
    import agent.forge as f
    import agent.flows.pr_thread as thread
    def crash(*a, **k):
        os._exit(9)            # the process dies after the forge call, before the ledger write
    thread.record_pr = crash
    from agent.ledger import Ledger
    ledger = Ledger.open(sys.argv[1])
    forge = f.forge_class(sys.argv[5])("acme/widgets", api_url=sys.argv[2], token=sys.argv[4])
    thread.publish_pr(ledger, forge, int(sys.argv[3]), "agent/fix-crash002", "main", "title", "body", "c" * 40)
""")


def test_a_crash_between_create_and_ledger_write_never_makes_a_second_pr(hub, ledger):
    forge = hub.make()
    task_id, _ = create_task(ledger, REPO, "fix it", branch="agent/fix-crash002")
    child = subprocess.run([sys.executable, "-c", CRASH_CHILD, str(ledger.path), hub.url, str(task_id), hub.token,
                            hub.name], capture_output=True, text=True, timeout=60)
    assert child.returncode == 9, child.stderr
    assert hub.count("agent/fix-crash002") == 1 and ledger.one("SELECT * FROM prs WHERE task_id = ?", (task_id,)) is None
    pr, action = publish_pr(ledger, forge, task_id, "agent/fix-crash002", "main", "title", "body", "c" * 40)
    assert action == "adopted" and hub.count("agent/fix-crash002") == 1
    row = ledger.one("SELECT * FROM prs WHERE task_id = ?", (task_id,))
    assert (row["forge"], row["number"], row["state"], row["draft"]) == (hub.name, pr.number, "open", 1)
    pr2, action2 = publish_pr(ledger, forge, task_id, "agent/fix-crash002", "main", "title", "body v2", "d" * 40)
    assert (pr2.number, action2) == (pr.number, "updated") and forge.state(pr.number).body == "body v2"
    kinds = [e["kind"] for e in eventlog.events(ledger, task_id=task_id)]
    assert kinds.count("pr.adopted") == 1 and kinds.count("pr.updated") == 1
