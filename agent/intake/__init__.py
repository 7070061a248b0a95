"""Error intake: formats -> redaction -> fingerprint -> dedupe into the ledger, and pull sources."""
