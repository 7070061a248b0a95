"""`agent watch errors`: pull every configured source once, each with a persisted cursor.

Kinds:
- ``loki``: ``/loki/api/v1/query_range`` from the cursor (last entry's nanosecond timestamp) to now,
  forward, paged; each stream's lines are joined in time order and only error events are kept
  (multi-line traces, error-level lines, error-level JSON lines).
- ``file``: a file, glob or directory of logs, tailed by (inode, byte offset) per file.  A trace
  that reaches the end of a file still growing is held back until the next pull; a rotated or
  truncated file is read from the start.
- ``sentry``: the Sentry web API's latest events of one project (``/api/0/projects/ORG/PROJECT/events/?full=true``),
  newest first, paged back until the last event already seen.
The events of one pull and the new cursor are written in ONE transaction, so a crash never
double counts.  Credentials: ``auth_env``/``token_env`` name environment variables; netrc is the
fallback; nothing secret is ever read from the config file.
"""

from __future__ import annotations

import glob
import json
import os
import re
import time
from pathlib import Path
from typing import Any, Mapping

from agent import AgentError
from agent.config import SourceConfig
from agent.intake.formats import Event, ParseResult, Rejected, event_from_sentry, parse, parse_log_text
from agent.infra.redact import redact
from agent.intake.store import IngestResult, get_cursor, ingest
from agent.ledger import Ledger, leases
from agent.infra.textio import sniff_bom, without_escapes

LOKI_LOOKBACK_S = 3600
LOKI_LIMIT = 1000
LOKI_MAX_PAGES = 20
SENTRY_MAX_PAGES = 10
FILE_MAX_BYTES = 64 * 1024 * 1024   # per file per pull; the rest waits for the next pull
SOURCE_LEASE_S = 60.0   # the `source:<key>` lease a pull holds, renewed every third of it while it runs


class Pull:
    """What one source produced: events, rejections (already named), and the cursor to store."""

    def __init__(self, events: list[Event], rejected: list[Rejected], cursor: str | None):
        self.events, self.rejected, self.cursor = events, rejected, cursor


# --------------------------------------------------------------------------- loki

def _loki_labels_service(labels: dict) -> str | None:
    for k in ("service", "service_name", "app", "job", "container"):
        if labels.get(k):
            return labels[k]
    return None


def pull_loki(src: SourceConfig, cursor: str | None, env: Mapping[str, str] | None = None,
              now_ns: int | None = None, limit: int = LOKI_LIMIT) -> Pull:
    from agent.infra import http

    base = (src.url or "").rstrip("/")
    url = f"{base}/loki/api/v1/query_range"
    headers, auth = http.credentials(base, src.auth_env, env, what=f"loki source {redact(base)}")
    if src.tenant:  # multi-tenant Loki (and Grafana Cloud) select the tenant with this header
        headers = {**headers, "X-Scope-OrgID": src.tenant}
    end = now_ns if now_ns is not None else time.time_ns()
    start = int(cursor) + 1 if cursor else end - LOKI_LOOKBACK_S * 1_000_000_000
    streams: dict[str, tuple[dict, list[tuple[int, str]]]] = {}
    max_ts = int(cursor) if cursor else None
    bad_entries = 0
    for _page in range(LOKI_MAX_PAGES):
        doc, _ = http.get_json(url, params={"query": src.query, "start": str(start), "end": str(end),
                                            "limit": str(limit), "direction": "forward"},
                               headers=headers, auth=auth, pinned=http.origin(base))
        if not isinstance(doc, dict) or doc.get("status") != "success":
            raise AgentError(f"loki {redact(base)}: unexpected answer (status {doc.get('status')!r})"
                             if isinstance(doc, dict) else f"loki {redact(base)}: unexpected answer")
        data = doc.get("data") if isinstance(doc.get("data"), dict) else {}
        if data.get("resultType") != "streams":
            raise AgentError(f"loki {redact(base)}: query returned {data.get('resultType')!r}, not log streams; "
                             "use a log query such as {app=\"widgets\"}")
        count = 0
        page_max = None
        for stream in data.get("result") if isinstance(data.get("result"), list) else []:
            if not isinstance(stream, dict):
                continue
            labels = stream.get("stream") if isinstance(stream.get("stream"), dict) else {}
            key = json.dumps(labels, sort_keys=True, default=str)
            entries = streams.setdefault(key, (labels, []))[1]
            for value in stream.get("values") if isinstance(stream.get("values"), list) else []:
                entry = _loki_entry(value)
                if entry is None:
                    bad_entries += 1
                    continue
                ts, line = entry
                entries.append((ts, line))
                count += 1
                page_max = ts if page_max is None or ts > page_max else page_max
        if page_max is not None:
            max_ts = page_max if max_ts is None else max(max_ts, page_max)
        if count < limit or page_max is None:
            break
        start = page_max + 1
    events: list[Event] = []
    rejected: list[Rejected] = []
    for labels, entries in streams.values():
        entries.sort(key=lambda e: e[0])
        result = parse_log_text("\n".join(line.rstrip("\n") for _, line in entries))
        for ev in result.events:
            ev.service = ev.service or src.service or _loki_labels_service(labels)
            ev.environment = ev.environment or src.environment or labels.get("env") or labels.get("environment")
            events.append(ev)
        rejected.extend(result.rejected)
    if bad_entries:
        rejected.append(Rejected(0, f"{bad_entries} loki entr{'y' if bad_entries == 1 else 'ies'} not a "
                                    "[nanosecond timestamp, line] pair"))
    return Pull(events, rejected, str(max_ts) if max_ts is not None else cursor)


