"""``detprof doctor``: ready for the CPU here (a real smoke run), not ready for a T4 (no GPU; nsys shown, optional).

The CPU checks run the real command end to end: its smoke run is a real sweep of smallcnn in
both modes on TensorFlow, traced by TensorFlow's profiler. The GPU checks run against the
GPU boundary only: a fake NVML (``fake_nvml``) and stand-ins for the nsys program on PATH.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fake_nvml import FakeNvml, a100, t4
from script_runner import ROOT

from detprof.doctor.checks import Check, Readiness, readiness
from detprof.profiler import devices

NSYS_VERSION = "2025.3.1.90"


def doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "detprof.cli", "doctor", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        timeout=600,
        check=False,
    )


def by_name(checks: list[dict[str, Any]] | list[Check]) -> dict[str, Any]:
    return {(c["name"] if isinstance(c, dict) else c.name): c for c in checks}


@pytest.fixture(scope="module")
def cpu_answer() -> tuple[int, dict[str, Any]]:
    """``detprof doctor --backend tensorflow --format json`` on this machine: what a user runs before a sweep."""
    done = doctor("--backend", "tensorflow", "--format", "json")
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


@pytest.mark.slow
def test_this_cpu_is_ready_for_the_embedded_default(cpu_answer: tuple[int, dict[str, Any]]) -> None:
    code, answer = cpu_answer
    assert (code, answer["ready"], answer["target"], answer["reason"]) == (0, True, "cpu", "")
    checks = by_name(answer["checks"])
    assert checks["gpu"]["status"] == "skipped" and "the target is the CPU" in checks["gpu"]["detail"]
    assert checks["tensorflow"]["status"] == "ok" and "sees 0 GPUs" in checks["tensorflow"]["detail"]


@pytest.mark.slow
def test_the_smoke_run_is_traced_step_by_step_in_both_modes(cpu_answer: tuple[int, dict[str, Any]]) -> None:
    checks = by_name(cpu_answer[1]["checks"])
    smoke = checks["smoke run (tensorflow)"]
    assert smoke["status"] == "ok", smoke
    assert smoke["detail"].startswith("5 steps of smallcnn under tf in both modes")
    kernels = smoke["detail"].split(": ")[1].split(" ")[0]
    assert all(int(count) > 0 for count in kernels.split("/")), smoke
    assert smoke["detail"].endswith("5/5 step ranges")
    assert checks["determinism (tensorflow)"]["status"] == "ok"


def test_t4_is_not_ready_here_naming_the_gpu_and_nsys_with_their_fixes() -> None:
    done = doctor("--gpu", "t4", "--backend", "tensorflow", env={"PATH": os.path.dirname(sys.executable)})
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    missing = {line.split()[1]: line for line in lines if line.startswith("missing")}
    assert set(missing) == {"gpu", "nsys"} and "(optional); fix:" in missing["nsys"]
    assert "NVML sees no NVIDIA GPU" in missing["gpu"] and "fix: run on a node with T4 GPUs" in missing["gpu"]
    assert "nsys is not on PATH" in missing["nsys"] and "fix: install the Nsight Systems CLI" in missing["nsys"]
    assert lines[-1] == "detprof doctor: not ready for t4"
    # Read from a pipe, as here, every line is one whole check: none wraps onto a line of its own.
    assert {line.split()[0] for line in lines[:-1]} <= {"ok", "missing", "failed", "skipped"}


def test_forced_a_cpu_node_is_ready_for_a_gpu_label_with_the_gpu_checks_shown() -> None:
    done = doctor("--gpu", "t4", "--force", "--no-smoke", "--backend", "tensorflow")
    assert done.returncode == 0, done.stdout + done.stderr
    assert any(line.startswith("missing  gpu") for line in done.stdout.splitlines())
    assert "ready for t4 (forced: GPU checks shown, not enforced)" in done.stdout
    answer = readiness("t4", ["tensorflow"], force=True, smoke=False)
    assert answer.ready and answer.forced and answer.reason() == ""
    assert json.loads(json.dumps(answer.to_dict())) == answer.to_dict()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--gpu", "v101"), "detprof: error: unknown GPU label 'v101'"),
        (("--backend", "tensorflow,mxnet"), "detprof: error: unknown backend 'mxnet'"),
    ],
)
def test_a_wrong_label_or_backend_is_a_usage_error(args: tuple[str, ...], message: str) -> None:
    done = doctor(*args)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [done.stderr.strip()] and done.stderr.startswith(message), done.stderr


def put_on_path(monkeypatch: pytest.MonkeyPatch, folder: Path, name: str, script: str) -> None:
    """A stand-in for a GPU-machine program (nsys, nvprof) on PATH, ahead of anything installed."""
    folder.mkdir(exist_ok=True)
    program = folder / name
    program.write_text(f"#!/bin/sh\n{script}\n")
    program.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")


def on_gpus(monkeypatch: pytest.MonkeyPatch, nvml: FakeNvml) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(devices, "default_nvml", lambda: nvml)


def test_a_t4_node_with_nsys_is_ready_and_nvprof_is_optional(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    on_gpus(monkeypatch, FakeNvml([t4()]))
    put_on_path(monkeypatch, tmp_path, "nsys", f"echo 'NVIDIA Nsight Systems version {NSYS_VERSION}-253135822870v0'")
    answer = readiness("t4", ["tensorflow"], smoke=False)
    checks = by_name(answer.checks)
    assert answer.ready and answer.target == "t4"
    assert checks["gpu"].status == "ok" and "Tesla T4, compute capability 7.5" in checks["gpu"].detail
    assert (checks["nsys"].status, checks["nsys"].detail) == ("ok", f"nsys {NSYS_VERSION}")
    assert (checks["nvprof"].status, checks["nvprof"].required) == ("missing", False)
    assert [checks[n].status for n in ("tensorflow", "determinism (tensorflow)", "smoke run (tensorflow)")] == [
        "skipped"
    ] * 3


def test_a_gpu_node_without_nsys_is_ready_to_trace_with_the_frameworks_profilers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A cloud image's PyTorch or JAX, no nsys (an H200 in gpu-check, 2026-11-26): sweeps trace with the framework's
    own profiler, so the missing nsys is shown with its fix but does not block."""
    on_gpus(monkeypatch, FakeNvml([a100()]))
    monkeypatch.setenv("PATH", str(tmp_path))
    answer = readiness("a100", ["tensorflow"], smoke=False)
    nsys = by_name(answer.checks)["nsys"]
    assert answer.ready, answer.reason()
    assert (nsys.status, nsys.required) == ("missing", False)
    assert "each framework's own profiler" in nsys.detail and nsys.fix.startswith("install the Nsight Systems CLI")


