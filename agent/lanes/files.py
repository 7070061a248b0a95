"""Files that cross the sandbox boundary (DESIGN.md "Trust boundaries").

A lane writes only to its worktree and its lane dir (``lanes/N/lane``, bound read-write, ``{run_dir}`` of a
command vendor); the runner writes only to its run dir (``lanes/N``: logs, notes, results, the git config copy),
which the lane never sees.  Every read of a file the lane wrote goes through ``read_lane_file``: no symlink
(``O_NOFOLLOW``), a regular file, a size cap, then redaction and escape stripping.  The lane dir is fresh for each
turn: after a turn it is kept only as redacted copies in the run dir (``lane-files/<turn>/``) and removed, so nothing
a lane wrote there is bound into a later turn or run (what a repair turn needs, aider's chat, the runner carries
over as text it read).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import uuid
from pathlib import Path

LANE_FILE_CAP = 4 << 20          # bytes read of one lane-written file: its END when it is longer (the report)
KEPT_FILES = 64                  # lane files kept (redacted) after a run, each its last KEPT_BYTES
KEPT_BYTES = 1 << 20

_SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|_KEY$|CREDENTIAL|AUTH)", re.IGNORECASE)


def redact(text: str, extra_env: dict[str, str] | None = None) -> str:
    """Mask the values of secret-looking environment variables, then every token shape intake's redactor knows."""
    from agent.infra.redact import redact as redact_shapes

    if not text:
        return text
    values = set()
    for env in (os.environ, extra_env or {}):
        for name, value in env.items():
            if _SECRET_NAME.search(name) and value and len(value) >= 6:
                values.add(value)
    for value in sorted(values, key=len, reverse=True):
        text = text.replace(value, "[REDACTED]")
    return redact_shapes(text)


def lane_text(text: str | None, extra_env: dict[str, str] | None = None) -> str | None:
    """Lane-derived text as it may be stored or shown: redacted, then escape sequences and controls removed."""
    from agent.infra.text import strip_controls

    return strip_controls(redact(text, extra_env)) if text else text


