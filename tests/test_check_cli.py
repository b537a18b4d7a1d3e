"""``detprof baseline`` and ``detprof check`` end to end, on sweeps written through ResultsStore.

Every sweep here is synthetic with a known injected effect (tests/synthetic_sweep.py),
except the slow null test at the end, which runs two real CPU sweeps of one configuration.
"""

from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import synthetic_sweep as synth
from advised import advised, resolve
from piped_cli import header_lines, run_piped, table_rows

from detprof.analysis.overhead import noise_floors
from detprof.check.ci_outputs import CONSOLE_COLUMNS, escape_data, escape_property
from detprof.cli import main
from detprof.store import ResultsStore

MODELS = ("resnet50", "vgg16")
Capture = pytest.CaptureFixture[str]


def run_cli(capsys: Capture, *args: str | Path) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def make_sweep(
    root: Path,
    medians: dict[str, float],
    *,
    repeats: int = 5,
    sigma: float = 0.02,
    seed: int = 0,
    config: dict[str, Any] | None = None,
    **record_options: Any,
) -> Path:
    overheads = {
        model: synth.noisy_overheads(median, sigma, repeats, seed + index)
        for index, (model, median) in enumerate(medians.items())
    }
    cfg = config or synth.config(list(medians), repeats)
    return synth.write_sweep(root, cfg, synth.records(overheads, **record_options))


@pytest.fixture
def baseline(tmp_path: Path, capsys: Capture) -> Path:
    results = make_sweep(tmp_path / "base", {"resnet50": 1.5, "vgg16": 1.2}, seed=1)
    path = tmp_path / "detprof-baseline.json"
    code, out, err = run_cli(capsys, "baseline", results, "-o", path)
    assert code == 0, err
    assert "2 model(s), 5 repeats, GPU Tesla T4," in out
    return path


def test_baseline_file_holds_the_raw_log_ratios_and_fingerprint(baseline: Path) -> None:
    doc = json.loads(baseline.read_text())
    assert doc["schema_version"] == 1 and doc["kind"] == "detprof-baseline"
    expected = [math.log(v) for v in synth.noisy_overheads(1.5, 0.02, 5, 1)]
    # Wall time per step is the mean of whole-nanosecond step times (~40 ms): exact to about 1e-8.
    assert doc["models"]["resnet50"]["wall_log_ratios"] == pytest.approx(expected, rel=1e-7)
    assert doc["models"]["resnet50"]["kernel_log_ratios"] == pytest.approx(expected, rel=1e-12)
    entry = doc["models"]["vgg16"]
    assert (entry["repeats"], entry["steps"], entry["warmup"], entry["batch_size"]) == (5, 20, 5, 64)
    assert entry["input_shape"] == [224, 224, 3]
    fp = doc["fingerprint"]
    assert (fp["gpu_name"], fp["driver"], fp["cuda"], fp["cudnn"]) == ("Tesla T4", "550.54.15", "12.5.1", "9")
    assert (fp["tensorflow"], fp["keras"], fp["detprof"]) == ("2.21.0", "3.15.0", "0.1.0")
    assert fp["determinism"]["deterministic"]["op_determinism"] is True
    assert re.fullmatch(r"[0-9a-f]{16}", fp["config_hash"])


def test_injected_regression_exits_1(tmp_path: Path, baseline: Path, capsys: Capture) -> None:
    current = make_sweep(tmp_path / "cur", {"resnet50": 1.5 * 1.3, "vgg16": 1.2}, seed=11)
    code, out, _ = run_cli(capsys, "check", "--baseline", baseline, "--current", current)
    assert code == 1
    assert re.search(r"resnet50\s.*REGRESSED", out)
    assert re.search(r"vgg16\s.*OK", out)


LONG_MODEL = "transformer_block_with_a_rather_long_name_to_build_a_custom_keras_model"


