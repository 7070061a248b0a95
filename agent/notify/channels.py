"""Render an outbox row into a message and send it to one channel: Slack, a signed webhook, or email.

Every channel receives the delivery's idempotency key (``agent-<event id>-<channel>``): webhook header
``X-Agent-Delivery`` (and ``Idempotency-Key``), email ``Message-ID``, Slack in the text. ``send`` raises
``NotifyFailed`` with ``retry`` set for what a later attempt may fix (transport errors, 408/429/5xx, SMTP 4xx).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from dataclasses import dataclass
from typing import Mapping

from agent import AgentError
from agent.config import NotifyChannel
from agent.infra.redact import redact
from agent.infra.text import one_line
from agent.ledger import Ledger, now


SEND_TIMEOUT_S = 15


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
