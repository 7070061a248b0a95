"""The ledger's reads for `agent status` (text, JSON, the HTML page and `agent serve`'s live page); mixed into
``Ledger``. Read-only: nothing here writes."""

from __future__ import annotations

COUNTED = ("errors", "tasks", "prs", "lessons")   # the tables `agent status` counts by state


class StatusQueries:
    """Methods used by ``agent.status``; ``self`` is a ``Ledger``."""

    def state_counts(self, table: str) -> dict[str, int]:
        """``state -> rows`` of one of ``COUNTED``."""
        if table not in COUNTED:
            raise ValueError(f"state_counts: {table!r} is not one of {COUNTED}")
        return {r["state"]: r["n"] for r in self.all(f"SELECT state, count(*) AS n FROM {table} GROUP BY state")}

    def blocked_tasks(self) -> list[dict]:
        return self.all("SELECT id, repo, title, round, round_cap, blocked_reason, updated_at FROM tasks "
                        "WHERE state = 'gate-blocked' ORDER BY id")

    def failed_tasks(self) -> list[dict]:
        return self.all("SELECT id, repo, title, round, round_cap, failed_reason, updated_at FROM tasks "
                        "WHERE state = 'failed' ORDER BY id")

    def waiting_tasks(self) -> list[dict]:
        return self.all("SELECT id, repo, title, state, round, wait_reason, updated_at FROM tasks "
                        "WHERE state IN ('open', 'working') AND wait_reason IS NOT NULL ORDER BY id")

    def open_pr_rows(self) -> list[dict]:
        return self.all("SELECT task_id, repo, number, url, head_sha AS head FROM prs WHERE state = 'open' "
                        "ORDER BY task_id")

    def lane_cost_total(self) -> float:
        return float(self.scalar("SELECT coalesce(sum(cost_usd), 0) FROM lane_runs") or 0.0)

    def recent_tasks(self, limit: int = 200) -> list[dict]:
        """The newest tasks with their PR URL, for the HTML page."""
        return self.all("SELECT t.id, t.repo, t.title, t.state, t.round, t.round_cap, t.blocked_reason, "
                        "t.failed_reason, t.wait_reason, p.url AS pr_url FROM tasks t "
                        f"LEFT JOIN prs p ON p.task_id = t.id ORDER BY t.id DESC LIMIT {int(limit)}")
