"""The pairing check (``analysis.pairing_check``): the same sweep with both modes in one process and with a process
per mode, compared model by model into one of three answers, on records of known overheads."""

from __future__ import annotations

import numpy as np
import pytest
import synthetic_sweep as synth

from detprof.analysis.pairing_check import REPEATS, PairingAnswer, compare


def routes(
    in_one: dict[str, list[float]],
    apart: dict[str, list[float]],
    *,
    failed_in_one: dict[str, str] | None = None,
    failed_apart: dict[str, str] | None = None,
) -> PairingAnswer:
    """Both routes' records of the given per-repeat ratios (kernel time and wall time alike)."""
    return compare(
        synth.records(in_one, tracer="jax", backend="jax", failed=failed_in_one),
        synth.records(apart, tracer="jax", backend="jax", failed=failed_apart),
    )


def test_routes_whose_overheads_match_within_two_percent_agree() -> None:
    answer = routes({"mediumcnn_k5": [2.170, 2.172, 2.169]}, {"mediumcnn_k5": [2.171, 2.170, 2.172]})
    assert answer.answer == "agrees" and answer.route == "in_process"
    (model,) = answer.models
    assert model.ratio == pytest.approx(1.0, abs=0.002)
    assert 0.98 <= model.low <= model.ratio <= model.high <= 1.02
    assert model.why.endswith("within [0.98, 1.02]") and "kernel time" in model.why


def test_an_interval_wholly_outside_the_band_disagrees_and_the_study_pairs_a_process_per_mode() -> None:
    # The H100's 5x5 medium CNN: 6-7% less deterministic kernel time where the default step compiled first.
    answer = routes({"mediumcnn_k5": [2.04, 2.041, 2.039]}, {"mediumcnn_k5": [2.171, 2.170, 2.172]})
    assert answer.answer == "disagrees" and answer.route == "processes"
    (model,) = answer.models
    assert model.high < 0.98 and model.ratio == pytest.approx(0.94, abs=0.002)
    assert "outside [0.98, 1.02]" in model.why


def test_a_wide_interval_or_one_pair_a_way_cannot_tell() -> None:
    wide = routes({"mediumcnn_k5": [1.9, 2.4]}, {"mediumcnn_k5": [2.17, 2.17]})
    assert wide.answer == "cannot tell" and wide.route == "processes"
    assert "across the edge of" in wide.models[0].why
    one = routes({"mediumcnn_k5": [2.17]}, {"mediumcnn_k5": [2.17]})
    assert one.answer == "cannot tell" and one.models[0].low is None
    assert "two or more each way give an interval" in one.models[0].why


def test_runs_that_fail_in_one_process_and_run_apart_disagree_with_the_reason() -> None:
    # JAX's gpt_small on the H100: its deterministic step failed in one process, compiled with the flag as an option.
    error = "IndexError: absl::container_internal::raw_hash_map<>::at"
    failed = {f"gpt_small--deterministic--r{r}": error for r in (0, 1)}
    answer = routes({"gpt_small": [1.1, 1.1]}, {"gpt_small": [1.07, 1.08]}, failed_in_one=failed)
    assert answer.answer == "disagrees"
    assert answer.models[0].why.startswith("in one process failed (2 run(s) failed, e.g. gpt_small--deterministic")
    assert answer.models[0].why.endswith("; a process per mode it ran")
    both = routes({"gpt_small": [1.1, 1.1]}, {"gpt_small": [1.07, 1.08]}, failed_in_one=failed, failed_apart=failed)
    assert both.answer == "cannot tell"


