"""The PR proves itself (DESIGN.md "The proof"): a test that fails on the base and passes on the head.

After the head's check passed, the round's change is split into test files (``proof.tests`` globs of the
repository's own config, else ``DEFAULT_TESTS``) and the rest. The check runs once more, in the same sandbox, on a
tree at the base commit with only the test changes applied: it must fail. The tests that failed there are the
proof (the head's check passed, so they flip). A round whose base run passes is sent back, naming the new or
changed tests that passed on the base, tests made to skip and failing tests removed. Where the check is a runner
we know (pytest, unittest) and the round changed Python test files, only those files run on the base.

Pure helpers (globs, names in a diff, runner output, matching the production error) are plain functions; ``prove``
takes the check runner as a parameter (the fixer's sandboxed ``check_argv`` + ``proc.run``).
"""

from __future__ import annotations

import functools
import json
import re
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Callable

from agent.ledger.proofs import summary  # noqa: F401  (the one wording of a proof, shared with the ledger reads)

# What a test file looks like, per language, in gitignore's syntax: "tests/" is a folder anywhere, "test_*.py" a
# file name anywhere.
DEFAULT_TESTS: tuple[str, ...] = (
    "tests/", "test/", "__tests__/", "spec/", "testdata/",
    "test_*.py", "*_test.py", "conftest.py",
    "*_test.go",
    "*.spec.ts", "*.test.ts", "*.spec.tsx", "*.test.tsx", "*.spec.js", "*.test.js", "*.spec.jsx", "*.test.jsx",
    "*.spec.mjs", "*.test.mjs",
    "*Test.java", "*Tests.java", "*Test.kt", "*_spec.rb", "*_test.rb", "*Test.php", "*_test.exs",
)
NAMES_MAX = 50
TAIL_LINES = 25

PROVEN, UNPROVEN, REJECTED, OFF = "proven", "unproven", "rejected", "off"


# ------------------------------------------------------------------ which files are tests


@functools.lru_cache(maxsize=64)
def _spec(globs: tuple[str, ...]):
    import pathspec  # gitignore's syntax, which is what people already write for "these files"

    return pathspec.GitIgnoreSpec.from_lines(globs or DEFAULT_TESTS)


def is_test_path(path: str, globs: tuple[str, ...] = DEFAULT_TESTS) -> bool:
    """Whether ``path`` is a test file: ``globs`` are gitignore lines (``tests/`` a folder anywhere, ``test_*.py``
    a file name anywhere, ``a/**/b.py`` from the top, ``!`` excludes); empty means the defaults."""
    return _spec(tuple(globs)).match_file(path)


@dataclass(frozen=True)
class FileChange:
    status: str          # A | M | D | T
    path: str


def changed_files(git: Callable[..., str], base: str, head: str) -> list[FileChange]:
    """Every file changed from ``base`` to ``head`` (renames off: a move is a delete and an add)."""
    raw = git("diff", "--raw", "-z", "--no-renames", "--no-ext-diff", "--no-textconv", base, head)
    parts = raw.split("\0")
    out = []
    for i in range(0, len(parts) - 1, 2):
        if parts[i].startswith(":"):
            out.append(FileChange(parts[i].split(" ")[4][:1], parts[i + 1]))
    return out


# ------------------------------------------------------------------ test names in a diff

TEST_DEF = re.compile(r"^\s*(?:async\s+)?def\s+(test\w*)|^\s*func\s+(Test\w+)|^\s*class\s+(\w*Test\w*)\b"
                      r"|^\s*(?:it|test)(?:\.\w+)?\s*\(\s*['\"`]([^'\"`]{1,120})")
SKIP = re.compile(r"@pytest\.mark\.(?:skip|skipif|xfail)\b|@unittest\.(?:skip\w*|expectedFailure)\b"
                  r"|\bskipTest\(|\bpytest\.(?:skip|xfail|importorskip)\(|raise\s+(?:unittest\.)?SkipTest\b"
                  r"|\bt\.Skip(?:Now|f)?\(|\b(?:it|test|describe)\.(?:skip|todo)\(|\bx(?:it|test|describe)\(")


