"""Keras 3 on TensorFlow, JAX and PyTorch: one determinism switch per backend and its tracer (real CPU sweeps on
each backend: tests/test_layers_e2e.py).

What each framework reports in effect is read in a fresh process per case (determinism is
switched before the framework starts and cannot be switched back), and a JAX or PyTorch
worker must not load TensorFlow.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from conftest import SUITE_XLA_FLAGS

from detprof import backends, determinism
from detprof.backends.jax import scatter_expander_default, xla_flags
from detprof.cli import main
from detprof.errors import UsageError
from detprof.options import RunOptions
from detprof.profiler.devices import DeviceChoice
from detprof.profiler.measured_runs import chosen_backend, default_results_dir
from detprof.profiler.tracers import resolve_tracer

PROBE = """
import json, sys
import detprof.profiler.worker  # everything a worker imports before it is switched
from detprof import determinism
settings = determinism.DeterminismSettings({mode!r}, 7, backend={backend!r}, knobs={knobs!r})
effective = determinism.apply(settings)
from detprof.profiler.worker_spec import WorkerSpec
from detprof.profiler.workloads import model_training
params = {{"model": "smallcnn", "input_shape": [16, 16, 3], "classes": 10, "batch_size": 4}}
spec = WorkerSpec("probe", "", settings, 0, 1, 0, 0, "none", None, "", "", params)
step, facts = model_training(spec)
step()
loaded = [m for m in ("tensorflow", "jax", "torch", "sklearn", "pandas") if sys.modules.get(m) is not None]
import sklearn, pandas  # a user's code may import what the framework's and Keras' imports were kept from
print(json.dumps({{"effective": effective, "versions": determinism.software_versions({backend!r}),
                  "facts": facts, "loaded": loaded}}))
