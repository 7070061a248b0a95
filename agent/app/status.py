"""`agent status`: errors, tasks and PRs by state; what needs a human; one self-contained HTML page."""

from __future__ import annotations

import html
import shlex

from agent.intake.formats import error_headline
from agent.domain.wording import ago, reset_command
from agent.ledger import Ledger, eventlog, status
from agent.git.workspace import disk_use, human_bytes

ERROR_STATES = ("open", "fixing", "resolved", "skipped")
TASK_STATES = ("open", "working", "gate-blocked", "done", "failed")
PR_STATES = ("open", "merged", "closed")


def _counts(ledger: Ledger, table: str, states: tuple[str, ...]) -> dict[str, int]:
    found = status.state_counts(ledger, table)
    return {s: found.get(s, 0) for s in states} | {k: v for k, v in found.items() if k not in states}


def one_line(text: str | None, limit: int | None = None) -> str:
    """A reason or title on one line (a multi-line lane excerpt never breaks a row), cut to ``limit``."""
    flat = " ".join((text or "").split())
    return flat if limit is None or len(flat) <= limit else flat[:limit - 3].rstrip() + "..."


FINISHED_PAGE = 50     # finished tasks per page; older ones by link
FAILED_SHOWN = 50      # newest failed tasks in the summary
DECISIONS_SHOWN = 20   # newest open errors listed under "waiting for a decision"


def _epoch(ts: str | None) -> float | None:
    """A ledger timestamp (``2026-01-01T10:00:00.123456Z`` or without fraction) as Unix seconds."""
    from datetime import datetime, timezone

    if not ts:
        return None
    try:
        return datetime.fromisoformat(ts.replace("Z", "+00:00")).astimezone(timezone.utc).timestamp()
    except ValueError:
        return None


def runner_live(runner: dict) -> bool:
    """Whether a runner counts as live for the stuck rule (the runners view's own judgement): alive, or stopped
    cleanly within the stale threshold (a cron runner between two ticks)."""
    from agent.coord.runners import stale_after_s

    state = runner.get("state")
    if state == "stopped":
        return float(runner.get("heartbeat_age_s") or 0) <= stale_after_s()
    return state == "alive" if state is not None else bool(runner.get("alive"))


def current_step(steps: dict[str, str]) -> str | None:
    """The first step in chain order that is not closed and whose needs are (what the task is on now)."""
    from agent.domain.chain import CLOSED, STEPS

    for s in STEPS:
        if steps.get(s.key, "pending") not in CLOSED and all(steps.get(n, "pending") in CLOSED for n in s.needs):
            return s.key
    return None


def stuck_reason(task: dict, runners_by_id: dict[str, dict], any_live: bool, now: float,
                 timeout_s: float) -> str | None:
    """Why a task is stuck, or None. The one rule (the page, `agent status` and its JSON use it): a ``working``
    task is stuck when a runner that is not live holds it (or its claim's lease ran out), when nothing holds it and
    no runner is live to pick it up, or when nothing happened to it (no event) for longer than its lane timeout."""
    if task["state"] != "working":
        return None
    holder = task.get("claim_runner")
    if task.get("claim_token"):
        runner = runners_by_id.get(holder or "")
        if runner is None or not runner_live(runner):
            return f"held by runner {holder or '?'}, which is not live"
        if task.get("lease_until") is not None and float(task["lease_until"]) < now:
            return f"held by runner {holder}, but its lease expired {ago(now - float(task['lease_until']))} ago"
    elif not any_live:
        return "no live runner to pick it up (is the daemon or cron running?)"
    last = _epoch(task.get("last_event_at")) or _epoch(task.get("updated_at"))
    if last is not None and now - last > timeout_s and not task.get("wait_reason"):
        return f"no event for {ago(now - last)} (lane timeout {ago(timeout_s)})"
    return None


