"""The report's answer on synthetic results: verdicts against their own intervals, what a study buys,
studies that did not learn, CPU caveats, the noise floor, ``--format json`` and ``-o -``.

The sweeps are written in the documented record format (``tests/synthetic_sweep.py``), with
per-repeat ratios chosen so that each interval is known; stability summaries are hand-written
in the study's ``summary.json`` format; calibrations are ``records.measured_run`` records with
``arm`` "a"/"b" in a ``ResultsStore(root, "calibration")``.
"""

from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
import synthetic_sweep as synth
from advised import advised, resolve

from detprof.cli import main
from detprof.intervals import CHEAP_OVERHEAD, Overhead, paired_t, repeats_to_read, stein_interval
from detprof.records import measured_run, stability_run
from detprof.reports.command import render_report
from detprof.reports.headline import advice
from detprof.reports.report_data import stability_dataset, stability_refusal, trained_in
from detprof.reports.verdict import Verdict, verdict
from detprof.stability.learning import learned_threshold, learning_of
from detprof.store import ResultsStore

CPU = {"label": "cpu", "name": "AMD EPYC", "cpu_count": 2}
CROSSING = [0.8, 1.25, 1.0]
"""Per-repeat ratios whose 95% CI spans the cheap line widely: about [0.57, 1.74] (the issue had [0.548, 1.840])."""
CHEAP = [1.02, 1.03, 1.04, 1.03]
EXPENSIVE = [1.6, 1.7, 1.65]


def sweep(root: Path, ratios: dict[str, list[float]], device: dict[str, Any] | None = None) -> Path:
    label = (device or synth.DEVICE)["label"]
    records = synth.records(ratios, device=device)
    repeats = max(len(r) for r in ratios.values())
    return synth.write_sweep(root, synth.config(list(ratios), repeats, gpu_label=label), records)


def stability(
    root: Path,
    model: str,
    device: str,
    *,
    accuracy: float,
    churn_impl: float,
    classes: int | None = 10,
    backend: str | None = None,
) -> None:
    """A stability summary in the study's format: algo+impl, algo, impl, control with 3 runs each.

    With a ``backend``, one run record of that backend beside it (what tells the report which
    backend trained); without, no records: a study from before there was a choice.
    """
    store = ResultsStore(root / "stability" / model, "stability")
    store.open({"model": model, "device": device}, f"detprof stability --model {model}", resume=False)
    if backend is not None:
        store.write_record(
            dict(
                stability_run(
                    run_id="r0", variant="control", run=0, mode="default", seeds={}, status="ok", backend=backend
                )
            )
        )
    variants = []
    for name, varies, std, churn in (
        ("algo+impl", ["init", "shuffle", "impl"], 0.012, 0.09),
        ("algo", ["init", "shuffle"], 0.010, 0.08),
        ("impl", ["impl"], 0.004, churn_impl),
        ("control", [], 0.0, 0.0),
    ):
        variants.append(
            {
                "variant": name,
                "varies": varies,
                "mode": "default" if "impl" in varies else "deterministic",
                "runs_ok": 3,
                "runs_failed": 0,
                "failures": [],
                "accuracy": {"mean": accuracy, "std": std, "std_se": std / 4},
                "churn": churn,
                "l2": churn,
                "determinism_check": {"applicable": not varies, "verified": True},
            }
        )
    summary = {
        "kind": "stability",
        "model": model,
        "dataset": "digits",
        "device": device,
        "classes": classes,
        "runs_ok": 12,
        "runs_failed": 0,
        "variants": variants,
        "config": {
            "model": model,
            "dataset": "digits",
            "epochs": 60,
            "runs": 3,
            "variants": [v["variant"] for v in variants],
        },
    }
    store.write_json("summary.json", summary)


