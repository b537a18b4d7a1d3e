"""JAX profiler traces on a CPU (XLA:CPU thunks in an XSpace) -> KernelTable.

The traces are written here by real ``jax.profiler`` runs, in a fresh interpreter (Keras
picks its backend at import, and this process may hold Keras on TensorFlow). Expected
values come from walking the protobuf with TensorFlow's generated XSpace classes, and
nesting is resolved by brute force, not by the parser's stack. The classes are loaded as
the parser loads them, without importing TensorFlow (7 s here): only the schema is shared.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from script_runner import ROOT, run_script

from detprof.cli import main
from detprof.errors import InputError
from detprof.traces.classify import classify
from detprof.traces.kernel_table import KERNEL_DTYPES
from detprof.traces.parsers import load_trace
from detprof.traces.parsers.tf_xplane import _xplane_pb2
from detprof.traces.step_split import kernel_ns_by_step, step_range_name

STEPS = 3

# Run with ``python -c`` as: LOGDIR {jax,keras}. The tracing calls are the ones detprof's
# worker makes around its measured steps.
TRACE_STEPS = """
import sys

import jax
import jax.numpy as jnp
import numpy as np

from detprof.traces.step_split import step_range_name

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


@pytest.fixture(scope="module")
def xplane_pb2():
    return _xplane_pb2()


def _space(xplane_pb2, logdir: Path) -> Any:
    [file] = logdir.glob("plugins/profile/*/*.xplane.pb")
    space = xplane_pb2.XSpace()
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


def _check_against_protobuf(logdir: Path, xplane_pb2) -> Any:
    """The table from the log folder against the raw XSpace; returns the table."""
    space = _space(xplane_pb2, logdir)
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


def test_jax_trace_gives_one_row_per_executed_hlo_op(jax_logdir: Path, xplane_pb2) -> None:
    table = _check_against_protobuf(jax_logdir, xplane_pb2)

    names = set(table.kernels["name"].astype(str))
    categories = {classify(n) for n in names}
    assert {"conv forward", "gemm/matmul", "elementwise"} <= categories, names
    assert "while" in names  # the scan, whose body ran inside it: its row holds only its own time
    assert not any(n.startswith("end: ") or "::" in n for n in names), names


def test_a_while_loop_and_its_body_count_once(jax_logdir: Path, xplane_pb2) -> None:
    thunks = _thunks(_space(xplane_pb2, jax_logdir))
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
def test_keras_on_jax(tmp_path: Path, xplane_pb2) -> None:
    table = _check_against_protobuf(_trace(tmp_path / "trace", "keras"), xplane_pb2)

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


def _jax_space(xplane_pb2) -> tuple[Any, Any]:
    """A JAX-written XSpace (metadata plane with jax_version) and its host plane, with one step marker."""
    space = xplane_pb2.XSpace(hostnames=["h"])
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


def test_nested_thunks_hold_their_self_time(tmp_path: Path, xplane_pb2) -> None:
    """A while thunk [0, 10 us) runs dot.2 [1, 5) and copy.1 [5.5, 9) on its thread; add.9 runs elsewhere."""
    space, host = _jax_space(xplane_pb2)
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


def test_jax_xspace_without_xla_ops_is_the_one_line_error(tmp_path: Path, xplane_pb2) -> None:
    space, host = _jax_space(xplane_pb2)
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


def test_gpu_kernels_win_over_host_thunks(tmp_path: Path, xplane_pb2) -> None:
    """A JAX GPU trace also has host events with hlo_op stats; the GPU's Stream lines are the kernels."""
    space, host = _jax_space(xplane_pb2)
    _thunk(host.lines.add(id=7, name="tf_XLAPjRtCpuClient/7", timestamp_ns=2_000), host, 4, 4, 0, 1_000_000)
    gpu = _plane(space, 2, "/device:GPU:0", {1: "hlo_op", 2: "dot.2"}, {1: "sm90_xmma_gemm_f32f32"})
    stream = gpu.lines.add(id=13, name="Stream #13(Compute)", timestamp_ns=3_000)
    stream.events.add(metadata_id=1, offset_ps=0, duration_ps=7_000).stats.add(metadata_id=1, ref_value=2)
    gpu.lines.add(id=-1, name="XLA Ops", timestamp_ns=3_000).events.add(metadata_id=1, duration_ps=7_000)
    path = tmp_path / "gpu.xplane.pb"
    path.write_bytes(space.SerializeToString())

    table = load_trace(path)

    assert table.kernels[["name", "device_id", "stream_id", "dur_ns"]].to_dict("records") == [
        {"name": "sm90_xmma_gemm_f32f32", "device_id": 0, "stream_id": 13, "dur_ns": 7}
    ]
    assert [d.name for d in table.devices] == ["/device:GPU:0"]
    assert table.format == "jax-xplane"  # the format names the profiler that wrote the trace
    assert table.memory is not None and table.memory.empty
    assert kernel_ns_by_step(table) == [7]
