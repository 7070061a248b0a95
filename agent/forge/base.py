"""The forge interface and its vocabulary, in a leaf every forge module imports: ``Forge`` (a ``typing.Protocol``),
``PR``, ``Feedback``, ``CIResult``, the error classes, the agent's own-comment marks and the adoption rule."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from typing import Protocol, runtime_checkable

from agent import AgentError


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
