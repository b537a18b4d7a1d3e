"""The regression statistics, checked against scipy and hand computations, never against themselves."""

from __future__ import annotations

import math

import numpy as np
import pytest
import synthetic_sweep as synth
from scipy import stats

from detprof.check.baseline_file import (
    fingerprint,
    fingerprint_differences,
    measurement_config_hash,
)
from detprof.check.regression import (
    ModelSample,
    SweepSamples,
    Verdict,
    baseline_models,
    compare,
    samples_from_records,
    severity,
)
from detprof.errors import InputError
from detprof.intervals import holm, repeats_to_settle, welch_difference

THRESHOLD = 0.10
MARGIN = math.log(1 + THRESHOLD)


def _logs(median: float, sigma: float, n: int, seed: int) -> tuple[float, ...]:
    return tuple(math.log(v) for v in synth.noisy_overheads(median, sigma, n, seed))


@pytest.mark.parametrize(("m", "n", "seed"), [(2, 2, 0), (3, 5, 1), (10, 10, 2), (4, 9, 3)])
def test_welch_matches_scipy_and_the_textbook_formula(m: int, n: int, seed: int) -> None:
    b = _logs(1.4, 0.04, m, seed)
    c = _logs(1.6, 0.08, n, seed + 100)
    w = welch_difference(b, c)

    vb, vc = np.var(b, ddof=1) / m, np.var(c, ddof=1) / n
    assert w.diff == pytest.approx(np.mean(c) - np.mean(b), rel=1e-12)
    assert w.se == pytest.approx(math.sqrt(vb + vc), rel=1e-12)
    assert w.df == pytest.approx((vb + vc) ** 2 / (vb**2 / (m - 1) + vc**2 / (n - 1)), rel=1e-12)

    shifted = np.asarray(c) - MARGIN
    greater = stats.ttest_ind(shifted, b, equal_var=False, alternative="greater")
    assert w.df == pytest.approx(greater.df, rel=1e-10)
    assert w.p_greater(MARGIN) == pytest.approx(greater.pvalue, rel=1e-9)
    less = stats.ttest_ind(np.asarray(c) + MARGIN, b, equal_var=False, alternative="less")
    assert w.p_less(-MARGIN) == pytest.approx(less.pvalue, rel=1e-9)

    for alpha in (0.05, 0.025, 0.05 / 3):
        plain = stats.ttest_ind(c, b, equal_var=False, alternative="greater")
        assert w.lower(alpha) == pytest.approx(plain.confidence_interval(1 - alpha).low, rel=1e-9)
        plain = stats.ttest_ind(c, b, equal_var=False, alternative="less")
        assert w.upper(alpha) == pytest.approx(plain.confidence_interval(1 - alpha).high, rel=1e-9)


def test_welch_refuses_fewer_than_two_values() -> None:
    with pytest.raises(ValueError, match="at least two"):
        welch_difference([0.1], [0.2, 0.3])


def test_welch_without_spread_collapses_to_the_point() -> None:
    w = welch_difference([0.5, 0.5, 0.5], [0.75, 0.75])
    assert w.se == 0 and math.isinf(w.df)
    assert w.lower(0.05) == w.upper(0.05) == 0.25
    assert w.p_greater(0.1) == 0.0 and w.p_greater(0.3) == 1.0
    assert w.p_less(0.3) == 0.0 and w.p_less(0.1) == 1.0


def test_holm_matches_a_hand_computation() -> None:
    # alpha 0.05, k = 3: sorted p = a 0.01, c 0.03, b 0.04.
    # step 1: 0.01 <= 0.05/3 = 0.01667 reject; step 2: 0.03 > 0.05/2 = 0.025 stop.
    # adjusted: a 3*0.01 = 0.03; c max(0.03, 2*0.03) = 0.06; b max(0.06, 1*0.04) = 0.06.
    steps = holm({"a": 0.01, "b": 0.04, "c": 0.03}, 0.05)
    assert [steps[n].rejected for n in "abc"] == [True, False, False]
    assert [steps[n].rank for n in "abc"] == [1, 3, 2]
    assert steps["a"].level == pytest.approx(0.05 / 3)
    assert steps["c"].level == pytest.approx(0.025)
    assert steps["b"].level == pytest.approx(0.025), "after the stop, the stopping level"
    assert [steps[n].adjusted_p for n in "abc"] == pytest.approx([0.03, 0.06, 0.06])


def test_holm_rejects_all_when_every_step_passes() -> None:
    steps = holm({"x": 0.004, "y": 0.02, "z": 0.049}, 0.05)
    assert all(s.rejected for s in steps.values())
    assert [steps[n].level for n in "xyz"] == pytest.approx([0.05 / 3, 0.025, 0.05])
    assert [steps[n].adjusted_p for n in "xyz"] == pytest.approx([0.012, 0.04, 0.049])


