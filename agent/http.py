"""The one module that speaks HTTP (through requests): every forge (``ApiClient``) and the Loki/Sentry sources.

``requests`` is imported only here and only inside functions, so a cron tick that makes no HTTP call never pays
for it. Credentials come from the environment (a variable named in config) or from netrc, never from the config
file. Errors are one-line AgentErrors that never include credentials.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping
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


# --------------------------------------------------------------------------- the one HTTP path of every forge

MAX_PAGES = 50


def retry_after_seconds(value: str | None, clock: Callable[[], float]) -> float | None:
    """``Retry-After`` as seconds: a number of seconds or an HTTP date (RFC 9110); None if absent."""
    if value is None or not str(value).strip():
        return None
    text = str(value).strip()
    try:
        return max(float(text), 0.0)
    except ValueError:
        pass
    from email.utils import parsedate_to_datetime

    try:
        return max(parsedate_to_datetime(text).timestamp() - clock(), 0.0)
    except (TypeError, ValueError, IndexError, OverflowError):
        return 60.0


def rate_limit_wait(resp, clock: Callable[[], float]) -> float | None:
    """Seconds to wait if ``resp`` (a 403 or 429) is a rate-limit answer, else None.

    Honoured, in order: ``Retry-After`` (GitHub, GitLab, proxies in front of Gitea/Forgejo); an exhausted
    window with its reset time, ``X-RateLimit-Remaining: 0`` + ``X-RateLimit-Reset`` (GitHub) or
    ``RateLimit-Remaining: 0`` + ``RateLimit-Reset`` (GitLab), both unix seconds; a bare 429 waits a minute.
    """
    if resp.status_code not in (403, 429):
        return None
    h = resp.headers
    wait = retry_after_seconds(h.get("Retry-After"), clock)
    if wait is not None:
        return wait
    for prefix in ("X-RateLimit-", "RateLimit-"):
        if h.get(prefix + "Remaining") == "0" and h.get(prefix + "Reset"):
            try:
                return max(float(h[prefix + "Reset"]) - clock(), 0.0) + 1.0
            except ValueError:
                return 60.0
    if resp.status_code == 429:
        return 60.0
    return None


def response_message(resp) -> str:
    """The ``message`` (GitHub, Gitea) / ``message``/``error`` (GitLab) of an error answer, else its text."""
    try:
        data = resp.json()
    except ValueError:
        data = None
    if isinstance(data, dict):
        for key in ("message", "error", "error_description"):
            value = data.get(key)
            if value:
                return (value if isinstance(value, str) else str(value)).replace("\n", " ")
    return (resp.text or resp.reason or "").strip().replace("\n", " ")


class ApiClient:
    """One REST API at ``base_url``: every forge's HTTP goes through ``request`` and ``paginate``.

    - ``auth_headers()`` is called for each request (the forge resolves its token lazily, in memory only);
      nothing here ever puts a header value into a message.
    - Rate limits (``rate_limit_wait``, plus the forge's ``rate_limit_hint`` for answers without headers)
      are waited out with the injected ``sleep`` while the wait is at most ``max_wait`` and attempts remain;
      otherwise ``rate_limited_error`` says when the next call is allowed.
    - Timeouts, dropped connections and 5xx are retried with exponential backoff only when ``idempotent``;
      otherwise (and when retries run out) ``transient_error`` is raised and the caller decides (a create is
      looked up before it is repeated; a comment is never repeated).
    - Any other 4xx goes to ``check(resp, what)``, the forge's one place for what its answers mean; it raises.
      Statuses in ``allow`` are returned to the caller instead (e.g. a 404 that means "none").
    """

    def __init__(self, label: str, display: str, base_url: str, auth_headers: Callable[[], dict], *,
                 check: Callable[[Any, str], None], session=None, headers: Mapping[str, str] | None = None,
                 sleep: Callable[[float], None] | None = None, clock: Callable[[], float] | None = None,
                 timeout: tuple[float, float] = (10.0, 30.0), retries: int = 3, max_wait: float = 120.0,
                 backoff: float = 1.0, transient_error: type[Exception] = AgentError,
                 rate_limited_error: type[Exception] = AgentError,
                 rate_limit_hint: Callable[[Any], float | None] | None = None):
        import time

        self.label = label                  # "gitlab grp/proj": starts every message
        self.display = display              # "GitLab": who allows the next call
        self.base_url = base_url.rstrip("/")
        self.auth_headers = auth_headers
        self.check = check
        self._session = session
        self.headers = {"User-Agent": USER_AGENT, "Accept": "application/json", **(headers or {})}
        self.sleep = sleep or time.sleep
        self.clock = clock or time.time
        self.timeout = timeout
        self.retries = retries
        self.max_wait = max_wait
        self.backoff = backoff
        self.transient_error = transient_error
        self.rate_limited_error = rate_limited_error
        self.rate_limit_hint = rate_limit_hint
        # remembers a rate-limit reset across scans (agent.forge.RateLimitHold): ``check(what)`` raises while it
        # is ahead, so no call is made; ``remember(until, what)`` stores one the in-pass wait could not cover
        self.hold = None

    @property
    def session(self):
        if self._session is None:
            self._session = new_session()
        return self._session

    def url(self, path: str) -> str:
        return path if path.startswith(("http://", "https://")) else f"{self.base_url}{path}"

    def backoff_wait(self, attempt: int) -> float:
        return self.backoff * 2 ** (attempt - 1)

    def _wait_for(self, resp) -> float | None:
        wait = rate_limit_wait(resp, self.clock)
        if wait is None and self.rate_limit_hint is not None and resp.status_code in (403, 429):
            wait = self.rate_limit_hint(resp)
        return wait

    def request(self, method: str, path: str, *, json: Any = None, params: Mapping | None = None,
                idempotent: bool = True, what: str = "", allow: tuple[int, ...] = ()) -> Any:
        import time

        url = self.url(path)
        what = what or f"{method} {path}"
        if self.hold is not None:
            self.hold.check(what)
        attempt = 0
        while True:
            attempt += 1
            headers = {**self.headers, **self.auth_headers()}
            try:
                resp = self.session.request(method, url, json=json, params=params, headers=headers,
                                            timeout=self.timeout)
            except Exception as exc:
                kind = transport_failure(exc)
                if kind is None:
                    raise
                if idempotent and attempt <= self.retries:
                    self.sleep(self.backoff_wait(attempt))
                    continue
                raise self.transient_error(f"{self.label}: {what} {kind} ({_where(self.base_url)}); "
                                           "it will be retried on the next scan") from None
            if resp.status_code in allow:
                return resp
            wait = self._wait_for(resp)
            if wait is not None:
                if attempt > self.retries or wait > self.max_wait:
                    until = self.clock() + wait
                    at = time.strftime("%H:%M:%S UTC", time.gmtime(until))
                    if self.hold is not None:
                        self.hold.remember(until, what)
                    exc = self.rate_limited_error(f"{self.label}: rate limited on {what}; {self.display} allows "
                                                  f"the next call in {wait:.0f}s (at {at}); no call before then")
                    exc.until = until
                    raise exc
                self.sleep(wait)
                continue
            if resp.status_code >= 500:
                if idempotent and attempt <= self.retries:
                    self.sleep(self.backoff_wait(attempt))
                    continue
                raise self.transient_error(f"{self.label}: {what} failed with {resp.status_code} "
                                           f"({redact(response_message(resp))[:120]}); it will be retried "
                                           "on the next scan")
            if resp.status_code >= 400:
                self.check(resp, what)
                raise AgentError(f"{self.label}: {what} failed with {resp.status_code}: "
                                 f"{redact(response_message(resp))[:200]}")
            return resp

    def paginate(self, path: str, params: Mapping | None, what: str, max_pages: int = MAX_PAGES) -> list:
        """Every item of a listed collection: follows ``Link: rel="next"`` (GitHub, GitLab, Gitea), else
        GitLab's ``X-Next-Page``; stops after ``max_pages`` with an error rather than a silent truncation."""
        items: list = []
        url: str = path
        query: dict | None = dict(params or {})
        for _ in range(max_pages):
            resp = self.request("GET", url, params=query, what=what)
            page = resp.json()
            if not isinstance(page, list):
                raise AgentError(f"{self.label}: {what}: expected a list, got {type(page).__name__}")
            items.extend(page)
            nxt = resp.links.get("next", {}).get("url")
            if nxt:
                url, query = nxt, None  # the next URL carries the query
                continue
            next_page = (resp.headers.get("X-Next-Page") or "").strip()
            if next_page and page:
                query = {**(query or {}), "page": next_page}
                continue
            return items
        raise AgentError(f"{self.label}: {what} has more than {max_pages} pages; narrow the query")