def calibration(
    root: Path, ratios: dict[str, list[float]], device: dict[str, Any] | None = None, backend: str | None = None
) -> None:
    """A/A runs: arm b over arm a by the given ratios, both deterministic (on ``backend``, where given)."""
    on_backend = {} if backend is None else {"backend": backend}
    store = ResultsStore(root, "calibration")
    store.open({"models": list(ratios)}, "detprof sweep --calibrate (synthetic)", resume=False)
    for model, per_repeat in ratios.items():
        for repeat, ratio in enumerate(per_repeat):
            for arm, scale in (("a", 1.0), ("b", ratio)):
                store.write_record(
                    measured_run(
                        run_id=f"{model}--{arm}--r{repeat}",
                        model=model,
                        mode="deterministic",
                        arm=arm,
                        repeat=repeat,
                        status="ok",
                        steps=synth.STEPS,
                        warmup=5,
                        batch_size=64,
                        tracer="nsys",
                        step_wall_ns=[round(40e6 * scale)] * synth.STEPS,
                        kernel_ns_per_step=25e6 * scale,
                        settings=synth.settings("deterministic", backend),
                        versions=dict(synth.BACKEND_VERSIONS[backend or "tensorflow"]),
                        device=dict(device or synth.DEVICE),
                        started_at="2025-01-01T00:00:00+00:00",
                        finished_at="2025-01-01T00:00:10+00:00",
                        duration_s=10.0,
                        **on_backend,
                    )
                )


def headline(root: Path) -> dict[str, dict[str, Any]]:
    doc = json.loads(render_report([root], "json"))
    return {f"{m['model']}@{m['device']}": m for m in doc["models"]}


def answer_section(page: str) -> str:
    return page[page.index('<section id="answer">') : page.index('<section id="overhead">')]


def md_answer(text: str) -> str:
    return text[text.index("## Should you turn determinism on?") : text.index("## Overhead by model")]


@pytest.mark.parametrize(
    ("ratios", "expected"),
    [(CHEAP, "cheap"), (EXPENSIVE, "expensive"), (CROSSING, "not settled"), ([1.05], "not settled")],
)
def test_verdict_reads_its_own_interval(ratios: list[float], expected: str) -> None:
    overhead = paired_t(math.log(r) for r in ratios)
    assert overhead is not None
    v = verdict(overhead)
    assert v.reading == expected
    if expected == "cheap":
        assert overhead.ci_high <= CHEAP_OVERHEAD
    if overhead.has_interval and overhead.ci_low <= CHEAP_OVERHEAD < overhead.ci_high:
        assert v.reading == "not settled" and "cheap" not in v.text


def test_not_settled_names_the_repeats_that_would_settle_it() -> None:
    overhead = paired_t(math.log(r) for r in CROSSING)
    assert overhead is not None and overhead.ci_low < 0.6 and overhead.ci_high > 1.7
    needed = repeats_to_read(overhead)
    assert needed is not None
    v = verdict(overhead)
    assert v.text == f"not settled: need about {needed - 3} more repeats"
    assert v.more_repeats == needed - 3 and v.repeats_needed == needed
    at_the_line = verdict(Overhead(1.1, 1.0, 1.21, (math.log(1.05), math.log(1.1), math.log(1.15))))
    assert at_the_line.text == "not settled: at the 1.10x line" and at_the_line.repeats_needed is None
    assert verdict(paired_t([0.05])).text == "not settled: one repeat, no interval"  # type: ignore[arg-type]


def test_a_two_stage_interval_counts_the_repeats_of_its_own_form() -> None:
    """Stein's interval keeps its first stage's spread: the repeats that would settle it are counted with that
    spread, not with the tighter spread of every repeat, which would promise one more repeat where hundreds are due."""
    first = [math.log(r) for r in (0.93, 1.18, 0.97, 1.16)]
    later = [math.log(1.05)] * 7
    overhead = stein_interval([*first, *later], first_stage=4)
    assert overhead is not None and overhead.ci_low < CHEAP_OVERHEAD < overhead.ci_high
    needed = repeats_to_read(overhead)
    plain = repeats_to_read(paired_t([*first, *later]))  # type: ignore[arg-type]
    assert needed is not None and plain is not None and needed > 3 * plain
    mean = sum([*first, *later]) / 11
    for n, settled in ((needed, True), (needed - 1, False)):  # n repeats, the same mean and first stage
        rest = (mean * n - sum(first)) / (n - 4)
        grown = stein_interval([*first, *[rest] * (n - 4)], first_stage=4)
        assert grown is not None and (grown.ci_high <= CHEAP_OVERHEAD) == settled, n