"""


def probe(backend: str, mode: str, env: dict[str, str] | None = None, knobs: tuple[str, ...] | None = None) -> dict:
    """Apply ``mode`` (or ``knobs``) on ``backend`` in a fresh process, take one training step, and say what is in
    effect and which frameworks and packages the process loaded (scikit-learn and pandas are imported after)."""
    import os

    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(backend=backend, mode=mode, knobs=knobs)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})},
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


EXPANDER = "--xla_gpu_enable_scatter_determinism_expander"
KEPT_XLA_FLAGS = f"{SUITE_XLA_FLAGS} --xla_cpu_enable_fast_math=false"
USER_XLA_FLAGS = {
    "default": f"{KEPT_XLA_FLAGS} {EXPANDER}=false --xla_gpu_deterministic_ops=true",
    "deterministic": f"{KEPT_XLA_FLAGS} {EXPANDER}=true",
}
"""A user's own ``XLA_FLAGS`` per mode: kept in both, but for the flags of detprof's knobs (a deterministic flag and
the scatter determinism expander they set), which each mode sets as its knobs say: the expander stays at the
installed XLA's default, whatever the user's flags say. The suite's own flag among them, as every process of the
suite has it (``conftest``): without it a probe's step compiled with LLVM's optimisations, 2.3 s more."""


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["jax", "torch"])
@pytest.mark.parametrize("mode", ["default", "deterministic"])
def test_each_backend_reports_determinism_in_effect_exactly_in_deterministic_mode(backend: str, mode: str) -> None:
    """Each knob is read back from the framework as the mode sets it, those that matter only on a GPU too (XLA
    parses its GPU flags, PyTorch keeps cuDNN's settings here; the fill: where deterministic algorithms are on), and
    JAX keeps the user's own XLA flags."""
    found = probe(backend, mode, {"XLA_FLAGS": USER_XLA_FLAGS[mode]} if backend == "jax" else None)
    effective = found["effective"]
    assert effective["backend"] == backend and effective["mode"] == mode
    assert effective["op_determinism"] is (mode == "deterministic")
    assert found["versions"][backend] and found["versions"]["keras"]
    # A JAX or PyTorch worker never loads TensorFlow, whatever Keras probes for, nor what Keras' import would load
    # only because it is installed.
    assert found["loaded"] == [backend]
    mode_knobs = backends.get(backend).mode_knobs() if mode == "deterministic" else frozenset()
    expected = {name: name in mode_knobs for name in backends.get(backend).knob_names()}
    if backend == "torch":
        expected["torch.cudnn_benchmark"] = True
        assert effective["cudnn_deterministic"] is (mode == "deterministic")
        assert effective["cudnn_benchmark"] is False
        assert (effective["cublas_workspace_config"] == ":4096:8") is (mode == "deterministic")
        assert effective["jit_compile"] is False
        assert found["facts"]["train_step"] == "keras train_on_batch (jit_compile=False)"
    else:
        assert effective["jit_compile"] is True
        assert found["facts"]["train_step"] == "keras train_on_batch (jit_compile=True)"
        deterministic = f"{KEPT_XLA_FLAGS} --xla_gpu_deterministic_ops=true"
        assert effective["xla_flags"] == (KEPT_XLA_FLAGS if mode == "default" else deterministic)
        assert effective["scatter_determinism_expander"] is scatter_expander_default()
    assert effective["knobs"] == expected


@pytest.mark.slow
def test_a_tensorflow_worker_loads_tensorflow_alone() -> None:
    """TensorFlow's import loads JAX whenever it is installed, Keras' scikit-learn and pandas: none of them while
    the worker is switched, each importable after."""
    found = probe("tensorflow", "deterministic")
    assert found["effective"]["op_determinism"] is True
    assert found["loaded"] == ["tensorflow"]


@pytest.mark.slow
def test_every_jax_knob_is_read_back_from_xla_as_set_even_those_that_matter_only_on_a_gpu() -> None:
    """Beyond deterministic mode's flag (above), the knobs a knob study may set: XLA parses its GPU flags here too.
    (PyTorch's deterministic mode sets every one of its knobs but the choices of an attention back end and CUDA's
    launch blocking.)"""
    names = backends.get("jax").knob_names()
    torch_knobs = frozenset(backends.get("torch").knob_names())
    assert backends.get("torch").mode_knobs() == torch_knobs - {
        "torch.cuda_launch_blocking",
        "torch.sdpa_math",
        "torch.sdpa_flash",
        "torch.sdpa_efficient",
    }
    found = probe("jax", "deterministic", knobs=names)["effective"]["knobs"]
    assert found == dict.fromkeys(names, True)


def test_xla_flags_replace_only_detprofs_knobs() -> None:
    flags = "--xla_dump_to=/tmp/x --xla_gpu_deterministic_ops=false --xla_gpu_autotune_level=2"
    deterministic = backends.get("jax").mode_knobs()
    assert xla_flags(flags, deterministic) == "--xla_dump_to=/tmp/x --xla_gpu_deterministic_ops=true"
    assert xla_flags(flags, frozenset()) == "--xla_dump_to=/tmp/x"
    assert xla_flags("", frozenset({"jax.xla_gpu_autotune_level"})) == "--xla_gpu_autotune_level=0"
    assert xla_flags("", frozenset()) == ""
    # The scatter expander's knob turns the installed XLA's default around, a user's own setting taken out.
    expander = "--xla_gpu_enable_scatter_determinism_expander"
    turned = "false" if scatter_expander_default() else "true"
    knob = frozenset({"jax.xla_gpu_enable_scatter_determinism_expander"})
    assert xla_flags(f"{expander}={turned} --xla_dump_to=/tmp/x", knob) == f"--xla_dump_to=/tmp/x {expander}={turned}"
    assert xla_flags(f"{expander}={turned}", frozenset()) == ""


def test_an_unknown_or_missing_backend_is_one_line_naming_the_extra(monkeypatch) -> None:
    with pytest.raises(UsageError, match="unknown backend 'mxnet'; choose one of tensorflow, jax, torch"):
        backends.require("mxnet")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    missing = r"--backend torch needs torch, not installed here: pip install 'detprof\[torch\]'"
    with pytest.raises(UsageError, match=missing):
        backends.require("torch")


def test_compiler_switches_belong_to_their_backend() -> None:
    assert chosen_backend(RunOptions(backend="jax")) == "jax"
    with pytest.raises(UsageError, match="JAX always compiles with XLA"):
        chosen_backend(RunOptions(backend="jax", xla=True))
    with pytest.raises(UsageError, match="PyTorch compiles with --compile"):
        chosen_backend(RunOptions(backend="torch", xla=True))
    with pytest.raises(UsageError, match=r"--compile is torch\.compile"):
        chosen_backend(RunOptions(compile=True))
    assert determinism.DeterminismSettings("default", backend="torch", compile=True).jit_compile is True


def test_each_backend_is_traced_by_its_own_profiler_on_a_cpu() -> None:
    for backend, name in (("tensorflow", "tf"), ("jax", "jax"), ("torch", "torch")):
        assert resolve_tracer("auto", False, backend=backend).name == name
    other = "--tracer tf profiles another framework than --backend torch: use --tracer torch"
    with pytest.raises(UsageError, match=other):
        resolve_tracer("tf", False, backend="torch")


def test_results_of_each_backend_go_to_their_own_folder() -> None:
    cpu = DeviceChoice(label="cpu", gpu=None)
    assert default_results_dir(cpu).name.endswith("-cpu")
    assert default_results_dir(cpu, "torch").name.endswith("-cpu-torch")


def test_sweep_refuses_a_backend_it_cannot_run_before_any_worker(tmp_path, capsys) -> None:
    code = main(["sweep", "--backend", "mxnet", "--models", "smallcnn", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "unknown backend 'mxnet'" in err
    assert not (tmp_path / "r").exists()


def test_dry_run_shows_the_backends_switch_and_compiler(capsys) -> None:
    assert main(["sweep", "--dry-run", "--backend", "jax", "--models", "smallcnn", "--gpu", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "backend      jax" in out and "tracer       jax" in out
    assert "XLA_FLAGS+=--xla_gpu_deterministic_ops=true" in out and "jax.jit in both modes" in out


@pytest.mark.slow  # PyTorch in this process
def test_an_attention_knob_leaves_scaled_dot_product_attention_one_back_end_and_the_next_arm_all_of_them() -> None:
    import torch
    from torch.nn import functional

    torch_backend = backends.get("torch")
    q = torch.randn(1, 2, 8, 4, requires_grad=True)
    try:
        for knob, runs in (("torch.sdpa_math", "_scaled_dot_product_attention_math"), (None, "flash_attention")):
            torch_backend.arm_switch(frozenset({knob} if knob else ()))()
            in_effect = torch_backend.knobs_in_effect()
            assert [k for k in ("torch.sdpa_math", "torch.sdpa_flash", "torch.sdpa_efficient") if in_effect[k]] == (
                [knob] if knob else []
            )
            with torch.profiler.profile() as profile:
                functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
            assert any(runs in event.name for event in profile.events()), knob
    finally:
        torch_backend.arm_switch(frozenset())()
