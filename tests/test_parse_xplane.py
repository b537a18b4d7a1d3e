"""TensorFlow profiler (XSpace) traces -> KernelTable.

Expected values come from walking the protobuf messages directly, not from the parser. The
messages are detprof's runtime XSpace classes, which read without TensorFlow; the first tests
hold their schema and what they decode to TensorFlow's own generated module. A CPU trace is
produced by a real TensorFlow training run.
"""

from __future__ import annotations

import importlib.util
import json
import random
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest
from fixtures_traces import SHARED_TRACES, real_traces, require_real_traces
from script_runner import run_script

from detprof.errors import InputError
from detprof.traces.classify import classify
from detprof.traces.kernel_table import KERNEL_DTYPES, MEMORY_DTYPES
from detprof.traces.parsers.tf_xplane import load_xplane
from detprof.traces.parsers.xspace_schema import PACKAGE, schema, xspace_class
from detprof.traces.step_split import kernel_ns_by_step, within_steps

BERT = SHARED_TRACES / "tf-bert-3gpu.xplane.pb"
SMALLCNN = SHARED_TRACES / "tf-2.21-cpu-smallcnn.xplane.pb"

needs_bert = real_traces(BERT)
needs_smallcnn = real_traces(SMALLCNN)
XSpace = xspace_class()


@pytest.fixture(scope="module")
def tensorflow_xplane_pb2():
    """TensorFlow's generated XSpace module, loaded from its file (importing tensorflow itself takes seconds)."""
    spec = importlib.util.find_spec("tensorflow")
    locations = spec.submodule_search_locations if spec is not None else None
    for location in locations or ():
        source = Path(location, "tsl", "profiler", "protobuf", "xplane_pb2.py")
        if source.is_file():
            file_spec = importlib.util.spec_from_file_location("tensorflow_xplane_pb2_for_tests", source)
            module = importlib.util.module_from_spec(file_spec)
            file_spec.loader.exec_module(module)
            return module
    pytest.skip("TensorFlow (and its generated xplane_pb2) is not installed")


def test_runtime_schema_is_tensorflows(tensorflow_xplane_pb2) -> None:
    """Every field detprof declares has TensorFlow's number, type, label, message type and oneof."""
    from google.protobuf import descriptor_pb2

    theirs = descriptor_pb2.FileDescriptorProto()
    tensorflow_xplane_pb2.DESCRIPTOR.CopyToProto(theirs)
    assert theirs.package == PACKAGE

    def fields(file):
        out = {}
        for message in file.message_type:
            for container in (message, *message.nested_type):
                prefix = message.name if container is message else f"{message.name}.{container.name}"
                oneofs = [o.name for o in container.oneof_decl]
                for f in container.field:
                    oneof = oneofs[f.oneof_index] if f.HasField("oneof_index") else None
                    out[f"{prefix}.{f.name}"] = (f.number, f.type, f.label, f.type_name, oneof)
                if container.options.map_entry:
                    out[f"{prefix}:map_entry"] = True
        return out

    ours = fields(schema())
    assert len(ours) == 44  # 38 fields, 2 map entries of 2 fields each, and their map_entry option
    assert ours.items() <= fields(theirs).items()


@pytest.mark.parametrize("trace", [BERT, SMALLCNN], ids=["bert-gpu", "smallcnn-cpu"])
def test_runtime_classes_decode_real_traces_as_tensorflow_does(tensorflow_xplane_pb2, trace: Path) -> None:
    require_real_traces(trace)
    from google.protobuf import json_format

    data = trace.read_bytes()
    ours, theirs = XSpace.FromString(data), tensorflow_xplane_pb2.XSpace.FromString(data)
    # A field the runtime schema got wrong would stay an unknown field, which this view leaves out.
    assert json_format.MessageToDict(ours) == json_format.MessageToDict(theirs)
    assert type(ours).DESCRIPTOR.file.pool is not type(theirs).DESCRIPTOR.file.pool


