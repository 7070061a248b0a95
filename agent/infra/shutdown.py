"""Stopping on SIGINT/SIGTERM the same way everywhere (`agent daemon` and every `agent watch` command).

First signal: set ``STOP``. No new step, task or scan starts; the running step may finish and its state is recorded.
A lane or check still running ``grace`` seconds later (``limits.shutdown_grace``) is stopped like on a second
signal. Second signal: kill the process groups of running lanes and checks (``proc.kill_all``) at once; what they
were doing is recorded as interrupted (never as a verdict) and the next scan runs it again.
"""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

DEFAULT_GRACE_S = 10   # limits.shutdown_grace's default (agent.config reads it from here)
# Set on the first signal; the fixer and the scans check it between steps (kept here, not in agent.flows.fixer, so a
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


def _kill_running() -> int:
    proc = sys.modules.get("agent.infra.proc")  # not imported: this process never started a child
    return proc.kill_all() if proc is not None else 0


def _running() -> int:
    proc = sys.modules.get("agent.infra.proc")
    return len(proc.running()) if proc is not None else 0


@contextmanager
def graceful_stop(echo: Callable[[str], None], who: str = "agent",
                  grace: float | Callable[[], float] | None = None) -> Iterator[Stopping]:
    """Handle SIGINT/SIGTERM as described above while the body runs (main thread only). ``grace``: seconds the
    first signal lets running lanes and checks go on before stopping them (None: until they end); a callable is
    asked when the first signal comes, so a run that is never signalled never reads the config for it."""
    state = Stopping()
    timer: list[threading.Timer] = []
    asked = grace

    def grace_over():
        n = _running()
        if state.count == 1 and n:  # said before stopping them: the main thread ends as soon as they are gone
            echo(f"{who}: {grace:g} s grace over (limits.shutdown_grace), stopping {n} running process group(s); "
                 "they run again next time")
            _kill_running()

    def on_signal(signum, frame):
        nonlocal grace
        if callable(grace):
            grace = asked()
        state.count += 1
        if state.signum is None:
            state.signum = signum
        STOP.set()
        if state.count >= 2:
            echo(f"{who}: second signal, killed {_kill_running()} running process group(s)")
        else:
            within = f" for up to {grace:g} s" if grace is not None else ""
            echo(f"{who}: {signal.Signals(signum).name} received; finishing the running step{within} (again to "
                 "stop it now)")
            if grace is not None:
                timer.append(threading.Timer(grace, grace_over))
                timer[0].daemon = True
                timer[0].start()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield state
    finally:
        for t in timer:
            t.cancel()
        for s, handler in old.items():
            signal.signal(s, handler)
        STOP.clear()
        if "agent.infra.proc" in sys.modules:
            sys.modules["agent.infra.proc"].resume_starting()
