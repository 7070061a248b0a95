"""Notification delivery: the passes that send outbox rows through the channels (``agent.notify.channels``).

The outbox row was written with its event (``agent/ledger/outbox.py``); a delivery pass (``agent watch notify``,
every daemon pass, and `agent serve`'s background thread) expands new rows into one delivery per channel that wants
them, claims the due ones, sends, and records the outcome. Every channel receives the delivery's idempotency key
(``agent-<event id>-<channel>``): webhook header ``X-Agent-Delivery`` (and ``Idempotency-Key``), email
``Message-ID``, Slack in the text. A crash before the send loses nothing (the row is still pending); a crash after
the send but before it is recorded resends the same key once the claimant is dead, so a receiver that keys on it
applies the message once. Failures are retried with backoff (transport errors, 408/429/5xx, SMTP 4xx); a refusal
that retrying cannot fix (other 4xx, SMTP 5xx) or the last attempt marks the delivery ``failed`` with the reason.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
from typing import Callable, Mapping

from agent import AgentError
from agent.config import Config
from agent.infra.faults import crashpoint
from agent.infra.redact import redact
from agent.ledger import Ledger
from agent.ledger import outbox
from agent.infra.text import one_line
from agent.notify.channels import (SIGNATURE_HEADER, Message, NotifyFailed, render, sample_message,  # noqa: F401
                                   send)

BACKOFF_S = (30, 60, 120, 300, 600, 1800, 3600)   # after attempt 1, 2, ...; the last repeats
MAX_ATTEMPTS = 10
LEASE_S = 120                                      # > one send, on the ledger's clock (agent.ledger.outbox);
                                                   # a dead claimant's row is taken back at once


def _claimant() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def _dead(claimed_by: str) -> bool:
    """A claim of a process on this host that no longer lives (a SIGKILLed daemon) is taken back at once."""
    from agent.coord.runners import pid_alive

    host, _, rest = claimed_by.partition(":")
    pid = rest.partition(":")[0]
    return host == socket.gethostname() and pid.isdigit() and not pid_alive(int(pid))


def backoff(attempts: int) -> float:
    return float(BACKOFF_S[min(attempts, len(BACKOFF_S)) - 1])


def deliver(ledger: Ledger, config: Config, env: Mapping[str, str] | None = None, *, ssl_context=None,
            sender: Callable[..., None] = send) -> list[dict]:
    """One delivery pass: expand new outbox rows, send what is due, record each outcome. One item per delivery.
    What is due, each claim's lease and each retry's time are the ledger's clock, never this runner's."""
    channels = {c.id: c for c in config.notify}
    outbox.expand(ledger, {cid: c.on for cid, c in channels.items()})
    token = _claimant()
    items = []
    for d in outbox.dead_letter_stuck(ledger, _dead, MAX_ATTEMPTS):
        items.append({"key": d["key"], "state": outbox.DEAD,
                      "line": f"notify {d['key']} ({d['kinds']}): dead after {d['attempts']} attempts that never "
                              f"finished; `agent notify retry {d['key']}` tries again"})
    for d in outbox.claim_due(ledger, token, LEASE_S, _dead):
        channel = channels.get(d["channel"])
        kinds = tuple(d["kinds"].split(","))
        label = f"notify {d['key']} ({','.join(kinds)})"
        if channel is None:
            outbox.record(ledger, d["id"], token, "failed", "channel no longer configured")
            items.append({"key": d["key"], "state": "failed", "line": f"{label}: channel no longer configured"})
            continue
        try:   # anything that goes wrong with this one delivery fails it alone; the pass goes on
            msg = render(ledger, d["key"], kinds, json.loads(d["payload"] or "{}"), d["task_id"], d["error_id"],
                         d["event_at"])
            crashpoint("notify.before_send")  # fault injection (tests): claimed, nothing sent yet
            sender(channel, msg, env, ssl_context=ssl_context)
        except Exception as exc:  # noqa: BLE001 - one poison row never silences the others
            if not isinstance(exc, NotifyFailed):
                exc = NotifyFailed(f"{channel.id}: {type(exc).__name__}: {one_line(redact(str(exc)), 200)}",
                                   retry=True)
            if not exc.retry:
                outbox.record(ledger, d["id"], token, "failed", str(exc))
                items.append({"key": d["key"], "state": "failed", "line": f"{label}: failed for good: {exc}"})
            elif d["attempts"] >= MAX_ATTEMPTS:
                outbox.record(ledger, d["id"], token, outbox.DEAD, str(exc))
                items.append({"key": d["key"], "state": outbox.DEAD,
                              "line": f"{label}: dead after {d['attempts']} attempts: {exc}; "
                                      f"`agent notify retry {d['key']}` tries again"})
            else:
                wait = backoff(d["attempts"])
                outbox.record(ledger, d["id"], token, "pending", str(exc), retry_in=wait)
                items.append({"key": d["key"], "state": "pending",
                              "line": f"{label}: attempt {d['attempts']} failed, retry in {wait:.0f}s: {exc}"})
            continue
        crashpoint("notify.sent")  # fault injection (tests): sent, not yet recorded
        outbox.record(ledger, d["id"], token, "delivered")
        items.append({"key": d["key"], "state": "delivered", "line": f"{label}: delivered to {channel.id}"})
    return items


def list_deliveries(ledger: Ledger, state: str | None = None, limit: int = 100) -> list[dict]:
    """`agent notify list`: deliveries, newest first (``state``: pending | sending | delivered | failed | dead)."""
    if state is not None and state not in outbox.DELIVERY_STATES:
        raise AgentError(f"unknown delivery state {state!r}; use one of {', '.join(outbox.DELIVERY_STATES)}")
    return outbox.deliveries(ledger, state, limit)


def retry(ledger: Ledger, keys: tuple[str, ...] = (), every: bool = False) -> list[dict]:
    """`agent notify retry`: failed or dead deliveries (the named ones, or all) go back to pending, due now, with
    a fresh attempt count."""
    if not keys and not every:
        raise AgentError("name the deliveries to retry (their key, from `agent notify list`) or pass --all")
    done = outbox.requeue(ledger, keys, every)
    missing = [k for k in keys if k not in {d["key"] for d in done}]
    if missing:
        raise AgentError(f"no failed or dead delivery with key {', '.join(missing)}; see `agent notify list "
                         "--state dead`")
    return done


def scan(app, jobs: int = 1) -> list[dict]:
    """`agent watch notify` (and every `watch all` / daemon pass)."""
    return deliver(app.ledger, app.config)


def send_tests(config: Config, env: Mapping[str, str] | None = None, ssl_context=None) -> list[dict]:
    """`agent notify test`: one test message to every configured channel, sent now (not through the outbox)."""
    if not config.notify:
        raise AgentError("no notify: channels in config.yaml; add one (see `agent init`'s commented config)")
    out = []
    for channel in config.notify:
        msg = sample_message()
        try:
            send(channel, msg, env, ssl_context=ssl_context)
            out.append({"channel": channel.id, "kind": channel.kind, "ok": True, "key": msg.key, "error": None})
        except NotifyFailed as exc:
            out.append({"channel": channel.id, "kind": channel.kind, "ok": False, "key": msg.key, "error": str(exc)})
    return out
