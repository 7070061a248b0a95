"""A vendor CLI's first-start state, made once per binary and copied into each fresh private state (issue 34).

A lane never sees the user's vendor state: it gets a private copy per task holding only the login files
(``agent.lanes.files.private_state``), so every task's first lane of a vendor starts that CLI in a new state dir.
codex then creates and migrates six SQLite databases before it does anything else (~60-80 ms of every such start).
An adapter that names ``prime_argv`` and ``template_files`` gets that work done once per binary instead:

- the prime: ``prime_argv(bin)`` is a command that makes the CLI write that state and stop, with no model turn and
  nothing of any lane as input (codex: ``codex exec -C /tmp resume --last``: it opens and migrates its databases,
  then refuses to run in the sandbox's empty private ``/tmp``, which is no trusted directory; claude: ``claude
  plugin list``, which makes and migrates its ``.claude.json``, ~14 ms of a first start).  It runs in the
  sandbox a version probe gets (``sandbox.probe_argv``) with no network at all and a new private state holding the
  login files, as a lane's first start would, under a time limit;
- the template: the top-level regular files of each state dir matching ``template_files`` (codex: the databases and
  their write-ahead logs), kept under ``HOME/lanes/state-templates/<key>/<private dir's name>/`` (``<index>-<name>``),
  ``<key>`` from the binary's resolved path, size and mtime (as the version cache: a new or touched binary primes
  again).  A prime that timed out, failed to start, or left none of those files leaves a ``none`` marker: that binary
  starts fresh;
- the seed: a private state dir holding none of the template's names (not even as a link) gets a copy of each,
  written by ``write_private`` (a planted link is replaced, never followed); one a lane already used keeps its own.
  A JSON login file the template holds too (claude's ``.claude.json``) is, each run, the user's login keys laid
  over the template's document (``agent.lanes.files.private_state``): copied alone, claude redid its first-start
  work on it at every lane (a machine id, four migrations: five rewrites, ~30 ms).

Trust: what is copied is what the vendor's own binary writes on any fresh start, from the agent's fixed argv, in an
empty directory, without network, worktree, spec or production text; it lives in the agent home, which no lane
sees.  Files are copied in name order, so a database comes before its log: a copy cut short leaves a database the
CLI migrates itself, never a log without its database.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path

from agent.lanes.files import binary_key, fresh_dir, private_state, read_bytes_nofollow, write_private

PRIME_TIMEOUT = 20.0
TEMPLATE_FILE_CAP = 64 << 20          # a bigger file is not state a first start writes
NONE = "none"                         # the marker of a binary whose prime gave no template


def templates_root(home: Path) -> Path:
    return Path(home) / "lanes" / "state-templates"


def template_key(vendor, bin_path: str) -> str:
    ident = json.dumps([binary_key(vendor.name, bin_path), list(vendor.prime_argv("BIN") or [])])
    return hashlib.sha256(ident.encode()).hexdigest()[:24]


def has_template(vendor) -> bool:
    return bool(getattr(vendor, "template_files", ())) and bool(getattr(vendor, "prime_argv", lambda b: None)("BIN"))


def template_for(vendor, bin_path: str, originals: list, env: dict[str, str], home: Path, config) -> Path | None:
    """The template dir of this binary, made now when there is none yet (the prime), or None (the vendor has no
    prime, or this binary's gave nothing).  ``originals``: the vendor's state paths as the vendor names them;
    ``env``: the lane's environment."""
    if not has_template(vendor):
        return None
    try:
        root = templates_root(home) / template_key(vendor, bin_path)
    except OSError:
        return None
    if not root.is_dir() or root.is_symlink():
        try:
            root = _prime(vendor, bin_path, originals, env, home, config, root)
        except OSError:
            return None              # a read-only or full home: the lane starts in a new state, as without one
    if root is None or os.path.lexists(root / NONE):
        return None
    return root


def _prime(vendor, bin_path, originals, env, home, config, root: Path) -> Path | None:
    from agent.infra import proc
    from agent.lanes.egress import no_network
    from agent.lanes.sandbox import SandboxUnavailable, probe_argv

    parent = root.parent
    parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    scratch = fresh_dir(parent / f".prime-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        pairs = private_state(scratch / "state", list(originals), tuple(getattr(vendor, "login_files", ()) or ()))
        try:
            argv, penv = probe_argv(config, home, vendor.prime_argv(bin_path), env, scratch / "sandbox",
                                    state_paths=pairs, net=no_network(config))
        except SandboxUnavailable:
            return None
        res = proc.run(argv, cwd=scratch, env=penv, timeout=PRIME_TIMEOUT, stdout_path=scratch / "prime.stdout",
                       stderr_path=scratch / "prime.stderr", max_bytes=65536)
        out = fresh_dir(scratch / "template")
        kept = 0 if res.timed_out or res.missing else _keep(pairs, vendor.template_files, out)
        if kept == 0:
            write_private(out / NONE, "the prime gave no template: this binary starts in a new state\n")
        try:
            os.rename(out, root)
        except OSError:
            pass                     # another process made it meanwhile: theirs stands
        return root if root.is_dir() else None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _matches(name: str, patterns) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _keep(pairs: list[tuple[Path, Path]], patterns, out: Path) -> int:
    kept = 0
    for priv, _orig in pairs:
        if priv.is_symlink() or not priv.is_dir():
            continue
        for name in sorted(os.listdir(priv)):
            if not _matches(name, patterns):
                continue
            data = read_bytes_nofollow(priv / name, cap=TEMPLATE_FILE_CAP + 1)
            if data is None or len(data) > TEMPLATE_FILE_CAP:
                continue
            (out / priv.name).mkdir(exist_ok=True, mode=0o700)
            write_private(out / priv.name / name, data)
            kept += 1
    return kept


def seed(pairs: list[tuple[Path, Path]], root: Path | None) -> int:
    """Copy the template into each private state dir of ``pairs`` that has none of its names yet; the number of
    files copied."""
    if root is None:
        return 0
    copied = 0
    for priv, _orig in pairs:
        src = root / priv.name
        if priv.is_symlink() or not priv.is_dir() or not src.is_dir():
            continue
        names = sorted(os.listdir(src))
        if any(os.path.lexists(priv / name) for name in names):
            continue                 # a state a lane already used keeps its own
        for name in names:
            data = read_bytes_nofollow(src / name, cap=TEMPLATE_FILE_CAP)
            if data is None:
                continue
            try:
                write_private(priv / name, data)
            except OSError:
                return copied        # a full disk: the CLI makes what is missing itself (a database before its log)
            copied += 1
    return copied
