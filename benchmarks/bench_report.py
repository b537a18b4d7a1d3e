"""Size and render targets of issue 6: a report over 20 models x 2 GPUs stays under 10 MB with
plotly.js embedded, and renders in under 3 s in headless Chromium.

This is a size and rendering benchmark, not a measurement: the results it reports on are
synthesized here, in the documented store format (manifest, one record per run, launch-level
kernel tables, GPU telemetry, a stability summary per GPU), shaped like real ones: about a
hundred and fifty distinct kernels per model with real-looking cuDNN, cuBLAS and Eigen
names (long templated signatures with ``<``, ``>`` and ``&``), determinism swapping some
kernels for others and slowing a few, 3 repeats, 10 steps per run. The GPUs are labelled
t4 and v100 so that the published-figures table matches them.

Render time is from navigation to every plot div holding plotly's SVG, in Debian's
Chromium driven by playwright (never a downloaded browser); the median of 3 page loads.

Run: ``make bench`` or ``python -m benchmarks`` (all benchmarks), or
``python -m benchmarks.bench_report``.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from benchmarks.results import record
from detprof.profiler.telemetry import summarize as summarize_telemetry
from detprof.records import measured_run
from detprof.reports.command import write_report
from detprof.store import ResultsStore
from detprof.traces.kernel_names import short_kernel_name

TARGET_BYTES = 10 * 1024 * 1024
TARGET_RENDER_S = 3.0
PAGE_LOADS = 3
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
MODELS = (
    "vgg16", "vgg19", "resnet50", "resnet101", "resnet152", "densenet121", "densenet201", "inceptionv3",
    "xception", "mobilenet", "mobilenetv2", "efficientnetb0", "nasnetmobile", "mediumcnn_k1", "mediumcnn_k3",
    "mediumcnn_k5", "mediumcnn_k7", "smallcnn", "smallcnn_bn", "resnet18",
)  # fmt: skip
UNSUPPORTED = {
    "nasnetmobile": "Deterministic GPU implementation of unsorted segment reduction op not available.",
}
GPUS: dict[str, dict[str, Any]] = {
    "t4": {"name": "Tesla T4", "compute_capability": "7.5", "sm_count": 40, "memory_bytes": 15_843_721_216,
           "clock": 1590, "power": 70.0, "arch": "sm75"},
    "v100": {"name": "Tesla V100-SXM2-16GB", "compute_capability": "7.0", "sm_count": 80,
             "memory_bytes": 17_179_869_184, "clock": 1530, "power": 300.0, "arch": "volta"},
}  # fmt: skip
REPEATS = 3
STEPS = 10

EIGEN_OPS = ("scalar_sum_op", "scalar_product_op", "scalar_max_op", "scalar_difference_op", "scalar_quotient_op")
CONV_SHAPES = ((64, 64, 3), (128, 128, 3), (256, 256, 3), (512, 512, 3), (128, 64, 1), (256, 128, 1))


def _templates(arch: str, layer: int) -> list[tuple[str, str]]:
    """(name, role) of one layer's kernels; role says what determinism does to it."""
    c_in, c_out, k = CONV_SHAPES[layer % len(CONV_SHAPES)]
    op = EIGEN_OPS[layer % len(EIGEN_OPS)]
    return [
        (
            f"{arch}_xmma_fprop_implicit_gemm_indexed_f32f32_f32f32_f32_nhwckrsc_nchw_tilesize{c_in}x{c_out}x{k * 8}"
            f"_stage1_warpsize2x2x1_g1_tensor16x8x8_execute_kernel__5x_cudnn",
            "same",
        ),
        (
            f"void cudnn::detail::wgrad_alg0_engine<float, 128, 6, 8, {k}, {k}, 5, false, {c_out}>(int, int, int, "
            "float const*, int, float*, float const*, kernel_grad_params, unsigned long long, int, float, int, int, "
            "int, int)",
            "removed",
        ),
        (
            f"void cudnn::detail::wgrad_alg1_engine<float, float, {c_in}, 5, 3, 3, 3, 2, true, true>(int, int, int, "
            "float const*, int, float*, float const*, kernel_grad_params, unsigned long long, int, float, int, int, "
            "int*, kernel_grad_params, int, int)",
            "added",
        ),
        (
            f"void cudnn::detail::dgrad_engine<float, {k * 128}, 6, 7, 3, 3, 5, false>(int, int, int, float const*, "
            "int, float const*, int, float*, kernel_grad_params, unsigned long long, int, unsigned long long, int, "
            "float, int, int, int)",
            "slower",
        ),
        (
            "void Eigen::internal::EigenMetaKernel<Eigen::TensorEvaluator<Eigen::TensorAssignOp<Eigen::TensorMap<"
            "Eigen::Tensor<float, 1, 1, long>, 16, Eigen::MakePointer>, Eigen::TensorCwiseBinaryOp<Eigen::internal::"
            f"{op}<float const, float const>, Eigen::TensorMap<Eigen::Tensor<float const, 1, 1, long>, 16, "
            "Eigen::MakePointer> const, Eigen::TensorMap<Eigen::Tensor<float const, 1, 1, long>, 16, "
            f"Eigen::MakePointer> const> const> const, Eigen::GpuDevice>, long>(Eigen::TensorEvaluator<layer{layer}"
            "> const&, long)",
            "same",
        ),
        (
            f"void tensorflow::functor::BiasGradNHWC_SharedAtomics<float>(int, float const*, float*, int) [{layer}]",
            "removed",
        ),
        (
            "void tensorflow::functor::ColumnReduceKernel<float const*, float*, cub::Sum>(float const*, float*, "
            f"int, int, cub::Sum, std::iterator_traits<float const*>::value_type) [{layer}]",
            "added",
        ),
        (
            f"void cudnn::bn_bw_1C11_singleread<float, 512, true, 1, 2, {layer % 3}>(float, float, float, float, "
            "cudnnTensorStruct, float const*, cudnnTensorStruct, float const*, cudnnTensorStruct, float*, "
            "float const*, float*, float*, float const*, float const*, float, cudnn::reduced_divisor, int, "
            "cudnn::reduced_divisor, cudnn::bnBwPersistentState*, int, float, float, float, int, float, "
            "cudnnStatus_t*, bool)",
            "same",
        ),
        (f"{arch}_sgemm_{c_in}x{c_out}_nn_splitK", "same"),
        (
            f"void tensorflow::functor::SwapDimension1And2InTensor3UsingTiles<unsigned int, 256, 32, 32, false>("
            f"unsigned int const*, tensorflow::functor::Dimension<3>, unsigned int*) [{layer}]",
            "same",
        ),
    ]


