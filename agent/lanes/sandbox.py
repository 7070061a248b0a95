"""The lane sandbox: every lane (built-in vendor or plain command) runs inside bubblewrap (``bwrap``).

What a sandboxed lane sees (DESIGN.md "Trust boundaries"):
- its own PID namespace; ``--die-with-parent``, so when the lane's main process ends (or the agent dies) every
  process it started dies too, a ``setsid`` grandchild included; no capabilities (``--cap-drop ALL``: as root
  a lane could otherwise remount its read-only view);
- the whole filesystem read-only, a private ``/tmp`` and ``/dev``, its own ``/proc`` (so no other process's
  environment is readable); every writable tmpfs size-capped (``Plan.tmpfs_mb``), every mount ``nosuid``;
- the agent home (ledger, config, other tasks' specs, worktrees and lane logs) replaced by an empty tmpfs, with only
  this lane's worktree (read-write for the implementer, read-only for every other role), its spec (read-only) and
  its lane dir (read-write: vendors write their last message and chat files there) bound back in; the runner's run
  dir (logs, notes, the git config copy) is never shown (agent.lanes.files);
- the users' homes (``/root``, ``/home``, the agent's ``$HOME`` and its user's home in passwd) replaced by empty
  tmpfs mounts: ``~/.ssh``, ``~/.aws``, ``~/.config/gh``, ``~/.netrc``, shell history and other users' homes are not
  there; when the agent is root, the system's root-only secrets are blanked too (``system_secrets``: ``/etc/shadow``,
  SSH host keys, ``/etc/ssl/private``).  ``$HOME`` is the lane's private, writable, throwaway home; bound back into
  it: the vendor's session dirs (``state_paths``: a private copy per task, read-write), and read-only what the lane
  must run (``toolchain_paths``: the agent's interpreter and package tree, the PATH entries' tool directories, the
  vendor binary's package) and the files a command vendor's argv or a ``vendors.X.env`` variable names;
- the git dir read-only: the worktree's ``.git`` file (so a lane cannot point it elsewhere), the mirror's objects
  and refs, and in place of the mirror's ``config`` a sanitised copy (format version and extensions only: no remote
  URL, nothing git would execute);
- read-write: what the vendor must write to keep and resume its session (``state_paths`` of its adapter, e.g.
  ``$CODEX_HOME``, ``$CLAUDE_CONFIG_DIR``: the task's private copy shown at that path) and the paths listed in
  ``vendors.X.writable``; read-only, those state dirs the CLI loads code from (``read_only_state``: opencode's config
  dir and its plugins), so no lane leaves code there for the task's next lane;
- its own network namespace: only its vendor's model hosts, through the agent's egress proxy, and no host
  socket dir (``/run``, ``/var/run``, the ledger's and ssh-agent's); see ``agent.lanes.egress``;
- no unix socket of its own: ``socket(AF_UNIX)`` fails with EPERM (``sandbox.unix_sockets: deny``, the default;
  ``agent.lanes.seccomp``), so no host socket a mount left in view is connectable; ``socketpair()`` works.

``sandbox: none`` in config.yaml runs lanes without it (explicitly only; doctor warns).  With ``sandbox: bwrap``
(the default) and no bwrap on PATH, lanes refuse to start with a one-line fix.
"""

from __future__ import annotations

import os
import re
import sys
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from agent import AgentError
from agent.infra.proc import go_arg
from agent.lanes.seccomp import sandbox_filter

INSTALL_FIX = ("install bubblewrap (`apt-get install bubblewrap`, or scripts/ci-bwrap), or set `sandbox: none` in "
               "config.yaml to run lanes unsandboxed")


class SandboxUnavailable(AgentError):
    pass


def bwrap_path() -> str | None:
    from agent.infra.proc import system_binary

    return system_binary("bwrap")


def mode(config) -> str:
    return getattr(config, "sandbox", "bwrap") or "bwrap"


def require(config) -> str | None:
    """The bwrap binary to use, None for ``sandbox: none``; raises SandboxUnavailable (one line with the fix)."""
    if mode(config) == "none":
        return None
    found = bwrap_path()
    if found is None:
        raise SandboxUnavailable(f"sandbox: bwrap is configured but bwrap is not installed; {INSTALL_FIX}")
    return found


