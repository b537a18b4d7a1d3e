"""JAX profiler traces (XSpace) -> KernelTable: XLA:CPU thunks from real runs, XLA:GPU kernels as XLA writes them.

The CPU traces are written here by real ``jax.profiler`` runs, in a fresh interpreter (Keras
picks its backend at import, and this process may hold Keras on TensorFlow). Expected
values come from walking the protobuf messages plainly (detprof's runtime XSpace classes,
which ``test_parse_xplane`` holds to TensorFlow's generated ones), and nesting is resolved
by brute force, not by the parser's stack. The GPU cases: an XSpace built here the way XLA's GPU
tracer writes one (``_xla_gpu_space``), and two real ones, ``tests/data/h200-jax/``: detprof's own
sweep of ``smallcnn`` (32x32, batch 32) on an NVIDIA H200 in ``make gpu-check`` on 2026-11-26, JAX 0.11.2
with CUDA 13, in each mode, as the sweep's traced run wrote them.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fixtures_traces import SHARED_TRACES, present_real_traces
from script_runner import ROOT, run_script

from detprof.backends.base import step_range_name
from detprof.cli import main
from detprof.errors import InputError
from detprof.traces.classify import classify
from detprof.traces.kernel_table import KERNEL_DTYPES
from detprof.traces.parsers import load_trace
from detprof.traces.parsers.xspace_schema import xspace_class
from detprof.traces.step_split import kernel_ns_by_step, within_steps

STEPS = 3
XSpace = xspace_class()

# Run with ``python -c`` as: LOGDIR {jax,keras}. The tracing calls are the ones detprof's
# worker makes around its measured steps.
TRACE_STEPS = """
import sys

import jax
import jax.numpy as jnp
import numpy as np

from detprof.backends.base import step_range_name

logdir, kind = sys.argv[1:]
rng = np.random.default_rng(0)
x = rng.normal(size=(4, 8, 8, 3)).astype("float32")
if kind == "keras":
    import keras

    model = keras.Sequential(
        [
            keras.Input((8, 8, 3)),
            keras.layers.Conv2D(4, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(3),
        ]
    )
    model.compile(
        optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=True
    )
    y = np.arange(4) % 3

    def step():
        return model.train_on_batch(x, y)

else:

    def loss(params, x):
        dims = ("NHWC", "HWIO", "NHWC")
        h = jax.lax.conv_general_dilated(x, params["k"], (1, 1), "SAME", dimension_numbers=dims)
        h = jax.nn.relu(h).reshape(x.shape[0], -1) @ params["w"]
        h, _ = jax.lax.scan(lambda c, _: (jnp.tanh(c @ params["r"]), None), h, None, length=3)
        return jnp.mean(h**2)

    @jax.jit
    def train_step(params, x):
        grads = jax.grad(loss)(params, x)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)

    params = {
        "k": rng.normal(size=(3, 3, 3, 8)).astype("float32"),
        "w": rng.normal(size=(8 * 8 * 8, 16)).astype("float32") * 0.05,
        "r": rng.normal(size=(16, 16)).astype("float32") * 0.1,
    }

    def step():
        global params
        params = train_step(params, x)
        return params

jax.block_until_ready(step())  # compiled before the trace starts
options = jax.profiler.ProfileOptions()
options.python_tracer_level = 0
jax.profiler.start_trace(logdir, profiler_options=options)
try:
    for i in range({steps}):
        with jax.profiler.TraceAnnotation(step_range_name(i)):
            jax.block_until_ready(step())
finally:
    jax.profiler.stop_trace()
