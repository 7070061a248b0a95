"""The execution fence: a per-task claim in the ledger, and a file lock per scan.

- **Task claim**: ``tasks.claim_owner/claim_pid/claim_token/lease_until``. A worker claims a task before advancing
  it, renews the lease while a lane or check runs, and passes its token to every write (``tasks._check_claim``
  checks it inside the same transaction), so a worker that lost its claim cannot write its result.
  A claim is stale when its lease expired or its pid is dead on this host; a stale claim is reclaimed.
- **Scan lock**: ``$AGENT_HOME/locks/<scan>.lock`` names its holder (pid and process start time, host, token) and
  carries a lease renewed by a heartbeat thread. Another scan is refused while the holder is live; a holder that
  died, whose pid now names another process, or that stopped beating (SIGSTOP) past its lease is replaced. The
  read-check-write of the file happens under a flock held for that moment only, never across a scan.
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

from agent.ledger import Ledger

LEASE_S = 120.0
SCAN_LEASE_S = 60.0   # a scan lock's holder must beat within this; a stopped or dead holder blocks no longer
HOST = os.uname().nodename  # = socket.gethostname(); socket + secrets cost ~7 ms of import on every tick


def owner_id() -> str:
    return f"{HOST}:{os.getpid()}:{threading.get_ident()}"


CRASHPOINT_ENV = "AGENT_CRASHPOINT"


def crashpoint(name: str) -> None:
    """Fault injection for tests: if ``$AGENT_CRASHPOINT`` equals ``name``, die at once with ``os._exit(137)``.

    It simulates a SIGKILL at an exact place (no finally blocks, no atexit, no flush), so the crash tests can
    prove that the next scan continues from there.  Never set in production; a no-op unless the env var matches.
    Names in use: ``commit.done``, ``commit.ref_pushed``, ``commit.recorded``, ``push.done``, ``pr.created``, ``lane.finished``.
    """
    if os.environ.get(CRASHPOINT_ENV) == name:
        os._exit(137)


def pid_alive(pid: int | None) -> bool:
    """Whether ``pid`` is a live process on this host (a zombie nobody reaped counts as dead)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # an orphan whose parent (PID 1 in some containers) never reaps it stays a zombie forever
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (OSError, IndexError):
        return True


def _stale(row: dict, now: float) -> bool:
    if not row["claim_token"]:
        return True
    if row["lease_until"] is not None and row["lease_until"] < now:
        return True
    owner = row["claim_owner"] or ""
    same_host = owner.split(":", 1)[0] == HOST
    return same_host and not pid_alive(row["claim_pid"])


def claim(ledger: Ledger, task_id: int, lease_s: float = LEASE_S) -> str | None:
    """Claim a task; returns the token, or None when another live worker holds it."""
    token = os.urandom(8).hex()
    with ledger.tx() as c:
        row = c.execute("SELECT claim_owner, claim_pid, claim_token, lease_until FROM tasks WHERE id = ?",
                        (task_id,)).fetchone()
        if row is None:
            return None
        row = dict(row)
        now = time.time()
        if not _stale(row, now):
            return None
        if row["claim_token"]:
            ledger.event(c, "task.claim_reclaimed", "script",
                         {"previous_owner": row["claim_owner"], "previous_pid": row["claim_pid"]}, task_id=task_id)
        ledger.update(c, "tasks", {"id": task_id}, {"claim_owner": owner_id(), "claim_pid": os.getpid(),
                                                    "claim_token": token, "lease_until": now + lease_s})
    return token


def renew(ledger: Ledger, task_id: int, token: str, lease_s: float = LEASE_S) -> bool:
    with ledger.tx() as c:
        return c.execute("UPDATE tasks SET lease_until = ? WHERE id = ? AND claim_token = ?",
                         (time.time() + lease_s, task_id, token)).rowcount == 1


def release(ledger: Ledger, task_id: int, token: str) -> None:
    with ledger.tx() as c:
        c.execute("UPDATE tasks SET claim_owner = NULL, claim_pid = NULL, claim_token = NULL, lease_until = NULL "
                  "WHERE id = ? AND claim_token = ?", (task_id, token))


@contextmanager
def lease_keeper(ledger_path: Path, task_id: int, token: str, lease_s: float = LEASE_S) -> Iterator[None]:
    """Renew a claim every lease/3 from a background thread (own connection) while the body runs."""
    stop = threading.Event()

    def loop() -> None:
        led = Ledger.open(ledger_path, create=False)
        try:
            while not stop.wait(lease_s / 3):
                if not renew(led, task_id, token, lease_s):
                    return
        finally:
            led.close()

    t = threading.Thread(target=loop, daemon=True, name=f"lease-{task_id}")
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(timeout=5)


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
    from agent.proc import start_time

    pid = record.get("pid")
    return pid_alive(pid) and start_time(pid) == record.get("start")


@contextmanager
def _guard(folder: Path, name: str) -> Iterator[None]:
    """Serialise the read-check-write of one lock file. The flock is held only for that moment, never across a
    scan, so a stopped holder cannot keep it; waiting for it is bounded."""
    import fcntl

    fd = os.open(folder / f"{name}.guard", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + 5.0
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ScanBusy(f"scan {name}: its lock file stayed busy for 5 s") from None
                time.sleep(0.01)
        yield
    finally:
        os.close(fd)  # closing drops the flock


@contextmanager
def scan_lock(home: Path, name: str, lease: float = SCAN_LEASE_S) -> Iterator[ScanLock]:
    """Hold ``locks/<name>.lock`` for one scan, with a lease renewed by a heartbeat thread.

    Raises ScanBusy while another holder is live (``holder_live``). A holder that died, whose pid now names another
    process, or that stopped beating (SIGSTOP, a hung machine) for longer than its lease is replaced."""
    from agent.proc import start_time

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
