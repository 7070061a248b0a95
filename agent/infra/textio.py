"""Every file the agent reads (config, a repository's settings, intake files, stdin) is decoded here, one way.

- A byte-order mark chooses the encoding (UTF-8, UTF-16 LE/BE, UTF-32 LE/BE) and is dropped; without one the
  bytes are UTF-8.
- ``strict`` (config files): an invalid byte is an :class:`InputError` naming the file and the byte offset.
  Otherwise (intake: one bad byte must not cost the events around it) each invalid byte becomes U+FFFD and
  :meth:`Decoded.note` says how many there were and where the first one is.
- Lines end at ``\\n``, ``\\r\\n``, ``\\r`` or ``\\n\\r`` alike (:func:`split_lines`, :func:`one_newline`).
- YAML is parsed by :func:`load_yaml`: whatever a document holds (bad syntax, a 5,000-digit integer, lists nested
  5,000 deep), a failure is one line naming the file and what to fix.  :func:`load_yaml_cached` keeps the parsed
  document as JSON under the text's hash, so a process that reads an unchanged file skips importing YAML (~12 ms).

A leaf module: it imports nothing of agent but :class:`agent.AgentError`.
"""

from __future__ import annotations

import codecs
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent import AgentError

# longest first: the UTF-32 LE mark starts with the UTF-16 LE one
BOMS = ((codecs.BOM_UTF32_LE, "utf-32-le"), (codecs.BOM_UTF32_BE, "utf-32-be"), (codecs.BOM_UTF8, "utf-8"),
        (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))
FIX = "save it as UTF-8 (or UTF-16/UTF-32 with a byte-order mark)"
_ESCAPED = re.compile("[\udc80-\udcff]+")
_NEWLINE = re.compile(r"\r\n|\n\r|\r|\n")
_NEWLINE_BYTES = re.compile(rb"\r\n|\n\r|\r|\n")


class InputError(AgentError):
    """A file that cannot be read as text or YAML: one line naming the file, where, and the fix."""


@dataclass
class Decoded:
    text: str
    encoding: str = "utf-8"       # the codec used (a BOM's, else utf-8)
    bom: int = 0                  # bytes of byte-order mark skipped
    bad: int = 0                  # invalid bytes replaced by U+FFFD (never with strict)
    first_bad: int | None = None  # byte offset of the first one in the file

    def note(self, name: str) -> str | None:
        """One line about replaced bytes, or None when there were none."""
        if not self.bad:
            return None
        return (f"{name}: {self.bad} invalid {self.encoding.upper()} byte{'s' if self.bad > 1 else ''} replaced by "
                f"U+FFFD, the first at byte {self.first_bad}; {FIX} to keep them")


def sniff_bom(head: bytes) -> tuple[str, int]:
    """(codec, length of the mark) for the first bytes of a file; ("utf-8", 0) without a mark."""
    for mark, codec in BOMS:
        if head.startswith(mark):
            return codec, len(mark)
    return "utf-8", 0


def _describe(data: bytes, offset: int) -> str:
    return data[offset:offset + 4].hex(" ")


def decode(data: bytes, name: str, strict: bool = True, error: type[AgentError] = InputError) -> Decoded:
    """Decode the bytes of a whole file. ``strict`` raises ``error`` at the first invalid byte, naming its
    offset; otherwise invalid bytes become U+FFFD (counted, the first one's offset kept)."""
    codec, bom = sniff_bom(data)
    body = memoryview(data)[bom:] if bom else data
    try:
        return Decoded(str(body, codec), codec, bom)
    except UnicodeDecodeError as exc:
        at = bom + exc.start
        if strict:
            raise error(f"{name}: not valid {codec.upper()} at byte {at} ({_describe(data, bom + exc.start)}); "
                        f"{FIX}") from None
    if codec == "utf-8":   # one U+FFFD per invalid byte; the offset of the first is exact
        text = str(body, codec, "surrogateescape")
        bad = sum(m.end() - m.start() for m in _ESCAPED.finditer(text))
        return Decoded(without_escapes(text), codec, bom, bad, at)
    text = str(body, codec, "replace")
    return Decoded(text, codec, bom, max(1, text.count("\ufffd")), at)


