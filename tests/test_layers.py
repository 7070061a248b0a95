"""The layers (DESIGN.md "Layers"): one package per layer, each importing only from its own layer or below, and no
import circle between files or between folders.

The check reads every import statement of every module under agent/ (top level, inside functions, under
``TYPE_CHECKING``), plus ``importlib.import_module("agent....")`` calls and registry strings such as
``"agent.flows.decide:decide_scan"`` that name a module: whatever a module can load is an arrow. A second test runs
the daemon and the demo for real and checks that the CLI layer was never imported on the way.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ledger_conn

ROOT = Path(__file__).resolve().parent.parent
AGENT = ROOT / "agent"

# Top layer first. A module belongs to the layer of the longest package prefix that names it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("cli", ("agent.cli", "agent.__main__")),
    ("app", ("agent.app",)),
    ("flows", ("agent.flows",)),
    ("adapters", ("agent.lanes", "agent.forge", "agent.intake", "agent.notify")),
    ("config", ("agent.config",)),
    ("git", ("agent.git",)),
    ("coord", ("agent.coord",)),
    ("ledger", ("agent.ledger",)),
    ("domain", ("agent.domain",)),
    ("infra", ("agent.infra", "agent")),   # "agent": the package's own __init__ (AgentError, __version__) only
]
RANK = {pkg: len(LAYERS) - i for i, (_, pkgs) in enumerate(LAYERS) for pkg in pkgs}
LAYER_NAME = {pkg: name for name, pkgs in LAYERS for pkg in pkgs}
_MODULE_STRING = re.compile(r"^(agent(?:\.\w+)+)(?::\w+)?$")


def modules(root: Path = AGENT) -> dict[str, Path]:
    """Every module under agent/, by dotted name (a package by its own name, for its __init__.py)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The module ``name`` loads: itself, else the nearest enclosing module (``agent.x.attr`` -> ``agent.x``)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def arrows(module: str, path: Path, known: dict[str, Path]) -> dict[str, int]:
    """What ``module`` imports, anywhere in the file: target module -> first line number."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: dict[str, int] = {}

    def add(name: str, line: int) -> None:
        target = _resolve(name, known)
        if target and target != module:
            found.setdefault(target, line)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                add(full if full in known else base, node.lineno)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            m = _MODULE_STRING.match(node.value)     # import_module("agent.x"), "agent.x:attr" registries
            if m and m.group(1) in known:
                add(m.group(1), node.lineno)
    return found


def layer_of(module: str) -> str:
    best = max((pkg for pkg in RANK if module == pkg or module.startswith(pkg + ".")), key=len)
    return best


def graph(root: Path = AGENT) -> tuple[dict[str, Path], dict[str, dict[str, int]]]:
    known = modules(root)
    return known, {m: arrows(m, p, known) for m, p in known.items()}


def upward(root: Path = AGENT) -> list[str]:
    known, g = graph(root)
    bad = []
    for m, targets in g.items():
        for t, line in targets.items():
            if RANK[layer_of(t)] > RANK[layer_of(m)]:
                bad.append(f"{known[m].relative_to(root.parent)}:{line}: {m} ({LAYER_NAME[layer_of(m)]}) imports "
                           f"{t} ({LAYER_NAME[layer_of(t)]}), a higher layer")
    return sorted(bad)


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        comp.append(top)
                        if top == node:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return sorted(found)


def file_circles(root: Path = AGENT) -> list[list[str]]:
    _, g = graph(root)
    return circles({m: set(t) for m, t in g.items()})


def folder_circles(root: Path = AGENT) -> list[list[str]]:
    known, g = graph(root)

    def folder(m: str) -> str:   # a package's __init__ and a module at agent/ root (__main__) stand for themselves
        return m if known[m].name == "__init__.py" or m.count(".") == 1 else m.rpartition(".")[0]

    edges: dict[str, set[str]] = {}
    for m, targets in g.items():
        for t in targets:
            if folder(t) != folder(m):
                edges.setdefault(folder(m), set()).add(folder(t))
    return circles(edges)


def test_every_module_sits_in_a_layer_package():
    loose = sorted(m for m in modules() if m.count(".") == 1 and m not in RANK and not m.endswith("__main__"))
    assert not loose, f"modules at agent/ root, in no layer: {loose}"
    assert all(layer_of(m) for m in modules())


def test_no_module_imports_a_higher_layer_even_inside_a_function():
    bad = upward()
    assert not bad, "\n".join(bad)


def test_no_import_circle_between_files():
    found = file_circles()
    assert not found, "\n".join(" <-> ".join(c) for c in found)


def test_no_import_circle_between_folders():
    found = folder_circles()
    assert not found, "\n".join(" <-> ".join(c) for c in found)


# The checks above must be able to fail: the same reader on a small package with every kind of wrong arrow.
BAD_TREE = {
    "agent/__init__.py": "",
    "agent/infra/__init__.py": "",
    "agent/infra/proc.py": "def run():\n    from agent.ledger import tasks   # upward, inside a function\n",
    "agent/ledger/__init__.py": "",
    "agent/ledger/tasks.py": "from agent.ledger import lanes\n",
    "agent/ledger/lanes.py": "import importlib\nM = importlib.import_module('agent.ledger.tasks')\n",
    "agent/app/__init__.py": "",
    "agent/app/scans.py": "SCANS = {'x': 'agent.flows.a:scan'}\n",
    "agent/flows/__init__.py": "",
    "agent/flows/a.py": "from agent.flows.sub import b\n",
    "agent/flows/sub/__init__.py": "",
    "agent/flows/sub/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from agent.flows import a\n",
    "agent/loose.py": "",
}


@pytest.fixture
def bad_tree(tmp_path):
    for rel, text in BAD_TREE.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path / "agent"


def test_the_checks_see_every_kind_of_bad_arrow(bad_tree):
    assert upward(bad_tree) == ["agent/infra/proc.py:2: agent.infra.proc (infra) imports agent.ledger.tasks "
                                "(ledger), a higher layer"]
    assert file_circles(bad_tree) == [["agent.flows.a", "agent.flows.sub.b"],
                                      ["agent.ledger.lanes", "agent.ledger.tasks"]]
    assert folder_circles(bad_tree) == [["agent.flows", "agent.flows.sub"]]
    known, g = graph(bad_tree)
    assert "agent.flows.a" in g["agent.app.scans"]          # a registry string is an arrow
    assert "agent.loose" in known and layer_of("agent.loose") == "agent"


CHILD = r"""
import json, sys
from pathlib import Path
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
print(json.dumps(sorted(m for m in sys.modules if m == "agent.cli" or m.startswith("agent.cli."))))
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
