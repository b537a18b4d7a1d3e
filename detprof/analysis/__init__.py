"""Read-side results of measured studies: overheads with their intervals, and what each model's runs found.

Pure functions of records and kernel tables: nothing here starts a process, so the report,
``check``'s comparison and ``kernels`` read results without importing the runner.
"""
