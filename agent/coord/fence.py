"""The execution fence: runners, per-task claims with fencing tokens, named leases, and a file lock per scan.

- **Runner**: a home on a machine, with an id (``$AGENT_RUNNER_ID`` or ``<hostname>:<hash of the machine id and
  the home>``) and a heartbeat in the ledger's ``runners`` table (on the ledger's clock, with the runner's clock
  offset), beaten by every scan, daemon pass and lease keeper (``beat``); a clean stop marks it stopped (``stop``).
  Alive, stopped, dead (this machine: its pid with its start time is gone) or silent (another machine, no heartbeat):
  ``runner_view``.
- **Task claim**: ``tasks.claim_owner/claim_pid/claim_runner/claim_token/lease_until`` and ``tasks.fence``. A worker
  claims a task before advancing it (``take``: only when unclaimed or stale), renews the lease while a lane or check
  runs (``lease_keeper``), and passes its token to every write; the fencing check
  (``agent.ledger.leases.check_claim``) runs inside the write's transaction, so a worker that lost its claim writes
  nothing (LeaseLost). Every new claim increments ``fence``, so a task's tokens strictly increase. A claim is stale
  when its lease expired on the ledger's clock, or (in this pid scope only: this boot of this machine, this pid
  namespace) its pid is dead. ``take`` returns who held it before: the takeover hook.
- **Named lease**: ``named_lease(ledger, name)`` (``source:<key>`` around a source's pull, ``pr-open`` around the
  PR limits and the PR create) with a token checked by the write it guards (``ledger.check_lease``). Stale, like
  a claim, when it expired or (in this pid scope only) its holder's pid is dead: a scan killed while holding it does
  not stall the next one for the lease's ttl.
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

from agent.ledger import Ledger
from agent.ledger.clock import CLAIM_LEASE_S, claim_lease_s

LEASE_S = CLAIM_LEASE_S   # a task claim's lease (120 s), renewed every third of it while a lane or check runs
SCAN_LEASE_S = 60.0   # a scan lock's holder must beat within this; a stopped or dead holder blocks no longer
HOST = os.uname().nodename  # = socket.gethostname(); socket + secrets cost ~7 ms of import on every tick
RUNNER_ENV = "AGENT_RUNNER_ID"
STALE_AFTER = 3  # a runner whose heartbeat is older than this many task leases is shown as stale
SKEW_WARN_S = 5.0   # a runner whose clock is further than this off the ledger's is flagged (and logs it once)
MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")
HOME_ID_FILE = "runner.id"   # a random id made in the home at its first start: tells apart machines and containers


def owner_id() -> str:
    return f"{HOST}:{os.getpid()}:{threading.get_ident()}"


CRASHPOINT_ENV = "AGENT_CRASHPOINT"


def crashpoint(name: str) -> None:
    """Fault injection for tests: if ``$AGENT_CRASHPOINT`` equals ``name``, die at once with ``os._exit(137)``.

    It simulates a SIGKILL at an exact place (no finally blocks, no atexit, no flush), so the crash tests can
    prove that the next scan continues from there.  Never set in production; a no-op unless the env var matches.
    Names in use: ``commit.done``, ``commit.ref_pushed``, ``commit.recorded``, ``push.done``, ``pr.created``, ``lane.finished``, ``proof.recorded``.
    """
    if os.environ.get(CRASHPOINT_ENV) == name:
        os._exit(137)


PAUSEPOINT_ENV = "AGENT_PAUSEPOINT"


def pausepoint(name: str) -> None:
    """Fault injection for tests: if ``$AGENT_PAUSEPOINT`` is ``name:SECONDS``, sleep that long here (it widens a
    window two runners could race in, so a test can show the window is closed). A no-op unless it matches.
    Names in use: ``pr.limits_checked``."""
    spec = os.environ.get(PAUSEPOINT_ENV)
    if spec and spec.rpartition(":")[0] == name:
        try:
            time.sleep(float(spec.rpartition(":")[2]))
        except ValueError:
            pass


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



# --------------------------------------------------------------------------- runners


_SCOPE: str | None = None


def pid_scope() -> str:
    """Where a pid means something: this kernel boot (``boot_id``, random per boot, so another machine never has
    it) and this pid namespace (a container sees its own pids). Only a holder recorded with this very scope is
    judged by its pid; any other is judged by its lease alone."""
    global _SCOPE
    if _SCOPE is None:
        try:
            with open("/proc/sys/kernel/random/boot_id") as fh:
                boot = fh.read().strip()
        except OSError:
            boot = f"{HOST}?"
        try:
            ns = os.readlink("/proc/self/ns/pid")
        except OSError:
            ns = "pid:?"
        _SCOPE = f"{boot}/{ns}"
    return _SCOPE


_MACHINE: str | None = None


def machine_id() -> str:
    """The machine's id (``/etc/machine-id``), or "" where there is none (some containers)."""
    global _MACHINE
    if _MACHINE is None:
        _MACHINE = _read_machine_id()
    return _MACHINE