def read_bytes_nofollow(path: Path | str, cap: int = LANE_FILE_CAP) -> bytes | None:
    """The bytes of a lane-written file, or None when it is missing, a symlink (any kind: refused, not followed)
    or not a regular file (a FIFO would block, a device would read forever).  Longer than ``cap``: its last
    ``cap`` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        if st.st_size > cap:
            os.lseek(fd, st.st_size - cap, os.SEEK_SET)
        chunks, left = [], cap
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_lane_file(path: Path | str, extra_env: dict[str, str] | None = None, cap: int = LANE_FILE_CAP,
                   parse: bool = False) -> str | None:
    """THE read of a file a lane wrote: ``read_bytes_nofollow``, decoded, redacted and escape-stripped.  ``parse``:
    for an adapter that parses it (JSON events, a log's structure), the decoded text as it is; what the adapter takes
    from it is redacted and stripped where it is kept (``lane_text`` in run_lane)."""
    raw = read_bytes_nofollow(path, cap)
    if raw is None:
        return None
    text = raw.decode("utf-8", errors="replace")
    return text if parse else lane_text(text, extra_env) or ""


def write_private(path: Path | str, data: str | bytes, mode: int = 0o600) -> Path:
    """Write a runner file: a new file (``O_EXCL | O_NOFOLLOW``, a unique temporary name beside it) renamed over
    ``path``, so a symlink planted at that name is replaced, never followed, and two writers never see half a file."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
        try:
            os.replace(tmp, p)
        except IsADirectoryError:
            shutil.rmtree(p, ignore_errors=True)
            os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return p


def fresh_dir(path: Path | str) -> Path:
    """An empty directory at ``path``, whatever was there (a tree is removed without following its links)."""
    p = Path(path)
    _remove(p)
    p.mkdir(parents=True, mode=0o700)
    return p


def _remove(path: Path) -> None:
    """Remove what is at ``path``, if anything (a tree without following its links)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def keep_lane_files(lane_dir: Path, dest: Path, extra_env: dict[str, str] | None = None) -> list[str]:
    """Keep what a lane left in its lane dir as redacted, escape-stripped copies under ``dest`` (a runner dir),
    then remove the lane dir.  Links and special files are not followed, only named in ``dest/LINKS``."""
    lane_dir, dest = Path(lane_dir), Path(dest)
    kept: list[str] = []
    refused: list[str] = []
    if lane_dir.is_dir() and not lane_dir.is_symlink():
        for root, dirs, files in os.walk(lane_dir, followlinks=False):
            if len(kept) + len(refused) >= KEPT_FILES:
                break
            for name in sorted(files) + sorted(d for d in dirs if os.path.islink(os.path.join(root, d))):
                rel = os.path.relpath(os.path.join(root, name), lane_dir)
                if len(kept) + len(refused) >= KEPT_FILES:
                    break
                text = read_lane_file(os.path.join(root, name), extra_env, cap=KEPT_BYTES)
                if text is None:
                    refused.append(rel)
                    continue
                dest.mkdir(parents=True, exist_ok=True, mode=0o700)
                write_private(dest / rel.replace(os.sep, "__"), text)
                kept.append(rel)
    if refused:
        dest.mkdir(parents=True, exist_ok=True, mode=0o700)
        from agent.infra.text import strip_controls

        write_private(dest / "LINKS", "not kept (a link or not a regular file):\n"
                      + "\n".join(strip_controls(r) for r in refused[:200]) + "\n")
    if lane_dir.is_symlink() or lane_dir.is_file():
        lane_dir.unlink()
    elif lane_dir.exists():
        shutil.rmtree(lane_dir, ignore_errors=True)
    return kept


LOGIN_FILE_CAP = 1 << 20
# keys of claude's ~/.claude.json that carry its login (the rest is per-project history of the user's sessions)
_CLAUDE_JSON_KEYS = ("oauthAccount", "primaryApiKey", "userID", "hasCompletedOnboarding", "customApiKeyResponses",
                     "installMethod", "firstStartTime")


def _login_bytes(src: Path) -> bytes | None:
    """A login file of the user's (trusted: it may be a link into their dotfiles), a regular file under the cap."""
    try:
        if not src.is_file() or src.stat().st_size > LOGIN_FILE_CAP:
            return None
        data = src.read_bytes()
    except OSError:
        return None
    if src.name == ".claude.json":
        import json

        try:
            doc = json.loads(data)
        except ValueError:
            return None
        data = json.dumps({k: doc[k] for k in _CLAUDE_JSON_KEYS if isinstance(doc, dict) and k in doc}).encode()
    return data


def binary_key(vendor_name: str, bin_path: str) -> str:
    """A vendor binary's identity: vendor, resolved path, size and mtime (a replaced or touched binary is a new key):
    what the version cache and the state templates (agent.lanes.vendorstate) are keyed by."""
    import json

    real = os.path.realpath(bin_path)
    st = os.stat(real)
    return json.dumps([vendor_name, real, st.st_size, st.st_mtime_ns])


def _over_template(data: bytes, template_file: Path) -> bytes:
    """A JSON login document's keys laid over the same file of the binary's state template (its first start,
    migrated: agent.lanes.vendorstate), so the CLI finds its first-start work done and rewrites nothing; the login
    bytes as they are where either is no JSON object."""
    import json

    base = read_bytes_nofollow(template_file, cap=LOGIN_FILE_CAP)
    try:
        doc, login = json.loads(base) if base is not None else None, json.loads(data)
    except ValueError:
        return data
    if not isinstance(doc, dict) or not isinstance(login, dict):
        return data
    return json.dumps({**doc, **login}).encode()


def state_origin(item: Path | str) -> Path:
    """A vendor state path as ``private_state`` pairs it (absolute, ``~`` expanded, links left as named)."""
    return Path(os.path.abspath(os.path.expanduser(str(item))))


def private_state(root: Path, state_paths: list, login: tuple[str, ...],
                  template: Path | None = None, fixed: dict | None = None,
                  obeyed: tuple[str, ...] = ()) -> list[tuple[Path, Path]]:
    """A private copy of each of a vendor's state paths under ``root`` (one per task: its sessions stay for the
    task's later runs), holding only the login files named in ``login`` copied from the user's (refreshed each
    run), as ``(private, original)`` pairs the sandbox binds read-write in place of the user's live dir.  Nothing a
    lane writes there reaches the user or another task.  A state path that is a file (``~/.claude.json``) is
    copied alone (and, for that one, only its login keys).  ``template``: the binary's state template
    (agent.lanes.vendorstate); a JSON login file it holds too is the template's document with the login keys laid
    over it (claude's ``.claude.json``: its migrations done, ~30 ms of five rewrites at every start otherwise).
    ``fixed``: ``{original dir: {name: bytes}}`` for the dirs the sandbox binds read-only (the adapter's
    ``read_only_state``): those files are written too, and nothing else stays in that private copy.  In every
    private copy a login file the user does not have (any more) is removed, and so is each of ``obeyed`` (the
    adapter's ``obeyed_files``: instructions, hooks, plugins): what the CLI obeys comes from the user or from no
    one, never from an earlier lane of the task."""
    out: list[tuple[Path, Path]] = []
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    for i, item in enumerate(state_paths):
        orig = state_origin(item)
        priv = root / f"{i}-{orig.name or 'state'}"
        if orig.is_file() or (not orig.exists() and orig.suffix == ".json"):
            data = _login_bytes(orig)
            if data is None:
                continue
            write_private(priv, data)
            out.append((priv, orig))
            continue
        if priv.is_symlink() or priv.is_file():
            priv.unlink(missing_ok=True)
        priv.mkdir(parents=True, exist_ok=True, mode=0o700)
        wrote = set()
        for name in login:
            data = _login_bytes(orig / name)
            if data is not None and template is not None and name.endswith(".json"):
                data = _over_template(data, template / priv.name / name)
            if data is not None:
                write_private(priv / name, data)
                wrote.add(name)
        own = (fixed or {}).get(orig)
        if own is not None:
            _only(priv, own, wrote)
        else:
            for name in sorted({*login, *obeyed} - wrote):
                # a login file the template holds is put back in one rename, never missing for a moment: a lane of
                # the task may be running on this state (a task's PR reviewers run side by side)
                base = None if template is None or name not in login else read_bytes_nofollow(
                    template / priv.name / name, cap=LOGIN_FILE_CAP)
                if base is not None:
                    write_private(priv / name, base)
                else:
                    _remove(priv / name)
        out.append((priv, orig))
    return out


def _only(priv: Path, files: dict[str, bytes], login: set[str]) -> None:
    """A read-only state dir's private copy: ``files`` written (unless already so), the login files written this
    run (``login``) kept, anything else removed (what a lane wrote there before the dir was read-only, a login file
    the user no longer has; links unfollowed)."""
    for name, data in files.items():
        if read_bytes_nofollow(priv / name, cap=len(data) + 1) != data:
            write_private(priv / name, data)
    for entry in os.scandir(priv):
        if entry.name not in files and entry.name not in login:
            _remove(Path(entry.path))

