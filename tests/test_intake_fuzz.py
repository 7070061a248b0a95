"""A bounded fuzzer over every intake format: generated hostile lines and blocks (wrong types, non-finite and
huge numbers, lone surrogates, deep nesting, broken and truncated traces, Sentry shapes with junk in every
field) sit between two valid events.  For every example: no exception escapes parsing or storing, both valid
neighbours are stored, and the work the patterns are given grows linearly (four copies of an input cost at
most about four times one copy, counted by ``intake_hostile.WorkCounter``, not by a clock)."""

import json

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agent.intake.formats import parse
from agent.intake.store import ingest_text, prepare
from agent.ledger import Ledger

from intake_hostile import WorkCounter

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                          HealthCheck.too_slow])

SURROGATES = st.sampled_from(["\ud800", "\udfff", "\udc80x", "\ud83d"])
TEXT = st.one_of(st.text(max_size=40), SURROGATES, st.sampled_from([
    "token=abc", "eyJ" * 20, "a (" * 30, "a." * 40, " " * 200, "web/sessions.py:321", "Bearer ", "x@", "://",
    '"', "'", "\\", "{", "[", "Traceback (most recent call last):"]))
NUMBERS = st.one_of(st.integers(min_value=-(10**40), max_value=10**40), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([2**31, -1, 10**4000]))
JSON = st.recursive(st.one_of(st.none(), st.booleans(), NUMBERS, TEXT),
                    lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(TEXT, kids, max_size=4)),
                    max_leaves=12)
SENTRY_KEYS = ["event_id", "exception", "entries", "threads", "tags", "message", "logentry", "platform", "level",
               "timestamp", "release", "environment", "request", "culprit", "transaction", "values", "frames",
               "stacktrace", "type", "value", "module", "data", "in_app", "lineno", "filename", "function"]
SHAPED = st.recursive(st.one_of(st.none(), NUMBERS, TEXT),
                      lambda kids: st.one_of(st.lists(kids, max_size=3),
                                             st.dictionaries(st.sampled_from(SENTRY_KEYS), kids, max_size=5)),
                      max_leaves=16)
RECORD_KEYS = ["message", "msg", "class", "type", "stack", "stacktrace", "traceback", "exc_info", "level", "service",
               "environment", "timestamp", "repo", "release", "error", "exception", "platform"]
RECORD = st.dictionaries(st.sampled_from(RECORD_KEYS), JSON, max_size=6)


def _json_line(value) -> str:
    text = json.dumps(value, allow_nan=True)
    return text.replace("10000000000", "1" + "0" * 4400, 1) if "10000000000" in text else text


JSON_LINE = st.one_of(JSON, SHAPED, RECORD).map(_json_line)
DEEP = st.integers(1, 50_000).map(lambda n: "[" * n + "]" * n)
TRACE_PIECES = st.sampled_from([
    "Traceback (most recent call last):", '  File "/app/a.py", line 3, in f', '  File "/app/b.py", line 1e999, in g',
    '  File "x", line ' + "9" * 5000 + ", in h", "    code()", "KeyError: 'k'", "ValueError", "",
    "During handling of the above exception, another exception occurred:", "java.lang.IllegalStateException: x",
    "\tat com.acme.A.b(A.java:1)", "\tat " + "a (" * 50, "    at f (/app/x.js:1:2)", "    at " + "x" * 300,
    "Caused by: java.io.IOException: y", "\t... 3 more", "2024-05-01 10:00:00 ERROR boom", "ERROR " + "a." * 100,
    "{", '{"level": "error"', "    " + " " * 500 + "File"])
TRACE_BLOCK = st.lists(TRACE_PIECES, min_size=1, max_size=8).map("\n".join)
BAD = st.lists(st.one_of(JSON_LINE, DEEP, TRACE_BLOCK, TEXT.map(lambda t: t.replace("\n", " "))),
               min_size=1, max_size=4).map("\n".join)


WORDS = {1: "one", 2: "two"}


def good(i: int) -> str:
    return json.dumps({"service": "api", "environment": "production", "level": "error", "class": "KeyError",
                       "message": f"good event {WORDS[i]}", "event_id": f"{i:032x}",
                       "stack": [{"file": f"app/m{i}.py", "function": f"f{i}"}]})


def _not_item_header(bad: str) -> bool:
    """An envelope item header legitimately governs the line after it (Sentry format), so none is generated."""
    for line in bad.split("\n"):
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(obj, dict) and "type" in obj and set(obj) <= {"type", "length", "content_type", "filename",
                                                                     "attachment_type", "item_count"}:
            return False
    return True


def _check(tmp_path, fmt: str, bad: str) -> None:
    text = good(1) + "\n" + bad + "\n" + good(2) + "\n"
    r = parse(text, fmt)
    for ev in r.events:
        prepare(ev)
    ledger = Ledger.open(tmp_path / f"fuzz-{fmt}.db")
    try:
        with ledger.tx() as c:
            c.execute("DELETE FROM errors")
        ingest_text(ledger, text, fmt)
        messages = {x["message"] for x in ledger.all("SELECT message FROM errors")}
    finally:
        ledger.close()
    assert {"good event one", "good event two"} <= messages, (fmt, messages, r.rejected)


def _work(monkeypatch, text: str, fmt: str) -> int:
    counter = WorkCounter()
    with monkeypatch.context() as m:
        counter.install(m)
        for ev in parse(text, fmt).events:
            prepare(ev)
    return counter.total


@pytest.mark.slow
@SETTINGS
@given(bad=BAD.filter(_not_item_header))
@example(bad="\tat com.acme.A.b(A.java:1)")          # found by this test: a JSON line read as a Java header
@example(bad='Traceback (most recent call last):\n  File "/app/a.py", line 3, in f')
@example(bad='{"event_id": "e", "exception": {"values": 5}, "tags": 7, "entries": "x"}')
def test_fuzz_every_format_keeps_neighbours_and_never_raises(tmp_path, bad):
    for fmt in ("auto", "jsonl", "sentry", "traceback"):
        _check(tmp_path, fmt, bad)


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bad=BAD.filter(_not_item_header), fmt=st.sampled_from(["auto", "jsonl", "sentry", "traceback"]))
def test_fuzz_work_grows_linearly_with_the_input(monkeypatch, bad, fmt):
    one = good(1) + "\n" + bad + "\n" + good(2) + "\n"
    w1 = _work(monkeypatch, one, fmt)
    w4 = _work(monkeypatch, one * 4, fmt)
    assert w4 <= 4.5 * w1 + 2_000, (w1, w4)
