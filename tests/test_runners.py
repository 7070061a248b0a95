"""Issue 14, runners: runner identity and heartbeats, leases with fencing tokens, named leases (source cursors,
the PR limits) and `agent runners`.

Real parts: one ledger shared by two homes (``shared_homes``: on SQLite the second home's ledger.db is a symlink to
the first's, as two runners on one machine; with ``--ledger=postgres`` both homes use the test's PostgreSQL database
through AGENT_LEDGER_URL), real `agent` processes, real SIGSTOP and SIGCONT, real lane processes killed by the lease
keeper. Two "runners" in one test process are two Ledger connections with two runner ids.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.coord.claims import Claim, LeaseBusy, claim, lease_keeper, named_lease, take
from agent.coord.runners import beat, pid_scope, runner_id, runners
from agent.ledger import Ledger, eventlog, leases, ledger_path
from agent.ledger.tasks import ClaimLost, LeaseLost, create_task, note_wait, set_step, start_next_round, transition
from agent.ledger.leases import claimed_tx

from conftest import Agent, agent_bin, ledger_conn, on_postgres


def dump(home: Path) -> list[str]:
    """Every row of every table of the home's ledger, sorted (what "the ledger is unchanged" compares)."""
    con = ledger_conn(home)
    try:
        if on_postgres():
            tables = [r[0] for r in con.execute("SELECT table_name FROM information_schema.tables "
                                                "WHERE table_schema = current_schema()").fetchall()]
        else:
            tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()]
        return sorted(f"{t}: {tuple(r)!r}" for t in tables for r in con.execute(f'SELECT * FROM "{t}"').fetchall())
    finally:
        con.close()


def two_runners(shared_homes):
    a, b = shared_homes
    return Ledger.open(ledger_path(a), create=False), Ledger.open(ledger_path(b), create=False)


# --------------------------------------------------------------------------- identity, heartbeats, `agent runners`


def test_runner_id_is_the_host_and_a_hash_of_the_home_unless_the_environment_names_it(tmp_path, monkeypatch):
    monkeypatch.delenv("AGENT_RUNNER_ID", raising=False)
    host = os.uname().nodename
    a, b = runner_id(tmp_path / "a"), runner_id(tmp_path / "b")
    assert a.startswith(host + ":") and len(a.split(":")[-1]) == 8
    assert a != b and a == runner_id(tmp_path / "a" / ".." / "a")
    monkeypatch.setenv("AGENT_RUNNER_ID", "eu-west-runner-3")
    assert runner_id(tmp_path / "a") == "eu-west-runner-3"


