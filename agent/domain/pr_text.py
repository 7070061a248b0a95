"""PR title and body: a pure function from plain data to ``(title, body)``.

The body is what a human reviewer reads first: a short English paragraph, the same in German, then a
``<details>`` block with everything needed to audit the PR (error id, fingerprint, service, head, the
brief, rounds, every reviewer verdict with its findings, check results, cost) and a hidden marker
``<!-- agent-task: N -->`` tying the PR to its task.

Untrusted text (error message, brief, findings, commands) is fenced with a fence longer than any
backtick run inside it, so it cannot close the fence or the ``<details>`` block, and it passes a
final secret guard.  Structured fields (ids, shas, numbers) are validated and printed as-is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from agent.infra.text import BACKTICKS, fence, forge_safe, ident, one_line, visible  # noqa: F401 - fence: re-exported

TITLE_MAX = 72
BODY_MAX = 60000          # GitHub refuses bodies over 65536 characters
FIELD_MAX = 8000          # one brief / findings block
MARKER_RE = re.compile(r"<!-- agent-task: (\d+) -->")


@dataclass
class Verdict:
    round: int
    stage: str                 # review | pr
    dimension: str             # code | quality | logic
    verdict: str               # approve | reject
    vendor: str = ""
    findings: str = ""         # the reviewer's FINDINGS text ("none" for zero)
    findings_count: int = 0
    head_sha: str | None = None


@dataclass
class CheckResult:
    round: int
    command: str
    passed: bool
    exit_code: int | None = None
    head_sha: str | None = None
    duration_s: float | None = None


@dataclass
class PRData:
    task_id: int
    error_id: str
    fingerprint: str
    service: str
    head_sha: str
    brief: str
    rounds: int = 1
    error_class: str = ""
    message: str = ""
    count: int | None = None
    title: str | None = None           # a title to use instead of the composed one
    summary: str = ""                  # the implementer's SUMMARY (English)
    verdicts: list[Verdict] = field(default_factory=list)
    checks: list[CheckResult] = field(default_factory=list)
    cost_usd: float = 0.0
    branch: str = ""
    base: str = ""
    ci: list[dict] = field(default_factory=list)               # PR CI for ci_head: {name, state, conclusion, url}
    ci_head: str | None = None
    ci_state: str | None = None                                # pending | success | failure | neutral
    feedback_rounds: list[dict] = field(default_factory=list)  # {round, trigger, keys}
    lesson: dict | None = None         # the task's lesson: {id, state, text, reason}; None: it left none
    proof: dict | None = None          # the head's proof row (agent.ledger.proofs); None: not checked

    @classmethod
    def from_dict(cls, d: dict) -> "PRData":
        d = dict(d)
        d["verdicts"] = [v if isinstance(v, Verdict) else Verdict(**v) for v in d.get("verdicts") or []]
        d["checks"] = [c if isinstance(c, CheckResult) else CheckResult(**c) for c in d.get("checks") or []]
        return cls(**d)


# --------------------------------------------------------------------------- guards


_FALLBACK_RULES = [
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)", re.S),
     "[redacted:private-key]"),
    (re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,})"), "[redacted:github-token]"),
    (re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"), "[redacted:aws-key]"),
    (re.compile(r"(?i)\b(bearer|token)\s+[A-Za-z0-9._~+/=-]{16,}"), r"\1 [redacted:bearer]"),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*"), "[redacted:jwt]"),
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]{1,20}://[^/\s:@]+):[^/\s@]+@"), r"\1:[redacted:password]@"),
]


def guard(text: Any) -> str:
    """The final secret guard for free text going into a PR.

    Uses intake's redactor (``agent.infra.redact.redact``) when it is installed, and a small built-in
    set of token patterns in any case.
    """
    s = "" if text is None else str(text)
    try:
        from agent.infra.redact import redact  # the product's one redactor, when present
    except ImportError:  # pragma: no cover - depends on what is merged
        redact = None
    if redact is not None:
        s = redact(s)
    for pattern, repl in _FALLBACK_RULES:
        s = pattern.sub(repl, s)
    return s


_HEX = re.compile(r"^[0-9a-fA-F]+$")


def _hexid(value: Any, length: int | None = None) -> str:
    s = str(value or "").strip()
    if not s:
        return "unknown"
    if not _HEX.match(s):
        return guard(s)[:80]
    return s[:length] if length else s


def _word(value: Any) -> str:
    """A state word (success, failure, ...) as plain text: letters and underscores only."""
    return re.sub(r"[^a-z_]", "", str(value or "").lower())[:24] or "?"


def _one_line(text: str) -> str:
    return one_line(text)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _code(text: str) -> str:
    """An inline code span that survives backticks (and look-alikes) in ``text``; invisible characters spelled."""
    text = visible(_one_line(text))
    runs = [len(m) for m in re.findall("[" + BACKTICKS + "]+", text)]
    ticks = "`" * (max(runs, default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def task_marker(task_id: int) -> str:
    return f"<!-- agent-task: {int(task_id)} -->"


def parse_task_marker(body: str) -> int | None:
    """The task id of a PR body written by agent (the last marker wins), or None."""
    found = MARKER_RE.findall(body or "")
    return int(found[-1]) if found else None


# --------------------------------------------------------------------------- the text


def render_title(d: PRData) -> str:
    """The agent's own words from a template: ``fix(SERVICE): CLASS (agent task N)``; the error's message and the
    lane's text never reach the title (a squash merge makes it the commit subject)."""
    if d.title and d.title.strip():
        raw = forge_safe(_one_line(guard(d.title)))
    else:
        raw = f"fix({ident(d.service, 40) or 'service'}): {ident(d.error_class, 60) or 'production error'} " \
              f"(agent task {int(d.task_id)})"
    return _clip(_one_line(raw), TITLE_MAX)


