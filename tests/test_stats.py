"""top_n, kernel_stats and diff over hand-built KernelTables, checked against numpy/statistics."""

from __future__ import annotations

import statistics

import numpy as np
import pandas as pd
import pytest

from detprof.traces.kernel_table import KERNEL_DTYPES, SUMMARY_DTYPES, UNNAMED, KernelTable, conform
from detprof.traces.kernel_tables import diff, kernel_stats, kernels_in_common, top_n


def launches(rows: list[tuple[str, int]], short: dict[str, str] | None = None) -> KernelTable:
    frame = pd.DataFrame(
        {
            "name": [n for n, _ in rows],
            "short_name": [(short or {}).get(n, n.split("<")[0]) for n, _ in rows],
            "start_ns": np.arange(len(rows), dtype=np.int64) * 1000,
            "dur_ns": [d for _, d in rows],
        }
    )
    return KernelTable("test", "nsys-sqlite", kernels=conform(frame, KERNEL_DTYPES))


def test_kernel_stats_match_independent_computation() -> None:
    rng = np.random.default_rng(1)
    names = [f"kernel_{i}<float>" for i in range(5)]
    rows = [
        (names[int(i)], int(d)) for i, d in zip(rng.integers(0, 5, 500), rng.integers(100, 10_000, 500), strict=True)
    ]
    stats = kernel_stats(launches(rows))
    total = sum(d for _, d in rows)
    for rec in stats.to_dict("records"):
        durs = [d for n, d in rows if n == rec["name"]]
        assert rec["instances"] == len(durs)
        assert rec["total_ns"] == sum(durs)
        assert rec["pct"] == pytest.approx(sum(durs) / total * 100)
        assert rec["avg_ns"] == pytest.approx(statistics.mean(durs))
        assert rec["med_ns"] == pytest.approx(statistics.median(durs))
        assert rec["std_ns"] == pytest.approx(statistics.stdev(durs))
        assert rec["min_ns"] == min(durs) and rec["max_ns"] == max(durs)
    assert list(stats["total_ns"]) == sorted(stats["total_ns"], reverse=True)


def test_top_n_reports_remainder_so_shares_add_up() -> None:
    rows = [(f"k{i}", 100 * (i + 1)) for i in range(30)]
    head, other = top_n(launches(rows), n=20)
    assert len(head) == 20
    assert head["total_ns"].sum() + other == sum(d for _, d in rows)
    assert other == sum(100 * (i + 1) for i in range(10))
    assert head["pct"].sum() + other / sum(d for _, d in rows) * 100 == pytest.approx(100)


@pytest.mark.parametrize("by", ["name", "short_name"])
def test_top_n_is_the_head_of_kernel_stats(by: str) -> None:
    """Ranked on totals first, the chosen kernels' rows are kernel_stats' rows: ties broken by name, unnamed
    launches one kernel of their own, shares of every kernel's time, short names merged."""
    rng = np.random.default_rng(7)
    names = [f"kernel_{i}<float>" for i in range(40)]
    rows = [(names[int(i)], int(d)) for i, d in zip(rng.integers(0, 40, 2000), rng.integers(1, 50, 2000), strict=True)]
    rows += [("tie_b<int>", 10_000), ("tie_a<int>", 10_000), ("tie_c<int>", 10_000)]
    short = {n: f"s{int(n.split('_')[1].split('<')[0]) % 7}" for n in names}
    table = launches(rows, short)
    table.kernels.loc[[3, 17, 29], "name"] = None
    for column in ("name", "short_name"):  # codes in reverse name order: ranking by code is not by name
        names_here = table.kernels[column].cat.categories
        table.kernels[column] = table.kernels[column].cat.reorder_categories(names_here[::-1])
    for n in (1, 3, 10, 50):
        head, other = top_n(table, n, by)
        stats = kernel_stats(table, by)
        pd.testing.assert_frame_equal(head, stats.head(n).reset_index(drop=True))
        assert other == int(stats["total_ns"].iloc[n:].sum())


def test_single_launch_has_null_std() -> None:
    stats = kernel_stats(launches([("only", 5)]))
    assert np.isnan(stats.loc[0, "std_ns"])


