"""nsys SQLite exports: the real CloverLeaf export checked against SQL, and generated variants."""

from __future__ import annotations

import math
import shutil
import sqlite3
from pathlib import Path

import pandas as pd
import pytest
from fixtures_traces import SHARED_TRACES, Kernel, a100, real_traces, write_nsys_sqlite

from detprof.errors import InputError
from detprof.traces.kernel_names import short_kernel_name
from detprof.traces.kernel_table import KERNEL_DTYPES, MEMORY_DTYPES, NVTX_DTYPES, Device, conform
from detprof.traces.kernel_tables import kernel_stats, top_n
from detprof.traces.parsers import load_trace, nsys_sqlite, sqlite_columns

CLOVERLEAF = SHARED_TRACES / "nsys-2024.5-cloverleaf-4xA100.sqlite"
needs_cloverleaf = real_traces(CLOVERLEAF)

# What NVIDIA's cuda_gpu_kern_sum computes, per demangled name: count, total, mean, median
# (mean of the middle pair for even counts), min, max and the sample variance.
KERN_SUM_SQL = """
WITH k AS (SELECT demangledName AS nid, "end" - start AS dur FROM CUPTI_ACTIVITY_KIND_KERNEL),
ranked AS (
    SELECT nid, dur, row_number() OVER (PARTITION BY nid ORDER BY dur) AS rn,
           count(*) OVER (PARTITION BY nid) AS n FROM k),
med AS (SELECT nid, avg(dur) AS med FROM ranked WHERE rn IN ((n + 1) / 2, (n + 2) / 2) GROUP BY nid),
agg AS (
    SELECT nid, count(*) AS n, sum(dur) AS total, avg(dur) AS mean, min(dur) AS lo, max(dur) AS hi,
           CASE WHEN count(*) > 1
                THEN (sum(dur * dur) - sum(dur) * sum(dur) * 1.0 / count(*)) / (count(*) - 1) END AS var
    FROM k GROUP BY nid)
SELECT s.value, agg.n, agg.total, agg.mean, med.med, agg.lo, agg.hi, agg.var
FROM agg JOIN med USING (nid) JOIN StringIds AS s ON s.id = agg.nid
"""


def _sql(path: Path, query: str) -> list[tuple]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute(query).fetchall()
    conn.close()
    return rows


@needs_cloverleaf
def test_cloverleaf_per_kernel_stats_match_cuda_gpu_kern_sum_sql() -> None:
    expected = {row[0]: row[1:] for row in _sql(CLOVERLEAF, KERN_SUM_SQL)}
    stats = kernel_stats(load_trace(CLOVERLEAF), by="name").set_index("name")

    assert len(stats) == len(expected) == 102
    assert int(stats["total_ns"].sum()) == 294_404_540
    for name, (n, total, mean, med, lo, hi, var) in expected.items():
        row = stats.loc[name]
        assert (row["instances"], row["total_ns"]) == (n, total)
        assert (row["min_ns"], row["max_ns"]) == (lo, hi)
        assert row["avg_ns"] == pytest.approx(mean)
        assert row["med_ns"] == pytest.approx(med)
        if var is None:
            assert math.isnan(row["std_ns"])
        else:
            assert row["std_ns"] == pytest.approx(math.sqrt(max(var, 0.0)), rel=1e-6, abs=1e-3)


@needs_cloverleaf
def test_cloverleaf_launch_rows_match_sql_in_export_order() -> None:
    rows = _sql(
        CLOVERLEAF,
        'SELECT d.value, s.value, k.start, k."end" - k.start, k.deviceId, k.streamId, k.correlationId, '
        "k.gridX, k.gridY, k.gridZ, k.blockX, k.blockY, k.blockZ FROM CUPTI_ACTIVITY_KIND_KERNEL AS k "
        "JOIN StringIds AS d ON d.id = k.demangledName JOIN StringIds AS s ON s.id = k.shortName "
        "ORDER BY k.rowid",
    )
    kernels = load_trace(CLOVERLEAF).kernels
    columns = [
        "name",
        "short_name",
        "start_ns",
        "dur_ns",
        "device_id",
        "stream_id",
        "correlation_id",
        "grid_x",
        "grid_y",
        "grid_z",
        "block_x",
        "block_y",
        "block_z",
    ]
    frame = kernels[columns].astype(object)
    got = [tuple(None if pd.isna(v) else v for v in row) for row in frame.itertuples(index=False, name=None)]
    assert got == rows
    assert kernels["op"].isna().all()


