"""Secret redaction: the one function every stored or published text passes through.

``redact(text) -> str`` replaces secrets with ``[redacted:KIND]`` markers.  It is deterministic
(so fingerprints computed from redacted fields are stable) and idempotent (redacting twice
changes nothing).  It over-redacts rather than under-redacts: a key named ``*token*`` loses its
value even when the value was harmless.  The forge and fixer call it as a final guard on PR
bodies and evidence; intake calls it on every field of every event before anything is stored.
Note: hex runs of 32+ characters are redacted, so a full 40-char git SHA is too; publish short SHAs.
"""

from __future__ import annotations

import functools
import re
from typing import Any

_SECRET_KEYS = (
    r"passw(?:or)?d|passwd|pwd|pass(?![a-z0-9])|secret|token|api[_-]?key|apikey|access[_-]?key|private[_-]?key|"
    r"client[_-]?secret|credentials?|session(?:[_-]?id)?|sessid|cookie|signature|auth(?![a-z0-9])|"
    r"authorization|bearer|jwt|dsn|otp(?![a-z0-9])|pin(?![a-z0-9])"
)
_SECRET_WORD = re.compile(r"(?i)" + _SECRET_KEYS)

# Every pattern below is linear on any input: repetitions are possessive (``*+``, ``++``: no backtracking into
# them) or bounded, and a pattern that must find something after a run (a dot, an ``@``, a separator) may only
# start where that run starts (a lookbehind), so a long run is scanned once, not once per position in it.
# tests/test_intake_hostile.py feeds each one inputs built to hurt and counts the work.
_RULES: list[tuple[str, re.Pattern, Any]] = [
    # to the END line, or to the end of the text when there is none
    ("private-key", re.compile(r"-----BEGIN [A-Z ]{0,40}PRIVATE KEY-----(?:[^-]++|-(?!----END [A-Z ]{0,40}PRIVATE KEY-----))*+"
                               r"(?:-----END [A-Z ]{0,40}PRIVATE KEY-----)?"), "[redacted:private-key]"),
    # Whole header lines whose value is a credential, to the end of the line.
    ("header", re.compile(r"(?im)\b((?:set-)?cookie|authorization|proxy-authorization|x-api-key|x-auth-token)"
                          r"([ \t]{0,64}:[ \t]{0,64})(?!\[redacted)([^\s\"'][^\r\n\"']*+)"),
     lambda m: f"{m.group(1)}{m.group(2)}[redacted:{_kind(m.group(1))}]"),
    # "Bearer X" anywhere; "Basic/Token/Digest X" as words, when X looks like a credential (has a digit or symbol)
    ("bearer", re.compile(r"(?i)(bearer)\s{1,64}+(?!\[redacted)([A-Za-z0-9._~+/=-]{8,}+)"),
     lambda m: f"{m.group(1)} [redacted:bearer]"),
    ("token", re.compile(r"(?i)(?<![A-Za-z0-9])(basic|token|digest)\s{1,64}+(?!\[redacted)"
                         r"(?=[A-Za-z.~]*+[0-9+/=_-])([A-Za-z0-9._~+/=-]{8,}+)"),
     lambda m: f"{m.group(1)} [redacted:bearer]"),
    # the netrc form (``machine H login U password P``, ``default ... password P``), one line or several
    ("netrc", re.compile(r"(?i)(\b(?:machine\s{1,64}+\S{1,253}+|default)(?:\s{1,64}+(?:login|account|port)\s{1,64}+"
                         r"\S{1,256}+){0,3}+\s{1,64}+password\s{1,64}+)(?!\[redacted)\S{1,1024}+"),
     lambda m: f"{m.group(1)}[redacted:password]"),
    ("url-password", re.compile(r"(?i)\b([a-z][a-z0-9+.-]{1,20}://)([^/\s:@\"'<>]*+):([^/\s@\"'<>]++)@"),
     lambda m: f"{m.group(1)}{m.group(2)}:[redacted:password]@"),
    ("jwt", None, None),   # _sub_jwt: a hand-written scan (see there)
    ("github-token", re.compile(r"(?:gh[pousr]_[A-Za-z0-9]{30,}+|github_pat_[A-Za-z0-9_]{22,}+)"),
     "[redacted:github-token]"),
    ("aws-key", re.compile(r"(?<![0-9])(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA|ABIA|ACCA)[A-Z0-9]{16}(?![A-Za-z0-9])"),
     "[redacted:aws-key]"),
    ("slack-token", re.compile(r"xox[abprs]-[A-Za-z0-9-]{10,}+"), "[redacted:token]"),
    ("stripe-key", re.compile(r"(?<![A-Za-z0-9])(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{10,}+"), "[redacted:token]"),
    ("model-api-key", re.compile(r"(?<![A-Za-z0-9])sk-(?:ant-|proj-|or-)?[A-Za-z0-9_-]{20,}+"), "[redacted:token]"),
    ("google-key", re.compile(r"AIza[0-9A-Za-z_-]{35}\b"), "[redacted:token]"),
    # key=value, key: value, "key": "value", 'key': 'value' where the key names a secret: _sub_key_values.
    ("key-value", None, None),
    # an address starts where its run of local-part characters starts (leading punctuation stays)
    ("email", re.compile(r"(?<![A-Za-z0-9._%+-])([._%+-]*+)[A-Za-z0-9][A-Za-z0-9._%+-]*+@[A-Za-z0-9-]{1,63}"
                         r"(?:\.[A-Za-z0-9-]{1,63}){0,8}\.[A-Za-z]{2,63}"),
     lambda m: f"{m.group(1)}[redacted:email]"),
    ("hex", re.compile(r"(?<![0-9a-fA-F])(?:0x)?[0-9a-fA-F]{32,}+"), "[redacted:hex]"),
]


