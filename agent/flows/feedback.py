"""`agent watch pr-feedback`: what reviewers write on a draft PR and what its CI says start the next round.

For each task whose PR is open:
- read what is new since the PR's cursor (``Forge.feedback``): reviews, inline review comments (file, line),
  conversation comments. Each item is recorded once (unique per task and key) with a decision:
  ``own`` (the agent's own reply, by its mark), ``ignored`` (the author has no write access and is not in
  ``review.allowed_users``, an approval, an empty text), ``stop`` (``/agent stop`` from an allowed author:
  the task is gate-blocked with that reason) or ``taken`` (a finding for the next round);
- for a done task, the taken items start a new round on the same branch, through the one state machine
  (``tasks.start_feedback_round``: done -> working, the item keys are the evidence), unless a cap says no:
  then the task is gate-blocked and the PR gets one comment saying a human must take over;
- for a done task whose head is pushed, read the PR's CI for that head (``Forge.ci_results``): a failure
  becomes findings and starts a round the same way; a success is shown in the PR body; pending waits (other
  tasks go on).
Reading, deciding and starting the round is one transaction, so a kill before it re-reads (nothing recorded)
and a kill after it finds every item recorded: a round never starts twice.  The reply the round owes
(``pr_replies``) is posted when the round's task is done again (``post_owed_replies``, from the fixer's finish
and from this scan), forge first and ledger last: before posting, the PR is searched for the reply's own mark,
so a reply posted just before a kill is recorded, never posted again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from agent import AgentError

from agent.domain import chain
from agent.infra.faults import crashpoint
from agent.ledger import Ledger, feedback, ledger_path
from agent.infra.text import one_line

STOP_COMMAND = "/agent stop"
BODY_MAX = 4000           # stored per item (redacted)
SPEC_ITEMS_MAX = 30       # findings from PR feedback put in one spec
OWN_MARK_KEY = "own-mark" # the ledger secret that signs the agent's own marks
CI_TEXT_MAX = 2000        # a CI result's text kept for the spec (fenced there)


def _redact(text: str) -> str:
    from agent.infra.redact import redact

    return redact(text or "")


def _one_line(text: str, limit: int = 200) -> str:
    return one_line(text, limit)


# ---------------------------------------------------------------------------------------------- deciding


def stop_reason(body: str) -> str | None:
    """The reason of a ``/agent stop [reason]`` command on the first line of ``body``, '' if none, else None."""
    first = (body or "").strip().splitlines()[0].strip() if (body or "").strip() else ""
    if first.lower() == STOP_COMMAND or first.lower().startswith(STOP_COMMAND + " "):
        return first[len(STOP_COMMAND):].strip(" :-")
    return None


def own_checker(login: str | None, secret: str) -> Callable[[object], str | None]:
    """Whether a ``Feedback`` is the agent's own: by its author (the forge's ``own_login``) first, else by an own
    mark signed with the ledger's secret. Returns the reply key it answers ('' for an own comment without one), or
    None: not the agent's (an outsider's copy of a mark is just a comment from an outsider)."""
    from agent.forge import verified_key

    def own(item) -> str | None:
        marked = item.own_key
        if login and (item.author or "").lower() == login.lower():
            return verified_key(marked, secret) or marked or ""
        return verified_key(marked, secret)

    return own


def _own_for(ledger: Ledger, forge) -> Callable[[object], str | None]:
    from agent.forge import own_login
    from agent.ledger.keys import ledger_key

    return own_checker(own_login(forge), ledger_key(ledger, OWN_MARK_KEY))


def decide(item, may_steer: Callable[[str], bool], own: Callable[[object], str | None] | None = None
           ) -> tuple[str, str | None]:
    """``(decision, reason)`` for one ``Feedback``: own | ignored | stop | taken (``own``: see ``own_checker``)."""
    if own is not None and own(item) is not None:
        return "own", "the agent's own comment"
    if not may_steer(item.author):
        return "ignored", f"{item.author} has no write access and is not in review.allowed_users"
    if stop_reason(item.body) is not None:
        return "stop", None
    if item.kind == "review" and item.state not in ("changes_requested", "commented"):
        return "ignored", f"a review that is {item.state or 'unknown'} asks for no change"
    if not (item.body or "").strip():
        if item.kind == "review":
            return "ignored", "a review without text (its inline comments are read one by one)"
        return "ignored", "empty"
    return "taken", None


def allowed_checker(forge, allowed_users: tuple[str, ...]) -> Callable[[str], bool]:
    """``review.allowed_users`` first, then the forge's write access (asked once per author per scan)."""
    cache: dict[str, bool] = {}
    allowed = {u.lower() for u in allowed_users}

    def may_steer(login: str) -> bool:
        if (login or "").lower() in allowed:
            return True
        if login not in cache:
            cache[login] = bool(login) and forge.has_write_access(login)
        return cache[login]

    return may_steer