def test_crossing_interval_is_never_cheap_in_html_md_or_json(tmp_path: Path) -> None:
    """The issue's case: [0.548, 1.840] read "cheap and buys little"; every output now says not settled."""
    root = sweep(tmp_path / "res", {"resnet50": CROSSING, "mobilenet": CHEAP})
    stability(root, "resnet50", "t4", accuracy=0.9, churn_impl=0.0)
    stability(root, "mobilenet", "t4", accuracy=0.9, churn_impl=0.05)
    rows = headline(root)
    crossing = rows["resnet50@t4"]
    assert crossing["verdict"] == "not settled"
    assert re.fullmatch(r"not settled: need about \d+ more repeats", crossing["verdict_text"])
    assert crossing["reading"] == "not settled" and "cheap" not in crossing["advice"]
    assert any(c.startswith("Not settled: the 95% CI lies on both sides of 1.10x") for c in crossing["caveats"])
    assert rows["mobilenet@t4"]["verdict"] == "cheap" and rows["mobilenet@t4"]["reading"] == "cheap and worth it"

    page = render_report([root], "html", "cdn")
    answer = answer_section(page)
    row = re.search(r"<tr><td><code>resnet50</code>.*?</tr>", answer, re.S)
    assert row is not None
    assert crossing["verdict_text"] in row.group(0) and ">cheap<" not in row.group(0)
    assert '<span class="verdict not-settled">' in row.group(0)
    tradeoff = page[page.index('<section id="tradeoff">') : page.index('<section id="conditions">')]
    reading = re.search(r"<tr><td><code>resnet50</code>.*?</tr>", tradeoff, re.S)
    assert reading is not None
    assert "cheap and" not in reading.group(0) and "not settled: need about" in reading.group(0)

    text = render_report([root], "md")
    md_row = next(line for line in md_answer(text).splitlines() if line.startswith("| t4 (Tesla T4) | resnet50 |"))
    assert f"**{crossing['verdict_text']}** (from kernel time, n=3)" in md_row and "cheap" not in md_row
    assert "Not settled: the 95% CI lies on both sides of 1.10x" in md_answer(text)
    tradeoff_row = next(line for line in text.splitlines() if line.startswith("| resnet50 | t4 |"))
    assert "not settled: need about" in tradeoff_row and "cheap and" not in tradeoff_row


def test_json_shape(tmp_path: Path) -> None:
    root = sweep(tmp_path / "res", {"smallcnn": CHEAP})
    stability(root, "smallcnn", "t4", accuracy=0.93, churn_impl=0.02)
    doc = json.loads(render_report([root], "json"))
    assert set(doc) >= {"models", "notes", "thresholds", "stability_not_learned", "warnings"}
    (model,) = doc["models"]
    assert model["device"] == "t4" and model["model"] == "smallcnn" and model["verdict"] == "cheap"
    for metric in ("kernel", "wall"):
        interval = model["overhead"][metric]
        assert set(interval) >= {"ratio", "lo", "hi"}
        assert interval["lo"] < interval["ratio"] < interval["hi"] <= CHEAP_OVERHEAD
    assert model["overhead"]["kernel"]["ratio"] == pytest.approx(math.exp(sum(map(math.log, CHEAP)) / 4))
    assert model["noise_floor"] is None and model["calibrated"] is False
    assert model["stability"]["churn_impl"] == 0.02 and model["stability"]["learned"] is True
    assert model["stability"]["std_drop"] == pytest.approx(0.002)
    assert model["metric"] == "kernel" and model["repeats"] == 4 and model["repeats_needed"] is None
    assert model["churn_impl"] == 0.02 and model["reading"] == "cheap and worth it"
    assert isinstance(model["caveats"], list)
    assert any("no calibration ran" in n for n in doc["notes"])


