"""Vendor adapters: the ``VENDORS`` registry and the ``command`` vendor (the protocol: ``agent.lanes.protocol``).

An adapter only builds argv and reads a finished turn; ``agent.lanes.lane.run_lane`` does the
running, timing, repairing and recording.  Built-in adapters (codex, claude, opencode, aider,
grok, gemini) live in ``agent.lanes.builtin``, whose ``ADAPTERS`` dict fills ``VENDORS``; it is imported
lazily by ``get_vendor`` and ``known_vendors`` so a cron tick that runs no lane never pays for it.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from agent import AgentError
from agent.domain.names import BUILTIN_VENDORS
from agent.lanes.protocol import Invocation, LaneContext, TurnOutput, Vendor


# name -> adapter instance; agent.lanes.builtin adds the built-in CLIs.
VENDORS: dict[str, Vendor] = {}

_SESSION_RE = re.compile(r"^SESSION:[ \t]*(\S+)[ \t]*$")
_COST_RE = re.compile(r"^COST:[ \t]*\$?([0-9]+(?:\.[0-9]+)?)[ \t]*(?:usd|USD)?[ \t]*$")


class CommandVendor:
    """Any argv template: ``{spec}`` ``{cwd}`` ``{role}`` ``{model}`` ``{run_dir}``, and for
    ``resume`` also ``{session}`` ``{note}``.  Stdout is the agent's message; ``SESSION: id`` and
    ``COST: usd`` lines in it are recorded and removed from the message the parser sees."""

    def __init__(self, name: str, command: tuple[str, ...] | list[str],
                 resume: tuple[str, ...] | list[str] | None = None):
        if not command:
            raise AgentError(f"vendors.{name}.command: expected a non-empty argv list")
        self.name = name
        self.command = tuple(command)
        self.resume = tuple(resume) if resume else None
        self.default_bin = self.command[0]
        self.can_resume = self.resume is not None

    @classmethod
    def from_config(cls, vc) -> "CommandVendor":
        return cls(vc.name, vc.command, vc.resume)

    @staticmethod
    def _fill(template: tuple[str, ...], values: dict[str, str]) -> list[str]:
        out = []
        for arg in template:
            for key, value in values.items():
                arg = arg.replace("{" + key + "}", value)
            out.append(arg)
        return out

    def _values(self, ctx: LaneContext) -> dict[str, str]:
        return {"spec": str(ctx.spec_path), "cwd": str(ctx.cwd), "role": ctx.role, "model": ctx.model or "",
                "run_dir": str(ctx.run_dir)}

    def _argv(self, template: tuple[str, ...], ctx: LaneContext, values: dict[str, str]) -> list[str]:
        argv = self._fill(template, values)
        if ctx.bin and ctx.bin != template[0]:
            argv[0] = ctx.bin          # vendors.X.bin overrides the command's program
        return argv + list(ctx.extra_args)

    def build(self, ctx: LaneContext) -> Invocation:
        return Invocation(argv=self._argv(self.command, ctx, self._values(ctx)))

    def build_resume(self, ctx: LaneContext, session_id: str | None, note_path: Path) -> Invocation:
        if self.resume is None:
            raise AgentError(f"vendor {self.name} has no resume command")
        if session_id is None and any("{session}" in a for a in self.resume):
            raise AgentError(f"vendor {self.name}: resume needs a session id and the turn printed no SESSION: line")
        values = self._values(ctx) | {"session": session_id or "", "note": str(note_path)}
        # the session id is the lane's text: exactly where the template puts it (a trusted script path that merely
        # contains a short id is still bound into the sandbox, agent.lanes.sandbox.with_argv_files)
        return Invocation(argv=self._argv(self.resume, ctx, values),
                          lane_text_at=tuple(i for i, a in enumerate(self.resume) if "{session}" in a))

    def read_turn(self, stdout: str, stderr: str, exit_code: int | None, ctx: LaneContext) -> TurnOutput:
        session = None
        cost = None
        kept = []
        for line in stdout.replace("\r\n", "\n").split("\n"):
            m = _SESSION_RE.match(line)
            if m:
                session = m.group(1)
                continue
            m = _COST_RE.match(line)
            if m:
                cost = (cost or 0.0) + float(m.group(1))
                continue
            kept.append(line)
        return TurnOutput(message="\n".join(kept), session_id=session, cost_usd=cost)

    def version_argv(self, bin: str) -> list[str]:
        return []                 # no version probe: the argv template and binary hash stand in

    def template(self) -> str:
        return shlex.join(self.command) + (" || resume: " + shlex.join(self.resume) if self.resume else "")


def _load_builtins() -> None:
    import importlib

    try:
        builtin = importlib.import_module("agent.lanes.builtin")
    except ModuleNotFoundError as exc:
        if exc.name != "agent.lanes.builtin":
            raise
        return
    for name, adapter in (getattr(builtin, "ADAPTERS", None) or {}).items():
        VENDORS.setdefault(name, adapter)


def get_vendor(name: str, config=None) -> Vendor:
    """The adapter for ``name``: a ``vendors:`` entry with ``command:`` in config, else a built-in."""
    vc = config.vendors.get(name) if config is not None else None
    if vc is not None and vc.command:
        return CommandVendor.from_config(vc)
    if name not in VENDORS:
        _load_builtins()
    if name in VENDORS:
        return VENDORS[name]
    if name in BUILTIN_VENDORS:
        raise AgentError(f"vendor {name}: no adapter in this build of agent; define it under vendors: "
                         f"with a command: argv instead")
    raise AgentError(f"unknown vendor {name!r}; use one of {', '.join(BUILTIN_VENDORS)} "
                     f"or define it under vendors: with a command: argv")


def known_vendors(config=None) -> list[str]:
    """Every vendor name usable now: built-in adapters plus config command vendors."""
    _load_builtins()
    names = set(VENDORS)
    if config is not None:
        names |= {n for n, vc in config.vendors.items() if vc.command}
    return sorted(names)