def _space(path: Path):
    space = XSpace()
    space.ParseFromString(path.read_bytes())
    return space


def _stat(plane, holder, name: str):
    for stat in holder.stats:
        if plane.stat_metadata[stat.metadata_id].name == name:
            kind = stat.WhichOneof("value")
            return plane.stat_metadata[stat.ref_value].name if kind == "ref_value" else getattr(stat, kind)
    return None


def _gpu_events(space):
    """(device, plane, line, event, name) for every event on the Stream lines of GPU planes."""
    for plane in space.planes:
        if plane.name.startswith("/device:GPU:"):
            device = int(plane.name.rsplit(":", 1)[1])
            for line in plane.lines:
                if line.name.startswith("Stream #"):
                    for event in line.events:
                        yield device, plane, line, event, plane.event_metadata[event.metadata_id].name


def _host_ops(space):
    """(line, event, op name, op type) for the TF op events of the executor threads."""
    for plane in space.planes:
        if plane.name == "/host:CPU":
            for line in plane.lines:
                if line.name.startswith("tf_Compute") or (line.name.startswith("tf_numa_") and "Eigen" in line.name):
                    for event in line.events:
                        op, colon, op_type = plane.event_metadata[event.metadata_id].name.rpartition(":")
                        if colon and op and not op.endswith(":") and " " not in op_type:
                            yield line, event, op, op_type


def _check_schema(table) -> None:
    assert table.format == "tf-xplane"
    assert list(table.kernels.columns) == list(KERNEL_DTYPES)
    for column, dtype in KERNEL_DTYPES.items():
        if dtype != "string":
            assert str(table.kernels[column].dtype) == dtype, column
    if table.memory is not None:
        assert list(table.memory.columns) == list(MEMORY_DTYPES)


