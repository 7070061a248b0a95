"""`agent serve` on a real waitress server on 127.0.0.1, driven over HTTP: signatures, missing secrets, size limit,
malformed JSON, replays, redaction, the status page, metrics, and 2,000 requests from 8 threads with nothing lost."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

from agent.domain import chain
from agent.config import parse_config
from agent.app.serve import HookApp, Server
from agent.ledger import eventlog
from agent.ledger.tasks import create_task, transition
from conftest import agent_bin
from intake_payloads import sentry_python_event

EVENTS_KEY, SENTRY_KEY, AM_TOKEN = "ev-key-1", "sentry-client-secret", "am-token-1"
ENV = {"AGENT_HOOK_SECRET": EVENTS_KEY, "SENTRY_CLIENT_SECRET": SENTRY_KEY, "ALERTMANAGER_TOKEN": AM_TOKEN}
AM_HEADERS = {"Authorization": f"Bearer {AM_TOKEN}", "Content-Type": "application/json"}


def start(home, env=ENV, **serve):
    cfg = parse_config({"serve": serve} if serve else {})
    return Server(HookApp(home, cfg, env), "127.0.0.1", 0).start()


@pytest.fixture
def srv(ledger, home):
    s = start(home)
    yield s
    s.close()


def call(url, path, body: bytes | None = None, headers: dict | None = None, method=None):
    req = urllib.request.Request(url + path, data=body, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read(), resp.headers  # case-insensitive
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers


def sig(key: str, body: bytes, prefix="sha256=") -> str:
    return prefix + hmac.new(key.encode(), body, hashlib.sha256).hexdigest()


def post_events(url, body: bytes, key=EVENTS_KEY, **extra):
    return call(url, "/hooks/events", body, {"X-Agent-Signature": sig(key, body),
                                             "Content-Type": "application/x-ndjson", **extra})


def line(message="KeyError: 'qty'", service="widgets-api", n=0, **more) -> str:
    return json.dumps({"message": message, "class": "KeyError", "service": service, "environment": "production",
                       "timestamp": f"2026-01-01T10:00:{n % 60:02d}Z",
                       "stack": [{"file": "widgets/pricing.py", "function": "line_total", "line": 17}], **more})


def counts(ledger):
    return (ledger.scalar("SELECT count(*) FROM errors"), ledger.scalar("SELECT coalesce(sum(count), 0) FROM errors"),
            ledger.scalar("SELECT count(*) FROM hook_deliveries"))


# --------------------------------------------------------------------------- /hooks/events


def test_events_signed_are_stored_then_a_replay_changes_nothing(srv, ledger):
    body = (line(n=1) + "\n" + line(n=2) + "\n").encode()
    code, out, _ = post_events(srv.url, body)
    doc = json.loads(out)
    assert code == 202 and doc["new"] == 1 and doc["deduplicated"] == 1, out
    assert counts(ledger) == (1, 2, 1)
    code, out, _ = post_events(srv.url, body)
    assert code == 200 and json.loads(out)["replay"] is True
    assert counts(ledger) == (1, 2, 1)
    events = [e["kind"] for e in eventlog.events(ledger)]
    assert events == ["error.ingested"]
    code, _, _ = post_events(srv.url, (line(n=3) + "\n").encode())  # a new delivery of the same error counts up
    assert code == 202 and counts(ledger) == (1, 3, 2)


def test_bad_or_missing_signature_is_401_and_stores_nothing(srv, ledger):
    body = (line() + "\n").encode()
    assert post_events(srv.url, body, key="wrong")[0] == 401
    code, out, _ = call(srv.url, "/hooks/events", body)
    assert code == 401 and b"X-Agent-Signature" in out
    code, _, _ = call(srv.url, "/hooks/events", body, {"X-Agent-Signature": sig(EVENTS_KEY, body + b" ")})
    assert code == 401
    assert counts(ledger) == (0, 0, 0) and eventlog.events(ledger) == []


def test_missing_secret_is_a_clear_refusal(ledger, home):
    s = start(home, env={})
    try:
        body = (line() + "\n").encode()
        code, out, _ = post_events(s.url, body)
        assert code == 503 and "AGENT_HOOK_SECRET" in json.loads(out)["error"]
        code, out, _ = call(s.url, "/hooks/alertmanager", b"{}", {**AM_HEADERS, "Authorization": "Bearer x"})
        assert code == 503 and "ALERTMANAGER_TOKEN" in json.loads(out)["error"]
        assert counts(ledger) == (0, 0, 0)
    finally:
        s.close()


def test_oversized_body_is_413(ledger, home):
    s = start(home, max_body_bytes=2000)
    try:
        body = ("\n".join(line(n=i) for i in range(30)) + "\n").encode()
        assert len(body) > 2000
        code, out, _ = post_events(s.url, body)
        assert code == 413 and b"2000" in out
        small = (line() + "\n").encode()
        assert post_events(s.url, small)[0] == 202
        assert counts(ledger) == (1, 1, 1)
    finally:
        s.close()


def test_malformed_json_is_400_with_one_line_and_nothing_stored(srv, ledger):
    body = (line() + "\n{not json\n").encode()
    code, out, _ = post_events(srv.url, body)
    reason = json.loads(out)["error"]
    assert code == 400 and reason.startswith("line 2: not valid JSON") and "\n" not in reason
    body = (line() + "\n" + json.dumps({"level": "error"}) + "\n").encode()
    code, out, _ = post_events(srv.url, body)
    assert code == 400 and "line 2: record has neither a message nor an exception class" in json.loads(out)["error"]
    assert post_events(srv.url, b"")[0] == 400
    assert counts(ledger) == (0, 0, 0)


def test_events_are_redacted_like_ingest(srv, ledger):
    token = "ghp_" + "A" * 36
    body = (line(message=f"auth failed for token {token} password=hunter2") + "\n").encode()
    assert post_events(srv.url, body)[0] == 202
    stored = json.dumps(ledger.all("SELECT * FROM errors"))
    assert token not in stored and "hunter2" not in stored


# --------------------------------------------------------------------------- /hooks/sentry


def _sentry(url, doc, key=SENTRY_KEY, resource="event_alert", request_id="req-1", stamp=None):
    body = json.dumps(doc).encode()
    return call(url, "/hooks/sentry", body, {"Sentry-Hook-Signature": sig(key, body, ""), "Sentry-Hook-Resource":
                                             resource, "Request-ID": request_id, "Content-Type": "application/json",
                                             "Sentry-Hook-Timestamp": str(int(time.time()) if stamp is None
                                                                          else stamp)})


def test_sentry_integration_webhook(srv, ledger):
    doc = {"action": "triggered", "installation": {"uuid": "i-1"},
           "data": {"event": sentry_python_event(), "triggered_rule": "page me"}}
    assert _sentry(srv.url, doc, key="wrong")[0] == 401
    code, out, _ = _sentry(srv.url, doc)
    assert code == 202, out
    e = ledger.one("SELECT service, class, environment, excerpt FROM errors")
    assert (e["service"], e["class"], e["environment"]) == ("widgets-api", "KeyError", "production")
    assert "alice@example.com" not in e["excerpt"]
    assert _sentry(srv.url, doc)[0] == 200  # same Request-ID: a replay
    assert counts(ledger)[1:] == (1, 1)
    code, out, _ = _sentry(srv.url, {"action": "created", "data": {"installation": {}}}, resource="installation")
    assert code == 200 and b"ignored" in out
    body = b"{nope"
    code, out, _ = call(srv.url, "/hooks/sentry", body, {"Sentry-Hook-Signature": sig(SENTRY_KEY, body, ""),
                                                         "Content-Type": "application/json",
                                                         "Sentry-Hook-Timestamp": str(int(time.time()))})
    assert code == 400 and b"not JSON" in out


# --------------------------------------------------------------------------- /hooks/alertmanager


def _am(alerts, version="4"):
    return {"version": version, "groupKey": "{}:{alertname=\"HighErrorRate\"}", "status": "firing",
            "receiver": "agent", "groupLabels": {"alertname": "HighErrorRate"},
            "commonLabels": {"alertname": "HighErrorRate", "service": "widgets-api", "env": "production"},
            "commonAnnotations": {}, "externalURL": "http://alertmanager.test", "truncatedAlerts": 0,
            "alerts": alerts}


def test_alertmanager_webhook_with_bearer_token(srv, ledger):
    alert = {"status": "firing", "labels": {"alertname": "HighErrorRate", "instance": "web-1", "severity": "critical"},
             "annotations": {"summary": "5xx rate above 5% on web-1"}, "startsAt": "2026-01-01T10:00:00Z",
             "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "http://prom.test/graph", "fingerprint": "abc"}
    resolved = {**alert, "status": "resolved", "labels": {**alert["labels"], "instance": "web-2"}}
    body = json.dumps(_am([alert, resolved])).encode()
    assert call(srv.url, "/hooks/alertmanager", body, {**AM_HEADERS, "Authorization": "Bearer nope"})[0] == 401
    assert call(srv.url, "/hooks/alertmanager", body, {"Content-Type": "application/json"})[0] == 401
    code, out, _ = call(srv.url, "/hooks/alertmanager", body, AM_HEADERS)
    assert code == 202 and json.loads(out)["new"] == 1, out
    e = ledger.one("SELECT service, class, environment, level, message FROM errors")
    assert e == {"service": "widgets-api", "class": "HighErrorRate", "environment": "production",
                 "level": "critical", "message": "5xx rate above 5% on web-1"}
    v3 = json.dumps(_am([alert], version="3")).encode()
    code, out, _ = call(srv.url, "/hooks/alertmanager", v3, AM_HEADERS)
    assert code == 400 and b"version 4" in out
    only_resolved = json.dumps(_am([resolved])).encode()
    code, out, _ = call(srv.url, "/hooks/alertmanager", only_resolved, AM_HEADERS)
    assert code == 200 and b"no firing alerts" in out
    assert counts(ledger) == (1, 1, 1)


# --------------------------------------------------------------------------- pages


def test_status_page_metrics_and_health(srv, ledger):
    tid, _ = create_task(ledger, "acme/widgets", "Fix <KeyError> in checkout")
    transition(ledger, tid, chain.BLOCKED, "script", "lane codex: binary not found")
    post_events(srv.url, (line() + "\n").encode())
    code, page, headers = call(srv.url, "/")
    html = page.decode()
    assert code == 200 and headers["Content-Type"].startswith("text/html")
    assert "http-equiv='refresh'" not in html and "agent task reset 1 --reason &#x27;what you fixed&#x27;" in html
    assert "Fix &lt;KeyError&gt; in checkout" in html and html.count("<script") == 1  # only the live updater
    assert "script-src 'sha256-" in headers["Content-Security-Policy"]
    assert call(srv.url, "/", b"x", method="POST")[0] == 405
    code, text, headers = call(srv.url, "/metrics")
    text = text.decode()
    assert code == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert 'agent_tasks{state="gate-blocked"} 1' in text and 'agent_errors{state="open"} 1' in text
    assert 'agent_hook_deliveries_total{hook="events"} 1' in text
    for fam in ("agent_prs", "agent_lane_runs_total", "agent_lane_run_duration_seconds", "agent_cost_usd_total",
                "agent_notify_deliveries", "agent_build_info", "agent_hook_requests_total"):
        assert f"# TYPE {fam} " in text
    for ln in text.splitlines():  # every sample line is name{labels} value
        assert ln.startswith("#") or re.fullmatch(r'[a-z_]+(\{[a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*\})? \S+', ln), ln
    code, out, _ = call(srv.url, "/healthz")
    assert code == 200 and json.loads(out)["ok"] is True
    assert call(srv.url, "/nope")[0] == 404 and call(srv.url, "/hooks/events")[0] == 405


def test_metrics_count_lane_runs_and_deliveries(srv, ledger):
    with ledger.tx() as c:
        for vendor, role, secs in (("codex", "implementer", 30), ("codex", "implementer", 90),
                                   ("claude", "reviewer", 12)):
            c.execute("INSERT INTO lane_runs (role, vendor, status, cost_usd, started_at, ended_at) VALUES "
                      "(?, ?, 'complete', 0.5, '2026-01-01T10:00:00.000000Z', ?)",
                      (role, vendor, f"2026-01-01T10:{secs // 60:02d}:{secs % 60:02d}.000000Z"))
    text = call(srv.url, "/metrics")[1].decode()
    assert 'agent_lane_runs_total{vendor="codex",role="implementer",status="complete"} 2' in text
    assert 'agent_lane_run_duration_seconds_sum{vendor="codex",role="implementer"} 120' in text
    assert 'agent_lane_run_duration_seconds_count{vendor="claude",role="reviewer"} 1' in text
    assert 'agent_cost_usd_total{vendor="codex",role="implementer"} 1' in text
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f for f in text_string_to_metric_families(text)}
    lane = families["agent_lane_run_duration_seconds"]  # one summary family, not two counters
    assert lane.type == "summary"
    assert {(s.name, s.labels["vendor"], s.value) for s in lane.samples} == {
        ("agent_lane_run_duration_seconds_sum", "codex", 120), ("agent_lane_run_duration_seconds_count", "codex", 2),
        ("agent_lane_run_duration_seconds_sum", "claude", 12), ("agent_lane_run_duration_seconds_count", "claude", 1)}
    [info] = families["agent_build_info"].samples
    from agent import __version__
    assert info.labels["version"] == __version__ and info.value == 1


# --------------------------------------------------------------------------- load


@pytest.mark.slow
def test_2000_requests_from_8_threads_nothing_lost(srv, ledger):
    per_thread, errors = 250, []
    bodies = [[(line(service=f"svc-{t % 4}", n=i, request=f"{t}-{i}") + "\n").encode() for i in range(per_thread)]
              for t in range(8)]

    def worker(t):
        for body in bodies[t]:
            code, out, _ = post_events(srv.url, body)
            if code != 202:
                errors.append((code, out))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    errs, total, deliveries = counts(ledger)
    assert (total, deliveries) == (2000, 2000) and errs == 4  # one error per service, every occurrence counted


# --------------------------------------------------------------------------- the real commands


def _listening(proc, timeout=30) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ln = proc.stdout.readline()
        m = re.search(r"(?:listening|serving) on (http://\S+)", ln)
        if m:
            return m.group(1)
    raise AssertionError("server did not say where it listens")


@pytest.mark.parametrize("command", [("serve", "--port", "0"), ("daemon", "--serve", "--port", "0",
                                                                   "--interval", "0.2")])
def test_agent_serve_and_daemon_serve_as_real_processes(home, command):
    env = {**os.environ, "AGENT_HOME": str(home), **ENV}
    subprocess.run([*agent_bin(), "init"], env=env, check=True, capture_output=True)
    p = subprocess.Popen([*agent_bin(), *command], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    try:
        url = _listening(p)
        assert url.startswith("http://127.0.0.1:")
        assert call(url, "/healthz")[0] == 200
        assert post_events(url, (line() + "\n").encode())[0] == 202
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0
    finally:
        if p.poll() is None:
            p.kill()
    from conftest import ledger_conn
    con = ledger_conn(home)
    assert con.execute("SELECT count(*) FROM errors").fetchone()[0] == 1
    con.close()


def test_the_systemd_example_runs_the_server_in_the_daemon():
    import shlex
    from pathlib import Path

    from agent.cli.watch import daemon

    unit = (Path(__file__).resolve().parent.parent / "scripts" / "agent.service").read_text()
    [exec_line] = [ln for ln in unit.splitlines() if ln.startswith("ExecStart=")]
    argv = shlex.split(exec_line.split("=", 1)[1])
    assert argv[1] == "daemon" and "--serve" in argv
    ctx = daemon.make_context("daemon", argv[2:])  # the options exist and parse
    assert ctx.params["with_serve"] is True and ctx.params["host"] == "127.0.0.1" and ctx.params["port"] == 8080


# --------------------------------------------------------------------------- idle


def test_idle_server_sleeps_in_poll_instead_of_spinning(srv):
    """The server loop's poll() used a timeout of int(0.25) = 0 ms: about 12,000 wake-ups a second while idle.
    Counted here by the listening socket's readable() check, which poll runs once per loop pass."""
    listener = srv.server
    passes = []
    real = listener.readable
    listener.readable = lambda: passes.append(1) or real()
    try:
        time.sleep(1.5)
    finally:
        listener.readable = real
    assert len(passes) <= 5, f"{len(passes)} loop passes in 1.5 s while idle"
    assert call(srv.url, "/healthz")[0] == 200  # a request still wakes it at once


