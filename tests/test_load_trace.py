"""``load_trace``: format detection from content, Nsight reports, and every bad-input case."""

from __future__ import annotations

import json
import random
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from fixtures_kineto import simple_gpu_trace
from fixtures_traces import (
    NVPROF_TRACE_HEADER,
    SHARED_TRACES,
    Kernel,
    nvprof_section,
    real_traces,
    write_nsys_sqlite,
)
from script_runner import SCRIPTS, run_script

from detprof.errors import ExitCode, InputError
from detprof.traces.parsers import KNOWN_FORMATS, load_trace

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
    assert info.value.exit_code == ExitCode.INPUT
    return message


def _stats_csv(path: Path) -> Path:
    path.write_text(KERN_SUM_CSV)
    return path


def _kineto_json(path: Path) -> Path:
    return simple_gpu_trace(path)


def _kineto_gzip(path: Path) -> Path:
    return simple_gpu_trace(path, compress=True)


@pytest.mark.parametrize(
    ("writer", "misleading_name", "fmt", "kernels"),
    [
        (_sqlite, "kernels.csv", "nsys-sqlite", 2),
        (_stats_csv, "report.sqlite", "nsys-stats-csv", 2),
        (_nvprof, "trace.xplane.pb", "nvprof-trace-csv", 1),
        (_sqlite, "trace.nsys-rep", "nsys-sqlite", 2),
        (_kineto_json, "kernels.csv", "kineto-json", 2),
        (_kineto_gzip, "report.sqlite", "kineto-json", 2),
        (_kineto_gzip, "trace.pt.trace.json", "kineto-json", 2),
    ],
    ids=[
        "sqlite-as-csv",
        "stats-csv-as-sqlite",
        "nvprof-as-pb",
        "sqlite-as-nsys-rep",
        "kineto-json-as-csv",
        "kineto-gzip-as-sqlite",
        "kineto-gzip-without-gz",
    ],
)
def test_format_comes_from_content_not_name(
    tmp_path: Path, writer: Callable[[Path], Path], misleading_name: str, fmt: str, kernels: int
) -> None:
    path = writer(tmp_path / misleading_name)
    table = load_trace(str(path))
    assert (table.format, table.source, table.kernel_count) == (fmt, str(path), kernels)


@real_traces(CPU_XPLANE)
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


NOT_A_TRACE = f": not a trace detprof reads ({KNOWN_FORMATS}); "


def _not_a_trace(path: Path) -> str:
    """The one wording for a file in no known format; returns what it says the file looked like."""
    message = _input_error(path)
    assert message.startswith(f"{path}{NOT_A_TRACE}"), message
    assert "TensorFlow profiler trace" not in message
    return message.removeprefix(f"{path}{NOT_A_TRACE}")


def test_random_bytes(tmp_path: Path) -> None:
    path = tmp_path / "noise.bin"
    path.write_bytes(bytes((i * 131 + 7) % 256 for i in range(4096)))
    assert _not_a_trace(path) == "binary, but neither SQLite nor a TensorFlow XSpace protobuf"


@pytest.mark.parametrize("seed", range(10))
def test_random_bytes_of_any_length_and_name(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    path = tmp_path / rng.choice(["trace.bin", "profile.sqlite", "run.xplane.pb", "kernels.csv"])
    path.write_bytes(b"\x00" + rng.randbytes(rng.randint(1, 3000)))
    assert _not_a_trace(path).startswith("binary")


def test_protobuf_that_is_not_an_xspace(tmp_path: Path) -> None:
    from google.protobuf import descriptor_pb2

    path = tmp_path / "model.pb"
    message = descriptor_pb2.FileDescriptorProto(name="model.proto", package="somewhere.else", dependency=["a.proto"])
    path.write_bytes(message.SerializeToString())
    assert _not_a_trace(path).startswith("binary")


def test_an_xspace_without_kernels_keeps_its_own_message(tmp_path: Path) -> None:
    """A real TensorFlow profile that holds nothing is not "a file in no known format"."""
    from detprof.traces.parsers.xspace_schema import xspace_class

    space = xspace_class()()
    space.planes.add(name="/host:CPU").lines.add(name="python")
    path = tmp_path / "eager.xplane.pb"
    path.write_bytes(space.SerializeToString())
    message = _input_error(path)
    assert "holds no GPU kernels" in message and "not a trace detprof reads" not in message


def test_plain_text(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("These are my notes about the training run.\nNothing to parse here.\n")
    assert _not_a_trace(path) == (
        "text, but without an nsys stats kernel summary (cuda_gpu_kern_sum) or an nvprof CSV header"
    )


def test_csv_of_another_kind(tmp_path: Path) -> None:
    path = tmp_path / "losses.csv"
    path.write_text("epoch,loss,accuracy\n1,2.30,0.11\n2,1.95,0.34\n")
    assert _not_a_trace(path).startswith("text")


@pytest.mark.parametrize("content", [b"\x00\x01\x02garbage" * 100, b"just some words\n"], ids=["binary", "text"])
def test_parse_cli_says_it_in_one_line_with_exit_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes
) -> None:
    from detprof.cli import main

    path = tmp_path / "somefile"
    path.write_bytes(content)
    assert main(["parse", str(path)]) == ExitCode.INPUT
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"detprof: error: {path}{NOT_A_TRACE}")
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err


