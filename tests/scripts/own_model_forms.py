"""Every form of a model of your own, built, inspected and trained on one Keras backend, as a worker does it.

Run in its own interpreter from the folder that holds the models (argv: the backend, then a
JSON request): a backend is chosen once per process, and determinism must never leak into
pytest's. Each spec of ``describe`` is inspected as ``own_build.inspect`` does it and asked
whether it outputs probabilities; each of ``train`` also takes one sweep step
(``workloads.model_training``, on ``data`` when its inputs or outputs need it) and, with one
input and one output, one stability step and its features. Prints one JSON object (the last
line of stdout).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from detprof.determinism import DeterminismSettings, apply
from detprof.models import own, own_build
from detprof.models.npz_data import headers

SHAPE = (8, 8, 1)
CLASSES = 10
BATCH = 4


def described(spec: str) -> dict[str, Any]:
    model = own.parse(spec)
    answer = own_build.describe(model, SHAPE, CLASSES)
    answer["probabilities"] = own_build.outputs_probabilities(own_build.build(model, SHAPE, CLASSES))
    return answer


def sweep_step(spec: str, data: Path, backend: str) -> dict[str, Any]:
    """One step of the sweep's workload, fed as the sweep's plan would feed it."""
    from detprof.profiler.worker_spec import WorkerSpec
    from detprof.profiler.workloads import model_training

    model = own.parse(spec)
    item = own.Inspected.from_answer(model, own_build.describe(model, SHAPE, CLASSES))
    params: dict[str, Any] = {"batch_size": BATCH, "model": item.label, "own_model": item.model.as_record()}
    params |= {"input_shape": list(SHAPE), "classes": CLASSES}
    if len(item.inputs) != 1 or len(item.outputs) != 1:
        params["data"] = own.data_feed(item, data, headers(data), BATCH)
    settings = DeterminismSettings("default", backend=backend)
    step, facts = model_training(WorkerSpec("t", "", settings, 0, 1, 0, 0, "none", None, "", "", params))
    step()
    return facts


def stability_step(spec: str, backend: str) -> dict[str, Any]:
    """The stability study's trainer: reset for a run, one training step, and the features it scores."""
    from detprof.stability.training import Trainer
    from detprof.stability.variants import RunSeeds

    jit_compile = DeterminismSettings("deterministic", backend=backend).jit_compile  # type: ignore[arg-type]
    model = own.parse(spec)
    trainer = Trainer(model.label, SHAPE, CLASSES, 1e-3, jit_compile, own_model=model)
    trainer.reset(RunSeeds(init=1, shuffle=2, augment=3, dropout=4, bitflip=None))
    rng = np.random.default_rng(0)
    x = rng.random((16, *SHAPE), dtype=np.float32)
    loss, _ = trainer.train_step(x, rng.integers(0, CLASSES, size=16).astype(np.int32))
    features, outputs = trainer.infer(x, 8)
    return {
        "loss": loss,
        "outputs": "probabilities" if trainer.outputs_probabilities else "logits",
        "features": int(features.shape[1]),
        "rows": [round(float(s), 4) for s in outputs.sum(axis=1)[:2]],
    }


def main(backend: str, request: dict[str, Any]) -> dict[str, Any]:
    apply(DeterminismSettings("default", backend=backend))  # type: ignore[arg-type]
    data = Path(request["data"]).resolve()
    found: dict[str, Any] = {spec: described(spec) for spec in request["describe"]}
    for spec in request["train"]:
        found[spec]["sweep"] = sweep_step(spec, data, backend)
        if len(found[spec]["outputs"]) == 1:
            found[spec]["stability"] = stability_step(spec, backend)
    return found


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], json.loads(sys.argv[2]))))
