"""The results store: atomic records, resume rules, discovery."""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import synthetic_sweep as synth

from detprof.cli import main
from detprof.errors import EnvironmentFailure, InputError, UsageError
from detprof.store import ResultsStore, atomic_write_bytes, find_studies, json_safe, place_for, write_output


def test_records_round_trip_and_resume_rules(tmp_path) -> None:
    store = ResultsStore(tmp_path, "sweep")
    store.open({"steps": 5}, "detprof sweep", resume=False)
    for run_id, status in (("a", "ok"), ("b", "failed")):
        store.write_record({"run_id": run_id, "model": "m", "mode": "default", "repeat": 0, "status": status})
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


def test_without_out_each_configuration_of_a_day_has_a_place_of_its_own(tmp_path: Path) -> None:
    """The day's folder takes the first; another goes to a folder named for its models (three, then a count), or
    with its hash where that name is taken; the same configuration always finds its own place again."""
    models = ["smallcnn", "gpt_tiny", "vit_tiny", "moe_tiny"]

    def opened(config: dict[str, int], subjects: list[str]) -> Path:
        place = place_for(tmp_path, "sweep", config, subjects)
        ResultsStore(place, "sweep").open(config, "detprof sweep", resume=True)
        return place

    assert opened({"steps": 5}, models[:1]) == tmp_path
    assert opened({"steps": 6}, models[:1]) == tmp_path / "smallcnn"
    taken = opened({"steps": 7}, models[:1])
    assert taken.parent == tmp_path and taken.name.startswith("smallcnn-") and len(taken.name) == len("smallcnn-") + 8
    assert opened({"steps": 8}, models) == tmp_path / "smallcnn-gpt_tiny-vit_tiny-and-1-more"
    for steps, place in ((5, tmp_path), (6, tmp_path / "smallcnn"), (7, taken)):
        assert place_for(tmp_path, "sweep", {"steps": steps}, models[:1]) == place
    assert place_for(tmp_path, "verify", {"steps": 6}, models[:1]) == tmp_path  # another kind's folder is free


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


@pytest.mark.parametrize(
    ("manifest", "found"),
    [([], "holds an array"), ('"sweep"', "holds a string"), ({"kind": "sweep", "config": [1]}, "'config'")],
)
def test_a_manifest_that_is_not_an_object_is_input_error(tmp_path, manifest, found) -> None:
    store = ResultsStore(tmp_path, "sweep")
    store.dir.mkdir()
    store.manifest_path.write_text(manifest if isinstance(manifest, str) else json.dumps(manifest))
    with pytest.raises(InputError, match=rf"manifest\.json: not a detprof manifest: .*{found}") as raised:
        store.manifest()
    assert "\n" not in str(raised.value)
    if not isinstance(manifest, dict):
        with pytest.raises(InputError, match=r"sweep/manifest\.json: not a detprof manifest"):
            find_studies(tmp_path)


def test_a_run_record_that_is_not_an_object_is_input_error(tmp_path) -> None:
    store = ResultsStore(tmp_path, "sweep")
    store.open({}, "x", resume=False)
    store.record_path("a").parent.mkdir()
    store.record_path("a").write_text("[1, 2]")
    with pytest.raises(InputError, match=r"runs/a\.json: not a detprof run record"):
        list(store.records())
    with pytest.raises(InputError, match=r"runs/a\.json: not a detprof run record"):
        store.is_done("a")


def test_discovery_reads_only_manifests_of_study_folders(tmp_path) -> None:
    (tmp_path / "webapp").mkdir()
    (tmp_path / "webapp" / "manifest.json").write_text("[]")
    ResultsStore(tmp_path, "kernels").open({}, "x", resume=False)
    assert [s.kind for s in find_studies(tmp_path)] == ["kernels"]


