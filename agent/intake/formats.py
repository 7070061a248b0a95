"""Parse error reports into ``Event`` objects: JSONL, Sentry payloads, and raw log text.

``parse(text, fmt)`` never raises for bad input: a malformed line or event becomes a
``Rejected(line, reason)`` and the rest is parsed.  Frames are always ordered outermost call
first, innermost (where the exception was raised) last, whatever order the source used.
Nothing here redacts; ``agent.intake.store`` redacts every field before anything is stored.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Iterator

FORMATS = ("auto", "jsonl", "sentry", "traceback")
ERROR_LEVELS = ("error", "err", "critical", "crit", "fatal", "emerg", "emergency", "alert", "panic", "severe")
MAX_EXCERPT_LINES = 200


@dataclass
class Frame:
    file: str = ""
    function: str = ""
    lineno: int | None = None
    module: str = ""
    in_app: bool | None = None

    def label(self) -> str:
        """``path/file.py:function``; a Java/Kotlin frame (bare file name) uses its class: ``pkg.Class:method``."""
        where = self.file if ("/" in self.file or not self.module) else self.module
        return f"{where}:{self.function}"


@dataclass
class Event:
    message: str = ""
    cls: str = ""
    frames: list[Frame] = field(default_factory=list)
    causes: list[str] = field(default_factory=list)   # classes of chained exceptions, outermost first
    service: str | None = None
    environment: str | None = None
    level: str = "error"
    timestamp: str | None = None                      # ISO 8601 UTC
    repo: str | None = None
    release: str | None = None
    platform: str | None = None
    excerpt: str = ""
    line: int = 1


@dataclass
class Rejected:
    line: int
    reason: str


@dataclass
class ParseResult:
    format: str
    events: list[Event] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)
    consumed_lines: int | None = None   # log text only: lines fully parsed (the rest may be an unfinished trace)


# --------------------------------------------------------------------------- helpers


def iso_ts(value: Any) -> str | None:
    """Epoch seconds/ms/ns or an ISO string -> ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` (UTC); None if unreadable."""
    if value is None or value == "":
        return None
    try:
        if isinstance(value, str) and re.fullmatch(r"\d+(\.\d+)?", value.strip()):
            value = float(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            v = float(value)
            if v > 1e17:
                v /= 1e9
            elif v > 1e14:
                v /= 1e6
            elif v > 1e11:
                v /= 1e3
            dt = datetime.fromtimestamp(v, tz=timezone.utc)
        elif isinstance(value, str):
            s = value.strip().replace(" ", "T", 1)
            s = re.sub(r"(\.\d{6})\d+", r"\1", s)          # nanoseconds -> microseconds
            s = re.sub(r",(\d+)", r".\1", s)                # 2024-01-01T10:00:00,123
            dt = datetime.fromisoformat(s)
            dt = dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)
        else:
            return None
    except (ValueError, OverflowError, OSError):
        return None
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _get(obj: Any, *paths: str) -> Any:
    """First non-empty value among dotted ``paths`` (also tried as flat keys like "error.message")."""
    for path in paths:
        if isinstance(obj, dict) and obj.get(path) not in (None, "", [], {}):
            return obj[path]
        cur = obj
        for part in path.split("."):
            cur = cur.get(part) if isinstance(cur, dict) else None
        if cur not in (None, "", [], {}):
            return cur
    return None


def _str(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None and not isinstance(value, bool) else None
    except (TypeError, ValueError):
        return None


# --------------------------------------------------------------------------- log text / tracebacks

PY_START = re.compile(r"^(?P<prefix>.*?)Traceback \(most recent call last\):\s*$")
PY_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+)(?:, in (?P<fn>.+?))?\s*$')
PY_EXC = re.compile(r"^(?P<cls>[A-Za-z_][\w.]*)(?::\s?(?P<msg>.*))?$")
PY_CHAIN = ("During handling of the above exception, another exception occurred:",
            "The above exception was the direct cause of the following exception:")
AT_LINE = re.compile(r"^\s+at\s+\S")
AT_CONT = re.compile(r"^\s*(?:\.\.\. \d+ (?:more|common frames omitted)|\.\.\.\s*$)")
CAUSED = re.compile(r"^\s*(?:Caused by|Suppressed|\[cause\]):\s*(?P<rest>.*)$")
JAVA_FRAME = re.compile(r"^\s+at\s+(?:[\w.$-]+/)*(?P<func>[\w$.<>\[\]-]+?)\((?P<file>[^():]*)(?::(?P<line>\d+))?\)\s*$")
NODE_FRAME = re.compile(r"^\s+at\s+(?:async\s+)?(?:(?P<func>.+?)\s+\((?P<file>.+?)(?::(?P<line>\d+))?(?::\d+)?\)"
                        r"|(?P<file2>\S+?):(?P<line2>\d+)(?::\d+)?)\s*$")
HEADER_AT_START = re.compile(r'^\s*(?:Exception in thread "[^"]*"\s+|Uncaught\s+)?(?P<cls>[A-Za-z_$][\w$.]*)'
                             r"(?:\s*\[[A-Z_0-9]+\])?(?::\s*(?P<msg>.*)|\s*)$")
HEADER_SEARCH = re.compile(r"(?P<cls>(?:[A-Za-z_$][\w$]*\.)*[A-Z][\w$]*(?:Error|Exception|Throwable|Fault))"
                           r"(?:\s*\[[A-Z_0-9]+\])?(?::\s*(?P<msg>.*))?$")
LEVEL_WORD = re.compile(r"(?:\b(?:ERROR|CRITICAL|FATAL|SEVERE|PANIC|EMERG|ALERT)\b"
                        r"|\blevel=\"?(?:error|fatal|critical|crit|panic)\b|\[(?:error|fatal|crit)\])")


def _frame_from_text(line: str) -> Frame | None:
    m = PY_FRAME.match(line)
    if m:
        return Frame(file=m["file"], function=(m["fn"] or "").strip(), lineno=int(m["line"]))
    m = JAVA_FRAME.match(line)
    if m and ("." in m["func"] or m["file"]):
        func = m["func"]
        module, _, fn = func.rpartition(".")
        return Frame(file=m["file"], function=fn or func, lineno=_int(m["line"]), module=module)
    m = NODE_FRAME.match(line)
    if m:
        file = m["file"] or m["file2"] or ""
        return Frame(file=file, function=(m["func"] or "<anonymous>").strip(), lineno=_int(m["line"] or m["line2"]))
    if AT_LINE.match(line):
        return Frame(function=line.strip()[3:].strip())
    return None


def _header(line: str) -> tuple[str, str]:
    m = HEADER_AT_START.match(line)
    if m:
        return m["cls"], (m["msg"] or "").strip()
    m = HEADER_SEARCH.search(line)
    if m:
        return m["cls"], (m["msg"] or "").strip()
    return "", line.strip()


def _is_at_header(lines: list[str], i: int) -> bool:
    return (i + 1 < len(lines) and lines[i].strip() != "" and not AT_LINE.match(lines[i])
            and not lines[i][:1].isspace() and AT_LINE.match(lines[i + 1]) is not None)


def _error_line(line: str) -> str | None:
    """The message of a single error log line, or None when the line is not an error."""
    m = LEVEL_WORD.search(line)
    if not m:
        return None
    return line[m.end():].strip(" \t:-|]>") or line.strip()


def _parse_python(lines: list[str], i: int) -> tuple[Event | None, int, bool]:
    """Parse a Python traceback at ``lines[i]``; returns (event, next index, complete)."""
    n = len(lines)
    segments: list[tuple[list[Frame], str, str]] = []
    j = i
    while True:
        j += 1  # past "Traceback (most recent call last):"
        frames: list[Frame] = []
        while j < n and (lines[j][:1].isspace() or lines[j].strip() == ""):
            if lines[j].strip() == "" and j + 1 < n and not lines[j + 1][:1].isspace():
                j += 1
                continue
            f = _frame_from_text(lines[j]) if PY_FRAME.match(lines[j]) else None
            if f:
                frames.append(f)
            j += 1
        if j >= n:
            return None, j, False
        m = PY_EXC.match(lines[j].strip())
        if m is None:
            cls, msg = "", lines[j].strip()
        else:
            cls, msg = m["cls"], (m["msg"] or "").strip()
        j += 1
        segments.append((frames, cls, msg))
        k = j
        while k < n and lines[k].strip() == "":
            k += 1
        if k < n and lines[k].strip() in PY_CHAIN:
            k += 1
            while k < n and lines[k].strip() == "":
                k += 1
            if k < n and PY_START.match(lines[k]):
                j = k
                continue
            if k >= n:
                return None, k, False
        break
    frames, cls, msg = segments[-1]
    return Event(message=msg, cls=cls, frames=frames, causes=[s[1] for s in segments[:-1]],
                 platform="python"), j, True


def _parse_at(lines: list[str], i: int) -> tuple[Event, int]:
    """Parse a Java or Node stack (header line then ``at`` frames, with Caused by: chains)."""
    n = len(lines)
    cls, msg = _header(lines[i])
    frames: list[Frame] = []
    causes: list[str] = []
    platform = None
    j = i + 1
    in_main = True
    while j < n:
        line = lines[j]
        if AT_LINE.match(line):
            f = _frame_from_text(line)
            if f and in_main:
                frames.append(f)
                if platform is None:
                    platform = "java" if JAVA_FRAME.match(line) and "." in (f.module or "") else "node"
        elif AT_CONT.match(line):
            pass
        else:
            c = CAUSED.match(line)
            if not c:
                break
            ccls, _ = _header(c["rest"])
            causes.append(ccls)
            in_main = False
        j += 1
    frames.reverse()  # Java/Node print innermost first
    return Event(message=msg, cls=cls, frames=frames, causes=causes, platform=platform), j


def parse_log_text(text: str, final: bool = True, line_base: int = 1) -> ParseResult:
    """Group multi-line Python/Java/Node traces (and single error lines) in log text into events.

    With ``final=False`` (tailing a file still being written) an event that reaches the end of the
    text is held back: ``consumed_lines`` stops before it so the next read starts there.
    """
    lines = [ln[:-1] if ln.endswith("\r") else ln for ln in text.split("\n")]
    if lines and lines[-1] == "":
        lines.pop()               # text ending in a newline has no extra empty line
    n = len(lines)
    result = ParseResult(format="traceback")
    consumed = n
    i = 0
    context: tuple[int, str] | None = None
    while i < n:
        line = lines[i]
        start = context[0] if context else i
        event: Event | None = None
        if PY_START.match(line):
            event, j, complete = _parse_python(lines, i)
            if not complete:
                if not final:
                    consumed = start
                    break
                result.rejected.append(Rejected(line_base + i, "Python traceback ends before its exception line"))
                i = j
                context = None
                continue
        elif _is_at_header(lines, i):
            event, j = _parse_at(lines, i)
        elif line.lstrip().startswith("{"):
            j = i + 1
            try:
                obj = json.loads(line)
            except ValueError:
                obj = None
            if isinstance(obj, dict) and _record_is_error(obj):
                try:
                    event = event_from_record(obj)
                except ValueError as exc:
                    result.rejected.append(Rejected(line_base + i, str(exc)))
        else:
            msg = _error_line(line)
            if msg is not None:
                nxt = i + 1
                if nxt < n and (PY_START.match(lines[nxt]) or _is_at_header(lines, nxt)):
                    context = (i, line)
                    i += 1
                    continue
                event, j = Event(message=msg, cls=""), i + 1
            else:
                j = i + 1
        if event is not None:
            if not final and j >= n:
                consumed = start
                break
            raw = lines[start:j]
            if len(raw) > MAX_EXCERPT_LINES:
                raw = raw[:MAX_EXCERPT_LINES] + [f"... {len(raw) - MAX_EXCERPT_LINES} more lines"]
            event.excerpt = event.excerpt or "\n".join(raw)
            event.line = line_base + start
            if event.timestamp is None:
                event.timestamp = iso_ts(_leading_ts(lines[start]))
            result.events.append(event)
        context = None
        i = j
    result.consumed_lines = consumed
    return result


_TS = re.compile(r"^\W{0,2}(\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)")


def _leading_ts(line: str) -> str | None:
    m = _TS.match(line)
    return m.group(1) if m else None


# --------------------------------------------------------------------------- JSONL records

def _record_is_error(obj: dict) -> bool:
    level = str(_get(obj, "level", "severity", "levelname", "log.level") or "").lower()
    if level in ERROR_LEVELS:
        return True
    if _is_sentry(obj):
        return True
    return _get(obj, "stack", "stacktrace", "stack_trace", "traceback", "exc_info", "error.stack_trace",
                "error.stack", "exception") is not None


def event_from_record(obj: dict) -> Event:
    """One JSONL record (our own shape, common structured-log shapes, or a Sentry event) -> Event."""
    if not isinstance(obj, dict):
        raise ValueError("expected a JSON object")
    if _is_sentry(obj):
        return event_from_sentry(obj)
    message = _get(obj, "message", "msg", "error.message", "err.message", "exception.message")
    cls = _get(obj, "class", "exception_class", "exc_type", "error.type", "error.kind", "err.name", "type",
               "exception.type")
    if not isinstance(_get(obj, "error"), dict) and isinstance(_get(obj, "error"), str) and not message:
        message = obj["error"]
    stack = _get(obj, "stack", "stacktrace", "stack_trace", "traceback", "exc_info", "error.stack_trace",
                 "error.stack", "err.stack", "exception.stacktrace")
    frames: list[Frame] = []
    causes: list[str] = []
    platform = _str(_get(obj, "platform"))
    if isinstance(stack, str):
        parsed = parse_log_text(stack)
        if parsed.events:
            ev = max(parsed.events, key=lambda e: len(e.frames))
            frames, causes, platform = ev.frames, ev.causes, platform or ev.platform
            cls = cls or ev.cls
            message = message or ev.message
    elif isinstance(stack, list):
        for item in stack:
            if isinstance(item, str):
                f = _frame_from_text(item if item[:1].isspace() else "  " + item) or Frame(function=item.strip())
            elif isinstance(item, dict):
                f = Frame(file=_str(_get(item, "file", "filename", "abs_path", "path")) or "",
                          function=_str(_get(item, "function", "func", "method", "name")) or "",
                          lineno=_int(_get(item, "line", "lineno", "lineNumber")),
                          module=_str(_get(item, "module", "class", "className")) or "")
            else:
                raise ValueError("stack items must be strings or objects")
            frames.append(f)
    elif stack is not None:
        raise ValueError("stack must be a string or a list")
    if not message and not cls:
        raise ValueError("record has neither a message nor an exception class")
    if cls is not None and not isinstance(cls, str):
        raise ValueError("class must be a string")
    level = str(_get(obj, "level", "severity", "levelname", "log.level") or "error").lower()
    ts_raw = _get(obj, "timestamp", "time", "ts", "@timestamp", "datetime")
    return Event(
        message=_str(message) or "", cls=cls or "", frames=frames, causes=causes,
        service=_str(_get(obj, "service", "service.name", "app", "logger_service")),
        environment=_str(_get(obj, "environment", "env", "service.environment")),
        level=level, timestamp=iso_ts(ts_raw), repo=_str(_get(obj, "repo", "repository")),
        release=_str(_get(obj, "release", "version", "service.version")), platform=platform,
        excerpt=_str(stack) if isinstance(stack, str) else "")


def _json_lines(text: str, line_base: int) -> Iterator[tuple[int, Any, str | None]]:
    """(line number, parsed object or None, why it is not JSON or None) for every non-blank line."""
    for offset, line in enumerate(text.split("\n")):
        if not line.strip():
            continue
        try:
            yield line_base + offset, json.loads(line), None
        except ValueError as exc:
            yield line_base + offset, None, f"not valid JSON ({exc.msg})"


def _add_event(result: ParseResult, build: Callable[[Any], Event], obj: Any, lineno: int,
               prefix: str = "") -> None:
    """Build one event from a parsed object, or record why it is rejected; never raises."""
    try:
        ev = build(obj)
    except (ValueError, TypeError, AttributeError) as exc:
        result.rejected.append(Rejected(lineno, prefix + (str(exc) or type(exc).__name__)))
        return
    ev.line = lineno
    if not ev.excerpt:
        ev.excerpt = _excerpt(ev)
    result.events.append(ev)


def parse_jsonl(text: str, line_base: int = 1) -> ParseResult:
    result = ParseResult(format="jsonl")
    for lineno, obj, bad in _json_lines(text, line_base):
        if bad:
            result.rejected.append(Rejected(lineno, bad))
        elif not (isinstance(obj, dict) and (_envelope_header(obj) or _item_header(obj))):
            _add_event(result, event_from_record, obj, lineno)
    return result


# --------------------------------------------------------------------------- Sentry

_SENTRY_KEYS = ("exception", "entries", "logentry", "event_id", "eventID", "sdk", "culprit", "threads")
_ITEM_HEADER_KEYS = {"type", "length", "content_type", "filename", "attachment_type", "item_count"}
_BUILTIN_MODULES = ("builtins", "__builtin__", "exceptions", "__main__")


def _envelope_header(obj: dict) -> bool:
    return ("dsn" in obj or "sent_at" in obj) and not any(k in obj for k in ("exception", "message", "level",
                                                                             "platform", "logentry"))


def _item_header(obj: dict) -> bool:
    return "type" in obj and isinstance(obj.get("type"), str) and set(obj) <= _ITEM_HEADER_KEYS


def _unwrap(obj: dict) -> tuple[dict, dict]:
    """Webhook wrappers -> (event, wrapper).  Integration webhooks: {"action", "data": {"event"|"error"}};
    legacy plugin webhooks: {"project", "event": {...}}."""
    data = obj.get("data")
    if isinstance(data, dict):
        for key in ("event", "error"):
            if isinstance(data.get(key), dict):
                return data[key], obj
    if isinstance(obj.get("event"), dict):
        return obj["event"], obj
    return obj, {}


def _is_sentry(obj: Any) -> bool:
    if not isinstance(obj, dict):
        return False
    inner, wrapper = _unwrap(obj)
    return bool(wrapper) or any(k in inner for k in _SENTRY_KEYS)


def _tags(raw: Any) -> dict[str, str]:
    if isinstance(raw, dict):
        return {str(k): _str(v) or "" for k, v in raw.items()}
    tags: dict[str, str] = {}
    for item in raw or []:
        if isinstance(item, (list, tuple)) and len(item) == 2:
            tags[str(item[0])] = _str(item[1]) or ""
        elif isinstance(item, dict) and "key" in item:
            tags[str(item["key"])] = _str(item.get("value")) or ""
    return tags


def _sentry_frames(stacktrace: Any) -> list[Frame]:
    frames = []
    if not isinstance(stacktrace, dict):
        return frames
    for f in stacktrace.get("frames") or []:
        if not isinstance(f, dict):
            continue
        in_app = f.get("in_app", f.get("inApp"))
        frames.append(Frame(
            file=_str(f.get("filename") or f.get("abs_path") or f.get("absPath")) or "",
            function=_str(f.get("function") or f.get("rawFunction")) or "",
            lineno=_int(f.get("lineno", f.get("lineNo"))),
            module=_str(f.get("module") or f.get("package")) or "",
            in_app=None if in_app is None else bool(in_app)))
    return frames  # Sentry orders frames outermost first already


def _exc_class(value: dict, platform: str | None) -> str:
    from agent.intake.redact import redact

    # redacted part by part: joining first could glue a secret to the next part's text
    typ = redact(_str(value.get("type")) or "")
    module = redact(_str(value.get("module")) or "")
    if module and module not in _BUILTIN_MODULES and platform not in ("javascript", "node"):
        return f"{module}.{typ}" if typ else module
    return typ


def event_from_sentry(obj: dict) -> Event:
    """A Sentry event as SDKs send it (store/envelope payload), as webhooks wrap it, or as the web API
    returns it (``entries``, camelCase frames, tags as key/value objects)."""
    if not isinstance(obj, dict):
        raise ValueError("expected a JSON object for a Sentry event")
    d, wrapper = _unwrap(obj)
    platform = _str(d.get("platform"))
    exc = d.get("exception")
    values = exc.get("values") if isinstance(exc, dict) else exc if isinstance(exc, list) else None
    message = None
    request_url = None
    for entry in d.get("entries") or []:
        if not isinstance(entry, dict):
            continue
        data = entry.get("data")
        if entry.get("type") == "exception" and isinstance(data, dict) and not values:
            values = data.get("values")
        elif entry.get("type") == "message" and isinstance(data, dict):
            message = data.get("formatted") or data.get("message")
        elif entry.get("type") == "request" and isinstance(data, dict):
            request_url = data.get("url")
    values = [v for v in (values or []) if isinstance(v, dict)]
    cls, frames, causes = "", [], []
    if values:
        main = values[-1]  # Sentry lists chained exceptions oldest first; the last one was raised
        cls = _exc_class(main, platform)
        frames = _sentry_frames(main.get("stacktrace") or main.get("raw_stacktrace"))
        causes = [_exc_class(v, platform) for v in reversed(values[:-1])]
        message = _str(main.get("value")) or message
    if not frames:
        for thread in ((d.get("threads") or {}).get("values") or []) if isinstance(d.get("threads"), dict) else []:
            if isinstance(thread, dict) and thread.get("crashed"):
                frames = _sentry_frames(thread.get("stacktrace"))
    if message is None:
        le = d.get("logentry") or {}
        msg = d.get("message")
        message = (le.get("formatted") or le.get("message") if isinstance(le, dict) else None) or \
                  (msg.get("formatted") or msg.get("message") if isinstance(msg, dict) else msg) or d.get("title")
    if not cls and not message:
        raise ValueError("Sentry event has neither an exception nor a message")
    tags = _tags(d.get("tags"))
    request = d.get("request") if isinstance(d.get("request"), dict) else {}
    request_url = request_url or request.get("url")
    release = d.get("release")
    if isinstance(release, dict):
        release = release.get("version")
    project = wrapper.get("project_slug") or (wrapper.get("project") if isinstance(wrapper.get("project"), str)
                                               else None)
    ev = Event(
        message=_str(message) or "", cls=cls, frames=frames, causes=causes,
        service=tags.get("service") or tags.get("service.name") or _str(project),
        environment=_str(d.get("environment")) or tags.get("environment"),
        level=(_str(d.get("level")) or tags.get("level") or "error").lower(),
        timestamp=iso_ts(d.get("timestamp") or d.get("dateCreated") or d.get("datetime") or d.get("received")),
        repo=tags.get("repo"), release=_str(release) or tags.get("release"), platform=platform)
    ev.excerpt = _excerpt(ev, extra=[f"culprit: {d['culprit']}" if d.get("culprit") else "",
                                     f"transaction: {d['transaction']}" if d.get("transaction") else "",
                                     f"url: {request_url}" if request_url else ""])
    return ev


def _excerpt(ev: Event, extra: Iterable[str] = ()) -> str:
    lines = [f"{ev.cls}: {ev.message}" if ev.cls else ev.message]
    for f in ev.frames[-30:]:
        where = f"{f.file or f.module}" + (f":{f.lineno}" if f.lineno is not None else "")
        lines.append(f"  at {where} in {f.function}")
    lines += [f"caused by: {c}" for c in ev.causes]
    lines += [x for x in extra if x]
    return "\n".join(lines)


def parse_sentry(text: str, line_base: int = 1) -> ParseResult:
    """One Sentry event, a JSON array of them (the web API), or an SDK envelope / NDJSON stream."""
    result = ParseResult(format="sentry")
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
        skip_next = False  # the payload line after a non-event envelope item header (attachments, sessions)
        for lineno, obj, bad in _json_lines(text, line_base):
            if skip_next:
                skip_next = False
            elif bad:
                result.rejected.append(Rejected(lineno, bad))
            elif isinstance(obj, dict) and _envelope_header(obj):
                pass
            elif isinstance(obj, dict) and _item_header(obj):
                skip_next = obj["type"] != "event"
            else:
                _add_event(result, event_from_sentry, obj, lineno)
        return result
    docs = doc if isinstance(doc, list) else [doc]
    for index, obj in enumerate(docs):
        _add_event(result, event_from_sentry, obj, line_base, f"event {index + 1}: " if isinstance(doc, list) else "")
    return result


# --------------------------------------------------------------------------- entry point

def sniff(text: str) -> str:
    """Guess the format: a JSON document or envelope -> sentry, JSON lines -> jsonl, else log text."""
    s = text.lstrip()
    if not s:
        return "jsonl"
    if s[0] == "[":
        return "sentry"
    if s[0] == "{":
        first = s.split("\n", 1)[0]
        try:
            obj = json.loads(first)
        except ValueError:
            try:
                return "sentry" if _is_sentry(json.loads(s)) else "jsonl"
            except ValueError:
                return "jsonl"
        if isinstance(obj, dict) and _envelope_header(obj):
            return "sentry"
        return "jsonl"
    return "traceback"


def parse(text: str, fmt: str = "auto", *, service: str | None = None, environment: str | None = None,
          repo: str | None = None, final: bool = True, line_base: int = 1) -> ParseResult:
    """Parse ``text`` in ``fmt``; ``service``/``environment``/``repo`` fill in what events do not name."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    chosen = sniff(text) if fmt == "auto" else fmt
    if chosen == "jsonl":
        result = parse_jsonl(text, line_base)
    elif chosen == "sentry":
        result = parse_sentry(text, line_base)
    else:
        result = parse_log_text(text, final=final, line_base=line_base)
    for ev in result.events:
        ev.service = ev.service or service
        ev.environment = ev.environment or environment
        ev.repo = ev.repo or repo
    return result
