"""`agent serve`: webhook intake, the live status page, Prometheus metrics and a health check, on waitress.

Routes (everything else is 404, other methods 405):
- ``POST /hooks/events``: JSON lines as `agent error ingest` reads them; ``X-Agent-Signature: sha256=<hex>``,
  the HMAC-SHA256 of the body (with ``X-Agent-Timestamp: <unix seconds>``: of ``TIMESTAMP.BODY``) with the key in
  ``serve.events_secret_env`` (default ``AGENT_HOOK_SECRET``);
- ``POST /hooks/sentry``: Sentry integration webhooks; ``Sentry-Hook-Signature`` = HMAC-SHA256 hex of the body
  with the integration's client secret (``serve.sentry_secret_env``), ``Sentry-Hook-Timestamp`` within
  ``serve.replay_window``; resources without an error event are answered 200 and ignored;
- ``POST /hooks/alertmanager``: Alertmanager webhook version 4; ``Authorization: Bearer <token>``
  (``serve.alertmanager_token_env``);
- ``POST /api/<project>/envelope/`` and ``/store/``: Sentry's ingest protocol for SDKs (agent/intake/dsn.py);
- ``GET /`` the status page (agent/app/status.py's renderer; its script patches the summary from ``GET /status.json``),
  ``GET /tasks/N`` a task's timeline, ``GET /metrics`` (these need ``serve.read_token_env``'s token when set),
  ``GET /healthz`` (``{"ok": true|false}`` only).

A hook request is checked in this order, and nothing is stored unless it passes all of them: the secret is
configured (else 503 naming the variable), the body fits ``serve.max_body_bytes`` (413), the signature or token
matches (401), its timestamp is fresh (401), the content type is JSON/NDJSON (415), the body parses and every event
is valid (400 with one line naming the first problem). Every refusal is a JSON body (waitress's own too) and every
hook request is counted by outcome. Then the events take `agent error ingest`'s path (``formats.parse`` /
``store.ingest``: redaction, fingerprint, dedupe), in one transaction with the delivery's key (``hook_deliveries``),
on a connection with ``synchronous=FULL``: the 202 is sent only after that commit is on disk. A delivery whose key
(from signed content only) was accepted before is answered 200 ``replay`` and changes nothing.

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
IDLE_POLL_S = 1   # seconds the idle server loop sleeps in poll(); waitress takes whole seconds
STATUS = {200: "200 OK", 202: "202 Accepted", 400: "400 Bad Request", 401: "401 Unauthorized",
          404: "404 Not Found", 405: "405 Method Not Allowed", 413: "413 Payload Too Large",
          415: "415 Unsupported Media Type", 429: "429 Too Many Requests", 500: "500 Internal Server Error",
          503: "503 Service Unavailable"}
SENTRY_API = re.compile(r"/api/(\d{1,20})/(envelope|store)/?")
# agent_hook_requests_total{hook,outcome}: the outcome of a refusal, by its status code
OUTCOMES = {400: "invalid", 401: "unauthorized", 404: "not_found", 405: "method", 413: "too_large",
            415: "content_type", 429: "rate_limited", 500: "error", 503: "disabled"}
HOOKS = ("events", "sentry", "alertmanager")
# The page's one script: every REFRESH_S seconds it fetches /status.json and replaces the summary sections that
# changed, keeping <details> a person opened open (no reload: scroll position and the finished list stay).
def live_js(every_ms: int) -> str:
    return ("(function(){var last={};function tick(){fetch('status.json',{cache:'no-store',credentials:'same-origin'})"
           ".then(function(r){if(!r.ok)throw new Error('HTTP '+r.status);return r.json();}).then(function(d){"
           "Object.keys(d.sections).forEach(function(id){var el=document.getElementById(id);"
           "if(!el||last[id]===d.sections[id])return;var open=[];"
           "el.querySelectorAll('details[open]').forEach(function(x){open.push(x.id);});"
           "var tmp=document.createElement('div');tmp.innerHTML=d.sections[id];el.replaceWith(tmp.firstChild);"
           "last[id]=d.sections[id];open.forEach(function(i){var x=document.getElementById(i);if(x)x.open=true;});});"
           "document.getElementById('live-at').textContent=d.generated;}).catch(function(e){"
           "document.getElementById('live-at').textContent='update failed: '+e.message;});}"
            f"setInterval(tick,{int(every_ms)});}})();")


def csp(script: str) -> str:
    """The page's Content-Security-Policy: nothing from elsewhere, and only this one inline script."""
    import base64

    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    return ("default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; connect-src 'self'; base-uri 'none'; "
            f"form-action 'none'; frame-ancestors 'none'; script-src 'sha256-{digest}'")