def test_check_to_a_ci_log_prints_one_line_per_model(tmp_path: Path, capsys: Capture) -> None:
    """A CI log is no terminal: the table keeps one line per model, whole names, and a one-line header and title."""
    base = make_sweep(tmp_path / "base", {"resnet50": 1.5, LONG_MODEL: 1.2}, seed=1)
    assert run_cli(capsys, "baseline", base, "-o", tmp_path / "b.json")[0] == 0
    current = make_sweep(tmp_path / "cur", {"resnet50": 1.5 * 1.3, LONG_MODEL: 1.2}, seed=11)
    done = run_piped("check", "--baseline", tmp_path / "b.json", "--current", current)
    assert done.returncode == 1, done.stderr
    assert "Determinism overhead vs baseline (deterministic / default)" in map(str.strip, done.stdout.splitlines())
    assert header_lines(done.stdout) == [list(CONSOLE_COLUMNS)]
    rows = table_rows(done.stdout)
    assert [(row[0], row[1]) for row in rows] == [("resnet50", "REGRESSED"), (LONG_MODEL, "OK")]


def test_identical_results_exit_0(tmp_path: Path, baseline: Path, capsys: Capture) -> None:
    current = make_sweep(tmp_path / "same", {"resnet50": 1.5, "vgg16": 1.2}, seed=1)
    code, out, err = run_cli(capsys, "check", "--baseline", baseline, "--current", current)
    assert code == 0, err
    assert out.count(" OK ") == 2
    assert "1.000x" in out and "REGRESSED" not in out.split("Change =")[0]


@pytest.mark.parametrize("seed", range(100, 112))
def test_noise_within_the_threshold_is_not_regressed(
    tmp_path: Path, baseline: Path, capsys: Capture, seed: int
) -> None:
    current = make_sweep(tmp_path / "noisy", {"resnet50": 1.5 * 1.03, "vgg16": 1.2 / 1.02}, sigma=0.03, seed=seed)
    code, out, _ = run_cli(capsys, "check", "--baseline", baseline, "--current", current)
    assert code == 0
    table = out.split("Change =")[0]
    assert "REGRESSED" not in table


def test_environment_mismatch_exits_3(tmp_path: Path, baseline: Path, capsys: Capture) -> None:
    current = make_sweep(
        tmp_path / "tf-upgrade",
        {"resnet50": 1.5, "vgg16": 1.2},
        seed=1,
        versions={**synth.VERSIONS, "tensorflow": "2.22.0"},
        device={**synth.DEVICE, "driver": "560.35.03"},
    )
    code, out, err = run_cli(capsys, "check", "--baseline", baseline, "--current", current)
    assert code == 3
    assert err.count("\n") == 1 and "driver, tensorflow" in err and "--allow-env-change" in err
    assert "tensorflow: 2.21.0 -> 2.22.0" in out and "driver: 550.54.15 -> 560.35.03" in out

    code, out, err = run_cli(capsys, "check", "--baseline", baseline, "--current", current, "--allow-env-change")
    assert code == 0
    assert "warning: environment differs from the baseline (driver, tensorflow)" in err
    assert "accepted (--allow-env-change)" in out


def test_a_different_measurement_configuration_is_incomparable(tmp_path: Path, baseline: Path, capsys: Capture) -> None:
    cfg = synth.config(list(MODELS), 5, batch_size=32)
    current = make_sweep(tmp_path / "bs32", {"resnet50": 1.5, "vgg16": 1.2}, seed=1, config=cfg)
    code, out, err = run_cli(capsys, "check", "--baseline", baseline, "--current", current)
    assert code == 3 and "environment differs from the baseline (config.batch_size)" in err, err
    assert "config.batch_size: 64 -> 32" in out, out


def test_more_repeats_in_the_current_run_stay_comparable(tmp_path: Path, baseline: Path, capsys: Capture) -> None:
    current = make_sweep(tmp_path / "r10", {"resnet50": 1.5, "vgg16": 1.2}, repeats=10, seed=20)
    code, out, _ = run_cli(capsys, "check", "--baseline", baseline, "--current", current)
    assert code == 0 and "5/10" in out


