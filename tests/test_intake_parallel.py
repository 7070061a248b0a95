"""JSONL intake in chunks: batch boundaries, and the forked workers `agent error ingest` uses, which must store
exactly what the in-process path stores (rows, counts, events, rejections and their order)."""

import json
import os

import pytest

from agent import AgentError
from agent.intake import store
from agent.intake.formats import Event, Frame
from agent.intake.store import ingest_text, prepare
from agent.ledger import Ledger

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
    events = [(e["kind"], json.dumps(e["payload"], sort_keys=True)) for e in ledger.events()]
    return rows, events


def _summary(result) -> dict:
    d = result.to_json()
    d["errors"] = len(d["errors"])
    return d


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
    assert [(e["kind"], e["payload"]["count"]) for e in ledger.events()] == [("error.ingested", 4), ("error.seen", 2)]


def test_forked_workers_store_exactly_what_the_in_process_path_stores(tmp_path, ledger, no_clock, monkeypatch):
    text = _text(437)                                          # 44 chunks of 10 lines, the last one short
    ref = Ledger.open(tmp_path / "ref.db")                     # in-process, on SQLite
    expected, _ = ingest_text(ref, text, "auto", chunk_lines=10, workers=0)
    pids = tmp_path / "pids"
    real = store._prepare_batch

    def spy(events, result):
        with open(pids, "a") as fh:
            fh.write(f"{os.getpid()}\n")
        return real(events, result)

    monkeypatch.setattr(store, "_prepare_batch", spy)         # (the forked workers inherit it)
    got, used = ingest_text(ledger, text, "auto", chunk_lines=10, workers=2)
    workers = set(pids.read_text().split())
    assert workers and str(os.getpid()) not in workers and len(pids.read_text().split()) == 44
    assert used == "jsonl"
    assert _summary(got) == _summary(expected)
    assert expected.rejected > 10 and expected.deduplicated > 100
    assert [(r.line, r.reason) for r in got.rejections] == [(r.line, r.reason) for r in expected.rejections]
    assert _stored(ledger) == _stored(ref)
    assert "hunter" not in json.dumps(_stored(ledger))
    ref.close()


def test_few_chunks_stay_in_process(tmp_path, ledger, monkeypatch):
    monkeypatch.setattr(store, "_ingest_parallel", lambda *a, **k: pytest.fail("no pool for two chunks"))
    result, _ = ingest_text(ledger, _text(20), "jsonl", chunk_lines=10, workers=2)
    assert result.new == 3


def test_a_worker_that_dies_fails_the_ingest_and_keeps_the_chunks_before_it(tmp_path, ledger, no_clock, monkeypatch):
    real = store._prepare_batch

    def dies_on_the_third(events, result):
        if events and events[0].line == 21:
            os._exit(3)
        return real(events, result)

    monkeypatch.setattr(store, "_prepare_batch", dies_on_the_third)
    with pytest.raises(AgentError, match=r"worker process died; the events before line (\d+) are stored") as err:
        ingest_text(ledger, _text(60), "jsonl", chunk_lines=10, workers=2)
    # the chunks whose results arrived before the death was seen are stored (usually lines 1-20), whole; none after
    before = int(err.value.args[0].split("before line ")[1].split()[0])
    assert before in (1, 11, 21)
    events = sum(1 for i in range(before - 1) if i % 17 != 7 and i % 23 != 11 and i % 29 != 13)
    assert (ledger.scalar("SELECT sum(count) FROM errors") or 0) == events


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
