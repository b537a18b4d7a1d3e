"""The report's pure pieces with hand-built inputs: attribution, pairing, quadrants, references, warnings."""

from __future__ import annotations

import math
import re

import pandas as pd
import pytest

from detprof import formatting
from detprof.intervals import CHEAP_OVERHEAD, Overhead, inconclusive_reason
from detprof.reports.attribution import attribution
from detprof.reports.gpu_clocks import ClockRow, by_mode, clock_rows, throttle_warnings
from detprof.reports.markdown import md
from detprof.reports.provenance import provenance
from detprof.reports.published import PUBLISHED, published_gpu, reference_rows
from detprof.reports.tradeoff import NOISY_CHURN, Cost, Noise, noise_of, pair, quadrant, reading
from detprof.traces.kernel_table import SUMMARY_DTYPES, KernelTable, conform
from detprof.traces.kernel_tables import diff

WGRAD_0 = "void cudnn::detail::wgrad_alg0_engine<float, 128, 6, 8, 3, 3, 5, false, 512>(int, float const*)"
WGRAD_1 = "void cudnn::detail::wgrad_alg1_engine<float, 64, 5, 3, 3, 3, 2, true, true>(int, float const*)"
SGEMM = "volta_sgemm_128x64_nn"
EIGEN = (
    "void Eigen::internal::EigenMetaKernel<Eigen::TensorEvaluator<Eigen::TensorAssignOp<Eigen::TensorMap<"
    "Eigen::Tensor<float, 1, 1, long>, 16>, Eigen::TensorCwiseBinaryOp<Eigen::internal::scalar_sum_op<float const, "
    "float const>, X const, Y const> const> const, Eigen::GpuDevice>, long>(Eigen::TensorEvaluator<Z> const&, long)"
)


def summary_table(kernels: dict[str, int]) -> KernelTable:
    frame = pd.DataFrame(
        {
            "name": list(kernels),
            "short_name": list(kernels),
            "instances": [1] * len(kernels),
            "total_ns": list(kernels.values()),
        }
    )
    return KernelTable("hand-built", "nsys-stats-csv", summary=conform(frame, SUMMARY_DTYPES))


def test_attribution_names_category_library_count_and_share() -> None:
    base = {WGRAD_0: 1000, SGEMM: 500, EIGEN: 200}
    det = {WGRAD_0: 1500, WGRAD_1: 320, SGEMM: 500, EIGEN: 380}
    sentence = attribution(diff(summary_table(base), summary_table(det)), None)
    conv_growth = (1500 - 1000) + 320
    net = sum(det.values()) - sum(base.values())
    expected = (
        f"{conv_growth / net:.0%} of the added kernel time (net +{net / sum(base.values()):.1%}) "
        "is in two cuDNN convolution backward-filter kernels. Largest of them: "
    )
    assert sentence.startswith(expected)
    assert sentence.endswith("(+500 ns/step, slower).")
    assert sentence.startswith("82% ")


def test_attribution_says_new_when_every_kernel_is_new() -> None:
    base = {WGRAD_0: 1000, SGEMM: 1000}
    det = {WGRAD_0: 1000, SGEMM: 1000, WGRAD_1: 500}
    sentence = attribution(diff(summary_table(base), summary_table(det)), None)
    assert sentence.startswith(
        "100% of the added kernel time (net +25.0%) is in one new cuDNN convolution backward-filter kernel. It is "
    )
    assert sentence.endswith("(+500 ns/step, new).")


def test_attribution_when_others_got_faster_says_more_than_all() -> None:
    base = {WGRAD_0: 1000, SGEMM: 1000}
    det = {WGRAD_0: 1600, SGEMM: 600}
    sentence = attribution(diff(summary_table(base), summary_table(det)), None)
    assert sentence.startswith(f"More than all of the added kernel time ({600 / 200:.0%} of the net +10.0%)")
    assert "one slower cuDNN convolution backward-filter kernel" in sentence
    assert "; other kernels got faster. It is void cudnn::detail::wgrad_alg0_engine<float" in sentence
    assert sentence.endswith("... (+600 ns/step, slower).")


