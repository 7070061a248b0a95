"""The one process runner: every child process the product starts (lanes, repo checks, version
probes) goes through ``run``; the agent's short git commands go through ``capture`` (via ``agent.git.workspace.git``).

Guarantees:
- the child runs in its own session / process group (``start_new_session=True``), so a timeout
  (SIGTERM, then SIGKILL after ``grace``) takes down grandchildren too; anything the child left
  running in its group when it exits is killed as well;
- the child writes stdout / stderr to files itself (no pipes: a double-forked grandchild holding a pipe can
  neither block the run nor lose its report); when it ends, a file over ``max_bytes`` is cut to its first
  ``max_bytes``, a one-line truncation marker and its last ``tail_bytes`` (a lane's final report is at the end);
  a file growing past ``hard_cap`` while it runs gets the child killed;
- it never raises for a failing child: a missing or non-executable binary gives
  ``missing=True, exit_code=127`` (status "unavailable"), a timeout ``timed_out=True``. It raises the ``OSError``
  only when our own disk refuses the output (full, read-only): that is no verdict on the child.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

DEFAULT_MAX_BYTES = 10 * 1024 * 1024
DEFAULT_TAIL_BYTES = 256 * 1024
DEFAULT_HARD_CAP = 1 << 30        # an output file past 1 GiB while the child runs: the child is killed
TRUNCATION_MARKER = "\n[agent: output truncated, {dropped} bytes dropped]\n"
# A child that waits for the agent's go: an argv element made by ``go_arg(payload)`` stands for the read end of a
# pipe whose only write end this process holds.  run() puts that end's number there, and once the child may go on
# (after ``gate``) writes the payload and closes the write end.  A sandbox reads it to its end right before its
# command starts (bwrap's ``--seccomp FD``: the payload is the lane's filter, agent/lanes/sandbox.py), so the work
# before the go overlaps the sandbox's start, and an agent that is gone before its go (SIGKILLed, maybe before bwrap
# armed its parent-death signal, which then never comes) leaves an empty payload, which bwrap refuses: the command
# never starts unsupervised.  The element holds a NUL, which no real argument can: run outside run(), it is refused.
GO_PREFIX = "\0agent-go:"


def go_arg(payload: bytes) -> str:
    """The argv element standing for the go pipe that carries ``payload`` (see GO_PREFIX)."""
    return GO_PREFIX + payload.hex()


# A child that needs work done in it between its fork and its exec (a lane's network namespace and its listening
# sockets, agent/lanes/egress.py): an argv element made by ``setup_arg(key, fn)`` names ``fn``, which run() calls
# in the child right before the exec (after setsid, with its stdio in place) and drops from the argv.  Like the go
# element it holds a NUL: an argv run anywhere but here is refused, never started without its set-up.  ``fn`` runs
# in a forked copy of a threaded process: no locks, no imports, no logging; it writes its own error to stderr and
# ends the child with ``os._exit`` rather than raise.  ``drop_setup(key)`` when its owner is done.
SETUP_PREFIX = "\0agent-setup:"
_SETUPS: dict[str, Callable[[], None]] = {}


def setup_arg(key: str, fn: Callable[[], None]) -> str:
    _SETUPS[key] = fn
    return SETUP_PREFIX + key


def drop_setup(key: str) -> None:
    _SETUPS.pop(key, None)


def _marked(argv: list[str], prefix: str) -> int | None:
    """The index of argv's element made by ``go_arg`` (GO_PREFIX) or ``setup_arg`` (SETUP_PREFIX), or None."""
    return next((i for i, a in enumerate(argv) if a.startswith(prefix)), None)


def _open_go(argv: list[str], at: int) -> tuple[int, int, bytes]:
    """A go pipe for argv's go element at ``at`` (which becomes its read end's number): (read end, write end,
    payload); both ends non-inheritable, so only a child given the read end in ``pass_fds`` has it."""
    payload = bytes.fromhex(argv[at][len(GO_PREFIX):])
    r, w = os.pipe()
    argv[at] = str(r)
    return r, w, payload


