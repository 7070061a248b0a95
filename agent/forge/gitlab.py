"""The GitLab forge over REST API v4: gitlab.com and self-managed instances (its HTTP is agent/infra/http.py's ApiClient).

GitLab's quirks, all here:
- Base URL from ``gitlab.api_url`` (self-managed: ``https://HOST/api/v4``); the token from the variable named by
  ``gitlab.token_env`` (default GITLAB_TOKEN), sent as ``PRIVATE-TOKEN``, held in memory only.
- A project is addressed by its URL-encoded path (``group%2Fsub%2Fname``); branch names are encoded too.
- Merge requests are addressed by ``iid`` (the N in !N), which is what ``PR.number`` holds.
- There is no draft flag on create or update: a draft is a title starting with ``Draft:`` (also ``[Draft]``,
  ``(Draft)``).  The agent writes ``Draft: `` and reports titles without the prefix.  An update keeps whatever
  draft state the MR has now, so a human who marked it ready is never overruled.
- Found again by source and target branch (``GET /projects/:id/merge_requests?source_branch=&target_branch=``).
- ``state`` is ``opened|closed|locked|merged``: opened and locked are open; merged and closed are told apart by
  the state itself.
- A duplicate create answers 409 ("Another open merge request already exists for this source branch"): the
  open draft on our branch is adopted, anything else refused with the reason.
- Throttling answers 429 with ``Retry-After`` and ``RateLimit-*`` headers (handled by ApiClient); pagination
  follows ``Link: rel="next"`` or ``X-Next-Page``.
- Review feedback: notes of the MR's discussions (system notes ignored); a ``DiffNote`` is an inline comment
  (``position.new_path``/``new_line``).  The tool's own notes are recognised by ``GET /user``: an own note
  without the agent's hidden mark (a plain ``comment``) is never feedback.
- Write access: the effective (inherited or invited) ``access_level`` from ``members/all/:user_id`` >= 30
  (Developer).  CI: the commit statuses and the pipelines of the head sha.
"""

from __future__ import annotations

import os
import re
import time
from typing import Callable
from urllib.parse import quote

from agent.forge.base import (PR, CIResult, Feedback, FeedbackPage, ForgeAuthError, ForgeError, ci_state,
                              own_key, with_own_mark)
from agent.forge.hosted import TEXT, HostedForge

DRAFT_PREFIX = "Draft: "
_DRAFT_RE = re.compile(r"^\s*(?:draft:|\[draft\]|\(draft\))\s*", re.I)
WRITE_ACCESS_LEVEL = 30          # Developer; 40 Maintainer, 50 Owner
MAX_PAGES = 50
# The JSON shapes (agent.infra.http.check_shape) GitLab's answers must have; more fields are fine.
USER = {"id": int, "username": str}
MR = {"iid": int, "state": str, "source_branch": str, "target_branch": str, "title": str, "description?": TEXT,
      "sha?": TEXT, "web_url?": TEXT, "draft?": (bool, None), "work_in_progress?": (bool, None),
      "merged_at?": TEXT}
NOTE = {"id": int, "body?": TEXT, "author?": (USER, None), "system?": (bool, None), "type?": TEXT,
        "created_at?": TEXT, "position?": ({"new_path?": TEXT, "old_path?": TEXT, "new_line?": (int, None),
                                                   "old_line?": (int, None)}, None)}
DISCUSSION = {"id": (str, int), "notes?": ([NOTE], None)}
STATUS = {"id": int, "status": str, "name?": TEXT, "description?": TEXT, "target_url?": TEXT}
PIPELINE = {"id": int, "status": str, "source?": TEXT, "ref?": TEXT, "web_url?": TEXT}


def resolve_token(token_env: str = "GITLAB_TOKEN", environ: dict | None = None) -> str:
    env = os.environ if environ is None else environ
    value = (env.get(token_env) or "").strip()
    if not value:
        raise ForgeAuthError(f"no GitLab token: set {token_env} (a personal, project or group access token with "
                                  "the api scope and at least the Developer role) or change gitlab.token_env")
    return value


def strip_draft(title: str) -> tuple[str, bool]:
    """(title without a draft prefix, whether it had one)."""
    m = _DRAFT_RE.match(title or "")
    return ((title or "")[m.end():], True) if m else (title or "", False)


def _ci_word(word: str) -> str:
    """GitLab's CI words that ``ci_state`` does not know: still running, or stopped by a human."""
    return {"waiting_for_callback": "pending", "canceling": "canceled"}.get(word, word)


def _pr_from_json(data: dict) -> PR:
    title, prefixed = strip_draft(data.get("title") or "")
    raw_state = data.get("state") or "opened"
    state = {"opened": "open", "locked": "open", "merged": "merged", "closed": "closed"}.get(raw_state, raw_state)
    if data.get("merged_at") and state == "closed":
        state = "merged"
    draft = bool(data.get("draft") or data.get("work_in_progress") or prefixed)
    return PR(number=int(data["iid"]), url=data.get("web_url") or "", head=data.get("source_branch") or "",
              head_sha=data.get("sha"), base=data.get("target_branch") or "", state=state, draft=draft,
              title=title, body=data.get("description") or "")


