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
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import requests

from agent.forge import ForgeError, publish_pr
from agent.forge.github import GithubForge

from agent.tasks import create_task

ROOT = Path(__file__).resolve().parent.parent
SIM_DIR = Path(os.environ.get("AGENT_GITHUB_SIM_DIR", ROOT / ".cache" / "github-sim"))
SERVER = ROOT / "tests" / "github_sim" / "server.mjs"
REPO = "acme/widgets"


class Sim:
    def __init__(self, url: str):
        self.url = url

    def state(self) -> dict:
        return requests.get(f"{self.url}/_sim/state", timeout=10).json()

    def pulls(self, head: str | None = None) -> list[dict]:
        return [p for p in self.state()["pulls"] if head is None or p["head"] == head]

    def set_state(self, number: int, **values) -> None:
        r = requests.post(f"{self.url}/_sim/pulls/{REPO}/{number}/state", json=values, timeout=10)
        assert r.status_code == 200, r.text

    def raw_create(self, head: str, draft: bool = True) -> dict:
        r = requests.post(f"{self.url}/repos/{REPO}/pulls", timeout=10,
                          json={"title": "by hand", "head": head, "base": "main", "body": "x", "draft": draft})
        assert r.status_code == 201, r.text
        return r.json()


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    pkg = SIM_DIR / "node_modules" / "@simulacrum" / "github-api-simulator" / "package.json"
    if shutil.which("node") is None:
        pytest.skip("node is not installed: the GitHub API simulator needs node 20+")
    if not pkg.exists():
        pytest.skip(f"GitHub API simulator not installed in {SIM_DIR}: run `bash scripts/ci-forge` (needs npm)")
    log = tmp_path_factory.mktemp("sim") / "sim.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(["node", str(SERVER)], env={**os.environ, "GITHUB_SIM_DIR": str(SIM_DIR)},
                                stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        line = ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if line.startswith("LISTENING") or not line and proc.poll() is not None:
                break
        if not line.startswith("LISTENING"):
            pytest.fail(f"simulator did not start: {line!r}; log:\n{log.read_text()[-2000:]}")
        url = f"http://127.0.0.1:{int(line.split()[1])}"
        yield Sim(url)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


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


def test_merged_and_closed_states_read_back(sim, forge):
    a = forge.create_draft("agent/fix-merge01", "main", "t", "b")
    b = forge.create_draft("agent/fix-close01", "main", "t", "b")
    sim.set_state(a.number, merged=True)
    sim.set_state(b.number, state="closed")
    assert forge.state(a.number).state == "merged"
    assert forge.state(b.number).state == "closed"
    assert forge.find_pr_by_head("agent/fix-merge01").state == "merged"


def test_422_already_exists_adopts_only_open_draft_on_our_branch(sim, forge):
    mine = sim.raw_create("agent/fix-adopt001", draft=True)
    pr = forge.create_draft("agent/fix-adopt001", "main", "our title", "our body")
    assert pr.number == mine["number"] and pr.title == "our title" and pr.body == "our body"
    assert len(sim.pulls("agent/fix-adopt001")) == 1

    sim.raw_create("agent/fix-ready001", draft=False)
    with pytest.raises(ForgeError) as exc:
        forge.create_draft("agent/fix-ready001", "main", "t", "b")
    msg = str(exc.value)
    assert "not a draft" in msg and "refusing to adopt" in msg and "\n" not in msg
    assert len(sim.pulls("agent/fix-ready001")) == 1


def test_find_prefers_the_open_pr_and_pagination_follows_link(sim, forge):
    first = forge.create_draft("agent/fix-again001", "main", "t", "b")
    sim.set_state(first.number, state="closed")
    second = forge.create_draft("agent/fix-again001", "main", "t2", "b2")
    assert second.number != first.number
    assert forge.find_pr_by_head("agent/fix-again001").number == second.number

    everything = forge._paginate(f"/repos/{REPO}/pulls", {"state": "all", "per_page": 2}, "listing all")
    assert len(everything) == len(sim.pulls()) >= 3
    assert len({p["number"] for p in everything}) == len(everything)


CRASH_CHILD = textwrap.dedent("""
    import os, sys
    import agent.forge as f
    from agent.forge.github import GithubForge
    from agent.ledger import Ledger
    def crash(*a, **k):
        os._exit(9)            # the process dies after the forge call, before the ledger write
    f.record_pr = crash
    ledger = Ledger.open(sys.argv[1])
    forge = GithubForge("acme/widgets", api_url=sys.argv[2], token="t")
    f.publish_pr(ledger, forge, int(sys.argv[3]), "agent/fix-crash001", "main", "title", "body", "c" * 40)
    print("not reached")
""")


def test_crash_between_create_and_ledger_write_never_makes_a_second_pr(sim, forge, ledger, home):
    task_id, _ = create_task(ledger, REPO, "fix it", branch="agent/fix-crash001")
    child = subprocess.run([sys.executable, "-c", CRASH_CHILD, str(ledger.path), sim.url, str(task_id)],
                           capture_output=True, text=True, timeout=60)
    assert child.returncode == 9, child.stderr
    assert len(sim.pulls("agent/fix-crash001")) == 1          # the create happened
    assert ledger.one("SELECT * FROM prs WHERE task_id = ?", (task_id,)) is None  # the record did not

    pr, action = publish_pr(ledger, forge, task_id, "agent/fix-crash001", "main", "title", "body", "c" * 40)
    assert action == "adopted"
    assert len(sim.pulls("agent/fix-crash001")) == 1          # still exactly one PR
    row = ledger.one("SELECT * FROM prs WHERE task_id = ?", (task_id,))
    assert row["number"] == pr.number and row["forge"] == "github" and row["state"] == "open"
    assert row["head_sha"] == "c" * 40 and row["draft"] == 1

    # the next round: same PR, new body
    pr2, action2 = publish_pr(ledger, forge, task_id, "agent/fix-crash001", "main", "title", "body v2", "d" * 40)
    assert (pr2.number, action2) == (pr.number, "updated")
    assert sim.pulls("agent/fix-crash001")[0]["body"] == "body v2"
    kinds = [e["kind"] for e in ledger.events(task_id=task_id)]
    assert kinds.count("pr.adopted") == 1 and kinds.count("pr.updated") == 1
    pr3, action3 = publish_pr(ledger, forge, task_id, "agent/fix-crash001", "main", "title", "body v2", "d" * 40)
    assert action3 == "unchanged" and len(sim.pulls("agent/fix-crash001")) == 1


def test_publish_refuses_a_closed_pr_found_by_head(sim, forge, ledger, home):
    task_id, _ = create_task(ledger, REPO, "fix it", branch="agent/fix-closed01")
    old = sim.raw_create("agent/fix-closed01")
    sim.set_state(old["number"], state="closed")
    with pytest.raises(ForgeError, match="it is closed"):
        publish_pr(ledger, forge, task_id, "agent/fix-closed01", "main", "t", "b", "e" * 40)
    assert ledger.one("SELECT * FROM prs WHERE task_id = ?", (task_id,)) is None
    assert len(sim.pulls("agent/fix-closed01")) == 1

