"""A GitHub App as the agent's identity: short-lived installation tokens instead of a person's token.

- A JWT (PyJWT, RS256 with the app's private key; ``iss`` = app id, issued 60 s in the past for clock drift,
  expiring after 9 minutes, under GitHub's 10) authenticates as the app; it only buys tokens and reads the app.
- The installation is ``github.installation_id`` or found from the repository (``GET /repos/{o}/{r}/installation``).
- ``POST /app/installations/{id}/access_tokens`` with ``repositories: [NAME]`` buys a token (``Authorization:
  Bearer``) for that one configured repository, valid for an hour (one token per repository: a repository the app
  is not installed on fails alone, never the others' tokens).  It is cached in memory only (per process, shared by
  every forge of that repository) and replaced ``REFRESH_MARGIN`` seconds before it expires, so no call ever goes
  out with an expired one.
- PRs and comments then show as ``<slug>[bot]`` (``GET /app``): that is the agent's own login (``bot_login``).
- ``describe()`` (``agent doctor --online``): the installation's account, permissions and what is missing of
  ``REQUIRED`` (pull requests: write, contents: write, checks: read).
All HTTP goes through agent.infra.http.ApiClient (credentials pinned to the API's origin, answers shape-checked).
"""

from __future__ import annotations

import os
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Callable
from urllib.parse import quote

from agent.forge.base import ForgeAuthError, ForgeBadAnswer, ForgeError, ForgeRateLimited, ForgeTransient

JWT_LIFETIME = 540                # seconds; GitHub refuses more than 600
REFRESH_MARGIN = 300              # a cached installation token is replaced this long before it expires
REQUIRED = {"pull_requests": "write", "contents": "write", "checks": "read"}
LEVELS = {"none": 0, "read": 1, "write": 2, "admin": 3}

_CACHE: dict[tuple, tuple[str, float]] = {}     # (api, app, installation, repositories) -> (token, expires epoch)
_BOTS: dict[tuple, str] = {}                     # (api, app) -> "<slug>[bot]"
_LOCK = threading.Lock()


def load_private_key(private_key_file: str | None, private_key_env: str | None,
                     environ: dict | None = None) -> str:
    """The app's PEM private key from the file or the variable named in config; ForgeAuthError if unusable."""
    env = os.environ if environ is None else environ
    if private_key_env:
        pem = env.get(private_key_env) or ""
        if not pem.strip():
            raise ForgeAuthError(f"github.private_key_env: {private_key_env} is not set; export the GitHub App's "
                                 "private key (PEM) in it")
        where = private_key_env
    else:
        path = Path(os.path.expanduser(private_key_file or ""))
        try:
            pem = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            why = getattr(exc, "strerror", None) or type(exc).__name__
            raise ForgeAuthError(f"github.private_key_file: cannot read {path}: {why}; download the app's "
                                 "private key (.pem) and point private_key_file at it") from None
        where = str(path)
    if "PRIVATE KEY-----" not in pem:
        raise ForgeAuthError(f"github App private key in {where} is not a PEM private key (-----BEGIN ... "
                             "PRIVATE KEY-----)")
    return pem


