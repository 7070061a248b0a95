"""Task claims with fencing tokens, the lease keeper, and named leases across runners.

- **Task claim**: ``tasks.claim_owner/claim_pid/claim_runner/claim_token/lease_until`` and ``tasks.fence``. A worker
  claims a task before advancing it (``take``: only when unclaimed or stale), renews the lease while a lane or check
  runs (``lease_keeper``), and passes its token to every write; the fencing check
  (``agent.ledger.leases.check_claim``) runs inside the write's transaction, so a worker that lost its claim writes
  nothing (LeaseLost). Every new claim increments ``fence``, so a task's tokens strictly increase. A claim is stale
  when its lease expired on the ledger's clock, or (in this pid scope only: this boot of this machine, this pid
  namespace) its pid is dead. ``take`` returns who held it before: the takeover hook.
- **Named lease**: ``named_lease(ledger, name)`` (``source:<key>`` around a source's pull, ``pr-open`` around the
  PR limits and the PR create) with a token checked by the write it guards (``leases.check_lease``). Stale, like
  a claim, when it expired or (in this pid scope only) its holder's pid is dead: a scan killed while holding it does
  not stall the next one for the lease's ttl.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from agent.coord import runners as _runners
from agent.coord.locks import SCAN_LEASE_S
from agent.coord.runners import owner_id, pid_alive, pid_scope, reopen, runner_id, _default_runner
from agent.ledger import Ledger, leases
from agent.ledger.clock import CLAIM_LEASE_S, claim_lease_s


LEASE_S = CLAIM_LEASE_S   # a task claim's lease (120 s), renewed every third of it while a lane or check runs


@dataclass(frozen=True)
class Claim:
    """A task claim this worker took. ``token`` is its fencing token (every write passes it). The ``previous_*``
    fields are the takeover hook: ``previous_runner`` is the runner that held the task last (its worktree lives in
    that runner's home), ``previous_token``/``previous_owner`` are set when that holder never released it (it died
    or stalled past its lease): its running lane runs are to be marked interrupted."""
    task_id: int
    token: str
    fence: int
    runner: str
    previous_runner: str | None = None
    previous_owner: str | None = None
    previous_token: str | None = None
    previous_lease_until: float | None = None

    @property
    def took_over(self) -> bool:
        """The previous holder did not release the task (dead, or stopped past its lease)."""
        return self.previous_token is not None

    @property
    def moved(self) -> bool:
        """The task was last held by another runner: its workspace is in that runner's home."""
        return self.previous_runner is not None and self.previous_runner != self.runner


def _stale(row: dict) -> bool:
    """A claim nobody holds: none, its lease ended (``expired``: judged by the ledger's clock in the statement
    that read the row), or its holder was a process of this pid scope that is gone. A holder elsewhere (another
    machine, container or boot, even with this hostname) is judged by its lease alone."""
    if not row["claim_token"] or row["expired"]:
        return True
    return row.get("claim_scope") == pid_scope() and not pid_alive(row["claim_pid"])


def take(ledger: Ledger, task_id: int, lease_s: float | None = None, runner: str | None = None) -> Claim | None:
    """Claim a task: only when it is unclaimed or its claim is stale (lease expired; or, in this pid scope, its pid is
    dead). The claiming UPDATE increments the task's fencing counter. Returns the Claim, or None while another
    live worker holds it."""
    runner = runner or _default_runner(ledger)
    lease_s = lease_s or claim_lease_s()
    with ledger.tx() as c:
        row = leases.claim_row(ledger, c, task_id)
        if row is None:
            return None
        if not _stale(row):
            return None
        fence = int(row["fence"] or 0) + 1
        token = leases.take_claim(ledger, c, task_id, fence, owner_id(), os.getpid(), runner, lease_s, pid_scope())
        if token is None:
            return None
        if row["claim_token"]:
            ledger.event(c, "task.claim_reclaimed", "script",
                         {"previous_owner": row["claim_owner"], "previous_pid": row["claim_pid"],
                          "previous_runner": row["claim_runner"], "previous_token": row["claim_token"],
                          "runner": runner, "token": token}, task_id=task_id)
    return Claim(task_id, token, fence, runner, previous_runner=row["claim_runner"],
                 previous_owner=row["claim_owner"] if row["claim_token"] else None,
                 previous_token=row["claim_token"] or None,
                 previous_lease_until=row["lease_until"] if row["claim_token"] else None)


def claim(ledger: Ledger, task_id: int, lease_s: float | None = None, runner: str | None = None) -> str | None:
    """Claim a task; returns the token, or None when another live worker holds it (see ``take``)."""
    got = take(ledger, task_id, lease_s, runner)
    return got.token if got else None


def renew(ledger: Ledger, task_id: int, token: str, lease_s: float | None = None,
          runner: str | None = None) -> bool:
    return leases.renew_claim(ledger, task_id, token, lease_s or claim_lease_s(), runner)


