"""The PR proves itself (issue 32, DESIGN.md "The proof"): a test that fails on the base and passes on the head.

End to end on agent.app.demo's project with real git, the real check sandbox (bubblewrap) and scripted implementer
lanes as real subprocesses; both ledgers (``--ledger=postgres``). The pure parts (which files are tests, runner
output, matching the production error) get unit tests with real runner output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agent.domain import chain

from agent.app import demo
from agent.config import ConfigError, parse_repo_settings
from agent.ledger.proofs import proof_for_head, record_proof
from agent.flows.proof import (failing_tests, feedback, is_test_path, narrowed_command, reproduces)

from conftest import git
from test_fixer import edit_config, home, ingest_and_decide, ledger, run_until_settled, scan, script_vendor, world  # noqa: F401


def _rewrite_base(world, tmp_path: Path, files: dict[str, str | None], message: str) -> None:
    """A new commit on the remote's main (the task's base): ``files`` written (None: removed)."""
    work = tmp_path / "base-edit"
    git(tmp_path, "clone", "-q", str(world["remote"]), str(work))
    for rel, text in files.items():
        if text is None:
            (work / rel).unlink()
        else:
            (work / rel).write_text(text)
    git(work, "add", "-A")
    git(work, "-c", "user.name=t", "-c", "user.email=t@localhost", "commit", "-qm", message)
    git(work, "push", "-q", "origin", "HEAD:main")


# The demo's tests without the one that fails on the base: its base passes, so only a test the lane adds can prove.
PASSING_TESTS = demo.TESTS.replace('''    def test_missing_qty_means_one_unit(self):
        self.assertEqual(order_total([{"price": 5}]), 5)

''', "")


def passing_base(world, tmp_path, agent_config: str | None = None) -> None:
    files = {"tests/test_pricing.py": PASSING_TESTS}
    if agent_config is not None:
        files[".agent/config.yaml"] = agent_config
    _rewrite_base(world, tmp_path, files, "tests: only what passes")


def run(world, script: str, round_cap: int = 1) -> list[str]:
    def change(cfg):
        cfg["vendors"]["demo-implementer"] = script_vendor(world, "impl", script)
        cfg["limits"]["round_cap"] = round_cap

    edit_config(world, change)
    ingest_and_decide(world)
    scan(world, "error-fix")
    return run_until_settled(world)


IMPL = '''
import sys
from pathlib import Path
cwd = Path(sys.argv[2])
spec = Path(sys.argv[1]).read_text()
p = cwd / "widgets" / "pricing.py"
p.write_text(p.read_text().replace('item["qty"]', 'item.get("qty", 1)'))
{more}
print("STATUS: complete")
print("SUMMARY: default a missing qty to one unit")
'''

def adds_test(module: str, cls: str, method: str, assertion: str, indent: str = "") -> str:
    """Implementer script lines writing a new unittest module (``indent``: inside an ``if``)."""
    text = (f"import unittest\n\nfrom widgets.pricing import order_total\n\n\nclass {cls}(unittest.TestCase):\n"
            f"    def {method}(self):\n        {assertion}\n")
    return f"\n{indent}(cwd / 'tests' / '{module}').write_text({text!r})\n"


FAILING_ASSERTION = "self.assertEqual(order_total([{'price': 5}]), 5)"
ADDS_FAILING_TEST = IMPL.format(more=adds_test("test_missing_qty.py", "MissingQty",
                                               "test_line_without_qty_is_one_unit", FAILING_ASSERTION))
NO_TEST = IMPL.format(more="")
ADDS_PASSING_TEST = IMPL.format(more=adds_test(
    "test_more.py", "More", "test_two_lines",
    "self.assertEqual(order_total([{'price': 2, 'qty': 2}, {'price': 1, 'qty': 1}]), 5)"))
SKIPS_FAILING_TEST = IMPL.format(more='''
t = cwd / "tests" / "test_pricing.py"
t.write_text(t.read_text().replace("    def test_missing_qty_means_one_unit",
                                   "    @unittest.skip('flaky')\\n    def test_missing_qty_means_one_unit"))
''')
REMOVES_FAILING_TEST = IMPL.format(more='''
t = cwd / "tests" / "test_pricing.py"
t.write_text(t.read_text().replace("    def test_missing_qty_means_one_unit(self):\\n"
                                   "        self.assertEqual(order_total([{\\"price\\": 5}]), 5)\\n", ""))
''')
# Round 1 fixes without a test; round 2 (its spec carries the proof's feedback) adds the failing test.
LEARNS = IMPL.format(more='if "No test proves the fix" in spec:' + adds_test(
    "test_missing_qty.py", "MissingQty", "test_line_without_qty_is_one_unit", FAILING_ASSERTION, indent="    "))


def _task(world) -> tuple[dict, list[dict], list[str]]:
    led = ledger(world)
    try:
        t = led.one("SELECT * FROM tasks WHERE id = 1")
        proofs = led.all("SELECT * FROM proofs ORDER BY id")
        feedback = [json.loads(e["payload"]).get("feedback", "") for e in
                    led.all("SELECT payload FROM events WHERE kind = 'round.started'")]
        return t, proofs, [f for f in feedback if f]
    finally:
        led.close()


def _pr_body(world) -> str:
    from agent.app.context import App
    from agent.domain.pr_text import render_pr
    from agent.ledger.prs import pr_data_from_ledger

    app = App(home=world["home"])
    try:
        return render_pr(pr_data_from_ledger(app.ledger, 1))[1]
    finally:
        app.close()


# ---------------------------------------------------------------------------------------------- end to end


def test_added_failing_test_proves_the_fix_and_reproduces_the_error(world, tmp_path, agent_proc):
    passing_base(world, tmp_path)
    run(world, ADDS_FAILING_TEST)
    t, proofs, _ = _task(world)
    assert t["state"] == "done", t
    [p] = proofs
    assert p["verdict"] == "proven" and p["head_sha"] == t["head_sha"] and p["reproduces"] == 1
    flipped = json.loads(p["flipped"])
    assert flipped == ["tests.test_missing_qty.MissingQty.test_line_without_qty_is_one_unit"]
    assert json.loads(p["test_files"]) == ["tests/test_missing_qty.py"]
    # a known runner (unittest) with a changed Python test file: only that file ran on the base
    assert p["narrowed"] == 1 and p["command"].endswith("-m unittest tests/test_missing_qty.py")
    assert "KeyError: 'qty'" in p["base_tail"] and "line_total" in p["reproduces_why"]
    assert "/checks/" not in p["base_tail"]       # paths as in the repository, not the agent's home
    body = _pr_body(world)
    assert "**Proof:** 1 test fails on the base commit and passes with this change; the base failure " \
           "reproduces the production error." in body
    assert "**Nachweis:** 1 Test schlägt auf dem Basis-Commit fehl" in body
    assert "`tests.test_missing_qty.MissingQty.test_line_without_qty_is_one_unit`" in body
    assert "```text\n" in body.split("The base failure ends with:")[1]     # the base output is fenced
    shown = json.loads(agent_proc("task", "show", "1", "--json").stdout)
    assert shown["proof"]["proven"] and shown["proof"]["summary"].startswith("proven: 1 test fails")
    assert "(reproduces the error)" in agent_proc("task", "show", "1").stdout
    assert "(proven)" in agent_proc("status").stdout
    # the PR reviewers read the same proof
    spec = (world["home"] / "specs" / "task-1" / "review-logic-round-1.md").read_text()
    assert "# Proof" in spec and "flips: tests.test_missing_qty.MissingQty.test_line_without_qty_is_one_unit" in spec


def test_fix_without_a_test_is_sent_back_then_proven(world, tmp_path):
    passing_base(world, tmp_path)
    lines = run(world, LEARNS, round_cap=3)
    assert any("round 1: no test proves the fix" in line for line in lines), lines
    t, proofs, fb = _task(world)
    assert [p["verdict"] for p in proofs] == ["rejected", "proven"], proofs
    assert t["state"] == "done" and t["round"] == 2
    assert "No test proves the fix" in fb[0] and "the round changed no test file" in fb[0]
    assert "with only this round's test changes (the round changed no test file); it passed." in fb[0]
    spec2 = (world["home"] / "specs" / "task-1" / "round-2.md").read_text()
    assert "No test proves the fix" in spec2
    assert "It also runs it on the base commit with only your test changes" in spec2   # told up front, too
    led = ledger(world)
    try:
        steps = led.all("SELECT key, status, evidence FROM steps WHERE task_id = 1 AND key = 'local_check_pass'")
    finally:
        led.close()
    assert "proven: 1 test fails" in steps[0]["evidence"]


def test_test_that_passes_on_the_base_is_sent_back_by_name(world, tmp_path):
    passing_base(world, tmp_path)
    run(world, ADDS_PASSING_TEST)
    t, proofs, fb = _task(world)
    assert t["state"] == "failed" and "No test proves the fix" in t["failed_reason"]
    [p] = proofs
    assert p["verdict"] == "rejected" and p["reproduces"] is None
    assert json.loads(p["passed_on_base"]) == ["tests/test_more.py::test_two_lines"]
    assert "already pass on the base: tests/test_more.py::test_two_lines" in t["failed_reason"]
    led = ledger(world)
    try:
        assert led.scalar("SELECT count(*) FROM prs") == 0
    finally:
        led.close()


def test_skipping_the_failing_test_is_sent_back_by_name(world):
    run(world, SKIPS_FAILING_TEST)      # the demo's base has the failing test; the lane makes it skip
    t, proofs, _ = _task(world)
    assert t["state"] == "failed"
    [p] = proofs
    assert p["verdict"] == "rejected" and p["base_status"] == "ok"
    assert json.loads(p["skipped"]) == ["tests/test_pricing.py::test_missing_qty_means_one_unit"]
    assert "made to skip or xfail (they count as nothing): tests/test_pricing.py::test_missing_qty_means_one_unit" \
           in t["failed_reason"]


def test_removing_the_failing_test_is_sent_back_by_name(world):
    run(world, REMOVES_FAILING_TEST)
    t, proofs, _ = _task(world)
    [p] = proofs
    assert t["state"] == "failed" and p["verdict"] == "rejected"
    assert "Tests removed (they count as nothing): tests/test_pricing.py::test_missing_qty_means_one_unit" \
           in t["failed_reason"]


def test_the_demo_failing_test_at_base_proves_the_demo_fix(world):
    """The demo's project has a failing test at the base: a fix that makes it pass is proven by it."""
    run(world, NO_TEST)
    t, proofs, _ = _task(world)
    assert t["state"] == "done" and [p["verdict"] for p in proofs] == ["proven"]
    assert json.loads(proofs[0]["flipped"]) == ["test_pricing.OrderTotal.test_missing_qty_means_one_unit"]
    assert proofs[0]["narrowed"] == 0 and proofs[0]["reproduces"] == 1


