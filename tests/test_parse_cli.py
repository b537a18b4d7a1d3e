"""`detprof parse` and `detprof diff` through the real CLI entry point.

Expected values are computed here from the fixture's own kernel list, never from detprof's output.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import sqlite3
import statistics
from collections import defaultdict
from pathlib import Path

import pytest
from fixtures_traces import SHARED_TRACES, Kernel, a100, real_traces, write_nsys_sqlite
from piped_cli import header_lines, run_piped, table_rows
from script_runner import run_script

from detprof.cli import main

PARSE_KEYS = {"source", "format", "devices", "kernel_count", "total_ns", "memory_ns", "other_ns", "kernels"}
KERNEL_KEYS = {
    "name", "short_name", "category", "instances", "total_ns", "pct",
    "avg_ns", "med_ns", "min_ns", "max_ns", "std_ns",
}  # fmt: skip


def kernels_of(n_names: int, device: int = 0, scale: int = 1) -> list[Kernel]:
    out, t = [], 1_000
    for i in range(n_names):
        for j in range(i + 1):
            dur = scale * (100 * (i + 1) + 7 * j)
            out.append(Kernel(f"void k{i}<float, {j % 2}>(float*)", f"k{i}", t, dur, device=device))
            t += dur + 50
    return out


@pytest.fixture
def trace(tmp_path: Path) -> tuple[Path, list[Kernel]]:
    kernels = kernels_of(25) + kernels_of(3, device=1)
    path = write_nsys_sqlite(
        tmp_path / "run.sqlite",
        kernels,
        gpus=[a100(0), a100(1)],
        memcpys=[],
    )
    return path, kernels


def run(args: list[str], capsys) -> tuple[int, str, str]:
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_parse_json_has_the_documented_shape(trace, capsys) -> None:
    path, kernels = trace
    code, out, err = run(["parse", str(path), "--format", "json", "--top", "5"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert set(doc) >= PARSE_KEYS
    assert doc["format"] == "nsys-sqlite" and doc["source"] == str(path)
    assert [d["id"] for d in doc["devices"]] == [0, 1]
    assert {"id", "name", "sm_count", "compute_capability"} <= set(doc["devices"][0])
    assert doc["devices"][0]["compute_capability"] == "8.0" and doc["devices"][0]["sm_count"] == 108
    assert doc["kernel_count"] == len(kernels)
    assert doc["total_ns"] == sum(k.dur for k in kernels)
    by_name: dict[str, list[int]] = defaultdict(list)
    for k in kernels:
        by_name[k.name].append(k.dur)
    totals = sorted(((sum(d), n) for n, d in by_name.items()), key=lambda x: (-x[0], x[1]))
    assert doc["other_ns"] == sum(t for t, _ in totals[5:])
    assert len(doc["kernels"]) == 5
    for row, (total, name) in zip(doc["kernels"], totals, strict=False):
        assert set(row) == KERNEL_KEYS
        durs = by_name[name]
        assert row["name"] == name and row["total_ns"] == total and row["instances"] == len(durs)
        assert row["med_ns"] == pytest.approx(statistics.median(durs))
        assert row["std_ns"] == (pytest.approx(statistics.stdev(durs)) if len(durs) > 1 else None)
        assert row["pct"] == pytest.approx(total / doc["total_ns"] * 100)
    assert doc["memory_ns"] == 0


def test_parse_csv_device_and_short_names(trace, capsys) -> None:
    path, kernels = trace
    code, out, _ = run(["parse", str(path), "--format", "csv", "--device", "1", "--by", "short"], capsys)
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    on_1 = [k for k in kernels if k.device == 1]
    assert {r["name"] for r in rows} == {k.short for k in on_1}
    assert sum(int(r["total_ns"]) for r in rows) == sum(k.dur for k in on_1)


def test_parse_table_mentions_the_top_kernel(trace, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    path, _ = trace
    code, out, _ = run(["parse", str(path), "--top", "3", "--full-names"], capsys)
    assert code == 0
    assert "void k24<float, 0>(float*)" in out and "(all other kernels)" in out


def test_parse_table_shows_short_names_by_default(trace, capsys, monkeypatch) -> None:
    """Kernels k24<float, 0> and k24<float, 1> share the short name k24: the table keeps them apart."""
    monkeypatch.setenv("COLUMNS", "200")
    path, kernels = trace
    code, out, _ = run(["parse", str(path), "--top", "4"], capsys)
    assert code == 0
    totals: dict[str, int] = defaultdict(int)
    for k in kernels:
        totals[k.name] += k.dur
    top4 = sorted(totals, key=lambda n: (-totals[n], n))[:4]
    expected = [n.removeprefix("void ").removesuffix("(float*)") for n in top4]
    assert [row[-1] for row in table_rows(out)] == [*expected, "(all other kernels)"]
    assert {e.split("<")[0] for e in expected} == {"k24", "k23"}
    assert "(float*)" not in out and "--full-names shows whole kernel names" in out


def test_parse_json_and_csv_keep_full_names_whatever_the_table_does(trace, capsys) -> None:
    path, kernels = trace
    full = {k.name for k in kernels}
    for extra in ([], ["--full-names"]):
        code, out, _ = run(["parse", str(path), "--format", "json", *extra], capsys)
        assert code == 0
        rows = json.loads(out)["kernels"]
        assert {r["name"] for r in rows} <= full and all(r["name"].endswith("(float*)") for r in rows)
        code, out, _ = run(["parse", str(path), "--format", "csv", *extra], capsys)
        assert {r["name"] for r in csv.DictReader(io.StringIO(out))} <= full


def test_diff_json_reports_added_and_slower_kernels(tmp_path, capsys) -> None:
    base = write_nsys_sqlite(tmp_path / "a.sqlite", kernels_of(3))
    slower = [*kernels_of(3, scale=2), Kernel("void wgrad_det<float>()", "wgrad_det", 10**7, 5000)]
    other = write_nsys_sqlite(tmp_path / "b.sqlite", slower)
    code, out, err = run(["diff", str(base), str(other), "--format", "json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    statuses = {k["name"]: k["status"] for k in doc["kernels"]}
    assert statuses["void wgrad_det<float>()"] == "added"
    assert {statuses[f"void k{i}<float, 0>(float*)"] for i in range(3)} == {"slower"}
    assert doc["delta_ns"] == sum(k.dur for k in slower) - sum(k.dur for k in kernels_of(3))


def test_diff_of_one_device_reads_that_device_in_both_traces(tmp_path, capsys) -> None:
    gpus = [a100(0), a100(1)]
    base = write_nsys_sqlite(tmp_path / "a.sqlite", kernels_of(3) + kernels_of(2, device=1), gpus=gpus, memcpys=[])
    other = kernels_of(3, scale=5) + kernels_of(2, device=1, scale=2)
    changed = write_nsys_sqlite(tmp_path / "b.sqlite", other, gpus=gpus, memcpys=[])
    code, out, err = run(["diff", str(base), str(changed), "--format", "json", "--device", "1"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["delta_ns"] == sum(k.dur for k in kernels_of(2, device=1))
    assert {k["name"] for k in doc["kernels"]} == {k.name for k in kernels_of(2)}
    code, _, err = run(["diff", str(base), str(changed), "--device", "7"], capsys)
    assert code == 2 and err.strip().endswith("no kernels on device 7; devices with kernels: [0, 1]")


def test_diff_of_a_cpus_ops_and_a_gpus_kernels_warns_that_they_do_not_compare(tmp_path, capsys) -> None:
    gpu = write_nsys_sqlite(tmp_path / "a.sqlite", kernels_of(3))
    cpu = SHARED_TRACES / "tf-2.21-cpu-smallcnn.xplane.pb"
    code, _, err = run(["diff", str(gpu), str(cpu), "--format", "json"], capsys)
    assert code == 0 and f"warning: {cpu} holds a CPU's ops, {gpu} a GPU's kernels" in err, err
    code, _, err = run(["diff", str(gpu), str(gpu), "--format", "json"], capsys)
    assert "warning" not in err


def test_diff_by_short_name_merges_template_instances(tmp_path, capsys) -> None:
    base = write_nsys_sqlite(tmp_path / "a.sqlite", kernels_of(3))
    other = write_nsys_sqlite(tmp_path / "b.sqlite", kernels_of(3, scale=3))
    code, out, err = run(["diff", str(base), str(other), "--format", "json", "--by", "short"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["by"] == "short" and doc["kernels_in_common"] == 3
    per_short: dict[str, int] = defaultdict(int)
    for k in kernels_of(3):
        per_short[k.short] += 2 * k.dur  # scale 3 minus scale 1
    assert {k["name"]: k["delta_ns"] for k in doc["kernels"]} == per_short
    code, out, err = run(["diff", str(base), str(other), "--by", "kernel"], capsys)
    assert code == 2 and err.count("\n") == 1 and "--by" in err


def test_diff_table_shows_short_names_unless_asked(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    base = write_nsys_sqlite(tmp_path / "a.sqlite", kernels_of(3))
    other = write_nsys_sqlite(tmp_path / "b.sqlite", kernels_of(3, scale=2))
    code, out, _ = run(["diff", str(base), str(other)], capsys)
    assert code == 0
    shown = {row[-1] for row in table_rows(out)}
    assert shown == {"k0", *(f"k{i}<float, {j}>" for i in (1, 2) for j in (0, 1))}
    assert "kernels in common: 5" in " ".join(out.split())  # the header may wrap at a long tmp path
    code, out, _ = run(["diff", str(base), str(other), "--full-names"], capsys)
    assert code == 0 and "void k2<float, 1>(float*)" in out


CUTLASS_GEMM = (
    "void cutlass::Kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::threadblock::MmaMultistage<float, 128, "
    "256, 64>, cutlass::epilogue::threadblock::Epilogue<float>>>(cutlass::gemm::kernel::GemmUniversal::Params)"
)


def test_a_narrow_terminal_keeps_each_kernel_on_one_line(capsys, monkeypatch) -> None:
    """At 100 columns a long short label is cut to what the other columns leave, not folded over lines, keeping its
    end; the numbers stay whole."""
    monkeypatch.setenv("COLUMNS", "100")
    code, out, _ = run(["parse", str(SHARED_TRACES / "kineto-a100-control.json.gz"), "--top", "6"], capsys)
    assert code == 0
    body = out.split("┡")[1].split("└")[0].splitlines()[1:]
    assert len(body) == 7 and all(len(line) <= 100 for line in body)
    assert "split_embedding_backward_co…" in out and "│ 36.2 ms │" in out  # cut in the middle, its end kept
    monkeypatch.setenv("COLUMNS", "120")  # a diff's labels hold template arguments, with spaces a wrap breaks at
    code, out, _ = run(["diff", *map(str, KINETO_PAIR), "--top", "6"], capsys)
    assert code == 0
    body = out.split("┡")[1].split("└")[0].splitlines()[1:]
    assert len(body) == 6 and all(len(line) <= 120 for line in body), "\n".join(body)
    # Two kernels whose names differ only at their end stay told apart where the column ends.
    assert "float, 5ul> │" in out and "float, 2ul> │" in out
    # Each label fits whole within what the other columns leave (the row of all other kernels' share included):
    # none is cut again at the column's end, where its instance or number would be lost.
    monkeypatch.setenv("COLUMNS", "100")
    for trace in ("nsys-2024.5-cloverleaf-4xA100.sqlite", "tf-bert-3gpu.xplane.pb"):
        code, out, _ = run(["parse", str(SHARED_TRACES / trace), "--top", "4"], capsys)
        rows = out.split("┡")[1].split("└")[0].splitlines()[1:]
        assert code == 0 and not any(row.endswith("… │") for row in rows), "\n".join(rows)


def test_parse_to_a_pipe_shows_every_column_and_whole_names(tmp_path) -> None:
    """Off a terminal there is no width to fit: a header line, then one line per kernel with its whole name."""
    kernels = [Kernel(CUTLASS_GEMM, "cutlass::Kernel", 10**6, 50_000), *kernels_of(3)]
    path = write_nsys_sqlite(tmp_path / "cutlass.sqlite", kernels)
    done = run_piped("parse", path)
    assert done.returncode == 0, done.stderr
    assert header_lines(done.stdout) == [
        ["Time %", "Total", "Instances", "Avg", "Med", "Min", "Max", "StdDev", "Category", "Name"]
    ]
    totals: dict[str, int] = defaultdict(int)
    for k in kernels:
        totals[k.name] += k.dur
    assert [row[-1] for row in table_rows(done.stdout)] == sorted(totals, key=lambda n: (-totals[n], n))
    assert "--full-names" not in done.stdout and "wider terminal" not in done.stdout


def disjoint_traces(tmp_path: Path) -> tuple[Path, Path]:
    """Two traces whose kernels share no full name; k0's template instance differs, so short names meet once."""
    base = [Kernel("void k0<float>(float*)", "k0", 1_000, 300), Kernel("void a()", "a", 2_000, 100)]
    other = [Kernel("void k0<half>(half*)", "k0", 1_000, 500), Kernel("void b()", "b", 2_000, 50)]
    other += [Kernel("void c()", "c", 3_000, 70)]
    return write_nsys_sqlite(tmp_path / "a.sqlite", base), write_nsys_sqlite(tmp_path / "b.sqlite", other)


