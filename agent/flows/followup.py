"""Follow-up of opened PRs (`agent watch pr-merged`).

For every PR agent recorded as open, ask its forge for the state now:
- merged -> the PR row becomes merged, the error ``resolved``, the task ``done`` (if the state
  machine allows it from where the task is), the task's candidate lesson ``accepted`` (a human accepted the work);
- closed without merge -> the error becomes ``skipped`` with that reason (intake never proposes a
  skipped error again), the task ``failed`` with the reason, its candidate lesson ``discarded``, and the task
  branch is pruned from the remote (retried on later scans until it is gone).
Each change is written together with its event in one transaction.  A forge error for one PR is
reported as that PR's item and does not stop the others.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from agent import AgentError

from agent.domain import chain
from agent.forge import PR, ForgeAuthError, ForgeError, get_forge
from agent.git.push import PushError
from agent.ledger import Ledger, pending
from agent.ledger.prs import get_pr, prs_to_follow, record_pr_final
from agent.ledger.tasks import find_task, finished_worktrees, record_workspace_removed, task_state


def _apply(ledger: Ledger, row: dict, pr: PR) -> str | None:
    """Record a merged/closed PR and its consequences. Returns the new state or None if unchanged."""
    return record_pr_final(ledger, row, pr.state, pr.draft)


def _prune(ledger: Ledger, row: dict, config, prune: Callable) -> str:
    """Delete the remote branch of a closed PR once; record it. Returns a short note."""
    repo_cfg = config.repos.get(row["repo"])
    task = find_task(ledger, row["task_id"]) or {}
    branch = row["head_branch"] or task.get("branch")
    if repo_cfg is None or not branch:
        return "branch not pruned (repo not in config)"
    deleted = prune(repo_cfg.url, branch, task.get("base") or repo_cfg.base, repo_cfg.branch_prefix)
    from agent.git.push import delete_task_ref

    ref_deleted = delete_task_ref(repo_cfg.url, row["task_id"])   # its round commits' hidden ref goes with it
    with ledger.tx() as c:
        ledger.event(c, "pr.branch_pruned", "script", {"branch": branch, "deleted": bool(deleted),
                                                       "task_ref_deleted": ref_deleted}, task_id=row["task_id"])
    return f"branch {branch} pruned" if deleted else f"branch {branch} already gone"


def _prune_task_ref(ledger: Ledger, row: dict, config) -> str:
    """A merged PR's task keeps no hidden ref on the remote (its commits are in the base, or kept by the forge).
    Best effort: a leftover ref is harmless."""
    from agent.git.push import delete_task_ref

    repo_cfg = config.repos.get(row["repo"])
    if repo_cfg is None:
        return ""
    try:
        if delete_task_ref(repo_cfg.url, row["task_id"]):
            with ledger.tx() as c:
                ledger.event(c, "task.ref_pruned", "script", {"repo": row["repo"]}, task_id=row["task_id"])
            return "; hidden ref pruned"
    except AgentError as exc:
        return f"; hidden ref not pruned ({exc})"
    return ""


def _remembered(ledger: Ledger, task_id: int) -> str:
    """``; lesson N accepted`` when the merge made the task's lesson one later specs carry."""
    from agent.ledger.lessons import task_lesson

    lesson = task_lesson(ledger, task_id)
    return f"; lesson {lesson['id']} accepted" if lesson and lesson["state"] == "accepted" else ""


def owe_pr_text(ledger: Ledger, task_id: int, reason: str, claim_token: str | None = None) -> None:
    """Remember that a task's PR text update failed for now (it is retried by `watch pr-merged`); the fixer
    passes its claim token (a worker that lost the task records nothing)."""
    from agent.ledger.leases import claimed_tx

    with claimed_tx(ledger, task_id, claim_token) as c:
        pending.set_pending(ledger, c, f"pr_text:{task_id}", "pr_text", reason[:500], task_id=task_id)
        ledger.event(c, "pr.text_pending", "script", {"reason": reason[:500]}, task_id=task_id)


def retry_pr_texts(ledger: Ledger, config, home: Path, forge_factory: Callable = get_forge) -> list[dict]:
    """Send every PR text update still owed (its in-pass retries all failed), re-rendered from the ledger now.

    The row goes when the text lands, or when the PR is no longer open (nothing to update). A failure keeps it
    and counts the attempt; the item is quiet when it failed for the same reason as last time.
    """
    from agent.flows.pr_thread import publish_pr
    from agent.domain.pr_text import render_pr
    from agent.ledger.prs import pr_data_from_ledger

    items = []
    for owed in pending.pending_of(ledger, "pr_text"):
        task_id = owed["task_id"]
        row = get_pr(ledger, task_id)
        task = find_task(ledger, task_id)
        repo_cfg = config.repos.get(row["repo"]) if row else None
        if row is None or task is None or row["state"] != "open":
            with ledger.tx() as c:
                pending.clear_pending(ledger, c, owed["key"])
            continue
        item = {"task_id": task_id, "repo": row["repo"], "number": row["number"], "url": row["url"],
                "pr_text": "owed"}
        if repo_cfg is None:
            items.append({**item, "quiet": True, "line": f"task {task_id}: PR text owed, but repo {row['repo']} "
                                                         "is not in config.yaml"})
            continue
        try:
            title, body = render_pr(pr_data_from_ledger(ledger, task_id))
            forge = forge_factory(repo_cfg, config, home, ledger)
            _pr, action = publish_pr(ledger, forge, task_id, task["branch"] or row["head_branch"],
                                     task["base"] or repo_cfg.base, title, body, task["head_sha"])
        except (ForgeError, AgentError) as exc:
            with ledger.tx() as c:
                pending.set_pending(ledger, c, owed["key"], "pr_text", str(exc)[:500], task_id=task_id)
            items.append({**item, "error": str(exc), "quiet": str(exc)[:500] == owed["reason"],
                          "line": f"task {task_id}: PR text still not updated ({exc}); later scans retry it"})
            continue
        with ledger.tx() as c:
            pending.clear_pending(ledger, c, owed["key"])
        items.append({**item, "pr_text": action, "changed": True,
                      "line": f"task {task_id}: {row['repo']}#{row['number']} text {action} (owed since "
                              f"{owed['attempts']} failed attempt(s))"})
    return items