def take_setup(argv: list[str]) -> tuple[list[str], Callable[[], None] | None, bool]:
    """argv without its set-up element, the set-up it names (None: none), and False when it names one that is
    gone (its owner closed it)."""
    at = _marked(argv, SETUP_PREFIX)
    if at is None:
        return argv, None, True
    fn = _SETUPS.get(argv[at][len(SETUP_PREFIX):])
    return argv[:at] + argv[at + 1:], fn, fn is not None


@contextlib.contextmanager
def go_now(argv: Sequence[str]):
    """``(argv, pass_fds, preexec_fn)`` for a caller that starts the child itself (``subprocess``) and has nothing to
    overlap with its start: the go element (``go_arg``), if any, replaced by a pipe that already holds its payload,
    whose read end (in ``pass_fds``) closes when the block ends; the set-up (``setup_arg``) to run in the child."""
    argv, setup, found = take_setup([str(a) for a in argv])
    if not found:
        raise ValueError("the command's set-up is gone (its owner closed it)")
    at = _marked(argv, GO_PREFIX)
    if at is None:
        yield argv, (), setup
        return
    r, w, payload = _open_go(argv, at)
    try:
        os.write(w, payload)
    finally:
        os.close(w)
    try:
        yield argv, (r,), setup
    finally:
        os.close(r)


@dataclass
class ProcResult:
    exit_code: int | None          # None only when the process could not be waited for
    timed_out: bool
    missing: bool                  # binary not found / not executable (exit_code 127)
    duration_s: float
    pid: int | None
    stdout_path: Path
    stderr_path: Path
    truncated: bool
    error: str | None = None       # why the process could not start, if it did not

    @property
    def status(self) -> str:
        """ok | failed | timeout | unavailable"""
        if self.missing:
            return "unavailable"
        if self.timed_out:
            return "timeout"
        return "ok" if self.exit_code == 0 else "failed"

    def stdout_text(self, limit: int | None = None) -> str:
        return read_text(self.stdout_path, limit)

    def stderr_text(self, limit: int | None = None) -> str:
        return read_text(self.stderr_path, limit)

    def tail(self, chars: int = 4000) -> str:
        """The last ``chars`` characters of stdout, then stderr (for evidence and errors)."""
        out = read_tail(self.stdout_path, chars)
        err = read_tail(self.stderr_path, chars)
        if err.strip():
            return (out[-(chars // 2):] + ("\n--- stderr ---\n" if out else "") + err[-(chars // 2):]).strip("\n")
        return out


def system_binary(name: str) -> str | None:
    """A system tool on PATH or in /usr/bin (bwrap), or None."""
    import shutil

    for cand in (shutil.which(name), f"/usr/bin/{name}"):
        if cand and os.access(cand, os.X_OK):
            return cand
    return None


def open_new(path: Path | str):
    """``path`` opened for writing, empty, never through a symlink planted at its name (``O_NOFOLLOW``: a link
    there is replaced by a new file, never followed)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError:
        if not os.path.islink(path):
            raise
        os.unlink(path)
        fd = os.open(path, flags | os.O_EXCL, 0o600)
    return os.fdopen(fd, "wb")


def read_text(path: Path | str | None, limit: int | None = None) -> str:
    """A file's text (utf-8, undecodable bytes replaced); missing file -> ''."""
    if path is None:
        return ""
    try:
        with open(path, "rb") as fh:
            data = fh.read() if limit is None else fh.read(limit)
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace")


def read_tail(path: Path | str | None, chars: int) -> str:
    if path is None:
        return ""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - chars * 4))
            data = fh.read()
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace")[-chars:]


class _Follower(threading.Thread):
    """Watches a child's output files while it runs (one thread for all of them): hands the latest complete line of
    each to ``on_line`` and kills the child's group when a file grows past ``hard_cap`` (a disk-filling child).
    Never holds the child's output: the child writes the files itself, so no pipe exists that a grandchild could
    keep open."""

    INTERVAL = 0.2

    def __init__(self, paths: Sequence[Path], on_line: Callable[[str], None] | None, hard_cap: int, pgid: int):
        super().__init__(daemon=True)
        self.on_line, self.hard_cap, self.pgid = on_line, hard_cap, pgid
        self.files = [{"path": p, "offset": 0, "partial": b""} for p in paths]
        self.stop = threading.Event()
        self.over_cap = False

    def run(self) -> None:
        while not self.stop.wait(self.INTERVAL):
            self.poll()

    def poll(self) -> None:
        for f in self.files:
            self._poll(f)

    def _poll(self, f: dict) -> None:
        try:
            size = os.path.getsize(f["path"])
        except OSError:
            return
        if size > self.hard_cap and not self.over_cap:
            self.over_cap = True
            _kill_group(self.pgid, signal.SIGKILL)
        if self.on_line is None or size <= f["offset"]:
            return
        old = f["offset"]
        start = max(old, size - 65536)
        try:
            with open(f["path"], "rb") as fh:
                fh.seek(start)
                data = fh.read(size - start)
        except OSError:
            return
        f["offset"] = start + len(data)
        data = (f["partial"] if start == old else b"") + data
        *lines, partial = data.split(b"\n")
        f["partial"] = partial[-4096:]
        for raw in reversed(lines):
            text = raw.decode("utf-8", errors="replace").strip()
            if text:
                try:
                    self.on_line(text)
                except Exception:  # a progress display must never break a run
                    pass
                break


MIN_FREE_BYTES = 256 * 1024


def require_room(folder: Path) -> None:
    """Raise OSError(ENOSPC) when the file system holding ``folder`` is (nearly) full: a child's output written
    there could be lost without anyone seeing an error, and that is no verdict on the child."""
    import errno

    try:
        st = os.statvfs(folder)
    except OSError:
        return
    if st.f_bavail * st.f_frsize < MIN_FREE_BYTES:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder))


