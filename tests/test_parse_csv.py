"""nsys stats CSVs, nvprof CSVs (trace and summary) and kernel base names."""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from pathlib import Path

import pandas as pd
import pytest
from fixtures_traces import NVPROF_SUMMARY_HEADER, NVPROF_TRACE_HEADER, SHARED_TRACES, nvprof_section, real_traces

from detprof.errors import InputError
from detprof.traces.kernel_names import short_kernel_name
from detprof.traces.kernel_table import KERNEL_DTYPES, MEMORY_DTYPES, SUMMARY_DTYPES, Device
from detprof.traces.parsers import load_trace

NVPROF_CFD = SHARED_TRACES / "nvprof-cfd-titanxp.gpu-trace.csv"

FOO = "void foo<float, 2>(float*, int)"
BAR = "bar(int)"


@pytest.mark.parametrize(
    ("name", "short"),
    [
        ("void foo<float, 2>(float*, int)", "foo"),
        ("foo(int, float)", "foo"),
        ("EigenMetaKernel", "EigenMetaKernel"),
        ("sm80_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32",) * 2,
        ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(Params)", "Kernel"),
        (
            "void Eigen::internal::EigenMetaKernel<Eigen::TensorEvaluator<Eigen::TensorAssignOp<"
            "Eigen::TensorMap<Eigen::Tensor<float, 1, 1, long>, 16>, Eigen::TensorCwiseUnaryOp<"
            "Eigen::internal::scalar_square_op<float>, Eigen::TensorMap<float const> const> const>, "
            "Eigen::GpuDevice>, long>(Eigen::TensorEvaluator<float>, long)",
            "EigenMetaKernel",
        ),
        (
            "void (anonymous namespace)::softmax_warp_forward<float, float, 5>(float*, float const*, int)",
            "softmax_warp_forward",
        ),
        ("(anonymous namespace)::helper(int)", "helper"),
        (
            "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl<"
            "at::native::add_kernel(at::TensorIteratorBase&)::{lambda(float, float)#1}>(at::TensorIteratorBase&)"
            "::{lambda(int)#1}>(int, at::native::gpu_kernel_impl::{lambda(int)#1})",
            "elementwise_kernel",
        ),
        (
            "std::enable_if<true, void>::type tensorflow::functor::ShuffleInTensor3Simple<float, 2, 1, 0>"
            "(int, float const*, tensorflow::functor::Dimension<3>, float*)",
            "ShuffleInTensor3Simple",
        ),
        ("void kernel<int>", "kernel"),
        ("_MklNativeConv2DBackpropFilter", "_MklNativeConv2DBackpropFilter"),
        ("", ""),
    ],
)
def test_short_kernel_name(name: str, short: str) -> None:
    assert short_kernel_name(name) == short


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


OLD_2020 = """Generating SQLite file report1.sqlite from report1.qdrep
Using report1.sqlite for SQL queries.
Running [/opt/nvidia/nsight-systems/2020.3.1/reports/gpukernsum.py report1.sqlite]...

"Time(%)","Total Time (ns)","Instances","Average","Minimum","Maximum","Name"
66.7,6000,3,2000.0,1000,3000,"void foo<float, 2>(float*, int)"
33.3,3000,1,3000.0,3000,3000,"bar(int)"
"""

MID_2021 = """Time(%),Total Time (ns),Instances,Average,Minimum,Maximum,StdDev,Name
66.7,6000,3,2000.0,1000,3000,1000.0,"void foo<float, 2>(float*, int)"
33.3,3000,1,3000.0,3000,3000,0.0,bar(int)
"""

NEW_2023 = """Generating '/tmp/nsys-report-1b2c.qdstrm'
[1/1] [========================100%] report1.nsys-rep
Processing [report1.sqlite] with [/opt/nvidia/nsys/2023.4.1/reports/cuda_gpu_kern_sum.py]...

 ** CUDA GPU Kernel Summary (cuda_gpu_kern_sum):

Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Name
66.7,6000,3,2000.0,2000.0,1000,3000,1000.0,"void foo<float, 2>(float*, int)"
33.3,3000,1,3000.0,3000.0,3000,3000,0.0,bar(int)

Processing [report1.sqlite] with [/opt/nvidia/nsys/2023.4.1/reports/cuda_api_sum.py]...

 ** CUDA API Summary (cuda_api_sum):

Time (%),Total Time (ns),Num Calls,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Name
100.0,99999,9,11111.0,11111.0,11111,11111,0.0,cudaLaunchKernel
"""