def _def_name(line: str) -> str | None:
    m = TEST_DEF.match(line)
    return next((g for g in m.groups() if g), None) if m else None


def enclosing_test(lines: list[str], n: int) -> str | None:
    """The test a 1-based line ``n`` belongs to: its own definition, the one a decorator above it marks, or the
    nearest test definition above it (not a class)."""
    if not 0 < n <= len(lines):
        return None
    own = _def_name(lines[n - 1])
    if own:
        return own
    if lines[n - 1].lstrip().startswith("@"):
        for line in lines[n:n + 6]:
            name = _def_name(line)
            if name:
                return name
            if not line.lstrip().startswith("@"):
                break
    for line in reversed(lines[:n - 1]):
        name = _def_name(line)
        if name and not line.lstrip().startswith("class"):
            return name
    return None


@dataclass
class DiffNames:
    changed: list[str] = field(default_factory=list)    # tests added or edited ("file::name")
    skipped: list[str] = field(default_factory=list)    # tests a skip/xfail marker was added to
    removed: list[str] = field(default_factory=list)    # tests defined on the base and gone at the head


def _hunks(diff: str) -> dict[str, tuple[list[tuple[int, str]], list[str]]]:
    """path -> (added lines with their head line numbers, removed lines) of a ``-U0`` diff."""
    files: dict[str, tuple[list[tuple[int, str]], list[str]]] = {}
    path, new_no = None, 0
    for line in diff.splitlines():
        if line.startswith("+++ "):
            path = line[6:] if line.startswith("+++ b/") else None
            if path is not None:
                files.setdefault(path, ([], []))
        elif line.startswith("--- "):
            old = line[6:] if line.startswith("--- a/") else None
            path = old
            if old is not None:
                files.setdefault(old, ([], []))
        elif line.startswith("@@"):
            m = re.match(r"@@ -\d+(?:,\d+)? \+(\d+)", line)
            new_no = int(m.group(1)) if m else 0
        elif path is not None and line.startswith("+"):
            files[path][0].append((new_no, line[1:]))
            new_no += 1
        elif path is not None and line.startswith("-"):
            files[path][1].append(line[1:])
    return files


def diff_names(git: Callable[..., str], base: str, head: str, paths: list[str]) -> DiffNames:
    """Which tests the round's test changes add or edit, make skip, or remove."""
    out = DiffNames()
    if not paths:
        return out
    diff = git("diff", "-U0", "--no-color", "--no-ext-diff", "--no-textconv", "--no-renames", base, head, "--",
               *paths)
    for path, (added, removed) in _hunks(diff).items():
        try:
            lines = git("show", f"{head}:{path}").splitlines()
        except Exception:  # deleted at the head
            lines = []
        now_defined = {n for n in (_def_name(ln) for ln in lines) if n}
        for no, text in added:
            name = enclosing_test(lines, no)
            if not name:
                continue
            label = f"{path}::{name}"
            if SKIP.search(text) and label not in out.skipped:
                out.skipped.append(label)
            if label not in out.changed:
                out.changed.append(label)
        for text in removed:
            name = _def_name(text)
            if name and name not in now_defined and not text.lstrip().startswith("class"):
                label = f"{path}::{name}"
                if label not in out.removed:
                    out.removed.append(label)
    out.changed = [c for c in out.changed if c not in out.skipped][:NAMES_MAX]
    out.skipped, out.removed = out.skipped[:NAMES_MAX], out.removed[:NAMES_MAX]
    return out


# ------------------------------------------------------------------ runner output

_PYTEST_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+::\S+)", re.M)
_UNITTEST_FAILED = re.compile(r"^(?:FAIL|ERROR): (\w+) \(([\w.]+)\)", re.M)
_GO_FAILED = re.compile(r"^\s*--- FAIL: (\S+)", re.M)
_JEST_FAILED = re.compile(r"^\s*[✕×] (.{1,160}?)(?: \(\d+(?:\.\d+)? ?m?s\))?$", re.M)


