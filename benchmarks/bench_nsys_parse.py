"""Speed targets for an nsys SQLite export with 1,000,000 kernels to the top-20 table.

The targets of "kernel names that cost nothing": ``load_trace`` + ``top_n`` in-process
<= 0.5 s, and the whole command line (``detprof parse FILE --format json``, start-up
included) <= 1.0 s. Issue 2's still hold: >= 5x faster than the naive pandas approach
(``read_sql`` of the kernel table joined with ``StringIds``, then ``groupby``) and < 500 MB
peak memory. The naive read of only the three columns the table needs (start, end, name) is
shown too: it is the baseline that detprof once lost to, when a Python string was made per
launch.

The names are 400 distinct cuDNN/CUTLASS-style signatures of about 90 characters and their
short names: long and many names are what made per-launch strings expensive, so a file of
a few short names would hide that cost.

Every approach runs in its own subprocess (so that peak RSS is its own and nothing is
warmed in-process), and the approaches take turns round by round, so that a change in the
machine's load during the run hits all of them alike; figures are medians over rounds.
The command line runs with its byte-code cached, as an installed detprof has it, and its
figure for a 1,000-kernel file shows what start-up alone costs. The file uses the real
export layout: the DDL below is the column list of Nsight Systems 2024.5 (export schema
3.13.2), written out literally so the benchmark needs no external trace.

Run: ``make bench`` or ``python -m benchmarks`` (all benchmarks), or
``python -m benchmarks.bench_nsys_parse``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.results import record

N_KERNELS = 1_000_000
N_NAMES = 400
SMALL_KERNELS = 1_000
TOP = 20
ROUNDS = 5
TARGET_IN_PROCESS_S = 0.5
TARGET_CLI_S = 1.0
TARGET_RATIO = 5.0
TARGET_PEAK_MB = 500.0
_INSERT_CHUNK = 100_000

STRING_IDS_DDL = """
CREATE TABLE StringIds (
    id                          INTEGER   NOT NULL   PRIMARY KEY,
    value                       TEXT      NOT NULL
)"""

KERNEL_DDL = """
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (
    start                       INTEGER   NOT NULL,
    end                         INTEGER   NOT NULL,
    deviceId                    INTEGER   NOT NULL,
    contextId                   INTEGER   NOT NULL,
    greenContextId              INTEGER,
    streamId                    INTEGER   NOT NULL,
    correlationId               INTEGER,
    globalPid                   INTEGER,
    demangledName               INTEGER   NOT NULL,
    shortName                   INTEGER   NOT NULL,
    mangledName                 INTEGER,
    launchType                  INTEGER,
    cacheConfig                 INTEGER,
    registersPerThread          INTEGER   NOT NULL,
    gridX                       INTEGER   NOT NULL,
    gridY                       INTEGER   NOT NULL,
    gridZ                       INTEGER   NOT NULL,
    blockX                      INTEGER   NOT NULL,
    blockY                      INTEGER   NOT NULL,
    blockZ                      INTEGER   NOT NULL,
    staticSharedMemory          INTEGER   NOT NULL,
    dynamicSharedMemory         INTEGER   NOT NULL,
    localMemoryPerThread        INTEGER   NOT NULL,
    localMemoryTotal            INTEGER   NOT NULL,
    gridId                      INTEGER   NOT NULL,
    sharedMemoryExecuted        INTEGER,
    graphNodeId                 INTEGER,
    sharedMemoryLimitConfig     INTEGER
)"""

RUNTIME_DDL = """
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (
    start                       INTEGER   NOT NULL,
    end                         INTEGER   NOT NULL,
    eventClass                  INTEGER   NOT NULL,
    globalTid                   INTEGER,
    correlationId               INTEGER,
    nameId                      INTEGER   NOT NULL,
    returnValue                 INTEGER   NOT NULL,
    callchainId                 INTEGER
)"""
LAUNCH_CALL = "cudaLaunchKernel_v7000"

_FAMILIES: tuple[tuple[str | None, str], ...] = (
    (
        "wgrad_alg0_engine",
        "void cudnn::cnn::wgrad_alg0_engine<float, {a}, {b}, 5, 3, 3, 3, {c}, false, 512>(int, int, float*)",
    ),
    (
        "implicit_convolve_sgemm",
        "void implicit_convolve_sgemm<float, float, {a}, {b}, 5, 4, 3, 3, {c}, false, true>(int, int)",
    ),
    (
        "bn_fw_tr_1C11_kernel_NCHW",
        "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, {a}, true, {c}>(cudnnTensorStruct, {b})",
    ),
    (None, "sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize{a}x{b}x16_stage{c}_warpsize2x2x1"),
    (
        "nchwToNhwcKernel",
        "void cudnn::ops::nchwToNhwcKernel<float, float, float, true, false, (cudnnKernelDataType_t){c}>({a}, {b})",
    ),
    ("Kernel", "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_{a}x{b}_32x{c}_nn_align4>(Params)"),
    (
        "winogradForwardData4x4",
        "void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>({a}, {b}, {c}, WinogradDataParams)",
    ),
    (
        "dgrad2d_grouped_direct_kernel",
        "void dgrad2d_grouped_direct_kernel<float, float, float, float, {a}, {b}, {c}, true>(DgradParams)",
    ),
)
"""(short name, demangled template); a C-style kernel without arguments (``sm80_xmma_...``) is its
own short name in nsys, so that family gives each instance a short name of its own."""


def kernel_names(n: int) -> list[tuple[str, str]]:
    """``n`` distinct (demangled, short) pairs of 80-103 characters, shaped like cuDNN/CUTLASS kernels."""
    names = []
    for i in range(n):
        short, template = _FAMILIES[i % len(_FAMILIES)]
        j = i // len(_FAMILIES)
        demangled = template.format(a=32 * (1 + j % 5), b=64 * (1 + (j // 5) % 5), c=1 + j // 25)
        names.append((demangled, short or demangled))
    if len(set(names)) != n:
        raise ValueError(f"{n} names asked for, but the families make only {len(set(names))} distinct ones")
    return names


def write_trace(path: Path, n_kernels: int = N_KERNELS, n_names: int = N_NAMES, seed: int = 0) -> None:
    """Write an nsys-layout SQLite file with ``n_kernels`` launches of ``n_names`` kernels.

    Launch counts follow a Zipf-like law and durations a per-kernel log-normal, so the
    top-20 table has the skew of a real training step rather than uniform noise. Like a
    real export it holds the API call that launched each kernel too.
    """
    rng = np.random.default_rng(seed)
    names = kernel_names(n_names)
    other = [f"thread_{i}" for i in range(500)] + [LAUNCH_CALL]
    # nsys stores each string once; a kernel that is its own short name shares its id.
    strings = other + list(dict.fromkeys([*sorted({s for _, s in names}), *(d for d, _ in names)]))
    string_id = {s: i for i, s in enumerate(strings)}
    demangled_ids = np.array([string_id[d] for d, _ in names], dtype=np.int64)
    short_ids = np.array([string_id[s] for _, s in names], dtype=np.int64)

    weights = 1.0 / np.arange(1, n_names + 1) ** 1.1
    which = rng.choice(n_names, size=n_kernels, p=weights / weights.sum())
    median_ns = rng.uniform(2_000, 400_000, size=n_names)
    dur = np.maximum(1_000, rng.lognormal(np.log(median_ns[which]), 0.3)).astype(np.int64)
    gap = rng.integers(500, 5_000, size=n_kernels)
    start = 1_000_000_000 + np.cumsum(dur + gap) - dur
    end = start + dur
    stream = rng.choice(np.array([7, 13, 14, 15]), size=n_kernels)
    grid = rng.choice(np.array([1, 32, 108, 216, 1024]), size=n_kernels)
    block = rng.choice(np.array([128, 256, 512]), size=n_kernels)
    columns = [
        start,
        end,
        np.zeros(n_kernels, np.int64),
        np.ones(n_kernels, np.int64),
        None,
        stream,
        np.arange(100, 100 + n_kernels),
        np.full(n_kernels, 310028053512192),
        demangled_ids[which],
        short_ids[which],
        None,
        np.ones(n_kernels, np.int64),
        np.zeros(n_kernels, np.int64),
        np.full(n_kernels, 32),
        grid,
        np.ones(n_kernels, np.int64),
        np.ones(n_kernels, np.int64),
        block,
        np.ones(n_kernels, np.int64),
        np.ones(n_kernels, np.int64),
        np.zeros(n_kernels, np.int64),
        np.zeros(n_kernels, np.int64),
        np.zeros(n_kernels, np.int64),
        np.full(n_kernels, 127401984),
        np.arange(1, n_kernels + 1),
        np.full(n_kernels, 32768),
        None,
        np.zeros(n_kernels, np.int64),
    ]
    calls = [
        start - 3_000,
        start - 1_000,
        np.ones(n_kernels, np.int64),
        np.full(n_kernels, 310028053512192),
        np.arange(100, 100 + n_kernels),
        np.full(n_kernels, string_id[LAUNCH_CALL]),
        np.zeros(n_kernels, np.int64),
        None,
    ]
    path.unlink(missing_ok=True)
    with sqlite3.connect(path) as conn:
        conn.execute(STRING_IDS_DDL)
        conn.execute(KERNEL_DDL)
        conn.execute(RUNTIME_DDL)
        conn.executemany("INSERT INTO StringIds VALUES (?, ?)", list(enumerate(strings)))
        _insert(conn, "CUPTI_ACTIVITY_KIND_KERNEL", columns, n_kernels)
        _insert(conn, "CUPTI_ACTIVITY_KIND_RUNTIME", calls, n_kernels)
    conn.close()


def _insert(conn: sqlite3.Connection, table: str, columns: list[np.ndarray | None], rows: int) -> None:
    """Rows from column arrays (``None``: a null column), in chunks that bound the Python lists."""
    insert = f"INSERT INTO {table} VALUES ({', '.join('?' * len(columns))})"
    for lo in range(0, rows, _INSERT_CHUNK):
        hi = min(lo + _INSERT_CHUNK, rows)
        chunk = [[None] * (hi - lo) if c is None else c[lo:hi].tolist() for c in columns]
        conn.executemany(insert, zip(*chunk, strict=True))


NAIVE_ALL_SQL = (
    "SELECT k.*, s.value AS name FROM CUPTI_ACTIVITY_KIND_KERNEL AS k JOIN StringIds AS s ON s.id = k.demangledName"
)
NAIVE_THREE_SQL = (
    'SELECT k.start, k."end", s.value AS name '
    "FROM CUPTI_ACTIVITY_KIND_KERNEL AS k JOIN StringIds AS s ON s.id = k.demangledName"
)
APPROACHES = {
    "detprof": "detprof load_trace + top_n(20), in-process",
    "cli": "detprof parse FILE --format json, whole process",
    "naive": "naive read_sql(kernel table JOIN StringIds) + groupby",
    "naive-3": "naive, reading only start, end, name",
    "cli-small": f"detprof parse FILE --format json, {SMALL_KERNELS:,} kernels",
}
"""Each approach, in the order the rounds run them."""

Top = list[tuple[str, int, int]]


def _top_detprof(path: Path) -> Top:
    from detprof.traces.kernel_tables import top_n
    from detprof.traces.parsers import load_trace

    head, _other = top_n(load_trace(path), TOP)
    return list(zip(head["name"], head["instances"].tolist(), head["total_ns"].tolist(), strict=True))


def _top_naive(path: Path, sql: str) -> Top:
    import pandas as pd

    with sqlite3.connect(path) as conn:
        frame = pd.read_sql(sql, conn)
    conn.close()
    frame["dur"] = frame["end"] - frame["start"]
    stats = frame.groupby("name")["dur"].agg(["count", "sum", "mean", "median", "min", "max", "std"])
    stats["pct"] = stats["sum"] / stats["sum"].sum() * 100.0
    stats = stats.reset_index().sort_values(["sum", "name"], ascending=[False, True]).head(TOP)
    return list(zip(stats["name"], stats["count"].tolist(), stats["sum"].tolist(), strict=True))


def peak_rss_mb() -> float:
    """This process's own high-water RSS.

    Not ``ru_maxrss``: Linux carries that over from the parent across fork/exec, so the
    generator's memory would show up in the measured process.
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("/proc/self/status has no VmHWM line")