@pytest.mark.parametrize(
    ("text", "has_median", "has_std"),
    [(OLD_2020, False, False), (MID_2021, False, True), (NEW_2023, True, True)],
    ids=["2020-gpukernsum-preamble", "2021-stddev-bare", "2023-cuda_gpu_kern_sum-title"],
)
def test_nsys_stats_header_generations(tmp_path: Path, text: str, has_median: bool, has_std: bool) -> None:
    table = load_trace(_write(tmp_path / "kern.csv", text))
    assert table.format == "nsys-stats-csv" and table.is_summary and table.kernels.empty
    summary = table.summary.set_index("name")
    assert list(table.summary.columns) == list(SUMMARY_DTYPES)
    assert list(summary.index) == [FOO, BAR]
    assert summary.loc[FOO, ["instances", "total_ns"]].tolist() == [3, 6000]
    assert summary.loc[FOO, ["avg_ns", "min_ns", "max_ns"]].tolist() == [2000.0, 1000.0, 3000.0]
    assert (summary.loc[FOO, "med_ns"] == 2000.0) if has_median else math.isnan(summary.loc[FOO, "med_ns"])
    assert (summary.loc[FOO, "std_ns"] == 1000.0) if has_std else math.isnan(summary.loc[FOO, "std_ns"])
    assert summary.loc[FOO, "short_name"] == "foo" and summary.loc[BAR, "short_name"] == "bar"
    assert table.kernel_count == 4 and table.total_ns == 9000


@pytest.mark.parametrize(("unit", "scale"), [("us", 1e3), ("ms", 1e6), ("sec", 1e9), ("s", 1e9), ("ns", 1.0)])
def test_nsys_stats_timeunit_suffixes(tmp_path: Path, unit: str, scale: float) -> None:
    def value(ns: float) -> str:
        return f"{ns / scale:.9f}"

    text = (
        f'"Time (%)","Total Time ({unit})","Instances","Avg ({unit})","Med ({unit})","Min ({unit})",'
        f'"Max ({unit})","StdDev ({unit})","Name"\n'
        f"100.0,{value(7_500_000)},3,{value(2_500_000)},{value(2_000_000)},{value(1_500_000)},"
        f'{value(4_000_000)},{value(1_322_876)},"{FOO}"\n'
    )
    row = load_trace(_write(tmp_path / "kern.csv", text)).summary.iloc[0]
    assert row["total_ns"] == 7_500_000
    for column, ns in [
        ("avg_ns", 2_500_000),
        ("med_ns", 2_000_000),
        ("min_ns", 1_500_000),
        ("max_ns", 4_000_000),
        ("std_ns", 1_322_876),
    ]:
        assert row[column] == pytest.approx(ns, abs=1e-3)


def test_nsys_stats_report_that_was_skipped(tmp_path: Path) -> None:
    text = (
        "Processing [report1.sqlite] with [/opt/nvidia/nsys/2023.4.1/reports/cuda_gpu_kern_sum.py]...\n"
        "SKIPPED: report1.sqlite does not contain CUDA kernel data.\n"
    )
    path = _write(tmp_path / "kern.csv", text)
    with pytest.raises(InputError, match="SKIPPED") as info:
        load_trace(path)
    assert str(path) in str(info.value)


def test_nsys_stats_header_without_rows(tmp_path: Path) -> None:
    path = _write(tmp_path / "kern.csv", NEW_2023.split("66.7")[0])
    with pytest.raises(InputError, match="without kernel rows") as info:
        load_trace(path)
    assert str(path) in str(info.value)