def test_a_bad_runner_id_is_refused_in_one_line(tmp_path):
    home = tmp_path / "home"
    env = {**os.environ, "AGENT_HOME": str(home), "AGENT_RUNNER_ID": "two words"}
    assert subprocess.run([*agent_bin(), "init"], env={**env, "AGENT_RUNNER_ID": ""}, capture_output=True,
                          timeout=60).returncode == 0
    r = subprocess.run([*agent_bin(), "watch", "errors"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1 and "AGENT_RUNNER_ID='two words' is not a runner id" in r.stderr


def test_every_scan_registers_then_beats_the_runner(agent, home):
    assert agent("init").exit_code == 0
    assert agent.json("runners") == []
    assert agent("watch", "errors").exit_code == 0
    first = agent.json("runners")
    assert [r["id"] for r in first] == [runner_id(home)]
    r = first[0]
    assert r["host"] == os.uname().nodename and r["home"] == str(home.resolve())
    assert r["state"] == "stopped" and r["alive"] is False   # the watch run ended cleanly
    assert r["tasks"] == [] and r["heartbeat_at"].endswith("Z") and r["pid"] > 0
    led = Ledger.open(ledger_path(home), create=False)
    try:
        beat1 = led.scalar("SELECT heartbeat_at FROM runners")
        time.sleep(0.05)
        assert agent("watch", "errors").exit_code == 0
        assert led.scalar("SELECT heartbeat_at FROM runners") > beat1
        assert agent.json("runners")[0]["started_at"] == r["started_at"]   # registered once, beaten since
        assert [e["kind"] for e in eventlog.events(led)].count("runner.registered") == 1
    finally:
        led.close()


def test_the_daemon_beats_once_per_pass(home, agent, monkeypatch):
    from agent.app.context import App
    from agent.app.daemon import run_daemon

    assert agent("init").exit_code == 0
    app = App(home=home)
    beats = []
    real = leases.beat_runner

    def counting(ledger, runner):
        if ledger is app.ledger:
            beats.append(runner["id"])
        return real(ledger, runner)

    monkeypatch.setattr(leases, "beat_runner", counting)
    try:
        assert run_daemon(app, interval=0, max_ticks=3, echo=lambda line: None) == 3
    finally:
        app.close()
    assert beats == [runner_id(home)] * 3
    assert Agent(home).json("runners")[0]["id"] == runner_id(home)


def test_agent_runners_shows_each_runner_its_heartbeat_and_the_tasks_it_holds(shared_homes):
    a_home, b_home = shared_homes
    led_a, led_b = two_runners(shared_homes)
    try:
        t1, _ = create_task(led_a, "acme/widgets", "one")
        t2, _ = create_task(led_a, "acme/widgets", "two")
        ra, rb = beat(led_a, a_home), beat(led_b, b_home)
        assert take(led_a, t1, runner=ra) and take(led_b, t2, lease_s=0.05, runner=rb)
        with led_b.tx() as c:  # runner B's process stopped beating an hour ago (and its lease ran out)
            c.execute("UPDATE runners SET heartbeat_at = ? WHERE id = ?", (time.time() - 3600, rb))
        time.sleep(0.1)
    finally:
        led_a.close()
        led_b.close()
    agent = Agent(a_home)
    rows = {r["id"]: r for r in agent.json("runners")}
    assert set(rows) == {ra, rb}
    assert rows[ra]["alive"] is True and rows[rb]["alive"] is False
    assert rows[rb]["home"] == str(b_home.resolve()) and rows[rb]["heartbeat_age_s"] >= 3599
    assert [t["task_id"] for t in rows[ra]["tasks"]] == [t1] and rows[ra]["tasks"][0]["lease_expired"] is False
    assert [t["task_id"] for t in rows[rb]["tasks"]] == [t2] and rows[rb]["tasks"][0]["lease_expired"] is True
    for key in ("id", "host", "home", "pid", "heartbeat_at", "heartbeat_age_s", "alive", "tasks"):
        assert key in rows[ra]
    text = agent("runners").stdout
    assert f"{ra}  alive  heartbeat " in text and f"{rb}  SILENT  heartbeat 1h00m ago" in text
    assert "runs but has not beaten for 1h00m" in text
    assert f"task {t1} (open): lease " in text and f"task {t2} (open): lease expired " in text
    # ... and `agent status`: a Runners section in text, JSON and the HTML page
    status = agent("status").stdout
    assert "runners (2, 1 dead or silent):" in status and f"{rb}  SILENT" in status
    assert {r["id"] for r in agent.json("status")["runners"]} == {ra, rb}
    page = a_home / "status.html"
    assert agent("status", "--html", str(page)).exit_code == 0
    html = page.read_text()
    assert "<h2>Runners (2)</h2><table id='runners'>" in html and rb in html and ">silent<" in html


def test_status_of_a_single_runner_shows_it_stopped_after_a_clean_watch_run(agent, home):
    assert agent("init").exit_code == 0
    assert "runners" not in agent("status").stdout and agent.json("status")["runners"] == []
    assert agent("watch", "errors").exit_code == 0   # one runner registered; the run ended cleanly: stopped
    [runner] = agent.json("runners")
    assert "runners (1):" in agent("status").stdout and f"{runner['id']}  stopped" in agent("status").stdout
    assert [(r["alive"], r["state"]) for r in agent.json("status")["runners"]] == [(False, "stopped")]


# --------------------------------------------------------------------------- claims and fencing tokens


def test_a_new_claim_increments_the_fencing_token_and_names_the_previous_holder(shared_homes):
    led_a, led_b = two_runners(shared_homes)
    try:
        tid, _ = create_task(led_a, "acme/widgets", "t")
        first = take(led_a, tid, lease_s=0.05, runner="runner-a")
        assert isinstance(first, Claim) and first.fence == 1 and first.previous_runner is None
        assert take(led_b, tid, runner="runner-b") is None       # a live lease is never taken
        time.sleep(0.1)
        second = take(led_b, tid, runner="runner-b")             # expired: runner B takes it over
        assert second.fence == 2 and int(second.token) > int(first.token)
        assert second.took_over and second.moved
        assert (second.previous_runner, second.previous_token) == ("runner-a", first.token)
        assert second.previous_owner.startswith(os.uname().nodename + ":")
        ev = [e for e in eventlog.events(led_a, task_id=tid) if e["kind"] == "task.claim_reclaimed"][-1]["payload"]
        assert ev["previous_runner"] == "runner-a" and ev["runner"] == "runner-b" and ev["token"] == second.token
        from agent.coord.claims import release

        release(led_b, tid, second.token)
        third = take(led_a, tid, runner="runner-a")              # released: a plain claim, but it moved back
        assert third.fence == 3 and not third.took_over and third.moved and third.previous_runner == "runner-b"
    finally:
        led_a.close()
        led_b.close()


def test_a_live_lease_on_another_host_is_never_taken_early(ledger):
    tid, _ = create_task(ledger, "acme/widgets", "t")
    with ledger.tx() as c:  # another host's worker: its pid means nothing here; only its lease counts
        c.execute("UPDATE tasks SET claim_owner = 'elsewhere:1:1', claim_pid = 999999999, claim_token = '7', "
                  "fence = 7, claim_runner = 'elsewhere:00000000', lease_until = ? WHERE id = ?",
                  (time.time() + 600, tid))
    assert claim(ledger, tid) is None
    with ledger.tx() as c:  # the same in this pid scope (this machine) with a dead pid: reclaimed at once
        c.execute("UPDATE tasks SET claim_owner = ?, claim_scope = ? WHERE id = ?",
                  (f"{os.uname().nodename}:999999999:1", pid_scope(), tid))
    got = take(ledger, tid)
    assert got.fence == 8 and got.token == "8" and got.previous_runner == "elsewhere:00000000"


def test_a_write_after_the_lease_was_lost_is_refused_and_the_ledger_is_unchanged(shared_homes):
    """Runner A claims, its lease expires, runner B claims: every write A still tries is refused (LeaseLost, a
    ClaimLost) and changes nothing."""
    a_home, _ = shared_homes
    led_a, led_b = two_runners(shared_homes)
    try:
        from agent.ledger import lanes, prs
        from agent.ledger.tasks import record_check, record_commit, record_gate, record_push

        tid, _ = create_task(led_a, "acme/widgets", "t")
        a = take(led_a, tid, lease_s=0.05, runner="runner-a")
        note_wait(led_a, tid, "A waits", a.token)          # A may write while it holds the lease
        run_id = lanes.start_run(led_a, task_id=tid, error_id=None, round=1, role="implementer", vendor="codex",
                                 head_sha=None, claim_token=a.token)
        # A's lease runs out (set here, not slept past: a write of A's after expiry but before anyone else claims
        # renews it, which on a loaded machine made this test's setup race its own 0.05 s lease)
        with led_a.tx() as c:
            c.execute("UPDATE tasks SET lease_until = ? WHERE id = ?", (time.time() - 1, tid))
        b = take(led_b, tid, runner="runner-b")
        assert b is not None
        before = dump(a_home)
        attempts = {
            "step close": lambda: set_step(led_a, tid, "spec_written", "ja", "spec", source="human",
                                           claim_token=a.token),
            "transition": lambda: transition(led_a, tid, "gate-blocked", "script", "x", claim_token=a.token),
            "wait": lambda: note_wait(led_a, tid, "A still thinks it works", a.token),
            "next round": lambda: start_next_round(led_a, tid, "findings", claim_token=a.token),
            "lane run started": lambda: lanes.start_run(led_a, task_id=tid, error_id=None, round=1, role="reviewer",
                                                        vendor="claude", head_sha=None, claim_token=a.token),
            "lane run progress": lambda: lanes.update_run(led_a, run_id, {"pid": 4242}, task_id=tid,
                                                          claim_token=a.token),
            "lane run outcome": lambda: lanes.finish_run(led_a, run_id, {"status": "complete"}, {"run_id": run_id},
                                                         task_id=tid, error_id=None, claim_token=a.token),
            "commit": lambda: record_commit(led_a, tid, 1, "a" * 40, None, "fix", claim_token=a.token),
            "check": lambda: record_check(led_a, tid, 1, command="pytest", exit_code=0, passed=True, head="a" * 40,
                                          output_path="/x", duration_s=1.0, status="ok", claim_token=a.token),
            "gate": lambda: record_gate(led_a, tid, 1, stage="review", dimension="code", verdict="approve",
                                        findings=0, head="a" * 40, lane_run_id=run_id, claim_token=a.token),
            "push": lambda: record_push(led_a, tid, sha="a" * 40, pushed=True, forced=False, branch="fix/x",
                                        claim_token=a.token),
            "record_pr": lambda: prs.record_pr(led_a, tid, {"forge": "local", "repo": "acme/widgets", "number": 1,
                                                            "url": "local://1", "state": "open"}, "created",
                                               "script", claim_token=a.token),
        }

        def raw_write():
            with claimed_tx(led_a, tid, a.token) as c:
                led_a.update(c, "tasks", {"id": tid}, {"head_sha": "f" * 40})

        attempts["claimed write"] = raw_write
        for what, attempt in attempts.items():
            with pytest.raises(LeaseLost, match="claim lost to another worker; result not written"):
                attempt()
            assert issubclass(LeaseLost, ClaimLost)
            assert dump(a_home) == before, f"{what} changed the ledger"
        # B, the current holder, writes fine
        note_wait(led_b, tid, "B waits", b.token)
    finally:
        led_a.close()
        led_b.close()


def test_a_holder_whose_lease_expired_but_was_not_taken_still_writes_and_renews(ledger):
    tid, _ = create_task(ledger, "acme/widgets", "t")
    got = take(ledger, tid, lease_s=0.05)
    time.sleep(0.1)
    assert ledger.scalar("SELECT lease_until FROM tasks WHERE id = ?", (tid,)) < time.time()
    assert note_wait(ledger, tid, "still mine", got.token) is True
    assert ledger.scalar("SELECT lease_until FROM tasks WHERE id = ?", (tid,)) > time.time() + 60


def test_the_lease_keeper_opens_its_connection_only_when_a_renewal_is_due(ledger):
    """A step shorter than a third of the lease (most of them) costs the keeper no connection (on PostgreSQL each
    is a server process); a longer one opens one and renews the lease on it."""
    from agent.coord import claims

    tid, _ = create_task(ledger, "acme/widgets", "t")
    got = take(ledger, tid, lease_s=600)
    opened = []

    def open_ledger():
        opened.append(Ledger.open(ledger.location, create=False))
        return opened[-1]

    renewals = []
    renew = lambda led: renewals.append(led) or claims.renew(led, tid, got.token, 600)  # noqa: E731
    with claims._renewing(open_ledger, 0.2, renew, lambda: None, "short"):
        pass
    assert opened == [] and renewals == []
    before = ledger.scalar("SELECT lease_until FROM tasks WHERE id = ?", (tid,))
    with claims._renewing(open_ledger, 0.1, renew, lambda: None, "long"):
        time.sleep(0.45)
    assert len(opened) == 1 and len(renewals) >= 2 and all(led is opened[0] for led in renewals)
    assert ledger.scalar("SELECT lease_until FROM tasks WHERE id = ?", (tid,)) >= before


STALLED_WORKER = r"""
import sys, time
from pathlib import Path
from agent.infra import proc
from agent.coord.claims import lease_keeper, take
from agent.ledger import Ledger, ledger_path
from agent.ledger.tasks import note_wait, LeaseLost

path, tid, logs = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
path = path if "://" in path else Path(path)
led = Ledger.open(path, create=False)
got = take(led, tid, lease_s=0.6, runner="runner-a")
print("claimed", got.token, flush=True)
t0 = time.monotonic()
with lease_keeper(path, tid, got.token, lease_s=0.6, runner="runner-a") as keeper:
    res = proc.run(["sleep", "60"], cwd=".", env=None, timeout=90, stdout_path=logs / "lane.out",
                   stderr_path=logs / "lane.err")
print("lane", "killed" if res.exit_code != 0 else "finished", round(time.monotonic() - t0, 1),
      "lost" if keeper.lost.is_set() else "held", flush=True)
try:
    note_wait(led, tid, "lane result", got.token)
    print("written", flush=True)
except LeaseLost as exc:
    print("refused:", exc, flush=True)
"""


def test_the_lease_keeper_stops_the_lane_of_a_worker_that_lost_its_lease_and_it_writes_nothing(shared_homes,
                                                                                               monkeypatch):
    """Runner A (a real process) runs a lane under its lease keeper; A is stopped (SIGSTOP) past its lease,
    runner B claims the task, A resumes: A's keeper finds the claim gone, kills A's lane at once, and A's write
    is refused."""
    from agent.ledger import LedgerError

    a_home, _ = shared_homes
    monkeypatch.setenv("AGENT_LEDGER_BUSY_TIMEOUT", "2")   # B's wait when A is stopped inside a write (below)
    led_a, led_b = two_runners(shared_homes)
    tid, _ = create_task(led_a, "acme/widgets", "t")
    led_a.close()
    worker = subprocess.Popen([sys.executable, "-c", STALLED_WORKER, str(ledger_path(a_home)), str(tid), str(a_home)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout.readline().startswith("claimed")
        time.sleep(0.3)
        b = None
        for _ in range(10):
            os.kill(worker.pid, signal.SIGSTOP)
            time.sleep(1.0)                               # past A's lease: nobody renewed it
            try:
                b = take(led_b, tid, runner="runner-b")
                break
            except LedgerError as exc:   # A was stopped inside its keeper's renewal, holding the write lock:
                assert "busy" in str(exc)  # let it finish that write and stop it again
                os.kill(worker.pid, signal.SIGCONT)
                time.sleep(0.1)
        assert b is not None and b.took_over and b.previous_runner == "runner-a"
        before = dump(a_home)
        os.kill(worker.pid, signal.SIGCONT)
        out, _ = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            os.kill(worker.pid, signal.SIGCONT)
            worker.kill()
        led_b.close()
    lane, refused = out.splitlines()[:2]
    _, state, seconds, lost = lane.split()
    assert state == "killed" and lost == "lost" and float(seconds) < 10, out   # not the lane's 60 s
    assert refused.startswith("refused:") and "claim lost" in refused
    assert dump(a_home) == before                              # A wrote nothing after B claimed


# --------------------------------------------------------------------------- named leases


def test_a_named_lease_has_one_holder_across_runners_and_its_token_increases(shared_homes):
    led_a, led_b = two_runners(shared_homes)
    try:
        with named_lease(led_a, "pr-open", ttl=30, runner="runner-a") as tok1:
            with pytest.raises(LeaseBusy, match="lease pr-open is held by runner-a"):
                with named_lease(led_b, "pr-open", ttl=30, runner="runner-b"):
                    pass
            with led_a.tx() as c:
                leases.check_lease(led_a, c, "pr-open", tok1)
        with named_lease(led_b, "pr-open", ttl=30, runner="runner-b") as tok2:
            assert tok2 > tok1
            with pytest.raises(LeaseLost):   # A's old token no longer guards a write
                with led_a.tx() as c:
                    leases.check_lease(led_a, c, "pr-open", tok1)
        # an expired lease is taken by the next runner (expired here, not slept past: a 0.05 s ttl expired before
        # the second call on a loaded machine)
        assert leases.take_lease(led_a, "x", "a", "runner-a", ttl=30) == 1
        assert leases.take_lease(led_b, "x", "b", "runner-b", ttl=30) is None
        with led_a.tx() as c:
            c.execute("UPDATE leases SET until = ? WHERE name = 'x'", (time.time() - 1,))
        assert leases.take_lease(led_b, "x", "b", "runner-b", ttl=30) == 2
    finally:
        led_a.close()
        led_b.close()


HOLD_LEASE = r"""
import sys, time
from pathlib import Path
from agent.coord.claims import named_lease
from agent.ledger import Ledger, ledger_path
led = Ledger.open(ledger_path(Path(sys.argv[1])), create=False)
with named_lease(led, "pr-open", ttl=60, runner="runner-a") as token:
    print(token, flush=True)
    time.sleep(120)
"""


def test_a_named_lease_whose_holder_was_killed_on_this_host_is_taken_at_once(shared_homes):
    """A scan SIGKILLed inside `pr-open` (after the PR create, before recording it) left the lease held for its
    60 s ttl, and the next scan waited that long. Like a task claim, a lease whose holder is a dead process of this
    host is stale now; a live holder still keeps it, and a holder on another host is trusted until its ttl."""
    a, b = shared_homes
    p = subprocess.Popen([sys.executable, "-c", HOLD_LEASE, str(a)], stdout=subprocess.PIPE, text=True)
    try:
        first = int(p.stdout.readline())
        led = Ledger.open(ledger_path(b), create=False)
        try:
            with pytest.raises(LeaseBusy, match="held by runner-a"):    # alive: it holds
                with named_lease(led, "pr-open", ttl=60, runner="runner-b"):
                    pass
            p.kill()
            p.wait(10)
            t0 = time.monotonic()
            with named_lease(led, "pr-open", ttl=60, runner="runner-b") as token:   # dead: taken, no waiting
                assert token == first + 1
                assert time.monotonic() - t0 < 30      # far below the ttl it would have waited (not a speed test)
                assert leases.lease_row(led, "pr-open")["runner"] == "runner-b"
            # a holder on another host: its pid means nothing here, so only its ttl frees it
            assert leases.take_lease(led, "pr-open", "elsewhere:1:1@runner-c", "runner-c", ttl=60) == first + 2
            with pytest.raises(LeaseBusy, match="held by runner-c"):
                with named_lease(led, "pr-open", ttl=60, runner="runner-b"):
                    pass
        finally:
            led.close()
    finally:
        p.kill()
        p.wait(10)


def test_a_cursor_write_from_a_pull_that_started_before_another_runners_page_is_refused(ledger, home):
    """The store's transaction checks the cursor is still the one the pull read: a page already stored by another
    runner is never stored again (the fencing of cursors, apart from the lease)."""
    from agent.intake.formats import Event
    from agent.intake.store import ingest, set_cursor

    set_cursor(ledger, "file:x", "page-1")
    read = ledger.scalar("SELECT value FROM cursors WHERE source = 'file:x'")
    set_cursor(ledger, "file:x", "page-2")   # another runner stored page 2 meanwhile
    before = dump(home)
    ev = Event(message="KeyError: 'qty'", cls="KeyError", service="widgets-api")
    with pytest.raises(LeaseLost, match="cursor moved"):
        ingest(ledger, [ev], cursor=("file:x", "page-2"),
               guard=lambda c: leases.check_cursor(ledger, c, "file:x", read))
    assert dump(home) == before


# --------------------------------------------------------------------------- across runner processes


def _runner_env(home: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("AGENT_CRASHPOINT", "AGENT_PAUSEPOINT",
                                                             "AGENT_RUNNER_ID")}
    return {**env, "AGENT_HOME": str(home), **extra}


def test_two_runners_pulling_one_source_at_once_store_each_page_once(shared_homes):
    """Two `agent watch errors` processes (two homes, one ledger) pull the same Loki source at the same moment,
    three times over while it grows. The answers are slow (1.2 s), so their pulls overlap for sure: one holds the
    source's lease, the other skips; every served line is counted exactly once."""
    import yaml

    from intake_support import LocalServer

    served: list[tuple[int, str]] = []

    def loki(method, path, query, headers):
        time.sleep(1.2)
        start, end = int(query["start"]), int(query["end"])
        values = [[str(ts), line] for ts, line in served if start <= ts <= end]
        return 200, {}, {"status": "success", "data": {"resultType": "streams", "result": [
            {"stream": {"app": "widgets", "service_name": "widgets-api"}, "values": values}] if values else []}}

    a_home, b_home = shared_homes
    t0 = time.time_ns() - 600 * 10**9
    skipped = 0
    with LocalServer(loki) as srv:
        for home in (a_home, b_home):
            (home / "config.yaml").write_text(yaml.safe_dump({"sources": [
                {"kind": "loki", "url": srv.url, "query": '{app="widgets"}'}]}))
        for rnd in range(3):
            for i in range(4):
                served.append((t0 + rnd * 100 + i, json.dumps({"level": "error", "msg": f"checkout failed {rnd}",
                                                               "service": "widgets-api"})))
            procs = [subprocess.Popen([*agent_bin(), "watch", "errors", "--json"], env=_runner_env(h),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                     for h in (a_home, b_home)]
            outs = [p.communicate(timeout=60) for p in procs]
            assert [p.returncode for p in procs] == [0, 0], outs
            items = [json.loads(out)[0] for out, _ in outs]
            assert all(it["ok"] for it in items), items
            skipped += sum(1 for it in items if it.get("skipped"))
    con = ledger_conn(a_home)
    try:
        assert con.execute("SELECT sum(count) FROM errors").fetchone()[0] == len(served) == 12
        assert con.execute("SELECT count(*) FROM leases WHERE name LIKE 'source:%'").fetchone()[0] == 1
    finally:
        con.close()
    assert skipped >= 2, "the two pulls should have overlapped"


@pytest.mark.slow
def test_the_open_draft_limit_counts_across_two_runners(tmp_path, monkeypatch):
    """Two runners (own homes, one ledger) each drive one task to its PR at the same time, with
    ``open_drafts_per_repo: 1`` and a pause injected between the limit check and the PR create (where two
    runners could race): exactly one draft is opened; the other task waits, saying why. The second home reuses
    the first's mirror and worktrees through symlinks (rebuilding a worktree on another runner is the takeover's
    part, not this test's)."""
    from chaos_support import add_home, build, read_log

    for var in ("AGENT_RUNNER_ID", "AGENT_CLAIM_LEASE_S"):
        monkeypatch.delenv(var, raising=False)
    log = tmp_path / "lanes.log"
    p = build(tmp_path / "w", tasks=2, lane_args=("--log", str(log)), limits={"open_drafts_per_repo": 1})
    a_home = p["home"]
    b_home = add_home(p, "home-b")
    for shared in ("mirrors", "worktrees", "specs"):
        if (a_home / shared).exists():
            (b_home / shared).symlink_to(a_home / shared)
    procs = []
    for home, order in ((a_home, "1"), (b_home, "2")):
        env = _runner_env(home, AGENT_PAUSEPOINT="pr.limits_checked:3")
        # each runner starts on a different task so both reach their PR at about the same time
        code = ("import sys; from pathlib import Path; from agent.app.context import App; from agent.flows import fixer; "
                "from agent.coord.runners import beat; h = Path(sys.argv[1]); app = App(home=h); beat(app.ledger, h); "
                "print('\\n'.join(fixer.advance(h, app.config, int(sys.argv[2]))))")
        procs.append(subprocess.Popen([sys.executable, "-c", code, str(home), order], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [pr.communicate(timeout=240)[0] for pr in procs]
    assert [pr.returncode for pr in procs] == [0, 0], outs
    con = ledger_conn(a_home)
    try:
        prs = con.execute("SELECT task_id FROM prs").fetchall()
        assert len(prs) == 1, outs
        waiting = con.execute("SELECT id, wait_reason FROM tasks WHERE id != ?", (prs[0]["task_id"],)).fetchone()
        assert "waiting to open a PR: 1 open drafts in" in (waiting["wait_reason"] or ""), (dict(waiting), outs)
        runners_seen = {r["claim_runner"] for r in con.execute("SELECT claim_runner FROM tasks")}
        assert len(runners_seen) == 2   # each task was driven by its own runner
    finally:
        con.close()
    assert {r["role"] for r in read_log(log) if r["event"] == "start"} >= {"implementer", "reviewer"}


@pytest.mark.slow
def test_a_runner_stopped_past_its_lease_loses_the_task_and_stops_its_lane_without_writing(tmp_path, monkeypatch):
    """`fixer.advance` in a real process (runner A, lease 1.5 s) runs the implementer lane (sleeping 30 s); A is
    stopped (SIGSTOP, the lane keeps running) past its lease, runner B claims the task, A resumes: A's lease keeper
    finds the claim gone and kills the lane at once, A says so, and nothing A does after B's claim reaches the
    ledger; B's claim stands."""
    from agent.ledger import LedgerError
    from chaos_support import build, read_log

    monkeypatch.setenv("AGENT_LEDGER_BUSY_TIMEOUT", "2")   # B's wait when A is stopped inside a write (below)
    log = tmp_path / "lanes.log"
    p = build(tmp_path / "w", tasks=1, lane_args=("--sleep", "30", "--log", str(log)))
    home = p["home"]
    code = ("import sys; from pathlib import Path; from agent.app.context import App; from agent.flows import fixer; "
            "h = Path(sys.argv[1]); print('\\n'.join(fixer.advance(h, App(home=h).config, 1)), flush=True)")
    env = _runner_env(home, AGENT_CLAIM_LEASE_S="1.5", AGENT_RUNNER_ID="runner-a")
    a = subprocess.Popen([sys.executable, "-c", code, str(home)], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    led = Ledger.open(ledger_path(home), create=False)
    try:
        deadline = time.monotonic() + 60
        while not read_log(log) and time.monotonic() < deadline:
            time.sleep(0.05)
        (started,) = read_log(log)
        b = None
        for _ in range(10):
            os.kill(a.pid, signal.SIGSTOP)
            time.sleep(2.0)                                         # A's lease runs out
            try:
                b = take(led, 1, runner="runner-b")
                break
            except LedgerError as exc:   # A was stopped inside its keeper's renewal, holding the write lock:
                assert "busy" in str(exc)  # let it finish that write and stop it again
                os.kill(a.pid, signal.SIGCONT)
                time.sleep(0.1)
        assert b is not None and b.took_over and b.previous_runner == "runner-a"
        before = dump(home)
        t0 = time.monotonic()
        os.kill(a.pid, signal.SIGCONT)
        out, _ = a.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if a.poll() is None:
            os.kill(a.pid, signal.SIGCONT)
            a.kill()
        led.close()
    assert "lease lost while its implementer lane ran" in out or "claim lost" in out, out
    assert took < 15, f"A went on for {took:.1f}s: its lane was not stopped"        # not the lane's 30 s
    assert [r["event"] for r in read_log(log)] == ["start"] and started["role"] == "implementer"
    assert dump(home) == before, "runner A wrote after runner B claimed the task"


def test_the_daily_budget_counts_what_every_runner_spent(shared_homes):
    """Runner B's lanes spent $4; runner A, about to start a lane with `limits.daily_budget_usd: 5`, may go on;
    after B spends $1.50 more, A waits and says why (the spend is summed from the shared ledger)."""
    from agent.config import parse_config
    from agent.flows.fixer.outcomes import Ctx, Stop
    from agent.flows.fixer.limits import check_budgets
    from agent.ledger import lanes

    a_home, _ = shared_homes
    led_a, led_b = two_runners(shared_homes)
    config = parse_config({"limits": {"daily_budget_usd": 5, "task_budget_usd": 100}})
    try:
        mine, _ = create_task(led_a, "acme/widgets", "A's task")
        theirs, _ = create_task(led_b, "acme/widgets", "B's task")
        a, b = take(led_a, mine, runner="runner-a"), take(led_b, theirs, runner="runner-b")

        def spend(usd):
            run = lanes.start_run(led_b, task_id=theirs, error_id=None, round=1, role="implementer", vendor="codex",
                                  head_sha=None, claim_token=b.token)
            lanes.finish_run(led_b, run, {"status": "complete", "cost_usd": usd}, {"run_id": run}, task_id=theirs,
                             error_id=None, claim_token=b.token)

        spend(4.0)
        ctx = Ctx(a_home, config, led_a, mine, a.token)
        check_budgets(ctx)                         # $4 of $5: A goes on
        spend(1.5)
        with pytest.raises(Stop):
            check_budgets(ctx)
        assert ctx.waiting == "waiting: daily budget spent ($5.5 of $5)"
        assert led_a.scalar("SELECT wait_reason FROM tasks WHERE id = ?", (mine,)) == ctx.waiting
    finally:
        led_a.close()
        led_b.close()
