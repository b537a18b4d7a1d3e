"""Stands in for the ``nsys`` binary (a GPU-machine tool) in tests that have no Nsight Systems.

Copied under the name ``nsys`` into a folder on PATH, behind a ``#!`` line naming the test's
Python. It writes its argv as JSON to $FAKE_NSYS_LOG. With $FAKE_NSYS_EXPORT set, it
"exports" by copying that prepared file to the ``--output`` path; without, it fails as a
corrupt report does.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

Path(os.environ["FAKE_NSYS_LOG"]).write_text(json.dumps(sys.argv[1:]))
exported = os.environ.get("FAKE_NSYS_EXPORT")
if exported is None:
    sys.stderr.write("Processing...\nError: report file is corrupt\n")
    sys.exit(1)
shutil.copy(exported, sys.argv[sys.argv.index("--output") + 1])