def _trace_rows(pid_offset_s: float) -> list[dict[str, object]]:
    """One process's activity in true units (seconds/milliseconds/kilobytes)."""
    return [
        {
            "Start": pid_offset_s + 0.5,
            "Duration": 0.002,
            "Size": 4.0,
            "Throughput": 1.9,
            "SrcMemType": "Pageable",
            "DstMemType": "Device",
            "Device": "TITAN Xp (0)",
            "Context": 1,
            "Stream": 7,
            "Name": "[CUDA memcpy HtoD]",
            "Correlation_ID": 101,
        },
        {
            "Start": pid_offset_s + 0.6,
            "Duration": 0.25,
            "Grid X": 506,
            "Grid Y": 1,
            "Grid Z": 1,
            "Block X": 192,
            "Block Y": 1,
            "Block Z": 1,
            "Registers Per Thread": 58,
            "Static SMem": 0,
            "Dynamic SMem": 0,
            "Device": "TITAN Xp (0)",
            "Context": 1,
            "Stream": 7,
            "Name": "cuda_compute_flux(int, int*, float*)",
            "Correlation_ID": 102,
        },
        {
            "Start": pid_offset_s + 0.7,
            "Duration": 0.001,
            "Size": 0.5,
            "Throughput": 0.4,
            "DstMemType": "Device",
            "Device": "TITAN Xp (0)",
            "Context": 1,
            "Stream": 7,
            "Name": "[CUDA memset]",
            "Correlation_ID": 103,
        },
        {
            "Start": pid_offset_s + 0.8,
            "Duration": 0.0075,
            "Device": "TITAN Xp (0)",
            "Unified Memory": 65536,
            "Virtual Address": "0x7f54d8000000",
            "Name": "[Unified Memory Memcpy HtoD]",
        },
        {
            "Start": pid_offset_s + 0.9,
            "Unified Memory": "PC 0x5e240510",
            "Virtual Address": "0x7f54d8000000",
            "Name": "[Unified Memory CPU page faults]",
        },
        {
            "Start": pid_offset_s + 0.95,
            "Duration": 0.27,
            "Device": "TITAN Xp (0)",
            "Unified Memory": 18,
            "Virtual Address": "0x7f54d8800000",
            "Name": "[Unified Memory GPU page faults]",
        },
        {
            "Start": pid_offset_s + 1.0,
            "Duration": 0.125,
            "Grid X": 64,
            "Grid Y": 2,
            "Grid Z": 1,
            "Block X": 256,
            "Block Y": 1,
            "Block Z": 1,
            "Device": "Tesla T4 (1)",
            "Context": 2,
            "Stream": 13,
            "Name": "void time_step<float>(int, float*)",
            "Correlation_ID": 104,
        },
    ]


UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


def _in_units(rows: list[dict[str, object]], start_unit: str, dur_unit: str) -> list[dict[str, object]]:
    out = []
    for row in rows:
        row = dict(row)
        row["Start"] = f"{row['Start'] / UNITS[start_unit]:.9f}"
        if "Duration" in row:
            row["Duration"] = f"{row['Duration'] * 1e-3 / UNITS[dur_unit]:.9f}"
        out.append(row)
    return out


@pytest.mark.parametrize(("start_unit", "dur_unit"), [("s", "ms"), ("ms", "us"), ("us", "ns"), ("s", "s")])
def test_nvprof_trace_units_and_row_kinds(tmp_path: Path, start_unit: str, dur_unit: str) -> None:
    units = {
        "Start": start_unit,
        "Duration": dur_unit,
        "Size": "KB",
        "Throughput": "GB/s",
        "Unified Memory": "B",
        "Static SMem": "B",
        "Dynamic SMem": "B",
    }
    text = nvprof_section(4242, NVPROF_TRACE_HEADER, units, _in_units(_trace_rows(1.0), start_unit, dur_unit))
    table = load_trace(_write(tmp_path / "trace.csv", text))

    assert table.format == "nvprof-trace-csv" and not table.is_summary
    k = table.kernels
    assert list(k.columns) == list(KERNEL_DTYPES)
    names = ["cuda_compute_flux(int, int*, float*)", "void time_step<float>(int, float*)"]
    assert list(k["name"].astype(str)) == names
    assert list(k["short_name"].astype(str)) == ["cuda_compute_flux", "time_step"]
    assert list(k["start_ns"]) == [1_600_000_000, 2_000_000_000]
    assert list(k["dur_ns"]) == [250_000, 125_000]
    assert list(k["device_id"]) == [0, 1] and list(k["stream_id"]) == [7, 13]
    assert list(k["correlation_id"]) == [102, 104]
    assert k[["grid_x", "grid_y", "block_x"]].values.tolist() == [[506, 1, 192], [64, 2, 256]]
    assert table.devices == [Device(0, "TITAN Xp"), Device(1, "Tesla T4")]

    m = table.memory
    assert list(m.columns) == list(MEMORY_DTYPES)
    assert list(m["kind"]) == ["memcpy HtoD", "memset", "unified memcpy HtoD"]
    assert list(m["bytes"]) == [4096, 512, 65536]
    assert list(m["dur_ns"]) == [2_000, 1_000, 7_500]
    assert table.memory_ns == 10_500


