"""Dedupe events into the ``errors`` table: redact, fingerprint, count.

While an error is open, fixing or skipped, a new occurrence with its fingerprint only bumps
``count``/``last_seen`` (and ``first_seen`` for late arrivals) and replaces the latest redacted
excerpt and message.  A resolved error that recurs opens a new error row: the fix did not hold,
and the old row's history (conclusion, task, PR) stays as it was.  Events: one ``error.ingested``
per new row and one ``error.seen`` per existing row per batch (with the batch's count), in the
same transaction as the rows.  Every string field is capped, made valid UTF-8 and redacted before it
is fingerprinted or stored; all of that (and the fingerprint) happens before the write transaction
starts, so a slow event never holds the ledger's write lock.  An event that cannot be prepared is
rejected on its own (naming its line); the others are stored.
"""

from __future__ import annotations

import contextlib
import functools
import gc
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

from agent.intake.fingerprint import _in_app as frame_in_app
from agent.intake.fingerprint import fingerprint, frame_key, signature_of
from agent.intake.formats import MAX_NAME, MAX_SHORT, Event, Frame, Rejected, cap, valid_text
from agent.infra.redact import redact
from agent.ledger import Ledger, now
from agent.infra.text import one_line
# the error rows, their occurrences and the source cursors are written by the errors aggregate's record operations
from agent.ledger.errors import (error_detail, get_cursor, list_errors, new_error_id,  # noqa: F401
                                 record_occurrences, set_cursor)

ACTIVE_STATES = ("open", "fixing", "skipped")
MAX_EXCERPT = 8000
MAX_MESSAGE = 2000
BATCH = 5000


@dataclass
class IngestResult:
    new: int = 0
    deduplicated: int = 0
    rejected: int = 0
    error_ids: list[str] = field(default_factory=list)     # every error touched, in first-touched order
    rejections: list[Rejected] = field(default_factory=list)

    def add_rejected(self, items: Iterable[Rejected]) -> None:
        for r in items:
            self.rejections.append(r)
            self.rejected += 1

    def to_json(self) -> dict:
        return {"new": self.new, "deduplicated": self.deduplicated, "rejected": self.rejected,
                "errors": self.error_ids, "rejections": [{"line": r.line, "reason": r.reason}
                                                         for r in self.rejections]}


@dataclass
class Prepared:
    fingerprint: str
    service: str
    environment: str
    cls: str
    message: str
    signature: str
    frames: list[str]
    repo: str | None
    level: str
    release: str | None
    timestamp: str
    raw_excerpt: str            # redacted only when written (only the latest per error is kept)


MAX_FRAMES_STORED = 256
# Before redaction a field may be longer than what is stored, so a secret is not cut in half first.
PRE_MESSAGE = 4 * MAX_MESSAGE
PRE_EXCERPT = 2 * MAX_EXCERPT


