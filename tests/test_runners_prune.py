"""Dead runners made visible and removable: `agent doctor` warns about stale runners (who, since when, what each
still holds), `agent runners --prune` removes the stale ones that hold nothing, and a daemon that waits between
passes keeps beating.

Everything is real: ledger files (or the PostgreSQL server with --ledger=postgres), task claims and named leases
taken through agent.coord and the ledger's own operations, the CLI in-process and `agent daemon` as a subprocess.
Only the age of a heartbeat is made up (an UPDATE moves it into the past): waiting six minutes would prove nothing
more.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from agent.app.doctor import render_text, run_doctor
from agent.coord.claims import take
from agent.coord.runners import beat, runner_id, stale_after_s
from agent.ledger import Ledger, eventlog, leases, ledger_path
from agent.ledger.tasks import create_task
from conftest import Agent, agent_bin, ledger_conn, on_postgres

HOUR = 3600.0


def register(led: Ledger, rid: str, host: str = "old-box", age_s: float = 0.0, pid: int = 4242) -> str:
    """A runner row as `beat` writes it, its heartbeat ``age_s`` in the past."""
    leases.beat_runner(led, {"id": rid, "host": host, "home": f"/srv/agent/{rid}", "pid": pid, "pid_start": None,
                             "version": "0.test"})
    if age_s:
        with led.tx() as c:
            c.execute("UPDATE runners SET heartbeat_at = ? WHERE id = ?", (time.time() - age_s, rid))
    return rid


def runner_ids(home: Path) -> set[str]:
    led = Ledger.open(ledger_path(home), create=False)
    try:
        return {r["id"] for r in leases.runner_rows(led)}
    finally:
        led.close()


def dump(home: Path) -> list[str]:
    con = ledger_conn(home)
    try:
        return sorted(repr(tuple(r)) for t in ("runners", "events", "tasks", "leases")
                      for r in con.execute(f'SELECT * FROM "{t}"').fetchall())
    finally:
        con.close()


@pytest.fixture
def fleet(home, monkeypatch):
    """One live runner (this home) and three gone ones: holding an expired claim and an expired named lease,
    holding a claim still within its lease, and holding nothing."""
    for var in ("AGENT_RUNNER_ID", "AGENT_CLAIM_LEASE_S"):
        monkeypatch.delenv(var, raising=False)
    led = Ledger.open(ledger_path(home))
    try:
        live = beat(led, home)
        expired = register(led, "box-b:dead", host="box-b", age_s=2 * HOUR, pid=111)
        stuck = register(led, "box-c:stuck", host="box-c", age_s=HOUR, pid=222)
        idle = register(led, "box-d:idle", host="box-d", age_s=3 * HOUR, pid=333)
        t1, _ = create_task(led, "acme/widgets", "one")
        t2, _ = create_task(led, "acme/widgets", "two")
        t3, _ = create_task(led, "acme/widgets", "three")
        assert take(led, t1, runner=live)
        assert take(led, t2, runner=expired, lease_s=0.05)
        assert take(led, t3, runner=stuck, lease_s=630)
        assert leases.take_lease(led, "source:loki", "box-b:111:1", expired, ttl=-600) is not None
        time.sleep(0.1)
        yield {"home": home, "live": live, "expired": expired, "stuck": stuck, "idle": idle,
               "tasks": (t1, t2, t3)}
    finally:
        led.close()


def doctor(home: Path) -> dict:
    return run_doctor(home, home / "config.yaml", environ=dict(os.environ))


# --------------------------------------------------------------------------- doctor


def test_doctor_warns_about_each_stale_runner_with_its_host_silence_and_what_it_holds(fleet):
    result = doctor(fleet["home"])
    checks = {c["name"]: c for c in result["checks"]}
    t1, t2, t3 = fleet["tasks"]
    # warnings, not problems: the verdict is whatever the other checks say
    assert all(c["ok"] for c in checks.values() if c["name"].startswith("runner"))
    assert f"runner {fleet['live']}" not in checks and "runners" not in checks
    stale = {name for name, c in checks.items() if name.startswith("runner ") and c["warn"]}
    assert stale == {f"runner {fleet['expired']}", f"runner {fleet['stuck']}", f"runner {fleet['idle']}"}

    dead = checks[f"runner {fleet['expired']}"]["detail"]
    assert dead.startswith("host box-b, home /srv/agent/box-b:dead, pid 111: no heartbeat for 2h00m (stale after 6m)")
    assert f"holds task {t2} (open, lease expired " in dead and "lease source:loki (expired 10m ago)" in dead
    assert "still within its lease" not in dead
    assert "takes its task(s) over" in checks[f"runner {fleet['expired']}"]["fix"]

    stuck = checks[f"runner {fleet['stuck']}"]
    assert "no heartbeat for 1h00m" in stuck["detail"] and f"task {t3} (open, lease 10m left)" in stuck["detail"]
    assert f"its claim on task {t3} is still within its lease, so no other runner may take it over" in \
        stuck["detail"]
    assert "pid 222 on box-c is stuck" in stuck["fix"]

    idle = checks[f"runner {fleet['idle']}"]
    assert idle["detail"].endswith("no heartbeat for 3h00m (stale after 6m); holds nothing")
    assert "agent runners --prune" in idle["fix"]

    text = render_text(result)
    assert f"WARN  runner {fleet['idle']}: host box-d" in text
    assert f"      fix: if it is gone for good: `agent runners --prune`" in text
    assert f"runner {fleet['stuck']}" in text.splitlines()[-1]            # named in the warnings' summary


def test_doctor_cli_keeps_exit_0_for_stale_runner_warnings(agent, home):
    init = agent("init")
    assert init.exit_code == 0, init.output              # a commented config: nothing else to complain about
    led = Ledger.open(ledger_path(home), create=False)
    try:
        register(led, "box-d:idle", host="box-d", age_s=3 * HOUR)
        register(led, "box-b:dead", host="box-b", age_s=2 * HOUR)
        assert leases.take_lease(led, "pr-open", "box-b:111:1", "box-b:dead", ttl=-600) is not None
    finally:
        led.close()
    out = agent("doctor")
    assert out.exit_code == 0, out.output
    assert "WARN  runner box-d:idle: host box-d" in out.stdout
    assert "WARN  runner box-b:dead: host box-b" in out.stdout and "holds lease pr-open (expired 10m ago)" in out.stdout
    assert out.stdout.rstrip().splitlines()[-1] == (  # a fresh home has no repo and no lane: not "healthy"
        "not set up yet: no repo and no lane role, so nothing will be fixed (3 warning(s): "
        "runner box-b:dead, runner box-d:idle, config)")
    doc = json.loads(agent("doctor", "--json").stdout)
    assert doc["ok"] is True
    assert {c["name"] for c in doc["checks"] if c["warn"]} == {"config", "runner box-d:idle", "runner box-b:dead"}


def test_doctor_does_not_report_fresh_runners(home, monkeypatch):
    monkeypatch.delenv("AGENT_RUNNER_ID", raising=False)
    led = Ledger.open(ledger_path(home))
    try:
        rid = beat(led, home)
        register(led, "box-e:recent", host="box-e", age_s=stale_after_s() - 30)   # silent, but not for long
        t, _ = create_task(led, "acme/widgets", "one")
        assert take(led, t, runner="box-e:recent")
    finally:
        led.close()
    checks = {c["name"]: c for c in doctor(home)["checks"]}
    assert not [n for n in checks if n.startswith("runner ")]
    assert checks["runners"] == {"name": "runners", "ok": True, "warn": False, "fix": None,
                                 "detail": "2 runner(s), each with a heartbeat within 6m"}
    assert rid


def test_doctor_names_a_claim_held_by_a_runner_that_is_not_registered(home, monkeypatch):
    monkeypatch.delenv("AGENT_RUNNER_ID", raising=False)
    led = Ledger.open(ledger_path(home))
    try:
        beat(led, home)
        t, _ = create_task(led, "acme/widgets", "one")
        assert take(led, t, runner="box-z:gone", lease_s=630)     # an older agent never registered this runner
    finally:
        led.close()
    check = {c["name"]: c for c in doctor(home)["checks"]}["runner box-z:gone"]
    assert check["warn"] and check["ok"]
    assert check["detail"].startswith(f"not in the runners table: no heartbeat recorded (stale after 6m); holds task "
                                      f"{t} (open, lease 10m left); its claim on task {t} is still within its lease")
    assert "whether its process is stuck" in check["fix"]


def test_doctor_on_a_ledger_without_runners_says_so(home):
    Ledger.open(ledger_path(home)).close()
    checks = {c["name"]: c for c in doctor(home)["checks"]}
    assert checks["runners"]["ok"] and "no runner has registered yet" in checks["runners"]["detail"]


# --------------------------------------------------------------------------- `agent runners` shows leases


def test_agent_runners_lists_the_named_leases_each_runner_holds(fleet):
    agent = Agent(fleet["home"])
    rows = {r["id"]: r for r in agent.json("runners")}
    assert [(lease["name"], lease["expired"]) for lease in rows[fleet["expired"]]["leases"]] == \
        [("source:loki", True)]
    assert rows[fleet["live"]]["leases"] == [] and rows[fleet["idle"]]["leases"] == []
    text = agent("runners").stdout
    assert "    lease source:loki: expired 10m ago" in text


# --------------------------------------------------------------------------- prune


def test_prune_removes_only_stale_runners_that_hold_nothing_and_records_each(fleet):
    home = fleet["home"]
    events_before = len([1 for line in dump(home) if "runner.pruned" in line])
    agent = Agent(home)
    removed = agent.json("runners", "--prune")
    assert [r["id"] for r in removed] == [fleet["idle"]]
    assert removed[0]["host"] == "box-d" and removed[0]["home"] == "/srv/agent/box-d:idle"
    assert removed[0]["alive"] is False and removed[0]["heartbeat_age_s"] >= 3 * HOUR - 5
    # kept: the live one, the one holding an expired claim and a lease, the one holding a live claim
    assert runner_ids(home) == {fleet["live"], fleet["expired"], fleet["stuck"]}

    led = Ledger.open(ledger_path(home), create=False)
    try:
        pruned = [e for e in eventlog.events(led) if e["kind"] == "runner.pruned"]
        assert events_before == 0 and len(pruned) == 1 and pruned[0]["actor"] == "human"
        payload = pruned[0]["payload"]
        assert payload["id"] == fleet["idle"] and payload["host"] == "box-d" and payload["older_than_s"] == 360.0

        # nothing more goes while they hold something; once released, the expired one goes
        assert agent.json("runners", "--prune") == []
        t1, t2, t3 = fleet["tasks"]
        leases.release_lease(led, "source:loki", led.scalar("SELECT token FROM leases WHERE name = 'source:loki'"))
        assert agent.json("runners", "--prune") == []            # still holds task t2's (expired) claim
        leases.release_claim(led, t2, led.scalar("SELECT claim_token FROM tasks WHERE id = ?", (t2,)))
        assert [r["id"] for r in agent.json("runners", "--prune")] == [fleet["expired"]]
        assert runner_ids(home) == {fleet["live"], fleet["stuck"]}
        assert len([e for e in eventlog.events(led) if e["kind"] == "runner.pruned"]) == 2
    finally:
        led.close()


def test_prune_text_output_and_older_than(home, monkeypatch):
    monkeypatch.delenv("AGENT_RUNNER_ID", raising=False)
    led = Ledger.open(ledger_path(home))
    try:
        register(led, "box-f:day", host="box-f", age_s=26 * HOUR)
        register(led, "box-g:hours", host="box-g", age_s=2 * HOUR)
        register(led, "box-h:minutes", host="box-h", age_s=10)
    finally:
        led.close()
    agent = Agent(home)
    out = agent("runners", "--prune", "--older-than", "1d")
    assert out.exit_code == 0, out.output
    assert out.stdout.startswith("removed box-f:day  box-f  /srv/agent/box-f:day  last heartbeat 20")
    assert out.stdout.count("\n") == 1
    assert runner_ids(home) == {"box-g:hours", "box-h:minutes"}
    out = agent("runners", "--prune")                                  # the default: stale (6 min)
    assert out.exit_code == 0 and "removed box-g:hours" in out.stdout and "box-h" not in out.stdout
    out = agent("runners", "--prune")
    assert out.exit_code == 0 and out.stdout.startswith("no runner removed")
    assert runner_ids(home) == {"box-h:minutes"}
    assert agent.json("runners", "--prune", "--older-than", "5s")[0]["id"] == "box-h:minutes"   # it asked for it
    assert runner_ids(home) == set()


@pytest.mark.parametrize("bad", ["5x", "0", "-3m", "abc", "", "1e999h", "nan"])
def test_a_bad_older_than_is_one_line_and_changes_nothing(fleet, bad):
    home = fleet["home"]
    before = dump(home)
    out = subprocess.run([*agent_bin(), "runners", "--prune", "--older-than", bad],
                         env={**os.environ, "AGENT_HOME": str(home)}, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and out.stdout == "" and "Traceback" not in out.stderr
    assert out.stderr == f"agent: --older-than {bad!r} is not a duration; give a positive number with s, m, h or " \
                         "d (90s, 30m, 12h, 7d)\n"
    assert dump(home) == before


def test_older_than_without_prune_is_a_usage_error(agent, home):
    Ledger.open(ledger_path(home)).close()
    out = agent("runners", "--older-than", "1h")
    assert out.exit_code == 2 and "--older-than goes with --prune" in out.output


# --------------------------------------------------------------------------- the daemon beats while it waits


def test_a_daemon_waiting_between_passes_keeps_beating(home, agent_proc, monkeypatch):
    monkeypatch.delenv("AGENT_RUNNER_ID", raising=False)
    assert agent_proc("init").returncode == 0
    env = {**os.environ, "AGENT_HOME": str(home), "AGENT_CLAIM_LEASE_S": "0.5"}
    proc = subprocess.Popen([*agent_bin(), "daemon", "--interval", "600"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        rid = runner_id(home)
        led = Ledger.open(ledger_path(home), create=False)
        try:
            beats: list[float] = []
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and len(set(beats)) < 4:   # the first pass, then 3 while waiting
                beat_at = led.scalar("SELECT heartbeat_at FROM runners WHERE id = ?", (rid,))
                if beat_at is not None and (not beats or beat_at != beats[-1]):
                    beats.append(beat_at)
                time.sleep(0.1)
        finally:
            led.close()
        assert len(beats) >= 4, f"heartbeats seen while the daemon waits 600 s: {beats}"
        assert proc.poll() is None                       # still in its first wait: no second pass beat for it
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "daemon: stopped after 1 pass(es)" in out, out
    assert "heartbeat not recorded" not in out