def test_json_safe_turns_every_undefined_number_into_null() -> None:
    frame = pd.DataFrame({"n": pd.array([1, None], dtype="Int64"), "x": [math.inf, 2.5]})
    row = frame.to_dict("records")[1]
    value = {
        "nan": math.nan,
        "row": row,
        "numpy": (np.float32("nan"), np.int64(3), np.array([1.5, np.nan])),
        "text": "nan",
    }
    safe = json_safe(value)
    assert safe == {"nan": None, "row": {"n": None, "x": 2.5}, "numpy": [None, 3, [1.5, None]], "text": "nan"}
    assert type(safe["numpy"][1]) is int
    assert json.loads(json.dumps(safe, allow_nan=False)) == safe
    assert json_safe(frame.to_dict("records")[0]) == {"n": 1, "x": None}


def test_a_record_without_the_fields_readers_need_is_input_error(tmp_path) -> None:
    store = ResultsStore(tmp_path, "sweep")
    store.open({"steps": 5}, "detprof sweep", resume=False)
    store.write_record({"run_id": "a", "mode": "default", "repeat": 0, "status": "ok"})
    with pytest.raises(InputError, match=r"a\.json: run record a has no valid 'model'"):
        list(store.records())


@pytest.fixture(params=[0o022, 0o077, 0o002], ids=lambda m: f"umask-{m:03o}")
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    """The process's real umask set to ``request.param`` for one test, then restored."""
    previous = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(previous)


def test_result_files_respect_the_umask(tmp_path: Path, umask: int) -> None:
    """Manifests, records, tables and report-style files are 0666 & ~umask (0644 under 022), not mkstemp's 0600."""
    store = ResultsStore(tmp_path, "sweep")
    store.open({"steps": 5}, "detprof sweep", resume=False)
    store.write_record({"run_id": "a", "model": "m", "mode": "default", "repeat": 0, "status": "ok"})
    rel = store.write_table("kernels", pd.DataFrame({"a": [1, 2]}))
    report = tmp_path / "report.html"
    atomic_write_bytes(report, b"<html></html>")
    atomic_write_bytes(report, b"<html>again</html>")  # replacing a file keeps the rule too
    expected = 0o666 & ~umask
    for path in (store.manifest_path, store.record_path("a"), store.dir / rel, report):
        assert stat.S_IMODE(path.stat().st_mode) == expected, path
    assert report.read_bytes() == b"<html>again</html>"
    assert not [p for p in tmp_path.rglob("*.tmp")]


def test_report_html_written_by_the_cli_respects_the_umask(tmp_path: Path, umask: int) -> None:
    results = synth.write_sweep(tmp_path / "res", synth.config(["resnet50"], 3), synth.records({"resnet50": [1.2] * 3}))
    out = tmp_path / "report.html"
    assert main(["report", str(results), "-o", str(out)]) == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask


def test_a_failed_write_leaves_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "record.json"
    target.mkdir()  # renaming a file onto a directory fails after the data is written
    with pytest.raises(OSError):
        atomic_write_bytes(target, b"{}")
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]


def test_a_file_the_user_names_is_written_through_a_link_and_into_a_pipe_or_device(tmp_path: Path) -> None:
    """``report -o``, ``baseline -o``, ``check --junit``: a rename would replace a symbolic link by a file, and a
    FIFO or a device (``/dev/null``, as root in a CI container) by one; each is written through instead."""
    import threading

    (tmp_path / "link.json").symlink_to(tmp_path / "real" / "target.json")
    write_output(tmp_path / "link.json", b"{}", "the baseline")
    assert (tmp_path / "link.json").is_symlink() and (tmp_path / "real" / "target.json").read_bytes() == b"{}"
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    read: list[bytes] = []
    reader = threading.Thread(target=lambda: read.append(pipe.read_bytes()))
    reader.start()
    write_output(pipe, b"<html>", "the report")
    reader.join(timeout=10)
    assert pipe.is_fifo() and read == [b"<html>"]
    null = tmp_path / "null"
    try:
        os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        return  # only root makes a device: CI's container does
    write_output(null, b"<testsuites/>", "the file")
    assert null.is_char_device()


def test_a_file_the_machine_refuses_exits_74_and_one_that_cannot_be_there_3(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=f"cannot write the report to {tmp_path}: Is a directory"):
        write_output(tmp_path, b"x", "the report")
    with pytest.raises(EnvironmentFailure, match=r"cannot write the report to /sys/detprof\.html: Permission denied"):
        write_output(Path("/sys/detprof.html"), b"x", "the report")