def test_attribution_names_the_largest_kernel_of_its_group_and_the_largest_overall_apart() -> None:
    """Eleven small elementwise increases outweigh one large convolution: each named for what it is."""
    elementwise = {f"{EIGEN}_{i}": 1000 for i in range(11)}
    base = {WGRAD_0: 10_000, **elementwise}
    det = {WGRAD_0: 12_000, **{name: 1000 + 200 + 10 * i for i, name in enumerate(elementwise)}}
    sentence = attribution(diff(summary_table(base), summary_table(det)), None)
    assert "is in 11 slower Eigen elementwise kernels." in sentence
    assert f"Largest of them: {EIGEN[:57]}... (+300 ns/step, slower)." in sentence
    assert sentence.endswith(f"The largest single increase is outside them: {WGRAD_0[:57]}... (+2 us/step, slower).")


@pytest.mark.parametrize(
    ("det_sgemm", "change"),
    [(1004, "+0.2% (+4 ns), under the 1% that counts as unchanged."), (900, "-5.0% (-100 ns).")],
)
def test_attribution_with_no_added_time(det_sgemm: int, change: str) -> None:
    base = {WGRAD_0: 1000, SGEMM: 1000}
    det = {WGRAD_0: 1000, SGEMM: det_sgemm}
    sentence = attribution(diff(summary_table(base), summary_table(det)), None)
    assert sentence.startswith(f"Determinism added no kernel time here: kernel time per step changed by {change}")


def test_attribution_names_a_grown_kernel_even_when_the_total_fell() -> None:
    """The console once named a kernel while the report said "no added time": now both say both, in one sentence."""
    base = {WGRAD_0: 1000, SGEMM: 1000}
    det = {WGRAD_0: 600, SGEMM: 1100}
    sentence = attribution(diff(summary_table(base), summary_table(det)), None)
    assert sentence == (
        "Determinism added no kernel time here: kernel time per step changed by -15.0% (-300 ns). "
        f"The largest single increase, {SGEMM} (+100 ns/step, slower), was outweighed by kernels that got faster."
    )


def test_attribution_says_where_the_kernels_add_up_to_other_than_the_overhead() -> None:
    """Under load, the kernels' means per step can lie far from the paired median the overhead takes: said, not left
    for the reader to find."""
    base = {WGRAD_0: 1000, SGEMM: 1000}
    det = {WGRAD_0: 1200, SGEMM: 1024}
    table = diff(summary_table(base), summary_table(det))
    far = attribution(table, settled(1.008, 1.036))
    assert far.startswith("89% of the added kernel time (net +11.2%) is in one slower cuDNN convolution")
    assert far.endswith(
        "These kernel figures add up to +11.2%, outside the overhead's 1.022x [1.008, 1.036]: they are means over the "
        "steps, which steps slowed by other work weigh on, and the overhead is the median of the paired steps' "
        "ratios: a run with nothing else on the machine reads where the time went."
    )
    assert "outside the overhead" not in attribution(table, settled(1.09, 1.13))
    assert "outside the overhead" not in attribution(table, None)


def settled(low: float, high: float) -> Overhead:
    mid = math.sqrt(low * high)
    return Overhead(mid, low, high, (math.log(mid) - 0.01, math.log(mid), math.log(mid) + 0.01))


def test_quadrants_at_their_thresholds() -> None:
    assert quadrant(settled(1.0, CHEAP_OVERHEAD), NOISY_CHURN) == "cheap and worth it"
    assert quadrant(settled(1.0, CHEAP_OVERHEAD), NOISY_CHURN / 2) == "cheap and buys little"
    assert quadrant(settled(CHEAP_OVERHEAD + 0.01, 1.3), NOISY_CHURN) == "expensive but buys a lot"
    assert quadrant(settled(1.8, 2.0), 0.0) == "expensive and buys little"
    assert quadrant(settled(0.548, 1.840), 0.0) == "not settled"
    assert quadrant(Overhead(1.02, math.nan, math.nan, (0.02,)), 0.5) == "not settled"


def variant(name: str, std: float, se: float, churn: float, runs: int = 5) -> dict:
    return {"variant": name, "runs_ok": runs, "accuracy": {"mean": 0.9, "std": std, "std_se": se}, "churn": churn}