def release(ledger: Ledger, task_id: int, token: str) -> None:
    leases.release_claim(ledger, task_id, token)


def release_quietly(ledger: Ledger, task_id: int, token: str | None) -> None:
    """Release a claim from a ``finally``: a failure here must not hide what the worker raised (the lease expires)."""
    if token:
        try:
            release(ledger, task_id, token)
        except Exception:
            pass


class Keeper:
    """What ``lease_keeper`` yields: ``lost`` is set once a renewal found the claim gone."""

    def __init__(self) -> None:
        self.lost = threading.Event()


@contextmanager
def _renewing(open_ledger, period: float, renew, on_lost, name: str) -> Iterator[None]:
    """While the body runs, call ``renew(led)`` every ``period`` s from a background thread with its own
    connection (``open_ledger()``, opened when the first renewal is due: most steps end before it, and on
    PostgreSQL a connection is a server process); once it returns False, ``on_lost()`` runs and renewing stops.
    A renewal that raises (a busy or unreachable ledger) is tried again next time: the lease covers the gap."""
    stop = threading.Event()

    def loop() -> None:
        led = None
        try:
            while not stop.wait(period):
                try:
                    led = led or open_ledger()
                    if not renew(led):
                        on_lost()
                        return
                except Exception:
                    continue
        finally:
            if led is not None:
                led.close()

    thread = threading.Thread(target=loop, daemon=True, name=name)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)


@contextmanager
def lease_keeper(ledger_path: Path, task_id: int, token: str, lease_s: float | None = None,
                 runner: str | None = None) -> Iterator[Keeper]:
    """Renew a claim every lease/3 from a background thread (own connection) while the body runs, beating the
    runner with it. When a renewal finds the claim gone (the lease expired and another runner claimed the task),
    ``keeper.lost`` is set and the process groups the body's thread started (its lane or check) are killed: a
    worker that lost its lease stops its work at once; its writes are refused anyway (``check_claim``)."""
    from agent.infra import proc

    keeper = Keeper()
    worker = threading.get_ident()
    lease_s = lease_s or claim_lease_s()
    runner = runner or (runner_id(Path(ledger_path).parent) if isinstance(ledger_path, Path) else
                        _runners._PROCESS_RUNNER or runner_id(Path.cwd(), create=False))

    def lost() -> None:
        keeper.lost.set()
        proc.kill_groups_of(worker)

    try:
        with _renewing(lambda: Ledger.open(ledger_path, create=False), lease_s / 3,
                       lambda led: renew(led, task_id, token, lease_s, runner), lost, f"lease-{task_id}"):
            yield keeper
    finally:
        proc.resume_thread(worker)


class LeaseBusy(Exception):
    def __init__(self, name: str, holder: dict | None):
        self.name, self.holder = name, holder or {}
        who = self.holder.get("runner") or self.holder.get("holder") or "another runner"
        super().__init__(f"lease {name} is held by {who}")


def holder_gone(holder: str, scope: str | None) -> bool:
    """Whether a named lease's holder (``owner_id()@runner``, recorded in pid ``scope``) was a process of this pid
    scope that no longer runs."""
    owner = holder.split("@", 1)[0]
    pid = owner.partition(":")[2].split(":", 1)[0]
    return scope == pid_scope() and pid.isdigit() and not pid_alive(int(pid))


@contextmanager
def named_lease(ledger: Ledger, name: str, ttl: float = SCAN_LEASE_S, runner: str | None = None,
                wait: float = 0.0) -> Iterator[int]:
    """Hold the named lease ``name`` (e.g. ``source:<key>``, ``pr-open``) across runners for the body, renewed
    every ttl/3 from a background thread. Yields its fencing token (a write the lease guards checks it in its
    own transaction: ``leases.check_lease``). Raises LeaseBusy when another holder keeps it past ``wait`` s."""
    runner = runner or _default_runner(ledger)
    holder = f"{owner_id()}@{runner}"
    deadline = time.monotonic() + wait
    while True:
        token = leases.take_lease(ledger, name, holder, runner, ttl, scope=pid_scope())
        if token is None:
            # held by a process of this pid scope that is gone (killed mid-body): as with a task claim, its lease is
            # stale now, not at its expiry; taken only under the token we saw, so a live newcomer is never robbed
            row = leases.lease_row(ledger, name)
            if row is not None and row["holder"] and holder_gone(row["holder"], row["scope"]):
                token = leases.take_lease(ledger, name, holder, runner, ttl, stale_token=row["token"],
                                          scope=pid_scope())
        if token is not None:
            break
        if time.monotonic() >= deadline:
            raise LeaseBusy(name, leases.lease_row(ledger, name))
        time.sleep(0.05)
    try:
        with _renewing(lambda: reopen(ledger), ttl / 3, lambda led: leases.renew_lease(led, name, token, ttl),
                       lambda: None, f"lease-{name}"):
            yield token
    finally:
        try:
            leases.release_lease(ledger, name, token)
        except Exception:
            pass  # a lease we could not release expires with its ttl
