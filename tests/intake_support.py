"""Helpers for the intake tests: a real ledger, a config, and small local HTTP servers."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable
from urllib.parse import parse_qs, urlsplit

import yaml

from agent.app.context import App
from agent.config import parse_config


def make_app(home: Path, config: dict | None = None) -> App:
    home.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (home / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    app = App(home=home)
    return app


def config_of(data: dict):
    return parse_config(data)


class LocalServer:
    """An http.server on 127.0.0.1 in a thread; ``handler(method, path, query, headers) -> (status, headers, body)``.

    Every request is recorded in ``requests`` as (path, query dict, headers dict).
    """

    def __init__(self, handler: Callable):
        self.handler = handler
        self.requests: list[tuple[str, dict, dict]] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                parts = urlsplit(self.path)
                query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
                headers = {k: v for k, v in self.headers.items()}
                outer.requests.append((parts.path, query, headers))
                status, extra, body = outer.handler("GET", parts.path, query, headers)
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (extra or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