JSON_TYPES = ("application/json",)
NDJSON_TYPES = ("application/x-ndjson", "application/jsonl", "application/x-jsonlines", "application/json")


class Reply(Exception):
    def __init__(self, code: int, message: str, outcome: str | None = None,
                 headers: list[tuple[str, str]] | tuple = (), **extra):
        super().__init__(message)
        self.code = code
        self.outcome = outcome or OUTCOMES.get(code, str(code))
        self.headers = list(headers or ())
        self.body = {"error" if code >= 400 else "result": message, **extra}


def _json(code: int, doc: dict) -> tuple[int, str, bytes]:
    return code, "application/json", (json.dumps(doc, sort_keys=True) + "\n").encode()


def _query_int(environ, name: str) -> int | None:
    from urllib.parse import parse_qs

    values = parse_qs(environ.get("QUERY_STRING") or "").get(name) or []
    if not values:
        return None
    if not values[0].isdigit() or len(values[0]) > 12:
        raise Reply(400, f"?{name}= takes a task id")
    return int(values[0])


def is_loopback(host: str) -> bool:
    import ipaddress

    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, config: Config, public: bool) -> str | None:
    """Refuse (AgentError) to serve the page and /metrics without a read token on an address other machines reach,
    unless ``public``; then return the one-line warning to print. None when nothing needs saying."""
    if is_loopback(host) or config.serve.read_token_env:
        return None
    if not public:
        raise AgentError(f"refusing to listen on {host} without a read token: anyone who reaches it would read the "
                         "status page and /metrics; set serve.read_token_env (a bearer token), bind 127.0.0.1, or "
                         "pass --public")
    return (f"serve: WARNING: listening on {host} with no read token (--public): the status page and /metrics are "
            "open to anyone who reaches this address")


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
        self._counts: dict[tuple[str, str], int] = {}
        self._count_lock = threading.Lock()
        self.refresh_s = REFRESH_S   # how often an open page fetches /status.json

    @property
    def script(self) -> str:
        return live_js(int(self.refresh_s * 1000))

    def count(self, path: str, outcome: str) -> None:
        """One hook request's outcome, for agent_hook_requests_total (this process's, since it started)."""
        hook = path[len("/hooks/"):] if path.startswith("/hooks/") else None
        if hook is None:
            return
        hook = hook if hook in HOOKS else "other"
        with self._count_lock:
            self._counts[(hook, outcome)] = self._counts.get((hook, outcome), 0) + 1

    def hook_counts(self) -> dict[tuple[str, str], int]:
        with self._count_lock:
            return dict(self._counts)

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
        extra: list = []
        try:
            code, ctype, body = self.route(method, path, environ)
            outcome = getattr(self._local, "outcome", "accepted")
        except Reply as r:
            (code, ctype, body), outcome, extra = _json(r.code, r.body), r.outcome, r.headers
        except AgentError as exc:
            (code, ctype, body), outcome = _json(503, {"error": str(exc)}), "unavailable"
        self._local.outcome = "accepted"
        self.count(path, outcome)
        headers = [("Content-Type", ctype), ("Content-Length", str(len(body))), ("Cache-Control", "no-store"),
                   ("X-Content-Type-Options", "nosniff"), *extra]
        if ctype.startswith("text/html"):
            headers += [("Content-Security-Policy", csp(self.script)), ("Referrer-Policy", "no-referrer")]
        if code == 405:
            headers.append(("Allow", "POST" if path.startswith("/hooks/") else "GET"))
        start_response(STATUS[code], headers)
        return [body]

    def route(self, method: str, path: str, environ) -> tuple[int, str, bytes]:
        hooks = {"/hooks/events": self.hook_events, "/hooks/sentry": self.hook_sentry,
                 "/hooks/alertmanager": self.hook_alertmanager}
        pages = {"/": lambda: self.page_status(environ), "/status.json": lambda: self.page_status_json(environ),
                 "/metrics": self.page_metrics, "/healthz": self.page_health}
        task = re.fullmatch(r"/tasks/([0-9]{1,12})", path)
        if path in hooks:
            if method != "POST":
                raise Reply(405, f"{path} takes POST")
            return hooks[path](environ)
        if path in pages or task:
            if method not in ("GET", "HEAD"):
                raise Reply(405, f"{path} is read-only; use GET")
            if path != "/healthz":
                self._read_auth(environ)
            return self.page_task(int(task.group(1))) if task else pages[path]()
        sentry = SENTRY_API.fullmatch(path)
        if sentry:
            if method != "POST":
                raise Reply(405, f"{path} takes POST (Sentry's ingest protocol)")
            return self.sentry_api(environ, sentry.group(1), sentry.group(2))
        raise Reply(404, f"no route {path}; see /healthz, /metrics, /, /tasks/N, /hooks/events|sentry|alertmanager")

    def _read_auth(self, environ) -> None:
        """``serve.read_token_env``: the page and /metrics need ``Authorization: Bearer <token>`` (or HTTP Basic
        with the token as password, so a browser can ask for it)."""
        import base64

        var = self.config.serve.read_token_env
        if not var:
            return
        token = self.env.get(var)
        if not token:
            raise Reply(503, f"read access disabled: environment variable {var} (serve.read_token_env) is not set "
                             "where agent serve runs; set it and restart")
        given = environ.get("HTTP_AUTHORIZATION") or ""
        scheme, _, value = given.partition(" ")
        if scheme.lower() == "basic":
            try:
                value = base64.b64decode(value.strip(), validate=True).decode().partition(":")[2]
            except (ValueError, UnicodeDecodeError):
                value = ""
        elif scheme.lower() != "bearer":
            value = ""
        if not (value and hmac.compare_digest(value.strip().encode(), token.encode())):
            raise Reply(401, f"Authorization: Bearer <token> missing or wrong (the token in {var})",
                        headers=(("WWW-Authenticate", 'Bearer realm="agent", Basic realm="agent"'),))

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
    def _content_type(environ, allowed: tuple[str, ...]) -> None:
        given = (environ.get("CONTENT_TYPE") or "").split(";")[0].strip().lower()
        if given not in allowed:
            raise Reply(415, f"Content-Type {given or '(none)'} is not accepted here; send {allowed[0]}"
                             f"{' (or ' + ', '.join(allowed[1:]) + ')' if len(allowed) > 1 else ''}; nothing stored")

    def _fresh(self, header: str, value: str | None) -> None:
        """A delivery's timestamp (Unix seconds) within ``serve.replay_window`` of now, else 401 ``stale``."""
        window = self.config.serve.replay_window
        try:
            ts = float((value or "").strip())
        except ValueError:
            raise Reply(401, f"{header} missing or not Unix seconds; nothing stored", outcome="stale") from None
        off = time.time() - ts
        if abs(off) > window:
            raise Reply(401, f"{header} is {int(abs(off))} s {'old' if off > 0 else 'in the future'}, outside the "
                             f"{window} s window (serve.replay_window): a replayed or delayed delivery; nothing "
                             "stored", outcome="stale")

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
            self._local.outcome = "replay"
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
        stamp = environ.get("HTTP_X_AGENT_TIMESTAMP")
        signed = body if stamp is None else stamp.strip().encode() + b"." + body
        if not self._hmac_ok(secret, signed, environ.get("HTTP_X_AGENT_SIGNATURE"), "sha256="):
            raise Reply(401, "X-Agent-Signature missing or wrong: send sha256=<hex HMAC-SHA256 of the body> (with "
                             "X-Agent-Timestamp: of TIMESTAMP.BODY); nothing stored")
        if stamp is None and self.config.serve.require_timestamp:
            raise Reply(401, "X-Agent-Timestamp required (serve.require_timestamp): send Unix seconds and sign "
                             "TIMESTAMP.BODY; nothing stored", outcome="stale")
        if stamp is not None:
            self._fresh("X-Agent-Timestamp", stamp)
        self._content_type(environ, NDJSON_TYPES)
        parsed = parse(self._text(body), "jsonl")
        self._first_rejection(parsed)
        if not parsed.events:
            raise Reply(400, "no events in the body; send one JSON object per line")
        return self._store("events", hashlib.sha256(signed).hexdigest(), parsed.events)

    def hook_sentry(self, environ) -> tuple[int, str, bytes]:
        from agent.intake.formats import parse

        secret = self._secret(self.config.serve.sentry_secret_env, "sentry_secret_env")
        body = self._body(environ)
        if not self._hmac_ok(secret, body, environ.get("HTTP_SENTRY_HOOK_SIGNATURE")):
            raise Reply(401, "Sentry-Hook-Signature missing or wrong (HMAC-SHA256 of the body with the "
                             "integration's client secret); nothing stored")
        self._fresh("Sentry-Hook-Timestamp", environ.get("HTTP_SENTRY_HOOK_TIMESTAMP"))
        self._content_type(environ, JSON_TYPES)
        text = self._text(body)
        try:
            json.loads(text)
        except ValueError as exc:
            raise Reply(400, f"body is not JSON ({exc.args[0].split(':')[0]}); nothing stored") from None
        resource = environ.get("HTTP_SENTRY_HOOK_RESOURCE") or ""
        if resource and resource not in ("event_alert", "error"):
            self._local.outcome = "ignored"
            return _json(200, {"result": f"ignored: resource {resource} carries no error event"})
        parsed = parse(text, "sentry")
        self._first_rejection(parsed)
        if not parsed.events:
            self._local.outcome = "ignored"
            return _json(200, {"result": "ignored: no error event in the payload"})
        # the key comes from what the signature covers: Request-ID is not signed, so a captured delivery re-sent
        # with a new id would otherwise count its error again (and feed the auto-decide threshold)
        return self._store("sentry", "body:" + hashlib.sha256(body).hexdigest(), parsed.events)

    def hook_alertmanager(self, environ) -> tuple[int, str, bytes]:
        from agent.intake.alertmanager import parse_alertmanager

        token = self._secret(self.config.serve.alertmanager_token_env, "alertmanager_token_env")
        body = self._body(environ)
        given = environ.get("HTTP_AUTHORIZATION") or ""
        if not (given[:7].lower() == "bearer " and hmac.compare_digest(given[7:].strip().encode(), token.encode())):
            raise Reply(401, "Authorization: Bearer <token> missing or wrong; nothing stored")
        self._content_type(environ, JSON_TYPES)
        try:
            doc = json.loads(self._text(body))
        except ValueError as exc:
            raise Reply(400, f"body is not JSON ({exc.args[0].split(':')[0]}); nothing stored") from None
        parsed = parse_alertmanager(doc)
        self._first_rejection(parsed)
        if not parsed.events:
            self._local.outcome = "ignored"
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

    def _gather(self, led):
        from agent.app.status import gather

        return gather(led, config=self.config)

    def page_status(self, environ) -> tuple[int, str, bytes]:
        from agent.app.status import FINISHED_PAGE, render_html
        from agent.ledger import status

        led = self._ledger(write=False)
        before = _query_int(environ, "before")
        data = self._gather(led)
        finished = status.finished_tasks(led, FINISHED_PAGE + 1, before)
        older = f"?before={finished[FINISHED_PAGE - 1]['id']}" if len(finished) > FINISHED_PAGE else None
        live = (f"<p id='live'>live: updates every {self.refresh_s:g} s without reloading · read-only · "
                f"<span id='live-at'>{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC</span></p>")
        page = render_html(led, data, href=lambda i: f"tasks/{i}", older=older, live=live,
                           head=f"<meta name='generator' content='agent serve'><script>{self.script}</script>",
                           finished=finished[:FINISHED_PAGE])
        return 200, "text/html; charset=utf-8", page.encode()

    def page_status_json(self, environ) -> tuple[int, str, bytes]:
        """What an open page fetches every few seconds: the summary's sections as HTML fragments by id."""
        from agent.app.status import summary_sections

        data = self._gather(self._ledger(write=False))
        return _json(200, {"generated": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                           "sections": summary_sections(data, href=lambda i: f"tasks/{i}")})

    def page_task(self, task_id: int) -> tuple[int, str, bytes]:
        from agent.app.status import render_task_page

        page = render_task_page(self._ledger(write=False), task_id, back="../")
        if page is None:
            raise Reply(404, f"no task {task_id}")
        return 200, "text/html; charset=utf-8", page.encode()

    def page_metrics(self) -> tuple[int, str, bytes]:
        from agent.ledger.metrics import gather

        m = gather(self._ledger(write=False))
        m["hook_requests"] = [{"hook": h, "outcome": o, "n": n} for (h, o), n in sorted(self.hook_counts().items())]
        text = prometheus(m) + self.sentry.metrics()
        return 200, "text/plain; version=0.0.4; charset=utf-8", text.encode()

    def page_health(self) -> tuple[int, str, bytes]:
        """``{"ok": true}`` or 503 ``{"ok": false}``: nothing else (no path, no error text) to whoever asks."""
        try:
            self._ledger(write=False).migrations()   # reads the ledger: any failure to read is unhealthy
        except Exception:  # noqa: BLE001 - any failure to read is unhealthy
            return _json(503, {"ok": False})
        return _json(200, {"ok": True})


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

    def family(name: str, kind: str, help_: str, samples: Iterable[tuple[dict, float]], suffix: str = "") -> None:
        """One family; for a summary, ``samples`` carry the suffix of each line (``_sum``, ``_count``) as
        ``labels["__suffix__"]``."""
        out.append(f"# HELP {name} {help_}")
        out.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            labels = dict(labels)
            line = name + labels.pop("__suffix__", suffix)
            lab = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
            out.append(f"{line}{{{lab}}} {float(value):g}" if lab else f"{line} {float(value):g}")

    from agent.app.status import ERROR_STATES, PR_STATES, TASK_STATES

    def by_state(rows, states):
        found = {r["state"]: r["n"] for r in rows}
        return [({"state": s}, found.get(s, 0)) for s in dict.fromkeys((*states, *found))]

    family("agent_errors", "gauge", "Errors by state.", by_state(m["errors"], ERROR_STATES))
    family("agent_tasks", "gauge", "Tasks by state.", by_state(m["tasks"], TASK_STATES))
    family("agent_prs", "gauge", "Pull requests by state.", by_state(m["prs"], PR_STATES))
    family("agent_lane_runs_total", "counter", "Lane runs by vendor, role and outcome.",
           [({"vendor": r["vendor"], "role": r["role"], "status": r["status"]}, r["n"]) for r in m["lane_runs"]])
    family("agent_lane_run_duration_seconds", "summary", "Wall time of finished lane runs.",
           [sample for r in m["lane_durations"]
            for sample in (({"__suffix__": "_sum", "vendor": r["vendor"], "role": r["role"]}, r["seconds"]),
                           ({"__suffix__": "_count", "vendor": r["vendor"], "role": r["role"]}, r["n"]))])
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
    family("agent_hook_requests_total", "counter", "Webhook requests by hook and outcome (accepted, replay, "
           "ignored, unauthorized, stale, invalid, too_large, content_type, disabled, ...), since this server "
           "started.", [({"hook": r["hook"], "outcome": r["outcome"]}, r["n"]) for r in m.get("hook_requests", [])])
    import platform

    from agent import __version__

    family("agent_build_info", "gauge", "The agent version and Python serving these metrics.",
           [({"version": __version__, "python": platform.python_version()}, 1)])
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- running it