class GitlabForge(HostedForge):
    name = "gitlab"
    display = "GitLab"
    noun = "merge request"

    def __init__(self, repo: str, api_url: str = "https://gitlab.com/api/v4",
                 token: str | Callable[[], str] | None = None, base: str = "main", session=None,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.time,
                 timeout: tuple[float, float] = (10.0, 30.0), retries: int = 3, max_wait: float = 120.0,
                 backoff: float = 1.0, token_env: str = "GITLAB_TOKEN"):
        from agent.domain.names import repo_key_problem

        if repo_key_problem(repo, self.name):
            raise ForgeError(f"gitlab: repository {repo!r}: {repo_key_problem(repo, self.name)}")
        super().__init__(repo, api_url, token, session=session, sleep=sleep, clock=clock, timeout=timeout,
                              retries=retries, max_wait=max_wait, backoff=backoff)
        self.base = base
        self.token_env = token_env
        self._me: dict | None = None

    @classmethod
    def from_config(cls, repo_config, config, home, ledger=None) -> "GitlabForge":
        gl = config.gitlab
        return cls(repo_config.name, timeout=config.forges.timeout, api_url=gl.api_url, base=repo_config.base,
                   token_env=gl.token_env,
                   token=lambda: resolve_token(gl.token_env))

    # ------------------------------------------------------------------ GitLab's quirks

    def resolve_token(self) -> str:
        return resolve_token(self.token_env)

    def auth_header(self, token: str) -> dict:
        return {"PRIVATE-TOKEN": token}

    def token_fix(self) -> str:
        return f"set a valid token (scope api) in {self.token_env}"

    def access_fix(self) -> str:
        return "the token's user needs at least the Developer role on the project"

    def check_more(self, resp, what: str, msg: str) -> None:
        if resp.status_code in (400, 422):
            raise ForgeError(f"gitlab {self.repo}: {what} was rejected ({resp.status_code}: {msg}); check the "
                                  "branch exists on the remote and differs from the target branch")

    def _project(self) -> str:
        return f"/projects/{quote(self.repo, safe='')}"

    def _mr(self, iid: int) -> str:
        return f"{self._project()}/merge_requests/{int(iid)}"

    def _get_mr(self, iid: int) -> dict:
        return self.api.call("GET", self._mr(iid), MR, what=f"reading MR !{iid}")

    # ------------------------------------------------------------------ the Forge interface

    def find_pr_by_head(self, branch: str, base: str | None = None) -> PR | None:
        params = {"source_branch": branch, "state": "all", "per_page": 100}
        if base or self.base:
            params["target_branch"] = base or self.base
        items = self.api.paginate(f"{self._project()}/merge_requests", params,
                                       what=f"listing MRs for {branch}", max_pages=MAX_PAGES, item=MR)
        prs = [_pr_from_json(i) for i in items if i["source_branch"] == branch]
        if not prs:
            return None
        prs.sort(key=lambda p: (p.state == "open", p.number), reverse=True)
        return prs[0]

    def _create(self, head: str, base: str, title: str, body: str) -> PR:
        payload = {"source_branch": head, "target_branch": base, "title": DRAFT_PREFIX + title,
                   "description": body, "remove_source_branch": False}
        return _pr_from_json(self.api.call("POST", f"{self._project()}/merge_requests", MR, json=payload,
                                                idempotent=False, what=f"creating the draft MR for {head}"))

    def _find(self, head: str, base: str) -> PR | None:
        return self.find_pr_by_head(head, base)

    def update(self, number: int, title: str, body: str) -> PR:
        current = _pr_from_json(self._get_mr(number))
        return _pr_from_json(self.api.call("PUT", self._mr(number), MR,
                                                json={"title": (DRAFT_PREFIX if current.draft else "") + title,
                                                      "description": body},
                                                what=f"updating MR !{number}"))

    def comment(self, number: int, text: str) -> None:
        # Not idempotent (a retry could post twice): no automatic retry; the caller's next scan decides.
        self.api.request("POST", f"{self._mr(number)}/notes", json={"body": text}, idempotent=False,
                              what=f"commenting on MR !{number}")

    def add_labels(self, number: int, labels: list[str]) -> None:
        if not labels:
            return
        # add_labels keeps the labels already there, so a retry is harmless.
        self.api.request("PUT", self._mr(number), json={"add_labels": ",".join(labels)},
                              what=f"labelling MR !{number}")

    def state(self, number: int) -> PR:
        return _pr_from_json(self._get_mr(number))

    def user(self) -> dict:
        """GET /user: who the token belongs to (``agent doctor --online``, own notes)."""
        if self._me is None:
            self._me = self.api.call("GET", "/user", USER, what="reading the token's user")
        return self._me

    # ------------------------------------------------------------------ PR feedback and CI

    def feedback(self, number: int, since: str | None = None) -> FeedbackPage:
        """Every note of the MR's discussions, oldest first: a ``DiffNote`` is ``inline`` (path and line of the
        new file, the thread id as ``review_id``), any other note a ``comment``.  System notes ("added 1 commit",
        "marked as draft") are not feedback.  GitLab has no review objects with a verdict; approvals are not
        read.  The token user's own notes count only when they carry the agent's mark (its replies, so the
        caller can see it answered); its other notes are never feedback."""
        n = int(number)
        me = int(self.user()["id"])
        web = self._get_mr(n).get("web_url") or ""
        items: list[Feedback] = []
        for d in self.api.paginate(f"{self._mr(n)}/discussions", {"per_page": 100},
                                        what=f"listing discussions of MR !{n}", max_pages=MAX_PAGES, item=DISCUSSION):
            for note in d.get("notes") or []:
                created = note.get("created_at") or ""
                author = note.get("author") or {}
                body = note.get("body") or ""
                if note.get("system") or (since and created < since):
                    continue
                if author.get("id") == me and own_key(body) is None:
                    continue
                common = {"id": str(note["id"]), "author": author.get("username") or "ghost", "body": body,
                               "created_at": created, "url": f"{web}#note_{note['id']}" if web else None}
                pos = note.get("position") or {}
                if note.get("type") == "DiffNote" and pos:
                    line = pos.get("new_line") if pos.get("new_line") is not None else pos.get("old_line")
                    items.append(Feedback(kind="inline", path=pos.get("new_path") or pos.get("old_path"),
                                               line=int(line) if line is not None else None,
                                               review_id=str(d.get("id")), **common))
                else:
                    items.append(Feedback(kind="comment", **common))
        items.sort(key=lambda f: (f.created_at, int(f.id) if f.id.isdigit() else 0))
        cursor = max([since or ""] + [f.created_at for f in items]) or None
        return FeedbackPage(items=items, cursor=cursor)

    def own_login(self) -> str | None:
        return str(self.user().get("username") or "") or None

    def reply(self, number: int, text: str, key: str) -> str:
        # Not idempotent: never retried here; the caller looks for its own mark before posting again.
        made = self.api.call("POST", f"{self._mr(number)}/notes", {"id": int}, json={"body": with_own_mark(text, key)},
                                  idempotent=False, what=f"replying on MR !{number}")
        return str(made["id"])

    def ci_results(self, sha: str) -> list[CIResult]:
        """The newest commit status per name (each CI job reports one) and the newest pipeline of ``sha``."""
        out: list[CIResult] = []
        statuses = self.api.paginate(f"{self._project()}/repository/commits/{quote(sha, safe='')}/statuses",
                                          {"per_page": 100}, what=f"listing commit statuses of {sha[:12]}",
                                          max_pages=MAX_PAGES, item=STATUS)
        seen: set[str] = set()
        for st in sorted(statuses, key=lambda x: int(x.get("id") or 0), reverse=True):
            name = st.get("name") or "default"
            if name in seen:
                continue
            seen.add(name)
            word = st.get("status") or ""
            out.append(CIResult(kind="status", id=str(st.get("id")), name=name, state=ci_state(_ci_word(word)),
                                     conclusion=word, summary=st.get("description") or "", url=st.get("target_url"),
                                     head_sha=sha))
        pipelines = self.api.call("GET", f"{self._project()}/pipelines", [PIPELINE],
                                       params={"sha": sha, "per_page": 20}, what=f"listing pipelines of {sha[:12]}")
        if pipelines:
            pl = max(pipelines, key=lambda x: int(x.get("id") or 0))
            word = pl.get("status") or ""
            out.append(CIResult(kind="pipeline", id=str(pl.get("id")), name=f"pipeline #{pl.get('id')}",
                                     state=ci_state(_ci_word(word)), conclusion=word,
                                     summary=f"{pl.get('source') or 'pipeline'} on {pl.get('ref') or sha[:12]}",
                                     url=pl.get("web_url"), head_sha=sha))
        return out

    # ------------------------------------------------------------------ who may steer

    def user_id(self, login: str) -> int | None:
        """The id of user ``login`` (``GET /users?username=``), or None if there is none."""
        me = self.user()
        if login == me.get("username"):
            return int(me["id"])
        found = self.api.call("GET", "/users", [USER], params={"username": login},
                                   what=f"looking up user {login}")
        return int(found[0]["id"]) if found else None

    def access_level(self, user_id: int) -> int:
        """The user's effective access level on the project (direct, inherited or invited): ``members/all``.
        A user who is no member at all gets 404 from GitLab: level 0."""
        resp = self.api.request("GET", f"{self._project()}/members/all/{int(user_id)}", allow=(404,),
                                     what=f"reading the access level of user {user_id}")
        if resp.status_code == 404:
            return 0
        return self.api.parse(resp, {"access_level": int}, f"reading the access level of user {user_id}")["access_level"]

    def has_write_access(self, login: str) -> bool:
        """Developer (30) or above: may push to the project's branches."""
        uid = self.user_id(login)
        return uid is not None and self.access_level(uid) >= WRITE_ACCESS_LEVEL
