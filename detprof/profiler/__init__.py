"""Tracers, trace parsers, the KernelTable schema, analyses over it, and the sweep driver."""