@needs_cloverleaf
def test_cloverleaf_schema_devices_memory_and_no_nvtx() -> None:
    table = load_trace(CLOVERLEAF)
    assert table.format == "nsys-sqlite" and table.source == str(CLOVERLEAF)
    assert list(table.kernels.columns) == list(KERNEL_DTYPES)
    pd.testing.assert_frame_equal(table.kernels, conform(table.kernels, KERNEL_DTYPES))
    gpus = _sql(CLOVERLEAF, "SELECT id, name, smCount, computeMajor, computeMinor, totalMemory FROM TARGET_INFO_GPU")
    assert table.devices == [
        Device(id=i, name=name, sm_count=sm, compute_capability=f"{major}.{minor}", memory_bytes=mem)
        for i, name, sm, major, minor, mem in sorted(gpus)
    ]
    memcpy = _sql(
        CLOVERLEAF,
        'SELECT copyKind, count(*), sum("end" - start), sum(bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY GROUP BY copyKind',
    )
    by_kind = table.memory.groupby("kind").agg(n=("dur_ns", "size"), dur=("dur_ns", "sum"), b=("bytes", "sum"))
    names = {1: "memcpy HtoD", 2: "memcpy DtoH"}
    assert {names[k]: (n, d, b) for k, n, d, b in memcpy} == {kind: (r.n, r.dur, r.b) for kind, r in by_kind.iterrows()}
    assert table.memory_ns == sum(d for _, _, d, _ in memcpy)
    assert table.nvtx is None


@needs_cloverleaf
def test_short_kernel_name_agrees_with_nsys_short_names() -> None:
    pairs = _sql(
        CLOVERLEAF,
        "SELECT DISTINCT d.value, s.value FROM CUPTI_ACTIVITY_KIND_KERNEL AS k "
        "JOIN StringIds AS d ON d.id = k.demangledName JOIN StringIds AS s ON s.id = k.shortName",
    )
    assert len(pairs) == 102
    assert all(short_kernel_name(demangled) == short for demangled, short in pairs)


def _kernels() -> list[Kernel]:
    conv = "void cudnn::cnn::conv2d_grouped_direct_kernel<false, true, float>(cudnn::Params, float const*)"
    gemm = "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(Params)"
    return [
        Kernel(conv, "conv2d_grouped_direct_kernel", 1_000, 400, stream=7, correlation=11, grid=(64, 2, 1)),
        Kernel(gemm, "Kernel", 2_000, 900, stream=13, correlation=12, block=(256, 1, 1)),
        Kernel(conv, "conv2d_grouped_direct_kernel", 3_000, 500, device=1, stream=7, correlation=None),
        Kernel(gemm, "Kernel", 4_000, 1_100, stream=13, correlation=14),
    ]