""".replace("{steps}", str(STEPS))


def _trace(logdir: Path, kind: str) -> Path:
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "2"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-c", TRACE_STEPS, str(logdir), kind],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return logdir


@pytest.fixture(scope="module")
def jax_logdir(tmp_path_factory) -> Path:
    """What ``jax.profiler.start_trace(DIR)`` leaves in DIR after 3 steps of a jitted conv/matmul/scan/grad step."""
    return _trace(tmp_path_factory.mktemp("jax-profile") / "trace", "jax")


def _space(logdir: Path) -> Any:
    [file] = logdir.glob("plugins/profile/*/*.xplane.pb")
    space = XSpace()
    space.ParseFromString(file.read_bytes())
    return space


def _stat(plane, event, name: str) -> object:
    for stat in event.stats:
        if plane.stat_metadata[stat.metadata_id].name == name:
            kind = stat.WhichOneof("value")
            return plane.stat_metadata[stat.ref_value].name if kind == "ref_value" else getattr(stat, kind)
    return None


def _thunks(space) -> list[tuple[Any, int, int, str]]:
    """(line, start ps, end ps, hlo_op) of every host event with an ``hlo_op`` stat, all lines."""
    [host] = [p for p in space.planes if p.name == "/host:CPU"]
    out = []
    for line in host.lines:
        for event in line.events:
            hlo_op = _stat(host, event, "hlo_op")
            if hlo_op is not None:
                start = line.timestamp_ns * 1000 + event.offset_ps
                out.append((line, start, start + event.duration_ps, hlo_op))
    return out


def _self_times(thunks: list[tuple[Any, int, int, str]]) -> list[tuple[str, int, int]]:
    """(hlo_op, start ns, self time ns): duration less the thunks directly inside it on its own thread."""

    def inside(a, b) -> bool:
        return a is not b and a[0].id == b[0].id and b[1] <= a[1] and a[2] <= b[2]

    out = []
    for t in thunks:
        children = [c for c in thunks if inside(c, t) and not any(inside(c, m) and inside(m, t) for m in thunks)]
        out.append((t[3], t[1] // 1000, (t[2] - t[1] - sum(c[2] - c[1] for c in children)) // 1000))
    return out


def _steps(space) -> list[tuple[int, int]]:
    [host] = [p for p in space.planes if p.name == "/host:CPU"]
    names = {step_range_name(i) for i in range(STEPS)}
    found = []
    for line in host.lines:
        for event in line.events:
            if host.event_metadata[event.metadata_id].name in names:
                start = (line.timestamp_ns * 1000 + event.offset_ps) // 1000
                found.append((start, start + event.duration_ps // 1000))
    return sorted(found)


def _check_against_protobuf(logdir: Path) -> Any:
    """The table from the log folder against the raw XSpace; returns the table."""
    space = _space(logdir)
    rows = _self_times(_thunks(space))

    table = load_trace(logdir)

    assert table.format == "jax-xplane"
    assert list(table.kernels.columns) == list(KERNEL_DTYPES)
    got = table.kernels
    assert table.kernel_count == len(rows) > 0
    assert table.total_ns == sum(dur for *_, dur in rows)
    assert Counter(zip(got["op"].astype(str), got["dur_ns"], strict=True)) == Counter((op, d) for op, _, d in rows)
    assert Counter(got["name"].astype(str)) == Counter(re.sub(r"\.\d+$", "", op) for op, *_ in rows)
    assert got["short_name"].astype(str).tolist() == got["name"].astype(str).tolist()
    assert set(got["device_id"].tolist()) == {0}
    assert [(d.id, d.name) for d in table.devices] == [(0, "/host:CPU")]
    assert table.memory is None

    steps = _steps(space)
    assert len(steps) == STEPS
    by_step = kernel_ns_by_step(table)
    expected = [sum(d for _, s, d in rows if lo <= s < hi) for lo, hi in steps]
    assert by_step == expected
    assert all(t > 0 for t in by_step)
    # Every op ran inside a step: the steps split all of the time.
    assert sum(by_step) == table.total_ns
    return table


def test_jax_trace_gives_one_row_per_executed_hlo_op(jax_logdir: Path) -> None:
    table = _check_against_protobuf(jax_logdir)

    names = set(table.kernels["name"].astype(str))
    categories = {classify(n) for n in names}
    assert {"conv forward", "gemm/matmul", "elementwise"} <= categories, names
    assert "while" in names  # the scan, whose body ran inside it: its row holds only its own time
    assert not any(n.startswith("end: ") or "::" in n for n in names), names


def test_a_while_loop_and_its_body_count_once(jax_logdir: Path) -> None:
    thunks = _thunks(_space(jax_logdir))
    loops = [t for t in thunks if t[3].startswith("while")]
    body = {id(t) for t in thunks if any(t is not w and t[0].id == w[0].id and w[1] <= t[1] < w[2] for w in loops)}
    assert loops and body

    table = load_trace(jax_logdir)

    outermost_ns = sum(t[2] - t[1] for t in thunks if id(t) not in body) / 1000
    assert table.total_ns <= outermost_ns < table.total_ns + len(thunks)


def test_the_run_folder_and_the_file_are_the_same_profile(jax_logdir: Path) -> None:
    [file] = jax_logdir.glob("plugins/profile/*/*.xplane.pb")
    assert list(file.parent.glob("*.trace.json.gz")), "jax writes a Chrome trace beside the XSpace"
    tables = [load_trace(path) for path in (jax_logdir, file.parent, file)]
    assert {(t.kernel_count, t.total_ns, t.format) for t in tables} == {
        (tables[0].kernel_count, tables[0].total_ns, "jax-xplane")
    }


def test_parse_cli_prints_a_table(jax_logdir: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    table = load_trace(jax_logdir)
    top = table.kernels.groupby("name", observed=True)["dur_ns"].sum().idxmax()

    code = main(["parse", str(jax_logdir), "--top", "5"])
    out = capsys.readouterr().out

    assert code == 0
    assert top in out and "(all other kernels)" in out

    assert main(["parse", str(jax_logdir), "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert (document["format"], document["kernel_count"], document["total_ns"]) == (
        "jax-xplane",
        table.kernel_count,
        table.total_ns,
    )


def test_reading_a_jax_trace_does_not_import_tensorflow(jax_logdir: Path) -> None:
    done = run_script("without_tensorflow.py", "load_trace", jax_logdir)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["result"] == [load_trace(jax_logdir).kernel_count]
    assert report["tensorflow_modules"] == []


@pytest.mark.slow
def test_keras_on_jax(tmp_path: Path) -> None:
    table = _check_against_protobuf(_trace(tmp_path / "trace", "keras"))

    names = set(table.kernels["name"].astype(str))
    categories = {classify(n) for n in names}
    assert {"conv forward", "gemm/matmul", "reduction", "elementwise"} <= categories, names


@pytest.mark.parametrize(
    ("name", "category"),
    [
        ("conv_general_dilated", "conv forward"),
        ("convolution", "conv forward"),
        ("dot", "gemm/matmul"),
        ("dot_general", "gemm/matmul"),
        ("multiply_subtract_fusion", "elementwise"),
        ("broadcast_maximum_fusion", "elementwise"),
        ("select_bitcast_fusion", "elementwise"),
        ("wrapped_add", "elementwise"),
        ("wrapped_iota", "elementwise"),
        ("multiply_reduce_fusion", "reduction"),
        ("wrapped_reduce-window", "reduction"),
        ("wrapped_scatter", "reduction"),
        ("transpose_copy_fusion", "memory"),
        ("bitcast_dynamic-update-slice_fusion", "memory"),
        ("wrapped_broadcast", "memory"),
        ("copy", "memory"),
        ("while", "other"),
        ("ynn_fusion", "other"),  # YNNPACK runs dots and reductions alike under this name
    ],
)
def test_xla_instruction_names_are_classified(name: str, category: str) -> None:
    assert classify(name) == category


# ---- XSpaces made by hand: exact times, and what the JAX rows must not change ----------


def _plane(space, plane_id: int, name: str, stats: dict[int, str], events: dict[int, str]) -> Any:
    plane = space.planes.add(id=plane_id, name=name)
    for key, value in stats.items():
        plane.stat_metadata[key].id = key
        plane.stat_metadata[key].name = value
    for key, value in events.items():
        plane.event_metadata[key].id = key
        plane.event_metadata[key].name = value
    return plane


def _jax_space() -> tuple[Any, Any]:
    """A JAX-written XSpace (metadata plane with jax_version) and its host plane, with one step marker."""
    space = XSpace(hostnames=["h"])
    metadata = _plane(space, 0, "/host:metadata", {1: "jax_version"}, {})
    metadata.stats.add(metadata_id=1, str_value="0.10.2")
    host = _plane(
        space,
        1,
        "/host:CPU",
        {1: "hlo_op", 2: "hlo_module", 3: "while.6", 4: "dot.2", 5: "copy.1", 6: "jit_f", 7: "add.9"},
        {1: "step 0", 2: "ThunkExecutor::Execute", 3: "while.6", 4: "dot.2", 5: "copy.1", 6: "end: dot.2", 7: "add.9"},
    )
    host.lines.add(id=1, name="python", timestamp_ns=1_000).events.add(metadata_id=1, offset_ps=0, duration_ps=10**8)
    return space, host


def _thunk(line, host, event_id: int, op_stat: int, offset_ps: int, duration_ps: int) -> None:
    event = line.events.add(metadata_id=event_id, offset_ps=offset_ps, duration_ps=duration_ps)
    event.stats.add(metadata_id=1, ref_value=op_stat)
    event.stats.add(metadata_id=2, ref_value=6)


def test_nested_thunks_hold_their_self_time(tmp_path: Path) -> None:
    """A while thunk [0, 10 us) runs dot.2 [1, 5) and copy.1 [5.5, 9) on its thread; add.9 runs elsewhere."""
    space, host = _jax_space()
    worker = host.lines.add(id=7, name="tf_XLAPjRtCpuClient/7", timestamp_ns=2_000)
    worker.events.add(metadata_id=2, offset_ps=0, duration_ps=12_000_000)
    _thunk(worker, host, 3, 3, 0, 10_000_000)
    _thunk(worker, host, 4, 4, 1_000_000, 4_000_000)
    worker.events.add(metadata_id=6, offset_ps=5_000_000, duration_ps=100_000)
    _thunk(worker, host, 5, 5, 5_500_000, 3_500_000)
    pool = host.lines.add(id=8, name="tf_XLAEigen/8", timestamp_ns=2_000)
    _thunk(pool, host, 7, 7, 2_000_000, 2_000_999)
    path = tmp_path / "h.xplane.pb"
    path.write_bytes(space.SerializeToString())

    table = load_trace(path)

    rows = table.kernels[["name", "op", "start_ns", "dur_ns", "stream_id"]].to_dict("records")
    assert rows == [
        {"name": "while", "op": "while.6", "start_ns": 2_000, "dur_ns": 2_500, "stream_id": 7},
        {"name": "dot", "op": "dot.2", "start_ns": 3_000, "dur_ns": 4_000, "stream_id": 7},
        {"name": "add", "op": "add.9", "start_ns": 4_000, "dur_ns": 2_000, "stream_id": 8},
        {"name": "copy", "op": "copy.1", "start_ns": 7_500, "dur_ns": 3_500, "stream_id": 7},
    ]
    assert table.format == "jax-xplane"
    assert table.nvtx.to_dict("records") == [{"text": "step 0", "start_ns": 1_000, "end_ns": 101_000}]
    assert kernel_ns_by_step(table) == [12_000]


def test_jax_xspace_without_xla_ops_is_the_one_line_error(tmp_path: Path) -> None:
    space, host = _jax_space()
    line = host.lines.add(id=7, name="tf_XLAPjRtCpuClient/7", timestamp_ns=2_000)
    line.events.add(metadata_id=2, offset_ps=0, duration_ps=5_000)
    line.events.add(metadata_id=4, offset_ps=0, duration_ps=5_000)  # named like a thunk, without its hlo_op stat
    path = tmp_path / "idle.xplane.pb"
    path.write_bytes(space.SerializeToString())

    with pytest.raises(InputError) as info:
        load_trace(path)
    message = str(info.value)
    assert message.startswith(str(path)) and "\n" not in message
    assert "no GPU kernels and no TF op or XLA events" in message


# ---- XLA:GPU as jax.profiler writes it --------------------------------------------------


class _Interned:
    """A plane's event and stat metadata, interned by name as XLA's XPlaneBuilder does (ids from 1)."""

    def __init__(self, plane) -> None:
        self.plane = plane

    def event(self, name: str) -> int:
        return self._intern(self.plane.event_metadata, name)

    def stat(self, name: str) -> int:
        return self._intern(self.plane.stat_metadata, name)

    def add(self, holder, name: str, **value) -> None:
        """A stat; ``ref=TEXT`` stores TEXT as a stat metadata name, as XLA does for repeated strings."""
        if "ref" in value:
            value = {"ref_value": self.stat(value.pop("ref"))}
        holder.stats.add(metadata_id=self.stat(name), **value)

    @staticmethod
    def _intern(table, name: str) -> int:
        for key, meta in table.items():
            if meta.name == name:
                return key
        key = len(table) + 1
        table[key].id = key
        table[key].name = name
        return key


# name, hlo_op, start ns, duration ns, (grid, block), correlation id, CUDA graph node (0: launched on its own)
_XLA_KERNELS = (
    ("loop_multiply_fusion", "multiply_fusion", 3_000, 1_000, ((4, 1, 1), (128, 1, 1)), 11, 0),  # settling step
    ("loop_multiply_fusion", "multiply_fusion", 13_000, 2_500, ((4, 1, 1), (128, 1, 1)), 21, 0),
    (
        "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_cublas",
        "dot.2",
        16_000,
        7_000,
        ((8, 2, 1), (384, 1, 1)),
        22,
        77,
    ),
    ("input_reduce_fusion", "reduce.4", 24_000, 1_200, ((1, 1, 1), (1024, 1, 1)), 23, 78),
    ("loop_multiply_fusion", "multiply_fusion", 63_000, 2_600, ((4, 1, 1), (128, 1, 1)), 31, 0),
    (
        "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_cublas",
        "dot.2",
        66_000,
        7_100,
        ((8, 2, 1), (384, 1, 1)),
        32,
        77,
    ),
)
_STEPS_NS = ((11_000, 51_000), (61_000, 101_000))
_LINE_NS = 1_000


def _xla_gpu_space():
    """An XSpace as ``jax.profiler`` writes it for two steps of a jitted function on one of two GPUs.

    Mirrored from openxla/xla: ``xla/backends/profiler/gpu/cupti_collector.cc`` (``CreateXEvent``: a
    kernel's stats in their order, ``kernel_details`` from ``ToXStat`` in ``cupti_collector.h``, the
    annotation stack parsed into ``tf_op`` = its outermost name and the innermost annotations' keys;
    ``GetDeviceXLineName``: ``Stream #N(Compute,...)``, overhead on a ``CUPTI overhead`` line;
    ``GetDeviceCapabilities``: the plane's ``gpu_device_name`` and capability stats, for every GPU
    the process sees; a launch's host event, named by the kernel it launched, with ``device_id`` and
    ``correlation_id``), ``cupti_buffer_events.cc`` (``MemcpyD2H``, ``Memset <kind>`` names, CUDA graph
    node ids), ``xla/backends/gpu/runtime/annotation.cc`` (the module annotation ``XlaModule:#hlo_module=
    ...,program_id=...#`` around ``Thunk:#name=...,hlo_op=...,unique_hlo_op_id=...#``), stat names from
    ``xla/tsl/profiler/utils/xplane_schema.cc`` (``Memset_details``, ``cuda_graph_node_id``); and from
    jax ``jax/_src/profiler.py`` (the ``/host:metadata`` plane's versions) and detprof's worker (each
    step a ``jax.profiler.TraceAnnotation("step i")`` on the python thread, which launches the kernels).
    The process's CPU client also ran one XLA:CPU thunk, as the real CPU traces above show them
    (``tf_XLAPjRtCpuClient`` thread, ``hlo_op``/``hlo_module``/``program_id`` stats): the CPU-run reading
    would take it for an op. Returns the space and the kernel table's expected rows.
    """
    space = XSpace(hostnames=["gpuhost"])
    metadata = space.planes.add(id=0, name="/host:metadata")
    meta = _Interned(metadata)
    for key, value in (("jax_version", "0.10.2"), ("jaxlib_version", "0.10.2"), ("cpu_version", "cpu")):
        meta.add(metadata, key, str_value=value)

    host = space.planes.add(id=1, name="/host:CPU")
    at_host = _Interned(host)
    python = host.lines.add(id=4242, name="python", display_name="python", timestamp_ns=_LINE_NS)
    for index, (start, end) in enumerate(_STEPS_NS):
        python.events.add(
            metadata_id=at_host.event(f"step {index}"),
            offset_ps=(start - _LINE_NS) * 1000,
            duration_ps=(end - start) * 1000,
        )
    for name, _, start, _, _, correlation, _ in _XLA_KERNELS:  # the launches, named by the kernel launched
        launch = python.events.add(
            metadata_id=at_host.event(name), offset_ps=(start - 1_500 - _LINE_NS) * 1000, duration_ps=900_000
        )
        at_host.add(launch, "device_id", uint64_value=0)
        at_host.add(launch, "correlation_id", uint64_value=correlation)
    cpu_client = host.lines.add(id=77, name="tf_XLAPjRtCpuClient/77", timestamp_ns=_LINE_NS)
    thunk = cpu_client.events.add(metadata_id=at_host.event("add.9"), offset_ps=20_000_000, duration_ps=4_000_000)
    at_host.add(thunk, "hlo_op", ref="add.9")
    at_host.add(thunk, "hlo_module", ref="jit_host_side")
    at_host.add(thunk, "program_id", int64_value=3)

    gpu = space.planes.add(id=0, name="/device:GPU:0")
    at_gpu = _Interned(gpu)
    at_gpu.add(gpu, "device_vendor", str_value="Nvidia")
    at_gpu.add(gpu, "gpu_device_name", str_value="NVIDIA H100 80GB HBM3")
    for key, value in (
        ("clock_rate", 1_980_000),
        ("core_count", 132),
        ("compute_cap_major", 9),
        ("compute_cap_minor", 0),
    ):
        at_gpu.add(gpu, key, int64_value=value)
    at_gpu.add(gpu, "memory_bandwidth", uint64_value=3_352_320_000_000)
    at_gpu.add(gpu, "memory_size", uint64_value=84_987_740_160)
    stream = gpu.lines.add(id=14, name="Stream #14(Compute,MemcpyD2H,Memset)", timestamp_ns=_LINE_NS)
    expected = []
    for name, hlo_op, start, dur, (grid, block), correlation, node in _XLA_KERNELS:
        event = stream.events.add(
            metadata_id=at_gpu.event(name), offset_ps=(start - _LINE_NS) * 1000, duration_ps=dur * 1000
        )
        at_gpu.add(event, "correlation_id", uint64_value=correlation)
        at_gpu.add(event, "context_id", str_value="$$1")
        if node:
            at_gpu.add(event, "cuda_graph_id", uint64_value=3)
            at_gpu.add(event, "cuda_graph_node_id", uint64_value=node)
        at_gpu.add(event, "theoretical_occupancy_pct", double_value=50.0)
        at_gpu.add(event, "occupancy_min_grid_size", int64_value=132)
        at_gpu.add(event, "occupancy_suggested_block_size", int64_value=1024)
        details = "regs:32 static_shared:0 dynamic_shared:0 grid:{},{},{} block:{},{},{} occ_pct:50".format(
            *grid, *block
        )
        at_gpu.add(event, "kernel_details", ref=details)
        at_gpu.add(event, "tf_op", ref="XlaModule")
        at_gpu.add(event, "name", str_value="jvp(train_step)/dot_general")
        at_gpu.add(event, "hlo_op", str_value=hlo_op)
        at_gpu.add(event, "unique_hlo_op_id", int64_value=100 + correlation)
        at_gpu.add(event, "hlo_module", str_value="jit_train_step")
        at_gpu.add(event, "program_id", int64_value=7)
        expected.append(
            {
                "name": name,
                "op": hlo_op,
                "start_ns": start,
                "dur_ns": dur,
                "device_id": 0,
                "stream_id": 14,
                "correlation_id": correlation,
                "graph_node_id": node or None,
                **dict(zip(("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z"), grid + block, strict=True)),
            }
        )
    copy = stream.events.add(metadata_id=at_gpu.event("MemcpyD2H"), offset_ps=29_000_000, duration_ps=800_000)
    at_gpu.add(copy, "correlation_id", uint64_value=24)
    at_gpu.add(copy, "memcpy_details", ref="kind_src:device kind_dst:pinned size:4 dest:0 async:1")
    memset = stream.events.add(metadata_id=at_gpu.event("Memset 1"), offset_ps=61_000_000, duration_ps=300_000)
    at_gpu.add(memset, "Memset_details", ref="kind:device num_bytes:1024 async:1")
    overhead = gpu.lines.add(id=999, name="CUPTI overhead", timestamp_ns=_LINE_NS)
    overhead.events.add(metadata_id=at_gpu.event("BUFFER_FLUSH"), offset_ps=40_000_000, duration_ps=5_000_000)

    idle = space.planes.add(id=1, name="/device:GPU:1")  # visible to the process, ran nothing
    _Interned(idle).add(idle, "gpu_device_name", str_value="NVIDIA H100 80GB HBM3")
    return space, expected


def test_xla_gpu_trace_reads_the_device_kernels(tmp_path: Path) -> None:
    """Kernels from the GPU plane, never the host's launches or its XLA:CPU thunk; XLA's ops, memory rows, steps."""
    space, expected = _xla_gpu_space()
    path = tmp_path / "gpuhost.xplane.pb"
    path.write_bytes(space.SerializeToString())

    table = load_trace(path)

    assert table.format == "jax-xplane"
    columns = list(expected[0])
    rows = table.kernels[columns].astype(object).where(table.kernels[columns].notna(), None)
    assert rows.to_dict("records") == expected
    assert [(d.id, d.name, d.sm_count, d.compute_capability, d.memory_bytes) for d in table.devices] == [
        (0, "NVIDIA H100 80GB HBM3", 132, "9.0", 84_987_740_160)
    ]
    assert table.memory.to_dict("records") == [
        {"kind": "memcpy DtoH", "start_ns": 30_000, "dur_ns": 800, "bytes": 4, "device_id": 0, "stream_id": 14},
        {"kind": "memset", "start_ns": 62_000, "dur_ns": 300, "bytes": 1024, "device_id": 0, "stream_id": 14},
    ]
    by_step = [sum(k[3] for k in _XLA_KERNELS if lo <= k[2] < hi) for lo, hi in _STEPS_NS]
    assert kernel_ns_by_step(table) == by_step == [10_700, 9_700]
    measured = within_steps(table)
    assert measured is not None
    assert measured.total_ns == sum(by_step) == table.total_ns - 1_000  # the settling kernel is left out
    assert measured.kernels["correlation_id"].tolist() == [21, 22, 23, 31, 32]


def test_gpu_activity_without_kernels_is_refused(tmp_path: Path) -> None:
    """Memory copies and no kernel record: the host's XLA:CPU thunk is not read as the kernels instead."""
    space, _ = _xla_gpu_space()
    [stream] = [line for plane in space.planes for line in plane.lines if line.name.startswith("Stream #")]
    gpu = next(p for p in space.planes if p.name == "/device:GPU:0")
    details = next(key for key, meta in gpu.stat_metadata.items() if meta.name == "kernel_details")
    kept = [event for event in stream.events if all(s.metadata_id != details for s in event.stats)]
    del stream.events[:]
    stream.events.extend(kept)
    path = tmp_path / "copies.xplane.pb"
    path.write_bytes(space.SerializeToString())

    with pytest.raises(InputError) as info:
        load_trace(path)
    message = str(info.value)
    assert message.startswith(str(path)) and "\n" not in message
    assert "2 memory copies/sets" in message and "no kernel" in message
    del stream.events[:]
    path.write_bytes(space.SerializeToString())
    assert load_trace(path).kernels["op"].tolist() == ["add.9"]  # no GPU activity at all: a CPU run's reading


def test_tables_are_the_same_where_tensorflow_cannot_be_imported(jax_logdir: Path) -> None:
    """A detprof[jax] or detprof[torch] machine has no TensorFlow: every XSpace reads the same without it.

    The other run has TensorFlow's own XSpace classes in protobuf's default pool (where importing
    TensorFlow puts them), beside detprof's, where TensorFlow is installed.
    """
    shared = (SHARED_TRACES / "tf-bert-3gpu.xplane.pb", SHARED_TRACES / "tf-2.21-cpu-smallcnn.xplane.pb")
    paths = [jax_logdir, *present_real_traces(*shared)]
    runs = {}
    for mode in ("blocked", "tensorflow-classes"):
        done = run_script("xspace_tables.py", mode, *paths, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[mode] = json.loads(done.stdout.strip().splitlines()[-1])

    assert runs["blocked"]["tensorflow"].startswith("ModuleNotFoundError")
    assert runs["blocked"]["tables"] == runs["tensorflow-classes"]["tables"]
    blocked = runs["blocked"]["tables"]
    assert [t["format"] for t in blocked] == ["jax-xplane", "tf-xplane", "tf-xplane"][: len(paths)]
    assert [len(t["kernels"][1]) for t in blocked] == [load_trace(path).kernel_count for path in paths]


H200_TRACES = Path(__file__).parent / "data" / "h200-jax"
SMALLCNN_POOLS = {"pool1", "pool2", "pool3"}


@pytest.fixture(scope="module")
def h200(tmp_path_factory) -> dict[str, Path]:
    """The real H200 traces of smallcnn in each mode, unpacked."""
    folder = tmp_path_factory.mktemp("h200-jax")
    traces = {}
    for mode in ("default", "deterministic"):
        traces[mode] = folder / f"smallcnn-{mode}.xplane.pb"
        traces[mode].write_bytes(gzip.decompress((H200_TRACES / f"smallcnn-{mode}.xplane.pb.gz").read_bytes()))
    return traces


def _gpu_kernels(path: Path) -> list[tuple[str, int, object]]:
    """(name, duration ns, hlo_op) of every event of the GPU plane that carries ``kernel_details``: a plain read."""
    space = XSpace()
    space.ParseFromString(path.read_bytes())
    [gpu] = [p for p in space.planes if p.name.startswith("/device:GPU:")]
    found = []
    for line in gpu.lines:
        for event in line.events:
            meta = gpu.event_metadata[event.metadata_id]
            stats = {gpu.stat_metadata[s.metadata_id].name for s in [*meta.stats, *event.stats]}
            if "kernel_details" in stats:
                found.append((meta.name, event.duration_ps // 1000, _stat(gpu, event, "hlo_op")))
    return found


@pytest.mark.parametrize("mode", ["default", "deterministic"])
def test_a_real_h200_trace_keeps_every_kernel(h200: dict[str, Path], mode: str) -> None:
    table = load_trace(h200[mode])
    plain = _gpu_kernels(h200[mode])
    assert table.format == "jax-xplane" and [d.name for d in table.devices] == ["NVIDIA H200"]
    assert (table.kernel_count, table.total_ns) == (len(plain), sum(dur for _, dur, _ in plain))


def test_kernels_xla_launched_from_command_buffers_find_their_layer(h200: dict[str, Path]) -> None:
    """XLA:GPU runs most of a deterministic step as command buffers (CUDA graphs), whose kernels name the
    buffer (``command_buffer_36``), not their instruction. The sorts that make max pooling's backward
    scatter deterministic are most of the added time: they belong to the pooling layers, and at most a
    tenth of either mode's kernel time is left unattributed (library GEMMs inside command buffers)."""
    from detprof.traces.attribution import UNATTRIBUTED, layer_of

    plain = _gpu_kernels(h200["deterministic"])
    in_buffers = sum(dur for _, dur, hlo_op in plain if str(hlo_op).startswith("command_buffer"))
    assert in_buffers > 0.7 * sum(dur for _, dur, _ in plain)
    for mode, trace in h200.items():
        kernels = load_trace(trace).kernels
        layers = kernels["scope"].map(lambda scope: layer_of(scope, SMALLCNN_POOLS | {"conv1", "conv2", "conv3"}))
        unattributed = kernels["dur_ns"][kernels["scope"].isna()].sum()
        assert unattributed < 0.1 * kernels["dur_ns"].sum(), mode
        sorts = kernels["name"].str.match(r"sort_")
        assert sorts.any() == (mode == "deterministic")
        assert set(layers[sorts]) <= SMALLCNN_POOLS and UNATTRIBUTED not in set(layers[sorts])
        assert set(kernels["op_type"][sorts]) <= {"select_and_scatter"}


def test_kernels_named_after_their_instruction_take_their_ops_category(h200: dict[str, Path]) -> None:
    """The sorts of the deterministic max pooling gradient say nothing by their names (``sort_2_1``): the kernel
    tables file them under their op, ``select_and_scatter``, which is pooling, and the diff then names pooling as
    what determinism added (on an H100 the medium CNN's sorts were three quarters of the added time)."""
    from detprof.traces.kernel_tables import diff, kernel_stats

    tables = {mode: load_trace(trace) for mode, trace in h200.items()}
    stats = kernel_stats(tables["deterministic"])
    sorts = stats[stats["name"].str.match(r"sort_")]
    assert len(sorts) > 0 and set(sorts["category"]) == {"pooling"}
    assert set(sorts["op_type"]) == {"select_and_scatter"}
    changed = diff(tables["default"], tables["deterministic"])
    added = changed[changed["status"] == "added"]
    assert added.groupby("category")["delta_ns"].sum().idxmax() == "pooling"


def test_a_gzip_compressed_xspace_reads_as_the_file_unpacked(h200: dict[str, Path]) -> None:
    """jax.profiler's trace as kept gzip-compressed (``.xplane.pb.gz``) is read as it is, as a Kineto trace's
    ``.json.gz`` is; a damaged one is one line."""
    from detprof.traces.parsers import load_trace

    packed = H200_TRACES / "smallcnn-default.xplane.pb.gz"
    assert load_trace(packed).kernels.equals(load_trace(h200["default"]).kernels)
    damaged = h200["default"].with_name("damaged.xplane.pb.gz")
    damaged.write_bytes(packed.read_bytes()[:5000])
    with pytest.raises(InputError, match=r"damaged\.xplane\.pb\.gz: "):
        load_trace(damaged)
