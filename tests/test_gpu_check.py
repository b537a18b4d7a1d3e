"""``make gpu-check``: without a GPU it runs nothing; with one, its checks read what the runs recorded.

No GPU is here, so the checks are shown on records shaped as a GPU sweep writes them (the
boundary a fake may stand in for: what NVML and the tracer would have put in the records),
each check failing for the one thing that is wrong.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from detprof.analysis.verification import Comparison, Difference, ModelVerification
from detprof.doctor.gpu_check import Ran, check_control, check_sweep_records, check_verification, report_step

ROOT = Path(__file__).resolve().parents[1]
UUID = "GPU-0b5c0a3e-0000-0000-0000-000000000000"


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has nvidia-smi")
def test_make_gpu_check_without_a_gpu_says_so_and_installs_nothing(tmp_path: Path) -> None:
    done = subprocess.run(
        ["make", "--no-print-directory", "gpu-check", f"GPU_VENV={tmp_path / 'venv'}", f"GPU_CHECK_OUT={tmp_path}/o"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["gpu-check: no NVIDIA GPU here (nvidia-smi lists none); nothing to check"]
    assert not list(tmp_path.iterdir())


def test_the_check_itself_without_a_gpu_is_one_line_and_exit_0(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "detprof.doctor.gpu_check", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    assert line.startswith("gpu-check: no NVIDIA GPU here (NVML: ") and line.endswith("nothing to check")
    assert not (tmp_path / "out").exists()


def gpu_run(mode: str, repeat: int, measures: str = "both") -> dict[str, Any]:
    """A run record as a torch sweep on the GPU writes it, traced by torch.profiler."""
    return {
        "run_id": f"smallcnn--{mode}--r{repeat}",
        "mode": mode,
        "status": "ok",
        "reason": None,
        "measures": measures,
        "kernel_count": 0 if measures == "wall" else 412,
        "kernel_devices": [] if measures == "wall" else ["NVIDIA H100 80GB HBM3"],
        "settings": {"mode": mode, "op_determinism": mode == "deterministic"},
        "device": {"label": "h100", "uuid": UUID, "cuda_visible_devices": UUID},
        "step_wall_ns": None if measures == "kernel" else [1_000_000] * 20,
    }


def sweep(measures: tuple[str, ...] = ("both",)) -> list[dict[str, Any]]:
    return [gpu_run(mode, r, m) for r in range(3) for mode in ("deterministic", "default") for m in measures]


def test_a_good_gpu_sweep_passes() -> None:
    assert check_sweep_records(sweep(), UUID, wraps_process=False) == []
    assert check_sweep_records(sweep(("kernel", "wall")), UUID, wraps_process=True) == []


def broken(change: str) -> list[dict[str, Any]]:
    records = copy.deepcopy(sweep())
    first = records[0]
    if change == "failed":
        first.update(status="failed", reason="CUDA error: out of memory")
    elif change == "cpu ops":
        for r in records:
            if r["mode"] == "default":
                r["kernel_devices"] = []
    elif change == "determinism":
        first["settings"]["op_determinism"] = False
    elif change == "other gpu":
        first["device"]["uuid"] = "GPU-ffff"
    elif change == "failed before a step":
        first.update(status="failed", reason="IndexError: absl::container_internal::raw_hash_map<>::at")
        first.update(kernel_count=0, kernel_devices=[], step_wall_ns=None)
    elif change == "no wall":
        first["step_wall_ns"] = None
    return records


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ("failed", "smallcnn--deterministic--r0: failed: CUDA error: out of memory"),
        ("cpu ops", "default mode: not every traced run holds GPU kernels"),
        ("determinism", "smallcnn--deterministic--r0: determinism in effect is False in deterministic mode"),
        ("other gpu", f"smallcnn--deterministic--r0: ran on GPU-ffff (CUDA_VISIBLE_DEVICES {UUID})"),
        (
            "failed before a step",
            "smallcnn--deterministic--r0: failed: IndexError: absl::container_internal::raw_hash_map<>::at",
        ),
        ("no wall", "wall time missing: smallcnn--deterministic--r0 timed no untraced steps"),
    ],
)
def test_each_thing_a_gpu_sweep_must_show_is_checked_and_a_failed_run_is_said_once(change: str, problem: str) -> None:
    assert check_sweep_records(broken(change), UUID, wraps_process=False) == [problem]


def test_nsys_runs_need_untraced_runs_beside_them() -> None:
    problems = check_sweep_records(sweep(("kernel",)), UUID, wraps_process=True)
    assert "wall time missing: no untraced steps were timed" in problems
    assert "no untraced run beside the traced ones: wall time would come from traced steps" in problems


def test_no_records_is_a_failure() -> None:
    assert check_sweep_records([], UUID, wraps_process=False) == ["no run was recorded"]


def control(verified: bool, device: str = "h100") -> dict[str, Any]:
    check = {"applicable": True, "verified": verified, "detail": "first differing at conv2d"}
    return {"device": device, "variants": [{"variant": "control", "determinism_check": check}]}


def test_the_control_study_must_be_bitwise_identical_on_the_gpu() -> None:
    assert check_control(control(True)) == []
    assert check_control(control(False)) == ["control runs not bitwise identical: first differing at conv2d"]
    assert check_control(control(True, "cpu")) == ["the study trained on the CPU, not the GPU"]
    assert check_control({"variants": []}) == ["the summary holds no control variant"]


def verification(deterministic: Comparison, device: str = "h100", **more: Any) -> dict[str, Any]:
    """What ``detprof verify --format json`` prints for one model, made by the type that prints it."""
    default = Comparison("default", False, 10, 7, Difference(3, "conv2d", "gradients", 1e-7, True))
    fields: dict[str, Any] = {"findings": [], "failures": []} | more
    model = ModelVerification(
        "smallcnn", "torch", device, "NVIDIA H100", {"deterministic": deterministic, "default": default}, **fields
    )
    return model.to_json()


def test_verify_on_the_gpu_must_hold_bitwise() -> None:
    identical = Comparison("deterministic", True, 10, 7)
    parted = Comparison("deterministic", False, 10, 7, Difference(2, "dense", "output", 3e-8, True))
    refusal = {"op": "max_unpool2d", "message": "no deterministic implementation", "layer": None, "advice": "..."}
    assert check_verification([verification(identical)]) == []
    assert check_verification([verification(parted)]) == [
        "smallcnn: deterministic runs differ (first at step 2, dense)"
    ]
    assert check_verification([verification(parted, side_by_side=("deterministic",))]) == [
        "smallcnn: deterministic runs differ (first at step 2, dense), run side by side"
    ]
    assert check_verification([verification(identical, "cpu")]) == ["smallcnn: verified on the CPU, not the GPU"]
    assert check_verification([verification(identical, findings=[refusal])]) == [
        "smallcnn: max_unpool2d refused determinism"
    ]
    unrun = Comparison("deterministic", None, 0, 0, problem="1 of 2 runs recorded")
    assert check_verification([verification(unrun, failures=["r1: out of memory"])]) == [
        "smallcnn: r1: out of memory",
        "smallcnn: 1 of 2 runs recorded",
    ]


def test_the_report_must_name_the_gpu_and_show_its_telemetry_and_the_published_figures(tmp_path: Path) -> None:
    log = tmp_path / "report.log"
    log.write_text("")
    ran = Ran(["python", "-m", "detprof.cli", "report"], 0, log, 1.0)
    page = tmp_path / "report.html"
    page.write_text("<h3>h100: GPU during the runs</h3> NVIDIA H100 80GB HBM3 <h3>Published figures (Zhuang)</h3>")
    assert report_step(ran, page, "NVIDIA H100 80GB HBM3").ok
    page.write_text("<h3>Published figures</h3>")
    problems = report_step(ran, page, "NVIDIA H100 80GB HBM3").problems
    assert problems == [
        "the report does not show the GPU's name ('NVIDIA H100 80GB HBM3')",
        "the report does not show the GPU's telemetry ('GPU during the runs')",
    ]
