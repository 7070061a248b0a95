"""`agent doctor`: a healthy demo home, and broken ones, each problem named with its fix.

Everything is real: the demo's project, bare remote and scripted lanes (real scripts), real ledger files, a real
`git`, and a real HTTP server on 127.0.0.1 standing in for the GitHub API (GET /user).  Nothing is mocked.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from agent.config import load_config
from agent.app.demo import make_project, write_config
from agent.app.doctor import (MIN_GIT, check_disk, check_git, check_github, check_ledger, check_vendor_auth,
                          parse_git_version, run_doctor)
from agent.ledger import Ledger, ledger_path
from conftest import on_postgres


@pytest.fixture
def demo_home(tmp_path):
    """A demo-shaped home: real project, local bare remote, config with real scripted lanes, a ledger."""
    _, remote = make_project(tmp_path)
    playbook = tmp_path / "playbook.json"
    playbook.write_text('{"groups": []}')
    home = tmp_path / "home"
    write_config(home, remote, playbook)
    Ledger.open(ledger_path(home)).close()
    return home


def edit_config(home: Path, fn) -> None:
    path = home / "config.yaml"
    data = yaml.safe_load(path.read_text())
    fn(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def doctor(home: Path, **kw) -> dict:
    kw.setdefault("environ", dict(os.environ))
    return run_doctor(home, home / "config.yaml", **kw)


def by_name(result: dict) -> dict:
    return {c["name"]: c for c in result["checks"]}


def problems(result: dict) -> dict:
    return {c["name"]: c for c in result["checks"] if not c["ok"]}


def test_healthy_demo_home(demo_home):
    result = doctor(demo_home)
    assert result["ok"], problems(result)
    checks = by_name(result)
    assert {"git", "ledger", "config", "disk", "remote demo/widgets"} <= set(checks)
    assert "lane demo-implementer (implementer)" in checks
    assert "lane demo-reviewer (pr-logic, pr-quality, reviewer)" in checks
    assert {"auth demo-implementer", "auth demo-reviewer"} <= set(checks)
    if on_postgres():
        assert "PostgreSQL" in checks["ledger"]["detail"] and "schema" in checks["ledger"]["detail"]
    else:
        assert "WAL" in checks["ledger"]["detail"] and "integrity ok" in checks["ledger"]["detail"]
    assert "reachable, main at" in checks["remote demo/widgets"]["detail"]
    assert all(c["fix"] is None for c in result["checks"])


def test_cli_json_and_exit_codes(demo_home, agent):
    agent.home = demo_home
    ok = agent("doctor", "--json")
    assert ok.exit_code == 0, ok.output
    doc = json.loads(ok.stdout)
    assert doc["ok"] is True
    assert all(set(c) == {"name", "ok", "detail", "fix", "warn"} for c in doc["checks"])

    edit_config(demo_home, lambda d: d["repos"]["demo/widgets"].update(url=str(demo_home / "gone.git")))
    bad = agent("doctor")
    assert bad.exit_code == 1
    assert "FAIL  remote demo/widgets" in bad.stdout and "fix: check repos.demo/widgets.url" in bad.stdout
    assert "1 problem(s): remote demo/widgets" in bad.stdout
    bad_json = agent("doctor", "--json")
    assert bad_json.exit_code == 1 and json.loads(bad_json.stdout)["ok"] is False


def test_missing_lane_binary(demo_home):
    edit_config(demo_home, lambda d: d["vendors"]["demo-implementer"].update(bin="no-such-agent-cli"))
    bad = problems(doctor(demo_home))
    check = bad["lane demo-implementer (implementer)"]
    assert "no-such-agent-cli: not found on the lane's PATH" in check["detail"]
    assert "vendors.demo-implementer.bin" in check["fix"]
    assert list(bad) == ["lane demo-implementer (implementer)"]


def test_missing_vendor_key_env(demo_home):
    edit_config(demo_home, lambda d: d["vendors"]["demo-implementer"].update(env=["DEMO_AGENT_KEY", "DEMO_URL"]))
    env = {k: v for k, v in os.environ.items() if k != "DEMO_AGENT_KEY"}
    check = problems(doctor(demo_home, environ=env))["auth demo-implementer"]
    assert "DEMO_AGENT_KEY named under vendors.demo-implementer.env but not set" in check["detail"]
    assert check["fix"].startswith("export DEMO_AGENT_KEY=")
    # present -> ok, and the detail says it is presence only (never claims the key is valid)
    good = by_name(doctor(demo_home, environ={**env, "DEMO_AGENT_KEY": "k"}))["auth demo-implementer"]
    assert good["ok"] and "DEMO_AGENT_KEY set" in good["detail"] and "presence only" in good["detail"]


def test_builtin_vendor_auth_probe(tmp_path):
    """A key set in our environment but not allowlisted for the lane is a problem; a login file is enough."""
    cfg = tmp_path / "config.yaml"
    cfg.write_text("lanes: {implementer: {vendor: claude}}\n")
    config = load_config(cfg)
    user_home = tmp_path / "user"
    user_home.mkdir()
    hidden = check_vendor_auth(config, "claude", {"ANTHROPIC_API_KEY": "sk-x", "HOME": str(user_home)})
    assert not hidden.ok and "not named under vendors.claude.env" in hidden.detail
    assert hidden.fix == "add ANTHROPIC_API_KEY to vendors.claude.env in config.yaml"
    nothing = check_vendor_auth(config, "claude", {"HOME": str(user_home)})
    assert not nothing.ok and "claude" in nothing.fix and "ANTHROPIC_API_KEY" in nothing.fix
    (user_home / ".claude").mkdir()
    (user_home / ".claude" / ".credentials.json").write_text("{}")
    login = check_vendor_auth(config, "claude", {"HOME": str(user_home)})
    assert login.ok and ".credentials.json" in login.detail and "presence only" in login.detail


@pytest.mark.sqlite_only("a garbage ledger.db file")
def test_corrupt_ledger_garbage(demo_home):
    (demo_home / "ledger.db").write_bytes(b"this is not sqlite at all" * 200)
    check = problems(doctor(demo_home))["ledger"]
    assert "not a readable SQLite ledger" in check["detail"] or "cannot open" in check["detail"]
    assert "move" in check["fix"] and "aside" in check["fix"]


@pytest.mark.sqlite_only("corrupt SQLite pages")
def test_corrupt_ledger_pages(demo_home):
    """A valid header with damaged table pages: integrity_check (or reading) must fail."""
    path = demo_home / "ledger.db"
    led = Ledger.open(path)
    with led.tx() as c:
        for i in range(400):
            c.execute("INSERT INTO events (ts, kind, actor, payload) VALUES (?, 'x', 'script', ?)",
                      (f"2026-01-01T00:00:{i:02d}Z", "p" * 200))
    led.close()
    data = bytearray(path.read_bytes())
    page = sqlite3.connect(path).execute("PRAGMA page_size").fetchone()[0]
    for start in range(3 * page, len(data) - page, 2 * page):   # scribble over every other page after the schema
        data[start + 8:start + 200] = os.urandom(192)
    path.write_bytes(bytes(data))
    check = check_ledger(demo_home)
    assert not check.ok
    assert "integrity_check failed" in check.detail or "malformed" in check.detail
    assert "restore a backup" in check.fix


@pytest.mark.sqlite_only("no ledger.db file yet; test_ledger_pg has the PostgreSQL database without a ledger")
def test_no_ledger_is_not_created(tmp_path):
    home = tmp_path / "fresh"
    result = run_doctor(home, home / "config.yaml", environ={})
    assert problems(result)["ledger"]["fix"] == "run `agent init` to create the home and ledger"
    assert not home.exists()


@pytest.mark.sqlite_only("a foreign SQLite file")
def test_foreign_sqlite_file(tmp_path):
    home = tmp_path / "h"
    home.mkdir()
    sqlite3.connect(home / "ledger.db").execute("CREATE TABLE t (x)").connection.commit()
    check = check_ledger(home)
    assert not check.ok and "not an agent ledger" in check.detail


def test_bad_config(demo_home):
    (demo_home / "config.yaml").write_text("limits:\n  round_cap: five\n")
    result = doctor(demo_home)
    bad = problems(result)
    assert list(bad) == ["config"]
    assert "limits.round_cap" in bad["config"]["detail"] and "config.yaml" in bad["config"]["fix"]
    assert not any(n.startswith(("lane ", "auth ", "remote ")) for n in by_name(result))


def test_missing_roles(demo_home):
    edit_config(demo_home, lambda d: (d["lanes"].pop("pr-logic"), d["lanes"].pop("reviewer")))
    check = problems(doctor(demo_home))["lanes"]
    assert "pr-logic" in check["detail"] and "reviewer" in check["detail"]
    assert "lanes.reviewer: {vendor: NAME}" in check["fix"]


def test_unreachable_remote(demo_home):
    edit_config(demo_home, lambda d: d["repos"]["demo/widgets"].update(url=str(demo_home / "nowhere.git")))
    check = problems(doctor(demo_home))["remote demo/widgets"]
    assert "nowhere.git" in check["detail"]
    assert check["fix"].startswith("check repos.demo/widgets.url") and "git ls-remote" in check["fix"]


def test_remote_without_base_branch(demo_home):
    edit_config(demo_home, lambda d: d["repos"]["demo/widgets"].update(base="trunk"))
    check = problems(doctor(demo_home))["remote demo/widgets"]
    assert "no branch 'trunk'" in check["detail"] and "repos.demo/widgets.base" in check["fix"]


def test_old_git_is_named(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "git"
    fake.write_text("#!/bin/sh\necho 'git version 2.20.1'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    check = check_git()
    assert not check.ok and "2.20.1 is older than 2.25" in check.detail and "install git >= 2.25" in check.fix
    assert parse_git_version("git version 2.39.5") == (2, 39, 5) and (2, 39) >= MIN_GIT


def test_low_disk(tmp_path):
    check = check_disk(tmp_path, min_free=1 << 60)
    assert not check.ok and "GiB free" in check.detail and "AGENT_HOME" in check.fix
    assert check_disk(tmp_path / "not" / "yet", min_free=1).ok


# ---------------------------------------------------------------------------------------------- GitHub


class _User(BaseHTTPRequestHandler):
    def do_GET(self):
        self.server.seen.append((self.path, self.headers.get("Authorization")))
        if self.path == "/api/v3/user" and self.headers.get("Authorization") == "Bearer good-token":
            body, code = {"login": "octo-bot"}, 200
        else:
            body, code = {"message": "Bad credentials"}, 401
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass


@pytest.fixture
def github_api():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _User)
    server.seen = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def github_config(tmp_path, server, remote: Path):
    cfg = tmp_path / "gh.yaml"
    cfg.write_text(yaml.safe_dump({
        "repos": {"acme/widgets": {"url": str(remote), "forge": "github"}},
        "github": {"api_url": f"http://127.0.0.1:{server.server_address[1]}/api/v3", "token_env": "ACME_GH"}}))
    return load_config(cfg)


def test_github_token_200_and_401(tmp_path, github_api):
    _, remote = make_project(tmp_path)
    config = github_config(tmp_path, github_api, remote)
    repo = config.repos["acme/widgets"]

    ok = check_github(config, repo, online=True, environ={"ACME_GH": "good-token"})
    assert ok.ok and "octo-bot" in ok.detail
    assert github_api.seen[-1] == ("/api/v3/user", "Bearer good-token")

    refused = check_github(config, repo, online=True, environ={"ACME_GH": "stale-token"})
    assert not refused.ok and "401" in refused.detail and "stale-token" not in refused.detail
    assert "ACME_GH" in refused.fix

    offline = check_github(config, repo, online=False, environ={"ACME_GH": "good-token"})
    assert offline.ok and "--online" in offline.detail
    assert len(github_api.seen) == 2          # offline sends nothing

    none = check_github(config, repo, online=True, environ={})
    assert not none.ok and "no GitHub token" in none.detail and none.fix.startswith("export ACME_GH=")


def test_github_home_through_run_doctor(tmp_path, github_api):
    _, remote = make_project(tmp_path)
    config = github_config(tmp_path, github_api, remote)
    home = tmp_path / "home"
    home.mkdir()
    Ledger.open(ledger_path(home)).close()
    result = run_doctor(home, config.path, config_required=True, online=True, environ={"ACME_GH": "nope"})
    bad = problems(result)
    assert "forge acme/widgets (github)" in bad
    assert "lanes" in bad                       # a repo but no lanes: the fixer roles are named
    assert by_name(result)["remote acme/widgets"]["ok"]


# ---------------------------------------------------------------------------------------------- gitlab, gitea


@pytest.mark.parametrize("forge", ["gitlab", "gitea"])
def test_gitlab_and_gitea_credentials_access_and_remote(tmp_path, forge):
    """Offline: the token variable is named and set.  Online: GET /user, the token user's own access to the
    project (GitLab effective access level >= 30, Gitea write or more) and `git ls-remote`, against the forge
    simulators (tests/forge_sim), which check each call against the forge's API schema."""
    from forge_sim.gitea import GiteaSim
    from forge_sim.gitlab import GitlabSim

    _, remote = make_project(tmp_path)
    sim = GitlabSim(token="tok-doctor") if forge == "gitlab" else GiteaSim(token="tok-doctor")
    with sim:
        if forge == "gitlab":
            sim.add_project("acme/widgets", bot_access=30)
            sim.add_project("acme/readonly", bot_access=20)
        else:
            sim.add_repo("acme/widgets", bot_permission="write")
            sim.add_repo("acme/readonly", bot_permission="read")
        cfg_path = tmp_path / "config.yaml"
        cfg_path.write_text(yaml.safe_dump({
            "repos": {"acme/widgets": {"url": str(remote), "forge": forge},
                      "acme/readonly": {"url": str(remote), "forge": forge}},
            forge: {"api_url": sim.url, "token_env": "ACME_FORGE_TOKEN"}}))
        config = load_config(cfg_path)
        from agent.app.doctor import check_forges

        unset = check_forges(config, online=False, environ={})
        assert [c.ok for c in unset] == [False, False]
        assert "ACME_FORGE_TOKEN is not set" in unset[0].detail and unset[0].fix.startswith("export ACME_FORGE_TOKEN=")
        offline = check_forges(config, online=False, environ={"ACME_FORGE_TOKEN": "tok-doctor"})
        assert all(c.ok for c in offline) and sim.calls == []          # offline sends nothing

        online = {c.name: c for c in check_forges(config, online=True, environ={"ACME_FORGE_TOKEN": "tok-doctor"})}
        good, weak = online[f"forge acme/widgets ({forge})"], online[f"forge acme/readonly ({forge})"]
        assert good.ok and "token belongs to agent-bot" in good.detail
        assert not weak.ok and "too little to open a draft" in weak.detail and "agent-bot" in weak.fix
        assert online["remote acme/widgets"].ok
        assert all(c.headers.get("PRIVATE-TOKEN" if forge == "gitlab" else "Authorization", "").endswith("tok-doctor")
                   for c in sim.calls)

        refused = {c.name: c for c in check_forges(config, online=True, environ={"ACME_FORGE_TOKEN": "stale"})}
        bad = refused[f"forge acme/widgets ({forge})"]
        assert not bad.ok and "token was refused (401)" in bad.detail and "stale" not in bad.detail
        sim.assert_clean()