def test_the_wrong_gpu_or_a_broken_nsys_blocks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    on_gpus(monkeypatch, FakeNvml([a100()]))
    put_on_path(monkeypatch, tmp_path, "nsys", "echo 'libcupti.so: cannot open shared object file' >&2; exit 127")
    answer = readiness("t4", ["tensorflow"])
    checks = by_name(answer.checks)
    assert not answer.ready
    assert checks["gpu"].status == "failed" and "the GPU is not T4: NVIDIA A100-SXM4-80GB" in checks["gpu"].detail
    assert checks["nsys"].status == "failed" and "`nsys --version` fails" in checks["nsys"].detail
    assert answer.reason().startswith("gpu failed: the GPU is not T4") and "nsys failed" in answer.reason()
    assert checks["smoke run (tensorflow)"].detail == "needs the smoke run (no usable GPU)"


def test_the_checklist_reads_one_line_per_check() -> None:
    answer = Readiness("cpu", [Check("gpu", "skipped", "the target is the CPU"), Check("x", "failed", "broke", "mend")])
    assert not answer.ready and answer.reason() == "x failed: broke"
    assert Readiness("cpu", [Check("nvprof", "missing", "absent", required=False)]).ready


@pytest.mark.slow
def test_a_failed_smoke_run_blocks_and_keeps_the_workers_logs() -> None:
    """A node whose XLA_FLAGS JAX refuses: its workers crash at start, and the checklist says where their logs are."""
    done = doctor("--backend", "jax", "--format", "json", env={"XLA_FLAGS": "--xla_no_such_flag=1"})
    assert done.returncode == 1, done.stdout + done.stderr
    answer = json.loads(done.stdout)
    checks = by_name(answer["checks"])
    assert checks["jax"]["status"] == "failed" and "Unknown flag in XLA_FLAGS" in checks["jax"]["detail"]
    assert checks["determinism (jax)"]["status"] == "skipped"
    smoke = checks["smoke run (jax)"]
    assert smoke["status"] == "failed" and smoke["fix"].startswith("the workers' logs are in ")
    logs = Path(smoke["fix"].removeprefix("the workers' logs are in "))
    try:
        assert any("Unknown flag in XLA_FLAGS" in log.read_text() for log in logs.glob("*.log"))
    finally:
        shutil.rmtree(logs.parents[1])
    assert answer["reason"].startswith("jax failed: no worker started")


@pytest.mark.parametrize(
    ("backend", "versions", "said"),
    [
        ("jax", {"jax": "0.11.2", "cuda_build": "13", "is_cuda_build": True, "gpus_visible": 1}, "jax 0.11.2 (CUDA 13"),
        ("jax", {"jax": "0.4.30", "is_cuda_build": True, "gpus_visible": 1}, "jax 0.4.30 (CUDA build)"),
        ("jax", {"jax": "0.10.2", "is_cuda_build": False, "gpus_visible": 0}, "jax 0.10.2 (CPU build)"),
    ],
)
def test_the_framework_line_names_the_cuda_build(backend: str, versions: dict[str, Any], said: str) -> None:
    """JAX's CUDA comes as a plugin package (``jax-cuda13-plugin``): a GPU machine's JAX is not called a CPU build."""
    from detprof.doctor.checks import _framework_check

    check = _framework_check(backend, [{"versions": versions}], uses_gpu=False, logs="")
    assert check.detail.startswith(said), check.detail