def test_directory_without_profile(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "events.txt").write_text("not a profile")
    message = _input_error(tmp_path / "logs")
    assert "no TensorFlow profile" in message and "no PyTorch profiler trace" in message


def test_a_folder_of_pytorch_profiler_traces(tmp_path: Path) -> None:
    trace = simple_gpu_trace(tmp_path / "worker0.1700000000000.pt.trace.json.gz", compress=True)
    table = load_trace(tmp_path)
    assert (table.format, table.source, table.kernel_count) == ("kineto-json", str(trace), 2)


def test_a_folder_with_an_xspace_stays_a_tensorflow_profile(tmp_path: Path) -> None:
    """TensorFlow's log folders keep their meaning even with a PyTorch trace beside the XSpace."""
    from detprof.traces.parsers.xspace_schema import xspace_class

    space = xspace_class()()
    space.planes.add(name="/host:CPU").lines.add(name="python")
    (tmp_path / "host.xplane.pb").write_bytes(space.SerializeToString())
    simple_gpu_trace(tmp_path / "worker0.pt.trace.json")
    assert "holds no GPU kernels" in _input_error(tmp_path)


def test_known_formats_name_pytorch_profiler_json() -> None:
    assert "PyTorch profiler JSON" in KNOWN_FORMATS


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


def _fake_nsys(monkeypatch: pytest.MonkeyPatch, bin_dir: Path, exported: Path | None, log: Path) -> None:
    """Stands in for the nsys binary (a GPU-machine tool): logs its argv, 'exports' a prepared file.

    The stand-in is ``tests/scripts/fake_nsys.py`` behind a ``#!`` line naming this Python;
    what it logs to and exports travel in its environment.
    """
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "nsys"
    script.write_text(f"#!{sys.executable}\n" + (SCRIPTS / "fake_nsys.py").read_text())
    script.chmod(0o755)
    monkeypatch.setenv("FAKE_NSYS_LOG", str(log))
    if exported is None:
        monkeypatch.delenv("FAKE_NSYS_EXPORT", raising=False)
    else:
        monkeypatch.setenv("FAKE_NSYS_EXPORT", str(exported))


def test_nsys_report_is_exported_with_nsys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "argv.json"
    _fake_nsys(monkeypatch, tmp_path / "bin", _sqlite(tmp_path / "prepared.sqlite"), log)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    report = _binary_report(tmp_path / "run.nsys-rep")

    table = load_trace(report)
    assert table.format == "nsys-sqlite" and table.source == str(report)
    assert table.kernel_count == 2 and table.total_ns == 100
    argv = json.loads(log.read_text())
    assert argv[:4] == ["export", "--type", "sqlite", "--output"] and argv[-1] == str(report)
    assert not Path(argv[4]).exists()


def test_failing_nsys_export_is_an_input_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_nsys(monkeypatch, tmp_path / "bin", None, tmp_path / "argv.json")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    message = _input_error(_binary_report(tmp_path / "run.qdrep"))
    assert "nsys export" in message and "report file is corrupt" in message


def test_sqlite_and_csv_traces_do_not_import_tensorflow(tmp_path: Path) -> None:
    sqlite_path = _sqlite(tmp_path / "a.sqlite")
    csv_path = tmp_path / "b.csv"
    csv_path.write_text(KERN_SUM_CSV)
    done = run_script("without_tensorflow.py", "load_trace", sqlite_path, csv_path)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(report["result"]) == 2
    assert report["tensorflow_modules"] == []
