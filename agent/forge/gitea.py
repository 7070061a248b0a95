"""The Gitea (and Forgejo) forge over REST API v1 (its HTTP is agent/infra/http.py's ApiClient).

Gitea's quirks, all here:
- Base URL from ``gitea.api_url`` (``https://HOST[/sub]/api/v1``); the token from the variable named by
  ``gitea.token_env`` (default GITEA_TOKEN), sent as ``Authorization: token <t>``, held in memory only.
- No draft flag on create or update: a draft is a title starting with one of the instance's
  ``[repository.pull-request] WORK_IN_PROGRESS_PREFIXES`` (default ``WIP:,[WIP]``, case-insensitive).  The agent
  writes ``gitea.wip_prefix`` (default ``WIP: ``) and reports titles without it; an update keeps the PR's
  current draft state, so a human who marked it ready is never overruled.
- Found again by ``GET /repos/{o}/{r}/pulls/{base}/{head}`` (404: none).
- ``state`` is ``open|closed`` for merged and unmerged PRs alike: ``merged`` (and ``merged_at``) tell them apart.
- A duplicate create answers 409: the open draft on our branch is adopted, anything else refused.
- Labels are set by id: names are looked up (``GET /repos/{o}/{r}/labels``) and missing ones created.
- Gitea documents no rate limit; a 429 or ``Retry-After`` (e.g. from a proxy) is honoured by ApiClient.
  Pagination: ``page``/``limit`` with a ``Link`` header.
- Review feedback: issue comments (conversation), PR reviews and their review comments (inline, ``path`` and
  ``position``).  The tool's own comments are recognised by ``GET /user``.  Write access:
  ``collaborators/{user}/permission`` is ``write``, ``admin`` or ``owner``.  CI: the commit statuses of the head.
"""

from __future__ import annotations

import os
import time
from typing import Callable
from urllib.parse import quote

from agent.forge.base import (PR, CIResult, Feedback, FeedbackPage, ForgeAuthError, ForgeError, ci_state,
                              own_key, with_own_mark)
from agent.forge.hosted import COMMENT, PERMISSION, PULL, STATUS, TEXT, WHO, HostedForge, pr_from_pulls_json

DEFAULT_WIP_PREFIXES = ("WIP:", "[WIP]")
WRITE_PERMISSIONS = ("write", "admin", "owner")
REVIEW_STATES = {"APPROVED": "approved", "REQUEST_CHANGES": "changes_requested", "COMMENT": "commented"}
MAX_PAGES = 50
PAGE_LIMIT = 50                  # Gitea's default MAX_RESPONSE_ITEMS
# The JSON shapes (agent.infra.http.check_shape) Gitea's answers must have; more fields are fine.
USER = {"id": int, "login": str}
LABEL = {"id": int, "name": str}
REVIEW = {"id": int, "state?": TEXT, "body?": TEXT, "user?": (WHO, None), "dismissed?": (bool, None),
          "submitted_at?": TEXT, "updated_at?": TEXT, "comments_count?": (int, None), "html_url?": TEXT}
INLINE = {**COMMENT, "path?": TEXT, "position?": (int, None), "original_position?": (int, None)}
STATUS = {**STATUS, "status?": TEXT}


def resolve_token(token_env: str = "GITEA_TOKEN", environ: dict | None = None) -> str:
    env = os.environ if environ is None else environ
    value = (env.get(token_env) or "").strip()
    if not value:
        raise ForgeAuthError(f"no Gitea token: set {token_env} (an access token with write:repository and "
                                  "write:issue scopes) or change gitea.token_env")
    return value


def _login(item: dict) -> str:
    return ((item.get("user") or {}).get("login")) or "ghost"


def strip_wip(title: str, prefixes: tuple[str, ...] = DEFAULT_WIP_PREFIXES) -> tuple[str, bool]:
    """(title without a work-in-progress prefix, whether it had one); case-insensitive like Gitea."""
    text = title or ""
    for prefix in sorted({p.strip() for p in prefixes if p.strip()}, key=len, reverse=True):
        if text.lower().startswith(prefix.lower()):
            return text[len(prefix):].lstrip(), True
    return text, False


