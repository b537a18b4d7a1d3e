"""The folder detprof puts first on a program's ``PYTHONPATH`` (``profiler.program.run``): it holds the
``sitecustomize`` that every Python process of the program runs at start-up. A package only so that
it ships with detprof; nothing imports it as one."""
