"""Issue 25: runners share one clock and one truth about who is alive.

- **Clock** (PostgreSQL: a server has its own clock): a real runner process whose clock runs 300 s ahead (or
  behind) of the machine's, through libfaketime (Debian's `faketime`, installed by scripts/ci-faketime), shares one
  PostgreSQL ledger with a runner on the true clock. Leases are set and judged on the ledger's clock, so neither
  takes the other's live claim or named lease; the skew is recorded with the heartbeat, flagged by `agent runners`
  and `agent doctor`, and the skewed runner says so once.
- **Liveness**: a real `agent daemon` SIGKILLed on this machine is `dead` at once (its pid is gone), one stopped
  cleanly is `stopped`; a dead runner's claim is free at once.
- **Identity**: a runner id differs between two "machines" with the same hostname and home path (a real bubblewrap
  container with its own machine id and its own home mounted at the same path); a claim written by a process of
  another machine with this hostname is judged by its lease, never by a pid that means nothing here.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.app.doctor import run_doctor
from agent.coord.claims import take
from agent.coord.runners import beat, pid_scope, runner_id, runners
from agent.ledger import Ledger, leases, ledger_path
from agent.ledger.tasks import create_task

from chaos_support import wait_for
from conftest import Agent, agent_bin

ROOT = Path(__file__).resolve().parent.parent


def libfaketime() -> str:
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    if not found:
        pytest.skip("libfaketime is not installed: run scripts/ci-faketime (Debian package faketime)")
    return found[0]


SKEWED = r"""
import json, sys, time
from pathlib import Path
from agent.coord.claims import take
from agent.coord.runners import beat
from agent.ledger import Ledger, leases, ledger_path

home, held, free = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
led = Ledger.open(ledger_path(home), create=False)
rid = beat(led, home)
beat(led, home)                     # logs the skew once, not at every beat
stolen = take(led, held, runner=rid)
own = take(led, free, runner=rid)
left = led.scalar("SELECT lease_until - EXTRACT(EPOCH FROM clock_timestamp())::float8 FROM tasks WHERE id = ?",
                  (free,)) if own else None
named = leases.take_lease(led, "pr-open", f"skewed:1:1@{rid}", rid, 60.0)
print(json.dumps({"clock": time.time(), "rid": rid, "stolen": stolen.token if stolen else None,
                  "own": own.token if own else None, "lease_left": left, "named": named}), flush=True)
