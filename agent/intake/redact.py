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

_RULES: list[tuple[str, re.Pattern, Any]] = [
    ("private-key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)",
                               re.S), "[redacted:private-key]"),
    # Whole header lines whose value is a credential, to the end of the line.
    ("header", re.compile(r"(?im)\b((?:set-)?cookie|authorization|proxy-authorization|x-api-key|x-auth-token)"
                          r"([ \t]*:[ \t]*)(?!\[redacted)([^\s\"'][^\r\n\"']*)"),
     lambda m: f"{m.group(1)}{m.group(2)}[redacted:{_kind(m.group(1))}]"),
    # "Bearer X" anywhere; "Basic/Token/Digest X" as words, when X looks like a credential (has a digit or symbol)
    ("bearer", re.compile(r"(?i)(bearer)\s+(?!\[redacted)([A-Za-z0-9._~+/=-]{8,})"),
     lambda m: f"{m.group(1)} [redacted:bearer]"),
    ("token", re.compile(r"(?i)(?<![A-Za-z0-9])(basic|token|digest)\s+(?!\[redacted)"
                         r"(?=[A-Za-z._~]*[0-9+/=_-])([A-Za-z0-9._~+/=-]{8,})"),
     lambda m: f"{m.group(1)} [redacted:bearer]"),
    ("url-password", re.compile(r"(?i)\b([a-z][a-z0-9+.-]{1,20}://)([^/\s:@\"'<>]*):([^/\s@\"'<>]+)@"),
     lambda m: f"{m.group(1)}{m.group(2)}:[redacted:password]@"),
    ("jwt", re.compile(r"eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*"), "[redacted:jwt]"),
    ("github-token", re.compile(r"(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,})"),
     "[redacted:github-token]"),
    ("aws-key", re.compile(r"(?<![0-9])(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA|ABIA|ACCA)[A-Z0-9]{16}(?![A-Za-z0-9])"),
     "[redacted:aws-key]"),
    ("slack-token", re.compile(r"xox[abprs]-[A-Za-z0-9-]{10,}"), "[redacted:token]"),
    ("stripe-key", re.compile(r"(?<![A-Za-z0-9])(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{10,}"), "[redacted:token]"),
    ("model-api-key", re.compile(r"(?<![A-Za-z0-9])sk-(?:ant-|proj-|or-)?[A-Za-z0-9_-]{20,}"), "[redacted:token]"),
    ("google-key", re.compile(r"AIza[0-9A-Za-z_-]{35}\b"), "[redacted:token]"),
    # key=value, key: value, "key": "value", 'key': 'value' where the key names a secret.
    ("key-value", re.compile(
        r"(?i)(?P<k>[\"']?[A-Za-z0-9_.-]*?(?:" + _SECRET_KEYS + r")[A-Za-z0-9_.-]*[\"']?)"
        r"(?P<s>\s*(?:=|:|=>)\s*)"
        r"(?P<v>\"(?:[^\"\\\n]|\\.)*\"|'(?:[^'\\\n]|\\.)*'|[^\s,;&\"'}\])<>]+)"),
     lambda m: _kv(m)),
    ("email", re.compile(r"[A-Za-z0-9][A-Za-z0-9._%+-]*@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"),
     "[redacted:email]"),
    ("hex", re.compile(r"(?:0x)?[0-9a-fA-F]{32,}"), "[redacted:hex]"),
]


def _kind(header: str) -> str:
    h = header.lower()
    return "cookie" if "cookie" in h else "authorization" if "auth" in h else "token"


def _kv(m: re.Match) -> str:
    v = m.group("v")
    if v.strip("\"'").startswith("[redacted") or not v.strip("\"'"):
        return m.group(0)
    q = v[0] if v[0] in "\"'" and len(v) >= 2 and v[-1] == v[0] else ""
    return f"{m.group('k')}{m.group('s')}{q}[redacted:secret]{q}"


# A superset of every rule's necessary literal (lowercased): text holding none of them, and no
# 32-hex run or GitHub token prefix, cannot hold a secret the rules would find, so it skips the
# substitutions.  Keep in step with _RULES and _SECRET_KEYS when adding a rule.
_LITERALS = ("private key", "privatekey", "private_key", "private-key", "apikey", "api_key", "api-key",
             "accesskey", "access_key", "access-key", "cookie", "authori", "token", "bearer", "basic", "digest", "://", "eyj",
             "github_pat_", "akia", "asia", "agpa", "aida", "aroa", "anpa", "anva", "aipa", "abia", "acca",
             "xox", "_live_", "_test_", "aiza", "sk-", "@", "pass", "pwd", "secret", "credential", "session", "sessid",
             "signature", "auth", "jwt", "dsn", "otp", "pin")
_MAYBE_RE = re.compile(r"gh[pousr]_|[0-9a-fA-F]{32}")


def _maybe(text: str) -> bool:
    low = text.lower()
    return any(lit in low for lit in _LITERALS) or _MAYBE_RE.search(text) is not None


def _apply_rules(text: str) -> str:
    for _name, pattern, repl in _RULES:
        text = pattern.sub(repl, text)
    return text


def _redact(text: str) -> str:
    return _apply_rules(text) if _maybe(text) else text


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