def test_holm_adjusted_p_and_decision_agree() -> None:
    rng = np.random.default_rng(7)
    for _ in range(200):
        p = {f"m{i}": float(v) for i, v in enumerate(rng.uniform(0, 0.1, rng.integers(1, 8)))}
        for step in holm(p, 0.05).values():
            assert step.rejected == (step.adjusted_p <= 0.05)


def _sample(logs: tuple[float, ...], kernel: tuple[float, ...] | None = None) -> ModelSample:
    return ModelSample(wall=logs, kernel=logs if kernel is None else kernel)


def _current(samples: dict[str, ModelSample], **kw: dict[str, str]) -> SweepSamples:
    return SweepSamples(samples, kw.get("failed", {}), kw.get("unsupported", {}))


def test_holm_is_applied_across_models_and_bounds_use_its_levels() -> None:
    base = {m: _sample(_logs(1.5, 0.03, 5, i)) for i, m in enumerate(("a", "b", "c"))}
    cur = {
        "a": _sample(_logs(1.5 * 1.40, 0.03, 5, 10)),
        "b": _sample(_logs(1.5 * 1.16, 0.03, 5, 11)),
        "c": _sample(_logs(1.5 * 1.00, 0.03, 5, 12)),
    }
    result = {r.model: r for r in compare(base, _current(cur), threshold=THRESHOLD, confidence=0.95).results}
    p = {}
    for m in "abc":
        res = stats.ttest_ind(np.asarray(cur[m].wall) - MARGIN, base[m].wall, equal_var=False, alternative="greater")
        p[m] = float(res.pvalue)
    expected = holm(p, 0.05)
    for m in "abc":
        r = result[m]
        assert r.p_regression == pytest.approx(p[m], rel=1e-9)
        assert r.lower_level == pytest.approx(expected[m].level)
        plain = stats.ttest_ind(cur[m].wall, base[m].wall, equal_var=False, alternative="greater")
        assert r.lower == pytest.approx(math.exp(plain.confidence_interval(1 - r.lower_level).low), rel=1e-9)
        assert (r.verdict == Verdict.REGRESSED) == expected[m].rejected
    assert result["a"].verdict == Verdict.REGRESSED
    assert result["c"].verdict == Verdict.OK


def test_holm_can_withhold_what_a_single_test_would_call() -> None:
    """Two borderline regressions: each alone passes at 5%, but Holm over three models needs 1.67%."""
    base = {m: _sample(tuple(np.log(1.5) + np.array([-0.02, 0.0, 0.02]))) for m in ("a", "b", "c")}
    shift = MARGIN + 0.045
    cur = {
        "a": _sample(tuple(np.log(1.5) + shift + np.array([-0.02, 0.0, 0.02]))),
        "b": _sample(tuple(np.log(1.5) + shift + np.array([-0.021, 0.0, 0.021]))),
        "c": _sample(tuple(np.log(1.5) + np.array([-0.02, 0.0, 0.02]))),
    }
    for m in "ab":
        alone = compare({m: base[m]}, _current({m: cur[m]}), threshold=THRESHOLD, confidence=0.95)
        assert alone.results[0].verdict == Verdict.REGRESSED
    together = compare(base, _current(cur), threshold=THRESHOLD, confidence=0.95)
    verdicts = {r.model: r.verdict for r in together.results}
    assert verdicts["a"] != Verdict.REGRESSED and verdicts["b"] != Verdict.REGRESSED
    assert verdicts["a"] == Verdict.INCONCLUSIVE


@pytest.mark.parametrize("seed", range(40))
def test_verdicts_are_read_off_the_interval(seed: int) -> None:
    rng = np.random.default_rng(seed)
    models = [f"m{i}" for i in range(int(rng.integers(1, 6)))]
    base, cur = {}, {}
    for i, m in enumerate(models):
        n_b, n_c = int(rng.integers(2, 11)), int(rng.integers(2, 11))
        change = float(np.exp(rng.normal(0, 0.15)))
        sigma = float(rng.uniform(0.005, 0.1))
        base[m] = _sample(_logs(1.3, sigma, n_b, seed * 100 + i))
        cur[m] = _sample(_logs(1.3 * change, sigma, n_c, seed * 100 + 50 + i))
    up, down = 1 + THRESHOLD, 1 / (1 + THRESHOLD)
    for r in compare(base, _current(cur), threshold=THRESHOLD, confidence=0.95).results:
        assert r.lower is not None and r.upper is not None and r.ratio is not None
        assert r.lower <= r.ratio <= r.upper
        assert (r.verdict == Verdict.REGRESSED) == (r.lower > up)
        assert (r.verdict == Verdict.IMPROVED) == (r.upper < down)
        if r.verdict == Verdict.INCONCLUSIVE:
            assert r.ratio > up or r.ratio < down
            assert (r.direction == "regression") == (r.ratio > up)
        if r.verdict == Verdict.OK:
            assert down <= r.ratio <= up


