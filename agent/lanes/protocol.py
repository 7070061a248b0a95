"""The vendor adapter protocol and its value types: what an adapter builds (``Invocation``) from what it is given
(``LaneContext``) and what it reads back from a finished turn (``TurnOutput``). A leaf: it imports nothing of lanes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable


@dataclass
class LaneContext:
    """Everything an adapter may use to build argv."""
    role: str
    writable: bool
    spec_path: Path
    cwd: Path
    model: str | None
    bin: str
    extra_args: tuple[str, ...]
    run_dir: Path                 # the lane dir $AGENT_HOME/lanes/<run-id>/lane/, fresh for each turn: the lane
                                  # writes here; read its files only with agent.lanes.files.read_lane_file


@dataclass
class Invocation:
    argv: list[str]
    stdin_path: Path | None = None
    env: dict[str, str] = field(default_factory=dict)   # extra env for this turn (e.g. CODEX_HOME)
    # the argv positions the lane's own text (its session id) went into, when the adapter knows them (a command
    # vendor: where its resume template says {session}); None: any element holding that text counts as the lane's
    lane_text_at: tuple[int, ...] | None = None


@dataclass
class TurnOutput:
    """What an adapter reads from a finished turn."""
    message: str                  # the agent's LAST message text (what the report parser sees)
    session_id: str | None = None
    cost_usd: float | None = None
    usage: dict = field(default_factory=dict)
    auth_failed: bool = False
    api_error: str | None = None


@runtime_checkable
class Vendor(Protocol):
    name: str
    default_bin: str
    can_resume: bool

    def build(self, ctx: LaneContext) -> Invocation: ...

    def build_resume(self, ctx: LaneContext, session_id: str | None, note_path: Path) -> Invocation: ...

    def read_turn(self, stdout: str, stderr: str, exit_code: int | None, ctx: LaneContext) -> TurnOutput: ...

    def version_argv(self, bin: str) -> list[str]: ...