# --------------------------------------------------------------------------- exposure and refusals


READ_TOKEN = "read-token-1"


def test_read_token_guards_the_page_and_metrics_and_healthz_says_only_ok(ledger, home):
    import base64

    s = start(home, env={**ENV, "AGENT_READ_TOKEN": READ_TOKEN}, read_token_env="AGENT_READ_TOKEN")
    try:
        for path in ("/", "/metrics"):
            code, out, headers = call(s.url, path)
            assert code == 401 and "AGENT_READ_TOKEN" in json.loads(out)["error"], (path, out)
            assert "Bearer" in headers["WWW-Authenticate"], headers
            assert call(s.url, path, headers={"Authorization": "Bearer wrong"})[0] == 401
            assert call(s.url, path, headers={"Authorization": f"Bearer {READ_TOKEN}"})[0] == 200
            basic = base64.b64encode(f"me:{READ_TOKEN}".encode()).decode()
            assert call(s.url, path, headers={"Authorization": f"Basic {basic}"})[0] == 200
        code, out, _ = call(s.url, "/healthz")  # no token needed, and nothing but ok
        assert code == 200 and json.loads(out) == {"ok": True}
        assert post_events(s.url, (line() + "\n").encode())[0] == 202  # hooks keep their own secrets
    finally:
        s.close()
    s = start(home, env=ENV, read_token_env="AGENT_READ_TOKEN")  # configured but not set: refused, never open
    try:
        code, out, _ = call(s.url, "/")
        assert code == 503 and "AGENT_READ_TOKEN" in json.loads(out)["error"]
    finally:
        s.close()


