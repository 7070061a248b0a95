"""A one-line live display while a lane runs: elapsed time and the last output line.

Only on a terminal: when the stream is not a TTY (cron, pipes, --json consumers) nothing is
written at all.  Use as a context manager and pass the object as ``on_progress`` to run_lane::

    with LaneProgress("implementer codex") as progress:
        run_lane(LaneRequest(..., on_progress=progress))
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO


def _is_tty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def format_line(label: str, elapsed: float, last: str, width: int = 100) -> str:
    mins, secs = divmod(int(elapsed), 60)
    head = f"[{label} {mins:02d}:{secs:02d}] "
    room = max(0, width - len(head))
    from agent.lanes.files import lane_text

    last = " ".join((lane_text(last) or "").split())       # a lane's line: redacted, no escape reaches the terminal
    if len(last) > room:
        last = last[: max(0, room - 1)] + "\u2026"
    return head + last


class LaneProgress:
    """Callable with each new output line; ticks once a second on a TTY, silent otherwise."""

    def __init__(self, label: str, stream: TextIO | None = None, interval: float = 1.0,
                 force: bool | None = None):
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = _is_tty(self.stream) if force is None else force
        self.interval = interval
        self.last = ""
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._shown = 0

    def __call__(self, line: str) -> None:
        self.last = line

    def set_label(self, label: str) -> None:
        self.label = label

    def _draw(self) -> None:
        text = format_line(self.label, time.monotonic() - self.started, self.last)
        pad = " " * max(0, self._shown - len(text))
        self.stream.write("\r" + text + pad)
        self.stream.flush()
        self._shown = len(text)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._draw()
            except (OSError, ValueError):
                return

    def __enter__(self) -> "LaneProgress":
        self.started = time.monotonic()
        if self.enabled:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
            try:
                self.stream.write("\r" + " " * self._shown + "\r")
                self.stream.flush()
            except (OSError, ValueError):
                pass