def test_names_stay_categoricals_and_stats_group_by_their_codes() -> None:
    """Categories no launch uses (a table cut to one device) give no row; each kernel keeps its first short name."""
    table = launches([("b<int>", 5), ("a<int>", 3), ("b<int>", 7), ("c<int>", 1)])
    assert isinstance(table.kernels["name"].dtype, pd.CategoricalDtype)
    table.kernels = table.kernels[table.kernels["name"] != "c<int>"].reset_index(drop=True)
    stats = kernel_stats(table)
    assert stats[["name", "short_name", "instances", "total_ns"]].values.tolist() == [
        ["b<int>", "b", 2, 12],
        ["a<int>", "a", 1, 3],
    ]


def test_launches_without_a_name_are_one_kernel_of_their_own() -> None:
    """A null name code is -1; taken as an index it would merge the launch into the last kernel."""
    names = ["a", None, "z", None]
    frame = pd.DataFrame({"name": names, "short_name": names, "dur_ns": [2, 3, 4, 5]})
    stats = kernel_stats(KernelTable("test", "nsys-sqlite", kernels=conform(frame, KERNEL_DTYPES)))
    assert dict(zip(stats["name"], stats["total_ns"], strict=True)) == {UNNAMED: 8, "z": 4, "a": 2}


def test_group_by_short_name_merges_template_instances() -> None:
    table = launches([("gemm<1>", 10), ("gemm<2>", 30), ("relu", 5)])
    stats = kernel_stats(table, by="short_name")
    assert dict(zip(stats["name"], stats["total_ns"], strict=True)) == {"gemm": 40, "relu": 5}


def test_summary_tables_give_the_same_columns() -> None:
    summary = conform(
        pd.DataFrame(
            {
                "name": ["a<int>", "a<float>", "b"],
                "short_name": ["a", "a", "b"],
                "instances": [2, 3, 1],
                "total_ns": [20, 60, 5],
                "avg_ns": [10, 20, 5],
                "med_ns": [10, 20, 5],
                "min_ns": [9, 15, 5],
                "max_ns": [11, 25, 5],
                "std_ns": [1.0, 2.0, np.nan],
            }
        ),
        SUMMARY_DTYPES,
    )
    table = KernelTable("s", "nsys-stats-csv", summary=summary)
    assert table.kernel_count == 6 and table.total_ns == 85
    by_short = kernel_stats(table, by="short_name").set_index("name")
    assert by_short.loc["a", "instances"] == 5 and by_short.loc["a", "total_ns"] == 80
    assert by_short.loc["a", "avg_ns"] == pytest.approx(16)
    assert np.isnan(by_short.loc["a", "med_ns"])
    assert by_short.loc["b", "med_ns"] == 5


def test_diff_statuses_and_shares() -> None:
    base = launches([("conv_fwd", 100), ("conv_fwd", 100), ("wgrad_fast", 300), ("relu", 50)])
    other = launches([("conv_fwd", 100), ("conv_fwd", 100), ("wgrad_det", 900), ("relu", 50), ("relu", 40)])
    d = diff(base, other).set_index("name")
    assert d.loc["wgrad_det", "status"] == "added"
    assert d.loc["wgrad_fast", "status"] == "removed"
    assert d.loc["relu", "status"] == "slower"
    assert d.loc["conv_fwd", "status"] == "same"
    total_change = (200 + 900 + 90) - (200 + 300 + 50)
    assert d["delta_ns"].sum() == total_change
    assert d.loc["wgrad_det", "share_of_change"] == pytest.approx(900 / total_change)
    assert d["share_of_change"].sum() == pytest.approx(1.0)


def test_kernels_in_common_counts_kernels_that_ran_in_both() -> None:
    base = launches([("conv_fwd", 100), ("wgrad_fast", 300), ("relu", 50)])
    other = launches([("conv_fwd", 100), ("wgrad_det", 900), ("relu", 60)])
    assert kernels_in_common(diff(base, other)) == 2
    disjoint = diff(launches([("a<int>", 10)]), launches([("a<float>", 20), ("b", 5)]))
    assert kernels_in_common(disjoint) == 0
    assert set(disjoint["status"]) == {"added", "removed"}
    by_short = diff(launches([("a<int>", 10)]), launches([("a<float>", 20), ("b", 5)]), by="short_name")
    assert kernels_in_common(by_short) == 1
    assert by_short.set_index("name").loc["a", "status"] == "slower"