@dataclass
class Plan:
    """What one sandboxed run may see and touch.  Paths are host paths (the sandbox shows them at the same place)."""
    cwd: Path
    writable_cwd: bool
    hide: list[Path] = field(default_factory=list)          # replaced by an empty tmpfs (the agent home: only
                                                            # the lane's own paths are bound back into it)
    homes: list[Path] = field(default_factory=list)         # users' homes: an empty writable tmpfs each
    rw: list[Path] = field(default_factory=list)            # bound read-write
    ro: list[Path] = field(default_factory=list)            # bound read-only (inside hidden or writable areas)
    over: list[tuple[Path, Path]] = field(default_factory=list)   # (source, dest): dest shows source, read-only
    over_rw: list[tuple[Path, Path]] = field(default_factory=list)   # (source, dest): dest shows source, writable
    empty: list[Path] = field(default_factory=list)         # an empty read-only dir in place of these
    tmpfs_mb: int = 1024                                    # size cap of each writable tmpfs (/tmp, homes)
    unix_sockets: str = "deny"                              # deny: socket(AF_UNIX) fails (agent.lanes.seccomp)

    def worktree_read_only(self) -> bool:
        """Whether no write of the lane's can reach its worktree: bound read-only, with nothing writable bound at
        or inside it (a tmpfs there is the lane's own memory, never the worktree's files)."""
        if self.writable_cwd:
            return False
        cwd = Path(self.cwd).resolve()
        for p in [*self.rw, *(dest for _, dest in self.over_rw)]:
            p = Path(p).resolve()
            if p == cwd or cwd in p.parents:
                return False
        return True


# compiled at import (the daemon's fork server has them ready for every lane it starts)
_GIT_VERSION = re.compile(r"^\s*repositoryformatversion\s*=\s*(\d+)", re.M | re.I)
_GIT_BARE = re.compile(r"^\s*bare\s*=\s*(\w+)", re.M | re.I)
_GIT_NAME = re.compile(r"^\s*name\s*=\s*(.+)$", re.M | re.I)
_GIT_EMAIL = re.compile(r"^\s*email\s*=\s*(.+)$", re.M | re.I)
_GIT_EXTENSION = re.compile(r"^\s*(objectformat|refstorage|worktreeconfig|partialclone|preciousobjects)\s*=", re.I)
_GIT_SECTIONS = {name: re.compile(r"^\s*\[" + name + r"\]\s*$(.*?)(?=^\s*\[|\Z)", re.M | re.S | re.I)
                 for name in ("user", "extensions")}
_NOT_PLAIN = re.compile(r"[^\w .@+-]")


def sanitized_git_config(common: Path, out: Path) -> Path:
    """A copy of the repository's config with only what git needs to read the repository (format version and
    extensions): no remote URL (it may carry credentials), no alias, filter, hook or command."""
    try:
        text = (Path(common) / "config").read_text(errors="replace")
    except OSError:
        text = ""
    version = _GIT_VERSION.search(text)
    bare = _GIT_BARE.search(text)
    lines = ["[core]", f"\trepositoryformatversion = {version.group(1) if version else 0}"]
    if bare:
        lines.append(f"\tbare = {'true' if bare.group(1).lower() in ('true', 'yes', 'on', '1') else 'false'}")
    # an identity, so a CLI that checks for one (aider writes it into the config when missing) finds one
    name = _GIT_NAME.search(_section(text, "user"))
    email = _GIT_EMAIL.search(_section(text, "user"))
    lines += ["[user]", f"\tname = {_plain(name.group(1)) if name else 'agent'}",
              f"\temail = {_plain(email.group(1)) if email else 'agent@localhost'}"]
    keep = [ln.strip() for ln in _section(text, "extensions").splitlines() if _GIT_EXTENSION.match(ln)]
    if keep:
        lines += ["[extensions]"] + [f"\t{k}" for k in keep]
    from agent.lanes.files import write_private

    return write_private(out, "\n".join(lines) + "\n")


def _section(text: str, name: str) -> str:
    m = _GIT_SECTIONS[name].search(text)
    return m.group(1) if m else ""


def _plain(value: str) -> str:
    """A config value reduced to characters that cannot start another key or section."""
    return _NOT_PLAIN.sub("", value.strip().strip('"'))[:100] or "agent"


