"""Per-mode kernel tables of a sweep, the one source of the console table, the report and kernels_bench."""

from __future__ import annotations

import math
import re
import statistics
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import synthetic_sweep as synth
from piped_cli import header_lines, table_rows

from detprof.analysis.overhead import ModelOverhead
from detprof.analysis.study_results import mode_kernels, per_step_table, summarize_model
from detprof.console import status_console
from detprof.errors import InputError
from detprof.store import ResultsStore
from detprof.sweep.render import print_outcome
from detprof.sweep.run import SweepOutcome
from detprof.traces.kernel_table import KERNEL_DTYPES, SUMMARY_DTYPES, conform

GEMM, CONV, ATOMIC = "volta_sgemm_128x64_nn", "cudnn_conv_kernel", "scatter_atomic_add"


def launches(durations: dict[str, list[int]]) -> pd.DataFrame:
    names = [name for name, durs in durations.items() for _ in durs]
    frame = pd.DataFrame(
        {
            "name": names,
            "short_name": names,
            "start_ns": range(len(names)),
            "dur_ns": [d for durs in durations.values() for d in durs],
        }
    )
    return conform(frame, KERNEL_DTYPES)


def run(
    store: ResultsStore, mode: str, repeat: int, frame: pd.DataFrame, *, tracer: str = "nsys", kind: str = "launches"
) -> dict[str, Any]:
    run_id = f"m--{mode}--r{repeat}"
    record = {
        "run_id": run_id,
        "model": "m",
        "mode": mode,
        "repeat": repeat,
        "status": "ok",
        "steps": 2,
        "tracer": tracer,
        "kernel_table": store.write_table(run_id, frame),
        "kernel_table_kind": kind,
    }
    store.write_record(record)
    return record


@pytest.fixture
def store(tmp_path: Path) -> ResultsStore:
    store = ResultsStore(tmp_path, "sweep")
    store.open({}, "test", resume=False)
    return store


def test_launches_of_all_repeats_are_pooled_per_step(store: ResultsStore) -> None:
    default = [
        run(store, "default", 0, launches({GEMM: [10, 20], CONV: [5, 5, 5, 5]})),
        run(store, "default", 1, launches({GEMM: [30], CONV: [7, 7, 7, 7]})),
    ]
    kernels = mode_kernels(store, default, "m default")
    assert kernels is not None and kernels.format == "nsys-sqlite"
    stats = kernels.stats.set_index("name")
    steps = 4
    assert stats.loc[GEMM, "instances"] == pytest.approx(3 / steps)
    assert stats.loc[GEMM, "total_ns"] == pytest.approx(60 / steps)
    assert stats.loc[GEMM, "med_ns"] == statistics.median([10, 20, 30])
    assert stats.loc[CONV, "med_ns"] == statistics.median([5] * 4 + [7] * 4)
    assert stats.loc[CONV, "total_ns"] == pytest.approx(48 / steps)
    table = kernels.table().summary.set_index("name")
    assert table.loc[GEMM, "instances"] == 1 and table.loc[GEMM, "total_ns"] == 15
    assert table.loc[CONV, "instances"] == 2 and table.loc[CONV, "total_ns"] == 12


@pytest.mark.parametrize(
    ("tracer", "kind", "expected"),
    [
        ("nsys", "launches", "nsys-sqlite"),
        ("nvprof", "launches", "nvprof-trace-csv"),
        ("tf", "launches", "tf-xplane"),
        ("nsys", "summary", "nsys-stats-csv"),
        ("nvprof", "summary", "nvprof-summary-csv"),
    ],
)
def test_tables_carry_the_format_their_tracer_wrote(store: ResultsStore, tracer: str, kind: str, expected: str) -> None:
    frame = launches({GEMM: [10, 30]})
    if kind == "summary":
        frame = conform(
            pd.DataFrame({"name": [GEMM], "short_name": [GEMM], "instances": [2], "total_ns": [40], "max_ns": [30.0]}),
            SUMMARY_DTYPES,
        )
    records = [run(store, "default", 0, frame, tracer=tracer, kind=kind)]
    table = per_step_table(store, records, "m default")
    assert table is not None and table.format == expected
    (row,) = table.summary.to_dict("records")
    assert (row["instances"], row["total_ns"], row["max_ns"]) == (1, 20, 30.0)
    assert math.isnan(row["med_ns"]) == (kind == "summary")


def test_a_table_of_an_unknown_tracer_is_input_error(store: ResultsStore) -> None:
    records = [run(store, "default", 0, launches({GEMM: [1]}), tracer="perf")]
    with pytest.raises(InputError, match=r"runs/m--default--r0\.json: .*tracer 'perf'"):
        mode_kernels(store, records, "m default")


def test_model_summary_diffs_the_modes_per_step(store: ResultsStore) -> None:
    records = [
        run(store, "default", 0, launches({GEMM: [10, 10], CONV: [40, 40]})),
        run(store, "deterministic", 0, launches({GEMM: [10, 10], CONV: [40, 40], ATOMIC: [100, 100, 100, 100]})),
        {"run_id": "m--deterministic--r1", "model": "m", "mode": "deterministic", "status": "failed", "reason": "x"},
    ]
    summary = summarize_model(store, ModelOverhead("m"), records)
    assert list(summary.modes) == ["default", "deterministic"]
    assert summary.kernel_diff is not None
    changes = summary.kernel_diff.set_index("name")
    assert changes.loc[ATOMIC, "status"] == "added" and changes.loc[ATOMIC, "delta_ns"] == 200
    assert changes.loc[CONV, "status"] == "same" and changes.loc[CONV, "delta_ns"] == 0
    only_default = summarize_model(store, ModelOverhead("m"), records[:1])
    assert list(only_default.modes) == ["default"] and only_default.kernel_diff is None


LONG_MODEL = "transformer_block_with_a_rather_long_name_to_build_a_custom_keras_model"


def test_closing_table_off_a_terminal_is_one_line_per_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep's closing table in a pipe or a log: whole model names, no column squeezed to nothing."""
    from detprof.sweep.render import print_summary

    monkeypatch.delenv("COLUMNS", raising=False)
    overheads = {"resnet50": [1.50, 1.52, 1.48], LONG_MODEL: [1.20, 1.21, 1.19]}
    results = synth.write_sweep(tmp_path, synth.config(list(overheads), 3), synth.records(overheads))
    print_summary(ResultsStore(results, "sweep"))
    out = capsys.readouterr().out
    assert "Overhead of determinism (deterministic / default, 95% CI over repeats)" in map(str.strip, out.splitlines())
    assert header_lines(out) == [["Model", "Kernel time", "Wall time", "Verdict"]]
    rows = table_rows(out)
    assert [row[0] for row in rows] == ["resnet50", LONG_MODEL]
    assert all(re.fullmatch(r"1\.\d{3}x \[1\.\d{3}, 1\.\d{3}\]", cell) for row in rows for cell in row[1:3])
    assert all(row[3].endswith("(kernel time)") for row in rows)


def test_where_the_results_are_is_one_line_to_copy_however_long_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Off a terminal (make's output, a CI log) a path wider than 80 columns is printed whole on its line, not
    broken where a space allows."""
    monkeypatch.delenv("COLUMNS", raising=False)
    out = tmp_path / ("a folder named at length " * 4).strip()
    print_outcome(SweepOutcome(out, "sweep", studies={}), status_console())
    assert capsys.readouterr().err.splitlines() == [f"results: {out}"]
