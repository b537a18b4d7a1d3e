"""PyTorch profiler traces (Kineto Chrome-trace JSON) -> KernelTable, through ``load_trace`` and the CLI.

Expected values come from a plain ``json``/``gzip`` read of each file in this module, never
from the parser. The CPU traces are written by a real ``torch.profiler`` run of a tiny
conv net; the small GPU traces by ``fixtures_kineto``.
"""

from __future__ import annotations

import bisect
import functools
import gzip
import json
import os
import re
import shutil
from collections import Counter, defaultdict
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from fixtures_kineto import (
    AUTOGRAD_THREAD,
    Launch,
    annotation,
    cpu_op,
    gpu_events,
    memory_event,
    simple_gpu_trace,
    trace_document,
    write_trace,
)
from fixtures_traces import SHARED_TRACES, real_traces

from detprof.cli import main
from detprof.errors import ExitCode, InputError
from detprof.traces.kernel_table import KERNEL_DTYPES, MEMORY_DTYPES
from detprof.traces.kernel_tables import top_n
from detprof.traces.parsers import KNOWN_FORMATS, load_trace
from detprof.traces.step_split import kernel_ns_by_step, within_steps

A100 = SHARED_TRACES / "kineto-a100-control.json.gz"
V100 = SHARED_TRACES / "kineto-v100-test.json.gz"
ALEXNET = SHARED_TRACES / "kineto-alexnet-a100.json.gz"
ROCM = SHARED_TRACES / "kineto-rocm-mi250.json.gz"
REAL = [A100, V100, ALEXNET, ROCM]


each_real_trace = pytest.mark.parametrize(
    "path", [pytest.param(p, marks=real_traces(p), id=p.name.removesuffix(".json.gz")) for p in REAL]
)


# --- a plain read of a trace -------------------------------------------------------------


