"""The ledger is the boundary: no module under agent/ outside agent/ledger speaks SQL.

The check reads the AST of every .py file (so comments never count, and strings split over lines or built as
f-strings are seen whole): a string constant (an f-string with its holes filled in) that looks like an SQL
statement, a call of ``.execute``/``.executemany``/``.executescript``, or a call of the ledger's generic row
writers with a table name (``ledger.insert(c, "tasks", ...)``, ``.update``, ``.delete``) is a finding.
What a module needs from the ledger is a record operation in agent/ledger (DESIGN.md "Ledger API").
"""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
AGENT = ROOT / "agent"

# Files that may still speak SQL, each with the reason and who moves it (issue 14 emptied it: keep it so). An entry
# whose file no longer has SQL fails the test below, so the list only shrinks.
ALLOWED: dict[str, str] = {}

_KEYWORD = r"(?:SELECT|INSERT|UPDATE|DELETE|CREATE|ALTER|DROP|PRAGMA|BEGIN|COMMIT|ROLLBACK|WITH|REPLACE)"
# What an SQL statement looks like, keyword by keyword (case-insensitive; prose rarely has this shape).
_STATEMENT = re.compile(r"""^\s*(?:
      SELECT\s+(?:DISTINCT\s+)?[\w*"'(]\S*(?:.*?\bFROM\s+["\w(]|[^a-z]*$|\s+\w+\s*\()
    | INSERT\s+(?:OR\s+\w+\s+)?INTO\s+["\w]
    | REPLACE\s+INTO\s+["\w]
    | UPDATE\s+["\w]+\s+SET\s+["\w]+\s*=
    | DELETE\s+FROM\s+["\w]
    | (?:CREATE|DROP)\s+(?:UNIQUE\s+|TEMP\s+|TEMPORARY\s+)?(?:TABLE|INDEX|VIEW|TRIGGER)\b
    | ALTER\s+TABLE\s+["\w]
    | PRAGMA\s+\w+
    | (?:BEGIN|COMMIT|ROLLBACK|END)(?:\s+(?:IMMEDIATE|EXCLUSIVE|DEFERRED|TRANSACTION))?\s*;?\s*$
    | WITH\s+(?:RECURSIVE\s+)?["\w]+(?:\s*\([^)]*\))?\s+AS\s*\(
)""", re.IGNORECASE | re.VERBOSE | re.DOTALL)
# A fragment of a statement being built up (" WHERE t.state = ?", "FROM tasks t JOIN ..."): SQL's own capitals.
_FRAGMENT = re.compile(r"^\s*(?:FROM|WHERE|AND|OR|JOIN|LEFT JOIN|INNER JOIN|ORDER BY|GROUP BY|VALUES|SET|LIMIT|"
                       r"ON CONFLICT|RETURNING)\s+\S+.*(?:\?|=|\bIN\b|\bIS\b|\bJOIN\b|\bBY\b|\bAS\b)")
_DRIVER_CALLS = {"execute", "executemany", "executescript"}
_ROW_WRITERS = {"insert", "update", "delete"}


