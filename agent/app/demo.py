"""`agent demo`: the whole path on an embedded example project, offline, ending in a draft PR.

It makes a small real project with a real bug and a failing test, a local bare remote and a config; ingests an
error event; decides it; and runs the fixer with scripted stand-in lanes (``agent/app/demo_lanes``). The scripted
reviewer rejects round 1 (a leftover debug print) so a second round shows; then a reviewer asks for a change on the
draft PR and `watch pr-feedback` starts a third round on the same PR, which replies there. The tests use the same
builder.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

SERVICE = "widgets-api"
REPO = "demo/widgets"

PRICING = '''"""Order pricing for the widgets shop."""


def line_total(item):
    return item["price"] * item["qty"]


def order_total(items):
    """Total of an order. A line without "qty" means one unit."""
    return sum(line_total(item) for item in items)
'''

TESTS = '''import unittest

from widgets.pricing import order_total


class OrderTotal(unittest.TestCase):
    def test_quantities(self):
        self.assertEqual(order_total([{"price": 2, "qty": 3}, {"price": 1, "qty": 1}]), 7)

    def test_missing_qty_means_one_unit(self):
        self.assertEqual(order_total([{"price": 5}]), 5)


if __name__ == "__main__":
    unittest.main()
'''

PLAYBOOK = {
    "groups": [
        {"summary": "Default a missing qty to one unit in line_total",
         "edits": [{"path": "widgets/pricing.py", "find": '    return item["price"] * item["qty"]',
                    "replace": '    print("debug: pricing", item)\n    return item["price"] * item.get("qty", 1)'}]},
        {"summary": "Remove the leftover debug print from line_total",
         "lesson": "widgets-api: order lines may omit qty; it means one unit",
         "edits": [{"path": "widgets/pricing.py", "find": '    print("debug: pricing", item)\n', "replace": ""}]},
        # only when a reviewer asks for it on the PR (the spec quotes their comment): the demo's third round
        {"summary": "Name the default quantity DEFAULT_QTY, as the PR review asked",
         "when": "DEFAULT_QTY",
         "edits": [{"path": "widgets/pricing.py",
                    "find": '\n\ndef line_total(item):\n    return item["price"] * item.get("qty", 1)',
                    "replace": '\nDEFAULT_QTY = 1  # an order line without "qty" is one unit\n\n\n'
                               'def line_total(item):\n    return item["price"] * item.get("qty", DEFAULT_QTY)'}]},
        # only when the PR's CI reports a failing ci/tests: a test that pins the constant
        {"summary": "Pin DEFAULT_QTY with a test, as the failing ci/tests check asked",
         "when": "ci/tests",
         "edits": [{"path": "tests/test_pricing.py",
                    "find": '        self.assertEqual(order_total([{"price": 5}]), 5)\n\n\n',
                    "replace": '        self.assertEqual(order_total([{"price": 5}]), 5)\n\n'
                               '    def test_default_qty_is_one(self):\n'
                               '        from widgets.pricing import DEFAULT_QTY\n\n'
                               '        self.assertEqual(DEFAULT_QTY, 1)\n\n\n'}]},
    ],
}

REVIEW_COMMENT = "Please name the default quantity: a DEFAULT_QTY constant instead of the bare 1."

BRIEF = ("order_total raises KeyError 'qty' when an order line has no qty. The docstring says a missing qty means "
         "one unit. Look at line_total in widgets/pricing.py.")


def error_events(n: int = 3, distinct: bool = False) -> str:
    """JSONL error events as a service would log them (different requests, same bug).

    ``distinct=True`` gives each event its own error class (KeyErrorA, KeyErrorB, ...), so ``n`` events become
    ``n`` errors and ``n`` tasks (the crash and concurrency tests use a batch of tasks on the one project)."""
    lines = []
    for i in range(n):
        cls = "KeyError" + ("".join(chr(65 + int(d)) for d in str(i)) if distinct else "")
        stack = ("Traceback (most recent call last):\n"
                 f'  File "/srv/widgets/app.py", line {40 + i}, in checkout\n'
                 "    total = order_total(cart.items)\n"
                 '  File "/srv/widgets/widgets/pricing.py", line 9, in order_total\n'
                 "    return sum(line_total(item) for item in items)\n"
                 '  File "/srv/widgets/widgets/pricing.py", line 5, in line_total\n'
                 '    return item["price"] * item["qty"]\n'
                 f"{cls}: 'qty'")
        lines.append(json.dumps({
            "service": SERVICE, "environment": "production", "level": "error",
            "message": f"{cls}: 'qty' (request {1000 + i}, user demo{i}@example.com)", "class": cls,
            "stack": stack, "timestamp": f"2026-11-30T10:0{i}:00Z"}))
    return "\n".join(lines) + "\n"


def _git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "demo", "GIT_AUTHOR_EMAIL": "demo@localhost",
           "GIT_COMMITTER_NAME": "demo", "GIT_COMMITTER_EMAIL": "demo@localhost"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


def make_project(root: Path) -> tuple[Path, Path]:
    """A real project with a bug and a failing test, pushed to a local bare remote. Returns (project, remote)."""
    project = root / "project"
    (project / "widgets").mkdir(parents=True)
    (project / "tests").mkdir()
    (project / "widgets" / "__init__.py").write_text("")
    (project / "widgets" / "pricing.py").write_text(PRICING)
    (project / "tests" / "__init__.py").write_text("")
    (project / "tests" / "test_pricing.py").write_text(TESTS)
    (project / ".gitignore").write_text("__pycache__/\n*.pyc\n")
    (project / ".agent").mkdir()
    (project / ".agent" / "config.yaml").write_text('blocked_paths: [".github/"]\n')
    _git(project, "init", "-q", "-b", "main")
    _git(project, "add", "-A")
    _git(project, "commit", "-qm", "widgets: order pricing")
    remote = root / "remote.git"
    _git(root, "clone", "-q", "--bare", str(project), str(remote))
    return project, remote


def agent_command() -> str:
    """How the user can call agent again: `agent` if that is on PATH, else the path they used."""
    import shutil

    argv0 = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if argv0.endswith("__main__.py") or not argv0:
        return f"{shlex.quote(sys.executable)} -m agent"
    on_path = shutil.which("agent")
    if on_path and os.path.realpath(on_path) == os.path.realpath(argv0):
        return "agent"
    return shlex.quote(argv0) if os.path.basename(argv0) == "agent" else "agent"


def check_command() -> str:
    return f"{shlex.quote(sys.executable)} -m unittest discover -s tests -q"


def write_config(home: Path, remote: Path, playbook: Path, implementer_status: str | None = None,
                 lane_args: tuple[str, ...] = (), limits: dict | None = None, forge: str = "local",
                 github_api_url: str | None = None, api_url: str | None = None, repo: str = REPO) -> Path:
    """The demo config. ``lane_args`` are appended to both scripted lanes (e.g. ``--sleep 0.1:0.4 --log F``),
    ``limits`` are merged over the demo's, ``forge`` with ``api_url`` (or ``github_api_url``) point the repo at
    another forge (github, gitlab or gitea), ``repo`` is the repository key."""
    py = sys.executable
    impl = [py, "-m", "agent.app.demo_lanes.implementer", "--spec", "{spec}", "--playbook", str(playbook),
            "--cwd", "{cwd}", *lane_args]
    rev = [py, "-m", "agent.app.demo_lanes.reviewer", "--spec", "{spec}", "--role", "{role}", *lane_args]
    config = {
        "repos": {repo: {"url": str(remote), "base": "main", "forge": forge, "services": [SERVICE],
                         "check": check_command()}},
        "vendors": {"demo-implementer": {"command": impl}, "demo-reviewer": {"command": rev}},
        "lanes": {"implementer": {"vendor": "demo-implementer", "timeout": 60},
                  "reviewer": {"vendor": "demo-reviewer", "timeout": 60},
                  "pr-quality": {"vendor": "demo-reviewer", "timeout": 60},
                  "pr-logic": {"vendor": "demo-reviewer", "timeout": 60}},
        "limits": {"round_cap": 5, "repair": 1, **(limits or {})},
        "git": {"author_name": "agent demo", "author_email": "agent-demo@localhost"},
    }
    if github_api_url:
        config["github"] = {"api_url": github_api_url}
    if api_url and forge in ("github", "gitlab", "gitea"):
        config[forge] = {"api_url": api_url}
    from agent.lanes.sandbox import bwrap_path

    if bwrap_path() is None:
        # the demo's lanes are its own scripted stand-ins (trusted code, no model): on a machine without
        # bubblewrap they run unsandboxed so the demo still works; run_demo says so.  Real lanes never do this.
        config["sandbox"] = "none"
    if "--log" in lane_args:       # the lanes append to that log from inside their sandbox
        folder = str(Path(lane_args[lane_args.index("--log") + 1]).resolve().parent)
        for vendor in config["vendors"].values():
            vendor["writable"] = [folder]
    import yaml

    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = home / "config.yaml"
    path.write_text("# written by `agent demo`: scripted stand-in lanes, local forge, local bare remote\n"
                    + yaml.safe_dump(config, sort_keys=False))
    return path


def setup(root: Path) -> dict:
    """Project, remote, playbook, home and config under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    if any(root.iterdir()):
        from agent import AgentError

        raise AgentError(f"{root} is not empty; pass an empty or new --dir")
    project, remote = make_project(root)
    playbook = root / "playbook.json"
    playbook.write_text(json.dumps(PLAYBOOK, indent=2))
    home = root / "home"
    write_config(home, remote, playbook)
    return {"root": root, "project": project, "remote": remote, "home": home, "playbook": playbook}