def test_nvprof_several_processes_all_count(tmp_path: Path) -> None:
    units_a = {"Start": "s", "Duration": "ms", "Size": "KB", "Unified Memory": "B"}
    units_b = {"Start": "ms", "Duration": "us", "Size": "MB", "Unified Memory": "KB"}
    text = nvprof_section(1, NVPROF_TRACE_HEADER, units_a, _in_units(_trace_rows(1.0), "s", "ms"))
    rows_b = _in_units(_trace_rows(5.0), "ms", "us")
    rows_b[0]["Size"] = "0.25"
    rows_b[3]["Unified Memory"] = "4.0"
    text += nvprof_section(2, NVPROF_TRACE_HEADER, units_b, rows_b)
    table = load_trace(_write(tmp_path / "trace.csv", text))
    assert table.kernel_count == 4
    assert list(table.kernels["start_ns"]) == [1_600_000_000, 2_000_000_000, 5_600_000_000, 6_000_000_000]
    assert list(table.memory["bytes"]) == [4096, 512, 65536, 262_144, 524_288, 4096]


def test_nvprof_trace_without_correlation_column(tmp_path: Path) -> None:
    header = NVPROF_TRACE_HEADER[:-1]
    units = {"Start": "s", "Duration": "ms", "Size": "KB", "Unified Memory": "B"}
    text = nvprof_section(7, header, units, _in_units(_trace_rows(0.0), "s", "ms"))
    k = load_trace(_write(tmp_path / "trace.csv", text)).kernels
    assert k["correlation_id"].isna().all() and len(k) == 2


SUMMARY_UNITS = dict(zip(NVPROF_SUMMARY_HEADER, ["", "%", "ms", "", "us", "us", "ms", ""], strict=True))


def _summary_rows(calls: int, total_ms: float, min_us: float, max_ms: float) -> list[dict[str, object]]:
    return [
        {
            "Type": "GPU activities",
            "Time(%)": 80.0,
            "Time": total_ms,
            "Calls": calls,
            "Avg": total_ms * 1e3 / calls,
            "Min": min_us,
            "Max": max_ms,
            "Name": "kernelA(float*)",
        },
        {
            "Type": "GPU activities",
            "Time(%)": 15.0,
            "Time": 1.5,
            "Calls": 3,
            "Avg": 500.0,
            "Min": 400.0,
            "Max": 0.6,
            "Name": "[CUDA memcpy HtoD]",
        },
        {
            "Type": "GPU activities",
            "Time(%)": 5.0,
            "Time": 0.5,
            "Calls": 1,
            "Avg": 500.0,
            "Min": 500.0,
            "Max": 0.5,
            "Name": "void kernelB<int>(int, int)",
        },
        {
            "Type": "API calls",
            "Time(%)": 90.0,
            "Time": 100.0,
            "Calls": 10,
            "Avg": 10000.0,
            "Min": 5.0,
            "Max": 50.0,
            "Name": "cudaMalloc",
        },
    ]


def test_nvprof_summary_mode(tmp_path: Path) -> None:
    text = nvprof_section(555, NVPROF_SUMMARY_HEADER, SUMMARY_UNITS, _summary_rows(4, 8.0, 1500.0, 2.5))
    table = load_trace(_write(tmp_path / "summary.csv", text))
    assert table.format == "nvprof-summary-csv" and table.is_summary
    s = table.summary.set_index("name")
    assert list(s.index) == ["kernelA(float*)", "void kernelB<int>(int, int)"]
    assert s.loc["kernelA(float*)", ["instances", "total_ns"]].tolist() == [4, 8_000_000]
    stats = s.loc["kernelA(float*)", ["avg_ns", "min_ns", "max_ns"]].tolist()
    assert stats == [2_000_000, 1_500_000, 2_500_000]
    assert math.isnan(s.loc["kernelA(float*)", "med_ns"]) and math.isnan(s.loc["kernelA(float*)", "std_ns"])
    assert s.loc["void kernelB<int>(int, int)", "short_name"] == "kernelB"
    assert table.total_ns == 8_500_000


def test_nvprof_summary_sections_merge_per_kernel(tmp_path: Path) -> None:
    text = nvprof_section(1, NVPROF_SUMMARY_HEADER, SUMMARY_UNITS, _summary_rows(4, 8.0, 1500.0, 2.5))
    text += nvprof_section(2, NVPROF_SUMMARY_HEADER, SUMMARY_UNITS, _summary_rows(2, 2.0, 900.0, 1.1))
    s = load_trace(_write(tmp_path / "summary.csv", text)).summary.set_index("name")
    row = s.loc["kernelA(float*)"]
    assert (row["instances"], row["total_ns"]) == (6, 10_000_000)
    assert (row["min_ns"], row["max_ns"]) == (900_000, 2_500_000)
    assert row["avg_ns"] == pytest.approx(10_000_000 / 6)
    assert s.loc["void kernelB<int>(int, int)", "instances"] == 2


