"""Every interval detprof reports, and the one reading of an overhead's interval.

Four designs, four intervals, one module, so that a ratio reads the same in the
sweep's table, the report and the CI check:

- paired t (``paired_t``): the two modes' runs of one repeat ran side by side, so the
  unit is the per-repeat log ratio ln(det/default); a Student t-interval on their mean,
  exponentiated. Log ratios make the interval multiplicative (an overhead cannot go
  below 0x), and the t distribution keeps it honest for the 3-10 repeats a sweep affords.
- Stein's two-stage interval (``stein_interval``), for a sweep that adds repeats until the
  interval is within a precision (``--precision``): a t-interval on the mean of every repeat
  with the spread of the first stage alone (its first ``first_stage`` repeats), whose number
  of repeats was fixed by that spread (``stein_repeats``). Stopping when a usual t-interval
  looks narrow enough favours the runs whose spread came out small and covers less than it
  says; Stein's covers at least its confidence for normal units, whatever the spread (Stein,
  1945: the mean of all repeats, given the first stage, is independent of its spread).
- Welch (``welch_difference``): a baseline and a current sweep are independent samples
  with their own spread; the difference of their mean log ratios with Welch's standard
  error and Welch-Satterthwaite degrees of freedom.
- bootstrap (``bootstrap_spread``): the standard error of a standard deviation across
  training runs, resampling runs with replacement as one would rerun the study.

``headline_metric`` is the one rule for which time an overhead is read from, and
``reading`` the one verdict an interval allows against ``CHEAP_OVERHEAD``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

Metric = Literal["kernel", "wall"]
METRIC_FIELDS: dict[Metric, str] = {"kernel": "kernel_ns_per_step", "wall": "wall_ns_per_step"}
MIN_REPEATS = 2
SETTLE_LIMIT = 1000

CHEAP_OVERHEAD = 1.10
"""Up to 10% more time is within the spread of training throughput that users already live
with (input pipelines, shared machines) and the paper's cheapest models (101%); beyond it,
determinism visibly lengthens experiments."""

Reading = Literal["cheap", "expensive", "not settled"]


@dataclass(frozen=True)
class Overhead:
    """det/default ratio of one metric for one model (1.0 = no overhead), with its interval."""

    ratio: float
    ci_low: float
    ci_high: float
    log_ratios: tuple[float, ...]
    confidence: float = 0.95
    first_stage: int | None = None
    """Stein's two-stage interval (``stein_interval``): the repeats of its first stage; None: a paired t-interval."""

    @property
    def n(self) -> int:
        return len(self.log_ratios)

    @property
    def has_interval(self) -> bool:
        return self.n >= MIN_REPEATS and not math.isnan(self.ci_low)

    @property
    def precision(self) -> float | None:
        """The interval's half-width as a fraction of the ratio (0.02: within +/-2%); None without an interval."""
        if not self.has_interval:
            return None
        return math.expm1((math.log(self.ci_high) - math.log(self.ci_low)) / 2)


def t_quantile(p: float, df: Any) -> Any:
    """Student's t quantile at ``p`` with ``df`` degrees of freedom (one, or an array of them; infinite: the
    normal's). SciPy's special function, not ``scipy.stats``, whose import alone took 0.6-1.5 s of every command
    that prints an interval on the 2-core machine."""
    from scipy.special import stdtrit

    return stdtrit(df, p)


def t_cdf(x: float, df: float) -> float:
    """Student's t distribution function at ``x`` (``t_quantile``'s inverse)."""
    from scipy.special import stdtr

    return float(stdtr(df, x))


def paired_t(log_ratios: Iterable[float], confidence: float = 0.95) -> Overhead | None:
    """Mean log ratio with a two-sided t-interval; a single pair gives no interval (NaN bounds)."""
    values = tuple(float(v) for v in log_ratios)
    if not values:
        return None
    mean, low, high = t_interval(values, confidence)
    return Overhead(math.exp(mean), math.exp(low), math.exp(high), values, confidence)


def satterthwaite_df(shares: Sequence[float], counts: Sequence[int]) -> float:
    """Welch-Satterthwaite's degrees of freedom of a sum of independent means, each mean's variance (``shares``)
    from its own ``counts`` values; infinite where every variance is zero."""
    denominator = sum(q**2 / (n - 1) for q, n in zip(shares, counts, strict=True))
    return sum(shares) ** 2 / denominator if denominator > 0 else math.inf


