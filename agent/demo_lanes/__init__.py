"""Scripted stand-ins for coding agents, used by `agent demo` and the tests.

They are plain scripts run as real subprocesses through the `command` vendor, exactly like an in-house agent would
be: they read the spec file, edit the worktree, and end their output with the final report. They do not think: the
implementer applies the next group of edits from a playbook, the reviewer applies a fixed rule. Nothing here calls a
model.
"""
