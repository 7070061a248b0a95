"""``run_lane``: one lane run — the one entry point the fixer, the decider and `agent lane run` call.

One run = one attempt: a first turn, then up to ``repair`` repair turns that resume the same
vendor session with a note when the report is missing or malformed (ADR-0061: not a retry; the
turns share the deadline and the cost).  A vendor that cannot resume gets one fresh retry.

Outcomes (``LaneResult.status``):
- complete | partial | blocked  the agent's valid final report
- malformed                     no valid report after the repairs (or the vendor reported an API error)
- timeout                       the deadline passed (the whole process group was killed)
- unavailable                   binary missing, exit 127, or authentication refused -> gate-blocked
- rejected                      a read-only lane changed the worktree, or ``capability_drift``
- interrupted                   shutdown stopped it before it reported (no repair turn; the next scan reruns it)
A run found still 'running' and passed as ``resume_run_id`` is marked 'interrupted' (superseded).

The run is recorded in ``lane_runs`` (status 'running' + manifest before the child starts, pid when
it starts, final fields after) with events lane.started / lane.repair / lane.finished.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from agent import AgentError
from agent.infra.text import strip_controls
from agent.infra.env import config_denylist, lane_env
from agent.lanes.files import (fresh_dir, keep_lane_files, private_state, read_bytes_nofollow,  # noqa: F401
                               redact, lane_text, write_private)
from agent.lanes.report import Report, parse_report, repair_note, verdict
from agent.lanes.sandbox import SandboxUnavailable, lane_plan, sandbox_exec_failure, require as require_sandbox, with_argv_files, wrap
from agent.lanes.protocol import Invocation, LaneContext, TurnOutput
from agent.lanes.vendors import CommandVendor, get_vendor

WRITABLE_ROLES = ("implementer",)
REPORT_STATUSES = ("complete", "partial", "blocked")
FINAL_STATUSES = REPORT_STATUSES + ("malformed", "timeout", "unavailable", "rejected", "interrupted")
CAPABILITY_DRIFT = "capability_drift"
MIRROR_TAMPERED = "git_tampered"
SETID_BITS = "setid_bits"
WORKTREE_TOO_LARGE = "worktree_too_large"
VERSION_TIMEOUT = 20.0
EXCERPT_CHARS = 2000
_round = round  # run_lane has a parameter named `round`


@dataclass
class LaneResult:
    run_id: int | None
    role: str
    vendor: str
    status: str
    report: Report | None
    findings: int | None
    findings_text: str
    summary: str | None
    lesson: str | None
    session_id: str | None
    exit_code: int | None
    cost_usd: float
    usage: dict
    repairs: list[dict]
    reason: str | None
    log_dir: Path
    excerpt: str
    manifest_hash: str | None = None
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status in REPORT_STATUSES

    @property
    def verdict(self) -> str | None:
        return verdict(self.report) if self.ok else None

    def to_json(self) -> dict:
        return {
            "run_id": self.run_id, "role": self.role, "vendor": self.vendor, "status": self.status,
            "verdict": self.verdict, "findings": self.findings, "findings_text": self.findings_text,
            "summary": self.summary, "lesson": self.lesson, "session_id": self.session_id,
            "exit_code": self.exit_code, "cost": round(self.cost_usd, 6), "usage": self.usage,
            "repairs": self.repairs, "reason": self.reason, "log_dir": str(self.log_dir),
            "excerpt": self.excerpt, "manifest_hash": self.manifest_hash,
            "duration_s": round(self.duration_s, 3),
            "report": self.report.to_json() if self.report is not None else None,
        }


# ---------------------------------------------------------------------------- helpers


def redact_file(path: Path | None, extra_env: dict[str, str] | None = None) -> None:
    """Rewrite a runner-written log (in the run dir, which no lane sees) with its redacted text, before anything
    else reads or keeps it; a link at its name is never followed."""
    if path is None:
        return
    p = Path(path)
    raw = read_bytes_nofollow(p, cap=1 << 40)
    if raw is None:
        return
    text = raw.decode("utf-8", errors="replace")
    clean = redact(text, extra_env)
    if clean != text or raw != text.encode("utf-8"):
        write_private(p, clean)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


_VERSION_CACHE: dict[str, str] = {}
VERSION_CACHE_FILE = "versions.json"
VERSION_CACHE_MAX = 200


def _version_key(vendor, bin_path: str) -> str:
    """The binary's identity: vendor, resolved path, size and mtime (a replaced or touched binary is a new key)."""
    real = os.path.realpath(bin_path)
    st = os.stat(real)
    return json.dumps([vendor.name, real, st.st_size, st.st_mtime_ns])


