"""The execution fence: a per-task claim in the ledger, and a file lock per scan.

- **Task claim**: ``tasks.claim_owner/claim_pid/claim_token/lease_until``. A worker claims a task before advancing
  it, renews the lease while a lane or check runs, and passes its token to every write (``tasks._check_claim``
  checks it inside the same transaction), so a worker that lost its claim cannot write its result.
  A claim is stale when its lease expired or its pid is dead on this host; a stale claim is reclaimed.
- **Scan lock**: ``$AGENT_HOME/locks/<scan>.lock`` held with ``fcntl.flock`` for the life of the scan, its content
  naming pid and token. The kernel drops a flock when its process dies, so a killed scan never leaves a lock behind;
  the pid/token content is for humans and `agent status`.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from agent.ledger import Ledger

LEASE_S = 120.0
HOST = os.uname().nodename  # = socket.gethostname(); socket + secrets cost ~7 ms of import on every tick


def owner_id() -> str:
    return f"{HOST}:{os.getpid()}:{threading.get_ident()}"


CRASHPOINT_ENV = "AGENT_CRASHPOINT"


def crashpoint(name: str) -> None:
    """Fault injection for tests: if ``$AGENT_CRASHPOINT`` equals ``name``, die at once with ``os._exit(137)``.

    It simulates a SIGKILL at an exact place (no finally blocks, no atexit, no flush), so the crash tests can
    prove that the next scan continues from there.  Never set in production; a no-op unless the env var matches.
    Names in use: ``commit.done``, ``commit.recorded``, ``push.done``, ``pr.created``, ``lane.finished``.
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


@contextmanager
def scan_lock(home: Path, name: str, wait: bool = False) -> Iterator[str]:
    """Hold ``locks/<name>.lock`` for one scan; raises ScanBusy if another live process holds it."""
    import fcntl

    folder = Path(home) / "locks"
    folder.mkdir(exist_ok=True)  # never parents: a home that does not exist is refused, not made here
    path = folder / f"{name}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            holder = path.read_text(errors="replace").strip()
            raise ScanBusy(f"scan {name} is already running ({holder or 'unknown holder'})") from None
        token = os.urandom(8).hex()
        os.ftruncate(fd, 0)
        os.write(fd, f"pid={os.getpid()} token={token} since={time.time():.0f}\n".encode())
        yield token
    finally:
        os.close(fd)  # closing drops the flock
