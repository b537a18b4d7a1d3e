"""``detprof gpu-study``: the plan a GPU lease gets, and its whole pipeline run here at tiny sizes.

The study runs as a user runs it, in two windows: the first with a budget that stops its first
part (SIGTERM at the window's end: its completed runs kept) and leaves every other part, the second
``--resume`` finishing everything on PyTorch and JAX. What it wrote is read as ``detprof report``
reads a bundle on another machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

from detprof import bundle, cli
from detprof.analysis.overhead import model_overheads
from detprof.errors import ExitCode, InputError
from detprof.gpu_study.plan import SCALES, Costs, StudyPlan, build_plan
from detprof.gpu_study.state import StudyState
from detprof.gpu_study.study import Prepared, failed_in_one_process, gpu_checks
from detprof.reports.command import render_report
from detprof.store import ResultsStore

Capture = pytest.CaptureFixture[str]
TINY = ["gpu-study", "--scale", "tiny", "--backends", "torch,jax"]
FIRST_WINDOW_S = 52
"""A window whose parts get 2 s: 52 less the 30 s kept for the report and bundle and the 20 s grace a stopped part
gets, so its first part is stopped, whatever this machine's speed."""


H100_STUDY = Path(__file__).resolve().parents[1] / "reference" / "h100-2026-11-28" / "gpu-study.zip"
"""The bundle ``make gpu-study`` brought back from an H100 in two windows."""


def plan_of(state: StudyState) -> StudyPlan:
    return build_plan(
        SCALES[state.scale],
        state.backends,
        600.0,
        Costs(),
        on_gpu=False,
        knob_models=state.knob_models,
        apart_models=state.apart_models,
    )


def detprof(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "detprof.cli", *map(str, args)]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=1200, check=False)


