"""Stopping on SIGINT/SIGTERM the same way everywhere (`agent daemon` and every `agent watch` command).

First signal: set ``STOP``. No new step, task or scan starts; the running step finishes and its state is recorded.
Second signal: kill the process groups of running lanes and checks (``proc.kill_all``); what they were doing is
recorded as interrupted (never as a verdict) and the next scan runs it again.
"""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

# Set on the first signal; the fixer and the scans check it between steps (kept here, not in agent.fixer, so a
# `watch errors` tick does not import the fixer just to read a flag; the fixer's modules import this same object).
STOP = threading.Event()


class Stopping:
    """What happened while ``graceful_stop`` was active."""

    def __init__(self) -> None:
        self.signum: int | None = None   # the first signal received
        self.count = 0

    @property
    def name(self) -> str | None:
        return signal.Signals(self.signum).name if self.signum else None

    @property
    def exit_code(self) -> int:
        """128 + the first signal's number (130 for SIGINT, 143 for SIGTERM), as a shell reports it."""
        return 128 + self.signum if self.signum else 0


@contextmanager
def graceful_stop(echo: Callable[[str], None], who: str = "agent") -> Iterator[Stopping]:
    """Handle SIGINT/SIGTERM as described above while the body runs (main thread only)."""
    state = Stopping()

    def on_signal(signum, frame):
        state.count += 1
        if state.signum is None:
            state.signum = signum
        STOP.set()
        if state.count >= 2:
            proc = sys.modules.get("agent.proc")  # not imported: this process never started a child
            killed = proc.kill_all() if proc is not None else 0
            echo(f"{who}: second signal, killed {killed} running process group(s)")
        else:
            echo(f"{who}: {signal.Signals(signum).name} received; finishing the running step (again to kill)")

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield state
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        STOP.clear()
        if "agent.proc" in sys.modules:
            sys.modules["agent.proc"].resume_starting()