def failing_tests(output: str) -> list[str]:
    """The tests a runner's output reports failed (pytest, unittest, go test, jest/vitest), in order."""
    names: list[str] = [m.group(1) for m in _PYTEST_FAILED.finditer(output)]
    for m in _UNITTEST_FAILED.finditer(output):
        where, test = m.group(2), m.group(1)
        names.append(where if where.endswith("." + test) else f"{where}.{test}")
    names += [m.group(1) for m in _GO_FAILED.finditer(output)]
    names += [m.group(1).strip() for m in _JEST_FAILED.finditer(output)]
    return list(dict.fromkeys(names))[:NAMES_MAX]


def _runner_prefix(command: str) -> tuple[list[str], str] | None:
    """(argv up to the runner, runner) when ``command`` is one plain pytest or unittest invocation."""
    if re.search(r"[;&|<>`$()\n]", command):
        return None
    try:
        argv = shlex.split(command)
    except ValueError:
        return None
    for i, word in enumerate(argv):
        base = PurePosixPath(word).name
        if base in ("pytest", "py.test"):
            return argv[:i + 1], "pytest"
        if word == "-m" and i + 1 < len(argv) and argv[i + 1] in ("pytest", "unittest"):
            return argv[:i + 2], argv[i + 1]
    return None


def narrowed_command(command: str, test_files: list[str]) -> str | None:
    """The check's own runner on ``test_files`` only (Python test modules), or None when we do not know how."""
    known = _runner_prefix(command)
    py = [f for f in test_files if f.endswith(".py") and PurePosixPath(f).name != "conftest.py"
          and not PurePosixPath(f).name.startswith("__")]
    if not known or not py:
        return None
    prefix, runner = known
    extra = ["-p", "no:cacheprovider"] if runner == "pytest" else []
    return shlex.join(prefix + extra + py)


# ------------------------------------------------------------------ the production error

_PY_FRAME = re.compile(r'File "([^"\n]+)", line \d+, in ([^\s]+)')
_PYTEST_FRAME = re.compile(r"^([^\s:]+\.py):\d+: (?:in (\S+)|\w)", re.M)   # pytest's long tracebacks
_PYTEST_SOURCE = re.compile(r"^ {4}(?:async )?def (\w+)\(", re.M)     # the frame's source pytest shows
_JS_FRAME = re.compile(r"\bat (?:([\w.$<>\[\]]+) )?\(?([^\s()]+?):\d+:\d+\)?")
_GO_FRAME = re.compile(r"^\s*([\w./-]+\.go):\d+", re.M)
_GO_FUNC = re.compile(r"^([\w./*()-]+)\.(\w+)\(", re.M)


def _frames(output: str) -> set[tuple[str, str]]:
    """(file name, function) pairs of the stack frames in ``output``."""
    found = {(PurePosixPath(f).name, fn) for f, fn in _PY_FRAME.findall(output)}
    found |= {(PurePosixPath(f).name, fn) for f, fn in _PYTEST_FRAME.findall(output)}
    found |= {("", fn) for fn in _PYTEST_SOURCE.findall(output)}
    found |= {(PurePosixPath(f).name, (fn or "").split(".")[-1]) for fn, f in _JS_FRAME.findall(output)}
    found |= {(PurePosixPath(f).name, "") for f in _GO_FRAME.findall(output)}
    found |= {("", fn) for _, fn in _GO_FUNC.findall(output)}
    return found


