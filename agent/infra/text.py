"""Untrusted text made safe to show, fence or write to a forge: one leaf module every writer shares.

- ``one_line``: a field that must be one line (service, class, environment, a title, an email header): every
  control, line separator, zero-width and bidi character becomes a space, runs of space collapse.
- ``strip_controls``: C0/C1 controls and ANSI escape sequences removed, newlines and tabs kept (lane output shown).
- ``visible``: zero-width, bidi and other invisible controls spelled ``<U+202E>`` so a reader (human or model)
  sees them (Trojan Source); ``bidi_controls`` lists the bidi ones a change holds.
- ``fence``: a backtick fence longer than any run of backtick-like characters in the (made visible) text.
- ``forge_safe``: what the forge would act on in free text (closing keywords with an issue reference, CI-skip
  directives, @mentions, commit trailers) defused, for text the agent writes outside fences.
"""

from __future__ import annotations

import re

# bidi embeddings/overrides/isolates and marks (Trojan Source, CVE-2021-42574)
BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c")
# characters that render as nothing (or almost): a fence or a keyword split by one looks whole
ZERO_WIDTH = frozenset("\u200b\u200c\u200d\u2060\u2061\u2062\u2063\u2064\ufeff\u180e\u00ad\u034f\u115f\u1160"
                       "\u3164\uffa0")
LINE_SEPARATORS = frozenset("\u2028\u2029\u0085\x0b\x0c\r\n")
# what a reader could take for a backtick
BACKTICKS = "`\u02cb\u1fef\uff40\u2035\u0060\u02bd"

_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
# Every escape sequence a terminal acts on, whole (linear: each alternative bounded or possessive), then any
# other control but newline and tab, and the bidi controls.
_ESCAPES = re.compile(
    r"[\x1b\x9b](?:(?<=\x1b)\[)?(?<=[\[\x9b])[0-?]{0,64}+[ -/]{0,16}+[@-~]?"      # CSI (7- or 8-bit)
    r"|(?:\x1b[\]PX^_]|[\x9d\x90\x98\x9e\x9f])[^\x07\x1b\x9c]{0,4096}+(?:\x07|\x1b\\|\x9c)?"  # OSC/DCS/SOS/PM/APC
    r"|\x1b[ -/]{0,16}+[0-~]?"                                                  # other ESC sequences
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f" + "".join(sorted(BIDI)) + "]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_INVISIBLE = re.compile("[" + "".join(sorted(BIDI | ZERO_WIDTH)) + r"\x00-\x08\x0b-\x1f\x7f-\x9f]")
_NOT_ONE_LINE = re.compile("[" + "".join(sorted(BIDI | ZERO_WIDTH | LINE_SEPARATORS)) + r"\x00-\x1f\x7f-\x9f]")
_TICK_RUN = re.compile("[" + BACKTICKS + "]+")


def strip_controls(text: str | None) -> str:
    """``text`` without terminal escape sequences (CSI, OSC/DCS/SOS/PM/APC with their payload, 7- or 8-bit),
    C0/C1 controls or bidi overrides; newlines and tabs stay (``\r\n`` and ``\r`` -> ``\n``).  What every
    lane-derived string passes through before it is stored or a human sees it (lane output shown)."""
    s = str(text or "")
    if s.isprintable() and not BIDI.intersection(s):
        return s
    return _ESCAPES.sub("", s.replace("\r\n", "\n").replace("\r", "\n"))


def one_line(text: str | None, limit: int | None = None) -> str:
    """``text`` as one clean line: controls, line separators, zero-width and bidi characters become spaces,
    whitespace collapses; clipped to ``limit`` characters (ending in ``…``) when given."""
    s = " ".join(_NOT_ONE_LINE.sub(" ", _ANSI.sub("", str(text or ""))).split())
    if limit is not None and len(s) > limit:
        s = s[: max(limit - 1, 0)].rstrip() + "…"
    return s


def visible(text: str | None) -> str:
    """``text`` with every invisible control (bidi, zero-width, C0/C1 except newline and tab) spelled
    ``<U+XXXX>``; ``\\r\\n`` becomes ``\\n``."""
    s = str(text or "").replace("\r\n", "\n")
    return _INVISIBLE.sub(lambda m: f"<U+{ord(m.group(0)):04X}>", s)


def bidi_controls(text: str | None) -> list[str]:
    """The bidi control characters in ``text``, as ``U+XXXX`` names (sorted, once each)."""
    return sorted({f"U+{ord(ch):04X}" for ch in str(text or "") if ch in BIDI})


def fence(text: str | None, info: str = "text") -> str:
    """``text`` (made visible) in a backtick fence longer than any run of backtick-like characters in it, so no
    line inside can close it, however it is spelled."""
    body = visible(text)
    longest = max((len(m) for m in _TICK_RUN.findall(body)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{one_line(info)}\n{body.rstrip()}\n{ticks}"


# closing keywords (GitHub, GitLab, Gitea) followed by an issue reference: #1, org/repo#2, a URL, GH-3
_CLOSING = re.compile(r"(?i)\b(clos(?:e|es|ed|ing)|fix(?:|es|ed|ing)|resolv(?:e|es|ed|ing)|implement(?:s|ed|ing)?)"
                      r"(\s*:?\s+)(?=(?:[\w.-]+/[\w.-]+)?#\d|https?://|gh-\d|[\w.-]+/[\w.-]+!\d|!\d)")
_SKIP_CI = re.compile(r"(?i)\[\s*(skip|no|ci|actions|azurepipelines|azure)[\s_-]*(ci|skip|actions)\s*\]|"
                      r"\*\*\*no_ci\*\*\*|\bskip-checks\s*:\s*true\b|\[skip-ci\]|\bci\.skip\b")
_MENTION = re.compile(r"(?<![\w`])@(?=[A-Za-z0-9])")
_TRAILER = re.compile(r"(?im)^(\s*)([A-Za-z][A-Za-z0-9-]*-by|Signed-off-by|Co-authored-by|Change-Id|Closes|Fixes"
                      r"|Resolves|Refs|Skip-checks)(\s*):")


def forge_safe(text: str | None) -> str:
    """Free text the agent writes to a forge outside a fence, with nothing in it the forge would act on: closing
    keywords lose their reference (``Fixes #1`` -> ``Fixes issue 1``), CI-skip directives are bracket-free, @mentions
    lose their ``@``, trailer lines lose their colon."""
    s = _CLOSING.sub(lambda m: f"{m.group(1)} (ref) ", str(text or ""))
    s = re.sub(r"(?<!&)#(?=\d)", " no. ", s)
    s = _SKIP_CI.sub(lambda m: "(" + re.sub(r"[\[\]*]", "", m.group(0)).strip() + ")", s)
    s = _MENTION.sub("", s)
    return _TRAILER.sub(lambda m: f"{m.group(1)}{m.group(2)}{m.group(3)} -", s)


def ident(text: str | None, limit: int = 80) -> str:
    """A name (exception class, service) for a template: its first word, letters, digits and ``_.:$/-`` only."""
    first = (one_line(text).split() or [""])[0]
    return re.sub(r"[^A-Za-z0-9_.:$/-]+", "", first)[:limit].strip("-.:/")