def test_optional_repo_without_tests_gets_a_pr_marked_unproven(world, tmp_path, agent_proc):
    passing_base(world, tmp_path, agent_config='blocked_paths: [".github/"]\nproof: optional\n')
    run(world, NO_TEST)
    t, proofs, _ = _task(world)
    assert t["state"] == "done"
    [p] = proofs
    assert p["verdict"] == "unproven" and p["mode"] == "optional"
    body = _pr_body(world)
    assert "**Proof:** unproven: no test fails on the base commit (the repository says proof: optional)." in body
    assert "**Nachweis:** unbewiesen" in body
    assert "(unproven)" in agent_proc("status").stdout
    page = tmp_path / "status.html"
    assert agent_proc("status", "--html", str(page)).returncode == 0
    assert "<td class='proof'>unproven</td>" in page.read_text()
    assert json.loads(agent_proc("task", "show", "1", "--json").stdout)["proof"]["proven"] is False


def test_proof_off_runs_nothing_more(world, tmp_path):
    passing_base(world, tmp_path, agent_config="proof: {mode: off}\n")
    run(world, NO_TEST)
    t, proofs, _ = _task(world)
    assert t["state"] == "done" and [p["verdict"] for p in proofs] == ["off"]
    logs = sorted(p.name for p in (world["home"] / "checks" / "task-1").glob("*.log"))
    assert logs and not [n for n in logs if "proof" in n]
    assert "**Proof:** unproven: proof is off for this repository." in _pr_body(world)
    assert "on the base commit" not in (world["home"] / "specs" / "task-1" / "round-1.md").read_text()


