"""What noise does to trained models, measured across the runs of one variant.

Pure functions of numpy arrays, after Zhuang et al. ("Randomness in neural network
training", MLSys 2022) and Summers & Dinneen ("Nondeterminism and instability in neural
network optimization", ICML 2021). Pairwise metrics average over every unordered pair of
runs; with fewer than two runs they are NaN, because a spread needs two samples.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from scipy.special import log_softmax, softmax
from scipy.stats import rankdata

from detprof.fingerprints import digest
from detprof.formatting import trained_in
from detprof.intervals import bootstrap_spread

T = TypeVar("T")


def _mean_over_pairs(items: Sequence[T], fn: Callable[[T, T], float]) -> float:
    values = [fn(a, b) for a, b in itertools.combinations(items, 2)]
    return float(np.mean(values)) if values else float("nan")


def accuracy(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    return float(np.mean(np.asarray(y_true) == np.asarray(y_pred)))


def churn(predictions: Sequence[np.ndarray]) -> float:
    """Fraction of test examples whose predicted label differs, mean over run pairs."""
    return _mean_over_pairs(predictions, lambda a, b: float(np.mean(a != b)))


def l2_distance(weights: Sequence[np.ndarray]) -> float:
    """|| w1/||w1|| - w2/||w2|| || of the flattened trainable weights, mean over run pairs."""
    units = [w.astype(np.float64).ravel() / np.linalg.norm(w.astype(np.float64)) for w in weights]
    return _mean_over_pairs(units, lambda a, b: float(np.linalg.norm(a - b)))


def per_class_accuracy(y_true: np.ndarray, y_pred: np.ndarray, classes: int) -> np.ndarray:
    """Accuracy within each true class; NaN for a class with no test examples."""
    out = np.full(classes, np.nan)
    for c in range(classes):
        mask = y_true == c
        if mask.any():
            out[c] = np.mean(y_pred[mask] == c)
    return out


@dataclass(frozen=True)
class PerClassSpread:
    stds: list[float]
    max_std: float
    ratio: float
    """max-class std / overall-accuracy std: how much worse the worst class fares than the average."""


def per_class_spread(per_class: np.ndarray, overall_std: float) -> PerClassSpread:
    """``per_class`` is runs x classes."""
    matrix = np.asarray(per_class, dtype=np.float64)
    if matrix.shape[0] < 2:
        nan = float("nan")
        return PerClassSpread([nan] * matrix.shape[1], nan, nan)
    stds = matrix.std(axis=0, ddof=1)
    finite = stds[np.isfinite(stds)]
    max_std = float(finite.max()) if finite.size else float("nan")
    return PerClassSpread([float(s) for s in stds], max_std, _ratio(max_std, overall_std))


def _ratio(numerator: float, denominator: float) -> float:
    if not np.isfinite(denominator) or denominator == 0:
        return float("nan")
    return float(numerator / denominator)


def false_positive_rate(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """FP / (FP + TN) with class 1 as positive; NaN when there are no negatives."""
    negatives = y_true == 0
    return float(np.mean(y_pred[negatives] == 1)) if negatives.any() else float("nan")


def false_negative_rate(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """FN / (FN + TP) with class 1 as positive; NaN when there are no positives."""
    positives = y_true == 1
    return float(np.mean(y_pred[positives] == 0)) if positives.any() else float("nan")


def subgroup_spread(
    y_true: np.ndarray, predictions: Sequence[np.ndarray], groups: np.ndarray, binary: bool
) -> dict[str, Any]:
    """Per group: accuracy (and FPR, FNR for binary tasks) across runs, each std's ratio to the overall std.

    Zhuang et al. (Table 5) show noise hits small sub-groups far harder than the average;
    the ratio says by how much.
    """
    rates: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {"accuracy": accuracy}
    if binary:
        rates |= {"fpr": false_positive_rate, "fnr": false_negative_rate}
    overall = {name: bootstrap_spread([fn(y_true, p) for p in predictions]).std for name, fn in rates.items()}
    out_groups = []
    for g in np.unique(groups):
        mask = groups == g
        row: dict[str, Any] = {"group": g.item(), "n": int(mask.sum())}
        for name, fn in rates.items():
            s = bootstrap_spread([fn(y_true[mask], p[mask]) for p in predictions])
            row[f"{name}_mean"] = s.mean
            row[f"{name}_std"] = s.std
            row[f"{name}_std_ratio"] = _ratio(s.std, overall[name])
        out_groups.append(row)
    return {"overall_std": overall, "groups": out_groups}


def spearman(probabilities: Sequence[np.ndarray]) -> float:
    """Spearman correlation of the flattened class probabilities, mean over run pairs.

    Ranks are computed once per run (average ranks for ties, as scipy.stats.spearmanr
    does) so that many runs of a large test set stay cheap.
    """
    ranks = [rankdata(p.ravel()) for p in probabilities]
    return _mean_over_pairs(ranks, lambda a, b: float(np.corrcoef(a, b)[0, 1]))


def ensemble_gain(probabilities: Sequence[np.ndarray], y_true: np.ndarray) -> float:
    """accuracy(mean of two runs' probabilities) minus the mean of their accuracies, mean over pairs."""

    def gain(a: np.ndarray, b: np.ndarray) -> float:
        joint = accuracy(y_true, np.argmax(a + b, axis=1))
        return joint - (accuracy(y_true, a.argmax(axis=1)) + accuracy(y_true, b.argmax(axis=1))) / 2

    return _mean_over_pairs(probabilities, gain)


def linear_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Linear CKA (Kornblith et al. 2019): ||Y'X||_F^2 / (||X'X||_F ||Y'Y||_F) of column-centred features."""
    xc = _centred(x)
    yc = _centred(y)
    denominator = np.linalg.norm(xc.T @ xc) * np.linalg.norm(yc.T @ yc)
    if denominator == 0:
        return float("nan")
    return float(np.linalg.norm(yc.T @ xc) ** 2 / denominator)


def _centred(features: np.ndarray) -> np.ndarray:
    f = np.asarray(features, dtype=np.float64).reshape(len(features), -1)
    return f - f.mean(axis=0, keepdims=True)


def mean_cka(representations: Sequence[np.ndarray]) -> float:
    return _mean_over_pairs(representations, linear_cka)


def layer_digests(layers: Sequence[tuple[str, Sequence[np.ndarray]]]) -> list[tuple[str, str]]:
    """One digest per layer, so a mismatch can be traced to the first layer where it appears."""
    return [(name, digest(weights)) for name, weights in layers]


@dataclass(frozen=True)
class DeterminismCheck:
    verified: bool | None
    """True: all runs bitwise identical; False: they differ; None: fewer than two runs to compare."""
    runs: int
    distinct: int
    first_differing_layer: str | None
    processes: int | None = None
    """The worker processes that trained the runs, each compiling its step once (``formatting.trained_in``); None
    where the records do not say."""
    eager: bool = False
    """The runs trained an eager step (a native PyTorch module's): nothing compiled to share."""

    def line(self) -> str:
        if self.verified is None:
            return f"determinism not checked: {self.runs} run(s), at least 2 needed"
        if self.verified:
            return (
                f"determinism verified: {self.runs} runs ended with bitwise-identical weights"
                f"{trained_in(self.processes, self.eager)}"
            )
        return (
            f"determinism NOT verified: {self.distinct} different final weights across {self.runs} runs; "
            f"first differing layer: {self.first_differing_layer}"
        )


def determinism_check(
    runs: Sequence[Sequence[tuple[str, str]]], processes: int | None = None, eager: bool = False
) -> DeterminismCheck:
    """``runs`` holds each run's per-layer digests, in model order; ``processes``: how many trained them; ``eager``:
    whether their step compiled nothing."""
    n = len(runs)
    distinct = len({tuple(r) for r in runs})
    if n < 2:
        return DeterminismCheck(None, n, distinct, None, processes, eager)
    if distinct == 1:
        return DeterminismCheck(True, n, 1, None, processes, eager)
    depth = max(len(r) for r in runs)
    position = next(i for i in range(depth) if len({r[i] if i < len(r) else None for r in runs}) > 1)
    layer = next(r[position][0] for r in runs if position < len(r))
    return DeterminismCheck(False, n, distinct, layer, processes, eager)


def probabilities_and_loss(outputs: np.ndarray, y: np.ndarray, probabilities: bool) -> tuple[np.ndarray, float]:
    """Per label (an image, or a position of a sequence: both flattened to rows) and their mean loss, from a model's
    ``outputs``: its probabilities where ``probabilities``, else its logits."""
    scores = outputs.reshape(-1, outputs.shape[-1]).astype(np.float64)
    y = y.reshape(-1)
    if probabilities:
        log_p = np.log(np.clip(scores, 1e-12, 1.0))
        probs = scores
    else:
        log_p = log_softmax(scores, axis=1)
        probs = softmax(scores, axis=1)
    return probs.astype(np.float32), float(-np.mean(log_p[np.arange(len(y)), y]))
