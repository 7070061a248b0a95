"""Three runners on one ledger, one killed mid-lane: its tasks are taken over and every task ends done, once.

Three real `agent daemon` processes, each with its own AGENT_HOME (mirrors, worktrees, locks, logs), all on one
ledger (one shared SQLite file; PostgreSQL when the suite runs with ``--ledger=postgres``) and one bare remote.
12 errors concluded `error.fix`; scripted lanes (the `command` vendor) that sleep 2 s, then edit a file and report
`STATUS: complete`. When the first runner has a lane running it is SIGKILLed (its whole process group).

Asserted: every task done with exactly one PR (ledger, local forge rows and files, remote branch == head == hidden
ref, one commit per round); no (task, round, role) lane launched twice except runs recorded as interrupted; the
tasks the killed runner held were taken over by the others (a `task.taken_over` event from its home after the kill).
"""

from __future__ import annotations

import json
import time

import pytest

from conftest import ledger_conn
from chaos_support import (check_invariants, count_done, kill_group, lane_launches, runner, runner_homes, stop_runners,
                           wait_for)

TASKS = 12


def db(home):
    return ledger_conn(home)   # the shared ledger, whichever backend


def payload(row) -> dict:
    value = row["payload"]
    return json.loads(value) if isinstance(value, str) else dict(value)


@pytest.mark.slow
def test_three_runners_one_killed_mid_lane(tmp_path):
    started = time.monotonic()
    p, homes = runner_homes(tmp_path / "w", runners=3, tasks=TASKS, sleep="2", log=tmp_path / "lanes.log")
    procs = [runner(h, tmp_path / f"runner-{i + 1}.log", jobs=2) for i, h in enumerate(homes)]
    victim, victim_home = procs[0], homes[0]
    try:
        def victim_in_a_lane():
            con = db(victim_home)
            try:
                return con.execute("SELECT count(*) FROM lane_runs WHERE status = 'running' AND pid IS NOT NULL "
                                   "AND log_dir LIKE ?", (f"{victim_home}/%",)).fetchone()[0] > 0
            finally:
                con.close()

        assert wait_for(victim_in_a_lane, 60), (tmp_path / "runner-1.log").read_text()
        con = db(victim_home)
        held = [r[0] for r in con.execute("SELECT id FROM tasks WHERE claim_pid = ? AND state IN ('open', 'working')",
                                          (victim.pid,))]
        last_event = con.execute("SELECT max(id) FROM events").fetchone()[0]
        con.close()
        kill_group(victim)                       # SIGKILL mid-lane
        assert held, "the killed runner held no task"

        assert wait_for(lambda: count_done(homes[1]) == TASKS, 120), \
            [(tmp_path / f"runner-{i}.log").read_text()[-3000:] for i in (2, 3)]
    finally:
        stop_runners(procs[1:])
        if victim.poll() is None:
            kill_group(victim)
    check_invariants(homes[1], p["remote"], TASKS, homes=homes)
    launches = lane_launches(homes[1])
    assert launches and all(n == 1 for n in launches.values()), {k: n for k, n in launches.items() if n != 1}
    con = db(homes[1])
    interrupted = con.execute("SELECT count(*) FROM lane_runs WHERE status = 'interrupted'").fetchone()[0]
    takeovers = {}
    for r in con.execute("SELECT task_id, payload FROM events WHERE kind = 'task.taken_over' AND id > ?",
                         (last_event,)):
        if payload(r)["from_worktree"].startswith(f"{victim_home}/"):
            takeovers[r["task_id"]] = payload(r)
    runs_by_home = {str(h): con.execute("SELECT count(*) FROM lane_runs WHERE log_dir LIKE ?",
                                        (f"{h}/%",)).fetchone()[0] for h in homes}
    con.close()
    assert set(held) <= set(takeovers), (held, takeovers)          # the killed runner's tasks were taken over
    assert interrupted >= 1                                          # the lane it was running, recorded as such
    assert all(runs_by_home.values()), runs_by_home                  # all three runners worked
    print(f"runners chaos: {TASKS} tasks, killed runner held {held}, {interrupted} interrupted run(s), "
          f"lanes per home {list(runs_by_home.values())}, {time.monotonic() - started:.1f}s")


@pytest.mark.slow
@pytest.mark.postgres_only("a stopped database server and a runner's clock apart from the ledger's")
def test_three_runners_one_with_its_clock_300s_ahead_through_a_database_stop(tmp_path, monkeypatch):
    """scripts/chaos --skew 300 --db-stop 30, smaller: three real daemons on a PostgreSQL server of this test's own,
    the third under libfaketime 300 s ahead; the server is stopped (pg_ctl stop) for 5 s while lanes run. Every
    task done with one PR, no lane run twice, no live claim taken, the skewed runner's offset recorded."""
    from pgserver import PgServer

    from chaos_support import runners_chaos

    server = PgServer.start()
    try:
        server.migrate_template()
        monkeypatch.setenv("AGENT_LEDGER_URL", server.fresh())
        got = runners_chaos(tmp_path / "w", server, runners=3, tasks=6, sleep="1", skew_s=300, db_stop_s=5)
    finally:
        server.stop()
    print(f"runners chaos with skew and a database stop: {got}")
