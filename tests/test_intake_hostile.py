"""Intake takes anything (issue 12): linear on inputs built to hurt, no traceback on any input, one bad line
never costs the others, one bug is one error, positions are never redacted.

Linearity is proven without clocks: every pattern is checked to be unable to backtrack over an unbounded
span (``intake_hostile.unbounded_backtracking``), patterns that must find something after a run can only
start where the run starts, and 1 MB inputs built against each old pattern go through (they took minutes to
hours before).  Timings live in bench/RESULTS.md (scripts/bench-ingest --only hostile).
"""

import json
import subprocess
import sys

import pytest

from agent.intake.fingerprint import signature
from agent.intake.formats import parse
from agent.infra.redact import redact
from agent.intake.store import ingest, ingest_text, prepare
from agent.ledger import Ledger

from intake_hostile import patterns, unbounded_backtracking
from intake_payloads import PY_LOG, sentry_python_event

MB = 1_000_000


def good(i: int) -> str:
    return json.dumps({"service": "api", "environment": "production", "level": "error", "class": "KeyError",
                       "message": f"good event {i}", "stack": [{"file": f"app/m{i}.py", "function": f"f{i}"}]})


def sandwich(bad: str) -> str:
    """A valid event on each side of ``bad``."""
    return good(1) + "\n" + bad + "\n" + good(2) + "\n"


# ------------------------------------------------------------------------------------------- 1. linear time


@pytest.mark.parametrize("name", sorted(patterns()))
def test_every_intake_pattern_is_linear_by_construction(name):
    assert unbounded_backtracking(patterns()[name]) == []


