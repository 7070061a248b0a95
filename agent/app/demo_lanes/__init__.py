"""Scripted stand-ins for coding agents, used by `agent demo` and the tests.

They are plain scripts run as real subprocesses through the `command` vendor, exactly like an in-house agent would
be: they read the spec file, edit the worktree, and end their output with the final report. They do not think: the
implementer applies the next group of edits from a playbook, the reviewer applies a fixed rule. Nothing here calls a
model.
"""

import json
import os
import random
import time


def add_pace_options(ap) -> None:
    """``--sleep S`` or ``--sleep LO:HI`` (seconds, random in the range, seeded by ``--seed`` and the spec path)
    and ``--log FILE`` (one JSON line at start and one at end: role, spec, cwd, pid, times). The crash and
    concurrency tests use them to hold a lane open and to see which lanes ran when."""
    ap.add_argument("--sleep", default=None, help="seconds to sleep before working: S or LO:HI")
    ap.add_argument("--seed", default="0", help="seed for a random --sleep (mixed with the spec path)")
    ap.add_argument("--log", default=None, help="append start/end JSON lines to this file")


def _log(path: str | None, record: dict) -> None:
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (json.dumps(record, sort_keys=True) + "\n").encode())  # one small O_APPEND write: atomic
    finally:
        os.close(fd)


class pace:
    """Context manager around a scripted lane's work: logs start, sleeps as asked, logs end."""

    def __init__(self, args, role: str):
        self.args, self.role = args, role
        self.record = {"role": role, "spec": os.path.abspath(args.spec), "cwd": os.getcwd(), "pid": os.getpid()}

    def __enter__(self):
        self.record["start"] = time.time()
        _log(self.args.log, {**self.record, "event": "start"})
        if self.args.sleep:
            lo, _, hi = self.args.sleep.partition(":")
            seconds = float(lo) if not hi else random.Random(f"{self.args.seed}:{self.args.spec}").uniform(
                float(lo), float(hi))
            time.sleep(seconds)
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            _log(self.args.log, {**self.record, "event": "end", "end": time.time()})
        return False
