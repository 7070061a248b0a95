"""A GitHub App as the agent's identity, against the GitHub simulator (tests/github_sim/server.mjs).

The simulator checks the app's JWT for real (RS256 signature with the app's public key, ``iss``, ``exp``, ``iat``),
sells ``ghs_`` installation tokens that expire on its own clock (moved forward by the test, together with the
agent's injected clock) and cover only the repositories asked for, acts as ``<slug>[bot]`` for them, and logs every
credential it refuses.  The key pair is made here with ``cryptography``; nothing is mocked.
"""

from __future__ import annotations

import os
import time

import pytest
import requests

from agent.config import parse_config
from agent.forge import ForgeAuthError, get_forge
from agent.forge import github_app
from github_sim import Sim

REPO = "acme/widgets"
APP_ID, SLUG, INSTALLATION = 4242, "agent-fixer", 777
BOT = f"{SLUG}[bot]"
FULL = {"pull_requests": "write", "contents": "write", "checks": "read", "metadata": "read"}


def keypair() -> tuple[str, str]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    return private, public


class AppSim(Sim):
    def configure(self, public_key: str, permissions: dict = FULL, lifetime: int = 3600) -> None:
        r = requests.post(f"{self.url}/_sim/app", timeout=10, json={
            "id": APP_ID, "slug": SLUG, "public_key": public_key, "installation_id": INSTALLATION,
            "permissions": permissions, "lifetime": lifetime})
        assert r.status_code == 200, r.text

    def advance(self, seconds: float) -> None:
        assert requests.post(f"{self.url}/_sim/clock", json={"advance": seconds}, timeout=10).status_code == 200

    def log(self) -> dict:
        return requests.get(f"{self.url}/_sim/app", timeout=10).json()


@pytest.fixture(scope="module")
def keys():
    return keypair()


@pytest.fixture(scope="module")
def sim(github_node, keys):
    app_sim = AppSim(github_node.url)
    app_sim.configure(keys[1])
    return app_sim


class Clock:
    """The agent's clock: real time plus what the test moved the simulator's clock by."""

    def __init__(self):
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


@pytest.fixture
def world(sim, keys, tmp_path, monkeypatch):
    github_app._CACHE.clear()
    pem = tmp_path / "app.pem"
    pem.write_text(keys[0])
    pem.chmod(0o600)
    for name in ("GITHUB_TOKEN", "GH_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    cfg = parse_config({"repos": {REPO: {"url": "x", "forge": "github"}},
                        "github": {"api_url": sim.url, "app_id": APP_ID, "private_key_file": str(pem)}})
    clock = Clock()

    def advance(seconds: float) -> None:
        sim.advance(seconds)
        clock.offset += seconds

    def forge():
        f = get_forge(cfg.repos[REPO], cfg, tmp_path)
        f.app.clock = f.api.clock = clock
        f.app.api.clock = clock
        return f

    yield {"cfg": cfg, "forge": forge, "advance": advance, "pem": pem}
    github_app._CACHE.clear()
    assert requests.post(f"{sim.url}/_sim/clock", json={"reset": True}, timeout=10).status_code == 200


def test_the_app_buys_a_token_and_opens_the_draft_as_its_bot(world, sim):
    before = sim.log()
    forge = world["forge"]()
    pr = forge.create_draft("agent/fix-app00001", "main", "fix: as the app", "body")
    assert pr.draft and sim.pulls("agent/fix-app00001")[0]["draft"] is True
    forge.comment(pr.number, "round 2 pushed")
    assert sim.comments_on(pr.number) == [(BOT, "round 2 pushed")]
    assert forge.own_login() == BOT
    log = sim.log()
    assert log["issued"] == before["issued"] + 1 and log["rejected"] == before["rejected"]
    assert forge.app.installation_id == INSTALLATION                    # found from the repository
    [(token, _)] = github_app._CACHE.values()                           # scoped to the configured repository
    other = requests.get(f"{sim.url}/repos/acme/gadgets/pulls", headers={"Authorization": f"Bearer {token}"},
                         timeout=10)
    assert other.status_code == 404 and sim.log()["rejected"][-1]["why"] == "repository not covered by the token"


def test_an_expired_installation_token_is_renewed_before_any_call_fails(world, sim):
    forge = world["forge"]()
    pr = forge.create_draft("agent/fix-app00002", "main", "t", "b")
    start = sim.log()
    [(old, _)] = github_app._CACHE.values()
    world["advance"](3600 - 120)          # two minutes left: inside the refresh margin, renewed before the call
    assert forge.state(pr.number).number == pr.number
    world["advance"](2 * 3600)            # long expired on the simulator's clock: renewed before the call
    forge.comment(pr.number, "still me")
    log = sim.log()
    assert log["issued"] == start["issued"] + 2 and log["rejected"] == start["rejected"]   # no failed call
    [(new, _)] = github_app._CACHE.values()
    stale = requests.get(f"{sim.url}/repos/{REPO}/pulls/{pr.number}", headers={"Authorization": f"Bearer {old}"},
                         timeout=10)
    assert stale.status_code == 401 and new != old                      # the simulator does refuse the old one
    assert sim.log()["rejected"][-1]["why"] == "expired installation token"