def git_paths(cwd: Path) -> tuple[Path | None, Path | None]:
    """(the worktree's git dir, the common dir) as the worktree says before the lane runs, or (None, None)."""
    from agent.git.workspace import WorkspaceError, find_common_dir

    dot = Path(cwd) / ".git"
    if not dot.exists():
        return None, None
    try:
        common = find_common_dir(Path(cwd))
    except WorkspaceError:
        return None, None
    if dot.is_dir():
        return dot.resolve(), common
    text = dot.read_text(errors="replace").strip()
    gd = Path(text[len("gitdir:"):].strip()) if text.startswith("gitdir:") else None
    if gd is not None and not gd.is_absolute():
        gd = Path(cwd) / gd
    return (gd.resolve() if gd else None), common


# Top-level directories that are never hidden as a "home" (a service account's HOME may be one of them).
_SYSTEM_DIRS = frozenset({"/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/media",
                          "/mnt", "/nonexistent", "/opt", "/proc", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr",
                          "/var"})


def user_homes(environ=None) -> list[Path]:
    """The home directories a lane never sees: ``/root``, ``/home`` (every user's home), the agent's ``$HOME``
    and its user's home in passwd (as given and resolved).  A home that is ``/`` or a system directory (a service
    account's) is left alone; one that does not exist cannot be mounted over and needs no hiding."""
    import pwd

    env = os.environ if environ is None else environ
    cands = ["/root", "/home", env.get("HOME") or ""]
    try:
        cands.append(pwd.getpwuid(os.getuid()).pw_dir)
    except (KeyError, OSError):
        pass
    out: list[Path] = []
    for c in cands:
        if not c.startswith("/"):
            continue
        for p in (Path(os.path.abspath(c)), Path(c).resolve()):
            if str(p) not in _SYSTEM_DIRS and p.is_dir() and p not in out:
                out.append(p)
    return out


def _inside(p: Path, roots) -> Path | None:
    """The root of ``roots`` that is ``p`` or one of its parents, or None.  (On the strings: ``r in p.parents``
    made a Path of every parent, ~2 ms of each lane's start.)"""
    s = str(p)
    plain = s[:1] == "/" and s[1:2] != "/"
    for r in roots:
        t = str(r)
        if plain and t[:1] == "/" and t[1:2] != "/":           # both absolute with the root "/": as strings
            if s == t or s.startswith(t + "/" if t != "/" else "/"):
                return r
        elif Path(p) == Path(r) or Path(r) in Path(p).parents:  # relative, or pathlib's "//" root
            return r
    return None


def runtime_paths(homes: list[Path] | None = None) -> list[Path]:
    """Where the agent itself runs from, when the private /tmp or a hidden home would hide it: its interpreter's
    prefix (a venv), the base interpreter that venv was made from (pyenv and uv keep theirs under ``~``) and the
    tree its package was imported from (an editable install, which may hold the vendor CLIs too).  Demo lanes and
    ``python -m`` command vendors run the agent's own interpreter; a CI clone under /tmp and a checkout under ``~``
    are the usual cases.  Read-only, like the rest of the filesystem outside /tmp."""
    import agent

    hidden = [Path("/tmp"), *(homes or [])]
    roots = {Path(sys.prefix).absolute(), Path(sys.base_prefix).absolute(),
             Path(agent.__file__).resolve().parent.parent}
    return sorted(p for p in roots if _inside(p, hidden) is not None and p not in hidden)


# What stays hidden inside a tool directory bound back from a home: credentials some tools keep next to their
# binaries (cargo's registry token, rubygems' API key, an npm prefix's global npmrc).
_TOOL_SECRETS = ("credentials", "credentials.toml", "etc/npmrc")
# Directories of a home that hold configuration and data of many programs: a PATH entry under one of them is bound
# back alone, never the whole directory; and never one of the usual secret stores.
_SHARED_DIRS = frozenset({".local", ".config", ".cache", ".var"})
_SECRET_DIRS = frozenset({".ssh", ".aws", ".gnupg", ".netrc", ".docker", ".kube", ".azure", ".password-store",
                          ".git-credentials", ".pgpass", ".npmrc", ".pypirc"})


