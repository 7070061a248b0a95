"""Vendor adapter protocol (minimal placeholder on the `vendors` branch).

The lanes core (branch `lanes`) owns this module; this copy holds only the dataclasses and the
registry exactly as fixed in lanes-interface.md so agent/lanes/builtin.py can import them.  The
lead reconciles at merge: the core's version wins.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


@dataclass
class LaneContext:
    role: str
    writable: bool
    spec_path: Path
    cwd: Path
    model: str | None
    bin: str
    extra_args: tuple[str, ...]
    run_dir: Path


@dataclass
class Invocation:
    argv: list[str]
    stdin_path: Path | None = None
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class TurnOutput:
    message: str
    session_id: str | None
    cost_usd: float | None
    usage: dict
    auth_failed: bool
    api_error: str | None


class Vendor(Protocol):
    name: str
    default_bin: str
    can_resume: bool

    def build(self, ctx: LaneContext) -> Invocation: ...
    def build_resume(self, ctx: LaneContext, session_id: str | None, note_path: Path) -> Invocation: ...
    def read_turn(self, stdout: str, stderr: str, exit_code: int | None, ctx: LaneContext) -> TurnOutput: ...
    def version_argv(self, bin: str) -> list[str]: ...


VENDORS: dict[str, Vendor] = {}


def get_vendor(name: str) -> Vendor | None:
    if not VENDORS or name not in VENDORS:
        from agent.lanes import builtin  # noqa: F401  (registers the built-in adapters)
    return VENDORS.get(name)