@dataclass(frozen=True)
class ChainedRatio:
    """A ratio no one pair measured, taken through comparisons that were (``chained``), with its interval."""

    ratio: float
    ci_low: float
    ci_high: float
    confidence: float = 0.95


def chained(over: Sequence[Overhead], under: Sequence[Overhead] = ()) -> ChainedRatio | None:
    """The product of the ratios ``over`` divided by that of ``under``, each a comparison paired on its own (a
    library helper against the least set of switches, each measured against the default): on the log scale their
    means add and, the comparisons' repeats being independent, so do the variances of the means, with
    Welch-Satterthwaite's degrees of freedom, as ``welch_difference`` takes two. None unless each has an interval."""
    parts = [*over, *under]
    if not parts or not all(part.has_interval for part in parts):
        return None
    mean = sum(float(np.mean(o.log_ratios)) for o in over) - sum(float(np.mean(u.log_ratios)) for u in under)
    shares = [float(np.var(p.log_ratios, ddof=1)) / p.n for p in parts]
    spread = sum(shares)
    confidence = parts[0].confidence
    half = float(t_quantile(0.5 + confidence / 2, satterthwaite_df(shares, [p.n for p in parts]))) * math.sqrt(spread)
    return ChainedRatio(math.exp(mean), math.exp(mean - half), math.exp(mean + half), confidence)


def t_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """The mean of paired differences and its two-sided t-interval; NaN bounds from fewer than ``MIN_REPEATS``."""
    mean = float(np.mean(values))
    if len(values) < MIN_REPEATS:
        return mean, math.nan, math.nan
    sem = float(np.std(values, ddof=1)) / math.sqrt(len(values))
    half = float(t_quantile(0.5 + confidence / 2, len(values) - 1)) * sem
    return mean, mean - half, mean + half


def stein_interval(log_ratios: Iterable[float], first_stage: int, confidence: float = 0.95) -> Overhead | None:
    """Stein's two-stage interval on the mean log ratio of every repeat, its half-width t(n0 - 1) * s0 / sqrt(n)
    from the first ``first_stage`` repeats' spread s0 alone; fewer repeats than that are a paired t-interval
    (no stopping decided anything yet)."""
    values = tuple(float(v) for v in log_ratios)
    if len(values) < first_stage or first_stage < MIN_REPEATS:
        return paired_t(values, confidence)
    mean = float(np.mean(values))
    spread = float(np.std(values[:first_stage], ddof=1))
    half = float(t_quantile(0.5 + confidence / 2, first_stage - 1)) * spread / math.sqrt(len(values))
    return Overhead(math.exp(mean), math.exp(mean - half), math.exp(mean + half), values, confidence, first_stage)


def stein_repeats(first_stage: Sequence[float], precision: float, confidence: float = 0.95) -> int:
    """The repeats Stein's interval needs to be within +/-``precision`` (a fraction), fixed by the first stage's
    spread: the first n >= n0 with t(n0 - 1) * s0 / sqrt(n) <= ln(1 + precision)."""
    n0 = len(first_stage)
    if n0 < MIN_REPEATS:
        raise ValueError("Stein's first stage needs at least two repeats")
    half_one = float(t_quantile(0.5 + confidence / 2, n0 - 1)) * float(np.std(first_stage, ddof=1))
    return max(n0, math.ceil((half_one / math.log1p(precision)) ** 2))


def repeats_for_precision(overhead: Overhead, precision: float) -> int | None:
    """Repeats in all after which the interval would be within +/-``precision``: Stein's own number where it is
    one (``stein_repeats``), else the smallest n whose paired t half-width, with the spread seen, would be.
    None without a spread to go on (fewer than two repeats) or where not even ``SETTLE_LIMIT`` would do."""
    if overhead.n < MIN_REPEATS:
        return None
    if overhead.first_stage is not None:
        return stein_repeats(overhead.log_ratios[: overhead.first_stage], precision, overhead.confidence)
    sd = float(np.std(overhead.log_ratios, ddof=1))
    n = np.arange(MIN_REPEATS, SETTLE_LIMIT + 1, dtype=float)
    half = t_quantile(0.5 + overhead.confidence / 2, n - 1) * sd / np.sqrt(n)
    enough = np.nonzero(half <= math.log1p(precision))[0]
    return int(n[enough[0]]) if enough.size else None


def headline_metric(kernel_traced: bool) -> Metric:
    """Kernel time wherever a tracer recorded kernels (what determinism changes), else wall time."""
    return "kernel" if kernel_traced else "wall"