def toolchain_paths(path_var: str, homes: list[Path]) -> tuple[list[Path], list[Path]]:
    """(directories to bind back read-only, credential files to blank) for the lane's PATH entries that live in a
    hidden home.  An entry's tool directory is the home's top-level directory holding it (``~/.pyenv`` for
    ``~/.pyenv/shims``, whose shims need the versions next to them; ``~/.nvm``, ``~/.cargo``) or, under a shared
    directory (``~/.local/bin``), the entry alone.  Secret stores are never bound back."""
    binds: list[Path] = []
    blanks: list[Path] = []
    for entry in (path_var or "").split(":"):
        if not entry.startswith("/"):
            continue
        e = Path(os.path.abspath(entry))
        home = _inside(e, homes)
        if home is None or e == home or not e.is_dir():
            continue
        rel = e.relative_to(home).parts
        if rel[0] in _SECRET_DIRS:
            continue
        root = e if rel[0] in _SHARED_DIRS else home / rel[0]
        if root not in binds:
            binds.append(root)
        # the tool's own root and, for a .../bin entry, its prefix (an nvm node keeps its global npmrc there)
        prefix = [e.parent] if e.name == "bin" and root in e.parent.parents else []
        for base in [root, *prefix]:
            blanks += [base / s for s in _TOOL_SECRETS if (base / s).is_file() and base / s not in blanks]
    return binds, blanks


def package_root(binary: Path) -> list[Path]:
    """What a binary needs besides itself, when it lives in a hidden home: the ``node_modules`` tree it belongs to
    (an npm package's dependencies sit beside it), its Python venv and the interpreter that venv was made from
    (``pyvenv.cfg`` ``home``), an interpreter's own prefix (``~/.pyenv/versions/X/bin/python`` needs ``lib/``
    next to ``bin/``), or else its resolved file."""
    named = Path(os.path.abspath(binary))
    real = named.resolve()
    for cand in (named, real):
        if "node_modules" in cand.parts:
            return [Path(*cand.parts[:cand.parts.index("node_modules") + 1])]
        for parent in cand.parents:
            cfg = parent / "pyvenv.cfg"
            if cfg.is_file():
                m = re.search(r"^\s*home\s*=\s*(\S.*?)\s*$", cfg.read_text(errors="replace"), re.M)
                base = Path(m.group(1)).resolve() if m and m.group(1).startswith("/") else None
                return [parent] + (package_root(base / "python") if base is not None else [])
    if real.parent.name == "bin" and (real.parent.parent / "lib").is_dir():
        return [real.parent.parent]
    return [real]


_SYSTEM_SECRETS = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/ssh/ssh_host_*_key",
                   "/etc/ssl/private")


def system_secrets() -> list[Path]:
    """Root-only secrets of the system (password hashes, SSH host keys, TLS private keys) a lane must not read when
    the agent runs as root: inside its user namespace the lane's uid maps to root outside, so a file only root may
    read is readable through the read-only root.  Only those that exist and are not world-readable."""
    import glob

    if os.getuid() != 0:
        return []
    out = []
    for pattern in _SYSTEM_SECRETS:
        for name in sorted(glob.glob(pattern)):
            try:
                if not os.stat(name).st_mode & 0o004:
                    out.append(Path(name))
            except OSError:
                continue
    return out


