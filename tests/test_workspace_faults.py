"""Issue 13 cases 2 and 5: workspace faults become visible states; a deleted mirror is cloned again and the ledger
never keeps a commit the repository lacks.

Real parts: the demo project with a real bare remote, real git mirrors and worktrees, the installed `agent` binary
as a subprocess (killed at exact points with AGENT_CRASHPOINT, the crash tests' fault injection), scripted lanes as
real subprocesses. An unreachable host is a connection refused on 127.0.0.1 (no other network is used here), not a
DNS failure.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import yaml

from chaos_support import build, check_invariants, git, run_to_end, watcher

from conftest import agent_bin, ledger_conn


def agent(home, *args):
    import os

    env = {k: v for k, v in os.environ.items() if k != "AGENT_CRASHPOINT"}
    env["AGENT_HOME"] = str(home)
    return subprocess.run([*agent_bin(), *args], env=env, capture_output=True, text=True, timeout=120)


def set_url(home, url):
    path = home / "config.yaml"
    cfg = yaml.safe_load(path.read_text())
    (name,) = cfg["repos"]
    cfg["repos"][name]["url"] = url
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return name


def db(home):
    con = ledger_conn(home)
    return con


@pytest.mark.parametrize("kind", ["missing path", "not a repository", "host refuses"])
def test_a_bad_repository_url_gate_blocks_after_3_failures_with_gits_first_line_and_the_fix(tmp_path, kind):
    p = build(tmp_path / "w", tasks=1)
    home = p["home"]
    shutil.rmtree(home / "mirrors")
    shutil.rmtree(home / "worktrees")
    con = db(home)
    con.execute("UPDATE tasks SET worktree = NULL, base_sha = NULL")  # as if the task were new
    con.commit()
    con.close()
    not_a_repo = tmp_path / "plain-folder"
    not_a_repo.mkdir()
    (not_a_repo / "README").write_text("not git\n")
    url, expected = {
        "missing path": (str(tmp_path / "no-such-repo.git"), "no-such-repo.git' does not exist"),
        "not a repository": (str(not_a_repo), "plain-folder' does not exist"),
        "host refuses": ("http://127.0.0.1:9/acme/widgets.git", "Failed to connect to 127.0.0.1"),
    }[kind]
    name = set_url(home, url)

    outs = []
    for n in range(1, 4):
        r = agent(home, "watch", "error-fix-work")
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        outs.append(r.stdout)
        con = db(home)
        events = [json.loads(e["payload"]) for e in con.execute("SELECT payload FROM events WHERE "
                                                                "kind = 'workspace.failed' ORDER BY id")]
        task = dict(con.execute("SELECT state, blocked_reason FROM tasks WHERE id = 1").fetchone())
        con.close()
        assert len(events) == n, (n, events)  # one event per failure
        assert expected in events[-1]["error"], events[-1]
        if n < 3:
            assert task["state"] != "gate-blocked", task
            assert f"({n} of 3 failures before it gate-blocks)" in r.stdout, r.stdout
    assert task["state"] == "gate-blocked", task
    reason = task["blocked_reason"]
    assert reason.startswith("workspace failed 3 times in a row: ")
    assert expected in reason and not reason.rstrip().endswith("'"), reason  # git's line, not cut to a quote
    assert f"repos.{name}.url" in reason, reason  # and the fix
    status = agent(home, "status").stdout
    assert "workspace failed 3 times in a row" in status and "agent task reset 1" in status, status

    # fixed: the human resets it and it runs to the end
    set_url(home, str(p["remote"]))
    assert agent(home, "task", "reset", "1", "--reason", "url fixed").returncode == 0
    run_to_end(home, log=tmp_path / "w.log")
    check_invariants(home, p["remote"], tasks=1)


def test_workspace_failures_limit_is_configurable(tmp_path):
    p = build(tmp_path / "w", tasks=1, limits={"workspace_failures": 1})
    home = p["home"]
    shutil.rmtree(home / "mirrors")
    shutil.rmtree(home / "worktrees")
    set_url(home, str(tmp_path / "gone.git"))
    agent(home, "watch", "error-fix-work")
    con = db(home)
    state = con.execute("SELECT state FROM tasks WHERE id = 1").fetchone()[0]
    con.close()
    assert state == "gate-blocked"


def _commits_exist(home, remote):
    """Every commit the ledger records for a task is one the remote repository holds."""
    con = db(home)
    rows = [dict(r) for r in con.execute("SELECT sha, parent FROM commits")]
    tasks = [dict(r) for r in con.execute("SELECT base_sha, head_sha, pushed_sha FROM tasks")]
    con.close()
    shas = {r["sha"] for r in rows} | {r["parent"] for r in rows} | {v for t in tasks for v in t.values()}
    for sha in filter(None, shas):
        subprocess.run(["git", "cat-file", "-e", f"{sha}^{{commit}}"], cwd=remote, check=True)
    return rows


@pytest.mark.parametrize("point,ref_kept", [("commit.recorded", True), ("commit.recorded", False),
                                            ("push.done", True)])
def test_a_deleted_mirror_is_cloned_again_and_no_lost_commit_stays_in_the_ledger(tmp_path, point, ref_kept):
    p = build(tmp_path / "w", tasks=1)
    home = p["home"]
    w = watcher(home, env={"AGENT_CRASHPOINT": point}, log=tmp_path / "crash.log")
    assert w.wait(120) == 137, (tmp_path / "crash.log").read_text()
    con = db(home)
    before = dict(con.execute("SELECT head_sha, round, round_cap FROM tasks WHERE id = 1").fetchone())
    con.close()
    assert before["head_sha"]
    # every recorded commit is on the remote's hidden ref of the task before it is recorded
    assert git(p["remote"], "rev-parse", "refs/agent/task-1") == before["head_sha"]
    if not ref_kept:  # a task from before hidden refs (or a remote that lost the ref): the commit is gone for good
        git(p["remote"], "update-ref", "-d", "refs/agent/task-1")
        git(p["remote"], "reflog", "expire", "--expire=now", "--all")
        git(p["remote"], "gc", "-q", "--prune=now")   # a clone from a local path would copy the loose object
    shutil.rmtree(home / "mirrors")  # e.g. an operator cleaning disk space
    run_to_end(home, log=tmp_path / "w.log")
    check_invariants(home, p["remote"], tasks=1)
    _commits_exist(home, p["remote"])
    con = db(home)
    kinds = [r[0] for r in con.execute("SELECT kind FROM events WHERE task_id = 1 ORDER BY id")]
    after = dict(con.execute("SELECT round, round_cap FROM tasks WHERE id = 1").fetchone())
    shas = [r[0] for r in con.execute("SELECT sha FROM commits WHERE task_id = 1 ORDER BY id")]
    con.close()
    assert "task.error" not in kinds and "workspace.failed" not in kinds
    if not ref_kept:  # the unpushed commit died with the mirror: a free round made it again
        assert kinds.count("commit.lost") == 1 and after["round_cap"] == before["round_cap"] + 1
    else:  # the worktree went on from the recorded commit, fetched from the remote: nothing lost
        assert "commit.lost" not in kinds and after["round_cap"] == before["round_cap"]
        assert before["head_sha"] in shas   # the commit recorded before the crash is still the task's
        assert git(p["remote"], "rev-parse", f"refs/heads/agent/fix-{_eid(home)}") == _head(home)
    assert git(p["remote"], "rev-parse", "refs/agent/task-1") == _head(home)


def _eid(home):
    con = db(home)
    try:
        return con.execute("SELECT error_id FROM tasks WHERE id = 1").fetchone()[0][:8]
    finally:
        con.close()


def _head(home):
    con = db(home)
    try:
        return con.execute("SELECT head_sha FROM tasks WHERE id = 1").fetchone()[0]
    finally:
        con.close()


def test_git_error_line_is_the_first_fatal_line_not_a_quote():
    from agent.git.workspace import GitError, git_error_line

    exc = GitError("git clone: '", "Cloning into bare repository 'x'...\nfatal: repository '/srv/nope' does not "
                   "exist\nhint: check the path\n'\n", 128)
    assert git_error_line(exc) == "fatal: repository '/srv/nope' does not exist"
