"""A stateful Gitea/Forgejo API v1 simulator (see tests/forge_sim/__init__.py for what it checks).

State per repository: pull requests (numbers shared with issues), issue comments, labels, reviews with their
inline comments, collaborators with a permission, commit statuses.  Branch heads come from a real bare git
repository when one is given (the remote agent pushes to), so a PR's ``head.sha`` is the pushed commit.
The human side (merge, close, review, comment, CI) is Python methods a test calls.
"""

from __future__ import annotations

import itertools
import subprocess
from pathlib import Path
from typing import Any

from . import Reply, SimServer, gitea_schema, now_iso

WEB = "http://gitea.sim"


class GiteaSim(SimServer):
    name = "gitea"
    invalid_request_status = 422   # Gitea's binding errors answer 422

    def __init__(self, token: str = "gitea-sim-token", bot: str = "agent-bot", prefix: str = ""):
        super().__init__(gitea_schema, token, prefix)
        self.ids = itertools.count(1000)
        self.users: dict[str, dict] = {}
        self.tokens: dict[str, str] = {}
        self.repos: dict[str, dict] = {}
        self.bot = self.add_user(bot, token=token)

    # ------------------------------------------------------------------ setup and the human side

    def add_user(self, login: str, token: str | None = None, admin: bool = False) -> dict:
        user = {"id": next(self.ids), "login": login, "login_name": "", "full_name": login.title(),
                "email": f"{login}@example.com", "avatar_url": f"{WEB}/avatars/{login}", "html_url": f"{WEB}/{login}",
                "language": "en-US", "is_admin": admin, "last_login": now_iso(), "created": now_iso(),
                "restricted": False, "active": True, "prohibit_login": False, "location": "", "website": "",
                "description": "", "visibility": "public", "followers_count": 0, "following_count": 0,
                "starred_repos_count": 0, "source_id": 0}
        self.users[login] = user
        if token:
            self.tokens[token] = login
        return user

    def add_repo(self, full_name: str, remote: Path | None = None, default_branch: str = "main",
                 bot_permission: str = "admin") -> dict:
        owner, name = full_name.split("/")
        if owner not in self.users:
            self.add_user(owner)
        repo = {"id": next(self.ids), "full_name": full_name, "owner": owner, "name": name, "remote": remote,
                "default_branch": default_branch, "counter": 0, "pulls": {}, "comments": {}, "labels": [],
                "issue_labels": {}, "reviews": {}, "statuses": {},
                "collaborators": {owner: "owner", self.bot["login"]: bot_permission}}
        self.repos[full_name] = repo
        return repo

    def set_permission(self, repo: str, login: str, permission: str) -> None:
        if login not in self.users:
            self.add_user(login)
        self.repos[repo]["collaborators"][login] = permission

    def merge(self, repo: str, number: int, by: str | None = None) -> None:
        with self.lock:
            pr = self.repos[repo]["pulls"][number]
            pr.update(state="closed", merged=True, merged_at=now_iso(), closed_at=now_iso(),
                      merge_commit_sha=pr["head_sha"], merged_by=by or self.repos[repo]["owner"])

    def close(self, repo: str, number: int) -> None:
        with self.lock:
            self.repos[repo]["pulls"][number].update(state="closed", closed_at=now_iso())

    def human_comment(self, repo: str, number: int, login: str, body: str) -> dict:
        with self.lock:
            return self._add_comment(self.repos[repo], number, login, body)

    def review(self, repo: str, number: int, login: str, state: str, body: str = "",
               comments: tuple[tuple[str, int, str], ...] = ()) -> dict:
        """A submitted review (state APPROVED|REQUEST_CHANGES|COMMENT) with inline comments (path, line, body)."""
        with self.lock:
            r = self.repos[repo]
            pr = r["pulls"][number]
            rid = next(self.ids)
            review = {"id": rid, "user": login, "state": state, "body": body, "commit_id": pr["head_sha"] or "",
                      "submitted_at": now_iso(), "comments": []}
            for path, line, text in comments:
                review["comments"].append({"id": next(self.ids), "path": path, "position": line, "body": text,
                                           "user": login, "created_at": now_iso(), "commit_id": pr["head_sha"] or ""})
            r["reviews"].setdefault(number, []).append(review)
            return review

    def add_status(self, repo: str, sha: str, context: str, state: str, description: str = "",
                   target_url: str = "") -> None:
        with self.lock:
            self.repos[repo]["statuses"].setdefault(sha, []).append(
                {"id": next(self.ids), "context": context, "status": state, "description": description,
                 "target_url": target_url, "created_at": now_iso(), "updated_at": now_iso(), "creator": "ci"})

    def pulls(self, repo: str, head: str | None = None) -> list[dict]:
        with self.lock:
            return [dict(p) for p in self.repos[repo]["pulls"].values() if head is None or p["head"] == head]

    def comments(self, repo: str, number: int) -> list[dict]:
        with self.lock:
            return [dict(c) for c in self.repos[repo]["comments"].get(number, [])]

    # ------------------------------------------------------------------ JSON as Gitea writes it

    def _user_json(self, login: str | None) -> dict | None:
        if login is None:
            return None
        if login not in self.users:
            self.add_user(login)
        return dict(self.users[login])

    def _repo_json(self, r: dict) -> dict:
        return {"id": r["id"], "name": r["name"], "full_name": r["full_name"], "html_url": f"{WEB}/{r['full_name']}",
                "clone_url": f"{WEB}/{r['full_name']}.git", "ssh_url": f"git@gitea.sim:{r['full_name']}.git",
                "default_branch": r["default_branch"], "private": True, "owner": self._user_json(r["owner"])}

    def _pr_json(self, r: dict, pr: dict) -> dict:
        url = f"{WEB}/{r['full_name']}/pulls/{pr['number']}"
        branch = lambda ref, sha: {"label": ref, "ref": ref, "sha": sha or "", "repo_id": r["id"],  # noqa: E731
                                   "repo": self._repo_json(r)}
        labels = [lb for lb in r["labels"] if lb["id"] in r["issue_labels"].get(pr["number"], [])]
        return {"id": pr["id"], "number": pr["number"], "title": pr["title"], "body": pr["body"],
                "state": pr["state"], "merged": pr["merged"], "merged_at": pr["merged_at"],
                "merge_commit_sha": pr["merge_commit_sha"], "merged_by": self._user_json(pr.get("merged_by")),
                "mergeable": not pr["merged"], "html_url": url, "url": url, "diff_url": url + ".diff",
                "patch_url": url + ".patch", "head": branch(pr["head"], pr["head_sha"]),
                "base": branch(pr["base"], self._sha(r, pr["base"])), "user": self._user_json(pr["user"]),
                "created_at": pr["created_at"], "updated_at": pr["updated_at"], "closed_at": pr["closed_at"],
                "labels": labels, "comments": len(r["comments"].get(pr["number"], [])), "is_locked": False,
                "assignee": None, "assignees": None, "requested_reviewers": None, "milestone": None,
                "due_date": None, "allow_maintainer_edit": False, "pin_order": 0, "merge_base": ""}

    def _comment_json(self, r: dict, c: dict) -> dict:
        return {"id": c["id"], "body": c["body"], "user": self._user_json(c["user"]), "created_at": c["created_at"],
                "updated_at": c["updated_at"], "html_url": f"{WEB}/{r['full_name']}/pulls/{c['issue']}#issuecomment-"
                f"{c['id']}", "issue_url": f"{WEB}/{r['full_name']}/issues/{c['issue']}",
                "pull_request_url": f"{WEB}/{r['full_name']}/pulls/{c['issue']}", "original_author": "",
                "original_author_id": 0, "assets": []}

    def corrupt_fields(self) -> dict:
        return {"number": "not-a-number"}

    # ------------------------------------------------------------------ helpers

    def _sha(self, r: dict, branch: str) -> str | None:
        if r["remote"] is None:
            return "0" * 40
        out = subprocess.run(["git", "ls-remote", str(r["remote"]), f"refs/heads/{branch}"], capture_output=True,
                             text=True, timeout=30).stdout.split()
        return out[0] if out else None

    def _repo(self, params: dict) -> dict:
        r = self.repos.get(f"{params['owner']}/{params['repo']}")
        if r is None:
            raise Reply(404, {"message": "The target couldn't be found.", "url": WEB})
        return r

    def _pull(self, r: dict, number) -> dict:
        pr = r["pulls"].get(int(number))
        if pr is None:
            raise Reply(404, {"message": "The target couldn't be found.", "url": WEB})
        return pr

    def _add_comment(self, r: dict, number: int, login: str, body: str) -> dict:
        self._pull(r, number)
        c = {"id": next(self.ids), "issue": number, "user": login, "body": body, "created_at": now_iso(),
             "updated_at": now_iso()}
        r["comments"].setdefault(number, []).append(c)
        return c

    def authenticate(self, headers) -> dict | None:
        auth = headers.get("Authorization") or ""
        if not auth.startswith("token "):
            return None
        login = self.tokens.get(auth[6:])
        return self.users.get(login) if login else None

    def unauthorized_body(self) -> Any:
        return {"message": "token is required", "url": WEB}

    def page_headers(self, page, size, last, total) -> dict:
        return {"X-Total-Count": str(total)}

    # ------------------------------------------------------------------ dispatch

    def dispatch(self, op: str, p: dict, q: dict, body: Any, user: dict, raw_url: str) -> tuple[int, Any, dict]:
        me = user["login"]
        if op == "userGetCurrent":
            return 200, self._user_json(me), {}
        r = self._repo(p)
        if r["collaborators"].get(me) not in ("write", "admin", "owner") and not user["is_admin"]:
            raise Reply(404, {"message": "The target couldn't be found.", "url": WEB})  # private repo
        if op == "repoListPullRequests":
            state = q.get("state", "open")
            items = [self._pr_json(r, pr) for n, pr in sorted(r["pulls"].items(), reverse=True)
                     if state == "all" or pr["state"] == state]
            page, headers = self.paginate(items, q, raw_url, "limit", 30, 50)
            return 200, page, headers
        if op == "repoCreatePullRequest":
            head, base, title = body.get("head"), body.get("base"), body.get("title")
            if not head or not base or not title:
                raise Reply(422, {"message": "head, base and title are required", "url": WEB})
            sha = self._sha(r, head)
            if sha is None or self._sha(r, base) is None:
                raise Reply(404, {"message": "The target couldn't be found.", "url": WEB})
            for pr in r["pulls"].values():
                if pr["head"] == head and pr["base"] == base and pr["state"] == "open":
                    raise Reply(409, {"message": f"pull request already exists for these targets [id: {pr['id']}, "
                                                 f"issue_id: {pr['id']}, head_repo_id: {r['id']}, base_repo_id: "
                                                 f"{r['id']}, head_branch: {head}, base_branch: {base}]", "url": WEB})
            r["counter"] += 1
            n = r["counter"]
            r["pulls"][n] = {"id": next(self.ids), "number": n, "title": title, "body": body.get("body") or "",
                             "head": head, "base": base, "head_sha": sha, "state": "open", "merged": False,
                             "merged_at": None, "merge_commit_sha": None, "closed_at": None, "user": me,
                             "created_at": now_iso(), "updated_at": now_iso()}
            return 201, self._pr_json(r, r["pulls"][n]), {}
        if op == "repoGetPullRequestByBaseHead":
            found = [pr for pr in r["pulls"].values() if pr["base"] == p["base"] and pr["head"] == p["head"]]
            if not found:
                raise Reply(404, {"message": "The target couldn't be found.", "url": WEB})
            found.sort(key=lambda pr: (pr["state"] == "open", pr["number"]), reverse=True)
            return 200, self._pr_json(r, self._refresh(r, found[0])), {}
        if op == "repoGetPullRequest":
            return 200, self._pr_json(r, self._refresh(r, self._pull(r, p["index"]))), {}
        if op == "repoEditPullRequest":
            pr = self._pull(r, p["index"])
            if "state" in body and body["state"] not in ("open", "closed"):
                raise Reply(422, {"message": "invalid state", "url": WEB})
            for key in ("title", "body", "state"):
                if key in body:
                    pr[key] = body[key]
            pr["updated_at"] = now_iso()
            return 201, self._pr_json(r, self._refresh(r, pr)), {}
        if op == "repoPullRequestIsMerged":
            return (204 if self._pull(r, p["index"])["merged"] else 404), None, {}
        if op == "issueGetComments":
            self._pull(r, p["index"])
            items = [c for c in r["comments"].get(int(p["index"]), [])
                     if (not q.get("since") or c["updated_at"] >= q["since"])
                     and (not q.get("before") or c["updated_at"] < q["before"])]
            return 200, [self._comment_json(r, c) for c in items], {}
        if op == "issueCreateComment":
            c = self._add_comment(r, int(p["index"]), me, body["body"])
            return 201, self._comment_json(r, c), {}
        if op == "issueListLabels":
            page, headers = self.paginate(list(r["labels"]), q, raw_url, "limit", 30, 50)
            return 200, page, headers
        if op == "issueCreateLabel":
            if any(lb["name"] == body["name"] for lb in r["labels"]):
                raise Reply(422, {"message": "label already exists", "url": WEB})
            lb = {"id": next(self.ids), "name": body["name"], "color": body["color"].lstrip("#"),
                  "description": body.get("description", ""), "exclusive": False, "is_archived": False,
                  "url": f"{WEB}/{r['full_name']}/labels/{body['name']}"}
            r["labels"].append(lb)
            return 201, lb, {}
        if op == "issueAddLabel":
            self._pull(r, p["index"])
            known = {lb["id"] for lb in r["labels"]}
            have = r["issue_labels"].setdefault(int(p["index"]), [])
            for lid in body.get("labels") or []:
                if lid not in known:
                    raise Reply(404, {"message": f"label {lid} not found", "url": WEB})
                if lid not in have:
                    have.append(lid)
            return 200, [lb for lb in r["labels"] if lb["id"] in have], {}
        if op == "repoListPullReviews":
            pr = self._pull(r, p["index"])
            items = [self._review_json(r, pr, rv) for rv in r["reviews"].get(pr["number"], [])]
            page, headers = self.paginate(items, q, raw_url, "limit", 30, 50)
            return 200, page, headers
        if op == "repoGetPullReviewComments":
            pr = self._pull(r, p["index"])
            for rv in r["reviews"].get(pr["number"], []):
                if rv["id"] == int(p["id"]):
                    return 200, [self._review_comment_json(r, pr, rv, c) for c in rv["comments"]], {}
            raise Reply(404, {"message": "The target couldn't be found.", "url": WEB})
        if op == "repoGetRepoPermissions":
            who = p["collaborator"]
            if who not in self.users:
                raise Reply(404, {"message": "The target couldn't be found.", "url": WEB})
            if who != me and not user["is_admin"] and r["collaborators"].get(me) not in ("admin", "owner"):
                raise Reply(403, {"message": "Only admins can query all permissions, repo admins can query all "
                                             "repo permissions, collaborators can query only their own", "url": WEB})
            perm = r["collaborators"].get(who, "none")
            return 200, {"permission": perm, "role_name": perm, "user": self._user_json(who)}, {}
        if op == "repoListStatuses":
            items = sorted(r["statuses"].get(p["sha"], []), key=lambda s: s["id"], reverse=True)
            items = [{**s, "creator": self._user_json(s["creator"]),
                      "url": f"{WEB}/api/v1/repos/{r['full_name']}/statuses/{p['sha']}"} for s in items]
            page, headers = self.paginate(items, q, raw_url, "limit", 30, 50)
            return 200, page, headers
        if op == "repoCreateStatus":
            self.add_status(r["full_name"], p["sha"], body.get("context") or "default", body.get("state") or "pending",
                            body.get("description") or "", body.get("target_url") or "")
            s = r["statuses"][p["sha"]][-1]
            return 201, {**s, "creator": self._user_json(me), "url": f"{WEB}/api/v1/repos/{r['full_name']}/statuses/"
                         f"{p['sha']}"}, {}
        raise Reply(404, {"message": f"no handler for {op}", "url": WEB})

    def _refresh(self, r: dict, pr: dict) -> dict:
        """An open PR's head follows its branch (a push updates the PR), like Gitea's."""
        if pr["state"] == "open" and r["remote"] is not None:
            sha = self._sha(r, pr["head"])
            if sha:
                pr["head_sha"] = sha
        return pr

    def _review_json(self, r: dict, pr: dict, rv: dict) -> dict:
        url = f"{WEB}/{r['full_name']}/pulls/{pr['number']}"
        return {"id": rv["id"], "user": self._user_json(rv["user"]), "state": rv["state"], "body": rv["body"],
                "commit_id": rv["commit_id"], "stale": False, "official": True, "dismissed": False,
                "comments_count": len(rv["comments"]), "submitted_at": rv["submitted_at"],
                "updated_at": rv["submitted_at"], "html_url": f"{url}#issuecomment-{rv['id']}",
                "pull_request_url": url, "team": None}

    def _review_comment_json(self, r: dict, pr: dict, rv: dict, c: dict) -> dict:
        url = f"{WEB}/{r['full_name']}/pulls/{pr['number']}"
        return {"id": c["id"], "body": c["body"], "user": self._user_json(c["user"]), "path": c["path"],
                "position": c["position"], "original_position": 0, "commit_id": c["commit_id"],
                "original_commit_id": c["commit_id"], "diff_hunk": "@@ -1 +1 @@", "html_url": f"{url}/files#"
                f"issuecomment-{c['id']}", "pull_request_url": url, "pull_request_review_id": rv["id"],
                "created_at": c["created_at"], "updated_at": c["created_at"], "resolver": None}
