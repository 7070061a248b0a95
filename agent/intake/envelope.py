"""Sentry's ingest wire, as unmodified SDKs send it to a DSN: auth, content encodings and envelopes.

Pure functions over bytes; `agent serve` (agent/app/serve.py) routes ``POST /api/<project>/envelope/`` and the legacy
``POST /api/<project>/store/`` here, then stores the event items through the same parser and ingest path as every
other Sentry payload (``formats.event_from_sentry``), so the same bug from an SDK, the Sentry webhook and the
Sentry API gets one fingerprint.

Wire facts (Sentry's developer documentation, "Envelopes" and "Authentication"):
- auth is ``X-Sentry-Auth: Sentry sentry_key=<public key>, sentry_version=7, ...`` or the same pairs as query
  parameters (``?sentry_key=...``, which browser and Node SDKs use);
- an envelope is a JSON header line, then items: a JSON item header line (``type``, optional ``length`` in bytes),
  then the payload: exactly ``length`` bytes (then an optional newline) or, without ``length``, up to the next
  newline or the end;
- bodies may carry ``Content-Encoding: gzip``, ``deflate`` or ``br``.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field
from urllib.parse import parse_qs

ENCODINGS = ("identity", "gzip", "x-gzip", "deflate", "br")
CHUNK = 64 * 1024


class EnvelopeError(ValueError):
    """Malformed input; ``code`` is the HTTP status it deserves (400 malformed, 413 too large, 415 encoding)."""

    def __init__(self, message: str, code: int = 400):
        super().__init__(message)
        self.code = code


@dataclass
class Item:
    type: str
    header: dict
    payload: bytes


@dataclass
class Envelope:
    header: dict
    items: list[Item] = field(default_factory=list)

    @property
    def event_id(self) -> str | None:
        value = self.header.get("event_id")
        return value if isinstance(value, str) and 0 < len(value) <= 64 else None


def sentry_key(auth_header: str | None, query_string: str | None) -> str | None:
    """The ``sentry_key`` of an ``X-Sentry-Auth`` header (``Sentry k=v, k=v``), else of the query string."""
    if auth_header:
        text = auth_header.strip()
        if text[:7].lower() == "sentry ":
            text = text[7:]
        for part in text.split(","):
            name, _, value = part.strip().partition("=")
            if name.strip() == "sentry_key" and value.strip():
                return value.strip()
    if query_string:
        values = parse_qs(query_string, max_num_fields=32).get("sentry_key")
        if values and values[0]:
            return values[0]
    return None


def decode(body: bytes, encoding: str | None, limit: int) -> bytes:
    """Undo ``Content-Encoding`` with the decoded size capped at ``limit`` bytes (a bomb stops at the cap, 413)."""
    enc = (encoding or "identity").strip().lower()
    if enc in ("", "identity"):
        out = body
    elif enc in ("gzip", "x-gzip", "deflate"):
        out = _inflate(body, enc, limit)
    elif enc == "br":
        out = _unbrotli(body, limit)
    else:
        raise EnvelopeError(f"Content-Encoding {enc[:40]!r} is not supported; send gzip, deflate, br or none", 415)
    if len(out) > limit:
        raise EnvelopeError(f"decoded body is over the limit of {limit} bytes (serve.max_body_bytes)", 413)
    return out


def _too_large(limit: int) -> EnvelopeError:
    return EnvelopeError(f"decoded body is over the limit of {limit} bytes (serve.max_body_bytes)", 413)


def _inflate(body: bytes, enc: str, limit: int) -> bytes:
    # gzip: wbits 16+15; deflate: zlib-wrapped as HTTP says, though some clients send it raw (wbits -15)
    attempts = (16 + zlib.MAX_WBITS,) if enc != "deflate" else (zlib.MAX_WBITS, -zlib.MAX_WBITS)
    for i, wbits in enumerate(attempts):
        d = zlib.decompressobj(wbits)
        try:
            out = d.decompress(body, limit + 1)
            if len(out) > limit or d.unconsumed_tail:
                raise _too_large(limit)
            out += d.flush(limit + 1 - len(out))
        except zlib.error as exc:
            if i + 1 < len(attempts):
                continue
            raise EnvelopeError(f"body is not valid {enc} ({exc})") from None
        if len(out) > limit:
            raise _too_large(limit)
        if not d.eof:
            raise EnvelopeError(f"body is not valid {enc} (truncated stream)")
        return out
    raise EnvelopeError(f"body is not valid {enc}")  # pragma: no cover - the loop returns or raises


def _unbrotli(body: bytes, limit: int) -> bytes:
    import brotli

    d = brotli.Decompressor()
    out = bytearray()
    try:
        for start in range(0, max(len(body), 1), CHUNK):
            out += d.process(body[start:start + CHUNK], output_buffer_limit=limit + 1 - len(out))
            while len(out) <= limit and not d.can_accept_more_data():
                more = d.process(b"", output_buffer_limit=limit + 1 - len(out))
                if not more:
                    break
                out += more
            if len(out) > limit:
                raise _too_large(limit)
    except brotli.error as exc:
        raise EnvelopeError(f"body is not valid br ({exc})") from None
    if not d.is_finished():
        raise EnvelopeError("body is not valid br (truncated stream)")
    return bytes(out)


def _json_obj(raw: bytes, what: str) -> dict:
    try:
        obj = json.loads(raw)
    except RecursionError:
        raise EnvelopeError(f"{what} is nested too deep") from None
    except ValueError as exc:
        raise EnvelopeError(f"{what} is not valid JSON ({getattr(exc, 'msg', exc)})") from None
    if not isinstance(obj, dict):
        raise EnvelopeError(f"{what} is not a JSON object")
    return obj


def parse(data: bytes, max_items: int = 1000) -> Envelope:
    """An envelope: header line, then (item header line, payload) pairs. Errors name the line."""
    pos, line = 0, 1

    def next_line() -> bytes:
        nonlocal pos, line
        end = data.find(b"\n", pos)
        end = len(data) if end < 0 else end
        chunk = data[pos:end]
        pos = end + 1
        line += 1
        return chunk

    header_line = next_line()
    if not header_line.strip():
        raise EnvelopeError("line 1: empty envelope header; an envelope starts with a JSON object line")
    env = Envelope(header=_json_obj(header_line, "line 1 (envelope header)"))
    while pos < len(data):
        at = line
        raw = next_line()
        if not raw.strip():
            continue          # trailing newlines
        head = _json_obj(raw, f"line {at} (item header)")
        typ = head.get("type")
        if not isinstance(typ, str) or not typ:
            raise EnvelopeError(f"line {at} (item header): no item type")
        length = head.get("length")
        if length is not None:
            if not isinstance(length, int) or isinstance(length, bool) or length < 0:
                raise EnvelopeError(f"line {at} (item header): length is not a byte count")
            if pos + length > len(data):
                raise EnvelopeError(f"line {at + 1}: payload of {typ} is shorter than its length {length}")
            payload = data[pos:pos + length]
            line += payload.count(b"\n")
            pos += length
            if data[pos:pos + 1] == b"\n":
                pos += 1
            line += 1
        else:
            payload = next_line() if pos <= len(data) else b""
        env.items.append(Item(type=typ, header=head, payload=payload))
        if len(env.items) > max_items:
            raise EnvelopeError(f"more than {max_items} items in one envelope")
    return env


def event_payload(item: Item, where: str) -> dict:
    """An ``event`` item's payload as a JSON object (400 naming the item otherwise)."""
    return _json_obj(item.payload, where)
