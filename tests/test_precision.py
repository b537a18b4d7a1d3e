"""``--precision`` and ``--budget``: repeats added model by model until each interval is within the precision.

The interval of a study that stopped when it was precise enough is Stein's two-stage interval
(``intervals.stein_interval``): its coverage is checked here by simulation against the t-interval
that stopping on its own width would give, which covers less than it says. The study flow is
checked on records written in the documented format (``synthetic_sweep``): which models get
another repeat, and what the outputs say of a model the budget left wider than asked.
"""

from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
import synthetic_sweep as synth

from detprof.analysis.overhead import model_overheads, repeats_wanted
from detprof.cli import main
from detprof.errors import ExitCode, UsageError
from detprof.intervals import paired_t, repeats_for_precision, stein_interval, stein_repeats
from detprof.option_values import parse_duration, parse_precision

PRECISION = 0.02
FIRST_STAGE = 4


def _stein_study(rng: np.random.Generator, sigma: float, draw: object = None) -> tuple[float, float]:
    """One study of log ratios with true mean 0: Stein's first stage, then the repeats it asks for."""
    sample = (lambda n: rng.normal(0.0, sigma, n)) if draw is None else draw
    first = list(sample(FIRST_STAGE))  # type: ignore[operator]
    need = min(stein_repeats(first, PRECISION), 200)
    values = first + list(sample(need - FIRST_STAGE))  # type: ignore[operator]
    interval = stein_interval(values, FIRST_STAGE)
    assert interval is not None
    return math.log(interval.ci_low), math.log(interval.ci_high)


def _stop_when_narrow(rng: np.random.Generator, sigma: float) -> tuple[float, float]:
    """The rule Stein's replaces: add repeats until the usual t-interval is within the precision."""
    values = list(rng.normal(0.0, sigma, FIRST_STAGE))
    while True:
        interval = paired_t(values)
        assert interval is not None
        if interval.precision is not None and (interval.precision <= PRECISION or len(values) >= 200):
            return math.log(interval.ci_low), math.log(interval.ci_high)
        values.append(float(rng.normal(0.0, sigma)))


@pytest.mark.parametrize("sigma", [0.005, 0.015, 0.04])
def test_steins_interval_covers_its_confidence_where_stopping_on_width_does_not(sigma: float) -> None:
    rng = np.random.default_rng(7)
    studies = 3000
    stein = [_stein_study(rng, sigma) for _ in range(studies)]
    covered = np.mean([low <= 0 <= high for low, high in stein])
    assert covered >= 0.94, covered  # >= 95% in truth; 3000 studies put the estimate within about 0.8%
    if sigma == 0.04:  # where a first stage that comes out narrow by chance is often taken for a precise one
        naive = [_stop_when_narrow(rng, sigma) for _ in range(studies)]
        assert np.mean([low <= 0 <= high for low, high in naive]) < covered - 0.025


def test_steins_interval_holds_on_heavy_tailed_repeats() -> None:
    """A repeat interrupted by other work now and then (a Student t with 4 degrees of freedom)."""
    rng = np.random.default_rng(11)
    draw = lambda n: 0.01 * rng.standard_t(4, n)  # noqa: E731
    studies = [_stein_study(rng, 0.0, draw) for _ in range(3000)]
    assert np.mean([low <= 0 <= high for low, high in studies]) >= 0.94


def test_the_repeats_asked_for_follow_the_first_stages_spread() -> None:
    quiet, noisy = [0.030, 0.031, 0.029, 0.030], [0.01, 0.05, 0.03, 0.07]
    assert stein_repeats(quiet, PRECISION) == FIRST_STAGE
    spread = float(np.std(noisy, ddof=1))
    assert stein_repeats(noisy, PRECISION) == math.ceil((3.182446305284263 * spread / math.log1p(PRECISION)) ** 2)
    assert stein_repeats(noisy, 0.01) > stein_repeats(noisy, PRECISION)
    interval = stein_interval([*noisy, 0.04, 0.03], FIRST_STAGE)
    assert interval is not None and interval.first_stage == FIRST_STAGE
    assert repeats_for_precision(interval, PRECISION) == stein_repeats(noisy, PRECISION)
    assert stein_interval(noisy[:3], FIRST_STAGE) == paired_t(noisy[:3])  # no stopping decided anything yet


def _sweep(ratios: dict[str, list[float]], *, first_stage: int | None = FIRST_STAGE) -> list[dict[str, object]]:
    records = [dict(r) for r in synth.records(ratios, tracer="none")]
    if first_stage is not None:
        for record in records:
            record |= {"precision": PRECISION, "first_stage": first_stage}
    return records


