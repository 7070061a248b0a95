"""The environment a lane sees: an allowlist, never a copy of ours minus a denylist.

Forge tokens, the ledger's credentials and any other secret in the parent's environment do not
reach a lane unless the user named that variable under ``vendors.X.env`` — and credential variables
(``secret_env_names``: the forge tokens, every ``*_env`` the config names, such as ``github.token_env``
or a source's ``token_env``/``auth_env``) are dropped even then (``deny``).  The same list keeps them
out of every git command but push (``agent.git.workspace.git_env``).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, Iterable, Mapping

BASE_NAMES = ("PATH", "HOME", "USER", "LANG", "TERM", "TMPDIR", "TZ")
BASE_PREFIXES = ("LC_",)
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"

# Credential variables that never reach a lane or a git command other than push, whatever the config says.
# Extend with ``register_secret_env`` (a forge module adding its default variable) rather than editing callers.
FORGE_TOKEN_VARS: list[str] = ["GITHUB_TOKEN", "GH_TOKEN", "GITLAB_TOKEN", "GITEA_TOKEN", "FORGEJO_TOKEN",
                               "AGENT_LEDGER_URL", "PGPASSWORD"]   # the PostgreSQL ledger's URL and password
# Callables config -> names, for secrets a future config section holds under a key not ending in ``_env``.
SECRET_ENV_PROVIDERS: list[Callable[[object], Iterable[str]]] = []


def register_secret_env(*names: str, provider: Callable[[object], Iterable[str]] | None = None) -> None:
    """Add credential variable names (or a function of the config returning some) to the deny list."""
    for n in names:
        if n and n not in FORGE_TOKEN_VARS:
            FORGE_TOKEN_VARS.append(n)
    if provider is not None and provider not in SECRET_ENV_PROVIDERS:
        SECRET_ENV_PROVIDERS.append(provider)


def _env_fields(obj, seen: set[int]) -> Iterable[str]:
    """Every string value of a field named ``*_env`` anywhere in a config tree (dataclasses, dicts, lists)."""
    if obj is None or isinstance(obj, (str, bytes, int, float, bool)) or id(obj) in seen:
        return
    seen.add(id(obj))
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name, None)
            if f.name.endswith("_env"):
                if isinstance(value, str) and value:
                    yield value
                elif isinstance(value, (list, tuple)):
                    yield from (v for v in value if isinstance(v, str) and v)
            else:
                yield from _env_fields(value, seen)
    elif isinstance(obj, Mapping):
        for key, value in obj.items():
            if isinstance(key, str) and key.endswith("_env") and isinstance(value, str) and value:
                yield value
            else:
                yield from _env_fields(value, seen)
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for value in obj:
            yield from _env_fields(value, seen)


def secret_env_names(config=None) -> tuple[str, ...]:
    """The one list of credential variables: forge tokens plus every ``*_env`` the config names
    (``github.token_env``, sources' ``token_env``/``auth_env``, and any later ``gitlab.token_env``,
    ``notify[].secret_env`` ...), plus what registered providers return.  ``vendors.X.env`` (a list of
    variables to pass) is not a ``*_env`` field, so it never adds itself here."""
    names = list(FORGE_TOKEN_VARS)
    if config is not None:
        names += list(_env_fields(config, set()))
        for provider in SECRET_ENV_PROVIDERS:
            try:
                names += [n for n in provider(config) if n]
            except Exception:
                pass
    return tuple(dict.fromkeys(n for n in names if n))


def lane_env(vendor_env_names: Iterable[str] = (), extra: Mapping[str, str] | None = None, *,
             deny: Iterable[str] = (), environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Build a lane's whole environment.

    ``vendor_env_names``: variables named in config (``vendors.X.env``), copied when set.
    ``extra``: adapter-specific values (e.g. CODEX_HOME) set as given.
    ``deny``: names that never pass (credential variables), even if listed above; the forge token
    variables (``FORGE_TOKEN_VARS``) are always denied.
    """
    src = os.environ if environ is None else environ
    denied = {d for d in deny if d} | set(FORGE_TOKEN_VARS)
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


def denied_in_config(config) -> list[tuple[str, str]]:
    """(vendor, variable) for every credential variable a ``vendors.X.env`` lists (doctor flags them:
    they are dropped, so the config says something that never happens)."""
    secrets = set(secret_env_names(config))
    return [(name, var) for name, vc in sorted(config.vendors.items()) for var in vc.env if var in secrets]
