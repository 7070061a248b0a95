"""The one process runner: every child process the product starts (lanes, repo checks, version
probes) goes through ``run``.  Git itself goes through GitPython.

Guarantees:
- the child runs in its own session / process group (``start_new_session=True``), so a timeout
  (SIGTERM, then SIGKILL after ``grace``) takes down grandchildren too; anything the child left
  running in its group when it exits is killed as well;
- stdout / stderr stream to files with a size cap: the first ``max_bytes`` are kept, then a
  one-line truncation marker, then the last ``tail_bytes`` (a lane's final report is at the end);
- it never raises for a failing child: a missing or non-executable binary gives
  ``missing=True, exit_code=127`` (status "unavailable"), a timeout ``timed_out=True``. It raises the ``OSError``
  only when our own disk refuses the output (full, read-only): that is no verdict on the child.
"""

from __future__ import annotations

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
TRUNCATION_MARKER = "\n[agent: output truncated, {dropped} bytes dropped]\n"


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


class _Pump(threading.Thread):
    """Copies one pipe to a file: head up to max_bytes, then keeps a rolling tail."""

    def __init__(self, pipe, path: Path, max_bytes: int, tail_bytes: int,
                 on_line: Callable[[str], None] | None):
        super().__init__(daemon=True)
        self.pipe, self.path, self.max_bytes, self.tail_bytes = pipe, path, max_bytes, tail_bytes
        self.on_line = on_line
        self.written = 0
        self.dropped = 0
        self.tail: deque[bytes] = deque()
        self.tail_len = 0
        self.partial = b""
        self.write_error: OSError | None = None   # the disk refused the output (full, read-only): run() raises it

    def run(self) -> None:
        try:
            self._copy()
        except OSError as exc:  # keep draining the pipe so the child is not blocked on a full pipe
            self.write_error = exc
            try:
                while os.read(self.pipe.fileno(), 65536):
                    pass
            except OSError:
                pass
        try:
            self.pipe.close()
        except OSError:
            pass

    def _copy(self) -> None:
        with open(self.path, "wb") as out:
            while True:
                try:
                    chunk = os.read(self.pipe.fileno(), 65536)
                except OSError:
                    break
                if not chunk:
                    break
                room = self.max_bytes - self.written
                if room > 0:
                    out.write(chunk[:room])
                    self.written += min(room, len(chunk))
                rest = chunk[room:] if room > 0 else chunk
                if rest and room < len(chunk):
                    self.dropped += len(rest)
                    self.tail.append(rest)
                    self.tail_len += len(rest)
                    while self.tail and self.tail_len - len(self.tail[0]) >= self.tail_bytes:
                        self.tail_len -= len(self.tail.popleft())
                if self.on_line is not None:
                    self._lines(chunk)
            if self.dropped:
                tail = b"".join(self.tail)[-self.tail_bytes:] if self.tail_bytes else b""
                shown = len(tail)
                out.write(TRUNCATION_MARKER.format(dropped=self.dropped - shown).encode())
                out.write(tail)

    def _lines(self, chunk: bytes) -> None:
        data = self.partial + chunk
        *lines, self.partial = data.split(b"\n")
        self.partial = self.partial[-4096:]
        for raw in reversed(lines):
            text = raw.decode("utf-8", errors="replace").strip()
            if text:
                try:
                    self.on_line(text)
                except Exception:  # a progress display must never break a run
                    pass
                break


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


def kill_all(grace: float = 2.0) -> int:
    """Stop starting children, SIGTERM every running group, then SIGKILL what is left after ``grace``;
    returns how many groups there were."""
    _HALTED.set()
    groups = list(running())
    for pgid in groups:
        _kill_group(pgid, signal.SIGTERM)
    end = time.monotonic() + grace
    while any(_group_alive(g) for g in groups) and time.monotonic() < end:
        time.sleep(0.05)
    for pgid in groups:
        _kill_group(pgid, signal.SIGKILL)
    return len(groups)


