"""`agent serve` as a Sentry DSN, driven by the real SDKs: Python's `sentry-sdk` (PyPI, a test dependency) and
`@sentry/node` (npm, installed by scripts/ci-sentry-sdks) in subprocesses pointed at a real waitress server on
127.0.0.1; then every bad input by raw HTTP. Both ledgers (the `home`/`ledger` fixtures follow --ledger)."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import zlib
from pathlib import Path

import brotli
import pytest

from agent.config import parse_config
from agent.intake import envelope as wire
from agent.app.serve import HookApp, Server
from test_serve import call, sig

ROOT = Path(__file__).resolve().parent.parent
NODE_SDK = ROOT / ".cache" / "sentry-node" / "node_modules" / "@sentry" / "node"
KEY, OTHER = "0123456789abcdef0123456789abcdef", "ffffffffffffffffffffffffffffffff"
ENV = {"AGENT_DSN_KEY": KEY, "SENTRY_CLIENT_SECRET": "hook-secret"}


def start(home, **serve):
    serve = {"dsn": [{"project": 7, "key_env": "AGENT_DSN_KEY", "service": "widgets-api"}], **serve}
    return Server(HookApp(home, parse_config({"serve": serve}), ENV), "127.0.0.1", 0).start()


@pytest.fixture
def srv(ledger, home):
    s = start(home)
    yield s
    s.close()


def dsn(srv, key=KEY, project=7) -> str:
    return f"http://{key}@{srv.host}:{srv.port}/{project}"


def errors(ledger):
    return [dict(r) for r in ledger.all("SELECT id, fingerprint, service, class, frames, count, environment, "
                                          "release, message FROM errors ORDER BY first_seen, id")]


def metric(srv, outcome: str, kind: str) -> int:
    _, body, _ = call(srv.url, "/metrics")
    for line in body.decode().splitlines():
        if line.startswith(f'agent_sentry_items_total{{outcome="{outcome}",type="{kind}"}}'):
            return int(float(line.split()[-1]))
    return 0


PY_APP = """
import json, sys, sentry_sdk
seen = []
def keep(event, hint):
    seen.append(event)
    return event
sentry_sdk.init(dsn=sys.argv[1], debug=True, traces_sample_rate=1.0, release="widgets@1.2",
                environment="production", before_send=keep, shutdown_timeout=5)

def line_total(item):
    return item["qty"] * item["price"]

def checkout(cart):
    return sum(line_total(i) for i in cart)

try:
    checkout([{"price": 3}])
except KeyError as exc:
    sentry_sdk.capture_exception(exc)
with sentry_sdk.start_transaction(name="checkout"):
    pass
scope = sentry_sdk.get_isolation_scope()
scope.start_session(session_mode="application")
scope.end_session()
sentry_sdk.flush(timeout=5)
with open(sys.argv[2], "w") as f:
    json.dump(seen[0], f, default=str)
if len(sys.argv) > 3:
    checkout([{"qty": None, "price": 2}])   # unhandled: the excepthook integration sends it, then the process exits 1
