"""One file lock per scan and home.

- **Scan lock**: ``$AGENT_HOME/locks/<scan>.lock`` names its holder (pid and process start time, host, token) and
  carries a lease renewed by a heartbeat thread. Another scan is refused while the holder is live; a holder that
  died, whose pid now names another process, or that stopped beating (SIGSTOP) past its lease is replaced. The
  read-check-write of the file happens under a flock held for that moment only, never across a scan. It is per
  home: runners with their own homes are kept apart by the claims and leases in the shared ledger instead.
"""

from __future__ import annotations

import json
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from agent.coord.runners import HOST, pid_alive


SCAN_LEASE_S = 60.0   # a scan lock's holder must beat within this; a stopped or dead holder blocks no longer


def flock_within(fd: int, seconds: float, poll: float = 0.05) -> bool:
    """Take an exclusive flock on ``fd``, waiting at most ``seconds``; False if it stayed busy."""
    import fcntl

    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(poll)


class ScanBusy(Exception):
    pass


@dataclass
class ScanLock:
    token: str
    took_over: dict | None = None   # the stale holder this lock replaced (stopped past its lease, dead, pid reused)


def _read_holder(path: Path) -> dict | None:
    try:
        record = json.loads(path.read_text(errors="replace"))
    except FileNotFoundError:
        return None
    except ValueError:  # empty, half-written by a killed process, or an older agent's format: no live holder
        return None
    return record if isinstance(record, dict) and record.get("token") else None


def _write_holder(path: Path, record: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    tmp.write_text(json.dumps(record, sort_keys=True) + "\n")
    os.replace(tmp, path)  # readers see the old record or the new one, never half of one


def holder_live(record: dict, now: float | None = None) -> bool:
    """Whether a scan lock's recorded holder still holds it: its heartbeat is within its lease and, on this host,
    it is the very process that took it (pid and process start time: a reused pid is someone else)."""
    now = time.time() if now is None else now
    if now - float(record.get("heartbeat") or 0) > float(record.get("lease") or SCAN_LEASE_S):
        return False
    if record.get("host") != HOST:
        return True
    from agent.infra.proc import start_time

    pid = record.get("pid")
    return pid_alive(pid) and start_time(pid) == record.get("start")


@contextmanager
def _guard(folder: Path, name: str) -> Iterator[None]:
    """Serialise the read-check-write of one lock file. The flock is held only for that moment, never across a
    scan, so a stopped holder cannot keep it; waiting for it is bounded."""
    fd = os.open(folder / f"{name}.guard", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if not flock_within(fd, 5.0, poll=0.01):
            raise ScanBusy(f"scan {name}: its lock file stayed busy for 5 s")
        yield
    finally:
        os.close(fd)  # closing drops the flock


@contextmanager
def scan_lock(home: Path, name: str, lease: float = SCAN_LEASE_S) -> Iterator[ScanLock]:
    """Hold ``locks/<name>.lock`` for one scan, with a lease renewed by a heartbeat thread.

    Raises ScanBusy while another holder is live (``holder_live``). A holder that died, whose pid now names another
    process, or that stopped beating (SIGSTOP, a hung machine) for longer than its lease is replaced."""
    from agent.infra.proc import start_time

    folder = Path(home) / "locks"
    folder.mkdir(exist_ok=True)  # never parents: a home that does not exist is refused, not made here
    path = folder / f"{name}.lock"
    token = os.urandom(8).hex()
    with _guard(folder, name):
        held = _read_holder(path)
        if held and holder_live(held):
            age = time.time() - float(held.get("heartbeat") or 0)
            raise ScanBusy(f"scan {name} is already running (pid {held.get('pid')}, heartbeat {age:.0f}s ago)")
        now = time.time()
        record = {"pid": os.getpid(), "start": start_time(os.getpid()), "host": HOST, "token": token,
                  "since": now, "heartbeat": now, "lease": lease}
        _write_holder(path, record)
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(lease / 4):
            try:
                with _guard(folder, name):
                    current = _read_holder(path)
                    if not current or current.get("token") != token:
                        return  # replaced while we were stopped: the new holder owns it now
                    current["heartbeat"] = time.time()
                    _write_holder(path, current)
            except (ScanBusy, OSError):
                continue  # the next beat tries again; the lease covers a few missed ones

    thread = threading.Thread(target=beat, daemon=True, name=f"scan-lock-{name}")
    thread.start()
    try:
        yield ScanLock(token, took_over=held)
    finally:
        stop.set()
        thread.join(5)
        try:
            with _guard(folder, name):
                current = _read_holder(path)
                if current and current.get("token") == token:
                    path.unlink(missing_ok=True)
        except (ScanBusy, OSError):
            pass  # a lock we could not remove expires with its lease