def _loki_entry(value: Any) -> tuple[int, str] | None:
    """A Loki stream value ``["<ns timestamp>", "<line>", {structured metadata}?]`` -> (ts, line), or None."""
    if not isinstance(value, list) or len(value) < 2 or not isinstance(value[1], str):
        return None
    ts = value[0]
    if not (isinstance(ts, str) and 0 < len(ts) <= 20 and ts.isascii() and ts.isdigit()):
        return None
    return int(ts), value[1]


# --------------------------------------------------------------------------- files

def expand_paths(pattern: str) -> list[Path]:
    p = Path(os.path.expanduser(pattern))
    if p.is_dir():
        return sorted(x for x in p.iterdir() if x.is_file() and not x.name.startswith("."))
    if any(ch in pattern for ch in "*?["):
        return sorted(Path(x) for x in glob.glob(os.path.expanduser(pattern)) if os.path.isfile(x))
    return [p] if p.is_file() else []


def pull_files(src: SourceConfig, cursor: str | None) -> Pull:
    state: dict[str, dict] = json.loads(cursor)["files"] if cursor else {}
    paths = expand_paths(src.path or "")
    if not paths and not any(ch in (src.path or "") for ch in "*?[") and not Path(src.path or "").is_dir():
        raise AgentError(f"file source {src.path}: no such file or directory")
    events: list[Event] = []
    rejected: list[Rejected] = []
    new_state: dict[str, dict] = {}
    for path in paths:
        key = str(path)
        try:
            st = path.stat()
            prev = state.get(key)
            same = prev is not None and prev.get("inode") == st.st_ino and st.st_size >= prev.get("offset", 0)
            offset = prev["offset"] if same else 0
            line = prev.get("line", 0) if same else 0
            final = same and prev.get("size") == st.st_size          # not grown since the last pull
            with open(path, "rb") as fh:
                codec, bom = sniff_bom(fh.read(4))                   # the file's byte-order mark, read each pull
                unit = _unit(codec)
                offset = max(offset, bom)
                after_cr = False
                if offset - unit >= bom:          # the last pull ended on a CR: an LF now completes that line end
                    fh.seek(offset - unit)
                    after_cr = fh.read(unit).decode(codec, "replace") == "\r"
                fh.seek(offset)
                data = fh.read(min(st.st_size - offset, FILE_MAX_BYTES))
        except OSError as exc:
            rejected.append(Rejected(0, f"{path}: cannot read ({exc.strerror})"))
            continue
        text, used_of = _file_lines(data, codec, final, after_cr)
        result: ParseResult = parse(text, src.format, service=src.service, environment=src.environment,
                                    final=final, line_base=line + 1)
        consumed = result.consumed_lines if result.consumed_lines is not None else len(used_of)
        consumed = min(consumed, len(used_of))
        events.extend(result.events)
        rejected.extend(Rejected(r.line, f"{path}: {r.reason}") for r in result.rejected)
        new_state[key] = {"inode": st.st_ino, "offset": offset + (used_of[consumed - 1] if consumed else 0),
                          "line": line + consumed, "size": st.st_size}
    return Pull(events, rejected, json.dumps({"files": new_state}, sort_keys=True))