def _compact(path: Path, max_bytes: int, tail_bytes: int) -> bool:
    """Cut a finished output file to its first ``max_bytes``, a marker, and its last ``tail_bytes``."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return False
    if size <= max_bytes:
        return False
    with open(path, "r+b") as fh:
        keep = min(tail_bytes, size - max_bytes)
        fh.seek(size - keep)
        tail = fh.read(keep) if keep else b""
        fh.seek(max_bytes)
        fh.write(TRUNCATION_MARKER.format(dropped=size - max_bytes - len(tail)).encode())
        fh.write(tail)
        fh.truncate()
    return True


def _kill_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process remains in the group.  Zombies whose parent does not
    reap them (PID 1 in some containers) answer killpg(0) but hold nothing open."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


# Process groups started by run() and not yet finished: kill_all() ends them (daemon's second signal).
_RUNNING: dict[int, str] = {}
_STARTED_BY: dict[int, int] = {}   # pgid -> the thread that started it (kill_groups_of: a lease keeper's worker)
_RUNNING_LOCK = threading.Lock()


def running() -> dict[int, str]:
    """pgid -> program name of every process group run() is currently waiting for."""
    with _RUNNING_LOCK:
        return dict(_RUNNING)


# Set by kill_all: the process is shutting down, so run() starts no new child (a lane's repair turn, the next
# check) and answers at once as if it had been killed; halted() lets callers tell that from a real failure.
_HALTED = threading.Event()


def halted() -> bool:
    return _HALTED.is_set()


def resume_starting() -> None:
    """Undo kill_all's halt (the daemon calls it when it returns, for in-process callers and tests)."""
    _HALTED.clear()


_HALTED_THREADS: set[int] = set()   # threads whose work was stopped (kill_groups_of): run() starts nothing for them


def kill_groups_of(thread_ident: int, grace: float = 2.0) -> int:
    """SIGTERM, then SIGKILL after ``grace``, every running group that thread ``thread_ident`` started (a worker
    whose task lease was lost: its lane or check must not go on), and start no new child for that thread (a lane's
    repair turn) until ``resume_thread``. Returns how many groups there were."""
    with _RUNNING_LOCK:
        _HALTED_THREADS.add(thread_ident)
        groups = [g for g, t in _STARTED_BY.items() if t == thread_ident and g in _RUNNING]
    return _terminate(groups, grace)


