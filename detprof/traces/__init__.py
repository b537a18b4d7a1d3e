"""The trace layer: every trace format into one KernelTable, and the analyses of kernel tables."""