def test_the_simulator_checks_signature_issuer_and_expiry_of_the_jwt(world, sim, tmp_path):
    import jwt

    now = int(sim.log()["now"])           # the simulator's clock (earlier tests moved it forward)
    other, _ = keypair()

    def ask(token):
        return requests.get(f"{sim.url}/app", headers={"Authorization": f"Bearer {token}"}, timeout=10)

    good = jwt.encode({"iat": now - 60, "exp": now + 300, "iss": str(APP_ID)}, world["pem"].read_text(), "RS256")
    assert ask(good).status_code == 200 and ask(good).json()["slug"] == SLUG
    cases = {"bad signature": jwt.encode({"iat": now - 60, "exp": now + 300, "iss": str(APP_ID)}, other, "RS256"),
             "is not the app id": jwt.encode({"iat": now - 60, "exp": now + 300, "iss": "1"},
                                             world["pem"].read_text(), "RS256"),
             "expired": jwt.encode({"iat": now - 900, "exp": now - 300, "iss": str(APP_ID)},
                                   world["pem"].read_text(), "RS256")}
    for why, token in cases.items():
        assert ask(token).status_code == 401
        assert why in sim.log()["rejected"][-1]["why"]

    # the agent with the wrong key: one line that says what to check, no key material
    wrong = tmp_path / "wrong.pem"
    wrong.write_text(other)
    cfg = parse_config({"repos": {REPO: {"url": "x", "forge": "github"}},
                        "github": {"api_url": sim.url, "app_id": APP_ID, "private_key_file": str(wrong)}})
    github_app._CACHE.clear()
    with pytest.raises(ForgeAuthError) as exc:
        get_forge(cfg.repos[REPO], cfg, tmp_path).state(1)
    msg = str(exc.value)
    assert "JWT was refused (401)" in msg and "private key" in msg and "\n" not in msg and "PRIVATE" not in msg


def test_the_apps_own_comments_are_its_own_for_feedback(world, sim):
    forge = world["forge"]()
    pr = forge.create_draft("agent/fix-app00003", "main", "t", "b")
    forge.comment(pr.number, "round 2 pushed")                       # unmarked: never feedback
    reply = forge.reply(pr.number, "Changed it.", "task-3-round-2")   # marked: the agent's own reply
    sim.comment(pr.number, "alice", "please rename it")
    items = forge.feedback(pr.number).items
    assert [(f.author, f.own_key) for f in items] == [(BOT, "task-3-round-2"), ("alice", None)]
    assert items[0].id == reply


def test_doctor_online_shows_the_installation_its_permissions_and_what_is_missing(world, sim, keys):
    from agent.app.doctor import check_forges

    [offline] = check_forges(world["cfg"], online=False)
    assert offline.ok and "signs a JWT" in offline.detail
    ok = check_forges(world["cfg"], online=True)[0]     # (then the git remote's check)
    assert ok.ok and f"{BOT}, installation {INSTALLATION} on acme" in ok.detail, ok.detail
    try:
        sim.configure(keys[1], permissions={"pull_requests": "write", "contents": "read", "metadata": "read"})
        short = check_forges(world["cfg"], online=True)[0]
        assert not short.ok and "missing contents: write, checks: read" in short.detail, short.detail
        assert "accept the new permissions" in short.fix
    finally:
        sim.configure(keys[1])
    world["pem"].write_text("not a key")
    [bad] = check_forges(world["cfg"], online=False)
    assert not bad.ok and "not a PEM private key" in bad.detail and "private_key_file" in bad.fix


@pytest.mark.slow
def test_a_github_app_configuration_goes_from_error_to_draft_pr(sim, keys, tmp_path):
    """The demo's error, fixed and opened as a draft by the app: no personal token anywhere in the environment."""
    import yaml

    from chaos_support import build, check_invariants, run_to_end

    github_app._CACHE.clear()
    p = build(tmp_path / "w", tasks=1, forge="github", github_api_url=sim.url)
    home, remote = p["home"], p["remote"]
    pem = tmp_path / "app.pem"
    pem.write_text(keys[0])
    cfg_path = home / "config.yaml"
    cfg = yaml.safe_load(cfg_path.read_text())
    cfg["github"] = {"api_url": sim.url, "app_id": APP_ID, "private_key_env": "AGENT_APP_KEY"}
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    before = sim.log()
    env = {"AGENT_APP_KEY": keys[0]}
    for name in ("GITHUB_TOKEN", "GH_TOKEN"):
        assert name not in os.environ
    run_to_end(home, env=env, log=tmp_path / "run.log")
    [t] = check_invariants(home, remote, tasks=1, sim=Sim(sim.url, repo="demo/widgets"))
    assert [p["draft"] for p in Sim(sim.url, repo="demo/widgets").pulls(t["branch"])] == [True]
    log = sim.log()
    assert log["issued"] > before["issued"] and log["rejected"] == before["rejected"]
    for path in home.rglob("*"):
        if path.is_file():
            assert b"PRIVATE KEY" not in path.read_bytes() and b"ghs_" not in path.read_bytes(), path


def test_a_token_refused_before_its_time_is_bought_again_once(world, sim):
    """The installation's tokens were revoked: one 401, a new token, the call succeeds; no task is blocked for it."""
    forge = world["forge"]()
    pr = forge.create_draft("agent/fix-app00004", "main", "t", "b")
    start = sim.log()
    assert requests.post(f"{sim.url}/_sim/app/revoke", timeout=10).status_code == 200
    assert forge.state(pr.number).number == pr.number
    log = sim.log()
    assert log["issued"] == start["issued"] + 1
    assert [r["why"] for r in log["rejected"][len(start["rejected"]):]] == ["unknown installation token"]
