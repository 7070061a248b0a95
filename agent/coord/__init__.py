"""Coordination between runners: runner identity and liveness, task claims with fencing tokens, named leases,
scan locks. Below git, config and the adapters; above the ledger."""
