"""The fixer's two scans:

- ``fix_scan`` (`agent watch error-fix`): each confirmed fix conclusion becomes a task (found or created, never
  two per error) with its workspace.
- ``work_scan`` (`agent watch error-fix-work`): drives every open task through the chain as far as it can go now.
"""

from __future__ import annotations

from agent import AgentError

import threading
from pathlib import Path
from typing import TYPE_CHECKING

from agent.ledger import Ledger, ledger_path
from agent.ledger.tasks import active_task_ids, task_state, work_queue
from agent.infra.shutdown import STOP

if TYPE_CHECKING:
    from agent.config import Config


def lift_config_blocks(ledger: Ledger, home: Path, config: Config, blocked: list[dict]) -> list[dict]:
    """Tasks gate-blocked by the config (repository not configured, no lane for a role; ``blocked`` from
    ``tasks.config_blocked_tasks``) go back to work, with an event, once the config has what they need again."""
    from agent.config.repo import task_gaps
    from agent.ledger.tasks import lift_config_block

    items = []
    for t in blocked:
        if task_gaps(config, home, t):
            continue
        if lift_config_block(ledger, t["id"], "the config has what it needs again"):
            items.append({"task_id": t["id"], "line": f"task {t['id']}: config fixed, back to work "
                                                      f"(was: {t['blocked_reason']})"})
    return items


def work_scan(app, jobs: int = 1) -> list[dict]:
    """`agent watch error-fix-work`: advance every open or working task, up to ``jobs`` at once (first putting
    back to work the tasks whose config block the config no longer causes)."""
    blocked, ids = work_queue(app.ledger)  # one read; the config is loaded only when there is something to check
    if blocked:
        lifted = lift_config_blocks(app.ledger, app.home, app.config, blocked)
        ids = active_task_ids(app.ledger)  # the lifted tasks are working again
    else:
        lifted = []
    if not ids:
        return lifted
    from agent.flows.fixer.driver import advance   # a no-op tick never loads the driver

    config = app.config
    # one connection per thread for the whole scan (this thread's is the app's): a task another runner holds
    # costs one statement, not two connections (each a server process on PostgreSQL)
    mine = threading.local()
    opened: list[Ledger] = []

    def ledger() -> Ledger:
        if threading.get_ident() == main:
            return app.ledger
        if getattr(mine, "ledger", None) is None:
            mine.ledger = Ledger.open(ledger_path(app.home), create=False)
            opened.append(mine.ledger)
        return mine.ledger

    def one(task_id: int) -> dict:
        if STOP.is_set():
            return {"task_id": task_id, "line": f"task {task_id}: not started: shutting down"}
        led = ledger()
        lines = advance(app.home, config, task_id, progress=jobs <= 1, ledger=led)
        t = task_state(led, task_id) or {"state": "?", "round": 0}
        # nothing to say (no progress, the same wait as last time): quiet, so a cron tick mails only news
        return {"task_id": task_id, "state": t["state"], "round": t["round"], "lines": lines,
                "line": "\n".join(lines) if lines else f"task {task_id}: no progress possible now",
                **({} if lines else {"quiet": True})}

    main = threading.get_ident()
    if jobs <= 1 or len(ids) == 1:
        return lifted + [one(i) for i in ids]
    from concurrent.futures import ThreadPoolExecutor

    try:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            return lifted + list(pool.map(one, ids))
    finally:
        for led in opened:
            led.close()


def fix_scan(app, jobs: int = 1) -> list[dict]:
    """`agent watch error-fix`: every confirmed error.fix conclusion without a task gets one, with its workspace."""
    from agent.ledger.errors import fix_candidates

    ledger, config = app.ledger, app.config
    rows = fix_candidates(ledger)
    items = []
    for r in rows:
        if STOP.is_set():  # SIGINT/SIGTERM: the workspace being made is finished, no new one is started
            break
        repo = config.repo_for_service(r["service"], hint=r["repo"])
        if repo is None:
            items.append({"error_id": r["error_id"], "line": f"error {r['error_id'][:8]}: no repository configured "
                          f"for service {r['service']!r}; add it to repos.<name>.services"})
            continue
        title = f"Fix {r['class'] or 'error'} in {r['service']}"
        if r["message"]:
            title += f": {r['message'].splitlines()[0]}"
        from agent.coord.claims import claim, release
        from agent.coord.runners import runner_id
        from agent.ledger.tasks import begin_fix
        from agent.ledger.tasks import create_task
        from agent.git.workspace import branch_name

        try:
            task_id, created = create_task(ledger, repo.name, title[:200], error_id=r["error_id"],
                                           conclusion_id=r["conclusion_id"], base=repo.base,
                                           round_cap=config.limits.round_cap, actor="script")
        except AgentError as exc:  # one repository's problem never stops the others' work
            items.append({"error_id": r["error_id"], "error": str(exc),
                          "line": f"error {r['error_id'][:8]}: no task: {exc}"})
            continue
        # its branch, its error's state and its workspace: only under its claim, as this home's runner (the
        # worktree it makes is in this home; the work scan's claim then knows it did not move)
        token = claim(ledger, task_id, runner=runner_id(app.home))
        if token is None:
            items.append({"task_id": task_id, "error_id": r["error_id"], "created": created,
                          "line": f"task {task_id} {'created' if created else 'found'} for error "
                                  f"{r['error_id'][:8]}; claimed by another worker, which prepares its workspace"})
            continue
        try:
            begin_fix(ledger, task_id, r["error_id"], branch_name(repo.branch_prefix, r["error_id"], task_id),
                      claim_token=token)
            lines = advance_workspace_only(app.home, config, task_id, token)
        finally:
            release(ledger, task_id, token)
        items.append({"task_id": task_id, "error_id": r["error_id"], "created": created,
                      "line": f"task {task_id} {'created' if created else 'found'} for error {r['error_id'][:8]}"
                              + (f"; {lines}" if lines else "")})
    return items


def advance_workspace_only(home: Path, config: Config, task_id: int, token: str) -> str:
    """Prepare the task's workspace now, under the caller's claim ``token`` (so `watch error-fix` leaves it
    ready); errors are retried later."""
    from agent.flows.fixer.driver import ensure_workspace
    from agent.flows.fixer.outcomes import Ctx, Stop

    ledger = Ledger.open(ledger_path(home), create=False)
    ctx = Ctx(home, config, ledger, task_id, token)
    try:
        if ctx.load_task()["worktree"]:  # prepared already (maybe in another runner's home): the work scan, under the
            return f"worktree {ctx.load_task()['worktree']}"   # task's claim, is what takes a task over
        ensure_workspace(ctx)
        return f"worktree {ctx.load_task()['worktree']}"
    except Stop:
        return "; ".join(ctx.lines)
    finally:
        ledger.close()
