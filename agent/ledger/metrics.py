"""The numbers `agent serve` exposes on /metrics, read from the ledger (read-only)."""

from __future__ import annotations


def gather(ledger) -> dict:
    one = ledger.all
    seconds = ledger.dialect.seconds_between("started_at", "ended_at")
    return {
        "errors": one("SELECT state, count(*) AS n FROM errors GROUP BY state"),
        "tasks": one("SELECT state, count(*) AS n FROM tasks GROUP BY state"),
        "prs": one("SELECT state, count(*) AS n FROM prs GROUP BY state"),
        "lane_runs": one("SELECT vendor, role, status, count(*) AS n FROM lane_runs GROUP BY vendor, role, status"),
        "lane_durations": one(
            "SELECT vendor, role, count(*) AS n, "
            f"coalesce(sum({seconds}), 0) AS seconds "
            "FROM lane_runs WHERE started_at IS NOT NULL AND ended_at IS NOT NULL GROUP BY vendor, role"),
        "cost": one("SELECT vendor, role, coalesce(sum(cost_usd), 0) AS usd FROM lane_runs GROUP BY vendor, role"),
        "deliveries": one("SELECT channel, state, count(*) AS n FROM notify_deliveries GROUP BY channel, state"),
        "hooks": one("SELECT hook, count(*) AS deliveries, coalesce(sum(events), 0) AS events "
                     "FROM hook_deliveries GROUP BY hook"),
        "outbox_pending": ledger.scalar("SELECT count(*) FROM outbox WHERE expanded = 0"),
    }