@functools.cache
def plain(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as fh:
        return json.load(fh)


def ns(microseconds: float) -> int:
    return round(microseconds * 1000)


def events_of(doc: dict[str, Any], *categories: str) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") in categories]


def totals_by_name(doc: dict[str, Any]) -> dict[str, list[int]]:
    durations: dict[str, list[int]] = defaultdict(list)
    for e in events_of(doc, "kernel"):
        durations[e["name"]].append(ns(e["dur"]))
    return durations


def ranked(durations: dict[str, list[int]]) -> list[tuple[str, int, int]]:
    """(name, instances, total) by total time, largest first, ties by name (as nsys's report orders them)."""
    rows = [(name, len(d), sum(d)) for name, d in durations.items()]
    return sorted(rows, key=lambda r: (-r[2], r[0]))


def launch_steps(doc: dict[str, Any], step_names: str = "ProfilerStep#") -> list[tuple[int | None, dict[str, Any]]]:
    """Each kernel with the CPU step range its launching runtime call (same correlation) ran in; None for none."""
    steps = sorted(
        (e for e in events_of(doc, "user_annotation") if e["name"].startswith(step_names)), key=lambda e: e["ts"]
    )
    starts = [e["ts"] for e in steps]
    launched = {e["args"]["correlation"]: e["ts"] for e in events_of(doc, "cuda_runtime", "cuda_driver")}
    out: list[tuple[int | None, dict[str, Any]]] = []
    for k in events_of(doc, "kernel"):
        at = launched.get(k["args"]["correlation"])
        i = None if at is None else bisect.bisect_right(starts, at) - 1
        inside = i is not None and i >= 0 and at < steps[i]["ts"] + steps[i]["dur"]
        out.append((i if inside else None, k))
    return out


def launch_step_totals(doc: dict[str, Any]) -> list[int]:
    count = sum(1 for e in events_of(doc, "user_annotation") if e["name"].startswith("ProfilerStep#"))
    totals = [0] * count
    for step, k in launch_steps(doc):
        if step is not None:
            totals[step] += ns(k["dur"])
    return totals


# --- the real GPU traces ----------------------------------------------------------------


README_FACTS = {
    "kineto-a100-control.json.gz": (8568, 446_813_000, [3], 170),
    "kineto-v100-test.json.gz": (9876, 801_858_000, [1], 131),
    "kineto-alexnet-a100.json.gz": (79, 10_692_000, [0], 16),
    "kineto-rocm-mi250.json.gz": (14, 110_881, [2], 12),
}


@each_real_trace
def test_plain_read_agrees_with_the_published_facts(path: Path) -> None:
    """The test's own reading of the files says what ../shared/traces/README.md says about them."""
    doc = plain(path)
    kernels = events_of(doc, "kernel")
    count, total, devices, distinct = README_FACTS[path.name]
    assert (len(kernels), sum(ns(e["dur"]) for e in kernels)) == (count, total)
    assert sorted({e["args"]["device"] for e in kernels}) == devices
    assert len({e["name"] for e in kernels}) == distinct


@each_real_trace
def test_load_trace_matches_a_plain_read(path: Path) -> None:
    doc = plain(path)
    kernels = events_of(doc, "kernel")
    table = load_trace(path)

    assert table.format == "kineto-json" and table.source == str(path)
    assert list(table.kernels.columns) == list(KERNEL_DTYPES)
    assert {c: str(t) for c, t in table.kernels.dtypes.items()} == KERNEL_DTYPES
    assert table.kernel_count == len(kernels)
    assert table.total_ns == sum(ns(e["dur"]) for e in kernels)
    assert Counter(table.kernels["name"].astype(str)) == Counter(e["name"] for e in kernels)
    assert sorted(table.kernels["start_ns"].tolist()) == sorted(ns(e["ts"]) for e in kernels)
    got = table.kernels
    assert Counter(zip(got["device_id"], got["stream_id"], got["correlation_id"], strict=True)) == Counter(
        (e["args"]["device"], e["args"]["stream"], e["args"]["correlation"]) for e in kernels
    )
    dims = got[["grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z"]]
    expected_dims = Counter(
        tuple(e["args"]["grid"] + e["args"]["block"]) if "grid" in e["args"] else (None,) * 6 for e in kernels
    )
    assert Counter(tuple(None if pd.isna(v) else int(v) for v in row) for row in dims.itertuples(False)) == (
        expected_dims
    )

    head, other_ns = top_n(table, 10)
    expected = ranked(totals_by_name(doc))
    assert list(zip(head["name"], head["instances"], head["total_ns"], strict=True)) == expected[:10]
    assert other_ns == sum(total for _, _, total in expected[10:])


@each_real_trace
def test_devices_are_those_that_ran_kernels(path: Path) -> None:
    doc = plain(path)
    ran = sorted({e["args"]["device"] for e in events_of(doc, "kernel")})
    properties = {p["id"]: p for p in doc["deviceProperties"]}
    assert len(properties) > len(ran)  # deviceProperties lists every GPU of the machine

    devices = load_trace(path).devices

    assert [d.id for d in devices] == ran
    for device in devices:
        p = properties[device.id]
        assert (device.name, device.sm_count, device.memory_bytes) == (p["name"], p["numSms"], p["totalGlobalMem"])
        assert device.compute_capability == f"{p['computeMajor']}.{p['computeMinor']}"


@each_real_trace
def test_memory_rows_match_a_plain_read(path: Path) -> None:
    doc = plain(path)
    copies = events_of(doc, "gpu_memcpy", "gpu_memset")
    memory = load_trace(path).memory

    assert memory is not None and list(memory.columns) == list(MEMORY_DTYPES)
    assert len(memory) == len(copies)
    assert int(memory["dur_ns"].sum()) == sum(ns(e["dur"]) for e in copies)
    kinds = Counter("memset" if e["cat"] == "gpu_memset" else "memcpy " + e["name"].split()[1] for e in copies)
    assert Counter(memory["kind"].astype(str)) == kinds
    assert sorted(memory["bytes"].dropna().astype(int)) == sorted(
        e["args"]["bytes"] for e in copies if "bytes" in e["args"]
    )


def parse_json(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code = main(["parse", *args, "--format", "json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


@each_real_trace
def test_parse_cli_matches_a_plain_read(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = plain(path)
    kernels = events_of(doc, "kernel")
    properties = {p["id"]: p for p in doc["deviceProperties"]}

    out = parse_json([str(path), "--top", "5"], capsys)

    assert out["format"] == "kineto-json"
    assert out["kernel_count"] == len(kernels)
    assert out["total_ns"] == sum(ns(e["dur"]) for e in kernels)
    assert out["memory_ns"] == sum(ns(e["dur"]) for e in events_of(doc, "gpu_memcpy", "gpu_memset"))
    ran = sorted({e["args"]["device"] for e in kernels})
    assert [(d["id"], d["name"], d["sm_count"], d["compute_capability"]) for d in out["devices"]] == [
        (i, properties[i]["name"], properties[i]["numSms"], f"{properties[i]['computeMajor']}.0") for i in ran
    ]
    expected = ranked(totals_by_name(doc))
    assert [(k["name"], k["instances"], k["total_ns"]) for k in out["kernels"]] == expected[:5]
    assert out["other_ns"] == sum(total for _, _, total in expected[5:])


@real_traces(A100)
def test_a100_top_kernel_is_the_nccl_send_recv(capsys: pytest.CaptureFixture[str]) -> None:
    out = parse_json([str(A100), "--top", "1"], capsys)
    top = out["kernels"][0]
    assert (top["name"], top["instances"], top["total_ns"]) == (
        "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)",
        42,
        130_655_000,
    )
    assert top["category"] == "communication"


@real_traces(A100)
def test_a100_steps_are_the_profiler_steps_of_the_launching_calls() -> None:
    doc = plain(A100)
    expected = launch_step_totals(doc)
    assert len(expected) == 6 and sum(expected) == sum(ns(e["dur"]) for e in events_of(doc, "kernel"))

    table = load_trace(A100)

    assert table.nvtx is not None and table.nvtx["text"].tolist() == [f"step {i}" for i in range(6)]
    assert kernel_ns_by_step(table) == expected
    within = within_steps(table)
    assert within is not None and within.kernel_count == table.kernel_count


@real_traces(ROCM)
def test_rocm_steps_count_the_kernels_autograd_threads_launch() -> None:
    """The GPU-side ProfilerStep range holds only the kernels of the annotating thread."""
    doc = plain(ROCM)
    expected = launch_step_totals(doc)
    (gpu_step,) = [e for e in events_of(doc, "gpu_user_annotation") if e["name"].startswith("ProfilerStep#")]
    inside_gpu_range = sum(
        ns(e["dur"]) for e in events_of(doc, "kernel") if gpu_step["ts"] <= e["ts"] < gpu_step["ts"] + gpu_step["dur"]
    )
    assert expected == [110_881, 0] and inside_gpu_range == 53_920

    assert kernel_ns_by_step(load_trace(ROCM)) == expected


@real_traces(V100)
def test_v100_steps_where_the_gpu_runs_a_step_behind() -> None:
    """Step i+1's first kernels start before step i's last: no range split is exact, the one chosen misplaces least.

    Splitting at each step's first kernel, the obvious alternative, moves step i's late kernels
    (tens of milliseconds) into step i+1.
    """
    doc = plain(V100)
    expected = launch_step_totals(doc)
    table = load_trace(V100)
    got = kernel_ns_by_step(table)
    assert got is not None and len(got) == len(expected) == 6
    assert table.nvtx is not None
    starts, ends = table.nvtx["start_ns"].tolist(), table.nvtx["end_ns"].tolist()
    assert all(e <= s for e, s in zip(ends, starts[1:], strict=False))
    assert all(abs(g - e) <= 0.06 * e for g, e in zip(got, expected, strict=True))

    first_kernels = [min(ns(k["ts"]) for step, k in launch_steps(doc) if step == i) for i in range(6)]
    naive_starts = [*first_kernels, 2**62]
    kernels = [(ns(e["ts"]), ns(e["dur"])) for e in events_of(doc, "kernel")]
    naive = [sum(d for t, d in kernels if naive_starts[i] <= t < naive_starts[i + 1]) for i in range(6)]
    assert sum(abs(g - e) for g, e in zip(got, expected, strict=True)) < sum(
        abs(n - e) for n, e in zip(naive, expected, strict=True)
    )


@pytest.mark.parametrize(
    "path", [pytest.param(p, marks=real_traces(p), id=p.name.removesuffix(".json.gz")) for p in (A100, V100, ROCM)]
)
def test_the_table_within_steps_holds_the_kernels_launched_in_them(path: Path) -> None:
    """``within_steps`` (what a run's record counts) keeps every kernel launched in a step and none launched outside.

    Kernels whose launching call the trace lacks (546 in the V100 file, NCCL's among them) have only
    their GPU time to go by: those kept ran within a step's kernel span. Every kept row is a GPU
    kernel of the file, once.
    """
    doc = plain(path)
    kernels = events_of(doc, "kernel")
    launched = {e["args"]["correlation"] for e in events_of(doc, "cuda_runtime", "cuda_driver")}
    in_steps = Counter(k["args"]["correlation"] for step, k in launch_steps(doc) if step is not None)
    in_steps_ns = sum(ns(k["dur"]) for step, k in launch_steps(doc) if step is not None)

    within = within_steps(load_trace(path))

    assert within is not None
    kept = Counter(within.kernels["correlation_id"].tolist())
    assert kept & in_steps == in_steps  # every kernel launched in a step
    assert not (set(kept - in_steps) & launched)  # the others: kernels whose launch the trace lacks
    by_kernel = Counter((k["name"], k["args"]["correlation"], ns(k["ts"]), ns(k["dur"])) for k in kernels)
    rows = within.kernels
    got = Counter(zip(rows["name"].astype(str), rows["correlation_id"], rows["start_ns"], rows["dur_ns"], strict=True))
    assert got & by_kernel == got  # GPU kernels of the file only, none twice
    assert sum(kernel_ns_by_step(within) or []) == within.total_ns >= in_steps_ns


@real_traces(ALEXNET)
def test_a_trace_without_step_annotations_is_not_restricted() -> None:
    """The AlexNet benchmark marks no ProfilerStep (nor detprof's steps): nothing to restrict the table to."""
    names = {e["name"] for e in events_of(plain(ALEXNET), "user_annotation")}
    assert not any(n.startswith("ProfilerStep#") or re.match(r"^step \d+$", n) for n in names)

    table = load_trace(ALEXNET)

    assert within_steps(table) is None and kernel_ns_by_step(table) is None


@real_traces(A100, V100)
def test_diff_names_the_changed_kernels(capsys: pytest.CaptureFixture[str]) -> None:
    base, other = totals_by_name(plain(A100)), totals_by_name(plain(V100))

    def status(name: str) -> str:
        if name not in base:
            return "added"
        if name not in other:
            return "removed"
        b, o = sum(base[name]), sum(other[name])
        return "slower" if o > b * 1.02 else "faster" if o < b * 0.98 else "same"

    delta = {n: sum(other.get(n, [])) - sum(base.get(n, [])) for n in base.keys() | other.keys()}
    biggest = sorted(delta, key=lambda n: (-abs(delta[n]), n))[:15]

    code = main(["diff", str(A100), str(V100), "--format", "json", "--top", "15"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    out = json.loads(captured.out)

    assert [(k["name"], k["status"], k["delta_ns"]) for k in out["kernels"]] == [
        (n, status(n), delta[n]) for n in biggest
    ]
    assert {k["status"] for k in out["kernels"]} >= {"added", "removed", "slower"}
    assert out["kernels_in_common"] == len(base.keys() & other.keys())
    nccl = {k["category"] for k in out["kernels"] if k["name"].startswith("ncclKernel_")}
    assert nccl == {"communication"}


@real_traces(A100, V100)
def test_a_folder_of_rank_files(tmp_path: Path) -> None:
    """tensorboard_trace_handler's layout: one <worker>.<time>.pt.trace.json.gz per rank (a100: 3, v100: 1)."""
    shutil.copy(A100, tmp_path / "host-a.1661203462.pt.trace.json.gz")
    shutil.copy(V100, tmp_path / "host-b.1661938466.pt.trace.json.gz")

    with pytest.raises(InputError, match=r"several ranks \(1, 3\); choose one with --rank"):
        load_trace(tmp_path)
    assert load_trace(tmp_path, rank=3).kernel_count == len(events_of(plain(A100), "kernel"))
    assert load_trace(tmp_path, rank=1).kernel_count == len(events_of(plain(V100), "kernel"))
    message = _input_error(tmp_path, rank=0)
    assert message == f"{tmp_path}: no trace of rank 0; ranks here: 1, 3"


# --- small traces written here ----------------------------------------------------------


def _input_error(path: Path, rank: int | None = None) -> str:
    with pytest.raises(InputError) as info:
        load_trace(path, rank=rank)
    message = str(info.value)
    assert str(path) in message and "\n" not in message
    assert info.value.exit_code == ExitCode.INPUT
    return message


def _gpu_trace(tmp_path: Path, events: list[dict[str, object]], name: str = "trace.json", **doc: Any) -> Path:
    return write_trace(tmp_path / name, trace_document(events, **doc))


def test_times_are_rounded_to_whole_nanoseconds(tmp_path: Path) -> None:
    """Microseconds (integers in old traces, fractions in new ones) x 1000, each rounded, never truncated."""
    launches = [
        Launch("epoch_int", 1661203462598738, 7, 1661203462598700),
        Launch("fraction", 4203669603771.648, 6.88, None),
        Launch("round_up", 1661203462598900.0004, 1.9996, None),
        Launch("tiny", 1661203462599000, 0.0014, None),
    ]
    table = load_trace(_gpu_trace(tmp_path, gpu_events(launches), devices=1))
    got = {
        n: (s, d)
        for n, s, d in zip(table.kernels["name"], table.kernels["start_ns"], table.kernels["dur_ns"], strict=True)
    }
    assert got == {
        "epoch_int": (1661203462598738000, 7000),
        "fraction": (4203669603771648, 6880),
        "round_up": (1661203462598900000, 2000),
        "tiny": (1661203462599000000, 1),
    }


def test_kernel_columns_come_from_the_event_args(tmp_path: Path) -> None:
    launches = [
        Launch("void at::native::reduce_kernel<512, 1>(int)", 10.0, 2.0, 1.0, device=1, stream=13, grid=(4, 2, 1)),
        Launch("ampere_sgemm_128x64_nn", 20.0, 3.0, 2.0, device=1, stream=7, block=(256, 1, 1)),
    ]
    events = [
        *gpu_events(launches, first_correlation=500),
        memory_event("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 5.0, 1.5, 4096, device=1),
        memory_event("gpu_memcpy", "Memcpy DtoD (Device -> Device)", 6.0, 0.5, 64, device=1),
        memory_event("gpu_memset", "Memset (Device)", 7.0, 0.25, 8, device=1),
        memory_event("gpu_memcpy", "Memcpy HtoD (Host -> Device)", 8.0, 1.0, None, device=1),
    ]
    table = load_trace(_gpu_trace(tmp_path, events, devices=4))

    k = table.kernels
    assert k["name"].astype(str).tolist() == [launches[0].name, launches[1].name]
    assert k["short_name"].astype(str).tolist() == ["reduce_kernel", "ampere_sgemm_128x64_nn"]
    assert k["device_id"].tolist() == [1, 1] and k["stream_id"].tolist() == [13, 7]
    assert k["correlation_id"].tolist() == [500, 501]
    assert k[["grid_x", "grid_y", "grid_z"]].to_numpy().tolist() == [[4, 2, 1], [1, 1, 1]]
    assert k[["block_x", "block_y", "block_z"]].to_numpy().tolist() == [[128, 1, 1], [256, 1, 1]]
    assert [(d.id, d.name, d.sm_count, d.compute_capability) for d in table.devices] == [
        (1, "NVIDIA Test GPU 1", 101, "8.6")
    ]
    assert table.memory is not None
    assert table.memory["kind"].tolist() == ["memcpy HtoD", "memcpy DtoD", "memset", "memcpy HtoD"]
    assert table.memory["bytes"].tolist()[:3] == [4096, 64, 8] and table.memory["bytes"].isna().tolist()[3]
    assert table.memory_ns == 1500 + 500 + 250 + 1000
    assert table.graph_launches == 0


def _steps_trace(tmp_path: Path, launches: list[Launch], annotations: list[dict[str, object]]) -> Path:
    return _gpu_trace(tmp_path, [*annotations, *gpu_events(launches)], devices=1)


def test_steps_follow_the_launching_call_not_the_gpu_annotation(tmp_path: Path) -> None:
    """Kineto draws the GPU-side step range around the annotating thread's kernels only."""
    launches = [
        Launch("forward", 300.0, 10.0, 110.0),
        Launch("backward", 320.0, 30.0, 150.0, thread=AUTOGRAD_THREAD),
        Launch("next_forward", 500.0, 20.0, 210.0),
    ]
    annotations = [
        annotation("ProfilerStep#7", 100.0, 100.0),
        annotation("ProfilerStep#8", 200.0, 100.0),
        annotation("ProfilerStep#7", 299.0, 12.0, gpu=True),
        annotation("ProfilerStep#8", 499.0, 30.0, gpu=True),
    ]
    table = load_trace(_steps_trace(tmp_path, launches, annotations))
    assert kernel_ns_by_step(table) == [40_000, 20_000]


def test_the_gpu_annotation_is_used_where_it_holds_every_kernel(tmp_path: Path) -> None:
    launches = [Launch("a", 300.0, 10.0, 110.0), Launch("b", 320.0, 30.0, 150.0), Launch("c", 500.0, 20.0, 210.0)]
    annotations = [
        annotation("ProfilerStep#7", 100.0, 100.0),
        annotation("ProfilerStep#8", 200.0, 100.0),
        annotation("ProfilerStep#7", 299.0, 60.0, gpu=True),
        annotation("ProfilerStep#8", 499.0, 30.0, gpu=True),
    ]
    table = load_trace(_steps_trace(tmp_path, launches, annotations))
    assert table.nvtx is not None
    assert table.nvtx.values.tolist() == [["step 0", 299_000, 359_000], ["step 1", 499_000, 529_000]]
    assert kernel_ns_by_step(table) == [40_000, 20_000]


def test_steps_without_kernels_and_kernels_without_steps(tmp_path: Path) -> None:
    """A kernel launched before the trace began (no runtime call in it) belongs to no step; an idle step counts 0."""
    launches = [
        Launch("left_over", 95.0, 50.0, None),
        Launch("a", 150.0, 10.0, 110.0),
        Launch("c", 400.0, 20.0, 310.0),
    ]
    annotations = [
        annotation("ProfilerStep#1", 100.0, 100.0),
        annotation("ProfilerStep#2", 200.0, 100.0),
        annotation("ProfilerStep#3", 300.0, 100.0),
    ]
    table = load_trace(_steps_trace(tmp_path, launches, annotations))
    assert kernel_ns_by_step(table) == [10_000, 0, 20_000]
    within = within_steps(table)
    assert within is not None and within.kernel_count == 2


def test_interleaved_steps_meet_where_least_kernel_time_is_misplaced(tmp_path: Path) -> None:
    """Step 1's first kernel (stream 14) starts while step 0's last (stream 15) has yet to start.

    Splitting at step 1's first kernel would move step 0's 40 us kernel; splitting after it
    moves step 1's 5 us kernel instead, the least possible.
    """
    launches = [
        Launch("s0_main", 1000.0, 100.0, 100.0),
        Launch("s0_late", 1160.0, 40.0, 150.0, stream=15),
        Launch("s1_early", 1150.0, 5.0, 210.0, stream=14),
        Launch("s1_main", 1200.0, 100.0, 220.0),
    ]
    annotations = [annotation("ProfilerStep#1", 90.0, 110.0), annotation("ProfilerStep#2", 200.0, 100.0)]
    table = load_trace(_steps_trace(tmp_path, launches, annotations))
    assert kernel_ns_by_step(table) == [145_000, 100_000]


def test_detprof_step_markers_win_over_profiler_steps(tmp_path: Path) -> None:
    launches = [Launch("a", 300.0, 10.0, 110.0), Launch("b", 320.0, 30.0, 150.0), Launch("c", 500.0, 20.0, 210.0)]
    annotations = [
        annotation("ProfilerStep#1", 100.0, 200.0),
        annotation("step 0", 105.0, 40.0),
        annotation("step 1", 146.0, 100.0),
    ]
    table = load_trace(_steps_trace(tmp_path, launches, annotations))
    assert table.nvtx is not None and table.nvtx["text"].tolist() == ["step 0", "step 1"]
    assert kernel_ns_by_step(table) == [10_000, 50_000]


def test_gzip_is_recognised_by_its_magic_bytes(tmp_path: Path) -> None:
    compressed = simple_gpu_trace(tmp_path / "trace.json", compress=True)
    plain_text = simple_gpu_trace(tmp_path / "trace.json.gz")
    for path in (compressed, plain_text):
        table = load_trace(path)
        assert (table.format, table.kernel_count, table.total_ns) == ("kineto-json", 2, 10_000)


# --- ranks --------------------------------------------------------------------------------


def test_a_folder_with_one_trace_needs_no_rank(tmp_path: Path) -> None:
    simple_gpu_trace(tmp_path / "worker.123.pt.trace.json")
    (tmp_path / "notes.json").write_text('{"epochs": 3}')
    table = load_trace(tmp_path)
    assert table.source == str(tmp_path / "worker.123.pt.trace.json") and table.kernel_count == 2


def test_rank_selection_in_a_folder(tmp_path: Path) -> None:
    simple_gpu_trace(tmp_path / "w0.1.pt.trace.json.gz", rank=0, compress=True)
    simple_gpu_trace(tmp_path / "w1.1.pt.trace.json", rank=1)

    assert _input_error(tmp_path) == f"{tmp_path}: traces of several ranks (0, 1); choose one with --rank"
    assert load_trace(tmp_path, rank=1).source == str(tmp_path / "w1.1.pt.trace.json")
    assert load_trace(tmp_path, rank=0).source == str(tmp_path / "w0.1.pt.trace.json.gz")
    assert _input_error(tmp_path, rank=7) == f"{tmp_path}: no trace of rank 7; ranks here: 0, 1"


def test_several_cycles_of_one_rank_read_the_newest(tmp_path: Path) -> None:
    old = simple_gpu_trace(tmp_path / "w0.100.pt.trace.json", rank=0)
    new = simple_gpu_trace(tmp_path / "w0.200.pt.trace.json", rank=0)
    os.utime(old, ns=(2_000_000_000_000_000_000, 2_000_000_000_000_000_000))
    os.utime(new, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
    assert load_trace(tmp_path).source == str(old)
    assert load_trace(tmp_path, rank=0).source == str(old)


def test_a_file_of_another_rank(tmp_path: Path) -> None:
    path = simple_gpu_trace(tmp_path / "trace.json", rank=2)
    assert load_trace(path, rank=2).kernel_count == 2
    assert _input_error(path, rank=3) == f"{path}: holds rank 2, not rank 3"
    single = simple_gpu_trace(tmp_path / "single.json")
    assert "not a distributed trace" in _input_error(single, rank=0)


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _one_line_error(code: int, out: str, err: str, exit_code: int = ExitCode.INPUT) -> str:
    assert code == exit_code and out == ""
    assert err.startswith("detprof: error: ") and err.count("\n") == 1 and "Traceback" not in err
    return err.removeprefix("detprof: error: ").strip()


def test_rank_option_of_parse_and_diff(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        simple_gpu_trace(tmp_path / folder / "w0.pt.trace.json", rank=0)
        simple_gpu_trace(tmp_path / folder / "w1.pt.trace.json", rank=1)
    a, b = tmp_path / "a", tmp_path / "b"

    code, out, err = _cli(["parse", str(a), "--rank", "1", "--format", "json"], capsys)
    assert code == 0, err
    assert json.loads(out)["source"] == str(a / "w1.pt.trace.json")
    code, out, err = _cli(["diff", str(a), str(b), "--rank", "0", "--format", "json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["base"]["source"], doc["other"]["source"]) == (str(a / "w0.pt.trace.json"), str(b / "w0.pt.trace.json"))
    assert _one_line_error(*_cli(["parse", str(a), "--rank", "5"], capsys)) == (
        f"{a}: no trace of rank 5; ranks here: 0, 1"
    )
    assert "choose one with --rank" in _one_line_error(*_cli(["diff", str(a), str(b)], capsys))


def test_rank_of_a_trace_that_has_none_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("not a trace\n")
    message = _one_line_error(*_cli(["parse", str(notes), "--rank", "0"], capsys), exit_code=ExitCode.USAGE)
    assert "--rank" in message and str(notes) in message


# --- bad input ----------------------------------------------------------------------------


def _truncated_gzip(path: Path) -> Path:
    data = gzip.compress(json.dumps(trace_document(gpu_events([Launch("k", 1.0, 1.0, 0.5)] * 200))).encode())
    path.write_bytes(data[: len(data) // 2])
    return path


def _corrupt_gzip(path: Path) -> Path:
    data = bytearray(gzip.compress(json.dumps(trace_document(gpu_events([Launch("k", 1.0, 1.0, 0.5)]))).encode()))
    data[-8:-4] = bytes(4)  # the CRC-32 of the content
    path.write_bytes(bytes(data))
    return path


def _text(content: str) -> Any:
    def write(path: Path) -> Path:
        path.write_text(content)
        return path

    return write


def _document(events: list[dict[str, object]]) -> Any:
    def write(path: Path) -> Path:
        return write_trace(path, trace_document(events))

    return write


BAD_TRACES = {
    "truncated-gzip": (_truncated_gzip, "truncated gzip file"),
    "corrupt-gzip": (_corrupt_gzip, "corrupt gzip file"),
    "invalid-json": (_text('{"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "kernel",'), "invalid JSON"),
    "wrong-type": (_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": "soon"}]}'), "unexpected value"),
    "no-kernels-or-ops": (
        _document([annotation("ProfilerStep#1", 1.0, 2.0), cpu_op("x", 1.0, 1.0) | {"cat": "python_function"}]),
        "without GPU kernels or CPU ops",
    ),
    "no-events": (_text('{"schemaVersion": 1, "traceEvents": []}'), "without GPU kernels or CPU ops"),
}


@pytest.mark.parametrize(("writer", "says"), BAD_TRACES.values(), ids=BAD_TRACES.keys())
def test_bad_traces_are_one_line_input_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], writer: Any, says: str
) -> None:
    path = writer(tmp_path / "trace.json.gz")
    assert says in _input_error(path)
    message = _one_line_error(*_cli(["parse", str(path)], capsys))
    assert message.startswith(f"{path}: ") and says in message


NOT_KINETO = {
    "object-without-traceEvents": (_text('{"epochs": 3, "loss": [0.5, 0.4]}'), "JSON, but without traceEvents"),
    "array": (_text('[{"ph": "X"}]'), "JSON, but an array, not an object with traceEvents"),
    "toml": (_text('[build-system]\nrequires = ["setuptools"]\n'), "not JSON"),
    "gzip-of-text": (
        lambda p: p.write_bytes(gzip.compress(b"epoch,loss\n1,0.5\n")) and p,
        "gzip-compressed, but not JSON inside",
    ),
    "gzip-without-traceEvents": (
        lambda p: p.write_bytes(gzip.compress(b'{"a": 1}')) and p,
        "gzip-compressed JSON, but without traceEvents",
    ),
}


@pytest.mark.parametrize(("writer", "what"), NOT_KINETO.values(), ids=NOT_KINETO.keys())
def test_json_that_is_no_profiler_trace_is_not_a_trace_detprof_reads(tmp_path: Path, writer: Any, what: str) -> None:
    path = writer(tmp_path / "data.json")
    message = _input_error(path)
    assert message == f"{path}: not a trace detprof reads ({KNOWN_FORMATS}); {what}"
    assert "PyTorch profiler JSON" in KNOWN_FORMATS


def test_a_folder_without_traces_names_both_kinds(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"lr": 0.1}')
    message = _input_error(tmp_path)
    assert "no TensorFlow profile" in message and "no PyTorch profiler trace" in message


# --- CPU-only traces from a real torch.profiler run -------------------------------------------


@pytest.fixture(scope="module")
def cpu_traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three steps of a tiny conv net marked with record_function("step i"), and a scheduled run's folder."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, record_function, schedule, tensorboard_trace_handler

    out = tmp_path_factory.mktemp("torch-cpu")
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.BatchNorm2d(4),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(4 * 7 * 7, 5),
    )
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    x, y = torch.randn(2, 3, 16, 16), torch.tensor([1, 3])

    def train_step() -> None:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        optimizer.step()

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(3):
            with record_function(f"step {i}"):
                train_step()
    marked = out / "marked.json"
    prof.export_chrome_trace(str(marked))

    folder = out / "scheduled"
    handler = tensorboard_trace_handler(str(folder), worker_name="worker0", use_gzip=True)
    with profile(
        activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=2), on_trace_ready=handler
    ) as prof:
        for _ in range(4):
            train_step()
            prof.step()
    return {"marked": marked, "scheduled": folder}


def _open(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    return json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)


def exact_ns(microseconds: float) -> int:
    """A JSON microsecond value as whole nanoseconds, rounded in decimal (no float product)."""
    return int((Decimal(repr(microseconds)) * 1000).to_integral_value(ROUND_HALF_EVEN))


def expected_self_times(doc: dict[str, Any]) -> list[tuple[str, int, int, int]]:
    """(name, start, self time, thread) of each CPU op: its interval less the union of the ops inside it.

    Brute force over intervals, unlike the parser's call stack: an op contains another on its
    thread that lies within it; of two with the same interval the first in the file is the parent.
    """
    ops = [
        (e["name"], exact_ns(e["ts"]), exact_ns(e["ts"]) + round(e["dur"] * 1000), (e["pid"], e["tid"]))
        for e in events_of(doc, "cpu_op")
    ]
    out = []
    for i, (name, start, end, thread) in enumerate(ops):
        inside = sorted(
            (s, e)
            for j, (_, s, e, t) in enumerate(ops)
            if j != i and t == thread and start <= s and e <= end and ((s, e) != (start, end) or j > i)
        )
        out.append((name, start, end - start - union_length(inside), hash(thread)))
    return out


def union_length(intervals: list[tuple[int, int]]) -> int:
    covered, reach = 0, None
    for s, e in sorted(intervals):
        if reach is None or s >= reach:
            covered += e - s
            reach = e
        elif e > reach:
            covered += e - reach
            reach = e
    return covered


def test_cpu_trace_times_ops_by_self_time(cpu_traces: dict[str, Path]) -> None:
    path = cpu_traces["marked"]
    doc = _open(path)
    expected = expected_self_times(doc)
    ops = events_of(doc, "cpu_op")
    spans = [(exact_ns(e["ts"]), exact_ns(e["ts"]) + round(e["dur"] * 1000)) for e in ops]

    table = load_trace(path)

    assert table.format == "kineto-cpu-json" and table.kernel_count == len(ops) > 100
    per_name: dict[str, int] = defaultdict(int)
    for name, _, self_ns, _ in expected:
        per_name[name] += self_ns
    got = table.kernels.groupby(table.kernels["name"].astype(str))["dur_ns"].sum().to_dict()
    assert got == per_name
    assert table.total_ns == sum(per_name.values()) == union_length(spans)
    assert table.total_ns <= max(e for _, e in spans) - min(s for s, _ in spans)
    assert per_name["aten::mkldnn_convolution"] > 0 and per_name["aten::conv2d"] < per_name["aten::mkldnn_convolution"]
    ops_of_conv2d = set(table.kernels.loc[table.kernels["name"] == "aten::mkldnn_convolution", "op"].astype(str))
    assert ops_of_conv2d == {"aten::conv2d"}
    assert [d.id for d in table.devices] == [0] and table.memory is None


def test_cpu_trace_steps_are_detprofs_markers(cpu_traces: dict[str, Path]) -> None:
    doc = _open(cpu_traces["marked"])
    markers = sorted(
        (e for e in events_of(doc, "user_annotation") if e["name"].startswith("step ")), key=lambda e: e["ts"]
    )
    bounds = [(exact_ns(e["ts"]), exact_ns(e["ts"]) + round(e["dur"] * 1000)) for e in markers]
    expected = [sum(d for _, s, d, _ in expected_self_times(doc) if lo <= s < hi) for lo, hi in bounds]

    table = load_trace(cpu_traces["marked"])

    assert table.nvtx is not None and table.nvtx["text"].tolist() == ["step 0", "step 1", "step 2"]
    assert kernel_ns_by_step(table) == expected and all(expected)


def test_scheduled_cpu_trace_folder_steps_are_the_profiler_steps(
    cpu_traces: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    folder = cpu_traces["scheduled"]
    (file,) = folder.iterdir()
    assert file.name.endswith(".pt.trace.json.gz")
    doc = _open(file)
    steps = sorted(
        (e for e in events_of(doc, "user_annotation") if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"]
    )
    bounds = [(exact_ns(e["ts"]), exact_ns(e["ts"]) + round(e["dur"] * 1000)) for e in steps]
    expected = [sum(d for _, s, d, _ in expected_self_times(doc) if lo <= s < hi) for lo, hi in bounds]

    table = load_trace(folder)

    assert table.format == "kineto-cpu-json" and table.source == str(file)
    assert len(expected) == 2 and kernel_ns_by_step(table) == expected
    out = parse_json([str(folder), "--top", "3"], capsys)
    assert out["format"] == "kineto-cpu-json" and out["kernel_count"] == len(events_of(doc, "cpu_op"))