def test_a_model_wider_than_asked_gets_more_repeats_and_the_outputs_say_how_many() -> None:
    quiet = [1.030, 1.031, 1.029, 1.030]
    noisy = [1.01, 1.05, 1.03, 1.07]
    records = _sweep({"quiet": quiet, "noisy": noisy})
    wanted = repeats_wanted(records, PRECISION)
    assert wanted["quiet"] == (4, 4)
    assert wanted["noisy"][0] == 4 and wanted["noisy"][1] == stein_repeats([math.log(r) for r in noisy], PRECISION)
    overheads = model_overheads(records)
    assert overheads["noisy"].wall is not None and overheads["noisy"].wall.first_stage == FIRST_STAGE
    assert overheads["quiet"].precision_line() == "wall time +/-0.1% after 4 repeats, within +/-2.0%"
    line = overheads["noisy"].precision_line()
    short = wanted["noisy"][1] - 4
    assert line is not None and line.startswith("wall time +/-") and "after 4 repeats: not within +/-2.0%" in line
    assert f"about {short} more repeats would reach it" in line
    assert _sweep({"quiet": quiet}, first_stage=None)[0].get("first_stage") is None
    assert model_overheads(_sweep({"quiet": quiet}, first_stage=None))["quiet"].precision_line() is None


def test_a_failed_model_gets_no_more_repeats() -> None:
    records = [dict(r) for r in synth.records({"m": [1.01, 1.05, 1.03, 1.07]}, failed={"m--default--r1": "boom"})]
    for record in records:
        record |= {"precision": PRECISION, "first_stage": FIRST_STAGE}
    assert repeats_wanted(records, PRECISION) == {}


@pytest.mark.parametrize(
    ("given", "fraction"), [("2%", 0.02), ("0.02", 0.02), (" 0.5% ", 0.005), ("off", 0.0), (0.03, 0.03)]
)
def test_precision_reads_as_a_fraction(given: str | float, fraction: float) -> None:
    assert parse_precision(given) == pytest.approx(fraction)


@pytest.mark.parametrize(("given", "seconds"), [("90s", 90), ("10m", 600), ("1.5h", 5400), ("45", 45), (30.0, 30)])
def test_budget_reads_as_seconds(given: str | float, seconds: float) -> None:
    assert parse_duration(given, "--budget") == seconds


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--precision", "150%"), "--precision takes a fraction of the overhead such as 2% or 0.02 (or off)"),
        (("--precision", "fast"), "--precision takes a fraction"),
        (("--budget", "soon"), "--budget takes a positive duration such as 90s, 10m or 1h, not 'soon'"),
        (("--precision", "off", "--budget", "5m"), "--budget bounds the repeats --precision adds"),
        (("--precision", "2%", "--repeats", "1"), "--precision needs --repeats 2 or more"),
        (("--pairing", "threads"), "unknown --pairing 'threads'; choose one of auto, in-process, processes"),
    ],
)
def test_bad_precision_budget_or_pairing_is_one_line(
    args: tuple[str, ...], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["sweep", "--dry-run", "--backend", "tensorflow", "--models", "smallcnn", "--gpu", "cpu", *args])
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE, err
    assert err.count("\n") == 1 and said in err, err


def test_torch_keeps_a_process_per_mode_where_a_switch_is_read_once() -> None:
    from detprof.backends import get

    torch = get("torch")
    deterministic = torch.mode_knobs()
    flippable = deterministic - {"torch.cublas_workspace_config"}
    assert torch.shared_process_refusal([flippable, frozenset()], compile=False, on_gpu=True) is None
    refusal = torch.shared_process_refusal([deterministic, frozenset()], compile=False, on_gpu=True)
    assert "read once, when CUDA starts" in str(refusal)
    assert "torch.compile" in str(torch.shared_process_refusal([frozenset(), frozenset()], compile=True, on_gpu=False))
    with pytest.raises(UsageError):
        parse_precision("-1%")
    # Asked for by name, one process runs both: it starts with the workspace, which the default arm shares.
    assert torch.shared_process_refusal([deterministic, frozenset()], compile=False, on_gpu=True, asked=True) is None
    assert torch.process_knobs([deterministic, frozenset()], on_gpu=True) == {"torch.cublas_workspace_config"}
    assert torch.process_knobs([flippable, frozenset()], on_gpu=True) == frozenset()
    assert torch.process_knobs([deterministic, deterministic], on_gpu=False) == frozenset()  # cuBLAS: a GPU's


def test_one_process_asked_for_by_name_pairs_pytorch_on_a_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    plan = ["sweep", "--dry-run", "--backend", "torch", "--models", "smallcnn", "--gpu", "t4", "--force"]
    assert main(plan) == ExitCode.OK
    assert "sequential: one worker at a time" in capsys.readouterr().out
    assert main([*plan, "--pairing", "in-process"]) == ExitCode.OK
    said = capsys.readouterr().out
    assert "in-process: one worker per repeat runs both modes" in said
    assert "the process starts with torch.cublas_workspace_config, which both modes share" in said