def test_diff_of_traces_without_a_common_kernel_says_so(tmp_path, capsys, monkeypatch) -> None:
    """A documented result (exit 0), not an input error: one line, then each side's own kernels."""
    monkeypatch.setenv("COLUMNS", "200")
    base, other = disjoint_traces(tmp_path)
    code, out, err = run(["diff", str(base), str(other)], capsys)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    expected = (
        "no kernel in common: BASE has 2 kernels, OTHER has 3; a ratio per kernel would mean nothing "
        "(--by short pairs up 1 short names)"
    )
    assert expected in lines
    assert "ratio" not in lines[0] and "slower" not in out and "faster" not in out
    assert "Only in BASE (removed)" in out and "Only in OTHER (added)" in out
    assert [row[-1] for row in table_rows(out)] == ["k0", "a", "k0", "c", "b"]
    code, out, _ = run(["diff", str(base), str(other), "--format", "json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["kernels_in_common"] == 0
    assert {k["status"] for k in doc["kernels"]} == {"added", "removed"}
    code, out, _ = run(["diff", str(base), str(other), "--format", "json", "--by", "short"], capsys)
    assert json.loads(out)["kernels_in_common"] == 1


@pytest.mark.parametrize(
    ("name", "content", "fragment"),
    [
        ("missing.sqlite", None, "no such file"),
        ("random.bin", bytes(range(256)) * 4, ""),
        ("empty.csv", b"", ""),
        ("notes.txt", b"just some words\nand more\n", ""),
        ("truncated.sqlite", "truncate", ""),
    ],
)
def test_bad_traces_are_one_line_exit_3(tmp_path, capsys, name: str, content, fragment: str) -> None:
    path = tmp_path / name
    if content == "truncate":
        whole = write_nsys_sqlite(tmp_path / "whole.sqlite", kernels_of(30)).read_bytes()
        path.write_bytes(whole[: len(whole) // 3])
    elif content is not None:
        path.write_bytes(content)
    code, out, err = run(["parse", str(path)], capsys)
    assert code == 3
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and fragment in lines[0].lower()
    assert "Traceback" not in err


def test_usage_errors_are_exit_2(trace, capsys) -> None:
    path, _ = trace
    for args in (["parse", str(path), "--by", "kernel"], ["parse", str(path), "--device", "9"], ["parse"]):
        code, _, err = run(args, capsys)
        assert code == 2, args
        assert len(err.strip().splitlines()) == 1


def test_device_check_reads_no_deferred_column(trace, capsys, monkeypatch) -> None:
    """``--device`` with a device that ran nothing fails on the columns read with the file, not a full read."""
    import detprof.traces.parsers as parsers

    path, _ = trace
    real_load = parsers.load_trace
    completed: list[int] = []

    def load_counting_completions(*args, **kwargs):
        table = real_load(*args, **kwargs)
        complete = table.__dict__["_complete"]
        table.defer_columns(lambda frame: completed.append(len(frame)) or complete(frame))
        return table

    monkeypatch.setattr(parsers, "load_trace", load_counting_completions)
    code, _, err = run(["parse", str(path), "--device", "9"], capsys)
    assert code == 2 and "devices with kernels: [0, 1]" in err
    assert completed == []


def test_parse_of_sqlite_does_not_import_tensorflow(trace) -> None:
    path, _ = trace
    done = run_script("without_tensorflow.py", "parse", path)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["result"] == 0
    assert report["tensorflow_modules"] == [], "tensorflow was imported"


NOT_FOR_PARSE = (
    "rich",
    "plotly",
    "pyarrow.dataset",
    "detprof.check",
    "detprof.kernels_bench",
    "detprof.models",
    "detprof.profiler",
    "detprof.reports",
    "detprof.stability",
    "detprof.sweep",
)
"""What ``detprof parse FILE --format json`` has no use for: the other commands, the report, rich tables."""


def test_parse_json_imports_only_what_it_uses(trace) -> None:
    """Start-up is most of a small trace's parse, so the imports of other commands stay out of it."""
    path, _ = trace
    done = run_script("without_tensorflow.py", "parse", path)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["result"] == 0
    unused = [m for m in report["modules"] if any(m == p or m.startswith(f"{p}.") for p in NOT_FOR_PARSE)]
    assert unused == []
    assert "detprof.traces.parsers.nsys_sqlite" in report["modules"]


NVPROF_CFD = SHARED_TRACES / "nvprof-cfd-titanxp.gpu-trace.csv"
CLOVERLEAF = SHARED_TRACES / "nsys-2024.5-cloverleaf-4xA100.sqlite"


@real_traces(NVPROF_CFD)
def test_parse_real_nvprof_trace_json(capsys) -> None:
    code, out, _ = run(["parse", str(NVPROF_CFD), "--format", "json", "--top", "1"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["format"] == "nvprof-trace-csv"
    assert doc["kernels"][0]["short_name"] == "cuda_compute_flux"
    assert doc["kernels"][0]["instances"] == 6000


def distinct_nsys_kernels(path: Path) -> int:
    """What cuda_gpu_kern_sum groups by: distinct demangled names, counted by plain SQL."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        (count,) = conn.execute("SELECT COUNT(DISTINCT demangledName) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    return int(count)


def distinct_nvprof_kernels(path: Path) -> int:
    """Kernel rows of an nvprof GPU trace are the ones with a grid; counted by a plain csv read."""
    lines = [line for line in path.read_text().splitlines() if line and not line.startswith("==")]
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    return len({r["Name"] for r in rows[1:] if r.get("Grid X")})


@real_traces(CLOVERLEAF)
def test_real_nsys_trace_table_has_one_line_per_kernel(capsys, monkeypatch) -> None:
    """CloverLeaf's demangled names run to 600 characters; each row of the table stays one line."""
    monkeypatch.setenv("COLUMNS", "160")
    code, out, _ = run(["parse", str(CLOVERLEAF), "--top", "30"], capsys)
    assert code == 0
    rows = table_rows(out)
    assert len(rows) == 31  # 30 kernels and "(all other kernels)", none folded onto a second line
    names = [row[-1] for row in rows[:-1]]
    assert len(set(names)) == 30 and all(len(n) <= 64 for n in names)
    assert all(n.startswith(("par_ranged1d_kernel", "par_ranged2d_kernel", "par_reduce_kernel")) for n in names)
    code, out, _ = run(["parse", str(CLOVERLEAF), "--top", "3", "--full-names"], capsys)
    assert code == 0 and len(table_rows(out)) > 10  # the full names do wrap


@real_traces(CLOVERLEAF, NVPROF_CFD)
def test_real_traces_without_a_common_kernel(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "160")
    nsys, nvprof = CLOVERLEAF, NVPROF_CFD
    code, out, err = run(["diff", str(nsys), str(nvprof), "--top", "2"], capsys)
    assert (code, err) == (0, "")
    n, m = distinct_nsys_kernels(nsys), distinct_nvprof_kernels(nvprof)
    assert (n, m) == (102, 4)
    line = f"no kernel in common: BASE has {n} kernels, OTHER has {m}; a ratio per kernel would mean nothing"
    assert line in out.splitlines()
    assert f"({n - 2} more not shown" in out and "cuda_compute_flux" in out


KINETO_PAIR = (SHARED_TRACES / "kineto-a100-control.json.gz", SHARED_TRACES / "kineto-v100-test.json.gz")
NCCL_SEND_RECV = "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)"


def kineto_kernel_names(path: Path) -> set[str]:
    """Every kernel name of a Kineto trace, by a plain json read."""
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    return {e["name"] for e in events if e.get("cat") == "kernel"}


@real_traces(*KINETO_PAIR)
def test_diff_to_a_pipe_is_one_line_per_kernel_with_whole_names() -> None:
    """``detprof diff A B | grep ncclKernel_SendRecv`` finds the kernel's row; a COLUMNS the user sets still rules."""
    done = run_piped("diff", *KINETO_PAIR)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"base {KINETO_PAIR[0]}: ") and lines[0].endswith("kernels in common: 104")
    assert header_lines(done.stdout) == [
        ["Status", "Delta", "Share of change", "Base total", "Other total", "Base n", "Other n", "Category", "Name"]
    ]
    rows = table_rows(done.stdout)
    assert len(rows) == 20  # the default --top, none folded onto a second line
    assert {row[-1] for row in rows} <= kineto_kernel_names(KINETO_PAIR[0]) | kineto_kernel_names(KINETO_PAIR[1])
    (grepped,) = [line for line in lines if "ncclKernel_SendRecv" in line]
    assert grepped.strip("│ ").endswith(f"│ {NCCL_SEND_RECV}")
    narrow = run_piped("diff", *KINETO_PAIR, columns=100)
    assert narrow.returncode == 0, narrow.stderr
    assert max(len(line) for line in narrow.stdout.splitlines()) == 100
