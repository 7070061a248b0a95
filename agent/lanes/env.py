"""The environment a lane sees: an allowlist, never a copy of ours minus a denylist.

Forge tokens, the ledger's credentials and any other secret in the parent's environment do not
reach a lane unless the user named that variable under ``vendors.X.env`` — and forge/source
token variables named in the config are dropped even then (``deny``).
"""

from __future__ import annotations

import os
from typing import Iterable, Mapping

BASE_NAMES = ("PATH", "HOME", "USER", "LANG", "TERM", "TMPDIR", "TZ")
BASE_PREFIXES = ("LC_",)
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


def lane_env(vendor_env_names: Iterable[str] = (), extra: Mapping[str, str] | None = None, *,
             deny: Iterable[str] = (), environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Build a lane's whole environment.

    ``vendor_env_names``: variables named in config (``vendors.X.env``), copied when set.
    ``extra``: adapter-specific values (e.g. CODEX_HOME) set as given.
    ``deny``: names that never pass (forge/source token variables), even if listed above.
    """
    src = os.environ if environ is None else environ
    denied = {d for d in deny if d}
    env: dict[str, str] = {}
    for name, value in src.items():
        if name in BASE_NAMES or name.startswith(BASE_PREFIXES):
            env[name] = value
    for name in vendor_env_names:
        if name in src and name not in denied:
            env[name] = src[name]
    for name, value in (extra or {}).items():
        if name not in denied:
            env[name] = str(value)
    env.setdefault("PATH", DEFAULT_PATH)
    for name in denied:
        env.pop(name, None)
    return env


def config_denylist(config) -> tuple[str, ...]:
    """Secret-holding variable names the config itself mentions (forge and source tokens)."""
    names = [config.github.token_env, "GITHUB_TOKEN", "GH_TOKEN", config.gitlab.token_env, config.gitea.token_env]
    for src in config.sources:
        names += [src.auth_env, src.token_env]
    return tuple(n for n in names if n)
