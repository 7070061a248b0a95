"""The embedded local forge: draft PRs with no account and no network.

Branches are pushed to any git remote (a local bare repository is enough; see ``agent.git.push``).
The forge keeps its PRs in the ledger's ``local_prs`` table (numbers allocated per repo) and writes
each one as markdown to ``$AGENT_HOME/prs/<owner>-<name>-<number>.md`` so a human can read it.
``agent pr mark TASK merged|closed`` plays the human who merges or closes it; `agent watch pr-merged`
then follows it up exactly as for a hosted forge.
"""

from __future__ import annotations

import getpass
import json
import os
from pathlib import Path

from agent.forge.base import (CI_STATES, PR, CIResult, Feedback, FeedbackPage, ForgeAuthError, ForgeError,
                              adoption_refusal, with_own_mark)
from agent.ledger import Ledger, ledger_path, now
from agent.ledger.local_forge import (add_local_pr_check, add_local_pr_note, change_local_pr, local_pr,
                                           local_pr_by_head, local_pr_checks, local_pr_notes, open_local_pr)

AGENT_LOGIN = "agent"       # the author of the agent's own replies on the local forge


def local_user() -> str:
    """The one collaborator (write access) of the local forge: the account running agent."""
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry (some containers)
        return os.environ.get("USER") or "local"


def repo_slug(repo: str) -> str:
    return repo.replace("/", "-")


