"""Builders and checks shared by the crash, chaos and concurrency tests (and scripts/chaos).

Everything is real: the demo project (agent/app/demo.py) with a bare git remote, N distinct errors decided `fix`,
scripted lanes run as subprocesses through the `command` vendor, `agent watch error-fix-work` run as a real
process in its own process group so a test can SIGKILL it (and only it: lanes run in their own groups).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from conftest import ledger_conn

ROOT = Path(__file__).resolve().parent.parent
TERMINAL = ("done", "failed", "gate-blocked")


def agent_bin() -> list[str]:
    exe = Path(sys.executable).parent / "agent"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "agent"]


def build(root: Path, tasks: int = 1, lane_args: tuple[str, ...] = (), forge: str = "local",
          github_api_url: str | None = None, limits: dict | None = None, api_url: str | None = None,
          repo: str | None = None) -> dict:
    """Demo project + remote + config + ``tasks`` distinct errors decided fix + `watch error-fix` run once
    (``repo``: the repository key in config, default the demo's)."""
    from agent.app.context import App
    from agent.app.scans import run_scan
    from agent.flows.decide import decide
    from agent.app.demo import BRIEF, PLAYBOOK, error_events, make_project, write_config
    from agent.intake.store import ingest_text

    root.mkdir(parents=True, exist_ok=True)
    project, remote = make_project(root)
    playbook = root / "playbook.json"
    playbook.write_text(json.dumps(PLAYBOOK))
    home = root / "home"
    write_config(home, remote, playbook, lane_args=lane_args, forge=forge, github_api_url=github_api_url,
                 api_url=api_url, limits={"prs_per_hour": 1000, "open_drafts_per_repo": 1000, **(limits or {})},
                 **({"repo": repo} if repo else {}))
    app = App(home=home)
    try:
        ingest_text(app.ledger, error_events(tasks, distinct=True), "auto", actor="script", source="test")
        errors = app.ledger.all("SELECT id FROM errors ORDER BY created_at, id")
        assert len(errors) == tasks, f"expected {tasks} distinct errors, got {len(errors)}"
        for e in errors:
            decide(app.ledger, app.config, e["id"], "fix", brief=BRIEF, decided_by="human")
        run_scan(app, "error-fix")
        assert app.ledger.scalar("SELECT count(*) FROM tasks") == tasks
    finally:
        app.close()
    return {"root": root, "home": home, "remote": remote, "project": project, "playbook": playbook}


def watcher(home: Path, env: dict | None = None, jobs: int = 1, log: Path | None = None,
            command: tuple[str, ...] = ("watch", "error-fix-work")) -> subprocess.Popen:
    """Start `agent watch error-fix-work` as a real process leading its own process group."""
    full = {k: v for k, v in os.environ.items() if k != "AGENT_CRASHPOINT"}
    full.update({"AGENT_HOME": str(home), **(env or {})})
    out = open(log, "ab") if log else subprocess.DEVNULL
    try:
        args = [*agent_bin(), "--home", str(home), *command]
        if command[0] == "watch":
            args += ["--jobs", str(jobs)]
        return subprocess.Popen(args, env=full, stdout=out, stderr=subprocess.STDOUT if log else subprocess.DEVNULL,
                                start_new_session=True, cwd=str(ROOT))
    finally:
        if log:
            out.close()


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the watcher's whole process group and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)


def open_tasks(home: Path) -> int:
    c = ledger_conn(home)
    try:
        return c.execute("SELECT count(*) FROM tasks WHERE state IN ('open', 'working')").fetchone()[0]
    finally:
        c.close()


def run_to_end(home: Path, env: dict | None = None, passes: int = 20, jobs: int = 1,
               log: Path | None = None, timeout: float = 120) -> int:
    """Run the watcher to completion until no task is open/working; returns the passes used."""
    for n in range(1, passes + 1):
        p = watcher(home, env=env, jobs=jobs, log=log)
        assert p.wait(timeout) == 0, f"watcher exited {p.returncode}; see {log}"
        if open_tasks(home) == 0:
            return n
        time.sleep(0.05)  # an orphaned lane of a killed watcher may still be finishing
    raise AssertionError(f"tasks still open after {passes} passes: {open_tasks(home)}")


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def remote_sha(remote: Path, branch: str) -> str | None:
    out = git(remote, "ls-remote", str(remote), f"refs/heads/{branch}")
    return out.split()[0] if out else None


def check_invariants(home: Path, remote: Path, tasks: int, sim=None, require_done: bool = True,
                     homes: list[Path] | None = None) -> list[dict]:
    """The exactly-once guarantees, asserted from the ledger, the remote, the forge and the PR files (written by the
    local forge into the home of the runner that opened the PR: one of ``homes`` when several share the ledger)."""
    from agent.domain import chain

    con = ledger_conn(home)
    try:
        assert not isinstance(con, sqlite3.Connection) or \
            con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        rows = [dict(r) for r in con.execute("SELECT * FROM tasks ORDER BY id")]
        assert len(rows) == tasks, f"{len(rows)} tasks for {tasks} errors"
        assert len({r["error_id"] for r in rows}) == tasks, "two tasks for one error"
        now = time.time()
        for t in rows:
            tid = t["id"]
            # no claim left past its lease (a finished run releases; a killed one leaves a dead pid or expires)
            assert t["claim_token"] is None or (t["lease_until"] or 0) >= now, f"task {tid}: stale claim {t}"
            if require_done:
                assert t["state"] == chain.DONE, f"task {tid} is {t['state']}: {t['failed_reason'] or t['blocked_reason']}"
            else:
                assert t["state"] in TERMINAL + ("open", "working"), t["state"]
            if t["state"] != chain.DONE:
                continue
            # one PR per task, in the ledger and on the forge
            prs = [dict(r) for r in con.execute("SELECT * FROM prs WHERE task_id = ?", (tid,))]
            assert len(prs) == 1, f"task {tid}: {len(prs)} prs rows"
            pr = prs[0]
            assert pr["head_branch"] == t["branch"] and pr["state"] == "open" and pr["draft"] == 1
            if pr["forge"] == "local":
                local = con.execute("SELECT number, head, head_sha FROM local_prs WHERE head = ?",
                                    (t["branch"],)).fetchall()
                assert len(local) == 1, f"task {tid}: {len(local)} local PRs on {t['branch']}"
                assert local[0]["number"] == pr["number"]
                mds = [h / "prs" / f"{pr['repo'].replace('/', '-')}-{pr['number']}.md" for h in homes or [home]]
                assert any(md.exists() for md in mds), mds
            if sim is not None:
                on_sim = sim.pulls(t["branch"])
                assert len(on_sim) == 1, f"task {tid}: {len(on_sim)} PRs on the GitHub simulator"
                assert on_sim[0]["number"] == pr["number"] and on_sim[0]["draft"] is True
            # one commit per round, all on the branch, nothing else on it; the pushed branch is the head
            commits = [dict(r) for r in con.execute("SELECT round, sha, parent FROM commits WHERE task_id = ? "
                                                    "ORDER BY id", (tid,))]
            assert len(commits) == len({c["round"] for c in commits}), f"task {tid}: two commits in a round"
            assert len(commits) == len({c["sha"] for c in commits})
            assert t["head_sha"] == commits[-1]["sha"] == t["pushed_sha"]
            assert remote_sha(remote, t["branch"]) == t["head_sha"]
            # every recorded commit is reachable from the task's hidden ref on the remote (pushed before recorded)
            hidden = git(remote, "rev-parse", f"refs/agent/task-{tid}")
            assert hidden == t["head_sha"], f"task {tid}: hidden ref {hidden} vs head {t['head_sha']}"
            chain_shas = git(remote, "rev-list", "--reverse", f"{t['base_sha']}..{t['branch']}").split()
            assert chain_shas == [c["sha"] for c in commits], f"task {tid}: branch {chain_shas} vs {commits}"
            assert pr["head_sha"] == t["head_sha"]
        return rows
    finally:
        con.close()


def lane_launches(home: Path) -> dict[tuple[int, int, str], int]:
    """Lane runs per (task, round, role) that were not superseded (interrupted rows are the re-run's own)."""
    con = ledger_conn(home)
    try:
        out: dict[tuple[int, int, str], int] = {}
        for tid, rnd, role, n in con.execute("SELECT task_id, round, role, count(*) FROM lane_runs WHERE status "
                                             "!= 'interrupted' GROUP BY task_id, round, role"):
            out[(tid, rnd, role)] = n
        return out
    finally:
        con.close()


def wait_for(pred, timeout: float = 30.0) -> bool:
    """Poll ``pred`` until it is true (True) or ``timeout`` seconds passed (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return False


def read_log(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def chaos(root: Path, tasks: int = 5, kills: int = 8, seed: int | None = None, sim=None,
          kill_window: tuple[float, float] = (0.3, 1.5), sleep: str = "0.02:0.25", echo=print) -> dict:
    """SIGKILL `agent watch error-fix-work` (its whole group) at random moments across a batch of tasks, restart,
    repeat ``kills`` times, then run it to the end and check every invariant. Returns a summary."""
    import random

    seed = seed if seed is not None else random.SystemRandom().randrange(1 << 30)
    echo(f"chaos seed={seed} tasks={tasks} kills={kills} forge={'github-sim' if sim else 'local'}")
    rnd = random.Random(seed)
    lanes_log = root / "lanes.log"
    env = {"GITHUB_TOKEN": "sim-token-not-secret"} if sim else {}
    p = build(root / "w", tasks=tasks, lane_args=("--sleep", sleep, "--seed", str(seed), "--log", str(lanes_log)),
              forge="github" if sim else "local", github_api_url=sim.url if sim else None)
    home = p["home"]
    started = time.monotonic()
    killed = 0
    for i in range(kills):
        if open_tasks(home) == 0:
            break
        w = watcher(home, env=env, jobs=rnd.choice((1, 2, 3)), log=root / "watch.log")
        delay = rnd.uniform(*kill_window)
        try:
            w.wait(delay)
            echo(f"  pass {i + 1}: watcher finished before the kill at {delay:.2f}s")
        except subprocess.TimeoutExpired:
            kill_group(w)
            killed += 1
            echo(f"  pass {i + 1}: SIGKILL after {delay:.2f}s; open tasks {open_tasks(home)}")
    passes = run_to_end(home, env=env, passes=60, jobs=2, log=root / "watch.log")
    rows = check_invariants(home, p["remote"], tasks, sim=sim)
    summary = {"seed": seed, "tasks": tasks, "killed": killed, "final_passes": passes,
               "states": sorted({r["state"] for r in rows}), "rounds": [r["round"] for r in rows],
               "lane_runs": sum(lane_launches(home).values()), "seconds": round(time.monotonic() - started, 1)}
    echo(f"chaos ok: {summary}")
    return summary


def lane_host_pid(home: Path, timeout: float = 10.0) -> int:
    """The running lane's pid as this host sees it (the ledger records its sandbox's pid; the lane itself logs its
    pid inside its own PID namespace)."""
    end = time.monotonic() + timeout
    while True:
        con = ledger_conn(Path(home))
        try:
            row = con.execute("SELECT pid FROM lane_runs WHERE status = 'running' AND pid IS NOT NULL "
                              "ORDER BY id DESC LIMIT 1").fetchone()
        finally:
            con.close()
        if row or time.monotonic() > end:
            return row[0] if row else 0
        time.sleep(0.05)


def share_ledger(p: dict) -> Path | None:
    """Move the built home's SQLite ledger next to the homes and link it back, so several runner homes (each with
    its own mirrors, worktrees, locks and logs) share one ledger file, as runners on one machine would."""
    if os.environ.get("AGENT_LEDGER_URL"):
        return None   # PostgreSQL (--ledger=postgres): every home and every runner process uses it already
    shared = Path(p["root"]) / "shared-ledger.db"
    own = Path(p["home"]) / "ledger.db"
    if not shared.exists():
        own.rename(shared)
        own.symlink_to(shared)
    return shared


def add_home(p: dict, name: str) -> Path:
    """Another runner home: the same config.yaml, its own everything else, the shared ledger (``share_ledger``)."""
    import shutil

    shared = share_ledger(p)
    home = Path(p["root"]) / name
    home.mkdir(mode=0o700)
    shutil.copy(Path(p["home"]) / "config.yaml", home / "config.yaml")
    if shared is not None:
        (home / "ledger.db").symlink_to(shared)
    return home


# one round per task: the scripted reviewer approves a change without a leftover print() (the runners chaos test and
# scripts/bench-runners)
ONE_ROUND = {"groups": [{"summary": "Default a missing qty to one unit in line_total",
                         "edits": [{"path": "widgets/pricing.py", "find": '    return item["price"] * item["qty"]',
                                    "replace": '    return item["price"] * item.get("qty", 1)'}]}]}


def runner_homes(root: Path, runners: int, tasks: int, sleep: str = "2", log: Path | None = None) -> tuple[dict, list]:
    """A batch of ``tasks`` one-round tasks whose lanes sleep ``sleep`` seconds, and ``runners`` homes on one shared
    ledger (the first is the one the batch was built in)."""
    lane_args = ("--sleep", sleep) + (("--log", str(log)) if log else ())
    p = build(root, tasks=tasks, lane_args=lane_args)
    p["playbook"].write_text(json.dumps(ONE_ROUND))
    share_ledger(p)
    homes = [p["home"]] + [add_home(p, f"runner-{i + 1}") for i in range(1, runners)]
    return p, homes


def runner(home: Path, log: Path | None = None, jobs: int = 1, interval: float = 0.2,
           env: dict | None = None) -> subprocess.Popen:
    """A real `agent daemon` for ``home`` in its own process group."""
    return watcher(home, env=env, log=log, command=("daemon", "--interval", str(interval), "--jobs", str(jobs)))


def count_done(home: Path) -> int:
    c = ledger_conn(Path(home))
    try:
        return c.execute("SELECT count(*) FROM tasks WHERE state = 'done'").fetchone()[0]
    finally:
        c.close()


def stop_runners(procs: list[subprocess.Popen]) -> None:
    """SIGTERM every live runner (the running step finishes), SIGKILL what does not stop within 30 s."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            kill_group(proc)