def _review_round(app, task: dict, pr: dict, echo, max_passes: int) -> None:
    """A reviewer asks for a change on the draft PR; `watch pr-feedback` starts round 3 on the same PR."""
    from agent.forge.local import LocalForge, local_user
    from agent.ledger.tasks import active_task_ids
    from agent.app.scans import run_scan

    forge = LocalForge(app.ledger, app.home, REPO)
    forge.add_review(int(pr["number"]), local_user(), "changes_requested", "",
                     [("widgets/pricing.py", 5, REVIEW_COMMENT)])
    echo(f"a reviewer ({local_user()}) requests a change on PR #{pr['number']}, widgets/pricing.py line 5: "
         f"{REVIEW_COMMENT}")
    for item in run_scan(app, "pr-feedback"):
        echo(item["line"])
    for _ in range(max_passes):
        for item in run_scan(app, "error-fix-work"):
            echo(item["line"])
        if not active_task_ids(app.ledger):
            break


def run_demo(root: Path, echo=print, max_passes: int = 8) -> dict:
    from agent.app.context import App
    from agent.flows.decide import decide
    from agent.intake.store import ingest_text
    from agent.ledger.errors import first_error
    from agent.ledger.prs import demo_pr
    from agent.ledger.tasks import active_task_ids, first_task
    from agent.app.scans import run_scan

    started = time.monotonic()
    paths = setup(root)
    home = paths["home"]
    echo(f"demo project with a bug and a failing test: {paths['project']}")
    echo(f"local bare remote: {paths['remote']}")
    app = App(home=home)
    if getattr(app.config, "sandbox", "bwrap") == "none":
        echo("bubblewrap is not installed: the demo's own scripted lanes run without a sandbox "
             "(real lanes need it: apt-get install bubblewrap)")
    try:
        result, fmt = ingest_text(app.ledger, error_events(), "auto", actor="script", source="demo")
        echo(f"ingested 3 error events ({fmt}): {result.new} new error, {result.deduplicated} deduplicated")
        error = first_error(app.ledger)
        decide(app.ledger, app.config, error["id"], "fix", brief=BRIEF, decided_by="human")
        echo(f"decided error {error['id'][:8]} (seen {error['count']}x): fix")
        for line in (i["line"] for i in run_scan(app, "error-fix")):
            echo(line)
        for _ in range(max_passes):
            items = run_scan(app, "error-fix-work")
            for item in items:
                echo(item["line"])
            if not active_task_ids(app.ledger):
                break
        task = first_task(app.ledger)
        pr = demo_pr(app.ledger, task["id"])
        if pr and task["state"] == "done":
            _review_round(app, task, pr, echo, max_passes)
            task = first_task(app.ledger)
            pr = demo_pr(app.ledger, task["id"])
        from agent.ledger.proofs import proof_for_head, summary
        from agent.ledger.tasks import find_task

        proof = summary(proof_for_head(app.ledger, task["id"], find_task(app.ledger, task["id"])["head_sha"]))
    finally:
        app.close()
    h = shlex.quote(str(home))
    me = agent_command()
    echo("")
    echo(f"task {task['id']}: {task['state']} after {task['round']} round(s) in {time.monotonic() - started:.1f}s")
    if pr:
        echo(f"draft PR: {pr['url']} (branch {pr['head_branch']} at {pr['head_sha'][:12]})")
    echo(f"proof: {proof}")   # the demo's failing test at the base flips (DESIGN.md "The proof")
    echo("look next:")
    echo(f"  {me} --home {h} status")
    echo(f"  {me} --home {h} task show {task['id']}")
    echo(f"  {me} --home {h} pr show {task['id']}")
    echo(f"  {me} --home {h} events --task {task['id']}")
    echo(f"  git -C {shlex.quote(str(paths['remote']))} log --oneline main..{pr['head_branch'] if pr else 'HEAD'}")
    return {"task": task, "pr": pr, "proof": proof, **{k: str(v) for k, v in paths.items()}}