@pytest.mark.parametrize(("repeats", "change", "sigma"), [(2, 1.6, 0.01), (10, 1.2, 0.03)])
def test_small_and_large_repeat_counts(
    tmp_path: Path, capsys: Capture, repeats: int, change: float, sigma: float
) -> None:
    base = make_sweep(tmp_path / "base", {"resnet50": 1.5}, repeats=repeats, sigma=sigma, seed=3)
    assert run_cli(capsys, "baseline", base, "-o", tmp_path / "b.json")[0] == 0
    same = make_sweep(tmp_path / "same", {"resnet50": 1.5}, repeats=repeats, sigma=sigma, seed=4)
    code, out, _ = run_cli(capsys, "check", "--baseline", tmp_path / "b.json", "--current", same)
    assert code == 0 and f"{repeats}/{repeats}" in out
    worse = make_sweep(tmp_path / "worse", {"resnet50": 1.5 * change}, repeats=repeats, sigma=sigma, seed=5)
    code, out, _ = run_cli(capsys, "check", "--baseline", tmp_path / "b.json", "--current", worse)
    assert code == 1 and "REGRESSED" in out
    if repeats == 2:
        assert "only 2 repeats" in out


def test_a_single_repeat_cannot_give_an_interval(tmp_path: Path, capsys: Capture) -> None:
    single = make_sweep(tmp_path / "r1", {"resnet50": 1.5}, repeats=1)
    code, _, err = run_cli(capsys, "baseline", single, "-o", tmp_path / "b.json")
    assert code == 3 and err.count("\n") == 1 and "R < 2 cannot give an interval" in err
    assert not (tmp_path / "b.json").exists()

    base = make_sweep(tmp_path / "r3", {"resnet50": 1.5}, repeats=3)
    assert run_cli(capsys, "baseline", base, "-o", tmp_path / "b.json")[0] == 0
    code, _, err = run_cli(capsys, "check", "--baseline", tmp_path / "b.json", "--current", single)
    assert code == 3 and err.count("\n") == 1 and "R < 2 cannot give an interval" in err


def test_baseline_of_results_with_failed_runs_is_refused(tmp_path: Path, capsys: Capture) -> None:
    results = make_sweep(tmp_path / "f", {"resnet50": 1.5}, failed={"resnet50--default--r2": "CUDA OOM"})
    code, _, err = run_cli(capsys, "baseline", results, "-o", tmp_path / "b.json")
    assert code == 3 and "CUDA OOM" in err and "complete sweep" in err


def test_baseline_of_a_sweep_stopped_before_its_last_repeat_is_refused(tmp_path: Path, capsys: Capture) -> None:
    results = make_sweep(tmp_path / "s", {"resnet50": 1.5}, repeats=3)
    next((results / "sweep" / "runs").glob("resnet50--default--r2*.json")).unlink()
    code, _, err = run_cli(capsys, "baseline", results, "-o", tmp_path / "b.json")
    assert code == 3 and err.count("\n") == 1, err
    assert "resnet50 has 2 of the 3 paired repeats the sweep asked for" in err and "sweep --resume" in err
    assert not (tmp_path / "b.json").exists()


def test_baseline_of_a_missing_directory(tmp_path: Path, capsys: Capture) -> None:
    code, _, err = run_cli(capsys, "baseline", tmp_path / "nowhere", "-o", tmp_path / "b.json")
    assert code == 3 and err.count("\n") == 1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r.pop("repeat"), "has no valid 'repeat'"),
        (lambda r: r.update(mode=None), "has no valid 'mode'"),
        (lambda r: r.update(wall_ns_per_step="fast"), "non-numeric 'wall_ns_per_step'"),
        (lambda r: r.update(kernel_ns_per_step=math.nan), "non-numeric 'kernel_ns_per_step'"),
    ],
)
def test_malformed_run_records_are_one_line(tmp_path: Path, capsys: Capture, change: Any, message: str) -> None:
    recs = synth.records({"resnet50": [1.5, 1.6, 1.55]})
    change(recs[3])
    results = synth.write_sweep(tmp_path / "bad", synth.config(["resnet50"], 3), recs)
    code, _, err = run_cli(capsys, "baseline", results, "-o", tmp_path / "b.json")
    assert code == 3 and err.count("\n") == 1 and message in err and "resnet50--" in err