def _read_machine_id() -> str:
    for path in MACHINE_ID_FILES:
        try:
            with open(path) as fh:
                text = fh.read(100).strip()
        except OSError:
            continue
        if text and all(ch in "0123456789abcdef" for ch in text.lower()):
            return text.lower()
    return ""


def home_id(home: Path | str, create: bool = False) -> str:
    """The random id kept in the home (``runner.id``, made the first time the home's runner id is asked): two
    machines or containers with the same hostname, machine id (a cloned image) and home path still differ by it.
    Read without following links; "" when there is none (yet)."""
    path = Path(home).expanduser() / HOME_ID_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd) as fh:
            text = fh.read(100).strip()
        if len(text) == 32 and all(ch in "0123456789abcdef" for ch in text):
            return text
    except OSError:
        pass
    if not create or not path.parent.is_dir():
        return ""
    made = os.urandom(16).hex()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:   # another process of this home made it first (or a bad file is there): read again
        return home_id(home, create=False)
    except OSError:
        return ""
    with os.fdopen(fd, "w") as fh:
        fh.write(made + "\n")
    return made


def runner_id(home: Path | str, create: bool = True) -> str:
    """This runner's id: ``$AGENT_RUNNER_ID`` if set, else ``<hostname>:<CRC-32 of the machine id, the home's
    random id and the home's path, 8 hex>``: one home on one machine is one runner; two homes on one machine, or
    two machines (or containers) with the same hostname and home path, are two runners."""
    given = os.environ.get(RUNNER_ENV)
    if given is not None:
        given = given.strip()
        if not given or len(given) > 100 or any(ch.isspace() or not ch.isprintable() for ch in given):
            from agent import AgentError

            raise AgentError(f"{RUNNER_ENV}={given[:40]!r} is not a runner id; use 1-100 printable characters "
                             "without spaces (or unset it for <hostname>:<hash of the home>)")
        return given
    import zlib   # not hashlib: its OpenSSL import costs ~2.5 ms on every cron tick; this only tells runners apart

    where = str(Path(home).expanduser().resolve())
    key = "\0".join((machine_id(), home_id(where, create), where))
    return f"{HOST}:{zlib.crc32(key.encode()):08x}"


_PROCESS_RUNNER: str | None = None   # the runner this process last beat for (its home's)


def _default_runner(ledger: Ledger) -> str:
    """The runner a caller that did not name one acts for: ``$AGENT_RUNNER_ID``; else a SQLite ledger's home;
    else (a ledger URL names no home) the runner this process beat for; else the working directory's."""
    where = getattr(ledger, "location", None) or getattr(ledger, "path", None)
    if os.environ.get(RUNNER_ENV) is None and not isinstance(where, Path) and _PROCESS_RUNNER:
        return _PROCESS_RUNNER
    if isinstance(where, Path):
        return runner_id(where.parent)
    return runner_id(Path.cwd(), create=False)   # never leaves a file in the working directory


def reopen(ledger: Ledger) -> Ledger:
    """Another connection to the same ledger (a background thread's own)."""
    return Ledger.open(getattr(ledger, "location", None) or ledger.path, create=False)


