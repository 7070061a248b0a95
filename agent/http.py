"""The one module that speaks HTTP (through requests): the GitHub forge and the Loki/Sentry sources use it.

``requests`` is imported only here and only inside functions, so a cron tick that makes no HTTP call never pays
for it. Credentials come from the environment (a variable named in config) or from netrc, never from the config
file. Errors are one-line AgentErrors that never include credentials.
"""

from __future__ import annotations

import os
from typing import Any, Mapping
from urllib.parse import urlsplit

from agent import AgentError
from agent.intake.redact import redact

TIMEOUT = 30
USER_AGENT = "agent-fixer/0.1"


def new_session():
    """A requests Session (connection reuse for the forge's many calls)."""
    import requests

    return requests.Session()


def transport_failure(exc: BaseException) -> str | None:
    """'timed out' / 'could not connect' for a network failure of a request, None for anything else."""
    import requests

    if isinstance(exc, requests.Timeout):
        return "timed out"
    if isinstance(exc, requests.ConnectionError):
        return "could not connect"
    return None


def _where(url: str) -> str:
    parts = urlsplit(url)
    return redact(f"{parts.scheme}://{parts.hostname or ''}{':' + str(parts.port) if parts.port else ''}{parts.path}")


def netrc_auth(url: str, env: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(login, password) for the URL's host from $NETRC or ~/.netrc, or None."""
    import netrc

    env = os.environ if env is None else env
    path = env.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    if not os.path.isfile(path):
        return None
    try:
        found = netrc.netrc(path).authenticators(urlsplit(url).hostname or "")
    except (netrc.NetrcParseError, OSError):
        return None
    if not found:
        return None
    login, _account, password = found
    return (login or "", password or "")


def credentials(url: str, env_name: str | None, env: Mapping[str, str] | None = None,
                what: str = "source") -> tuple[dict, Any]:
    """(headers, auth) from the variable ``env_name`` (``user:password`` -> basic auth, else a bearer token),
    falling back to netrc for the URL's host."""
    env = os.environ if env is None else env
    if env_name:
        value = env.get(env_name)
        if not value:
            raise AgentError(f"{what}: environment variable {env_name} is not set; export it or remove auth_env")
        if ":" in value and not value.lower().startswith("bearer "):
            user, _, password = value.partition(":")
            return {}, (user, password)
        token = value[7:] if value.lower().startswith("bearer ") else value
        return {"Authorization": f"Bearer {token.strip()}"}, None
    return {}, netrc_auth(url, env)


def get_json(url: str, *, params: dict | None = None, headers: dict | None = None, auth: Any = None,
             timeout: float = TIMEOUT) -> tuple[Any, Any]:
    """GET a JSON document; returns (document, response).  Raises AgentError on any failure."""
    import requests

    hdrs = {"User-Agent": USER_AGENT, "Accept": "application/json", **(headers or {})}
    try:
        resp = requests.get(url, params=params, headers=hdrs, auth=auth, timeout=timeout)
    except requests.RequestException as exc:
        raise AgentError(f"GET {_where(url)}: {type(exc).__name__}; is the service reachable?") from None
    if resp.status_code in (401, 403):
        raise AgentError(f"GET {_where(url)}: HTTP {resp.status_code}; check the credentials "
                         "(the variable named in config, or netrc)")
    if resp.status_code >= 400:
        raise AgentError(f"GET {_where(url)}: HTTP {resp.status_code}: {redact(resp.text[:200]).strip()}")
    try:
        return resp.json(), resp
    except ValueError:
        raise AgentError(f"GET {_where(url)}: response is not JSON") from None


class PostFailed(AgentError):
    """A POST that did not succeed; ``retry`` says whether trying again later can help."""

    def __init__(self, message: str, retry: bool):
        super().__init__(message)
        self.retry = retry


def post(url: str, body: bytes, *, headers: dict | None = None, timeout: float = 15, shown: str | None = None) -> int:
    """POST ``body``; returns the 2xx status. Raises PostFailed (one line, no credentials, no query string)
    with ``retry`` True for transport failures, 408, 429 and 5xx, False for other refusals. ``shown`` names the
    destination in messages instead of the URL (a Slack webhook URL is itself a secret)."""
    import requests

    hdrs = {"User-Agent": USER_AGENT, **(headers or {})}
    try:
        resp = requests.post(url, data=body, headers=hdrs, timeout=timeout, allow_redirects=False)
    except requests.RequestException as exc:
        raise PostFailed(f"POST {shown or _where(url)}: {transport_failure(exc) or type(exc).__name__}",
                         retry=True) from None
    if 200 <= resp.status_code < 300:
        return resp.status_code
    retry = resp.status_code in (408, 429) or resp.status_code >= 500
    raise PostFailed(f"POST {shown or _where(url)}: HTTP {resp.status_code}: {redact(resp.text[:200]).strip()}", retry=retry)