def _write_baseline_variant(src: Path, dst: Path, change: Any) -> Path:
    doc = json.loads(src.read_text())
    change(doc)
    dst.write_text(json.dumps(doc))
    return dst


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing", None, "no such baseline file"),
        ("garbage", "{not json", "not a detprof baseline (invalid JSON"),
        ("list", "[1, 2]", "not a detprof baseline (no schema_version"),
        ("binary", b"\xff\xfe\x00", "not UTF-8"),
    ],
)
def test_unusable_baseline_files(
    tmp_path: Path,
    capsys: Capture,
    name: str,
    content: str | bytes | None,
    message: str,
) -> None:
    current = make_sweep(tmp_path / "cur", {"resnet50": 1.5})
    path = tmp_path / f"{name}.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    code, out, err = run_cli(capsys, "check", "--baseline", path, "--current", current)
    assert code == 3
    assert err.count("\n") == 1 and message in err and "Traceback" not in err
    assert out == ""


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda d: d.update(schema_version=2),
            "baseline schema version 2 is newer than this detprof reads (1)",
        ),
        (lambda d: d.update(schema_version="1"), "schema_version must be a positive integer"),
        (lambda d: d.update(kind="something-else"), "kind must be 'detprof-baseline'"),
        (lambda d: d["fingerprint"].pop("tensorflow"), "fingerprint.tensorflow is missing"),
        (lambda d: d["models"]["vgg16"].update(wall_log_ratios=[0.1]), "models.vgg16.wall_log_ratios"),
        (lambda d: d["models"]["vgg16"].update(wall_log_ratios=["0.1", 0.2]), "models.vgg16.wall_log_ratios"),
        (lambda d: d["models"]["vgg16"].update(kernel_log_ratios={"a": 1}), "models.vgg16.kernel_log_ratios"),
        (lambda d: d["models"]["vgg16"].update(batch_size=True), "models.vgg16.batch_size"),
        (lambda d: d.update(models={}), "models must be a non-empty object"),
        (lambda d: d.update(unsupported=["x"]), "unsupported must map model names"),
    ],
)
def test_malformed_and_newer_baselines(
    tmp_path: Path, baseline: Path, capsys: Capture, change: Any, message: str
) -> None:
    current = make_sweep(tmp_path / "cur", {"resnet50": 1.5, "vgg16": 1.2}, seed=1)
    bad = _write_baseline_variant(baseline, tmp_path / "bad.json", change)
    code, _, err = run_cli(capsys, "check", "--baseline", bad, "--current", current)
    assert code == 3 and err.count("\n") == 1 and message in err


def test_non_finite_numbers_are_refused(tmp_path: Path, baseline: Path, capsys: Capture) -> None:
    current = make_sweep(tmp_path / "cur", {"resnet50": 1.5, "vgg16": 1.2}, seed=1)
    bad = tmp_path / "nan.json"
    bad.write_text(baseline.read_text().replace('"wall_log_ratios": [', '"wall_log_ratios": [NaN, ', 1))
    code, _, err = run_cli(capsys, "check", "--baseline", bad, "--current", current)
    assert code == 3 and "NaN is not a number a baseline may hold" in err


def test_models_missing_on_either_side(tmp_path: Path, baseline: Path, capsys: Capture) -> None:
    current = make_sweep(tmp_path / "cur", {"vgg16": 1.2, "mobilenet": 1.1}, seed=2, config=synth.config(MODELS, 5))
    code, out, err = run_cli(capsys, "check", "--baseline", baseline, "--current", current)
    assert code == 0
    assert re.search(r"resnet50\s.*MISSING_CURRENT", out) and re.search(r"mobilenet\s.*MISSING_BASELINE", out)
    assert "warning: resnet50: MISSING_CURRENT" in err and "warning: mobilenet: MISSING_BASELINE" in err
    code, _, _ = run_cli(capsys, "check", "--baseline", baseline, "--current", current, "--strict")
    assert code == 1


def test_no_model_in_common_is_one_line(tmp_path: Path, baseline: Path, capsys: Capture) -> None:
    current = make_sweep(tmp_path / "cur", {"lenet": 1.1}, config=synth.config(MODELS, 5))
    code, out, err = run_cli(capsys, "check", "--baseline", baseline, "--current", current)
    assert code == 3 and err.count("\n") == 1 and out == ""
    assert "no model in common" in err and "resnet50, vgg16" in err and "lenet" in err


def test_a_failed_measurement_exits_3(tmp_path: Path, baseline: Path, capsys: Capture) -> None:
    current = make_sweep(
        tmp_path / "cur",
        {"resnet50": 1.5, "vgg16": 1.2},
        seed=1,
        failed={"vgg16--deterministic--r3": "killed"},
    )
    code, out, _ = run_cli(capsys, "check", "--baseline", baseline, "--current", current)
    assert code == 3 and re.search(r"vgg16\s.*FAILED", out)


