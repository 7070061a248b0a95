"""``run_lane(LaneRequest)``: one lane run — the one entry point the fixer, the decider and `agent lane run` call.
A ``LaneRun`` holds the run's state and takes it through its phases: open (recorded), prepare, first turn,
repairs, verdict, finish.

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
A task's run starts each turn's process only under the task's live claim (checked right before it starts); a lost
claim raises LeaseLost after git's own files are restored and setid bits stripped, and nothing more is recorded.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from agent import AgentError
from agent.infra.text import strip_controls
from agent.infra.env import lane_env, secret_env_names
from agent.lanes.files import (binary_key, fresh_dir, keep_lane_files, private_state, read_bytes_nofollow,  # noqa: F401
                               redact, lane_text, state_origin, write_private)
from agent.lanes.report import Report, parse_report, repair_note, verdict
from agent.lanes.sandbox import (SETUP_RETRIES, SandboxUnavailable, lane_plan, require as require_sandbox,
                                 sandbox_exec_failure, until_set_up, vanished_mount, with_argv_files, wrap)
from agent.lanes.protocol import Invocation, LaneContext, TurnOutput
from agent.lanes.vendors import CommandVendor, get_vendor

WRITABLE_ROLES = ("implementer",)
REPORT_STATUSES = ("complete", "partial", "blocked")
FINAL_STATUSES = REPORT_STATUSES + ("malformed", "timeout", "unavailable", "rejected", "interrupted")
CAPABILITY_DRIFT = "capability_drift"
MIRROR_TAMPERED = "git_tampered"
SETID_BITS = "setid_bits"
WORKTREE_TOO_LARGE = "worktree_too_large"
WATCH_S = 2.0            # how often a writing turn's worktree size is measured (limits.worktree_max_mb)
VERSION_TIMEOUT = 20.0
EXCERPT_CHARS = 2000


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
    return binary_key(vendor.name, bin_path)


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


@dataclass(frozen=True)
class LaneRequest:
    """What one lane run is asked to do (``run_lane``'s one argument).

    ``deadline`` is an absolute ``time.time()``; the lane's own timeout (lanes.ROLE.timeout, else
    limits.lane_timeout) applies too, whichever is first, and repair turns share it.
    ``budget`` (``agent.ledger.lanes.DailyBudget``, the fixer's lanes): the run reserves its estimate of the daily
    budget when it is recorded, or ``BudgetRefused`` is raised before anything starts.
    ``task_id`` + ``claim_token``: the run is the task's, recorded under its claim; ``resume_run_id``: the run
    found in flight that this one supersedes."""

    config: Any
    home: Path
    role: str
    spec_path: Path
    cwd: Path
    ledger: Any = None
    task_id: int | None = None
    error_id: str | None = None
    round: int | None = None
    head_sha: str | None = None
    repo_lanes: dict | None = None
    vendor: str | None = None
    deadline: float | None = None
    claim_token: str | None = None
    resume_run_id: int | None = None
    on_progress: Callable[[str], None] | None = None
    budget: Any = None


class Tally:
    """The turns of one run and what they add up to: cost, usage and the vendor session (repairs share them)."""

    def __init__(self, vendor):
        self.vendor = vendor
        self.turns: list[tuple[Any, TurnOutput]] = []
        self.cost = 0.0
        self.cost_seen = False
        self.usage: dict = {}
        self.session_id: str | None = None

    def add(self, res, out: TurnOutput) -> None:
        """Count one turn's cost and usage into the attempt."""
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


class _Ended(Exception):
    """Raised by a preparing step: the run ends here with this outcome, before any turn starts."""

    def __init__(self, status: str, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


Outcome = tuple[str | None, str | None, Report | None]  # (status: None while the report needs repair, reason, report)


def run_lane(request: LaneRequest) -> LaneResult:
    """Run one lane to an outcome; never raises for a failing child (see the module doc).

    Raises AgentError only for caller errors: unknown role/vendor, missing spec or cwd, lost claim, no budget."""
    return LaneRun(request).run()


class LaneRun:
    """One lane run, phase by phase: open (recorded), prepare, first turn, repairs, verdict, finish."""

    def __init__(self, req: LaneRequest):
        from agent.config import ROLES

        self.req = req
        self.started = time.time()
        if req.role not in ROLES:
            raise AgentError(f"unknown role {req.role!r}; use one of {', '.join(ROLES)}")
        self.spec_path, self.cwd, self.home = Path(req.spec_path).resolve(), Path(req.cwd).resolve(), Path(req.home)
        if not self.spec_path.is_file():
            raise AgentError(f"spec file {self.spec_path} does not exist; write the spec first")
        if not self.cwd.is_dir():
            raise AgentError(f"working directory {self.cwd} does not exist")
        self.ledger = req.ledger
        self.role = req.role
        self.run_id: int | None = None
        self.run_dir = self.lane_dir = Path()
        self.repairs: list[dict] = []
        self.runner_files: list[Path] = []
        self.turn_index = 0
        self.carried: dict[str, str] = {}                  # what the next turn needs of the last one's lane dir
        self.bwrap = self.plan = self.ctx = self.mhash = self.before = self.guard = None
        self.network: Callable[[], Any] | None = None     # starts the turn's network (agent.lanes.egress)
        self.launched: list[str] = []                     # the last turn's argv, as started
        self.size_stopped: int | None = None              # the worktree's size when a turn was stopped for it

    def run(self) -> LaneResult:
        from agent.ledger.leases import LeaseLost

        self.open()
        try:
            first = self.prepare()
        except _Ended as end:
            return self.finish(end.status, end.reason, None)
        try:
            status, reason, report = self.repair(self.first_turn(first))
        except LeaseLost:
            # the claim is gone (no turn starts without it): the lane's traces are settled all the same, and
            # nothing more is recorded (the fixer drops the task, as for any lost claim)
            self.settle()
            raise
        status, reason = self.verdict(status, reason)
        return self.finish(status, reason, report)

    # open ---------------------------------------------------------------
    def open(self) -> None:
        """Check the claim, read the lane's settings, record the run 'running' and make its dirs."""
        req = self.req
        if self.ledger is not None and req.task_id is not None and req.claim_token is not None:
            from agent.ledger.tasks import ClaimLost, claim_held

            if not claim_held(self.ledger, req.task_id, req.claim_token):
                raise ClaimLost(f"task {req.task_id}: claim lost to another worker; not starting a lane")
        self.vendor_name, self.model, timeout, self.repair_budget = _lane_settings(
            req.config, self.role, req.repo_lanes, req.vendor)
        self.vendor = get_vendor(self.vendor_name, req.config)
        self.vc = req.config.vendor(self.vendor_name)
        self.end = min(req.deadline if req.deadline is not None else float("inf"), self.started + timeout)
        self.writable = self.role in WRITABLE_ROLES
        self.deny = secret_env_names(req.config)
        self.secrets = lane_env(self.vc.env, deny=self.deny)
        self.tally = Tally(self.vendor)
        if self.ledger is not None:
            from agent.ledger.lanes import start_run

            self.run_id = start_run(self.ledger, task_id=req.task_id, error_id=req.error_id, round=req.round,
                                    role=self.role, vendor=self.vendor_name, head_sha=req.head_sha,
                                    claim_token=req.claim_token, budget=req.budget, supersedes=req.resume_run_id)
            self.run_dir = self.home / "lanes" / str(self.run_id)
        else:
            self.run_dir = self.home / "lanes" / f"adhoc-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
        self.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        # the runner's files stay in run_dir, which the lane never sees; the lane writes only to its worktree and
        # to lane_dir (fresh for each turn, bound read-write, kept as text and removed after it: agent.lanes.files)
        self.lane_dir = fresh_dir(self.run_dir / "lane")
        self.record({"log_dir": str(self.run_dir)})

    # prepare (before any child starts) -----------------------------------
    def prepare(self) -> Invocation:
        """Sandbox, binary, manifest, the resumed run, the worktree's picture and the sandbox plan; returns the
        first turn's invocation, or raises _Ended."""
        self._require_sandbox()
        bin_path = self._binary()
        self.ctx = LaneContext(role=self.role, writable=self.writable, spec_path=self.spec_path, cwd=self.cwd,
                               model=self.model, bin=bin_path, extra_args=tuple(self.vc.args), run_dir=self.lane_dir)
        try:
            first = self.vendor.build(self.ctx)
        except AgentError as exc:
            raise _Ended("unavailable", f"vendor {self.vendor_name} cannot run this lane: {exc}") from None
        self._record_manifest(bin_path, first)
        if self.req.resume_run_id is not None:
            first = self._resume(first)
        if self.bwrap is not None:
            self._plan(first)
        if time.time() >= self.end:
            raise _Ended("timeout", "deadline already passed before the lane started")
        return first

    def _watch_worktree(self) -> None:
        """The worktree's picture (a read-only lane is judged by it) and the git guard, taken once, before any
        process of the lane runs: the gate of its turns' starts (``proc.run(gate=)``), in a sandbox while bwrap sets
        it up and waits for its go, without one right before the start.  No picture where the sandbox mounts the
        worktree read-only with nothing writable inside it: the kernel refuses the lane every write there, and two
        ``git status`` runs (~3 ms each, the first on the start's critical path) would check what cannot happen."""
        if self.guard is None:
            locked = self.bwrap is not None and self.plan is not None and self.plan.worktree_read_only()
            self.before = None if self.writable or locked else worktree_state(self.cwd)
            self.guard = GitGuard(self.cwd)

    def _require_sandbox(self) -> None:
        """Refuse rather than run a lane unconfined by accident."""
        config = self.req.config
        try:
            self.bwrap = require_sandbox(config)
        except SandboxUnavailable as exc:
            raise _Ended("unavailable", str(exc)) from None
        if self.bwrap is not None:
            from agent.lanes.egress import lane_network

            self.network = lambda: lane_network(config, self.vendor_name)

    def _binary(self) -> str:
        bin_name = self.vc.bin or self.vendor.default_bin
        bin_path = shutil.which(bin_name, path=lane_env(self.vc.env, deny=self.deny).get("PATH"))
        if bin_path is None and os.path.sep in bin_name and os.access(bin_name, os.X_OK):
            bin_path = os.path.abspath(bin_name)
        if bin_path is None:
            raise _Ended("unavailable", f"{bin_name}: binary not found on the lane's PATH; install it or set "
                         f"vendors.{self.vendor_name}.bin")
        return bin_path

    def _record_manifest(self, bin_path: str, first: Invocation) -> None:
        probe_env = lane_env(self.vc.env, deny=self.deny)
        version = binary_version(self.vendor, bin_path, probe_env, self.run_dir,
                                 cache=self.home / "lanes" / VERSION_CACHE_FILE,
                                 sandbox=_probe_sandbox(self.req.config, self.home, self.run_dir))
        manifest = {"vendor": self.vendor_name, "bin": bin_path, "version": version, "model": self.model,
                    "role": self.role, "argv": _template(self.vendor, first, self.ctx),
                    "spec_sha256": sha256_file(self.spec_path)}
        self.mhash = manifest_hash(manifest)
        self.record({"manifest": json.dumps(manifest, sort_keys=True), "manifest_hash": self.mhash})

    def _resume(self, first: Invocation) -> Invocation:
        """The run this one supersedes: marked interrupted; a changed manifest ends this one (capability drift);
        its vendor session is resumed when the vendor can."""
        from agent.ledger.lanes import get_run, interrupt_run

        req = self.req
        prev = get_run(self.ledger, req.resume_run_id) if self.ledger is not None else None
        if prev is None:
            raise AgentError(f"lane run {req.resume_run_id} not found; cannot resume it")
        if prev.get("status") == "running":
            # the interrupted run is superseded by this one; it no longer counts as in flight
            interrupt_run(self.ledger, req.resume_run_id, f"interrupted; resumed as run {self.run_id}",
                          task_id=req.task_id, claim_token=req.claim_token)
        if prev.get("manifest_hash") != self.mhash:
            raise _Ended("rejected", CAPABILITY_DRIFT)
        if prev.get("session_id") and self.vendor.can_resume:
            note = write_private(self.run_dir / "resume-note.md", "The previous run of this task was interrupted. "
                                 "Continue where you left off and end your last message with the final report.\n")
            self.runner_files.append(note)
            try:
                first = self.vendor.build_resume(self.ctx, prev["session_id"], note)
                self.tally.session_id = prev["session_id"]
            except Exception:
                pass  # fall back to the fresh first turn built above
        return first

    def _plan(self, first: Invocation) -> None:
        state_env = lane_env(self.vc.env, first.env, deny=self.deny)
        state = self.vendor.state_paths(state_env) if hasattr(self.vendor, "state_paths") else []
        # never the user's live dirs: a private copy per task holding only the login files (agent.lanes.files)
        scope = f"task-{self.req.task_id}" if self.req.task_id is not None else f"run-{self.run_dir.name}"
        originals = state
        # the CLI's own first-start state, made once per binary (its databases, migrated): agent.lanes.vendorstate
        from agent.lanes.vendorstate import seed, template_for

        template = template_for(self.vendor, self.ctx.bin, originals, state_env, self.home,
                                self.req.config) if originals else None
        fixed = self.vendor.read_only_state(state_env) if hasattr(self.vendor, "read_only_state") else {}
        fixed = {state_origin(k): v for k, v in fixed.items()}
        state = private_state(self.home / "vendor-state" / scope / self.vendor_name, state,
                              tuple(getattr(self.vendor, "login_files", ()) or ()), template=template, fixed=fixed,
                              obeyed=tuple(getattr(self.vendor, "obeyed_files", ()) or ()))
        seed(state, template)
        self.plan = lane_plan(cwd=self.cwd, writable=self.writable, agent_home=self.home, run_dir=self.run_dir,
                              lane_dir=self.lane_dir, spec_paths=[self.spec_path],
                              state_paths=[p for p in state if p[1] not in fixed],
                              read_only_state=[p for p in state if p[1] in fixed],
                              extra_writable=list(getattr(self.vc, "writable", ()) or ()))
        self.plan.tmpfs_mb = self.req.config.limits.lane_tmp_mb
        self.plan.unix_sockets = self.req.config.sandbox_unix_sockets

    # the turns -------------------------------------------------------------
    def first_turn(self, first: Invocation) -> Outcome:
        from agent.infra import proc

        res, out = self.turn(first, "turn")
        status, reason, report = self.classify(res, out)
        if status is None and proc.halted():
            # shutting down stopped it: no report is not a malformed one, and no repair turn may start
            status, reason = "interrupted", "stopped by shutdown before it reported"
        return status, reason, report

    def repair(self, outcome: Outcome) -> Outcome:
        """Up to ``repair`` turns while the report needs repair: resume the session with a note, or (a vendor that
        cannot resume) one fresh retry with the note in the spec; they share the deadline."""
        status, reason, report = outcome
        fresh_used = False
        n = 0
        while status is None and n < self.repair_budget:
            if time.time() >= self.end - 1:
                reason = f"{reason}; no time left for a repair turn"
                break
            n += 1
            self._fresh_lane_dir()
            note_text = repair_note(report.problem if report else None, self.role)
            built = self._repair_invocation(n, note_text, fresh_used)
            if built is None:
                break
            inv, kind = built
            fresh_used = fresh_used or kind == "fresh"
            status, new_reason, new_report = self._repair_turn(n, inv, kind, note_text, report)
            if new_report is not None or status is not None:
                reason, report = new_reason, (new_report if new_report is not None else report)
            if kind == "fresh":
                break
        return (status or "malformed"), reason, report

    def _repair_invocation(self, n: int, note_text: str, fresh_used: bool) -> tuple[Invocation, str] | None:
        note_path = write_private(self.run_dir / f"repair-{n}.md", note_text)
        self.runner_files.append(note_path)
        if self.vendor.can_resume:
            try:
                return self.vendor.build_resume(self.ctx, self.tally.session_id, note_path), "resume"
            except Exception:
                pass
        if fresh_used:
            return None
        retry_spec = write_private(self.run_dir / "spec-retry.md",
                                   self.spec_path.read_text(encoding="utf-8", errors="replace")
                                   + "\n\n## Note from the runner (a previous attempt's report was rejected)\n\n"
                                   + note_text)
        self.runner_files.append(retry_spec)
        retry_ctx = LaneContext(**{**self.ctx.__dict__, "spec_path": retry_spec})
        return self.vendor.build(retry_ctx), "fresh"

    def _repair_turn(self, n: int, inv: Invocation, kind: str, note_text: str, report: Report | None) -> Outcome:
        """Run repair turn ``n`` and record it (``repairs``, event lane.repair)."""
        total = self.repair_budget if kind == "resume" else 1
        label = f"{self.role} repair {n}/{total}"
        if hasattr(self.req.on_progress, "set_label"):
            self.req.on_progress.set_label(label)
        session_before = self.tally.session_id
        cost_before = self.tally.cost
        res, out = self.turn(inv, f"repair-{n}")
        prev_problem = lane_text(report.problem, self.secrets) if report else None
        status, new_reason, new_report = self.classify(res, out)
        entry = {"label": label, "kind": kind, "round": self.req.round, "note": lane_text(note_text, self.secrets),
                 "problem": prev_problem, "session_id": out.session_id or session_before,
                 "resumed_session": session_before if kind == "resume" else None,
                 "exit_code": res.exit_code, "cost_usd": round(self.tally.cost - cost_before, 6),
                 "outcome": status or "malformed", "log": str(res.stdout_path)}
        self.repairs.append(entry)
        self.event("lane.repair", {"run_id": self.run_id, "label": label, "kind": kind, "problem": prev_problem,
                                   "outcome": entry["outcome"], "session_id": entry["session_id"]})
        return status, new_reason, new_report

    def turn(self, inv: Invocation, slug: str):
        """One turn: its process in the sandbox (with its own network), then its output read and its logs
        redacted."""
        from agent.infra import proc

        self.fence(slug)
        self.turn_index += 1
        base = self.run_dir / f"{self.turn_index:02d}-{slug}"
        env = lane_env(self.vc.env, inv.env, deny=self.deny)
        try:
            net = self.network() if self.bwrap is not None else None   # agent.lanes.egress: closed below
        except OSError as exc:                                          # no room for its socket, say
            for suffix in (".stdout", ".stderr"):
                base.with_suffix(suffix).write_bytes(b"")
            res = proc.ProcResult(exit_code=127, timed_out=False, missing=True, duration_s=0.0, pid=None,
                                  stdout_path=base.with_suffix(".stdout"), stderr_path=base.with_suffix(".stderr"),
                                  truncated=False, error=f"the lane's egress proxy could not start: {exc}")
            out = TurnOutput(message="")
            self.tally.add(res, out)
            self._keep_lane_dir(base.name)
            return res, out
        refused: list[str] = []

        def start():
            try:
                res = self._launch(inv, base, env, net, self.end - time.time())
            finally:
                refused.extend(net.refused() if net is not None else [])
                if net is not None:
                    net.close()
            return self.launched, res

        def restarted(gone: str) -> bool:
            # a path the plan hides (a host socket, its dir) went away before bwrap came up: nothing ran; a new
            # plan, with a new network and scan of the host's sockets
            nonlocal net
            self.event("lane.sandbox_restarted", {"run_id": self.run_id, "turn": self.turn_index, "gone": gone})
            try:
                net = self.network()
            except OSError:
                return False
            return True

        res = until_set_up(start, restarted) if self.bwrap is not None else start()[1]
        if refused:
            self.event("lane.egress_refused", {"run_id": self.run_id, "turn": self.turn_index, "hosts": refused})
        out = self._read_turn(res)
        self.tally.add(res, out)
        self._keep_lane_dir(base.name)
        return res, out

    def _keep_lane_dir(self, turn: str) -> None:
        """After a turn: what the next turn needs of its lane dir read (``read_lane_file``), then the dir kept as
        redacted text under ``lane-files/<turn>/`` and removed."""
        carried = getattr(self.vendor, "carried", None)
        self.carried = carried(self.ctx) if carried is not None else {}
        keep_lane_files(self.lane_dir, self.run_dir / "lane-files" / turn, self.secrets)

    def _fresh_lane_dir(self) -> None:
        """Before a repair turn: a new empty lane dir holding only what the runner carries over, written by the
        runner from text (a later turn never sees a file or link an earlier one left)."""
        fresh_dir(self.lane_dir)
        for name, text in self.carried.items():
            write_private(self.lane_dir / name, text)

    def fence(self, slug: str) -> None:
        """A turn's process starts only under the live claim of the run's task: checked right before it starts, on
        the ledger's clock (``check_claim``: an expired lease nobody took is renewed); LeaseLost when it is gone."""
        req = self.req
        if self.ledger is None or req.task_id is None or req.claim_token is None:
            return
        from agent.ledger.leases import LeaseLost, check_claim

        try:
            with self.ledger.tx(exclusive=False) as c:
                check_claim(c, req.task_id, req.claim_token)
        except LeaseLost:
            what = "first turn" if slug == "turn" else f"{slug} turn"
            raise LeaseLost(f"task {req.task_id}: claim lost to another worker; the {self.role} lane's {what} "
                            "was not started, nothing more recorded") from None

    def _launch(self, inv: Invocation, base: Path, env: dict[str, str], net, remaining: float):
        from agent.infra import proc

        argv = list(inv.argv)
        if self.bwrap is not None:
            # what this turn reads of the runner's (its note, a retry spec) is bound read-only; a path that came
            # from the lane (its session id) is never bound
            plan = with_argv_files(self.plan, argv, env, untrusted=[self.tally.session_id or ""],
                                   untrusted_at=inv.lane_text_at,
                                   files=[f for f in self.runner_files if str(f) in " ".join(argv)])
            argv, env = wrap(self.bwrap, argv, plan, env, net)
        self.launched = argv
        watch = _SizeWatch(self.cwd, self.req.config.limits.worktree_max_mb) if self.writable else None

        def started(pid: int) -> None:
            self.record({"pid": pid, "pid_start": proc.start_time(pid)})
            if watch is not None:
                watch.start(pid)

        try:
            return proc.run(argv, cwd=self.ctx.cwd, env=env, timeout=max(0.1, remaining), stdin_path=inv.stdin_path,
                            stdout_path=base.with_suffix(".stdout"), stderr_path=base.with_suffix(".stderr"),
                            on_line=self.req.on_progress, on_start=started, gate=self._watch_worktree,
                            pass_fds=net.pass_fds() if net is not None else ())
        finally:
            if watch is not None:
                watch.stop()
                if watch.tripped is not None:
                    self.size_stopped = watch.tripped

    def _read_turn(self, res) -> TurnOutput:
        if res.missing:
            out = TurnOutput(message="")
        else:
            try:
                out = self.vendor.read_turn(res.stdout_text(), res.stderr_text(), res.exit_code, self.ctx)
            except Exception as exc:  # an adapter bug fails this turn closed, not the process
                out = TurnOutput(message="", api_error=f"could not read the vendor's output ({exc})")
        # the raw logs were needed to read the turn; from here on only their redacted text is kept
        redact_file(res.stdout_path, self.secrets)
        redact_file(res.stderr_path, self.secrets)
        return out

    def classify(self, res, out: TurnOutput) -> Outcome:
        """(final status or None when the report needs repair, reason, report)."""
        if res.missing:
            return "unavailable", res.error or "binary not found", None
        if self.size_stopped is not None:       # the turn was stopped for it: final, whatever it left (no repair)
            why = _too_large(self.size_stopped, self.req.config.limits.worktree_max_mb, "while the lane ran")
            return "rejected", f"{WORKTREE_TOO_LARGE}: {why}", None
        if res.exit_code in (1, 126, 127) and self.bwrap is not None and not res.timed_out:
            cause = sandbox_exec_failure(res.stderr_text())
            gone = vanished_mount(self.launched, res.stderr_text(4096)) if cause else None
            if gone:
                return "unavailable", (f"the sandbox could not start: {gone}, a path it hides (a host socket or "
                                       f"its dir), kept vanishing while it started ({SETUP_RETRIES + 1} tries); "
                                       "run the lane again"), None
            if cause:
                return "unavailable", (f"the sandbox could not start the vendor CLI ({cause}); install it where "
                                       f"its files are readable, or set vendors.{self.vendor_name}.bin to an "
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

    # verdict -----------------------------------------------------------------
    def settle(self) -> tuple[list[str], list[str], str | None]:
        """After the last turn: git's own files restored, setid bits stripped. Returns (the git files the lane
        changed, the worktree files that had setid bits, why the worktree is too large or None)."""
        # no guard: no process of the lane was started (the gate runs before any could)
        tampered = self.guard.check_and_restore() if self.guard is not None else []
        setid, too_large = _settle_files(self.plan, self.cwd, self.writable, self.req.config.limits.worktree_max_mb)
        return tampered, setid, too_large

    def verdict(self, status: str, reason: str | None) -> tuple[str, str | None]:
        """The lane's traces settled; a changed git file, setid bits, an oversized worktree or (read-only lanes) a
        changed worktree rejects the run."""
        tampered, setid, too_large = self.settle()
        about = {"run_id": self.run_id, "role": self.role, "vendor": self.vendor_name}
        if tampered:
            shown = ", ".join(tampered[:10]) + (f" (+{len(tampered) - 10} more)" if len(tampered) > 10 else "")
            self.event("lane.git_tampered", {**about, "paths": tampered[:50]})
            return "rejected", f"{MIRROR_TAMPERED}: the lane changed {shown}; restored"
        if setid:
            shown = ", ".join(setid[:10]) + (f" (+{len(setid) - 10} more)" if len(setid) > 10 else "")
            self.event("lane.setid_bits", {**about, "paths": setid[:50]})
            return "rejected", f"{SETID_BITS}: the lane left setuid/setgid files {shown}; bits removed"
        if too_large:
            return "rejected", f"{WORKTREE_TOO_LARGE}: {too_large}"
        if self.before is not None:
            changed = changed_paths(self.before, worktree_state(self.cwd))
            if changed:
                shown = ", ".join(changed[:10]) + (f" (+{len(changed) - 10} more)" if len(changed) > 10 else "")
                return "rejected", f"read-only lane changed the worktree: {shown}"
        return status, reason

    # finish ------------------------------------------------------------------
    def finish(self, status: str, reason: str | None, report: Report | None) -> LaneResult:
        """The result: recorded with its lane.finished event (under the claim), the lane's files kept, the
        vendor state of a run outside a task removed, result.json written."""
        cost_source = self._price()
        result = self._result(status, reason, report)
        if self.ledger is not None:
            self._record_result(result, cost_source)
        keep_lane_files(self.lane_dir, self.run_dir / "lane-files", self.secrets)   # no turn ran (else: gone)
        if self.req.task_id is None:         # a run outside a task: no later run can resume its vendor session
            shutil.rmtree(self.home / "vendor-state" / f"run-{self.run_dir.name}", ignore_errors=True)
        doc = result.to_json()
        if doc.get("report"):
            doc["report"] = {k: (lane_text(v, self.secrets) if isinstance(v, str) else v)
                             for k, v in doc["report"].items()}
        try:
            write_private(self.run_dir / "result.json", json.dumps(doc, indent=2, default=str))
        except OSError:
            pass
        return result

    def _price(self) -> str | None:
        """Where the cost comes from: the vendor, or (tokens only: codex, gemini) config prices: or the defaults."""
        if self.tally.cost_seen:
            return "vendor"
        from agent.domain.prices import priced_cost

        priced = priced_cost(self.vendor_name, self.model, self.tally.usage, getattr(self.req.config, "prices", None))
        if priced is None:
            return None
        self.tally.cost, cost_source = priced
        return cost_source

    def _result(self, status: str, reason: str | None, report: Report | None) -> LaneResult:
        last_res, last_out = self.tally.turns[-1] if self.tally.turns else (None, None)
        if status in REPORT_STATUSES and report is not None:
            findings, ftext, summary, lesson = report.findings, report.findings_text, report.summary, report.lesson
        else:
            findings, ftext, summary, lesson = None, "", None, None
        secrets = self.secrets
        tail = ""
        if last_out is not None:
            tail = (last_out.message or "")[-EXCERPT_CHARS:]
            if not tail.strip() and last_res is not None:
                tail = last_res.tail(EXCERPT_CHARS)
        return LaneResult(
            run_id=self.run_id, role=self.role, vendor=self.vendor_name, status=status, report=report,
            findings=findings, findings_text=lane_text(ftext, secrets),
            summary=lane_text(summary, secrets) if summary else None,
            lesson=lane_text(lesson, secrets) if lesson else None,
            session_id=strip_controls(self.tally.session_id) or None,
            exit_code=last_res.exit_code if last_res is not None else None, cost_usd=self.tally.cost,
            usage=self.tally.usage, repairs=self.repairs, reason=lane_text(reason, secrets), log_dir=self.run_dir,
            excerpt=lane_text(tail, secrets), manifest_hash=self.mhash, duration_s=time.time() - self.started)

    def _record_result(self, result: LaneResult, cost_source: str | None) -> None:
        """The outcome and its lane.finished event: one transaction, under the claim."""
        from agent.ledger.lanes import finish_run

        t = self.tally
        finish_run(self.ledger, self.run_id, {
            "status": result.status, "findings_count": result.findings, "findings_text": result.findings_text,
            "summary": result.summary, "lesson": result.lesson, "reason": result.reason,
            "session_id": result.session_id, "exit_code": result.exit_code, "cost_usd": t.cost,
            "usage": json.dumps(t.usage, sort_keys=True), "repairs": json.dumps(self.repairs, sort_keys=True)},
            {"run_id": self.run_id, "role": self.role, "vendor": self.vendor_name, "status": result.status,
             "reason": result.reason, "findings": result.findings, "repairs": len(self.repairs), "cost_usd": t.cost,
             "cost_source": cost_source, "session_id": result.session_id},
            task_id=self.req.task_id, error_id=self.req.error_id, claim_token=self.req.claim_token)

    # ledger -----------------------------------------------------------------
    def record(self, values: dict) -> None:
        if self.ledger is None or self.run_id is None:
            return
        from agent.ledger.lanes import update_run

        update_run(self.ledger, self.run_id, values, task_id=self.req.task_id, claim_token=self.req.claim_token)

    def event(self, kind: str, payload: dict) -> None:
        if self.ledger is None:
            return
        from agent.ledger.leases import claimed_tx

        # fenced like every task write: a lane whose task was taken over (lease lost) records nothing more
        task_id = self.req.task_id
        with claimed_tx(self.ledger, task_id, self.req.claim_token if task_id is not None else None) as c:
            self.ledger.event(c, kind, "lane", payload, task_id=task_id, error_id=self.req.error_id)


class _SizeWatch:
    """While a writing turn runs, the worktree's size is measured every ``WATCH_S`` seconds; past
    ``limits.worktree_max_mb`` the turn's process group is killed at once, so a lane filling the disk stops within
    seconds, and the run is rejected with the size it saw as its reason, with no repair turn (before: the reason came
    only from ``_settle_files`` after the turns, so a repair turn that truncated a file and was stopped in turn could
    leave the run "malformed")."""

    def __init__(self, cwd: Path, max_mb: int, period: float | None = None):
        self.cwd, self.max_bytes = Path(cwd), max_mb << 20
        self.period = WATCH_S if period is None else period
        self.done = threading.Event()
        self.thread: threading.Thread | None = None
        self.tripped: int | None = None          # the size that stopped the turn

    def start(self, pid: int) -> None:
        from agent.infra import proc

        started = proc.start_time(pid)
        self.thread = threading.Thread(target=self._watch, args=(pid, started), name="worktree-size", daemon=True)
        self.thread.start()

    def _watch(self, pid: int, started: int | None) -> None:
        from agent.git.workspace import walk_tree
        from agent.infra import proc

        while not self.done.wait(self.period):
            size = walk_tree(self.cwd)[0]
            if size > self.max_bytes:
                self.tripped = size
                proc.kill_group_if_same(pid, started, grace=0.5)
                return

    def stop(self) -> None:
        self.done.set()
        if self.thread is not None:
            self.thread.join(timeout=5)


def _settle_files(plan, cwd: Path, writable: bool, max_mb: int) -> tuple[list[str], str | None]:
    """After the lane: setuid/setgid bits removed from everything it could write (the worktree, its vendor state,
    ``vendors.X.writable``), and the worktree's size against ``limits.worktree_max_mb``.  Returns (the worktree
    files that had such bits, why the worktree is too large or None)."""
    from agent.git.workspace import walk_tree

    if plan is not None:
        for src in [s for s, _ in plan.over_rw] + [p for p in plan.rw if p != Path(cwd)]:
            if Path(src).is_dir() and not Path(src).is_symlink():
                walk_tree(Path(src), strip_setid=True)
    if not writable:
        return [], None
    size, setid = walk_tree(Path(cwd), strip_setid=True)
    return setid, (_too_large(size, max_mb) if size > max_mb << 20 else None)


def _too_large(size: int, max_mb: int, when: str = "") -> str:
    """Why a worktree of ``size`` bytes fails the run (after the turns, or ``when`` a turn was stopped for it)."""
    from agent.git.workspace import human_bytes

    return (f"the worktree grew to {human_bytes(size)}{' ' + when if when else ''}, past limits.worktree_max_mb "
            f"({max_mb} MB){', and the lane was stopped' if when else ''}; keep generated and downloaded files out "
            "of it")


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
        env = lane_env(vc.env, deny=secret_env_names(config))
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
