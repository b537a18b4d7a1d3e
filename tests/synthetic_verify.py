"""Synthetic ``detprof verify`` studies in the real format: records, fingerprints and samples on disk.

A real verification trains each model four times in fresh workers (tens of seconds a model),
so the report's tests write what those runs write instead: a ``ResultsStore(root, "verify")``
with one ``records.verify_run`` record per run and each run's ``fingerprints.RunFingerprints``
saved beside it. A model's two runs of a mode are the same tensors unless the test plants a
point where they part: from then on, the layers at and after it differ by an amount that
grows tenfold per layer and per step, and every layer differs at later steps (the weights
took different updates), which is what a real nondeterministic op does to a model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import synthetic_sweep as synth

from detprof.fingerprints import RunFingerprints
from detprof.records import verify_run
from detprof.store import ResultsStore

STEPS = 4
FIRST_DIFFERENCE = 1e-7
"""The size of the difference where two runs part; it grows tenfold per layer after it and per step."""


@dataclass(frozen=True)
class Planted:
    """One model's verification: its layers, where each mode's two runs part (step, layer index), or a refusal."""

    layers: Sequence[str]
    deterministic: tuple[int, int] | None = None
    default: tuple[int, int] | None = None
    finding: Mapping[str, Any] | None = None
    """An op that refused to run deterministically (``findings.Finding.to_json``): no deterministic run took a step."""


def _difference(step: int, layer: int, parts: tuple[int, int] | None) -> float:
    if parts is None or step < parts[0] or (step == parts[0] and layer < parts[1]):
        return 0.0
    return FIRST_DIFFERENCE * 10.0 ** (step - parts[0] + max(0, layer - parts[1]))


def run_pair(
    layers: Sequence[str], steps: int, parts: tuple[int, int] | None
) -> tuple[RunFingerprints, RunFingerprints]:
    """Two runs' fingerprints as ``verify.workload`` takes them: every layer's output in model order, then weights."""
    rng = np.random.default_rng(7)
    a, b = RunFingerprints(), RunFingerprints()
    for step in range(steps):
        a.begin_step()
        b.begin_step()
        for kind in ("output", "weights"):
            for index, layer in enumerate(layers):
                x = rng.standard_normal((4, 3))
                moved = _difference(step, index, parts) if kind == "output" else _difference(step, 0, parts)
                a.add(layer, kind, [x])
                b.add(layer, kind, [x + moved] if moved else [x])
    return a, b


def write_verify(
    root: Path,
    models: Mapping[str, Planted],
    *,
    device: Mapping[str, Any] | None = None,
    backend: str = "torch",
    steps: int = STEPS,
    compiled: Mapping[str, str] | None = None,
) -> Path:
    """A verification study of ``models`` under ``root/verify``, as ``detprof verify`` writes one; returns ``root``.
    ``compiled``: what each run's worker said of its compiling (``Backend.compile_in_this_process``); none, as a
    framework without a cache of compiled steps across processes says."""
    device = dict(device or synth.DEVICE)
    store = ResultsStore(root, "verify")
    config = {"models": list(models), "backend": backend, "gpu_label": device["label"], "steps": steps}
    command = f"detprof verify --models {','.join(models)} --backend {backend} --steps {steps}"
    store.open(config, command, resume=False)
    for order, (model, planted) in enumerate(models.items()):
        for mode in ("deterministic", "default"):
            finding = planted.finding if mode == "deterministic" else None
            refused = finding is not None
            runs = run_pair(planted.layers, 0 if refused else steps, getattr(planted, mode))
            for replica, fingerprints in zip("ab", runs, strict=True):
                run_id = f"{model}--{mode}--{replica}"
                folder = Path("fingerprints") / run_id
                if not refused:
                    fingerprints.save(store.dir / folder)
                store.write_record(
                    dict(
                        verify_run(
                            run_id=run_id,
                            model=model,
                            mode=mode,
                            replica=replica,
                            status="unsupported" if refused else "ok",
                            reason=None if finding is None else str(finding["message"]),
                            backend=backend,
                            steps=0 if refused else steps,
                            steps_asked=steps,
                            fingerprints=None if refused else str(folder),
                            layers=list(planted.layers),
                            finding=None if finding is None else dict(finding),
                            settings=synth.settings(mode, backend),
                            versions=dict(synth.BACKEND_VERSIONS[backend]),
                            device=device,
                            started_at=f"2025-01-02T00:{order:02d}:00+00:00",
                            finished_at=f"2025-01-02T00:{order:02d}:20+00:00",
                            duration_s=20.0,
                            **(compiled or {}),
                        )
                    )
                )
    return root