"""


def run_py_app(tmp_path, url: str, unhandled: bool) -> tuple[subprocess.CompletedProcess, dict]:
    script = tmp_path / "app.py"
    script.write_text(textwrap.dedent(PY_APP))
    dump = tmp_path / "event.json"
    argv = [sys.executable, str(script), url, str(dump)] + (["unhandled"] if unhandled else [])
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": ""}, cwd=tmp_path)
    return proc, json.loads(dump.read_text())


def sdk_complaints(stderr: str) -> list[str]:
    """What the SDK logs when a send failed (it never raises into the app)."""
    words = ("Unexpected status code", "ERROR", "rate limit", "Failed", "error sending")
    return [line for line in stderr.splitlines() if any(w in line for w in words)]


def test_python_sdk_capture_and_unhandled_become_one_error_and_other_items_are_dropped(srv, ledger, tmp_path):
    proc, event = run_py_app(tmp_path, dsn(srv), unhandled=True)
    assert proc.returncode == 1 and "TypeError" in proc.stderr, proc.stderr[-2000:]
    assert sdk_complaints(proc.stderr) == [], proc.stderr[-3000:]
    rows = errors(ledger)
    assert [(r["service"], r["class"], r["environment"], r["release"]) for r in rows] == [
        ("widgets-api", "KeyError", "production", "widgets@1.2"),
        ("widgets-api", "TypeError", "production", "widgets@1.2")], rows
    frames = json.loads(rows[0]["frames"])
    assert [f.split(":")[-1] for f in frames[-3:]] == ["checkout", "<genexpr>", "line_total"], frames
    assert rows[0]["count"] == 1 and rows[1]["count"] == 1
    # the transaction and the session were accepted and dropped: nothing stored for them, counted for /metrics
    assert metric(srv, "accepted", "event") == 2
    assert metric(srv, "dropped", "transaction") == 1 and metric(srv, "dropped", "session") >= 1
    # the same exception through the Sentry integration webhook (same service) deduplicates into the same error
    body = json.dumps({"action": "created", "data": {"event": {**event, "tags": {"service": "widgets-api"}}}})
    code, out, _ = call(srv.url, "/hooks/sentry", body.encode(),
                        {"Sentry-Hook-Signature": sig("hook-secret", body.encode(), ""),
                         "Sentry-Hook-Resource": "event_alert", "Content-Type": "application/json",
                         "Sentry-Hook-Timestamp": str(int(time.time()))})
    assert code == 202, out
    assert json.loads(out)["errors"] == [rows[0]["id"]] and json.loads(out)["new"] == 0
    assert errors(ledger)[0]["count"] == 2


def test_sdk_retry_of_the_same_event_counts_once(srv, ledger):
    event = {"event_id": "a" * 32, "platform": "python", "level": "error",
             "exception": {"values": [{"type": "KeyError", "value": "'qty'", "stacktrace": {"frames": [
                 {"filename": "widgets/pricing.py", "function": "line_total", "lineno": 3, "in_app": True}]}}]}}
    body = wire_envelope({"event_id": "a" * 32}, [("event", json.dumps(event).encode())])
    for _ in range(2):
        code, out, _ = post_envelope(srv, body)
        assert code == 200 and json.loads(out) == {"id": "a" * 32}
    assert [r["count"] for r in errors(ledger)] == [1]


NODE_APP = """
const Sentry = require(process.argv[2]);
Sentry.init({ dsn: process.argv[3], release: "widgets@1.2", environment: "production", tracesSampleRate: 1.0,
              debug: true });