SPREAD = np.array([-0.06, 0.0, 0.06, 0.01])


def test_repeats_to_settle_is_the_smallest_n_that_clears_the_margin() -> None:
    w = welch_difference(math.log(1.2) + SPREAD, math.log(1.2 * 1.16) + SPREAD[::-1])
    assert w.lower(0.05) < MARGIN < w.diff
    alpha = 0.05
    n = repeats_to_settle(w, MARGIN, alpha)
    assert n is not None and n > 2

    def clears(k: int) -> bool:
        s_b, s_c = w.var_baseline, w.var_current
        se = math.sqrt((s_b + s_c) / k)
        df = (s_b + s_c) ** 2 / ((s_b / k) ** 2 / (k - 1) + (s_c / k) ** 2 / (k - 1)) / k**2
        return w.diff - stats.t.ppf(1 - alpha, df) * se > MARGIN

    assert clears(n) and not clears(n - 1)


def test_repeats_to_settle_gives_up_on_a_hopeless_gap() -> None:
    w = welch_difference([0.0, 0.5, -0.5], [MARGIN + 1e-4 - 0.5, MARGIN + 1e-4, MARGIN + 1e-4 + 0.5])
    assert repeats_to_settle(w, MARGIN, 0.05) is None


def test_inconclusive_reports_width_and_repeats() -> None:
    base = {"m": _sample(_logs(1.3, 0.08, 3, 5))}
    cur = {"m": _sample(_logs(1.3 * 1.18, 0.08, 3, 6))}
    (r,) = compare(base, _current(cur), threshold=THRESHOLD, confidence=0.95).results
    assert r.verdict == Verdict.INCONCLUSIVE and r.direction == "regression"
    assert r.width == pytest.approx(r.upper - r.lower)
    assert r.repeats_to_settle is not None and r.repeats_to_settle > 3


def test_gate_is_kernel_time_only_when_both_sides_have_it() -> None:
    kernel_b, kernel_c = _logs(2.0, 0.01, 4, 1), _logs(2.0 * 1.5, 0.01, 4, 2)
    wall = _logs(1.1, 0.01, 4, 3)
    both = compare(
        {"m": ModelSample(wall=wall, kernel=kernel_b)},
        _current({"m": ModelSample(wall=wall, kernel=kernel_c)}),
        threshold=THRESHOLD,
        confidence=0.95,
    ).results[0]
    assert both.metric == "kernel" and both.verdict == Verdict.REGRESSED and both.metric_note is None
    one = compare(
        {"m": ModelSample(wall=wall, kernel=kernel_b)},
        _current({"m": ModelSample(wall=wall)}),
        threshold=THRESHOLD,
        confidence=0.95,
    ).results[0]
    assert one.metric == "wall" and one.verdict == Verdict.OK
    assert one.metric_note is not None and "kernel time only in the baseline" in one.metric_note


def test_missing_failed_and_unsupported_models() -> None:
    logs = _logs(1.3, 0.02, 3, 1)
    base = {m: _sample(logs) for m in ("both", "gone", "now_unsupported", "broken")}
    cur = SweepSamples(
        {"both": _sample(logs), "new": _sample(logs)},
        failed={"broken": "1 run(s) failed, e.g. OOM"},
        unsupported={"now_unsupported": "no deterministic kernel", "never": "no deterministic kernel"},
    )
    never = {"never": "no deterministic kernel"}
    results = compare(base, cur, threshold=THRESHOLD, confidence=0.95, baseline_unsupported=never)
    verdicts = {r.model: r.verdict for r in results.results}
    assert verdicts == {
        "both": Verdict.OK,
        "gone": Verdict.MISSING_CURRENT,
        "new": Verdict.MISSING_BASELINE,
        "now_unsupported": Verdict.FAILED,
        "broken": Verdict.FAILED,
        "never": Verdict.UNSUPPORTED,
    }
    assert results.family_size == 1


def test_current_with_a_single_pair_is_a_failed_measurement() -> None:
    base = {"m": _sample(_logs(1.3, 0.02, 3, 1))}
    (r,) = compare(base, _current({"m": _sample((0.3,))}), threshold=THRESHOLD, confidence=0.95).results
    assert r.verdict == Verdict.FAILED and r.reason is not None and "R < 2" in r.reason


