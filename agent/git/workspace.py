"""Workspaces: one bare mirror per repository, one git worktree per task, and the agent's hardened git.

- The mirror (``$AGENT_HOME/mirrors/OWNER__NAME.git``) is cloned once and fetched after. Remote branches land in
  ``refs/remotes/origin/*`` so a fetch never touches the task branches that live in the mirror.
- A task's worktree is added on branch ``<prefix><error-id8>`` from ``origin/<base>`` in a staging path and then
  moved into place with ``git worktree move`` (a rename), so a crash never leaves a half-made workspace at the final
  path. A leftover staging worktree is removed and made again on the next scan.
- Every git command the agent runs goes through ``git()``: a fixed environment (no forge or source token but for
  push), ``-c`` overrides that switch off everything a repository's config could make git execute (hooks,
  fsmonitor, external diff, textconv, pagers, ssh commands), and, for a task's worktree, an explicit
  ``--git-dir``/``--work-tree`` taken from the mirror, never from the worktree's own ``.git`` file. The mirror's
  config, hooks and ``info/`` are hashed around every lane (``protected_state``/``restore``).
"""

from __future__ import annotations

import hashlib
import os
import threading
import re
import shutil
import stat
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from agent import AgentError


class WorkspaceError(AgentError):
    """The mirror or worktree could not be made; the message has git's own first error line and the fix."""


def git_error_line(exc) -> str:
    """Git's first error line (``fatal: repository '/x' does not exist``) from a failed git command's stderr (an
    exception's ``stderr``, or the text itself).

    Git may print progress first and hints after: the first ``fatal:``/``error:`` line is the one that says what
    went wrong (the last line can be a hint, "...and the repository exists.", or, as GitPython quoted it, a lone
    ``'``)."""
    text = exc if isinstance(exc, str) else str(getattr(exc, "stderr", "") or "")
    lines = [line.strip() for line in text.splitlines() if line.strip().strip("'")]
    for line in lines:
        if line.lower().removeprefix("remote:").lstrip().startswith(("fatal:", "error:")):
            return line
    return lines[0] if lines else ("" if isinstance(exc, str) else str(exc))


def _fix_for(line: str, repo: str) -> str:
    low = line.lower()
    if "could not resolve host" in low or "name or service not known" in low or "connection refused" in low \
            or "could not connect" in low or "failed to connect" in low or "timed out" in low:
        return f"the host in repos.{repo}.url cannot be reached: check the URL and the network"
    if "permission denied" in low or "authentication failed" in low or "could not read username" in low \
            or "access denied" in low or "403" in low:
        return f"access to repos.{repo}.url was refused: check the credentials or SSH key of this user"
    return f"check repos.{repo}.url: it must be a git repository this user can clone"


def _git_failed(exc, what: str, repo: str, fix: str | None = None) -> WorkspaceError:
    line = git_error_line(exc)
    if "no space left on device" in str(getattr(exc, "stderr", "")).lower():
        from agent.ledger import disk_full

        return disk_full(what)
    return WorkspaceError(f"{what}: {line}; {fix or _fix_for(line, repo)}")


@dataclass(frozen=True)
class Workspace:
    path: Path
    branch: str
    base_sha: str
    mirror: Path
    created: bool


class GitError(AgentError):
    """A git command failed; ``stderr`` holds its last lines."""

    def __init__(self, message: str, stderr: str = "", exit_code: int | None = None):
        super().__init__(message)
        self.stderr = stderr
        self.exit_code = exit_code


