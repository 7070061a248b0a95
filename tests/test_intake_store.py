"""Dedupe into the errors table on a real SQLite ledger, and the canary test: no planted secret
reaches any byte of the ledger (main file and WAL) or any other file in the home."""

import json
import os
import subprocess
import sys

from agent.intake.formats import Event, Frame, parse
from agent.intake.store import ingest, list_errors
from agent.ledger import Ledger, eventlog, ledger_path

from conftest import ledger_bytes, on_postgres
from intake_payloads import JAVA_LOG, NODE_LOG, PY_LOG, sentry_java_event, sentry_python_event


def _ev(msg="Order 7 not found", ts="2024-05-01T10:00:00.000000Z", fn="load", service="api"):
    return Event(message=msg, cls="app.NotFound", frames=[Frame(file="app/orders.py", function=fn)],
                 service=service, environment="production", timestamp=ts, excerpt=f"NotFound: {msg}")


def test_dedupe_counts_first_last_and_latest_excerpt(tmp_path):
    ledger = Ledger.open(ledger_path(tmp_path))
    r1 = ingest(ledger, [_ev("Order 7 not found", "2024-05-01T10:00:00.000000Z"),
                         _ev("Order 8 not found", "2024-05-01T09:00:00.000000Z"),
                         _ev("Order 9 not found", "2024-05-01T11:00:00.000000Z"),
                         _ev(fn="save")])
    assert (r1.new, r1.deduplicated) == (2, 2)
    r2 = ingest(ledger, [_ev("Order 10 not found", "2024-05-01T08:00:00.000000Z")])   # late arrival
    assert (r2.new, r2.deduplicated) == (0, 1)
    row = ledger.one("SELECT * FROM errors WHERE id = ?", (r1.error_ids[0],))
    assert row["count"] == 4
    assert row["first_seen"] == "2024-05-01T08:00:00.000000Z" and row["last_seen"] == "2024-05-01T11:00:00.000000Z"
    assert row["message"] == "Order 9 not found" and row["excerpt"] == "NotFound: Order 9 not found"
    assert len(row["id"]) == 16 and all(c in "0123456789abcdef" for c in row["id"])
    kinds = [(e["kind"], e["payload"]["count"]) for e in eventlog.events(ledger)]
    assert kinds == [("error.ingested", 3), ("error.ingested", 1), ("error.seen", 1)]


def test_skipped_keeps_deduping_resolved_opens_new_row(tmp_path):
    ledger = Ledger.open(ledger_path(tmp_path))
    (eid,) = ingest(ledger, [_ev()]).error_ids
    with ledger.tx() as c:
        c.execute("UPDATE errors SET state = 'skipped' WHERE id = ?", (eid,))
    assert ingest(ledger, [_ev()]).error_ids == [eid]
    with ledger.tx() as c:
        c.execute("UPDATE errors SET state = 'resolved' WHERE id = ?", (eid,))
    r = ingest(ledger, [_ev()])
    assert r.new == 1 and r.error_ids != [eid]
    rows = ledger.all("SELECT id, state, count, fingerprint FROM errors ORDER BY created_at")
    assert [(x["state"], x["count"]) for x in rows] == [("resolved", 2), ("open", 1)]
    assert rows[0]["fingerprint"] == rows[1]["fingerprint"]


def test_same_bug_across_formats_and_requests_groups(tmp_path):
    ledger = Ledger.open(ledger_path(tmp_path))
    events = parse(json.dumps(sentry_java_event(1234))).events + parse(json.dumps(sentry_java_event(99))).events
    events += parse(json.dumps(sentry_python_event("'sku-1'", "r1", "a@example.com"))).events
    events += parse(json.dumps(sentry_python_event("'sku-2'", "r2", "b@example.com"))).events
    events += parse(json.dumps(sentry_python_event("'sku-3'", "r3", function="discount_for"))).events
    r = ingest(ledger, events)
    assert (r.new, r.deduplicated) == (3, 2)
    assert sorted(x["count"] for x in list_errors(ledger)) == [1, 2, 2]


CANARIES = {
    "bearer": "Bearer CANARYbearer0123456789",
    "cookie": "Cookie: sessionid=CANARYcookie01",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJDQU5BUllqd3QifQ.CANARYjwtSignature01",
    "aws": "AKIACANARY0AWS0KEY01",
    "github": "ghp_CANARYgithubTOKEN0123456789abcdefghij",
    "email": "canary.person@canary-mail.example.com",
    "hex": "cafe" * 10,
    "kv": "password=CANARYpassword01",
    "kv-json": '"api_key": "CANARYapikey01"',
    "url": "https://deploy:CANARYurlpw01@db.example.com/x",
}
NEEDLES = ["CANARYbearer0123456789", "CANARYcookie01", "CANARYjwtSignature01", "eyJzdWIiOiJDQU5BUllqd3QifQ",
           "AKIACANARY0AWS0KEY01", "CANARYgithubTOKEN", "canary.person@", "cafecafecafecafecafecafecafecafe",
           "CANARYpassword01", "CANARYapikey01", "CANARYurlpw01"]


