"""`agent bench import swebench`: SWE-bench instances become bench cases.

An instance (SWE-bench's JSON or JSONL: ``instance_id``, ``repo``, ``base_commit``, ``test_patch``,
``FAIL_TO_PASS``, ``PASS_TO_PASS``; the gold ``patch`` is never used) becomes a case whose hidden test patch is the
instance's ``test_patch`` and whose verification runs FAIL_TO_PASS plus PASS_TO_PASS. The product starts from a
production error, not an issue text, so the error event is made once, here: the repository at the base commit with
the test patch applied, the FAIL_TO_PASS tests run (in the check sandbox), and their traceback stored in the case as
a traceback log. The lanes then see the repository without the test patch, and the error as it would arrive.
"""

from __future__ import annotations

import json
import shlex
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from agent import AgentError

REQUIRED = ("instance_id", "repo", "base_commit", "test_patch", "FAIL_TO_PASS")
DEFAULT_TEST = "python -m pytest -q -p no:cacheprovider --tb=native {tests}"


def read_instances(path: Path) -> list[dict]:
    """A JSON list, one JSON object, or JSONL; each checked for the fields a case needs."""
    text = Path(path).read_text(encoding="utf-8-sig")
    try:
        doc = json.loads(text)
        docs = doc if isinstance(doc, list) else [doc]
    except ValueError:
        docs = []
        for i, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    docs.append(json.loads(line))
                except ValueError as exc:
                    raise AgentError(f"{path}: line {i}: not JSON ({getattr(exc, 'msg', exc)})") from None
    out = []
    for i, d in enumerate(docs, 1):
        if not isinstance(d, dict):
            raise AgentError(f"{path}: instance {i}: expected a JSON object")
        missing = [k for k in REQUIRED if not d.get(k)]
        if missing:
            raise AgentError(f"{path}: instance {i} ({d.get('instance_id', '?')}): missing {', '.join(missing)}")
        out.append({**d, "FAIL_TO_PASS": _tests(d["FAIL_TO_PASS"]), "PASS_TO_PASS": _tests(d.get("PASS_TO_PASS"))})
    return out


def _tests(value) -> list[str]:
    if isinstance(value, str):   # SWE-bench stores the lists as JSON text
        value = json.loads(value) if value.strip() else []
    return [str(t) for t in value or []]


def repo_url(instance: dict, repo_root: Path | None) -> str:
    """``owner/name`` as a GitHub URL, or a folder under ``repo_root`` (``owner__name`` or ``name``) offline."""
    repo = instance["repo"]
    if repo_root is not None:
        for name in (repo.replace("/", "__"), repo.split("/")[-1], repo.split("/")[-1] + ".git"):
            if (Path(repo_root) / name).exists():
                return str((Path(repo_root) / name).resolve())
        raise AgentError(f"{instance['instance_id']}: {repo} not found under {repo_root} "
                         f"(looked for {repo.replace('/', '__')} and {repo.split('/')[-1]})")
    if "/" in repo and "://" not in repo and not Path(repo).exists():
        return f"https://github.com/{repo}.git"
    return str(Path(repo).resolve()) if Path(repo).exists() else repo


def capture_error(instance: dict, url: str, test_command: str, setup: str | None, config,
                  echo: Callable[[str], None] = print) -> str:
    """The FAIL_TO_PASS tests' output at the base commit with the test patch applied (in the check sandbox)."""
    from agent.infra import proc
    from agent.lanes.sandbox import sandboxed_check
    from agent.git.workspace import GitError, git

    tmp = Path(tempfile.mkdtemp(prefix="agent-swebench-"))
    try:
        work = tmp / "repo"
        git("clone", "--quiet", url, str(work), network=True, timeout=1800)
        git("checkout", "--quiet", "--detach", instance["base_commit"], cwd=work)
        patch = tmp / "test.patch"
        patch.write_text(instance["test_patch"] if instance["test_patch"].endswith("\n")
                         else instance["test_patch"] + "\n", encoding="utf-8")
        try:
            git("apply", "--whitespace=nowarn", str(patch), cwd=work)
        except GitError as exc:
            raise AgentError(f"{instance['instance_id']}: test_patch does not apply at {instance['base_commit'][:12]}"
                             f": {exc}") from None
        command = test_command.format(tests=" ".join(shlex.quote(t) for t in instance["FAIL_TO_PASS"]))
        if setup:
            command = f"{setup} && {command}"
        home = tmp / "home"
        home.mkdir(mode=0o700)
        check = sandboxed_check(config, home, work, command, tmp / "scratch")
        res = check(timeout=config.limits.check_timeout, stdout_path=tmp / "out.log", stderr_path=tmp / "err.log")
        text = proc.read_text(tmp / "out.log") + "\n" + proc.read_text(tmp / "err.log")
        if res.status == "ok":
            raise AgentError(f"{instance['instance_id']}: FAIL_TO_PASS passes at the base commit with the test patch "
                             "applied; nothing to fix (check --test-command)")
        echo(f"{instance['instance_id']}: FAIL_TO_PASS fails at base (exit {res.exit_code}); error captured")
        return text
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def to_case(instance: dict, url: str, error_text: str, test_command: str, setup: str | None) -> dict:
    tests = instance["FAIL_TO_PASS"] + instance["PASS_TO_PASS"]
    return {
        "id": instance["instance_id"], "repo": url, "base": instance["base_commit"],
        "service": instance["repo"].split("/")[-1],
        "source": f"SWE-bench {instance['instance_id']}",
        "error": {"format": "traceback", "text": error_text},
        **({"setup": setup} if setup else {}),
        # the rounds' check: the tests that passed before (the hidden ones do not exist in the lanes' checkout)
        "check": test_command.format(tests=" ".join(shlex.quote(t) for t in instance["PASS_TO_PASS"])).strip(),
        "verify": {"patch": instance["test_patch"],
                   "command": test_command.format(tests=" ".join(shlex.quote(t) for t in tests))},
    }


def import_instances(path: Path, out_dir: Path, config, *, repo_root: Path | None = None,
                     test_command: str = DEFAULT_TEST, setup: str | None = None,
                     echo: Callable[[str], None] = print) -> list[Path]:
    import yaml

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for inst in read_instances(path):
        target = out_dir / f"{inst['instance_id']}.yaml"
        if target.exists():
            echo(f"{inst['instance_id']}: {target} exists; kept")
            written.append(target)
            continue
        url = repo_url(inst, repo_root)
        error = capture_error(inst, url, test_command, setup, config, echo)
        target.write_text(yaml.safe_dump(to_case(inst, url, error, test_command, setup), sort_keys=False,
                                         width=120), encoding="utf-8")
        written.append(target)
    return written