def test_a_regression_outranks_a_failed_measurement(tmp_path: Path, baseline: Path, capsys: Capture) -> None:
    current = make_sweep(
        tmp_path / "cur",
        {"resnet50": 2.5, "vgg16": 1.2},
        seed=1,
        failed={"vgg16--deterministic--r3": "killed"},
    )
    code, _, _ = run_cli(capsys, "check", "--baseline", baseline, "--current", current)
    assert code == 1


def _inconclusive_sweeps(tmp_path: Path) -> tuple[Path, Path]:
    """Three noisy repeats, a 15% rise: beyond the threshold, but not provably."""
    spread = [0.92, 1.0, 1.08]
    cfg = synth.config(["resnet50"], 3)
    base = synth.write_sweep(tmp_path / "base", cfg, synth.records({"resnet50": [1.5 * s for s in spread]}))
    cur = synth.write_sweep(tmp_path / "cur", cfg, synth.records({"resnet50": [1.5 * 1.15 * s for s in spread[::-1]]}))
    return base, cur


def test_inconclusive_warns_and_strict_fails(tmp_path: Path, capsys: Capture) -> None:
    base, cur = _inconclusive_sweeps(tmp_path)
    assert run_cli(capsys, "baseline", base, "-o", tmp_path / "b.json")[0] == 0
    code, out, err = run_cli(capsys, "check", "--baseline", tmp_path / "b.json", "--current", cur)
    assert code == 0
    assert "INCONCLUSIVE" in out and re.search(r"width \d\.\d{3}; about \d+ repeats per side would settle it", out)
    assert "warning: resnet50: INCONCLUSIVE" in err
    code, _, _ = run_cli(capsys, "check", "--baseline", tmp_path / "b.json", "--current", cur, "--strict")
    assert code == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--current", "x"], "needs --baseline FILE"),
        (["--baseline", "b.json"], "exactly one of --current RESULTS_DIR or --run"),
        (["--baseline", "b.json", "--current", "x", "--run"], "exactly one of"),
        (["--baseline", "b.json", "--current", "x", "--threshold", "0"], "such as 10% or 0.10, not '0'"),
        (["--baseline", "b.json", "--current", "x", "--threshold", "10"], "not '10' (a fraction: 1,000%; write 10%"),
        (["--baseline", "b.json", "--current", "x", "--threshold", "inf"], "such as 10% or 0.10, not 'inf'"),
        (["--baseline", "b.json", "--current", "x", "--threshold", "ten"], "such as 10% or 0.10, not 'ten'"),
        (["--baseline", "b.json", "--current", "x", "--confidence", "1"], "--confidence must lie between"),
        (["--baseline", "b.json", "--current", "x", "--repeats", "5"], "--repeats only apply with --run"),
    ],
)
def test_usage_errors_exit_2(capsys: Capture, args: list[str], message: str) -> None:
    code, _, err = run_cli(capsys, "check", *args)
    assert code == 2 and err.count("\n") == 1 and message in err


def _regression_check(tmp_path: Path, baseline: Path, capsys: Capture, *extra: Any) -> tuple:
    current = make_sweep(tmp_path / "cur", {"resnet50": 1.5 * 1.3, "vgg16": 1.2}, seed=11)
    return run_cli(capsys, "check", "--baseline", baseline, "--current", current, *extra)


def test_a_threshold_is_a_percentage_or_a_fraction(tmp_path: Path, baseline: Path, capsys: Capture) -> None:
    """A 30% rise: beyond the default 10%, within 50% written either way."""
    assert _regression_check(tmp_path / "a", baseline, capsys)[0] == 1
    for threshold in ("50%", "0.5"):
        code, out, _ = _regression_check(tmp_path / threshold, baseline, capsys, "--threshold", threshold)
        assert code == 0 and "REGRESSED above 1.500" in out, out