def _timeout_for(config, role: str | None) -> float:
    """A task's lane timeout: its running lane's (``lanes.ROLE.timeout``, else ``limits.lane_timeout``); with no
    lane running, the longer of the lane and check timeouts."""
    from agent.config import Limits

    limits = config.limits if config is not None else Limits()
    if not role:
        return float(max(limits.lane_timeout, limits.check_timeout))
    lane = config.lane(role) if config is not None else None
    return float(lane.timeout if lane is not None and lane.timeout else limits.lane_timeout)


def _active_row(t: dict, now: float) -> dict:
    created = _epoch(t["created_at"])
    last = _epoch(t["last_event_at"])
    lane = None
    if t["lane_role"]:
        lane = {"role": t["lane_role"], "vendor": t["lane_vendor"],
                "running_s": round(now - (_epoch(t["lane_started_at"]) or now), 1)}
    return {"id": t["id"], "repo": t["repo"], "title": t["title"], "state": t["state"], "round": t["round"],
            "round_cap": t["round_cap"], "age_s": round(now - created, 1) if created else None,
            "idle_s": round(now - last, 1) if last else None, "last_event": t["last_event"],
            "step": current_step(t["steps"]), "lane": lane, "held_by": t["claim_runner"] if t["claim_token"] else None,
            "wait_reason": t["wait_reason"], "blocked_reason": t["blocked_reason"]}


def gather(ledger: Ledger, home=None, config=None, now: float | None = None) -> dict:
    """Everything `agent status` and the page show, summary first (see render_text)."""
    import time

    from agent.coord.runners import runners as runner_list

    now = time.time() if now is None else now
    blocked = status.blocked_tasks(ledger)
    for t in blocked:
        t["reset_command"] = reset_command(t["id"], "gate-blocked")
    failed = status.failed_tasks(ledger, limit=FAILED_SHOWN)
    for t in failed:
        t["reset_command"] = reset_command(t["id"], "failed")
    runners = runner_list(ledger)   # judged on the ledger's clock
    by_id = {r["id"]: r for r in runners}
    any_live = any(runner_live(r) for r in runners)
    active, stuck = [], []
    for t in status.active_tasks(ledger):
        row = _active_row(t, now)
        row["stuck"] = stuck_reason(t, by_id, any_live, now, _timeout_for(config, t["lane_role"]))
        active.append(row)
        if row["stuck"]:
            stuck.append(row)
    ages = {r["id"]: r for r in active}
    for t in blocked:
        t.update({k: ages[t["id"]][k] for k in ("age_s", "idle_s", "step") if t["id"] in ages})
    prs = _with_proof(ledger, status.open_pr_rows(ledger))
    for p in prs:
        opened = _epoch(p["created_at"])
        p["age_s"] = round(now - opened, 1) if opened else None
    undecided = status.undecided_errors(ledger, DECISIONS_SHOWN)
    for e in undecided:
        seen = _epoch(e["last_seen"])
        e["last_seen_age_s"] = round(now - seen, 1) if seen else None
        e["decide_command"] = (f"agent error decide {e['id']} --fix --brief {shlex.quote('what to fix')}   # or "
                               f"--skip --reason {shlex.quote('why not')}")
    finished = status.finished_tasks(ledger, FINISHED_PAGE)
    data = {
        "errors": _counts(ledger, "errors", ERROR_STATES),
        "tasks": _counts(ledger, "tasks", TASK_STATES),
        "prs": _counts(ledger, "prs", PR_STATES),
        "lessons": lesson_counts(ledger),
        "gate_blocked": blocked,
        "stuck": stuck,
        "open_prs": prs,
        "undecided": undecided,
        "runners": runners,
        "active": active,
        "waiting": status.waiting_tasks(ledger),
        "failed": failed,
        "finished": finished,
        "cost_usd": round(status.lane_cost_total(ledger), 4),
        **({"disk": disk_use(home)} if home is not None else {}),
    }
    return data


def proof_word(verdict: str | None) -> str:
    """A task's proof for its head in one word (DESIGN.md "The proof")."""
    return {None: "not checked", "proven": "proven"}.get(verdict, "unproven")