class LocalForge:
    name = "local"

    def __init__(self, ledger: Ledger, home: Path, repo: str, remote_url: str | None = None,
                 collaborators: tuple[str, ...] | None = None):
        self.ledger = ledger
        self.home = Path(home)
        self.repo = repo
        self.remote_url = remote_url
        self.collaborators = tuple(collaborators) if collaborators is not None else (local_user(),)

    def __repr__(self) -> str:
        return f"LocalForge(repo={self.repo!r})"

    @classmethod
    def from_config(cls, repo_config, config, home, ledger=None) -> "LocalForge":
        if ledger is None:
            ledger = Ledger.open(ledger_path(Path(home)))
        return cls(ledger, Path(home), repo_config.name, repo_config.url)

    # ------------------------------------------------------------------ helpers

    def md_path(self, number: int) -> Path:
        return self.home / "prs" / f"{repo_slug(self.repo)}-{int(number)}.md"

    def _row(self, number: int) -> dict:
        return self._known(local_pr(self.ledger, self.repo, number), number)

    def _known(self, row: dict | None, number: int) -> dict:
        if row is None:
            raise ForgeError(f"local forge: {self.repo} has no PR #{number}; see `agent pr list`")
        return row

    def _pr(self, row: dict) -> PR:
        return PR(number=row["number"], url=self.md_path(row["number"]).as_uri(), head=row["head"],
                  head_sha=row["head_sha"], base=row["base"], state=row["state"], draft=bool(row["draft"]),
                  title=row["title"] or "", body=row["body"] or "")

    def _remote_sha(self, branch: str) -> str | None:
        if not self.remote_url:
            return None
        from agent.git.push import PushError, remote_branch_sha

        try:
            return remote_branch_sha(self.remote_url, branch)
        except PushError as exc:   # the remote cannot be read: for the forge's callers, a refusal a human must fix
            raise ForgeAuthError(str(exc)) from None

    def _write_md(self, number: int) -> None:
        row = self._row(number)
        labels = json.loads(row["labels"] or "[]")
        comments = json.loads(row["comments"] or "[]")
        state = row["state"] + (" (draft)" if row["draft"] and row["state"] == "open" else "")
        lines = [f"# {row['title']}", "",
                 f"- PR: {self.repo}#{row['number']} (local forge)",
                 f"- State: {state}",
                 f"- Head: `{row['head']}` at `{row['head_sha'] or 'unknown'}`",
                 f"- Base: `{row['base']}`",
                 f"- Labels: {', '.join(labels) if labels else 'none'}",
                 f"- Updated: {row['updated_at']}", "", "---", "", row["body"] or "", ""]
        if comments:
            lines += ["---", "", "## Comments", ""]
            for cm in comments:
                lines += [f"**{cm['at']}**", "", cm["text"], ""]
        notes = local_pr_notes(self.ledger, self.repo, number)
        if notes:
            lines += ["---", "", "## Reviews and comments", ""]
            for n in notes:
                where = f" on `{n['path']}`" + (f" line {n['line']}" if n["line"] else "") if n["path"] else ""
                what = f"review ({n['state']})" if n["kind"] == "review" else n["kind"]
                lines += [f"**#{n['id']} {what} by {n['author']}{where}, {n['created_at']}**", "", n["body"] or "", ""]
        path = self.md_path(number)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".md.tmp")
        tmp.write_text("\n".join(lines), encoding="utf-8")
        os.replace(tmp, path)

    # ------------------------------------------------------------------ the Forge interface

    def find_pr_by_head(self, branch: str) -> PR | None:
        row = local_pr_by_head(self.ledger, self.repo, branch)
        return self._pr(row) if row else None

    def create_draft(self, head: str, base: str, title: str, body: str, task_id: int | None = None) -> PR:
        if head == base:
            raise ForgeError(f"local forge: head {head!r} is the base branch; a PR needs its own branch")
        from agent.git.push import safe_url

        sha = self._remote_sha(head)
        if self.remote_url and sha is None:
            raise ForgeError(f"local forge: branch {head} is not on the remote {safe_url(self.remote_url)}; push it first")

        def adoptable(existing: dict) -> None:
            why = adoption_refusal(self._pr(existing), head)
            if why:
                raise ForgeError(f"local forge: {why}")

        number = open_local_pr(self.ledger, self.repo, head, base, title, body, sha, adoptable)
        self._write_md(number)
        return self._pr(self._row(number))

    def update(self, number: int, title: str, body: str) -> PR:
        row = self._row(number)
        sha = self._remote_sha(row["head"]) or row["head_sha"]
        change_local_pr(self.ledger, self.repo, number,
                        lambda _row: {"title": title, "body": body, "head_sha": sha})
        self._write_md(number)
        return self._pr(self._row(number))

    def comment(self, number: int, text: str) -> None:
        def add(row: dict | None) -> dict:
            comments = json.loads(self._known(row, number)["comments"] or "[]") + [{"at": now(), "text": text}]
            return {"comments": json.dumps(comments)}

        change_local_pr(self.ledger, self.repo, number, add)
        self._write_md(number)

    def add_labels(self, number: int, labels: list[str]) -> None:
        def add(row: dict | None) -> dict:
            have = json.loads(self._known(row, number)["labels"] or "[]")
            return {"labels": json.dumps(have + [lb for lb in labels if lb not in have])}

        change_local_pr(self.ledger, self.repo, number, add)
        self._write_md(number)

    def state(self, number: int) -> PR:
        return self._pr(self._row(number))

    def feedback(self, number: int, since: str | None = None) -> FeedbackPage:
        self._row(number)
        after = int(since) if since and since.isdigit() else 0
        rows = local_pr_notes(self.ledger, self.repo, number, after)
        items = [Feedback(kind=r["kind"], id=str(r["id"]), author=r["author"], body=r["body"] or "",
                               created_at=r["created_at"], state=r["state"], path=r["path"], line=r["line"],
                               review_id=str(r["review_id"]) if r["review_id"] else None,
                               url=f"{self.md_path(number).as_uri()}#note-{r['id']}") for r in rows]
        return FeedbackPage(items=items, cursor=str(rows[-1]["id"]) if rows else since)

    def has_write_access(self, login: str) -> bool:
        return login in self.collaborators

    def own_login(self) -> str:
        return AGENT_LOGIN

    def reply(self, number: int, text: str, key: str) -> str:
        note = self.add_note(number, "comment", AGENT_LOGIN, with_own_mark(text, key))
        return str(note)

    def ci_results(self, sha: str) -> list[CIResult]:
        rows = local_pr_checks(self.ledger, self.repo, sha)
        newest: dict[tuple[str, str], dict] = {}
        for r in rows:  # the newest result per (kind, name) wins, as on GitHub
            newest[(r["kind"], r["name"])] = r
        return [CIResult(kind=r["kind"], id=str(r["id"]), name=r["name"], state=r["state"],
                              conclusion=r["conclusion"] or r["state"], summary=r["summary"] or "", url=r["url"],
                              head_sha=r["sha"]) for r in newest.values()]

    # ------------------------------------------------------------------ the human side (demo, tests)

    def mark(self, number: int, state: str, actor: str = "human") -> PR:
        """Merge or close a PR in the local forge, as a reviewer would on a hosted forge."""
        if state not in ("merged", "closed"):
            raise ForgeError(f"local forge: state must be merged or closed, got {state!r}")
        def close(row: dict | None) -> dict:
            if self._known(row, number)["state"] != "open":
                raise ForgeError(f"local forge: {self.repo}#{number} is already {row['state']}")
            return {"state": state}

        change_local_pr(self.ledger, self.repo, number, close,
                        event=(f"local_pr.{state}", actor, {"repo": self.repo, "number": int(number)}))
        self._write_md(number)
        return self._pr(self._row(number))

    def add_note(self, number: int, kind: str, author: str, body: str, state: str | None = None,
                 path: str | None = None, line: int | None = None, review_id: int | None = None,
                 actor: str = "human") -> int:
        """A review, inline review comment or conversation comment, as a person would write it (`agent pr comment`)."""
        if kind not in ("review", "inline", "comment"):
            raise ForgeError(f"local forge: kind must be review, inline or comment, got {kind!r}")
        if not (author or "").strip():
            raise ForgeError("local forge: a comment needs an author (--author NAME)")
        if line is not None and not path:
            raise ForgeError("local forge: --line needs --path (the file the line is in)")
        if line is not None and int(line) < 1:
            raise ForgeError(f"local forge: --line must be 1 or more, got {line}")
        def still_open(row: dict | None) -> None:
            if self._known(row, number)["state"] != "open":
                raise ForgeError(f"local forge: {self.repo}#{number} is {row['state']}; it takes no more comments")

        note = add_local_pr_note(self.ledger, self.repo, number, {
            "kind": kind, "review_id": review_id, "author": author.strip(), "body": body, "state": state,
            "path": path, "line": int(line) if line is not None else None}, actor, still_open)
        self._write_md(number)
        return note

    def add_review(self, number: int, author: str, state: str, body: str = "",
                   comments: list[tuple[str, int | None, str]] = ()) -> int:
        """A review (changes_requested | commented | approved) with inline comments ``(path, line, body)``."""
        if state not in ("changes_requested", "commented", "approved"):
            raise ForgeError(f"local forge: review state must be changes_requested, commented or approved, got {state!r}")
        review = self.add_note(number, "review", author, body, state=state)
        for path, line, text in comments:
            self.add_note(number, "inline", author, text, path=path, line=line, review_id=review)
        return review

    def record_check(self, sha: str, name: str, state: str, summary: str = "", url: str | None = None,
                     conclusion: str | None = None, kind: str = "check_run", actor: str = "human") -> int:
        """A CI result for commit ``sha`` (`agent pr checks`): state is one of pending, success, failure, neutral."""
        if state not in CI_STATES:
            raise ForgeError(f"local forge: check state must be one of {', '.join(CI_STATES)}, got {state!r}")
        if not (name or "").strip():
            raise ForgeError("local forge: a check needs a name")
        if not sha:
            raise ForgeError("local forge: the PR has no head commit yet; push it first")
        return add_local_pr_check(self.ledger, self.repo, sha, {
            "kind": kind, "name": name.strip(), "state": state, "conclusion": conclusion or state,
            "summary": summary, "url": url}, actor)
