"""`agent daemon`: loop the one-shot scans; stop cleanly on SIGTERM/SIGINT.

Signals are handled by ``agent.infra.shutdown.graceful_stop``, as in every `agent watch` command: the first one lets the
running step finish (lanes and checks for up to ``limits.shutdown_grace``) and starts nothing new; a second one
kills the running lanes' and checks' process groups at once; their tasks resume from the ledger on the next start. The daemon then exits 0 (a requested stop).

The runner's heartbeat is beaten at every pass and, while the daemon waits between passes, every task lease, so a
live daemon never looks stale (`agent runners`, `agent doctor`) whatever its ``--interval``.
"""

from __future__ import annotations

import time
from typing import Callable


def run_daemon(app, interval: float = 60.0, jobs: int = 1, max_ticks: int | None = None,
               echo: Callable[[str], None] = print, serve: tuple[str, int] | None = None,
               public: bool = False) -> int:
    from agent import AgentError
    from agent.coord.runners import beat, stop
    from agent.ledger.clock import claim_lease_s
    from agent.app.scans import SCANS, news, run_scan
    from agent.infra.shutdown import STOP, graceful_stop

    from agent.ledger.backend import OUTAGE

    app.require_home()
    ticks = 0
    OUTAGE.echo = lambda line: echo(f"daemon: {line}")   # a lost ledger: one line, one a minute, one when back
    server = _start_server(app, serve, echo, public) if serve else None
    try:
        with graceful_stop(echo, who="daemon", grace=app.shutdown_grace):
            while not STOP.is_set():
                try:  # one heartbeat per tick: `agent runners` shows this runner alive
                    beat(app.ledger, app.home, echo)
                except Exception as exc:  # a busy or unreachable ledger must not stop the daemon
                    if not OUTAGE.down:   # an outage says so itself, once (and once a minute)
                        echo(f"daemon: heartbeat not recorded: {type(exc).__name__}: {exc}")
                if OUTAGE.down:   # no scan can work without the ledger: wait for the next pass
                    scans_now = False
                else:
                    scans_now = True
                try:  # pick up edits; a broken edit skips this pass and says why, the daemon keeps running
                    app.reload_config()
                    scans = list(SCANS) if scans_now else []
                except AgentError as exc:
                    if not OUTAGE.down:
                        echo(f"daemon: config not loaded, pass skipped: {exc}")
                    scans = []
                for name in scans:
                    if STOP.is_set():
                        break
                    try:
                        for line in news(run_scan(app, name, jobs=jobs)):
                            echo(line)
                    except Exception as exc:  # a broken scan must not stop the daemon
                        if not OUTAGE.down:
                            echo(f"daemon: scan {name} failed: {type(exc).__name__}: {exc}")
                ticks += 1
                if max_ticks is not None and ticks >= max_ticks:
                    break
                deadline = time.monotonic() + interval
                next_beat = time.monotonic() + claim_lease_s()
                while not STOP.is_set() and time.monotonic() < deadline:
                    time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
                    if time.monotonic() >= next_beat:  # a long --interval never makes this runner look stale
                        next_beat = time.monotonic() + claim_lease_s()
                        try:
                            beat(app.ledger, app.home, echo)
                        except Exception as exc:  # noqa: BLE001 - as above
                            if not OUTAGE.down:
                                echo(f"daemon: heartbeat not recorded: {type(exc).__name__}: {exc}")
    finally:
        OUTAGE.echo = None
        if server is not None:
            server.close()
    stop(app.ledger, app.home)   # a clean stop: `agent runners` shows this runner stopped, not dead
    echo(f"daemon: stopped after {ticks} pass(es)")
    return ticks


def _start_server(app, where: tuple[str, int], echo: Callable[[str], None], public: bool = False):
    """`agent daemon --serve`: the server on a thread of this process (notifications go out every daemon pass)."""
    from agent.app.serve import HookApp, Server, check_exposure

    warning = check_exposure(where[0], app.config, public)
    app.ledger  # noqa: B018 - creates or migrates the ledger before the server threads open theirs
    server = Server(HookApp(app.home, app.config), *where).start()
    if warning:
        echo(warning)
    echo(f"daemon: serving on {server.url}")
    return server
