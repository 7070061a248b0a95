"""Parse error reports into ``Event`` objects: JSONL, Sentry payloads, and raw log text.

``parse(text, fmt)`` never raises for any input: each line (JSONL), event (Sentry) or block (log
text) is read on its own, and whatever it holds (wrong types, non-finite or huge numbers, lone
surrogates, deep nesting) it becomes either an ``Event`` or a ``Rejected(line, reason)`` while the
rest is parsed.  Every field is capped (``cap``, truncation marked) before any pattern runs on it,
and every pattern is linear on any input (possessive or bounded repetitions; frame lines are split
by hand).  Frames are always ordered outermost call first, innermost (where the exception was
raised) last, whatever order the source used.  Nothing here redacts; ``agent.intake.store``
redacts every field before anything is stored.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Iterator

from agent.infra.textio import one_newline, split_lines

FORMATS = ("auto", "jsonl", "sentry", "traceback")
ERROR_LEVELS = ("error", "err", "critical", "crit", "fatal", "emerg", "emergency", "alert", "panic", "severe")
MAX_EXCERPT_LINES = 200
# Caps applied before any pattern runs (characters).  Store truncates further after redaction.
MAX_LINE = 16_384          # one line of log text
MAX_MESSAGE = 16_384       # an event's message
MAX_STACK = 65_536         # a stack/traceback string inside a JSON record
MAX_EXCERPT = 16_384       # an event's raw excerpt
MAX_NAME = 1_024           # a frame's file/function/module, a class, a cause
MAX_SHORT = 256            # service, environment, level, repo, release, platform, timestamp text, each tag
MAX_FRAMES_KEPT = 256      # frames per event (the innermost are kept)
MAX_CAUSES = 32
MAX_TAGS = 256


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
    grouping: list[str] | None = None                 # the SDK's own `fingerprint` values, when not the default


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


def valid_text(s: str) -> str:
    """``s`` as valid UTF-8 text: lone surrogates (``"\\ud800"`` in JSON) become U+FFFD."""
    if s.isascii():
        return s
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


def cap(s: str, limit: int) -> str:
    """``s`` cut to ``limit`` characters, at a space when one is near, with the cut marked."""
    if len(s) <= limit:
        return s
    cut = s.rfind(" ", limit - 64, limit)
    cut = cut if cut > 0 else limit
    return f"{s[:cut]} [truncated {len(s) - cut} chars]"


_EPOCH = re.compile(r"\d++(?:\.\d++)?+")
_SUBSECOND = re.compile(r"(\.\d{6})\d++")
_COMMA_FRACTION = re.compile(r",(\d++)")


def iso_ts(value: Any) -> str | None:
    """Epoch seconds/ms/ns or an ISO string -> ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` (UTC); None if unreadable."""
    if isinstance(value, str) and len(value) <= 64:
        return _iso_ts_text(value)
    return _iso_ts(value)


@functools.lru_cache(maxsize=4096)
def _iso_ts_text(value: str) -> str | None:
    return _iso_ts(value)


def _iso_ts(value: Any) -> str | None:
    if value is None or value == "" or (isinstance(value, str) and len(value) > 64):
        return None
    try:
        if isinstance(value, str) and _EPOCH.fullmatch(value.strip()):
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
            s = _SUBSECOND.sub(r"\1", s)                     # nanoseconds -> microseconds
            s = _COMMA_FRACTION.sub(r".\1", s)              # 2024-01-01T10:00:00,123
            dt = datetime.fromisoformat(s)
            dt = dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)
        else:
            return None
    except (ValueError, OverflowError, OSError, TypeError):
        return None
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _get(obj: Any, *paths: str) -> Any:
    """First non-empty value among dotted ``paths`` (also tried as flat keys like "error.message")."""
    if not isinstance(obj, dict):
        return None
    get = obj.get
    for path in paths:
        value = get(path)
        if value is not None and value != "" and value != [] and value != {}:
            return value
        parts = _PARTS.get(path)
        if parts is None:
            parts = _PARTS[path] = tuple(path.split(".")) if "." in path else ()
        if not parts:
            continue
        cur = get(parts[0])
        if not isinstance(cur, dict):
            continue          # (a path through a missing key or a non-object is None)
        for part in parts[1:]:
            cur = cur.get(part) if isinstance(cur, dict) else None
        if cur not in (None, "", [], {}):
            return cur
    return None


_PARTS: dict[str, tuple[str, ...]] = {}    # a dotted path's keys (the paths are the constants below)


def _str(value: Any, limit: int = MAX_SHORT) -> str | None:
    """Any JSON value as capped, valid text (containers as compact JSON); None stays None."""
    if value is None:
        return None
    if isinstance(value, str):
        if len(value) <= limit and value.isascii():
            return value
        return valid_text(cap(value, limit))
    if isinstance(value, (dict, list)):
        try:
            text = json.dumps(value, sort_keys=True, default=str)
        except (ValueError, TypeError, RecursionError):
            text = f"<{type(value).__name__}>"
        return valid_text(cap(text, limit))
    if isinstance(value, float) and value != value:
        return "NaN"
    return cap(str(value), limit)


_MAX_LINENO = 2**31


def _int(value: Any) -> int | None:
    """A line number: a finite, non-negative integer below 2**31 (bools, huge, non-finite and text -> None)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value if 0 <= value < _MAX_LINENO else None
    if isinstance(value, float):
        return int(value) if 0 <= value < _MAX_LINENO else None      # NaN and inf compare False
    if isinstance(value, str) and 0 < len(value) <= 9 and value.isascii() and value.isdigit():
        return int(value)
    return None


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def loads(line: str) -> tuple[Any, str | None]:
    """``json.loads`` that never raises: (object, None) or (None, why not)."""
    try:
        return json.loads(line), None
    except RecursionError:
        return None, "not valid JSON (nested too deep)"
    except ValueError as exc:
        why = getattr(exc, "msg", None) or str(exc).split(":")[0]
        return None, f"not valid JSON ({why})"


# --------------------------------------------------------------------------- log text / tracebacks

PY_HEADER = "Traceback (most recent call last):"
PY_FRAME = re.compile(r'\s++File "([^"]++)", line (\d++)(?:, in (.++))?+\s*+$')
PY_EXC = re.compile(r"(?P<cls>[A-Za-z_][\w.]*+)(?::\s?(?P<msg>.*+))?+$")
PY_CHAIN = ("During handling of the above exception, another exception occurred:",
            "The above exception was the direct cause of the following exception:")
AT_LINE = re.compile(r"\s++at\s++\S")
AT_CONT = re.compile(r"\s*+(?:\.\.\. \d++ (?:more|common frames omitted)|\.\.\.\s*+$)")
CAUSED = re.compile(r"\s*+(?:Caused by|Suppressed|\[cause\]):\s*+(?P<rest>.*+)$")
HEADER_AT_START = re.compile(r'\s*+(?:Exception in thread "[^"]{0,256}+"\s++|Uncaught\s++)?(?P<cls>[A-Za-z_$][\w$.]*+)'
                             r"(?:\s*+\[[A-Z_0-9]{1,64}+\])?(?::\s*+(?P<msg>.*+)|\s*+)$")
# A class token starts where a run of identifier characters starts, so a long run is scanned once.
CLASS_TOKEN = re.compile(r"(?<![\w$.])[A-Za-z_$][\w$.]*+")
CLASS_TAIL = re.compile(r"(?:\s*+\[[A-Z_0-9]{1,64}+\])?(?::\s*+(?P<msg>.*+)|\s*+$)")
CLASS_NAME = re.compile(r"(?:[A-Za-z_$][\w$]*+\.)*+[A-Z][\w$]*+", re.ASCII)
CLASS_SUFFIXES = ("Error", "Exception", "Throwable", "Fault")
LEVEL_WORD = re.compile(r"(?:\b(?:ERROR|CRITICAL|FATAL|SEVERE|PANIC|EMERG|ALERT)\b"
                        r"|\blevel=\"?(?:error|fatal|critical|crit|panic)\b|\[(?:error|fatal|crit)\])")
_JAVA_FUNC = re.compile(r"[\w$.<>\[\]/@-]++")


def _is_py_start(line: str) -> bool:
    return line.rstrip().endswith(PY_HEADER)


def _at_frame(line: str) -> tuple[Frame, str] | None:
    """A Java (``at pkg.Class.method(File.java:12)``) or Node (``at fn (file:12:3)``, ``at file:12:3``) frame line,
    split by hand (no backtracking): (frame, "java"|"node"), or None."""
    rest = line.strip()[2:].lstrip()
    if rest.startswith("async "):
        rest = rest[6:].lstrip()
    if rest.endswith(")"):
        depth, k = 0, -1
        for k in range(len(rest) - 1, -1, -1):       # the "(" matching the final ")"
            ch = rest[k]
            if ch == ")":
                depth += 1
            elif ch == "(":
                depth -= 1
                if depth == 0:
                    break
        if k > 0 and rest[k] == "(":
            head, loc = rest[:k], rest[k + 1:-1]
            if not head[-1:].isspace() and _JAVA_FUNC.fullmatch(head) and "(" not in loc and ")" not in loc:
                func = head.rsplit("/", 1)[-1]          # java.base/java.lang.Thread.run -> java.lang.Thread.run
                file, _, num = loc.partition(":")
                if (not num or num.isdigit()) and ("." in func or file):
                    module, _, fn = func.rpartition(".")
                    return Frame(file=file, function=fn or func, lineno=_int(num), module=module), "java"
            file, lineno = _location(loc)
            return Frame(file=file, function=head.strip() or "<anonymous>", lineno=lineno), "node"
    if rest and not any(ch.isspace() for ch in rest):
        file, lineno = _location(rest)
        if lineno is not None:
            return Frame(file=file, function="<anonymous>", lineno=lineno), "node"
    return Frame(function=rest), "node"


def _location(loc: str) -> tuple[str, int | None]:
    """``file:line:col`` / ``file:line`` / ``file`` -> (file, line)."""
    parts = loc.rsplit(":", 2)
    if len(parts) == 3 and parts[2].isdigit() and parts[1].isdigit():
        return parts[0], _int(parts[1])
    if len(parts) >= 2 and parts[-1].isdigit():
        return loc.rsplit(":", 1)[0], _int(parts[-1])
    return loc, None


def _frame_from_text(line: str) -> Frame | None:
    m = PY_FRAME.match(line)
    if m:
        return Frame(file=m[1], function=(m[3] or "").strip(), lineno=_int(m[2]))
    if AT_LINE.match(line):
        return _at_frame(line)[0]
    return None


def _class_at(line: str, start: int = 0) -> tuple[str, str] | None:
    """The leftmost exception class in ``line`` (a dotted name ending in Error/Exception/Throwable/Fault,
    followed by ``: message``, ``[CODE]`` or the end of the line) -> (class, message)."""
    for m in CLASS_TOKEN.finditer(line, start):
        tok = m.group(0).rstrip(".")
        if not tok.endswith(CLASS_SUFFIXES) or not CLASS_NAME.fullmatch(tok):
            continue
        t = CLASS_TAIL.match(line, m.start() + len(tok))
        if t:
            return tok, (t["msg"] or "").strip()
    return None


def _header(line: str) -> tuple[str, str]:
    m = HEADER_AT_START.match(line)
    if m:
        return m["cls"], (m["msg"] or "").strip()
    found = _class_at(line)
    if found:
        return found
    return "", line.strip()


def _is_at_header(lines: list[str], i: int) -> bool:
    return (i + 1 < len(lines) and lines[i].strip() != "" and not lines[i][:1].isspace()
            and AT_LINE.match(lines[i + 1]) is not None)


def _error_line(line: str) -> str | None:
    """The message of a single error log line, or None when the line is not an error."""
    m = LEVEL_WORD.search(line)
    if not m:
        return None
    return line[m.end():].strip(" \t:-|]>") or line.strip()


def _parse_python(lines: list[str], i: int) -> tuple[Event | None, int, str]:
    """Parse a Python traceback at ``lines[i]``; returns (event, next index, "ok" | "eof" | "incomplete").

    "eof": the text ends before the exception line (a file still being written).  "incomplete": the
    frames are followed by something that is not an exception line (another traceback, a log line);
    the next index then points at that line, so it is read on its own and never swallowed.
    """
    n = len(lines)
    segments: list[tuple[list[Frame], str, str]] = []
    j = i
    while True:
        j += 1  # past "Traceback (most recent call last):"
        frames: list[Frame] = []
        while j < n:                      # indented lines (frames, source lines) and blank lines
            line = lines[j]
            if line[:1].isspace():
                m = PY_FRAME.match(line)
                if m:
                    num = m[2]      # digits: a line number when ASCII and below 2**31 (as _int reads it)
                    frames.append(Frame(m[1], (m[3] or "").strip(),
                                        int(num) if len(num) <= 9 and num.isascii() else None))
            elif line.strip():
                break
            j += 1
        if j >= n:
            return None, j, "eof"
        exc_line = lines[j].strip()
        m = PY_EXC.match(exc_line) if not _is_py_start(exc_line) else None
        if m is None:
            return None, j, "incomplete"
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
            if k < n and _is_py_start(lines[k]):
                j = k
                continue
            if k >= n:
                return None, k, "eof"
        break
    frames, cls, msg = segments[-1]
    return Event(message=msg, cls=cls, frames=frames, causes=[s[1] for s in segments[:-1]],
                 platform="python"), j, "ok"


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
            if in_main:
                f, kind = _at_frame(line)
                frames.append(f)
                if platform is None:
                    platform = "java" if kind == "java" and "." in f.module else "node"
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


def _json_line_event(obj: Any, in_log: bool) -> Event | None:
    """A JSON line inside log text: an event when it is an error record, else None."""
    if isinstance(obj, dict) and _record_is_error(obj, in_log):
        return event_from_record(obj)
    return None


def parse_log_text(text: str, final: bool = True, line_base: int = 1) -> ParseResult:
    """Group multi-line Python/Java/Node traces, JSON error records and single error lines in log text into events.

    Each block is read on its own: whatever one block holds, it becomes an event or a rejection naming its
    line, and reading goes on after it.  Lines are capped at ``MAX_LINE`` characters before any pattern runs.
    With ``final=False`` (tailing a file still being written) an event that reaches the end of the
    text is held back: ``consumed_lines`` stops before it so the next read starts there.
    """
    lines = split_lines(text)
    if any(len(ln) > MAX_LINE for ln in lines):
        lines = [cap(ln, MAX_LINE) for ln in lines]
    if lines and lines[-1] == "":
        lines.pop()               # text ending in a newline has no extra empty line
    n = len(lines)
    result = ParseResult(format="traceback")
    consumed = n
    i = 0
    context: tuple[int, str] | None = None
    while i < n:
        start = context[0] if context else i
        try:
            event, j, why = _log_block(lines, i, context is not None)
        except Exception as exc:   # noqa: BLE001 - one block never costs the others
            event, j, why = None, i + 1, f"could not be read ({type(exc).__name__})"
        if why == "context":
            context = (i, lines[i])
            i += 1
            continue
        if why == "eof":
            if not final:
                consumed = start
                break
            why = "Python traceback ends before its exception line"
        if why:
            result.rejected.append(Rejected(line_base + i, why))
        if event is not None:
            if not final and j >= n:
                consumed = start
                break
            raw = lines[start:j]
            if len(raw) > MAX_EXCERPT_LINES:
                raw = raw[:MAX_EXCERPT_LINES] + [f"... {len(raw) - MAX_EXCERPT_LINES} more lines"]
            event.excerpt = cap(event.excerpt or "\n".join(raw), MAX_EXCERPT)
            event.line = line_base + start
            if event.timestamp is None:
                event.timestamp = iso_ts(_leading_ts(lines[start]))
            result.events.append(event)
        context = None
        i = max(j, i + 1)
    result.consumed_lines = consumed
    return result


def _log_block(lines: list[str], i: int, has_context: bool) -> tuple[Event | None, int, str]:
    """Read the block starting at ``lines[i]``: (event or None, next index, rejection reason or "",
    or "context" for an error line introducing the trace on the next line, or "eof")."""
    n = len(lines)
    line = lines[i]
    if _is_py_start(line):
        event, j, status = _parse_python(lines, i)
        if status == "eof":
            return None, j, "eof"
        if status == "incomplete":
            return None, j, "Python traceback ends before its exception line"
        return event, j, ""
    if line.lstrip().startswith("{"):
        obj, bad = loads(line)
        if not bad:                       # a JSON line is a record, even when `at` lines follow it
            try:
                return _json_line_event(obj, True), i + 1, ""
            except (ValueError, TypeError, AttributeError) as exc:
                return None, i + 1, str(exc) or type(exc).__name__
    if _is_at_header(lines, i):
        event, j = _parse_at(lines, i)
        return event, j, ""
    if line.lstrip().startswith("{"):
        return None, i + 1, ""
    msg = _error_line(line)
    if msg is None:
        return None, i + 1, ""
    nxt = i + 1
    if not has_context and nxt < n and (_is_py_start(lines[nxt]) or _is_at_header(lines, nxt)):
        return None, i, "context"
    return Event(message=msg, cls=""), i + 1, ""


_TS = re.compile(r"^\W{0,2}(\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d{1,12})?(?:Z|[+-]\d\d:?\d\d)?)")


def _leading_ts(line: str) -> str | None:
    m = _TS.match(line)
    return m.group(1) if m else None


# --------------------------------------------------------------------------- JSONL records

_LEVEL_KEYS = ("level", "severity", "levelname", "log.level")
_STACK_KEYS = ("stack", "stacktrace", "stack_trace", "traceback", "exc_info", "error.stack_trace", "error.stack",
               "err.stack", "exception.stacktrace", "exception")
_CLASS_KEYS = ("class", "exception_class", "exc_type", "error.type", "error.kind", "err.name", "type",
               "exception.type")


def _record_is_error(obj: dict, in_log: bool = False) -> bool:
    """Is this JSON record an error?  Inside log text a record with no level counts when it names an
    exception class (plain JSONL files hold only errors, so there every record counts)."""
    level = _get(obj, *_LEVEL_KEYS)
    if isinstance(level, str) and level.lower() in ERROR_LEVELS:
        return True
    if _is_sentry(obj):
        return True
    if _get(obj, *_STACK_KEYS) is not None:
        return True
    return in_log and level is None and isinstance(_get(obj, *_CLASS_KEYS[:-2]), str)


def _stack_text_event(stack: str) -> Event | None:
    """A stack/traceback string through the log-text parsers: the event with the most frames, else the
    frame lines found in it (a stack printed without its header or exception line)."""
    stack = cap(stack, MAX_STACK)
    lines = split_lines(stack)
    if len(lines) < 4 * MAX_EXCERPT_LINES and max(map(len, lines)) <= MAX_LINE:
        if _is_py_start(lines[0]):        # the common shapes, without building an excerpt
            ev, _, status = _parse_python(lines, 0)
            if status == "ok" and ev is not None and ev.frames:
                return ev
        elif _is_at_header(lines, 0):
            ev = _parse_at(lines, 0)[0]
            if ev.frames:
                return ev
    parsed = parse_log_text(stack)
    if parsed.events:
        best = max(parsed.events, key=lambda e: len(e.frames))
        if best.frames:
            return best
    frames = []
    python = False
    for line in lines:
        if len(frames) >= MAX_FRAMES_KEPT * 4:
            break
        line = cap(line, MAX_LINE)
        head = line.lstrip()
        if head.startswith("File ") or head.startswith("at "):
            f = _frame_from_text(line if line[:1].isspace() else "  " + line)
            if f is not None:
                frames.append(f)
                python = python or head.startswith("File ")
    if frames:
        if not python:
            frames.reverse()        # Java/Node print innermost first, Python outermost first
        return Event(frames=frames)
    return parsed.events[0] if parsed.events else None


def event_from_record(obj: dict) -> Event:
    """One JSONL record (our own shape, common structured-log shapes, or a Sentry event) -> Event."""
    if not isinstance(obj, dict):
        raise ValueError("expected a JSON object")
    if _is_sentry(obj):
        return event_from_sentry(obj)
    message = _get(obj, "message", "msg", "error.message", "err.message", "exception.message")
    cls = _get(obj, *_CLASS_KEYS)
    if not message and isinstance(obj.get("error"), str):
        message = obj["error"]
    stack = _get(obj, *_STACK_KEYS[:-1])
    if isinstance(stack, list) and stack and all(isinstance(x, str) for x in stack) and \
            any("\n" in x for x in stack[:MAX_FRAMES_KEPT]):
        stack = "".join(stack[:MAX_FRAMES_KEPT * 4])      # traceback.format_exception() lines
    frames: list[Frame] = []
    causes: list[str] = []
    platform = _str(_get(obj, "platform"))
    if isinstance(stack, str):
        ev = _stack_text_event(stack)
        if ev is not None:
            frames, causes, platform = ev.frames, ev.causes, platform or ev.platform
            cls = cls or ev.cls or None
            message = message or ev.message or None
    elif isinstance(stack, list):
        for item in stack[-MAX_FRAMES_KEPT:]:
            if isinstance(item, str):
                item = cap(item, MAX_LINE)
                f = _frame_from_text(item if item[:1].isspace() else "  " + item) or Frame(function=item.strip())
            elif isinstance(item, dict):
                f = Frame(file=_str(_get(item, "file", "filename", "abs_path", "path"), MAX_NAME) or "",
                          function=_str(_get(item, "function", "func", "method", "name"), MAX_NAME) or "",
                          lineno=_int(_get(item, "line", "lineno", "lineNumber")),
                          module=_str(_get(item, "module", "class", "className"), MAX_NAME) or "",
                          in_app=_bool(_get(item, "in_app", "inApp")))
            else:
                raise ValueError("stack items must be strings or objects")
            frames.append(f)
    elif stack is not None and not isinstance(stack, dict):
        raise ValueError("stack must be a string or a list")
    if not message and not cls:
        raise ValueError("record has neither a message nor an exception class")
    if cls is not None and not isinstance(cls, str):
        raise ValueError("class must be a string")
    level = _str(_get(obj, *_LEVEL_KEYS)) or "error"
    ts_raw = _get(obj, "timestamp", "time", "ts", "@timestamp", "datetime")
    return Event(
        message=_str(message, MAX_MESSAGE) or "", cls=_str(cls, MAX_NAME) or "", frames=frames,
        causes=[_str(c, MAX_NAME) or "" for c in causes[:MAX_CAUSES]],
        service=_str(_get(obj, "service", "service.name", "app", "logger_service")),
        environment=_str(_get(obj, "environment", "env", "service.environment")),
        level=level.lower(), timestamp=iso_ts(ts_raw), repo=_str(_get(obj, "repo", "repository")),
        release=_str(_get(obj, "release", "version", "service.version")), platform=platform,
        excerpt=_str(stack, MAX_EXCERPT) if isinstance(stack, str) else "")


def _bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _json_lines(text: str, line_base: int) -> Iterator[tuple[int, Any, str | None]]:
    """(line number, parsed object or None, why it is not JSON or None) for every non-blank line."""
    for offset, line in enumerate(split_lines(text)):
        if not line or line.isspace():      # (what `not line.strip()` says, without copying the line)
            continue
        obj, bad = loads(line)
        yield line_base + offset, obj, bad


def _add_event(result: ParseResult, build: Callable[[Any], Event], obj: Any, lineno: int,
               prefix: str = "") -> None:
    """Build one event from a parsed object, or record why it is rejected; never raises."""
    try:
        ev = build(obj)
        ev.line = lineno
        ev.frames = ev.frames[-MAX_FRAMES_KEPT:]
        if not ev.excerpt:
            ev.excerpt = _excerpt(ev)
    except (ValueError, TypeError, AttributeError) as exc:
        result.rejected.append(Rejected(lineno, prefix + cap(str(exc) or type(exc).__name__, 200)))
        return
    except RecursionError:
        result.rejected.append(Rejected(lineno, prefix + "nested too deep"))
        return
    except Exception as exc:  # noqa: BLE001 - whatever one event holds, the others are still read
        result.rejected.append(Rejected(lineno, prefix + f"could not be read ({type(exc).__name__})"))
        return
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
_SENTRY_KEY_SET = frozenset(_SENTRY_KEYS)
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
    return bool(wrapper) or not _SENTRY_KEY_SET.isdisjoint(inner)


def _tags(raw: Any) -> dict[str, str]:
    tags: dict[str, str] = {}
    if isinstance(raw, dict):
        for k, v in list(raw.items())[:MAX_TAGS]:
            tags[_str(k) or ""] = _str(v) or ""
        return tags
    for item in _list(raw)[:MAX_TAGS]:
        if isinstance(item, list) and len(item) == 2:
            tags[_str(item[0]) or ""] = _str(item[1]) or ""
        elif isinstance(item, dict) and "key" in item:
            tags[_str(item["key"]) or ""] = _str(item.get("value")) or ""
    return tags


def _sentry_frames(stacktrace: Any) -> list[Frame]:
    frames = []
    for f in _list(_dict(stacktrace).get("frames"))[-MAX_FRAMES_KEPT:]:
        if not isinstance(f, dict):
            continue
        in_app = f.get("in_app", f.get("inApp"))
        frames.append(Frame(
            file=_str(f.get("filename") or f.get("abs_path") or f.get("absPath"), MAX_NAME) or "",
            function=_str(f.get("function") or f.get("rawFunction"), MAX_NAME) or "",
            lineno=_int(f.get("lineno", f.get("lineNo"))),
            module=_str(f.get("module") or f.get("package"), MAX_NAME) or "",
            in_app=None if in_app is None else bool(in_app)))
    return frames  # Sentry orders frames outermost first already


def _exc_class(value: dict, platform: str | None) -> str:
    from agent.infra.redact import redact

    # redacted part by part: joining first could glue a secret to the next part's text
    typ = redact(_str(value.get("type"), MAX_NAME) or "")
    module = redact(_str(value.get("module"), MAX_NAME) or "")
    if module and module not in _BUILTIN_MODULES and platform not in ("javascript", "node"):
        return f"{module}.{typ}" if typ else module
    return typ


DEFAULT_GROUPING = "{{ default }}"


def _grouping(raw: Any) -> list[str] | None:
    """An event's ``fingerprint`` (Sentry's custom grouping) when it says more than ``{{ default }}``."""
    values = [_str(v, MAX_NAME) for v in _list(raw)[:MAX_TAGS] if isinstance(v, (str, int, float))]
    values = [v for v in values if v is not None]
    if not values or all(v.replace(" ", "") == DEFAULT_GROUPING.replace(" ", "") for v in values):
        return None
    return values


def event_from_sentry(obj: dict) -> Event:
    """A Sentry event as SDKs send it (store/envelope payload), as webhooks wrap it, or as the web API
    returns it (``entries``, camelCase frames, tags as key/value objects).  A field of the wrong type is
    treated as absent."""
    if not isinstance(obj, dict):
        raise ValueError("expected a JSON object for a Sentry event")
    d, wrapper = _unwrap(obj)
    platform = _str(d.get("platform"))
    exc = d.get("exception")
    values = _list(exc.get("values")) if isinstance(exc, dict) else _list(exc)
    message = None
    request_url = None
    for entry in _list(d.get("entries")):
        if not isinstance(entry, dict):
            continue
        data = entry.get("data")
        if entry.get("type") == "exception" and isinstance(data, dict) and not values:
            values = _list(data.get("values"))
        elif entry.get("type") == "message" and isinstance(data, dict):
            message = data.get("formatted") or data.get("message")
        elif entry.get("type") == "request" and isinstance(data, dict):
            request_url = data.get("url")
    values = [v for v in values if isinstance(v, dict)]
    cls, frames, causes = "", [], []
    if values:
        main = values[-1]  # Sentry lists chained exceptions oldest first; the last one was raised
        cls = _exc_class(main, platform)
        frames = _sentry_frames(main.get("stacktrace") or main.get("raw_stacktrace"))
        causes = [_exc_class(v, platform) for v in reversed(values[:-1][-MAX_CAUSES:])]
        message = _str(main.get("value"), MAX_MESSAGE) or message
    if not frames:
        for thread in _list(_dict(d.get("threads")).get("values")):
            if isinstance(thread, dict) and thread.get("crashed"):
                frames = _sentry_frames(thread.get("stacktrace"))
    if message is None:
        le = _dict(d.get("logentry"))
        msg = d.get("message")
        message = (le.get("formatted") or le.get("message")) or \
                  (msg.get("formatted") or msg.get("message") if isinstance(msg, dict) else msg) or d.get("title")
    if not cls and not message:
        raise ValueError("Sentry event has neither an exception nor a message")
    tags = _tags(d.get("tags"))
    request = _dict(d.get("request"))
    request_url = request_url or request.get("url")
    release = d.get("release")
    if isinstance(release, dict):
        release = release.get("version")
    project = wrapper.get("project_slug") or (wrapper.get("project") if isinstance(wrapper.get("project"), str)
                                               else None)
    ev = Event(
        message=_str(message, MAX_MESSAGE) or "", cls=cap(cls, MAX_NAME), frames=frames, causes=causes,
        service=tags.get("service") or tags.get("service.name") or _str(project),
        environment=_str(d.get("environment")) or tags.get("environment"),
        level=(_str(d.get("level")) or tags.get("level") or "error").lower(),
        timestamp=iso_ts(d.get("timestamp") or d.get("dateCreated") or d.get("datetime") or d.get("received")),
        repo=tags.get("repo"), release=_str(release) or tags.get("release"), platform=platform,
        grouping=_grouping(d.get("fingerprint")))
    ev.excerpt = _excerpt(ev, extra=[f"culprit: {_str(d['culprit'], MAX_NAME)}" if d.get("culprit") else "",
                                     f"transaction: {_str(d['transaction'], MAX_NAME)}" if d.get("transaction")
                                     else "",
                                     f"url: {_str(request_url, MAX_NAME)}" if request_url else ""])
    return ev


def error_headline(cls: str | None, message: str | None) -> str:
    """``KeyError: 'qty'``: the class, then the message, without the class twice when the message already starts
    with it (as a Python exception's text does)."""
    cls, message = (cls or "").strip(), (message or "").strip()
    if not cls:
        return message or "-"
    if message == cls or message.startswith(cls + ":"):
        return message
    return f"{cls}: {message}" if message else cls


def _excerpt(ev: Event, extra: Iterable[str] = ()) -> str:
    lines = [cap(error_headline(ev.cls, ev.message) if ev.cls else ev.message, MAX_EXCERPT // 2)]
    for f in ev.frames[-30:]:
        where = f"{f.file or f.module}" + (f":{f.lineno}" if f.lineno is not None else "")
        lines.append(f"  at {where} in {f.function}")
    lines += [f"caused by: {c}" for c in ev.causes]
    lines += [x for x in extra if x]
    return cap("\n".join(lines), MAX_EXCERPT)


def parse_sentry(text: str, line_base: int = 1) -> ParseResult:
    """One Sentry event, a JSON array of them (the web API), or an SDK envelope / NDJSON stream."""
    result = ParseResult(format="sentry")
    doc, bad = loads(text)
    if bad:
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
    """Guess the format of a whole input.

    A JSON document (an array, or one object over several lines) or an SDK envelope -> ``sentry``; every
    non-blank line a JSON value (the first one valid) -> ``jsonl``; anything else -> log text
    (``traceback``), which reads tracebacks, error lines and JSON error records block by block, so a log
    mixing JSON lines and tracebacks loses neither.
    """
    s = text.lstrip()
    if not s:
        return "jsonl"
    first = s.split("\n", 1)[0]
    if s[0] in "[{":
        obj, bad = loads(first)
        if bad and "\n" in s.rstrip():
            doc, whole_bad = loads(s)
            if not whole_bad:
                return "sentry" if isinstance(doc, list) or _is_sentry(doc) else "jsonl"
        if not bad:
            if isinstance(obj, dict) and _envelope_header(obj):
                return "sentry"
            if isinstance(obj, list) and "\n" not in s.rstrip():
                return "sentry"
        if all(_json_ish(ln) for ln in s.split("\n") if ln.strip()):
            return "jsonl"            # a broken line among JSON lines is rejected by name, not read as log text
    return "traceback"


def _json_ish(line: str) -> bool:
    """A line meant as JSON: an object, or an array that parses (``[2024-05-01 ...] ERROR`` is log text)."""
    head = line.lstrip()[:1]
    return head == "{" or (head == "[" and loads(line)[1] is None)


def parse(text: str, fmt: str = "auto", *, service: str | None = None, environment: str | None = None,
          repo: str | None = None, final: bool = True, line_base: int = 1) -> ParseResult:
    """Parse ``text`` in ``fmt``; ``service``/``environment``/``repo`` fill in what events do not name.

    Never raises for any text (an unknown ``fmt`` is a programming error and raises ValueError)."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    text = one_newline(text[1:] if text.startswith("\ufeff") else text)
    chosen = sniff(text) if fmt == "auto" else fmt
    try:
        if chosen == "jsonl":
            result = parse_jsonl(text, line_base)
        elif chosen == "sentry":
            result = parse_sentry(text, line_base)
        else:
            result = parse_log_text(text, final=final, line_base=line_base)
    except Exception as exc:  # noqa: BLE001 - the parsers isolate lines and events; this is the last guard
        result = ParseResult(format=chosen, rejected=[Rejected(line_base, f"could not be read ({type(exc).__name__})")])
    for ev in result.events:
        ev.service = ev.service or service
        ev.environment = ev.environment or environment
        ev.repo = ev.repo or repo
    return result


_ERRORISH = re.compile(r"\b(?i:error|exception|traceback|fatal|panic|critical)\b|[a-z](?:Error|Exception)\b")


def nothing_found(text: str, fmt: str) -> tuple[str, bool]:
    """For an input that gave no event and no rejection: (why, in a few words; whether it really holds no error).

    It holds none when it is empty or blank, a document with no event in it, or log text in which no line even
    mentions an error. Text that holds NUL characters (binary, or UTF-16/32 without a byte-order mark) or log text
    that mentions errors in a shape not read here is not called clean."""
    lines = split_lines(text)
    count = sum(1 for ln in lines if ln.strip())
    if not count:
        return "the input is empty", True
    head = text[:4 * 1024 * 1024]
    if "\x00" in head:
        return ("it holds NUL characters: binary, or UTF-16/UTF-32 without a byte-order mark; save it as UTF-8",
                False)
    if fmt in ("jsonl", "sentry"):
        return f"{count} {'JSON line' if fmt == 'jsonl' else 'line'}{'s' if count > 1 else ''} of {fmt}, " \
               "holding no event", True
    if _ERRORISH.search(head):
        return (f"{count} line{'s' if count > 1 else ''} of log text mention errors, but none reads as an error "
                "line (ERROR, FATAL, level=error ...), a trace or a JSON error record; pass --format if it is JSON",
                False)
    return f"{count} line{'s' if count > 1 else ''} of log text, none an error line, trace or JSON error record", True