def _kernel_frame(
    rng: np.random.Generator, arch: str, layers: int, mode: str, scale: float, slowdown: float
) -> pd.DataFrame:
    """Launch-level kernels of ``STEPS`` steps, in the KernelTable schema."""
    names, durations = [], []
    for layer in range(layers):
        for name, role in _templates(arch, layer):
            if (role == "added" and mode == "default") or (role == "removed" and mode == "deterministic"):
                continue
            base = scale * (1 + layer % 7) * (3.0 if role in ("added", "removed") else 1.0)
            if mode == "deterministic" and role in ("added", "slower"):
                base *= slowdown
            per_step = 1 + layer % 3
            names += [name] * (per_step * STEPS)
            durations += list(rng.normal(base, base * 0.05, per_step * STEPS).clip(min=1000))
    starts = np.cumsum(np.asarray(durations, dtype=np.int64) + 2_000)
    frame = pd.DataFrame(
        {
            "name": pd.Categorical(names),
            "short_name": pd.Categorical([short_kernel_name(n) for n in names]),
            "start_ns": starts,
            "dur_ns": np.asarray(durations, dtype=np.int64),
        }
    )
    for col in ("device_id", "stream_id", "correlation_id", "grid_x", "grid_y", "grid_z", "block_x", "block_y",
                "block_z"):  # fmt: skip
        frame[col] = pd.array([0] * len(frame), dtype="Int64")
    frame["op"] = pd.array([None] * len(frame), dtype="string")
    return frame


def _telemetry(rng: np.random.Generator, gpu: dict[str, Any], throttled: bool) -> dict[str, Any]:
    samples = []
    for i in range(10):
        clock = gpu["clock"] * (0.8 if throttled and i > 6 else 1.0)
        samples.append(
            {
                "t_s": i * 0.2,
                "sm_clock_mhz": clock,
                "max_sm_clock_mhz": gpu["clock"],
                "temperature_c": float(60 + rng.integers(0, 20)),
                "power_w": float(gpu["power"] * rng.uniform(0.7, 0.98)),
                "utilization_pct": 98.0,
                "throttle_reasons": ["sw_power_cap"] if throttled and i > 6 else [],
            }
        )
    return {"samples": samples, "summary": summarize_telemetry(samples)}


