"""`agent status`: errors, tasks and PRs by state; what needs a human; one self-contained HTML page."""

from __future__ import annotations

import html
import json
import shlex

from agent.ledger import Ledger
from agent.workspace import disk_use, human_bytes

ERROR_STATES = ("open", "fixing", "resolved", "skipped")
TASK_STATES = ("open", "working", "gate-blocked", "done", "failed")
PR_STATES = ("open", "merged", "closed")


def _counts(ledger: Ledger, table: str, states: tuple[str, ...]) -> dict[str, int]:
    found = ledger.state_counts(table)
    return {s: found.get(s, 0) for s in states} | {k: v for k, v in found.items() if k not in states}


def reset_command(task_id: int, state: str) -> str:
    """The exact line a human runs to put a gate-blocked or failed task back to work."""
    if state == "failed":
        return f"agent task reset {task_id} --reason {shlex.quote('why it may go on')} --rounds 2"
    return f"agent task reset {task_id} --reason {shlex.quote('what you fixed')}"


def one_line(text: str | None, limit: int | None = None) -> str:
    """A reason or title on one line (a multi-line lane excerpt never breaks a row), cut to ``limit``."""
    flat = " ".join((text or "").split())
    return flat if limit is None or len(flat) <= limit else flat[:limit - 3].rstrip() + "..."


def gather(ledger: Ledger, home=None) -> dict:
    blocked = ledger.blocked_tasks()
    for t in blocked:
        t["reset_command"] = reset_command(t["id"], "gate-blocked")
    failed = ledger.failed_tasks()
    for t in failed:
        t["reset_command"] = reset_command(t["id"], "failed")
    data = {
        "errors": _counts(ledger, "errors", ERROR_STATES),
        "tasks": _counts(ledger, "tasks", TASK_STATES),
        "prs": _counts(ledger, "prs", PR_STATES),
        "lessons": lesson_counts(ledger),
        "gate_blocked": blocked,
        "failed": failed,
        "waiting": ledger.waiting_tasks(),
        "open_prs": _with_proof(ledger, ledger.open_pr_rows()),
        "cost_usd": round(ledger.lane_cost_total(), 4),
        **({"disk": disk_use(home)} if home is not None else {}),
    }
    runners = runners_shown(ledger)
    if runners:
        data["runners"] = runners
    return data


def _with_proof(ledger: Ledger, rows: list[dict]) -> list[dict]:
    """Each open PR's proof word for its task's head (DESIGN.md "The proof"): proven, unproven or not checked."""
    from agent.ledger.proofs import proof_states

    states = proof_states(ledger)
    for r in rows:
        r["proof"] = {"proven": "proven", "rejected": "unproven"}.get(states.get(r["task_id"]),
                                                                      "unproven" if r["task_id"] in states
                                                                      else "not checked")
    return rows


def lesson_counts(ledger: Ledger) -> dict[str, int]:
    """Lessons by state: candidates wait for a human (their PR merged, or `agent lesson accept`); only accepted
    ones reach a spec."""
    from agent.lessons import counts

    return counts(ledger)


def runners_shown(ledger: Ledger) -> list[dict] | None:
    """The runners for `agent status`: only when more than one runner shares the ledger, or one is stale (or a
    claim names a runner that never registered); a single live runner's status stays as it always was."""
    from agent.fence import runners

    found = runners(ledger)
    if len(found) > 1 or any(not r["alive"] for r in found):
        return found
    return None


def ago(seconds: float | None) -> str:
    """``42s``, ``5m``, ``3h12m``, ``2d4h``: an age or a time left, short."""
    if seconds is None:
        return "never"
    s = int(abs(seconds))
    if s < 120:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600}h"