def test_new_schema_fixture_kernels_devices_memory(tmp_path: Path) -> None:
    path = write_nsys_sqlite(
        tmp_path / "new.sqlite",
        _kernels(),
        gpus=[a100(1), a100(0)],
        memcpys=[
            {"start": 10, "end": 30, "bytes": 4096, "copyKind": 1, "deviceId": 0, "streamId": 7},
            {"start": 40, "end": 45, "bytes": 64, "copyKind": 42, "deviceId": 0, "streamId": 7},
            {"start": 50, "end": 58, "bytes": 1 << 20, "copyKind": 11, "deviceId": 1, "streamId": 13},
        ],
        memsets=[{"start": 60, "end": 61, "bytes": 512, "deviceId": 0, "streamId": 7}],
    )
    table = load_trace(path)
    k = table.kernels
    assert list(k["name"].astype(str)) == [x.name for x in _kernels()]
    assert list(k["short_name"].astype(str)) == ["conv2d_grouped_direct_kernel", "Kernel"] * 2
    assert list(k["dur_ns"]) == [400, 900, 500, 1_100] and list(k["start_ns"]) == [1_000, 2_000, 3_000, 4_000]
    assert list(k["device_id"]) == [0, 0, 1, 0] and list(k["stream_id"]) == [7, 13, 7, 13]
    assert k["correlation_id"].tolist() == [11, 12, pd.NA, 14]
    assert (k.loc[0, "grid_x"], k.loc[0, "grid_y"], k.loc[1, "block_x"]) == (64, 2, 256)
    assert [d.id for d in table.devices] == [0, 1]
    assert table.devices[0] == Device(0, "NVIDIA A100-SXM4-80GB", 108, "8.0", 84_990_623_744)
    memory = table.memory
    assert list(memory.columns) == list(MEMORY_DTYPES)
    assert list(memory["kind"]) == ["memcpy HtoD", "memcpy HtoH", "unified memcpy HtoD", "memset"]
    assert list(memory["bytes"]) == [4096, 64, 1 << 20, 512]
    assert table.memory_ns == 20 + 5 + 8 + 1
    assert table.total_ns == 2_900 and table.kernel_count == 4


def test_old_schema_without_enum_tables(tmp_path: Path) -> None:
    path = write_nsys_sqlite(
        tmp_path / "old.sqlite",
        _kernels(),
        schema="old",
        gpus=[a100(0, "old")],
        memcpys=[
            {"start": 10, "end": 30, "bytes": 100, "copyKind": 2, "deviceId": 0, "streamId": 7},
            {"start": 30, "end": 35, "bytes": 100, "copyKind": 8, "deviceId": 0, "streamId": 7},
            {"start": 40, "end": 41, "bytes": 100, "copyKind": 10, "deviceId": 0, "streamId": 7},
        ],
    )
    with sqlite3.connect(path) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    conn.close()
    assert {"TARGET_INFO_CUDA_GPU", "EXPORT_META_DATA"} <= tables
    assert not any(t.startswith("ENUM_") for t in tables) and "TARGET_INFO_GPU" not in tables

    table = load_trace(path)
    assert table.kernel_count == 4 and table.total_ns == 2_900
    assert table.devices == [Device(0, "Tesla V100-SXM2-16GB", 80, "7.0", 16_945_512_448), Device(1)]
    assert list(table.memory["kind"]) == ["memcpy DtoH", "memcpy DtoD", "memcpy PtoP"]


def test_lazy_export_with_only_kernels_and_strings(tmp_path: Path) -> None:
    table = load_trace(write_nsys_sqlite(tmp_path / "lazy.sqlite", _kernels()))
    assert table.devices == [Device(0), Device(1)]
    assert table.memory is not None and table.memory.empty and table.memory_ns == 0
    assert table.nvtx is None
    assert table.kernel_count == 4


def test_missing_optional_kernel_columns_become_null(tmp_path: Path) -> None:
    path = write_nsys_sqlite(
        tmp_path / "cols.sqlite", _kernels(), drop_kernel_columns=("correlationId", "gridZ", "shortName")
    )
    k = load_trace(path).kernels
    assert list(k.columns) == list(KERNEL_DTYPES)
    assert k["correlation_id"].isna().all() and k["grid_z"].isna().all()
    assert list(k["short_name"].astype(str)) == list(k["name"].astype(str))
    assert k["grid_x"].tolist() == [64, 1, 1, 1]


def test_nvtx_ranges_from_text_and_registered_strings(tmp_path: Path) -> None:
    nvtx = [
        {"start": 500, "end": 900, "eventType": 60, "registered": "train_step 2"},
        {"start": 100, "end": 400, "eventType": 59, "text": "train_step 1"},
        {"start": 150, "end": None, "eventType": 59, "text": "unfinished push"},
        {"start": 160, "end": None, "eventType": 34, "text": "a mark"},
        {"start": 0, "end": 0, "eventType": 75, "text": "domain"},
        {"start": 950, "end": 990, "eventType": 59, "text": "explicit", "registered": "ignored"},
    ]
    table = load_trace(write_nsys_sqlite(tmp_path / "nvtx.sqlite", _kernels(), nvtx=nvtx))
    assert table.nvtx is not None
    assert list(table.nvtx.columns) == list(NVTX_DTYPES)
    assert table.nvtx.astype(object).values.tolist() == [
        ["train_step 1", 100, 400],
        ["train_step 2", 500, 900],
        ["explicit", 950, 990],
    ]


