"""The decisions of the GPU path that can be checked without a GPU: what nsys is asked to record,
which runs are traced, where wall and kernel time come from, and whether a trace lost the
kernels of the CUDA graphs its process launched (against a real nsys export)."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pandas as pd
import pytest
from fake_nvml import FakeNvml, a100, t4
from fixtures_traces import SHARED_TRACES, real_traces, require_real_traces

from detprof.analysis.overhead import model_overheads
from detprof.cli import main
from detprof.errors import UsageError
from detprof.profiler import devices, tracers
from detprof.profiler.measured_runs import UNTRACED_SUFFIX, PlannedRun, Workload, measured_parts, runs_to_measure
from detprof.profiler.tracers import TRACERS, resolve_tracer
from detprof.records import kernel_table_steps, measured_run
from detprof.reports.provenance import timing_note
from detprof.traces.graphs import cuda_graph_use
from detprof.traces.kernel_table import KERNEL_DTYPES, KernelTable, conform, range_table
from detprof.traces.parsers import load_trace
from detprof.traces.step_split import kernel_ns_by_step, within_steps

NSYS_TRACE = SHARED_TRACES / "nsys-2024.5-cloverleaf-4xA100.sqlite"
needs_nsys_trace = real_traces(NSYS_TRACE)


def fake_which(present: set[str]):
    return lambda name: f"/opt/bin/{name}" if name in present else None


def test_nsys_traces_graph_nodes_and_no_library_apis_unless_asked(monkeypatch) -> None:
    monkeypatch.setattr(tracers.shutil, "which", fake_which({"nsys"}))
    command = resolve_tracer("nsys", gpu_present=True).command(["python", "w"], Path("/r/run"))
    assert "--cuda-graph-trace=node" in command
    assert [a for a in command if a.startswith("--trace=")] == ["--trace=cuda,nvtx"]
    asked = resolve_tracer("nsys", gpu_present=True, api_traces=("cudnn", "cublas", "cudnn"))
    assert "--trace=cuda,nvtx,cudnn,cublas" in asked.command(["python", "w"], Path("/r/run"))


@pytest.mark.parametrize(
    ("choice", "apis", "message"),
    [("nsys", ("cufft",), "unknown --trace-api 'cufft'"), ("tf", ("cudnn",), "--trace-api is for --tracer nsys")],
)
def test_api_traces_are_checked(monkeypatch, choice: str, apis: tuple[str, ...], message: str) -> None:
    monkeypatch.setattr(tracers.shutil, "which", fake_which({"nsys"}))
    with pytest.raises(UsageError, match=message):
        resolve_tracer(choice, gpu_present=True, api_traces=apis)


def test_a_tracer_that_is_not_installed_is_refused_unless_only_planned(monkeypatch) -> None:
    monkeypatch.setattr(tracers.shutil, "which", fake_which(set()))
    with pytest.raises(UsageError, match="not installed"):
        resolve_tracer("nsys", gpu_present=True)
    planned = resolve_tracer("nsys", gpu_present=True, require_installed=False)
    assert not planned.installed
    assert planned.command(["python", "w"], Path("/r/run"), require_installed=False)[0] == "nsys"


def planned(model: str, mode: str, repeat: int) -> PlannedRun:
    return PlannedRun(f"{model}--{mode}--r{repeat}", f"{model} {mode} r{repeat}", mode, repeat, Workload("m:f"), {})


def test_wall_time_is_never_measured_under_a_tracer() -> None:
    plan = [planned("m", "deterministic", 0), planned("m", "default", 0)]
    plan += [planned("m", "default", 1), planned("m", "deterministic", 1)]
    assert measured_parts(TRACERS["tf"]) == ("both",)
    assert [r.measures for r in runs_to_measure(plan, TRACERS["tf"])] == ["both"] * 4
    assert [r.measures for r in runs_to_measure(plan, TRACERS["none"])] == ["wall"] * 4
    for name in ("nsys", "nvprof"):
        runs = runs_to_measure(plan, TRACERS[name])
        assert [(r.run_id, r.measures) for r in runs] == [
            ("m--deterministic--r0", "kernel"),
            ("m--default--r0", "kernel"),
            (f"m--deterministic--r0{UNTRACED_SUFFIX}", "wall"),
            (f"m--default--r0{UNTRACED_SUFFIX}", "wall"),
            ("m--default--r1", "kernel"),
            ("m--deterministic--r1", "kernel"),
            (f"m--default--r1{UNTRACED_SUFFIX}", "wall"),
            (f"m--deterministic--r1{UNTRACED_SUFFIX}", "wall"),
        ]


def test_a_run_steps_untraced_then_traced_as_it_measures() -> None:
    both, kernel, wall = (
        PlannedRun("r", "r", "default", 0, Workload("m:f"), {}, m) for m in ("both", "kernel", "wall")
    )
    assert (both.wall_steps(50), both.traced_steps(50), both.traced) == (50, 50, True)
    assert (kernel.wall_steps(50), kernel.traced_steps(50), kernel.traced) == (0, 50, True)
    assert (wall.wall_steps(50), wall.traced_steps(50), wall.traced) == (50, 0, False)


def record(mode: str, repeat: int, measures: str, wall_ms: float | None, kernel_ms: float | None) -> dict:
    return dict(
        measured_run(
            run_id=f"m--{mode}--r{repeat}" + (UNTRACED_SUFFIX if measures == "wall" else ""),
            mode=mode,
            repeat=repeat,
            model="m",
            status="ok",
            steps=10,
            warmup=1,
            batch_size=8,
            measures=measures,
            tracer="none" if measures == "wall" else "nsys",
            device={"label": "t4"},
            started_at="",
            finished_at="",
            duration_s=1.0,
            step_wall_ns=None if wall_ms is None else [int(wall_ms * 1e6)] * 10,
            traced_step_wall_ns=None if measures == "wall" else [int(3 * (wall_ms or 10) * 1e6)] * 10,
            kernel_ns_per_step=None if kernel_ms is None else kernel_ms * 1e6,
        )
    )


def test_each_metric_pairs_the_runs_that_measured_it() -> None:
    """Traced runs under nsys are slow (the tracer's tax) and must not reach the wall ratio."""
    records = []
    for repeat, drift in enumerate((1.0, 1.1, 0.95)):
        records += [
            record("default", repeat, "kernel", None, 8.0 * drift),
            record("deterministic", repeat, "kernel", None, 12.0 * drift),
            record("default", repeat, "wall", 10.0 * drift, None),
            record("deterministic", repeat, "wall", 11.0 * drift, None),
        ]
    overhead = model_overheads(records)["m"]
    assert overhead.kernel.ratio == pytest.approx(1.5, rel=1e-6)
    assert overhead.wall.ratio == pytest.approx(1.1, rel=1e-6)
    assert overhead.wall.n == overhead.kernel.n == 3
    assert "untraced runs beside them" in timing_note(records)


def test_timing_note_says_which_runs_were_traced() -> None:
    both = record("default", 0, "kernel", 10.0, 8.0) | {"measures": "both", "tracer": "tf"}
    assert timing_note([both]).startswith("Each run timed untraced steps first")
    old = {k: v for k, v in both.items() if k != "measures"}
    assert "measured under the tracer (tf)" in timing_note([old])
    assert timing_note([record("default", 0, "wall", 10.0, None)]).startswith("Not traced")


def kernels(starts: list[int], durations: list[int]) -> pd.DataFrame:
    return conform(
        pd.DataFrame({"name": [f"k{i}" for i in range(len(starts))], "start_ns": starts, "dur_ns": durations}),
        KERNEL_DTYPES,
    )


def test_only_the_kernels_of_the_measured_steps_count() -> None:
    """The settling step after the capture starts lies in no ``step i`` range and is left out."""
    table = KernelTable(
        "t",
        "nsys-sqlite",
        kernels=kernels([5, 15, 25, 35, 45], [1, 2, 3, 4, 5]),
        nvtx=range_table([("settle", 0, 10), ("step 0", 10, 30), ("step 1", 30, 40)]),
    )
    measured = within_steps(table)
    assert measured is not None
    assert measured.kernels["name"].tolist() == ["k1", "k2", "k3"]
    assert kernel_ns_by_step(measured) == kernel_ns_by_step(table) == [5, 4]
    assert within_steps(KernelTable("t", "nvprof-trace-csv", kernels=kernels([1], [1]))) is None
    assert kernel_table_steps({"steps": 10}) == 10
    assert kernel_table_steps({"steps": 10, "kernel_table_steps": 11}) == 11


@pytest.fixture
def nsys_copy(tmp_path) -> Path:
    """A private copy of a real nsys export, so a test may add what a graph-launching process records."""
    copy = tmp_path / "trace.sqlite"
    shutil.copyfile(NSYS_TRACE, copy)
    return copy


def add_graph_launches(path: Path, count: int, name: str = "cuGraphLaunch") -> None:
    with sqlite3.connect(path) as conn:
        (name_id,) = conn.execute("SELECT max(id) + 1 FROM StringIds").fetchone()
        conn.execute("INSERT INTO StringIds (id, value) VALUES (?, ?)", (name_id, name))
        (start,) = conn.execute("SELECT max(start) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()
        conn.executemany(
            "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, globalTid, correlationId, nameId, "
            "returnValue) VALUES (?, ?, 1, 0, 0, ?, 0)",
            [(start + i, start + i + 1, name_id) for i in range(count)],
        )


@needs_nsys_trace
def test_a_trace_without_graphs_passes_the_graph_check() -> None:
    use = cuda_graph_use(load_trace(NSYS_TRACE))
    with sqlite3.connect(f"file:{NSYS_TRACE}?mode=ro", uri=True) as conn:
        (node_kernels,) = conn.execute(
            "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE graphNodeId IS NOT NULL AND graphNodeId != 0"
        ).fetchone()
    assert (use.launches, use.graph_kernels) == (0, node_kernels) == (0, 0)
    assert use.hidden is None and use.record() == {"cuda_graph_launches": 0, "graph_kernel_count": 0}


@needs_nsys_trace
def test_graph_launches_without_their_kernels_make_the_trace_unusable(nsys_copy) -> None:
    add_graph_launches(nsys_copy, 4, "cuGraphLaunch_v10000")
    use = cuda_graph_use(load_trace(nsys_copy))
    assert use.launches == 4 and use.graph_kernels == 0
    assert use.hidden and "--cuda-graph-trace=node" in use.hidden


@needs_nsys_trace
def test_kernels_from_graph_nodes_are_counted(nsys_copy) -> None:
    add_graph_launches(nsys_copy, 2, "cudaGraphLaunch_v10000")
    with sqlite3.connect(nsys_copy) as conn:
        conn.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET graphNodeId = rowid WHERE rowid % 10 = 0")
        (expected,) = conn.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid % 10 = 0").fetchone()
    table = load_trace(nsys_copy)
    use = cuda_graph_use(table)
    assert (use.launches, use.graph_kernels, use.hidden) == (2, expected, None)
    assert table.kernels["graph_node_id"].notna().sum() == expected


def dry_run(monkeypatch, capsys, tmp_path, *args: str) -> tuple[int, str, str]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    code = main(["sweep", "--dry-run", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_dry_run_plans_a_forced_gpu_label_with_a_tracer_that_is_not_installed(monkeypatch, capsys, tmp_path) -> None:
    monkeypatch.setattr(tracers.shutil, "which", fake_which(set()))
    monkeypatch.setattr(devices, "default_nvml", lambda: FakeNvml([]))
    code, out, err = dry_run(
        monkeypatch, capsys, tmp_path, "--gpu", "t4", "--force", "--tracer", "nsys", "--xla", "--models", "smallcnn"
    )
    assert (code, err) == (0, "")
    assert "NOT INSTALLED" in out and "t4 (--force" in out
    assert "--cuda-graph-trace=node" in out and "--trace=cuda,nvtx " in out
    assert "CUDA_VISIBLE_DEVICES=<UUID of the t4 GPU" in out
    assert "jit_compile (XLA) pinned: on in both modes (--xla)" in out
    runs = [line.split(":")[0].split(". ")[1] for line in out.splitlines() if line.startswith("  ") and ". " in line]
    assert runs[:4] == [
        "smallcnn--deterministic--r0",
        "smallcnn--default--r0",
        f"smallcnn--deterministic--r0{UNTRACED_SUFFIX}",
        f"smallcnn--default--r0{UNTRACED_SUFFIX}",
    ]
    assert len(runs) == 4 * 3, "paper preset: 3 repeats, each a traced and an untraced pair"
    assert not list(tmp_path.iterdir()), "a dry run writes nothing"


def test_dry_run_pins_the_chosen_gpu_by_its_uuid(monkeypatch, capsys, tmp_path) -> None:
    monkeypatch.setattr(tracers.shutil, "which", fake_which({"nsys"}))
    monkeypatch.setattr(devices, "default_nvml", lambda: FakeNvml([a100(), t4()]))
    code, out, _ = dry_run(
        monkeypatch, capsys, tmp_path, "--gpu", "t4", "--gpu-index", "1", "--models", "smallcnn", "--repeats", "1"
    )
    assert code == 0
    assert f"CUDA_VISIBLE_DEVICES={t4().uuid}" in out and "TF_FORCE_GPU_ALLOW_GROWTH" not in out
    assert "tracer       nsys" in out and "NOT INSTALLED" not in out and "/opt/bin/nsys profile" in out
    assert "sequential" in out


def test_dry_run_on_the_cpu_shows_the_lockstep_sessions(monkeypatch, capsys, tmp_path) -> None:
    args = ("--gpu", "cpu", "--models", "smallcnn", "--repeats", "2", "--precision", "2%", "--pairing", "processes")
    code, out, _ = dry_run(monkeypatch, capsys, tmp_path, *args)
    assert code == 0
    assert "lockstep" in out and "session.json" in out and "CUDA_VISIBLE_DEVICES" not in out
    assert out.count("wall time from up to 80 untraced steps, then kernel time from up to 80 traced steps") == 4
    assert "as many per phase as take 0.25 s (at most 80)" in out
    assert "within +/-2.0%, as many as its first 2 repeats' spread asks for" in out
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("backend", ["tensorflow", "torch"])
def test_dry_run_of_a_backend_that_switches_between_steps_shows_one_worker_per_repeat(
    monkeypatch, capsys, tmp_path, backend: str
) -> None:
    args = ("--gpu", "cpu", "--backend", backend, "--models", "smallcnn", "--repeats", "2", "--steps", "7")
    code, out, _ = dry_run(monkeypatch, capsys, tmp_path, *args)
    assert code == 0
    assert "in-process: one worker per repeat runs both modes" in out and "lockstep" not in out
    assert out.count("both modes: ") == 2 and "as many per phase" not in out
    assert "smallcnn--deterministic--r0 + smallcnn--default--r0: deterministic + default in turn" in out
    assert "smallcnn--default--r1 + smallcnn--deterministic--r1: default + deterministic in turn" in out
    assert "wall time from 7 untraced steps, then kernel time from 7 traced steps" in out
    code, out, _ = dry_run(monkeypatch, capsys, tmp_path, *args, "--pairing", "processes")
    assert code == 0 and "lockstep: two warm workers per repeat" in out


@pytest.mark.slow
def test_runs_one_after_the_other_measure_wall_untraced_and_kernels_traced(tmp_path) -> None:
    """The GPU's sequential design, run here with TensorFlow's profiler: each run its own worker."""
    from detprof.invocation import Invocation
    from detprof.profiler.devices import DeviceChoice
    from detprof.profiler.measured_runs import MeasurementTarget
    from detprof.profiler.study import MeasuredStudy, run_planned
    from detprof.profiler.sweep_request import SweepConfig
    from detprof.store import ResultsStore
    from detprof.sweep.sweep_runs import plan_runs

    config = SweepConfig(
        models=("smallcnn",), steps=3, warmup=1, repeats=1, batch_size=8, input_size=16, pairing="sequential"
    )
    target = MeasurementTarget(DeviceChoice("cpu", None), TRACERS["tf"], "cpu-small")
    store = ResultsStore(tmp_path, "sweep")
    records = run_planned(
        MeasuredStudy("sweep", plan_runs(config), config, config.manifest(), target, store.root, Invocation("t"))
    )
    assert [r["run_id"] for r in records] == ["smallcnn--deterministic--r0", "smallcnn--default--r0"]
    for rec in records:
        assert rec["status"] == "ok", rec["reason"]
        assert "pairing" not in rec and rec["measures"] == "both"
        assert len(rec["step_wall_ns"]) == len(rec["traced_step_wall_ns"]) == rec["kernel_table_steps"] == 3
        assert len(rec["step_kernel_ns"]) == 3 and rec["kernel_ns_per_step"] > 0


@pytest.mark.parametrize(
    ("trace", "devices"),
    [
        ("tf-bert-3gpu.xplane.pb", ["/device:GPU:4", "/device:GPU:6"]),
        ("kineto-a100-control.json.gz", ["NVIDIA A100-PG509-200"]),
        ("nsys-2024.5-cloverleaf-4xA100.sqlite", ["NVIDIA A100-SXM4-80GB"]),
        ("tf-2.21-cpu-smallcnn.xplane.pb", []),
    ],
)
def test_a_record_names_the_gpus_whose_kernels_its_table_holds(trace: str, devices: list[str]) -> None:
    """What tells a GPU kernel table from a CPU's ops in a record: a CPU-only trace names no device."""
    from detprof.profiler.trace_fields import kernel_devices

    path = SHARED_TRACES / trace
    require_real_traces(path)
    assert kernel_devices(load_trace(path)) == devices
