"""`agent bench run`: each case x vendor x repeat through the real fixer path, then verified against a hidden test.

One run is one folder, ``OUT/runs/<case>/<vendor>/<n>/``, holding its own home (SQLite ledger, config), its own
bare remote with the case's base commit, and at the end ``result.json``. A run happens in its own process
(``agent bench one``), so ``--jobs`` runs several at once and a crash costs one run only. The whole product path
runs: the error is ingested as its source delivers it, decided (the case's brief, else the vendor's decider lane),
and the fixer's scans advance the task (implementer, commit, check, reviewers, rounds, push, draft PR on the local
forge, PR reviewers) until it is done, failed or gate-blocked, or the case's wall time runs out.

Then verification, outside the fixer: the agent's branch is checked out in a folder of the run, the case's hidden
test patch (which no lane ever saw: it lives only in the case file) is applied, and ``setup`` plus
``verify.command`` run there in the same sandbox as a repository check. A run is *resolved* when a draft PR was
opened, its branch does not touch a file of the hidden patch, and the command passes.

Resumable: ``result.json`` is written last (atomically), so a finished run is never run again; a killed run finds
its home and ledger where they were and goes on (the ledger is crash-safe; see DESIGN.md "Crash safety"). A case
file changed since a run finished (another digest) is a different case: its old result is kept aside and it runs
again.
"""

from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from agent.app.bench.cases import Case, load_case

ROLES = ("implementer", "reviewer", "pr-quality", "pr-logic")
TERMINAL = ("done", "failed", "gate-blocked")
MAX_DIFF = 200_000


@dataclass(frozen=True)
class Planned:
    case: Case
    vendor: str
    n: int
    folder: Path

    @property
    def label(self) -> str:
        return f"{self.case.id} x {self.vendor} #{self.n}"


def split_vendor(spec: str) -> tuple[str, str | None]:
    """``codex`` or ``codex:gpt-5-codex`` -> (vendor, model or None)."""
    name, _, model = spec.partition(":")
    return name, (model or None)


def folder_name(spec: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in spec)


def plan(cases: list[Case], vendors: list[str], repeat: int, out: Path) -> list[Planned]:
    return [Planned(c, v, n, out / "runs" / c.id / folder_name(v) / str(n))
            for c in cases for v in vendors for n in range(1, repeat + 1)]


def finished(p: Planned) -> dict | None:
    """The run's result if it finished with this case's digest."""
    path = p.folder / "result.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("case_digest") == p.case.digest else None


