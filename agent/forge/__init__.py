"""Forges: where draft pull requests live.  One interface, four implementations.

- ``agent.forge.base``: ``Forge``, the interface every forge implements (a ``typing.Protocol``), and its vocabulary
  (``PR``, ``Feedback``, ``CIResult``, the errors); re-exported here.
- ``FORGES`` maps a repo's ``forge:`` config value to its class (``module:Class``, imported lazily).
- ``get_forge(repo_config, config, home)`` builds the forge for one repository.
- Publishing the task's draft PR and recording it is the PR thread's (``agent.flows.pr_thread.publish_pr``).

Rules every forge keeps: PRs are always drafts; a forge never marks one ready and never merges.
All HTTP goes through ``agent.infra.http.ApiClient`` (retries, backoff, rate limits, pagination); each hosted
forge's module (``github``, ``gitlab``, ``gitea``) holds only that forge's quirks.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

from agent.forge.base import (CI_STATES, FEEDBACK_KINDS, OWN_MARK_PREFIX, PR, PR_STATES, REVIEW_STATES,  # noqa: F401
                              CIResult, Feedback, FeedbackPage, Forge, ForgeAuthError, ForgeBadAnswer, ForgeConflict,
                              ForgeError, ForgeRateLimited, ForgeTransient, adoption_refusal, ci_state, own_key,
                              own_login, own_mark, signed_key, verified_key, with_own_mark)

if TYPE_CHECKING:  # pragma: no cover
    from agent.config import Config, RepoConfig
    from agent.ledger import Ledger


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

        from agent.ledger import pending

        hold = pending.pending(self.ledger, self.key)
        if hold and hold["until"] and hold["until"] > self.clock():
            at = time.strftime("%H:%M:%S UTC", time.gmtime(hold["until"]))
            raise ForgeRateLimited(f"{self.forge} {self.api_url}: rate limited until {at} (remembered from an "
                                   f"earlier call); no call before then, {what} waits for a later scan",
                                   until=hold["until"], remembered=True)

    def remember(self, until: float, what: str) -> None:
        from agent.ledger import pending

        reason = f"rate limited on {what}"
        with self.ledger.tx() as c:
            pending.set_pending(self.ledger, c, self.key, "rate_limit", reason, until=until)
            self.ledger.event(c, "forge.rate_limited", "script", {"forge": self.forge, "api_url": self.api_url,
                                                                  "until": until, "reason": reason})
