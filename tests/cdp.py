"""A small Chrome DevTools Protocol client over ``--remote-debugging-pipe`` (stdlib only): start headless
Chromium, open a page, evaluate JavaScript in it. Messages are JSON separated by NUL bytes on fds 3 (to Chromium)
and 4 (from it)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import tempfile
import time


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    def __init__(self, width: int = 1100, height: int = 800):
        exe = chromium()
        if exe is None:
            raise RuntimeError("chromium not installed: run scripts/ci-chromium")
        self.profile = tempfile.mkdtemp(prefix="agent-cdp-")
        import fcntl

        def high(fd: int) -> int:  # away from 3 and 4, so the redirections below cannot clobber each other
            new = fcntl.fcntl(fd, fcntl.F_DUPFD, 20)
            os.close(fd)
            return new

        to_r, self._to_w = os.pipe()
        self._from_r, from_w = os.pipe()
        to_r, from_w = high(to_r), high(from_w)
        argv = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                "--disable-extensions", "--remote-debugging-pipe", f"--user-data-dir={self.profile}",
                f"--window-size={width},{height}", "about:blank"]
        # fds 3 and 4 in the child, whatever numbers the pipes have here (bash: dash refuses fds above 9)
        shell = f"exec {shlex.join(argv)} 3<&{to_r} 4>&{from_w} {to_r}<&- {from_w}>&-"
        self.proc = subprocess.Popen(["bash", "-c", shell], pass_fds=(to_r, from_w), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        os.close(to_r)
        os.close(from_w)
        self._buf = b""
        self._next = 0
        self.session: str | None = None

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 60):
        self._next += 1
        msg = {"id": self._next, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            while b"\0" not in self._buf:
                chunk = os.read(self._from_r, 1 << 16)
                if not chunk:
                    raise RuntimeError("chromium closed the pipe")
                self._buf += chunk
            raw, self._buf = self._buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
        raise TimeoutError(method)

    def open(self, url: str) -> None:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.send("Page.enable", session=self.session)
        self.send("Page.navigate", {"url": url}, session=self.session)
        self.wait_for("document.readyState === 'complete'")

    def eval(self, expression: str):
        res = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=self.session)
        if "exceptionDetails" in res:
            raise RuntimeError(f"{expression}: {res['exceptionDetails']}")
        return res["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.eval(expression):
                return
            time.sleep(0.1)
        raise TimeoutError(expression)

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=5)
        except Exception:  # noqa: BLE001 - it may be gone already
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        os.close(self._to_w)
        os.close(self._from_r)
        shutil.rmtree(self.profile, ignore_errors=True)
