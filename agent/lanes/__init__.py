"""Lanes: run CLI coding agents (codex, claude, ..., or any command) on a spec, safely.

- ``agent.infra.proc``            the one process runner (process group, timeout, capped logs)
- ``agent.lanes.env``       the allowlisted environment a lane sees
- ``agent.lanes.report``    the fail-closed STATUS/SUMMARY/FINDINGS report parser
- ``agent.lanes.vendors``   the adapter protocol, the ``VENDORS`` registry, the ``command`` vendor
- ``agent.lanes.lane``      ``run_lane``: one lane run with repair, read-only check, manifest, ledger
- ``agent.lanes.progress``  elapsed time + last output line on a terminal

Import the submodules you need; this package imports nothing heavy.
"""