# ---------------------------------------------------------------------------------------------- the guard


def test_a_rejected_proof_keeps_the_check_step_closed_for_everyone(ledger):
    from agent.ledger import now
    from agent.ledger.tasks import Refused, create_task, set_step, snapshot

    tid, _ = create_task(ledger, "acme/widgets", "fix it")
    head, base = "a" * 40, "b" * 40
    with ledger.tx() as c:
        ledger.update(c, "tasks", {"id": tid}, {"head_sha": head, "base_sha": base, "state": "working"})
        ledger.insert(c, "checks", {"task_id": tid, "round": 1, "passed": 1, "head_sha": head, "created_at": now()})
        for key in ("spec_written", "implementer_done", "committed"):
            ledger.update(c, "steps", {"task_id": tid, "key": key}, {"status": "ja"})
    assert "local_check_pass" in chain.next_steps(snapshot(ledger, tid))
    assert chain.close_reasons(snapshot(ledger, tid), "local_check_pass", "ja", "human", "looked") == []
    record_proof(ledger, tid, 1, head=head, base=base, mode="required", verdict="rejected", reproduces=None,
                 reproduces_why="", command="pytest", narrowed=False, lists={"test_files": []}, base_exit=0,
                 base_status="ok", base_tail="1 passed", duration_s=0.1, claim_token=None)
    assert proof_for_head(ledger, tid, head)["verdict"] == "rejected"
    with pytest.raises(Refused, match="no test proves head aaaaaaaaaaaa"):
        set_step(ledger, tid, "local_check_pass", "ja", "looked", source="human")