# Overrides on every git command the agent runs. Repository config (which a lane could have written) can set
# commands git executes; these win over any config file. Filters and textconv drivers are named per attribute,
# so they cannot be switched off by name here (nor diff.external: an empty value makes git run ""): the mirror's config (the only place that defines them) is
# hash-checked around every lane and restored on drift, and diff/show get --no-ext-diff --no-textconv.
SAFE_GIT_CONFIG = (
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.untrackedCache=false",
    "core.pager=cat",
    "core.editor=true",
    "core.askPass=",
    "core.sshCommand=ssh",
    "core.attributesFile=/dev/null",
    "gc.auto=0",
    "maintenance.auto=false",
    "submodule.recurse=false",
    "fetch.recurseSubmodules=false",
    "protocol.ext.allow=never",
    "credential.helper=",
    "commit.gpgSign=false",
    "tag.gpgSign=false",
)
# Push (and fetch/clone/ls-remote: they talk to the remote) keep the user's credential helpers and ssh setup.
_NETWORK_DROPS = ("credential.helper=", "core.sshCommand=ssh", "core.askPass=")
_ENV_KEEP = ("PATH", "HOME", "USER", "SSH_AUTH_SOCK", "GIT_SSH_COMMAND", "GIT_SSH", "SSL_CERT_FILE", "SSL_CERT_DIR", "GIT_SSL_CAINFO", "http_proxy", "https_proxy", "no_proxy",
             "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "TZ")
GIT_TIMEOUT = 300.0


_USER_CREDENTIALS: list[list[str]] = []


def user_credential_config() -> list[str]:
    """The user's own ``credential.*`` settings (global and system config), as ``-c key=value`` overrides: the
    only part of their git config a push or fetch gets (their credential helper, e.g. ``gh``)."""
    if not _USER_CREDENTIALS:
        from agent.infra import proc

        env = {k: os.environ[k] for k in ("PATH", "HOME", "XDG_CONFIG_HOME") if k in os.environ}
        res = proc.capture(["git", "config", "-z", "--get-regexp", r"^credential\."], cwd="/", env=env,
                           timeout=30)
        out = []
        for rec in (res.stdout.split("\0") if res.exit_code == 0 else []):
            key, _, value = rec.partition("\n")
            if key:
                out += ["-c", f"{key}={value}"]
        _USER_CREDENTIALS[:] = [out]
    return list(_USER_CREDENTIALS[0])


def git_env(push: bool = False, config=None, network: bool = False) -> dict[str, str]:
    """The whole environment of an agent git command: a few variables git needs, never a credential unless
    ``push`` (then the forge/source token variables pass, for credential helpers such as ``gh``).  No system or
    global git config is read (``GIT_CONFIG_NOSYSTEM``, ``GIT_CONFIG_GLOBAL=/dev/null``): a filter driver, alias
    or hook path in the user's ``~/.gitconfig`` never runs on a lane's files.  ``HOME`` is unset unless the
    command talks to a remote (the user's credential helper may need their home): git then reads nothing from a
    home (no ``~/.config/git/ignore``), and no per-process empty directory is left behind by a killed agent."""
    from agent.infra.env import secret_env_names

    env = {k: os.environ[k] for k in _ENV_KEEP if k in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update({"LC_ALL": "C", "LANGUAGE": "C", "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true",
                "SSH_ASKPASS": "true", "GIT_NO_REPLACE_OBJECTS": "1", "GIT_OPTIONAL_LOCKS": "0",
                "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null"})
    if not (push or network):
        env.pop("HOME", None)
    if not push:
        for name in secret_env_names(config):
            env.pop(name, None)
    else:
        for name in secret_env_names(config):
            if name in os.environ:
                env[name] = os.environ[name]
    if "GIT_SSH_COMMAND" not in env and "GIT_SSH" not in env:
        env["GIT_SSH_COMMAND"] = "ssh"        # wins over a core.sshCommand from any config
    return env


def git(*args: str, cwd: Path | str | None = None, git_dir: Path | str | None = None,
        work_tree: Path | str | None = None, network: bool = False, push: bool = False,
        timeout: float = GIT_TIMEOUT, input: bytes | None = None, check: bool = True, raw: bool = False) -> str:
    """Run one hardened git command and return its stdout (trailing newline kept off).

    ``git_dir``/``work_tree`` are passed explicitly when given (a task's worktree: never trust its ``.git``
    file). ``network`` keeps the user's credential helpers and ssh setup; ``push`` also passes credential
    variables. Raises GitError (with stderr) when ``check`` and git fails. ``raw``: stdout as bytes, untouched."""
    from agent.infra import proc

    overrides = [c for c in SAFE_GIT_CONFIG if not ((network or push) and c in _NETWORK_DROPS)]
    argv = ["git"]
    for c in overrides:
        argv += ["-c", c]
    if network or push:
        argv += user_credential_config()
    if git_dir is not None:
        argv.append(f"--git-dir={git_dir}")
    if work_tree is not None:
        argv.append(f"--work-tree={work_tree}")
    argv += list(args)
    res = proc.capture(argv, cwd=cwd or work_tree or git_dir, env=git_env(push=push, network=network),
                       timeout=timeout,
                       input=input)
    if check and res.exit_code != 0:
        what = "timed out" if res.timed_out else (git_error_line(res.stderr)[:300] or f"exit {res.exit_code}")
        raise GitError(f"git {args[0] if args else ''}: {what}", res.stderr, res.exit_code)
    if raw:
        return res.raw  # type: ignore[return-value]
    return res.stdout[:-1] if res.stdout.endswith("\n") else res.stdout


# Config keys that make git run a command, rewrite where it talks to, or read more config: agent never writes them
# into a mirror, so finding one means something (a lane, without the sandbox) did. Git is refused there until the
# mirror is restored (the lane guard does it after every lane).
_EXEC_KEYS = re.compile(
    r"^(core\.(hookspath|fsmonitor|sshcommand|gitproxy|pager|editor|askpass|alternaterefscommand|attributesfile|"
    r"worktree)|filter\..*|diff\..*\.(textconv|command)|diff\.external|merge\..*\.driver|url\..*|credential\..*|"
    r"include\..*|includeif\..*|remote\..*\.(uploadpack|receivepack|vcs|proxy)|gpg\..*program|sequence\.editor|"
    r"uploadpack\..*|receive\..*|alias\..*|pager\..*|http\..*proxy.*|interactive\..*)$", re.I)
_AUDIT_CACHE: dict[tuple, list[str]] = {}


def audit_config(common: Path) -> list[str]:
    """The keys in a repository's own config that could make git execute something or go elsewhere."""
    path = Path(common) / "config"
    try:
        st = path.stat()
    except OSError:
        return []
    key = (str(path), st.st_ino, st.st_mtime_ns, st.st_size)
    if key not in _AUDIT_CACHE:
        names = git("config", "--file", str(path), "--list", "--name-only", cwd=common, check=False)
        _AUDIT_CACHE[key] = sorted({n for n in names.splitlines() if _EXEC_KEYS.match(n.strip())})
    return _AUDIT_CACHE[key]


def require_clean_config(common: Path) -> None:
    bad = audit_config(common)
    if bad:
        raise GitError(f"{common}/config holds keys agent never writes ({', '.join(bad[:5])}); something changed "
                       "the mirror: restore its config (or re-clone it) before agent runs git there")


def worktree_git_dir(mirror: Path, worktree: Path) -> Path:
    """The worktree's git dir inside the mirror (``worktrees/<name>``), found from the mirror's own records
    (each ``worktrees/*/gitdir`` names its worktree's ``.git``), never from the worktree's ``.git`` file."""
    target = (Path(worktree).resolve() / ".git")
    wt_root = Path(mirror) / "worktrees"
    guess = wt_root / Path(worktree).name
    for cand in [guess] + (sorted(wt_root.iterdir()) if wt_root.is_dir() else []):
        try:
            recorded = Path((cand / "gitdir").read_text().strip())
        except OSError:
            continue
        if recorded == target or recorded.resolve() == target:
            return cand
    raise WorkspaceError(f"{worktree}: not a worktree registered in {mirror}; recreate the task's workspace")


class TaskGit:
    """Hardened git bound to one task worktree and its git dir in the mirror."""

    def __init__(self, worktree: Path | str, mirror: Path | str | None = None):
        self.worktree = Path(worktree)
        if mirror is None:
            mirror = find_common_dir(self.worktree)
        self.mirror = Path(mirror)
        if (self.worktree / ".git").is_dir() and self.mirror.resolve() == (self.worktree / ".git").resolve():
            self.git_dir = self.mirror        # a plain repository (ad-hoc `agent lane run --cwd`)
        else:
            self.git_dir = worktree_git_dir(self.mirror, self.worktree)

    def __call__(self, *args: str, **kw) -> str:
        if self.git_dir != self.mirror or not (self.worktree / ".git").is_dir():
            require_clean_config(self.mirror)        # a task worktree's mirror: only what agent wrote
        return git(*args, git_dir=self.git_dir, work_tree=self.worktree, cwd=self.worktree, **kw)

    def head(self) -> str:
        return self("rev-parse", "HEAD")

    def diff(self, *args: str) -> str:
        return self("diff", "--no-ext-diff", "--no-textconv", "--no-color", *args)

    def staged_changes(self) -> list["Change"]:
        """Every change staged against HEAD (``git diff --cached --raw``), renames off."""
        raw = self("diff", "--cached", "--raw", "-z", "--no-renames", "--no-ext-diff", "--no-textconv", "HEAD")
        parts = raw.split("\0")
        out = []
        for i in range(0, len(parts) - 1, 2):
            meta, path = parts[i], parts[i + 1]
            if not meta.startswith(":"):
                continue
            src_mode, dst_mode, src_sha, dst_sha, status = meta[1:].split(" ")[:5]
            out.append(Change(path, src_mode, dst_mode, dst_sha, status))
        return out

    def dot_git_text(self) -> str:
        """What the worktree's ``.git`` file must say (restored after every lane)."""
        return f"gitdir: {self.git_dir.resolve()}\n"


@dataclass(frozen=True)
class Change:
    path: str
    src_mode: str
    dst_mode: str
    dst_sha: str
    status: str


def unsafe_changes(g: TaskGit, changes: list[Change]) -> list[str]:
    """Staged changes that are never committed, whatever the blocked paths say: a new gitlink (a submodule
    entry), and a symlink judged by resolving it through the tree: absolute, climbing above the root on the way,
    or passing through another link (``s -> .``, ``u1 -> s/..`` ... resolve to ``/`` though no target says so).
    An unchanged link is judged again when it passes through a link this change adds or alters."""
    bad = []
    changed_links = {c.path for c in changes if "120000" in (c.dst_mode, c.src_mode)}
    for c in changes:
        if c.dst_mode == "160000" and c.src_mode != "160000":
            bad.append(f"{c.path} (new gitlink)")
    if not changed_links:
        return bad
    links = _index_links(g)
    for path, target in sorted(links.items()):
        why = _link_problem(path, target, links)
        if why is None or (path not in changed_links and why[1] not in changed_links):
            continue
        bad.append(f"{path} (symlink to {target[:80]}) {why[0]}")
    return bad


def _index_links(g: TaskGit) -> dict[str, str]:
    """Every symlink staged in the index: path -> target (read from the worktree the index was staged from; from
    the blob when the file there is not that link any more)."""
    out = {}
    for rec in g("ls-files", "-s", "-z").split("\0"):
        meta, _, path = rec.partition("\t")
        if not meta.startswith("120000 "):
            continue
        try:
            out[path] = os.readlink(g.worktree / path)
        except OSError:
            out[path] = g("cat-file", "blob", meta.split(" ")[1])
    return out


def _link_problem(path: str, target: str, links: dict[str, str]) -> tuple[str, str | None] | None:
    """(why the link at ``path`` to ``target`` is unsafe, the link it passes through), resolved through the
    tree, or None."""
    if os.path.isabs(target):
        return "is absolute", None
    stack = path.split("/")[:-1]
    for part in target.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not stack:
                return "leaves the worktree", None
            stack.pop()
            continue
        stack.append(part)
        here = "/".join(stack)
        if here in links:
            return f"passes through the link {here}", here
    return None


def find_common_dir(worktree: Path) -> Path:
    """The common git dir of ``worktree``, read from its ``.git`` (only before a lane has run in it, or for a
    plain repository whose ``.git`` is a directory)."""
    dot = Path(worktree) / ".git"
    if dot.is_dir():
        return dot.resolve()
    try:
        text = dot.read_text().strip()
    except OSError:
        raise WorkspaceError(f"{worktree}: not a git worktree (no .git)") from None
    if not text.startswith("gitdir:"):
        raise WorkspaceError(f"{worktree}: .git does not name a git dir")
    gd = Path(text[len("gitdir:"):].strip())
    if not gd.is_absolute():
        gd = (Path(worktree) / gd)
    try:
        common = (gd / "commondir").read_text().strip()
    except OSError:
        return gd.resolve()
    return (gd / common).resolve() if not Path(common).is_absolute() else Path(common).resolve()


# ---------------------------------------------------------------------------------------------- mirror integrity


def protected_files(common: Path, git_dir: Path | None = None) -> list[Path]:
    """The files whose content decides what git executes: the common config, ``hooks/``, ``info/``, and the
    per-worktree ``config.worktree``/``commondir``/``gitdir`` of ``git_dir``."""
    common = Path(common)
    out = [common / "config"]
    for sub in ("hooks", "info"):
        d = common / sub
        if d.is_dir() or d.is_symlink():
            out.append(d)
            for root, dirs, files in os.walk(d, followlinks=False):
                for n in sorted(dirs + files):
                    out.append(Path(root) / n)
    if git_dir is not None and Path(git_dir) != common:
        out += [Path(git_dir) / n for n in ("config.worktree", "commondir", "gitdir")]
    return out


def protected_state(common: Path, git_dir: Path | None = None) -> dict[str, tuple[str, bytes | None]]:
    """path -> (kind, content) of every protected file (kind: file, dir, link, absent)."""
    state: dict[str, tuple[str, bytes | None]] = {}
    for p in protected_files(common, git_dir):
        try:
            if p.is_symlink():
                state[str(p)] = ("link", os.readlink(p).encode())
            elif p.is_dir():
                state[str(p)] = ("dir", None)
            elif p.exists():
                state[str(p)] = ("file", p.read_bytes())
            else:
                state[str(p)] = ("absent", None)
        except OSError:
            state[str(p)] = ("unreadable", None)
    return state


def state_digest(state: dict[str, tuple[str, bytes | None]]) -> str:
    h = hashlib.sha256()
    for path in sorted(state):
        kind, data = state[path]
        h.update(f"{path}\0{kind}\0".encode())
        h.update(hashlib.sha256(data or b"").digest())
    return h.hexdigest()


def drift(before: dict, common: Path, git_dir: Path | None = None) -> list[str]:
    """Protected paths whose content differs from ``before`` (added, changed or removed)."""
    after = protected_state(common, git_dir)
    keys = sorted(set(before) | set(after))
    return [k for k in keys if before.get(k, ("absent", None)) != after.get(k, ("absent", None))]


def restore(before: dict, common: Path, git_dir: Path | None = None) -> None:
    """Put every protected file back as it was in ``before``; remove what was added."""
    after = protected_state(common, git_dir)
    for path in sorted(set(after) - set(before), key=len, reverse=True):
        p = Path(path)
        if p.is_symlink() or p.is_file():
            p.unlink(missing_ok=True)
        elif p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
    for path in sorted(before, key=len):
        kind, data = before[path]
        p = Path(path)
        if after.get(path) == (kind, data):
            continue
        if p.is_symlink() or (p.exists() and not p.is_dir()):
            p.unlink()
        elif p.is_dir() and kind != "dir":
            shutil.rmtree(p)
        if kind == "dir":
            p.mkdir(parents=True, exist_ok=True)
        elif kind == "file":
            p.parent.mkdir(parents=True, exist_ok=True)
            tmp = p.with_name(p.name + ".agent-restore")
            tmp.write_bytes(data or b"")
            tmp.replace(p)
        elif kind == "link":
            p.symlink_to(data.decode())


def _slug(repo: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", repo.replace("/", "__"))


def mirror_path(home: Path, repo: str) -> Path:
    return Path(home) / "mirrors" / f"{_slug(repo)}.git"


def branch_name(prefix: str, error_id: str | None, task_id: int) -> str:
    return f"{prefix}{error_id[:8]}" if error_id else f"{prefix}task-{task_id}"


def _write_excludes(mirror: Path) -> None:
    """Files vendor CLIs write into any worktree (caches, settings) are never committed nor count as edits.

    ``info/exclude`` of the mirror applies to every worktree made from it, and read-only lane verification
    skips ignored files too.
    """
    from agent.domain.names import WORKTREE_LITTER

    litter = sorted({p for paths in WORKTREE_LITTER.values() for p in paths})
    path = mirror / "info" / "exclude"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "# written by agent: files vendor CLIs leave in a worktree\n" + "".join(f"/{p}\n" for p in litter)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


_THREAD_LOCKS: dict[str, "threading.Lock"] = {}
_THREAD_LOCKS_GUARD = threading.Lock()
MIRROR_LOCK_WAIT = 600.0   # a clone of a large repository can take minutes


@contextmanager
def mirror_lock(home: Path, repo: str, wait: float = MIRROR_LOCK_WAIT) -> Iterator[None]:
    """Serialise what changes one home's mirror of a repository (clone, fetch, worktree add/move/prune): the
    threads of one runner (``--jobs``) and the processes sharing the home (a cron tick next to the daemon). A
    thread lock plus an flock on ``mirrors/<name>.git.lock``, waited for at most ``wait`` seconds."""
    import threading

    from agent.coord.locks import flock_within

    path = mirror_path(home, repo)
    path.parent.mkdir(parents=True, exist_ok=True)
    key = str(path)
    with _THREAD_LOCKS_GUARD:
        lock = _THREAD_LOCKS.setdefault(key, threading.Lock())
    if not lock.acquire(timeout=wait):
        raise WorkspaceError(f"{repo}: the mirror {path} stayed busy for {wait:.0f}s; the next scan tries again")
    try:
        fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if not flock_within(fd, wait):
                raise WorkspaceError(f"{repo}: the mirror {path} stayed busy for {wait:.0f}s (another "
                                     "process of this home holds it); the next scan tries again")
            yield
        finally:
            os.close(fd)
    finally:
        lock.release()


def ensure_mirror(home: Path, repo: str, url: str) -> Path:
    """Clone the bare mirror once (into a staging path, then rename); fetch it every later time. Callers that may
    run in parallel in one home hold ``mirror_lock``."""
    mirror = mirror_path(home, repo)
    try:
        if mirror.exists() and not (mirror / "HEAD").exists():
            shutil.rmtree(mirror)   # half there (a rename or delete cut short): no git repository, cloned again
        if mirror.exists():
            git("fetch", url, "+refs/heads/*:refs/remotes/origin/*", "--prune", "--quiet", git_dir=mirror,
                network=True)
            _write_excludes(mirror)
            return mirror
        mirror.parent.mkdir(parents=True, exist_ok=True)
        staging = mirror.with_name(mirror.name + ".staging")
        shutil.rmtree(staging, ignore_errors=True)
        git("clone", "--bare", "--quiet", "--", url, str(staging), cwd=mirror.parent, network=True)
        git("config", "remote.origin.fetch", "+refs/heads/*:refs/remotes/origin/*", git_dir=staging)
        git("fetch", url, "+refs/heads/*:refs/remotes/origin/*", "--quiet", git_dir=staging, network=True)
        _write_excludes(staging)
        staging.rename(mirror)
        return mirror
    except GitError as exc:
        raise _git_failed(exc, f"{repo}: cannot clone or fetch {url}", repo) from None


def _worktree_branches(mirror: Path) -> dict[str, str]:
    """path -> branch for every worktree registered in the mirror."""
    out: dict[str, str] = {}
    current = None
    for line in git("worktree", "list", "--porcelain", git_dir=mirror).splitlines():
        if line.startswith("worktree "):
            current = line[len("worktree "):]
        elif line.startswith("branch ") and current:
            out[current] = line[len("branch refs/heads/"):]
    return out


def own_worktree(home: Path, task_id: int) -> Path:
    """Where this home keeps the task's worktree (each runner has its own home, so its own copy)."""
    return Path(home) / "worktrees" / f"task-{task_id}"


def ensure_worktree(home: Path, repo: str, url: str, base: str, branch: str, task_id: int,
                    start_at: str | None = None) -> Workspace:
    """Find or make the task's worktree. Idempotent; safe to call again after a crash at any point.

    ``start_at`` (a takeover: another runner advanced the task) is the commit the worktree must be at: this home's
    own worktree of the task, if it has one, is reset there (its branch moves, whatever it held is dropped: the
    ledger's head is the truth), else one is made there."""
    mirror = ensure_mirror(home, repo, url)
    final = own_worktree(home, task_id)
    root = final.parent
    root.mkdir(parents=True, exist_ok=True)
    staging = root / f".staging-task-{task_id}"
    try:
        base_sha = git("rev-parse", "--verify", "--quiet", f"refs/remotes/origin/{base}^{{commit}}", git_dir=mirror)
    except GitError:
        raise WorkspaceError(f"{repo}: base branch {base!r} not found on the remote; check repos.{repo}.base") \
            from None
    registered = _worktree_branches(mirror)
    if final.exists():
        if registered.get(str(final.resolve())) != branch:
            raise WorkspaceError(f"{final}: exists but is not the worktree of branch {branch}; move it aside")
        if start_at is None:
            return Workspace(final, branch, base_sha, mirror, created=False)
        try:
            g = TaskGit(final, mirror)
            for name in ("index.lock", "HEAD.lock"):   # left by a kill of this home's runner long ago
                (g.git_dir / name).unlink(missing_ok=True)
            g("reset", "-q", "--hard", start_at)
            g("clean", "-fdq")
            return Workspace(final, branch, base_sha, mirror, created=True)
        except (GitError, WorkspaceError):
            remove_worktree(mirror, final)   # made again below
    # a crash left a staging worktree: throw it away and make it again
    if staging.exists() or str(staging.resolve()) in registered:
        shutil.rmtree(staging, ignore_errors=True)
    git("worktree", "prune", git_dir=mirror)
    _restore_kept_branch(mirror, branch, task_id)
    branch_exists = bool(git("branch", "--list", branch, git_dir=mirror).strip())
    pushed = _has_ref(mirror, f"refs/remotes/origin/{branch}")
    try:
        if start_at:  # a takeover: exactly the commit the ledger (or the remote's hidden ref) says
            git("worktree", "add", "-B", branch, str(staging), start_at, git_dir=mirror, cwd=root)
        elif branch_exists:  # made by an earlier attempt whose worktree was lost: keep its commits
            git("worktree", "add", str(staging), branch, git_dir=mirror, cwd=root)
        elif pushed:  # the mirror was lost and cloned again: go on from what was pushed, not from the base
            git("worktree", "add", "-b", branch, str(staging), f"refs/remotes/origin/{branch}", git_dir=mirror,
                cwd=root)
        else:
            git("worktree", "add", "-b", branch, str(staging), f"refs/remotes/origin/{base}", git_dir=mirror,
                cwd=root)
        git("worktree", "move", str(staging), str(final), git_dir=mirror, cwd=root)
    except GitError as exc:
        raise _git_failed(exc, f"task {task_id}: cannot create worktree", repo,
                          f"move {final} aside if it is in the way, or reset the task") from None
    return Workspace(final, branch, base_sha, mirror, created=True)


def _has_ref(mirror: Path, ref: str) -> bool:
    return git("rev-parse", "--verify", "--quiet", ref, git_dir=mirror, check=False) != ""


def has_commit(mirror: Path, sha: str | None) -> bool:
    """Whether the repository at ``mirror`` holds commit ``sha``."""
    if not sha or not (Path(mirror) / "HEAD").exists():
        return False
    try:
        git("cat-file", "-e", f"{sha}^{{commit}}", git_dir=mirror)
        return True
    except GitError:
        return False


def intact(worktree: Path, mirror: Path) -> bool:
    """Whether a task's worktree folder is still a worktree registered in ``mirror`` (a deleted mirror leaves a
    folder that is no git worktree: every git command there fails). Asked of the mirror's own records, never of
    the worktree's ``.git`` file (a lane can write that)."""
    if not (Path(mirror) / "HEAD").exists():
        return False
    try:
        return (worktree_git_dir(mirror, worktree) / "HEAD").exists()
    except WorkspaceError:
        return False


def remove_worktree(mirror: Path, path: Path) -> None:
    try:
        git("worktree", "remove", "--force", str(path), git_dir=mirror)
    except GitError:
        shutil.rmtree(path, ignore_errors=True)
        git("worktree", "prune", git_dir=mirror, check=False)


def read_base_file(mirror: Path, base_sha: str, path: str, raw: bool = False) -> str | bytes | None:
    """A file's text (``raw``: its bytes) at the base commit (trusted: a lane cannot change it), or None when it is
    not there."""
    try:
        return git("show", "--no-textconv", f"{base_sha}:{path}", git_dir=mirror, raw=raw)
    except GitError:
        return None


def task_ref(task_id: int) -> str:
    """The task's hidden ref on the shared remote: every recorded round commit is reachable from it (pushed before
    the commit is recorded), so any runner can rebuild the task's worktree (DESIGN.md "Takeover")."""
    return f"refs/agent/task-{int(task_id)}"


def fetched_task_ref(task_id: int) -> str:
    """Where a mirror keeps its copy of the remote's ``task_ref`` (outside refs/heads and refs/remotes/origin, so
    the mirror's ordinary fetch never prunes or moves it)."""
    return f"refs/agent/remote/task-{int(task_id)}"


def ls_remote_ref(url: str, ref: str, cwd: Path | str | None = None) -> str | None:
    """The sha of one full ref (``refs/heads/x``, ``refs/agent/task-3``) on the remote, or None when it is not there.
    Raises GitError when the remote cannot be read."""
    out = git("ls-remote", "--", url, ref, network=True, cwd=cwd)
    for line in out.splitlines():
        sha, _, name = line.partition("\t")
        if name.strip() == ref:
            return sha.strip()
    return None


def fetch_task_ref(mirror: Path, url: str, task_id: int) -> str | None:
    """Bring the remote's ``task_ref(task_id)`` into the mirror (as ``fetched_task_ref``) and return its sha, or None
    when the remote has none (a task from before hidden refs, or pruned). Raises GitError on a git failure."""
    ref, local = task_ref(task_id), fetched_task_ref(task_id)
    sha = ls_remote_ref(url, ref, cwd=mirror)
    if sha is None:
        git("update-ref", "-d", local, git_dir=mirror, check=False)
        return None
    if has_commit(mirror, sha):
        git("update-ref", local, sha, git_dir=mirror)
    else:
        git("fetch", "--quiet", "--no-tags", "--no-write-fetch-head", url, f"+{ref}:{local}", git_dir=mirror,
            network=True)
    return sha


def is_ancestor(git_dir: Path | str, ancestor: str, descendant: str) -> bool:
    """Whether ``ancestor`` is ``descendant`` or in its history (False when either object is missing)."""
    try:
        git("merge-base", "--is-ancestor", ancestor, descendant, git_dir=git_dir)
        return True
    except GitError:
        return False


def parent_of(git_dir: Path | str, sha: str) -> str | None:
    """The first parent of ``sha`` (None for a root commit or a missing object)."""
    out = git("rev-list", "--parents", "-n", "1", sha, git_dir=git_dir, check=False).split()
    return out[1] if len(out) > 1 else None


def kept_ref(task_id: int) -> str:
    """Where a failed task's head is kept when its worktree and branch are removed (a reset brings it back)."""
    return f"refs/agent/kept/task-{task_id}"


def _restore_kept_branch(mirror: Path, branch: str, task_id: int) -> None:
    """A reset task whose branch was removed gets it back at the kept head, so its recorded commits are there."""
    if git("branch", "--list", branch, git_dir=mirror).strip():
        return
    try:
        sha = git("rev-parse", "--verify", "--quiet", kept_ref(task_id), git_dir=mirror)
    except GitError:
        return
    git("branch", branch, sha, git_dir=mirror)
    git("update-ref", "-d", kept_ref(task_id), git_dir=mirror)


def remove_task_workspace(home: Path, repo: str, task_id: int, path: Path, branch: str | None,
                          keep_sha: str | None = None) -> None:
    """Remove a finished task's worktree and its local branch, then prune the mirror's worktree list.

    ``keep_sha`` (a failed task's head, which a human may still reset) is kept under ``kept_ref(task_id)``.
    The task's private vendor state (``vendor-state/task-N``: its lanes' sessions) goes with it.
    """
    shutil.rmtree(Path(home) / "vendor-state" / f"task-{task_id}", ignore_errors=True)
    mirror = mirror_path(home, repo)
    path = Path(path)
    if not (mirror / "HEAD").exists():   # no mirror (deleted by hand): only the folder is left to remove
        shutil.rmtree(path, ignore_errors=True)
        return
    if keep_sha:
        try:
            git("update-ref", kept_ref(task_id), keep_sha, git_dir=mirror)
        except GitError:
            pass  # the commit is gone already: nothing to keep
    try:
        git("worktree", "remove", "--force", str(path), git_dir=mirror)
    except GitError:
        shutil.rmtree(path, ignore_errors=True)
    git("worktree", "prune", git_dir=mirror, check=False)
    if branch and git("branch", "--list", branch, git_dir=mirror).strip():
        git("branch", "-D", branch, git_dir=mirror)


def walk_tree(root: Path, strip_setid: bool = False) -> tuple[int, list[str]]:
    """(bytes on disk under ``root``, files that had a setuid/setgid bit): one walk that never follows a link.
    With ``strip_setid`` the bits are removed (a lane of a root agent can leave a setuid-root shell behind)."""
    total, setid = 0, []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in filenames:
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            total += st.st_blocks * 512
            if stat.S_ISREG(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                setid.append(os.path.relpath(path, root))
                if strip_setid:
                    _clear_setid(path)
    return total, setid


def _clear_setid(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        if not os.path.islink(path):      # unreadable to us: chmod by name (no lane runs now; not a link)
            os.chmod(path, stat.S_IMODE(os.lstat(path).st_mode) & ~(stat.S_ISUID | stat.S_ISGID))
        return
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode):
            os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))
    finally:
        os.close(fd)


def disk_use(home: Path) -> dict:
    """Bytes and counts of task worktrees and mirrors under the home (what `status` and `doctor` show)."""

    def size(root: Path) -> int:
        return walk_tree(root)[0]

    out = {}
    for key, folder, pattern in (("worktrees", "worktrees", "task-*"), ("mirrors", "mirrors", "*.git")):
        found = sorted(p for p in (Path(home) / folder).glob(pattern) if p.is_dir())
        out[key] = {"count": len(found), "bytes": sum(size(p) for p in found)}
    return out


def human_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"
