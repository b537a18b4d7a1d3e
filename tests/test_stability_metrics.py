"""Every stability metric against an independent computation or a case worked out by hand."""

from __future__ import annotations

import hashlib
import itertools
import statistics

import numpy as np
import pytest
from scipy.stats import spearmanr
from sklearn.metrics import accuracy_score, confusion_matrix

from detprof import formatting
from detprof.fingerprints import digest
from detprof.intervals import bootstrap_spread
from detprof.stability import metrics


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


def test_spread_mean_and_sample_std_match_statistics() -> None:
    values = [0.91, 0.93, 0.92, 0.95, 0.90]
    s = bootstrap_spread(values)
    assert s.mean == pytest.approx(statistics.mean(values))
    assert s.std == pytest.approx(statistics.stdev(values))
    assert s.n == 5


def test_bootstrap_se_of_std_matches_normal_theory_for_a_large_sample(rng: np.random.Generator) -> None:
    # For normal data the std's standard error is about sigma / sqrt(2 (n - 1)).
    values = rng.normal(0.0, 2.0, size=400)
    s = bootstrap_spread(values)
    assert s.std_se == pytest.approx(2.0 / np.sqrt(2 * 399), rel=0.25)


def test_bootstrap_se_is_seeded_scale_equivariant_and_zero_for_constant_runs() -> None:
    values = [0.1, 0.4, 0.3, 0.8]
    assert bootstrap_spread(values).std_se == bootstrap_spread(values).std_se
    assert bootstrap_spread([10 * v for v in values]).std_se == pytest.approx(10 * bootstrap_spread(values).std_se)
    assert bootstrap_spread([0.5, 0.5, 0.5]).std_se == 0.0


def test_spread_of_one_run_has_no_std() -> None:
    s = bootstrap_spread([0.9])
    assert s.mean == 0.9
    assert np.isnan(s.std) and np.isnan(s.std_se)


def test_accuracy_matches_sklearn(rng: np.random.Generator) -> None:
    y = rng.integers(0, 5, 300)
    p = np.where(rng.random(300) < 0.7, y, rng.integers(0, 5, 300))
    assert metrics.accuracy(y, p) == pytest.approx(accuracy_score(y, p))


def test_churn_hand_built() -> None:
    a = np.array([0, 1, 2, 3])
    b = np.array([0, 1, 2, 0])  # differs from a in 1 of 4
    c = np.array([1, 1, 2, 3])  # differs from a in 1, from b in 2
    assert metrics.churn([a, b, c]) == pytest.approx((1 / 4 + 1 / 4 + 2 / 4) / 3)
    assert metrics.churn([a, a]) == 0.0
    assert np.isnan(metrics.churn([a]))


def test_l2_of_unit_normalized_weights_hand_built() -> None:
    w1 = np.array([3.0, 4.0])  # unit (0.6, 0.8)
    w2 = np.array([4.0, 3.0])  # unit (0.8, 0.6): distance sqrt(0.08)
    w3 = np.array([6.0, 8.0])  # same direction as w1: distance 0
    d = np.sqrt(0.08)
    assert metrics.l2_distance([w1, w2]) == pytest.approx(d)
    assert metrics.l2_distance([w1, w2, w3]) == pytest.approx((d + 0 + d) / 3)
    assert metrics.l2_distance([w1, -w1]) == pytest.approx(2.0)


def test_per_class_accuracy_matches_confusion_matrix(rng: np.random.Generator) -> None:
    y = rng.integers(0, 4, 200)
    p = np.where(rng.random(200) < 0.6, y, rng.integers(0, 4, 200))
    cm = confusion_matrix(y, p, labels=[0, 1, 2, 3])
    expected = cm.diagonal() / cm.sum(axis=1)
    np.testing.assert_allclose(metrics.per_class_accuracy(y, p, 4), expected)


def test_per_class_accuracy_of_a_class_without_examples_is_nan() -> None:
    out = metrics.per_class_accuracy(np.array([0, 0, 1]), np.array([0, 1, 1]), 3)
    assert out[0] == 0.5 and out[1] == 1.0 and np.isnan(out[2])


