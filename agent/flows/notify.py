"""Notifications: render an outbox row into a message and deliver it to Slack, a signed webhook, or email.

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

import hashlib
import hmac
import json
import os
import secrets
import socket
import time
from dataclasses import dataclass
from typing import Callable, Mapping

from agent import AgentError
from agent.config import Config, NotifyChannel
from agent.coord.fence import crashpoint
from agent.infra.redact import redact
from agent.ledger import Ledger, now
from agent.ledger import outbox
from agent.infra.text import one_line

BACKOFF_S = (30, 60, 120, 300, 600, 1800, 3600)   # after attempt 1, 2, ...; the last repeats
MAX_ATTEMPTS = 10
SEND_TIMEOUT_S = 15
LEASE_S = 120                                      # > one send; a dead claimant's row is taken back at once
SIGNATURE_HEADER = "X-Agent-Signature"


class NotifyFailed(AgentError):
    def __init__(self, message: str, retry: bool):
        super().__init__(message)
        self.retry = retry


@dataclass(frozen=True)
class Message:
    key: str                  # idempotency key
    kinds: tuple[str, ...]
    title: str                # one line: what happened
    text: str                 # what happened, and what a human does next
    command: str | None       # the exact command to run, if any
    url: str | None           # the PR, if any
    task_id: int | None
    error_id: str | None
    at: str


# --------------------------------------------------------------------------- rendering


def render(ledger: Ledger, key: str, kinds: tuple[str, ...], payload: dict, task_id: int | None,
           error_id: str | None, at: str) -> Message:
    """The message for one outbox row: what happened, and the exact command or URL a human acts on."""
    from agent.domain.wording import reset_command

    from agent.ledger.tasks import find_task

    task = find_task(ledger, task_id) if task_id is not None else None
    where = f"task {task_id} ({one_line(task['repo'], 100)}: {one_line(task['title'], 120)})" if task else \
        (f"task {task_id}" if task_id else "")
    event = payload.get("event")
    url = payload.get("url")
    command = None
    if event == "budget.reached":
        title = (f"agent: daily lane budget reached (${payload.get('spent_usd')} of ${payload.get('limit_usd')}); "
                 "tasks wait")
        text = ("Spending over the last 24 hours reached limits.daily_budget_usd. Tasks wait (nothing is dropped) "
                "until it falls below the limit; raise the limit in config.yaml to go on now.")
        command = "agent status"
    elif "gate-blocked" in kinds:
        reason = _quoted(payload.get("reason"))
        title = f"agent: {where} is gate-blocked: {reason}"
        text = f"{where} waits for a human. Reason: {reason}\nWhen it is fixed, run the command below."
        command = reset_command(task_id, "gate-blocked")
    elif "failed" in kinds:
        reason = _quoted(payload.get("reason"))
        title = f"agent: {where} failed: {reason[:200]}"
        text = f"{where} failed. Reason: {reason}\nTo let it go on with more rounds, run the command below."
        command = reset_command(task_id, "failed")
    elif "pr-opened" in kinds:
        title = f"agent: draft PR opened for {where}: {url}"
        text = f"A draft PR for {where} is open and waits for review: {url}"
    elif "pr-merged" in kinds:
        title = f"agent: PR merged for {where}: {url}"
        text = f"The PR {url} was merged; the error is resolved and the task is done."
        command = f"agent error show {error_id}" if error_id else None
    else:  # pr-closed
        title = f"agent: PR closed without merge for {where}: {url}"
        text = f"The PR {url} was closed without merge; the error is skipped and never proposed again."
        command = f"agent error show {error_id}" if error_id else None
    # the last guard: reasons can quote lane output or error text (one line each: see _quoted)
    return Message(key=key, kinds=kinds, title=one_line(redact(title), 300), text=redact(text)[:4000],
                   command=command, url=one_line(url, 500) or None if url else None, task_id=task_id,
                   error_id=error_id, at=at)


def _quoted(reason) -> str:
    """A reason (it can quote lane output or error text) as one line in quotes: a newline in it can never start
    a line of the message, such as a fake ``Run:``."""
    return f'"{one_line(reason, 1000)}"' if reason else '""'


def sample_message() -> Message:
    key = f"agent-test-{secrets.token_hex(6)}"
    return Message(key=key, kinds=("test",), title="agent: test notification",
                   text="This is a test from `agent notify test`; this channel is set up.", command="agent status",
                   url=None, task_id=None, error_id=None, at=now())


# --------------------------------------------------------------------------- channels


def _env(env: Mapping[str, str], name: str | None, channel: NotifyChannel, what: str) -> str:
    value = env.get(name or "")
    if not value:
        raise NotifyFailed(f"{channel.id}: environment variable {name} ({what}) is not set; export it where agent "
                           "runs", retry=True)
    return value


def _slack_escape(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_body(msg: Message) -> bytes:
    lines = [f"*{_slack_escape(msg.title)}*", _slack_escape(msg.text)]
    if msg.command:
        lines.append(f"Run: `{_slack_escape(msg.command)}`")
    if msg.url:
        lines.append(f"<{msg.url}|{_slack_escape(msg.url)}>")
    lines.append(f"_id {msg.key}_")
    return json.dumps({"text": "\n".join(lines)}).encode()


def webhook_body(msg: Message) -> bytes:
    return json.dumps({"id": msg.key, "kinds": list(msg.kinds), "title": msg.title, "text": msg.text,
                       "command": msg.command, "url": msg.url, "task_id": msg.task_id, "error_id": msg.error_id,
                       "at": msg.at}, sort_keys=True).encode()


def sign(secret: str, body: bytes) -> str:
    """``sha256=<hex>``: HMAC-SHA256 of the exact body bytes (the same scheme `agent serve` checks)."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def email_message(channel: NotifyChannel, msg: Message, user: str | None):
    from email.message import EmailMessage
    from email.utils import formatdate

    from email import policy

    # headers: one line each, whatever the text (a CR/LF in an error field would make Python refuse the header)
    m = EmailMessage(policy=policy.SMTP)
    m["Subject"] = one_line(msg.title, 200) or "agent"
    m["From"] = one_line(channel.sender or user or "agent@localhost")
    m["To"] = one_line(", ".join(channel.to))
    m["Date"] = formatdate(localtime=False)
    m["Message-ID"] = f"<{one_line(msg.key)}@agent>"
    m["X-Agent-Delivery"] = one_line(msg.key)
    body = [msg.text, ""]
    if msg.command:
        body += ["Run:", f"    {msg.command}", ""]
    if msg.url:
        body += [f"PR: {msg.url}", ""]
    m.set_content("\n".join(body))
    return m


