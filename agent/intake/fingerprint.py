"""Fingerprints: which occurrences are the same bug.

fingerprint = sha256("service | exception class | stack signature | environment")[:20].

The stack signature is the innermost ``MAX_FRAMES`` in-app frames as ``location:function``, with
volatile parts normalised (numbers, UUIDs, hex addresses, quoted values, ids), plus the classes of
chained causes.  A frame's location ignores where the code was deployed: it is the file's name
without directories or extension (``/srv/app/widgets/pricing.py``, ``widgets/pricing.py`` and the
module ``widgets.pricing`` are all ``pricing``; a Java class ``com.acme.OrderService`` and its file
``OrderService.java`` are both ``OrderService``), so one code location matches across Sentry, JSONL
and log tracebacks.  Generic file names (``__init__``, ``index``) keep their directory.  Frames are
in-app unless the source says otherwise or the path/module is plainly a library (site-packages,
node_modules, ``java.``...), since log tracebacks carry no in_app flag.  Line numbers are left out on purpose: they move with every deploy,
while the chain of functions that reached the raise is what identifies the call site.  With no
frames at all the signature falls back to the normalised message.  So the same bug from
different requests (different ids, values, addresses, timestamps in the message) groups together,
and the same exception raised from a different function or reached through a different caller
stays apart.  The fingerprint is 20 hex chars so it is never mistaken for a secret by ``redact``.
"""

from __future__ import annotations

import functools
import hashlib
import re
from typing import Sequence

MAX_FRAMES = 8

MAX_TEXT = 2000      # characters of a message that are normalised
MAX_CODE = 512       # characters of a file, function, module or class name

# Linear on any input: repetitions are bounded, and the inputs are capped first.
_UUID = re.compile(r"\b[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}\b")
_HEXADDR = re.compile(r"\b0x[0-9a-fA-F]++\b|@[0-9a-fA-F]{4,}+\b")
_HEXRUN = re.compile(r"\b(?=[a-fA-F]*+\d)(?=\d*+[a-fA-F])[0-9a-fA-F]{6,}+\b")   # a digit and a letter
_QUOTED = re.compile(r"\"(?:[^\"\\]|\\.){0,512}+\"|'(?:[^'\\]|\\.){0,512}+'|`[^`]{0,512}+`")
_REDACTED = re.compile(r"\[redacted:[a-z-]{1,32}+\]")
_ID_TOKEN = re.compile(r"\b(?=[\w-]{0,64}\d)[A-Za-z][\w-]{0,64}?\d[\w-]{0,64}+\b")   # words with digits: user_42
_NUMBER = re.compile(r"\d++(?:\.\d++)?+")
_SPACE = re.compile(r"\s++")


def normalise_text(text: str | None) -> str:
    """Strip the volatile parts of a message or frame name."""
    s = (text or "")[:MAX_TEXT]
    s = _REDACTED.sub("<R>", s)
    s = _UUID.sub("<uuid>", s)
    s = _HEXADDR.sub("<addr>", s)
    s = _QUOTED.sub("<q>", s)
    s = _HEXRUN.sub("<hex>", s)
    s = _ID_TOKEN.sub("<id>", s)
    s = _NUMBER.sub("<n>", s)
    return _SPACE.sub(" ", s).strip()


_LONGNUM = re.compile(r"\d{4,}+")
_LAMBDA = re.compile(r"\$\$?Lambda\$?[\w/$]*+|lambda\$[\w$]*+|\$\d++")


@functools.lru_cache(maxsize=16384)
def normalise_code(name: str | None) -> str:
    """Identifiers are stable, so only generated parts go: lambdas, ``$1`` classes, build hashes, long numbers."""
    s = _LAMBDA.sub("$λ", (name or "")[:MAX_CODE])
    s = _UUID.sub("<uuid>", s)
    s = _HEXADDR.sub("<addr>", s)
    s = _HEXRUN.sub("<hex>", s)
    return _LONGNUM.sub("<n>", s).strip()


_LIBRARY_PATHS = ("site-packages/", "dist-packages/", "node_modules/", "/lib/python", "<frozen ", "node:internal",
                  "internal/", "/usr/lib/", "/jdk/", "/rubygems/", "/gems/")