# ---------------------------------------------------------------------------------------------- pure parts


@pytest.mark.parametrize("path,expected", [
    ("tests/test_pricing.py", True), ("pkg/tests/helpers.py", True), ("test_x.py", True), ("a/b_test.py", True),
    ("cmd/server_test.go", True), ("web/src/cart.spec.ts", True), ("web/src/cart.test.js", True),
    ("src/__tests__/cart.jsx", True), ("conftest.py", True),
    ("widgets/pricing.py", False), ("cmd/server.go", False), ("web/src/cart.ts", False), ("testing.md", False),
    ("latest/x.py", False),
])
def test_default_test_globs(path, expected):
    assert is_test_path(path) is expected


def test_repo_globs_replace_the_defaults_and_config_is_validated():
    s = parse_repo_settings({"proof": {"mode": "optional", "tests": ["checks/**/*.py", "qa/"]}})
    assert s.proof.mode == "optional" and s.proof.tests == ("checks/**/*.py", "qa/")
    assert is_test_path("checks/a/b.py", s.proof.tests) and is_test_path("qa/x.txt", s.proof.tests)
    assert not is_test_path("tests/test_x.py", s.proof.tests)
    assert not is_test_path("tests/fixtures/data.py", ("tests/", "!tests/fixtures/"))   # gitignore's negation
    assert parse_repo_settings({"proof": "off"}).proof.mode == "off"
    assert parse_repo_settings(yaml.safe_load("proof: off")).proof.mode == "off"      # YAML 1.1: off is false
    assert parse_repo_settings(yaml.safe_load("proof: {mode: off}")).proof.mode == "off"
    assert parse_repo_settings({}).proof.mode == "required"
    with pytest.raises(ConfigError, match=r"proof: expected one of required\|optional\|off, got \"sometimes\""):
        parse_repo_settings({"proof": "sometimes"})
    with pytest.raises(ConfigError, match=r"proof.mode: expected one of"):
        parse_repo_settings({"proof": {"mode": 1}})
    with pytest.raises(ConfigError, match="proof"):
        parse_repo_settings({"proof": {"globs": ["x"]}})