def _read_version_cache(path: Path) -> dict[str, str]:
    raw = read_bytes_nofollow(path, cap=1 << 20)
    try:
        doc = json.loads(raw.decode("utf-8")) if raw else {}
    except ValueError:
        return {}
    if not isinstance(doc, dict):
        return {}
    return {k: v for k, v in doc.items() if isinstance(k, str) and isinstance(v, str) and len(v) <= 200}


def binary_version(vendor, bin_path: str, env: dict[str, str], run_dir: Path, cache: Path | None = None,
                   sandbox: Callable[[list[str], dict[str, str]], tuple[list[str], dict[str, str]]] | None = None
                   ) -> str:
    """The vendor's ``--version`` output (first line), or the binary's content hash when it has none.

    Cached in this process and, when ``cache`` (a JSON file in the agent home) is given, across processes, keyed by
    the binary's resolved path, size and mtime, so a new process (a cron tick) does not pay the probe again.
    ``sandbox(argv, env)``: wraps the probe in the lane's sandbox (``agent.lanes.sandbox.probe_argv``)."""
    key = _version_key(vendor, bin_path)
    if key in _VERSION_CACHE:
        return _VERSION_CACHE[key]
    stored = _read_version_cache(cache) if cache is not None else {}
    if key in stored:
        _VERSION_CACHE[key] = stored[key]
        return stored[key]
    argv = vendor.version_argv(bin_path)
    version = ""
    if argv:
        from agent.infra import proc

        if sandbox is not None:
            argv, env = sandbox(argv, env)
        res = proc.run(argv, cwd=run_dir, env=env, timeout=VERSION_TIMEOUT,
                       stdout_path=run_dir / "version.stdout", stderr_path=run_dir / "version.stderr",
                       max_bytes=65536)
        text = strip_controls((res.stdout_text() or res.stderr_text()).strip())
        version = text.splitlines()[0][:200] if text and res.exit_code == 0 else ""
    if not version:
        version = "sha256:" + sha256_file(Path(bin_path))[:16]
    _VERSION_CACHE[key] = version
    if cache is not None:
        stored = _read_version_cache(cache)          # re-read: another process may have added its own
        real = json.loads(key)[1]
        stored = {k: v for k, v in stored.items() if not k.startswith(json.dumps([vendor.name, real])[:-1] + ",")}
        stored[key] = version
        try:
            write_private(cache, json.dumps(dict(list(stored.items())[-VERSION_CACHE_MAX:]), indent=1))
        except OSError:
            pass                                     # a read-only home only costs the probe next time
    return version


def manifest_hash(manifest: dict) -> str:
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()


def _template(vendor, inv: Invocation, ctx: LaneContext) -> str:
    if isinstance(vendor, CommandVendor):
        return vendor.template()
    subs = sorted([(str(ctx.run_dir), "{run_dir}"), (str(ctx.spec_path), "{spec}"), (str(ctx.cwd), "{cwd}")],
                  key=lambda kv: len(kv[0]), reverse=True)
    out = []
    for arg in inv.argv:
        for real, ph in subs:
            arg = arg.replace(real, ph)
        out.append(arg)
    return json.dumps(out)


# ---------------------------------------------------------------------------- worktree snapshot