def _where(row: dict) -> str:
    if not row.get("path"):
        return ""
    return f" on {row['path']}" + (f" line {row['line']}" if row.get("line") else "")


def finding_text(row: dict) -> str:
    """One finding for a spec, from a ``pr_feedback`` row (all of it untrusted: it goes inside one fence)."""
    if row["kind"] == "ci":
        head = f"CI {row['state']}: {row['author']}"
        if row.get("url"):
            head += f" (details: {row['url']})"
        return f"{head}\n{row['body'] or '(no summary)'}"
    what = {"review": f"review ({row['state']})", "inline": "review comment", "comment": "PR comment"}.get(
        row["kind"], row["kind"])
    return f"{what} by {row['author']}{_where(row)}:\n{row['body']}"


def spec_findings(ledger: Ledger, task_id: int) -> list[str]:
    """Every finding taken from the PR so far (newest round last), for the implementer spec."""
    rows = feedback.feedback_items(ledger, task_id, decision="taken")
    return [f"[round {r['round']}] {finding_text(r)}" for r in rows[-SPEC_ITEMS_MAX:]]


# ---------------------------------------------------------------------------------------------- rounds


def _start_or_cap(ledger: Ledger, c, task: dict, number: int, trigger: str, keys: list[str], config,
                  head: str | None) -> tuple[str, str]:
    """Inside the caller's transaction: start a feedback round, or gate-block at a cap (owing one comment).

    Returns ``("started", line)`` or ``("capped", line)``."""
    from agent.ledger.tasks import start_feedback_round, transition_in

    task_id = task["id"]
    used = feedback.feedback_rounds_since_reset(ledger, c, task_id)
    why = chain.feedback_round_refusal(task["round"], task["round_cap"], used, config.limits.feedback_rounds)
    if why:
        reason = f"{why}; a human must take over PR #{number}"
        transition_in(ledger, c, task_id, task["state"], chain.BLOCKED, "script", reason)
        resets = feedback.resets(ledger, task_id, c)
        feedback.owe_reply(ledger, c, task_id, f"task-{task_id}-cap-{resets}", "cap", task["round"], reason)
        return "capped", f"gate-blocked: {reason}"
    what = "CI failed" if trigger == "ci" else f"PR feedback ({len(keys)} item{'s' if len(keys) != 1 else ''})"
    new_round = start_feedback_round(ledger, c, task_id, keys, f"{what} on PR #{number}: {', '.join(keys)[:300]}",
                                     trigger)
    feedback.set_feedback_round(ledger, c, task_id, keys, new_round)
    feedback.add_feedback_round(ledger, c, task_id, new_round, trigger, keys, head)
    feedback.owe_reply(ledger, c, task_id, f"task-{task_id}-round-{new_round}", "round", new_round)
    return "started", f"round {new_round} started by {what}"


def _record_items(ledger: Ledger, c, task_id: int, number: int, rows: list[dict]) -> None:
    known = feedback.feedback_keys(ledger, task_id, c)
    for row in rows:
        if row["key"] not in known:
            feedback.add_feedback(ledger, c, {"task_id": task_id, "number": number, **row})
            known.add(row["key"])


