"""Forges: where draft pull requests live.  One interface, four implementations, one publish path.

- ``Forge`` is the interface every forge implements (a ``typing.Protocol``).
- ``FORGES`` maps a repo's ``forge:`` config value to its class (``module:Class``, imported lazily).
- ``get_forge(repo_config, config, home)`` builds the forge for one repository.
- ``publish_pr(...)`` is what the fixer calls: create the task's draft PR or update it, found by head
  branch, and record it in the ledger's ``prs`` table.  It is safe to call again after a crash at any
  point: a PR created just before a crash is found again by its head branch, never created twice.

Rules every forge keeps: PRs are always drafts; a forge never marks one ready and never merges.
All HTTP goes through ``agent.infra.http.ApiClient`` (retries, backoff, rate limits, pagination); each hosted
forge's module (``github``, ``gitlab``, ``gitea``) holds only that forge's quirks.
"""

from __future__ import annotations

import hashlib
import importlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from agent import AgentError

if TYPE_CHECKING:  # pragma: no cover
    from agent.config import Config, RepoConfig
    from agent.ledger import Ledger

PR_STATES = ("open", "closed", "merged")


class ForgeError(AgentError):
    """The forge refused or failed; the message names what to do."""


class ForgeAuthError(ForgeError):
    """Credentials missing, refused (401), not allowed (403) or the repository not visible (404).

    The fixer gate-blocks the task on this: a human must fix the credentials, then `agent task reset`.
    """


@dataclass(frozen=True)
class PR:
    number: int
    url: str
    head: str                 # head branch name
    head_sha: str | None
    base: str
    state: str                # open | closed | merged
    draft: bool
    title: str
    body: str

    def to_dict(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------ PR feedback and CI (the shapes forges return)

FEEDBACK_KINDS = ("review", "inline", "comment")
REVIEW_STATES = ("changes_requested", "commented", "approved", "dismissed", "pending")
CI_STATES = ("pending", "success", "failure", "neutral")
OWN_MARK_PREFIX = "<!-- agent-own: "


def own_mark(key: str) -> str:
    """The hidden last line that marks a comment as the agent's own; ``key`` names what it answers."""
    key = "".join(ch for ch in str(key) if ch.isalnum() or ch in "-_.:#")[:120] or "reply"
    return f"{OWN_MARK_PREFIX}{key} -->"


def with_own_mark(text: str, key: str) -> str:
    return f"{text.rstrip()}\n\n{own_mark(key)}"


def own_key(body: str | None) -> str | None:
    """The key of the own mark if ``body``'s last non-empty line is one (a quote of it, ``> <!-- ...``, is not)."""
    lines = [ln for ln in (body or "").splitlines() if ln.strip()]
    if not lines:
        return None
    last = lines[-1].strip()
    if last.startswith(OWN_MARK_PREFIX) and last.endswith(" -->"):
        return last[len(OWN_MARK_PREFIX):-4] or None
    return None


def signed_key(key: str, secret: str) -> str:
    """``key:SIG``: the reply key with an HMAC keyed by the ledger's own-mark secret, for ``with_own_mark``; only a
    holder of the ledger can write a mark ``verified_key`` accepts."""
    import hmac

    return f"{key}:{hmac.new(secret.encode(), str(key).encode(), hashlib.sha256).hexdigest()[:32]}"


def verified_key(marked: str | None, secret: str) -> str | None:
    """The reply key of an own mark's ``key:SIG`` when SIG is the ledger's, else None (a forged or old mark)."""
    import hmac

    key, _, sig = (marked or "").rpartition(":")
    if not key or not sig:
        return None
    return key if hmac.compare_digest(signed_key(key, secret), marked) else None


def own_login(forge) -> str | None:
    """The login the forge shows on the agent's own comments (the token's user, or a GitHub App's bot), or None
    when the forge cannot say now (then only a verified mark counts)."""
    login = getattr(forge, "own_login", None)
    if login is None:
        return None
    try:
        return login() or None
    except ForgeError:
        return None


@dataclass(frozen=True)
class Feedback:
    """One thing a person wrote on a PR: a review, an inline review comment, or a conversation comment.

    The text is untrusted: whoever uses it fences it (agent/infra/text.py) and never executes it.
    """
    kind: str                      # review | inline | comment
    id: str                        # the forge's id (as a string), unique per kind within the repository
    author: str                    # login
    body: str                      # as the forge returned it
    created_at: str                # ISO 8601 UTC
    state: str | None = None       # reviews: one of REVIEW_STATES; None for comments
    path: str | None = None        # inline: the file
    line: int | None = None        # inline: the line in the new file (None for a file-level comment)
    review_id: str | None = None   # inline: the review it belongs to, if any
    url: str | None = None         # where a human reads it

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.id}"

    @property
    def own_key(self) -> str | None:
        """The key of an own mark on the text's last line (see ``own_mark``); anyone can write one, so the caller
        trusts it only from the agent's own login or with a verified signature (``verified_key``)."""
        return own_key(self.body)

    def to_dict(self) -> dict:
        return {**asdict(self), "key": self.key}


