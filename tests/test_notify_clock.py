"""Issue 25, one clock for notification deliveries: a delivery's claim lease and its retry time are set and judged
on the ledger's clock (PostgreSQL's ``clock_timestamp()``, SQLite's ``'now'``) in the claiming statement, never on
a runner's.  A runner whose clock runs 300 s ahead sees a live claim as expired by its own clock: before, it took
the delivery another runner was sending (a second send of the same message while the first one may still land);
one 300 s behind set its retries in the past (due at once for every other runner).  The skewed clock is injected
in this process: every runner-side clock read (``time.time``, and ``deliver``'s former ``clock`` default) is moved;
the ledger's is not.  Real SQLite or PostgreSQL (``--ledger=postgres``), a real local HTTP receiver."""

from __future__ import annotations

import time

import pytest

from agent.config import parse_config
from agent.domain import chain
from agent.flows import notify
from agent.ledger.outbox import expand
from agent.ledger.tasks import create_task, transition
from notify_support import Receiver

OTHER = "another-host:4242:held"      # a runner on another machine, alive, mid-send


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def _skew(monkeypatch, seconds: float) -> None:
    real = time.time
    skewed = lambda: real() + seconds    # noqa: E731
    monkeypatch.setattr(time, "time", skewed)
    defaults = notify.deliver.__kwdefaults__ or {}
    if "clock" in defaults:               # the runner clock deliver read before the change
        monkeypatch.setitem(defaults, "clock", skewed)


def _setup(ledger, receiver):
    cfg = parse_config({"notify": [{"kind": "webhook", "url": receiver.url, "secret_env": "K", "name": "ops"}]})
    tid, _ = create_task(ledger, "acme/widgets", "Fix KeyError in checkout")
    transition(ledger, tid, chain.BLOCKED, "script", "x")
    expand(ledger, {"ops": ("gate-blocked",)})
    return cfg


def _row(ledger) -> dict:
    clock = ledger.dialect.clock
    return ledger.one(f"SELECT state, claimed_by, attempts, lease_until - {clock} AS lease_left, "
                      f"next_at - {clock} AS due_in FROM notify_deliveries")


def test_a_runner_300s_ahead_takes_no_live_delivery(ledger, receiver, monkeypatch):
    cfg = _setup(ledger, receiver)
    with ledger.tx() as c:     # the other runner claimed it (its lease: LEASE_S of the ledger's time) and is sending
        c.execute(f"UPDATE notify_deliveries SET state = 'sending', claimed_by = ?, attempts = 1, "
                  f"lease_until = {ledger.dialect.clock} + ?", (OTHER, notify.LEASE_S))
    _skew(monkeypatch, 300)
    assert notify.deliver(ledger, cfg, {"K": "k"}) == []
    row = _row(ledger)
    assert row["state"] == "sending" and row["claimed_by"] == OTHER and row["attempts"] == 1, row
    assert receiver.requests == []
    # the control: once the lease is over on the ledger's clock, the same skewed runner takes it and sends
    with ledger.tx() as c:
        c.execute(f"UPDATE notify_deliveries SET lease_until = {ledger.dialect.clock} - 1")
    assert [i["state"] for i in notify.deliver(ledger, cfg, {"K": "k"})] == ["delivered"]
    assert len(receiver.requests) == 1


@pytest.mark.parametrize("skew", [300, -300])
def test_a_skewed_runners_claim_and_retry_are_the_ledgers_time(ledger, monkeypatch, skew):
    r = Receiver(codes=[503, 200])
    try:
        cfg = _setup(ledger, r)
        _skew(monkeypatch, skew)
        first = notify.deliver(ledger, cfg, {"K": "k"})        # the skewed runner's attempt fails: retry later
        assert [i["state"] for i in first] == ["pending"], first
        row = _row(ledger)
        assert notify.BACKOFF_S[0] - 5 < row["due_in"] <= notify.BACKOFF_S[0], row   # the wait, on the ledger's clock
        monkeypatch.undo()
        assert notify.deliver(ledger, cfg, {"K": "k"}) == []   # a true-clock runner: not due yet
        assert len(r.requests) == 1
    finally:
        r.close()


def test_a_claims_lease_is_the_ledgers_time(ledger, receiver, monkeypatch):
    cfg = _setup(ledger, receiver)
    seen = []

    def sender(channel, msg, env, ssl_context=None):   # look at the claim while it is held, mid-send
        seen.append(_row(ledger))

    _skew(monkeypatch, 300)
    assert [i["state"] for i in notify.deliver(ledger, cfg, {"K": "k"}, sender=sender)] == ["delivered"]
    assert seen and notify.LEASE_S - 10 < seen[0]["lease_left"] <= notify.LEASE_S, seen
