"""`agent serve` as a Sentry DSN: the checks and parsing of one SDK delivery, before anything is stored.

A delivery is checked in this order, and nothing is stored unless it passes all of them: the project is configured
in ``serve.dsn`` (else 404), its key variable is set (503), the ``sentry_key`` matches in constant time (401), the
body fits ``serve.max_body_bytes`` raw and decoded (413; a compression bomb stops at the cap), the envelope parses
(400 naming the line), every event item is an event (400 naming the item), and the rate limit has room (429 with
``Retry-After`` and ``X-Sentry-Rate-Limits``, so SDKs back off as they do for Sentry). Items other than events
(transactions, sessions, client reports, attachments, ...) are accepted and dropped, and counted for ``/metrics``.

The events then take the path every Sentry payload takes (``formats.event_from_sentry``), with the service and repo
from config, never from the event: only config maps errors to repositories. The delivery key is the project and the
event id, so an SDK's retry of the same event is a replay and counts once.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import json
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

from agent.intake import envelope as wire
from agent.intake.formats import Event, event_from_sentry

HOOK = "sentry-sdk"
WINDOW_S = 60.0


class Refused(Exception):
    def __init__(self, code: int, message: str, headers: list[tuple[str, str]] | None = None):
        super().__init__(message)
        self.code = code
        self.headers = headers or []


@dataclass
class Delivery:
    hook: str
    key: str
    event_id: str | None
    events: list[Event] = field(default_factory=list)


class RateLimit:
    """At most ``per_minute`` events in any 60 s window (this process); ``take(n)`` -> seconds to wait, or 0."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic):
        self.per_minute = per_minute
        self.clock = clock
        self._times: collections.deque[float] = collections.deque()
        self._lock = threading.Lock()

    def take(self, n: int) -> int:
        with self._lock:
            now = self.clock()
            while self._times and now - self._times[0] >= WINDOW_S:
                self._times.popleft()
            if len(self._times) + n > self.per_minute:
                oldest = self._times[0] if self._times else now
                return max(1, math.ceil(WINDOW_S - (now - oldest)))
            self._times.extend([now] * n)
            return 0


class SentryIngest:
    def __init__(self, serve_config, env: Mapping[str, str]):
        self.config = serve_config
        self.env = env
        self.limit = RateLimit(serve_config.max_events_per_minute)
        self._counts: collections.Counter = collections.Counter()   # (outcome, item type) -> n
        self._lock = threading.Lock()

    def _count(self, outcome: str, kind: str, n: int = 1) -> None:
        with self._lock:
            self._counts[(outcome, kind)] += n

    def receive(self, project: str, kind: str, environ, read_body: Callable) -> Delivery:
        dsn = next((p for p in self.config.dsn if p.project == project), None)
        if dsn is None:
            raise Refused(404, f"unknown Sentry project {project}: add it to serve.dsn in config.yaml")
        key = self.env.get(dsn.key_env)
        if not key:
            raise Refused(503, f"Sentry project {project} disabled: environment variable {dsn.key_env} "
                               "(serve.dsn key_env) is not set where agent serve runs; set it and restart")
        given = wire.sentry_key(environ.get("HTTP_X_SENTRY_AUTH"), environ.get("QUERY_STRING"))
        if not given or not hmac.compare_digest(given.encode(), key.encode()):
            raise Refused(401, "sentry_key missing or wrong (X-Sentry-Auth or ?sentry_key=); check the DSN the "
                               "SDK uses (agent doctor prints it); nothing stored")
        try:
            raw = read_body(environ)
        except Exception as exc:  # the server's own body check (413, bad Content-Length) keeps its code
            code = getattr(exc, "code", 400)
            raise Refused(code, str(exc)) from None
        try:
            data = wire.decode(raw, environ.get("HTTP_CONTENT_ENCODING"), self.config.max_body_bytes)
            delivery = (self._envelope(data, dsn) if kind == "envelope" else self._store(data, dsn))
        except wire.EnvelopeError as exc:
            self._count("refused", "malformed")
            raise Refused(exc.code, f"{exc}; nothing stored") from None
        if delivery.events:
            wait = self.limit.take(len(delivery.events))
            if wait:
                self._count("refused", "rate_limited", len(delivery.events))
                raise Refused(429, f"over serve.max_events_per_minute ({self.config.max_events_per_minute}); "
                                   f"retry after {wait} s; nothing stored",
                              headers=[("Retry-After", str(wait)),
                                       ("X-Sentry-Rate-Limits", f"{wait}:error;default:project")])
            self._count("accepted", "event", len(delivery.events))
        return delivery

    def _event(self, obj: dict, dsn, where: str) -> Event:
        try:
            ev = event_from_sentry(obj)
        except (ValueError, TypeError, AttributeError, RecursionError) as exc:
            raise wire.EnvelopeError(f"{where}: not a Sentry event ({str(exc)[:200] or type(exc).__name__})") \
                from None
        ev.service, ev.repo = dsn.service, dsn.repo    # config decides where an error goes, never the event
        return ev

    def _envelope(self, data: bytes, dsn) -> Delivery:
        env = wire.parse(data)
        events: list[Event] = []
        event_id = env.event_id
        for i, item in enumerate(env.items):
            if item.type == "event":
                obj = wire.event_payload(item, f"item {i + 1} (event)")
                events.append(self._event(obj, dsn, f"item {i + 1} (event)"))
                event_id = event_id or _event_id(obj)
            else:
                self._count("dropped", item.type[:40])
        return Delivery(hook=HOOK, key=self._key(dsn, event_id, data), event_id=event_id, events=events)

    def _store(self, data: bytes, dsn) -> Delivery:
        try:
            obj = json.loads(data)
        except RecursionError:
            raise wire.EnvelopeError("event is nested too deep") from None
        except ValueError as exc:
            raise wire.EnvelopeError(f"body is not a JSON event ({getattr(exc, 'msg', exc)})") from None
        if not isinstance(obj, dict):
            raise wire.EnvelopeError("body is not a JSON object")
        event_id = _event_id(obj)
        return Delivery(hook=HOOK, key=self._key(dsn, event_id, data), event_id=event_id,
                        events=[self._event(obj, dsn, "event")])

    @staticmethod
    def _key(dsn, event_id: str | None, data: bytes) -> str:
        return f"{dsn.project}:{event_id or hashlib.sha256(data).hexdigest()}"

    def metrics(self) -> str:
        """Prometheus text for what this process's Sentry endpoint received (counters reset on restart)."""
        with self._lock:
            counts = sorted(self._counts.items())
        out = ["# HELP agent_sentry_items_total Sentry SDK items received, by outcome and item type.",
               "# TYPE agent_sentry_items_total counter"]
        out += [f'agent_sentry_items_total{{outcome="{o}",type="{_label(t)}"}} {n}' for (o, t), n in counts]
        return "\n".join(out) + "\n"


def _event_id(obj: dict) -> str | None:
    value = obj.get("event_id")
    return value if isinstance(value, str) and 0 < len(value) <= 64 else None


def _label(value: str) -> str:
    return "".join(c for c in value if c.isalnum() or c in "_-.")


def dsn_url(base_url: str, project: str, key: str) -> str:
    """``http://KEY@HOST:PORT/PROJECT`` for an SDK, from where `agent serve` is reached."""
    scheme, rest = base_url.split("://", 1)
    host, _, path = rest.partition("/")
    prefix = f"/{path.strip('/')}" if path.strip("/") else ""
    return f"{scheme}://{key}@{host}{prefix}/{project}"
