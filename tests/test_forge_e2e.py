"""End to end on GitLab and on Gitea/Forgejo: error in -> draft MR/PR -> merged or closed follow-up.

Everything real: the demo project with a real bug and a bare git remote, errors ingested and decided, scripted
lanes run as subprocesses through the command vendor, `agent watch error-fix-work` and `agent watch pr-merged`
as real processes talking HTTP to the forge simulator on 127.0.0.1 (tests/forge_sim), which checks every call
against the forge's API schema and reads branch heads from the same bare remote the agent pushes to.  The
human side (merge, close) is the simulator's own methods.
"""

from __future__ import annotations

import sqlite3

import pytest

from chaos_support import build, check_invariants, run_to_end, watcher
from forge_sim.gitea import GiteaSim
from forge_sim.gitlab import GitlabSim

REPO = "demo/widgets"
TOKENS = {"gitlab": "glpat-e2e-" + "x" * 12, "gitea": "gta-e2e-" + "y" * 12}


class View:
    """The simulator's PRs in the shape chaos_support.check_invariants reads (number, draft)."""

    def __init__(self, forge: str, sim):
        self.forge, self.sim = forge, sim

    def pulls(self, branch: str) -> list[dict]:
        if self.forge == "gitlab":
            return [{"number": m["iid"], "draft": m["title"].startswith("Draft: "), "sha": m["sha"],
                     "title": m["title"], "body": m["description"]} for m in self.sim.mrs(REPO, branch)]
        return [{"number": p["number"], "draft": p["title"].startswith("WIP: "), "sha": p["head_sha"],
                 "title": p["title"], "body": p["body"]} for p in self.sim.pulls(REPO, branch)]


def _sim(forge: str):
    if forge == "gitlab":
        return GitlabSim(token=TOKENS[forge])
    return GiteaSim(token=TOKENS[forge])


def _db(home):
    con = sqlite3.connect(home / "ledger.db", timeout=30)
    con.row_factory = sqlite3.Row
    return con