def test_per_class_spread_std_and_ratio() -> None:
    per_class = np.array([[0.9, 0.5, 1.0], [0.8, 0.7, 1.0], [0.85, 0.3, 1.0]])
    overall_std = 0.02
    s = metrics.per_class_spread(per_class, overall_std)
    expected = [statistics.stdev(per_class[:, c]) for c in range(3)]
    np.testing.assert_allclose(s.stds, expected)
    assert s.max_std == pytest.approx(statistics.stdev([0.5, 0.7, 0.3]))
    assert s.ratio == pytest.approx(s.max_std / overall_std)
    assert np.isnan(metrics.per_class_spread(per_class, 0.0).ratio)


def test_false_positive_and_negative_rates_match_confusion_matrix(rng: np.random.Generator) -> None:
    y = rng.integers(0, 2, 500)
    p = np.where(rng.random(500) < 0.75, y, 1 - y)
    tn, fp, fn, tp = confusion_matrix(y, p, labels=[0, 1]).ravel()
    assert metrics.false_positive_rate(y, p) == pytest.approx(fp / (fp + tn))
    assert metrics.false_negative_rate(y, p) == pytest.approx(fn / (fn + tp))
    assert np.isnan(metrics.false_positive_rate(np.ones(3, int), np.ones(3, int)))


def test_subgroup_spread_binary_against_sklearn(rng: np.random.Generator) -> None:
    n = 400
    y = rng.integers(0, 2, n)
    groups = np.where(rng.random(n) < 0.2, "minority", "majority")
    runs = [np.where(rng.random(n) < 0.8, y, 1 - y) for _ in range(4)]
    out = metrics.subgroup_spread(y, runs, groups, binary=True)

    def rates(mask: np.ndarray, p: np.ndarray) -> tuple[float, float, float]:
        tn, fp, fn, tp = confusion_matrix(y[mask], p[mask], labels=[0, 1]).ravel()
        return accuracy_score(y[mask], p[mask]), fp / (fp + tn), fn / (fn + tp)

    everyone = np.ones(n, bool)
    overall = [statistics.stdev(rates(everyone, p)[k] for p in runs) for k in range(3)]
    assert out["overall_std"]["accuracy"] == pytest.approx(overall[0])
    assert out["overall_std"]["fpr"] == pytest.approx(overall[1])
    assert out["overall_std"]["fnr"] == pytest.approx(overall[2])
    by_group = {row["group"]: row for row in out["groups"]}
    assert set(by_group) == {"majority", "minority"}
    for name, row in by_group.items():
        mask = groups == name
        assert row["n"] == mask.sum()
        per_run = [rates(mask, p) for p in runs]
        for k, metric in enumerate(("accuracy", "fpr", "fnr")):
            std = statistics.stdev(r[k] for r in per_run)
            assert row[f"{metric}_mean"] == pytest.approx(statistics.mean(r[k] for r in per_run))
            assert row[f"{metric}_std"] == pytest.approx(std)
            assert row[f"{metric}_std_ratio"] == pytest.approx(std / overall[k])


def test_subgroup_spread_multiclass_reports_accuracy_only(rng: np.random.Generator) -> None:
    y = rng.integers(0, 3, 90)
    groups = np.repeat([0, 1, 2], 30)
    runs = [np.where(rng.random(90) < 0.7, y, 0) for _ in range(3)]
    row = metrics.subgroup_spread(y, runs, groups, binary=False)["groups"][0]
    assert "fpr_std" not in row and "accuracy_std" in row


def test_spearman_matches_scipy_including_ties(rng: np.random.Generator) -> None:
    probs = [rng.dirichlet(np.ones(4), size=50) for _ in range(3)]
    probs[1][:10] = 0.25  # ties
    expected = statistics.mean(spearmanr(a.ravel(), b.ravel()).statistic for a, b in itertools.combinations(probs, 2))
    assert metrics.spearman(probs) == pytest.approx(expected)


def test_ensemble_gain_hand_built() -> None:
    y = np.array([0, 1])
    p1 = np.array([[0.9, 0.1], [0.6, 0.4]])  # predicts 0, 0: accuracy 0.5
    p2 = np.array([[0.4, 0.6], [0.1, 0.9]])  # predicts 1, 1: accuracy 0.5
    # mean (0.65, 0.35), (0.35, 0.65) predicts 0, 1: accuracy 1.0
    assert metrics.ensemble_gain([p1, p2], y) == pytest.approx(0.5)
    assert metrics.ensemble_gain([p1, p1], y) == pytest.approx(0.0)