def test_noise_of_takes_churn_under_impl_and_the_std_drop() -> None:
    noise = noise_of(
        [
            variant("algo+impl", 0.030, 0.004, 0.12),
            variant("algo", 0.010, 0.003, 0.11),
            variant("impl", 0.02, 0.003, 0.07),
        ],
        "cifar10",
    )
    assert noise.churn_impl == 0.07
    assert noise.std_drop == pytest.approx(0.020)
    assert noise.std_drop_se == pytest.approx(math.sqrt(0.004**2 + 0.003**2))


def test_noise_of_without_the_variants_it_needs() -> None:
    noise = noise_of([variant("algo", 0.01, 0.003, 0.1), variant("impl", 0.0, 0.0, 0.2, runs=1)], "digits")
    assert noise.churn_impl is None and noise.std_drop is None and noise.std_drop_se is None


def test_pair_joins_on_model_device_label_and_backend() -> None:
    costs = {
        ("resnet18", "t4", "tensorflow"): Cost(Overhead(1.05, 1.02, 1.08, (0.04, 0.05, 0.06)), "kernel"),
        ("resnet18", "v100", "tensorflow"): Cost(Overhead(1.6, 1.5, 1.7, (0.45, 0.47, 0.49)), "kernel"),
        ("vgg19", "t4", "tensorflow"): Cost(Overhead(1.9, 1.8, 2.0, (0.6, 0.65, 0.7)), "wall"),
        ("vgg19", "t4", "torch"): Cost(Overhead(1.02, 1.01, 1.03, (0.01, 0.02, 0.03)), "kernel"),
    }
    noisy = Noise(0.05, 0.002, 0.001, "cifar10")
    points = pair(
        costs,
        [
            (("resnet18", "t4", "tensorflow"), noisy),
            (("resnet18", "a100", "tensorflow"), noisy),
            (("resnet18", "t4", "jax"), noisy),
            (("vgg19", "t4", "tensorflow"), Noise(0.001, None, None, "x")),
        ],
    )
    assert [(p.model, p.device, p.backend, p.quadrant) for p in points] == [
        ("resnet18", "t4", "tensorflow", "cheap and worth it"),
        ("vgg19", "t4", "tensorflow", "expensive and buys little"),
    ]
    assert "5.0% of test predictions" in points[0].reading
    assert "wall time by +90%" in points[1].reading


def test_reading_of_an_interval_across_the_cheap_line_is_not_settled_never_cheap() -> None:
    spanning = Cost(Overhead(1.08, 1.01, 1.16, (0.05, 0.08, 0.1)), "kernel")
    q, text = reading(spanning, Noise(0.02, None, None, "x"))
    assert q == "not settled"
    assert text.startswith("not settled: need about ") and "cheap and" not in text
    assert "(95% CI +1% to +16%)" in text
    q, text = reading(spanning, Noise(None, 0.01, 0.002, "x"))
    assert q is None and "no `impl` variant" in text


@pytest.mark.parametrize(
    ("label", "name", "gpu"),
    [
        ("t4", "Tesla T4", "t4"),
        ("tesla-v100-sxm2-16gb", "Tesla V100-SXM2-16GB", "v100"),
        ("mygpu", "Tesla P100-PCIE-16GB", "p100"),
        ("a100", "NVIDIA A100-SXM4-40GB", None),
        ("cpu", "AMD EPYC", None),
        ("l4", "NVIDIA L4", None),
    ],
)
def test_published_gpu_matches_whole_model_words(label: str, name: str, gpu: str | None) -> None:
    assert published_gpu(label, name) == gpu


def overhead(ratio: float, half: float = 0.05, n: int = 3) -> Overhead:
    return Overhead(ratio, ratio - half, ratio + half, tuple([math.log(ratio)] * n))


def test_reference_rows_hold_figures_against_the_matching_gpu_only() -> None:
    v100 = {"vgg19": overhead(1.80), "mobilenet": overhead(1.30), "mediumcnn_k1": overhead(1.3)}
    t4 = {"resnet50": overhead(1.5), "vgg16": overhead(1.2)}
    rows = reference_rows([("v100", "Tesla V100-SXM2-16GB", v100), ("t4", "Tesla T4", t4), ("cpu", "AMD EPYC", {})])
    by_key = {(r.figure.gpu, r.figure.subject, r.device): r for r in rows}
    assert len(rows) == len(PUBLISHED)
    vgg = by_key[("v100", "VGG19", "v100")]
    assert vgg.measured == "180% [175%, 185%]" and vgg.agrees is True
    assert by_key[("v100", "MobileNet", "v100")].agrees is False
    assert by_key[("v100", "medium CNN, kernel 1x1 -> 7x7", "v100")].measured == "mediumcnn_k7 not measured on v100"
    assert by_key[("p100", "across models", None)].measured == "no P100 measured"
    t4_range = by_key[("t4", "across models", "t4")]
    assert t4_range.measured == "120% - 150% over 2 model(s)" and t4_range.agrees is True
    assert all(r.device != "cpu" for r in rows)