@needs_bert
def test_bert_gpu_kernels_match_the_protobuf() -> None:
    space = _space(BERT)
    kernels = [e for e in _gpu_events(space) if not e[4].startswith(("Memcpy", "Memset"))]
    copies = [e for e in _gpu_events(space) if e[4].startswith(("Memcpy", "Memset"))]

    table = load_xplane(BERT)

    _check_schema(table)
    got = table.kernels
    assert table.kernel_count == len(kernels) == 1330
    assert table.total_ns == sum(e[3].duration_ps // 1000 for e in kernels)
    assert Counter(got["device_id"].tolist()) == Counter(e[0] for e in kernels) == {4: 665, 6: 665}
    assert Counter(got["name"].astype(str)) == Counter(e[4] for e in kernels)
    assert Counter(got["stream_id"].tolist()) == Counter(e[2].id for e in kernels)
    assert Counter(got["correlation_id"].tolist()) == Counter(
        int(_stat(plane, event, "correlation_id")) for _, plane, _, event, _ in kernels
    )
    assert Counter(got["op"].astype(str)) == Counter(
        _stat(plane, event, "level 0") for _, plane, _, event, _ in kernels
    )
    starts = sorted(line.timestamp_ns + event.offset_ps // 1000 for _, _, line, event, _ in kernels)
    assert got["start_ns"].tolist() == starts
    assert set(got["short_name"].astype(str)) == {"EigenMetaKernel", "FillPhiloxRandomKernelLaunch"}

    dims = Counter()
    for _, plane, _, event, _ in kernels:
        details = _stat(plane, event, "kernel_details")
        grid = re.search(r"grid:(\d+),(\d+),(\d+)", details).groups()
        block = re.search(r"block:(\d+),(\d+),(\d+)", details).groups()
        dims[tuple(map(int, grid + block))] += 1
    got_dims = Counter(
        map(tuple, got[["grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z"]].to_numpy().tolist())
    )
    assert got_dims == dims

    assert table.memory is not None
    assert len(table.memory) == len(copies) == 226
    assert table.memory_ns == sum(e[3].duration_ps // 1000 for e in copies)
    assert Counter(table.memory["kind"].astype(str)) == {"memcpy HtoD": 202, "memcpy DtoH": 24}
    assert table.memory["bytes"].notna().all()


@needs_bert
def test_bert_devices_are_the_gpus_that_ran_kernels() -> None:
    """GPU:4 and GPU:6 ran the kernels; GPU:1 only copied memory, and the other five planes are empty."""
    space = _space(BERT)
    planes = {int(p.name.rsplit(":", 1)[1]): p for p in space.planes if p.name.startswith("/device:GPU:")}
    with_kernels = sorted({device for device, *_, name in _gpu_events(space) if not name.startswith("Mem")})

    devices = load_xplane(BERT).devices

    assert sorted(planes) == list(range(8))
    assert [d.id for d in devices] == with_kernels == [4, 6]
    for device in devices:
        plane = planes[device.id]
        values = {plane.stat_metadata[s.metadata_id].name: s for s in plane.stats}
        assert "gpu_device_name" not in values  # this TensorFlow did not record the GPU's model
        assert device.name == plane.name
        assert device.sm_count == values["core_count"].int64_value
        assert device.compute_capability == (
            f"{values['compute_cap_major'].int64_value}.{values['compute_cap_minor'].int64_value}"
        )
        assert device.memory_bytes == values["memory_size"].uint64_value


@needs_bert
def test_bert_table_holds_gpu_kernels_only_and_no_steps() -> None:
    """The host plane holds a launch event per kernel, named like it; none of them is a row, and no step is marked."""
    space = _space(BERT)
    [host] = [p for p in space.planes if p.name == "/host:CPU"]
    host_names = Counter(host.event_metadata[e.metadata_id].name for line in host.lines for e in line.events)
    streams = {(device, line.id) for device, _, line, *_ in _gpu_events(space)}
    kernels = [e for e in _gpu_events(space) if not e[4].startswith(("Memcpy", "Memset"))]
    launched = Counter(e[4] for e in kernels)
    assert all(host_names[name] == count for name, count in launched.items())  # one launch per kernel
    assert not any(re.match(r"^step \d+$", name) for name in host_names)

    table = load_xplane(BERT)

    rows = table.kernels
    assert set(zip(rows["device_id"].tolist(), rows["stream_id"].tolist(), strict=True)) <= streams
    assert table.total_ns == sum(e[3].duration_ps // 1000 for e in kernels)
    assert table.nvtx is None
    assert within_steps(table) is None and kernel_ns_by_step(table) is None


@needs_smallcnn
def test_cpu_trace_ops_match_the_protobuf() -> None:
    space = _space(SMALLCNN)
    ops = list(_host_ops(space))

    table = load_xplane(SMALLCNN)

    _check_schema(table)
    got = table.kernels
    assert len(got) == len(ops) > 0
    assert Counter(got["name"].astype(str)) == Counter(op_type for *_, op_type in ops)
    assert got["short_name"].astype(str).tolist() == got["name"].astype(str).tolist()
    assert Counter(got["op"].astype(str)) == Counter(op for _, _, op, _ in ops)
    assert table.total_ns == sum(event.duration_ps // 1000 for _, event, _, _ in ops)
    assert Counter(got["stream_id"].tolist()) == Counter(line.id for line, *_ in ops)
    assert set(got["device_id"].tolist()) == {0}
    assert [(d.id, d.name) for d in table.devices] == [(0, "/host:CPU")]
    assert table.memory is None
    assert {"_MklNativeFusedConv2D", "_MklNativeConv2DBackpropFilterWithBias", "_MklMatMul"} <= set(got["name"])
    # Executor and thread-pool bookkeeping on the same threads is not an op.
    assert not got["name"].astype(str).str.contains("::|Memory", regex=True).any()


def _profile_training(logdir: Path, compiler: str) -> Path:
    done = run_script(
        "train_and_profile.py",
        logdir,
        compiler,
        timeout=300,
        env={"TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return logdir


@pytest.fixture(scope="module")
def cpu_logdir(tmp_path_factory) -> Path:
    """A TensorBoard log folder written by a real TensorFlow profile of two training steps.

    It trains: every test that uses it is marked slow.
    """
    return _profile_training(tmp_path_factory.mktemp("tf-profile") / "logs", "graph")


@pytest.mark.slow
def test_xla_compiled_cpu_run_reads_its_thunks(tmp_path: Path) -> None:
    """jit_compile=True leaves no TF op events: the XLA:CPU thunks inside ThunkExecutor are the kernels."""
    logdir = _profile_training(tmp_path / "logs", "xla")
    table = load_xplane(logdir)
    _check_schema(table)
    names = set(table.kernels["name"].astype(str))
    assert "convolution" in names, names
    assert not any(n.startswith("end: ") or "::" in n or re.search(r"\.\d+$", n) for n in names), names
    assert table.kernels["op"].str.match(r"^[\w-]+(\.\d+)?$").all()
    space = _space(next(logdir.glob("plugins/profile/*/*.xplane.pb")))
    host = next(p for p in space.planes if p.name == "/host:CPU")
    executor_ns = sum(
        e.duration_ps // 1000
        for line in host.lines
        for e in line.events
        if host.event_metadata[e.metadata_id].name == "ThunkExecutor::Execute"
    )
    assert 0 < table.total_ns <= executor_ns


@pytest.mark.slow
def test_real_tf_run_logdir(cpu_logdir: Path) -> None:
    files = list(cpu_logdir.glob("plugins/profile/*/*.xplane.pb"))
    assert len(files) == 1
    expected = Counter(op_type for *_, op_type in _host_ops(_space(files[0])))

    table = load_xplane(cpu_logdir)

    _check_schema(table)
    kernels = table.kernels
    assert Counter(kernels["name"].astype(str)) == expected
    assert kernels["op"].notna().all()
    assert kernels["op"].str.len().min() > 0
    assert (kernels["dur_ns"] >= 0).all()
    assert table.source == str(cpu_logdir)
    names = set(kernels["name"].astype(str))
    assert any("Conv2D" in n for n in names), names
    assert any("MatMul" in n for n in names), names
    categories = {classify(n) for n in names}
    assert {"conv forward", "conv backward filter", "gemm/matmul", "pooling", "softmax/loss"} <= categories
    # The run folder and the file itself are the same profile.
    for path in (files[0].parent, files[0]):
        again = load_xplane(path)
        assert again.kernels["dur_ns"].sum() == kernels["dur_ns"].sum()
        assert len(again.kernels) == len(kernels)


@pytest.mark.slow
@needs_bert
def test_logdir_uses_its_newest_run(cpu_logdir: Path, tmp_path: Path) -> None:
    logdir = tmp_path / "logs"
    shutil.copytree(cpu_logdir, logdir)
    older = logdir / "plugins" / "profile" / "2000_01_01_00_00_00"
    older.mkdir()
    shutil.copy(BERT, older / "worker.xplane.pb")

    table = load_xplane(logdir)

    assert [d.name for d in table.devices] == ["/host:CPU"]
    assert load_xplane(older).kernel_count == 1330


@needs_bert
def test_keras_callback_layout_is_found(tmp_path: Path) -> None:
    run = tmp_path / "logs" / "train" / "plugins" / "profile" / "2024_05_01_10_00_00"
    run.mkdir(parents=True)
    shutil.copy(BERT, run / "host.xplane.pb")

    assert load_xplane(tmp_path / "logs").kernel_count == 1330


@needs_bert
def test_profiles_deeper_down_belong_to_other_experiments(tmp_path: Path) -> None:
    run = tmp_path / "logs" / "exp1" / "train" / "plugins" / "profile" / "2024_05_01_10_00_00"
    run.mkdir(parents=True)
    shutil.copy(BERT, run / "host.xplane.pb")

    _assert_input_error(tmp_path / "logs", "no TensorFlow profile")


@needs_bert
def test_every_host_of_a_run_counts(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(BERT, run / "worker0.xplane.pb")
    shutil.copy(BERT, run / "worker1.xplane.pb")

    single = load_xplane(BERT)
    table = load_xplane(run)

    assert table.kernel_count == 2 * single.kernel_count
    assert table.total_ns == 2 * single.total_ns
    # The second host's GPUs get their own ids rather than merging into the first host's.
    assert [d.id for d in table.devices] == [4, 6, 12, 14]
    assert Counter(table.kernels["device_id"].tolist()) == {4: 665, 6: 665, 12: 665, 14: 665}
    assert table.devices[2].name == "34.83.195.179:6003 /device:GPU:4"


@needs_smallcnn
def test_every_host_of_a_cpu_run_counts(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(SMALLCNN, run / "a.xplane.pb")
    shutil.copy(SMALLCNN, run / "b.xplane.pb")

    table = load_xplane(run)

    assert table.kernel_count == 2 * load_xplane(SMALLCNN).kernel_count
    assert [d.id for d in table.devices] == [0, 1]


@pytest.mark.slow
def test_parser_does_not_import_tensorflow(cpu_logdir: Path) -> None:
    done = run_script("without_tensorflow.py", "load_xplane", cpu_logdir)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    [kernel_count] = report["result"]
    assert kernel_count > 0
    assert report["tensorflow_modules"] == []


# ---- bad input: one clear InputError naming the path -------------------------------


def _assert_input_error(path: Path, fragment: str) -> None:
    with pytest.raises(InputError) as info:
        load_xplane(path)
    message = str(info.value)
    assert str(path) in message
    assert fragment in message
    assert "\n" not in message


def test_random_bytes(tmp_path: Path) -> None:
    path = tmp_path / "noise.xplane.pb"
    path.write_bytes(random.Random(7).randbytes(4096))
    _assert_input_error(path, "not a TensorFlow profiler trace")


@pytest.mark.parametrize("seed", range(20))
def test_random_bytes_never_pass_as_a_profile(tmp_path: Path, seed: int) -> None:
    path = tmp_path / "noise.bin"
    path.write_bytes(random.Random(seed).randbytes(random.Random(seed).randint(1, 2000)))
    with pytest.raises(InputError):
        load_xplane(path)


def test_text_file(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("this is not a profile\nat all\n")
    _assert_input_error(path, "not a TensorFlow profiler trace")


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.xplane.pb"
    path.touch()
    _assert_input_error(path, "empty file")


def test_missing_path(tmp_path: Path) -> None:
    _assert_input_error(tmp_path / "nowhere", "no such file")


def test_empty_directory(tmp_path: Path) -> None:
    _assert_input_error(tmp_path, "no TensorFlow profile")


def test_profile_folder_without_xplane(tmp_path: Path) -> None:
    run = tmp_path / "plugins" / "profile" / "2024_01_01_00_00_00"
    run.mkdir(parents=True)
    (run / "host.trace.json.gz").write_bytes(b"\x1f\x8b")
    _assert_input_error(tmp_path, "no run with an *.xplane.pb")


def test_xspace_without_kernels_or_ops(tmp_path: Path) -> None:
    space = XSpace(hostnames=["h"])
    host = space.planes.add(id=0, name="/host:CPU")
    host.event_metadata[1].name = "ExecutorState::Process"
    host.event_metadata[1].id = 1
    line = host.lines.add(id=5, name="tf_Compute/5", timestamp_ns=100)
    line.events.add(metadata_id=1, offset_ps=1000, duration_ps=5000)
    space.planes.add(id=1, name="/device:GPU:0")
    path = tmp_path / "idle.xplane.pb"
    path.write_bytes(space.SerializeToString())
    _assert_input_error(path, "no GPU kernels and no TF op or XLA events")


def test_failed_gpu_tracer_is_not_read_from_host_ops(tmp_path: Path) -> None:
    """CUPTI could not run: the XSpace holds its error and TF's host ops, which are launches, not kernel time.

    The error is worded as XLA's ``CuptiTracer::ErrorIfAny`` words it (xla/backends/profiler/gpu/cupti_tracer.cc),
    which the GPU tracer adds to ``XSpace.errors``.
    """
    space = XSpace(
        hostnames=["gpuhost"], errors=["gpuhost: Insufficient privilege to run libcupti (you need root permission)."]
    )
    host = space.planes.add(id=0, name="/host:CPU")
    host.event_metadata[1].name = "model/dense/MatMul:MatMul"
    host.lines.add(id=5, name="tf_Compute/5", timestamp_ns=100).events.add(metadata_id=1, duration_ps=5_000_000)
    path = tmp_path / "gpuhost.xplane.pb"
    path.write_bytes(space.SerializeToString())

    _assert_input_error(path, "Insufficient privilege to run libcupti")
    space.ClearField("errors")
    path.write_bytes(space.SerializeToString())
    assert load_xplane(path).kernels["name"].astype(str).tolist() == ["MatMul"]  # without the error: a CPU run


def test_xspace_made_by_hand_is_read_exactly(tmp_path: Path) -> None:
    """Times in picoseconds from the line start, ref-valued stats, memset rows."""
    space = XSpace()
    gpu = space.planes.add(id=1, name="/device:GPU:3")
    for key, name in {
        1: "kernel_details",
        2: "level 0",
        3: "correlation_id",
        4: "memset_details",
        5: "regs:16 shm:0 grid:7,2,1 block:128,1,1",
        6: "model/dense/MatMul:MatMul",
        7: "core_count",
        8: "compute_cap_major",
        9: "compute_cap_minor",
    }.items():
        gpu.stat_metadata[key].id = key
        gpu.stat_metadata[key].name = name
    gpu.event_metadata[1].name = "volta_sgemm_128x64_nn"
    gpu.event_metadata[2].name = "Memset"
    gpu.stats.add(metadata_id=7, int64_value=108)
    gpu.stats.add(metadata_id=8, int64_value=8)
    gpu.stats.add(metadata_id=9, int64_value=0)
    line = gpu.lines.add(id=17, name="Stream #17(Compute,Memset)", timestamp_ns=1_000)
    kernel = line.events.add(metadata_id=1, offset_ps=2_500_000, duration_ps=7_999)
    kernel.stats.add(metadata_id=1, ref_value=5)
    kernel.stats.add(metadata_id=2, ref_value=6)
    kernel.stats.add(metadata_id=3, uint64_value=42)
    memset = line.events.add(metadata_id=2, offset_ps=9_000_000, duration_ps=3_000)
    memset.stats.add(metadata_id=4, str_value="size:4096 dest:1")
    gpu.lines.add(id=-1, name="TensorFlow Ops", timestamp_ns=1_000).events.add(metadata_id=1, duration_ps=9)
    path = tmp_path / "hand.xplane.pb"
    path.write_bytes(space.SerializeToString())

    table = load_xplane(path)

    row = table.kernels.iloc[0]
    assert len(table.kernels) == 1
    assert (row["name"], row["short_name"], row["op"]) == (
        "volta_sgemm_128x64_nn",
        "volta_sgemm_128x64_nn",
        "model/dense/MatMul:MatMul",
    )
    assert (row["start_ns"], row["dur_ns"], row["device_id"], row["stream_id"], row["correlation_id"]) == (
        3_500,
        7,
        3,
        17,
        42,
    )
    assert [row[c] for c in ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z")] == [
        7,
        2,
        1,
        128,
        1,
        1,
    ]
    assert table.memory.to_dict("records") == [
        {"kind": "memset", "start_ns": 10_000, "dur_ns": 3, "bytes": 4096, "device_id": 3, "stream_id": 17}
    ]
    assert [(d.id, d.sm_count, d.compute_capability) for d in table.devices] == [(3, 108, "8.0")]
