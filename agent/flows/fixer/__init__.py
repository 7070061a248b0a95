"""The fixer: confirmed error.fix conclusions -> tasks with worktrees -> rounds -> a reviewed draft PR.

- ``outcomes``: ``Ctx`` and how a step ends (``block``, ``fail``, ``wait``, ``reject_round``, ``close_step``); a leaf.
- ``driver``: ``advance`` (one task, one step at a time, under its claim), unexpected-error accounting, the task's
  workspace (made, made again when lost, reconciled with the ledger).
- ``steps``: one handler per chain step (``STEP_HANDLERS``) and ``finish``.
- ``limits``: budgets, wall time, daily cost, open drafts per repository and PRs per hour.
- ``scans``: ``fix_scan`` (`agent watch error-fix`), ``work_scan`` (`agent watch error-fix-work`),
  ``lift_config_blocks``, ``advance_workspace_only``.

The names below are re-exported lazily, so `agent watch` imports only the module a scan needs (a no-op tick never
loads the step handlers).
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Ctx": "outcomes", "Stop": "outcomes", "advance": "driver", "MAX_UNEXPECTED": "driver",
    "STEP_HANDLERS": "steps",
    "work_scan": "scans", "fix_scan": "scans", "lift_config_blocks": "scans", "advance_workspace_only": "scans",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agent.flows.fixer' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"agent.flows.fixer.{module}"), name)
    globals()[name] = value
    return value