@pytest.mark.parametrize(
    ("args", "adds"),
    [
        ((), "Then repeats 4, 5, ... of each model whose interval is not yet within +/-2.0%, as many as its first 4"),
        (("--repeats", "3"), None),
        (("--repeats", "3", "--precision", "5%"), "not yet within +/-5.0%, as many as its first 3 repeats' spread"),
        (("--precision", "off"), None),
    ],
)
def test_the_preset_adds_repeats_unless_the_repeats_are_given(
    args: tuple[str, ...], adds: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    """``cpu-small`` asks for +/-2% within 90 s; ``--repeats N`` alone is N repeats, no more."""
    assert main(["sweep", "--dry-run", "--models", "smallcnn", "--gpu", "cpu", *args]) == ExitCode.OK
    out = " ".join(capsys.readouterr().out.split())
    if adds is None:
        assert "Then repeats" not in out
    else:
        assert adds in out
    assert ("while the next repeat fits in 90 s" in out) is (adds is not None)


def test_an_interval_just_wider_than_asked_does_not_read_as_the_precision_asked() -> None:
    """+/-2.02% against +/-2%: one digit would print "+/-2.0%: not within +/-2.0%"."""
    shape = np.array([-1.0, -1 / 3, 1 / 3, 1.0])
    t3 = 3.182446305284263
    scale = 1.003 * math.log1p(PRECISION) * 2 / (t3 * float(np.std(shape, ddof=1)))
    ratios = [math.exp(0.03 + scale * v) for v in shape]
    line = model_overheads(_sweep({"edge": ratios}))["edge"].precision_line()
    assert line is not None and re.search(r"\+/-2\.0\d% after 4 repeats: not within \+/-2\.0%", line), line


def test_the_json_report_and_checks_outputs_carry_the_precision_as_fields(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One model settled within +/-2%, one left wider: the fields, not only the caveat sentence."""
    quiet, noisy = [1.030, 1.031, 1.029, 1.030], [1.01, 1.05, 1.03, 1.07]
    records = _sweep({"quiet": quiet, "noisy": noisy})
    results = synth.write_sweep(tmp_path / "res", synth.config(["quiet", "noisy"], FIRST_STAGE), records)
    assert main(["report", str(results), "--format", "json", "-o", "-"]) == ExitCode.OK
    rows = {row["model"]: row for row in json.loads(capsys.readouterr().out)["models"]}
    need = stein_repeats([math.log(r) for r in noisy], PRECISION)
    assert rows["quiet"]["precision"] == {
        "metric": "wall",
        "half_width": pytest.approx(rows["quiet"]["overhead"]["wall"]["half_width"]),
        "target": PRECISION,
        "settled": True,
        "repeats": 4,
        "repeats_to_target": 4,
    }
    noisy_precision = rows["noisy"]["precision"]
    assert noisy_precision["settled"] is False and noisy_precision["half_width"] > PRECISION
    assert (noisy_precision["repeats"], noisy_precision["repeats_to_target"]) == (4, need)
    assert noisy_precision["repeats_to_target"] != rows["noisy"]["repeats_needed"]

    assert main(["baseline", str(results), "-o", str(tmp_path / "base.json")]) == ExitCode.OK
    junit, bench = tmp_path / "check.xml", tmp_path / "bench.json"
    args = ["check", "--baseline", str(tmp_path / "base.json"), "--current", str(results)]
    main([*args, "--junit", str(junit), "--benchmark-json", str(bench)])
    capsys.readouterr()
    cases = {case.get("name"): case for case in ET.parse(junit).getroot().iter("testcase")}
    properties = {p.get("name"): p.get("value") for p in cases["noisy"].iter("property")}
    assert properties["precision_settled"] == "False" and properties["precision_repeats_to_target"] == str(need)
    assert float(properties["precision_target"]) == PRECISION
    entries = {entry["name"].split()[0]: entry for entry in json.loads(bench.read_text())}
    assert entries["quiet"]["precision"] == rows["quiet"]["precision"]
    assert entries["noisy"]["precision"]["repeats_to_target"] == need


def test_an_aa_calibration_adds_repeats_until_both_metrics_are_within_the_precision() -> None:
    """Kernel time settled, wall time not: a sweep stops on its headline (kernel time); an A/A, the noise floor of
    both metrics, asks for the repeats its wall time needs, and both its intervals are Stein's."""
    wall, kernel = [1.01, 0.97, 1.03, 0.99], [1.001, 0.999, 1.000, 1.002]
    sweep = [dict(r) for r in synth.records({"m": wall}, kernel_overheads={"m": kernel})]
    for record in sweep:
        record |= {"precision": PRECISION, "first_stage": FIRST_STAGE}
    assert repeats_wanted(sweep, PRECISION) == {"m": (4, 4)}
    aa = [r | {"mode": "deterministic", "arm": "a" if r["mode"] == "default" else "b"} for r in sweep]
    measured = model_overheads(aa)["m"]
    assert measured.wall is not None and measured.wall.first_stage == FIRST_STAGE
    need = stein_repeats(list(measured.wall.log_ratios), PRECISION)
    assert need > 4 and repeats_wanted(aa, PRECISION) == {"m": (4, need)}
    knob_arms = [r | {"comparison": "total"} for r in aa]
    assert repeats_wanted(knob_arms, PRECISION) == {"m": (4, 4)}