def _lease_text(task: dict, now: float) -> str:
    from datetime import datetime, timezone

    if not task["lease_until"]:
        return "no lease"
    until = datetime.strptime(task["lease_until"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
    return f"lease expired {ago(now - until)} ago" if until < now else f"lease {ago(until - now)} left"


def _named_lease_text(lease: dict, now: float) -> str:
    """``expired 3m ago`` or ``1m left``."""
    return _lease_text({"lease_until": lease["until"]}, now).replace("lease ", "", 1)


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
        state = "alive" if r["alive"] else "STALE"
        beat = f"heartbeat {ago(r['heartbeat_age_s'])} ago" if r["heartbeat_at"] else "never registered"
        where = f"  {r['host']}  {r['home']}  pid {r['pid']}" if r["host"] else ""
        lines.append(f"  {r['id']}  {state}  {beat}{where}")
        if not r["tasks"]:
            lines.append("    holds no task")
        for t in r["tasks"]:
            lines.append(f"    task {t['task_id']} ({t['state']}): {_lease_text(t, now)}")
        for lease in r.get("leases", []):
            lines.append(f"    lease {lease['name']}: {_named_lease_text(lease, now)}")
    return lines


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
            lines.append(f"  task {t['id']} {t['repo']}: {one_line(t['blocked_reason'], 300)}\n"
                         f"    then: {t['reset_command']}")
    if data["failed"]:
        lines.append("\nfailed:")
        for t in data["failed"]:
            lines.append(f"  task {t['id']} {t['repo']}: {one_line(t['failed_reason'], 200)}\n"
                         f"    to retry: {t['reset_command']}")
    if data.get("waiting"):
        lines.append("\nworking, but waiting:")
        for t in data["waiting"]:
            lines.append(f"  task {t['id']} {t['repo']}: {one_line(t['wait_reason'], 300)}")
    if data["open_prs"]:
        lines.append("\ndraft PRs waiting for review:")
        for p in data["open_prs"]:
            lines.append(f"  task {p['task_id']} {p['repo']}#{p['number']}: {p['url']} ({p.get('proof', '?')})")
    if data.get("runners"):
        stale = sum(1 for r in data["runners"] if not r["alive"])
        lines.append(f"\nrunners ({len(data['runners'])}{f', {stale} stale' if stale else ''}):")
        lines.extend(runner_lines(data["runners"]))
    return "\n".join(lines)


CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;margin:2rem auto;max-width:70rem;color:#222;padding:0 1rem}
h1{font-size:1.4rem}h2{font-size:1.1rem;margin-top:2rem;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5rem 0}td,th{border:1px solid #ddd;padding:.25rem .6rem;text-align:left;vertical-align:top}
th{background:#f5f5f5}.blocked{background:#fff4e5}.failed{background:#fdecea}.done{background:#eaf7ee}
code{background:#f3f3f3;padding:0 .25rem}details{margin:.4rem 0}summary{cursor:pointer;font-weight:600}
.ev td:first-child{white-space:nowrap;color:#666}
"""


def render_html(ledger: Ledger, data: dict) -> str:
    e = html.escape
    out = ["<!doctype html>", "<html lang='en'><head><meta charset='utf-8'><title>agent status</title>",
           f"<style>{CSS}</style></head><body>", "<h1>agent status</h1>"]
    out.append("<table id='counts'><tr><th></th>" + "".join(f"<th>{e(s)}</th>" for s in TASK_STATES) + "</tr>")
    out.append("<tr><th>tasks</th>" + "".join(f"<td>{data['tasks'].get(s, 0)}</td>" for s in TASK_STATES)
               + "</tr></table>")
    out.append("<table><tr><th>errors</th>" + "".join(f"<td>{e(k)} {v}</td>" for k, v in data["errors"].items())
               + "</tr><tr><th>PRs</th>" + "".join(f"<td>{e(k)} {v}</td>" for k, v in data["prs"].items())
               + "</tr><tr id='lessons'><th>lessons</th>"
               + "".join(f"<td>{e(k)} {data['lessons'][k]}</td>" for k in ("candidate", "accepted"))
               + f"</tr><tr><th>cost</th><td colspan='4'>${data['cost_usd']:.2f}</td></tr>"
               + ("<tr><th>disk</th>" + "".join(f"<td>{k} {v['count']} ({human_bytes(v['bytes'])})</td>"
                                                for k, v in data["disk"].items()) + "</tr>" if data.get("disk") else "")
               + "</table>")
    for key, title, cls, reason, then in (("gate_blocked", "Needs a human", "blocked", "blocked_reason", "then run"),
                                          ("failed", "Failed", "failed", "failed_reason", "to retry"),
                                          ("waiting", "Working, but waiting", "waiting", "wait_reason", None)):
        if not data.get(key):
            continue
        out.append(f"<h2>{title}</h2><table id='{cls}'><tr><th>task</th><th>reason</th>"
                   + (f"<th>{then}</th>" if then else "") + "</tr>")
        for t in data[key]:
            out.append(f"<tr class='{cls}'><td>{t['id']}</td><td>{e(one_line(t[reason], 500))}</td>"
                       + (f"<td><code>{e(t['reset_command'])}</code></td>" if then else "") + "</tr>")
        out.append("</table>")
    if data.get("runners"):
        out.append("<h2>Runners</h2><table id='runners'><tr><th>runner</th><th>state</th><th>heartbeat</th>"
                   "<th>host</th><th>home</th><th>pid</th><th>tasks held</th></tr>")
        import time

        now = time.time()
        for r in data["runners"]:
            held = "<br>".join([f"task {t['task_id']} ({e(t['state'])}): {e(_lease_text(t, now))}" for t in r["tasks"]]
                               + [f"lease {e(lease['name'])}: {e(_named_lease_text(lease, now))}"
                                  for lease in r.get("leases", [])])
            beat = f"{ago(r['heartbeat_age_s'])} ago" if r["heartbeat_at"] else "never"
            out.append(f"<tr class='{'' if r['alive'] else 'failed'}'><td>{e(r['id'])}</td>"
                       f"<td>{'alive' if r['alive'] else 'stale'}</td><td>{e(beat)}</td><td>{e(r['host'] or '')}</td>"
                       f"<td>{e(r['home'] or '')}</td><td>{r['pid'] or ''}</td><td>{held or 'none'}</td></tr>")
        out.append("</table>")
    out.append("<h2>Tasks</h2>")
    tasks = ledger.recent_tasks(200)
    from agent.ledger.proofs import proof_states

    proofs = proof_states(ledger)
    resets = {t["id"]: t["reset_command"] for t in data["gate_blocked"] + data["failed"]}
    for t in tasks:
        cls = {"gate-blocked": "blocked", "failed": "failed", "done": "done"}.get(t["state"], "")
        why = t["blocked_reason"] or t["failed_reason"] or (t["wait_reason"] if t["state"] in ("open", "working")
                                                            else None) or ""
        pr = f" — <a href='{e(t['pr_url'])}'>{e(t['pr_url'])}</a>" if t["pr_url"] else ""
        if t["id"] in proofs:
            pr += " · " + ("proven" if proofs[t["id"]] == "proven" else "unproven")
        out.append(f"<details class='task {cls}' id='task-{t['id']}'><summary>task {t['id']} · {e(t['state'])} · "
                   f"round {t['round']}/{t['round_cap']} · {e(t['repo'])} · {e(t['title'])}{pr}</summary>")
        if why:
            out.append(f"<p>{e(why[:500])}</p>")
        if t["id"] in resets:
            out.append(f"<p>then run: <code>{e(resets[t['id']])}</code></p>")
        out.append("<table class='ev'><tr><th>time</th><th>actor</th><th>event</th><th>details</th></tr>")
        for ev in ledger.events(task_id=t["id"], limit=500):
            out.append(f"<tr><td>{e(ev['ts'][:19])}</td><td>{e(ev['actor'])}</td><td>{e(ev['kind'])}</td>"
                       f"<td>{e(json.dumps(ev['payload'], sort_keys=True)[:300])}</td></tr>")
        out.append("</table></details>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"