def test_a_backend_agrees_only_where_every_model_does_and_its_answer_is_kept_as_json() -> None:
    agree = {"mediumcnn_k5": [2.170, 2.172, 2.169], "gpt_small": [1.07, 1.071, 1.069]}
    mixed = routes(agree | {"mediumcnn_k3": [1.9, 2.4]}, agree | {"mediumcnn_k3": [2.17, 2.17]})
    assert {m.model: m.answer for m in mixed.models} == {
        "gpt_small": "agrees",
        "mediumcnn_k3": "cannot tell",
        "mediumcnn_k5": "agrees",
    }
    assert mixed.answer == "cannot tell"
    worse = routes(agree | {"mediumcnn_k3": [2.04, 2.041, 2.039]}, agree | {"mediumcnn_k3": [2.17, 2.171, 2.17]})
    assert worse.answer == "disagrees"
    assert PairingAnswer.from_json(worse.to_json()) == worse
    assert routes({}, {}).answer == "cannot tell"


def test_repeats_sharing_a_process_are_held_to_a_process_per_repeat_the_same_way() -> None:
    """The repeats check: a model's repeats re-running the steps one process built, against a process per repeat."""
    shared = synth.records({"mediumcnn_k5": [2.04, 2.041, 2.039]}, tracer="jax", backend="jax")
    apart = synth.records({"mediumcnn_k5": [2.171, 2.170, 2.172]}, tracer="jax", backend="jax")
    answer = compare(shared, apart, REPEATS)
    assert answer.answer == "disagrees"
    assert "repeats in one process over a process per repeat" in answer.models[0].why
    assert compare(apart, apart, REPEATS).answer == "agrees"


def spread(ratio: float, sd: float, n: int) -> list[float]:
    """``n`` per-repeat ratios whose logs have mean ln(``ratio``) and sample spread ``sd``, exactly."""
    z = np.linspace(-1.0, 1.0, n)
    return list(ratio * np.exp(sd * (z - z.mean()) / z.std(ddof=1)))


def test_a_check_that_cannot_tell_says_how_many_repeats_a_way_would_answer_it() -> None:
    # An H100's mediumcnn_k3 on JAX spread 1% a repeat: two repeats a way cannot tell a 0.4% difference from 2%.
    first = routes({"mediumcnn_k5": spread(2.17 * 1.004, 0.01, 2)}, {"mediumcnn_k5": spread(2.17, 0.01, 2)})
    (model,) = first.models
    assert model.answer == "cannot tell" and "2 and 2 repeats" in model.why
    needed = model.repeats_to_answer
    assert needed is not None and 5 <= needed <= 8
    assert model.why.endswith(f"; about {needed} repeats a way would answer")
    # As many, at the same ratio and spread, answer; one fewer does not.
    for n, said in ((needed, "agrees"), (needed - 1, "cannot tell")):
        more = routes({"mediumcnn_k5": spread(2.17 * 1.004, 0.01, n)}, {"mediumcnn_k5": spread(2.17, 0.01, n)})
        assert more.answer == said, n
    # A ratio beyond the band is answered the same way: as many repeats would put the interval wholly outside it.
    beyond = routes({"mediumcnn_k5": spread(2.17 * 1.035, 0.01, 2)}, {"mediumcnn_k5": spread(2.17, 0.01, 2)})
    needed = beyond.models[0].repeats_to_answer
    assert needed is not None
    wider = routes({"mediumcnn_k5": spread(2.17 * 1.035, 0.01, needed)}, {"mediumcnn_k5": spread(2.17, 0.01, needed)})
    assert wider.answer == "disagrees"
    # A ratio on the band's edge: no number of repeats would answer, and the check says so.
    edge = routes({"mediumcnn_k5": spread(2.17 * 1.02, 0.01, 2)}, {"mediumcnn_k5": spread(2.17, 0.01, 2)})
    assert edge.models[0].repeats_to_answer is None
    assert edge.models[0].why.endswith("; no number of repeats would answer")
    # What answered says nothing of more repeats.
    assert (
        routes({"mediumcnn_k5": [2.170, 2.172, 2.169]}, {"mediumcnn_k5": [2.171, 2.170, 2.172]})
        .models[0]
        .repeats_to_answer
        is None
    )
