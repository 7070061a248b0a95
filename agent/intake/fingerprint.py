"""Fingerprints: which occurrences are the same bug.

fingerprint = sha256("service | exception class | stack signature | environment")[:20].

The stack signature is the innermost ``MAX_FRAMES`` frames as ``module-or-file:function``,
with volatile parts normalised (numbers, UUIDs, hex addresses, quoted values, ids), plus the
classes of chained causes.  Line numbers are left out on purpose: they move with every deploy,
while the chain of functions that reached the raise is what identifies the call site.  With no
frames at all the signature falls back to the normalised message.  So the same bug from
different requests (different ids, values, addresses, timestamps in the message) groups together,
and the same exception raised from a different function or reached through a different caller
stays apart.  The fingerprint is 20 hex chars so it is never mistaken for a secret by ``redact``.
"""

from __future__ import annotations

import hashlib
import re
from typing import Sequence

MAX_FRAMES = 8

_UUID = re.compile(r"\b[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}\b")
_HEXADDR = re.compile(r"\b0x[0-9a-fA-F]+\b|@[0-9a-fA-F]{4,}\b")
_HEXRUN = re.compile(r"\b(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{6,}\b")
_QUOTED = re.compile(r"\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'|`[^`]*`")
_REDACTED = re.compile(r"\[redacted:[a-z-]+\]")
_ID_TOKEN = re.compile(r"\b(?=[\w-]*\d)[A-Za-z][\w-]*\d[\w-]*\b")   # words with digits: user_42, sku-123, req7f
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_SPACE = re.compile(r"\s+")


def normalise_text(text: str | None) -> str:
    """Strip the volatile parts of a message or frame name."""
    s = text or ""
    s = _REDACTED.sub("<R>", s)
    s = _UUID.sub("<uuid>", s)
    s = _HEXADDR.sub("<addr>", s)
    s = _QUOTED.sub("<q>", s)
    s = _HEXRUN.sub("<hex>", s)
    s = _ID_TOKEN.sub("<id>", s)
    s = _NUMBER.sub("<n>", s)
    return _SPACE.sub(" ", s).strip()


_LONGNUM = re.compile(r"\d{4,}")
_LAMBDA = re.compile(r"\$\$?Lambda\$?[\w/$]*|lambda\$[\w$]*|\$\d+")


def normalise_code(name: str | None) -> str:
    """Identifiers are stable, so only generated parts go: lambdas, ``$1`` classes, build hashes, long numbers."""
    s = _LAMBDA.sub("$λ", name or "")
    s = _UUID.sub("<uuid>", s)
    s = _HEXADDR.sub("<addr>", s)
    s = _HEXRUN.sub("<hex>", s)
    return _LONGNUM.sub("<n>", s).strip()


def _path(file: str) -> str:
    """Keep the stable tail of a path: drop deploy roots, site-packages prefixes, query strings."""
    f = (file or "").replace("\\", "/").split("?")[0].split("#")[0]
    for marker in ("site-packages/", "dist-packages/", "node_modules/"):
        if marker in f:
            f = marker + f.rsplit(marker, 1)[1]
            break
    else:
        f = re.sub(r"^[a-z]+://[^/]+", "", f)        # webpack://app or https://cdn.host
        parts = [p for p in f.split("/") if p not in ("", ".")]
        f = "/".join(parts[-3:])
    return normalise_code(f)


def frame_key(file: str = "", function: str = "", module: str = "") -> str:
    where = normalise_code(module) if module else _path(file)
    fn = normalise_code(function) or "?"
    return f"{where}:{fn}"


def signature(frames: Sequence, causes: Sequence[str] = (), message: str | None = None) -> str:
    """The normalised stack signature of an event (frames ordered outermost first)."""
    keys = [frame_key(getattr(f, "file", ""), getattr(f, "function", ""), getattr(f, "module", ""))
            for f in frames]
    in_app = [k for k, f in zip(keys, frames) if getattr(f, "in_app", None) is not False]
    keys = in_app or keys
    if keys:
        sig = " > ".join(keys[-MAX_FRAMES:])
    else:
        sig = "msg:" + normalise_text(message)[:200]
    if causes:
        sig += " | caused by " + ", ".join(normalise_code(c) for c in causes)
    return sig


def fingerprint(service: str | None, cls: str | None, sig: str, environment: str | None) -> str:
    raw = " | ".join([(service or "").strip(), normalise_code(cls), sig, (environment or "").strip()])
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:20]