def send(channel: NotifyChannel, msg: Message, env: Mapping[str, str] | None = None, ssl_context=None,
         timeout: float = SEND_TIMEOUT_S) -> None:
    """Send one message on one channel; raises NotifyFailed (with ``retry``) on any failure."""
    env = os.environ if env is None else env
    if channel.kind in ("slack", "webhook"):
        from agent.infra.http import PostFailed, post

        url = channel.url or _env(env, channel.url_env, channel, "the URL")
        headers = {"Content-Type": "application/json"}
        if channel.kind == "slack":
            body = slack_body(msg)
        else:
            body = webhook_body(msg)
            headers.update({SIGNATURE_HEADER: sign(_env(env, channel.secret_env, channel, "the HMAC key"), body),
                            "X-Agent-Delivery": msg.key, "Idempotency-Key": msg.key})
        try:
            post(url, body, headers=headers, timeout=timeout,
                 shown=channel.id if channel.url_env else None)
        except PostFailed as exc:
            raise NotifyFailed(f"{channel.id}: {exc}", retry=exc.retry) from None
        return
    _send_email(channel, msg, env, ssl_context, timeout)


def _send_email(channel: NotifyChannel, msg: Message, env: Mapping[str, str], ssl_context, timeout: float) -> None:
    import smtplib
    import ssl

    host, _, port = (channel.smtp or "").rpartition(":")
    user = _env(env, channel.user_env, channel, "the SMTP user") if channel.user_env else None
    password = _env(env, channel.password_env, channel, "the SMTP password") if channel.password_env else None
    try:
        with smtplib.SMTP(host, int(port), timeout=timeout) as smtp:
            smtp.ehlo()
            if channel.starttls:
                if not smtp.has_extn("starttls"):
                    raise NotifyFailed(f"{channel.id}: {host}:{port} does not offer STARTTLS; fix the server or set "
                                       "starttls: false for a trusted local relay", retry=False)
                smtp.starttls(context=ssl_context or ssl.create_default_context())
                smtp.ehlo()
            if user is not None:
                smtp.login(user, password or "")
            smtp.send_message(email_message(channel, msg, user))
    except NotifyFailed:
        raise
    except smtplib.SMTPResponseException as exc:
        raise NotifyFailed(f"{channel.id}: SMTP {exc.smtp_code}: {redact(str(exc.smtp_error)[:200])}",
                           retry=exc.smtp_code < 500) from None
    except smtplib.SMTPRecipientsRefused:
        raise NotifyFailed(f"{channel.id}: every recipient was refused", retry=False) from None
    except ssl.SSLError as exc:
        raise NotifyFailed(f"{channel.id}: TLS with {host}:{port} failed ({exc.reason}); a private CA goes in "
                           "SSL_CERT_FILE", retry=True) from None
    except (OSError, smtplib.SMTPException) as exc:
        raise NotifyFailed(f"{channel.id}: SMTP {host}:{port}: {type(exc).__name__}: {redact(str(exc))[:200]}",
                           retry=True) from None


# --------------------------------------------------------------------------- delivery passes


def _claimant() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def _dead(claimed_by: str) -> bool:
    """A claim of a process on this host that no longer lives (a SIGKILLed daemon) is taken back at once."""
    from agent.coord.fence import pid_alive

    host, _, rest = claimed_by.partition(":")
    pid = rest.partition(":")[0]
    return host == socket.gethostname() and pid.isdigit() and not pid_alive(int(pid))


def backoff(attempts: int) -> float:
    return float(BACKOFF_S[min(attempts, len(BACKOFF_S)) - 1])


def deliver(ledger: Ledger, config: Config, env: Mapping[str, str] | None = None, *,
            clock: Callable[[], float] = time.time, ssl_context=None,
            sender: Callable[..., None] = send) -> list[dict]:
    """One delivery pass: expand new outbox rows, send what is due, record each outcome. One item per delivery."""
    channels = {c.id: c for c in config.notify}
    outbox.expand(ledger, {cid: c.on for cid, c in channels.items()})
    token = _claimant()
    items = []
    for d in outbox.dead_letter_stuck(ledger, clock(), _dead, MAX_ATTEMPTS):
        items.append({"key": d["key"], "state": outbox.DEAD,
                      "line": f"notify {d['key']} ({d['kinds']}): dead after {d['attempts']} attempts that never "
                              f"finished; `agent notify retry {d['key']}` tries again"})
    for d in outbox.claim_due(ledger, token, clock(), LEASE_S, _dead):
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
                outbox.record(ledger, d["id"], token, "pending", str(exc), next_at=clock() + wait)
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