def test_reference_without_an_interval_cannot_agree_or_disagree() -> None:
    rows = reference_rows([("v100", None, {"vgg19": Overhead(1.85, math.nan, math.nan, (0.6,))})])
    vgg = next(r for r in rows if r.figure.subject == "VGG19")
    assert vgg.agrees is None and vgg.measured == "185% (n=1, no CI)"


@pytest.mark.parametrize(
    ("o", "expected"),
    [
        (None, None),
        (Overhead(1.3, math.nan, math.nan, (0.26,)), "one repeat only"),
        (Overhead(1.3, 1.0, 1.7, (0.1, 0.2, 0.4)), "wider than 50% of the estimate"),
        (Overhead(1.1, 1.05, 1.15, (0.05, 0.1, 0.14)), "spans 1.10x"),
        (Overhead(1.5, 1.45, 1.55, (0.4, 0.41, 0.42)), None),
    ],
)
def test_inconclusive_reason(o: Overhead | None, expected: str | None) -> None:
    warning = inconclusive_reason(o)
    assert (warning is None) if expected is None else (expected in (warning or ""))


def telemetry(clock_min: float, throttled: bool, reasons: list[str]) -> dict:
    return {
        "summary": {
            "sample_count": 4,
            "sm_clock_mhz": {"min": clock_min, "mean": 1500.0, "max": 1590.0},
            "temperature_c": {"min": 50.0, "mean": 60.0, "max": 71.0},
            "power_w": {"min": 50.0, "mean": 60.0, "max": 70.0},
            "throttled": throttled,
            "throttle_reasons": reasons,
        }
    }


def test_clock_rows_gather_throttled_runs_per_model_and_mode() -> None:
    records = [
        {"model": "vgg19", "mode": "default", "telemetry": telemetry(1400, False, [])},
        {"model": "vgg19", "mode": "default", "telemetry": telemetry(1100, True, ["sw_power_cap"])},
        {"model": "vgg19", "mode": "deterministic", "telemetry": telemetry(1590, False, [])},
        {"model": "cpu-only", "mode": "default", "telemetry": None},
    ]
    rows = clock_rows(records)
    assert [(r.model, r.mode, r.runs, r.sm_clock_min, r.throttled_runs) for r in rows] == [
        ("vgg19", "default", 2, 1100, 1),
        ("vgg19", "deterministic", 1, 1590, 0),
    ]
    warnings = throttle_warnings("t4", rows)
    assert warnings == [
        "t4: vgg19 (default): clocks throttled in 1 of 2 runs (sw_power_cap); "
        "its overhead mixes determinism with throttling"
    ]
    modes = by_mode([*rows, ClockRow("resnet50", "default", 2, 1500, 1550, 1590, 80, 66, 0, ())])
    assert [(r.mode, r.runs, r.sm_clock_min, r.temperature_max) for r in modes] == [
        ("default", 4, 1100, 80),
        ("deterministic", 1, 1590, 71),
    ]


def test_markdown_text_shows_kernel_names_literally_and_commands_as_code() -> None:
    assert md("Kernel<float>& a|b *d* _e_ `x") == r"Kernel\<float\>\& a\|b \*d\* \_e\_ \`x"
    assert md("two\nlines") == "two lines"
    command = "`detprof stability --model mediumcnn_k1 --out a|b`"
    assert md(f"run {command} <now>") == r"run `detprof stability --model mediumcnn_k1 --out a\|b` \<now\>"


@pytest.mark.parametrize(
    ("ns", "text"),
    [(512, "512 ns"), (1500, "1.5 us"), (2_500_000, "2.5 ms"), (3.2e9, "3.2 s"), (-41_800, "-41.8 us"), (None, "-")],
)
def test_durations_read_in_their_own_unit(ns: float | None, text: str) -> None:
    assert formatting.duration_ns(ns) == text