def test_parallel_readers_keep_every_row_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    names = [f"void k{i}<float>(float*)" for i in range(7)]
    kernels = [
        Kernel(names[i % 7], f"k{i % 7}", 10 * i, 1 + i % 13, stream=i % 3, correlation=None if i % 5 else i)
        for i in range(3_000)
    ]
    path = write_nsys_sqlite(tmp_path / "many.sqlite", kernels)
    with sqlite3.connect(path) as conn:
        conn.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid % 7 = 3 OR rowid BETWEEN 1000 AND 1400")
    conn.close()
    monkeypatch.setattr(sqlite_columns, "PARALLEL_MIN_ROWS", 100)
    monkeypatch.setattr(sqlite_columns, "reader_cpus", lambda: 4)

    expected = _sql(
        path,
        'SELECT start, "end" - start, streamId, correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY rowid',
    )
    k = load_trace(path).kernels
    got = [
        (int(a), int(b), int(c), None if pd.isna(d) else int(d))
        for a, b, c, d in k[["start_ns", "dur_ns", "stream_id", "correlation_id"]]
        .astype(object)
        .itertuples(index=False)
    ]
    assert got == expected
    assert list(k["name"].astype(str)) == [names[(s // 10) % 7] for s, *_ in expected]


def test_kernel_name_ids_missing_or_null(tmp_path: Path) -> None:
    path = write_nsys_sqlite(tmp_path / "ids.sqlite", _kernels()[:3])
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET demangledName = 777 WHERE rowid = 1")
        conn.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET demangledName = NULL WHERE rowid = 3")
    conn.close()
    names = list(load_trace(path).kernels["name"].astype(str))
    assert names == ["<string id 777>", _kernels()[1].name, "<unnamed>"]


def test_names_are_categoricals_of_the_distinct_names(tmp_path: Path) -> None:
    k = load_trace(write_nsys_sqlite(tmp_path / "names.sqlite", _kernels())).kernels
    for column in ("name", "short_name"):
        assert isinstance(k[column].dtype, pd.CategoricalDtype), column
        assert list(k[column].cat.categories) == sorted({str(n) for n in k[column]}), column
    assert len(k["name"].cat.categories) == 2


def test_top_n_reads_only_the_columns_it_needs(tmp_path: Path) -> None:
    """Start times, streams and grids are read on first use of ``kernels``, not for a top-N table."""
    path = write_nsys_sqlite(tmp_path / "run.sqlite", _kernels(), gpus=[a100(0), a100(1)])
    table = load_trace(path)
    path.unlink()
    head, other_ns = top_n(table, 1)
    assert (head.loc[0, "short_name"], head.loc[0, "instances"], head.loc[0, "total_ns"]) == ("Kernel", 2, 2_000)
    assert other_ns == 900 and (table.kernel_count, table.total_ns) == (4, 2_900)
    assert [d.id for d in table.devices] == [0, 1]
    with pytest.raises(InputError, match=r"run\.sqlite"):
        table.launches("start_ns")


def test_deferred_columns_line_up_with_the_rows_read_first(tmp_path: Path) -> None:
    path = write_nsys_sqlite(tmp_path / "run.sqlite", _kernels())
    table = load_trace(path)
    k = table.kernels
    assert list(k.columns) == list(KERNEL_DTYPES)
    assert list(zip(k["dur_ns"], k["start_ns"], k["stream_id"], strict=True)) == [
        (x.dur, x.start, x.stream) for x in _kernels()
    ]
    assert table.launches("start_ns")["start_ns"].tolist() == [x.start for x in _kernels()]


def test_a_table_changed_after_loading_is_an_input_error(tmp_path: Path) -> None:
    path = write_nsys_sqlite(tmp_path / "run.sqlite", _kernels())
    table = load_trace(path)
    with sqlite3.connect(path) as conn:
        conn.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid = 2")
    conn.close()
    with pytest.raises(InputError, match="changed"):
        table.launches("start_ns")


def test_a_converted_report_is_read_whole_before_its_export_goes(tmp_path: Path) -> None:
    """``nsys export`` writes to a temporary folder that is gone once the parser returns."""
    path = write_nsys_sqlite(tmp_path / "exported.sqlite", _kernels())
    table = nsys_sqlite.load_nsys_sqlite(path, source="run.nsys-rep")
    path.unlink()
    assert table.source == "run.nsys-rep"
    assert table.kernels["start_ns"].tolist() == [x.start for x in _kernels()]


def _assert_input_error(path: Path, fragment: str, *, on_first_use: bool = False) -> None:
    """``on_first_use``: the fault is in a launch column read only when ``kernels`` is first used."""
    table = load_trace(path) if on_first_use else None
    with pytest.raises(InputError) as info:
        load_trace(path) if table is None else table.kernels
    message = str(info.value)
    assert str(path) in message and fragment in message and "\n" not in message


def test_export_without_kernel_table_is_an_input_error(tmp_path: Path) -> None:
    path = write_nsys_sqlite(tmp_path / "nokernels.sqlite", [], kernel_table=False, gpus=[a100(0)])
    _assert_input_error(path, "no CUDA kernels")


def test_empty_kernel_table_is_an_input_error(tmp_path: Path) -> None:
    _assert_input_error(write_nsys_sqlite(tmp_path / "empty.sqlite", []), "empty trace")


def test_missing_string_table_is_an_input_error(tmp_path: Path) -> None:
    path = write_nsys_sqlite(tmp_path / "nostrings.sqlite", _kernels())
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE StringIds")
    conn.close()
    _assert_input_error(path, "StringIds")


@pytest.mark.parametrize(("column", "on_first_use"), [("deviceId", False), ("streamId", True)])
def test_non_integer_kernel_values_are_an_input_error(tmp_path: Path, column: str, on_first_use: bool) -> None:
    path = write_nsys_sqlite(tmp_path / "text.sqlite", _kernels())
    with sqlite3.connect(path) as conn:
        conn.execute(f"UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET {column} = 'default stream'")
    conn.close()
    _assert_input_error(path, f"CUPTI_ACTIVITY_KIND_KERNEL.{column}", on_first_use=on_first_use)


def _big_fixture(path: Path) -> Path:
    kernels = [Kernel(f"void kernel_{i % 50}(int)", f"kernel_{i % 50}", 100 * i, 50) for i in range(20_000)]
    return write_nsys_sqlite(path, kernels, gpus=[a100(0)])


def test_truncated_sqlite_is_an_input_error(tmp_path: Path) -> None:
    whole = _big_fixture(tmp_path / "whole.sqlite")
    cut = tmp_path / "cut.sqlite"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    _assert_input_error(cut, "truncated")


def test_corrupt_sqlite_pages_are_an_input_error(tmp_path: Path) -> None:
    path = _big_fixture(tmp_path / "corrupt.sqlite")
    data = bytearray(path.read_bytes())
    page_size = int.from_bytes(data[16:18], "big")
    data[page_size:] = bytes((i * 7919) % 251 for i in range(len(data) - page_size))
    path.write_bytes(bytes(data))
    _assert_input_error(path, "SQLite")


def test_sqlite_header_followed_by_garbage_is_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "garbage.sqlite"
    path.write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 40)
    _assert_input_error(path, "SQLite")


def test_file_names_that_are_special_in_sqlite_uris(tmp_path: Path) -> None:
    original = write_nsys_sqlite(tmp_path / "a.sqlite", _kernels())
    odd = tmp_path / "run 1 #2 ?mode=rw %41.sqlite"
    shutil.copy(original, odd)
    table = load_trace(odd)
    assert table.source == str(odd) and table.kernel_count == 4