def run(argv: Sequence[str], *, cwd: Path | str, env: dict[str, str] | None, timeout: float | None,
        stdin_path: Path | str | None = None, stdout_path: Path | str, stderr_path: Path | str,
        max_bytes: int = DEFAULT_MAX_BYTES, tail_bytes: int = DEFAULT_TAIL_BYTES,
        on_line: Callable[[str], None] | None = None, on_start: Callable[[int], None] | None = None,
        grace: float = 3.0, kill_leftovers: bool = True) -> ProcResult:
    """Run ``argv`` to completion or timeout; never raises for a failing child.

    ``env`` is the child's *whole* environment (build it with ``agent.lanes.env.lane_env``);
    ``None`` inherits ours (only for trusted helpers).  ``on_line(text)`` receives the latest
    non-empty output line (from a reader thread); ``on_start(pid)`` runs right after the start.
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

    if not argv:
        return not_started("empty command")
    if _HALTED.is_set():
        stdout_path.write_bytes(b"")
        stderr_path.write_text("not started: shutting down (kill_all)\n", encoding="utf-8")
        return ProcResult(exit_code=-signal.SIGKILL, timed_out=False, missing=False, duration_s=0.0, pid=None,
                          stdout_path=stdout_path, stderr_path=stderr_path, truncated=False,
                          error="not started: shutting down")
    stdin = None
    try:
        stdin = open(stdin_path, "rb") if stdin_path is not None else subprocess.DEVNULL
        proc = subprocess.Popen(argv, cwd=str(cwd), env=env, stdin=stdin, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True, close_fds=True)
    except FileNotFoundError as exc:
        if not os.path.isdir(str(cwd)):
            return not_started(f"working directory {cwd} does not exist")
        return not_started(f"{argv[0]}: command not found ({exc.strerror})")
    except PermissionError as exc:
        return not_started(f"{argv[0]}: not executable ({exc.strerror})")
    except OSError as exc:
        return not_started(f"{argv[0]}: cannot start ({exc.strerror or exc})")
    finally:
        if stdin is not None and stdin is not subprocess.DEVNULL:
            stdin.close()

    pgid = proc.pid  # start_new_session: the child leads its own group
    with _RUNNING_LOCK:
        _RUNNING[pgid] = os.path.basename(argv[0])
    try:
        return _supervise(proc, pgid, started, timeout, grace, kill_leftovers, stdout_path, stderr_path,
                          max_bytes, tail_bytes, on_line, on_start)
    finally:
        with _RUNNING_LOCK:
            _RUNNING.pop(pgid, None)


def _supervise(proc, pgid, started, timeout, grace, kill_leftovers, stdout_path, stderr_path, max_bytes,
               tail_bytes, on_line, on_start) -> ProcResult:
    pumps = [_Pump(proc.stdout, stdout_path, max_bytes, tail_bytes, on_line),
             _Pump(proc.stderr, stderr_path, max_bytes, tail_bytes, on_line)]
    for p in pumps:
        p.start()
    if on_start is not None:
        try:
            on_start(proc.pid)
        except Exception:
            # the caller could not record the pid: do not leave an unrecorded child running
            _kill_group(pgid, signal.SIGKILL)
            proc.wait()
            for p in pumps:
                p.join(5)
            raise

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
        # shell) would keep the pipes open and outlive the run: end them too.
        if _group_alive(pgid):
            _kill_group(pgid, signal.SIGTERM)
            end = time.monotonic() + grace
            while _group_alive(pgid) and time.monotonic() < end:
                time.sleep(0.05)
            _kill_group(pgid, signal.SIGKILL)
    for p in pumps:
        p.join(10)
    for p in pumps:
        if p.write_error is not None:  # not the child's failure: the disk is full or read-only; say so upstream
            raise p.write_error
    return ProcResult(exit_code=proc.returncode, timed_out=timed_out, missing=False,
                      duration_s=time.monotonic() - started, pid=proc.pid, stdout_path=stdout_path,
                      stderr_path=stderr_path, truncated=any(p.dropped for p in pumps))