_SKEW_LOGGED = False


def skew_line(rid: str, offset: float | None) -> str | None:
    """The warning for a runner whose clock is more than SKEW_WARN_S off the ledger's, or None."""
    if offset is None or abs(offset) <= SKEW_WARN_S:
        return None
    return (f"runner {rid}: this machine's clock is {abs(offset):.1f}s {'ahead of' if offset > 0 else 'behind'} "
            "the ledger's; leases use the ledger's clock, but fix the time sync (`timedatectl`, chrony/ntpd)")


def beat(ledger: Ledger, home: Path | str, echo=None) -> str:
    """Register this runner (first time) or beat its heartbeat; every scan, daemon tick and lease keeper does.
    The ledger records how far this machine's clock is off its own; past SKEW_WARN_S the process says so once
    (``echo``, else stderr). Returns the runner id."""
    from agent import __version__
    from agent.infra.proc import start_time

    global _PROCESS_RUNNER, _SKEW_LOGGED
    rid = runner_id(home)
    _PROCESS_RUNNER = rid
    got = ledger.beat_runner({"id": rid, "host": HOST, "home": str(Path(home).expanduser().resolve()),
                              "pid": os.getpid(), "pid_start": start_time(os.getpid()), "version": __version__,
                              "machine": machine_id() or None, "scope": pid_scope()})
    line = skew_line(rid, got.get("clock_offset_s") if isinstance(got, dict) else None)
    if line and not _SKEW_LOGGED:
        _SKEW_LOGGED = True
        if echo is not None:
            echo(line)
        else:
            import sys

            print(f"agent: {line}", file=sys.stderr, flush=True)
    return rid


def stop(ledger: Ledger, home: Path | str) -> bool:
    """A clean stop (the daemon's end, a watch run's end): mark this runner stopped, unless another process of
    it beat since. Never raises (a ledger that is gone: the runner shows as dead or silent instead)."""
    try:
        return ledger.stop_runner(runner_id(home), os.getpid())
    except Exception:   # noqa: BLE001 - stopping must not fail on the ledger
        return False


