"""Notifications: the outbox row is written with its event, delivered after to a real local HTTP receiver (Slack
shape and a signed JSON webhook) and a real local SMTP server (aiosmtpd, STARTTLS with a self-signed certificate
made here), retried with backoff, and delivered exactly once across a crash (real subprocesses, a crashpoint and a
SIGKILL)."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import signal
import ssl
import subprocess
import time

import pytest

from agent.domain import chain

from agent.flows import notify
from agent.config import ConfigError, parse_config
from agent.ledger import eventlog, ledger_path
from agent.ledger.outbox import kinds_for
from agent.ledger.tasks import create_task, transition
from conftest import agent_bin, ledger_conn
from notify_support import Receiver, self_signed_cert

SECRET = "s3cret-hmac-key"


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def _config(*channels):
    return parse_config({"notify": list(channels)})


def _block(ledger, reason="lane codex: binary not found; install it"):
    tid, _ = create_task(ledger, "acme/widgets", "Fix KeyError in checkout")
    transition(ledger, tid, chain.BLOCKED, "script", reason)
    return tid


def _deliveries(ledger):
    return ledger.all("SELECT channel, key, state, attempts, last_error FROM notify_deliveries ORDER BY id")


def _backoff_over(ledger):
    """Every waiting retry due now (the wait is on the ledger's clock: no runner clock can skip it)."""
    with ledger.tx() as c:
        c.execute("UPDATE notify_deliveries SET next_at = 0 WHERE state = 'pending'")


# --------------------------------------------------------------------------- outbox


def test_event_kinds_map_to_notifications():
    assert kinds_for("task.state", {"to": "gate-blocked", "reason": "x"}) == ("gate-blocked",)
    assert kinds_for("task.state", {"to": "gate-blocked", "reason": "task budget spent ($3 of $3)"}) == \
        ("gate-blocked", "budget")
    assert kinds_for("task.state", {"to": "failed"}) == ("failed",)
    assert kinds_for("task.state", {"to": "working"}) == ()
    assert kinds_for("pr.created", {}) == ("pr-opened",) == kinds_for("pr.adopted", {})
    assert kinds_for("pr.updated", {}) == ()
    assert kinds_for("pr.merged", {}) == ("pr-merged",)
    assert kinds_for("pr.closed", {}) == ("pr-closed",)
    assert kinds_for("budget.reached", {"scope": "daily"}) == ("budget",)
    assert kinds_for("step.closed", {}) == ()


def test_outbox_row_commits_and_rolls_back_with_its_event(ledger):
    tid = _block(ledger)
    rows = ledger.all("SELECT o.kinds, o.task_id, e.kind FROM outbox o JOIN events e ON e.id = o.event_id")
    assert rows == [{"kinds": "gate-blocked", "task_id": tid, "kind": "task.state"}]
    tid2, _ = create_task(ledger, "acme/widgets", "another")
    with pytest.raises(RuntimeError):
        with ledger.tx() as c:
            from agent.ledger.tasks import transition_in
            transition_in(ledger, c, tid2, "open", chain.FAILED, "script", "boom")
            raise RuntimeError("crash inside the transaction")
    assert ledger.scalar("SELECT count(*) FROM outbox") == 1  # neither the event nor its outbox row survived
    assert ledger.scalar("SELECT state FROM tasks WHERE id = ?", (tid2,)) == "open"


def test_daily_budget_is_one_notification_a_day(ledger):
    from agent.ledger.outbox import daily_budget_reached

    assert daily_budget_reached(ledger, 51.0, 50.0) is True
    assert daily_budget_reached(ledger, 52.0, 50.0) is False
    assert ledger.scalar("SELECT count(*) FROM outbox WHERE kinds = 'budget'") == 1


# --------------------------------------------------------------------------- channels over real HTTP


def test_slack_and_signed_webhook_get_what_happened_and_the_reset_command(ledger, receiver):
    env = {"SLACK_URL": receiver.url + "/slack", "HOOK_KEY": SECRET}
    cfg = _config({"kind": "slack", "url_env": "SLACK_URL", "on": ["gate-blocked"]},
                  {"kind": "webhook", "url": receiver.url + "/json", "secret_env": "HOOK_KEY"})
    tid = _block(ledger)
    items = notify.deliver(ledger, cfg, env)
    assert sorted(i["state"] for i in items) == ["delivered", "delivered"]
    by_path = {r["path"]: r for r in receiver.requests}
    slack = json.loads(by_path["/hook/slack"]["body"])["text"]
    assert f"task {tid} (acme/widgets: Fix KeyError in checkout) is gate-blocked" in slack
    assert f"`agent task reset {tid} --reason 'what you fixed'`" in slack and "binary not found" in slack
    hook = by_path["/hook/json"]
    body = hook["body"]
    want = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    assert hook["headers"]["X-Agent-Signature"] == want
    doc = json.loads(body)
    assert doc["kinds"] == ["gate-blocked"] and doc["task_id"] == tid
    assert doc["command"] == f"agent task reset {tid} --reason 'what you fixed'"
    assert hook["headers"]["X-Agent-Delivery"] == hook["headers"]["Idempotency-Key"] == doc["id"]
    assert {d["state"] for d in _deliveries(ledger)} == {"delivered"}
    assert notify.deliver(ledger, cfg, env) == [] and len(receiver.requests) == 2  # nothing sent twice
    kinds = [e["kind"] for e in eventlog.events(ledger, task_id=tid)]
    assert kinds.count("notify.delivered") == 2


def test_a_channel_only_gets_the_events_it_asked_for(ledger, receiver):
    cfg = _config({"kind": "webhook", "url": receiver.url, "secret_env": "K", "on": ["failed", "pr-merged"]})
    _block(ledger)
    assert notify.deliver(ledger, cfg, {"K": SECRET}) == [] and receiver.requests == []
    tid, _ = create_task(ledger, "acme/widgets", "two")
    transition(ledger, tid, chain.FAILED, "script", "round cap 5 reached")
    assert [i["state"] for i in notify.deliver(ledger, cfg, {"K": SECRET})] == ["delivered"]
    assert receiver.json(0)["command"] == f"agent task reset {tid} --reason 'why it may go on' --rounds 2"


def test_pr_opened_message_carries_the_pr_url(ledger, receiver):
    from agent.flows.pr_thread import record_pr
    from agent.forge import PR

    class F:
        name, repo = "local", "acme/widgets"

    tid, _ = create_task(ledger, "acme/widgets", "pr")
    pr = PR(number=7, url="https://example.test/acme/widgets/pull/7", state="open", draft=True,
            head="agent/fix-1", base="main", head_sha="abc", title="t", body="b")
    record_pr(ledger, tid, F(), pr, head_sha="abc", title="t", body="b", action="created")
    cfg = _config({"kind": "webhook", "url": receiver.url, "secret_env": "K", "on": ["pr-opened"]})
    notify.deliver(ledger, cfg, {"K": SECRET})
    doc = receiver.json(0)
    assert doc["url"] == pr.url and pr.url in doc["text"] and doc["kinds"] == ["pr-opened"]


def test_failures_retry_with_backoff_and_a_refusal_stops(ledger):
    r = Receiver(codes=[503, 200])
    try:
        cfg = _config({"kind": "webhook", "url": r.url, "secret_env": "K"})
        _block(ledger)
        first = notify.deliver(ledger, cfg, {"K": SECRET})
        assert first[0]["state"] == "pending" and "HTTP 503" in first[0]["line"]
        assert notify.deliver(ledger, cfg, {"K": SECRET}) == []  # backoff: not yet
        _backoff_over(ledger)
        again = notify.deliver(ledger, cfg, {"K": SECRET})
        assert again[0]["state"] == "delivered"
        assert len(set(r.keys())) == 1 and len(r.requests) == 2  # the retry carried the same idempotency key
        assert _deliveries(ledger)[0]["attempts"] == 2
    finally:
        r.close()
    r = Receiver(codes=[404])
    try:
        cfg = _config({"kind": "webhook", "url": r.url, "secret_env": "K"})
        _block(ledger, "second")
        items = notify.deliver(ledger, cfg, {"K": SECRET})
        assert [i["state"] for i in items] == ["failed"] and "HTTP 404" in items[0]["line"]
        with ledger.tx() as c:
            c.execute("UPDATE notify_deliveries SET next_at = 0")
        assert notify.deliver(ledger, cfg, {"K": SECRET}) == []
    finally:
        r.close()


def test_missing_secret_is_retried_and_named(ledger, receiver):
    cfg = _config({"kind": "slack", "url_env": "NOPE_URL"})
    _block(ledger)
    items = notify.deliver(ledger, cfg, {})
    assert items[0]["state"] == "pending" and "NOPE_URL" in items[0]["line"]
    assert _deliveries(ledger)[0]["last_error"].startswith("slack-")


def test_config_refuses_bad_channels():
    with pytest.raises(ConfigError, match=r"notify\[0\]\.secret_env"):
        _config({"kind": "webhook", "url": "https://x.test/h"})
    with pytest.raises(ConfigError, match=r"notify\[0\]\.on\[0\]: expected one of"):
        _config({"kind": "slack", "url_env": "U", "on": ["gate_blocked"]})
    with pytest.raises(ConfigError, match=r"notify\[0\]\.secret: secrets never go in config"):
        _config({"kind": "webhook", "url": "https://x.test/h", "secret": "x", "secret_env": "K"})
    with pytest.raises(ConfigError, match=r"notify\[0\]\.smtp: expected host:port"):
        _config({"kind": "email", "smtp": "smtp.example", "to": ["a@b.test"]})


# --------------------------------------------------------------------------- email over a real SMTP server


@pytest.fixture
def smtp_server(tmp_path):
    pytest.importorskip("aiosmtpd")
    from aiosmtpd.controller import Controller
    from aiosmtpd.smtp import AuthResult, LoginPassword

    cert, key = self_signed_cert(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    received = []

    class Handler:
        async def handle_DATA(self, server, session, envelope):
            received.append({"from": envelope.mail_from, "to": envelope.rcpt_tos,
                             "data": envelope.content.decode("utf-8", "replace"), "tls": session.ssl is not None,
                             "user": getattr(session, "auth_data", None)})
            return "250 OK"

    def auth(server, session, envelope, mechanism, data):
        ok = isinstance(data, LoginPassword) and data.login == b"ops" and data.password == b"pw-123"
        return AuthResult(success=ok, handled=False)

    import socket

    with socket.socket() as s:  # a free port (aiosmtpd's start-up probe cannot use port 0)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctl = Controller(Handler(), hostname="127.0.0.1", port=port, require_starttls=True, tls_context=server_ctx,
                     authenticator=auth, auth_require_tls=True)
    ctl.start()
    try:
        yield {"port": port, "received": received, "cert": cert}
    finally:
        ctl.stop()


def test_email_over_starttls_with_login(ledger, smtp_server):
    port = smtp_server["port"]
    cfg = _config({"kind": "email", "smtp": f"127.0.0.1:{port}", "user_env": "SMTP_USER",
                   "password_env": "SMTP_PASSWORD", "to": ["oncall@example.test"], "from": "agent@example.test",
                   "on": ["failed"]})
    tid, _ = create_task(ledger, "acme/widgets", "mail me")
    transition(ledger, tid, chain.FAILED, "script", "round cap 5 reached; last feedback: tests fail")
    client_ctx = ssl.create_default_context(cafile=str(smtp_server["cert"]))
    env = {"SMTP_USER": "ops", "SMTP_PASSWORD": "pw-123"}
    items = notify.deliver(ledger, cfg, env, ssl_context=client_ctx)
    assert [i["state"] for i in items] == ["delivered"], items
    [mail] = smtp_server["received"]
    assert mail["tls"] and mail["to"] == ["oncall@example.test"] and mail["from"] == "agent@example.test"
    assert f"Subject: agent: task {tid} (acme/widgets: mail me) failed" in mail["data"]
    assert f"agent task reset {tid} --reason 'why it may go on' --rounds 2" in mail["data"]
    key = _deliveries(ledger)[0]["key"]
    assert f"Message-ID: <{key}@agent>" in mail["data"]
    # a wrong password is a refusal (SMTP 535): failed for good, with the reason
    tid2, _ = create_task(ledger, "acme/widgets", "wrong pw")
    transition(ledger, tid2, chain.FAILED, "script", "x")
    bad = notify.deliver(ledger, cfg, {**env, "SMTP_PASSWORD": "nope"}, ssl_context=client_ctx)
    assert [i["state"] for i in bad] == ["failed"] and "SMTP 535" in bad[0]["line"]
    assert len(smtp_server["received"]) == 1


def test_email_refuses_a_certificate_it_cannot_verify(ledger, smtp_server):
    cfg = _config({"kind": "email", "smtp": f"127.0.0.1:{smtp_server['port']}", "to": ["a@example.test"]})
    _block(ledger)
    items = notify.deliver(ledger, cfg, {}, ssl_context=ssl.create_default_context())  # self-signed: not trusted
    assert items[0]["state"] == "pending" and "TLS" in items[0]["line"]
    assert smtp_server["received"] == []


# --------------------------------------------------------------------------- `agent notify test`


def test_notify_test_sends_one_message_per_channel(agent, home, receiver, monkeypatch):
    bad = Receiver(codes=[404])
    try:
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.yaml").write_text(
            "notify:\n"
            f"  - {{kind: webhook, url: '{receiver.url}', secret_env: HOOK_KEY}}\n"
            f"  - {{kind: slack, url: '{bad.url}'}}\n")
        monkeypatch.setenv("HOOK_KEY", SECRET)
        r = agent("notify", "test")
        assert r.exit_code == 1
        assert "webhook-" in r.stdout and ": sent" in r.stdout and "FAILED: slack-" in r.stdout
        assert "1 channel(s) failed" in r.stderr and "Traceback" not in r.output
        assert len(receiver.requests) == 1 and receiver.json(0)["kinds"] == ["test"]
        assert len(bad.requests) == 1
    finally:
        bad.close()
    (home / "config.yaml").write_text("repos: {}\n")
    r = agent("notify", "test")
    assert r.exit_code == 1 and "no notify: channels" in r.stderr


