"""Pure domain code: no I/O, no ledger. The step chain and its guard, specs, PR text, prices, shared wording."""