def _terminate(groups: list[int], grace: float) -> int:
    """SIGTERM each process group, SIGKILL what is still alive after ``grace``; returns how many there were."""
    for pgid in groups:
        _kill_group(pgid, signal.SIGTERM)
    end = time.monotonic() + grace
    while any(_group_alive(g) for g in groups) and time.monotonic() < end:
        time.sleep(0.05)
    for pgid in groups:
        _kill_group(pgid, signal.SIGKILL)
    return len(groups)


def resume_thread(thread_ident: int) -> None:
    """Undo kill_groups_of's halt for that thread (its lease keeper's body ended)."""
    with _RUNNING_LOCK:
        _HALTED_THREADS.discard(thread_ident)


def kill_all(grace: float = 2.0) -> int:
    """Stop starting children, SIGTERM every running group, then SIGKILL what is left after ``grace``;
    returns how many groups there were."""
    _HALTED.set()
    groups = list(running())
    return _terminate(groups, grace)


def run(argv: Sequence[str], *, cwd: Path | str, env: dict[str, str] | None, timeout: float | None,
        stdin_path: Path | str | None = None, stdout_path: Path | str, stderr_path: Path | str,
        max_bytes: int = DEFAULT_MAX_BYTES, tail_bytes: int = DEFAULT_TAIL_BYTES,
        on_line: Callable[[str], None] | None = None, on_start: Callable[[int], None] | None = None,
        grace: float = 3.0, kill_leftovers: bool = True, pass_fds: Sequence[int] = (),
        hard_cap: int = DEFAULT_HARD_CAP, gate: Callable[[], None] | None = None) -> ProcResult:
    """Run ``argv`` to completion or timeout; never raises for a failing child.

    ``env`` is the child's *whole* environment (build it with ``agent.infra.env.lane_env``);
    ``None`` inherits ours (only for trusted helpers).  ``on_line(text)`` receives the latest
    non-empty output line (from a reader thread); ``on_start(pid)`` runs right after the start.
    ``gate()``: work that must be done before the child's command runs but may overlap its start: with a go pipe
    (``go_arg``: a sandbox that waits for its go) it runs while the child comes up, else before the child starts.
    What it raises ends the child's group (its command never ran) and is raised here.  An argv naming a set-up
    (``setup_arg``) runs it in the child before the exec.
    """
    stdout_path, stderr_path = Path(stdout_path), Path(stderr_path)
    stdout_path.parent.mkdir(parents=True, exist_ok=True)
    stderr_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    argv = [str(a) for a in argv]

    def not_started(msg: str) -> ProcResult:
        stdout_path.write_bytes(b"")
        stderr_path.write_text(msg + "\n", encoding="utf-8")
        return ProcResult(exit_code=127, timed_out=False, missing=True, duration_s=time.monotonic() - started,
                          pid=None, stdout_path=stdout_path, stderr_path=stderr_path, truncated=False, error=msg)

    argv, setup, found = take_setup(argv)
    if not found:
        return not_started("not started: its set-up is gone (the lane turn that made it ended)")
    if not argv:
        return not_started("empty command")
    if _HALTED.is_set() or threading.get_ident() in _HALTED_THREADS:
        stdout_path.write_bytes(b"")
        stderr_path.write_text("not started: shutting down (kill_all), or its task lease was lost\n", encoding="utf-8")
        return ProcResult(exit_code=-signal.SIGKILL, timed_out=False, missing=False, duration_s=0.0, pid=None,
                          stdout_path=stdout_path, stderr_path=stderr_path, truncated=False,
                          error="not started: shutting down")
    go_at = _marked(argv, GO_PREFIX)
    if gate is not None and go_at is None:
        gate()                           # nothing holds the command back: before the start
        gate = None
    # the child writes its output files itself: nothing here waits on a pipe a grandchild could hold open.  Our own
    # disk refusing them (read-only, full) is raised: no verdict on the child.
    require_room(stdout_path.parent)
    out_fh = open_new(stdout_path)
    err_fh = open_new(stderr_path)
    stdin = proc = None
    go = payload = None
    if go_at is not None:
        *go, payload = _open_go(argv, go_at)
        pass_fds = (*pass_fds, go[0])
    try:
        stdin = open(stdin_path, "rb") if stdin_path is not None else subprocess.DEVNULL
        proc = subprocess.Popen(argv, cwd=str(cwd), env=env, stdin=stdin, stdout=out_fh, stderr=err_fh,
                                start_new_session=True, close_fds=True, pass_fds=pass_fds, preexec_fn=setup)
    except FileNotFoundError as exc:
        if not os.path.isdir(str(cwd)):
            return not_started(f"working directory {cwd} does not exist")
        return not_started(f"{argv[0]}: command not found ({exc.strerror})")
    except PermissionError as exc:
        return not_started(f"{argv[0]}: not executable ({exc.strerror})")
    except OSError as exc:
        return not_started(f"{argv[0]}: cannot start ({exc.strerror or exc})")
    finally:
        if go is not None:
            os.close(go[0])
            if proc is None:             # not started: nobody to wait for the go
                os.close(go[1])
        if stdin is not None and stdin is not subprocess.DEVNULL:
            stdin.close()
        for fh in (out_fh, err_fh):
            if fh is not None:
                fh.close()

    pgid = proc.pid  # start_new_session: the child leads its own group
    with _RUNNING_LOCK:
        _RUNNING[pgid] = os.path.basename(argv[0])
        _STARTED_BY[pgid] = threading.get_ident()
    go_open = [go is not None]

    def release() -> None:
        if gate is not None:
            gate()
        if go is not None:
            try:
                os.write(go[1], payload)     # one write of at most PIPE_BUF bytes: whole or nothing
            except OSError:              # the child is gone already (bwrap failed): its result says why
                pass
            go_open[0] = False
            os.close(go[1])

    try:
        return _supervise(proc, pgid, started, timeout, grace, kill_leftovers, stdout_path, stderr_path,
                          max_bytes, tail_bytes, on_line, on_start, hard_cap, release)
    finally:
        if go_open[0]:                   # no go (the gate raised): end of file with no payload
            os.close(go[1])
        with _RUNNING_LOCK:
            _RUNNING.pop(pgid, None)
            _STARTED_BY.pop(pgid, None)


