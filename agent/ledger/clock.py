"""The ledger's notion of time, in a leaf every ledger module may import: its timestamps and a task claim's lease."""

from __future__ import annotations

from datetime import datetime, timezone


def now() -> str:
    """UTC timestamp with microseconds, sortable as text."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


CLAIM_LEASE_S = 120.0   # a task claim's lease (agent.coord.claims.LEASE_S); renewed every third of it while a lane runs


LEASE_ENV = "AGENT_CLAIM_LEASE_S"


def claim_lease_s() -> float:
    """A task claim's lease in seconds: ``$AGENT_CLAIM_LEASE_S`` (operators, tests) or 120."""
    import os

    try:
        return max(0.05, float(os.environ.get(LEASE_ENV, CLAIM_LEASE_S)))
    except ValueError:
        return CLAIM_LEASE_S
