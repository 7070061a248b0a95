"""Lanes: run CLI coding agents (codex, claude, ..., or any command) on a spec, safely.

- ``agent.lanes.protocol``  the adapter protocol and its value types (a leaf)
- ``agent.lanes.vendors``   the ``VENDORS`` registry and the ``command`` vendor
- ``agent.lanes.builtin``   the built-in adapters (codex, claude, opencode, aider, grok, gemini)
- ``agent.lanes.report``    the fail-closed STATUS/SUMMARY/FINDINGS report parser
- ``agent.lanes.lane``      ``run_lane``: one lane run with repair, read-only check, manifest, ledger
- ``agent.lanes.sandbox``   bubblewrap; ``agent.lanes.egress`` the allowlisting egress proxy
- ``agent.lanes.files``     every read of a lane-written file; ``agent.lanes.progress`` elapsed time on a terminal

A lane runs through ``agent.infra.proc`` (the one process runner) with ``agent.infra.env``'s allowlisted
environment. Import the submodules you need; this package imports nothing heavy.
"""