def follow_prs(ledger: Ledger, config, home: Path, forge_factory: Callable = get_forge,
               prune: Callable | None = None) -> list[dict]:
    """One pass over open PRs (and closed ones whose branch is not pruned yet). Returns one item each."""
    if prune is None:
        from agent.git.push import delete_remote_branch as prune
    rows = prs_to_follow(ledger)
    items: list[dict] = []
    forges: dict[str, object] = {}
    for row in rows:
        ref = f"{row['repo']}#{row['number']}"
        item = {"task_id": row["task_id"], "forge": row["forge"], "repo": row["repo"], "number": row["number"],
                "url": row["url"], "state": row["state"], "changed": False}
        try:
            if row["state"] == "open":
                repo_cfg = config.repos.get(row["repo"])
                if repo_cfg is None:
                    item.update(line=f"task {row['task_id']}: {ref} skipped: repo {row['repo']} is not in config.yaml",
                                error="repo not in config")
                    items.append(item)
                    continue
                if row["repo"] not in forges:
                    forges[row["repo"]] = forge_factory(repo_cfg, config, home, ledger)
                pr = forges[row["repo"]].state(int(row["number"]))
                if pr.state == "open":
                    item.update(line=f"task {row['task_id']}: {ref} still open", quiet=True)   # no news
                    items.append(item)
                    continue
                new = _apply(ledger, row, pr)
                item.update(state=pr.state, changed=new is not None)
                if new == "merged":
                    item["pruned_ref"] = _prune_task_ref(ledger, row, config) + _remembered(ledger, row["task_id"])
            if item["state"] == "closed":
                note = _prune(ledger, row, config, prune)
                item["pruned"] = note
            item["line"] = f"task {row['task_id']}: {ref} {item['state']}" + \
                (f"; {item['pruned']}" if item.get("pruned") else "") + item.get("pruned_ref", "")
        except (ForgeAuthError, PushError) as exc:   # a token, or the remote git cannot read or refuses: a human
            item.update(line=f"task {row['task_id']}: {ref}: {exc}", error=str(exc), auth=True)
        except (ForgeError, AgentError) as exc:
            # a remembered rate limit is no news: it was said when it happened
            item.update(line=f"task {row['task_id']}: {ref}: {exc}", error=str(exc),
                        **({"quiet": True} if getattr(exc, "remembered", False) else {}))
        items.append(item)
    return items


def remove_finished_worktrees(ledger: Ledger, home: Path, grace_s: int) -> list[dict]:
    """Remove the worktree and local branch of every task that is over (failed, or its PR merged or closed) for
    longer than ``grace_s``, under the task's claim; a failed task's head is kept in the mirror for a reset."""
    from datetime import datetime, timedelta, timezone

    from agent.coord.claims import claim, release
    from agent.git.workspace import remove_task_workspace

    cutoff = (datetime.now(timezone.utc) - timedelta(seconds=grace_s)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    items = []
    from agent.git.workspace import own_worktree

    for t in finished_worktrees(ledger, cutoff):
        if os.path.realpath(t["worktree"]) != os.path.realpath(own_worktree(home, t["id"])):
            continue  # another runner's home holds it: that runner removes it (a folder here is never theirs)
        token = claim(ledger, t["id"])
        if token is None:
            continue  # someone works on it (a reset): not finished after all
        try:
            now_state = (task_state(ledger, t["id"]) or {}).get("state")
            if now_state != t["state"]:
                continue
            keep = t["head_sha"] if t["state"] != chain.DONE else None
            why = f"task {t['state']}" + (f", PR {t['pr_state']}" if t["pr_state"] in ("merged", "closed") else "")
            try:
                remove_task_workspace(home, t["repo"], t["id"], Path(t["worktree"]), t["branch"], keep_sha=keep)
            except Exception as exc:  # noqa: BLE001 - one task's leftovers never stop the scan; retried next time
                items.append({"task_id": t["id"], "error": str(exc),
                              "line": f"task {t['id']}: worktree not removed ({type(exc).__name__}: {exc})"})
                continue
            record_workspace_removed(ledger, t["id"], path=t["worktree"], branch=t["branch"], why=why,
                                     kept_head=keep, claim_token=token)
            items.append({"task_id": t["id"], "worktree_removed": t["worktree"], "changed": True,
                          "line": f"task {t['id']}: worktree and branch {t['branch']} removed ({why})"})
        finally:
            release(ledger, t["id"], token)
    return items


def scan_pr_merged(app, jobs: int = 1) -> list[dict]:
    """The `agent watch pr-merged` scan: PR states, PR text updates still owed, finished tasks' worktrees."""
    return (follow_prs(app.ledger, app.config, app.home) + retry_pr_texts(app.ledger, app.config, app.home)
            + remove_finished_worktrees(app.ledger, app.home, app.config.limits.worktree_grace))