def _write_json(path: Path, doc: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def progress_line(i: int, total: int, p: Planned, r: dict, skipped: bool = False) -> str:
    if skipped:
        return f"[{i}/{total}] {p.label}: done earlier ({'resolved' if r.get('resolved') else 'not resolved'})"
    what = "resolved" if r.get("resolved") else f"not resolved: {r.get('why') or 'unknown'}"
    return (f"[{i}/{total}] {p.label}: {what}; {r.get('rounds', 0)} round(s), {r.get('lanes', 0)} lane(s), "
            f"${r.get('cost_usd', 0):.2f}, {r.get('wall_s', 0):.0f} s")


def run_bench(cases: list[Case], vendors: list[str], out: Path, *, repeat: int = 1, jobs: int = 1,
              config_file: Path | None = None, echo: Callable[[str], None] = print) -> list[dict]:
    """Every planned run not finished yet, ``jobs`` at a time; a progress line per run. Returns all results."""
    out = Path(out).resolve()
    (out / "cases").mkdir(parents=True, exist_ok=True)
    for c in cases:   # the report reads ids, sources and digests from here; copies, not links
        (out / "cases" / f"{c.id}.json").write_text(json.dumps({"id": c.id, "digest": c.digest, "source": c.source,
                                                                "service": c.service, "repo": c.repo,
                                                                "base": c.base}, indent=2), encoding="utf-8")
    runs = plan(cases, vendors, repeat, out)
    total, results, count = len(runs), [], [0]

    def one(p: Planned) -> dict:
        r = finished(p)
        skipped = r is not None
        if r is None:
            r = _run_in_process(p, out, config_file)
        count[0] += 1
        echo(progress_line(count[0], total, p, r, skipped))
        return r

    if jobs <= 1:
        results = [one(p) for p in runs]
    else:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            results = list(pool.map(one, runs))
    return results


def _run_in_process(p: Planned, out: Path, config_file: Path | None) -> dict:
    """``agent bench one`` for one run in its own process (the one process runner, agent.infra.proc)."""
    from agent.infra import proc

    p.folder.mkdir(parents=True, exist_ok=True)
    stale = p.folder / "result.json"
    if stale.exists():   # finished with another version of the case: keep it aside, run again
        os.replace(stale, p.folder / f"result.{int(time.time())}.old.json")
    argv = [sys.executable, "-m", "agent", "bench", "one", str(p.case.path), "--vendor", p.vendor,
            "--dir", str(p.folder), "--cache", str(out / "cache")]
    if config_file:
        argv += ["--base-config", str(config_file)]
    env = {k: v for k, v in os.environ.items() if k not in ("AGENT_HOME", "AGENT_LEDGER_URL")}
    res = proc.run(argv, cwd=p.folder, env=env, timeout=p.case.limits.wall_s + 900,
                   stdout_path=p.folder / "run.log", stderr_path=p.folder / "run.err")
    r = finished(p)
    if r is None:
        from agent.infra.redact import redact

        tail = redact(proc.read_tail(p.folder / "run.err", 600)).strip().splitlines()
        why = tail[-1] if tail else f"exit {res.exit_code}"
        r = {"case": p.case.id, "vendor": p.vendor, "repeat": p.n, "resolved": False, "error": True,
             "why": f"the run stopped: {why[:300]}", "case_digest": p.case.digest}
    return r


# --------------------------------------------------------------------------- one run, in its own process


def _git(*args: str, cwd: Path | None = None, network: bool = False) -> str:
    from agent.git.workspace import git

    return git(*args, cwd=cwd, network=network, timeout=600)


def _mirror(case: Case, cache_dir: Path) -> Path:
    """One bare mirror of the case's repository per bench folder, shared by its runs (fetched once)."""
    import hashlib

    import fcntl

    cache = cache_dir / (hashlib.sha256(case.repo.encode()).hexdigest()[:16] + ".git")
    cache.parent.mkdir(parents=True, exist_ok=True)
    with open(cache.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)       # runs of one repository wait for the first one's clone
        if not (cache / "HEAD").exists():
            try:
                _git("clone", "--bare", "--quiet", case.repo, str(cache), network=True)
            except Exception as exc:  # noqa: BLE001 - a repository that cannot be reached is said in one line
                from agent import AgentError

                raise AgentError(f"case {case.id}: cannot fetch {case.repo}: {str(exc).splitlines()[0][:200]}") \
                    from None
    return cache


def _config(case: Case, vendor_spec: str, remote: Path, base_config: dict) -> dict:
    vendor, model = split_vendor(vendor_spec)
    cfg = {k: v for k, v in base_config.items() if k not in ("repos", "ledger")}
    check = case.check_command if not case.setup else f"{case.setup} && {case.check_command}"
    cfg["repos"] = {f"bench/{case.id}": {"url": str(remote), "base": "bench-base", "forge": "local",
                                         "services": [case.service], "check": check}}
    lanes = dict(base_config.get("lanes") or {})
    for role in ROLES + (() if case.brief else ("decider",)):
        old = lanes.get(role)
        if role in ("implementer", "decider") or old is None:
            # the vendor measured writes the fix (and the brief); reviewers named in --config stay fixed, so
            # vendors can be compared as implementers against the same reviewers
            lanes[role] = {**(old if isinstance(old, dict) else {}), "vendor": vendor}
            if model:
                lanes[role]["model"] = model
    cfg["lanes"] = lanes
    cfg["limits"] = {**(base_config.get("limits") or {}), "round_cap": case.limits.rounds,
                     "task_budget_usd": case.limits.cost_usd, "task_wall_time": case.limits.wall_s}
    if not case.brief:
        cfg["decide"] = {**(base_config.get("decide") or {}), "auto": True, "min_count": 1}
    return cfg


def _prepare(case: Case, vendor: str, folder: Path, base_config: dict, cache_dir: Path) -> dict:
    """Home, remote and decided error, once (``prepared.json`` says it happened)."""
    import shutil

    import yaml

    from agent.app.context import App
    from agent.flows.decide import decide
    from agent.intake.store import ingest_text

    marker = folder / "prepared.json"
    if marker.exists():
        return json.loads(marker.read_text(encoding="utf-8"))
    for name in ("home", "remote.git"):          # a setup killed half-way starts over
        shutil.rmtree(folder / name, ignore_errors=True)
    cache = _mirror(case, cache_dir)
    try:
        base_sha = _git("rev-parse", "--verify", "--quiet", f"{case.base}^{{commit}}", cwd=cache)
    except Exception:  # noqa: BLE001
        base_sha = ""
    if not base_sha:
        from agent import AgentError

        raise AgentError(f"case {case.id}: base {case.base!r} is not a commit of {case.repo}")
    remote = folder / "remote.git"
    _git("clone", "--bare", "--quiet", str(cache), str(remote))
    _git("update-ref", "refs/heads/bench-base", base_sha, cwd=remote)
    home = folder / "home"
    home.mkdir(parents=True, mode=0o700)
    (home / "config.yaml").write_text("# written by `agent bench`\n" + yaml.safe_dump(
        _config(case, vendor, remote, base_config), sort_keys=False), encoding="utf-8")
    app = App(home=home)
    try:
        result, _ = ingest_text(app.ledger, case.error_text, case.error_format, service=case.service,
                                actor="script", source="bench")
        if not result.error_ids:
            from agent import AgentError

            raise AgentError(f"case {case.id}: error.text holds no error event ({result.rejected} rejected)")
        error_id = result.error_ids[0]
        if case.brief:
            decide(app.ledger, app.config, error_id, "fix", brief=case.brief, decided_by="human")
    finally:
        app.close()
    state = {"error_id": error_id, "base_sha": base_sha, "started": time.time(), "elapsed_s": 0.0}
    _write_json(marker, state)
    return state


def _drive(folder: Path, state: dict, case: Case, echo: Callable[[str], None]) -> dict:
    """The scans, pass after pass, until the task ends or the wall time is spent."""
    from agent.app.context import App
    from agent.ledger.bench import run_outcome
    from agent.app.scans import run_scan

    app = App(home=folder / "home")
    began = time.monotonic()
    spent = float(state.get("elapsed_s") or 0)
    try:
        while True:
            outcome = run_outcome(app.ledger, state["error_id"])
            task = outcome["task"]
            if task and task["state"] in TERMINAL:
                break
            conclusion = outcome["conclusion"]
            if conclusion is not None and conclusion["kind"] == "skip":
                break
            if spent + time.monotonic() - began > case.limits.wall_s:
                outcome["timed_out"] = True
                break
            names = ("error-decide",) if conclusion is None and not case.brief else ()
            names += ("error-fix", "error-fix-work")
            moved = False
            for name in names:
                for item in run_scan(app, name):
                    echo(item.get("line", ""))
                    moved = True
            if conclusion is None and not case.brief and \
                    run_outcome(app.ledger, state["error_id"])["conclusion"] is None:
                outcome = run_outcome(app.ledger, state["error_id"])
                outcome["why"] = "the decider lane gave no decision"
                break
            if not moved:
                time.sleep(0.2)
            state["elapsed_s"] = spent + time.monotonic() - began
            _write_json(folder / "prepared.json", state)
    finally:
        app.close()
    state["elapsed_s"] = spent + time.monotonic() - began
    _write_json(folder / "prepared.json", state)
    return outcome


def _verify(case: Case, folder: Path, remote: Path, outcome: dict, base_sha: str, config) -> dict:
    """The hidden patch on the agent's branch, then setup + verify.command in the check sandbox."""
    import shutil

    from agent.lanes.sandbox import sandboxed_check
    from agent.git.workspace import GitError

    pr = outcome.get("pr")
    if not pr or not pr.get("head_branch"):
        return {"ran": False}
    work = folder / "verify"
    shutil.rmtree(work, ignore_errors=True)
    _git("clone", "--quiet", "--branch", pr["head_branch"], str(remote), str(work))
    head = _git("rev-parse", "HEAD", cwd=work)
    changed = [n for n in _git("diff", "--name-only", base_sha, head, cwd=work).splitlines() if n]
    diff = _git("diff", base_sha, head, cwd=work)
    touched = [f for f in case.hidden_files() if f in changed]
    patch = folder / "hidden.patch"
    patch.write_text(case.verify_patch, encoding="utf-8")
    result = {"ran": True, "head": head, "changed": changed, "touched_hidden": touched,
              "diff": diff[:MAX_DIFF], "diff_truncated": len(diff) > MAX_DIFF}
    try:
        _git("apply", "--whitespace=nowarn", str(patch), cwd=work)
    except GitError as exc:
        return {**result, "passed": False, "why": f"the hidden test patch does not apply on the agent's branch: "
                                                  f"{str(exc)[:200]}"}
    finally:
        patch.unlink()
    command = case.verify_command if not case.setup else f"{case.setup} && {case.verify_command}"
    check = sandboxed_check(config, folder / "home", work, command, folder / "verify-scratch")
    res = check(timeout=config.limits.check_timeout, stdout_path=folder / "verify.log",
                stderr_path=folder / "verify.err")
    from agent.infra.redact import redact

    return {**result, "passed": res.status == "ok", "exit_code": res.exit_code,
            "output_tail": redact(res.tail(2000))}


def run_one(case_path: Path, vendor: str, folder: Path, base_config: dict, cache_dir: Path | None = None,
            echo: Callable[[str], None] = print) -> dict:
    """One (case, vendor, repeat), start to result.json; resumes a killed one. One process at a time per run
    folder: a `bench one` left running by a killed `bench run` (it has its own process group) finishes first, and
    the next one then finds its result."""
    import fcntl

    case = load_case(case_path)
    folder = Path(folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "run.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = finished(Planned(case, vendor, 0, folder))
        return done if done is not None else _run_locked(case, vendor, folder, base_config, cache_dir, echo)


def _run_locked(case: Case, vendor: str, folder: Path, base_config: dict, cache_dir: Path | None,
                echo: Callable[[str], None]) -> dict:
    from agent.app.context import App

    state = _prepare(case, vendor, folder, base_config, Path(cache_dir or folder / "cache"))
    outcome = _drive(folder, state, case, echo)
    app = App(home=folder / "home")
    try:
        verified = _verify(case, folder, folder / "remote.git", outcome, state["base_sha"], app.config)
    finally:
        app.close()
    task = outcome.get("task") or {}
    resolved = bool(verified.get("ran") and verified.get("passed") and not verified.get("touched_hidden"))
    why = None
    if not resolved:
        if verified.get("touched_hidden"):
            why = f"the agent's change edits the hidden test's file(s): {', '.join(verified['touched_hidden'])}"
        elif verified.get("ran"):
            why = verified.get("why") or f"the hidden test fails on the agent's branch (exit {verified.get('exit_code')})"
        elif outcome.get("why"):
            why = outcome["why"]
        elif outcome.get("timed_out"):
            why = f"wall time of {case.limits.wall_s} s spent (task {task.get('state', 'not made')})"
        elif task:
            why = (f"task {task['state']}: "
                   f"{task.get('failed_reason') or task.get('blocked_reason') or 'no reason given'}")
        else:
            why = "no task was made"
    result = {"case": case.id, "vendor": vendor, "repeat": int(folder.name) if folder.name.isdigit() else 0,
              "case_digest": case.digest, "resolved": resolved, "why": why,
              "task_state": task.get("state"), "rounds": task.get("round") or 0,
              "lanes": outcome["lanes"], "lanes_by_role": outcome["lanes_by_role"],
              "cost_usd": outcome["cost_usd"], "tokens": outcome["tokens"],
              "wall_s": round(state["elapsed_s"], 1), "pr": outcome.get("pr"),
              "verdicts": outcome["gates"], "decided_by": (outcome.get("conclusion") or {}).get("decided_by"),
              "verify": {k: v for k, v in verified.items() if k != "diff"}, "diff": verified.get("diff", ""),
              "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    _write_json(folder / "result.json", result)
    return result
