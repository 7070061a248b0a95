"""The one module that speaks HTTP (through requests): every forge (``ApiClient``) and the Loki/Sentry sources.

``requests`` is imported only here and only inside functions, so a cron tick that makes no HTTP call never pays
for it. Credentials come from the environment (a variable named in config) or from netrc, never from the config
file. Errors are one-line AgentErrors that never include credentials.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping
from urllib.parse import urljoin, urlsplit

from agent import AgentError
from agent.infra.redact import redact

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


DEFAULT_PORTS = {"http": 80, "https": 443}
REDIRECTS = (301, 302, 303, 307, 308)
MAX_REDIRECTS = 5


def origin(url: str) -> str:
    """``scheme://host[:port]`` of ``url`` (lower case, the default port left out): where credentials may go."""
    parts = urlsplit(url)
    scheme = (parts.scheme or "").lower()
    try:
        port = parts.port
    except ValueError:
        port = -1  # an invalid port never equals a configured origin
    shown = f":{port}" if port is not None and port != DEFAULT_PORTS.get(scheme) else ""
    return f"{scheme}://{(parts.hostname or '').lower()}{shown}"


class ForeignOrigin(AgentError):
    """An answer pointed (``Link: rel="next"``, a redirect) away from the configured origin; not followed."""


def foreign(who: str, url: str, pinned: str) -> str:
    """The one line refusing a request to ``url`` because it is not on origin ``pinned``."""
    return (f"{who}: refusing to send credentials to {redact(origin(url))}, which is not the configured origin "
            f"{redact(pinned)}; check the API URL in config.yaml (or the proxy in between)")