def without_escapes(text: str) -> str:
    """Text decoded with ``surrogateescape`` (a tailed file, whose byte offsets must stay exact) as it is shown
    and stored: each invalid byte a U+FFFD."""
    return _ESCAPED.sub(lambda m: "\ufffd" * (m.end() - m.start()), text)


def read_text(path: Path | str, name: str | None = None, strict: bool = True,
              error: type[AgentError] = InputError) -> Decoded:
    """A whole file decoded; a file that cannot be read is ``error`` too (``NAME: cannot read: why``)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise error(f"{name or path}: cannot read: {exc.strerror or exc}") from None
    return decode(data, name or str(path), strict, error=error)


def split_lines(text: str) -> list[str]:
    """Lines of ``text``, each ending at ``\\n``, ``\\r\\n``, ``\\r`` or ``\\n\\r`` (a final empty piece kept, as
    ``str.split`` keeps it)."""
    if "\r" not in text:
        return text.split("\n")
    return _NEWLINE.split(text)


def one_newline(text: str) -> str:
    """``text`` with every line ending made ``\\n``."""
    return _NEWLINE.sub("\n", text) if "\r" in text else text


def line_ends(data: bytes) -> list[int]:
    """The byte offset just past each line ending in ``data`` (the same endings as :func:`split_lines`)."""
    return [m.end() for m in _NEWLINE_BYTES.finditer(data)]


YAML_CACHE_FORMAT = 1


def load_yaml_cached(text: str, name: str, cache: Path | None, error: type[AgentError] = InputError) -> Any:
    """:func:`load_yaml`, with the document kept in ``cache`` (a JSON file the caller owns, e.g. in the agent
    home) under the SHA-256 of ``text``: the same text is the same document, so an edit (whatever its mtime) is
    a miss.  Only a document JSON carries unchanged is kept (no dates, no non-string keys); a cache that is
    missing, a link, unreadable or another text's is a miss; one that cannot be written only costs the parse."""
    if cache is None:
        return load_yaml(text, name, error)
    import hashlib   # here: a tick that reads no config does not load OpenSSL for it

    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    try:
        fd = os.open(cache, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as fh:
            kept = json.loads(fh.read(1 << 22))
        if kept.get("format") == YAML_CACHE_FORMAT and kept.get("sha256") == digest and "doc" in kept:
            return kept["doc"]
    except (OSError, ValueError, AttributeError, RecursionError):
        pass
    doc = load_yaml(text, name, error)
    try:
        same = json.loads(json.dumps(doc, allow_nan=False)) == doc
    except (TypeError, ValueError, RecursionError):
        same = False
    if same:
        tmp = Path(cache).with_name(f".{Path(cache).name}.{os.getpid()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump({"format": YAML_CACHE_FORMAT, "sha256": digest, "doc": doc}, fh)
            os.replace(tmp, cache)
        except OSError:
            try:
                tmp.unlink()
            except OSError:
                pass
    return doc


def load_yaml(text: str, name: str, error: type[AgentError] = InputError) -> Any:
    """``yaml.safe_load`` whose every failure is one ``error`` line naming the file, where, and what to fix."""
    import yaml  # imported here: a cron tick without config should not pay for it

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)   # libyaml: fast, and it caps nesting itself
    try:
        return yaml.load(text, Loader=loader)  # noqa: S506 - a safe loader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        if "nesting depth" in str(what):
            raise error(f"{name}:{where}: not valid YAML: nested too deep; flatten the nesting") from None
        raise error(f"{name}:{where}: not valid YAML: {' '.join(str(what).split())[:200]}; fix the file there")\
            from None
    except RecursionError:
        raise error(f"{name}: not valid YAML: nested too deep; flatten the nesting") from None
    except ValueError as exc:   # an integer of more than 4,300 digits, a date out of range
        raise error(f"{name}: not valid YAML: a value cannot be read ({' '.join(str(exc).split(';')[0].split())[:160]}); "
                    "shorten or quote it") from None
    except Exception as exc:  # noqa: BLE001 - whatever else a document provokes, still one line
        raise error(f"{name}: not valid YAML: {type(exc).__name__}; fix the file") from None