def test_doctor_on_a_home_with_no_repo_and_no_lane_is_not_healthy(agent):
    assert agent("init").exit_code == 0
    out = agent("doctor")
    last = out.stdout.rstrip().splitlines()[-1]
    assert "healthy" not in last and last.startswith("not set up yet: no repo and no lane role"), out.stdout
    assert "WARN  config:" in out.stdout and "add `repos:` and `lanes:`" in out.stdout


def test_a_git_error_names_the_problem_not_the_end_of_gits_advice(tmp_path):
    """A failed fetch ends with "Please make sure you have the correct access rights / and the repository
    exists."; the line kept is the one saying what failed (real git, a path with no repository)."""
    from agent.config import parse_config
    from agent.app.doctor import check_remote
    from agent.git.workspace import GitError, git

    gone = tmp_path / "gone.git"
    with pytest.raises(GitError) as err:
        git("ls-remote", str(gone), network=True)
    assert "does not appear to be a git repository" in str(err.value), str(err.value)
    assert "and the repository exists" not in str(err.value)
    repo = parse_config({"repos": {"acme/widgets": {"url": str(gone)}}}).repos["acme/widgets"]
    check = check_remote(repo)
    assert check.ok is False and "does not appear to be a git repository" in check.detail, check.detail


def test_doctor_warns_on_host_network(demo_home):
    """Issue 23: `sandbox.network: host` is allowed only explicitly and doctor says what it opens; the default
    (proxy) is a plain ok; `network: none` is ok and says what it means."""
    assert by_name(doctor(demo_home))["network"]["warn"] is False
    edit_config(demo_home, lambda d: d.update(sandbox={"network": "host"}))
    check = by_name(doctor(demo_home))["network"]
    assert check["ok"] and check["warn"] and "loopback" in check["detail"] and "network: host" in check["fix"]
    edit_config(demo_home, lambda d: d.update(sandbox={"network": "none"}))
    check = by_name(doctor(demo_home))["network"]
    assert check["ok"] and not check["warn"] and "no network" in check["detail"]


def test_doctor_names_a_base_url_the_egress_proxy_would_refuse(demo_home):
    """A vendor given a base URL (a *_BASE_URL variable in vendors.X.env) that its allowlist does not hold: its
    lanes could not reach their model through the proxy, so doctor says which entry to add."""
    def vendor(d, hosts):
        d["vendors"]["demo-implementer"]["env"] = ["ANTHROPIC_BASE_URL"]
        d["vendors"]["demo-implementer"]["hosts"] = hosts
    environ = {**os.environ, "ANTHROPIC_BASE_URL": "http://127.0.0.1:8089"}
    edit_config(demo_home, lambda d: vendor(d, []))
    check = by_name(doctor(demo_home, environ=environ))["network"]
    assert not check["ok"] and "127.0.0.1:8089" in check["detail"], check
    assert check["fix"] == 'add "127.0.0.1:8089" to vendors.demo-implementer.hosts in config.yaml'
    edit_config(demo_home, lambda d: vendor(d, ["127.0.0.1:8089"]))
    assert by_name(doctor(demo_home, environ=environ))["network"]["ok"]
