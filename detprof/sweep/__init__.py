"""The sweep: models in default and deterministic mode, the embedded default end to end."""
