"""Wording shared by every place that talks to a human: ages, and the exact command that puts a task back to work."""

from __future__ import annotations

import shlex


def reset_command(task_id: int, state: str) -> str:
    """The exact line a human runs to put a gate-blocked or failed task back to work."""
    if state == "failed":
        return f"agent task reset {task_id} --reason {shlex.quote('why it may go on')} --rounds 2"
    return f"agent task reset {task_id} --reason {shlex.quote('what you fixed')}"


def ago(seconds: float | None) -> str:
    """``42s``, ``5m``, ``3h12m``, ``2d4h``: an age or a time left, short."""
    if seconds is None:
        return "never"
    s = int(abs(seconds))
    if s < 120:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600}h"