def reproduces(output: str, error_class: str | None, frames: list[str] | str | None) -> tuple[bool, str]:
    """Whether a failing run's ``output`` shows the production error: its exception class and a frame in the same
    function or file. Returns (yes, what matched or what did not)."""
    cls = (error_class or "").strip().split(".")[-1]
    if isinstance(frames, str):
        try:
            frames = json.loads(frames)
        except ValueError:
            frames = []
    prod = [str(f) for f in frames or []]
    if not cls:
        return False, "the production error names no exception class"
    if not re.search(rf"(?<![\w]){re.escape(cls)}\b", output):
        return False, f"the base failure does not show {cls}"
    files = {PurePosixPath(f.rsplit(":", 1)[0]).name for f in prod if ":" in f}
    funcs = {f.rsplit(":", 1)[1] for f in prod if ":" in f} - {"", "<module>", "<lambda>", "?"}
    for name, fn in sorted(_frames(output)):
        if fn and fn in funcs:
            return True, f"{cls} in {fn}" + (f" ({name})" if name else "")
    for name, fn in sorted(_frames(output)):
        if name and name in files:
            return True, f"{cls} in {name}"
    return False, f"the base failure shows {cls} but no frame of the production stack"


# ------------------------------------------------------------------ the run


@dataclass
class Proof:
    mode: str
    verdict: str                      # proven | unproven | rejected | off
    command: str = ""
    narrowed: bool = False
    test_files: list[str] = field(default_factory=list)
    flipped: list[str] = field(default_factory=list)
    passed_on_base: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    base_exit: int | None = None
    base_status: str = ""
    base_tail: str = ""               # redacted by the caller before it is stored
    duration_s: float = 0.0
    reproduces: bool | None = None
    reproduces_why: str = ""

    def lists(self) -> dict[str, list[str]]:
        return {"test_files": self.test_files, "flipped": self.flipped, "passed_on_base": self.passed_on_base,
                "skipped": self.skipped, "removed": self.removed}


RunCheck = Callable[[Path, str, str], "object"]   # (tree, command, log name) -> agent.infra.proc.ProcResult


def base_tree(mirror: Path, tree: Path, base: str, head: str, changes: list[FileChange]) -> None:
    """A detached worktree of ``mirror`` at ``base`` with the test ``changes`` of ``head`` applied."""
    from agent.git.workspace import TaskGit, git

    drop_tree(mirror, tree)
    tree.parent.mkdir(parents=True, exist_ok=True)
    # -f: a tree left registered by a crash (its folder gone) is taken over, not refused
    git("worktree", "add", "-f", "-q", "--detach", str(tree), base, git_dir=mirror)
    tg = TaskGit(tree, mirror)
    present = [c.path for c in changes if c.status != "D"]
    gone = [c.path for c in changes if c.status == "D"]
    if present:
        tg("checkout", head, "--", *present)
    if gone:
        tg("rm", "-q", "--ignore-unmatch", "--", *gone)


def drop_tree(mirror: Path, tree: Path) -> None:
    from agent.git.workspace import git

    if tree.exists():
        git("worktree", "remove", "--force", str(tree), git_dir=mirror, check=False)
    if tree.exists():   # not a registered worktree (a crash between mkdir and add): just files
        shutil.rmtree(tree, ignore_errors=True)
        git("worktree", "prune", git_dir=mirror, check=False)


def _named_failure(res) -> bool:
    """A failed run that names the tests that failed (not a loader or collection error of the runner)."""
    names = failing_tests(_output(res)) if res.status == "failed" else []
    return bool(names) and not any("_FailedTest" in n for n in names)


def _output(res) -> str:
    return (res.stdout_text(400_000) + "\n" + res.stderr_text(200_000)).strip("\n")


_CONTROL = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]|[\x00-\x08\x0b-\x1f\x7f]")


def last_lines(text: str, n: int = TAIL_LINES) -> str:
    """The last ``n`` non-empty-ended lines of a run's output, terminal escapes and control characters removed."""
    lines = [_CONTROL.sub("", ln).rstrip() for ln in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines[-n:])