def test_healthz_shows_no_path_even_when_the_ledger_is_unreadable(srv, ledger, home):
    code, out, _ = call(srv.url, "/healthz")
    assert code == 200 and json.loads(out) == {"ok": True}
    assert str(home) not in out.decode()


def _raw(url: str, request: bytes) -> tuple[int, bytes, str]:
    import socket

    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    ctype = next((ln.split(b":", 1)[1].strip().decode() for ln in head.split(b"\r\n")
                  if ln.lower().startswith(b"content-type:")), "")
    return status, body, ctype


def test_every_refusal_is_json_and_counted_by_hook_and_outcome(ledger, home):
    s = start(home, max_body_bytes=2000)
    try:
        big = b"x" * 5000
        # over the size limit: waitress refuses it before the application, from Content-Length alone
        code, body, ctype = _raw(s.url, b"POST /hooks/events HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n"
                                        b"Content-Type: application/x-ndjson\r\nConnection: close\r\n\r\n" + big)
        assert code == 413 and ctype == "application/json" and "error" in json.loads(body)
        code, body, ctype = _raw(s.url, b"POST /hooks/events HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n"
                                        b"Connection: close\r\n\r\n")
        assert code == 400 and ctype == "application/json" and "error" in json.loads(body)
        one = (line() + "\n").encode()
        code, out, headers = call(s.url, "/hooks/events", one, {"X-Agent-Signature": sig(EVENTS_KEY, one),
                                                               "Content-Type": "text/plain"})
        assert code == 415 and "application/x-ndjson" in json.loads(out)["error"]
        assert headers["Content-Type"] == "application/json"
        code, out, _ = call(s.url, "/hooks/alertmanager", b"{}", {**AM_HEADERS, "Content-Type": "text/html"})
        assert code == 415
        for code, out, headers in (call(s.url, "/nope"), call(s.url, "/hooks/events"), post_events(s.url, one, "k")):
            assert code >= 400 and headers["Content-Type"] == "application/json" and json.loads(out)["error"]
        assert post_events(s.url, one)[0] == 202
        assert post_events(s.url, one)[0] == 200
        assert counts(ledger) == (1, 1, 1)
        from prometheus_client.parser import text_string_to_metric_families

        text = call(s.url, "/metrics")[1].decode()
        fam = {f.name: f for f in text_string_to_metric_families(text)}["agent_hook_requests"]
        got = {(x.labels["hook"], x.labels["outcome"]): x.value for x in fam.samples}
        assert got == {("events", "too_large"): 1, ("events", "invalid"): 1, ("events", "content_type"): 1,
                       ("alertmanager", "content_type"): 1, ("events", "method"): 1, ("events", "unauthorized"): 1,
                       ("events", "accepted"): 1, ("events", "replay"): 1}, got
    finally:
        s.close()


