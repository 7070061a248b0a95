"""Shared helpers for lane tests: a scripted command-vendor agent (a real Python subprocess),
a real git repo, a real ledger.  Nothing is mocked: the 'agent' is a small script that follows
a plan file the test writes, one entry per turn."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

FAKE_AGENT = r'''
import argparse, json, os, sys, time
from pathlib import Path

ap = argparse.ArgumentParser()
ap.add_argument("--plan", required=True)
ap.add_argument("--spec")
ap.add_argument("--cwd")
ap.add_argument("--role")
ap.add_argument("--session")
ap.add_argument("--note")
args, _ = ap.parse_known_args()

plan_path = Path(args.plan)
plan = json.loads(plan_path.read_text())
calls = plan_path.with_suffix(".calls.jsonl")
n = sum(1 for _ in open(calls)) if calls.exists() else 0
turn = plan["turns"][min(n, len(plan["turns"]) - 1)]
record = {"n": n, "argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ),
          "spec": Path(args.spec).read_text() if args.spec else None,
          "note": Path(args.note).read_text() if args.note else None, "session": args.session}
with open(calls, "a") as fh:
    fh.write(json.dumps(record) + "\n")

if "expect_session" in turn and args.session != turn["expect_session"]:
    print(f"wrong session {args.session!r}")
    sys.exit(2)
for rel, content in turn.get("edit", {}).items():
    p = Path(args.cwd or os.getcwd()) / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(content)
if turn.get("session"):
    print(f"SESSION: {turn['session']}", flush=True)
for line in turn.get("progress", []):
    print(line, flush=True)
if turn.get("sleep"):
    time.sleep(turn["sleep"])
text = turn.get("print", "")
for name in turn.get("echo_env", []):
    text = text.replace("{" + name + "}", os.environ.get(name, ""))
sys.stdout.write(text)
if turn.get("cost") is not None:
    print(f"\nCOST: {turn['cost']}")
sys.exit(turn.get("exit", 0))
'''


class FakeAgent:
    """A scripted command-vendor agent.  ``turns`` is a list of dicts (see FAKE_AGENT)."""

    def __init__(self, tmp: Path, name: str = "fake"):
        self.dir = tmp / f"agent-{name}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.script = self.dir / "fake_agent.py"
        self.script.write_text(FAKE_AGENT)
        self.plan = self.dir / "plan.json"
        self.calls_path = self.plan.with_suffix(".calls.jsonl")
        self.name = name

    def set(self, *turns: dict) -> "FakeAgent":
        self.plan.write_text(json.dumps({"turns": list(turns)}))
        if self.calls_path.exists():
            self.calls_path.unlink()
        return self

    @property
    def calls(self) -> list[dict]:
        if not self.calls_path.exists():
            return []
        return [json.loads(line) for line in self.calls_path.read_text().splitlines() if line.strip()]

    def command(self) -> list[str]:
        return [sys.executable, str(self.script), "--plan", str(self.plan), "--spec", "{spec}", "--cwd", "{cwd}",
                "--role", "{role}"]

    def resume(self) -> list[str]:
        return [sys.executable, str(self.script), "--plan", str(self.plan), "--cwd", "{cwd}", "--role", "{role}",
                "--session", "{session}", "--note", "{note}"]

    def vendor_config(self, resume: bool = True, env: list[str] | None = None) -> dict:
        d = {"command": self.command(), "writable": [str(self.dir)]}   # it logs its calls next to its plan
        if resume:
            d["resume"] = self.resume()
        if env:
            d["env"] = env
        return d


def make_repo(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    run = lambda *a: subprocess.run(["git", *a], cwd=path, check=True, capture_output=True)  # noqa: E731
    run("init", "-q", "-b", "main")
    run("config", "user.email", "t@example.invalid")
    run("config", "user.name", "t")
    (path / "app.py").write_text("def total(cart):\n    return sum(cart['items'])\n")
    (path / ".gitignore").write_text("__pycache__/\n")
    run("add", ".")
    run("commit", "-q", "-m", "init")
    return path


def make_config(vendors: dict, lanes: dict | None = None, limits: dict | None = None, **extra):
    from agent.config import parse_config

    return parse_config({"vendors": vendors, "lanes": lanes or {}, "limits": limits or {}, **extra})


def report_impl(summary: str = "Guarded the missing key.") -> str:
    return f"Edited app.py.\n\nSTATUS: complete\nSUMMARY: {summary}\nLESSON: carts can be empty\n"


def report_review(findings: list[str] | None = None) -> str:
    if not findings:
        return "Reviewed.\n\nSTATUS: complete\nFINDINGS: none\n"
    return "Reviewed.\n\nSTATUS: complete\nFINDINGS:\n" + "".join(f"- {f}\n" for f in findings)