@pytest.mark.parametrize(
    ("stat", "text"),
    [
        ({"std": 0.01234, "std_se": 0.004}, "0.0123 +/- 0.0040"),
        ({"std": 0.01234, "std_se": None}, "0.0123"),
        ({"std": 0.01234, "std_se": math.nan}, "0.0123"),
        ({"std": None, "std_se": 0.004}, "-"),
        (None, "-"),
    ],
)
def test_a_spread_without_its_standard_error_shows_no_plus_minus(stat: dict | None, text: str) -> None:
    assert formatting.plus_minus(stat) == text


def test_stability_console_table_uses_the_report_formatting() -> None:
    from rich.console import Console

    from detprof.stability.command import variant_table

    variant = {
        "runs_ok": 3,
        "runs_failed": 0,
        "accuracy": {"mean": 0.9, "std": 0.01234, "std_se": None},
        "cross_entropy": {"std": math.nan},
        "churn": 0.02,
        "l2": None,
        "per_class": {"ratio": 1.5},
        "spearman": 0.99,
        "ensemble_gain": 0.001,
        "cka": 0.95,
        "distinct_weights": 3,
    }
    console = Console(width=120, record=True)
    console.print(variant_table(variant))
    text = console.export_text()
    assert "0.0123" in text and "+/-  -" not in text and "+/- -" not in text
    assert re.search(r"cross-entropy std \+/- s\.e\.\s*│\s*-\s*│", text)


def test_provenance_warns_when_runs_had_different_malloc_settings() -> None:
    base = {"status": "ok", "device": {"label": "cpu", "name": "cpu"}, "mode": "default"}
    same = [base | {"worker_env": {"MALLOC_TOP_PAD_": "1"}}, base | {"worker_env": {"MALLOC_TOP_PAD_": "1"}}]
    assert not provenance(same, {}).warnings
    mixed = [same[0], base | {"worker_env": {"MALLOC_TOP_PAD_": "0"}}]
    assert any("different malloc settings" in w for w in provenance(mixed, {}).warnings)


def test_a_device_reads_as_its_name_where_its_label_is_the_name_spelled_as_a_label() -> None:
    """A GPU without a short label (an H100 is labelled from its name) shows once, not twice in two spellings."""
    from detprof.reports.cells import device_named

    assert device_named("nvidia-h100-80gb-hbm3", "NVIDIA H100 80GB HBM3") == "NVIDIA H100 80GB HBM3"
    assert device_named("t4", "Tesla T4") == "t4 (Tesla T4)"
    assert device_named("cpu", None) == "cpu"


def test_counts_read_as_words() -> None:
    assert [formatting.counted(n, "step") for n in (1, 2)] == ["1 step", "2 steps"]
    assert [formatting.in_all(n, "layer") for n in (1, 2, 12)] == [
        "in its one layer",
        "in both layers",
        "in all 12 layers",
    ]


def test_a_label_forced_on_another_device_is_not_held_against_that_gpus_published_figures(tmp_path) -> None:
    """A test cluster's CPU node forced to say t4: its overheads are a CPU's, not a T4's."""
    import synthetic_sweep as synth

    from detprof.reports.report_data import build_report

    forced = {"label": "t4", "name": "Intel(R) Xeon(R)", "forced": True}
    for name, device in (("real", synth.DEVICE), ("forced", forced)):
        records = synth.records({"vgg19": [1.5] * 3}, device=device)
        synth.write_sweep(tmp_path / name, synth.config(["vgg19"], 3), records)
    reports = {name: build_report([tmp_path / name]) for name in ("real", "forced")}
    compared = {name: [r.device for r in report.references] for name, report in reports.items()}
    assert any(compared["real"]) and not any(compared["forced"]), compared
    said = "t4: the label was forced (--force) on Intel(R) Xeon(R): its times are that device's, not a T4's"
    assert said in reports["forced"].warnings and not any("forced" in w for w in reports["real"].warnings)


def test_a_drop_in_points_names_its_standard_error() -> None:
    assert formatting.points(0.0008, 0.0017) == "+0.08 pp (s.e. 0.17)" and formatting.points(0.001) == "+0.10 pp"
