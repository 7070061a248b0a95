"""The PR thread: the task's one draft PR, published and recorded (``publish_pr``): created, updated, or found by
its head branch and adopted after a crash, never twice; and its row in the ledger's ``prs`` table (``record_pr``)."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from agent.forge.base import PR, Forge, ForgeError, adoption_refusal

if TYPE_CHECKING:  # pragma: no cover
    from agent.ledger import Ledger


def body_hash(body: str) -> str:
    return hashlib.sha256(body.encode("utf-8")).hexdigest()


def publish_pr(ledger: "Ledger", forge: Forge, task_id: int, head: str, base: str, title: str, body: str,
               head_sha: str | None, actor: str = "script", claim_token: str | None = None) -> tuple[PR, str]:
    """Create or update the task's draft PR and record it in ``prs`` (with its event, one transaction, checking
    ``claim_token``: None only for the follow-up that retries an owed PR text, which holds no claim).

    Returns ``(pr, action)`` with action ``created`` | ``updated`` | ``adopted`` | ``unchanged``.
    Order matters for crash safety: the forge is asked first (a PR recorded for the task, else one found
    by head branch, else a new one), the ledger written last.  A crash between the forge call and the
    ledger write leaves a PR the ledger does not know; the next call finds it by head and adopts it.
    """
    if head == base:
        raise ForgeError(f"task {task_id}: head branch {head!r} is the base branch; refusing to open a PR")
    from agent.ledger.prs import get_pr

    row = get_pr(ledger, task_id)
    if row is not None and row["number"] is not None and row["forge"] == forge.name:
        current = forge.state(int(row["number"]))
        if current.state != "open":
            raise ForgeError(f"task {task_id}: PR #{current.number} is {current.state}; not updating it "
                             "(`agent watch pr-merged` follows it up)")
        action = "unchanged"
        pr = current
        if current.title != title or current.body != body:
            pr = forge.update(current.number, title, body)
            action = "updated"
    else:
        found = forge.find_pr_by_head(head)
        if found is not None:
            why = adoption_refusal(found, head)
            if why:
                raise ForgeError(f"task {task_id}: {why}")
            pr = found
            if found.title != title or found.body != body:
                pr = forge.update(found.number, title, body)
            action = "adopted"
        else:
            pr = forge.create_draft(head, base, title, body)
            action = "created"
            from agent.infra.faults import crashpoint

            crashpoint("pr.created")  # fault injection (tests): the PR exists, the ledger does not know it yet
    record_pr(ledger, task_id, forge, pr, head_sha=head_sha, title=title, body=body, action=action, actor=actor,
              claim_token=claim_token)
    return pr, action


def record_pr(ledger: "Ledger", task_id: int, forge: Forge, pr: PR, head_sha: str | None, title: str, body: str,
              action: str, actor: str = "script", claim_token: str | None = None) -> None:
    from agent.ledger import prs

    prs.record_pr(ledger, task_id, {"forge": forge.name, "repo": forge.repo, "number": pr.number, "url": pr.url,
                                    "head_branch": pr.head, "head_sha": head_sha or pr.head_sha, "base": pr.base,
                                    "state": pr.state, "draft": 1 if pr.draft else 0, "title": title, "body": body,
                                    "body_hash": body_hash(body)}, action, actor, claim_token=claim_token)