def commit_message(task_id: int, round_no: int, error_class: str | None, service: str | None,
                   error_id: str | None = None) -> str:
    """A round's commit message, from a template only: the lane's SUMMARY (untrusted) goes to the PR's fenced
    sections, never into history a merge carries (no closing keywords, CI-skip directives, mentions, trailers)."""
    cls = ident(error_class, 60) or "production error"
    svc = ident(service, 40) or "service"
    err = _hexid(error_id, 16) if error_id else None
    lines = [f"fix({svc}): {cls} (agent task {int(task_id)}, round {int(round_no)})", "",
             f"Proposed by agent for {'error ' + err if err and err != 'unknown' else 'a production error'} "
             f"in {svc}; the implementer's summary and every review are in the pull request."]
    return "\n".join(lines) + "\n"


def _check_phrase(checks: list[CheckResult]) -> tuple[str, str]:
    if not checks:
        return "no repository check was configured", "es war keine Prüfung des Repositorys eingerichtet"
    last = checks[-1]
    if last.passed:
        return "the repository check passed on the final head", "die Prüfung des Repositorys ist auf dem " \
                                                                   "letzten Stand bestanden"
    return "the repository check failed on the final head", "die Prüfung des Repositorys ist auf dem letzten " \
                                                            "Stand fehlgeschlagen"


def _memory(d: PRData) -> str:
    """What agent will remember if this PR is merged (EN, then DE), so the human who merges decides it."""
    les = d.lesson or {}
    text = _one_line(les.get("text") or "")
    if not text or les.get("state") not in ("candidate", "refused", "accepted"):
        return ("**Memory:** if this pull request is merged, agent remembers nothing from it.\n\n"
                "**Gedächtnis:** Wird dieser Pull Request zusammengeführt, merkt sich Agent daraus nichts.")
    lid = int(les.get("id") or 0)
    quoted = fence(_clip(guard(text), 600), "lesson")
    if les.get("state") == "refused":
        why = _clip(_one_line(guard(les.get("reason") or "")), 200)
        return (f"**Memory:** the implementer left a lesson agent refused ({why}); it is never remembered:\n\n"
                f"**Gedächtnis:** Der Implementierungs-Agent hat eine Lektion hinterlassen, die Agent abgelehnt hat "
                f"({why}); sie wird nie gemerkt:\n\n{quoted}")
    if les.get("state") == "accepted":
        return (f"**Memory:** agent remembers this lesson (#{lid}) for later fixes of "
                f"{_code(guard(d.service) or 'unknown')}; "
                f"`agent lesson forget {lid}` drops it:\n\n"
                f"**Gedächtnis:** Agent merkt sich diese Lektion (#{lid}) für spätere Korrekturen; "
                f"`agent lesson forget {lid}` verwirft sie:\n\n{quoted}")
    return (f"**Memory:** if this pull request is merged, agent remembers this lesson (#{lid}) and gives it to later "
            f"fixes of {_code(guard(d.service) or 'unknown')}; `agent lesson forget {lid}` drops it either way:\n\n"
            f"**Gedächtnis:** Wird dieser Pull Request zusammengeführt, merkt sich Agent diese Lektion (#{lid}) und "
            f"gibt sie späteren Korrekturen mit; `agent lesson forget {lid}` verwirft sie in jedem Fall:\n\n{quoted}")