def _item_row(item, decision: str, reason: str | None, round_no: int) -> dict:
    return {"key": item.key, "kind": item.kind, "author": item.author, "path": item.path, "line": item.line,
            "state": item.state, "url": item.url, "body": _redact(item.body)[:BODY_MAX], "decision": decision,
            "reason": reason, "round": round_no}


def read_feedback(ledger: Ledger, forge, config, task_id: int, token: str | None) -> list[str]:
    """Read new PR feedback for one task and act on it (see the module docstring). Returns lines."""
    from agent.ledger.prs import get_pr
    from agent.ledger.tasks import get_task, transition_in
    from agent.ledger.leases import claimed_tx

    task = get_task(ledger, task_id)
    pr = get_pr(ledger, task_id)
    number = int(pr["number"])
    watch = feedback.pr_watch(ledger, task_id)
    page = forge.feedback(number, watch["cursor"])
    crashpoint("feedback.read")  # fault injection (tests): read from the forge, nothing recorded yet
    known = feedback.feedback_keys(ledger, task_id)
    may_steer = allowed_checker(forge, config.review.allowed_users)
    own = _own_for(ledger, forge)
    decided = [(item, *decide(item, may_steer, own)) for item in page.items if item.key not in known]
    if not decided:
        if page.cursor != watch["cursor"]:
            with claimed_tx(ledger, task_id, token) as c:
                feedback.set_pr_watch(ledger, c, task_id, cursor=page.cursor)
        return []
    lines: list[str] = []
    stops = [(item, dec) for item, dec, _ in decided if dec == "stop"]
    with claimed_tx(ledger, task_id, token) as c:
        task = get_task(ledger, task_id, c)
        if task["state"] != chain.DONE and not stops:
            # mid-round: the items wait (nothing recorded, the cursor stays) until the task is done again
            return []
        rows: list[dict] = []
        for item, dec, reason in decided:
            if dec == "taken" and (stops or task["state"] != chain.DONE):
                dec, reason = "ignored", "arrived with /agent stop"
            rows.append(_item_row(item, dec, reason, task["round"]))
        _record_items(ledger, c, task_id, number, rows)
        feedback.set_pr_watch(ledger, c, task_id, cursor=page.cursor)
        for r in rows:
            if r["decision"] == "ignored" and r["reason"] and "write access" in r["reason"]:
                lines.append(f"task {task_id}: PR #{number} {r['key']} by {r['author']} ignored: {r['reason']}")
        taken = [r["key"] for r in rows if r["decision"] == "taken"]
        if stops:
            item, _ = stops[-1]
            why = _one_line(_redact(stop_reason(item.body) or "no reason given"))
            reason = f"stopped by {item.author} on PR #{number} ({item.key}): {why}"
            transition_in(ledger, c, task_id, task["state"], chain.BLOCKED, "script", reason)
            lines.append(f"task {task_id}: gate-blocked: {reason}")
        elif taken:
            _, line = _start_or_cap(ledger, c, task, number, "review", taken, config, task["pushed_sha"])
            lines.append(f"task {task_id}: {line}")
    crashpoint("feedback.recorded")  # fault injection (tests): items recorded and the round started
    return lines


def _ci_rows(results) -> list[dict]:
    return [{"name": r.name, "kind": r.kind, "state": r.state, "conclusion": r.conclusion, "url": r.url}
            for r in results]


