"""Test helpers: a real HTTP receiver on 127.0.0.1 that records what it is sent, and a self-signed certificate."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class Receiver:
    """Records every POST (path, headers, body). ``codes`` answers the first requests with those statuses
    (then 200); ``hold`` makes the first request wait until ``release`` is set (it never answers otherwise)."""

    def __init__(self, codes: list[int] | None = None, hold: bool = False):
        self.requests: list[dict] = []
        self.codes = list(codes or [])
        self.hold = hold
        self.release = threading.Event()
        self.arrived = threading.Event()
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with outer.lock:
                    outer.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                    first = len(outer.requests) == 1
                    code = outer.codes.pop(0) if outer.codes else 200
                outer.arrived.set()
                if outer.hold and first:
                    outer.release.wait(60)
                    return  # never answer: the sender is killed while it waits
                self.send_response(code)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def json(self, i: int) -> dict:
        return json.loads(self.requests[i]["body"])

    def keys(self) -> list[str]:
        return [r["headers"].get("X-Agent-Delivery") for r in self.requests]

    def wait_for(self, n: int, timeout: float = 30) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(self.requests) >= n:
                return True
            time.sleep(0.02)
        return False

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def self_signed_cert(folder: Path) -> tuple[Path, Path]:
    """(cert, key) for 127.0.0.1/localhost, made with the openssl CLI."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key