def _proof(d: PRData) -> str:
    """Whether the PR proves itself (EN, then DE): a test that fails on the base and passes on the head."""
    p = d.proof or {}
    verdict = p.get("verdict")
    if verdict == "proven":
        n = len(p.get("flipped") or [])
        one = n == 1
        if p.get("reproduces"):
            how_en = "the base failure reproduces the production error"
            how_de = "der Fehlschlag auf der Basis reproduziert den Produktionsfehler"
        else:
            how_en = "a regression test only: the base failure does not show the production error"
            how_de = "nur ein Regressionstest: der Fehlschlag auf der Basis zeigt den Produktionsfehler nicht"
        return (f"**Proof:** {n} {'test fails' if one else 'tests fail'} on the base commit and "
                f"{'passes' if one else 'pass'} with this change; {how_en}.\n\n"
                f"**Nachweis:** {n} {'Test schlägt' if one else 'Tests schlagen'} auf dem Basis-Commit fehl und "
                f"{'besteht' if one else 'bestehen'} mit dieser Änderung; {how_de}.")
    why_en = "proof is off for this repository" if verdict == "off" else \
        "no test fails on the base commit (the repository says proof: optional)"
    why_de = "der Nachweis ist für dieses Repository abgeschaltet" if verdict == "off" else \
        "kein Test schlägt auf dem Basis-Commit fehl (das Repository sagt proof: optional)"
    return f"**Proof:** unproven: {why_en}.\n\n**Nachweis:** unbewiesen: {why_de}."


def _proof_details(d: PRData) -> list[str]:
    """The proof in the details block: the flipping tests and the base failure's last lines (fenced)."""
    p = d.proof or {}
    if p.get("verdict") != "proven":
        return []
    parts = ["**Proof**", "", f"On the base commit {_code(_hexid(p.get('base_sha'), 12))} with only this PR's test "
             f"changes, {_code(guard(p.get('command') or ''))} failed (exit {p.get('base_exit')}); at the head it "
             "passes. Tests that flip:", ""]
    parts += [f"- {_code(guard(name)[:200])}" for name in (p.get("flipped") or [])[:20]]
    for key, what in (("skipped", "made to skip or xfail"), ("removed", "removed")):
        if p.get(key):   # proven by other tests; a reviewer still sees these
            names = ", ".join(_code(guard(n)[:200]) for n in p[key][:20])
            parts += ["", f"Tests this PR {what} (they prove nothing): {names}"]
    why = _one_line(guard(p.get("reproduces_why") or ""))
    if why:
        parts += ["", ("Reproduces the error: " if p.get("reproduces") else "Regression test only: ") + _clip(why, 300)]
    tail = (p.get("base_tail") or "").strip()
    if tail:
        parts += ["", "The base failure ends with:", "", fence(_clip(guard(tail), 4000)), ""]
    return parts + [""]