def _unit(codec: str) -> int:
    return 1 if codec == "utf-8" else (4 if "32" in codec else 2)


def _file_lines(data: bytes, codec: str, final: bool, after_cr: bool = False) -> tuple[str, list[int]]:
    """A piece of a tailed file as text of whole lines (any line ending; a last line without one is held back
    unless the file stopped growing), and the byte length of the piece through each line. ``after_cr``: the
    piece before ended on a CR, so an LF first completes that CRLF (it is no line). Invalid UTF-8 bytes are read
    as U+FFFD (agent.infra.textio), each still counted as the byte it was."""
    utf8, unit = codec == "utf-8", _unit(codec)
    errors = "surrogateescape" if utf8 else "replace"
    raw = data[:len(data) - len(data) % unit].decode(codec, errors)
    skip = 0
    if after_cr and raw.startswith("\n"):
        raw, skip = raw[1:], unit
    pieces = _LINE.findall(raw)
    if pieces and pieces[-1] == "":
        pieces.pop()
    if pieces and not final and not pieces[-1].endswith(("\n", "\r")):
        pieces.pop()
    ends, total = [], skip
    for piece in pieces:
        total += len(piece) if utf8 and piece.isascii() else len(piece.encode(codec, errors))
        ends.append(total)
    text = "".join(pieces)
    return (without_escapes(text) if utf8 else text), ends


_LINE = re.compile(r"[^\r\n]*+(?:\r\n|\n\r|\r|\n)|[^\r\n]++$|$")


# --------------------------------------------------------------------------- sentry

def pull_sentry(src: SourceConfig, cursor: str | None, env: Mapping[str, str] | None = None,
                max_pages: int = SENTRY_MAX_PAGES) -> Pull:
    from agent.infra import http
    from agent.intake.formats import iso_ts

    base = (src.url or "").rstrip("/")
    url = f"{base}/api/0/projects/{src.org}/{src.project}/events/"
    headers, auth = http.credentials(base, src.token_env, env, what=f"sentry source {redact(base)}")
    seen = json.loads(cursor) if cursor else {"last": None, "ids": []}
    last, last_ids = seen.get("last"), set(seen.get("ids") or [])
    events: list[Event] = []
    rejected: list[Rejected] = []
    newest, newest_ids = last, set(last_ids)
    params: dict | None = {"full": "true"}
    next_url: str | None = url
    pages = 0
    while next_url and pages < (max_pages if last else 1):
        doc, resp = http.get_json(next_url, params=params, headers=headers, auth=auth, pinned=http.origin(base))
        pages += 1
        params = None  # the next link carries its own query
        if not isinstance(doc, list):
            raise AgentError(f"sentry {redact(base)}: expected a list of events, got {type(doc).__name__}")
        reached_known = False
        for index, raw in enumerate(doc):
            if not isinstance(raw, dict):
                rejected.append(Rejected(index + 1, f"page {pages} event {index + 1}: not an object"))
                continue
            eid = str(raw.get("eventID") or raw.get("id") or raw.get("event_id") or "")
            when = iso_ts(raw.get("dateCreated") or raw.get("dateReceived") or raw.get("timestamp")) or ""
            if last and (when < last or (when == last and eid in last_ids)):
                reached_known = True
                continue
            try:
                ev = event_from_sentry(raw)
            except (ValueError, TypeError, AttributeError) as exc:
                rejected.append(Rejected(index + 1, f"page {pages} event {eid[:64] or index + 1}: {exc}"))
                continue
            except Exception as exc:  # noqa: BLE001 - one event never costs the others
                rejected.append(Rejected(index + 1, f"page {pages} event {eid[:64] or index + 1}: "
                                                    f"could not be read ({type(exc).__name__})"))
                continue
            ev.service = src.service or ev.service or src.project   # config's service beats the event's tags
            ev.environment = ev.environment or src.environment
            events.append(ev)
            if newest is None or when > newest:
                newest, newest_ids = when, {eid}
            elif when == newest:
                newest_ids.add(eid)
        link = resp.links.get("next") if resp is not None else None
        if reached_known or not link or link.get("results") == "false":
            break
        next_url = link.get("url")
    return Pull(events, rejected, json.dumps({"last": newest, "ids": sorted(newest_ids)}))