class GiteaForge(HostedForge):
    name = "gitea"
    display = "Gitea"

    def __init__(self, repo: str, api_url: str = "https://gitea.com/api/v1",
                 token: str | Callable[[], str] | None = None, base: str = "main", wip_prefix: str = "WIP: ",
                 session=None, sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.time,
                 timeout: tuple[float, float] = (10.0, 30.0), retries: int = 3, max_wait: float = 120.0,
                 backoff: float = 1.0, token_env: str = "GITEA_TOKEN"):
        from agent.domain.names import repo_key_problem

        if repo_key_problem(repo, self.name):
            raise ForgeError(f"gitea: repository {repo!r}: {repo_key_problem(repo, self.name)}")
        super().__init__(repo, api_url, token, session=session, sleep=sleep, clock=clock, timeout=timeout,
                              retries=retries, max_wait=max_wait, backoff=backoff)
        self.owner, self.repo_name = repo.split("/")
        self.base = base
        self.token_env = token_env
        self.wip_prefix = wip_prefix if wip_prefix.endswith(" ") else wip_prefix + " "
        self.wip_prefixes = tuple(dict.fromkeys((*DEFAULT_WIP_PREFIXES, wip_prefix.strip())))
        self._me: dict | None = None

    @classmethod
    def from_config(cls, repo_config, config, home, ledger=None) -> "GiteaForge":
        gt = config.gitea
        return cls(repo_config.name, timeout=config.forges.timeout, api_url=gt.api_url, base=repo_config.base,
                   wip_prefix=gt.wip_prefix,
                   token_env=gt.token_env, token=lambda: resolve_token(gt.token_env))

    # ------------------------------------------------------------------ Gitea's quirks

    def resolve_token(self) -> str:
        return resolve_token(self.token_env)

    def auth_header(self, token: str) -> dict:
        return {"Authorization": f"token {token}"}

    def token_fix(self) -> str:
        return f"set a valid token in {self.token_env}"

    def access_fix(self) -> str:
        return "the token needs write access to the repository (write:repository, write:issue)"

    def check_more(self, resp, what: str, msg: str) -> None:
        if resp.status_code == 423:
            raise ForgeError(f"gitea {self.repo}: the repository is archived (423) on {what}; unarchive it or "
                                  "remove it from repos: in config.yaml")
        if resp.status_code == 422:
            raise ForgeError(f"gitea {self.repo}: {what} was rejected (422: {msg}); check the branch exists on "
                                  "the remote and differs from the base")

    def _repo_path(self) -> str:
        return f"/repos/{quote(self.owner, safe='')}/{quote(self.repo_name, safe='')}"

    def _pr_from_json(self, data: dict) -> PR:
        title, prefixed = strip_wip(data.get("title") or "", self.wip_prefixes)
        return pr_from_pulls_json(data, title=title, draft=prefixed)

    def _get_pr(self, number: int) -> dict:
        return self.api.call("GET", f"{self._repo_path()}/pulls/{int(number)}", PULL, what=f"reading PR #{number}")

    # ------------------------------------------------------------------ the Forge interface

    def find_pr_by_head(self, branch: str, base: str | None = None) -> PR | None:
        base = base or self.base
        resp = self.api.request("GET", f"{self._repo_path()}/pulls/{quote(base, safe='')}/{quote(branch, safe='')}",
                                     what=f"looking up the PR for {branch}", allow=(404,))
        if resp.status_code == 404:
            return None
        pr = self._pr_from_json(self.api.parse(resp, PULL, f"looking up the PR for {branch}"))
        return pr if pr.head == branch else None

    def _create(self, head: str, base: str, title: str, body: str) -> PR:
        payload = {"head": head, "base": base, "title": self.wip_prefix + title, "body": body}
        return self._pr_from_json(self.api.call("POST", f"{self._repo_path()}/pulls", PULL, json=payload,
                                                     idempotent=False, what=f"creating the draft PR for {head}"))

    def _find(self, head: str, base: str) -> PR | None:
        return self.find_pr_by_head(head, base)

    def update(self, number: int, title: str, body: str) -> PR:
        current = self._pr_from_json(self._get_pr(number))
        return self._pr_from_json(self.api.call(
            "PATCH", f"{self._repo_path()}/pulls/{int(number)}", PULL,
            json={"title": (self.wip_prefix if current.draft else "") + title, "body": body},
            what=f"updating PR #{number}"))

    def comment(self, number: int, text: str) -> None:
        # Not idempotent (a retry could post twice): no automatic retry; the caller's next scan decides.
        self.api.request("POST", f"{self._repo_path()}/issues/{int(number)}/comments", json={"body": text},
                              idempotent=False, what=f"commenting on PR #{number}")

    def add_labels(self, number: int, labels: list[str]) -> None:
        if not labels:
            return
        known = {lb["name"]: lb["id"] for lb in self.api.paginate(
            f"{self._repo_path()}/labels", {"limit": PAGE_LIMIT}, what="listing labels", item=LABEL)}
        ids = []
        for name in dict.fromkeys(labels):
            if name not in known:
                made = self.api.call("POST", f"{self._repo_path()}/labels", LABEL,
                                          json={"name": name, "color": "#ededed"}, idempotent=False,
                                          what=f"creating label {name!r}")
                known[name] = made["id"]
            ids.append(int(known[name]))
        # Adding labels the PR already has is a no-op, so a retry is harmless.
        self.api.request("POST", f"{self._repo_path()}/issues/{int(number)}/labels", json={"labels": ids},
                              what=f"labelling PR #{number}")

    def state(self, number: int) -> PR:
        return self._pr_from_json(self._get_pr(number))

    def user(self) -> dict:
        """GET /user: who the token belongs to (``agent doctor --online``, own comments)."""
        if self._me is None:
            self._me = self.api.call("GET", "/user", USER, what="reading the token's user")
        return self._me

    # ------------------------------------------------------------------ PR feedback and CI

    def feedback(self, number: int, since: str | None = None) -> FeedbackPage:
        """Submitted reviews (with their verdict), their inline comments (path, line) and the conversation's
        issue comments, oldest first.  Pending and review-request entries are not feedback.  The token user's
        own comments count only when they carry the agent's mark (its replies); its other comments never do."""
        n = int(number)
        me = int(self.user()["id"])
        items: list[Feedback] = []

        def keep(user: dict | None, body: str, created: str) -> bool:
            if since and created < since:
                return False
            return not ((user or {}).get("id") == me and own_key(body) is None)

        for r in self.api.paginate(f"{self._repo_path()}/pulls/{n}/reviews", {"limit": PAGE_LIMIT},
                                        what=f"listing reviews of PR #{n}", max_pages=MAX_PAGES, item=REVIEW):
            state = REVIEW_STATES.get(str(r.get("state") or "").upper())
            if state is None:
                continue                      # PENDING (not submitted) or REQUEST_REVIEW (a request, no words)
            if r.get("dismissed"):
                state = "dismissed"
            created = r.get("submitted_at") or r.get("updated_at") or ""
            body = r.get("body") or ""
            if keep(r.get("user"), body, created):
                items.append(Feedback(kind="review", id=str(r["id"]), author=_login(r), body=body,
                                           created_at=created, state=state, url=r.get("html_url")))
            if not r.get("comments_count"):
                continue
            for c in self.api.call("GET", f"{self._repo_path()}/pulls/{n}/reviews/{int(r['id'])}/comments", [INLINE],
                                        what=f"reading review {r['id']} of PR #{n}"):
                line = c.get("position") or c.get("original_position") or None
                created, body = c.get("created_at") or "", c.get("body") or ""
                if keep(c.get("user"), body, created):
                    items.append(Feedback(kind="inline", id=str(c["id"]), author=_login(c), body=body,
                                               created_at=created, path=c.get("path"),
                                               line=int(line) if line else None, review_id=str(r["id"]),
                                               url=c.get("html_url")))
        params = {"since": since} if since else None
        for c in self.api.call("GET", f"{self._repo_path()}/issues/{n}/comments", [COMMENT], params=params,
                                    what=f"listing comments of PR #{n}"):
            created, body = c.get("created_at") or "", c.get("body") or ""
            if keep(c.get("user"), body, created):
                items.append(Feedback(kind="comment", id=str(c["id"]), author=_login(c), body=body,
                                           created_at=created, url=c.get("html_url")))
        items.sort(key=lambda f: (f.created_at, f.kind != "review", int(f.id) if f.id.isdigit() else 0))
        cursor = max([since or ""] + [f.created_at for f in items]) or None
        return FeedbackPage(items=items, cursor=cursor)

    def own_login(self) -> str | None:
        return str(self.user().get("login") or "") or None

    def reply(self, number: int, text: str, key: str) -> str:
        # Not idempotent: never retried here; the caller looks for its own mark before posting again.
        made = self.api.call("POST", f"{self._repo_path()}/issues/{int(number)}/comments", COMMENT,
                                  json={"body": with_own_mark(text, key)}, idempotent=False,
                                  what=f"replying on PR #{number}")
        return str(made["id"])

    def ci_results(self, sha: str) -> list[CIResult]:
        """The newest commit status per context (Gitea Actions and external CI both report statuses)."""
        statuses = self.api.paginate(f"{self._repo_path()}/statuses/{quote(sha, safe='')}", {"limit": PAGE_LIMIT},
                                          what=f"listing commit statuses of {sha[:12]}", max_pages=MAX_PAGES,
                                          item=STATUS)
        out: list[CIResult] = []
        seen: set[str] = set()
        for st in sorted(statuses, key=lambda x: int(x.get("id") or 0), reverse=True):
            context = st.get("context") or "default"
            if context in seen:
                continue
            seen.add(context)
            word = st.get("status") or ""
            out.append(CIResult(kind="status", id=str(st.get("id")), name=context, state=ci_state(word),
                                     conclusion=word, summary=st.get("description") or "", url=st.get("target_url"),
                                     head_sha=sha))
        return out

    # ------------------------------------------------------------------ who may steer

    def permission(self, login: str) -> str:
        """``none|read|write|admin|owner`` of ``login`` on the repository; an unknown user is ``none``.

        Gitea lets a token read only its own permission unless it is admin on the repository (or a site admin):
        a 403 says so in one line rather than silently meaning "no access"."""
        resp = self.api.request("GET", f"{self._repo_path()}/collaborators/{quote(login, safe='')}/permission",
                                     allow=(403, 404), what=f"reading {login}'s permission")
        if resp.status_code == 404:
            return "none"
        if resp.status_code == 403:
            raise ForgeAuthError(f"gitea {self.repo}: reading {login}'s permission was refused (403); Gitea "
                                      "answers it only to repository admins: give the token's user admin on the "
                                      "repository, or list trusted reviewers in review.allowed_users")
        return str(self.api.parse(resp, PERMISSION, f"reading {login}'s permission")["permission"] or "none")

    def has_write_access(self, login: str) -> bool:
        return self.permission(login) in WRITE_PERMISSIONS