def test_the_dry_run_for_an_h100_lists_every_part_its_expected_time_and_what_later_windows_take(
    capsys: Capture, tmp_path: Path
) -> None:
    code = cli.main(["gpu-study", "--dry-run", "--gpu", "h100", "--backends", "torch,jax", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == ExitCode.OK, out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert list(lines) == [
        "torch-overhead-first",
        "jax-overhead-first",
        "torch-overhead-rest",
        "jax-overhead-rest",
        "torch-knobs",
        "jax-knobs",
        "torch-stability-smallcnn",
        "torch-stability-gpt_tiny",
        "jax-stability-smallcnn",
        "jax-stability-gpt_tiny",
        "torch-verify",
        "jax-verify",
    ]
    # The most valuable answer first, on both frameworks, in the first window: the medium CNN at 1..7 and a GPT.
    for backend in ("torch", "jax"):
        first = lines[f"{backend}-overhead-first"]
        assert "this window" in first
        assert "--models mediumcnn_k1,mediumcnn_k3,mediumcnn_k5,mediumcnn_k7,gpt_small" in first
        assert "measured on NVIDIA H100 80GB HBM3, 2026-11-28" in first
        rest = lines[f"{backend}-overhead-rest"]
        assert "a later window" in rest
        assert "moe_small,vit_small,vgg19,resnet50,densenet121,mobilenet,efficientnetb0" in rest
    # Expected seconds from what the H100 measured last: JAX's medium CNNs took 11-19 s a repeat, PyTorch's 28-29 s
    # and its gpt_small 32 s; JAX's gpt_small, which failed there, estimated at 30 s.
    expected = {name: float(line.split()[1]) for name, line in lines.items()}
    assert expected["jax-overhead-first"] < expected["torch-overhead-first"]
    assert "for 4 of 5" in lines["jax-overhead-first"] and "for 4 of 5" not in lines["torch-overhead-first"]
    assert (expected["jax-overhead-first"] - 4) / 2 == pytest.approx(19.1 + 11.2 + 13.0 + 14.4 + 30.0, abs=0.6)
    assert (expected["torch-overhead-first"] - 4) / 2 == pytest.approx(29.0 + 29.2 + 27.5 + 27.7 + 31.5, abs=0.6)
    assert "a window of 600 s" in out
    assert "10 left for later windows" in out


def test_a_plan_of_one_window_bounds_the_repeats_its_overhead_parts_add_for_precision() -> None:
    plan = build_plan(SCALES["gpu"], ["jax"], 1800.0, Costs(), on_gpu=True, knob_models={}, apart_models={})
    first = plan.parts[0]
    assert first.name == "jax-overhead-first"
    budget = first.options[first.options.index("--budget") + 1]
    assert budget == f"{round(1800 * 0.55 / 2 - first.estimate_s)}s"
    assert plan.not_run == {}


def test_models_whose_pairs_failed_in_one_process_are_rerun_a_process_per_mode_after_the_overhead_parts() -> None:
    with bundle.unpacked([H100_STUDY]) as (h100,):
        # On the H100, XLA failed gpt_small's and moe_small's deterministic steps compiled in one process with the
        # default one; the medium CNNs and the Keras applications ran.
        assert failed_in_one_process([h100 / "jax-overhead-first", h100 / "jax-overhead-rest"]) == [
            "gpt_small",
            "moe_small",
        ]
        assert failed_in_one_process([h100 / "torch-overhead-first"]) == []
        # The report's note on them names the same fix, read from the records as every report reads them.
        records = ResultsStore(h100 / "jax-overhead-first", "sweep").records()
        note = model_overheads(records)["gpt_small"].failure_note()
        assert note is not None and note.endswith("(fix: --pairing processes runs each mode in a process of its own)")
    apart = {"torch": [], "jax": ["gpt_small", "moe_small"]}
    plan = build_plan(SCALES["gpu"], ["torch", "jax"], 600.0, Costs(), on_gpu=True, knob_models={}, apart_models=apart)
    names = [part.name for part in plan.parts]
    assert names[:5] == [
        "torch-overhead-first",
        "jax-overhead-first",
        "torch-overhead-rest",
        "jax-overhead-rest",
        "jax-overhead-apart",
    ]
    rerun = plan.parts[4]
    assert rerun.models == ("gpt_small", "moe_small")
    assert " --pairing processes " in f" {' '.join(rerun.argv('folder'))} "


def dry_run(capsys: Capture, out: Path) -> dict[str, str]:
    code = cli.main(["gpu-study", "--dry-run", "--gpu", "h100", "--backends", "jax,torch", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == ExitCode.OK, printed
    return {line.split()[0]: line for line in printed.splitlines() if line.startswith("  ")}


def test_the_h100_study_continues_with_what_its_stopped_part_has_left(capsys: Capture, tmp_path: Path) -> None:
    fresh = dry_run(capsys, tmp_path / "fresh")
    with zipfile.ZipFile(H100_STUDY) as archive:
        (tmp_path / "gpu-study.json").write_bytes(archive.read("gpu-study.json"))
    continued = dry_run(capsys, tmp_path)
    assert "done" in continued["jax-overhead-first"] and "done" in continued["torch-overhead-first"]
    # jax-overhead-rest ran 266 s before its window ended: its completed runs are kept, so that much comes off.
    left_s, whole_s = (float(lines["jax-overhead-rest"].split()[1]) for lines in (continued, fresh))
    assert left_s == pytest.approx(whole_s - 265.7, abs=1)
    assert "this window" in continued["jax-overhead-rest"]


def test_without_a_gpu_the_study_says_what_to_run_instead_in_one_line(capsys: Capture, tmp_path: Path) -> None:
    code = cli.main(["gpu-study", "--out", str(tmp_path / "study")])
    err = capsys.readouterr().err.strip()
    assert code == ExitCode.USAGE
    assert len(err.splitlines()) == 1
    assert "no NVIDIA GPU here" in err and "--scale tiny" in err and "--dry-run --gpu h100" in err
    code = cli.main(["gpu-study", "--scale", "tiny", "--resume", "--out", str(tmp_path / "none")])
    assert code == ExitCode.USAGE
    assert "holds no GPU study to continue" in capsys.readouterr().err


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The tiny study in two windows: one stopped by its budget, one resumed to the end."""
    base = tmp_path_factory.mktemp("gpu-study")
    out = base / "study"
    started = time.monotonic()
    first = detprof(*TINY, "--budget", f"{FIRST_WINDOW_S}s", "--out", out, cwd=base)
    first_s = time.monotonic() - started
    after_first = StudyState.load(out)
    second = detprof("gpu-study", "--resume", "--budget", "15m", "--out", out, "--bundle-to", base / "home", cwd=base)
    return {"out": out, "base": base, "first": first, "first_s": first_s, "after_first": after_first, "second": second}


@pytest.mark.slow
def test_a_window_stops_its_running_part_at_its_budget_and_leaves_the_rest_for_resume(study: dict[str, Any]) -> None:
    first, state = study["first"], study["after_first"]
    assert first.returncode == ExitCode.OK, first.stderr
    assert study["first_s"] < FIRST_WINDOW_S + 10  # the process's own start and exit aside, within its budget
    assert state is not None
    stopped = state.parts["torch-overhead-first"]
    assert (stopped.status, stopped.exit_code, stopped.window) == ("stopped", ExitCode.TERMINATED, 1)
    window = state.windows[0]
    assert window.ran == ["torch-overhead-first"]
    assert window.left["torch-overhead-first"] == "stopped at the window's end (its completed runs kept)"
    assert window.left["jax-verify"] == "the window's budget was spent"
    assert len(window.left) == 7  # every part of the plan
    assert "parts left" in first.stdout and "--resume" in first.stdout
    assert (study["out"] / "study.zip").exists()  # a window that measured almost nothing still leaves its bundle


@pytest.mark.slow
def test_resume_runs_every_part_on_pytorch_and_jax_and_each_part_answers(study: dict[str, Any]) -> None:
    out, second = study["out"], study["second"]
    assert second.returncode == ExitCode.OK, second.stdout + second.stderr
    assert "every part done" in second.stdout
    state = StudyState.load(out)
    assert state is not None
    assert {name: p.status for name, p in state.parts.items()} == {
        name: "done"
        for name in (
            "torch-overhead-first",
            "jax-overhead-first",
            "torch-knobs",
            "torch-stability-smallcnn",
            "jax-stability-smallcnn",
            "torch-verify",
            "jax-verify",
        )
    }
    assert state.parts["torch-overhead-first"].window == 2
    assert all(p.seconds > 0 and p.estimate_s > 0 for p in state.parts.values())
    # The knob study took the model whose determinism cost most in this study's own overhead parts (its one model).
    assert state.knob_models == {"torch": "gpt_tiny"}
    # Every pair ran in one process, so no model is rerun a process per mode.
    assert state.apart_models == {"torch": [], "jax": []}
    summary = (out / "summary.md").read_text()
    assert "| jax-knobs | | | | not run: no knob of jax studied can matter on a CPU" in summary
    assert summary.rstrip().endswith("Done.")
    # The suite sets JAX_COMPILATION_CACHE_DIR (conftest): JAX's verification and stability runs compiled regardless.
    for part, kind in (("jax-verify", "verify"), ("jax-stability-smallcnn", "stability")):
        compiled = {
            json.loads(p.read_text()).get("compilation_cache") for p in (out / part / kind / "runs").glob("*.json")
        }
        assert compiled == {"off"}, part
    for backend in ("torch", "jax"):
        records = [json.loads(p.read_text()) for p in (out / f"{backend}-overhead-first/sweep/runs").glob("*.json")]
        assert {(r["model"], r["mode"], r["status"]) for r in records} == {
            ("gpt_tiny", mode, "ok") for mode in ("default", "deterministic")
        }
        summary_json = json.loads((out / f"{backend}-stability-smallcnn/stability/summary.json").read_text())
        variants = {v["variant"]: v for v in summary_json["variants"]}
        assert set(variants) == {"impl", "control"}
        assert variants["control"]["determinism_check"]["verified"] is True
    # make gpu-check's checks read each part's results: here, on a CPU, they find no GPU kernels.
    prepared = Prepared(plan_of(state), state, "cpu", "GPU-none")
    problems = gpu_checks(prepared, out)
    assert "torch-overhead-first: default mode: not every traced run holds GPU kernels" in problems
    assert "jax-stability-smallcnn: the study trained on the CPU, not the GPU" in problems
    machine = json.loads((out / "machine" / "window-2.json").read_text())
    assert machine["packages"]["torch"] and machine["packages"]["jax"] and machine["python"]


@pytest.mark.slow
def test_the_bundle_is_within_16_mib_and_reports_as_the_folder_does(study: dict[str, Any]) -> None:
    out, base = study["out"], study["base"]
    path = base / "home" / "study.zip"
    assert bundle.is_bundle(path)
    assert path.stat().st_size <= bundle.LIMIT_BYTES
    with zipfile.ZipFile(path) as archive:
        names = set(archive.namelist())
        said = json.loads(archive.read(bundle.MARKER))
    assert {"gpu-study.json", "summary.md", "report.html", "machine/window-2.json"} <= names
    assert not any(name.endswith(".zip") for name in names)
    assert said["files"] == len(names) - 1
    from_bundle = detprof("report", path, "--format", "json", "-o", "-", cwd=base)
    assert from_bundle.returncode == 0, from_bundle.stderr
    read, kept = json.loads(from_bundle.stdout), json.loads(render_report([out], "json"))
    assert read["sources"] == [str(path)]
    for key in ("generated_at", "sources"):
        read.pop(key), kept.pop(key)
    assert read == kept
    assert {m["backend"] for m in read["models"]} == {"torch", "jax"}
    assert {(v["backend"], v["model"]) for v in read["verification"]} == {("torch", "gpt_tiny"), ("jax", "gpt_tiny")}
    assert all(v["deterministic"]["identical"] for v in read["verification"])
    assert [k["backend"] for k in read["knobs"]] == ["torch"]


def test_a_bundle_over_its_limit_leaves_out_the_bulk_smallest_first(tmp_path: Path) -> None:
    folder = tmp_path / "res"
    (folder / "sweep" / "traces").mkdir(parents=True)
    (folder / "sweep" / "runs").mkdir()
    (folder / "sweep" / "runs" / "a.json").write_text("{}")
    rng = __import__("random").Random(0)
    for name, size in (("small.json", 10_000), ("large.json", 200_000)):
        (folder / "sweep" / "traces" / name).write_bytes(rng.randbytes(size))
    packed = bundle.write(folder, tmp_path / "b.zip", limit=120_000)
    assert packed.left_out == ["sweep/traces/large.json"]
    with zipfile.ZipFile(packed.path) as archive:
        assert set(archive.namelist()) == {"sweep/runs/a.json", "sweep/traces/small.json", bundle.MARKER}
    assert not bundle.is_bundle(folder / "sweep" / "runs" / "a.json")


def test_a_bundle_entry_pointing_outside_it_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "evil.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(bundle.MARKER, "{}")
        archive.writestr("../outside.json", "{}")
    with pytest.raises(InputError, match="points outside it"), bundle.unpacked([path]):
        pass
    assert not (tmp_path / "outside.json").exists()