def write_sweep(root: Path, label: str, seed: int) -> None:
    gpu = GPUS[label]
    rng = np.random.default_rng(seed)
    store = ResultsStore(root, "sweep")
    config = {
        "models": list(MODELS), "modes": ["default", "deterministic"], "steps": STEPS, "warmup": 5,
        "repeats": REPEATS, "batch_size": 64, "input_size": None, "classes": None, "tracer": "nsys", "xla": False,
        "gpu_label": label, "seed": 0, "preset": "paper",
    }  # fmt: skip
    store.open(
        config, f"detprof sweep --gpu {label} --models {','.join(MODELS)} (synthetic: bench_report)", resume=False
    )
    device = {"label": label, "name": gpu["name"], "uuid": None, "driver": "550.54.15", "cuda_driver": "12.4",
              "compute_capability": gpu["compute_capability"], "sm_count": gpu["sm_count"],
              "memory_bytes": gpu["memory_bytes"]}  # fmt: skip
    versions = {"detprof": "0.1.0", "python": "3.11.9", "tensorflow": "2.21.0", "keras": "3.15.0",
                "cuda_build": "12.5.1", "cudnn_build": "9"}  # fmt: skip
    for index, model in enumerate(MODELS):
        layers = 6 + index % 10
        slowdown = 1.2 + (index % 9) * 0.35
        for repeat in range(REPEATS):
            for mode in ("deterministic", "default"):
                run_id = f"{model}--{mode}--r{repeat}"
                settings = {"mode": mode, "seed": 0, "xla": False, "op_determinism": mode == "deterministic",
                            "jit_compile": False, "cudnn_autotune": True,
                            "deprecated_tf_deterministic_ops_env": None}  # fmt: skip
                day = f"2025-03-0{1 + repeat}"
                identity = {"run_id": run_id, "model": model, "mode": mode, "repeat": repeat, "steps": STEPS,
                            "warmup": 5, "batch_size": 64, "input_shape": [224, 224, 3], "classes": 1000,
                            "tracer": "nsys", "settings": settings, "versions": versions, "device": device,
                            "started_at": f"{day}T10:{index:02d}:00+00:00",
                            "finished_at": f"{day}T10:{index:02d}:40+00:00", "duration_s": 40.0}  # fmt: skip
                if model in UNSUPPORTED and mode == "deterministic":
                    store.write_record(measured_run(**identity, status="unsupported", reason=UNSUPPORTED[model]))
                    continue
                scale = 20_000 * (1 + repeat * 0.01)
                frame = _kernel_frame(rng, gpu["arch"], layers, mode, scale, slowdown)
                kernel_ns = float(frame["dur_ns"].sum()) / STEPS
                wall = kernel_ns * 1.3 + 2e6
                record = measured_run(
                    **identity,
                    status="ok",
                    step_wall_ns=[round(wall)] * STEPS,
                    kernel_ns_per_step=kernel_ns,
                    kernel_count=len(frame),
                    kernel_table=store.write_table(run_id, frame),
                    kernel_table_kind="launches",
                    telemetry=_telemetry(rng, gpu, throttled=label == "t4" and model == "vgg19" and repeat == 1),
                )
                store.write_record(record)