HOSTILE_REDACT = {
    "single token after a secret word": lambda n: "token" + "a" * n,
    "secret word after a long token": lambda n: "a" * n + "token",
    "repeated secret words": lambda n: "token" * (n // 5),
    "repeated keys": lambda n: "token=" * (n // 6),
    "unterminated quoted values": lambda n: 'token="' * (n // 7),
    "JWT prefixes": lambda n: "eyJ" * (n // 3),
    "JWT halves": lambda n: "eyJaaaaa." * (n // 9),
    "email local part": lambda n: "@ " + "a" * n,
    "email domains": lambda n: "token a@" + "a." * (n // 2),
    "url without @": lambda n: "a://" + "b:" * (n // 2),
    "private key begins": lambda n: "-----BEGIN " * (n // 11),
    "private key without end": lambda n: "-----BEGIN PRIVATE KEY-----" + "-----END " * (n // 9),
    "near-hex runs": lambda n: ("a" * 31 + "g") * (n // 32),
    "spaces after a header": lambda n: "cookie" + " " * n,
    "dotted key": lambda n: "secret" + ".a" * (n // 2),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_REDACT))
def test_redaction_takes_1mb_inputs_built_against_each_old_rule(name):
    text = HOSTILE_REDACT[name](MB)
    out = redact(text)
    assert redact(out) == out                      # idempotent, and it returned at all
    assert len(out) <= 3 * len(text) + 64          # markers are longer than tiny secrets, never more


def test_a_15kb_lane_summary_is_redacted_whole():
    secret = "ghp_" + "Z" * 36
    summary = "SUMMARY: " + "x" * 7_000 + "token" + "y" * 8_000 + f" pushed with {secret} token=hunter22"
    out = redact(summary)
    assert secret not in out and "hunter22" not in out and out.startswith("SUMMARY: xxx")


def test_hostile_log_lines_of_1mb_are_read():
    frame_spaces = ('Traceback (most recent call last):\n  File "/app/a.py", line 1, in f' + " " * MB +
                    "x\nKeyError: 'k'\n")
    node_parens = "TypeError: boom\n    at " + "a (" * (MB // 3) + "\n"
    header_dots = "ERROR " + "a." * (MB // 2) + "\n    at f (/app/x.js:1:1)\n"
    single_token = json.dumps({"level": "error", "message": "token" + "a" * MB}) + "\n"
    for text in (frame_spaces, node_parens, header_dots, single_token):
        r = parse(text)
        assert len(r.events) == 1 and not r.rejected
        p = prepare(r.events[0])
        assert len(p.message) < 2_100 and len(p.raw_excerpt) < 40_000


def test_parsing_and_redaction_happen_outside_the_write_transaction(tmp_path, monkeypatch):
    import agent.intake.store as store

    ledger = Ledger.open(tmp_path / "ledger.db")
    seen = []
    real = store.redact

    def watching(text):
        seen.append(ledger.conn.in_transaction)
        return real(text)

    monkeypatch.setattr(store, "redact", watching)
    result, _ = ingest_text(ledger, "".join(good(i) + "\n" for i in range(20)) + PY_LOG)
    assert result.new == 20 + 1 and seen and not any(seen)


# ------------------------------------------------------------------------------------- 2. never a traceback

DEEP = "[" * 200_000 + "]" * 200_000
CRASHERS = {
    "integer over 4,300 digits": '{"level": "error", "message": "m", "n": ' + "9" * 5_000 + "}",
    "frame line 1e999": json.dumps({"level": "error", "message": "m", "stack": [{"file": "a.py", "line": 1}]})
    .replace('"line": 1', '"line": 1e999'),
    "frame line Infinity": json.dumps({"level": "error", "message": "m", "stack": [{"file": "a.py", "line": 1}]})
    .replace('"line": 1', '"line": Infinity'),
    "frame line NaN": json.dumps({"level": "error", "message": "m", "stack": [{"file": "a.py", "line": 1}]})
    .replace('"line": 1', '"line": NaN'),
    "lone surrogate": '{"level": "error", "message": "bad \\ud800 text", "service": "\\udfff", '
                      '"stack": [{"file": "\\ud800.py", "function": "f\\udc00"}]}',
    "sentry tags a number": '{"event_id": "e", "level": "error", "message": "m", "tags": 5}',
    "sentry entries a number": '{"event_id": "e", "message": "m", "entries": 5}',
    "sentry exception.values a number": '{"event_id": "e", "message": "m", "exception": {"values": 5}}',
    "sentry frames a number": '{"event_id": "e", "exception": {"values": [{"type": "E", "stacktrace": {"frames": 5}}]}}',
    "sentry threads.values a number": '{"event_id": "e", "message": "m", "threads": {"values": 5}}',
    "sentry tags a list of numbers": '{"event_id": "e", "message": "m", "tags": [1, [2, 3], {"key": 4}]}',
    "nested 200,000 deep": '{"level": "error", "message": "m", "extra": ' + DEEP + "}",
    "array nested 200,000 deep": DEEP,
    "stack a number": '{"level": "error", "message": "m", "stack": 12}',
    "timestamp 1e999": '{"level": "error", "message": "m", "timestamp": 1e999}',
    "message a huge object": json.dumps({"level": "error", "message": {"k": ["v" * 1000] * 100}}),
}


@pytest.mark.parametrize("fmt", ["auto", "jsonl", "traceback"])
@pytest.mark.parametrize("name", sorted(CRASHERS))
def test_no_input_crashes_and_both_neighbours_are_ingested(tmp_path, name, fmt):
    ledger = Ledger.open(tmp_path / "ledger.db")
    text = sandwich(CRASHERS[name])
    result, _ = ingest_text(ledger, text, fmt)
    messages = {r["message"] for r in ledger.all("SELECT message FROM errors")}
    assert {"good event 1", "good event 2"} <= messages, (result.to_json(), messages)
    for r in result.rejections:
        assert r.line == 2 and "\n" not in r.reason
    stored = json.dumps(ledger.all("SELECT * FROM errors"))
    stored.encode("utf-8")                         # valid UTF-8: no lone surrogate was stored


def test_traceback_text_with_huge_and_non_finite_line_numbers(tmp_path):
    ledger = Ledger.open(tmp_path / "ledger.db")
    text = "".join(f'Traceback (most recent call last):\n  File "/app/a.py", line {n}, in f\n    x\nKeyError: {i}\n'
                   for i, n in enumerate(["9" * 5_000, "1e999", "Infinity", "12"]))
    result, used = ingest_text(ledger, text, "auto")
    assert used == "traceback" and not result.rejected
    assert ledger.scalar("SELECT sum(count) FROM errors") == 4


def test_sentry_shaped_lines_inside_log_text_never_crash(tmp_path):
    bad = [CRASHERS[k] for k in CRASHERS if k.startswith("sentry")]
    text = PY_LOG + "\n".join(bad) + "\n" + PY_LOG
    r = parse(text, "traceback")
    assert len([e for e in r.events if e.cls == "widgets.errors.CheckoutError"]) == 2


def test_the_cli_names_each_bad_line_and_never_prints_a_traceback(tmp_path):
    home = tmp_path / "home"
    home.mkdir()  # only `agent init` creates a home
    lines = [good(0)] + [v for v in CRASHERS.values()] + [good(99)]
    f = tmp_path / "hostile.jsonl"
    f.write_text("\n".join(lines) + "\n", encoding="utf-8")
    env = {"AGENT_HOME": str(home), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    p = subprocess.run([sys.executable, "-m", "agent", "error", "ingest", str(f), "--json"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert "Traceback" not in p.stderr and p.returncode in (0, 1), p.stderr
    doc = json.loads(p.stdout)
    named = {r["line"] for r in doc["rejections"]}
    assert named <= set(range(2, len(lines))) and 1 not in named and len(lines) not in named
    for line in p.stderr.splitlines():
        assert line.startswith(f"{f}: line ") or line.startswith("agent: "), line
    ledger = Ledger.open(home / "ledger.db")
    messages = {r["message"] for r in ledger.all("SELECT message FROM errors")}
    assert {"good event 0", "good event 99"} <= messages


# ------------------------------------------------------------------------------- 3. nothing good is lost


def test_one_crashing_line_never_costs_the_valid_events_of_its_file(tmp_path):
    ledger = Ledger.open(tmp_path / "ledger.db")
    lines = [good(i) for i in range(40)]
    lines.insert(20, CRASHERS["integer over 4,300 digits"])
    lines.insert(30, CRASHERS["nested 200,000 deep"])
    result, _ = ingest_text(ledger, "\n".join(lines) + "\n", "auto")
    assert result.new == 40 and [r.line for r in result.rejections] == [21, 31]


def test_a_truncated_traceback_never_swallows_the_next():
    truncated = 'Traceback (most recent call last):\n  File "/app/a.py", line 3, in handler\n    do()\n'
    text = truncated + PY_LOG.split("\n", 2)[2]        # the next one starts right after
    r = parse(text, "traceback")
    assert [e.cls for e in r.events] == ["widgets.errors.CheckoutError"]
    assert [(x.line, x.reason) for x in r.rejected] == [(1, "Python traceback ends before its exception line")]
    r = parse(truncated + "2024-05-01 10:00:00 INFO fine\n" + truncated + "KeyError: 'k'\n", "traceback")
    assert [e.cls for e in r.events] == ["KeyError"] and [x.line for x in r.rejected] == [1]


def test_auto_reads_json_lines_and_tracebacks_in_one_log():
    text = (json.dumps({"level": "error", "message": "disk full", "service": "w"}) + "\n" + PY_LOG +
            json.dumps({"level": "info", "message": "fine"}) + "\n" +
            json.dumps({"message": "no level", "class": "app.Broken"}) + "\n")
    r = parse(text)
    assert r.format == "traceback" and not r.rejected
    assert [(e.cls, e.message) for e in r.events] == [
        ("", "disk full"), ("widgets.errors.CheckoutError", "cannot price cart 981"), ("app.Broken", "no level")]
    assert [e.line for e in r.events] == [1, 3, PY_LOG.count("\n") + 3]


# ------------------------------------------------------------------------------------ 4. one bug, one error


def test_same_bug_from_sentry_jsonl_and_a_log_under_a_deploy_root_is_one_error(tmp_path):
    ledger = Ledger.open(tmp_path / "ledger.db")
    sentry = json.dumps(sentry_python_event())        # filenames relative to the app, module set, in_app flags
    log = ("2024-05-01 10:00:01,456 ERROR [django.request] Internal Server Error: /checkout\n"
           "Traceback (most recent call last):\n"
           '  File "/usr/local/lib/python3.11/site-packages/django/core/handlers/exception.py", line 55, in inner\n'
           "    response = get_response(request)\n"
           '  File "/srv/releases/2024-05-01/widgets/views.py", line 42, in checkout\n'
           "    total = price_for(cart)\n"
           '  File "/srv/releases/2024-05-01/widgets/pricing.py", line 17, in price_for\n'
           "    return PRICES[sku]\nKeyError: 'sku-9'\n")
    jsonl = json.dumps({"service": "widgets-api", "environment": "production", "level": "error",
                        "class": "KeyError", "message": "'sku-7'",
                        "stack": [{"file": "/app/widgets/views.py", "function": "checkout", "line": 40},
                                  {"file": "/app/widgets/pricing.py", "function": "price_for", "line": 19}]})
    for text, fmt in ((sentry, "sentry"), (log, "traceback"), (jsonl + "\n", "jsonl")):
        r, _ = ingest_text(ledger, text, fmt, service="widgets-api", environment="production")
        assert not r.rejected
    rows = ledger.all("SELECT count, signature FROM errors")
    assert [x["count"] for x in rows] == [3], rows


def test_jsonl_stack_strings_group_by_their_frames_not_the_message(tmp_path):
    stacks = {
        "python frames without the exception line": '  File "/app/o.py", line 9, in get\n    raise NotFound(i)\n',
        "node frames without a header": "    at get (/app/o.js:9:3)\n    at main (/app/m.js:1:1)",
        "traceback.format_exception() lines": ["Traceback (most recent call last):\n",
                                               '  File "/app/o.py", line 9, in get\n    raise NotFound(i)\n',
                                               "app.NotFound: gone\n"],
    }
    for name, stack in stacks.items():
        ledger = Ledger.open(tmp_path / f"{len(name)}.db")
        events = [json.dumps({"level": "error", "class": "app.NotFound", "stack": stack,
                              "message": f"order for {who} not found ({extra})"})
                  for who, extra in (("alice", "Bearer abcdefgh12345"), ("bob", "retry later"))]
        r, _ = ingest_text(ledger, "\n".join(events) + "\n", "jsonl")
        assert (r.new, r.deduplicated) == (1, 1), name


def test_frames_compare_by_a_location_without_deploy_roots():
    from agent.intake.formats import Frame

    def sig(*files, module=""):
        return signature([Frame(file=f, function="load", module=module) for f in files])

    assert sig("/srv/app/current/orders/service.py") == sig("orders/service.py") == sig("service.py")
    assert sig("OrderService.java", module="com.acme.OrderService") == sig("", module="com.acme.OrderService")
    assert sig("app:///src/cart.js") == sig("/home/deploy/app/src/cart.js") == sig("webpack://shop/./src/cart.js")
    assert sig("/app/orders/service.py") != sig("/app/orders/repository.py")
    assert sig("/app/a/__init__.py") != sig("/app/b/__init__.py")


# --------------------------------------------------------------------------------- 5. positions stay


@pytest.mark.parametrize("text", [
    "web/sessions.py:321", 'File "/app/web/auth.py", line 12', "at tokens.py:45 in refresh",
    "    at issue (/app/src/tokens.js:12:5)", "at com.acme.AuthService.login(AuthService.java:42)",
    "SessionStore.kt:88", "secret_store.rb:7", "password_reset.ts:19:3",
])
def test_redaction_never_touches_file_positions(text):
    assert redact(text) == text


def test_secret_keys_are_still_redacted_next_to_positions():
    out = redact("web/sessions.py:321 session=abc123 token: xyz789 auth.py:12 password=hunter2")
    assert out == ("web/sessions.py:321 session=[redacted:secret] token: [redacted:secret] auth.py:12 "
                   "password=[redacted:secret]")


@pytest.mark.parametrize("text", ["spring.datasource.password:1234", "db.pin: 1234", "token:1234", "auth.token=abc"])
def test_dotted_keys_that_name_a_secret_are_still_keys(text):
    assert redact(text).endswith("[redacted:secret]")


def test_a_file_name_is_not_a_key():
    assert redact('{"session.py": "changed", "tokens.js": 3}') == '{"session.py": "changed", "tokens.js": 3}'


def test_events_with_positions_in_messages_keep_them(tmp_path):
    ledger = Ledger.open(tmp_path / "ledger.db")
    ingest(ledger, parse(json.dumps({"level": "error", "class": "KeyError",
                                     "message": "failed at web/sessions.py:321 and tokens.py:9"}) + "\n").events)
    assert ledger.scalar("SELECT message FROM errors") == "failed at web/sessions.py:321 and tokens.py:9"


def test_auto_keeps_json_lines_whose_first_line_is_broken_as_jsonl():
    text = "{oops\n" + good(1) + "\n[1, 2]\n" + good(2) + "\n"
    r = parse(text)
    assert r.format == "jsonl" and [x.line for x in r.rejected] == [1, 3] and len(r.events) == 2
    log = "[2024-05-01 10:00:00] ERROR boom\n[2024-05-01 10:00:01] INFO fine\n" + good(1) + "\n"
    assert parse(log).format == "traceback" and len(parse(log).events) == 2


def test_a_quoted_secret_longer_than_the_scan_bound_leaks_no_tail():
    out = redact('config token="' + "S" * 5_000 + 'TAIL" rest\nnext line')
    assert "TAIL" not in out and "SSSS" not in out and out.endswith("\nnext line")
