"""Chaos: SIGKILL `agent watch error-fix-work` at random moments across a batch of tasks, restart, repeat.

Then: exactly one PR per task (ledger, local forge rows and files, or the GitHub REST simulator), no duplicate
tasks, one commit per round and the pushed branch == head, `PRAGMA integrity_check` ok, no claim left past its
lease, every task done. Sized for CI; `scripts/chaos --tasks 20 --kills 100` is the long run. The seed is printed
(`pytest -s`) and can be fixed with AGENT_CHAOS_SEED to replay a failure.
"""

from __future__ import annotations

import os

from chaos_support import chaos
from test_forge_github_sim import sim  # noqa: F401  (the module-scoped simulator fixture)


def _seed():
    return int(os.environ["AGENT_CHAOS_SEED"]) if os.environ.get("AGENT_CHAOS_SEED") else None


def test_chaos_local_forge(tmp_path):
    lines: list[str] = []
    summary = chaos(tmp_path, tasks=5, kills=8, seed=_seed(), echo=lambda s: (print(s), lines.append(s)))
    assert summary["killed"] >= 1, lines  # the test must actually have killed something
    assert summary["states"] == ["done"]


def test_chaos_github_simulator(tmp_path, sim):  # noqa: F811
    summary = chaos(tmp_path, tasks=3, kills=5, seed=_seed(), sim=sim)
    assert summary["killed"] >= 1 and summary["states"] == ["done"]
