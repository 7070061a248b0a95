"""A real HTTP proxy on 127.0.0.1 in front of the GitHub simulator that answers chosen requests with a fault
(a status with headers and a JSON or raw body), delays them, or forwards them and drops the answer.

The simulator cannot produce 5xx answers or rate limits on demand; this proxy forwards every request to it
unchanged unless a fault rule matches (method + path regex), in which case it answers that status with the
given headers itself.  It records every request that reached it, so a test can prove no call was made."""

from __future__ import annotations

import http.client
import json
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


@dataclass
class Fault:
    method: str
    path: str                          # a regex matched against the request path
    status: int
    headers: dict = field(default_factory=dict)
    body: dict = field(default_factory=lambda: {"message": "injected fault"})
    times: int | None = None           # None: until removed
    raw: bytes | None = None           # a body that is not JSON (a proxy's HTML page), sent as text/html
    kind: str = "status"               # status: answer it here; delay: wait, then forward; drop: forward, then
    delay: float = 0.0                 # close the connection without an answer (the work happened, the answer lost)


class FaultProxy:
    def __init__(self, upstream: str):
        self.upstream = urlsplit(upstream)
        self.faults: list[Fault] = []
        self.calls: list[list] = []     # [method, path, status answered (None: not yet, -1: dropped)]
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _any(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                fault = proxy._take(self.command, self.path)
                entry = proxy._log(self.command, self.path, None)          # on arrival: a test may look now
                if fault is not None and fault.kind == "delay":
                    time.sleep(fault.delay)
                if fault is not None and fault.kind == "status":
                    data = fault.raw if fault.raw is not None else json.dumps(fault.body).encode()
                    ctype = "text/html" if fault.raw is not None else "application/json"
                    self.send_response(fault.status)
                    for k, v in {"Content-Type": ctype, **fault.headers}.items():
                        self.send_header(k, str(v))
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    entry[2] = fault.status
                    self.wfile.write(data)
                    return
                conn = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                if fault is not None and fault.kind == "drop":
                    conn.close()
                    entry[2] = -1
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in HOP:
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                conn.close()
                entry[2] = resp.status

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _any

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):  # a client gone after a delay is the point
                pass

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _take(self, method: str, path: str) -> Fault | None:
        with self.lock:
            for f in self.faults:
                if f.method == method and re.search(f.path, path):
                    if f.times is not None:
                        f.times -= 1
                        if f.times <= 0:
                            self.faults.remove(f)
                    return f
        return None

    def _log(self, method: str, path: str, status: int | None) -> list:
        entry = [method, path, status]
        with self.lock:
            self.calls.append(entry)
        return entry

    def start(self) -> "FaultProxy":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
