"""JSONL intake in chunks (one transaction per chunk: batch boundaries), and the cached per-frame path of
``prepare`` against the general one."""

import json

import pytest

from agent.intake import store
from agent.intake.formats import Event, Frame
from agent.intake.store import ingest_text, prepare
from agent.ledger import Ledger, eventlog

ROW = ("fingerprint, service, environment, class, message, excerpt, signature, frames, repo, level, release, count, "
       "first_seen, last_seen, state")


def _line(i: int) -> str:
    fn = f"handle_{i % 3}"
    stack = ("Traceback (most recent call last):\n"
             f'  File "/app/svc/server.py", line {i}, in dispatch\n    return {fn}(request)\n'
             f'  File "/app/svc/h.py", line {i + 1}, in {fn}\n    x = ORDERS[k]\n'
             f"KeyError: 'order-{i}'\n")
    rec = {"service": "svc", "environment": "production", "level": "error", "class": "KeyError",
           "message": f"order {i} not found password=hunter{i}", "stack": stack,
           "timestamp": f"2024-05-01T10:{i // 60 % 60:02d}:{i % 60:02d}Z"}
    if i % 17 == 7:
        return "{not json"                                     # a parse rejection inside a chunk
    if i % 23 == 11:
        return json.dumps({"service": "svc", "level": "error"})  # no message nor class: rejected by the parser
    if i % 29 == 13:
        return ""                                              # a blank line (skipped, still counted as a line)
    return json.dumps(rec)


def _text(n: int) -> str:
    return "\n".join(_line(i) for i in range(n)) + "\n"


def _stored(ledger: Ledger) -> tuple[list, list]:
    rows = [tuple(r.values()) for r in ledger.all(f"SELECT {ROW} FROM errors ORDER BY fingerprint, first_seen")]
    events = [(e["kind"], json.dumps(e["payload"], sort_keys=True)) for e in eventlog.events(ledger)]
    return rows, events


@pytest.fixture
def no_clock(monkeypatch):
    """Events without a timestamp take the time of ingest: fixed, so two ingests compare equal."""
    monkeypatch.setattr(store, "now", lambda: "2024-06-01T00:00:00.000000Z")


def test_chunk_of_n_plus_one_events_rejections_and_duplicates_across_the_boundary(tmp_path, no_clock):
    ledger = Ledger.open(tmp_path / "l.db")
    lines = [json.dumps({"level": "error", "class": "KeyError", "message": f"m {i}", "service": "s",
                         "timestamp": f"2024-05-01T10:00:0{i}Z"}) for i in range(6)]
    lines.insert(3, "{broken")                               # line 4: rejected in the middle of the first chunk
    result, used = ingest_text(ledger, "\n".join(lines) + "\n", "jsonl", chunk_lines=5)
    assert used == "jsonl"
    assert (result.new, result.deduplicated, result.rejected) == (1, 5, 1)
    assert [r.line for r in result.rejections] == [4]
    row = ledger.one("SELECT count, first_seen, last_seen, message FROM errors")
    assert row["count"] == 6 and row["message"] == "m 5"
    assert (row["first_seen"], row["last_seen"]) == ("2024-05-01T10:00:00.000000Z", "2024-05-01T10:00:05.000000Z")
    # one transaction per chunk: lines 1-5 (four events), then lines 6-7 (the same error, seen twice more)
    assert [(e["kind"], e["payload"]["count"]) for e in eventlog.events(ledger)] == [("error.ingested", 4),
                                                                                      ("error.seen", 2)]


def test_many_chunks_with_rejections_and_blank_lines_inside_them(tmp_path, ledger, no_clock):
    n, size = 437, 10                          # 44 chunks, the last one short
    result, used = ingest_text(ledger, _text(n), "auto", chunk_lines=size)
    bad = [i for i in range(n) if i % 17 == 7 or i % 23 == 11]
    good = [i for i in range(n) if i not in bad and i % 29 != 13]
    assert used == "jsonl"
    assert [r.line for r in result.rejections] == [i + 1 for i in bad]        # in input order, numbered right
    assert (result.new, result.deduplicated, result.rejected) == (3, len(good) - 3, len(bad))
    assert ledger.scalar("SELECT sum(count) FROM errors") == len(good)
    # one transaction per chunk of 10 lines: per chunk, its events are counted once, whatever error they join
    per_chunk = [sum(1 for i in good if i // size == c) for c in range(-(-n // size))]
    counts: list[int] = []
    for e in eventlog.events(ledger):
        counts.append(e["payload"]["count"])
    assert sum(counts) == len(good) and len(counts) == sum(len({i % 3 for i in good if i // size == c})
                                                            for c in range(len(per_chunk)))
    rows, _ = _stored(ledger)
    assert "hunter" not in json.dumps(rows) and all(r[-2] > r[-3] for r in rows)   # last_seen after first_seen


def test_cached_frame_path_equals_the_general_one():
    class Other(Frame):      # any other frame type takes the general path
        pass

    frames = [("/srv/app/pricing.py", "total", "", None), ("site-packages/lib/x.py", "get", "", None),
              ("OrderService.java", "run", "com.acme.OrderService", True), ("a\x1b[31m.py", "f\u202e", "m", False),
              ("", "", "", None), ("x" * 300, "y" * 2000, "z", None)]
    for kind in (Frame, Other):
        evs = [Event(message="boom token=abc123def", cls="KeyError", service="s",
                     frames=[kind(file=f, function=fn, module=m, in_app=a) for f, fn, m, a in frames])]
        p = prepare(evs[0], "2024-01-01T00:00:00.000000Z")
        if kind is Frame:
            first = p
    assert (p.signature, p.frames, p.fingerprint) == (first.signature, first.frames, first.fingerprint)
    assert first.frames[0] == "/srv/app/pricing.py:total" and "pricing:total" in first.signature
    assert "lib" not in first.signature.split(" > ")[0]          # the library frame is left out (not in-app)
    assert "\x1b" not in "".join(first.frames) and "\u202e" not in "".join(first.frames)