@dataclass(frozen=True)
class FeedbackPage:
    items: list[Feedback]          # oldest first; may repeat items seen before (callers dedupe by ``key``)
    cursor: str | None             # opaque, made by the same forge; pass it to the next ``feedback`` call


@dataclass(frozen=True)
class CIResult:
    """One CI result for a commit: a commit status or a check run."""
    kind: str                      # status | check_run
    id: str
    name: str                      # status context / check run name
    state: str                     # normalised: one of CI_STATES
    conclusion: str                # the forge's own word (failure, timed_out, error, success, in_progress, ...)
    summary: str                   # description / output title + summary (untrusted text)
    url: str | None                # details URL
    head_sha: str
    app: str | None = None         # a check run's GitHub App (slug); None where the forge names none

    def to_dict(self) -> dict:
        return asdict(self)


def ci_state(status: str | None, conclusion: str | None = None) -> str:
    """Normalise a forge's CI words to pending | success | failure | neutral.

    GitHub statuses: pending/success/failure/error.  GitHub check runs: status queued/in_progress/completed
    (+ waiting/requested/pending) and conclusion success/failure/timed_out/startup_failure/cancelled/
    action_required/neutral/skipped/stale.  GitLab: created, running, success, failed, canceled, skipped, manual...
    Gitea: pending/success/error/failure/warning/skipped.  Cancelled and action-required runs are neutral (a
    human stopped or must approve them; no code change answers that).
    """
    word = (conclusion or status or "").strip().lower()
    if status and status.lower() in ("queued", "in_progress", "waiting", "requested") and not conclusion:
        return "pending"
    if word in ("success", "passed"):
        return "success"
    if word in ("failure", "failed", "error", "timed_out", "startup_failure"):
        return "failure"
    if word in ("", "pending", "queued", "in_progress", "waiting", "requested", "created", "running",
                "preparing", "waiting_for_resource", "scheduled"):
        return "pending"
    return "neutral"


class ForgeRateLimited(ForgeError):
    """The forge's rate limit would need a longer wait than allowed; try again later.

    ``until`` is the epoch time the forge allows calls again (when known); it is remembered in the ledger
    (``forge_pending``) and no call to that forge is made before it on later scans.
    """

    def __init__(self, message: str, until: float | None = None, remembered: bool = False):
        super().__init__(message)
        self.until = until
        self.remembered = remembered      # raised from the ledger's record, without calling the forge


class ForgeConflict(ForgeError):
    """The forge says a PR for this head (and base) already exists (GitHub 422, GitLab 409, Gitea 409)."""


class ForgeTransient(ForgeError):
    """A timeout, a dropped connection or a 5xx that was not (or could not safely be) retried."""


class ForgeBadAnswer(ForgeTransient):
    """An answer that is not the JSON shape the call expects (a proxy's HTML page, a list for an object, a
    missing field): handled like a 5xx, i.e. retried on the next scan."""


