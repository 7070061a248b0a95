"""Layering: the daemon and the demo run scans through ``agent.app.scans``, below the CLI layer; neither imports
``agent.cli`` (the CLI) to do it."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ledger_conn

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys
from pathlib import Path
import agent.app.daemon, agent.app.demo
from agent.app.context import App
from agent.app.daemon import run_daemon
from agent.app.demo import run_demo

root = Path(sys.argv[1])
run_demo(root / "demo", echo=lambda s: None)          # every scan the demo runs, to a draft PR
app = App(home=root / "demo" / "home")
try:
    run_daemon(app, interval=0, max_ticks=1, echo=lambda s: None)   # one pass of every scan in the registry
finally:
    app.close()
print(json.dumps(sorted(m for m in sys.modules if m == "agent.cli" or m.startswith("agent.cli.")
                        or m == "agent.cli")))
"""


def test_the_daemon_and_the_demo_run_every_scan_without_the_cli_layer(tmp_path):
    r = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True, timeout=300,
                       cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == []
    # and the demo really ran: its task is done with a draft PR

    con = ledger_conn(tmp_path / "demo" / "home")
    try:
        assert con.execute("SELECT state FROM tasks WHERE id = 1").fetchone()[0] == "done"
        assert con.execute("SELECT count(*) FROM prs WHERE task_id = 1").fetchone()[0] == 1
    finally:
        con.close()


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("module", ["app/daemon.py", "app/demo.py", "app/scans.py", "flows/fixer"])
def test_no_import_of_the_cli_layer_even_inside_a_function(module):
    """The run above sees only the paths it took; this reads every import statement, lazy ones included."""
    target = ROOT / "agent" / module
    files = sorted(target.rglob("*.py")) if target.is_dir() else [target]
    bad = {f"{f.relative_to(ROOT)}: {name}" for f in files for name in _imports(f)
           if name == "agent.cli" or name.startswith("agent.cli.")}
    assert not bad, sorted(bad)