# --------------------------------------------------------------------------- the scan

def source_label(src: SourceConfig) -> str:
    where = src.path if src.kind == "file" else f"{src.url} {src.org}/{src.project}" if src.kind == "sentry" \
        else f"{src.url} {src.query}"
    return redact(f"{src.kind} {where}")


def pull_source(ledger: Ledger, src: SourceConfig, env: Mapping[str, str] | None = None,
                lease_ttl: float = SOURCE_LEASE_S, runner: str | None = None) -> dict[str, Any]:
    """Pull one source, store its events and cursor together; return a scan item.

    Runners sharing the ledger take turns: the pull holds the named lease ``source:<key>`` while it reads the
    cursor, fetches and stores, and the store's transaction checks that the lease is still its own and that the
    cursor is still the one it started from, so no page is ever stored twice (a source another runner is pulling
    right now is skipped quietly)."""
    from agent.coord.claims import LeaseBusy, named_lease

    key = src.key
    label = source_label(src)
    try:
        with named_lease(ledger, f"source:{key}", ttl=lease_ttl, runner=runner) as token:
            cursor = get_cursor(ledger, key)
            if src.kind == "loki":
                pulled = pull_loki(src, cursor, env)
            elif src.kind == "file":
                pulled = pull_files(src, cursor)
            elif src.kind == "sentry":
                pulled = pull_sentry(src, cursor, env)
            else:
                raise AgentError(f"unknown source kind {src.kind!r}")
            result = IngestResult()
            result.add_rejected(pulled.rejected)

            def guard(conn) -> None:
                leases.check_lease(ledger, conn, f"source:{key}", token)
                leases.check_cursor(ledger, conn, key, cursor)

            ingest(ledger, pulled.events, source=f"{src.kind}", cursor=(key, pulled.cursor or ""), result=result,
                   guard=guard)
    except LeaseBusy as exc:
        return {"source": label, "kind": src.kind, "ok": True, "skipped": True, "quiet": True,
                "line": f"errors: {label}: skipped: {exc} (it is pulling this source now)"}
    except (AgentError, OSError, ValueError) as exc:   # one broken source must not stop the others
        from agent.ledger import storage_fault

        fault = storage_fault(exc, ledger.path)
        if fault is not None:  # ... but a full or read-only disk stops every one: say so and stop
            raise fault from None
        return {"source": label, "kind": src.kind, "ok": False, "error": str(exc),
                "line": f"errors: {label}: failed: {exc}"}
    except Exception as exc:  # noqa: BLE001 - an answer of an unexpected shape: this source fails, not the scan
        why = f"unexpected answer ({type(exc).__name__})"
        return {"source": label, "kind": src.kind, "ok": False, "error": why, "line": f"errors: {label}: failed: {why}"}
    news = result.new or result.deduplicated or result.rejected
    return {"source": label, "kind": src.kind, "ok": True, **result.to_json(),
            "line": f"errors: {label}: {result.new} new, {result.deduplicated} deduplicated, "
                    f"{result.rejected} rejected", **({} if news else {"quiet": True})}


def scan(app, jobs: int = 1) -> list[dict]:
    """The `errors` scan: pull every configured source once."""
    from agent.coord.runners import runner_id

    runner = runner_id(app.home)
    return [pull_source(app.ledger, src, runner=runner) for src in app.config.sources]