@runtime_checkable
class Forge(Protocol):
    name: str                 # "github" | "gitlab" | "gitea" | "local"
    repo: str                 # OWNER/NAME

    def find_pr_by_head(self, branch: str) -> PR | None:
        """The PR whose head is ``branch`` (an open one first, else the newest), or None."""

    def create_draft(self, head: str, base: str, title: str, body: str, task_id: int | None = None) -> PR:
        """Open a draft PR; adopts an existing one only if it is open, a draft and on ``head``."""

    def update(self, number: int, title: str, body: str) -> PR:
        """Replace the title and body."""

    def comment(self, number: int, text: str) -> None:
        """Add a comment."""

    def add_labels(self, number: int, labels: list[str]) -> None:
        """Add labels (existing ones are kept)."""

    def state(self, number: int) -> PR:
        """The PR as the forge sees it now."""

    # -- PR feedback and CI (`agent watch pr-feedback`) --------------------------------------------------

    def feedback(self, number: int, since: str | None = None) -> FeedbackPage:
        """Reviews (with state), inline review comments (path, line) and conversation comments on PR
        ``number``, oldest first, from ``since`` (a cursor this forge returned before; None = all).
        Items may repeat across calls; the caller dedupes by ``Feedback.key``.  The agent's own comments
        are included (the caller recognises them by ``Feedback.own_key``)."""

    def has_write_access(self, login: str) -> bool:
        """Whether ``login`` may push to the repository (GitHub: collaborator permission admin/maintain/write).
        An unknown user is False, not an error."""

    def own_login(self) -> str | None:
        """The author login of the comments this forge's credentials post (GitHub: the token's user, or an App's
        ``slug[bot]``); None when unknown.  The agent knows its own comments by this author first."""

    def reply(self, number: int, text: str, key: str) -> str:
        """Post a conversation comment marked as the agent's own (``with_own_mark(text, key)``); returns its id.
        Not retried automatically: the caller looks for its own mark ``key`` before posting again."""

    def ci_results(self, sha: str) -> list[CIResult]:
        """Commit statuses (the newest per context) and check runs for commit ``sha``."""


FORGES: dict[str, str] = {
    "github": "agent.forge.github:GithubForge",
    "gitlab": "agent.forge.gitlab:GitlabForge",
    "gitea": "agent.forge.gitea:GiteaForge",
    "local": "agent.forge.local:LocalForge",
}


def forge_class(name: str):
    if name not in FORGES:
        raise ForgeError(f"unknown forge {name!r}; expected one of {', '.join(FORGES)}")
    module, attr = FORGES[name].split(":")
    return getattr(importlib.import_module(module), attr)


def get_forge(repo_config: "RepoConfig", config: "Config", home: Path | str, ledger: "Ledger | None" = None) -> Forge:
    """The forge for ``repo_config`` (its ``forge:`` key).  ``ledger`` is used by the local forge;
    when omitted it opens ``home/ledger.db``."""
    forge = forge_class(repo_config.forge).from_config(repo_config, config, Path(home), ledger)
    api = getattr(forge, "api", None)       # a hosted forge's ApiClient
    if ledger is not None and api is not None:
        api.hold = RateLimitHold(ledger, forge.name, forge.api_url, api.clock)
    return forge


class RateLimitHold:
    """A forge's rate-limit reset remembered in the ledger (``forge_pending`` row ``rate_limit:<forge> <api url>``),
    so no call to that forge is made before it, by any scan or repository."""

    def __init__(self, ledger: "Ledger", forge: str, api_url: str, clock):
        self.ledger = ledger
        self.forge = forge
        self.api_url = api_url
        self.key = f"rate_limit:{forge} {api_url}"
        self.clock = clock

    def check(self, what: str) -> None:
        import time

        hold = self.ledger.pending(self.key)
        if hold and hold["until"] and hold["until"] > self.clock():
            at = time.strftime("%H:%M:%S UTC", time.gmtime(hold["until"]))
            raise ForgeRateLimited(f"{self.forge} {self.api_url}: rate limited until {at} (remembered from an "
                                   f"earlier call); no call before then, {what} waits for a later scan",
                                   until=hold["until"], remembered=True)

    def remember(self, until: float, what: str) -> None:
        reason = f"rate limited on {what}"
        with self.ledger.tx() as c:
            self.ledger.set_pending(c, self.key, "rate_limit", reason, until=until)
            self.ledger.event(c, "forge.rate_limited", "script", {"forge": self.forge, "api_url": self.api_url,
                                                                  "until": until, "reason": reason})


def adoption_refusal(pr: PR, branch: str) -> str | None:
    """Why an existing PR may not be adopted as the task's draft, or None if it may."""
    why = []
    if pr.state != "open":
        why.append(f"it is {pr.state}")
    if not pr.draft:
        why.append("it is not a draft")
    if pr.head != branch:
        why.append(f"its head is {pr.head!r}, not {branch!r}")
    if not why:
        return None
    return (f"a pull request for branch {branch} already exists (#{pr.number}, {pr.url}) and {' and '.join(why)}; "
            "refusing to adopt it: close it or delete the branch, then `agent task reset`")


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
            from agent.coord.fence import crashpoint

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
