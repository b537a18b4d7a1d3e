"""The paired log-ratio overhead and its t-interval, against scipy computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from detprof.analysis.overhead import ModelOverhead, model_overheads, paired_log_ratios
from detprof.intervals import paired_t


def record(model: str, mode: str, repeat: int, kernel: float | None, wall: float, status: str = "ok") -> dict:
    return {
        "run_id": f"{model}--{mode}--r{repeat}",
        "model": model,
        "mode": mode,
        "repeat": repeat,
        "status": status,
        "reason": None if status == "ok" else "boom",
        "kernel_ns_per_step": kernel,
        "wall_ns_per_step": wall,
    }


def test_interval_matches_scipy_t_interval() -> None:
    logs = [0.4, 0.5, 0.45, 0.38]
    o = paired_t(logs)
    lo, hi = stats.t.interval(0.95, df=3, loc=np.mean(logs), scale=stats.sem(logs))
    assert o.ratio == pytest.approx(math.exp(np.mean(logs)))
    assert o.ci_low == pytest.approx(math.exp(lo)) and o.ci_high == pytest.approx(math.exp(hi))


def test_single_pair_has_no_interval() -> None:
    o = paired_t([0.2])
    assert o.n == 1 and math.isnan(o.ci_low)
    assert paired_t([]) is None


def test_pairs_by_repeat_and_skips_failures() -> None:
    recs = [
        record("m", "deterministic", 0, 200.0, 20.0),
        record("m", "default", 0, 100.0, 10.0),
        record("m", "deterministic", 1, 300.0, 30.0),
        record("m", "default", 1, 100.0, 10.0),
        record("m", "deterministic", 2, None, 30.0, status="failed"),
        record("m", "default", 2, 100.0, 10.0),
    ]
    assert paired_log_ratios(recs, "kernel") == {"m": [math.log(2), math.log(3)]}
    result = model_overheads(recs)["m"]
    assert result.kernel.ratio == pytest.approx(math.sqrt(6))
    assert result.wall.n == 2
    assert result.failures[0]["run_id"] == "m--deterministic--r2"


def test_unsupported_reason_surfaces() -> None:
    recs = [
        record("x", "deterministic", 0, None, 1.0, status="unsupported"),
        record("x", "default", 0, 5.0, 1.0),
    ]
    assert model_overheads(recs)["x"].unsupported_reason == "boom"
    assert model_overheads(recs)["x"].kernel is None


def test_failure_note_names_the_count_and_an_example_run() -> None:
    fine = [record("m", "default", 0, 1.0, 1.0), record("m", "deterministic", 0, 2.0, 2.0)]
    assert model_overheads(fine)["m"].failure_note() is None
    failed = [*fine, record("m", "default", 1, None, 1.0, status="failed"), record("m", "default", 2, None, 1.0, "x")]
    assert model_overheads(failed)["m"].failure_note() == "2 run(s) failed, e.g. m--default--r1: boom"
    unsupported = [*failed, record("m", "deterministic", 1, None, 1.0, status="unsupported")]
    assert model_overheads(unsupported)["m"].failure_note() == "not supported under determinism: boom"
    no_reason = ModelOverhead("m", failures=[{"status": "failed"}])
    assert no_reason.failure_note() == "1 run(s) failed, e.g. failed"
    failure = {"status": "failed", "reason": "boom", "pairing": "in_process", "mode": "deterministic"}
    in_one_process = ModelOverhead("m", failures=[failure])
    assert in_one_process.failure_note() == (
        "1 run(s) failed, e.g. boom (fix: --pairing processes runs each mode in a process of its own)"
    )
    # Its default runs failed in that process too: it failed whatever the pairing, and no fix is named for it.
    both = ModelOverhead("m", failures=[failure, failure | {"mode": "default"}])
    assert both.failure_note() == "2 run(s) failed, e.g. boom"


def test_an_op_that_refused_determinism_is_named_with_its_layer_and_what_to_do() -> None:
    """A run recorded with its finding (``findings``) says what a user acts on, in every table and CI output."""
    finding = {"op": "scatter", "message": "RuntimeError: boom", "layer": "embed", "advice": "replace the op"}
    refused = {**record("m", "deterministic", 0, None, 1.0, status="unsupported"), "finding": finding}
    overhead = model_overheads([record("m", "default", 0, 1.0, 1.0), refused])["m"]
    assert overhead.failure_note() == "scatter in layer embed has no deterministic implementation: replace the op"
    assert overhead.unsupported_reason == "boom"
