"""One replica of ``detprof verify``'s deterministic runs for several models, in one process of one backend.

``python verify_models.py BACKEND OUT MODEL[:SIZE] ...``: each model trained ``STEPS`` steps at
its input size (32 unless given: InceptionV3 needs 75; a GPT's sequence length) by the verification workload, its
fingerprints in ``OUT/<model>``; prints each model's status as JSON. Two such processes are
two replicas, compared by the test.
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from detprof.models import registry
from detprof.verify.workload import VerifyAsk, fingerprint_runs

STEPS = 2
BATCH = 2
CLASSES = 4


def main(backend: str, out: str, models: list[str]) -> dict[str, str]:
    asks, names = [], []
    for given in models:
        name, _, size = given.partition(":")
        side = int(size or 32)
        shape = list(registry.get(name).shape_at(side))
        params = {"model": name, "input_shape": shape, "classes": CLASSES, "batch_size": BATCH}
        asks.append(asdict(VerifyAsk(params, "deterministic", backend, 0, STEPS, False)))
        names.append(name)
    with tempfile.TemporaryDirectory() as answers:
        fingerprint_runs(asks, [f"{out}/{name}" for name in names], answers)
        said = [json.loads((Path(answers) / f"{i}.json").read_text()) for i in range(len(names))]
    return {
        name: f"{answer['status']}: {answer['reason']}" if answer["status"] != "ok" else "ok"
        for name, answer in zip(names, said, strict=True)
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], sys.argv[3:])))
