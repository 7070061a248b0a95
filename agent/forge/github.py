"""The GitHub forge over REST: github.com and GitHub Enterprise (its HTTP goes through agent/infra/http.py).

- Base URL from ``github.api_url`` (GHE: ``https://HOST/api/v3``).
- Token from ``github.token_env`` (default GITHUB_TOKEN), then GITHUB_TOKEN, then GH_TOKEN, then
  ``github.token_command`` (run with a timeout).  The token is held in memory only: never stored,
  logged, put in an exception message or in ``repr``.
- Retries, backoff, rate limits and pagination are the shared ``agent.infra.http.ApiClient``; this module keeps
  only GitHub's own quirks (what 401/403/404/422 mean, the secondary limit without headers).
- Pagination follows the ``Link: <...>; rel="next"`` header (bounded).
- 401/403/404 raise ``ForgeAuthError`` with a one-line message saying what to fix.
- Rate limits (429, or 403 with ``Retry-After`` / ``X-RateLimit-Remaining: 0``) are waited out
  with a bounded backoff (the sleep function is injected so tests do not wait).
- Timeouts, connection errors and 5xx are retried only for idempotent calls.  Creating a PR is not
  idempotent: after such a failure the PR is looked up by head branch first, and the create is only
  repeated when none exists (proven not applied).
- Always draft; this module has no call that marks a PR ready or merges it.
"""

from __future__ import annotations

import os
import subprocess
import time
from typing import Any, Callable
from urllib.parse import quote

from agent import __version__
from agent.forge.base import (PR, CIResult, Feedback, FeedbackPage, ForgeAuthError, ForgeConflict, ForgeError,
                              ci_state, with_own_mark)
from agent.forge.base import ForgeRateLimited, ForgeTransient  # noqa: F401  (re-exported: callers import them here)
from agent.forge.hosted import COMMENT, PERMISSION, PULL, STATUS, TEXT, WHO, HostedForge, pr_from_pulls_json

API_VERSION = "2022-11-28"
MAX_PAGES = 50
TOKEN_COMMAND_TIMEOUT = 30
REVIEW = {"id": int, "state?": TEXT, "body?": TEXT, "user?": (WHO, None), "submitted_at?": TEXT, "html_url?": TEXT}
INLINE = {**COMMENT, "path?": TEXT, "line?": (int, None), "original_line?": (int, None),
          "pull_request_review_id?": (int, None)}
STATUS = {**STATUS, "state": str}
CHECK_RUNS = {"check_runs": [{"id": int, "name?": TEXT, "status?": TEXT, "conclusion?": TEXT,
                                   "details_url?": TEXT, "html_url?": TEXT,
                                   "output?": ({"title?": TEXT, "summary?": TEXT}, None),
                                   "app?": ({"slug?": TEXT}, None)}]}


