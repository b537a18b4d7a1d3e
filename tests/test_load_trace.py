"""``load_trace``: format detection from content, Nsight reports, and every bad-input case."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from fixtures_traces import (
    NVPROF_TRACE_HEADER,
    SHARED_TRACES,
    Kernel,
    nvprof_section,
    write_nsys_sqlite,
)

from detprof.errors import INPUT_EXIT, InputError
from detprof.traces.parsers import load_trace

KERN_SUM_CSV = (
    "Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Name\n"
    '100.0,3000,2,1500.0,1500.0,1000,2000,707.1,"void k<int>(int)"\n'
)
CPU_XPLANE = SHARED_TRACES / "tf-2.21-cpu-smallcnn.xplane.pb"


def _sqlite(path: Path) -> Path:
    kernels = [Kernel("void k<int>(int)", "k", 100, 40), Kernel("void k<int>(int)", "k", 200, 60)]
    return write_nsys_sqlite(path, kernels)


def _nvprof(path: Path) -> Path:
    row = {
        "Start": "1.0",
        "Duration": "0.5",
        "Grid X": "1",
        "Grid Y": "1",
        "Grid Z": "1",
        "Block X": "32",
        "Block Y": "1",
        "Block Z": "1",
        "Device": "TITAN Xp (0)",
        "Stream": "7",
        "Name": "k(int)",
        "Correlation_ID": "5",
    }
    path.write_text(nvprof_section(11, NVPROF_TRACE_HEADER, {"Start": "s", "Duration": "ms"}, [row]))
    return path


def _input_error(path: Path) -> str:
    with pytest.raises(InputError) as info:
        load_trace(path)
    message = str(info.value)
    assert str(path) in message, message
    assert "\n" not in message
    assert info.value.exit_code == INPUT_EXIT
    return message


def _stats_csv(path: Path) -> Path:
    path.write_text(KERN_SUM_CSV)
    return path


@pytest.mark.parametrize(
    ("writer", "misleading_name", "fmt", "kernels"),
    [
        (_sqlite, "kernels.csv", "nsys-sqlite", 2),
        (_stats_csv, "report.sqlite", "nsys-stats-csv", 2),
        (_nvprof, "trace.xplane.pb", "nvprof-trace-csv", 1),
        (_sqlite, "trace.nsys-rep", "nsys-sqlite", 2),
    ],
    ids=["sqlite-as-csv", "stats-csv-as-sqlite", "nvprof-as-pb", "sqlite-as-nsys-rep"],
)
def test_format_comes_from_content_not_name(
    tmp_path: Path, writer: Callable[[Path], Path], misleading_name: str, fmt: str, kernels: int
) -> None:
    path = writer(tmp_path / misleading_name)
    table = load_trace(str(path))
    assert (table.format, table.source, table.kernel_count) == (fmt, str(path), kernels)


@pytest.mark.skipif(not CPU_XPLANE.exists(), reason=f"real trace not present: {CPU_XPLANE}")
def test_protobuf_goes_to_the_xplane_parser_whatever_its_name(tmp_path: Path) -> None:
    path = tmp_path / "profile.sqlite"
    shutil.copy(CPU_XPLANE, path)
    assert load_trace(path).format == "tf-xplane"


def test_missing_path(tmp_path: Path) -> None:
    assert "no such file" in _input_error(tmp_path / "nope.sqlite")


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.csv"
    path.write_bytes(b"")
    assert "empty" in _input_error(path)


def test_whitespace_only_file(tmp_path: Path) -> None:
    path = tmp_path / "blank.csv"
    path.write_text("\n \n\t\n")
    assert "empty" in _input_error(path)


def test_random_bytes(tmp_path: Path) -> None:
    path = tmp_path / "noise.bin"
    path.write_bytes(bytes((i * 131 + 7) % 256 for i in range(4096)))
    assert "not a TensorFlow profiler trace" in _input_error(path)


def test_plain_text(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("These are my notes about the training run.\nNothing to parse here.\n")
    assert "unrecognized" in _input_error(path)


def test_directory_without_profile(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "events.txt").write_text("not a profile")
    assert "no TensorFlow profile" in _input_error(tmp_path / "logs")


def _binary_report(path: Path) -> Path:
    path.write_bytes(b"\x00\x01NSYS-REPORT\x00" + bytes(range(256)) * 8)
    return path


def test_nsys_report_without_nsys_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    monkeypatch.setenv("PATH", str(empty_bin))
    for suffix in (".nsys-rep", ".qdrep"):
        message = _input_error(_binary_report(tmp_path / f"run{suffix}"))
        assert "install Nsight Systems" in message and "nsys export --type sqlite" in message


def _fake_nsys(bin_dir: Path, exported: Path | None, log: Path) -> None:
    """Stands in for the nsys binary (a GPU-machine tool): logs its argv, 'exports' a prepared file."""
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "nsys"
    body = [
        f"#!{sys.executable}",
        "import json, shutil, sys",
        f"open({str(log)!r}, 'w').write(json.dumps(sys.argv[1:]))",
    ]
    if exported is None:
        body += ["sys.stderr.write('Processing...\\nError: report file is corrupt\\n')", "sys.exit(1)"]
    else:
        body += [f"shutil.copy({str(exported)!r}, sys.argv[sys.argv.index('--output') + 1])"]
    script.write_text("\n".join(body) + "\n")
    script.chmod(0o755)


def test_nsys_report_is_exported_with_nsys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "argv.json"
    _fake_nsys(tmp_path / "bin", _sqlite(tmp_path / "prepared.sqlite"), log)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    report = _binary_report(tmp_path / "run.nsys-rep")

    table = load_trace(report)
    assert table.format == "nsys-sqlite" and table.source == str(report)
    assert table.kernel_count == 2 and table.total_ns == 100
    argv = json.loads(log.read_text())
    assert argv[:4] == ["export", "--type", "sqlite", "--output"] and argv[-1] == str(report)
    assert not Path(argv[4]).exists()


def test_failing_nsys_export_is_an_input_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_nsys(tmp_path / "bin", None, tmp_path / "argv.json")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    message = _input_error(_binary_report(tmp_path / "run.qdrep"))
    assert "nsys export" in message and "report file is corrupt" in message


def test_sqlite_and_csv_traces_do_not_import_tensorflow(tmp_path: Path) -> None:
    sqlite_path = _sqlite(tmp_path / "a.sqlite")
    csv_path = tmp_path / "b.csv"
    csv_path.write_text(KERN_SUM_CSV)
    code = (
        "import sys\n"
        "from detprof.traces.parsers import load_trace\n"
        f"load_trace({str(sqlite_path)!r}); load_trace({str(csv_path)!r})\n"
        "print('tensorflow' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    assert done.stdout.strip() == "False"
