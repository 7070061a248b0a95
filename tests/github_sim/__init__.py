"""The GitHub REST simulator (server.mjs: @simulacrum/github-api-simulator plus our stateful handlers) started
on 127.0.0.1 for a test module, and ``Sim``: the test's side of it (state, the human side, test-only routes)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests

ROOT = Path(__file__).resolve().parent.parent.parent
SIM_DIR = Path(os.environ.get("AGENT_GITHUB_SIM_DIR", ROOT / ".cache" / "github-sim"))
SERVER = Path(__file__).resolve().parent / "server.mjs"
REPO = "acme/widgets"


class Sim:
    def __init__(self, url: str, repo: str = REPO):
        self.url = url
        self.repo = repo

    def state(self) -> dict:
        return requests.get(f"{self.url}/_sim/state", timeout=10).json()

    def pulls(self, head: str | None = None) -> list[dict]:
        return [p for p in self.state()["pulls"] if head is None or p["head"] == head]

    def set_state(self, number: int, **values) -> None:
        r = requests.post(f"{self.url}/_sim/pulls/{REPO}/{number}/state", json=values, timeout=10)
        assert r.status_code == 200, r.text

    def as_user(self, login: str) -> dict:
        return {"Authorization": f"Bearer user-{login}"}

    def collaborator(self, login: str, permission: str = "write") -> None:
        r = requests.post(f"{self.url}/_sim/collaborators", json={"login": login, "permission": permission},
                          timeout=10)
        assert r.status_code == 200, r.text

    def review(self, number: int, login: str, event: str, body: str = "", comments: list[dict] = ()) -> dict:
        r = requests.post(f"{self.url}/repos/{self.repo}/pulls/{number}/reviews", headers=self.as_user(login),
                          json={"event": event, "body": body, "comments": list(comments)}, timeout=10)
        assert r.status_code == 200, r.text
        return r.json()

    def comment(self, number: int, login: str, body: str) -> dict:
        r = requests.post(f"{self.url}/repos/{self.repo}/issues/{number}/comments", headers=self.as_user(login),
                          json={"body": body}, timeout=10)
        assert r.status_code == 201, r.text
        return r.json()

    def status(self, sha: str, state: str, context: str, description: str = "", target_url: str | None = None):
        payload = {"state": state, "context": context, "description": description}
        if target_url:
            payload["target_url"] = target_url
        r = requests.post(f"{self.url}/repos/{self.repo}/statuses/{sha}", json=payload, timeout=10)
        assert r.status_code == 201, r.text

    def check_run(self, sha: str, name: str, conclusion: str | None, title: str = "", summary: str = "",
                  details_url: str | None = None) -> dict:
        payload = {"name": name, "head_sha": sha, "status": "completed" if conclusion else "in_progress",
                   "output": {"title": title or name, "summary": summary or "-"}}
        if conclusion:
            payload["conclusion"] = conclusion
        if details_url:
            payload["details_url"] = details_url
        r = requests.post(f"{self.url}/repos/{self.repo}/check-runs", json=payload, timeout=10)
        assert r.status_code == 201, r.text
        return r.json()

    def comments_on(self, number: int) -> list[tuple[str, str]]:
        st = self.state()
        k = f"{self.repo}#{number}"
        return list(zip(st["comment_authors"].get(k, []), st["comments"].get(k, [])))

    def raw_create(self, head: str, draft: bool = True) -> dict:
        r = requests.post(f"{self.url}/repos/{REPO}/pulls", timeout=10,
                          json={"title": "by hand", "head": head, "base": "main", "body": "x", "draft": draft})
        assert r.status_code == 201, r.text
        return r.json()



@contextmanager
def running(log_dir: Path):
    """Start the simulator (skips when node or the npm package is missing: `bash scripts/ci-forge`)."""
    pkg = SIM_DIR / "node_modules" / "@simulacrum" / "github-api-simulator" / "package.json"
    if shutil.which("node") is None:
        pytest.skip("node is not installed: the GitHub API simulator needs node 20+")
    if not pkg.exists():
        pytest.skip(f"GitHub API simulator not installed in {SIM_DIR}: run `bash scripts/ci-forge` (needs npm)")
    log = log_dir / "sim.log"
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
        yield Sim(f"http://127.0.0.1:{int(line.split()[1])}")
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