_LIBRARY_MODULES = ("java.", "javax.", "jdk.", "sun.", "com.sun.", "kotlin.", "kotlinx.", "scala.", "org.springframework.",
                    "org.apache.", "org.eclipse.jetty.", "io.netty.", "org.hibernate.", "com.zaxxer.", "org.postgresql.",
                    "reactor.", "okhttp3.", "com.fasterxml.")
# Names that say nothing alone keep their directory.  Only a few: a directory that one source has and the other
# lacks (a file at the app root) would split the bug again.
_GENERIC_STEMS = ("__init__", "index", "mod")


def _clean_path(file: str) -> str:
    f = (file or "")[:MAX_CODE].replace("\\", "/").split("?")[0].split("#")[0]
    if "://" in f[:40]:
        f = f.split("://", 1)[1]
        f = f[f.find("/"):] if "/" in f else f          # webpack://app/x.js, https://cdn.host/x.js
    return f


def is_library(file: str = "", module: str = "") -> bool:
    """A frame plainly in a library or the runtime (used when the source gives no in_app flag)."""
    f = _clean_path(file)
    return any(m in f for m in _LIBRARY_PATHS) or (module or "").startswith(_LIBRARY_MODULES)


def location(file: str = "", module: str = "") -> str:
    """Where a frame's code lives, independent of where it was deployed (see the module docstring)."""
    f = _clean_path(file)
    for marker in ("site-packages/", "dist-packages/", "node_modules/"):
        if marker in f:        # a library: its path inside the package is already root-free
            return normalise_code(f.rsplit(marker, 1)[1])
    parts = [p for p in f.split("/") if p not in ("", ".", "..")]
    base = parts[-1] if parts else ""
    if base and "." in base and " " not in base:
        stem = base.rsplit(".", 1)[0]
        if stem in _GENERIC_STEMS and len(parts) > 1:
            stem = f"{parts[-2]}/{stem}"
        return normalise_code(stem)
    if module:
        last = module[:MAX_CODE].replace("/", ".").rsplit(".", 1)[-1].split("$", 1)[0]
        return normalise_code(last or module)
    return normalise_code(base)


@functools.lru_cache(maxsize=16384)
def frame_key(file: str = "", function: str = "", module: str = "") -> str:
    fn = normalise_code(function) or "?"
    return f"{location(file, module)}:{fn}"


@functools.lru_cache(maxsize=16384)
def _library(file: str, module: str) -> bool:
    return is_library(file, module)


def _in_app(frame) -> bool:
    flag = getattr(frame, "in_app", None)
    if flag is not None:
        return bool(flag)
    return not _library(getattr(frame, "file", "") or "", getattr(frame, "module", "") or "")


def signature(frames: Sequence, causes: Sequence[str] = (), message: str | None = None) -> str:
    """The normalised stack signature of an event (frames ordered outermost first)."""
    keys = [frame_key(getattr(f, "file", "") or "", getattr(f, "function", "") or "", getattr(f, "module", "") or "")
            for f in frames]
    return signature_of(keys, [_in_app(f) for f in frames], causes, message)


def signature_of(keys: Sequence[str], in_app: Sequence[bool], causes: Sequence[str] = (),
                 message: str | None = None) -> str:
    """:func:`signature` from each frame's :func:`frame_key` and whether it is in-app (intake computes those once
    per distinct frame)."""
    if keys and not causes:
        return _frames_signature(tuple(keys), tuple(in_app))
    app_keys = [k for k, a in zip(keys, in_app) if a]
    keys = app_keys or keys
    if keys:
        sig = " > ".join(keys[-MAX_FRAMES:])
    else:
        sig = "msg:" + normalise_text(message)[:200]
    if causes:
        sig += " | caused by " + ", ".join(normalise_code(c) for c in causes)
    return sig


@functools.lru_cache(maxsize=16384)
def _frames_signature(keys: tuple[str, ...], in_app: tuple[bool, ...]) -> str:
    app_keys = [k for k, a in zip(keys, in_app) if a]
    return " > ".join((app_keys or keys)[-MAX_FRAMES:])


@functools.lru_cache(maxsize=16384)
def fingerprint(service: str | None, cls: str | None, sig: str, environment: str | None) -> str:
    raw = " | ".join([(service or "").strip(), normalise_code(cls), sig, (environment or "").strip()])
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:20]