def test_severity_policy() -> None:
    spread = (-0.08, 0.0, 0.08)
    base = {"m": _sample(tuple(math.log(1.3) + v for v in spread))}
    cur = {"m": _sample(tuple(math.log(1.3 * 1.18) + v for v in spread))}
    (worse,) = compare(base, _current(cur), threshold=THRESHOLD, confidence=0.95).results
    assert (worse.verdict, worse.direction) == (Verdict.INCONCLUSIVE, "regression")
    assert severity(worse, strict=False) == "warning"
    assert severity(worse, strict=True) == "failure"
    cur_better = {"m": _sample(tuple(math.log(1.3 / 1.18) + v for v in spread))}
    (better,) = compare(base, _current(cur_better), threshold=THRESHOLD, confidence=0.95).results
    assert (better.verdict, better.direction) == (Verdict.INCONCLUSIVE, "improvement")
    assert severity(better, strict=False) == severity(better, strict=True) == "ok"


def test_samples_pair_repeats_and_keep_failures_apart() -> None:
    ratios = {"a": [1.2, 1.3, 1.25], "b": [2.0, 2.1, 1.9]}
    recs = synth.records(
        ratios,
        kernel_overheads={"a": [1.5, 1.6, 1.55], "b": [3.0, 3.1, 2.9]},
        failed={"b--deterministic--r1": "worker crashed"},
    )
    samples = samples_from_records(recs)
    assert samples.samples["a"].wall == pytest.approx([math.log(v) for v in ratios["a"]], rel=1e-12)
    assert samples.samples["a"].kernel == pytest.approx([math.log(v) for v in (1.5, 1.6, 1.55)], rel=1e-12)
    assert samples.samples["b"].wall == pytest.approx([math.log(2.0), math.log(1.9)], rel=1e-12)
    assert samples.failed == {"b": "1 run(s) failed, e.g. b--deterministic--r1: worker crashed"}
    with pytest.raises(InputError, match="needs a complete sweep"):
        baseline_models(samples, "results")


def test_baseline_refuses_a_single_repeat() -> None:
    samples = samples_from_records(synth.records({"a": [1.2]}))
    with pytest.raises(InputError, match=r"R < 2 cannot give an interval"):
        baseline_models(samples, "results")


def test_unsupported_models_are_recorded_not_sampled() -> None:
    recs = synth.records(
        {"a": [1.2, 1.3], "u": [1.0, 1.0]},
        unsupported={"u--deterministic--r0": "no deterministic GPU kernel", "u--deterministic--r1": "same"},
    )
    samples = samples_from_records(recs)
    assert set(samples.samples) == {"a"}
    assert samples.unsupported == {"u": "no deterministic GPU kernel"}
    assert set(baseline_models(samples, "results")) == {"a"}


def test_fingerprint_and_its_differences() -> None:
    cfg = synth.config(["a"], 3)
    recs = synth.records({"a": [1.2, 1.3, 1.25]})
    fp = fingerprint(cfg, recs)
    assert fp["gpu_name"] == "Tesla T4" and fp["driver"] == "550.54.15" and fp["cuda"] == "12.5.1"
    assert fp["tensorflow"] == "2.21.0" and fp["keras"] == "3.15.0" and fp["detprof"] == "0.1.0"
    assert fp["determinism"]["deterministic"]["op_determinism"] is True
    assert fp["determinism"]["default"]["op_determinism"] is False
    assert fingerprint_differences(fp, fingerprint(cfg, recs)) == []

    other = synth.records({"a": [1.2, 1.3, 1.25]}, versions={**synth.VERSIONS, "tensorflow": "2.22.0"})
    for rec in other:
        rec["settings"]["cudnn_autotune"] = False
    diffs = {d.field: d for d in fingerprint_differences(fp, fingerprint(cfg, other))}
    assert set(diffs) == {
        "tensorflow",
        "determinism.default.cudnn_autotune",
        "determinism.deterministic.cudnn_autotune",
    }
    assert diffs["tensorflow"].describe() == "tensorflow: 2.21.0 -> 2.22.0"


def test_config_hash_ignores_only_precision_and_the_model_list() -> None:
    cfg = synth.config(["a", "b"], 3)
    same = synth.config(["a"], 10, preset="cpu-small")
    assert measurement_config_hash(cfg) == measurement_config_hash(same)
    for key, value in (("steps", 50), ("batch_size", 32), ("xla", True), ("tracer", "tf"), ("seed", 1)):
        assert measurement_config_hash(cfg) != measurement_config_hash({**cfg, key: value}), key


def test_mixed_environments_list_every_value() -> None:
    recs = synth.records({"a": [1.2, 1.3]})
    recs[0]["device"]["driver"] = "535.00"
    fp = fingerprint(synth.config(["a"], 2), recs)
    assert fp["driver"] == ["535.00", "550.54.15"]