def lane_plan(*, cwd: Path, writable: bool, agent_home: Path, run_dir: Path, spec_paths: list[Path],
              state_paths: list, extra_writable: list[Path], homes: list[Path] | None = None,
              lane_dir: Path | None = None, read_only_state: list = ()) -> Plan:
    """The plan for a lane in ``cwd`` (see the module doc).  ``run_dir``: the runner's own dir (the git config
    copy goes there; never shown to the lane); ``lane_dir``: the lane's output dir, bound read-write.
    ``state_paths``: the vendor's state, each a ``(private copy, path the vendor expects)`` pair bound read-write
    (``private_state``), or a path bound as it is; ``read_only_state``: such pairs bound read-only (the adapter's
    ``read_only_state``).  ``homes``: the users' homes to hide (default ``user_homes()``)."""
    cwd = Path(cwd).resolve()
    plan = Plan(cwd=cwd, writable_cwd=writable)
    plan.hide.append(Path(agent_home).resolve())
    plan.homes = list(user_homes() if homes is None else homes)
    for item, binds in [*((i, plan.over_rw) for i in state_paths), *((i, plan.over) for i in read_only_state)]:
        if isinstance(item, tuple):
            src, dest = Path(item[0]), Path(item[1])
            if _inside(dest, [Path("/tmp"), *plan.homes]) is None and not dest.exists():
                try:    # a mount point on the read-only root must exist; in a hidden home bwrap makes it
                    dest.mkdir(parents=True, exist_ok=True) if src.is_dir() else None
                except OSError:
                    continue
            binds.append((src, Path(os.path.abspath(dest))))
            continue
        extra_writable = [item, *extra_writable]
    for p in extra_writable:
        p = Path(os.path.expanduser(str(p)))
        try:
            p.mkdir(parents=True, exist_ok=True) if not p.exists() else None
        except OSError:
            continue
        plan.rw.append(p.resolve())
    if lane_dir is not None:
        plan.rw.append(Path(lane_dir).resolve())
    (plan.rw if writable else plan.ro).append(cwd)
    plan.ro.extend(runtime_paths(plan.homes))
    for p in system_secrets():                      # blanked: an empty file or an empty read-only dir in its place
        (plan.empty.append(p) if p.is_dir() else plan.over.append((Path("/dev/null"), p)))
    for s in spec_paths:
        if s is not None and Path(s).exists():
            plan.ro.append(Path(s).resolve())
    git_dir, common = git_paths(cwd)
    dot = cwd / ".git"
    if dot.exists():
        plan.ro.append(dot)
    if common is not None:
        plan.ro.append(common)
        if git_dir is not None and git_dir != common:
            plan.ro.append(git_dir)
        if (common / "hooks").is_dir() and not (common / "hooks").is_symlink():
            plan.empty.append(common / "hooks")     # out of reach: an empty read-only dir in its place
        if (common / "config").exists():
            plan.over.append((sanitized_git_config(common, Path(run_dir) / "sandbox-git-config"),
                              common / "config"))
    return plan


_ENV_NOT_PATHS = ("HOME", "PATH", "TMPDIR", "PWD", "OLDPWD", "SHELL")


def with_argv_files(plan: Plan, argv: list[str], env: dict[str, str] | None = None, *,
                    untrusted: list[str] = (), untrusted_at: tuple[int, ...] | None = None,
                    files: list[Path] = ()) -> Plan:
    """The plan plus, read-only, what this turn must run and read: every existing file an absolute argv element
    names (a command vendor's script and its arguments, from the trusted config), every existing path a variable
    of the lane's environment names (``vendors.X.env``, e.g. ``OPENCODE_CONFIG``; in a hidden home only a file,
    never a directory such as ``~/.config``), and, when they live in a hidden home, the PATH entries' tool
    directories and the vendor binary's package or interpreter (``toolchain_paths``, ``package_root``).  Nothing
    in the agent home is ever bound back this way, nor an argv element holding text that came from a lane
    (``untrusted``: its session id, which a resume argv carries): a lane that names ``~/.netrc`` as its session
    must not get it bound into its next turn; ``untrusted_at``, when known, names exactly the argv positions that
    text went into (then the others are judged as config, whatever they contain).  ``files``: the runner's own
    files this turn reads (its note, a retry spec: in the run dir, which is otherwise hidden), bound read-only as
    they are."""
    env = env or {}
    extra: list[Path] = [Path(f) for f in files if Path(f).is_file() and not Path(f).is_symlink()]
    blanks: list[tuple[Path, Path]] = []
    bad = [u for u in untrusted if u]
    lanes = set(untrusted_at) if untrusted_at is not None else {i for i, a in enumerate(argv)
                                                                if any(u in a for u in bad)}
    candidates = [a for i, a in enumerate(argv) if a.startswith("/") and i not in lanes and os.path.isfile(a)]
    candidates += [v for k, v in env.items()
                   if k not in _ENV_NOT_PATHS and v.startswith("/") and ":" not in v
                   and os.path.exists(v) and len(Path(v).parts) >= 3]

    def add(p: Path) -> None:
        inside_rw = _inside(p, plan.rw) is not None
        hidden = _inside(p, plan.hide) is not None             # never the ledger, even if named
        if not inside_rw and not hidden and p not in plan.ro and p not in extra and p not in plan.homes:
            extra.append(p)

    for a in candidates:
        p = Path(a).resolve()
        if _inside(p, plan.homes) is not None and not p.is_file():
            continue                                            # a file in a home, never a whole directory
        add(p)
    if plan.homes:
        tools, secrets = toolchain_paths(env.get("PATH", ""), plan.homes)
        for t in tools:
            add(t)
        blanks += [(Path("/dev/null"), s) for s in secrets]
    hidden_roots = [Path("/tmp"), *plan.homes]                  # what the private /tmp and the homes hide
    if argv and argv[0].startswith("/") and os.path.exists(argv[0]):
        b = Path(os.path.abspath(argv[0]))
        roots = package_root(b)                                 # e.g. a venv outside made from ~/.pyenv's python
        if _inside(b, plan.homes) is not None and b.parent not in plan.homes:
            add(b.parent)                                       # the binary as named (a symlink stays one)
        elif _inside(b, [Path("/tmp")]) is not None and _inside(b, roots) is None:
            add(b)                                              # under /tmp: the file as named, not its directory
        for p in roots:                                         # its node_modules (with .bin/), venv, interpreter
            if _inside(p, hidden_roots) is not None and p not in hidden_roots:   # never all of /tmp or a home
                add(p)
    if not extra and not blanks:
        return plan
    return dataclasses.replace(plan, ro=list(plan.ro) + extra, over=list(plan.over) + blanks)