# --------------------------------------------------------------------------- crashes (real subprocesses)


def _write_config(home, url):
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text(f"notify:\n  - {{kind: webhook, url: '{url}', secret_env: HOOK_KEY}}\n"
                                      )


BLOCK = ("import sys; from agent.ledger import Ledger; from agent.ledger.tasks import create_task, transition; "
         "led = Ledger.open(sys.argv[1]); t, _ = create_task(led, 'acme/widgets', 't'); "
         "transition(led, t, 'gate-blocked', 'script', 'lane codex: not logged in')")


def _gate_block_in_a_subprocess(home):
    import sys
    subprocess.run([sys.executable, "-c", BLOCK, str(ledger_path(home))], check=True, capture_output=True)


def _db(home, sql):
    con = ledger_conn(home)
    try:
        return [tuple(r) for r in con.execute(sql).fetchall()]
    finally:
        con.close()


def test_crash_between_event_and_delivery_delivers_exactly_once(home, receiver, agent_proc):
    _write_config(home, receiver.url)
    env = {"HOOK_KEY": SECRET}
    _gate_block_in_a_subprocess(home)  # the event and its outbox row, committed by another process
    # the delivery pass dies right before the notification is sent
    r = agent_proc("watch", "notify", env={**env, "AGENT_CRASHPOINT": "notify.before_send"})
    assert r.returncode == 137, r.stderr
    assert _db(home, "SELECT state FROM tasks") == [("gate-blocked",)]
    assert receiver.requests == []
    r = agent_proc("watch", "notify", env=env)
    assert r.returncode == 0 and "delivered" in r.stdout, r.stdout + r.stderr
    assert agent_proc("watch", "notify", env=env).returncode == 0
    assert len(receiver.requests) == 1 and receiver.json(0)["kinds"] == ["gate-blocked"]
    assert _db(home, "SELECT state, attempts FROM notify_deliveries") == [("delivered", 2)]