def _no_ci(ledger: Ledger, task_id: int, token: str | None, sha: str, watch: dict, wait_s: int) -> list[str]:
    """No CI result for the pushed head: wait ``feedback.ci_wait`` from its push, then say so once (state
    ``missing``): a CI that never ran (a skip directive, no CI configured) is news, not "nothing to do"."""
    import time
    from datetime import datetime, timezone

    from agent.ledger import eventlog
    from agent.ledger.leases import claimed_tx
    from agent.ledger.prs import get_pr

    if watch["ci_sha"] == sha and watch["ci_state"] == "missing":
        return []
    pushed = [e for e in eventlog.events(ledger, task_id=task_id) if e["kind"] == "branch.pushed"
              and e["payload"].get("sha") == sha]
    if not pushed:
        return []
    at = datetime.strptime(pushed[-1]["ts"][:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
    waited = time.time() - at
    if waited < wait_s:
        return []
    with claimed_tx(ledger, task_id, token) as c:
        feedback.set_pr_watch(ledger, c, task_id, ci_sha=sha, ci_state="missing", ci_results="[]")
        ledger.event(c, "pr.ci_missing", "script", {"head": sha, "waited_s": int(waited)}, task_id=task_id)
    number = int(get_pr(ledger, task_id)["number"])
    return [f"task {task_id}: PR #{number} has no CI result for {sha[:12]} {int(waited)}s after the push "
            f"(feedback.ci_wait={wait_s}s): its CI did not run (a skip directive? no CI for the repository?); "
            "a result that comes later is still read"]


def read_ci(ledger: Ledger, forge, config, task_id: int, token: str | None) -> tuple[list[str], bool]:
    """The PR's CI for the task's pushed head. Returns (lines, refresh_pr_body)."""
    import json

    from agent.ledger.prs import get_pr
    from agent.ledger.tasks import get_task
    from agent.ledger.leases import claimed_tx

    task = get_task(ledger, task_id)
    sha = task["pushed_sha"]
    if task["state"] != chain.DONE or not sha or sha != task["head_sha"]:
        return [], False
    watch = feedback.pr_watch(ledger, task_id)
    if watch["ci_sha"] == sha and watch["ci_state"] in ("success", "failure", "neutral"):
        return [], False  # acted on already
    apps = set(config.feedback.ci_apps)   # a check run counts only from a configured CI app (anyone may add one)
    results = [r for r in forge.ci_results(sha) if r.kind != "check_run" or r.app is None or r.app in apps]
    if not results:
        return _no_ci(ledger, task_id, token, sha, watch, config.feedback.ci_wait), False
    states = {r.state for r in results}
    state = "pending" if "pending" in states else "failure" if "failure" in states else \
        "success" if "success" in states else "neutral"
    number = int(get_pr(ledger, task_id)["number"])
    lines: list[str] = []
    with claimed_tx(ledger, task_id, token) as c:
        task = get_task(ledger, task_id, c)
        if task["state"] != chain.DONE or task["pushed_sha"] != sha:
            return [], False
        if state == "failure":
            rows = [{"key": f"ci:{sha[:12]}:{r.kind}:{r.name}"[:200], "kind": "ci", "author": one_line(r.name, 120),
                     "path": None, "line": None, "state": one_line(r.conclusion or r.state, 40), "url": r.url,
                     "body": _redact(r.summary)[:CI_TEXT_MAX], "decision": "taken", "reason": None,
                     "round": task["round"]} for r in results if r.state == "failure"]
            _record_items(ledger, c, task_id, number, rows)
            feedback.set_pr_watch(ledger, c, task_id, ci_sha=sha, ci_state=state,
                                  ci_results=json.dumps(_ci_rows(results)))
            names = ", ".join(r["author"] for r in rows)
            _, line = _start_or_cap(ledger, c, task, number, "ci", [r["key"] for r in rows], config, sha)
            lines.append(f"task {task_id}: PR #{number} CI failed at {sha[:12]} ({names}); {line}")
        else:
            if watch["ci_sha"] == sha and watch["ci_state"] == state:
                return [], False
            feedback.set_pr_watch(ledger, c, task_id, ci_sha=sha, ci_state=state,
                                  ci_results=json.dumps(_ci_rows(results)))
            ledger.event(c, "pr.ci", "script", {"head": sha, "state": state, "results": _ci_rows(results)},
                         task_id=task_id)
            if state != "pending":
                lines.append(f"task {task_id}: PR #{number} CI {state} at {sha[:12]}")
    crashpoint("feedback.recorded")
    return lines, state in ("success", "neutral")


# ---------------------------------------------------------------------------------------------- replies


def reply_text(ledger: Ledger, task: dict, reply: dict, repo_path: Path | None) -> str:
    """What the round changed for which comment, the new head, the check (plain data, redacted)."""
    from agent.domain.pr_text import _code as code
    from agent.infra.text import fence

    rnd = int(reply["round"])
    if reply["kind"] == "cap":
        return (f"agent stops here: {reply['text']}.\n\nA human must take over this PR: push to the branch, or "
                f"close it. `agent task reset {task['id']} --reason TEXT --rounds N` lets agent go on.")
    items = feedback.feedback_items(ledger, task["id"], decision="taken", round=rnd)
    lines = [f"Round {rnd} addressed this feedback:"]
    for r in items:
        if r["kind"] == "ci":
            lines.append(f"- CI {code(_one_line(r['author'], 80))} ({code(_one_line(r['state'], 30))})")
        else:
            kind = {"review": "review", "inline": "review comment", "comment": "comment"}[r["kind"]]
            where = f" on {code(_one_line(r['path'], 120))}" + (f" line {r['line']}" if r["line"] else "") \
                if r["path"] else ""
            lines.append(f"- {kind} {r['key'].split(':', 1)[1]} by @{_one_line(r['author'], 60)}{where}")
    from agent.ledger.lanes import implementer_summaries_since
    from agent.ledger.tasks import latest_check

    summaries = implementer_summaries_since(ledger, task["id"], rnd)
    if summaries:   # the lane's words: only inside a fence (no mentions, images, HTML or links rendered)
        lines += ["", "What changed, as the implementer lane reported it:", "",
                  fence("\n".join(f"round {s['round']}: {_one_line(_redact(s['summary'] or ''), 400)}"
                                   for s in summaries))]
    fr = next((r for r in feedback.feedback_rounds(ledger, task["id"]) if r["round"] == rnd), None)
    if fr and fr["base_head"] and repo_path is not None and task["head_sha"]:
        try:
            from agent.git.workspace import TaskGit     # hardened: never GitPython on a worktree a lane wrote

            files = TaskGit(repo_path).diff("--name-only", fr["base_head"], task["head_sha"]).split()
            if files:
                lines.append("- files: " + ", ".join(code(_one_line(f, 120)) for f in files[:20]))
        except Exception:  # the worktree is gone or the old head unknown: the list is a nicety
            pass
    lines += ["", f"New head: `{task['head_sha'][:12]}` on `{task['branch']}` (this PR, updated)."]
    check = latest_check(ledger, task["id"], task["head_sha"])
    if check:
        lines.append(f"Check: {code(_one_line(_redact(check['command']), 200))} "
                     f"{'passed' if check['passed'] else 'failed'} at `{task['head_sha'][:12]}`.")
    lines.append("Reviewers (code, PR quality, PR logic) approved this head.")
    return _redact("\n".join(lines))


def post_owed_replies(ledger: Ledger, forge, task_id: int) -> list[str]:
    """Post every reply the task owes that is due now, at most once each (see the module docstring)."""
    from agent.ledger.prs import get_pr
    from agent.ledger.tasks import get_task

    task = get_task(ledger, task_id)
    pr = get_pr(ledger, task_id)
    if pr is None or pr["state"] != "open":
        return []
    due = [r for r in feedback.owed_replies(ledger, task_id)
           if r["kind"] != "round" or (task["state"] == chain.DONE and task["round"] >= r["round"]
                                       and task["pushed_sha"] == task["head_sha"])]
    if not due:
        return []
    from agent.forge import signed_key
    from agent.ledger.keys import ledger_key

    number = int(pr["number"])
    own = _own_for(ledger, forge)
    posted = {}
    for item in forge.feedback(number, None).items:  # replies posted just before a kill carry their key
        key = own(item)
        if key:
            posted[key] = item.id
    secret = ledger_key(ledger, OWN_MARK_KEY)
    lines = []
    for r in due:
        found = r["key"] in posted
        if found:
            reply_id = posted[r["key"]]
        else:
            text = reply_text(ledger, task, r, Path(task["worktree"]) if task["worktree"] else None)
            reply_id = forge.reply(number, text, signed_key(r["key"], secret))
            crashpoint("feedback.replied")  # fault injection (tests): posted, not recorded yet
        if feedback.record_reply(ledger, task_id, r["key"], reply_id, task["head_sha"], found):
            what = f"round {r['round']}" if r["kind"] == "round" else "a human must take over"
            lines.append(f"task {task_id}: replied on PR #{number} ({what})"
                         + (" (found on the PR after a crash, not posted again)" if found else ""))
    return lines


# ---------------------------------------------------------------------------------------------- the scan


def refresh_pr_text(ledger: Ledger, forge, task_id: int) -> bool:
    """Re-render the PR text (e.g. to show CI) and update the PR when it changed. Returns True if updated."""
    from agent.flows.pr_thread import publish_pr
    from agent.domain.pr_text import render_pr
    from agent.ledger.prs import get_pr, pr_data_from_ledger
    from agent.ledger.tasks import get_task

    task = get_task(ledger, task_id)
    title, body = render_pr(pr_data_from_ledger(ledger, task_id))
    pr = get_pr(ledger, task_id)
    if pr and pr["title"] == title and pr["body"] == body:
        return False
    publish_pr(ledger, forge, task_id, task["branch"], task["base"], title, body, task["head_sha"])
    return True


def watch_task(home: Path, config, task_id: int, forge_factory: Callable | None = None) -> list[str]:
    """One task's PR: owed replies, new feedback, CI. Own ledger connection and claim; never raises for a task."""
    from agent.coord.claims import claim, release_quietly
    from agent.forge import ForgeAuthError, ForgeError, get_forge
    from agent.ledger.tasks import ClaimLost, Refused, get_task

    ledger = Ledger.open(ledger_path(home), create=False)
    token = None
    try:
        token = claim(ledger, task_id)
        if token is None:
            return []  # a worker is on it now; the next scan reads its PR
        task = get_task(ledger, task_id)
        repo_cfg = config.repos.get(task["repo"])
        if repo_cfg is None:
            return [f"task {task_id}: repository {task['repo']} is not configured; PR feedback not read"]
        forge = (forge_factory or get_forge)(repo_cfg, config, home, ledger=ledger)
        lines = post_owed_replies(ledger, forge, task_id)
        if task["state"] not in (chain.OPEN, chain.WORKING, chain.DONE):
            return lines  # gate-blocked or failed: a human decides; only the comment it owes is posted
        lines += read_feedback(ledger, forge, config, task_id, token)
        ci_lines, refresh = read_ci(ledger, forge, config, task_id, token)
        lines += ci_lines
        if refresh and refresh_pr_text(ledger, forge, task_id):
            lines.append(f"task {task_id}: PR text shows the CI result")
        lines += post_owed_replies(ledger, forge, task_id)  # a cap comment owed by this pass
        return lines
    except (ForgeAuthError, ForgeError) as exc:
        if getattr(exc, "remembered", False):
            return []  # a rate limit remembered from an earlier call: said when it happened, no news now
        return [f"task {task_id}: PR feedback not read now: {exc}"]
    except (ClaimLost, Refused) as exc:
        return [f"task {task_id}: {exc}"]
    except AgentError as exc:
        return [f"task {task_id}: PR feedback: {exc}"]
    finally:
        release_quietly(ledger, task_id, token)
        ledger.close()


def scan_pr_feedback(app, jobs: int = 1, forge_factory: Callable | None = None) -> list[dict]:
    """`agent watch pr-feedback`: every open agent PR, one task at a time (one task's trouble stops no other)."""
    ids = [r["task_id"] for r in feedback.feedback_tasks(app.ledger)]
    ids += [i for i in feedback.tasks_with_owed_replies(app.ledger) if i not in ids]
    if not ids:
        return []
    config = app.config
    items = []
    for task_id in sorted(ids):
        try:
            lines = watch_task(app.home, config, task_id, forge_factory)
        except Exception as exc:  # one task's failure never stops the others
            lines = [f"task {task_id}: PR feedback error: {type(exc).__name__}: {exc}"]
        items.append({"task_id": task_id, "lines": lines,
                      "line": "\n".join(lines) if lines else f"task {task_id}: no new PR feedback",
                      **({} if lines else {"quiet": True})})
    return items