def check_argv(config, agent_home: Path, worktree: Path, command: str, scratch: Path) -> tuple[list[str], dict]:
    """argv and environment of a repository check: it runs code a lane wrote, so it is sandboxed like a lane
    (worktree read-write, the home hidden, no credential in its environment).  ``scratch`` is the runner's: made
    fresh here (whatever was there is removed, links unfollowed) and never shown to the check."""
    from agent.lanes.files import fresh_dir

    from agent.infra.env import lane_env, secret_env_names

    env = lane_env((), deny=secret_env_names(config))
    argv = ["sh", "-c", command]
    bwrap = require(config)
    if bwrap is None:
        return argv, env
    fresh_dir(scratch)
    plan = lane_plan(cwd=worktree, writable=True, agent_home=agent_home, run_dir=scratch, spec_paths=[],
                     state_paths=[], extra_writable=[])
    plan.tmpfs_mb = getattr(getattr(config, "limits", None), "lane_tmp_mb", plan.tmpfs_mb)
    plan.unix_sockets = getattr(config, "sandbox_unix_sockets", plan.unix_sockets)
    from agent.lanes.egress import check_network

    return wrap(bwrap, argv, with_argv_files(plan, argv, env), env, check_network(config))


def probe_argv(config, agent_home: Path, argv: list[str], env: dict[str, str], scratch: Path, *,
               state_paths: list = (), net=None) -> tuple[list[str], dict[str, str]]:
    """argv and environment of a vendor binary's probe (``--version``) in the sandbox its lane gets (the same
    binds of its binary, package tree and interpreter; home hidden), so a probe that works means the lane can start.
    ``scratch``: the runner's, made fresh here; the probe runs in an empty read-only directory inside it.
    ``state_paths``: ``(private copy, path the vendor expects)`` pairs bound read-write, as a lane's; ``net``: an
    ``agent.lanes.egress.Net`` (default: the host's network)."""
    from agent.lanes.files import fresh_dir

    bwrap = require(config)
    if bwrap is None:
        return list(argv), dict(env)
    fresh_dir(scratch)
    cwd = fresh_dir(Path(scratch) / "cwd")
    plan = lane_plan(cwd=cwd, writable=False, agent_home=agent_home, run_dir=Path(scratch), spec_paths=[],
                     state_paths=list(state_paths), extra_writable=[])
    plan.tmpfs_mb = getattr(getattr(config, "limits", None), "lane_tmp_mb", plan.tmpfs_mb)
    plan.unix_sockets = getattr(config, "sandbox_unix_sockets", plan.unix_sockets)
    return wrap(bwrap, list(argv), with_argv_files(plan, list(argv), env), env, net)