def measure(approach: str, path: Path) -> dict[str, object]:
    """One run of an in-process approach, timed after its imports; peak RSS includes them."""
    import pandas  # noqa: F401  (imports are not part of the measured time)

    if approach == "detprof":
        from detprof.traces import kernel_tables  # noqa: F401
        from detprof.traces.parsers import nsys_sqlite  # noqa: F401

        run = _top_detprof
    else:
        sql = NAIVE_ALL_SQL if approach == "naive" else NAIVE_THREE_SQL

        def run(p: Path) -> Top:
            return _top_naive(p, sql)

    start = time.perf_counter()
    top = run(path)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "top": top, "peak_mb": peak_rss_mb()}


def _root() -> Path:
    return Path(__file__).resolve().parents[1]


def measure_in_subprocess(module: str, approach: str, path: Path) -> dict[str, object]:
    """``module``'s ``measure(approach, path)`` in a fresh interpreter (``--measure``), so its peak RSS is its own."""
    done = subprocess.run(
        [sys.executable, "-m", module, "--measure", approach, str(path)],
        cwd=_root(),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def cli_env(pycache: Path) -> dict[str, str]:
    """The environment of a user's ``detprof``: byte-code cached, as an installed package has it.

    A shell with ``PYTHONDONTWRITEBYTECODE`` (CI images, this dev container) would otherwise
    make every run compile detprof's modules anew; the cache goes to ``pycache``, not the tree.
    """
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return env | {"PYTHONPYCACHEPREFIX": str(pycache)}


def run_cli(path: Path, env: dict[str, str]) -> dict[str, object]:
    """The whole command as a user runs it: interpreter start-up, imports, parse and JSON output."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "detprof.cli", "parse", str(path), "--format", "json", "--top", str(TOP)],
        cwd=_root(),
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    seconds = time.perf_counter() - start
    doc = json.loads(done.stdout)
    return {
        "seconds": seconds,
        "top": [(k["name"], k["instances"], k["total_ns"]) for k in doc["kernels"]],
        "kernel_count": doc["kernel_count"],
        "total_ns": doc["total_ns"],
    }


def _run(approach: str, path: Path, small: Path, env: dict[str, str]) -> dict[str, object]:
    if approach == "cli":
        return run_cli(path, env)
    if approach == "cli-small":
        return run_cli(small, env)
    return measure_in_subprocess("benchmarks.bench_nsys_parse", approach, path)


def load_average() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


TARGET = (
    "1,000,000-kernel nsys export to its top-20 table, in-process and as a whole `detprof parse`, against pandas "
    "read_sql + join + groupby: in-process <= 0.5 s, CLI <= 1.0 s, >= 5x faster, < 500 MB"
)


def main() -> int:
    print(f"== nsys SQLite parse: {N_KERNELS:,} kernels, {N_NAMES} kernel names of ~90 characters, top-{TOP} table ==")
    print(f"machine: {os.cpu_count()} CPUs, load average {load_average()} (timings assume an otherwise idle machine)")
    runs: dict[str, list[dict[str, object]]] = {a: [] for a in APPROACHES}
    with tempfile.TemporaryDirectory(prefix="detprof-bench-") as tmp:
        path, small = Path(tmp) / "bench.sqlite", Path(tmp) / "small.sqlite"
        start = time.perf_counter()
        write_trace(path)
        write_trace(small, n_kernels=SMALL_KERNELS)
        size_mb = path.stat().st_size / 2**20
        print(f"generated {path.name}: {size_mb:.0f} MB in {time.perf_counter() - start:.1f} s")
        env = cli_env(Path(tmp) / "pycache")
        run_cli(small, env)  # fills the byte-code cache, as installing detprof does
        for _ in range(ROUNDS):
            for approach in APPROACHES:
                runs[approach].append(_run(approach, path, small, env))
    print(f"load average after the runs: {load_average()}")

    median = {a: statistics.median(r["seconds"] for r in results) for a, results in runs.items()}
    for approach, label in APPROACHES.items():
        times = ", ".join(f"{r['seconds']:.3f}" for r in runs[approach])
        peaks = [r["peak_mb"] for r in runs[approach] if "peak_mb" in r]
        peak = f"; peak RSS {max(peaks):.0f} MB" if peaks else ""
        print(f"{label}: median {median[approach]:.3f} s (rounds {times}){peak}")

    ours, cli = median["detprof"], median["cli"]
    speedup = median["naive"] / ours
    peak = max(r["peak_mb"] for r in runs["detprof"])
    reference = runs["detprof"][0]["top"]
    same = all(
        [tuple(row) for row in r["top"]] == [tuple(row) for row in reference]
        for a in ("detprof", "cli", "naive", "naive-3")
        for r in runs[a]
    )
    print(f"speed-up vs naive reading only start, end, name: {median['naive-3'] / ours:.1f}x")
    checks = {
        f"in-process {ours:.3f} s <= {TARGET_IN_PROCESS_S:.1f} s": ours <= TARGET_IN_PROCESS_S,
        f"whole CLI {cli:.3f} s <= {TARGET_CLI_S:.1f} s": cli <= TARGET_CLI_S,
        f"speed-up vs naive {speedup:.1f}x >= {TARGET_RATIO:.0f}x": speedup >= TARGET_RATIO,
        f"peak RSS {peak:.0f} MB < {TARGET_PEAK_MB:.0f} MB": peak < TARGET_PEAK_MB,
        f"top-{TOP} identical in-process, from the CLI and in the naive tables": same,
    }
    return record("bench_nsys_parse", TARGET, checks)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--measure":
        print(json.dumps(measure(sys.argv[2], Path(sys.argv[3]))))
    else:
        sys.exit(main())