def write_stability(root: Path, label: str, seed: int) -> None:
    """A stability summary of resnet18 on cifar10 in the study's summary.json format."""
    rng = np.random.default_rng(seed)
    store = ResultsStore(root, "stability")
    config = {"model": "resnet18", "dataset": "cifar10", "variants": ["algo+impl", "algo", "impl", "control"],
              "runs": 10, "epochs": 60, "batch_size": 128, "lr": 0.0004, "seed": 0, "keep_weights": False}  # fmt: skip
    store.open({**config, "device": label}, f"detprof stability --model resnet18 --dataset cifar10 --gpu {label}",
               resume=False)  # fmt: skip
    variants = []
    for name, varies, std, churn in (
        ("algo+impl", ["init", "shuffle", "augment", "dropout", "impl"], 0.0031, 0.101),
        ("algo", ["init", "shuffle", "augment", "dropout"], 0.0029, 0.098),
        ("impl", ["impl"], 0.0024, 0.074),
        ("control", [], 0.0, 0.0),
    ):
        stds = list(rng.uniform(0.5, 3.0, 10) * std) if std else [0.0] * 10
        variants.append(
            {
                "variant": name, "varies": varies, "mode": "default" if "impl" in varies else "deterministic",
                "description": f"varies {', '.join(varies) or 'nothing'}", "runs_ok": 10, "runs_failed": 0,
                "failures": [], "accuracy": {"mean": 0.931, "std": std, "std_se": std / 4},
                "cross_entropy": {"mean": 0.25, "std": std, "std_se": std / 4}, "churn": churn,
                "l2": churn * 4, "per_class": {"stds": stds, "max_std": max(stds),
                                               "ratio": max(stds) / std if std else None},
                "subgroups": None, "spearman": 1 - churn, "ensemble_gain": churn / 10, "cka": 1 - churn / 2,
                "distinct_weights": 1 if not varies else 10,
                "determinism_check": {"applicable": not varies, "verified": not varies,
                                      "first_differing_layer": None if not varies else "conv1", "line": ""},
            }
        )  # fmt: skip
    summary = {"kind": "stability", "model": "resnet18", "dataset": "cifar10", "device": label,
               "device_info": {"label": label, "name": GPUS[label]["name"]}, "classes": 10, "config": config,
               "runs_total": 40, "runs_ok": 40, "runs_failed": 0, "determinism": {}, "software": {},
               "variants": variants}  # fmt: skip
    store.write_json("summary.json", summary)


def render_seconds(path: Path) -> tuple[float, list[str]]:
    """Seconds from navigation to every plot drawn, and every request that left the file."""
    from playwright.sync_api import sync_playwright

    outside: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("request", lambda r: None if r.url.startswith(("file:", "data:")) else outside.append(r.url))
            start = time.perf_counter()
            page.goto(path.resolve().as_uri())
            page.wait_for_function(
                "() => { const d = document.querySelectorAll('.plotly-graph-div');"
                " return d.length > 0 && Array.from(d).every(e => e.querySelector('svg.main-svg')); }",
                timeout=60_000,
            )
            return time.perf_counter() - start, outside
        finally:
            browser.close()


TARGET = "a report of 20 models x 2 GPUs, rendered in headless Chromium: < 10 MB, < 3 s, no request outside the file"


def main() -> int:
    print(f"== report: {len(MODELS)} models x {len(GPUS)} GPUs ({', '.join(GPUS)}), synthetic results ==")
    with tempfile.TemporaryDirectory(prefix="detprof-bench-report-") as tmp:
        dirs = []
        for seed, label in enumerate(GPUS):
            root = Path(tmp) / label
            write_sweep(root, label, seed)
            write_stability(root, label, seed)
            dirs.append(root)
        from detprof.reports.command import render_report

        start = time.perf_counter()
        html = render_report(dirs, "html", "embed")
        build_s = time.perf_counter() - start
        report = write_report(dirs[0], Path(tmp) / "one.html")
        path = Path(tmp) / "report.html"
        path.write_text(html, encoding="utf-8")
        size = path.stat().st_size
        loads = [render_seconds(path) for _ in range(PAGE_LOADS)]
        render_s = statistics.median(s for s, _ in loads)
        outside = sorted({u for _, urls in loads for u in urls})
        print(f"report built in {build_s:.1f} s; single-GPU report via write_report: {report.stat().st_size:,} bytes")
        print(f"size: {size:,} bytes ({size / 2**20:.2f} MiB); target < {TARGET_BYTES / 2**20:.0f} MiB")
        print(
            f"render (median of {PAGE_LOADS}): {render_s:.2f} s "
            f"[{', '.join(f'{s:.2f}' for s, _ in loads)}]; target < {TARGET_RENDER_S:.0f} s"
        )
    checks = {
        f"size {size / 2**20:.2f} MiB < {TARGET_BYTES / 2**20:.0f} MiB": size < TARGET_BYTES,
        f"render {render_s:.2f} s < {TARGET_RENDER_S:.0f} s": render_s < TARGET_RENDER_S,
        f"no request outside the file ({len(outside)} made)": not outside,
    }
    return record("bench_report", TARGET, checks)


if __name__ == "__main__":
    sys.exit(main())
