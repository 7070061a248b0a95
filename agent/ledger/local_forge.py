"""Record operations of the embedded local forge (``local_prs``, ``local_pr_notes``, ``local_pr_checks``).

``agent.forge.local.LocalForge`` keeps its rules (adoption, who may comment, valid states); what it reads and
writes in the ledger is here. A ``check(row)`` callback runs inside the write transaction on the row as it is
then, and raises to write nothing.
"""

from __future__ import annotations

from typing import Any, Callable

from agent.ledger import Ledger, now


def local_pr(ledger: Ledger, repo: str, number: int, conn=None) -> dict | None:
    c = conn or ledger.conn
    row = c.execute("SELECT * FROM local_prs WHERE repo = ? AND number = ?", (repo, int(number))).fetchone()
    return dict(row) if row is not None else None


def local_pr_by_head(ledger: Ledger, repo: str, head: str) -> dict | None:
    """The PR of ``head`` (an open one first, else the newest)."""
    return ledger.one("SELECT * FROM local_prs WHERE repo = ? AND head = ? "
                      "ORDER BY CASE WHEN state = 'open' THEN 1 ELSE 0 END DESC, number DESC LIMIT 1", (repo, head))


def local_pr_notes(ledger: Ledger, repo: str, number: int, after: int = 0) -> list[dict]:
    return ledger.all("SELECT * FROM local_pr_notes WHERE repo = ? AND number = ? AND id > ? ORDER BY id",
                      (repo, int(number), after))


def local_pr_checks(ledger: Ledger, repo: str, sha: str) -> list[dict]:
    return ledger.all("SELECT * FROM local_pr_checks WHERE repo = ? AND sha = ? ORDER BY id", (repo, sha))


def open_local_pr(ledger: Ledger, repo: str, head: str, base: str, title: str, body: str, sha: str | None,
                  check_existing: Callable[[dict], None]) -> int:
    """The open PR of ``head`` updated (after ``check_existing(row)`` allowed adopting it), else a new draft with
    the repository's next number and ``local_pr.opened``. Returns its number."""
    with ledger.tx() as c:
        existing = c.execute("SELECT * FROM local_prs WHERE repo = ? AND head = ? AND state = 'open'",
                             (repo, head)).fetchone()
        if existing is not None:
            existing = dict(existing)
            check_existing(existing)
            ledger.update(c, "local_prs", {"id": existing["id"]},
                          {"title": title, "body": body, "head_sha": sha or existing["head_sha"], "updated_at": now()})
            return existing["number"]
        number = (c.execute("SELECT max(number) FROM local_prs WHERE repo = ?", (repo,)).fetchone()[0] or 0) + 1
        ts = now()
        ledger.insert(c, "local_prs", {
            "repo": repo, "number": number, "head": head, "head_sha": sha, "base": base, "title": title,
            "body": body, "state": "open", "draft": 1, "labels": "[]", "comments": "[]", "created_at": ts,
            "updated_at": ts})
        ledger.event(c, "local_pr.opened", "script", {"repo": repo, "number": number, "head": head, "head_sha": sha})
        return number


def change_local_pr(ledger: Ledger, repo: str, number: int, change: Callable[[dict | None], dict[str, Any]],
                    event: tuple[str, str, dict] | None = None) -> dict:
    """Inside one transaction: ``change(row)`` (raising if the PR may not change) returns the values to write;
    they are written with ``event`` (kind, actor, payload) if given. Returns the row as it was."""
    with ledger.tx() as c:
        row = local_pr(ledger, repo, number, c)
        values = change(row)
        ledger.update(c, "local_prs", {"id": row["id"]}, {**values, "updated_at": now()})
        if event is not None:
            ledger.event(c, event[0], event[1], event[2])
        return row


def add_local_pr_note(ledger: Ledger, repo: str, number: int, note: dict[str, Any], actor: str,
                      check: Callable[[dict | None], None]) -> int:
    """A review, inline comment or comment on an open PR (``check(row)`` first), with ``local_pr.<kind>``."""
    with ledger.tx() as c:
        check(local_pr(ledger, repo, number, c))
        note_id = ledger.insert(c, "local_pr_notes", {"repo": repo, "number": int(number), **note,
                                                      "created_at": now()})
        ledger.event(c, f"local_pr.{note['kind']}", actor, {
            "repo": repo, "number": int(number), "id": note_id, "author": note["author"], "path": note["path"],
            "line": note["line"], "state": note["state"]})
        return note_id


def add_local_pr_check(ledger: Ledger, repo: str, sha: str, values: dict[str, Any], actor: str) -> int:
    """A CI result for a commit, with ``local_pr.check``."""
    with ledger.tx() as c:
        cid = ledger.insert(c, "local_pr_checks", {"repo": repo, "sha": sha, **values, "created_at": now()})
        ledger.event(c, "local_pr.check", actor, {"repo": repo, "sha": sha, "name": values["name"],
                                                  "state": values["state"], "id": cid})
        return cid
