"""Helpers for the hostile-input intake tests: every compiled pattern of intake, a structural check that
each is linear, and a counter of the work the patterns are given (for size-ratio checks)."""

from __future__ import annotations

import re
from re import _constants as C  # type: ignore[attr-defined]
from re import _parser  # type: ignore[attr-defined]

from agent.intake import fingerprint, formats
from agent.infra import redact

MODULES = (formats, redact, fingerprint)
MAX_BOUND = 4096


def patterns() -> dict[str, re.Pattern]:
    """Every compiled pattern the intake modules use, by ``module.NAME`` (rules by their rule name)."""
    out: dict[str, re.Pattern] = {}
    for mod in MODULES:
        for name, value in vars(mod).items():
            if isinstance(value, re.Pattern):
                out[f"{mod.__name__.rsplit('.', 1)[-1]}.{name}"] = value
    for name, pattern, _ in redact._RULES:
        if pattern is not None:
            out[f"redact.rule:{name}"] = pattern
    return out


def unbounded_backtracking(pattern: re.Pattern) -> list[str]:
    """The repetitions of ``pattern`` that could backtrack over an unbounded span: greedy or lazy ones without
    an upper bound (possessive ones never give back what they took), or bounds above MAX_BOUND."""
    problems: list[str] = []

    def walk(items) -> None:
        for op, av in items:
            if op in (C.MAX_REPEAT, C.MIN_REPEAT):
                lo, hi, sub = av
                if hi == C.MAXREPEAT or hi > MAX_BOUND:
                    kind = "greedy" if op == C.MAX_REPEAT else "lazy"
                    problems.append(f"{kind} {{{lo},{'' if hi == C.MAXREPEAT else hi}}} over {_show(sub)}")
                walk(sub)
            elif op == C.POSSESSIVE_REPEAT:
                walk(av[2])
            elif op == C.SUBPATTERN:
                walk(av[-1])
            elif op == C.BRANCH:
                for alt in av[1]:
                    walk(alt)
            elif op in (C.ASSERT, C.ASSERT_NOT):
                walk(av[1])
            elif op == C.ATOMIC_GROUP:
                walk(av)
            elif op == C.GROUPREF_EXISTS:
                walk(av[1])
                if av[2] is not None:
                    walk(av[2])

    walk(_parser.parse(pattern.pattern, pattern.flags))
    return problems


def _show(sub) -> str:
    return str(list(sub))[:60]


class WorkCounter:
    """Wraps every intake pattern so that each scan (search, finditer, sub, findall) adds the length it is
    given, and each anchored call (match, fullmatch) adds one; ``total`` is then proportional to the work the
    patterns were asked to do, each of them being linear by construction."""

    def __init__(self):
        self.total = 0

    def proxy(self, pattern: re.Pattern):
        counter = self

        class Counted:
            def __getattr__(self, name):
                return getattr(pattern, name)

            def _scan(self, name, string, *args, **kw):
                pos = args[0] if args else kw.get("pos", 0)
                counter.total += max(len(string) - (pos or 0), 1)
                return getattr(pattern, name)(string, *args, **kw)

            def search(self, string, *a, **k):
                return self._scan("search", string, *a, **k)

            def finditer(self, string, *a, **k):
                return self._scan("finditer", string, *a, **k)

            def findall(self, string, *a, **k):
                return self._scan("findall", string, *a, **k)

            def sub(self, repl, string, *a, **k):
                counter.total += max(len(string), 1)
                return pattern.sub(repl, string, *a, **k)

            def match(self, string, *a, **k):
                counter.total += 1
                return pattern.match(string, *a, **k)

            def fullmatch(self, string, *a, **k):
                counter.total += 1
                return pattern.fullmatch(string, *a, **k)

        return Counted()

    def install(self, monkeypatch) -> "WorkCounter":
        for mod in MODULES:
            for name, value in list(vars(mod).items()):
                if isinstance(value, re.Pattern):
                    monkeypatch.setattr(mod, name, self.proxy(value))
        monkeypatch.setattr(redact, "_RULES", [(n, self.proxy(p) if p is not None else None, r)
                                               for n, p, r in redact._RULES])
        redact._cached.cache_clear()
        return self