def parse_expiry(text: str) -> float:
    """``2016-07-11T22:14:10Z`` -> epoch seconds."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class GithubApp:
    """One GitHub App installation's tokens for ``repo``."""

    renews = True                 # HostedForge asks for the token on every call (it changes)

    def __init__(self, api_url: str, app_id: int, private_key: Callable[[], str], repo: str,
                 installation_id: int | None = None, clock: Callable[[], float] = time.time, timeout: tuple[float, float] = (10.0, 30.0), session=None):
        from agent.infra.http import ApiClient

        self.api_url = api_url.rstrip("/")
        self.app_id = int(app_id)
        self._private_key = private_key
        self._pem: str | None = None
        self.repo = repo
        self.owner, self.name = repo.split("/")
        self.installation_id = installation_id
        self.repositories = (self.name,)
        self.clock = clock
        self.api = ApiClient(f"github app {self.app_id}", "GitHub", self.api_url, self._jwt_headers,
                             check=self._check, session=session, clock=clock, timeout=timeout, retries=2,
                             headers={"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28"},
                             transient_error=ForgeTransient, rate_limited_error=ForgeRateLimited, error=ForgeError,
                             bad_answer_error=ForgeBadAnswer)

    def __repr__(self) -> str:  # never shows the key or a token
        return f"GithubApp(app_id={self.app_id}, repo={self.repo!r})"

    # ------------------------------------------------------------------ the app's own authentication

    def jwt(self) -> str:
        import jwt

        if self._pem is None:
            self._pem = self._private_key()
        now = int(self.clock())
        try:
            return jwt.encode({"iat": now - 60, "exp": now + JWT_LIFETIME, "iss": str(self.app_id)}, self._pem,
                              algorithm="RS256")
        except (ValueError, TypeError, jwt.exceptions.PyJWTError) as exc:
            raise ForgeAuthError(f"github app {self.app_id}: the private key cannot sign a JWT "
                                 f"({type(exc).__name__}); use the app's RSA private key (.pem)") from None

    def _jwt_headers(self) -> dict:
        return {"Authorization": f"Bearer {self.jwt()}"}

    def _check(self, resp, what: str) -> None:
        where = f"github app {self.app_id}"
        if resp.status_code == 401:
            raise ForgeAuthError(f"{where}: the app's JWT was refused (401) on {what}; check github.app_id and "
                                 "that the private key is the app's current one")
        if resp.status_code in (403, 404):
            raise ForgeAuthError(f"{where}: {what} answered {resp.status_code}: the app is not installed on "
                                 f"{self.repo} (or github.installation_id is wrong); install it on the repository")

    # ------------------------------------------------------------------ installation tokens

    def installation(self) -> int:
        if self.installation_id is None:
            found = self.api.call("GET", f"/repos/{quote(self.owner, safe='')}/{quote(self.name, safe='')}/installation",
                                  {"id": int}, what=f"finding the app's installation on {self.repo}")
            self.installation_id = found["id"]
        return self.installation_id

    def _key(self) -> tuple:
        return (self.api_url, self.app_id, self.installation_id, self.repositories)

    def __call__(self) -> str:
        """The installation token, bought or renewed when it has less than ``REFRESH_MARGIN`` seconds left."""
        self.installation()
        with _LOCK:
            cached = _CACHE.get(self._key())
            if cached is not None and cached[1] - REFRESH_MARGIN > self.clock():
                return cached[0]
            made = self.api.call("POST", f"/app/installations/{int(self.installation_id)}/access_tokens",
                                 {"token": str, "expires_at": str}, json={"repositories": list(self.repositories)},
                                 what="buying an installation token")
            try:
                expires = parse_expiry(made["expires_at"])
            except ValueError:
                raise ForgeBadAnswer(f"github app {self.app_id}: the installation token's expires_at "
                                     f"{made['expires_at'][:40]!r} is not a time; retried on the next scan") from None
            _CACHE[self._key()] = (made["token"], expires)
            return made["token"]

    current_token = __call__

    def forget(self) -> None:
        with _LOCK:
            _CACHE.pop(self._key(), None)

    def bot_login(self) -> str:
        """``<slug>[bot]``: the login PRs and comments made with the installation token show."""
        key = (self.api_url, self.app_id)
        if key not in _BOTS:
            app = self.api.call("GET", "/app", {"slug": str}, what="reading the app")
            _BOTS[key] = f"{app['slug']}[bot]"
        return _BOTS[key]

    def describe(self) -> dict:
        """The installation: ``{id, account, permissions, missing}`` (``missing``: what ``REQUIRED`` lacks)."""
        inst = self.api.call("GET", f"/app/installations/{int(self.installation())}",
                             {"id": int, "permissions": dict, "account?": (dict, None)},
                             what="reading the app's installation")
        perms = {k: v for k, v in inst["permissions"].items() if isinstance(v, str)}
        missing = {k: need for k, need in REQUIRED.items() if LEVELS.get(perms.get(k, "none"), 0) < LEVELS[need]}
        account = (inst.get("account") or {}).get("login") or "?"
        return {"id": inst["id"], "account": account, "permissions": perms, "missing": missing}


def app_for(config, repo_name: str, clock: Callable[[], float] = time.time,
            environ: dict | None = None) -> GithubApp:
    """The GithubApp of ``config.github`` for the configured repository ``repo_name``."""
    gh = config.github
    return GithubApp(gh.api_url, gh.app_id,
                     lambda: load_private_key(gh.private_key_file, gh.private_key_env, environ), repo_name,
                     installation_id=gh.installation_id, clock=clock, timeout=config.forges.timeout)