def test_junit_report_parses_back(tmp_path: Path, baseline: Path, capsys: Capture) -> None:
    junit = tmp_path / "reports" / "detprof.xml"
    code, _, _ = _regression_check(tmp_path, baseline, capsys, "--junit", junit)
    assert code == 1
    root = ET.parse(junit).getroot()
    assert root.tag == "testsuites" and root.get("tests") == "2" and root.get("failures") == "1"
    cases = {case.get("name"): case for case in root.iter("testcase")}
    assert set(cases) == set(MODELS)
    failure = cases["resnet50"].find("failure")
    assert failure is not None and failure.get("type") == "REGRESSED"
    message = failure.get("message") or ""
    ratio, low, high = (float(v) for v in re.search(r"change (\S+)x \[(\S+), (\S+)\]", message).groups())
    assert low < ratio < high and low > 1.10
    assert "> 1.100 (threshold +10%)" in message
    assert cases["vgg16"].find("failure") is None and cases["vgg16"].find("error") is None
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert props["threshold"] == "0.1" and props["holm_family_size"] == "2"


def test_junit_records_an_incomparable_environment(tmp_path: Path, baseline: Path, capsys: Capture) -> None:
    current = make_sweep(
        tmp_path / "cur", {"resnet50": 1.5, "vgg16": 1.2}, versions={**synth.VERSIONS, "keras": "3.16"}
    )
    junit = tmp_path / "j.xml"
    code, _, _ = run_cli(capsys, "check", "--baseline", baseline, "--current", current, "--junit", junit)
    assert code == 3
    (case,) = ET.parse(junit).getroot().iter("testcase")
    error = case.find("error")
    assert case.get("name") == "environment" and error is not None and "keras: 3.15.0 -> 3.16" in (error.text or "")


def _unescape(text: str) -> str:
    """What the Actions runner does to a workflow command's data and properties."""
    for code, char in (("%0D", "\r"), ("%0A", "\n"), ("%3A", ":"), ("%2C", ","), ("%25", "%")):
        text = text.replace(code, char)
    return text


def test_escaping_functions() -> None:
    assert escape_data("100% done\r\nnext: a,b") == "100%25 done%0D%0Anext: a,b"
    assert escape_property("100% done\r\nnext: a,b") == "100%25 done%0D%0Anext%3A a%2Cb"
    assert escape_data("%0A") == "%250A"
    for text in ("50%: a,b\nc", "%25", "a\r\n%3A"):
        assert _unescape(escape_property(text)) == text


