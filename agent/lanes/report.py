"""The final-report parser: pure, never raises, fail-closed.

An agent's last message must end with exactly one report::

    STATUS: complete | partial | blocked
    SUMMARY: <one paragraph>          (implementer; required)
    LESSON: <one line>                (implementer; optional)
    FINDINGS:                         (reviewer, pr-quality, pr-logic; required; "none" for zero)
    - <finding>
    DECISION: fix | skip              (decider; required) + BRIEF: (fix) or REASON: (skip)

A report starts at a line beginning (column 0) with ``STATUS:``.  It does not count when it is
inside a code fence, indented or prefixed (quoted, or a line of an echoed diff), and the message
fails when there are two, or when anything but report lines follows it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

STATUSES = ("complete", "partial", "blocked")
REVIEW_ROLES = ("reviewer", "pr-quality", "pr-logic")
DECISIONS = ("fix", "skip")
KEYS = ("STATUS", "SUMMARY", "LESSON", "FINDINGS", "DECISION", "BRIEF", "REASON")
NONE_WORDS = {"", "none", "0", "n/a", "na", "-", "no findings", "nothing", "none.", "n/a."}

_KEY_RE = re.compile(r"^(" + "|".join(KEYS) + r")[ \t]*:[ \t]*(.*)$", re.IGNORECASE)
_STATUS_START = re.compile(r"^status[ \t]*:", re.IGNORECASE)
_QUOTED_STATUS = re.compile(r"^[ \t>+\-*#|`\"']+status[ \t]*:", re.IGNORECASE)
_FENCE_RE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
_BULLET_RE = re.compile(r"^[ \t]{0,3}(?:[-*+\u2022]|\d{1,3}[.)])[ \t]+(.*)$")
_INT_RE = re.compile(r"^\d{1,6}$")


@dataclass(frozen=True)
class Report:
    ok: bool
    status: str | None = None
    summary: str | None = None
    lesson: str | None = None
    findings: int | None = None
    findings_text: str = ""
    decision: str | None = None
    brief: str | None = None
    reason: str | None = None
    problem: str | None = None

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _bad(problem: str, **fields) -> Report:
    return Report(ok=False, problem=problem, **fields)


def _fence_mask(lines: list[str]) -> list[bool]:
    """True for lines inside (or opening/closing) a fenced code block."""
    mask = [False] * len(lines)
    open_char, open_len = None, 0
    for i, line in enumerate(lines):
        m = _FENCE_RE.match(line)
        if open_char is None:
            if m:
                open_char, open_len = m.group(1)[0], len(m.group(1))
                mask[i] = True
        else:
            mask[i] = True
            if m and m.group(1)[0] == open_char and len(m.group(1)) >= open_len and not m.group(2).strip():
                open_char = None
    return mask


def _clean(value: str) -> str:
    return value.strip().strip("*_`").strip()


def parse_report(text: str, role: str) -> Report:
    """Parse the final report at the end of ``text`` for ``role``; see the module doc."""
    try:
        return _parse(text if isinstance(text, str) else "", role)
    except Exception as exc:  # pure and total: a parser bug must fail closed, not crash a run
        return _bad(f"report could not be parsed ({type(exc).__name__})")


def _parse(text: str, role: str) -> Report:
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    lines = text.split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    fenced = _fence_mask(lines)
    starts = [i for i, line in enumerate(lines) if not fenced[i] and _STATUS_START.match(line)]
    if not starts:
        if any(fenced[i] and "status" in line.lower() and _STATUS_START.match(line.lstrip())
               for i, line in enumerate(lines)):
            return _bad("report inside a code fence; write the final report as plain lines at the very end")
        if any(_QUOTED_STATUS.match(line) for line in lines):
            return _bad("report is indented or quoted; start each report line at the beginning of the line")
        return _bad("no final report; end your last message with STATUS: complete|partial|blocked")
    if len(starts) > 1:
        return _bad(f"two reports ({len(starts)} STATUS lines); give exactly one final report at the very end")

    fields: dict[str, str] = {}
    findings_items: list[str] = []
    current: str | None = None
    blank_since = False
    for i in range(starts[0], len(lines)):
        line = lines[i]
        if fenced[i]:
            return _bad("text after the report (a code fence); the report must be the very end of the message")
        m = _KEY_RE.match(line)
        if m:
            key = m.group(1).upper()
            if key in fields:
                return _bad(f"{key} given twice; give each report field once")
            fields[key] = m.group(2).strip()
            current, blank_since = key, False
            continue
        if not line.strip():
            blank_since = True
            continue
        if current == "FINDINGS":
            b = _BULLET_RE.match(line)
            if b:
                findings_items.append(b.group(1).strip())
                blank_since = False
                continue
            if findings_items and line[:1] in (" ", "\t") and not blank_since:
                findings_items[-1] += " " + line.strip()
                continue
            if not findings_items and not blank_since and not fields["FINDINGS"]:
                # a finding written as a plain line right under FINDINGS:
                findings_items.append(line.strip())
                continue
        elif current in ("SUMMARY", "BRIEF", "REASON") and not blank_since:
            fields[current] = (fields[current] + " " + line.strip()).strip()
            continue
        snippet = line.strip()[:60]
        return _bad(f"text after the report ({snippet!r}); the report must be the very end of the message")

    raw_status = _clean(fields.get("STATUS", "")).rstrip(".").lower()
    if raw_status not in STATUSES:
        return _bad(f"STATUS must be complete|partial|blocked, got {fields.get('STATUS', '')!r}")
    summary = _clean(fields["SUMMARY"]) if "SUMMARY" in fields else None
    lesson = _clean(fields["LESSON"]) if "LESSON" in fields else None
    base = dict(status=raw_status, summary=summary or None, lesson=lesson or None)

    if role in REVIEW_ROLES:
        if "FINDINGS" not in fields:
            return _bad("FINDINGS missing; reviewers end with FINDINGS: followed by one '- ' line per finding, "
                        "or FINDINGS: none", **base)
        count, ftext = _findings(fields["FINDINGS"], findings_items)
        return Report(ok=True, findings=count, findings_text=ftext, **base)

    if role == "decider":
        decision = _clean(fields.get("DECISION", "")).rstrip(".").lower()
        if decision not in DECISIONS:
            return _bad(f"DECISION must be fix|skip, got {fields.get('DECISION', '')!r}"
                        if "DECISION" in fields else "DECISION missing; a decider ends with DECISION: fix|skip",
                        **base)
        brief = _clean(fields.get("BRIEF", "")) or None
        reason = _clean(fields.get("REASON", "")) or None
        if decision == "fix" and not brief:
            return _bad("BRIEF missing; DECISION: fix needs BRIEF: what is broken, likely cause, where to look",
                        **base)
        if decision == "skip" and not reason:
            return _bad("REASON missing; DECISION: skip needs REASON: why this error is not worth a fix", **base)
        return Report(ok=True, decision=decision, brief=brief, reason=reason, **base)

    if role == "implementer" and not summary:
        return _bad("SUMMARY missing; the implementer reports SUMMARY: what changed and why", **base)
    count, ftext = (_findings(fields["FINDINGS"], findings_items) if "FINDINGS" in fields else (None, ""))
    return Report(ok=True, findings=count, findings_text=ftext, **base)


def _findings(inline: str, items: list[str]) -> tuple[int, str]:
    """Count findings; 'none', '0', 'n/a', '-', empty = 0.  Errs towards more findings."""
    real = [it for it in items if _clean(it).lower() not in NONE_WORDS]
    value = _clean(inline)
    low = value.lower()
    if low in NONE_WORDS:
        inline_count = 0
    elif _INT_RE.match(value):
        inline_count = int(value)
    else:
        real.insert(0, value)
        inline_count = 0
    count = max(inline_count, len(real))
    text = "\n".join(f"- {it}" for it in real)
    if not text and inline_count:
        text = f"{inline_count} finding(s), not itemised"
    return count, text


def verdict(report: Report | None) -> str | None:
    """approve | reject | None: complete + 0 findings approves; findings or partial/blocked reject."""
    if report is None or not report.ok:
        return None
    if report.status == "complete" and not report.findings:
        return "approve"
    return "reject"


def report_template(role: str) -> str:
    """The report block a spec (or a repair note) asks ``role`` to end with."""
    lines = ["STATUS: complete | partial | blocked"]
    if role in REVIEW_ROLES:
        lines += ["FINDINGS:", "- <one line per finding; write FINDINGS: none when there are none>"]
    elif role == "decider":
        lines += ["DECISION: fix | skip", "BRIEF: <what is broken, likely cause, where to look>   (for fix)",
                  "REASON: <why no fix is worth making>                     (for skip)"]
    else:
        lines += ["SUMMARY: <one paragraph: what you changed and why>", "LESSON: <one line, optional>"]
    return "\n".join(lines)


def repair_note(problem: str | None, role: str) -> str:
    """The note a repair turn sends: what was wrong, and a request for only the fixed report."""
    return (f"Your final report could not be accepted: {problem or 'no valid final report'}.\n\n"
            "Do not redo the work. Reply with only the corrected final report, written as plain lines at the "
            "very end of your message: no code fence, no quoting, nothing after it, and exactly one report:\n\n"
            + report_template(role) + "\n")
