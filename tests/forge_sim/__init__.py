"""Stateful forge simulators (GitLab, Gitea/Forgejo) on 127.0.0.1 that check every call against an API schema.

``SimServer`` is a real HTTP server (``ThreadingHTTPServer`` on 127.0.0.1, port 0) run in a thread of the test
process; a subprocess (``agent watch ...``) talks to it like to a real forge.  Each simulator has a schema module
(``gitlab_schema``, ``gitea_schema``) derived from the forge's official API description, with the file and commit
cited there.  For every request:

- the route must be an operation of the schema (method + path template), else 404 and a *violation*;
- path parameters, query parameters (only those the operation declares, with their types) and the JSON body
  (``jsonschema``, additional properties refused) are validated; an invalid request is answered 400 (or 422
  where the forge does) and recorded as a violation;
- the simulator's own answer is validated against the operation's response schema for that status (a status the
  operation does not declare is itself a violation); an invalid answer is replaced by a 502 and recorded.

Tests assert ``sim.violations == []`` at the end, so a forge module that sends a field the forge does not know,
or a simulator answer that drifts from the description, fails loudly.  Nothing is mocked between the forge module
and the socket.

Faults are injected per request (``sim.fault(...)``): a status (5xx, 429 with headers), a delay longer than the
client's timeout, or ``drop``: do the work, then close the connection without an answer (a create that happened
but whose response was lost).
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

import jsonschema


def schema_ref(name: str, nullable: bool = False) -> dict:
    """``{"$ref": "#/definitions/NAME"}``, or NAME-or-null (a Go nil pointer, a documented nullable field)."""
    ref = {"$ref": f"#/definitions/{name}"}
    return {"anyOf": [ref, {"type": "null"}]} if nullable else ref


def schema_obj(props: dict, required: tuple = ()) -> dict:
    """An object with exactly these properties: anything the description does not name is refused."""
    out = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        out["required"] = list(required)
    return out


def schema_list(name: str) -> dict:
    return {"type": "array", "items": schema_ref(name)}


class FakeClock:
    """An injected clock and sleep: waits are recorded (``sleeps``) and advance the clock, nobody waits."""

    def __init__(self, t: float = 1_800_000_000.0):
        self.t = t
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.t += s


class Reply(Exception):
    """Raised by a handler to answer with ``status`` and ``body`` (validated like any answer)."""

    def __init__(self, status: int, body: Any = None, headers: dict | None = None):
        super().__init__(status)
        self.status = status
        self.body = body
        self.headers = headers or {}


@dataclass
class Fault:
    method: str
    path_re: str
    kind: str                       # status | delay | drop
    status: int = 500
    headers: dict = field(default_factory=dict)
    body: Any = None
    delay: float = 0.0
    times: int = 1
    raw: bytes | None = None        # a status fault's body that is not JSON (a proxy's HTML page)

    def matches(self, method: str, path: str) -> bool:
        return self.times > 0 and method == self.method and re.search(self.path_re, path) is not None


@dataclass
class Call:
    method: str
    path: str                       # without the base path, decoded per segment
    raw_path: str
    query: dict
    body: Any
    headers: dict
    status: int | None = None


def _template_re(template: str) -> re.Pattern:
    """``/projects/{id}/merge_requests/{merge_request_iid}`` -> a regex over the RAW (still encoded) path.

    A parameter matches one encoded segment; a parameter named ``*name`` (the schema writes ``{head*}``) matches
    the rest of the path, slashes included (Gitea's ``/pulls/{base}/{head}`` route takes ``*`` for head)."""
    out = "^"
    for part in re.split(r"(\{[^}]+\})", template):
        if part.startswith("{"):
            name = part[1:-1]
            out += f"(?P<{name[:-1]}>.+)" if name.endswith("*") else f"(?P<{name}>[^/]+)"
        else:
            out += re.escape(part)
    return re.compile(out + "$")


class Schema:
    """Operations and definitions of one forge API, as written in its schema module."""

    def __init__(self, module):
        self.module = module
        self.base_path: str = module.BASE_PATH
        self.definitions: dict = module.DEFINITIONS
        self.ops = []
        for op in module.OPERATIONS:
            specificity = (op["path"].count("{"), -len(op["path"]))
            self.ops.append((specificity, _template_re(op["path"]), op))
        # literal segments win over parameters (/pulls/pinned before /pulls/{index}), like the forges' routers
        self.ops.sort(key=lambda t: t[0])

    def _validator(self, schema: dict):
        full = {**schema, "definitions": self.definitions}
        return jsonschema.Draft7Validator(full)

    def errors(self, schema: dict | None, value: Any) -> list[str]:
        if schema is None:
            return []
        return [f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
                for e in self._validator(schema).iter_errors(value)]

    def match(self, method: str, raw_path: str) -> tuple[dict | None, dict]:
        for _, rx, op in self.ops:
            m = rx.match(raw_path)
            if m and op["method"] == method:
                return op, {k: unquote(v) for k, v in m.groupdict().items()}
        return None, {}

    def param_errors(self, op: dict, path_params: dict, query: dict) -> list[str]:
        errs = []
        for name, value in path_params.items():
            errs += [f"path {name}: {e}" for e in _scalar_errors(op.get("path_params", {}).get(name, {}), value)]
        declared = op.get("query", {})
        for name, value in query.items():
            if name not in declared:
                errs.append(f"query {name}: not a parameter of {op['id']}")
                continue
            errs += [f"query {name}: {e}" for e in _scalar_errors(declared[name], value)]
        for name, spec in declared.items():
            if spec.get("required") and name not in query:
                errs.append(f"query {name}: required")
        return errs


def _scalar_errors(spec: dict, value: str) -> list[str]:
    kind = spec.get("type", "string")
    if kind == "integer" and not re.fullmatch(r"-?\d+", value):
        return [f"{value!r} is not an integer"]
    if kind == "boolean" and value not in ("true", "false"):
        return [f"{value!r} is not a boolean"]
    if "enum" in spec and value not in spec["enum"]:
        return [f"{value!r} is not one of {spec['enum']}"]
    if kind == "string" and spec.get("minLength") and len(value) < spec["minLength"]:
        return [f"{value!r} is too short"]
    return []


class SimServer:
    """The HTTP side shared by the simulators: routing, validation, auth, faults, pagination, the call log."""

    name = "forge"
    invalid_request_status = 400

    def __init__(self, schema_module, token: str, prefix: str = ""):
        self.schema = Schema(schema_module)
        self.schema.base_path = prefix.rstrip("/") + self.schema.base_path   # self-managed under a sub path
        self.token = token
        self.lock = threading.RLock()
        self.violations: list[str] = []
        self.calls: list[Call] = []
        self.faults: list[Fault] = []
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}{self.schema.base_path}"

    def start(self) -> "SimServer":
        sim = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                sim._handle(self)

            do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

        class Server(ThreadingHTTPServer):
            def handle_error(self, request, client_address):  # a dropped connection is the point of a fault
                pass

        self._httpd = Server(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name=f"{self.name}-sim", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # ------------------------------------------------------------------ test controls

    def fault(self, method: str, path_re: str, kind: str = "status", **kw) -> Fault:
        f = Fault(method=method, path_re=path_re, kind=kind, **kw)
        with self.lock:
            self.faults.append(f)
        return f

    def calls_to(self, method: str, path_re: str) -> list[Call]:
        with self.lock:
            return [c for c in self.calls if c.method == method and re.search(path_re, c.path)]

    def assert_clean(self) -> None:
        assert self.violations == [], "\n".join(self.violations)

    # ------------------------------------------------------------------ for subclasses

    def authenticate(self, headers) -> dict | None:
        """The user the request's credentials belong to, or None (answered 401)."""
        raise NotImplementedError

    def dispatch(self, op_id: str, params: dict, query: dict, body: Any, user: dict,
                 raw_path: str) -> tuple[int, Any, dict]:
        raise NotImplementedError

    def paginate(self, items: list, query: dict, raw_path: str, size_param: str, default_size: int,
                 max_size: int) -> tuple[list, dict]:
        """One page of ``items`` and its headers: ``Link`` (next/prev/first/last) plus the forge's totals."""
        page = max(int(query.get("page", 1)), 1)
        size = min(max(int(query.get(size_param, default_size)), 1), max_size)
        start = (page - 1) * size
        chunk = items[start:start + size]
        last = max((len(items) + size - 1) // size, 1)
        base = f"{self.url}{raw_path}"

        def link(p: int) -> str:
            q = {**{k: v for k, v in query.items() if k != "page"}, "page": str(p)}
            return base + "?" + urlencode(q)

        links = []
        if page < last:
            links.append(f'<{link(page + 1)}>; rel="next"')
        if page > 1:
            links.append(f'<{link(page - 1)}>; rel="prev"')
        links.append(f'<{link(1)}>; rel="first"')
        links.append(f'<{link(last)}>; rel="last"')
        headers = {"Link": ", ".join(links)}
        headers.update(self.page_headers(page, size, last, len(items)))
        return chunk, headers

    def page_headers(self, page: int, size: int, last: int, total: int) -> dict:
        return {}

    # ------------------------------------------------------------------ the request path

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(h.path)
        method = h.command
        length = int(h.headers.get("Content-Length") or 0)
        raw_body = h.rfile.read(length) if length else b""
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        bp = self.schema.base_path
        raw_path = parts.path[len(bp):] if parts.path.startswith(bp) else parts.path
        call = Call(method=method, path=unquote(raw_path), raw_path=raw_path, query=query, body=None,
                    headers={k: v for k, v in h.headers.items()})
        with self.lock:
            self.calls.append(call)
            fault = next((f for f in self.faults if f.matches(method, call.path)), None)
            if fault is not None:
                fault.times -= 1
        try:
            if fault is not None and fault.kind == "status" and fault.raw is not None:
                return self._send_raw(h, call, fault.status, fault.raw, fault.headers)
            if fault is not None and fault.kind == "status":
                return self._send(h, call, fault.status, fault.body if fault.body is not None else
                                  {"message": f"simulated {fault.status}"}, fault.headers)
            if fault is not None and fault.kind == "delay":
                time.sleep(fault.delay)
            if not parts.path.startswith(bp):
                return self._violate(h, call, 404, f"{method} {parts.path}: outside the API base {bp}")
            op, params = self.schema.match(method, raw_path)
            if op is None:
                return self._violate(h, call, 404, f"{method} {raw_path}: no such operation in the schema")
            if raw_body:
                try:
                    call.body = json.loads(raw_body)
                except ValueError:
                    return self._violate(h, call, 400, f"{op['id']}: body is not JSON")
                if "body" not in op:
                    return self._violate(h, call, 400, f"{op['id']}: takes no body")
                ctype = h.headers.get("Content-Type", "")
                if "application/json" not in ctype:
                    return self._violate(h, call, 400, f"{op['id']}: Content-Type {ctype!r} is not JSON")
            elif op.get("body_required"):
                return self._violate(h, call, 400, f"{op['id']}: a JSON body is required")
            errs = self.schema.param_errors(op, params, query)
            if call.body is not None:
                errs += [f"body {e}" for e in self.schema.errors(op.get("body"), call.body)]
            if errs:
                return self._violate(h, call, self.invalid_request_status, f"{op['id']}: " + "; ".join(errs))
            user = self.authenticate(h.headers)
            if user is None:
                return self._send(h, call, 401, self.unauthorized_body(), {})
            try:
                with self.lock:
                    status, body, headers = self.dispatch(op["id"], params, query, call.body, user, raw_path)
            except Reply as r:
                status, body, headers = r.status, r.body, r.headers
            if fault is not None and fault.kind == "drop":
                call.status = -1
                h.close_connection = True
                try:
                    h.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                return None
            responses = op["responses"]
            if str(status) not in responses:
                return self._violate(h, call, 502, f"{op['id']}: answered {status}, which the schema does not "
                                                    f"declare ({', '.join(responses)})")
            rerrs = self.schema.errors(responses[str(status)], body) if body is not None else []
            if body is None and responses[str(status)] is not None:
                rerrs = ["empty body where the schema declares one"]
            if rerrs:
                return self._violate(h, call, 502, f"{op['id']} {status} response: " + "; ".join(rerrs[:5]))
            if h.headers.get("X-Sim-Corrupt-Response") and isinstance(body, dict):
                body = {**body, **self.corrupt_fields()}
                rerrs = self.schema.errors(responses[str(status)], body)
                if rerrs:
                    return self._send(h, call, 502, {"message": "invalid response: " + "; ".join(rerrs[:3])}, {})
            return self._send(h, call, status, body, headers)
        except (BrokenPipeError, ConnectionResetError):
            return None

    def corrupt_fields(self) -> dict:
        return {}

    def unauthorized_body(self) -> Any:
        return {"message": "401 Unauthorized"}

    def _violate(self, h, call: Call, status: int, message: str) -> None:
        with self.lock:
            self.violations.append(message)
        self._send(h, call, status, {"message": message}, {})

    def _send_raw(self, h, call: Call, status: int, data: bytes, headers: dict) -> None:
        call.status = status
        h.send_response(status)
        for k, v in {"Content-Type": "text/html; charset=utf-8", **headers}.items():
            h.send_header(k, str(v))
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _send(self, h, call: Call, status: int, body: Any, headers: dict) -> None:
        call.status = status
        data = b"" if body is None else json.dumps(body).encode()
        h.send_response(status)
        if body is not None:
            h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            h.send_header(k, str(v))
        h.end_headers()
        if data:
            h.wfile.write(data)


def now_iso(clock: Callable[[], float] = time.time) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(clock()))
