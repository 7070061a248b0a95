"""Scripted implementer: applies the next not-yet-applied edit group from a JSON playbook.

Playbook: {"groups": [{"summary": "...", "lesson": "...", "when": "text", "edits": [{"path": "...", "find": "...",
"replace": "..."}, {"path": "...", "create": "file text"}]}], "status": "complete"}
A group with ``when`` applies only when the spec contains that text.

Usage (as a `command` vendor): python -m agent.app.demo_lanes.implementer --spec {spec} --playbook FILE
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from agent.app.demo_lanes import add_pace_options, pace


def applied(edit: dict, root: Path) -> bool:
    """An edit counts as done once the text it replaces is gone (later groups may rewrite its result)."""
    path = root / edit["path"]
    if "create" in edit:
        return path.exists()
    return path.exists() and edit["find"] not in path.read_text()


def apply(edit: dict, root: Path) -> None:
    path = root / edit["path"]
    if "create" in edit:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(edit["create"])
    else:
        text = path.read_text()
        if edit["find"] not in text:
            raise SystemExit(f"playbook edit does not apply to {edit['path']}")
        path.write_text(text.replace(edit["find"], edit["replace"], 1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--playbook", required=True)
    ap.add_argument("--cwd", default=".")
    add_pace_options(ap)
    args = ap.parse_args(argv)
    with pace(args, "implementer"):
        return work(args)


def work(args) -> int:
    spec = Path(args.spec).read_text()
    book = json.loads(Path(args.playbook).read_text())
    root = Path(args.cwd)
    session = "demo-" + hashlib.sha256(args.spec.encode()).hexdigest()[:12]
    print(f"SESSION: {session}")
    print(f"read spec ({len(spec.splitlines())} lines)")
    for group in book["groups"]:
        if all(applied(e, root) for e in group["edits"]):
            continue
        if group.get("when") and group["when"] not in spec:
            continue  # a group for a request the spec does not make (e.g. a PR review comment not written yet)
        for edit in group["edits"]:
            if not applied(edit, root):
                apply(edit, root)
                print(f"edited {edit['path']}")
        print("COST: 0.01")
        print(f"STATUS: {book.get('status', 'complete')}")
        print(f"SUMMARY: {group['summary']}")
        if group.get("lesson"):
            print(f"LESSON: {group['lesson']}")
        return 0
    print("COST: 0.01")
    print("STATUS: complete")
    print("SUMMARY: nothing left to change; every playbook edit is in place")
    return 0


if __name__ == "__main__":
    sys.exit(main())
