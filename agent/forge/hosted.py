"""What every hosted forge (GitHub, GitLab, Gitea/Forgejo) shares; each subclass keeps only its forge's quirks.

- One HTTP path: ``self.api`` is an ``agent.infra.http.ApiClient`` (retries, backoff, rate limits, pagination); the
  subclass gives it ``auth_header`` (how the token travels) and ``_check`` (what its 4xx answers mean).
- The token is resolved lazily, once, and held in memory only: never stored, logged, put in a message or ``repr``.
- One create path, ``create_draft``: a create is not idempotent, so after a timeout, a dropped connection or a 5xx
  the PR is looked up by head branch first and the create is only repeated when none exists (proven not
  applied); a conflict answer ("one exists already") adopts the existing PR only if it is open, a draft and on our
  branch (``adoption_refusal``), and anything else is refused with the reason.
"""

from __future__ import annotations

import time
from typing import Callable

from agent.forge.base import (PR, ForgeAuthError, ForgeBadAnswer, ForgeConflict, ForgeError, ForgeRateLimited,
                              ForgeTransient, adoption_refusal)


# The JSON shapes (agent.infra.http.check_shape) GitHub and Gitea/Forgejo answers must have; more fields are fine.
TEXT = (str, None)
WHO = {"login": str}
PULL = {"number": int, "state": str, "head": {"ref": str, "sha?": TEXT}, "base": {"ref": str}, "title?": TEXT,
        "body?": TEXT, "html_url?": TEXT, "draft?": (bool, None), "merged?": (bool, None), "merged_at?": TEXT}
COMMENT = {"id": int, "body?": TEXT, "user?": (WHO, None), "created_at?": TEXT, "html_url?": TEXT}
STATUS = {"id": int, "context?": TEXT, "description?": TEXT, "target_url?": TEXT}
PERMISSION = {"permission": TEXT, "role_name?": TEXT}


def pr_from_pulls_json(data: dict, title: str | None = None, draft: bool = False) -> PR:
    """A PR from the pull-request JSON GitHub and Gitea/Forgejo share (``number``, ``head{ref,sha}``, ``merged``).
    ``title``/``draft`` override what the JSON says (Gitea: the title without its WIP prefix)."""
    state = data.get("state") or "open"
    if data.get("merged") or data.get("merged_at"):
        state = "merged"
    head = data.get("head") or {}
    base = data.get("base") or {}
    return PR(number=int(data["number"]), url=data.get("html_url") or data.get("url") or "",
              head=head.get("ref") or "", head_sha=head.get("sha"), base=base.get("ref") or "",
              state=state, draft=bool(data.get("draft") or draft),
              title=data.get("title") or "" if title is None else title, body=data.get("body") or "")