def test_the_queue_depth_warning_does_not_flood_the_log(srv):
    import logging

    assert not logging.getLogger("waitress.queue").isEnabledFor(logging.WARNING)


def _run(home, *args, env_extra=None, timeout=60):
    env = {**os.environ, "AGENT_HOME": str(home), **ENV, **(env_extra or {})}
    return subprocess.run([*agent_bin(), *args], env=env, capture_output=True, text=True, timeout=timeout)


def test_non_loopback_bind_is_refused_without_a_token_unless_public(home):
    assert _run(home, "init").returncode == 0
    for command in (("serve",), ("daemon", "--serve", "--interval", "0.2")):
        r = _run(home, *command, "--host", "0.0.0.0", "--port", "0")
        assert r.returncode != 0 and "Traceback" not in r.stderr + r.stdout
        msg = (r.stderr + r.stdout).strip()
        assert "0.0.0.0" in msg and "serve.read_token_env" in msg and "--public" in msg and "\n" not in msg, msg
    env = {**os.environ, "AGENT_HOME": str(home), **ENV}
    p = subprocess.Popen([*agent_bin(), "serve", "--host", "0.0.0.0", "--port", "0", "--public"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        first = p.stdout.readline()
        assert "WARNING" in first and "0.0.0.0" in first and "no read token" in first, first
        url = _listening(p).replace("0.0.0.0", "127.0.0.1")
        assert call(url, "/healthz")[0] == 200
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0
    finally:
        if p.poll() is None:
            p.kill()
    from agent.app.serve import check_exposure

    assert check_exposure("0.0.0.0", parse_config({"serve": {"read_token_env": "T"}}), False) is None
    assert check_exposure("::1", parse_config({}), False) is None


def test_serve_on_a_port_in_use_says_so_in_one_line(home):
    import socket

    assert _run(home, "init").returncode == 0
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        r = _run(home, "serve", "--port", str(port))
    out = (r.stderr + r.stdout).strip()
    assert r.returncode != 0 and "Traceback" not in out and "\n" not in out, out
    assert f"127.0.0.1:{port}" in out and "already in use" in out


# --------------------------------------------------------------------------- replay


def test_sentry_replay_with_a_new_request_id_or_an_old_timestamp_changes_nothing(srv, ledger):
    doc = {"action": "triggered", "installation": {"uuid": "i-1"},
           "data": {"event": sentry_python_event(), "triggered_rule": "page me"}}
    assert _sentry(srv.url, doc, request_id="req-1")[0] == 202
    assert counts(ledger)[1:] == (1, 1)
    # the same signed body again with a fresh (unsigned) Request-ID: a replay, the count does not rise
    code, out, _ = _sentry(srv.url, doc, request_id="req-2")
    assert code == 200 and json.loads(out)["replay"] is True
    # a captured delivery sent later: its timestamp is outside the window
    code, out, _ = _sentry(srv.url, {**doc, "action": "resolved"}, stamp=int(time.time()) - 3600)
    assert code == 401 and "Sentry-Hook-Timestamp" in json.loads(out)["error"]
    code, out, _ = _sentry(srv.url, {**doc, "action": "resolved"}, stamp="soon")
    assert code == 401
    assert counts(ledger)[1:] == (1, 1)


def _stamped(url, body: bytes, stamp, key=EVENTS_KEY):
    signature = sig(key, f"{stamp}.".encode() + body)
    return call(url, "/hooks/events", body, {"X-Agent-Signature": signature, "X-Agent-Timestamp": str(stamp),
                                             "Content-Type": "application/x-ndjson"})


def test_events_signed_timestamp_window_and_requirement(ledger, home):
    body = (line() + "\n").encode()
    s = start(home, require_timestamp=True, replay_window=60)
    try:
        code, out, _ = post_events(s.url, body)  # no timestamp: refused when required
        assert code == 401 and "X-Agent-Timestamp" in json.loads(out)["error"]
        now = int(time.time())
        assert _stamped(s.url, body, now)[0] == 202
        assert _stamped(s.url, body, now)[0] == 200  # the same delivery again: a replay
        assert _stamped(s.url, body, now + 1)[0] == 202  # the same error reported again later: counted
        code, out, _ = _stamped(s.url, body, now - 600)  # outside the window
        assert code == 401 and "60 s" in json.loads(out)["error"]
        # the timestamp is signed: moving a captured delivery's timestamp breaks its signature
        signature = sig(EVENTS_KEY, f"{now - 600}.".encode() + body)
        code, _, _ = call(s.url, "/hooks/events", body, {"X-Agent-Signature": signature, "X-Agent-Timestamp":
                                                         str(now), "Content-Type": "application/x-ndjson"})
        assert code == 401
        assert counts(ledger) == (1, 2, 2)
    finally:
        s.close()
    s = start(home)  # not required: an unstamped delivery still works, a stamped one is still checked
    try:
        assert post_events(s.url, (line(n=5) + "\n").encode())[0] == 202
        assert _stamped(s.url, body, int(time.time()) - 3600)[0] == 401
    finally:
        s.close()