def _with_proof(ledger: Ledger, rows: list[dict]) -> list[dict]:
    from agent.ledger.proofs import proof_states

    states = proof_states(ledger)
    for r in rows:
        r["proof"] = proof_word(states.get(r["task_id"]))
    return rows


def lesson_counts(ledger: Ledger) -> dict[str, int]:
    """Lessons by state: candidates wait for a human (their PR merged, or `agent lesson accept`); only accepted
    ones reach a spec."""
    from agent.flows.lessons import counts

    return counts(ledger)


def _lease_text(task: dict, now: float) -> str:
    from datetime import datetime, timezone

    if not task["lease_until"]:
        return "no lease"
    if task.get("lease_left_s") is not None:   # judged on the ledger's clock (fence.runner_view)
        left = float(task["lease_left_s"])
        return f"lease expired {ago(-left)} ago" if left < 0 else f"lease {ago(left)} left"
    until = datetime.strptime(task["lease_until"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
    return f"lease expired {ago(now - until)} ago" if until < now else f"lease {ago(until - now)} left"


def _named_lease_text(lease: dict, now: float) -> str:
    """``expired 3m ago`` or ``1m left``."""
    return _lease_text({"lease_until": lease["until"], "lease_left_s": lease.get("left_s")}, now).replace(
        "lease ", "", 1)


def held_text(runner: dict, now: float) -> str:
    """What a runner holds, on one line: ``task 5 (working, lease 1m left), lease pr-open (expired 3m ago)``, or
    ``nothing``."""
    held = [f"task {t['task_id']} ({t['state']}, {_lease_text(t, now)})" for t in runner["tasks"]]
    held += [f"lease {lease['name']} ({_named_lease_text(lease, now)})" for lease in runner.get("leases", [])]
    return ", ".join(held) or "nothing"


def runner_lines(runners: list[dict], now: float | None = None) -> list[str]:
    """Two or more lines per runner: who, alive or stale, heartbeat age, then each task and named lease it
    holds."""
    import time

    now = time.time() if now is None else now
    lines = []
    for r in runners:
        state = r["state"] if r["state"] in ("alive", "stopped") else r["state"].upper()
        beat = f"heartbeat {ago(r['heartbeat_age_s'])} ago" if r["heartbeat_at"] else "never registered"
        where = f"  {r['host']}  {r['home']}  pid {r['pid']}" if r["host"] else ""
        lines.append(f"  {r['id']}  {state}  {beat}{where}")
        lines.append(f"    {r['why']}")
        if r["clock_skewed"]:
            lines.append(f"    CLOCK: {r['clock_offset_s']:+.1f}s off the ledger's clock (more than 5s)")
        if not r["tasks"]:
            lines.append("    holds no task")
        for t in r["tasks"]:
            lines.append(f"    task {t['task_id']} ({t['state']}): {_lease_text(t, now)}")
        for lease in r.get("leases", []):
            lines.append(f"    lease {lease['name']}: {_named_lease_text(lease, now)}")
    return lines


def _row_where(t: dict) -> str:
    """``step implementer_done, lane implementer (codex) 4m, last event 2m ago``."""
    bits = []
    if t.get("step"):
        bits.append(f"step {t['step']}")
    if t.get("lane"):
        bits.append(f"lane {t['lane']['role']} ({t['lane']['vendor']}) {ago(t['lane']['running_s'])}")
    if t.get("idle_s") is not None:
        bits.append(f"last event {ago(t['idle_s'])} ago")
    return ", ".join(bits)


def render_text(data: dict) -> str:
    def row(name: str, counts: dict) -> str:
        return f"{name:<7}" + "  ".join(f"{k} {v}" for k, v in counts.items())

    lines = [row("errors", data["errors"]), row("tasks", data["tasks"]), row("prs", data["prs"]),
             f"lessons candidate {data['lessons']['candidate']}  accepted {data['lessons']['accepted']}",
             f"cost   ${data['cost_usd']:.2f} spent on lanes"]
    if data.get("disk"):
        d = data["disk"]
        lines.append(f"disk   worktrees {d['worktrees']['count']} ({human_bytes(d['worktrees']['bytes'])})  "
                     f"mirrors {d['mirrors']['count']} ({human_bytes(d['mirrors']['bytes'])})")
    if data["gate_blocked"]:
        lines.append("\nneeds a human (gate-blocked):")
        for t in data["gate_blocked"]:
            age = f" ({ago(t['age_s'])} old)" if t.get("age_s") is not None else ""
            lines.append(f"  task {t['id']} {t['repo']}{age}: {one_line(t['blocked_reason'], 300)}\n"
                         f"    then: {t['reset_command']}")
    if data.get("stuck"):
        lines.append("\nstuck:")
        for t in data["stuck"]:
            lines.append(f"  task {t['id']} {t['repo']} ({ago(t['age_s'])} old; {_row_where(t)}): "
                         f"{one_line(t['stuck'], 300)}")
    if data["open_prs"]:
        lines.append("\ndraft PRs waiting for review:")
        for p in data["open_prs"]:
            age = f" (opened {ago(p['age_s'])} ago)" if p.get("age_s") is not None else ""
            lines.append(f"  task {p['task_id']} {p['repo']}#{p['number']}{age}: {p['url']} ({p.get('proof', '?')})")
    if data.get("undecided"):
        n, shown = data["errors"].get("open", len(data["undecided"])), len(data["undecided"])
        more = f", newest {shown} shown" if n > shown else ""
        lines.append(f"\nwaiting for a decision ({n} open error{'s' if n != 1 else ''}{more}):")
        for e in data["undecided"]:
            seen = f", last {ago(e['last_seen_age_s'])} ago" if e.get("last_seen_age_s") is not None else ""
            lines.append(f"  {e['id']} {e['service']} {one_line(error_headline(e['class'], e['message']), 160)} "
                         f"(seen {e['count']}x{seen})")
    if data.get("runners"):
        stale = sum(1 for r in data["runners"] if r["state"] in ("dead", "silent"))
        lines.append(f"\nrunners ({len(data['runners'])}{f', {stale} dead or silent' if stale else ''}):")
        lines.extend(runner_lines(data["runners"]))
    others = [t for t in data.get("active", []) if t["state"] != "gate-blocked" and not t["stuck"]]
    if others:
        lines.append("\nworking:")
        for t in others:
            wait = f"; waiting: {one_line(t['wait_reason'], 200)}" if t.get("wait_reason") else ""
            lines.append(f"  task {t['id']} {t['repo']} {t['state']} ({ago(t['age_s'])} old; {_row_where(t)}){wait}")
    if data["failed"]:
        lines.append("\nfailed:")
        for t in data["failed"]:
            lines.append(f"  task {t['id']} {t['repo']}: {one_line(t['failed_reason'], 200)}\n"
                         f"    to retry: {t['reset_command']}")
    return "\n".join(lines)


CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;margin:1.2rem auto;max-width:76rem;color:#222;padding:0 1rem}
h1{font-size:1.4rem;margin:.2rem 0}h2{font-size:1.05rem;margin:1.2rem 0 .3rem;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.3rem 0;width:100%}td,th{border:1px solid #ddd;padding:.2rem .5rem;text-align:left;vertical-align:top}
th{background:#f5f5f5}.blocked{background:#fff4e5}.failed,.stuck{background:#fdecea}.done{background:#eaf7ee}
code{background:#f3f3f3;padding:0 .25rem}details{margin:.4rem 0}summary{cursor:pointer;font-weight:600}
.ev td:first-child{white-space:nowrap;color:#666}.kind{color:#888;font-size:.85em}.muted{color:#777}
#live{color:#666;margin:.2rem 0}td:first-child{white-space:nowrap}.counts td,.counts th{width:auto}table.counts{width:auto}
"""


def _a(task_id: int, href) -> str:
    return f"<a href='{html.escape(href(task_id))}'>task {task_id}</a>"


def _section(sid: str, title: str, n: int, body: str) -> str:
    return f"<div id='{sid}'><h2>{title} ({n})</h2>{body if n else '<p class=muted>none</p>'}</div>"


def summary_sections(data: dict, href=lambda i: f"#task-{i}", now: float | None = None) -> dict[str, str]:
    """The summary as HTML fragments by element id: the page shows them, and `agent serve` sends them as JSON
    so an open page patches itself (agent/app/serve.py)."""
    import time

    e = html.escape
    now = time.time() if now is None else now
    out: dict[str, str] = {}
    out["s-counts"] = (
        "<div id='s-counts'><table class='counts' id='counts'><tr><th></th>" + "".join(f"<th>{e(s)}</th>" for s in TASK_STATES) + "</tr>"
        + "<tr><th>tasks</th>" + "".join(f"<td>{data['tasks'].get(s, 0)}</td>" for s in TASK_STATES) + "</tr></table>"
        + "<table class='counts'><tr><th>errors</th>"
        + "".join(f"<td>{e(k)} {v}</td>" for k, v in data["errors"].items())
        + "</tr><tr><th>PRs</th>" + "".join(f"<td>{e(k)} {v}</td>" for k, v in data["prs"].items())
        + "</tr><tr id='lessons'><th>lessons</th>"
        + "".join(f"<td>{e(k)} {data['lessons'][k]}</td>" for k in ("candidate", "accepted"))
        + f"</tr><tr><th>cost</th><td colspan='4'>${data['cost_usd']:.2f}</td></tr>"
        + ("<tr><th>disk</th>" + "".join(f"<td>{k} {v['count']} ({human_bytes(v['bytes'])})</td>"
                                         for k, v in data["disk"].items()) + "</tr>" if data.get("disk") else "")
        + "</table></div>")
    rows = "".join(f"<tr class='blocked'><td>{_a(t['id'], href)}</td><td>{e(t['repo'])}</td>"
                   f"<td>{ago(t.get('age_s')) if t.get('age_s') is not None else ''}</td>"
                   f"<td>{e(t.get('step') or '')}</td><td>{e(one_line(t['title'], 120))}</td>"
                   f"<td>{e(one_line(t['blocked_reason'], 500))}</td>"
                   f"<td><code>{e(t['reset_command'])}</code></td></tr>" for t in data["gate_blocked"])
    out["s-human"] = _section("s-human", "Needs a human", len(data["gate_blocked"]),
                              "<table id='blocked'><tr><th>task</th><th>repo</th><th>age</th><th>step</th>"
                              f"<th>title</th><th>reason</th><th>then run</th></tr>{rows}</table>")
    rows = "".join(f"<tr class='stuck'><td>{_a(t['id'], href)}</td><td>{e(t['repo'])}</td><td>{ago(t['age_s'])}</td>"
                   f"<td>{e(_row_where(t))}</td><td>{e(t['stuck'])}</td></tr>" for t in data["stuck"])
    out["s-stuck"] = _section("s-stuck", "Stuck", len(data["stuck"]),
                              "<table id='stuck'><tr><th>task</th><th>repo</th><th>age</th><th>where</th>"
                              f"<th>why stuck</th></tr>{rows}</table>")
    rows = "".join(f"<tr><td>{_a(p['task_id'], href)}</td><td>{e(p['repo'])}#{p['number']}</td>"
                   f"<td>{ago(p['age_s']) if p.get('age_s') is not None else ''}</td><td>{e(one_line(p['title'], 200))}</td>"
                   f"<td><a href='{e(p['url'] or '')}'>{e(p['url'] or '')}</a></td>"
                   f"<td class='proof'>{e(p.get('proof', ''))}</td></tr>" for p in data["open_prs"])
    out["s-review"] = _section("s-review", "Waiting for review", len(data["open_prs"]),
                               "<table id='review'><tr><th>task</th><th>PR</th><th>opened</th><th>title</th>"
                               f"<th>link</th><th>proof</th></tr>{rows}</table>")
    n_open = data["errors"].get("open", 0)
    rows = "".join(f"<tr><td><code>{e(x['id'])}</code></td><td>{e(x['service'])}</td>"
                   f"<td>{e(one_line(error_headline(x['class'], x['message']), 200))}</td><td>{x['count']}</td>"
                   f"<td>{ago(x['last_seen_age_s']) + ' ago' if x.get('last_seen_age_s') is not None else ''}</td></tr>"
                   for x in data["undecided"])
    more = (f"<p class=muted>newest {len(data['undecided'])} of {n_open}; all: <code>agent error list --state open"
            "</code></p>" if n_open > len(data["undecided"]) else "")
    out["s-decide"] = _section("s-decide", "Waiting for a decision", n_open,
                               "<table id='decide'><tr><th>id</th><th>service</th><th>error</th>"
                               f"<th>seen</th><th>last</th></tr>{rows}</table>{more}"
                               "<p class=muted>decide: <code>agent error decide ID --fix --brief TEXT</code> or "
                               "<code>--skip --reason TEXT</code></p>")
    rows = []
    for r in data["runners"]:
        held = "<br>".join([f"{_a(t['task_id'], href)} ({e(t['state'])}): {e(_lease_text(t, now))}" for t in r["tasks"]]
                           + [f"lease {e(lease['name'])}: {e(_named_lease_text(lease, now))}"
                              for lease in r.get("leases", [])])
        beat = f"{ago(r['heartbeat_age_s'])} ago" if r["heartbeat_at"] else "never"
        live = runner_live(r)
        rows.append(f"<tr class='{'' if live else 'failed'}'><td>{e(r['id'])}</td>"
                    f"<td>{e(r.get('state') or ('alive' if live else 'stale'))}</td><td>{e(beat)}</td>"
                    f"<td>{e(r['host'] or '')}</td><td>{r['pid'] or ''}</td><td>{held or 'nothing'}</td></tr>")
    out["s-runners"] = _section("s-runners", "Runners", len(data["runners"]),
                                "<table id='runners'><tr><th>runner</th><th>state</th><th>heartbeat</th><th>host</th>"
                                f"<th>pid</th><th>holds</th></tr>{''.join(rows)}</table>")
    others = [t for t in data["active"] if t["state"] != "gate-blocked" and not t["stuck"]]
    rows = "".join(f"<tr><td>{_a(t['id'], href)}</td><td>{e(t['repo'])}</td><td>{e(t['state'])}</td>"
                   f"<td>{ago(t['age_s']) if t['age_s'] is not None else ''}</td><td>{e(_row_where(t))}</td>"
                   f"<td>{e(one_line(t['title'], 120))}{' · waiting: ' + e(one_line(t['wait_reason'], 300)) if t['wait_reason'] else ''}"
                   "</td></tr>" for t in others)
    out["s-working"] = _section("s-working", "Working", len(others),
                                "<table id='working'><tr><th>task</th><th>repo</th><th>state</th><th>age</th>"
                                f"<th>where</th><th>title</th></tr>{rows}</table>")
    rows = "".join(f"<tr class='failed'><td>{_a(t['id'], href)}</td><td>{e(t['repo'])}</td>"
                   f"<td>{e(one_line(t['failed_reason'], 400))}</td><td><code>{e(t['reset_command'])}</code></td></tr>"
                   for t in reversed(data["failed"][-10:]))
    n_failed = data["tasks"].get("failed", 0)
    out["s-failed"] = ("<div id='s-failed'><details id='d-failed'><summary>Failed "
                       f"({n_failed})</summary><table id='failed'><tr><th>task</th><th>repo</th><th>reason</th>"
                       f"<th>to retry</th></tr>{rows}</table>"
                       + (f"<p class=muted>newest 10 of {n_failed}</p>" if n_failed > 10 else "")
                       + "</details></div>")
    return out


SUMMARY_ORDER = ("s-counts", "s-human", "s-stuck", "s-review", "s-decide", "s-runners", "s-working", "s-failed")


def finished_table(rows: list[dict], href, older: str | None) -> str:
    e = html.escape
    out = ["<table id='finished'><tr><th>task</th><th>state</th><th>repo</th><th>finished</th><th>title</th>"
           "<th>PR</th></tr>"]
    for t in rows:
        cls = "done" if t["state"] == "done" else "failed"
        pr = f"<a href='{e(t['pr_url'])}'>{e(t['pr_state'] or '')}</a>" if t["pr_url"] else ""
        out.append(f"<tr class='{cls}'><td>{_a(t['id'], href)}</td><td>{e(t['state'])}</td><td>{e(t['repo'])}</td>"
                   f"<td>{e((t['updated_at'] or '')[:16].replace('T', ' '))}</td><td>{e(one_line(t['title'], 160))}"
                   f"</td><td>{pr}</td></tr>")
    out.append("</table>")
    if older:
        out.append(f"<p><a id='older' href='{e(older)}'>older finished tasks</a></p>")
    return "".join(out)


def event_words(ev: dict) -> str:
    """One event as a sentence (never JSON): known kinds by template, others as ``key: value`` pairs."""
    p = ev.get("payload") or {}
    k = ev["kind"]

    def g(key, limit=300):
        return one_line(str(p.get(key, "")), limit)

    if k == "task.created":
        return f"task created for {g('repo')}: {g('title')}"
    if k == "task.state":
        return f"{g('from')} → {g('to')}" + (f": {g('reason', 500)}" if p.get("reason") else "")
    if k in ("step.closed", "step.reopened"):
        word = "reopened" if k == "step.reopened" else f"closed ({g('status')})"
        return f"step {g('key')} {word} by {g('source')}" + (f": {g('evidence')}" if p.get("evidence") else "")
    if k == "lane.started":
        return f"lane {g('role')} ({g('vendor')}) started, round {g('round')}"
    if k == "lane.finished":
        bits = [f"{x} {g(x)}" for x in ("status", "findings", "cost_usd") if p.get(x) not in (None, "")]
        return f"lane {g('role')} ({g('vendor')}) finished" + (f": {', '.join(bits)}" if bits else "")
    if k == "lane.interrupted":
        return f"lane run {g('run_id')} interrupted: {g('reason')}"
    if k == "round.started":
        return f"round {g('round')} started" + (f": {g('feedback', 300)}" if p.get("feedback") else "")
    if k == "commit.recorded":
        return f"commit {g('sha')[:12]} recorded"
    if k == "check.recorded":
        return f"check {'passed' if p.get('passed') else 'failed'} (exit {g('exit_code')}) on {g('head')[:12]}"
    if k == "gate.recorded":
        return f"{g('stage')} {g('dimension')}: {g('verdict')}" + (f", {g('findings')} finding(s)"
                                                                   if p.get("findings") else "")
    if k == "task.waiting":
        return f"waiting: {g('reason', 500)}"
    if k == "task.reset":
        return f"reset by a human from {g('from')}: {g('reason')}"
    if k == "pr.created":
        return f"draft PR opened: {g('url')}"
    rest = ", ".join(f"{key}: {one_line(str(v), 120)}" for key, v in sorted(p.items())
                     if not isinstance(v, (dict, list)))
    return rest[:600]


def timeline_table(events: list[dict]) -> str:
    e = html.escape
    out = ["<table class='ev'><tr><th>time (UTC)</th><th>who</th><th>what</th></tr>"]
    for ev in events:
        out.append(f"<tr><td>{e(ev['ts'][:19].replace('T', ' '))}</td><td>{e(ev['actor'])}</td>"
                   f"<td>{e(event_words(ev))} <span class='kind'>{e(ev['kind'])}</span></td></tr>")
    out.append("</table>")
    return "".join(out)


def render_html(ledger: Ledger, data: dict, *, href=None, older: str | None = None, head: str = "",
                live: str = "", finished: list[dict] | None = None) -> str:
    """The page: the summary first, then finished tasks (one page of them). Without ``href`` (the file of
    `agent status --html`) each task shown has its timeline in the same file; `agent serve` passes ``href`` to
    link /tasks/N instead, its live-update ``head`` (script) and ``live`` line."""
    e = html.escape
    inline = href is None
    href = href or (lambda i: f"#task-{i}")
    out = ["<!doctype html>", "<html lang='en'><head><meta charset='utf-8'><title>agent status</title>",
           f"<style>{CSS}</style>{head}</head><body>", "<h1>agent status</h1>", live]
    sections = summary_sections(data, href)
    out.extend(sections[k] for k in SUMMARY_ORDER)
    rows = data["finished"] if finished is None else finished
    out.append("<h2>Finished</h2>" + finished_table(rows, href, older))
    if inline:
        shown = [t["id"] for t in data["active"]] + [t["id"] for t in rows]
        out.append("<h2>Timelines</h2>")
        for tid in shown:
            t = status.task_row(ledger, tid)
            if t is None:
                continue
            out.append(f"<details class='task' id='task-{tid}'><summary>task {tid} · {e(t['state'])} · "
                       f"{e(t['repo'])} · {e(one_line(t['title'], 200))}</summary>")
            out.append(timeline_table(eventlog.events(ledger, task_id=tid, limit=200, newest=True)) + "</details>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def status_config(app) -> tuple[object | None, str | None]:
    """The config for `agent status` (lane timeouts for the stuck rule). A config named with ``--config`` that is
    missing or broken is an error (AgentError, one line); the default one only earns a warning (returned), so
    the status of a running system still shows while its config.yaml is being fixed."""
    from agent import AgentError

    try:
        return app.config, None
    except AgentError as exc:
        if app.config_file is not None:
            raise
        return None, f"config not loaded, lane timeouts at their defaults: {exc}"


def write_page(path, page: str) -> str:
    """Write ``agent status --html``'s page; a missing folder or an unwritable path is one line, not a traceback."""
    from agent import AgentError

    if not path.parent.is_dir():
        raise AgentError(f"cannot write {path}: folder {path.parent} does not exist; create it or pick another path")
    try:
        path.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise AgentError(f"cannot write {path}: {exc.strerror or exc}") from None
    return str(path.resolve())


def render_task_page(ledger: Ledger, task_id: int, back: str = "/") -> str | None:
    """``/tasks/N``: the task and its whole timeline in words; None when there is no such task."""
    e = html.escape
    t = status.task_row(ledger, task_id)
    if t is None:
        return None
    why = t["blocked_reason"] or t["failed_reason"] or t["wait_reason"] or ""
    pr = f"<p>PR: <a href='{e(t['pr_url'])}'>{e(t['pr_url'])}</a></p>" if t["pr_url"] else ""
    from agent.ledger.proofs import proof_states

    verdict = proof_states(ledger).get(task_id)
    pr += f"<p class='proof'>proof: {e(proof_word(verdict))}</p>" if verdict else ""
    then = (f"<p>then run: <code>{e(reset_command(task_id, t['state']))}</code></p>"
            if t["state"] in ("gate-blocked", "failed") else "")
    events = eventlog.events(ledger, task_id=task_id, limit=2000, newest=True)
    return "\n".join([
        "<!doctype html>", f"<html lang='en'><head><meta charset='utf-8'><title>task {task_id}</title>",
        f"<style>{CSS}</style></head><body>", f"<p><a href='{e(back)}'>← status</a></p>",
        f"<h1>task {task_id} · {e(t['state'])} · {e(t['repo'])}</h1>", f"<p>{e(one_line(t['title'], 500))}</p>",
        f"<p>round {t['round']}/{t['round_cap']} · created {e((t['created_at'] or '')[:19].replace('T', ' '))} UTC</p>",
        f"<p class='reason'>{e(one_line(why, 1000))}</p>" if why else "", then, pr,
        "<h2>Timeline</h2>", timeline_table(events), "</body></html>"]) + "\n"
