"""The daily budget's window and how a wait for it is worded (the fixer's limits and the decider share them)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone


def day_start() -> str:
    """The daily budget's window: the last 24 hours (as the ledger's timestamps sort)."""
    return (datetime.now(timezone.utc) - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%S")


def usd(x: float) -> str:
    """$3, $0.25, $0.005: enough digits to tell a small budget from what was spent."""
    return "$" + f"{x:,.4f}".rstrip("0").rstrip(".")


def daily_wait_line(spent: float, reserved: float, inflight: int, limit: float, role: str | None = None,
                    estimate: float | None = None) -> str:
    """Why a task waits for the daily budget: spent (and reserved by lanes in flight) of the limit, and, when the
    budget is not used up but the next lane does not fit, that lane's estimate."""
    line = f"waiting: daily budget spent ({usd(spent + reserved)} of {usd(limit)}"
    if inflight:
        line += f", {usd(reserved)} of it reserved by {inflight} running lane{'s' if inflight != 1 else ''}"
    if role is not None and estimate is not None and spent + reserved < limit:
        line += f"; a {role} lane is estimated at {usd(estimate)}"
    return line + ")"
