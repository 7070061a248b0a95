"""`watch error-fix-work` reads its queue in one statement: the same answer as the two reads it replaced."""

from __future__ import annotations

from agent.domain import chain
from agent.ledger.tasks import active_task_ids, config_blocked_tasks, create_task, transition, work_queue


def test_work_queue_is_the_config_blocked_tasks_and_the_active_ids_in_one_read(ledger):
    ids = [create_task(ledger, "acme/widgets", f"task {n}")[0] for n in range(6)]
    # 0 stays open; 1 working; 2 blocked by the config; 3 blocked by a gate; 4 done; 5 working
    for i in (1, 2, 3, 4, 5):
        transition(ledger, ids[i], chain.WORKING, "script", "start")
    transition(ledger, ids[2], chain.BLOCKED, "script", chain.CONFIG_BLOCK + " lane implementer missing")
    transition(ledger, ids[3], chain.BLOCKED, "script", "round cap reached")
    transition(ledger, ids[4], chain.DONE, "script", "pr open")

    blocked, active = work_queue(ledger)

    assert active == [ids[0], ids[1], ids[5]] == active_task_ids(ledger)
    assert [b["id"] for b in blocked] == [ids[2]]
    assert blocked == config_blocked_tasks(ledger)
    assert blocked[0]["blocked_reason"].startswith(chain.CONFIG_BLOCK)


def test_an_empty_ledger_has_an_empty_queue(ledger):
    assert work_queue(ledger) == ([], [])


def test_a_scan_over_tasks_other_runners_hold_opens_no_connection(ledger, home, monkeypatch):
    """`watch error-fix-work` drives every task on one connection per thread: tasks another runner holds are each
    one refused claim on it, not two new connections (each a server process on PostgreSQL). Ledger.open is
    wrapped only to count the calls; every connection stays real."""
    from agent.app.context import App
    from agent.coord.claims import take
    from agent.flows.fixer.scans import work_scan
    from agent.ledger import Ledger

    from agent.app.demo import write_config

    write_config(home, home / "remote.git", home / "playbook.json", repo="acme/widgets")
    ids = [create_task(ledger, "acme/widgets", f"task {n}")[0] for n in range(3)]
    for i in ids:
        assert take(ledger, i, lease_s=600, runner="another-runner") is not None
    app = App(home=home)
    try:
        app.ledger                                   # the app's own connection, opened before counting
        opened = []
        real = Ledger.open.__func__
        monkeypatch.setattr(Ledger, "open", classmethod(lambda cls, *a, **k: opened.append(a) or real(cls, *a, **k)))
        items = work_scan(app)
    finally:
        app.close()
    assert [i["line"] for i in items] == [f"task {i}: claimed by another worker; skipped" for i in ids]
    assert opened == []