def _jsonl_with_canaries() -> str:
    fields = ["service", "environment", "level", "message", "class", "timestamp", "repo", "release"]
    lines = []
    for secret in CANARIES.values():
        for f in fields + ["stack", "frames"]:
            rec = {"service": "api", "environment": "production", "level": "error", "message": "boom 1",
                   "class": "KeyError", "timestamp": "2024-05-01T10:00:00Z", "repo": "acme/api", "release": "1.0"}
            if f in fields:
                rec[f] = f"x {secret} y"
            elif f == "stack":
                rec["stack"] = (f'Traceback (most recent call last):\n  File "/app/{secret}.py", line 3, in f\n'
                                f"    call({secret})\nKeyError: {secret}\n")
            else:
                rec["stack"] = [{"file": f"/srv/{secret}/x.js", "function": secret, "line": 3}]
            lines.append(json.dumps(rec))
    return "\n".join(lines) + "\n"


def _sentry_with_canaries() -> list[dict]:
    out = []
    for secret in CANARIES.values():
        ev = sentry_python_event(value=f"bad {secret}", request_id=secret, email=secret)
        ev["tags"]["service"] = f"svc {secret}"
        ev["environment"] = secret
        ev["release"] = secret
        ev["message"] = secret
        ev["logentry"] = {"message": secret, "formatted": secret}
        ev["extra"] = {"token": secret}
        ev["request"]["url"] = f"https://shop.example.com/?q={secret}"
        ev["request"]["headers"]["Authorization"] = secret
        ev["culprit"] = secret
        ev["transaction"] = f"/checkout/{secret}"
        frame = ev["exception"]["values"][0]["stacktrace"]["frames"][-1]
        frame.update(filename=f"w/{secret}.py", function=f"fn_{secret}", module=secret, context_line=secret)
        ev["exception"]["values"][0]["type"] = f"Err{secret}"
        ev["exception"]["values"][0]["module"] = secret
        out.append(ev)
    return out


def _log_with_canaries() -> str:
    chunks = []
    for secret in CANARIES.values():
        chunks.append(f"2024-05-01 10:00:01,456 ERROR [{secret}] failed for {secret}\n"
                      f"Traceback (most recent call last):\n  File \"/app/{secret}/v.py\", line 4, in h_{secret}\n"
                      f"    go({secret!r})\nRuntimeError: {secret} again\n")
        chunks.append(f"java.lang.IllegalStateException: {secret}\n\tat com.acme.{secret}.Svc.run(Svc.java:3)\n"
                      f"Caused by: java.io.IOException: {secret}\n\tat x.Y.z(Y.java:1)\n")
        chunks.append(f"2024-05-01 10:00:02 ERROR upstream said {secret}\n")
    return "".join(chunks)


def test_canary_secrets_never_reach_the_ledger_file(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {"AGENT_HOME": str(home), "PATH": "/usr/bin:/bin"}
    if on_postgres():
        env["AGENT_LEDGER_URL"] = os.environ["AGENT_LEDGER_URL"]
    (tmp_path / "c.jsonl").write_text(_jsonl_with_canaries())
    (tmp_path / "s.json").write_text(json.dumps(_sentry_with_canaries()))
    (tmp_path / "t.log").write_text(_log_with_canaries() + PY_LOG + JAVA_LOG + NODE_LOG)
    for name, fmt in (("c.jsonl", "auto"), ("s.json", "sentry"), ("t.log", "traceback")):
        p = subprocess.run([sys.executable, "-m", "agent", "error", "ingest", str(tmp_path / name), "--format", fmt,
                            "--service", "svc"], env=env, capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        for needle in NEEDLES:
            assert needle not in p.stdout + p.stderr
    ledger = Ledger.open(ledger_path(home))
    assert ledger.scalar("SELECT sum(count) FROM errors") >= 10 * 10 + 10 + 30
    stored = json.dumps(ledger.all("SELECT * FROM errors")) + json.dumps(ledger.all("SELECT * FROM events"))
    assert "[redacted:" in stored
    blobs = {}
    for f in home.rglob("*"):
        if f.is_file():
            blobs[f.name] = f.read_bytes()
    if on_postgres():
        blobs["the PostgreSQL ledger (every row)"] = ledger_bytes(home)
        ledger.close()
    else:
        assert "ledger.db-wal" in blobs or "ledger.db" in blobs
        ledger.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        ledger.close()
        blobs["ledger.db (after checkpoint)"] = (home / "ledger.db").read_bytes()
    for name, data in blobs.items():
        for needle in NEEDLES:
            assert needle.encode() not in data, f"{needle} found in {name}"
    # the ledger is still a good ledger
    ledger = Ledger.open(ledger_path(home))
    assert ledger.integrity() == "ok"
    ledger.close()