def _real_output(tmp_path: Path, runner: list[str], test: str) -> str:
    (tmp_path / "test_case.py").write_text(test)
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    res = subprocess.run([sys.executable, "-m", *runner, "test_case.py"], cwd=tmp_path, capture_output=True,
                         text=True, env=env)
    return res.stdout + res.stderr


FAILING = '''import unittest


def line_total(item):
    return item["price"] * item["qty"]


class T(unittest.TestCase):
    def test_no_qty(self):
        line_total({"price": 1})

    def test_fine(self):
        pass
'''


def test_failing_tests_from_real_pytest_and_unittest_output(tmp_path):
    py = _real_output(tmp_path, ["pytest", "-q", "-p", "no:cacheprovider"], FAILING)
    assert failing_tests(py) == ["test_case.py::T::test_no_qty"]
    ut = _real_output(tmp_path, ["unittest"], FAILING)
    assert failing_tests(ut) == ["test_case.T.test_no_qty"]
    go = "=== RUN   TestTotal\n--- FAIL: TestTotal (0.00s)\n    total_test.go:9: got 0\nFAIL\n"
    assert failing_tests(go) == ["TestTotal"]


def test_reproduces_needs_the_class_and_a_frame_of_the_production_stack(tmp_path):
    out = _real_output(tmp_path, ["unittest"], FAILING)
    frames = json.dumps(["/srv/widgets/widgets/pricing.py:order_total", "/srv/widgets/widgets/pricing.py:line_total"])
    ok, why = reproduces(out, "KeyError", frames)
    assert ok and why == "KeyError in line_total (test_case.py)"
    assert reproduces(out, "ValueError", frames) == (False, "the base failure does not show ValueError")
    no, why = reproduces(out, "KeyError", ["/srv/other.py:checkout"])
    assert not no and "no frame of the production stack" in why
    # pytest's own traceback format
    pyout = _real_output(tmp_path, ["pytest", "-q", "-p", "no:cacheprovider"], FAILING)
    assert reproduces(pyout, "KeyError", frames) == (True, "KeyError in line_total")
    # a frame in the same file counts too (another function of pricing.py)
    ok, _ = reproduces('File "widgets/pricing.py", line 3, in helper\nKeyError: x', "KeyError",
                       ["/srv/w/widgets/pricing.py:line_total"])
    assert ok


def test_only_known_runners_are_narrowed():
    assert narrowed_command("python -m pytest -q", ["tests/test_a.py", "tests/conftest.py", "tests/data.json"]) \
        == "python -m pytest -p no:cacheprovider tests/test_a.py"
    assert narrowed_command("/v/bin/python -m unittest discover -s tests -q", ["tests/test_a.py"]) \
        == "/v/bin/python -m unittest tests/test_a.py"
    assert narrowed_command("pytest", ["t/test_b.py"]) == "pytest -p no:cacheprovider t/test_b.py"
    assert narrowed_command("make test", ["tests/test_a.py"]) is None
    assert narrowed_command("pytest && ruff .", ["tests/test_a.py"]) is None
    assert narrowed_command("go test ./...", ["x_test.go"]) is None


def test_base_tail_is_the_last_lines_without_control_characters():
    from agent.flows.proof import last_lines

    out = "\n".join(f"line {i}" for i in range(40)) + "\n\x1b[31mKeyError\x1b[0m: 'qty'\x07\r\n\n"
    tail = last_lines(out, 3)
    assert tail == "line 38\nline 39\nKeyError: 'qty'"


