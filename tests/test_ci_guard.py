"""The CI guard in conftest.py: with $AGENT_TEST_FORBID_SKIPS set (.ci/run sets it), a run that skipped any test
fails and names it; `--ledger=postgres` deselects `sqlite_only` tests instead of skipping them.

Real pytest runs in subprocesses, on a scratch test file next to a copy of this suite's conftest.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

SCRATCH = '''
import pytest

def test_runs():
    assert 1 + 1 == 2

def test_needs_a_tool():
    pytest.skip("frobnicator is not installed")

@pytest.mark.sqlite_only("about the file")
def test_about_the_sqlite_file():
    assert True
'''


def run(tmp_path: Path, *args: str, forbid: bool) -> subprocess.CompletedProcess:
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_scratch.py").write_text(SCRATCH)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    sqlite_only: about the SQLite file\n")
    env = {k: v for k, v in os.environ.items() if k not in ("AGENT_TEST_FORBID_SKIPS", "PYTEST_XDIST_WORKER")}
    if forbid:
        env["AGENT_TEST_FORBID_SKIPS"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           str(tmp_path), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_a_skip_fails_the_run_when_skips_are_forbidden_and_names_the_test(tmp_path):
    res = run(tmp_path, forbid=True)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "skipped in CI: test_scratch.py::test_needs_a_tool: " in res.stderr
    assert "frobnicator is not installed" in res.stderr and "1 test(s) skipped" in res.stderr


def test_without_the_variable_a_skip_is_only_reported(tmp_path):
    res = run(tmp_path, forbid=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "2 passed, 1 skipped" in res.stdout


def test_postgres_pass_deselects_sqlite_only_tests_instead_of_skipping_them(tmp_path):
    res = run(tmp_path, "--ledger=postgres", "--collect-only", forbid=True)   # collection only: no server needed
    assert res.returncode == 0, res.stdout + res.stderr
    assert "test_scratch.py::test_runs" in res.stdout and "test_about_the_sqlite_file" not in res.stdout
    assert "1 deselected" in res.stdout, res.stdout
    res = run(tmp_path, "--collect-only", forbid=True)                        # the SQLite pass keeps it
    assert "test_about_the_sqlite_file" in res.stdout and "deselected" not in res.stdout, res.stdout
