"""`agent bench` end to end, offline: a local case repository (the demo's project with its real bug), scripted
implementers as the vendors under test (the demo's playbook lanes: one fixes the bug, one makes a fix the hidden
test rejects, one also edits the hidden test's file), the demo's scripted reviewers, real git, real bubblewrap, the
local forge, each run in its own `agent bench one` process; then `agent bench report`. Killing `bench run` and
running it again re-runs nothing finished."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from agent.app.bench.cases import CaseError, load_case, load_cases
from agent.app.bench.report import summarize, wilson
from agent.app.demo import BRIEF, PLAYBOOK, error_events, make_project
from conftest import agent_bin

FIX = '    return item["price"] * item["qty"]'
HIDDEN = """diff --git a/tests/test_hidden.py b/tests/test_hidden.py
new file mode 100644
--- /dev/null
+++ b/tests/test_hidden.py
@@ -0,0 +1,9 @@
+import unittest
+
+from widgets.pricing import line_total
+
+
+class Hidden(unittest.TestCase):
+    def test_zero_qty_costs_nothing(self):
+        self.assertEqual(line_total({"price": 5, "qty": 0}), 0)
+        self.assertEqual(line_total({"price": 5}), 5)
"""


def playbook(replace: str, extra: list | None = None) -> dict:
    return {"groups": [{"summary": "Default a missing qty to one unit",
                        "edits": [{"path": "widgets/pricing.py", "find": FIX, "replace": replace}, *(extra or [])]}]}


def setup_bench(tmp_path: Path) -> tuple[Path, Path]:
    """A case repository, one case file and a vendors config with three scripted implementers."""
    project, remote = make_project(tmp_path / "repo")
    base = subprocess.run(["git", "-C", str(remote), "rev-parse", "main"], capture_output=True, text=True,
                          check=True).stdout.strip()
    books = {
        "good": playbook('    return item["price"] * item.get("qty", 1)'),
        "wrong": playbook('    return item["price"] * (item.get("qty") or 1)'),     # qty 0 costs one unit
        "cheat": playbook('    return item["price"] * item.get("qty", 1)',
                          [{"path": "tests/test_hidden.py", "create": "# nothing to see\n"}]),
    }
    py = sys.executable
    vendors = {}
    for name, book in books.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(book))
        vendors[name] = {"command": [py, "-m", "agent.app.demo_lanes.implementer", "--spec", "{spec}", "--playbook",
                                     str(path), "--cwd", "{cwd}"]}
    vendors["demo-reviewer"] = {"command": [py, "-m", "agent.app.demo_lanes.reviewer", "--spec", "{spec}", "--role",
                                            "{role}"]}
    config = {"vendors": vendors, "lanes": {r: {"vendor": "demo-reviewer", "timeout": 120}
                                            for r in ("reviewer", "pr-quality", "pr-logic")},
              "git": {"author_name": "bench", "author_email": "bench@localhost"}}
    cfg = tmp_path / "vendors.yaml"
    cfg.write_text(yaml.safe_dump(config))
    cases = tmp_path / "cases"
    cases.mkdir()
    (cases / "widgets-qty.yaml").write_text(yaml.safe_dump({
        "id": "widgets-qty", "repo": "../repo/remote.git", "base": base, "service": "widgets-api",
        "error": {"format": "jsonl", "text": error_events(1)}, "brief": BRIEF,
        "verify": {"patch": HIDDEN, "command": f"{py} -m unittest discover -s tests -q"},
        "check": f"{py} -m unittest discover -s tests -q",
        "limits": {"rounds": 2, "cost_usd": 1, "wall_s": 300}}))
    return cases, cfg


def bench(args: list[str], cfg: Path, cwd: Path, **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("AGENT_HOME", "AGENT_LEDGER_URL")}
    return subprocess.run([*agent_bin(), "--config", str(cfg), "bench", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600, **kw)


@pytest.mark.slow
def test_bench_resolves_one_catches_a_wrong_fix_and_a_lane_editing_the_hidden_test(tmp_path):
    cases, cfg = setup_bench(tmp_path)
    out = tmp_path / "out"
    proc = bench(["run", str(cases), "--vendor", "good", "--vendor", "wrong", "--vendor", "cheat", "--jobs", "3",
                  "--out", str(out)], cfg, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("[")]
    assert len(lines) == 3, proc.stdout            # one progress line per run
    results = {v: json.loads((out / "runs" / "widgets-qty" / v / "1" / "result.json").read_text())
               for v in ("good", "wrong", "cheat")}
    good, wrong, cheat = results["good"], results["wrong"], results["cheat"]
    assert good["resolved"] and good["task_state"] == "done" and good["pr"]["draft"] == 1, good
    assert good["rounds"] == 1 and good["lanes"] >= 4 and good["cost_usd"] > 0
    assert {v["verdict"] for v in good["verdicts"]} == {"approve"}
    assert 'item.get("qty", 1)' in good["diff"] and "test_hidden" not in good["diff"]
    assert not wrong["resolved"] and wrong["task_state"] == "done"
    assert wrong["why"].startswith("the hidden test fails on the agent's branch"), wrong["why"]
    assert not cheat["resolved"] and cheat["verify"]["touched_hidden"] == ["tests/test_hidden.py"]
    assert "edits the hidden test's file" in cheat["why"]
    # no lane ever saw the hidden test: it is in no spec, log or worktree of any run
    for path in (out / "runs").rglob("*"):
        written_after_the_lanes = "verify" in path.parts or path.name in ("result.json", "verify.log", "verify.err")
        if path.is_file() and path.suffix in (".md", ".log", ".stdout", ".stderr", ".json") \
                and not written_after_the_lanes:
            assert "test_zero_qty_costs_nothing" not in path.read_text(errors="replace"), path

    rep = bench(["report", str(out), "--json", "--html", str(tmp_path / "report.html")], cfg, tmp_path)
    assert rep.returncode == 0, rep.stderr
    summary = json.loads(rep.stdout)
    rates = {v["vendor"]: (v["resolved"], v["runs"]) for v in summary["vendors"]}
    assert rates == {"good": (1, 1), "wrong": (0, 1), "cheat": (0, 1)}
    page = (tmp_path / "report.html").read_text()
    assert "<svg" in page and "widgets-qty" in page
    again = bench(["run", str(cases), "--vendor", "good", "--out", str(out)], cfg, tmp_path)
    assert "done earlier (resolved)" in again.stdout, again.stdout


@pytest.mark.slow
def test_a_killed_bench_run_resumes_without_running_finished_work_again(tmp_path):
    cases, cfg = setup_bench(tmp_path)
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("AGENT_HOME", "AGENT_LEDGER_URL")}
    first = out / "runs" / "widgets-qty" / "good" / "1" / "result.json"
    p = subprocess.Popen([*agent_bin(), "--config", str(cfg), "bench", "run", str(cases), "--vendor", "good",
                          "--repeat", "2", "--out", str(out)], cwd=tmp_path, env=env, start_new_session=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while not first.exists() and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.1)
    assert first.exists(), p.stdout.read() if p.poll() is not None else "run 1 did not finish"
    os.killpg(p.pid, signal.SIGKILL)           # the whole bench, mid-way through run 2
    p.wait(30)
    before = first.read_bytes()
    lanes_before = json.loads(before)["lanes"]
    proc = bench(["run", str(cases), "--vendor", "good", "--repeat", "2", "--out", str(out)], cfg, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "widgets-qty x good #1: done earlier (resolved)" in proc.stdout, proc.stdout
    assert first.read_bytes() == before and json.loads(before)["lanes"] == lanes_before
    second = json.loads((out / "runs" / "widgets-qty" / "good" / "2" / "result.json").read_text())
    assert second["resolved"], second


@pytest.mark.parametrize("doc, error", [
    ({"id": "x"}, "repo: expected a non-empty string"),
    ({"id": "bad id!", "repo": "r", "base": "b"}, "id: 'bad id!' is not a case id"),
    ({"id": "x", "repo": "r", "base": "b", "error": "e", "verify": {"patch": "nope", "command": "c"}},
     "verify.patch: not a unified diff"),
    ({"id": "x", "repo": "r", "base": "b", "error": "e", "verify": {"patch": HIDDEN, "command": "c"},
      "limits": {"rounds": 0}}, "limits.rounds: expected a number >= 1"),
    ({"id": "x", "repo": "r", "base": "b", "error": {"format": "xml", "text": "t"}}, "error.format: expected one of"),
    ({"id": "x", "nope": 1}, "nope: unknown key"),
])
def test_case_errors_name_the_file_and_key(tmp_path, doc, error):
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(CaseError) as exc:
        load_case(path)
    assert str(exc.value).startswith(f"{path}: ") and error in str(exc.value), str(exc.value)


def test_bad_case_file_is_one_line_and_exit_1(tmp_path):
    (tmp_path / "a.yaml").write_text("id: [unclosed\n")
    proc = subprocess.run([*agent_bin(), "bench", "run", str(tmp_path / "a.yaml"), "--vendor", "codex", "--out",
                           str(tmp_path / "o")], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "AGENT_HOME": str(tmp_path)})
    assert proc.returncode == 1 and proc.stderr.startswith(f"agent: {tmp_path / 'a.yaml'}: not valid YAML at line")
    assert len(proc.stderr.strip().splitlines()) == 1
    (tmp_path / "b.yaml").write_text(yaml.safe_dump({"id": "dup", "repo": "r", "base": "b", "error": "e",
                                                     "verify": {"patch": HIDDEN, "command": "c"}}))
    (tmp_path / "c.yaml").write_text((tmp_path / "b.yaml").read_text())
    with pytest.raises(CaseError, match="ids must be unique"):
        load_cases([tmp_path / "b.yaml", tmp_path / "c.yaml"])


def test_wilson_interval_and_report_side_by_side(tmp_path):
    low, high = wilson(0, 10)
    assert low == 0 and 0.25 < high < 0.35
    low, high = wilson(10, 10)
    assert 0.65 < low < 0.75 and high == 1
    assert wilson(0, 0) == (0.0, 0.0)
    for name, won in (("before", 1), ("after", 3)):
        for n in range(1, 5):
            folder = tmp_path / name / "runs" / "case-a" / "codex" / str(n)
            folder.mkdir(parents=True)
            (folder / "result.json").write_text(json.dumps({"case": "case-a", "vendor": "codex",
                                                            "resolved": n <= won, "cost_usd": 0.5 * n,
                                                            "wall_s": 10 * n, "rounds": 1}))
    summary = summarize([tmp_path / "before", tmp_path / "after"])
    rows = {v["label"]: v for v in summary["vendors"]}
    assert rows["before:codex"]["resolved"] == 1 and rows["after:codex"]["resolved"] == 3
    assert rows["after:codex"]["median_cost_usd_resolved"] == 1.0
    assert summary["cases"]["case-a"]["after:codex"] == {"runs": 4, "resolved": 3, "why": []}


@pytest.mark.slow
def test_a_swebench_shaped_instance_imports_and_runs(tmp_path):
    """An instance in SWE-bench's shape over a local repository (the demo project): the error is captured from the
    FAIL_TO_PASS test at base with the test patch applied; the case then runs and resolves."""
    cases, cfg = setup_bench(tmp_path)
    remote = tmp_path / "repo" / "remote.git"
    base = subprocess.run(["git", "-C", str(remote), "rev-parse", "main"], capture_output=True, text=True,
                          check=True).stdout.strip()
    roots = tmp_path / "repos"
    roots.mkdir()
    subprocess.run(["git", "clone", "-q", "--bare", str(remote), str(roots / "demo__widgets")], check=True)
    instance = {"instance_id": "demo__widgets-1", "repo": "demo/widgets", "base_commit": base,
                "patch": "(the gold patch: never used)", "test_patch": HIDDEN,
                "FAIL_TO_PASS": json.dumps(["tests.test_hidden"]), "PASS_TO_PASS": json.dumps(["tests.test_pricing"]),
                "problem_statement": "line totals are wrong"}
    (tmp_path / "inst.jsonl").write_text(json.dumps(instance) + "\n")
    py = sys.executable
    imp = bench(["import", "swebench", str(tmp_path / "inst.jsonl"), "--out", str(tmp_path / "swe"),
                 "--repo-root", str(roots), "--test-command", f"{py} -m unittest -q {{tests}}"], cfg, tmp_path)
    assert imp.returncode == 0, imp.stderr + imp.stdout
    case = yaml.safe_load((tmp_path / "swe" / "demo__widgets-1.yaml").read_text())
    assert case["verify"]["patch"] == HIDDEN and case["error"]["format"] == "traceback"
    assert "KeyError: 'qty'" in case["error"]["text"]            # the FAIL_TO_PASS failure at base, captured
    assert case["verify"]["command"].endswith("tests.test_hidden tests.test_pricing")
    case["brief"] = BRIEF
    (tmp_path / "swe" / "demo__widgets-1.yaml").write_text(yaml.safe_dump(case))
    run = bench(["run", str(tmp_path / "swe"), "--vendor", "good", "--out", str(tmp_path / "o")], cfg, tmp_path)
    assert run.returncode == 0 and "demo__widgets-1 x good #1: resolved" in run.stdout, run.stdout + run.stderr


@pytest.mark.slow
@pytest.mark.vendor_cli
def test_bench_with_the_real_codex_and_claude_clis_one_resolved_one_not(tmp_path):
    """The real codex and claude CLIs (scripts/ci-vendors) as the vendors under test, against the scripted model
    server on 127.0.0.1 (tests/fakemodel): the model makes codex apply the right fix and claude a fix the hidden
    test rejects; the demo's scripted reviewers judge both."""
    from fakemodel import FakeModel, Reply
    from fakemodel.clis import MODELS, find_cli, setup_env

    bins = {}
    for cli in ("codex", "claude"):
        binary, why = find_cli(cli)
        assert binary is not None, why
        bins[cli] = binary
    fixes = {"responses": 'item.get(\\"qty\\", 1)', "messages": '(item.get(\\"qty\\") or 1)'}   # codex / claude

    def script(req):
        if not req.tool_names:
            return Reply(text="Fix qty")                      # side calls (titles)
        if req.tool_results:
            return Reply(text="STATUS: complete\nSUMMARY: default a missing qty in line_total\n")
        edit = f"sed -i 's/item\\[\"qty\"\\]/{fixes.get(req.api, fixes['responses'])}/' widgets/pricing.py"
        return Reply(shell=edit, text="STATUS: blocked\nSUMMARY: no shell tool\n")

    cases, cfg = setup_bench(tmp_path)
    config = yaml.safe_load(cfg.read_text())
    env = {k: v for k, v in os.environ.items() if k not in ("AGENT_HOME", "AGENT_LEDGER_URL")}
    with FakeModel(script) as server:
        for cli in ("codex", "claude"):
            extra = setup_env(cli, server.url, tmp_path / f"{cli}-env")
            env.update(extra)
            config["vendors"][cli] = {"bin": str(bins[cli]), "env": sorted(extra),
                                      "hosts": [server.url.split("://", 1)[1]]}   # through the egress proxy
        config["prices"] = {"fake-model": {"input": 1, "output": 2}, "claude-fake": {"input": 1, "output": 2}}
        cfg.write_text(yaml.safe_dump(config))
        out = tmp_path / "out"
        proc = subprocess.run([*agent_bin(), "--config", str(cfg), "bench", "run", str(cases), "--vendor",
                               f"codex:{MODELS['codex']}", "--vendor", f"claude:{MODELS['claude']}", "--jobs", "2",
                               "--out", str(out)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    res = {v: json.loads((out / "runs" / "widgets-qty" / f"{v}_{MODELS[v]}" / "1" / "result.json").read_text())
           for v in ("codex", "claude")}
    assert res["codex"]["resolved"], res["codex"]
    assert not res["claude"]["resolved"] and res["claude"]["task_state"] == "done", res["claude"]
    assert res["claude"]["why"].startswith("the hidden test fails"), res["claude"]["why"]
    assert res["codex"]["lanes_by_role"]["implementer"] == 1 and server.model_calls()


def test_shipped_cases_are_valid_and_name_their_upstream_fix():
    """bench/cases: real bugs from tomli and more-itertools, each verified by the upstream fix's own test (checked
    by hand against local mirrors: the hidden patch fails at base and passes at the fix commit)."""
    cases = load_cases([Path(__file__).resolve().parent.parent / "bench" / "cases"])
    assert len(cases) >= 5
    for c in cases:
        assert c.repo.startswith("https://github.com/") and len(c.base) == 40 and "/commit/" in c.source
        assert "Traceback (most recent call last)" in c.error_text and c.error_format == "traceback"
        assert c.hidden_files() and all(f.startswith("tests/") for f in c.hidden_files())


@pytest.mark.slow
def test_a_case_whose_repository_cannot_be_reached_says_so_and_the_run_goes_on(tmp_path):
    cases, cfg = setup_bench(tmp_path)
    doc = yaml.safe_load((cases / "widgets-qty.yaml").read_text())
    (cases / "unreachable.yaml").write_text(yaml.safe_dump({**doc, "id": "unreachable",
                                                            "repo": "http://127.0.0.1:9/gone.git"}))
    out = tmp_path / "out"
    proc = bench(["run", str(cases), "--vendor", "good", "--out", str(out)], cfg, tmp_path)
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if "unreachable x good" in ln)
    assert "cannot fetch http://127.0.0.1:9/gone.git" in line, proc.stdout
    assert "widgets-qty x good #1: resolved" in proc.stdout