def headline(kernel: Overhead | None, wall: Overhead | None) -> tuple[Metric, Overhead | None]:
    """The overhead a verdict is read from, and which time it is."""
    metric = headline_metric(kernel is not None)
    return metric, kernel if metric == "kernel" else wall


def spans(overhead: Overhead, threshold: float) -> bool:
    """Whether the interval lies on both sides of ``threshold``: the side is not settled."""
    return overhead.has_interval and overhead.ci_low <= threshold < overhead.ci_high


def reading(overhead: Overhead, threshold: float = CHEAP_OVERHEAD) -> Reading:
    """Cheap or expensive only when the whole interval is on one side of ``threshold``; else not settled."""
    if not overhead.has_interval or spans(overhead, threshold):
        return "not settled"
    return "cheap" if overhead.ci_high <= threshold else "expensive"


def repeats_to_read(overhead: Overhead, threshold: float = CHEAP_OVERHEAD) -> int | None:
    """Repeats (paired units) after which the interval would clear ``threshold``, if mean and spread stayed.

    The paired t half-width with n units is t(n-1) * s / sqrt(n); the smallest n with a
    half-width below the distance from the mean log ratio to ln(threshold). Where the interval is Stein's
    (``first_stage``), its own form: t(n0-1) * s0 / sqrt(n), the spread its first stage's, so that the count is of
    the interval the verdict reads. None when there is no spread to extrapolate from (fewer than two units) or not
    even ``SETTLE_LIMIT`` would do.
    """
    if overhead.n < MIN_REPEATS:
        return None
    logs = np.asarray(overhead.log_ratios)
    gap = abs(float(logs.mean()) - math.log(threshold))
    stage = overhead.first_stage
    sd = float(logs[:stage].std(ddof=1)) if stage else float(logs.std(ddof=1))
    if sd == 0:
        return overhead.n if gap > 0 else None
    n = np.arange(MIN_REPEATS, SETTLE_LIMIT + 1, dtype=float)
    df = stage - 1 if stage else n - 1
    half = t_quantile(0.5 + overhead.confidence / 2, df) * sd / np.sqrt(n)
    enough = np.nonzero(half < gap)[0]
    return int(n[enough[0]]) if enough.size else None


def noise_floor(calibration: Overhead) -> float | None:
    """The smallest overhead an A/A measurement (deterministic against itself) can resolve here.

    The farthest end of its interval from 1.0, as a fraction: 0.03 means this machine and
    design cannot tell overheads within about +/-3% from none. None without an interval.
    """
    if not calibration.has_interval:
        return None
    return max(calibration.ci_high - 1.0, 1.0 - calibration.ci_low)


WIDE_CI_RELATIVE = 0.5


def inconclusive_reason(overhead: Overhead | None) -> str | None:
    """Why this overhead's interval is too wide to conclude from, or None when it is fine.

    Any of: a single repeat (no interval at all); an interval wider than ``WIDE_CI_RELATIVE``
    of the estimate ((high - low) / ratio, so a [1.0, 1.6] interval around 1.3 is too wide);
    or an interval on both sides of ``CHEAP_OVERHEAD``, where the reading switches from
    "cheap" to "expensive".
    """
    if overhead is None:
        return None
    if overhead.n < 2:
        return "one repeat only: no confidence interval (use --repeats 3 or more)"
    low, high = overhead.ci_low, overhead.ci_high
    interval = f"95% CI [{low:.2f}x, {high:.2f}x]"
    if (high - low) / overhead.ratio > WIDE_CI_RELATIVE:
        return f"{interval} is wider than {WIDE_CI_RELATIVE:.0%} of the estimate: too wide to conclude"
    if spans(overhead, CHEAP_OVERHEAD):
        return f"{interval} spans {CHEAP_OVERHEAD:.2f}x: cannot tell cheap from expensive"
    return None


@dataclass(frozen=True)
class WelchDifference:
    """D = mean(current) - mean(baseline) of log ratios, with Welch's standard error and df."""

    diff: float
    se: float
    df: float
    n_baseline: int
    n_current: int
    var_baseline: float
    var_current: float
    mean_baseline: float
    mean_current: float

    def lower(self, alpha: float) -> float:
        """One-sided (1 - alpha) lower bound of D."""
        return self.diff - self._quantile(alpha) * self.se

    def upper(self, alpha: float) -> float:
        """One-sided (1 - alpha) upper bound of D."""
        return self.diff + self._quantile(alpha) * self.se

    def _quantile(self, alpha: float) -> float:
        return float(t_quantile(1.0 - alpha, self.df)) if self.se > 0 else 0.0

    def p_greater(self, margin: float) -> float:
        """One-sided p-value of H0: D <= margin."""
        if self.se == 0:
            return 0.0 if self.diff > margin else 1.0
        return t_cdf(-(self.diff - margin) / self.se, self.df)

    def p_less(self, margin: float) -> float:
        """One-sided p-value of H0: D >= margin."""
        if self.se == 0:
            return 0.0 if self.diff < margin else 1.0
        return t_cdf((self.diff - margin) / self.se, self.df)