def _hsic(k: np.ndarray, l_: np.ndarray) -> float:
    n = len(k)
    h = np.eye(n) - np.ones((n, n)) / n
    return float(np.trace(k @ h @ l_ @ h)) / (n - 1) ** 2


def test_linear_cka_matches_hsic_formula(rng: np.random.Generator) -> None:
    x = rng.normal(size=(60, 8))
    y = x @ rng.normal(size=(8, 5)) + 0.5 * rng.normal(size=(60, 5))
    k, l_ = x @ x.T, y @ y.T
    expected = _hsic(k, l_) / np.sqrt(_hsic(k, k) * _hsic(l_, l_))
    assert metrics.linear_cka(x, y) == pytest.approx(expected)


def test_linear_cka_invariances(rng: np.random.Generator) -> None:
    x = rng.normal(size=(40, 6))
    q, _ = np.linalg.qr(rng.normal(size=(6, 6)))
    assert metrics.linear_cka(x, x) == pytest.approx(1.0)
    assert metrics.linear_cka(x, 3.0 * x @ q + 7.0) == pytest.approx(1.0)
    assert metrics.linear_cka(x, rng.normal(size=(40, 6))) < 0.5
    assert np.isnan(metrics.linear_cka(x, np.zeros((40, 3))))


def test_mean_cka_averages_pairs(rng: np.random.Generator) -> None:
    reps = [rng.normal(size=(30, 4)) for _ in range(3)]
    pairs = [metrics.linear_cka(a, b) for a, b in itertools.combinations(reps, 2)]
    assert metrics.mean_cka(reps) == pytest.approx(statistics.mean(pairs))


def test_weights_digest_is_sha256_of_the_bytes_in_order() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.ones(4, dtype=np.float32)
    assert digest([a, b]) == hashlib.sha256(a.tobytes() + b.tobytes()).hexdigest()
    assert digest([a.T]) == hashlib.sha256(np.ascontiguousarray(a.T).tobytes()).hexdigest()


def _model(seed: int) -> list[tuple[str, list[np.ndarray]]]:
    r = np.random.default_rng(seed)
    return [
        ("conv1", [r.normal(size=(3, 3, 1, 4)).astype(np.float32), np.zeros(4, np.float32)]),
        ("dense", [r.normal(size=(4, 2)).astype(np.float32)]),
        ("logits", [r.normal(size=(2, 2)).astype(np.float32)]),
    ]


def test_determinism_check_passes_for_identical_weights_and_says_how_many_processes_compiled_them() -> None:
    """Runs of one worker share its compiled step; only runs of several could part in what compiling chose."""
    runs = [metrics.layer_digests(_model(0)) for _ in range(3)]
    check = metrics.determinism_check(runs)
    assert check.verified is True and check.distinct == 1 and check.first_differing_layer is None
    assert check.line() == "determinism verified: 3 runs ended with bitwise-identical weights"
    apart = "determinism verified: 3 runs ended with bitwise-identical weights, trained in 2 processes, each "
    assert metrics.determinism_check(runs, processes=2).line() == apart + "compiling its step itself"
    one = metrics.determinism_check(runs, processes=1).line()
    assert one.endswith("weights, trained in one process on one compiled step")
    badge = formatting.check_line({"applicable": True, "verified": True, "processes": 2})
    assert badge == (
        "verified",
        "verified: bitwise-identical weights, trained in 2 processes, each compiling its step itself",
    )


def test_determinism_check_names_the_first_layer_off_by_one_ulp() -> None:
    same = _model(0)
    nudged = _model(0)
    nudged[1][1][0][1, 1] = np.nextafter(nudged[1][1][0][1, 1], np.float32(np.inf))
    nudged[2][1][0][0, 0] += 1.0
    check = metrics.determinism_check([metrics.layer_digests(m) for m in (same, same, nudged)])
    assert check.verified is False
    assert check.distinct == 2
    assert check.first_differing_layer == "dense"
    assert "NOT verified" in check.line() and "dense" in check.line()


def test_determinism_check_needs_two_runs() -> None:
    check = metrics.determinism_check([metrics.layer_digests(_model(0))])
    assert check.verified is None
    assert "not checked" in check.line()