def sandboxed_check(config, agent_home: Path, worktree: Path, command: str, scratch: Path):
    """A repository check ready to run: ``check(**proc_run_options) -> ProcResult`` (``check_argv`` + ``proc.run``,
    through ``until_set_up``).  The first plan is made here, so a check that cannot be planned raises AgentError
    before anything runs."""
    from agent.infra.proc import run

    first = [check_argv(config, agent_home, worktree, command, scratch)]

    def check(**options):
        def start():
            argv, env = first.pop() if first else check_argv(config, agent_home, worktree, command, scratch)
            return argv, run(argv, cwd=worktree, env=env, **options)
        return until_set_up(start)
    return check


def until_set_up(start, on_restart=None):
    """``start() -> (argv, ProcResult)`` (a new plan each call), called again while bwrap could not come up
    because a mount point of the plan vanished (``vanished_mount``), ``SETUP_RETRIES`` times at most;
    ``on_restart(path)`` before each new start (False: no new start).  The last result."""
    for attempt in range(SETUP_RETRIES + 1):
        argv, res = start()
        gone = vanished_mount(argv, res.stderr_text(4096)) if attempt < SETUP_RETRIES else None
        if gone is None or (on_restart is not None and on_restart(gone) is False):
            return res
    raise AssertionError("unreachable")


# A sandbox whose mount point vanished between the plan and bwrap's start is planned and started again, this many
# times at most (each time with a new scan of the host's sockets).
SETUP_RETRIES = 2


def vanished_mount(argv: list[str], stderr: str) -> str | None:
    """The mount point bwrap could not make because it was gone by the time the sandbox came up, or None.

    The plan blanks each host socket it finds (``--ro-bind /dev/null SOCKET``) and hides socket dirs (``--tmpfs``);
    a service that removes its socket, or its directory, between that scan and bwrap's start leaves a mount point
    that cannot be made in the read-only root (``bwrap: Can't mkdir parents for P`` or ``Can't create file at P``).
    Nothing of the command ran, and there is nothing left to hide there, so starting again with a new plan is safe;
    a lane or check is never judged on it."""
    line = next((x for x in (stderr or "").splitlines()[:5] if x.startswith("bwrap: Can't ")), None)
    if line is None:
        return None
    dests = {argv[i + 2] for i in range(len(argv) - 2) if argv[i] == "--ro-bind" and argv[i + 1] == "/dev/null"}
    dests |= {argv[i + 1] for i in range(len(argv) - 1) if argv[i] == "--tmpfs"}
    for dest in sorted(dests, key=len, reverse=True):
        if (f" {dest}:" in line or line.endswith(f" {dest}")) and not os.path.lexists(dest):
            return dest
    return None


LANE_UID = 1000


def sandbox_exec_failure(stderr: str) -> str | None:
    """bwrap's own failure to exec the command (``bwrap: execvp X: No such file or directory``) or to set its filter
    (``bwrap: Unable to set up system call filtering ...``), which exits 1 like a crashing CLI would: the line, or
    None when the command did start."""
    for line in (stderr or "").splitlines()[:5]:
        if line.startswith(("bwrap: execvp ", "bwrap: Can't ", "bwrap: Unable to set up system call filtering",
                            "bwrap: prctl(PR_SET_SECCOMP)", "bwrap: Invalid seccomp data")) or (
                line.startswith("agent-lane: egress: ") and line.endswith("the lane does not start")):
            return line.strip()[:300]
    return None


def _uid_args() -> list[str]:
    """Inside its own user namespace the lane is not root even when the agent is: a vendor CLI that sandboxes
    its own tool calls with bwrap (codex) may then map its uid into a nested namespace, which root without
    capabilities may not (mapping uid 0 needs CAP_SETFCAP).  Outside, its files still belong to the agent's user."""
    return ["--uid", str(LANE_UID), "--gid", str(LANE_UID)] if os.getuid() == 0 else []


def _depth(p: Path) -> int:
    return len(Path(p).parts)