def welch_difference(baseline: Sequence[float], current: Sequence[float]) -> WelchDifference:
    m, n = len(baseline), len(current)
    if m < MIN_REPEATS or n < MIN_REPEATS:
        raise ValueError("Welch's interval needs at least two values on each side")
    vb = float(np.var(baseline, ddof=1))
    vc = float(np.var(current, ddof=1))
    qb, qc = vb / m, vc / n
    se = math.sqrt(qb + qc)
    df = satterthwaite_df([qb, qc], [m, n])
    mb, mc = float(np.mean(baseline)), float(np.mean(current))
    return WelchDifference(mc - mb, se, df, m, n, vb, vc, mb, mc)


def repeats_to_settle(welch: WelchDifference, margin: float, alpha: float) -> int | None:
    """Repeats per side after which the bound would clear ``margin``, if D and the variances stayed.

    Assumes both sides run n repeats with the observed variances s_b^2 and s_c^2:
    SE(n) = sqrt((s_b^2 + s_c^2) / n), df(n) = (s_b^2 + s_c^2)^2 (n - 1) / (s_b^4 + s_c^4).
    None when not even SETTLE_LIMIT repeats would do.
    """
    gap = abs(welch.diff - margin)
    total = welch.var_baseline + welch.var_current
    if total == 0:
        return MIN_REPEATS if gap > 0 else None
    n = np.arange(MIN_REPEATS, SETTLE_LIMIT + 1, dtype=float)
    df = total**2 * (n - 1) / (welch.var_baseline**2 + welch.var_current**2)
    half = t_quantile(1.0 - alpha, df) * np.sqrt(total / n)
    enough = np.nonzero(half < gap)[0]
    return int(n[enough[0]]) if enough.size else None


BOOTSTRAP_RESAMPLES = 2000


@dataclass(frozen=True)
class Spread:
    """Mean and sample std (ddof=1) across runs, with a bootstrap standard error of the std."""

    mean: float
    std: float
    std_se: float
    n: int


def bootstrap_spread(values: Sequence[float], resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> Spread:
    """The std's s.e. comes from resampling runs with replacement, as one would rerun the study."""
    v = np.asarray(values, dtype=np.float64)
    n = len(v)
    if n < MIN_REPEATS:
        return Spread(float(v.mean()) if n else float("nan"), float("nan"), float("nan"), n)
    rng = np.random.default_rng(seed)
    boot = v[rng.integers(0, n, size=(resamples, n))].std(axis=1, ddof=1)
    return Spread(float(v.mean()), float(v.std(ddof=1)), float(boot.std(ddof=1)), n)


@dataclass(frozen=True)
class HolmStep:
    rank: int
    level: float
    adjusted_p: float
    rejected: bool


def holm(
    pvalues: Mapping[str, float],
    alpha: float,
    rejects: Callable[[str, float], bool] | None = None,
) -> dict[str, HolmStep]:
    """Holm's step-down over ``pvalues``; ``rejects(name, level)`` decides a step (default p <= level).

    Every hypothesis gets the level it was tested at: its own step's level while the
    procedure rejects, the stopping step's level once it has stopped (so none after the
    stop can be rejected). Ties in p are broken by name, so the outcome is reproducible.
    """
    decide = rejects or (lambda name, level: pvalues[name] <= level)
    order = sorted(pvalues, key=lambda name: (pvalues[name], name))
    k = len(order)
    steps: dict[str, HolmStep] = {}
    running_max = 0.0
    stop_level: float | None = None
    for index, name in enumerate(order):
        running_max = max(running_max, min(1.0, (k - index) * pvalues[name]))
        if stop_level is None:
            level = alpha / (k - index)
            rejected = decide(name, level)
            if not rejected:
                stop_level = level
        else:
            level, rejected = stop_level, False
        steps[name] = HolmStep(index + 1, level, running_max, rejected)
    return steps
