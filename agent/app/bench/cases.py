"""Bench cases: one YAML file each, validated with one-line errors naming the file and the key.

```yaml
id: widgets-missing-qty              # letters, digits, - _ . (names the run folders)
repo: ../repos/widgets.git           # a git URL, or a path (relative to this file)
base: 4f1c2a9                        # the buggy commit (a sha or a ref of repo)
service: widgets-api                 # optional: the service the error comes from (default: the id)
error:                               # the event as a source delivers it
  format: jsonl                      # jsonl | sentry | traceback | auto (default)
  text: |
    {"message": "KeyError: 'qty'", ...}
brief: "..."                         # optional: else the vendor's decider lane writes it
setup: "pip install -e ."            # optional: prepares the check environment (run before check and verify)
check: "python -m pytest -q"         # optional: the repository's own check each round (default: verify.command)
verify:
  patch: |                           # a test patch hidden from every lane, applied after the fix
    diff --git a/tests/test_x.py b/tests/test_x.py
    ...
  command: "python -m pytest -q tests/test_x.py"   # must pass on the agent's branch with the patch applied
limits: {rounds: 3, cost_usd: 5, wall_s: 1800}     # optional
```
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from agent import AgentError

ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,79}")
FORMATS = ("auto", "jsonl", "sentry", "traceback")
KEYS = ("id", "repo", "base", "service", "error", "brief", "setup", "check", "verify", "limits", "source")


class CaseError(AgentError):
    """A case file that cannot be used: ``FILE: key: what is wrong``."""


@dataclass(frozen=True)
class Limits:
    rounds: int = 3
    cost_usd: float = 5.0
    wall_s: int = 1800


@dataclass(frozen=True)
class Case:
    id: str
    repo: str                      # a URL, or an absolute path
    base: str
    service: str
    error_text: str
    error_format: str
    verify_patch: str
    verify_command: str
    brief: str | None = None
    setup: str | None = None
    check: str | None = None
    limits: Limits = field(default_factory=Limits)
    path: Path | None = None
    source: str | None = None      # where the bug comes from (an upstream issue or fix), shown in reports

    @property
    def digest(self) -> str:
        """What a finished run was made from: a changed case is a different case."""
        parts = (self.repo, self.base, self.service, self.error_text, self.error_format, self.verify_patch,
                 self.verify_command, self.brief or "", self.setup or "", self.check or "", repr(self.limits))
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]

    @property
    def check_command(self) -> str:
        return self.check or self.verify_command

    def hidden_files(self) -> list[str]:
        """The files the hidden patch touches (``diff --git a/X b/Y`` and ``+++ b/Y`` lines)."""
        found: list[str] = []
        for line in self.verify_patch.splitlines():
            m = re.match(r"diff --git a/(\S+) b/(\S+)", line) or re.match(r"\+\+\+ b/(\S+)", line)
            if m:
                for name in m.groups():
                    if name not in found:
                        found.append(name)
        return found


def _need(d: dict, key: str, where: str, kind: type = str) -> Any:
    value = d.get(key)
    if kind is str and (not isinstance(value, str) or not value.strip()):
        raise CaseError(f"{where}: {key}: expected a non-empty string, got {_shown(value)}")
    return value


def _shown(value: Any) -> str:
    return "nothing" if value is None else (f'"{value[:60]}"' if isinstance(value, str) else type(value).__name__)


def _opt(d: dict, key: str, where: str) -> str | None:
    if d.get(key) is None:
        return None
    return _need(d, key, where)


def parse_case(doc: Any, where: str, base_dir: Path | None = None) -> Case:
    if not isinstance(doc, dict):
        raise CaseError(f"{where}: expected a mapping of {', '.join(KEYS)}, got {_shown(doc)}")
    for key in doc:
        if key not in KEYS:
            raise CaseError(f"{where}: {key}: unknown key; expected one of {', '.join(KEYS)}")
    cid = _need(doc, "id", where)
    if not ID.fullmatch(cid):
        raise CaseError(f"{where}: id: {cid[:60]!r} is not a case id; use letters, digits, '-', '_' or '.'")
    repo = _need(doc, "repo", where)
    if "://" not in repo and not repo.startswith("git@"):
        repo = str(((base_dir or Path.cwd()) / repo).resolve())
    error = doc.get("error")
    if isinstance(error, str):
        error = {"text": error}
    if not isinstance(error, dict):
        raise CaseError(f"{where}: error: expected {{format, text}} or the event's text, got {_shown(error)}")
    text = _need(error, "text", f"{where}: error")
    fmt = error.get("format", "auto")
    if fmt not in FORMATS:
        raise CaseError(f"{where}: error.format: expected one of {'|'.join(FORMATS)}, got {_shown(fmt)}")
    verify = doc.get("verify")
    if not isinstance(verify, dict):
        raise CaseError(f"{where}: verify: expected {{patch, command}}, got {_shown(verify)}")
    patch = _need(verify, "patch", f"{where}: verify")
    if "diff --git" not in patch and "+++ " not in patch:
        raise CaseError(f"{where}: verify.patch: not a unified diff (no 'diff --git' or '+++' line)")
    limits = doc.get("limits") or {}
    if not isinstance(limits, dict):
        raise CaseError(f"{where}: limits: expected {{rounds, cost_usd, wall_s}}, got {_shown(limits)}")
    lim = Limits()
    for key, lo in (("rounds", 1), ("cost_usd", 0), ("wall_s", 1)):
        if key in limits:
            value = limits[key]
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < lo or \
                    (key != "cost_usd" and not isinstance(value, int)):
                raise CaseError(f"{where}: limits.{key}: expected a number >= {lo}, got {_shown(value)}")
    for key in limits:
        if key not in ("rounds", "cost_usd", "wall_s"):
            raise CaseError(f"{where}: limits.{key}: unknown key; expected rounds, cost_usd or wall_s")
    lim = Limits(rounds=limits.get("rounds", lim.rounds), cost_usd=float(limits.get("cost_usd", lim.cost_usd)),
                 wall_s=limits.get("wall_s", lim.wall_s))
    return Case(id=cid, repo=repo, base=_need(doc, "base", where), service=_opt(doc, "service", where) or cid,
                error_text=text, error_format=fmt, verify_patch=patch if patch.endswith("\n") else patch + "\n",
                verify_command=_need(verify, "command", f"{where}: verify"), brief=_opt(doc, "brief", where),
                setup=_opt(doc, "setup", where), check=_opt(doc, "check", where), limits=lim,
                source=_opt(doc, "source", where))


def load_case(path: Path) -> Case:
    import yaml

    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except OSError as exc:
        raise CaseError(f"{path}: cannot read the case ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise CaseError(f"{path}: not UTF-8 (byte {exc.start}); save the case as UTF-8") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise CaseError(f"{path}: not valid YAML{at}; fix the file") from None
    except (ValueError, RecursionError) as exc:
        raise CaseError(f"{path}: not usable YAML ({type(exc).__name__}); fix the file") from None
    return replace(parse_case(doc, str(path), path.parent), path=path.resolve())


def load_cases(paths: list[Path]) -> list[Case]:
    """Case files and folders of them (``*.yaml``/``*.yml``, sorted); ids must be unique."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted([*p.glob("*.yaml"), *p.glob("*.yml")])
        else:
            files.append(p)
    if not files:
        raise CaseError("no case files given; pass CASE.yaml files or folders holding them")
    cases, seen = [], {}
    for f in files:
        case = load_case(f)
        if case.id in seen:
            raise CaseError(f"{f}: id: {case.id!r} is also the id of {seen[case.id]}; ids must be unique")
        seen[case.id] = f
        cases.append(case)
    return cases
