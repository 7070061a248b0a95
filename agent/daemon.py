"""`agent daemon`: loop the one-shot scans; stop cleanly on SIGTERM/SIGINT.

First signal: set ``fixer.STOP`` — no new step starts, the running step finishes and its state is saved.
Second signal: kill the process groups of running lanes and checks (``proc.kill_all``); their tasks resume from the
ledger on the next start.
"""

from __future__ import annotations

import signal
import time
from typing import Callable


def run_daemon(app, interval: float = 60.0, jobs: int = 1, max_ticks: int | None = None,
               echo: Callable[[str], None] = print) -> int:
    from agent import AgentError, fixer
    from agent.commands.watch import SCANS, news, run_scan
    from agent.config import load_config

    signals = {"count": 0}

    def on_signal(signum, frame):
        signals["count"] += 1
        fixer.STOP.set()
        if signals["count"] >= 2:
            from agent.proc import kill_all

            killed = kill_all()
            echo(f"daemon: second signal, killed {killed} running process group(s)")
        else:
            echo(f"daemon: {signal.Signals(signum).name} received; finishing the running step (again to kill)")

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    ticks = 0
    try:
        while not fixer.STOP.is_set():
            try:  # pick up edits; a broken edit skips this pass and says why, the daemon keeps running
                app._config = load_config(app.config_path, required=app.config_file is not None)
                scans = list(SCANS)
            except AgentError as exc:
                echo(f"daemon: config not loaded, pass skipped: {exc}")
                scans = []
            for name in scans:
                if fixer.STOP.is_set():
                    break
                try:
                    for line in news(run_scan(app, name, jobs=jobs)):
                        echo(line)
                except Exception as exc:  # a broken scan must not stop the daemon
                    echo(f"daemon: scan {name} failed: {type(exc).__name__}: {exc}")
            ticks += 1
            if max_ticks is not None and ticks >= max_ticks:
                break
            deadline = time.monotonic() + interval
            while not fixer.STOP.is_set() and time.monotonic() < deadline:
                time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        fixer.STOP.clear()
        from agent.proc import resume_starting

        resume_starting()
    echo(f"daemon: stopped after {ticks} pass(es)")
    return ticks
