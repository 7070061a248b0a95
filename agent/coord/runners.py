"""Runners: who is working on the ledger, and whether they are alive.

- **Runner**: a home on a machine, with an id (``$AGENT_RUNNER_ID`` or ``<hostname>:<hash of the machine id and
  the home>``) and a heartbeat in the ledger's ``runners`` table (on the ledger's clock, with the runner's clock
  offset), beaten by every scan, daemon pass and lease keeper (``beat``); a clean stop marks it stopped (``stop``).
  Alive, stopped, dead (this machine: its pid with its start time is gone) or silent (another machine, no heartbeat):
  ``runner_view``.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from agent.ledger import Ledger, leases
from agent.ledger.clock import claim_lease_s


HOST = os.uname().nodename  # = socket.gethostname(); socket + secrets cost ~7 ms of import on every tick


RUNNER_ENV = "AGENT_RUNNER_ID"


STALE_AFTER = 3  # a runner whose heartbeat is older than this many task leases is shown as stale


SKEW_WARN_S = 5.0   # a runner whose clock is further than this off the ledger's is flagged (and logs it once)


MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")


HOME_ID_FILE = "runner.id"   # a random id made in the home at its first start: tells apart machines and containers


def owner_id() -> str:
    return f"{HOST}:{os.getpid()}:{threading.get_ident()}"


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
    got = leases.beat_runner(ledger, {"id": rid, "host": HOST, "home": str(Path(home).expanduser().resolve()),
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
        return leases.stop_runner(ledger, runner_id(home), os.getpid())
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
    return runner_view(leases.runner_rows(ledger), leases.held_claims(ledger), leases.held_leases(ledger),
                       leases.clock_now(ledger))


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
    removed = leases.prune_runners(ledger, limit, why={"older_than_s": round(limit, 1)})
    return runner_view(removed, [], [], leases.clock_now(ledger) if now is None else now)