sys.stdin.readline()                # hold the claim (a live process) until the test has judged it
"""


@pytest.mark.postgres_only("a runner's clock apart from the ledger's: on SQLite the ledger's clock is the runner's")
@pytest.mark.parametrize("skew", [300, -300])
def test_a_runner_with_a_skewed_clock_takes_no_live_claim_and_is_flagged(tmp_path, monkeypatch, skew):
    monkeypatch.delenv("AGENT_RUNNER_ID", raising=False)
    monkeypatch.delenv("AGENT_CLAIM_LEASE_S", raising=False)
    lib = libfaketime()
    a, b = tmp_path / "runner-a", tmp_path / "runner-b"
    for h in (a, b):
        h.mkdir()
    led = Ledger.open(ledger_path(a))
    try:
        ra = beat(led, a)
        held, _ = create_task(led, "acme/widgets", "held by A")
        free, _ = create_task(led, "acme/widgets", "free")
        mine = take(led, held, runner=ra)                        # A's live claim: 120 s on the ledger's clock
        assert mine is not None
        assert leases.take_lease(led, "pr-open", f"a:{os.getpid()}:1@{ra}", ra, 60.0) is not None
    finally:
        led.close()
    env = {**os.environ, "AGENT_HOME": str(b), "LD_PRELOAD": lib, "FAKETIME": f"{skew:+d}",
           "FAKETIME_DONT_FAKE_MONOTONIC": "1", "PYTHONPATH": str(ROOT)}
    worker = subprocess.Popen([sys.executable, "-c", SKEWED, str(b), str(held), str(free)], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out = json.loads(worker.stdout.readline() or "{}")
        assert out, worker.stderr.read()
        assert abs(out["clock"] - time.time() - skew) < 30          # libfaketime really moved B's clock
        assert out["stolen"] is None                                # A's live claim stays A's
        assert out["named"] is None                                 # and so does A's named lease
        assert out["own"] is not None and 100 < out["lease_left"] <= 121   # B's lease: 120 s of the ledger's time
        led = Ledger.open(ledger_path(a), create=False)
        try:
            assert take(led, free, runner=ra) is None               # B's claim is live for A too (skew -300: not
            view = {r["id"]: r for r in runners(led)}               # already expired on arrival)
        finally:
            led.close()
        rb = out["rid"]
        assert abs(view[rb]["clock_offset_s"] - skew) < 30 and view[rb]["clock_skewed"] is True
        assert abs(view[ra]["clock_offset_s"]) < 5 and view[ra]["clock_skewed"] is False
        assert view[rb]["state"] == "alive"
        text = Agent(a)("runners").stdout
        assert f"CLOCK: {view[rb]['clock_offset_s']:+.1f}s off the ledger's clock" in text
        checks = {c["name"]: c for c in run_doctor(a, a / "config.yaml", environ=dict(os.environ))["checks"]}
        clock = checks[f"runner {rb} clock"]
        assert clock["warn"] and f"{view[rb]['clock_offset_s']:+.1f}s off the ledger's" in clock["detail"]
    finally:
        worker.stdin.close()
        worker.wait(30)
    err = worker.stderr.read()
    assert err.count("clock is") == 1, err                          # logged once, though it beat twice
    assert f"{abs(skew)}" in err.split("clock is", 1)[1].split("s ", 1)[0] or "ahead" in err or "behind" in err
    assert ("ahead of" if skew > 0 else "behind") in err


# --------------------------------------------------------------------------- liveness


def state_of(home: Path, rid: str) -> dict | None:
    return next((r for r in Agent(home).json("runners") if r["id"] == rid), None)


def test_a_runner_killed_on_this_machine_is_dead_at_once_and_a_clean_stop_is_stopped(home, agent_proc,
                                                                                    monkeypatch):
    monkeypatch.delenv("AGENT_RUNNER_ID", raising=False)
    assert agent_proc("init").returncode == 0
    rid = runner_id(home)
    env = {**os.environ, "AGENT_HOME": str(home)}
    for how in ("SIGKILL", "SIGTERM"):
        daemon = subprocess.Popen([*agent_bin(), "daemon", "--interval", "600"], env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        try:
            assert wait_for(lambda: (state_of(home, rid) or {}).get("pid") == daemon.pid), "never registered"
            alive = state_of(home, rid)
            assert alive["state"] == "alive" and alive["alive"] is True
            assert alive["why"] == f"pid {daemon.pid} runs on this machine"
            os.kill(daemon.pid, getattr(signal, how))
            daemon.wait(30)
        finally:
            if daemon.poll() is None:
                daemon.kill()
                daemon.wait()
        after = state_of(home, rid)
        if how == "SIGKILL":    # its heartbeat is seconds old, yet it is dead: the pid is gone
            assert after["state"] == "dead" and after["alive"] is False and after["heartbeat_age_s"] < 60
            assert after["why"] == f"pid {daemon.pid} is gone from this machine without a clean stop"
            checks = {c["name"]: c for c in run_doctor(home, home / "config.yaml", environ=dict(os.environ))["checks"]}
            assert checks[f"runner {rid}"]["warn"] and "without a clean stop" in checks[f"runner {rid}"]["detail"]
        else:
            assert after["state"] == "stopped" and after["alive"] is False and after["stopped_at"].endswith("Z")
            checks = {c["name"]: c for c in run_doctor(home, home / "config.yaml", environ=dict(os.environ))["checks"]}
            assert f"runner {rid}" not in checks and "1 stopped cleanly" in checks["runners"]["detail"]


HOLDER = r"""
import sys, time
from pathlib import Path
from agent.coord.claims import take
from agent.coord.runners import beat
from agent.ledger import Ledger, ledger_path
home, tid = Path(sys.argv[1]), int(sys.argv[2])
led = Ledger.open(ledger_path(home), create=False)
got = take(led, tid, runner=beat(led, home))
print(got.token, flush=True)
time.sleep(600)
"""


def test_a_dead_runners_claim_on_this_machine_is_free_at_once(home, agent_proc, monkeypatch):
    monkeypatch.delenv("AGENT_RUNNER_ID", raising=False)
    assert agent_proc("init").returncode == 0
    led = Ledger.open(ledger_path(home), create=False)
    try:
        tid, _ = create_task(led, "acme/widgets", "t")
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(home), str(tid)], stdout=subprocess.PIPE,
                                  text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        try:
            token = holder.stdout.readline().strip()
            assert token and take(led, tid, runner="other") is None      # live: its 120 s lease holds
            holder.kill()
            holder.wait()
        finally:
            if holder.poll() is None:
                holder.kill()
        got = take(led, tid, runner="other")                              # dead: free now, not in 120 s
        assert got is not None and got.took_over and got.previous_token == token
    finally:
        led.close()


# --------------------------------------------------------------------------- identity


def test_a_claim_from_another_machine_with_this_hostname_is_judged_by_its_lease(ledger):
    """What a runner on another machine (or container) with the same hostname and home path writes: its owner
    names this hostname, its pid means nothing here (999999999 is not running here), its pid scope is its own."""
    tid, _ = create_task(ledger, "acme/widgets", "t")
    host = os.uname().nodename
    with ledger.tx() as c:
        c.execute("UPDATE tasks SET claim_owner = ?, claim_pid = 999999999, claim_token = '3', fence = 3, "
                  "claim_runner = ?, claim_scope = 'another-boot/pid:[4026531836]', lease_until = ? WHERE id = ?",
                  (f"{host}:999999999:1", f"{host}:0000abcd", time.time() + 600, tid))
    assert take(ledger, tid) is None                   # its live lease holds: the pid is not ours to judge
    with ledger.tx() as c:
        c.execute("UPDATE tasks SET lease_until = ? WHERE id = ?", (time.time() - 1, tid))
    assert take(ledger, tid).fence == 4                # once its lease ended, it is taken over
    # a named lease the same way: held by a process of another machine with this hostname
    assert leases.take_lease(ledger, "pr-open", f"{host}:999999999:1@{host}:0000abcd", f"{host}:0000abcd", 600.0,
                             scope="another-boot/pid:[4026531836]") is not None
    from agent.coord.claims import LeaseBusy, named_lease

    with pytest.raises(LeaseBusy):
        with named_lease(ledger, "pr-open"):
            pass


ID_OF = "import sys; from agent.coord.runners import runner_id, pid_scope; print(runner_id(sys.argv[1]), pid_scope())"


def test_runner_ids_differ_between_machines_with_the_same_hostname_and_home_path(tmp_path, monkeypatch):
    """A real bubblewrap container: its own pid namespace, its own /etc/machine-id, its own home folder mounted at
    the same path as this machine's home, the same hostname."""
    import shutil

    monkeypatch.delenv("AGENT_RUNNER_ID", raising=False)
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        pytest.skip("bubblewrap is not installed: run scripts/ci-bwrap")
    home, other = tmp_path / "home", tmp_path / "other-machines-home"
    assert Agent(home)("init").exit_code == 0
    other.mkdir()
    (other / "runner.id").write_text((home / "runner.id").read_text())   # even a copied home: the machine differs
    fake = tmp_path / "machine-id"
    fake.write_text("0123456789abcdef0123456789abcdef\n")
    here = subprocess.run([sys.executable, "-c", ID_OF, str(home)], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout.split()
    there = subprocess.run([bwrap, "--bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid",
                            "--ro-bind", str(fake), "/etc/machine-id", "--ro-bind", str(fake),
                            "/var/lib/dbus/machine-id", "--bind", str(other), str(home), sys.executable, "-c", ID_OF,
                            str(home)], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout.split()
    assert here[0] == runner_id(home) and here[0].startswith(os.uname().nodename + ":")
    assert there[0].startswith(os.uname().nodename + ":") and there[0] != here[0]
    assert there[1] != here[1] == pid_scope()           # its pids are its own: never judged here
    monkeypatch.setenv("AGENT_RUNNER_ID", "eu-west-3")
    assert runner_id(home) == "eu-west-3"                 # the environment still wins


# --------------------------------------------------------------------------- outage


@pytest.mark.postgres_only("a database outage: a SQLite ledger is a file on the runner's own machine")
@pytest.mark.slow
def test_a_runner_that_loses_the_ledger_mid_lane_keeps_its_claim_and_runs_no_lane_twice(tmp_path, monkeypatch):
    """A real daemon reaches PostgreSQL through a TCP proxy; the proxy drops every connection and refuses new ones
    for 4 s while the daemon's lane runs (the lane ends during the outage). The daemon says so in one line, and
    one when the ledger is back; its claim survives with its token, the lane's result is written, and no lane
    runs twice (before: the result was lost, the task skipped until its lease ran out, then the lane re-run)."""
    from urllib.parse import urlsplit

    from chaos_support import CuttableProxy, count_done, runner, runner_homes, stop_runners, wait_for as until
    from conftest import ledger_conn

    monkeypatch.setenv("AGENT_CLAIM_LEASE_S", "30")
    p, (h,) = runner_homes(tmp_path / "w", runners=1, tasks=1, sleep="2.5")
    url = os.environ["AGENT_LEDGER_URL"]
    target = urlsplit(url)
    proxy = CuttableProxy(target.hostname, target.port)
    log = tmp_path / "daemon.log"
    daemon = runner(h, log=log, env={"AGENT_LEDGER_URL": proxy.url(url)})

    def lane_running() -> bool:
        con = ledger_conn(h)
        try:
            return con.execute("SELECT count(*) FROM lane_runs WHERE status = 'running' AND pid IS NOT NULL"
                               ).fetchone()[0] > 0
        finally:
            con.close()

    try:
        assert until(lane_running, 60), log.read_text()
        time.sleep(0.5)
        proxy.cut()                                    # the ledger is gone for 4 s; the 2.5 s lane ends meanwhile
        time.sleep(4.0)
        proxy.restore()
        assert until(lambda: count_done(h) == 1, 60), log.read_text()[-3000:]
    finally:
        stop_runners([daemon])
        proxy.close()
    con = ledger_conn(h)
    try:
        runs = con.execute("SELECT round, role, status FROM lane_runs ORDER BY id").fetchall()
        reclaimed = con.execute("SELECT count(*) FROM events WHERE kind = 'task.claim_reclaimed'").fetchone()[0]
    finally:
        con.close()
    per_lane: dict = {}
    for r in runs:
        per_lane[(r[0], r[1])] = per_lane.get((r[0], r[1]), 0) + 1
    assert per_lane and all(n == 1 for n in per_lane.values()), runs        # no lane ran twice
    assert all(r[2] != "interrupted" for r in runs) and reclaimed == 0, runs
    text = log.read_text()
    down = [line for line in text.splitlines() if "unreachable" in line]
    assert len(down) == 1 and "claims and their tokens are kept" in down[0], text
    assert len([line for line in text.splitlines() if "is back after" in line]) == 1, text
    assert "scan" not in text.split("unreachable", 1)[1].split("is back after", 1)[0], text   # nothing else


# --------------------------------------------------------------------------- fencing tokens at the side effects


def test_a_worker_that_lost_its_claim_pushes_no_branch(tmp_path):
    """step_pushed (the task branch's push) runs only under the current claim, checked in the same step: a worker
    whose claim another one took pushes nothing (before: only the ledger write after the push was refused)."""
    from agent.config import load_config
    from agent.coord.claims import claim, release
    from agent.flows.fixer.outcomes import Ctx
    from agent.flows.fixer.steps import step_pushed
    from agent.ledger.tasks import ClaimLost
    from agent.git.workspace import TaskGit
    from chaos_support import build, git

    p = build(tmp_path / "w", tasks=1)
    home = p["home"]
    led = Ledger.open(ledger_path(home), create=False)
    try:
        t = led.one("SELECT worktree, branch FROM tasks WHERE id = 1")
        g = TaskGit(t["worktree"])
        (Path(t["worktree"]) / "fix.txt").write_text("the fix\n")
        g("add", "-A")
        g("-c", "user.name=t", "-c", "user.email=t@localhost", "commit", "-q", "--no-verify", "-m", "fix")
        config = load_config(home / "config.yaml")
        mine = claim(led, 1)
        release(led, 1, mine)
        newer = claim(led, 1)                        # another worker holds the task now
        with pytest.raises(ClaimLost, match="nothing pushed"):
            step_pushed(Ctx(home, config, led, 1, token=mine))
        assert subprocess.run(["git", "rev-parse", "--verify", "-q", f"refs/heads/{t['branch']}"], cwd=p["remote"],
                              capture_output=True).returncode != 0
        assert led.scalar("SELECT pushed_sha FROM tasks WHERE id = 1") is None
        try:
            step_pushed(Ctx(home, config, led, 1, token=newer))    # the holder's push goes through
        except Exception as exc:   # noqa: BLE001 - closing the step may move on (Stop/Wait); the push is what counts
            assert not isinstance(exc, ClaimLost), exc
        assert git(p["remote"], "rev-parse", f"refs/heads/{t['branch']}") == g.head()
    finally:
        led.close()


def test_no_runner_takes_a_claim_while_its_holder_pushes_under_it(shared_homes):
    """The claim checked for a push stays put until the push ends: even with its lease run out, another runner's
    take() during the push finds it held (PostgreSQL: the row is locked; SQLite: the write lock), and afterwards
    the lease was renewed by the check, so the holder keeps it."""
    import threading

    a, b = shared_homes
    led_a, led_b = Ledger.open(ledger_path(a), create=False), Ledger.open(ledger_path(b), create=False)
    try:
        tid, _ = create_task(led_a, "acme/widgets", "t")
        mine = take(led_a, tid, runner="runner-a")
        with led_a.tx() as c:      # A's lease ran out, nobody took it yet
            c.execute("UPDATE tasks SET lease_until = ? WHERE id = ?", (time.time() - 5, tid))
        inside, got = threading.Event(), []
        grab = threading.Thread(target=lambda: (inside.wait(10), got.append(take(led_b, tid, runner="runner-b"))))
        grab.start()
        with leases.holding_claim(led_a, tid, mine.token):
            inside.set()
            time.sleep(0.5)        # the push
        grab.join(30)
        assert got == [None]
        assert led_a.scalar("SELECT claim_token FROM tasks WHERE id = ?", (tid,)) == mine.token
    finally:
        led_a.close()
        led_b.close()