def resolve_token(token_env: str = "GITHUB_TOKEN", token_command: tuple[str, ...] | None = None,
                  environ: dict | None = None) -> str:
    env = os.environ if environ is None else environ
    for name in dict.fromkeys((token_env, "GITHUB_TOKEN", "GH_TOKEN")):
        value = (env.get(name) or "").strip()
        if value:
            return value
    if token_command:
        # Not agent.infra.proc.run: that runner streams stdout to log files, and a token must never touch disk.
        try:
            proc = subprocess.run(list(token_command), capture_output=True, text=True,
                                       timeout=TOKEN_COMMAND_TIMEOUT, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise ForgeAuthError(f"github.token_command: {token_command[0]!r} not found; install it or fix "
                                      "the command in config.yaml") from None
        except subprocess.TimeoutExpired:
            raise ForgeAuthError(f"github.token_command timed out after {TOKEN_COMMAND_TIMEOUT}s; run it by hand "
                                      "to see why (is it waiting for a login?)") from None
        token = proc.stdout.strip()
        if proc.returncode != 0 or not token:
            # stderr may be shown: it is the tool's own complaint, never the token (stdout is not shown)
            why = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
            raise ForgeAuthError(f"github.token_command exited {proc.returncode} without a token ({why}); "
                                      "log it in, e.g. `gh auth login`")
        return token.splitlines()[0].strip()
    raise ForgeAuthError(f"no GitHub token: set {token_env} (or GH_TOKEN) or github.token_command in config.yaml, "
                              "with pull-request write access to the repository")


def _pr_from_json(data: dict) -> PR:
    return pr_from_pulls_json(data)


class GithubForge(HostedForge):
    name = "github"
    display = "GitHub"

    def __init__(self, repo: str, api_url: str = "https://api.github.com",
                 token: str | Callable[[], str] | None = None, session=None,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.time,
                 timeout: tuple[float, float] = (10.0, 30.0), retries: int = 3, max_wait: float = 120.0,
                 backoff: float = 1.0):
        from agent.domain.names import repo_key_problem

        if repo_key_problem(repo, self.name):
            raise ForgeError(f"github: repository {repo!r}: {repo_key_problem(repo, self.name)}")
        super().__init__(repo, api_url, token, session=session, sleep=sleep, clock=clock, timeout=timeout,
                              retries=retries, max_wait=max_wait, backoff=backoff,
                              headers={"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": API_VERSION,
                                       "User-Agent": f"agent-fixer/{__version__}"},
                              rate_limit_hint=_secondary_rate_limit)
        self.owner = repo.split("/")[0]
        self._me: dict | None = None

    @classmethod
    def from_config(cls, repo_config, config, home, ledger=None) -> "GithubForge":
        gh = config.github
        if gh.app:
            from agent.forge.github_app import app_for

            return cls(repo_config.name, timeout=config.forges.timeout, api_url=gh.api_url,
                       token=app_for(config, repo_config.name))
        return cls(repo_config.name, timeout=config.forges.timeout, api_url=gh.api_url,
                   token=lambda: resolve_token(gh.token_env, gh.token_command))

    @property
    def app(self):
        """The GitHub App whose installation tokens this forge uses, or None (a personal token)."""
        return self._token_source if getattr(self._token_source, "renews", False) else None

    # ------------------------------------------------------------------ GitHub's quirks

    def resolve_token(self) -> str:
        return resolve_token()

    def auth_header(self, token: str) -> dict:
        return {"Authorization": f"Bearer {token}"}

    def token_fix(self) -> str:
        if self.app is not None:
            return "check github.app_id, the private key and the app's installation (`agent doctor --online`)"
        return "set a valid GITHUB_TOKEN / GH_TOKEN or fix github.token_command"

    def access_fix(self) -> str:
        if self.app is not None:
            return "give the GitHub App 'pull requests: write' and 'contents: write' and accept them on the installation"
        return "give the token 'pull requests: write' on this repository"

    def check_more(self, resp, what: str, msg: str) -> None:
        if resp.status_code == 422:
            err = GithubValidationError(self.repo, what, resp)
            if err.already_exists:
                raise ForgeConflict(str(err))
            raise err

    def _request(self, method: str, path: str, shape: Any, *, json: Any = None, params: dict | None = None,
                 idempotent: bool = True, what: str = "", not_found_ok: bool = False) -> Any:
        """The answer's JSON, checked against ``shape`` (None for a 404 when ``not_found_ok``)."""
        resp = self.api.request(method, path, json=json, params=params, idempotent=idempotent, what=what,
                                     allow=(404,) if not_found_ok else ())
        if not_found_ok and resp.status_code == 404:
            return None
        return self.api.parse(resp, shape, what)

    def _paginate(self, path: str, params: dict, what: str, item: Any = dict) -> list:
        return self.api.paginate(path, params, what, max_pages=MAX_PAGES, item=item)

    def _pulls(self) -> str:
        owner, name = self.repo.split("/")
        return f"/repos/{quote(owner, safe='')}/{quote(name, safe='')}"

    # ------------------------------------------------------------------ the Forge interface

    def find_pr_by_head(self, branch: str) -> PR | None:
        items = self._paginate(f"{self._pulls()}/pulls",
                                    {"head": f"{self.owner}:{branch}", "state": "all", "per_page": 100},
                                    what=f"listing PRs for {branch}", item=PULL)
        prs = [_pr_from_json(i) for i in items if i["head"]["ref"] == branch]
        if not prs:
            return None
        prs.sort(key=lambda p: (p.state == "open", p.number), reverse=True)
        return prs[0]

    def _create(self, head: str, base: str, title: str, body: str) -> PR:
        payload = {"title": title, "head": head, "base": base, "body": body, "draft": True,
                   "maintainer_can_modify": False}
        return _pr_from_json(self._request("POST", f"{self._pulls()}/pulls", PULL, json=payload, idempotent=False,
                                                what=f"creating the draft PR for {head}"))

    def _find(self, head: str, base: str) -> PR | None:
        return self.find_pr_by_head(head)

    def update(self, number: int, title: str, body: str) -> PR:
        return _pr_from_json(self._request("PATCH", f"{self._pulls()}/pulls/{int(number)}", PULL,
                                                json={"title": title, "body": body}, what=f"updating PR #{number}"))

    def comment(self, number: int, text: str) -> None:
        # Not idempotent (a retry could post twice): no automatic retry; the caller's next scan decides.
        self._request("POST", f"{self._pulls()}/issues/{int(number)}/comments", object, json={"body": text},
                      idempotent=False, what=f"commenting on PR #{number}")

    def add_labels(self, number: int, labels: list[str]) -> None:
        if not labels:
            return
        # Adding labels that are already there is a no-op on GitHub, so a retry is safe.
        self._request("POST", f"{self._pulls()}/issues/{int(number)}/labels", object,
                      json={"labels": list(labels)}, what=f"labelling PR #{number}")

    def state(self, number: int) -> PR:
        return _pr_from_json(self._request("GET", f"{self._pulls()}/pulls/{int(number)}", PULL,
                                                what=f"reading PR #{number}"))

    # ------------------------------------------------------------------ PR feedback and CI

    def feedback(self, number: int, since: str | None = None) -> FeedbackPage:
        n = int(number)
        params = {"per_page": 100}
        if since:
            params["since"] = since
        items: list[Feedback] = []
        for r in self._paginate(f"{self._pulls()}/pulls/{n}/reviews", {"per_page": 100},
                                     what=f"listing reviews of PR #{n}", item=REVIEW):
            submitted = r.get("submitted_at")
            if not submitted or (since and submitted < since):
                continue  # pending reviews are not submitted yet; older ones were read before
            items.append(Feedback(kind="review", id=str(r["id"]), author=_login(r), body=r.get("body") or "",
                                       created_at=submitted, state=(r.get("state") or "").lower() or None,
                                       url=r.get("html_url")))
        for cm in self._paginate(f"{self._pulls()}/pulls/{n}/comments", dict(params),
                                      what=f"listing review comments of PR #{n}", item=INLINE):
            line = cm.get("line") if cm.get("line") is not None else cm.get("original_line")
            review = cm.get("pull_request_review_id")
            items.append(Feedback(kind="inline", id=str(cm["id"]), author=_login(cm), body=cm.get("body") or "",
                                       created_at=cm.get("created_at") or "", path=cm.get("path"),
                                       line=int(line) if line is not None else None,
                                       review_id=str(review) if review else None, url=cm.get("html_url")))
        for cm in self._paginate(f"{self._pulls()}/issues/{n}/comments", dict(params),
                                      what=f"listing comments of PR #{n}", item=COMMENT):
            items.append(Feedback(kind="comment", id=str(cm["id"]), author=_login(cm), body=cm.get("body") or "",
                                       created_at=cm.get("created_at") or "", url=cm.get("html_url")))
        if self.app is not None:  # the app's own unmarked comments are never feedback (as on GitLab and Gitea)
            me = self.own_login()
            items = [f for f in items if f.author != me or f.own_key is not None]
        items.sort(key=lambda f: (f.created_at, f.kind != "review", int(f.id) if f.id.isdigit() else 0))
        cursor = max([since or ""] + [f.created_at for f in items]) or None
        return FeedbackPage(items=items, cursor=cursor)

    def has_write_access(self, login: str) -> bool:
        data = self._request("GET", f"{self._pulls()}/collaborators/{quote(login, safe='')}/permission",
                                  PERMISSION, what=f"reading {login}'s permission", not_found_ok=True)
        if data is None:
            return False  # not a user, or not a collaborator
        return (data.get("permission") in ("admin", "write")
                or data.get("role_name") in ("admin", "maintain", "write"))

    def reply(self, number: int, text: str, key: str) -> str:
        # Not idempotent: never retried here; the caller looks for its own mark before posting again.
        made = self._request("POST", f"{self._pulls()}/issues/{int(number)}/comments", COMMENT,
                                  json={"body": with_own_mark(text, key)}, idempotent=False,
                                  what=f"replying on PR #{number}")
        return str(made["id"])

    def ci_results(self, sha: str) -> list[CIResult]:
        out: list[CIResult] = []
        seen: set[str] = set()
        for st in self._paginate(f"{self._pulls()}/commits/{quote(sha, safe='')}/statuses", {"per_page": 100},
                                      what=f"listing commit statuses of {sha[:12]}", item=STATUS):
            context = st.get("context") or "default"
            if context in seen:
                continue  # newest first: the first per context is the current one
            seen.add(context)
            out.append(CIResult(kind="status", id=str(st.get("id")), name=context,
                                     state=ci_state(st.get("state")), conclusion=st.get("state") or "",
                                     summary=st.get("description") or "", url=st.get("target_url"), head_sha=sha))
        url: str | None = f"{self._pulls()}/commits/{quote(sha, safe='')}/check-runs"
        params: dict | None = {"per_page": 100, "filter": "latest"}
        for _ in range(MAX_PAGES):
            resp = self.api.request("GET", url, params=params, what=f"listing check runs of {sha[:12]}")
            for run in self.api.parse(resp, CHECK_RUNS, f"listing check runs of {sha[:12]}")["check_runs"]:
                output = run.get("output") or {}
                summary = "\n".join(x for x in (output.get("title"), output.get("summary")) if x)
                out.append(CIResult(kind="check_run", id=str(run.get("id")), name=run.get("name") or "check",
                                         state=ci_state(run.get("status"), run.get("conclusion")),
                                         conclusion=run.get("conclusion") or run.get("status") or "",
                                         summary=summary, url=run.get("details_url") or run.get("html_url"),
                                         head_sha=sha, app=str((run.get("app") or {}).get("slug") or "")))
            url, params = resp.links.get("next", {}).get("url"), None
            if not url:
                break
        return out

    def own_login(self) -> str | None:
        """The login the agent's PRs and comments show: the app's ``<slug>[bot]``, else the token's user (GET /user,
        once per forge object)."""
        if self.app is not None:
            return self.app.bot_login()
        if self._me is None:
            self._me = self.user()
        return self._me["login"]

    def user(self) -> dict:
        """GET /user: who the token belongs to (``agent doctor --online``); 401/403 raise ForgeAuthError."""
        return self._request("GET", "/user", {"login": str, "id?": int}, what="reading the token's user")


class GithubValidationError(ForgeError):
    """A 422 from GitHub; ``already_exists`` when it says a PR for the head already exists."""

    def __init__(self, repo: str, what: str, resp):
        self.status = resp.status_code
        try:
            data = resp.json()
        except ValueError:
            data = {}
        self.errors = (data.get("errors") or []) if isinstance(data, dict) else []
        details = "; ".join(str(e.get("message") or e.get("code") or e) if isinstance(e, dict) else str(e)
                                 for e in self.errors)
        text = (data.get("message") if isinstance(data, dict) else None) or "Validation Failed"
        self.already_exists = "already exists" in details.lower() or "already exists" in text.lower()
        super().__init__(f"github {repo}: {what} was rejected (422 {text}{': ' + details if details else ''}); "
                              "check the branch exists on the remote and differs from the base")


def _login(item: dict) -> str:
    return ((item.get("user") or {}).get("login")) or "ghost"


def _message(resp) -> str:
    from agent.infra.http import response_message

    return response_message(resp)


def _secondary_rate_limit(resp) -> float | None:
    """GitHub's secondary limit can come as a 403 without rate-limit headers: it asks for at least a minute."""
    return 60.0 if "rate limit" in _message(resp).lower() else None
