"""Lanes: run coding-agent CLIs (vendors) in a worktree, parse their final report, repair by resuming."""