def render_body(d: PRData) -> str:
    cls = _code(guard(d.error_class)) if d.error_class.strip() else "an error"
    cls_de = _code(guard(d.error_class)) if d.error_class.strip() else "einen Fehler"
    svc = _code(guard(d.service) or "unknown")
    eid = _hexid(d.error_id, 8)
    rounds = max(int(d.rounds or 1), 1)
    check_en, check_de = _check_phrase(d.checks)
    en = (f"This draft pull request proposes a fix for {cls} in the service {svc} (error {_code(eid)}). "
          f"An implementer lane wrote the change in {rounds} round{'s' if rounds != 1 else ''} and "
          f"{check_en}; every reviewer verdict is listed below. "
          "Agent opened it as a draft: a human reviews it and decides whether to merge.")
    de = (f"Dieser Entwurf eines Pull Requests schlägt eine Korrektur für {cls_de} im Dienst {svc} vor "
          f"(Fehler {_code(eid)}). "
          f"Ein Implementierungs-Agent hat die Änderung in {rounds} Runde{'n' if rounds != 1 else ''} geschrieben "
          f"und {check_de}; alle Urteile der Review-Agenten stehen unten. "
          "Agent hat ihn als Entwurf geöffnet: Ein Mensch prüft ihn und entscheidet über das Zusammenführen.")

    rows = [
        ("Task", str(int(d.task_id))),
        ("Error", _code(_hexid(d.error_id))),
        ("Fingerprint", _code(_hexid(d.fingerprint))),
        ("Service", svc),
        ("Head", _code(_hexid(d.head_sha))),
        ("Branch", _code(guard(d.branch)) if d.branch else "-"),
        ("Base", _code(guard(d.base)) if d.base else "-"),
        ("Rounds", str(rounds)),
        ("Cost", f"${float(d.cost_usd or 0):.2f}"),
    ]
    if d.ci and d.ci_head and d.ci_state:
        rows.append(("PR CI", f"{_word(d.ci_state)} at {_code(_hexid(d.ci_head, 12))}"))
    if d.count is not None:
        rows.insert(4, ("Occurrences", str(int(d.count))))
    table = "| | |\n|---|---|\n" + "\n".join(f"| {k} | {v.replace('|', '&#124;')} |" for k, v in rows)

    parts = ["<details>", "<summary>Details for reviewers (agent)</summary>", "", table, ""]
    if d.message.strip():
        parts += ["**Error message**", "", fence(_clip(guard(d.message), 2000)), ""]
    parts += ["**Brief**", "", fence(_clip(guard(d.brief), FIELD_MAX)), ""]
    if d.summary.strip():
        parts += ["**Implementer summary**", "", fence(_clip(guard(d.summary), 2000)), ""]

    parts += _proof_details(d)
    parts += ["**Reviewer verdicts**", ""]
    if not d.verdicts:
        parts += ["- none recorded", ""]
    stage_order = {"review": 0, "pr": 1}
    for v in sorted(d.verdicts, key=lambda v: (v.round, stage_order.get(v.stage, 2), v.dimension)):
        who = f" by {_code(guard(v.vendor))}" if v.vendor else ""
        head = f" at {_code(_hexid(v.head_sha, 12))}" if v.head_sha else ""
        verdict = "approve" if v.verdict == "approve" else "reject"
        parts.append(f"- Round {int(v.round)}, {_code(v.stage + ':' + v.dimension)}{who}: **{verdict}**, "
                     f"{int(v.findings_count or 0)} finding{'s' if v.findings_count != 1 else ''}{head}")
        findings = (v.findings or "").strip()
        if findings and findings.lower() != "none":
            parts += ["", fence(_clip(guard(findings), FIELD_MAX)), ""]
    parts.append("")

    parts += ["**Checks**", ""]
    if not d.checks:
        parts.append("- none configured")
    for c in d.checks:
        res = "passed" if c.passed else "failed"
        code = f", exit {int(c.exit_code)}" if c.exit_code is not None else ""
        dur = f", {float(c.duration_s):.1f}s" if c.duration_s is not None else ""
        head = f" at {_code(_hexid(c.head_sha, 12))}" if c.head_sha else ""
        parts.append(f"- Round {int(c.round)}: {_code(guard(c.command))} **{res}**{code}{dur}{head}")
    if d.feedback_rounds:
        parts += ["", "**Rounds started on this PR**", ""]
        for fr in d.feedback_rounds:
            why = "its CI failed" if fr.get("trigger") == "ci" else "review feedback"
            keys = [str(k) for k in fr.get("keys") or []]
            parts.append(f"- Round {int(fr['round'])}: {why} ({len(keys)} item{'s' if len(keys) != 1 else ''}: "
                         f"{_code(guard(', '.join(keys)[:300]))})")
    if d.ci and d.ci_head:
        parts += ["", f"**PR CI** at {_code(_hexid(d.ci_head, 12))}: **{_word(d.ci_state or 'pending')}**", ""]
        for c in d.ci:
            url = str(c.get("url") or "")
            link = f" ({_code(guard(url)[:200])})" if url else ""
            parts.append(f"- {_code(guard(c.get('name') or 'check')[:120])}: **{_word(c.get('state') or '?')}** "
                         f"({_code(guard(c.get('conclusion') or '')[:40])}){link}")
    parts += ["", "</details>", "", task_marker(d.task_id), ""]

    body = "\n\n".join([en, de, _memory(d)] + ([_proof(d)] if d.proof else [])) + "\n\n" + "\n".join(parts)
    if len(body) > BODY_MAX:  # keep the marker and the closing tag; shorten the middle
        tail = "\n\n</details>\n\n" + task_marker(d.task_id) + "\n"
        body = body[: BODY_MAX - len(tail) - 80] + "\n\n_(shortened: the full record is in the ledger)_" + tail
        body = _close_open_fence(body)
    return body