def _supervise(proc, pgid, started, timeout, grace, kill_leftovers, stdout_path, stderr_path, max_bytes,
               tail_bytes, on_line, on_start, hard_cap, release) -> ProcResult:
    follower = _Follower([stdout_path, stderr_path], on_line, hard_cap, pgid)
    try:
        if on_start is not None:
            on_start(proc.pid)
        release()
    except BaseException:
        # the caller could not record the pid or do what must precede the command: no child runs on unrecorded
        # or unguarded (a sandbox still waiting for its go never started the command)
        _kill_group(pgid, signal.SIGKILL)
        proc.wait()
        raise
    follower.start()                     # after the go: a thread's start is not on the command's way

    timed_out = False
    # Popen.wait(timeout=...) polls with sleeps of up to 50 ms, which added ~25 ms to every lane and check;
    # a thread blocked in waitpid wakes the moment the child exits.
    waiter = threading.Thread(target=proc.wait, daemon=True)
    waiter.start()
    waiter.join(None if timeout is None else max(0.0, timeout))
    if waiter.is_alive():
        timed_out = True
        _kill_group(pgid, signal.SIGTERM)
        waiter.join(grace)
        _kill_group(pgid, signal.SIGKILL)
        waiter.join()
    if timed_out or kill_leftovers:
        # Grandchildren still in the group (backgrounded servers, a sleeping child of a killed
        # shell) would outlive the run: end them too.  (A sandboxed lane's setsid grandchildren die with its
        # PID namespace; see agent.lanes.sandbox.)
        if _group_alive(pgid):
            _kill_group(pgid, signal.SIGTERM)
            end = time.monotonic() + grace
            while _group_alive(pgid) and time.monotonic() < end:
                time.sleep(0.05)
            _kill_group(pgid, signal.SIGKILL)
    follower.stop.set()
    follower.join(5)
    follower.poll()       # the last lines written before the exit
    truncated = [_compact(p, max_bytes, tail_bytes) for p in (stdout_path, stderr_path)]
    require_room(stdout_path.parent)     # a disk that filled up while it ran may have cut its output short
    return ProcResult(exit_code=proc.returncode, timed_out=timed_out, missing=False,
                      duration_s=time.monotonic() - started, pid=proc.pid, stdout_path=stdout_path,
                      stderr_path=stderr_path, truncated=any(truncated) or follower.over_cap)