@pytest.mark.slow
def test_sigkill_while_sending_resends_the_same_key_once(home, agent_proc, tmp_path):
    """A real `agent daemon` is SIGKILLed while its webhook request is in flight (the receiver holds it). The next
    pass sends it again with the same idempotency key, so the receiver applies it once; the ledger records one
    delivery."""
    r = Receiver(hold=True)
    try:
        _write_config(home, r.url)
        env = {**os.environ, "AGENT_HOME": str(home), "HOOK_KEY": SECRET}
        _gate_block_in_a_subprocess(home)
        log = open(tmp_path / "daemon.log", "w")
        d = subprocess.Popen([*agent_bin(), "daemon", "--interval", "0.2"], env=env, stdout=log, stderr=log)
        try:
            assert r.arrived.wait(60), (tmp_path / "daemon.log").read_text()
            d.send_signal(signal.SIGKILL)
            assert d.wait(10) == -signal.SIGKILL
        finally:
            if d.poll() is None:
                d.kill()
            log.close()
        assert _db(home, "SELECT state FROM notify_deliveries") == [("sending",)]
        out = agent_proc("watch", "notify", env={"HOOK_KEY": SECRET})
        assert out.returncode == 0 and "delivered" in out.stdout, out.stdout + out.stderr
        assert len(r.requests) == 2 and len(set(r.keys())) == 1  # same key: the receiver applies it once
        assert _db(home, "SELECT state, attempts FROM notify_deliveries") == [("delivered", 2)]
        assert _db(home, "SELECT count(*) FROM events WHERE kind = 'notify.delivered'") == [(1,)]
    finally:
        r.close()


def test_readme_notify_example_is_valid_config():
    import re
    from pathlib import Path

    import yaml

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    [block] = [b for b in re.findall(r"```yml\n(.*?)```", readme, re.S) if "notify:" in b]
    cfg = parse_config(yaml.safe_load(block), filename="README.md")
    assert [c.kind for c in cfg.notify] == ["slack", "email"] and cfg.notify[1].on == ("failed", "budget")


def test_yaml_on_key_is_read_as_the_event_list(tmp_path):
    from agent.config import load_config

    path = tmp_path / "config.yaml"
    path.write_text("notify:\n  - {kind: slack, url_env: U, on: [failed]}\n  - kind: webhook\n    url: http://x.test/\n"
                    "    secret_env: K\n    on: [pr-merged, budget]\n")
    cfg = load_config(path)
    assert [c.on for c in cfg.notify] == [("failed",), ("pr-merged", "budget")]