def _iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    from datetime import datetime, timezone

    return datetime.fromtimestamp(float(epoch), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def stale_after_s() -> float:
    """A runner whose heartbeat is older than this is stale: STALE_AFTER task claim leases (6 min by default).
    A live runner beats at least every third of a lease while a lane or check runs (the lease keeper), at every
    daemon pass (60 s by default) and while the daemon waits between passes (every lease), so only a runner that
    stopped or lost the ledger goes that long; it also spans cron's 5-minute `agent watch all`."""
    return STALE_AFTER * claim_lease_s()


def runners(ledger: Ledger) -> list[dict]:
    """Every runner sharing the ledger, as ``runner_view`` shows it (judged on the ledger's clock)."""
    return runner_view(ledger.runner_rows(), ledger.held_claims(), ledger.held_leases(), ledger.clock_now())


def _ago(seconds: float) -> str:
    from agent.domain.wording import ago

    return ago(seconds)


def runner_state(r: dict, age: float) -> tuple[str, str]:
    """(state, why) of a runner row: ``stopped`` (a clean stop recorded, no heartbeat since), ``alive``/``dead``
    in this pid scope (its pid with its recorded start time runs, or not; a live pid that stopped beating is
    ``silent``), ``alive``/``silent`` elsewhere (a heartbeat within the stale threshold, or not)."""
    from agent.infra.proc import same_process, start_time

    stale_s = stale_after_s()
    if r.get("stopped_at") is not None and float(r["stopped_at"]) >= float(r["heartbeat_at"] or 0):
        return "stopped", f"stopped cleanly {_ago(age)} ago"
    if r.get("scope") and r["scope"] == pid_scope():
        pid = r["pid"]
        if not same_process(pid, r["pid_start"]):
            gone = start_time(pid) is None or not pid_alive(pid)
            return "dead", (f"pid {pid} is gone from this machine" if gone else
                            f"pid {pid} is now another process on this machine") + " without a clean stop"
        if age > stale_s:
            return "silent", f"pid {pid} runs but has not beaten for {_ago(age)} (stopped or hung?)"
        return "alive", f"pid {pid} runs on this machine"
    if age > stale_s:
        return "silent", f"no heartbeat for {_ago(age)} (stale after {_ago(stale_s)})"
    return "alive", f"heartbeat {_ago(age)} ago (another machine: judged by its heartbeat)"


def runner_view(rows: list[dict], claims: list[dict], leases: list[dict], now: float | None = None) -> list[dict]:
    """Every runner: id, host, home, pid, ``heartbeat_at`` (UTC) and its age, ``state`` (alive, stopped, dead,
    silent) with ``why``, ``alive`` (state is alive), ``clock_offset_s`` and ``clock_skewed`` (more than
    SKEW_WARN_S off the ledger's clock), ``machine``, the ``tasks`` it holds (task id, state, lease expiry,
    whether that expired, seconds left) and the named ``leases`` it holds (name, token, expiry, whether that
    expired). ``now`` is the ledger's time (`agent doctor` reads the rows through its own read-only
    connection)."""
    now = time.time() if now is None else now
    held: dict[str, list[dict]] = {}
    for c in claims:
        held.setdefault(c["claim_runner"] or "?", []).append(
            {"task_id": c["task_id"], "state": c["state"], "lease_until": _iso(c["lease_until"]),
             "lease_expired": c["lease_until"] is not None and c["lease_until"] < now,
             "lease_left_s": None if c["lease_until"] is None else round(float(c["lease_until"]) - now, 1)})
    named: dict[str, list[dict]] = {}
    for lease in leases:
        named.setdefault(lease["runner"] or "?", []).append(
            {"name": lease["name"], "token": lease["token"], "until": _iso(lease["until"]),
             "expired": lease["until"] is not None and lease["until"] < now,
             "left_s": None if lease["until"] is None else round(float(lease["until"]) - now, 1)})
    out = []
    for r in rows:
        age = max(0.0, now - float(r["heartbeat_at"] or 0))
        state, why = runner_state(r, age)
        offset = r.get("clock_offset_s")
        out.append({"id": r["id"], "host": r["host"], "home": r["home"], "pid": r["pid"],
                    "version": r["version"], "started_at": r["started_at"], "heartbeat_at": _iso(r["heartbeat_at"]),
                    "heartbeat_age_s": round(age, 1), "alive": state == "alive", "state": state, "why": why,
                    "machine": r.get("machine"), "stopped_at": _iso(r.get("stopped_at")),
                    "clock_offset_s": None if offset is None else round(float(offset), 1),
                    "clock_skewed": offset is not None and abs(float(offset)) > SKEW_WARN_S,
                    "tasks": held.pop(r["id"], []), "leases": named.pop(r["id"], [])})
    for rid in sorted(set(held) | set(named)):  # held by a runner that never registered (an older agent) or is gone
        out.append({"id": rid, "host": None, "home": None, "pid": None, "version": None, "started_at": None,
                    "heartbeat_at": None, "heartbeat_age_s": None, "alive": False, "state": "silent",
                    "why": f"no heartbeat recorded (stale after {_ago(stale_after_s())})", "machine": None,
                    "stopped_at": None, "clock_offset_s": None, "clock_skewed": False,
                    "tasks": held.get(rid, []), "leases": named.get(rid, [])})
    return out


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str, option: str = "--older-than") -> float:
    """``90s``, ``30m``, ``12h``, ``7d`` or plain seconds -> seconds (positive); AgentError naming ``option``."""
    from agent import AgentError

    raw = (text or "").strip().lower()
    unit = raw[-1:] if raw[-1:] in _UNITS else "s"
    number = raw[:-1] if raw[-1:] in _UNITS else raw
    try:
        seconds = float(number) * _UNITS[unit]
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise AgentError(f"{option} {text!r} is not a duration; give a positive number with s, m, h or d "
                         "(90s, 30m, 12h, 7d)")
    return seconds


