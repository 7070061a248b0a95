"""A stateful GitLab REST API v4 simulator (see tests/forge_sim/__init__.py for what it checks).

State per project: merge requests (``iid`` per project), discussions with their notes (system notes, diff notes
with a position, plain notes), members with an access level, commit statuses and pipelines per sha.  Branch heads
come from a real bare git repository when one is given, so an MR's ``sha`` is the pushed commit.  The human side
(merge, close, notes, review threads, CI) is Python methods a test calls.  Throttling answers carry GitLab's
``RateLimit-*`` and ``Retry-After`` headers (``rate_limit_fault``).
"""

from __future__ import annotations

import itertools
import subprocess
from pathlib import Path
from typing import Any

from . import Reply, SimServer, gitlab_schema, now_iso

WEB = "http://gitlab.sim"


class GitlabSim(SimServer):
    name = "gitlab"

    def __init__(self, token: str = "gitlab-sim-token", bot: str = "agent-bot", prefix: str = ""):
        super().__init__(gitlab_schema, token, prefix)
        self.ids = itertools.count(500)
        self.users: dict[str, dict] = {}
        self.tokens: dict[str, str] = {}
        self.projects: dict[str, dict] = {}
        self.bot = self.add_user(bot, token=token)

    # ------------------------------------------------------------------ setup and the human side

    def add_user(self, username: str, token: str | None = None) -> dict:
        user = {"id": next(self.ids), "username": username, "name": username.title(), "state": "active",
                "locked": False, "avatar_url": None, "web_url": f"{WEB}/{username}", "public_email": None}
        self.users[username] = user
        if token:
            self.tokens[token] = username
        return user

    def add_project(self, path: str, remote: Path | None = None, bot_access: int = 30) -> dict:
        project = {"id": next(self.ids), "path": path, "remote": remote, "counter": 0, "mrs": {},
                   "discussions": {}, "members": {self.bot["username"]: bot_access}, "statuses": {},
                   "pipelines": {}}
        self.projects[path] = project
        return project

    def set_access(self, project: str, username: str, level: int) -> None:
        if username not in self.users:
            self.add_user(username)
        self.projects[project]["members"][username] = level

    def merge(self, project: str, iid: int, by: str | None = None) -> None:
        with self.lock:
            mr = self.projects[project]["mrs"][iid]
            mr.update(state="merged", merged_at=now_iso(), merge_commit_sha=mr["sha"], merged_by=by or "maintainer")

    def close(self, project: str, iid: int) -> None:
        with self.lock:
            self.projects[project]["mrs"][iid].update(state="closed", closed_at=now_iso())

    def note(self, project: str, iid: int, username: str, body: str, system: bool = False) -> dict:
        """A conversation note (a new individual-note discussion)."""
        with self.lock:
            return self._new_discussion(self.projects[project], iid, username, body, system=system)

    def diff_note(self, project: str, iid: int, username: str, path: str, line: int, body: str) -> dict:
        """A review thread on a line of the diff (a DiffNote with its position)."""
        with self.lock:
            p = self.projects[project]
            mr = p["mrs"][iid]
            position = {"base_sha": "b" * 40, "start_sha": "b" * 40, "head_sha": mr["sha"] or "0" * 40,
                        "old_path": path, "new_path": path, "position_type": "text", "old_line": None,
                        "new_line": line, "line_range": None}
            return self._new_discussion(p, iid, username, body, note_type="DiffNote", position=position)

    def add_status(self, project: str, sha: str, name: str, status: str, description: str = "",
                   pipeline: bool = True) -> None:
        with self.lock:
            p = self.projects[project]
            pid = None
            if pipeline:
                pipes = p["pipelines"].setdefault(sha, [])
                if not pipes:
                    pipes.append({"id": next(self.ids), "iid": len(pipes) + 1, "sha": sha, "ref": "", "status": status,
                                  "source": "push", "created_at": now_iso(), "updated_at": now_iso()})
                pipes[-1].update(status=status, updated_at=now_iso())
                pid = pipes[-1]["id"]
            p["statuses"].setdefault(sha, []).append(
                {"id": next(self.ids), "sha": sha, "ref": None, "status": status, "name": name, "target_url": None,
                 "description": description or None, "created_at": now_iso(), "started_at": None,
                 "finished_at": None, "allow_failure": False, "coverage": None, "author": "ci", "pipeline_id": pid})

    def mrs(self, project: str, source: str | None = None) -> list[dict]:
        with self.lock:
            return [dict(m) for m in self.projects[project]["mrs"].values() if source is None or m["source"] == source]

    def notes(self, project: str, iid: int) -> list[dict]:
        with self.lock:
            return [dict(n) for d in self.projects[project]["discussions"].get(iid, []) for n in d["notes"]]

    @staticmethod
    def rate_limit_headers(retry_after: int, now: float) -> dict:
        return {"RateLimit-Limit": "600", "RateLimit-Name": "throttle_authenticated_api", "RateLimit-Observed": "601",
                "RateLimit-Remaining": "0", "RateLimit-Reset": str(int(now) + retry_after),
                "RateLimit-ResetTime": "Tue, 01 Dec 2026 15:00:00 GMT", "Retry-After": str(retry_after)}

    # ------------------------------------------------------------------ JSON as GitLab writes it

    def _user_json(self, username: str | None) -> dict | None:
        if username is None:
            return None
        if username not in self.users:
            self.add_user(username)
        return dict(self.users[username])

    def _mr_json(self, p: dict, mr: dict) -> dict:
        return {"id": mr["id"], "iid": mr["iid"], "project_id": p["id"], "title": mr["title"],
                "description": mr["description"], "state": mr["state"], "created_at": mr["created_at"],
                "updated_at": mr["updated_at"], "merged_at": mr["merged_at"], "closed_at": mr["closed_at"],
                "merged_by": self._user_json(mr.get("merged_by")), "merge_user": self._user_json(mr.get("merged_by")),
                "closed_by": None, "target_branch": mr["target"], "source_branch": mr["source"],
                "source_project_id": p["id"], "target_project_id": p["id"], "author": self._user_json(mr["author"]),
                "assignees": [], "reviewers": [], "labels": list(mr["labels"]),
                "draft": _is_draft(mr["title"]), "work_in_progress": _is_draft(mr["title"]),
                "merge_status": "can_be_merged", "detailed_merge_status": "draft_status" if _is_draft(mr["title"])
                else "mergeable", "sha": mr["sha"], "merge_commit_sha": mr["merge_commit_sha"],
                "squash_commit_sha": None, "user_notes_count": sum(
                    1 for d in p["discussions"].get(mr["iid"], []) for n in d["notes"] if not n["system"]),
                "should_remove_source_branch": None, "force_remove_source_branch": mr["remove_source_branch"],
                "reference": f"!{mr['iid']}", "references": {"short": f"!{mr['iid']}", "relative": f"!{mr['iid']}",
                                                             "full": f"{p['path']}!{mr['iid']}"},
                "web_url": f"{WEB}/{p['path']}/-/merge_requests/{mr['iid']}", "squash": False,
                "has_conflicts": False, "blocking_discussions_resolved": True,
                "diff_refs": {"base_sha": None, "head_sha": mr["sha"], "start_sha": None}, "head_pipeline": None}

    def _note_json(self, p: dict, iid: int, n: dict) -> dict:
        return {"id": n["id"], "type": n["type"], "body": n["body"], "attachment": None,
                "author": self._user_json(n["author"]), "created_at": n["created_at"], "updated_at": n["created_at"],
                "system": n["system"], "noteable_id": p["mrs"][iid]["id"], "noteable_type": "MergeRequest",
                "project_id": p["id"], "noteable_iid": iid, "resolvable": n["type"] == "DiffNote",
                "resolved": False, "resolved_by": None, "resolved_at": None, "confidential": False,
                "internal": False, "position": n["position"]}

    def corrupt_fields(self) -> dict:
        return {"iid": "seven"}

    # ------------------------------------------------------------------ helpers

    def _sha(self, p: dict, branch: str) -> str | None:
        if p["remote"] is None:
            return "0" * 40
        out = subprocess.run(["git", "ls-remote", str(p["remote"]), f"refs/heads/{branch}"], capture_output=True,
                             text=True, timeout=30).stdout.split()
        return out[0] if out else None

    def _project(self, params: dict, user: dict) -> dict:
        p = self.projects.get(params["id"])
        if p is None or p["members"].get(user["username"], 0) < 10:
            raise Reply(404, {"message": "404 Project Not Found"})
        return p

    def _mr(self, p: dict, iid) -> dict:
        mr = p["mrs"].get(int(iid))
        if mr is None:
            raise Reply(404, {"message": "404 Not found"})
        return mr

    def _refresh(self, p: dict, mr: dict) -> dict:
        if mr["state"] == "opened" and p["remote"] is not None:
            sha = self._sha(p, mr["source"])
            if sha:
                mr["sha"] = sha
        return mr

    def _new_discussion(self, p: dict, iid: int, author: str, body: str, system: bool = False,
                        note_type: str | None = None, position: dict | None = None) -> dict:
        self._mr(p, iid)
        note = {"id": next(self.ids), "type": note_type, "body": body, "author": author, "system": system,
                "created_at": now_iso(), "position": position}
        p["discussions"].setdefault(iid, []).append(
            {"id": f"{next(self.ids):040x}", "individual_note": note_type is None, "notes": [note]})
        return note

    def authenticate(self, headers) -> dict | None:
        token = headers.get("PRIVATE-TOKEN")
        username = self.tokens.get(token or "")
        return self.users.get(username) if username else None

    def unauthorized_body(self) -> Any:
        return {"message": "401 Unauthorized"}

    def page_headers(self, page, size, last, total) -> dict:
        return {"X-Page": str(page), "X-Per-Page": str(size), "X-Total": str(total), "X-Total-Pages": str(last),
                "X-Next-Page": str(page + 1) if page < last else "", "X-Prev-Page": str(page - 1) if page > 1 else ""}

    def _page(self, items: list, q: dict, raw_path: str) -> tuple[int, list, dict]:
        chunk, headers = self.paginate(items, q, raw_path, "per_page", 20, 100)
        return 200, chunk, headers

    # ------------------------------------------------------------------ dispatch

    def dispatch(self, op: str, params: dict, q: dict, body: Any, user: dict, raw_path: str):
        me = user["username"]
        if op == "getApiV4User":
            return 200, {**self._user_json(me), "created_at": now_iso(), "bio": "", "email": f"{me}@example.com",
                         "is_admin": False, "bot": False}, {}
        if op == "getApiV4Users":
            found = [self._user_json(u) for u in self.users if not q.get("username") or u == q["username"]]
            return self._page(found, q, raw_path)
        p = self._project(params, user)
        if op == "getApiV4ProjectsIdMergeRequests":
            state = q.get("state", "all")
            items = [self._mr_json(p, self._refresh(p, mr)) for _, mr in sorted(p["mrs"].items(), reverse=True)
                     if (state == "all" or mr["state"] == state)
                     and (not q.get("source_branch") or mr["source"] == q["source_branch"])
                     and (not q.get("target_branch") or mr["target"] == q["target_branch"])]
            return self._page(items, q, raw_path)
        if op == "postApiV4ProjectsIdMergeRequests":
            if p["members"].get(me, 0) < 30:
                raise Reply(403, {"message": "403 Forbidden"})
            source, target = body["source_branch"], body["target_branch"]
            if source == target:
                raise Reply(422, {"message": ["You can't use same project/branch for source and target"]})
            sha = self._sha(p, source)
            if sha is None or self._sha(p, target) is None:
                raise Reply(422, {"message": ["Source branch does not exist"]})
            for mr in p["mrs"].values():
                if mr["source"] == source and mr["target"] == target and mr["state"] == "opened":
                    raise Reply(409, {"message": [f"Another open merge request already exists for this source "
                                                  f"branch: !{mr['iid']}"]})
            p["counter"] += 1
            iid = p["counter"]
            p["mrs"][iid] = {"id": next(self.ids), "iid": iid, "title": body["title"],
                             "description": body.get("description"), "state": "opened", "source": source,
                             "target": target, "sha": sha, "author": me, "labels": [], "merged_at": None,
                             "closed_at": None, "merge_commit_sha": None, "created_at": now_iso(),
                             "updated_at": now_iso(), "remove_source_branch": bool(body.get("remove_source_branch"))}
            return 201, self._mr_json(p, p["mrs"][iid]), {}
        if op == "getApiV4ProjectsIdMergeRequestsMergeRequestIid":
            return 200, self._mr_json(p, self._refresh(p, self._mr(p, params["merge_request_iid"]))), {}
        if op == "putApiV4ProjectsIdMergeRequestsMergeRequestIid":
            mr = self._mr(p, params["merge_request_iid"])
            if "title" in body:
                mr["title"] = body["title"]
            if "description" in body:
                mr["description"] = body["description"]
            for name in _labels(body.get("add_labels")):
                if name not in mr["labels"]:
                    mr["labels"].append(name)
            if body.get("state_event") == "close" and mr["state"] == "opened":
                mr.update(state="closed", closed_at=now_iso())
            mr["updated_at"] = now_iso()
            return 200, self._mr_json(p, self._refresh(p, mr)), {}
        if op == "getApiV4ProjectsIdMergeRequestsNoteableIdNotes":
            iid = int(params["merge_request_iid"])
            self._mr(p, iid)
            notes = [self._note_json(p, iid, n) for d in p["discussions"].get(iid, []) for n in d["notes"]]
            if q.get("sort", "desc") == "desc":
                notes.reverse()
            return self._page(notes, q, raw_path)
        if op == "postApiV4ProjectsIdMergeRequestsNoteableIdNotes":
            iid = int(params["merge_request_iid"])
            note = self._new_discussion(p, iid, me, body["body"])
            return 201, self._note_json(p, iid, note), {}
        if op == "getApiV4ProjectsIdMergeRequestsNoteableIdDiscussions":
            iid = int(params["merge_request_iid"])
            self._mr(p, iid)
            items = [{"id": d["id"], "individual_note": d["individual_note"],
                      "notes": [self._note_json(p, iid, n) for n in d["notes"]]}
                     for d in p["discussions"].get(iid, [])]
            return self._page(items, q, raw_path)
        if op == "getApiV4ProjectsIdMembersAllUserId":
            uid = int(params["user_id"])
            who = next((u for u, info in self.users.items() if info["id"] == uid), None)
            if who is None or who not in p["members"]:
                raise Reply(404, {"message": "404 Not found"})
            member = {k: v for k, v in self._user_json(who).items() if k != "public_email"}
            return 200, {**member, "access_level": p["members"][who], "created_at": now_iso(),
                         "expires_at": None, "membership_state": "active"}, {}
        if op == "getApiV4ProjectsIdRepositoryCommitsShaStatuses":
            items = [{**s, "author": self._user_json(s["author"])} for s in p["statuses"].get(params["sha"], [])]
            if q.get("name"):
                items = [s for s in items if s["name"] == q["name"]]
            return self._page(items, q, raw_path)
        if op == "getApiV4ProjectsIdPipelines":
            items = [{**pl, "project_id": p["id"], "web_url": f"{WEB}/{p['path']}/-/pipelines/{pl['id']}"}
                     for sha, pls in p["pipelines"].items() for pl in pls if not q.get("sha") or sha == q["sha"]]
            items.sort(key=lambda pl: pl["id"], reverse=True)
            return self._page(items, q, raw_path)
        raise Reply(404, {"message": f"no handler for {op}"})


def _is_draft(title: str) -> bool:
    t = (title or "").lstrip().lower()
    return t.startswith(("draft:", "[draft]", "(draft)"))


def _labels(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, list):
        return [v for v in value if v]
    return [v.strip() for v in str(value).split(",") if v.strip()]
