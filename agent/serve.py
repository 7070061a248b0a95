"""`agent serve`: webhook intake, the live status page, Prometheus metrics and a health check, on waitress.

Routes (everything else is 404, other methods 405):
- ``POST /hooks/events``: JSON lines as `agent error ingest` reads them; ``X-Agent-Signature: sha256=<hex>``,
  the HMAC-SHA256 of the body with the key in ``serve.events_secret_env`` (default ``AGENT_HOOK_SECRET``);
- ``POST /hooks/sentry``: Sentry integration webhooks; ``Sentry-Hook-Signature`` = HMAC-SHA256 hex of the body
  with the integration's client secret (``serve.sentry_secret_env``); resources without an error event
  (installation, issue, comment, metric alerts) are answered 200 and ignored;
- ``POST /hooks/alertmanager``: Alertmanager webhook version 4; ``Authorization: Bearer <token>``
  (``serve.alertmanager_token_env``);
- ``GET /`` the status page (agent/status.py's renderer, refreshing itself every 5 s), ``GET /metrics``,
  ``GET /healthz``.

A hook request is checked in this order, and nothing is stored unless it passes all of them: the secret is
configured (else 503 naming the variable), the body fits ``serve.max_body_bytes`` (413), the signature or token
matches (401), the body parses and every event is valid (400 with one line naming the first problem). Then the
events take `agent error ingest`'s path (``formats.parse`` / ``store.ingest``: redaction, fingerprint, dedupe),
in one transaction with the delivery's key (``hook_deliveries``), on a connection with ``synchronous=FULL``: the
202 is sent only after that commit is on disk. A delivery whose key was accepted before (the sender's delivery
id, else the body's SHA-256) is answered 200 ``replay`` and changes nothing.

GET handlers read through a connection with ``PRAGMA query_only``: the page and metrics cannot write.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, Mapping

from agent import AgentError
from agent.config import Config
from agent.ledger import Ledger, ledger_path

REFRESH_S = 5
STATUS = {200: "200 OK", 202: "202 Accepted", 400: "400 Bad Request", 401: "401 Unauthorized",
          404: "404 Not Found", 405: "405 Method Not Allowed", 413: "413 Payload Too Large",
          415: "415 Unsupported Media Type", 429: "429 Too Many Requests", 500: "500 Internal Server Error",
          503: "503 Service Unavailable"}
SENTRY_API = re.compile(r"/api/(\d{1,20})/(envelope|store)/?")


class Reply(Exception):
    def __init__(self, code: int, message: str, headers: list[tuple[str, str]] | None = None, **extra):
        super().__init__(message)
        self.code = code
        self.headers = headers or []
        self.body = {"error" if code >= 400 else "result": message, **extra}


def _json(code: int, doc: dict) -> tuple[int, str, bytes]:
    return code, "application/json", (json.dumps(doc, sort_keys=True) + "\n").encode()


class HookApp:
    """The WSGI application. One ledger connection per server thread (SQLite connections are not shared)."""

    def __init__(self, home: Path, config: Config, env: Mapping[str, str] | None = None):
        self.home = Path(home)
        self.config = config
        self.env = os.environ if env is None else env
        self._local = threading.local()
        self._commits = GroupCommit()
        from agent.intake.dsn import SentryIngest

        self.sentry = SentryIngest(config.serve, self.env)

    # ------------------------------------------------------------------ connections

    def _ledger(self, write: bool) -> Ledger:
        attr = "writer" if write else "reader"
        led = getattr(self._local, attr, None)
        if led is None:
            led = Ledger.open(ledger_path(self.home), create=False)
            if write:
                led.durable_commits()  # a 202 means the events are on disk
            else:
                led.read_only()
            setattr(self._local, attr, led)
        return led

    # ------------------------------------------------------------------ WSGI

    def __call__(self, environ, start_response):
        method = environ.get("REQUEST_METHOD", "GET")
        path = environ.get("PATH_INFO", "/") or "/"
        extra: list[tuple[str, str]] = []
        try:
            code, ctype, body = self.route(method, path, environ)
        except Reply as r:
            code, ctype, body = _json(r.code, r.body)
            extra = r.headers
        except AgentError as exc:
            code, ctype, body = _json(503, {"error": str(exc)})
        headers = [("Content-Type", ctype), ("Content-Length", str(len(body))), ("Cache-Control", "no-store"),
                   *extra]
        if code == 405:
            headers.append(("Allow", "POST" if path.startswith("/hooks/") else "GET"))
        start_response(STATUS[code], headers)
        return [body]

    def route(self, method: str, path: str, environ) -> tuple[int, str, bytes]:
        hooks = {"/hooks/events": self.hook_events, "/hooks/sentry": self.hook_sentry,
                 "/hooks/alertmanager": self.hook_alertmanager}
        pages = {"/": self.page_status, "/metrics": self.page_metrics, "/healthz": self.page_health}
        if path in hooks:
            if method != "POST":
                raise Reply(405, f"{path} takes POST")
            return hooks[path](environ)
        if path in pages:
            if method not in ("GET", "HEAD"):
                raise Reply(405, f"{path} is read-only; use GET")
            return pages[path]()
        sentry = SENTRY_API.fullmatch(path)
        if sentry:
            if method != "POST":
                raise Reply(405, f"{path} takes POST (Sentry's ingest protocol)")
            return self.sentry_api(environ, sentry.group(1), sentry.group(2))
        raise Reply(404, f"no route {path}; see /healthz, /metrics, /, /hooks/events|sentry|alertmanager")

    # ------------------------------------------------------------------ hooks: common checks

    def _secret(self, var: str, key: str) -> str:
        value = self.env.get(var)
        if not value:
            raise Reply(503, f"hook disabled: environment variable {var} (serve.{key}) is not set where agent "
                             "serve runs; set it and restart")
        return value

    def _body(self, environ) -> bytes:
        limit = self.config.serve.max_body_bytes
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            raise Reply(400, "Content-Length is not a number") from None
        if length > limit:
            raise Reply(413, f"body of {length} bytes is over the limit of {limit} (serve.max_body_bytes)")
        body = environ["wsgi.input"].read(length if length else limit + 1)
        if len(body) > limit:
            raise Reply(413, f"body is over the limit of {limit} bytes (serve.max_body_bytes)")
        return body

    @staticmethod
    def _hmac_ok(secret: str, body: bytes, given: str | None, prefix: str = "") -> bool:
        want = prefix + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
        return bool(given) and hmac.compare_digest(want.encode(), given.strip().lower().encode())

    @staticmethod
    def _text(body: bytes) -> str:
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise Reply(400, f"body is not UTF-8 (byte {exc.start})") from None

    def _store(self, hook: str, key: str, events: list) -> tuple[int, str, bytes]:
        replay, result = self._commits.submit(hook, key, events, lambda: self._ledger(write=True))
        if replay:
            return _json(200, {"result": "replay: this delivery was accepted before; nothing changed",
                               "replay": True})
        return _json(202, {"result": "accepted", "replay": False, "new": result.new,
                           "deduplicated": result.deduplicated, "errors": result.error_ids})

    @staticmethod
    def _first_rejection(parsed) -> None:
        if parsed.rejected:
            r = parsed.rejected[0]
            more = f" (and {len(parsed.rejected) - 1} more)" if len(parsed.rejected) > 1 else ""
            raise Reply(400, f"line {r.line}: {r.reason}{more}; nothing stored")

    # ------------------------------------------------------------------ hooks

    def hook_events(self, environ) -> tuple[int, str, bytes]:
        from agent.intake.formats import parse

        secret = self._secret(self.config.serve.events_secret_env, "events_secret_env")
        body = self._body(environ)
        if not self._hmac_ok(secret, body, environ.get("HTTP_X_AGENT_SIGNATURE"), "sha256="):
            raise Reply(401, "X-Agent-Signature missing or wrong: send sha256=<hex HMAC-SHA256 of the body>; "
                             "nothing stored")
        parsed = parse(self._text(body), "jsonl")
        self._first_rejection(parsed)
        if not parsed.events:
            raise Reply(400, "no events in the body; send one JSON object per line")
        return self._store("events", hashlib.sha256(body).hexdigest(), parsed.events)

    def hook_sentry(self, environ) -> tuple[int, str, bytes]:
        from agent.intake.formats import parse

        secret = self._secret(self.config.serve.sentry_secret_env, "sentry_secret_env")
        body = self._body(environ)
        if not self._hmac_ok(secret, body, environ.get("HTTP_SENTRY_HOOK_SIGNATURE")):
            raise Reply(401, "Sentry-Hook-Signature missing or wrong (HMAC-SHA256 of the body with the "
                             "integration's client secret); nothing stored")
        text = self._text(body)
        try:
            json.loads(text)
        except ValueError as exc:
            raise Reply(400, f"body is not JSON ({exc.args[0].split(':')[0]}); nothing stored") from None
        resource = environ.get("HTTP_SENTRY_HOOK_RESOURCE") or ""
        if resource and resource not in ("event_alert", "error"):
            return _json(200, {"result": f"ignored: resource {resource} carries no error event"})
        parsed = parse(text, "sentry")
        self._first_rejection(parsed)
        if not parsed.events:
            return _json(200, {"result": "ignored: no error event in the payload"})
        key = environ.get("HTTP_REQUEST_ID") or hashlib.sha256(body).hexdigest()
        return self._store("sentry", key, parsed.events)

    def hook_alertmanager(self, environ) -> tuple[int, str, bytes]:
        from agent.intake.alertmanager import parse_alertmanager

        token = self._secret(self.config.serve.alertmanager_token_env, "alertmanager_token_env")
        body = self._body(environ)
        given = environ.get("HTTP_AUTHORIZATION") or ""
        if not (given[:7].lower() == "bearer " and hmac.compare_digest(given[7:].strip().encode(), token.encode())):
            raise Reply(401, "Authorization: Bearer <token> missing or wrong; nothing stored")
        try:
            doc = json.loads(self._text(body))
        except ValueError as exc:
            raise Reply(400, f"body is not JSON ({exc.args[0].split(':')[0]}); nothing stored") from None
        parsed = parse_alertmanager(doc)
        self._first_rejection(parsed)
        if not parsed.events:
            return _json(200, {"result": "ignored: no firing alerts"})
        return self._store("alertmanager", hashlib.sha256(body).hexdigest(), parsed.events)

    def sentry_api(self, environ, project: str, kind: str) -> tuple[int, str, bytes]:
        """Sentry's ingest protocol for unmodified SDKs (agent/intake/dsn.py does the checks and parsing)."""
        from agent.intake.dsn import Refused

        try:
            delivery = self.sentry.receive(project, kind, environ, self._body)
        except Refused as r:
            raise Reply(r.code, str(r), headers=r.headers) from None
        if not delivery.events:
            return _json(200, {"id": delivery.event_id})
        self._store(delivery.hook, delivery.key, delivery.events)   # a replayed event id changes nothing
        return _json(200, {"id": delivery.event_id})

    # ------------------------------------------------------------------ pages

    def page_status(self) -> tuple[int, str, bytes]:
        from agent.status import gather, render_html

        led = self._ledger(write=False)
        page = render_html(led, gather(led))
        live = (f"<meta http-equiv='refresh' content='{REFRESH_S}'>"
                f"<meta name='generator' content='agent serve'>")
        page = page.replace("<meta charset='utf-8'>", "<meta charset='utf-8'>" + live, 1)
        page = page.replace("<h1>agent status</h1>",
                            f"<h1>agent status</h1><p id='live'>live: refreshes every {REFRESH_S} s · read-only · "
                            f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC</p>", 1)
        return 200, "text/html; charset=utf-8", page.encode()

    def page_metrics(self) -> tuple[int, str, bytes]:
        from agent.ledger.metrics import gather

        text = prometheus(gather(self._ledger(write=False))) + self.sentry.metrics()
        return 200, "text/plain; version=0.0.4; charset=utf-8", text.encode()

    def page_health(self) -> tuple[int, str, bytes]:
        led = self._ledger(write=False)
        try:
            led.migrations()   # reads the ledger: any failure to read is unhealthy
        except Exception as exc:  # noqa: BLE001 - any failure to read is unhealthy
            return _json(503, {"ok": False, "error": f"ledger not readable: {type(exc).__name__}"})
        return _json(200, {"ok": True, "ledger": str(led.path)})


class _Job:
    __slots__ = ("hook", "key", "events", "done", "result", "error")

    def __init__(self, hook: str, key: str, events: list):
        self.hook, self.key, self.events = hook, key, events
        self.done, self.result, self.error = False, None, None


class GroupCommit:
    """Hook deliveries arriving together share one write transaction and one fsync (group commit).

    The first request to find no writer becomes the writer: it takes every delivery queued so far, stores them in
    one transaction on its own connection (``ledger.hooks.accept_batch``), and wakes their requests; the others
    wait meanwhile, so threads queue here, not in SQLite's sleeping busy handler. If the batch fails, each delivery
    is retried alone, so one bad delivery fails only its own request. A request is answered only after the commit
    that holds its events."""

    def __init__(self, max_batch: int = 64):
        self.max_batch = max_batch
        self._cv = threading.Condition()
        self._queue: list[_Job] = []
        self._writing = False

    def submit(self, hook: str, key: str, events: list, ledger: Callable[[], Ledger]) -> tuple[bool, object]:
        job = _Job(hook, key, events)
        with self._cv:
            self._queue.append(job)
            while not job.done:
                if self._writing:
                    self._cv.wait()
                    continue
                self._writing = True
                batch, self._queue = self._queue[:self.max_batch], self._queue[self.max_batch:]
                self._cv.release()
                try:
                    self._write(ledger, batch)
                finally:
                    self._cv.acquire()
                    self._writing = False
                    self._cv.notify_all()
        if job.error is not None:
            raise job.error
        return job.result

    @staticmethod
    def _write(ledger: Callable[[], Ledger], batch: list[_Job]) -> None:
        from agent.intake.store import ingest
        from agent.ledger.hooks import accept, accept_batch

        try:
            led = ledger()
        except Exception as exc:  # noqa: BLE001 - every request of the batch gets the error, none waits forever
            for job in batch:
                job.error, job.done = exc, True
            return

        def store(job: _Job):
            return lambda: ingest(led, job.events, actor="script", source=f"hook:{job.hook}", batch=None)

        try:
            results = accept_batch(led, [(j.hook, j.key, store(j)) for j in batch])
        except Exception:  # noqa: BLE001 - retried one by one below: one bad delivery must not fail the others
            results = None
        for i, job in enumerate(batch):
            try:
                job.result = results[i] if results is not None else accept(led, job.hook, job.key, store(job))
            except Exception as exc:  # noqa: BLE001 - raised again in the request that sent it
                job.error = exc
            job.done = True


# --------------------------------------------------------------------------- Prometheus text format


def _label(value) -> str:
    return str(value if value is not None else "").replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def prometheus(m: dict) -> str:
    """Prometheus text exposition format 0.0.4."""
    out: list[str] = []

    def family(name: str, kind: str, help_: str, samples: Iterable[tuple[dict, float]]) -> None:
        out.append(f"# HELP {name} {help_}")
        out.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            lab = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
            out.append(f"{name}{{{lab}}} {float(value):g}" if lab else f"{name} {float(value):g}")

    from agent.status import ERROR_STATES, PR_STATES, TASK_STATES

    def by_state(rows, states):
        found = {r["state"]: r["n"] for r in rows}
        return [({"state": s}, found.get(s, 0)) for s in dict.fromkeys((*states, *found))]

    family("agent_errors", "gauge", "Errors by state.", by_state(m["errors"], ERROR_STATES))
    family("agent_tasks", "gauge", "Tasks by state.", by_state(m["tasks"], TASK_STATES))
    family("agent_prs", "gauge", "Pull requests by state.", by_state(m["prs"], PR_STATES))
    family("agent_lane_runs_total", "counter", "Lane runs by vendor, role and outcome.",
           [({"vendor": r["vendor"], "role": r["role"], "status": r["status"]}, r["n"]) for r in m["lane_runs"]])
    family("agent_lane_run_duration_seconds_sum", "counter", "Total wall time of finished lane runs.",
           [({"vendor": r["vendor"], "role": r["role"]}, r["seconds"]) for r in m["lane_durations"]])
    family("agent_lane_run_duration_seconds_count", "counter", "Finished lane runs with a duration.",
           [({"vendor": r["vendor"], "role": r["role"]}, r["n"]) for r in m["lane_durations"]])
    family("agent_cost_usd_total", "counter", "Money spent on lanes, USD.",
           [({"vendor": r["vendor"], "role": r["role"]}, r["usd"]) for r in m["cost"]])
    family("agent_notify_deliveries", "gauge", "Notification deliveries by channel and state.",
           [({"channel": r["channel"], "state": r["state"]}, r["n"]) for r in m["deliveries"]])
    family("agent_notify_outbox_unexpanded", "gauge", "Outbox rows not yet given deliveries.",
           [({}, m["outbox_pending"] or 0)])
    family("agent_hook_deliveries_total", "counter", "Webhook deliveries accepted, by hook.",
           [({"hook": r["hook"]}, r["deliveries"]) for r in m["hooks"]])
    family("agent_hook_events_total", "counter", "Events received through webhooks, by hook.",
           [({"hook": r["hook"]}, r["events"]) for r in m["hooks"]])
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- running it


class Server:
    """waitress on host:port in this process; ``start()`` returns once the socket listens."""

    def __init__(self, app: HookApp, host: str = "127.0.0.1", port: int = 8080, threads: int = 8):
        from waitress.server import create_server

        self.app = app
        self.server = create_server(app, host=host, port=port, threads=threads, ident="agent",
                                    max_request_body_size=app.config.serve.max_body_bytes,
                                    clear_untrusted_proxy_headers=True, expose_tracebacks=False,
                                    asyncore_use_poll=True, asyncore_loop_timeout=0.25)
        self.host, self.port = self.server.effective_host, self.server.effective_port
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def serve_forever(self) -> None:
        self.server.run()

    def start(self) -> "Server":
        self._thread = threading.Thread(target=self.serve_forever, name="agent-serve", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self.server.close()
        if self._thread is not None:
            self._thread.join(timeout=5)


def delivery_loop(home: Path, config: Config, stop: threading.Event, every: float = 5.0,
                  echo: Callable[[str], None] = print) -> threading.Thread:
    """A background thread delivering the notification outbox every ``every`` seconds until ``stop``."""

    def loop():
        from agent import notify

        led = Ledger.open(ledger_path(home), create=False)
        try:
            while not stop.is_set():
                try:
                    for item in notify.deliver(led, config):
                        echo(item["line"])
                except Exception as exc:  # noqa: BLE001 - a failing pass must not end the server
                    echo(f"serve: notify pass failed: {type(exc).__name__}: {exc}")
                stop.wait(every)
        finally:
            led.close()

    t = threading.Thread(target=loop, name="agent-notify", daemon=True)
    t.start()
    return t


def run_serve(app, host: str, port: int, echo: Callable[[str], None] = print) -> None:
    """`agent serve`: the server and the delivery thread until SIGTERM/SIGINT (``agent.shutdown``'s handling)."""
    from agent.shutdown import STOP, graceful_stop

    app.require_home()
    app.ledger  # noqa: B018 - creates or migrates the ledger before the threads open theirs
    config = app.config
    server = Server(HookApp(app.home, config), host, port)
    stop = threading.Event()
    with graceful_stop(echo, who="serve"):
        server.start()
        delivery_loop(app.home, config, stop, echo=echo)
        echo(f"serve: listening on {server.url} (status /, /metrics, /healthz, /hooks/events|sentry|alertmanager)")
        try:
            while not STOP.wait(0.5):
                pass
        finally:
            stop.set()
            server.close()
    echo("serve: stopped")
