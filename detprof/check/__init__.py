"""The CI check: a frozen baseline, regression statistics, and outputs CI systems read."""