def _kind(header: str) -> str:
    h = header.lower()
    return "cookie" if "cookie" in h else "authorization" if "auth" in h else "token"


# ---- JSON web tokens: eyJ<5+ chars>.<5+ chars>.<chars>, from the alphabet [A-Za-z0-9_-].
_B64_RUN = re.compile(r"[A-Za-z0-9_-]*+")


def _sub_jwt(text: str) -> str:
    """Replace every JWT.  A failed candidate skips to the end of its run: every later ``eyJ`` in the same run
    would fail the same way, so each character is looked at a bounded number of times."""
    out: list[str] = []
    pos = done = 0
    while True:
        p = text.find("eyJ", pos)
        if p < 0:
            break
        r1 = _B64_RUN.match(text, p + 3).end()
        end = -1
        if r1 - (p + 3) >= 5 and text.startswith(".", r1):
            r2 = _B64_RUN.match(text, r1 + 1).end()
            if r2 - (r1 + 1) >= 5 and text.startswith(".", r2):
                end = _B64_RUN.match(text, r2 + 1).end()
        if end < 0:
            pos = max(r1, p + 3)
            continue
        out += [text[done:p], "[redacted:jwt]"]
        pos = done = end
    return "".join(out) + text[done:] if out else text


# ---- key=value secrets
# A key is a whole run of key characters (it can only start where such a run starts), optionally quoted,
# followed by = : or => ; the value is matched only for keys that name a secret.
_KEY_SEP = re.compile(r"[\"']?(?<![A-Za-z0-9_.-])(?P<run>[A-Za-z0-9_.-]++)[\"']?(?P<s>\s{0,16}+(?:=>|=|:)\s{0,16}+)")
# A quoted value not closed within 4096 characters is redacted to the end of its line (no tail leaks).
_VALUE = re.compile(r"\"(?:[^\"\\\n]|\\.){0,4096}+(?:\"|[^\n]*+)|'(?:[^'\\\n]|\\.){0,4096}+(?:'|[^\n]*+)"
                    r"|[^\s,;&\"'}\])<>]++")
# File names are not keys: ``web/sessions.py:321`` is a position, ``tokens.js: 12`` too.
_FILE_EXTS = frozenset(
    "py pyc pyx pyi js mjs cjs jsx ts tsx java kt kts scala groovy clj cljs rb erb go rs php c cc cpp cxx h hh hpp cs "
    "fs vb swift m mm dart ex exs erl hrl lua pl pm sh bash zsh ps1 r jl elm hs ml vue svelte html htm jsp aspx cshtml "
    "css scss sass less json yaml yml toml ini cfg conf xml properties sql proto tf txt log md rst lock gradle map wasm "
    "so dll jar class egg whl".split())


def _is_file_name(run: str) -> bool:
    return "." in run and run.rsplit(".", 1)[1].lower() in _FILE_EXTS


_POSITION = re.compile(r"\d{1,9}(?::\d{1,9})?(?![A-Za-z0-9_.-])")


def _looks_like_file(run: str) -> bool:
    """``name.ext`` whose extension is short and is not itself the secret word (``db.password`` is a key)."""
    if "." not in run:
        return False
    ext = run.rsplit(".", 1)[1]
    return 0 < len(ext) <= 6 and ext.isalnum() and _SECRET_WORD.search(ext) is None