def prove(*, mode: str, globs: tuple[str, ...], command: str, mirror: Path, tree: Path, base: str, head: str,
          run_check: RunCheck, error: dict | None, redact: Callable[[str], str]) -> Proof:
    """Run the check on the base plus the round's test changes and judge the result (see the module text)."""
    from agent.git.workspace import git as hardened, require_clean_config

    if mode == "off":
        return Proof(mode=mode, verdict=OFF, command=command)
    require_clean_config(mirror)   # only what agent wrote (a lane may have run before us)

    def git(*args: str) -> str:
        return hardened(*args, git_dir=mirror)

    tests = [c for c in changed_files(git, base, head) if is_test_path(c.path, globs)]
    names = diff_names(git, base, head, [c.path for c in tests])
    proof = Proof(mode=mode, verdict=REJECTED, command=command, test_files=[c.path for c in tests][:NAMES_MAX],
                  skipped=names.skipped, removed=names.removed)
    narrow = narrowed_command(command, [c.path for c in tests if c.status != "D"])
    base_tree(mirror, tree, base, head, tests)
    try:
        res = run_check(tree, narrow or command, "proof-narrowed" if narrow else "proof")
        took = res.duration_s
        if narrow and not _named_failure(res):
            # the new tests pass on the base (an older test that flips still counts), or our narrowed call itself
            # failed (a module that does not import that way): the check as the repository wrote it decides
            res = run_check(tree, command, "proof")
            took += res.duration_s
            narrow = None
    finally:
        drop_tree(mirror, tree)
    proof.narrowed = bool(narrow)
    proof.command = narrow or command
    proof.duration_s = round(took, 3)
    proof.base_exit, proof.base_status = res.exit_code, res.status
    text = _output(res).replace(f"{tree}/", "")   # paths as in the repository
    proof.base_tail = redact(last_lines(text))
    if res.status == "failed":
        proof.flipped = failing_tests(text) or [f"`{proof.command}` (no test names recognised in its output)"]
        proof.verdict = PROVEN
        if error:
            proof.reproduces, proof.reproduces_why = reproduces(text, error.get("class"), error.get("frames"))
        return proof
    proof.passed_on_base = names.changed
    proof.verdict = UNPROVEN if mode == "optional" else REJECTED
    return proof


def feedback(p: Proof) -> str:
    """What a rejected round's implementer reads: the tests that count as nothing, what ran, what to do."""
    lines = ["No test proves the fix: no test fails on the base commit without it."]
    if p.passed_on_base:
        lines.append("New or changed tests that already pass on the base: " + ", ".join(p.passed_on_base) + ".")
    if p.skipped:
        lines.append("Tests made to skip or xfail (they count as nothing): " + ", ".join(p.skipped) + ".")
    if p.removed:
        lines.append("Tests removed (they count as nothing): " + ", ".join(p.removed) + ".")
    how = "timed out" if p.base_status == "timeout" else ("could not start" if p.base_status == "unavailable"
                                                          else "passed")
    ran = f" ({', '.join(p.test_files)})" if p.test_files else " (the round changed no test file)"
    lines.append(f"What ran: `{p.command}` on the base commit with only this round's test changes{ran}; it {how}.")
    lines.append("Add or adjust a test that fails on the base commit and passes with the fix, ideally one that "
                 "raises the production error; never skip, xfail or delete a failing test.")
    return "\n".join(lines)


def spec_text(p: dict | None) -> str | None:
    """The proof as reviewers read it (plain text; the spec fences it)."""
    if p is None:
        return None
    lines = [summary(p)]
    if p.get("verdict") == PROVEN:
        lines.append(f"Ran on the base: {p.get('command')} (exit {p.get('base_exit')})")
        lines += [f"- flips: {name}" for name in p.get("flipped") or []]
        if p.get("reproduces_why"):
            lines.append(("Reproduces the error: " if p.get("reproduces") else "Regression test only: ")
                         + str(p["reproduces_why"]))
        if p.get("base_tail"):
            lines += ["The base failure ends with:", str(p["base_tail"])]
    return "\n".join(lines)