def test_study_that_did_not_learn_is_flagged_and_left_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """mediumcnn_k1 on digits at 15-17% (chance 10%) with churn 0.85 fed the verdict; now it is set apart, with the
    same study trained three times as long to read what it buys."""
    root = sweep(tmp_path / "res", {"mediumcnn_k1": EXPENSIVE, "smallcnn": CHEAP})
    stability(root, "mediumcnn_k1", "t4", accuracy=0.16, churn_impl=0.85)
    stability(root, "smallcnn", "t4", accuracy=0.93, churn_impl=0.02)
    rows = headline(root)
    flat = rows["mediumcnn_k1@t4"]
    assert flat["stability"]["learned"] is False and flat["stability"]["used_in_verdict"] is False
    assert flat["stability"]["accuracy_mean"] == pytest.approx(0.16) and flat["stability"]["chance"] == 0.1
    assert flat["learned"] is False and flat["churn_impl"] is None and flat["reading"] is None
    assert flat["verdict"] == "expensive"
    assert any("did not learn" in c for c in flat["caveats"])
    assert rows["smallcnn@t4"]["reading"] == "cheap and worth it"
    doc = json.loads(render_report([root], "json"))
    assert [s["model"] for s in doc["stability_not_learned"]] == ["mediumcnn_k1"]

    page = render_report([root], "html", "cdn")
    assert "did not learn: mean test accuracy 16.0%, chance 10.0%, learning needs 20%" in answer_section(page)
    stability_section = page[page.index('<section id="stability">') : page.index('<section id="tradeoff">')]
    learned, _, left_out = stability_section.partition("Studies whose models did not learn")
    assert "smallcnn on digits" in learned and "mediumcnn_k1" not in learned
    assert "mediumcnn_k1 on digits, t4: did not learn" in left_out
    retrain = "detprof stability --model mediumcnn_k1 --dataset digits --epochs 180 --runs 3"
    assert f"Train it longer before reading its spread: <code>{retrain}</code> (3x the 60 epochs it ran)" in left_out
    assert doc["stability_not_learned"][0]["advice"].endswith(f"`{retrain}` (3x the 60 epochs it ran)")
    tradeoff = page[page.index('<section id="tradeoff">') : page.index('<section id="conditions">')]
    assert "mediumcnn_k1" not in tradeoff and "smallcnn" in tradeoff
    plotted = re.findall(r'"name":"([^"]+ on t4)"', tradeoff)
    assert set(plotted) == {"smallcnn on t4"}

    text = render_report([root], "md")
    assert "| t4 (Tesla T4) | mediumcnn\\_k1 |" in md_answer(text) and "did not learn (left out)" in md_answer(text)
    assert "**Did not learn**, left out of the verdicts" in text
    assert retrain in advised(text)
    resolve(retrain, tmp_path, capsys)


@pytest.mark.parametrize(("classes", "needed"), [(10, 0.2), (100, 0.11), (2, 0.75), (3, 2 / 3)])
def test_the_learning_rule(classes: int, needed: float) -> None:
    assert learned_threshold(1 / classes) == pytest.approx(needed)
    runs = [{"runs_ok": 2, "accuracy": {"mean": needed - 0.01}}, {"runs_ok": 2, "accuracy": {"mean": needed + 0.01}}]
    assert learning_of(runs, classes).learned is True
    assert learning_of(runs[:1], classes).learned is False
    assert learning_of(runs, None).learned is None


def test_cpu_results_say_op_time_does_not_predict_gpu_cost(tmp_path: Path) -> None:
    root = sweep(tmp_path / "res", {"smallcnn": CHEAP}, device=CPU)
    stability(root, "smallcnn", "cpu", accuracy=0.93, churn_impl=0.0)
    (row,) = headline(root).values()
    assert row["on_cpu"] is True
    assert any(c.startswith("CPU op time: does not predict the GPU cost") for c in row["caveats"])
    assert any("property of TensorFlow's CPU kernels" in c for c in row["caveats"])
    page = html.unescape(answer_section(render_report([root], "html", "cdn")))
    assert "CPU op time does not predict what determinism costs on a GPU" in page
    assert "TensorFlow's CPU kernels giving the same result run to run" in page
    assert "Published GPU reference" in page and "284% -> 746%" in page
    text = md_answer(render_report([root], "md"))
    assert (
        "CPU op time does not predict" in text and "TensorFlow's CPU kernels giving the same result run to run" in text
    )
    assert "| P100 | medium CNN, kernel 1x1 -\\> 7x7 | 284% -\\> 746% |" in text


def test_gpu_results_carry_no_cpu_caveat(tmp_path: Path) -> None:
    root = sweep(tmp_path / "res", {"vgg19": EXPENSIVE})
    (row,) = headline(root).values()
    assert row["on_cpu"] is False and not any("CPU" in c for c in row["caveats"])
    page = render_report([root], "html", "cdn")
    assert "CPU op time" not in page and "Published GPU reference" not in answer_section(page)


