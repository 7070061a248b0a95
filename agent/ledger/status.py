"""The ledger's reads for `agent status` (text, JSON, the HTML page and `agent serve`'s live page), each taking
the ``Ledger``. Read-only: nothing here writes."""

from __future__ import annotations

COUNTED = ("errors", "tasks", "prs", "lessons")   # the tables `agent status` counts by state


def state_counts(ledger, table: str) -> dict[str, int]:
    """``state -> rows`` of one of ``COUNTED``."""
    if table not in COUNTED:
        raise ValueError(f"state_counts: {table!r} is not one of {COUNTED}")
    return {r["state"]: r["n"] for r in ledger.all(f"SELECT state, count(*) AS n FROM {table} GROUP BY state")}


def blocked_tasks(ledger) -> list[dict]:
    return ledger.all("SELECT id, repo, title, round, round_cap, blocked_reason, updated_at FROM tasks "
                      "WHERE state = 'gate-blocked' ORDER BY id")


def failed_tasks(ledger, limit: int | None = None) -> list[dict]:
    """Failed tasks, oldest first; with ``limit``, only the newest ``limit`` of them."""
    if limit is None:
        return ledger.all("SELECT id, repo, title, round, round_cap, failed_reason, updated_at FROM tasks "
                          "WHERE state = 'failed' ORDER BY id")
    rows = ledger.all("SELECT id, repo, title, round, round_cap, failed_reason, updated_at FROM tasks "
                      f"WHERE state = 'failed' ORDER BY id DESC LIMIT {int(limit)}")
    return rows[::-1]


def waiting_tasks(ledger) -> list[dict]:
    return ledger.all("SELECT id, repo, title, state, round, wait_reason, updated_at FROM tasks "
                      "WHERE state IN ('open', 'working') AND wait_reason IS NOT NULL ORDER BY id")


def open_pr_rows(ledger) -> list[dict]:
    return ledger.all("SELECT p.task_id, p.repo, p.number, p.url, p.head_sha AS head, p.created_at, "
                      "p.updated_at, t.title, t.state AS task_state FROM prs p LEFT JOIN tasks t ON t.id = p.task_id "
                      "WHERE p.state = 'open' ORDER BY p.task_id")


def active_tasks(ledger) -> list[dict]:
    """Tasks not finished (open, working, gate-blocked), each with its claim, its newest event's time, its
    running lane (if any) and its steps' statuses (``steps``: key -> status), for the status summary."""
    rows = ledger.all(
        "SELECT t.id, t.repo, t.title, t.state, t.round, t.round_cap, t.blocked_reason, t.wait_reason, "
        "t.created_at, t.updated_at, t.claim_runner, t.claim_token, t.lease_until, "
        "(SELECT e.ts FROM events e WHERE e.task_id = t.id ORDER BY e.id DESC LIMIT 1) AS last_event_at, "
        "(SELECT e.kind FROM events e WHERE e.task_id = t.id ORDER BY e.id DESC LIMIT 1) AS last_event, "
        "l.role AS lane_role, l.vendor AS lane_vendor, l.started_at AS lane_started_at "
        "FROM tasks t LEFT JOIN lane_runs l ON l.id = (SELECT max(r.id) FROM lane_runs r "
        "WHERE r.task_id = t.id AND r.status = 'running') "
        "WHERE t.state IN ('open', 'working', 'gate-blocked') ORDER BY t.id")
    steps: dict[int, dict[str, str]] = {}
    if rows:
        marks = ", ".join("?" for _ in rows)
        for s in ledger.all(f"SELECT task_id, key, status FROM steps WHERE task_id IN ({marks})",
                            tuple(r["id"] for r in rows)):
            steps.setdefault(s["task_id"], {})[s["key"]] = s["status"]
    for r in rows:
        r["steps"] = steps.get(r["id"], {})
    return rows


def finished_tasks(ledger, limit: int = 50, before: int | None = None) -> list[dict]:
    """Done and failed tasks, newest first, ``limit`` of them with an id below ``before``."""
    where = "t.state IN ('done', 'failed')" + (" AND t.id < ?" if before is not None else "")
    return ledger.all("SELECT t.id, t.repo, t.title, t.state, t.round, t.failed_reason, t.created_at, "
                      "t.updated_at, p.url AS pr_url, p.state AS pr_state FROM tasks t "
                      f"LEFT JOIN prs p ON p.task_id = t.id WHERE {where} ORDER BY t.id DESC LIMIT {int(limit)}",
                      (before,) if before is not None else ())


def undecided_errors(ledger, limit: int = 20) -> list[dict]:
    """Open errors (waiting for a decision), most recently seen first."""
    return ledger.all("SELECT id, service, environment, class, message, count, first_seen, last_seen FROM errors "
                      f"WHERE state = 'open' ORDER BY last_seen DESC, id LIMIT {int(limit)}")


def task_row(ledger, task_id: int) -> dict | None:
    return ledger.one("SELECT t.id, t.repo, t.title, t.state, t.round, t.round_cap, t.blocked_reason, "
                      "t.failed_reason, t.wait_reason, t.created_at, t.updated_at, p.url AS pr_url "
                      "FROM tasks t LEFT JOIN prs p ON p.task_id = t.id WHERE t.id = ?", (task_id,))


def lane_cost_total(ledger) -> float:
    return float(ledger.scalar("SELECT coalesce(sum(cost_usd), 0) FROM lane_runs") or 0.0)


def recent_tasks(ledger, limit: int = 200) -> list[dict]:
    """The newest tasks with their PR URL, for the HTML page."""
    return ledger.all("SELECT t.id, t.repo, t.title, t.state, t.round, t.round_cap, t.blocked_reason, "
                      "t.failed_reason, t.wait_reason, p.url AS pr_url FROM tasks t "
                      f"LEFT JOIN prs p ON p.task_id = t.id ORDER BY t.id DESC LIMIT {int(limit)}")
