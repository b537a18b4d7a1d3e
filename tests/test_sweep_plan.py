"""The sweep's plan, tracer command lines and worker settings, without running TensorFlow."""

from __future__ import annotations

from pathlib import Path

import pytest

from detprof.errors import UsageError
from detprof.profiler import tracers
from detprof.profiler.sweep_request import FP16_ON_A_CPU, SweepConfig
from detprof.profiler.tracers import TRACERS, resolve_tracer
from detprof.sweep.sweep_runs import plan_runs


def test_modes_are_interleaved_repeat_by_repeat_and_their_order_counterbalanced() -> None:
    plan = plan_runs(SweepConfig(models=("smallcnn", "resnet18"), repeats=2))
    assert [(r.fields["model"], r.mode, r.repeat) for r in plan] == [
        ("smallcnn", "deterministic", 0),
        ("smallcnn", "default", 0),
        ("resnet18", "deterministic", 0),
        ("resnet18", "default", 0),
        ("smallcnn", "default", 1),
        ("smallcnn", "deterministic", 1),
        ("resnet18", "default", 1),
        ("resnet18", "deterministic", 1),
    ]
    assert plan[0].run_id == "smallcnn--deterministic--r0"


def test_manifest_ignores_the_run_timeout() -> None:
    a = SweepConfig(models=("smallcnn",), run_timeout_s=10)
    b = SweepConfig(models=("smallcnn",), run_timeout_s=99)
    assert a.manifest() == b.manifest()
    assert a.manifest()["modes"] == ["default", "deterministic"]


def fake_which(present: set[str]):
    return lambda name: f"/opt/bin/{name}" if name in present else None


def test_nsys_command_line_traces_only_the_capture_range(monkeypatch) -> None:
    monkeypatch.setattr(tracers.shutil, "which", fake_which({"nsys"}))
    cmd = TRACERS["nsys"].command(["python", "-m", "w"], Path("/r/traces/run"))
    assert cmd[:2] == ["/opt/bin/nsys", "profile"]
    assert "--capture-range=cudaProfilerApi" in cmd and "--capture-range-end=stop" in cmd
    assert "--export=sqlite" in cmd and "--output=/r/traces/run" in cmd
    assert any(a.startswith("--trace=") and "nvtx" in a and "cuda" in a for a in cmd)
    assert cmd[-3:] == ["python", "-m", "w"]
    assert TRACERS["nsys"].trace_path(Path("/r/traces/run")) == Path("/r/traces/run.sqlite")
    assert TRACERS["nsys"].wraps_process and isinstance(TRACERS["nsys"], tracers.Nsys)


def test_nvprof_command_line_starts_with_profiling_off(monkeypatch) -> None:
    monkeypatch.setattr(tracers.shutil, "which", fake_which({"nvprof"}))
    cmd = TRACERS["nvprof"].command(["python", "w"], Path("/r/t/run"))
    assert cmd[:3] == ["/opt/bin/nvprof", "--profile-from-start", "off"]
    assert "--print-gpu-trace" in cmd and "--csv" in cmd
    assert cmd[cmd.index("--log-file") + 1] == "/r/t/run.csv"
    assert TRACERS["tf"].command(["python", "w"], Path("/x")) == ["python", "w"]


def test_auto_tracer_choice(monkeypatch) -> None:
    monkeypatch.setattr(tracers.shutil, "which", fake_which({"nsys"}))
    assert resolve_tracer("auto", gpu_present=True).name == "nsys"
    assert resolve_tracer("auto", gpu_present=False).name == "tf"
    monkeypatch.setattr(tracers.shutil, "which", fake_which(set()))
    assert resolve_tracer("auto", gpu_present=True).name == "tf"
    with pytest.raises(UsageError, match="not installed"):
        resolve_tracer("nvprof", gpu_present=True)
    monkeypatch.setattr(tracers.shutil, "which", fake_which({"nsys"}))
    with pytest.raises(UsageError, match="no GPU"):
        resolve_tracer("nsys", gpu_present=False)


@pytest.mark.parametrize(("field", "value"), [("steps", 0), ("repeats", 0), ("batch_size", 0), ("warmup", -1)])
def test_config_rejects_non_positive_values(field: str, value: int) -> None:
    with pytest.raises(UsageError, match="must be at least"):
        SweepConfig(models=("smallcnn",), **{field: value})


def test_float16_on_a_cpu_under_pytorch_is_said_before_its_slow_steps() -> None:
    """PyTorch's CPU runs a float16 convolution two orders of magnitude slower than float32: a sweep of a few steps
    took 9 min here. The sweep says why before it starts; bfloat16, a GPU and the other frameworks are not slowed."""
    warned = SweepConfig(models=("smallcnn",), amp="fp16", backend="torch", gpu_label="cpu").model_warnings()
    assert warned == [FP16_ON_A_CPU]
    for quiet in ({"amp": "bf16", "backend": "torch"}, {"amp": "fp16", "backend": "jax"}):
        assert SweepConfig(models=("smallcnn",), gpu_label="cpu", **quiet).model_warnings() == []
    assert SweepConfig(models=("smallcnn",), amp="fp16", backend="torch", gpu_label="h100").model_warnings() == []