function lineTotal(item) { return item.qty.value * 2; }
function checkout(cart) { return cart.map(lineTotal); }
try { checkout([{}]); } catch (e) { Sentry.captureException(e); }
Sentry.startSpan({ name: "checkout" }, () => {});
Sentry.flush(5000).then(() => { setTimeout(() => checkout([{}]), 10); });
"""


def test_node_sdk_capture_and_unhandled_become_errors(srv, ledger, tmp_path):
    assert NODE_SDK.exists(), "run scripts/ci-sentry-sdks (installs @sentry/node into .cache/sentry-node)"
    node = shutil.which("node")
    assert node, "node is not installed"
    script = tmp_path / "app.js"
    script.write_text(NODE_APP)
    proc = subprocess.run([node, str(script), str(NODE_SDK), dsn(srv)], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "TypeError" in proc.stderr, proc.stderr[-2000:]
    assert not [line for line in (proc.stdout + proc.stderr).splitlines()
                if "Error while sending" in line or "status code" in line.lower()], proc.stdout[-2000:]
    rows = errors(ledger)
    assert len(rows) == 2 and {r["class"] for r in rows} == {"TypeError"}, rows
    assert all(r["service"] == "widgets-api" and r["release"] == "widgets@1.2" for r in rows)
    for r in rows:   # the handled call and the unhandled one came through different callers: two call sites
        assert json.loads(r["frames"])[-1].endswith(":lineTotal"), r["frames"]
    assert rows[0]["fingerprint"] != rows[1]["fingerprint"]
    assert metric(srv, "accepted", "event") == 2 and metric(srv, "dropped", "span") + \
        metric(srv, "dropped", "transaction") >= 1


def test_rate_limit_answers_429_and_the_sdk_backs_off(ledger, home, tmp_path):
    srv = start(home, max_events_per_minute=1)
    try:
        script = tmp_path / "burst.py"
        script.write_text(textwrap.dedent("""
            import sys, sentry_sdk
            sentry_sdk.init(dsn=sys.argv[1], debug=True)
            for name in ("a", "b", "c", "d"):
                try:
                    raise ValueError(name)
                except ValueError as exc:
                    sentry_sdk.capture_exception(exc)
                sentry_sdk.flush(timeout=5)
        """))
        proc = subprocess.run([sys.executable, str(script), dsn(srv)], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert len(errors(ledger)) == 1
        refused = metric(srv, "refused", "rate_limited")
        assert refused == 1, (refused, proc.stderr[-3000:])   # after the first 429 the SDK stopped sending
        code, out, headers = post_envelope(srv, wire_envelope({}, [("event", json.dumps(
            {"message": "boom", "level": "error"}).encode())]))
        assert code == 429 and json.loads(out)["error"].startswith("over serve.max_events_per_minute")
        assert int(headers["Retry-After"]) >= 1 and headers["X-Sentry-Rate-Limits"].endswith(":project")
    finally:
        srv.close()


# --------------------------------------------------------------------------- bad input, by raw HTTP


def wire_envelope(header: dict, items: list[tuple[str, bytes]], with_length=True) -> bytes:
    out = [json.dumps(header).encode()]
    for typ, payload in items:
        head = {"type": typ, **({"length": len(payload)} if with_length else {})}
        out += [json.dumps(head).encode(), payload]
    return b"\n".join(out) + b"\n"


def post_envelope(srv, body: bytes, key=KEY, project=7, encoding=None, query=False):
    headers = {"Content-Type": "application/x-sentry-envelope"}
    if encoding:
        headers["Content-Encoding"] = encoding
    path = f"/api/{project}/envelope/"
    if query:
        path += f"?sentry_key={key}&sentry_version=7"
    elif key is not None:
        headers["X-Sentry-Auth"] = f"Sentry sentry_version=7, sentry_client=test/1, sentry_key={key}"
    return call(srv.url, path, body, headers)


EVENT = json.dumps({"message": "boom", "level": "error", "exception": {"values": [{"type": "ValueError",
                    "value": "boom"}]}}).encode()


@pytest.mark.parametrize("case", ["wrong-key", "no-key", "unknown-project", "malformed", "oversized", "bomb-gzip",
                                  "bomb-br", "bad-encoding", "not-an-event", "short-payload"])
def test_bad_input_is_refused_with_json_and_stores_nothing(ledger, home, case):
    srv = start(home, max_body_bytes=16384)
    try:
        before = errors(ledger)
        body, kw = wire_envelope({}, [("event", EVENT)]), {}
        if case == "wrong-key":
            kw["key"] = OTHER
        elif case == "no-key":
            kw["key"] = None
        elif case == "unknown-project":
            kw["project"] = 8
        elif case == "malformed":
            body = b'{}\n{"type": "session", "length": 2}\n{}\n{not json\n'
        elif case == "oversized":
            body = wire_envelope({}, [("event", b'{"message": "' + b"x" * 20000 + b'"}')])
        elif case == "bomb-gzip":
            body, kw["encoding"] = gzip.compress(b"{}\n" + b" " * 10_000_000), "gzip"
        elif case == "bomb-br":
            body, kw["encoding"] = brotli.compress(b"{}\n" + b" " * 10_000_000), "br"
        elif case == "bad-encoding":
            kw["encoding"] = "zstd"
        elif case == "not-an-event":
            body = wire_envelope({}, [("event", b'{"level": "error"}')])
        elif case == "short-payload":
            body = b'{}\n{"type": "event", "length": 500}\n{"message": "x"}\n'
        code, out, headers = post_envelope(srv, body, **kw)
        want = {"wrong-key": 401, "no-key": 401, "unknown-project": 404, "malformed": 400, "oversized": 413,
                "bomb-gzip": 413, "bomb-br": 413, "bad-encoding": 415, "not-an-event": 400, "short-payload": 400}
        assert code == want[case], out
        assert headers["Content-Type"] == "application/json"
        reason = json.loads(out)["error"]
        assert "\n" not in reason
        if case == "malformed":
            assert reason.startswith("line 4 (item header)"), reason
        if case == "not-an-event":
            assert reason.startswith("item 1 (event)"), reason
        assert errors(ledger) == before
    finally:
        srv.close()


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", None])
def test_encodings_and_query_auth_and_store_endpoint(srv, ledger, encoding):
    body = wire_envelope({"event_id": "b" * 32}, [("session", b'{"status": "ok"}'), ("event", EVENT)],
                         with_length=False)
    packed = {"gzip": gzip.compress, "deflate": zlib.compress, "br": brotli.compress, None: lambda b: b}[encoding](body)
    code, out, _ = post_envelope(srv, packed, encoding=encoding, query=True)
    assert code == 200 and json.loads(out) == {"id": "b" * 32}, out
    # the legacy store endpoint takes one event as JSON
    legacy = json.dumps({"event_id": "c" * 32, "message": "boom", "level": "error",
                         "exception": {"values": [{"type": "ValueError", "value": "boom"}]}}).encode()
    code, out, _ = call(srv.url, "/api/7/store/", legacy, {"X-Sentry-Auth": f"Sentry sentry_key={KEY}",
                                                           "Content-Type": "application/json"})
    assert code == 200 and json.loads(out) == {"id": "c" * 32}, out
    rows = errors(ledger)
    assert [(r["class"], r["count"]) for r in rows] == [("ValueError", 2)]


def test_envelope_parser_lengths_newlines_and_errors():
    payload = b'{"a": "line1\\nline2"}\nraw\nbytes'
    data = (b'{"event_id": "e1"}\n' + b'{"type": "attachment", "length": %d}\n' % len(payload) + payload + b"\n"
            + b'{"type": "event"}\n{"message": "m"}')
    env = wire.parse(data)
    assert env.event_id == "e1" and [i.type for i in env.items] == ["attachment", "event"]
    assert env.items[0].payload == payload and env.items[1].payload == b'{"message": "m"}'
    with pytest.raises(wire.EnvelopeError, match=r"^line 1"):
        wire.parse(b"[]\n")
    with pytest.raises(wire.EnvelopeError, match=r"^line 2 \(item header\): no item type"):
        wire.parse(b'{}\n{"length": 2}\n{}\n')
    assert wire.sentry_key("Sentry sentry_key=abc, sentry_version=7", None) == "abc"
    assert wire.sentry_key(None, "sentry_version=7&sentry_key=xyz") == "xyz"
    assert wire.sentry_key("Sentry sentry_version=7", "") is None


def test_sdk_fingerprint_groups_as_sentry_does(ledger):
    from agent.intake.formats import parse
    from agent.intake.store import ingest

    def ev(cls, fp=None, fn="a"):
        e = {"exception": {"values": [{"type": cls, "value": "x", "stacktrace": {"frames": [
            {"filename": "app.py", "function": fn, "in_app": True}]}}]}, "tags": {"service": "s"}}
        return json.dumps({**e, **({"fingerprint": fp} if fp else {})})

    parsed = parse("\n".join([ev("KeyError", ["db-down"]), ev("ValueError", ["db-down"], fn="b"),
                              ev("KeyError", ["{{ default }}"]), ev("KeyError"),
                              ev("KeyError", ["{{ default }}", "tenant-1"])]), "jsonl")
    result = ingest(ledger, parsed.events)
    ids = result.error_ids
    rows = {r["id"]: r["count"] for r in ledger.all("SELECT id, count FROM errors")}
    # a custom fingerprint groups any class together; `{{ default }}` alone is the default grouping
    assert len(rows) == 3 and sorted(rows.values()) == [1, 2, 2], (ids, rows)


def test_doctor_prints_the_dsn_and_warns_about_plain_http_beyond_loopback():
    from agent.app.doctor import check_sentry_dsn

    cfg = parse_config({"serve": {"url": "http://agent.internal:8080",
                                  "dsn": [{"project": 7, "key_env": "AGENT_DSN_KEY", "service": "widgets-api"},
                                          {"project": 9, "key_env": "UNSET_DSN_KEY", "service": "billing"}]}})
    first, second = check_sentry_dsn(cfg, ENV)
    assert first.ok and first.warn and f"http://{KEY}@agent.internal:8080/7" in first.detail
    assert "TLS" in first.fix
    assert not second.ok and "UNSET_DSN_KEY" in second.detail and "token_hex" in second.fix
    local = check_sentry_dsn(parse_config({"serve": {"url": "https://errors.example/agent", "dsn": [
        {"project": 7, "key_env": "AGENT_DSN_KEY", "service": "widgets-api"}]}}), ENV)[0]
    assert local.ok and not local.warn and f"https://{KEY}@errors.example/agent/7" in local.detail


@pytest.mark.parametrize("dsn, error", [
    ([{"project": "x7", "key_env": "K", "service": "s"}], "serve.dsn[0].project: expected a positive integer"),
    ([{"project": 7, "key_env": "K"}], "serve.dsn[0].service: expected a non-empty string"),
    ([{"project": 7, "key_env": "K", "service": "s", "repo": "acme/nope"}], "serve.dsn[0].repo: expected one of"),
    ([{"project": 7, "key_env": "K", "service": "s"}] * 2, "serve.dsn[1].project: project 7 is listed twice"),
    ({"project": 7}, "serve.dsn: expected a list"),
])
def test_dsn_config_errors_name_the_key(dsn, error):
    from agent.config import ConfigError

    with pytest.raises(ConfigError, match=error.replace("[", r"\[").replace("]", r"\]")):
        parse_config({"serve": {"dsn": dsn}})


def test_group_commit_one_bad_delivery_fails_alone_and_a_key_twice_in_a_batch_is_a_replay(ledger, home,
                                                                                          monkeypatch):
    """Concurrent hook deliveries share one transaction (serve.GroupCommit); a fault injected into one delivery's
    ingest (monkeypatched: nothing else makes a valid event fail inside the transaction) fails that request only."""
    import threading

    import agent.intake.store as store
    import agent.ledger.hooks as hooks
    from agent.intake.formats import Event
    from agent.ledger import Ledger, ledger_path
    from agent.app.serve import GroupCommit

    real_ingest, real_batch, sizes = store.ingest, hooks.accept_batch, []

    def ingest(led, events, **kw):
        if events and events[0].message == "poison":
            raise ValueError("injected fault")
        return real_ingest(led, events, **kw)

    def accept_batch(led, deliveries):
        sizes.append(len(deliveries))
        return real_batch(led, deliveries)

    monkeypatch.setattr(store, "ingest", ingest)
    monkeypatch.setattr(hooks, "accept_batch", accept_batch)
    commits, local = GroupCommit(), threading.local()

    def conn():
        if not hasattr(local, "led"):
            local.led = Ledger.open(ledger_path(home), create=False)
        return local.led

    jobs = [(f"k{i}", "poison" if i == 3 else f"boom {i}") for i in range(12)] + [("k0", "boom 0")]
    results: dict[int, object] = {}
    gate = threading.Barrier(len(jobs))

    def send(i, key, message):
        gate.wait()
        try:
            results[i] = commits.submit("events", key, [Event(message=message, cls="E", service="s")], conn)
        except ValueError as exc:
            results[i] = exc

    threads = [threading.Thread(target=send, args=(i, *job)) for i, job in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert isinstance(results[3], ValueError)
    replays = [i for i, r in results.items() if not isinstance(r, Exception) and r[0]]
    assert len(replays) == 1 and replays[0] in (0, 12)
    assert ledger.scalar("SELECT count(*) FROM hook_deliveries") == 11
    assert max(sizes) > 1, sizes       # some requests shared a transaction