def _sub_key_values(text: str) -> str:
    out: list[str] = []
    done = pos = 0
    while True:
        m = _KEY_SEP.search(text, pos)    # each search starts where the last match or value ended: one pass
        if m is None:
            break
        pos = vpos = m.end()
        run = m.group("run")
        if not _SECRET_WORD.search(run) or _is_file_name(run):
            continue
        if m.group("s").strip() == ":" and _POSITION.match(text, vpos) and _looks_like_file(run):
            continue                   # file.ext:line without a known extension
        v = _VALUE.match(text, vpos)
        if v is None or v.end() == vpos:
            continue
        pos = v.end()
        value = v.group(0)
        inner = value.strip("\"'")
        if inner.startswith("[redacted") or not inner:
            continue
        q = value[0] if value[0] in "\"'" and len(value) >= 2 and value[-1] == value[0] else ""
        out += [text[done:vpos], f"{q}[redacted:secret]{q}"]
        done = v.end()
    return "".join(out) + text[done:] if out else text


# A superset of every rule's necessary literal (lowercased): text holding none of them, and no
# 32-hex run or GitHub token prefix, cannot hold a secret the rules would find, so it skips the
# substitutions.  Keep in step with _RULES and _SECRET_KEYS when adding a rule.
_LITERALS = ("private key", "privatekey", "private_key", "private-key", "apikey", "api_key", "api-key",
             "accesskey", "access_key", "access-key", "cookie", "authori", "token", "bearer", "basic", "digest", "://", "eyj",
             "github_pat_", "akia", "asia", "agpa", "aida", "aroa", "anpa", "anva", "aipa", "abia", "acca",
             "xox", "_live_", "_test_", "aiza", "sk-", "@", "pass", "pwd", "secret", "credential", "session", "sessid",
             "signature", "auth", "jwt", "dsn", "otp", "pin")
_GH_PREFIX = re.compile(r"gh[pousr]_")
_HEX32 = re.compile(r"[0-9a-fA-F]{32}")   # a 32-hex run anywhere means one that starts a run (the rule's lookbehind)


def _maybe(text: str) -> bool:
    low = text.lower()
    for lit in _LITERALS:
        if lit in low:
            return True
    return ("gh" in text and _GH_PREFIX.search(text) is not None) or _HEX32.search(text) is not None


# Per rule, literals (lowercased) at least one of which every match contains: a rule whose literals are all
# absent from the text is skipped.  A marker a rule writes never creates a match for a later rule, so checking
# the original text is enough; test_prefilter_never_changes_the_result holds this equal to _apply_rules.
_NEEDS: dict[str, tuple[str, ...]] = {
    "private-key": ("private key",),
    "header": ("cookie", "authorization", "x-api-key", "x-auth-token"),
    "bearer": ("bearer",),
    "token": ("basic", "token", "digest"),
    "netrc": ("machine", "default"),
    "url-password": ("://",),
    "jwt": ("eyj",),
    "github-token": ("gh", "github_pat_"),
    "aws-key": ("akia", "asia", "agpa", "aida", "aroa", "anpa", "anva", "aipa", "abia", "acca"),
    "slack-token": ("xox",),
    "stripe-key": ("_live_", "_test_"),
    "model-api-key": ("sk-",),
    "google-key": ("aiza",),
    "key-value": ("pass", "pwd", "secret", "token", "key", "credential", "session", "sessid", "cookie",
                  "signature", "auth", "bearer", "jwt", "dsn", "otp", "pin"),
    "email": ("@",),
}


def _apply(name: str, pattern: re.Pattern | None, repl: Any, text: str) -> str:
    if pattern is not None:
        return pattern.sub(repl, text)
    return _sub_jwt(text) if name == "jwt" else _sub_key_values(text)


MAX_PASSES = 3   # a marker one rule writes can let an earlier rule match differently; passes until nothing changes


def _all_rules_once(text: str) -> str:
    for name, pattern, repl in _RULES:
        text = _apply(name, pattern, repl, text)
    return text


def _filtered_once(text: str) -> str:
    if not _maybe(text):
        return text
    low = text.lower()
    for name, pattern, repl in _RULES:
        needs = _NEEDS.get(name)
        if needs is None or any(lit in low for lit in needs):
            text = _apply(name, pattern, repl, text)
    return text


def _fixpoint(one_pass, text: str) -> str:
    for _ in range(MAX_PASSES):
        out = one_pass(text)
        if out == text:
            break
        text = out
    return text


def _apply_rules(text: str) -> str:
    """Every rule, unfiltered (the reference the filtered path is tested against)."""
    return _fixpoint(_all_rules_once, text)


def _redact(text: str) -> str:
    return _fixpoint(_filtered_once, text)


_cached = functools.lru_cache(maxsize=8192)(_redact)


def redact(text: Any) -> Any:
    """Return ``text`` with secrets replaced by ``[redacted:KIND]``; non-strings pass through."""
    if not isinstance(text, str) or not text:
        return text
    return _cached(text) if len(text) <= 256 else _redact(text)


def redact_obj(value: Any) -> Any:
    """Redact every string (keys too) inside nested dicts/lists."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact(str(k)): redact_obj(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_obj(v) for v in value]
    return value