def test_feedback_says_what_ran_and_what_passed():
    from agent.flows.proof import Proof

    text = feedback(Proof(mode="required", verdict="rejected", command="pytest -q", test_files=["tests/test_a.py"],
                          passed_on_base=["tests/test_a.py::test_new"], base_status="ok"))
    assert "What ran: `pytest -q` on the base commit with only this round's test changes (tests/test_a.py); " \
           "it passed." in text
    assert "already pass on the base: tests/test_a.py::test_new." in text


def test_the_base_tree_takes_over_a_crash_leftover_and_leaves_nothing_registered(tmp_path):
    import shutil

    from agent.flows.proof import FileChange, base_tree, drop_tree

    project, remote = demo.make_project(tmp_path)
    base = git(project, "rev-parse", "HEAD")
    (project / "tests" / "test_new.py").write_text("X = 1\n")
    (project / "tests" / "test_pricing.py").unlink()
    git(project, "add", "-A")
    git(project, "-c", "user.name=t", "-c", "user.email=t@localhost", "commit", "-qm", "tests")
    git(project, "push", "-q", str(remote), "HEAD:main")
    head = git(project, "rev-parse", "HEAD")
    tree = tmp_path / "checks" / "proof-tree"
    git(remote, "worktree", "add", "-q", "--detach", str(tree), base)
    shutil.rmtree(tree)                                    # a crash: registered, folder gone
    base_tree(remote, tree, base, head, [FileChange("A", "tests/test_new.py"), FileChange("D", "tests/test_pricing.py")])
    assert (tree / "tests" / "test_new.py").read_text() == "X = 1\n"          # the head's test change
    assert not (tree / "tests" / "test_pricing.py").exists()                  # deleted at the head: gone here too
    assert 'item["qty"]' in (tree / "widgets" / "pricing.py").read_text()     # the rest is the base
    drop_tree(remote, tree)
    assert not tree.exists() and str(tree) not in git(remote, "worktree", "list")


def test_a_pytest_check_runs_only_the_new_test_module_on_the_base(world, tmp_path):
    passing_base(world, tmp_path)
    edit_config(world, lambda c: c["repos"][demo.REPO].update(check=f"{sys.executable} -m pytest -q"))
    run(world, ADDS_FAILING_TEST)
    t, proofs, _ = _task(world)
    assert t["state"] == "done", t
    [p] = proofs
    assert p["verdict"] == "proven" and p["narrowed"] == 1 and p["reproduces"] == 1
    assert p["command"] == f"{sys.executable} -m pytest -p no:cacheprovider tests/test_missing_qty.py"
    assert json.loads(p["flipped"]) == ["tests/test_missing_qty.py::MissingQty::test_line_without_qty_is_one_unit"]


def test_pr_body_fences_the_base_output_and_names_skips_beside_a_proof():
    from agent.domain.pr_text import PRData, render_body

    tail = "E   ```\n</details>\ntoken ghp_" + "a" * 36 + "\nFAILED"
    d = PRData(task_id=3, error_id="ab12", fingerprint="f", service="s", head_sha="a" * 40, brief="b",
               proof={"verdict": "proven", "flipped": ["tests/t.py::test_x"], "skipped": ["tests/t.py::test_y"],
                      "removed": [], "base_sha": "b" * 40, "command": "pytest -q", "base_exit": 1,
                      "reproduces": False, "reproduces_why": "the base failure does not show KeyError",
                      "base_tail": tail})
    body = render_body(d)
    assert "a regression test only: the base failure does not show the production error." in body
    assert "Tests this PR made to skip or xfail (they prove nothing): `tests/t.py::test_y`" in body
    assert "ghp_" not in body                                  # the PR's secret guard runs over the output too
    fenced = body.split("The base failure ends with:\n\n")[1]
    assert fenced.startswith("````text\n") and "\n````\n" in fenced   # longer than the output's own ``` run
    assert body.count("</details>") == 2 and body.index("</details>\n") < body.index("\n````\n")