def pinned_send(send: Callable[..., Any], method: str, url: str, pinned: str, who: str,
                error: type[Exception] = ForeignOrigin, **kw) -> Any:
    """``send(method, url, allow_redirects=False, **kw)``, following redirects by hand and only within ``pinned``
    (an origin): a request (or a redirect) to any other origin is refused with one line naming both origins and
    is never sent, so no credential header (``Authorization``, ``PRIVATE-TOKEN``, ...) leaves its origin.
    307/308 repeat the method and body; 301/302/303 are followed for GET only."""
    for _hop in range(MAX_REDIRECTS + 1):
        if origin(url) != pinned:
            raise error(foreign(who, url, pinned))
        resp = send(method, url, allow_redirects=False, **kw)
        location = resp.headers.get("Location") if resp.status_code in REDIRECTS else None
        if not location:
            return resp
        nxt = urljoin(url, location)
        if origin(nxt) != pinned:
            raise error(f"{who}: {redact(pinned)} redirected to {redact(origin(nxt))}, another origin; not followed "
                        "(credentials go only to the configured origin): fix the API URL in config.yaml")
        if resp.status_code in (301, 302, 303) and method.upper() not in ("GET", "HEAD"):
            raise error(f"{who}: {method} {_where(url)} was redirected ({resp.status_code}) to {_where(nxt)}; "
                        "set the API URL in config.yaml to where it points")
        url = nxt
        kw.pop("params", None)  # the Location carries its own query
    raise error(f"{who}: more than {MAX_REDIRECTS} redirects from {_where(url)}; fix the API URL in config.yaml")


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
             timeout: float = TIMEOUT, pinned: str | None = None) -> tuple[Any, Any]:
    """GET a JSON document; returns (document, response).  Raises AgentError on any failure.

    ``pinned`` is the only origin the request (and its redirects) may go to, default ``url``'s own: a source
    passes its configured URL, so a ``Link`` next page on another host is refused, not sent credentials."""
    import requests

    hdrs = {"User-Agent": USER_AGENT, "Accept": "application/json", **(headers or {})}
    try:
        resp = pinned_send(requests.request, "GET", url, pinned or origin(url), f"GET {_where(url)}",
                           params=params, headers=hdrs, auth=auth, timeout=timeout)
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
                 rate_limit_hint: Callable[[Any], float | None] | None = None,
                 error: type[Exception] = AgentError, bad_answer_error: type[Exception] = AgentError,
                 reauth: Callable[[], bool] | None = None):
        import time

        self.label = label                  # "gitlab grp/proj": starts every message
        self.display = display              # "GitLab": who allows the next call
        self.base_url = base_url.rstrip("/")
        self.origin = origin(self.base_url)     # the only place auth_headers() are ever sent
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
        self.error = error                      # a refusal (another origin, a write redirected)
        self.bad_answer_error = bad_answer_error  # an answer not of the expected shape: retried next scan
        self.reauth = reauth                    # on a 401: drop a cached short-lived token; True = try once more
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
        reauthed = False
        while True:
            attempt += 1
            try:
                if origin(url) != self.origin:  # before auth_headers(): no token is even made for it
                    raise self.error(foreign(f"{self.label}: {what}", url, self.origin))
                headers = {**self.headers, **self.auth_headers()}
                resp = pinned_send(self.session.request, method, url, self.origin, f"{self.label}: {what}",
                                   error=self.error, json=json, params=params, headers=headers,
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
            if resp.status_code == 401 and self.reauth is not None and not reauthed:
                reauthed = True
                if self.reauth():           # a fresh token (a GitHub App's was revoked, or the clocks disagree)
                    continue
            if resp.status_code >= 400:
                self.check(resp, what)
                raise self.error(f"{self.label}: {what} failed with {resp.status_code}: "
                                 f"{redact(response_message(resp))[:200]}")
            return resp

    def parse(self, resp, shape: Any, what: str) -> Any:
        """The JSON of ``resp`` if it has ``shape`` (see ``check_shape``); else ``bad_answer_error`` with a
        one-line reason and the URL path (a proxy's HTML page, a list for an object, a missing field)."""
        path = redact(urlsplit(resp.url or "").path or "?")
        try:
            data = resp.json()
        except ValueError:
            ctype = (resp.headers.get("Content-Type") or "no content type").split(";")[0].strip()
            why = f"not JSON ({redact(ctype)[:60]}, HTTP {resp.status_code})"
        else:
            why = check_shape(data, shape)
            if why is None:
                return data
        raise self.bad_answer_error(f"{self.label}: {what}: unexpected answer from {path}: {why}; it will be "
                                    "retried on the next scan")

    def call(self, method: str, path: str, shape: Any, **kw) -> Any:
        """``request`` and ``parse``: the answer's JSON, checked against ``shape``."""
        resp = self.request(method, path, **kw)
        return self.parse(resp, shape, kw.get("what") or f"{method} {path}")

    def paginate(self, path: str, params: Mapping | None, what: str, max_pages: int = MAX_PAGES,
                 item: Any = dict) -> list:
        """Every item of a listed collection (each checked against ``item``): follows ``Link: rel="next"``
        (GitHub, GitLab, Gitea; only within the API's origin), else GitLab's ``X-Next-Page``; stops after
        ``max_pages`` with an error rather than a silent truncation."""
        items: list = []
        url: str = path
        query: dict | None = dict(params or {})
        for _ in range(max_pages):
            resp = self.request("GET", url, params=query, what=what)
            page = self.parse(resp, [item], what)
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


def check_shape(value: Any, shape: Any, where: str = "") -> str | None:
    """Why ``value`` (parsed JSON) does not have ``shape``, or None.  Shapes: a type (``int`` never takes a
    bool), a tuple of alternatives (``None`` = null), ``[item]`` (a list of items), ``{"key": shape}`` (an object
    with at least these keys; ``"key?"`` may be absent), ``Any``-like ``object`` (anything)."""
    at = f" at {where}" if where else ""
    if isinstance(shape, tuple):
        if any(check_shape(value, s, where) is None for s in shape):
            return None
        names = "/".join("null" if s is None else _kind(s) for s in shape)
        return f"expected {names}{at}, got {_kind(type(value))}"
    if shape is None:
        return None if value is None else f"expected null{at}, got {_kind(type(value))}"
    if shape is object:
        return None
    if isinstance(shape, list):
        if not isinstance(value, list):
            return f"expected a list{at}, got {_kind(type(value))}"
        for i, v in enumerate(value):
            why = check_shape(v, shape[0], f"{where}[{i}]")
            if why:
                return why
        return None
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return f"expected an object{at}, got {_kind(type(value))}"
        for key, sub in shape.items():
            name, optional = (key[:-1], True) if key.endswith("?") else (key, False)
            if name not in value:
                if optional:
                    continue
                return f"field {where + '.' if where else ''}{name} is missing"
            why = check_shape(value[name], sub, f"{where + '.' if where else ''}{name}")
            if why:
                return why
        return None
    if shape is int and isinstance(value, bool) or not isinstance(value, shape):
        return f"expected {_kind(shape)}{at}, got {_kind(type(value))}"
    return None


def _kind(t: Any) -> str:
    if isinstance(t, list):
        return "a list"
    if isinstance(t, dict):
        return "an object"
    return {dict: "an object", list: "a list", str: "a string", int: "an integer", float: "a number",
            bool: "a boolean", type(None): "null"}.get(t, getattr(t, "__name__", str(t)))


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
