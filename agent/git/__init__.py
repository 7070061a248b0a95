"""The git layer: the hardened git runner, mirrors and worktrees (``workspace``), pushing (``push``)."""