@real_traces(NVPROF_CFD)
def test_real_nvprof_cfd_trace_matches_a_plain_csv_read() -> None:
    with NVPROF_CFD.open(newline="") as fh:
        rows = [r for r in csv.reader(fh) if r and not r[0].startswith("==")]
    header, units, data = rows[0], rows[1], rows[2:]
    col = {name: i for i, name in enumerate(header)}
    assert units[col["Duration"]] == "ms" and units[col["Start"]] == "s"
    counts: dict[str, int] = defaultdict(int)
    totals: dict[str, int] = defaultdict(int)
    for r in data:
        if r[col["Grid X"]]:
            counts[r[col["Name"]]] += 1
            totals[r[col["Name"]]] += round(float(r[col["Duration"]]) * 1e6)
    memcpys = sum(1 for r in data if r[col["Name"]].startswith(("[CUDA memcpy", "[CUDA memset")))
    unified = sum(1 for r in data if r[col["Name"]].startswith("[Unified Memory Memcpy"))

    table = load_trace(NVPROF_CFD)
    k = table.kernels
    assert len(k) == sum(counts.values()) == 14_003
    assert counts["cuda_compute_flux(int, int*, float*, float*, float*)"] == 6000
    grouped = k.groupby(k["name"].astype(str))["dur_ns"].agg(["size", "sum"])
    assert {n: (int(r["size"]), int(r["sum"])) for n, r in grouped.iterrows()} == {
        n: (counts[n], totals[n]) for n in counts
    }
    first = next(r for r in data if r[col["Grid X"]])
    assert k.iloc[0]["start_ns"] == round(float(first[col["Start"]]) * 1e9)
    assert k.iloc[0]["correlation_id"] == int(first[col["Correlation_ID"]])
    assert len(table.memory) == memcpys + unified
    assert table.devices == [Device(0, "TITAN Xp")]


def test_nvprof_header_without_units_row(tmp_path: Path) -> None:
    text = nvprof_section(9, NVPROF_TRACE_HEADER, {}, _in_units(_trace_rows(0.0), "s", "ms"))
    lines = text.splitlines()
    path = _write(tmp_path / "nounits.csv", "\n".join(lines[:4] + lines[5:]) + "\n")
    with pytest.raises(InputError, match="units row") as info:
        load_trace(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    ("rows", "header", "fragment"),
    [
        (
            [r for r in _in_units(_trace_rows(0.0), "s", "ms") if "Grid X" not in r],
            NVPROF_TRACE_HEADER,
            "without kernel rows",
        ),
        (
            [r for r in _summary_rows(1, 1.0, 1.0, 1.0) if r["Name"].startswith(("[", "cuda"))],
            NVPROF_SUMMARY_HEADER,
            "without kernel rows",
        ),
    ],
    ids=["trace-only-memory", "summary-only-memcpy-and-api"],
)
def test_nvprof_csv_without_kernels(tmp_path: Path, rows: list, header: tuple, fragment: str) -> None:
    trace_units = {"Start": "s", "Duration": "ms", "Size": "KB", "Unified Memory": "B"}
    units = SUMMARY_UNITS if header == NVPROF_SUMMARY_HEADER else trace_units
    path = _write(tmp_path / "nokernels.csv", nvprof_section(3, header, units, rows))
    with pytest.raises(InputError, match=fragment) as info:
        load_trace(path)
    assert str(path) in str(info.value)


def test_nvprof_non_numeric_duration(tmp_path: Path) -> None:
    rows = _in_units(_trace_rows(0.0), "s", "ms")
    rows[1]["Duration"] = "fast"
    text = nvprof_section(3, NVPROF_TRACE_HEADER, {"Start": "s", "Duration": "ms"}, rows)
    path = _write(tmp_path / "bad.csv", text)
    with pytest.raises(InputError, match="Duration") as info:
        load_trace(path)
    assert str(path) in str(info.value)


def test_summary_tables_are_complete_frames(tmp_path: Path) -> None:
    table = load_trace(_write(tmp_path / "kern.csv", OLD_2020))
    assert isinstance(table.summary, pd.DataFrame)
    assert table.memory is None and table.devices == []


def test_nsys_stats_non_numeric_value(tmp_path: Path) -> None:
    path = _write(tmp_path / "kern.csv", MID_2021.replace("1000.0,", "fast,", 1))
    with pytest.raises(InputError, match="'fast'") as info:
        load_trace(path)
    assert str(path) in str(info.value)