def _close_open_fence(body: str) -> str:
    """After cutting, make sure no fence is left open before the closing ``</details>``."""
    head, sep, tail = body.rpartition("\n\n_(shortened")
    open_fence = None
    for line in head.splitlines():
        m = re.match(r"^(`{3,})", line)
        if m:
            if open_fence is None:
                open_fence = m.group(1)
            elif line.strip() == open_fence:
                open_fence = None
    if open_fence:
        head += "\n" + open_fence
    return head + sep + tail


def render_pr(data: PRData | dict) -> tuple[str, str]:
    """``(title, body)`` for a task's draft PR.

    ``data`` is a ``PRData`` (see ``agent.ledger.prs.pr_data_from_ledger``) or a dict of its fields.
    """
    d = data if isinstance(data, PRData) else PRData.from_dict(data)
    return render_title(d), render_body(d)


def pr_data_from_rows(inputs: dict) -> PRData:
    """PRData from ledger rows: ``task`` (tasks row), ``error`` (errors row or None), ``brief``,
    ``gates`` (gates joined with their lane run's vendor and findings_text), ``checks``, ``cost_usd``,
    ``summary``."""
    t = inputs["task"]
    e = inputs.get("error") or {}
    verdicts = [Verdict(round=g.get("round") or 1, stage=g.get("stage") or "", dimension=g.get("dimension") or "",
                        verdict=g.get("verdict") or "reject", vendor=g.get("vendor") or "",
                        findings=g.get("findings_text") or "", findings_count=g.get("findings_count") or 0,
                        head_sha=g.get("head_sha")) for g in inputs.get("gates") or []]
    checks = [CheckResult(round=c.get("round") or 1, command=c.get("command") or "", passed=bool(c.get("passed")),
                          exit_code=c.get("exit_code"), head_sha=c.get("head_sha"), duration_s=c.get("duration_s"))
              for c in inputs.get("checks") or []]
    cost = inputs.get("cost_usd")
    return PRData(task_id=int(t["id"]), error_id=t.get("error_id") or "", fingerprint=e.get("fingerprint") or "",
                  service=e.get("service") or "", head_sha=t.get("head_sha") or "",
                  brief=inputs.get("brief") or t.get("title") or "", rounds=t.get("round") or 1,
                  error_class=e.get("class") or "", message=e.get("message") or "", count=e.get("count"),
                  summary=inputs.get("summary") or "", verdicts=verdicts, checks=checks,
                  cost_usd=float(cost or 0.0),
                  branch=t.get("branch") or "", base=t.get("base") or "",
                  ci=list(inputs.get("ci") or []), ci_head=inputs.get("ci_head"), ci_state=inputs.get("ci_state"),
                  feedback_rounds=list(inputs.get("feedback_rounds") or []),
                  lesson={k: (inputs.get("lesson") or {}).get(k) for k in ("id", "state", "text", "reason")}
                  if inputs.get("lesson") else None,
                  proof=inputs.get("proof"))