def clean(value: object, limit: int) -> str:
    """Any value as valid, capped, redacted text (None -> "")."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= 256 and limit >= 256:
        return _clean_short(text)
    return redact(valid_text(cap(text, limit)))


@functools.lru_cache(maxsize=16384)
def _clean_short(text: str) -> str:
    return redact(valid_text(text))


def clean_name(value: object, limit: int) -> str:
    """A name (service, environment, class, a frame's parts, repo, level, release) as clean text on one line
    without controls: names reach titles, email headers, specs and commit templates. Names recur from event to
    event, so a short one is cleaned once (cached)."""
    if type(value) is str and len(value) <= 256:
        return _short_name(value)
    if value is None:
        return ""
    return one_line(clean(value, limit))


@functools.lru_cache(maxsize=16384)
def _short_name(text: str) -> str:
    return one_line(_clean_short(text))


def prepare(ev: Event, default_ts: str | None = None) -> Prepared:
    """Cap, clean and redact every field of an event, then fingerprint the redacted values."""
    service = clean_name(ev.service, MAX_SHORT) or "unknown"
    environment = clean_name(ev.environment, MAX_SHORT) or "unknown"
    cls = clean_name(ev.cls, MAX_NAME)
    message = cap(clean(ev.message, PRE_MESSAGE), MAX_MESSAGE)
    labels, keys, in_app = [], [], []
    for f in ev.frames[-MAX_FRAMES_STORED:]:
        file, function, module, flag = f.file, f.function, f.module, f.in_app
        if type(f) is Frame and type(file) is str and type(function) is str and type(module) is str \
                and len(file) <= 256 and len(function) <= 256 and len(module) <= 256 \
                and (flag is None or type(flag) is bool):
            label, key, app = _frame_parts(file, function, module, flag)
        else:
            label, key, app = _frame_parts_of(type(f)(file=clean_name(file, MAX_NAME),
                                                      function=clean_name(function, MAX_NAME),
                                                      module=clean_name(module, MAX_NAME), in_app=flag))
        labels.append(label)
        keys.append(key)
        in_app.append(app)
    causes = [clean(c, MAX_NAME) for c in ev.causes[:32]]
    sig = signature_of(keys, in_app, causes, message)
    group_cls = cls
    if ev.grouping:
        # the SDK's own fingerprint replaces the grouping, as in Sentry: `{{ default }}` stands for the stack
        # signature and class; without it, events of any class with the same values are one error
        default = [g.replace(" ", "") == "{{default}}" for g in ev.grouping]
        sig = "fingerprint: " + " | ".join(sig if d else clean(g, MAX_NAME) for g, d in zip(ev.grouping, default))
        group_cls = cls if any(default) else ""
    ts = ev.timestamp if isinstance(ev.timestamp, str) and len(ev.timestamp) <= 64 else None
    return Prepared(
        fingerprint=fingerprint(service, group_cls, sig, environment), service=service, environment=environment,
        cls=cls, message=message, signature=sig, frames=labels,
        repo=clean_name(ev.repo, MAX_SHORT) or None, level=clean_name(ev.level or "error", MAX_SHORT),
        release=clean_name(ev.release, MAX_SHORT) or None, timestamp=valid_text(ts or default_ts or now()),
        raw_excerpt=valid_text(cap(ev.excerpt or message, PRE_EXCERPT)))


def _frame_parts_of(f) -> tuple[str, str, bool]:
    """A cleaned frame's (label, signature key, in-app)."""
    return f.label(), frame_key(f.file or "", f.function or "", f.module or ""), frame_in_app(f)


@functools.lru_cache(maxsize=16384)
def _frame_parts(file: str, function: str, module: str, in_app: bool | None) -> tuple[str, str, bool]:
    """:func:`_frame_parts_of` for a frame of short names (a frame recurs from event to event: cleaned once)."""
    return _frame_parts_of(Frame(file=_short_name(file), function=_short_name(function), module=_short_name(module),
                                 in_app=in_app))


def _chunks(events: Iterable[Event], size: int) -> Iterator[list[Event]]:
    chunk: list[Event] = []
    for ev in events:
        chunk.append(ev)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def ingest(ledger: Ledger, events: Iterable[Event], *, actor: str = "script", source: str | None = None,
           cursor: tuple[str, str] | None = None, batch: int | None = BATCH,
           result: IngestResult | None = None, guard: Callable[[Any], None] | None = None) -> IngestResult:
    """Store events (deduplicated) in one transaction per ``batch`` events.

    With ``cursor=(source_key, value)`` everything goes in ONE transaction together with the
    cursor, so a crash either keeps both or neither (no double counting on the next pull).
    ``guard(conn)`` runs first inside each write transaction and may raise to write nothing (a source's pull
    checks there that it still holds the source's lease and that the cursor is still the one it read).
    Redaction and fingerprinting happen before each transaction starts.
    """
    result = result or IngestResult()
    size = None if cursor is not None else batch
    chunks = [list(events)] if size is None else _chunks(events, size)
    wrote_cursor = False
    for chunk in chunks:
        touched = _prepare_batch(chunk, result)
        record_occurrences(ledger, touched, actor, source, cursor, result, guard)
        wrote_cursor = True
    if cursor is not None and not wrote_cursor:
        set_cursor(ledger, cursor[0], cursor[1], guard)
    return result


def _prepare_batch(events: list[Event], result: IngestResult) -> dict[str, dict]:
    """Outside any transaction: prepare every event (one that fails is rejected alone) and group them by
    fingerprint; the latest occurrence's excerpt is redacted here too."""
    ts_default = now()
    touched: dict[str, dict] = {}
    for ev in events:
        try:
            p = prepare(ev, ts_default)
        except Exception as exc:  # noqa: BLE001 - one event never costs the others
            result.add_rejected([Rejected(getattr(ev, "line", 0), f"could not be stored ({type(exc).__name__})")])
            continue
        t = touched.get(p.fingerprint)
        if t is None:
            t = {"p": p, "count": 0, "first": p.timestamp, "last": p.timestamp, "latest": p}
            touched[p.fingerprint] = t
        t["count"] += 1
        if p.timestamp < t["first"]:
            t["first"] = p.timestamp
        if p.timestamp >= t["last"]:
            t["last"] = p.timestamp
            t["latest"] = p
    for t in touched.values():
        t["excerpt"] = cap(redact(t["latest"].raw_excerpt), MAX_EXCERPT)
    return touched


def ingest_text(ledger: Ledger, text: str, fmt: str = "auto", *, service: str | None = None,
                environment: str | None = None, repo: str | None = None, actor: str = "script",
                source: str | None = None, chunk_lines: int = BATCH) -> tuple[IngestResult, str]:
    """Parse and ingest a whole input; returns (result, the format used).

    JSONL is parsed and stored ``chunk_lines`` lines at a time (bounded memory, one transaction per
    chunk); Sentry documents and log text are parsed whole, since an event may span many lines.
    """
    from agent.intake.formats import parse, sniff
    from agent.infra.textio import one_newline

    text = one_newline(text[1:] if text.startswith("\ufeff") else text)   # (a file's BOM: agent.infra.textio.decode)
    chosen = sniff(text) if fmt == "auto" else fmt
    result = IngestResult()
    kw = {"service": service, "environment": environment, "repo": repo}
    with _fewer_collections():
        if chosen != "jsonl":
            parsed = parse(text, chosen, **kw)
            result.add_rejected(parsed.rejected)
            ingest(ledger, parsed.events, actor=actor, source=source or f"ingest:{chosen}", result=result)
            return result, chosen
        for start, chunk in _line_chunks(text, chunk_lines):
            parsed = parse(chunk, "jsonl", line_base=start + 1, **kw)
            result.add_rejected(parsed.rejected)
            ingest(ledger, parsed.events, actor=actor, source=source or "ingest:jsonl", result=result, batch=None)
    return result, chosen


def _line_chunks(text: str, size: int) -> Iterator[tuple[int, str]]:
    """(index of the first line, text of ``size`` lines) pieces of ``text``, cut where its line ends are (no list
    of every line: a 100 MB input is not held twice)."""
    pos, first, n = 0, 0, len(text)
    while pos < n:
        end = pos
        for _ in range(size):
            end = text.find("\n", end) + 1
            if end == 0:
                end = n
                break
        yield first, text[pos:end]
        pos, first = end, first + size


@contextlib.contextmanager
def _fewer_collections() -> Iterator[None]:
    """Intake allocates millions of short-lived, acyclic objects: the cycle collector's default first-generation
    threshold (700) runs it thousands of times for nothing (~8% of a 100,000-event ingest). A larger one while
    intake runs; the old thresholds come back after."""
    old = gc.get_threshold()
    gc.set_threshold(max(old[0], 50_000), *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)