def _text(node: ast.AST) -> str | None:
    """The text of a string constant, or of an f-string with each hole as ``x``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else "x"
                       for v in node.values)
    return None


def looks_like_sql(text: str) -> bool:
    if _FRAGMENT.match(text):
        return True
    if not _STATEMENT.match(text):
        return False
    word = text.split()[0].rstrip(";")
    if word.upper() in ("BEGIN", "COMMIT", "ROLLBACK", "END"):
        return word.isupper()                 # "COMMIT" ends a transaction, "commit" is git's
    return word.isupper() or word.islower()   # "SELECT"/"select" is SQL, "Select the task from ..." is a sentence


def sql_findings(source: str, name: str = "<module>") -> list[str]:
    """Every place in ``source`` that speaks SQL, as ``name:line: what``."""
    tree = ast.parse(source, filename=name)
    found = []
    inside_fstring = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    for node in ast.walk(tree):
        if id(node) in inside_fstring:
            continue  # a piece of an f-string: judged with the whole f-string
        text = _text(node)
        if text is not None and looks_like_sql(text):
            found.append(f"{name}:{node.lineno}: SQL text {' '.join(text.split())[:70]!r}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            attr = node.func.attr
            if attr in _DRIVER_CALLS:
                found.append(f"{name}:{node.lineno}: .{attr}() call")
            elif attr in _ROW_WRITERS and len(node.args) >= 3 and _text(node.args[1]) is not None:
                found.append(f"{name}:{node.lineno}: .{attr}(conn, {_text(node.args[1])!r}, ...) row write")
    return sorted(found, key=lambda f: int(f.split(":")[1]))


def _modules() -> list[Path]:
    return sorted(p for p in AGENT.rglob("*.py") if (AGENT / "ledger") not in p.parents)


def test_no_module_outside_the_ledger_speaks_sql():
    findings = []
    for path in _modules():
        rel = path.relative_to(ROOT).as_posix()
        if rel in ALLOWED:
            continue
        findings += sql_findings(path.read_text(encoding="utf-8"), rel)
    assert not findings, ("SQL outside agent/ledger (add a record operation there instead):\n"
                          + "\n".join(findings))


def test_every_allowed_file_still_needs_its_entry():
    for rel in sorted(ALLOWED):
        path = ROOT / rel
        assert path.exists() and sql_findings(path.read_text(encoding="utf-8"), rel), \
            f"{rel} no longer speaks SQL: remove it from ALLOWED"


PLANTED = textwrap.dedent('''
    """A module someone wrote in a hurry."""
    TABLE = "tasks"

    def plain(ledger, task_id):
        return ledger.one("SELECT * FROM tasks WHERE id = ?", (task_id,))

    def split(ledger):
        return ledger.all("SELECT id, state "
                          "FROM tasks ORDER BY id")

    def fstring(ledger, table, task_id):
        return ledger.scalar(f"SELECT count(*) FROM {table} WHERE task_id = {task_id}")

    def lowercase(ledger):
        return ledger.all("select id from tasks where state = 'open'")

    def write(conn):
        conn.execute(UPSERT, ())

    UPSERT = """
        INSERT INTO cursors (source, value) VALUES (?, ?)
        ON CONFLICT(source) DO UPDATE SET value = excluded.value
    """

    def fragment(sql, state):
        return sql + " WHERE t.state = ?"

    def rows(ledger, c):
        ledger.update(c, "tasks", {"id": 1}, {"state": "done"})

    def pragma(conn):
        return conn.executescript("PRAGMA user_version = 3")

    def update_set(conn):
        return f"UPDATE {TABLE} SET state = ? WHERE id = ?"

    def clean(d, items):
        """Select the task from the list, then update the status; delete nothing."""
        d.update({"state": "done"})
        items.insert(0, "first")
        return "Select a task to start; insert coins; update your config; begin again"
''')


def test_the_checker_catches_planted_sql(tmp_path):
    module = tmp_path / "planted.py"
    module.write_text(PLANTED, encoding="utf-8")
    found = sql_findings(module.read_text(encoding="utf-8"), "planted.py")
    lines = {int(f.split(":")[1]) for f in found}
    src = PLANTED.splitlines()

    def line_of(fragment: str) -> int:
        return next(i for i, text in enumerate(src, start=1) if fragment in text)

    expected = {line_of('"SELECT * FROM tasks'), line_of('"SELECT id, state "'), line_of('f"SELECT count(*)'),
                line_of('"select id from tasks'), line_of("conn.execute(UPSERT"), line_of('UPSERT = """'),
                line_of('" WHERE t.state = ?"'), line_of('ledger.update(c, "tasks"'),
                line_of('conn.executescript("PRAGMA'), line_of('f"UPDATE {TABLE} SET')}
    assert expected <= lines, "\n".join(found)
    # ... and nothing in the clean function (English that uses the same words is not SQL)
    clean_from = line_of("def clean(")
    assert not [f for f in found if int(f.split(":")[1]) >= clean_from], found


def test_the_checker_reads_real_files_and_sees_the_ledger_speak_sql():
    """The same checker on agent/ledger finds SQL (it is not blind): the record operations are there."""
    ledger_sql = sum(len(sql_findings(p.read_text(encoding="utf-8"), p.name))
                     for p in (AGENT / "ledger").glob("*.py"))
    assert ledger_sql > 50