def prune(ledger: Ledger, older_than: float | None = None, now: float | None = None) -> list[dict]:
    """Remove the runners whose heartbeat is older than ``older_than`` seconds (default: stale, ``stale_after_s``)
    and that hold nothing (no task claim, live or expired; no named lease), each with a ``runner.pruned`` event,
    in one transaction. Returns the removed runners as ``runners`` shows them. A pruned runner that comes back
    registers again at its next pass."""
    limit = stale_after_s() if older_than is None else older_than
    removed = ledger.prune_runners(limit, why={"older_than_s": round(limit, 1)})
    return runner_view(removed, [], [], ledger.clock_now() if now is None else now)


# --------------------------------------------------------------------------- task claims


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
        row = ledger.claim_row(c, task_id)
        if row is None:
            return None
        if not _stale(row):
            return None
        fence = int(row["fence"] or 0) + 1
        token = ledger.take_claim(c, task_id, fence, owner_id(), os.getpid(), runner, lease_s, pid_scope())
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
    return ledger.renew_claim(task_id, token, lease_s or claim_lease_s(), runner)


def release(ledger: Ledger, task_id: int, token: str) -> None:
    ledger.release_claim(task_id, token)


def release_quietly(ledger: Ledger, task_id: int, token: str | None) -> None:
    """Release a claim from a ``finally``: a failure here must not hide what the worker raised (the lease expires)."""
    if token:
        try:
            release(ledger, task_id, token)
        except Exception:
            pass


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


class Keeper:
    """What ``lease_keeper`` yields: ``lost`` is set once a renewal found the claim gone."""

    def __init__(self) -> None:
        self.lost = threading.Event()


@contextmanager
def _renewing(open_ledger, period: float, renew, on_lost, name: str) -> Iterator[None]:
    """While the body runs, call ``renew(led)`` every ``period`` s from a background thread with its own
    connection (``open_ledger()``); once it returns False, ``on_lost()`` runs and renewing stops. A renewal that
    raises (a busy or unreachable ledger) is tried again next time: the lease covers the gap."""
    stop = threading.Event()

    def loop() -> None:
        led = open_ledger()
        try:
            while not stop.wait(period):
                try:
                    if not renew(led):
                        on_lost()
                        return
                except Exception:
                    continue
        finally:
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
                        _PROCESS_RUNNER or runner_id(Path.cwd(), create=False))

    def lost() -> None:
        keeper.lost.set()
        proc.kill_groups_of(worker)

    try:
        with _renewing(lambda: Ledger.open(ledger_path, create=False), lease_s / 3,
                       lambda led: renew(led, task_id, token, lease_s, runner), lost, f"lease-{task_id}"):
            yield keeper
    finally:
        proc.resume_thread(worker)


# --------------------------------------------------------------------------- named leases


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
    own transaction: ``ledger.check_lease``). Raises LeaseBusy when another holder keeps it past ``wait`` s."""
    runner = runner or _default_runner(ledger)
    holder = f"{owner_id()}@{runner}"
    deadline = time.monotonic() + wait
    while True:
        token = ledger.take_lease(name, holder, runner, ttl, scope=pid_scope())
        if token is None:
            # held by a process of this pid scope that is gone (killed mid-body): as with a task claim, its lease is
            # stale now, not at its expiry; taken only under the token we saw, so a live newcomer is never robbed
            row = ledger.lease_row(name)
            if row is not None and row["holder"] and holder_gone(row["holder"], row["scope"]):
                token = ledger.take_lease(name, holder, runner, ttl, stale_token=row["token"], scope=pid_scope())
        if token is not None:
            break
        if time.monotonic() >= deadline:
            raise LeaseBusy(name, ledger.lease_row(name))
        time.sleep(0.05)
    try:
        with _renewing(lambda: reopen(ledger), ttl / 3, lambda led: led.renew_lease(name, token, ttl),
                       lambda: None, f"lease-{name}"):
            yield token
    finally:
        try:
            ledger.release_lease(name, token)
        except Exception:
            pass  # a lease we could not release expires with its ttl


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