@pytest.mark.slow
@pytest.mark.parametrize("forge", ["gitlab", "gitea"])
def test_error_to_draft_then_merged_and_closed_follow_up(tmp_path, forge, monkeypatch):
    with _sim(forge) as sim:
        p = build(tmp_path / "w", tasks=2, forge=forge, api_url=sim.url)
        home, remote = p["home"], p["remote"]
        if forge == "gitlab":
            sim.add_project(REPO, remote=remote)
        else:
            sim.add_repo(REPO, remote=remote)
        env = {f"{forge.upper()}_TOKEN": TOKENS[forge]}
        run_to_end(home, env=env, log=tmp_path / "run.log")
        view = View(forge, sim)
        rows = check_invariants(home, remote, tasks=2, sim=view)    # one draft per task, head == pushed branch

        con = _db(home)
        prs = {r["task_id"]: dict(r) for r in con.execute("SELECT * FROM prs")}
        for t in rows:
            [on_forge] = view.pulls(t["branch"])
            assert on_forge["sha"] == t["head_sha"] == prs[t["id"]]["head_sha"]
            assert on_forge["body"] == prs[t["id"]]["body"] and f"<!-- agent-task: {t['id']} -->" in on_forge["body"]
            assert on_forge["title"] == ("Draft: " if forge == "gitlab" else "WIP: ") + prs[t["id"]]["title"]
            assert prs[t["id"]]["forge"] == forge
        con.close()

        # review feedback and CI on the draft the agent opened, read through the forge its config builds
        # (the scan that turns them into a round is issue 15's `agent watch pr-feedback`)
        from agent.config import load_config
        from agent.forge import get_forge

        merged, closed = rows[0], rows[1]
        number, head = prs[merged["id"]]["number"], merged["head_sha"]
        if forge == "gitlab":
            sim.set_access(REPO, "alice", 40)
            sim.diff_note(REPO, number, "alice", "widgets/pricing.py", 3, "a missing qty should mean 1")
            sim.add_status(REPO, head, "test", "failed", "1 test failed")
        else:
            sim.set_permission(REPO, "alice", "write")
            sim.review(REPO, number, "alice", "REQUEST_CHANGES", "see inline",
                       comments=(("widgets/pricing.py", 3, "a missing qty should mean 1"),))
            sim.add_status(REPO, head, "ci/test", "failure", "1 test failed")
        monkeypatch.setenv(f"{forge.upper()}_TOKEN", TOKENS[forge])
        cfg = load_config(home / "config.yaml")
        f = get_forge(cfg.repos[REPO], cfg, home)
        page = f.feedback(number)
        inline = [i for i in page.items if i.kind == "inline"]
        assert [(i.author, i.path, i.line) for i in inline] == [("alice", "widgets/pricing.py", 3)]
        assert f.has_write_access("alice") and not f.has_write_access("mallory")
        assert [r.state for r in f.ci_results(head) if r.kind == "status"] == ["failure"]

        # a human merges the first and closes the second; the follow-up scan sees both
        sim.merge(REPO, prs[merged["id"]]["number"])
        sim.close(REPO, prs[closed["id"]]["number"])
        w = watcher(home, env=env, log=tmp_path / "follow.log", command=("watch", "pr-merged"))
        assert w.wait(120) == 0, (tmp_path / "follow.log").read_text()[-2000:]

        con = _db(home)
        state = {r["id"]: (r["state"], r["failed_reason"]) for r in con.execute("SELECT * FROM tasks")}
        errors = {r["id"]: r["state"] for r in con.execute("SELECT * FROM errors")}
        pr_state = {r["task_id"]: r["state"] for r in con.execute("SELECT * FROM prs")}
        assert pr_state == {merged["id"]: "merged", closed["id"]: "closed"}
        assert state[merged["id"]][0] == "done" and errors[merged["error_id"]] == "resolved"
        assert errors[closed["error_id"]] == "skipped"        # never proposed again
        assert state[closed["id"]][0] == "failed" and "closed without merge" in state[closed["id"]][1]
        pruned = [r["payload"] for r in con.execute("SELECT payload FROM events WHERE kind = 'pr.branch_pruned'")]
        assert len(pruned) == 1 and closed["branch"] in pruned[0]
        con.close()

        # the token reached the forge and nothing else: not the ledger, not a log, not a lane's spec
        token = TOKENS[forge].encode()
        for path in home.rglob("*"):
            if path.is_file():
                assert token not in path.read_bytes(), path
        assert token not in (tmp_path / "run.log").read_bytes()
        sim.assert_clean()


@pytest.mark.slow
@pytest.mark.parametrize("forge", ["gitlab", "gitea"])
def test_killed_right_after_the_create_call_then_resumed_adopts_the_one_draft(tmp_path, forge):
    """`AGENT_CRASHPOINT=pr.created` ends the watcher with 137 after the forge created the draft and before the
    ledger knows it; the next run finds it by its branch and adopts it: one MR/PR, never two."""
    with _sim(forge) as sim:
        p = build(tmp_path / "w", tasks=1, forge=forge, api_url=sim.url)
        home, remote = p["home"], p["remote"]
        if forge == "gitlab":
            sim.add_project(REPO, remote=remote)
        else:
            sim.add_repo(REPO, remote=remote)
        env = {f"{forge.upper()}_TOKEN": TOKENS[forge]}
        w = watcher(home, env={**env, "AGENT_CRASHPOINT": "pr.created"}, log=tmp_path / "crash.log")
        assert w.wait(120) == 137, (tmp_path / "crash.log").read_text()[-2000:]
        con = _db(home)
        branch = con.execute("SELECT branch FROM tasks").fetchone()[0]
        assert con.execute("SELECT count(*) FROM prs").fetchone()[0] == 0
        con.close()
        view = View(forge, sim)
        assert len(view.pulls(branch)) == 1
        run_to_end(home, env=env, log=tmp_path / "resume.log")
        check_invariants(home, remote, tasks=1, sim=view)
        con = _db(home)
        kinds = [r[0] for r in con.execute("SELECT kind FROM events")]
        con.close()
        assert "pr.adopted" in kinds and "pr.created" not in kinds
        creates = [c for c in sim.calls if c.method == "POST" and c.path.endswith(("/merge_requests", "/pulls"))]
        assert len(creates) == 1
        sim.assert_clean()