_SKIP_DIRS = {".git", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis"}


def worktree_state(cwd: Path) -> dict[str, str]:
    """A comparable picture of a worktree: HEAD + every changed/untracked file's content hash (git),
    or every file's content hash (not a git repo).  Ignored files do not count.  Git runs hardened
    (agent.git.workspace.git) with the git dir read before the lane ran, never through a hook or fsmonitor."""
    from agent.lanes.sandbox import git_paths
    from agent.git.workspace import GitError, git

    git_dir, common = git_paths(Path(cwd))
    state: dict[str, str] = {}
    raw = None
    if git_dir is not None:
        try:
            # one git process: porcelain v2 carries HEAD in its "# branch.oid" header
            raw = git("status", "--porcelain=v2", "-z", "--branch", "--untracked-files=all", git_dir=git_dir,
                      work_tree=Path(cwd), cwd=Path(cwd))
        except GitError:
            raw = None
    if raw is not None:
        root = Path(cwd)
        entries = raw.split("\0")
        state[":HEAD"] = "(no commits)"
        i = 0
        while i < len(entries):
            entry = entries[i]
            i += 1
            if entry.startswith("# branch.oid "):
                oid = entry[len("# branch.oid "):]
                state[":HEAD"] = oid if oid != "(initial)" else "(no commits)"
                continue
            kind = entry[:1]
            if kind == "?":
                code, path = "??", entry[2:]
            elif kind in "12u" and entry:
                fields = entry.split(" ", {"1": 8, "2": 9, "u": 10}[kind])
                code, path = fields[1], fields[-1]
                if kind == "2":
                    i += 1  # the rename source follows
            else:
                continue
            state[path] = code + ":" + _file_hash(root / path)
        return state
    root = Path(cwd)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
        for name in filenames:
            p = Path(dirpath) / name
            state[str(p.relative_to(root))] = _file_hash(p)
    return state


def _file_hash(p: Path) -> str:
    try:
        if p.is_symlink():
            return "link:" + os.readlink(p)
        if p.is_dir():
            return "dir"
        return sha256_file(p)[:16]
    except OSError:
        return "gone"


def changed_paths(before: dict[str, str], after: dict[str, str]) -> list[str]:
    keys = sorted(set(before) | set(after))
    return [("HEAD" if k == ":HEAD" else k) for k in keys if before.get(k) != after.get(k)]


# ---------------------------------------------------------------------------- git integrity


class GitGuard:
    """The git files a lane must never change, captured before it runs: the common dir's config, hooks/ and
    info/ (agent.git.workspace.protected_state), the worktree's git-dir records and its ``.git`` file.  After the
    lane, any change is restored and named (the run is rejected)."""

    def __init__(self, cwd: Path):
        from agent.lanes.sandbox import git_paths
        from agent.git.workspace import protected_state

        self.cwd = Path(cwd)
        self.git_dir, self.common = git_paths(self.cwd)
        self.dot = self.cwd / ".git"
        self.dot_bytes = self.dot.read_bytes() if self.dot.is_file() and not self.dot.is_symlink() else None
        self.state = protected_state(self.common, self.git_dir) if self.common is not None else None

    def check_and_restore(self) -> list[str]:
        from agent.git.workspace import drift, restore

        changed: list[str] = []
        if self.dot_bytes is not None:
            now = None
            try:
                now = self.dot.read_bytes() if self.dot.is_file() and not self.dot.is_symlink() else None
            except OSError:
                pass
            if now != self.dot_bytes:
                changed.append(str(self.dot))
                if self.dot.is_dir() and not self.dot.is_symlink():
                    shutil.rmtree(self.dot)
                else:
                    self.dot.unlink(missing_ok=True)
                self.dot.write_bytes(self.dot_bytes)
        if self.state is not None:
            moved = drift(self.state, self.common, self.git_dir)
            if moved:
                changed += moved
                restore(self.state, self.common, self.git_dir)
        return changed


# ---------------------------------------------------------------------------- the run


class LaneNotConfigured(AgentError):
    """No lane (vendor) is configured for a role: a config problem, fixed in config.yaml."""


def _lane_settings(config, role: str, repo_lanes: dict | None, vendor: str | None):
    lane = None
    if repo_lanes and role in repo_lanes:
        lane = repo_lanes[role]
        if isinstance(lane, dict):
            from agent.config import LaneConfig

            lane = LaneConfig(role=role, vendor=lane.get("vendor") or vendor or "", model=lane.get("model"),
                              timeout=lane.get("timeout"), repair=lane.get("repair"))
    if lane is None:
        lane = config.lanes.get(role)
    name = vendor or (lane.vendor if lane else None)
    if not name:
        raise LaneNotConfigured(f"no vendor configured for role {role}; add lanes.{role}: {{vendor: NAME}} to "
                                "config.yaml (or lanes: in the repository's .agent/config.yaml)")
    same = lane is not None and lane.vendor == name
    model = lane.model if same else None
    timeout = (lane.timeout if lane and lane.timeout else None) or config.limits.lane_timeout
    repair = lane.repair if lane is not None and lane.repair is not None else config.limits.repair
    return name, model, timeout, repair


class _Run:
    """State of one run_lane call (kept in one place so the steps below stay small)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)
        self.turns: list[tuple[Any, TurnOutput]] = []
        self.repairs: list[dict] = []
        self.cost = 0.0
        self.cost_seen = False
        self.usage: dict = {}
        self.session_id: str | None = None
        self.turn_index = 0
        self.runner_files: list[Path] = []
        self.network: Callable[[], Any] | None = None     # starts the turn's network (agent.lanes.egress)

    def add_turn(self, res, out: TurnOutput) -> None:
        """Count one turn's cost and usage into the attempt (repairs share the attempt's cost)."""
        if out.cost_usd is not None:
            self.cost += float(out.cost_usd)
            self.cost_seen = True
        # a vendor whose resumed turn reports the whole session's usage (codex) replaces, not adds
        resumed = bool(out.session_id) and out.session_id == self.session_id
        cumulative = resumed and getattr(self.vendor, "usage_cumulative", False)
        for k, v in (out.usage or {}).items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and not cumulative:
                self.usage[k] = self.usage.get(k, 0) + v
            else:
                self.usage[k] = v
        if out.session_id:
            self.session_id = out.session_id
        self.turns.append((res, out))

    # ledger ---------------------------------------------------------------
    def record(self, values: dict) -> None:
        if self.ledger is None or self.run_id is None:
            return
        from agent.ledger.lanes import update_run

        update_run(self.ledger, self.run_id, values, task_id=self.task_id, claim_token=self.claim_token)

    def event(self, kind: str, payload: dict) -> None:
        if self.ledger is None:
            return
        from agent.ledger.leases import claimed_tx

        # fenced like every task write: a lane whose task was taken over (lease lost) records nothing more
        with claimed_tx(self.ledger, self.task_id, self.claim_token if self.task_id is not None else None) as c:
            self.ledger.event(c, kind, "lane", payload, task_id=self.task_id, error_id=self.error_id)

    # one turn ---------------------------------------------------------------
    def turn(self, inv: Invocation, slug: str, ctx: LaneContext):
        from agent.infra import proc

        self.turn_index += 1
        base = self.run_dir / f"{self.turn_index:02d}-{slug}"
        remaining = self.deadline - time.time()
        env = lane_env(self.vendor_env, inv.env, deny=self.deny)
        argv = list(inv.argv)
        try:
            net = self.network() if self.bwrap is not None else None   # agent.lanes.egress: closed below
        except OSError as exc:                                          # no room for its socket, say
            for suffix in (".stdout", ".stderr"):
                base.with_suffix(suffix).write_bytes(b"")
            res = proc.ProcResult(exit_code=127, timed_out=False, missing=True, duration_s=0.0, pid=None,
                                  stdout_path=base.with_suffix(".stdout"), stderr_path=base.with_suffix(".stderr"),
                                  truncated=False, error=f"the lane's egress proxy could not start: {exc}")
            out = TurnOutput(message="")
            self.add_turn(res, out)
            return res, out
        if self.bwrap is not None:
            # what this turn reads of the runner's (its note, a retry spec) is bound read-only; a path that came
            # from the lane (its session id) is never bound
            plan = with_argv_files(self.plan, argv, env, untrusted=[self.session_id or ""],
                                   files=[f for f in self.runner_files if str(f) in " ".join(argv)])
            argv, env = wrap(self.bwrap, argv, plan, env, net)

        def on_start(pid: int) -> None:
            self.record({"pid": pid, "pid_start": proc.start_time(pid)})

        try:
            res = proc.run(argv, cwd=ctx.cwd, env=env, timeout=max(0.1, remaining), stdin_path=inv.stdin_path,
                           stdout_path=base.with_suffix(".stdout"), stderr_path=base.with_suffix(".stderr"),
                           on_line=self.on_progress, on_start=on_start)
        finally:
            refused = net.refused() if net is not None else []
            if net is not None:
                net.close()
        if refused:
            self.event("lane.egress_refused", {"run_id": self.run_id, "turn": self.turn_index, "hosts": refused})
        if res.missing:
            out = TurnOutput(message="")
        else:
            try:
                out = self.vendor.read_turn(res.stdout_text(), res.stderr_text(), res.exit_code, ctx)
            except Exception as exc:  # an adapter bug fails this turn closed, not the process
                out = TurnOutput(message="", api_error=f"could not read the vendor's output ({exc})")
        # the raw logs were needed to read the turn; from here on only their redacted text is kept
        redact_file(res.stdout_path, self.secrets)
        redact_file(res.stderr_path, self.secrets)
        self.add_turn(res, out)
        return res, out

    def classify(self, res, out: TurnOutput) -> tuple[str | None, str | None, Report | None]:
        """(final status or None when the report needs repair, reason, report)."""
        if res.missing:
            return "unavailable", res.error or "binary not found", None
        if res.exit_code in (1, 126, 127) and self.bwrap is not None and not res.timed_out:
            cause = sandbox_exec_failure(res.stderr_text())
            if cause:
                return "unavailable", (f"the sandbox could not start the vendor CLI ({cause}); install it where "
                                       f"its files are readable, or set vendors.{self.vendor.name}.bin to an "
                                       "executable whose interpreter exists, then `agent doctor`"), None
        if res.exit_code == 127 and not res.timed_out:
            return "unavailable", "exit 127: command not found inside the lane", None
        if out.auth_failed:
            return "unavailable", "authentication refused by the vendor CLI; log in or set its key", None
        if res.timed_out:
            return "timeout", f"lane timed out after {res.duration_s:.0f}s; process group killed", None
        report = parse_report(out.message, self.role)
        if out.api_error and not report.ok:
            return "malformed", f"vendor error: {out.api_error}", report
        if report.ok:
            return report.status, None, report
        return None, f"malformed report: {report.problem}", report


def run_lane(*, config, home: Path, role: str, spec_path: Path, cwd: Path,
             ledger=None, task_id: int | None = None, error_id: str | None = None,
             round: int | None = None, head_sha: str | None = None, repo_lanes: dict | None = None,
             vendor: str | None = None, deadline: float | None = None, claim_token: str | None = None,
             resume_run_id: int | None = None, on_progress: Callable[[str], None] | None = None,
             budget=None) -> LaneResult:
    """Run one lane to an outcome; never raises for a failing child (see the module doc).

    ``deadline`` is an absolute ``time.time()``; the lane's own timeout (lanes.ROLE.timeout, else
    limits.lane_timeout) applies too, whichever is first, and repair turns share it.
    ``budget`` (``agent.ledger.lanes.DailyBudget``, the fixer's lanes): the run reserves its estimate of the daily
    budget when it is recorded, or ``BudgetRefused`` is raised before anything starts.
    Raises AgentError only for caller errors: unknown role/vendor, missing spec or cwd, lost claim, no budget.
    """
    from agent.config import ROLES

    started = time.time()
    if role not in ROLES:
        raise AgentError(f"unknown role {role!r}; use one of {', '.join(ROLES)}")
    spec_path, cwd, home = Path(spec_path).resolve(), Path(cwd).resolve(), Path(home)
    if not spec_path.is_file():
        raise AgentError(f"spec file {spec_path} does not exist; write the spec first")
    if not cwd.is_dir():
        raise AgentError(f"working directory {cwd} does not exist")
    if ledger is not None and task_id is not None and claim_token is not None:
        from agent.ledger.tasks import ClaimLost, claim_held

        if not claim_held(ledger, task_id, claim_token):
            raise ClaimLost(f"task {task_id}: claim lost to another worker; not starting a lane")

    vendor_name, model, timeout, repair_budget = _lane_settings(config, role, repo_lanes, vendor)
    adapter = get_vendor(vendor_name, config)
    vc = config.vendor(vendor_name)
    end = min(deadline if deadline is not None else float("inf"), started + timeout)
    writable = role in WRITABLE_ROLES
    deny = config_denylist(config)

    run_id = None
    if ledger is not None:
        from agent.ledger.lanes import start_run

        run_id = start_run(ledger, task_id=task_id, error_id=error_id, round=round, role=role, vendor=vendor_name,
                           head_sha=head_sha, claim_token=claim_token, budget=budget, supersedes=resume_run_id)
        run_dir = home / "lanes" / str(run_id)
    else:
        run_dir = home / "lanes" / f"adhoc-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    # the runner's files stay in run_dir, which the lane never sees; the lane writes only to its worktree and to
    # lane_dir (fresh for this run, bound read-write, removed when the run ends: agent.lanes.files)
    lane_dir = fresh_dir(run_dir / "lane")

    r = _Run(ledger=ledger, run_id=run_id, task_id=task_id, error_id=error_id, role=role, vendor=adapter,
             run_dir=run_dir, lane_dir=lane_dir, deadline=end, vendor_env=vc.env, deny=deny, on_progress=on_progress,
             bwrap=None, plan=None, secrets=lane_env(vc.env, deny=deny), claim_token=claim_token)
    r.record({"log_dir": str(run_dir)})

    def finish(status: str, reason: str | None, report: Report | None, mhash: str | None) -> LaneResult:
        last_res, last_out = r.turns[-1] if r.turns else (None, None)
        cost_source = "vendor" if r.cost_seen else None
        if not r.cost_seen:  # tokens only (codex, gemini): priced from config prices: or the defaults
            from agent.domain.prices import priced_cost

            priced = priced_cost(vendor_name, model, r.usage, getattr(config, "prices", None))
            if priced is not None:
                r.cost, cost_source = priced
        if status in REPORT_STATUSES and report is not None:
            findings, ftext, summary, lesson = report.findings, report.findings_text, report.summary, report.lesson
        else:
            findings, ftext, summary, lesson = None, "", None, None
        secrets = lane_env(vc.env, deny=deny)
        tail = ""
        if last_out is not None:
            tail = (last_out.message or "")[-EXCERPT_CHARS:]
            if not tail.strip() and last_res is not None:
                tail = last_res.tail(EXCERPT_CHARS)
        result = LaneResult(
            run_id=run_id, role=role, vendor=vendor_name, status=status, report=report, findings=findings,
            findings_text=lane_text(ftext, secrets), summary=lane_text(summary, secrets) if summary else None,
            lesson=lane_text(lesson, secrets) if lesson else None, session_id=strip_controls(r.session_id) or None,
            exit_code=last_res.exit_code if last_res is not None else None, cost_usd=r.cost, usage=r.usage,
            repairs=r.repairs, reason=lane_text(reason, secrets), log_dir=run_dir, excerpt=lane_text(tail, secrets),
            manifest_hash=mhash, duration_s=time.time() - started)
        if ledger is not None:  # the outcome and its lane.finished event: one transaction, under the claim
            from agent.ledger.lanes import finish_run

            finish_run(ledger, run_id, {
                "status": status, "findings_count": findings, "findings_text": result.findings_text,
                "summary": result.summary, "lesson": result.lesson, "reason": result.reason,
                "session_id": result.session_id,
                "exit_code": result.exit_code, "cost_usd": r.cost, "usage": json.dumps(r.usage, sort_keys=True),
                "repairs": json.dumps(r.repairs, sort_keys=True)},
                {"run_id": run_id, "role": role, "vendor": vendor_name, "status": status, "reason": result.reason,
                 "findings": findings, "repairs": len(r.repairs), "cost_usd": r.cost, "cost_source": cost_source,
                 "session_id": result.session_id},
                task_id=task_id, error_id=error_id, claim_token=claim_token)
        keep_lane_files(lane_dir, run_dir / "lane-files", secrets)
        if task_id is None:         # a run outside a task: no later run can resume its vendor session
            shutil.rmtree(home / "vendor-state" / f"run-{run_dir.name}", ignore_errors=True)
        doc = result.to_json()
        if doc.get("report"):
            doc["report"] = {k: (lane_text(v, secrets) if isinstance(v, str) else v) for k, v in doc["report"].items()}
        try:
            write_private(run_dir / "result.json", json.dumps(doc, indent=2, default=str))
        except OSError:
            pass
        return result

    # -- the sandbox (before any child starts): refuse rather than run a lane unconfined by accident
    try:
        r.bwrap = require_sandbox(config)
    except SandboxUnavailable as exc:
        return finish("unavailable", str(exc), None, None)
    if r.bwrap is not None:
        from agent.lanes.egress import EgressUnavailable, lane_network, require as require_egress

        try:
            require_egress(config)
        except EgressUnavailable as exc:
            return finish("unavailable", str(exc), None, None)
        r.network = lambda: lane_network(config, vendor_name)

    # -- binary and manifest (before any child starts)
    bin_name = vc.bin or adapter.default_bin
    probe_env = lane_env(vc.env, deny=deny)
    bin_path = shutil.which(bin_name, path=probe_env.get("PATH"))
    if bin_path is None and os.path.sep in bin_name and os.access(bin_name, os.X_OK):
        bin_path = os.path.abspath(bin_name)
    if bin_path is None:
        return finish("unavailable", f"{bin_name}: binary not found on the lane's PATH; install it or set "
                      f"vendors.{vendor_name}.bin", None, None)
    ctx = LaneContext(role=role, writable=writable, spec_path=spec_path, cwd=cwd, model=model, bin=bin_path,
                      extra_args=tuple(vc.args), run_dir=lane_dir)
    try:
        first = adapter.build(ctx)
    except AgentError as exc:
        return finish("unavailable", f"vendor {vendor_name} cannot run this lane: {exc}", None, None)
    manifest = {"vendor": vendor_name, "bin": bin_path,
                "version": binary_version(adapter, bin_path, probe_env, run_dir,
                                          cache=home / "lanes" / VERSION_CACHE_FILE,
                                          sandbox=_probe_sandbox(config, home, run_dir)),
                "model": model, "role": role, "argv": _template(adapter, first, ctx),
                "spec_sha256": sha256_file(spec_path)}
    mhash = manifest_hash(manifest)
    r.record({"manifest": json.dumps(manifest, sort_keys=True), "manifest_hash": mhash})

    if resume_run_id is not None:
        from agent.ledger.lanes import get_run, interrupt_run

        prev = get_run(ledger, resume_run_id) if ledger is not None else None
        if prev is None:
            raise AgentError(f"lane run {resume_run_id} not found; cannot resume it")
        if prev.get("status") == "running":
            # the interrupted run is superseded by this one; it no longer counts as in flight
            interrupt_run(ledger, resume_run_id, f"interrupted; resumed as run {run_id}", task_id=task_id,
                          claim_token=claim_token)
        if prev.get("manifest_hash") != mhash:
            return finish("rejected", CAPABILITY_DRIFT, None, mhash)
        if prev.get("session_id") and adapter.can_resume:
            note = write_private(run_dir / "resume-note.md", "The previous run of this task was interrupted. "
                                 "Continue where you left off and end your last message with the final report.\n")
            r.runner_files.append(note)
            try:
                first = adapter.build_resume(ctx, prev["session_id"], note)
                r.session_id = prev["session_id"]
            except Exception:
                pass  # fall back to the fresh first turn built above

    before = None if writable else worktree_state(cwd)
    guard = GitGuard(cwd)
    if r.bwrap is not None:
        state_env = lane_env(vc.env, first.env, deny=deny)
        state = adapter.state_paths(state_env) if hasattr(adapter, "state_paths") else []
        # never the user's live dirs: a private copy per task holding only the login files (agent.lanes.files)
        scope = f"task-{task_id}" if task_id is not None else f"run-{run_dir.name}"
        state = private_state(home / "vendor-state" / scope / vendor_name, state,
                              tuple(getattr(adapter, "login_files", ()) or ()))
        r.plan = lane_plan(cwd=cwd, writable=writable, agent_home=home, run_dir=run_dir, lane_dir=lane_dir,
                           spec_paths=[spec_path],
                           state_paths=state, extra_writable=list(getattr(vc, "writable", ()) or ()))
        r.plan.tmpfs_mb = config.limits.lane_tmp_mb
        r.plan.unix_sockets = config.sandbox_unix_sockets

    if time.time() >= end:
        return finish("timeout", "deadline already passed before the lane started", None, mhash)

    # -- the first turn and the repair loop
    res, out = r.turn(first, "turn", ctx)
    status, reason, report = r.classify(res, out)
    from agent.infra import proc

    if status is None and proc.halted():
        # shutting down stopped it: no report is not a malformed one, and no repair turn may start
        status, reason = "interrupted", "stopped by shutdown before it reported"
    fresh_used = False
    n = 0
    while status is None and n < repair_budget:
        if time.time() >= end - 1:
            reason = f"{reason}; no time left for a repair turn"
            break
        n += 1
        note_text = repair_note(report.problem if report else None, role)
        note_path = write_private(run_dir / f"repair-{n}.md", note_text)
        r.runner_files.append(note_path)
        inv, kind = None, "resume"
        if adapter.can_resume:
            try:
                inv = adapter.build_resume(ctx, r.session_id, note_path)
            except Exception:
                inv = None
        if inv is None:
            if fresh_used:
                break
            fresh_used, kind = True, "fresh"
            retry_spec = write_private(run_dir / "spec-retry.md", spec_path.read_text(encoding="utf-8", errors="replace")
                                       + "\n\n## Note from the runner (a previous attempt's report was rejected)\n\n"
                                       + note_text)
            r.runner_files.append(retry_spec)
            retry_ctx = LaneContext(**{**ctx.__dict__, "spec_path": retry_spec})
            inv = adapter.build(retry_ctx)
        total = repair_budget if kind == "resume" else 1
        label = f"{role} repair {n}/{total}"
        if hasattr(on_progress, "set_label"):
            on_progress.set_label(label)
        session_before = r.session_id
        cost_before = r.cost
        res, out = r.turn(inv, f"repair-{n}", ctx)
        prev_problem = lane_text(report.problem, r.secrets) if report else None
        status, new_reason, new_report = r.classify(res, out)
        entry = {"label": label, "kind": kind, "round": round, "note": lane_text(note_text, r.secrets),
                 "problem": prev_problem, "session_id": out.session_id or session_before,
                 "resumed_session": session_before if kind == "resume" else None,
                 "exit_code": res.exit_code, "cost_usd": _round(r.cost - cost_before, 6),
                 "outcome": status or "malformed", "log": str(res.stdout_path)}
        r.repairs.append(entry)
        r.event("lane.repair", {"run_id": run_id, "label": label, "kind": kind, "problem": prev_problem,
                                "outcome": entry["outcome"], "session_id": entry["session_id"]})
        if new_report is not None or status is not None:
            reason, report = new_reason, (new_report if new_report is not None else report)
        if kind == "fresh":
            break
    if status is None:
        status = "malformed"

    tampered = guard.check_and_restore()
    setid, too_large = _settle_files(r, cwd, writable, config.limits.worktree_max_mb)
    if tampered:
        shown = ", ".join(tampered[:10]) + (f" (+{len(tampered) - 10} more)" if len(tampered) > 10 else "")
        status, reason = "rejected", f"{MIRROR_TAMPERED}: the lane changed {shown}; restored"
        r.event("lane.git_tampered", {"run_id": run_id, "role": role, "vendor": vendor_name, "paths": tampered[:50]})
    elif setid:
        shown_paths = ", ".join(setid[:10]) + (f" (+{len(setid) - 10} more)" if len(setid) > 10 else "")
        status, reason = "rejected", f"{SETID_BITS}: the lane left setuid/setgid files {shown_paths}; bits removed"
        r.event("lane.setid_bits", {"run_id": run_id, "role": role, "vendor": vendor_name, "paths": setid[:50]})
    elif too_large:
        status, reason = "rejected", f"{WORKTREE_TOO_LARGE}: {too_large}"
    elif before is not None:
        changed = changed_paths(before, worktree_state(cwd))
        if changed:
            shown = ", ".join(changed[:10]) + (f" (+{len(changed) - 10} more)" if len(changed) > 10 else "")
            status, reason = "rejected", f"read-only lane changed the worktree: {shown}"
    return finish(status, reason, report if status in REPORT_STATUSES else report, mhash)


def _settle_files(r: _Run, cwd: Path, writable: bool, max_mb: int) -> tuple[list[str], str | None]:
    """After the lane: setuid/setgid bits removed from everything it could write (the worktree, its vendor state,
    ``vendors.X.writable``), and the worktree's size against ``limits.worktree_max_mb``.  Returns (the worktree
    files that had such bits, why the worktree is too large or None)."""
    from agent.git.workspace import human_bytes, walk_tree

    if r.plan is not None:
        for src in [s for s, _ in r.plan.over_rw] + [p for p in r.plan.rw if p != Path(cwd)]:
            if Path(src).is_dir() and not Path(src).is_symlink():
                walk_tree(Path(src), strip_setid=True)
    if not writable:
        return [], None
    size, setid = walk_tree(Path(cwd), strip_setid=True)
    if size > max_mb << 20:
        return setid, (f"the worktree grew to {human_bytes(size)}, past limits.worktree_max_mb ({max_mb} MB); "
                       "keep generated and downloaded files out of it")
    return setid, None


def _probe_sandbox(config, agent_home: Path, scratch: Path):
    """The wrapper that runs a version probe in the sandbox its lane gets (agent.lanes.sandbox.probe_argv)."""
    from agent.lanes.sandbox import probe_argv

    return lambda argv, env: probe_argv(config, agent_home, argv, env, scratch / "sandbox")


def list_lanes(config, scratch: Path) -> list[dict]:
    """Every vendor (built-in, configured, or named by a lane) with its roles, binary and version."""
    from agent.domain.names import BUILTIN_VENDORS
    from agent.lanes.vendors import known_vendors

    names = set(known_vendors(config)) | set(BUILTIN_VENDORS) | {lc.vendor for lc in config.lanes.values()}
    probe_dir = Path(scratch) / "probe"
    probe_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in sorted(names):
        vc = config.vendor(name)
        try:
            adapter = get_vendor(name, config)
        except AgentError:
            adapter = None
        env = lane_env(vc.env, deny=config_denylist(config))
        bin_name = vc.bin or (adapter.default_bin if adapter is not None else name)
        path = shutil.which(bin_name, path=env.get("PATH"))
        version = None
        if path and adapter is not None:
            try:
                version = binary_version(adapter, path, env, probe_dir, cache=Path(scratch) / VERSION_CACHE_FILE,
                                         sandbox=_probe_sandbox(config, Path(scratch).parent, probe_dir))
            except (OSError, SandboxUnavailable):
                version = None
        rows.append({"vendor": name, "kind": "command" if vc.command else "builtin",
                     "roles": sorted(role for role, lc in config.lanes.items() if lc.vendor == name),
                     "bin": bin_name, "path": path, "found": path is not None, "version": version,
                     "adapter": adapter is not None, "can_resume": bool(adapter and adapter.can_resume)})
    return rows
