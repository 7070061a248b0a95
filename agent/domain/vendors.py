"""The built-in vendor names, once, in a leaf: config validates against them, the lane registry loads their
adapters (``agent.lanes.builtin``), git excludes what their CLIs leave in a worktree."""

BUILTIN_VENDORS = ("codex", "claude", "grok", "gemini", "aider", "opencode")

# paths a vendor CLI itself writes into any worktree (caches, settings): never committed, never an edit
WORKTREE_LITTER: dict[str, tuple[str, ...]] = {
    "aider": (".aider.tags.cache.v4/",),
    "grok": (".grok/",),
}
