"""A driver that starts one detprof worker behind a wrapper process, as nsys runs it, and waits to be killed.

Usage: lifeline_driver.py WORK_DIR. The wrapper is a shell that runs the worker as its child
(the command after it keeps the shell from exec'ing), so the worker's parent is the wrapper,
not this driver. The worker answers a ``call`` that blocks for ten minutes; it can only end
sooner by noticing that its driver is gone. Prints the wrapper's pid once it has started.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from detprof.profiler.lifeline import driver_lifeline
from detprof.profiler.process import worker_command
from detprof.store import atomic_write_json

work = Path(sys.argv[1])
spec, result = work / "spec.json", work / "result.json"
atomic_write_json(spec, {"call": "multiprocessing.connection:wait", "request": {"object_list": [], "timeout": 600}})
env, fds = driver_lifeline()
with open(work / "worker.log", "wb") as log:
    wrapper = subprocess.Popen(
        ["sh", "-c", '"$@"; exit $?', "wrapper", *worker_command(spec, result)],
        env={**os.environ, **env},
        pass_fds=fds,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
print(wrapper.pid, flush=True)
wrapper.wait()
