"""Fault injection for tests, a no-op unless its environment variable names the place: ``crashpoint`` dies there
(``os._exit(137)``, like a SIGKILL), ``pausepoint`` sleeps there (to widen a race window)."""

from __future__ import annotations

import os
import time


CRASHPOINT_ENV = "AGENT_CRASHPOINT"


def crashpoint(name: str) -> None:
    """Fault injection for tests: if ``$AGENT_CRASHPOINT`` equals ``name``, die at once with ``os._exit(137)``.

    It simulates a SIGKILL at an exact place (no finally blocks, no atexit, no flush), so the crash tests can
    prove that the next scan continues from there.  Never set in production; a no-op unless the env var matches.
    Names in use: ``commit.done``, ``commit.ref_pushed``, ``commit.recorded``, ``push.done``, ``pr.created``, ``lane.finished``, ``proof.recorded``.
    """
    if os.environ.get(CRASHPOINT_ENV) == name:
        os._exit(137)


PAUSEPOINT_ENV = "AGENT_PAUSEPOINT"


def pausepoint(name: str) -> None:
    """Fault injection for tests: if ``$AGENT_PAUSEPOINT`` is ``name:SECONDS``, sleep that long here (it widens a
    window two runners could race in, so a test can show the window is closed). A no-op unless it matches.
    Names in use: ``pr.limits_checked``."""
    spec = os.environ.get(PAUSEPOINT_ENV)
    if spec and spec.rpartition(":")[0] == name:
        try:
            time.sleep(float(spec.rpartition(":")[2]))
        except ValueError:
            pass
