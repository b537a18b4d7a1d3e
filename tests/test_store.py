"""The results store: atomic records, resume rules, discovery."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from detprof.errors import InputError, UsageError
from detprof.store import ResultsStore, find_studies


def test_records_round_trip_and_resume_rules(tmp_path) -> None:
    store = ResultsStore(tmp_path, "sweep")
    store.open({"steps": 5}, "detprof sweep", resume=False)
    store.write_record({"run_id": "a", "status": "ok"})
    store.write_record({"run_id": "b", "status": "failed"})
    assert store.is_done("a") and not store.is_done("b") and not store.is_done("c")
    assert [r["run_id"] for r in store.records()] == ["a", "b"]
    assert not list((store.dir / "runs").glob("*.tmp"))
    with pytest.raises(UsageError, match="--resume"):
        ResultsStore(tmp_path, "sweep").open({"steps": 5}, "x", resume=False)
    ResultsStore(tmp_path, "sweep").open({"steps": 5}, "x", resume=True)
    with pytest.raises(UsageError, match="different configuration"):
        ResultsStore(tmp_path, "sweep").open({"steps": 6}, "x", resume=True)


def test_tables_and_discovery(tmp_path) -> None:
    store = ResultsStore(tmp_path, "stability")
    store.open({}, "detprof stability", resume=False)
    rel = store.write_table("runs", pd.DataFrame({"a": [1, 2]}))
    assert store.read_table(rel)["a"].tolist() == [1, 2]
    assert [s.kind for s in find_studies(tmp_path)] == ["stability"]
    assert [s.kind for s in find_studies(store.dir)] == ["stability"]
    with pytest.raises(InputError, match="no detprof results"):
        find_studies(tmp_path / "stability" / "tables")
    with pytest.raises(InputError, match="no such results directory"):
        find_studies(tmp_path / "missing")


def test_unwritable_output_is_a_usage_error(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(UsageError, match="cannot write results"):
        ResultsStore(blocker / "sub", "sweep").open({}, "x", resume=False)


def test_corrupt_record_is_reported(tmp_path) -> None:
    store = ResultsStore(tmp_path, "sweep")
    store.open({}, "x", resume=False)
    (store.dir / "runs").mkdir()
    (store.dir / "runs" / "bad.json").write_text("{")
    with pytest.raises(InputError, match=r"bad\.json"):
        list(store.records())
    assert json.loads(store.manifest_path.read_text())["kind"] == "sweep"