def _without_repeats(mounts: list[tuple[int, int, list[str]]], replaced: set[str]) -> list[str]:
    """The mounts' arguments, in order, without a read-only bind of a path onto itself that the lane already sees
    read-only as it is: through the read-only root or an enclosing read-only bind of the same path, with nothing
    mounted in between (the agent's interpreter inside a bound ``~/.pyenv``, a repository's ``.git`` that is its own
    common dir, a vendor binary outside any hidden tree).  bwrap re-reads its mount table for each read-only bind,
    so each one left out is time off every lane start.  ``replaced``: what the mounts before these put in place of
    the root's view (the private /tmp, /dev, /proc)."""
    shown: dict[str, bool] = {"/": True, **{d: False for d in replaced}}
    out: list[str] = []
    for _depth, _order, op in mounts:
        dest = op[-1]                          # every op ends with its destination
        same = op[0] == "--ro-bind" and len(op) == 3 and op[1] == op[2]
        if same:
            p = Path(dest)
            enclosing = next((shown[str(a)] for a in (p, *p.parents) if str(a) in shown), True)
            if enclosing:
                continue
        out += op
        shown[dest] = same
    return out


def wrap(bwrap: str, argv: list[str], plan: Plan, env: dict[str, str], net=None) -> tuple[list[str], dict[str, str]]:
    """The bwrap argv running ``argv`` under ``plan``, and the environment to give it (TMPDIR is the private
    /tmp).  Mounts are ordered by depth, so a deeper path (the worktree's ``.git``) overrides a shallower one (the
    worktree), and a hidden tree (a user's home, the agent home inside it) is emptied before what the lane may see
    is bound back into it.  ``net`` (``agent.lanes.egress.Net``): the network namespace, the hidden socket dirs
    and the egress proxy (``net.pass_fds()`` go to the child); None shares the host's network."""
    args = [bwrap, "--die-with-parent", "--unshare-user", *_uid_args(), "--unshare-pid", "--unshare-ipc",
            "--unshare-uts", *(net.bwrap_args() if net is not None else []), "--new-session", "--cap-drop", "ALL",
            "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    # every writable tmpfs (the private /tmp, the homes, the hidden agent home) is RAM: each one capped
    size = ["--size", str(max(16, int(plan.tmpfs_mb)) << 20)]
    args += [*size, "--tmpfs", "/tmp"]
    if Path("/var/tmp").is_dir() and not Path("/var/tmp").is_symlink():
        # the host's other temp dir: private too (its files and sockets come and go, so they are not listed)
        args += [*size, "--tmpfs", "/var/tmp"]
    mounts: list[tuple[int, int, list[str]]] = []
    order = 0

    def add(dest: Path, op: list[str]) -> None:
        nonlocal order
        order += 1
        mounts.append((_depth(dest), order, op))

    for p in plan.homes:
        add(p, [*size, "--tmpfs", str(p)])
    for p in plan.hide:
        add(p, [*size, "--tmpfs", str(p)])
    for p in plan.rw:
        add(p, ["--bind", str(p), str(p)])
    for p in plan.ro:
        add(p, ["--ro-bind", str(p), str(p)])
    for src, dest in plan.over:
        add(dest, ["--ro-bind", str(src), str(dest)])
    for src, dest in plan.over_rw:
        add(dest, ["--bind", str(src), str(dest)])
    for p in plan.empty:
        add(p, ["--tmpfs", str(p), "--remount-ro", str(p)])
    bound = {plan.cwd, *plan.rw, *plan.ro, *(dest for _, dest in plan.over_rw)}
    for dest, op in (net.mounts() if net is not None else []):
        if not (op[0] == "--tmpfs" and dest in bound):     # a socket dir that is the lane's own worktree stays
            add(dest, op)
    env = dict(env) if net is None else net.env(env)
    tmpdir = env.get("TMPDIR") or "/tmp"
    if tmpdir != "/tmp" and len(Path(tmpdir).parts) >= 3:
        # a configured TMPDIR stays where the vendor expects it (codex refuses helper binaries under it), as a
        # private tmpfs of its own
        add(Path(tmpdir), [*size, "--tmpfs", tmpdir])
    else:
        env["TMPDIR"] = "/tmp"
    replaced = {args[i + 1] for i in range(len(args) - 1) if args[i] in ("--tmpfs", "--dev", "--proc")}
    args += _without_repeats(sorted(mounts, key=lambda m: (m[0], m[1])), replaced)
    # the filter (or an allow-all program) comes on the go pipe: bwrap reads it to its end right before the command
    args += ["--seccomp", go_arg(sandbox_filter(plan.unix_sockets != "allow"))]
    args += ["--chdir", str(plan.cwd), "--"]
    return args + list(argv), env