class HostedForge:
    name = "hosted"
    display = "the forge"
    noun = "pull request"             # GitLab: merge request

    def __init__(self, repo: str, api_url: str, token: str | Callable[[], str] | None = None, *, session=None,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.time,
                 timeout: tuple[float, float] = (10.0, 30.0), retries: int = 3, max_wait: float = 120.0,
                 backoff: float = 1.0, headers: dict | None = None, rate_limit_hint=None):
        from agent.infra.http import ApiClient

        self.repo = repo
        self.api_url = api_url.rstrip("/")
        self._token_source = token
        self._token: str | None = None
        self.api = ApiClient(f"{self.name} {repo}", self.display, self.api_url, self._auth_headers,
                                  check=self._check, session=session, headers=headers, sleep=sleep, clock=clock,
                                  timeout=timeout, retries=retries, max_wait=max_wait, backoff=backoff,
                                  transient_error=ForgeTransient, rate_limited_error=ForgeRateLimited,
                                  rate_limit_hint=rate_limit_hint, error=ForgeError, bad_answer_error=ForgeBadAnswer,
                                  reauth=self._reauth)

    def __repr__(self) -> str:  # never shows the token
        return f"{type(self).__name__}(repo={self.repo!r}, api_url={self.api_url!r})"

    # ------------------------------------------------------------------ for subclasses

    def resolve_token(self) -> str:
        """The token when none was given (reads the configured variable); raises ForgeAuthError."""
        raise NotImplementedError

    def auth_header(self, token: str) -> dict:
        raise NotImplementedError

    def token_fix(self) -> str:
        """What to do when the token is refused (401)."""
        raise NotImplementedError

    def access_fix(self) -> str:
        """What to do when access is denied (403)."""
        raise NotImplementedError

    def check_more(self, resp, what: str, msg: str) -> None:
        """The forge's other 4xx answers: raise ``ForgeConflict`` when a PR for the head exists, ForgeError for
        a refusal it can name; return for anything else (a generic ForgeError follows)."""

    def _check(self, resp, what: str) -> None:
        """What a 4xx answer means (rate limits were handled before): one line saying what to do."""
        from agent.infra.http import response_message
        from agent.infra.redact import redact

        msg = redact(response_message(resp))[:160]
        where = f"{self.name} {self.repo}"
        if resp.status_code == 401:
            raise ForgeAuthError(f"{where}: the token was refused (401) on {what}; {self.token_fix()}, then "
                                      "`agent task reset`")
        if resp.status_code == 403:
            raise ForgeAuthError(f"{where}: access denied (403) on {what}: {msg[:120]}; {self.access_fix()}, then "
                                      "`agent task reset`")
        if resp.status_code == 404:
            raise ForgeAuthError(f"{where}: not found (404) on {what}; the repository does not exist or the token "
                                      f"cannot see it: check repos: in config.yaml and {self.name}.api_url "
                                      f"({self.api_url})")
        if resp.status_code == 409:
            raise ForgeConflict(f"{where}: {what} conflicts (409): {msg}")
        self.check_more(resp, what, msg)

    def _create(self, head: str, base: str, title: str, body: str) -> PR:
        raise NotImplementedError

    def _find(self, head: str, base: str) -> PR | None:
        raise NotImplementedError

    def update(self, number: int, title: str, body: str) -> PR:
        raise NotImplementedError

    # ------------------------------------------------------------------ shared

    def _reauth(self) -> bool:
        """A 401: a renewing token source (a GitHub App) forgets its cached token and the call is tried once more."""
        forget = getattr(self._token_source, "forget", None)
        if getattr(self._token_source, "renews", False) and forget is not None:
            forget()
            return True
        return False

    def _auth_headers(self) -> dict:
        if getattr(self._token_source, "renews", False):   # a GitHub App: its token changes; it caches it
            return self.auth_header(self._token_source())
        if self._token is None:
            src = self._token_source
            token = src() if callable(src) else src
            self._token = token if token else self.resolve_token()
        return self.auth_header(self._token)

    def create_draft(self, head: str, base: str, title: str, body: str, task_id: int | None = None) -> PR:
        for attempt in range(1, self.api.retries + 2):
            try:
                return self._create(head, base, title, body)
            except ForgeConflict as exc:
                return self._adopt(head, title, body, self._find(head, base), exc)
            except ForgeTransient:
                # The create may or may not have happened: look before creating again.
                found = self._find(head, base)
                if found is not None:
                    return self._adopt(head, title, body, found, None)
                if attempt > self.api.retries:
                    raise
                self.api.sleep(self.api.backoff_wait(attempt))
        raise AssertionError("unreachable")  # pragma: no cover

    def _adopt(self, head: str, title: str, body: str, found: PR | None, exc: Exception | None) -> PR:
        if found is None:
            raise ForgeError(f"{self.name} {self.repo}: {self.display} says a {self.noun} for {head} exists but none "
                                  f"is listed; check the repository's {self.noun}s") from exc
        why = adoption_refusal(found, head)
        if why:
            raise ForgeError(f"{self.name} {self.repo}: {why.replace('pull request', self.noun)}") from None
        if found.title != title or found.body != body:
            return self.update(found.number, title, body)
        return found