def test_github_annotations_and_step_summary(
    tmp_path: Path, baseline: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    summary = tmp_path / "summary.md"
    summary.write_text("# earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    code, out, _ = _regression_check(tmp_path, baseline, capsys, "--github")
    assert code == 1
    commands = [line for line in out.splitlines() if line.startswith("::")]
    assert len(commands) == 1
    match = re.fullmatch(r"::error title=([^:]*)::(.*)", commands[0])
    assert match is not None
    assert match.group(1) == "detprof check%3A resnet50 REGRESSED"
    assert "threshold +10%25" in match.group(2)
    text = summary.read_text()
    assert text.startswith("# earlier step\n")
    rows = [line for line in text.splitlines() if line.startswith("| resnet50") or line.startswith("| vgg16")]
    assert len(rows) == 2 and "**REGRESSED**" in rows[0]


def test_annotation_data_with_separators_and_newlines(
    tmp_path: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    odd = "net:v1,50%"
    cfg = synth.config([odd, "plain"], 3)
    base = synth.write_sweep(tmp_path / "base", cfg, synth.records({odd: [1.5, 1.52, 1.49], "plain": [1.1, 1.1, 1.1]}))
    assert run_cli(capsys, "baseline", base, "-o", tmp_path / "b.json")[0] == 0
    cur = synth.write_sweep(
        tmp_path / "cur",
        cfg,
        synth.records(
            {odd: [1.5, 1.52, 1.49], "plain": [1.1, 1.1, 1.1]},
            failed={f"{odd}--default--r1": "worker crashed:\nline two, 100% lost"},
        ),
    )
    code, out, err = run_cli(capsys, "check", "--baseline", tmp_path / "b.json", "--current", cur, "--github")
    assert code == 3
    assert "GITHUB_STEP_SUMMARY is not set" in err
    (line,) = [line for line in out.splitlines() if line.startswith("::error")]
    title, message = re.fullmatch(r"::error title=([^:]*)::(.*)", line).groups()
    assert title == "detprof check%3A net%3Av1%2C50%25 FAILED"
    assert "\n" not in message and "%0Aline two, 100%25 lost" in message
    assert _unescape(title) == f"detprof check: {odd} FAILED"
    assert _unescape(message).endswith("worker crashed:\nline two, 100% lost")


def test_step_summary_shows_names_literally(tmp_path: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch) -> None:
    """GitHub renders HTML in the job summary: a model name with ``<``, ``&`` or ``|`` is escaped, not markup."""
    odd = "net<v2>&co|x"
    cfg = synth.config([odd], 3)
    base = synth.write_sweep(tmp_path / "b", cfg, synth.records({odd: [1.5, 1.51, 1.49]}))
    cur = synth.write_sweep(tmp_path / "c", cfg, synth.records({odd: [2.5, 2.51, 2.49]}))
    assert run_cli(capsys, "baseline", base, "-o", tmp_path / "b.json")[0] == 0
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    code, _, _ = run_cli(capsys, "check", "--baseline", tmp_path / "b.json", "--current", cur, "--github")
    assert code == 1
    (row,) = [line for line in summary.read_text().splitlines() if line.startswith("| net")]
    assert row.startswith(r"| net\<v2\>\&co\|x | **REGRESSED** |")
    assert row.count(" | ") == 8


@pytest.mark.parametrize("option", ["--junit", "--bmf", "--benchmark-json"])
def test_an_output_that_cannot_be_written_is_input_error(
    tmp_path: Path, baseline: Path, capsys: Capture, option: str
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, _, err = _regression_check(tmp_path, baseline, capsys, option, blocker / "out")
    assert (
        code == 3
        and err.count("\n") == 1
        and f"cannot write the file to {blocker / 'out'}: {blocker} is a file, not a folder" in err
    )
    assert blocker.read_text() == "x"


def test_at_most_ten_annotations_of_a_kind(tmp_path: Path, capsys: Capture) -> None:
    models = [f"m{i:02d}" for i in range(12)]
    cfg = synth.config(models, 3)
    base = synth.write_sweep(tmp_path / "b", cfg, synth.records({m: [1.5, 1.51, 1.49] for m in models}))
    cur = synth.write_sweep(tmp_path / "c", cfg, synth.records({m: [2.5, 2.51, 2.49] for m in models}))
    assert run_cli(capsys, "baseline", base, "-o", tmp_path / "b.json")[0] == 0
    code, out, _ = run_cli(capsys, "check", "--baseline", tmp_path / "b.json", "--current", cur, "--github")
    assert code == 1
    errors = [line for line in out.splitlines() if line.startswith("::error")]
    assert len(errors) == 10
    assert errors[-1] == "::error title=detprof check%3A 3 more::3 more errors: see the job summary"


def test_bencher_and_benchmark_json(tmp_path: Path, baseline: Path, capsys: Capture) -> None:
    bmf, bench = tmp_path / "bmf.json", tmp_path / "bench.json"
    code, _, _ = _regression_check(tmp_path, baseline, capsys, "--bmf", bmf, "--benchmark-json", bench)
    assert code == 1
    document = json.loads(bmf.read_text())
    assert set(document) == set(MODELS)
    logs = np.log(synth.noisy_overheads(1.5 * 1.3, 0.02, 5, 11))
    metric = document["resnet50"]["determinism-overhead"]
    assert metric["value"] == pytest.approx(math.exp(logs.mean()), rel=1e-9)
    from scipy import stats

    half = stats.t.ppf(0.975, 4) * logs.std(ddof=1) / math.sqrt(5)
    assert metric["lower_value"] == pytest.approx(math.exp(logs.mean() - half), rel=1e-9)
    assert metric["upper_value"] == pytest.approx(math.exp(logs.mean() + half), rel=1e-9)
    entries = json.loads(bench.read_text())
    assert [e["name"] for e in entries] == ["resnet50 determinism overhead", "vgg16 determinism overhead"]
    assert all(set(e) == {"name", "unit", "value", "range", "extra"} for e in entries)
    assert entries[0]["value"] == pytest.approx(metric["value"])
    assert "REGRESSED" in entries[0]["extra"]


def test_gate_falls_back_to_wall_time_and_says_so(tmp_path: Path, capsys: Capture) -> None:
    cfg = synth.config(["resnet50"], 4, tracer="none")
    wall = {"resnet50": [1.3, 1.31, 1.29, 1.3]}
    base = synth.write_sweep(tmp_path / "b", cfg, synth.records(wall, tracer="none"))
    assert run_cli(capsys, "baseline", base, "-o", tmp_path / "b.json")[0] == 0
    assert json.loads((tmp_path / "b.json").read_text())["models"]["resnet50"]["kernel_log_ratios"] is None
    cur = synth.write_sweep(tmp_path / "c", cfg, synth.records({"resnet50": [1.7, 1.71, 1.69, 1.7]}, tracer="none"))
    code, out, _ = run_cli(capsys, "check", "--baseline", tmp_path / "b.json", "--current", cur)
    assert code == 1
    assert re.search(r"resnet50\s.*REGRESSED\s.*wall", out)
    assert "no kernel time on either side: gated on wall time" in out


@pytest.mark.slow
def test_two_real_cpu_sweeps_of_one_configuration_are_not_regressed(tmp_path: Path, capsys: Capture) -> None:
    """The null case on real measurements: nothing changed, so nothing may be called REGRESSED.

    The first sweep is ``detprof sweep``; the second is ``check --run``, which must rebuild
    the very same configuration from the baseline (same fingerprint, no --allow-env-change).
    A false REGRESSED has probability at most alpha by construction, and on a loaded
    2-core runner the det/default ratio of a 5-step run swings by +-50%, which drives the
    rate towards alpha (about 2-3% at 5%, simulated). The check runs at 99% confidence so
    that this test's own false-failure rate stays below 0.5%; the threshold is the default.
    """
    sweep_options = [
        # No --steps: the preset sizes each phase's steps to the machine, and check --run must size them alike.
        *("--models", "smallcnn", "--warmup", "2", "--repeats", "2"),
        *("--input-size", "16", "--batch-size", "8", "--gpu", "cpu", "--tracer", "tf"),
        *("--pairing", "in-process", "--shared-repeats"),  # replayed by check --run as the baseline has them
    ]
    code, _, err = run_cli(capsys, "sweep", *sweep_options, "--out", tmp_path / "first")
    assert code == 0, err
    assert run_cli(capsys, "baseline", tmp_path / "first", "-o", tmp_path / "b.json")[0] == 0
    junit = tmp_path / "j.xml"
    check = ["--baseline", tmp_path / "b.json", "--run", "--out", tmp_path / "second", "--confidence", "0.99"]
    code, out, err = run_cli(capsys, "check", *check, "--junit", junit)
    assert code == 0, out + err
    assert "same fingerprint as the baseline" in out
    second = json.loads((tmp_path / "second" / "sweep" / "manifest.json").read_text())["config"]
    first = json.loads((tmp_path / "first" / "sweep" / "manifest.json").read_text())["config"]
    assert second == first
    (case,) = ET.parse(junit).getroot().iter("testcase")
    assert case.get("name") == "smallcnn" and case.find("failure") is None and case.find("error") is None


def test_check_shows_the_noise_floor_of_a_calibration_beside_the_results(
    tmp_path: Path, baseline: Path, capsys: Capture
) -> None:
    current = make_sweep(tmp_path / "cur", {"resnet50": 1.5, "vgg16": 1.2}, seed=1)
    code, out, _ = run_cli(capsys, "check", "--baseline", baseline, "--current", current)
    assert code == 0 and "noise floor: not measured here" in out
    (advice,) = advised(out)
    assert advice == f"detprof sweep --calibrate --models resnet50,vgg16 --out {current}"
    resolve(advice, tmp_path, capsys)
    calibration = ResultsStore(current, "calibration")
    calibration.open(synth.config(["resnet50"], 4), "detprof sweep --calibrate", resume=False)
    for record in synth.records({"resnet50": [1.01, 0.99, 1.02, 0.98]}):
        arm = "a" if record["mode"] == "default" else "b"
        calibration.write_record(record | {"mode": "deterministic", "arm": arm})
    code, out, _ = run_cli(capsys, "check", "--baseline", baseline, "--current", current)
    floor = noise_floors(calibration.records())["resnet50"]
    assert code == 0 and f"noise floor (A/A, {calibration.dir}): resnet50 +/-{floor:.1%}" in out
