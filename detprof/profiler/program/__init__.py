"""A training program detprof did not write, measured as a black box: its plan, its runs, the files it exchanges."""