def _json_channel(app: "HookApp"):
    """waitress's channel with its own refusals (413 over the size limit, 400 for a bad Content-Length or a
    malformed request line, 500) answered as JSON like every other refusal, and counted per hook."""
    from waitress.channel import HTTPChannel
    from waitress.task import ErrorTask

    class JsonErrorTask(ErrorTask):
        def execute(self):
            e = self.request.error
            code = int(e.code)
            detail = (f"body over the limit of {app.config.serve.max_body_bytes} bytes (serve.max_body_bytes); "
                      "nothing stored") if code == 413 else " ".join(str(e.body).split())
            body = (json.dumps({"error": f"{e.reason}: {detail}"}, sort_keys=True) + "\n").encode()
            app.count(getattr(self.request, "path", "") or "", OUTCOMES.get(code, str(code)))
            self.status = f"{code} {e.reason}"
            self.response_headers.extend([("Content-Type", "application/json"), ("Cache-Control", "no-store")])
            self.set_close_on_finish()
            self.content_length = len(body)
            self.write(body)

    class JsonChannel(HTTPChannel):
        error_task_class = JsonErrorTask

    return JsonChannel


class Server:
    """waitress on host:port in this process; ``start()`` returns once the socket listens."""

    def __init__(self, app: HookApp, host: str = "127.0.0.1", port: int = 8080, threads: int = 8):
        import logging

        from waitress.server import create_server

        self.app = app
        # waitress warns "Task queue depth is N" whenever a request waits for a free thread: under a burst of
        # hooks that is one log line per request, and the wait is already visible as latency in /metrics.
        logging.getLogger("waitress.queue").setLevel(logging.ERROR)
        # asyncore_loop_timeout is an int in waitress's adjustments: 0.25 became 0 and the loop polled without
        # sleeping (a whole core while idle). One second is how long an idle loop sleeps; a request wakes it.
        try:
            self.server = create_server(app, host=host, port=port, threads=threads, ident="agent",
                                        max_request_body_size=app.config.serve.max_body_bytes + 1,
                                        clear_untrusted_proxy_headers=True, expose_tracebacks=False,
                                        asyncore_use_poll=True, asyncore_loop_timeout=IDLE_POLL_S)
        except OSError as exc:
            import errno

            what = {errno.EADDRINUSE: "the address is already in use (another agent serve?); stop it or pick "
                                      "another --port",
                    errno.EACCES: "permission denied (ports below 1024 need privileges); pick --port 8080 or "
                                  "higher"}.get(exc.errno, exc.strerror or str(exc))
            raise AgentError(f"cannot listen on {host}:{port}: {what}") from None
        self.server.channel_class = _json_channel(app)
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
        from agent.flows import notify

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


def run_serve(app, host: str, port: int, echo: Callable[[str], None] = print, public: bool = False) -> None:
    """`agent serve`: the server and the delivery thread until SIGTERM/SIGINT (``agent.infra.shutdown``'s handling)."""
    from agent.infra.shutdown import STOP, graceful_stop

    app.require_home()
    config = app.config
    warning = check_exposure(host, config, public)
    app.ledger  # noqa: B018 - creates or migrates the ledger before the threads open theirs
    server = Server(HookApp(app.home, config), host, port)
    if warning:
        echo(warning)
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
