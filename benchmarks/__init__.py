"""Speed-target benchmarks.

Each ``bench_*.py`` module has a ``main()`` that prints its measurements and returns an
exit code (0 or None when its targets are met).
"""