class CuttableProxy:
    """A real TCP proxy on 127.0.0.1 in front of the PostgreSQL server, for an outage a test can place exactly:
    ``cut()`` drops every open connection and refuses new ones (what a runner sees when the server stops or the
    network goes), ``restore()`` lets them through again. ``url(url)`` is the same URL through the proxy."""

    def __init__(self, host: str, port: int):
        import socket
        import threading

        self.target = (host, port)
        self.up = True
        self.lock = threading.Lock()
        self.conns: list = []
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, url: str) -> str:
        from urllib.parse import urlsplit, urlunsplit

        parts = urlsplit(url)
        netloc = parts.netloc.rsplit("@", 1)
        auth = netloc[0] + "@" if len(netloc) == 2 else ""
        return urlunsplit(parts._replace(netloc=f"{auth}127.0.0.1:{self.port}"))

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            if not self.up:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src, dst) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass

    def cut(self) -> None:
        import socket

        self.up = False
        with self.lock:
            conns, self.conns = self.conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass

    def restore(self) -> None:
        self.up = True

    def close(self) -> None:
        self.cut()
        self.server.close()


def faketime_env(skew_s: float) -> dict:
    """The environment that runs a process with its clock ``skew_s`` seconds off (libfaketime, Debian's
    `faketime`, installed by scripts/ci-faketime); AssertionError naming the installer when it is missing."""
    import glob

    import tempfile

    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    assert found, "libfaketime is not installed: run scripts/ci-faketime (Debian package faketime)"
    # The wall clock is faked, the monotonic one is not (timeouts and waits stay true). libfaketime 0.9.10 then
    # fails clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME), which Python's time.sleep uses, with EINVAL: the
    # skewed Python process sleeps on a condition variable instead (a sitecustomize on its PYTHONPATH). Lanes and
    # git never see LD_PRELOAD (lane environments keep only PATH, HOME, USER, LANG, TERM, TMPDIR, TZ).
    site = Path(tempfile.mkdtemp(prefix="agent-faketime-"))
    (site / "sitecustomize.py").write_text("import threading, time\n"
                                           "time.sleep = lambda seconds: threading.Event().wait(seconds)\n")
    return {"LD_PRELOAD": found[0], "FAKETIME": f"{skew_s:+.0f}", "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}


def runners_chaos(root: Path, server, runners: int = 3, tasks: int = 6, sleep: str = "1", skew_s: float = 300.0,
                  db_stop_s: float = 30.0, log=print) -> dict:
    """N real `agent daemon` runners on one PostgreSQL ledger (``server``: tests/pgserver.PgServer, whose URL is
    in AGENT_LEDGER_URL), the last one with its clock ``skew_s`` seconds off (libfaketime); once lanes are
    running the server is stopped for ``db_stop_s`` seconds, then started again. Asserts: every task done with one
    PR, no (task, round, role) lane run twice (interrupted runs included), no claim ever taken from a live
    holder (no ``task.claim_reclaimed``), the skewed runner flagged. Returns the measures."""
    p, homes = runner_homes(root, runners=runners, tasks=tasks, sleep=sleep)
    started = time.monotonic()
    procs = [runner(h, log=root / f"runner-{i + 1}.log", env=faketime_env(skew_s) if i == runners - 1 and skew_s
                    else None) for i, h in enumerate(homes)]
    stopped_for = 0.0
    try:
        def lanes_running() -> bool:
            c = ledger_conn(homes[0])
            try:
                return c.execute("SELECT count(*) FROM lane_runs WHERE status = 'running' AND pid IS NOT NULL"
                                 ).fetchone()[0] > 0
            finally:
                c.close()

        assert wait_for(lanes_running, 120), (root / "runner-1.log").read_text()[-2000:]
        if db_stop_s:
            t0 = time.monotonic()
            server.pause()
            log(f"chaos: ledger server stopped for {db_stop_s:.0f}s")
            time.sleep(db_stop_s)
            server.resume()
            stopped_for = time.monotonic() - t0
            log(f"chaos: ledger server back after {stopped_for:.1f}s")
        assert wait_for(lambda: count_done(homes[0]) == tasks, 300), \
            [(root / f"runner-{i + 1}.log").read_text()[-2000:] for i in range(runners)]
        seconds = time.monotonic() - started
    finally:
        stop_runners(procs)
    check_invariants(homes[0], p["remote"], tasks, homes=homes)
    c = ledger_conn(homes[0])
    try:
        runs = c.execute("SELECT task_id, round, role, count(*) FROM lane_runs GROUP BY task_id, round, role"
                         ).fetchall()
        reclaimed = c.execute("SELECT count(*) FROM events WHERE kind = 'task.claim_reclaimed'").fetchone()[0]
        skewed = c.execute("SELECT id, clock_offset_s FROM runners WHERE home = ?",
                           (str(homes[-1].resolve()),)).fetchone()
    finally:
        c.close()
    crashed = {f"runner-{i + 1}": pr.returncode for i, pr in enumerate(procs) if pr.returncode not in (0, None)}
    assert not crashed, f"runners that did not stop cleanly: {crashed}"
    twice = [tuple(r) for r in runs if r[3] != 1]
    assert not twice, f"lanes run more than once: {twice}"
    assert reclaimed == 0, f"{reclaimed} claim(s) taken from a holder that never released them"
    if skew_s:
        assert skewed is not None and abs(float(skewed[1]) - skew_s) < 30, skewed
    lines = {h.name: len((root / f"runner-{i + 1}.log").read_text().splitlines()) for i, h in enumerate(homes)}
    return {"seconds": seconds, "stopped_for": stopped_for, "lanes": len(runs), "log_lines": lines}
