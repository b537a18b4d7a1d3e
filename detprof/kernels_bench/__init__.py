"""Op-level microbenchmarks of what determinism costs, one operation at a time."""
