"""``detprof verify``: whether determinism holds, fingerprint by fingerprint."""