# ---------------------------------------------------------------------------- short commands kept in memory


@dataclass
class Captured:
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False
    raw: bytes = b""          # stdout as bytes (a file git shows, decoded by its reader: agent.infra.textio)


def capture(argv: Sequence[str], *, cwd: Path | str | None, env: dict[str, str], timeout: float | None = 120,
            input: bytes | None = None) -> Captured:
    """Run a short trusted command (git) with exactly ``env`` and keep its output in memory.

    Its own session, so a timeout kills its whole group; a missing binary is exit 127.  Used for the agent's
    hardened git (agent.git.workspace.git), whose output is small and must not touch the disk (push sees a token).
    """
    argv = [str(a) for a in argv]
    try:
        proc = subprocess.Popen(argv, cwd=None if cwd is None else str(cwd), env=env,
                                stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                close_fds=True)
    except OSError as exc:
        return Captured(127, "", f"{argv[0]}: cannot start ({exc.strerror or exc})")
    with _RUNNING_LOCK:
        _RUNNING[proc.pid] = os.path.basename(argv[0])
    try:
        out, err = proc.communicate(input, timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        timed_out = True
    finally:
        with _RUNNING_LOCK:
            _RUNNING.pop(proc.pid, None)
    return Captured(proc.returncode if not timed_out else -signal.SIGKILL, out.decode("utf-8", "replace"),
                    err.decode("utf-8", "replace"), timed_out, out)


class Helper:
    """A long-lived trusted helper the agent starts and stops (the daemon's fork server): its own session (a Ctrl-C
    at the agent's terminal is the agent's to pass on), stdin a pipe whose only write end the agent holds (the
    helper ends when it reads EOF there: the agent stopped or died), stdout discarded, stderr the agent's."""

    def __init__(self, argv: Sequence[str], env: dict[str, str] | None = None):
        self.proc = subprocess.Popen([str(a) for a in argv], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, start_new_session=True, close_fds=True)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace: float = 5.0) -> int | None:
        """Close its lifeline, wait up to ``grace`` seconds, then SIGKILL it (only it: what it started for others
        runs on); its exit status."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            return self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


# ---------------------------------------------------------------------------- process identity


def start_time(pid: int | None) -> int | None:
    """The start time of ``pid`` (clock ticks since boot, /proc/PID/stat field 22), or None if there is no
    such process.  A pid plus its start time names one process for good: a reused pid has another start."""
    if not pid or pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        return int(fields[19])          # field 22 overall; fields[0] is field 3 (state)
    except (OSError, IndexError, ValueError):
        return None


def same_process(pid: int | None, started: int | None) -> bool:
    """Whether ``pid`` is still the very process recorded with start time ``started`` (and not a zombie).
    Without a recorded start time nothing can be proven, so the answer is False (never act on a guess)."""
    if not pid or started is None:
        return False
    now = start_time(pid)
    if now is None or now != int(started):
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def kill_group_if_same(pid: int, started: int | None, grace: float = 3.0) -> bool:
    """SIGTERM, then SIGKILL after ``grace``, the process group led by ``pid``, but only while ``pid`` is
    still the process recorded with ``started``; a pidfd pins it between the check and the signal.
    Returns whether anything was signalled."""
    if not same_process(pid, started):
        return False
    try:
        fd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        fd = None
    try:
        if not same_process(pid, started):      # checked again now that the pidfd pins the process
            return False
        for sig in (signal.SIGTERM, signal.SIGKILL):
            _kill_group(pid, sig)
            end = time.monotonic() + grace
            while same_process(pid, started) and time.monotonic() < end:
                time.sleep(0.05)
            if not same_process(pid, started):
                break
        return True
    finally:
        if fd is not None:
            os.close(fd)
