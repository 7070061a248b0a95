"""What things are called, checked one way, in a leaf: the built-in vendors (config validates against them, the lane
registry loads their adapters, git excludes what their CLIs leave in a worktree) and repository keys (``OWNER/NAME``;
GitLab also ``GROUP/SUBGROUP/.../NAME``), which config, the forges and task creation accept."""

from __future__ import annotations

from typing import Any


BUILTIN_VENDORS = ("codex", "claude", "grok", "gemini", "aider", "opencode")


# paths a vendor CLI itself writes into any worktree (caches, settings): never committed, never an edit
WORKTREE_LITTER: dict[str, tuple[str, ...]] = {
    "aider": (".aider.tags.cache.v4/",),
    "grok": (".grok/",),
}


NESTED_FORGES = ("gitlab",)      # project paths of any depth: GROUP/SUBGROUP/.../NAME


def repo_key_problem(key: Any, forge: str | None = None) -> str | None:
    """Why ``key`` is not a repository key of ``forge`` (``OWNER/NAME``; GitLab also ``GROUP/SUBGROUP/.../NAME``;
    ``forge`` None: any depth), or None.  A segment is letters, digits and ``._-``, neither ``.``, ``..`` nor
    starting with ``-``."""
    import re

    nested = forge is None or forge in NESTED_FORGES
    expected = "expected a repository name OWNER/NAME" + (" (GitLab: GROUP[/SUBGROUP...]/NAME)" if nested else "")
    parts = key.split("/") if isinstance(key, str) else []
    if len(parts) < 2 or (len(parts) > 2 and not nested):
        return expected + (", got a nested path: only GitLab has nested groups" if len(parts) > 2 else "")
    bad = next((p for p in parts if p in ("", ".", "..") or p.startswith("-")
                or not re.fullmatch(r"[A-Za-z0-9._-]+", p)), None)
    return None if bad is None else f"{expected}, got the segment {bad!r}"
