"""Scripted reviewer: approves a non-empty diff without leftover debug output; otherwise lists findings.

It reads the review spec (which holds the diff) and never writes a file.
Usage (as a `command` vendor): python -m agent.app.demo_lanes.reviewer --spec {spec} [--role {role}]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from agent.app.demo_lanes import add_pace_options, pace


def review(spec: str) -> list[str]:
    m = re.search(r"# The diff against the base branch\n\n(`{3,})diff\n(.*?)\n\1", spec, re.S)
    diff = m.group(2) if m else ""
    files = re.findall(r"^diff --git a/(\S+)", diff, re.M)
    findings = []
    if not files:
        findings.append("the diff is empty: nothing was fixed")
    if re.search(r"^\+.*\bprint\(", diff, re.M):
        findings.append("leftover print() call in the change")
    return findings


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--role", default="reviewer")
    add_pace_options(ap)
    args = ap.parse_args(argv)
    with pace(args, args.role):
        return work(args)


def work(args) -> int:
    findings = review(Path(args.spec).read_text())
    print("SESSION: demo-review")
    print("COST: 0.005")
    print(f"reviewed as {args.role}")
    print("STATUS: complete")
    if findings:
        print("FINDINGS:")
        for f in findings:
            print(f"- {f}")
    else:
        print("FINDINGS: none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