def test_noise_floor_from_a_calibration(tmp_path: Path) -> None:
    root = sweep(tmp_path / "res", {"resnet50": EXPENSIVE, "vgg19": CHEAP})
    calibration(root, {"resnet50": [1.01, 0.99, 1.02, 0.98]})
    rows = headline(root)
    from detprof.intervals import noise_floor

    expected = noise_floor(paired_t(math.log(r) for r in [1.01, 0.99, 1.02, 0.98]))  # type: ignore[arg-type]
    assert expected is not None and 0.01 < expected < 0.05
    assert rows["resnet50@t4"]["noise_floor"] == pytest.approx(expected)
    assert rows["resnet50@t4"]["calibrated"] is True
    assert rows["vgg19@t4"]["noise_floor"] is None and rows["vgg19@t4"]["calibrated"] is True
    doc = json.loads(render_report([root], "json"))
    assert not any("no calibration ran" in n for n in doc["notes"])
    page = render_report([root], "html", "cdn")
    assert f"+/-{expected:.1%}" in answer_section(page) and "not in the calibration" in answer_section(page)
    assert "detprof sweep --calibrate (synthetic)" in page[page.index('<section id="provenance">') :]


def test_a_calibration_alone_shows_its_noise_floor_first(tmp_path: Path) -> None:
    """A results folder from ``sweep --calibrate`` alone: the first screen is its A/A table, in every format."""
    root = tmp_path / "res"
    calibration(root, {"resnet50": [1.01, 0.99, 1.02, 0.98]})
    aa = paired_t(math.log(r) for r in [1.01, 0.99, 1.02, 0.98])  # type: ignore[arg-type]
    from detprof.formatting import floor, ratio
    from detprof.intervals import noise_floor
    from detprof.reports.markdown import md

    shown = floor(noise_floor(aa))
    page = answer_section(render_report([root], "html", "cdn"))
    assert "only a calibration" in page and "Noise floor: deterministic against itself" in page
    assert "resnet50" in page and html.escape(ratio(aa)) in page and shown in page
    md_text = md_answer(render_report([root], "md"))
    assert "only a calibration" in md_text and f"| t4 | resnet50 | {md(ratio(aa))} |" in md_text and shown in md_text
    (row,) = json.loads(render_report([root], "json"))["noise_floors"]
    assert row["model"] == "resnet50" and row["device"] == "t4"
    assert row["noise_floor"] == pytest.approx(noise_floor(aa))
    assert row["aa"]["kernel"]["ratio"] == pytest.approx(aa.ratio) and row["aa"]["kernel"]["n"] == 4


def test_beside_a_sweep_the_noise_floor_table_is_under_conditions(tmp_path: Path) -> None:
    root = sweep(tmp_path / "res", {"resnet50": EXPENSIVE})
    calibration(root, {"resnet50": [1.01, 0.99, 1.02, 0.98]})
    page = render_report([root], "html", "cdn")
    conditions = page[page.index('<section id="conditions">') : page.index('<section id="provenance">')]
    assert "Noise floor: deterministic against itself" in conditions
    assert "Noise floor: deterministic against itself" not in answer_section(page)


def test_without_calibration_says_none_ran(tmp_path: Path) -> None:
    root = sweep(tmp_path / "res", {"resnet50": EXPENSIVE})
    page = answer_section(render_report([root], "html", "cdn"))
    assert (
        "not run" in page
        and "No noise floor for t4: no calibration ran; <code>detprof sweep --calibrate --model" in page
    )


def test_every_command_the_report_advises_for_registry_models_resolves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ratios = {"smallcnn": CHEAP, "gpt_tiny": CROSSING}
    config = synth.config(list(ratios), 4, backend="torch", gpu_label="cpu")
    root = synth.write_sweep(tmp_path / "res", config, synth.records(ratios, device=CPU, backend="torch"))
    commands = advised(render_report([root], "md"))
    assert "detprof stability --model gpt_tiny --backend torch" in commands
    assert "detprof sweep --calibrate --models smallcnn,gpt_tiny --backend torch" in commands
    for line in commands:
        resolve(line, tmp_path, capsys)


@pytest.mark.parametrize("fmt", ["json", "md", "html"])
def test_dash_output_is_stdout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    root = sweep(tmp_path / "res", {"resnet50": CROSSING})
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(root), "--format", fmt, "-o", "-", "--plotlyjs", "cdn"]) == 0
    out = capsys.readouterr().out
    assert not (tmp_path / "-").exists()
    if fmt == "json":
        assert json.loads(out)["models"][0]["verdict"] == "not settled"
    elif fmt == "md":
        assert out.startswith("# detprof") and "not settled: need about" in out
    else:
        assert out.startswith("<!DOCTYPE html>") and out.rstrip().endswith("</html>")


def test_json_to_a_file_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = sweep(tmp_path / "res", {"resnet50": CHEAP})
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(root), "--format", "json"]) == 0
    assert json.loads((tmp_path / "report.json").read_text())["models"][0]["verdict"] == "cheap"


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["--format", "xml"], 2, "xml"),
        (["--plotlyjs", "local"], 2, "local"),
        (["-o", "/proc/detprof-report.html"], 3, "cannot write the report"),
    ],
)
def test_bad_options_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], code: int, says: str
) -> None:
    root = sweep(tmp_path / "res", {"resnet50": CHEAP})
    assert main(["report", str(root), *args]) == code
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err and says in err


def test_calibration_record_without_its_arm_is_input_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = sweep(tmp_path / "res", {"resnet50": CHEAP})
    calibration(root, {"resnet50": [1.0, 1.01]})
    path = root / "calibration" / "runs" / "resnet50--a--r0.json"
    record = json.loads(path.read_text())
    del record["arm"]
    path.write_text(json.dumps(record))
    assert main(["report", str(root), "--format", "json", "-o", "-"]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no valid 'arm'" in err


def test_a_generated_language_is_learned_by_its_loss_not_its_accuracy() -> None:
    """Next-token accuracy on a Markov chain is low even when its rules are learned: the loss is what tells."""
    references = (2.35, 4.08)
    learned = [{"runs_ok": 2, "accuracy": {"mean": 0.26}, "cross_entropy": {"mean": 2.79}}]
    frequencies_only = [{"runs_ok": 2, "accuracy": {"mean": 0.26}, "cross_entropy": {"mean": 3.5}}]
    assert learning_of(learned, 64, references).learned is True
    failed = learning_of(frequencies_only, 64, references)
    assert failed.learned is False
    assert failed.line() == (
        "mean held-out loss 3.50 nats, nearer the token frequencies' entropy (4.08) than the language's entropy "
        "rate (2.35)"
    )
    assert learning_of(learned, 64).learned is True  # images' rule: 26% against 1/64's chance


def test_the_stability_study_advised_for_your_own_model_is_on_images_with_the_channels_it_was_swept_on() -> None:
    """The default dataset's images (digits) have one channel: a model of your own swept on three-channel images is
    advised synthetic's, channels last in a Keras or Flax model's input and first in a PyTorch module's; the
    default where it fits (one channel, or token ids: markov), where no built-in dataset does, and for a registry
    model, which the study builds for its dataset."""
    mine = {"model_spec": {"given": "net.py:net"}, "model_api": "torch", "input_shape": [3, 32, 32]}
    assert stability_dataset(mine) == "synthetic"
    assert stability_dataset(mine | {"model_api": "flax", "input_shape": [24, 24, 3]}) == "synthetic"
    assert stability_dataset(mine | {"model_api": "keras", "input_shape": [32, 32, 3]}) == "synthetic"
    assert stability_dataset(mine | {"model_api": "keras", "input_shape": [28, 28, 1]}) is None
    assert stability_dataset(mine | {"input_shape": [1, 28, 28]}) is None
    assert stability_dataset(mine | {"input_shape": [16]}) is None
    assert stability_dataset(mine | {"input_shape": [4, 32, 32]}) is None
    assert stability_dataset({"model_api": "keras", "input_shape": [32, 32, 3]}) is None


def test_no_stability_study_is_advised_for_your_own_model_where_none_can_train_it() -> None:
    """A text classifier (one label per sequence) and a segmentation model (one per pixel) are refused by every
    stability study, as are a tagger that scores fewer positions than it is given and a classifier of feature vectors,
    and an image of channels no built-in dataset has needs a file of one's own: the advice says so, not a command that
    would be refused. A language model and a frame tagger (a label per position), a classifier of images, a registry
    model and a record from before ``labels_shape`` keep the command."""
    mine = {"model_spec": {"given": "net.py:net"}, "model_api": "torch"}
    text = stability_refusal(mine | {"input_shape": [32], "labels_shape": []})
    assert text is not None and "a text classifier's" in text
    pixels = stability_refusal(mine | {"input_shape": [3, 16, 16], "labels_shape": [16, 16]})
    assert pixels is not None and "a segmentation model's" in pixels
    features = stability_refusal(mine | {"input_shape": [20], "input_dtype": "float32", "labels_shape": []})
    assert features is not None and "it takes 20 numbers per example (a feature vector)" in features
    strided = stability_refusal(mine | {"input_shape": [32], "labels_shape": [16]})
    assert strided is not None and "it scores 16 of the 32 positions it is given (a strided tagger's)" in strided
    assert stability_refusal(mine | {"input_shape": [4, 32, 32], "labels_shape": []}) == (
        "no built-in dataset has 4-channel images: a study of it needs --dataset npz:PATH of yours"
    )
    for fits in ({"input_shape": [32], "labels_shape": [32]}, {"input_shape": [3, 32, 32], "labels_shape": []}):
        assert stability_refusal(mine | fits) is None
    assert stability_refusal(mine | {"input_shape": [32]}) is None
    assert stability_refusal({"model_api": "keras", "input_shape": [32], "labels_shape": []}) is None
    said = advice(Verdict("cheap", "cheap", 4, None), None, None, "text.py:classifier", "torch", unstudied=text)
    assert said == f"cheap; no stability study: {text}" and "detprof stability" not in said


def test_what_ran_says_the_precision_a_model_trained_in_where_it_is_not_float32_alone() -> None:
    assert trained_in([{"dtype_policy": "float32"}, {"dtype_policy": "float32"}]) is None
    assert trained_in([{"model": "program"}]) is None
    assert trained_in([{"dtype_policy": "mixed_bfloat16"}]) == "mixed_bfloat16"
    assert trained_in([{"dtype_policy": "float32"}, {"dtype_policy": "mixed_float16"}]) == "float32 and mixed_float16"


def test_the_studies_suggested_for_a_fleets_results_run_on_that_fleet(tmp_path: Path) -> None:
    """A fleet's results read on a laptop: the calibration and stability they suggest name the fleet's ``--ray``,
    or they would measure the laptop."""
    root = sweep(tmp_path / "res", {"resnet50": CHEAP})
    manifest = root / "sweep" / "manifest.json"
    given = json.loads(manifest.read_text())
    manifest.write_text(json.dumps(given | {"command": "detprof sweep --models resnet50 --ray=10.0.0.5:6379"}))
    commands = [c for c in advised(render_report([root], "md")) if "--model" in c]
    assert sorted(c.split()[1] for c in commands) == ["stability", "sweep"]
    assert all(c.endswith(" --ray 10.0.0.5:6379") for c in commands), commands


@pytest.mark.parametrize("loaded_runs", [1, 8])
def test_a_verdict_read_only_from_runs_under_other_load_says_so(tmp_path: Path, loaded_runs: int) -> None:
    """With every run sharing the machine, no quiet pair is left to check the verdict against: its cell says so."""
    records = synth.records({"resnet50": CHEAP})
    load = {"cores": 2, "other_cores": 1.5, "steal_fraction": 0.0}
    shared = [r | {"load": load} if i < loaded_runs else r for i, r in enumerate(records)]
    assert len(shared) == 8
    root = synth.write_sweep(tmp_path / "res", synth.config(["resnet50"], 4), shared)
    text = md_answer(render_report([root], "md"))
    assert "(from kernel time, n=4" in text
    assert ("n=4, every run under other load)" in text) is (loaded_runs == 8), text


def test_the_commands_the_words_name_are_code_in_html_and_markdown(tmp_path: Path) -> None:
    """The advice names a command in backticks: Markdown shows it as inline code, the page as ``<code>``, never as
    backticks; what the span holds is still escaped."""
    from detprof.reports.html import _code_spans

    root = sweep(tmp_path / "res", {"mobilenet": CHEAP})  # no stability study: the advice names the command
    page = render_report([root], "html", "cdn")
    words = re.sub(r"<script.*?</script>", "", page, flags=re.S)
    assert "<code>detprof stability --model mobilenet</code> measures what it buys" in answer_section(page)
    assert "`" not in words
    assert "`detprof stability --model mobilenet` measures what it buys" in render_report([root], "md")
    assert (
        _code_spans("run `a<b` then `c`, not a lone `") == "run <code>a&lt;b</code> then <code>c</code>, not a lone `"
    )
