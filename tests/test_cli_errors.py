"""How ``detprof`` fails: a bug, an interruption and a malformed results file each read differently."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import synthetic_sweep as synth
import typer

from detprof import cli
from detprof.errors import ExitCode, InputError, UsageError
from detprof.reports import command as report_command

Capture = pytest.CaptureFixture[str]


def run_cli(capsys: Capture, *args: str | Path) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_bug_exits_70_never_1_the_regression_code(
    tmp_path: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_args: object, **_kwargs: object) -> str:
        raise AttributeError("'list' object has no attribute 'get'")

    monkeypatch.delenv("DETPROF_DEBUG", raising=False)
    monkeypatch.setattr(report_command, "render_report", broken)
    code, _, err = run_cli(capsys, "report", tmp_path)
    assert code == ExitCode.INTERNAL
    assert err == "detprof: internal error: AttributeError: 'list' object has no attribute 'get' " + (
        "(DETPROF_DEBUG=1 shows the traceback)\n"
    )


@pytest.mark.parametrize(("raised", "line"), [(KeyboardInterrupt, ""), (typer.Abort, "detprof: interrupted\n")])
def test_an_interruption_claims_nothing_about_results(
    tmp_path: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch, raised: type[BaseException], line: str
) -> None:
    """Typer turns Ctrl-C into exit 130 itself; an abort gets a neutral line, since ``report`` keeps no runs."""

    def interrupted(*_args: object, **_kwargs: object) -> str:
        raise raised

    monkeypatch.setattr(report_command, "render_report", interrupted)
    code, _, err = run_cli(capsys, "report", tmp_path)
    assert (code, err) == (130, line)


@pytest.mark.parametrize(
    ("file", "content"),
    [
        ("manifest.json", []),
        ("manifest.json", {"kind": "sweep", "config": ["resnet50"]}),
        ("runs/resnet50--default--r0.json", ["not", "a", "record"]),
    ],
)
@pytest.mark.parametrize("command", ["report", "baseline"])
def test_results_json_that_is_not_an_object_is_one_line_exit_3(
    tmp_path: Path, capsys: Capture, command: str, file: str, content: object
) -> None:
    results = synth.write_sweep(tmp_path / "res", synth.config(["resnet50"], 3), synth.records({"resnet50": [1.2] * 3}))
    broken = results / "sweep" / file
    broken.write_text(json.dumps(content))
    args = [command, results, "-o", tmp_path / ("r.html" if command == "report" else "b.json")]
    code, _, err = run_cli(capsys, *args)
    assert code == ExitCode.INPUT
    assert err.count("\n") == 1 and str(broken) in err and "not a detprof" in err


def test_exit_codes_are_one_enum_as_the_docs_document_them() -> None:
    """0 done, 1 a check's no, 2 usage, 3 input, 70 a bug, 74 the machine refused, 130 Ctrl-C, 143 SIGTERM: the
    values CI scripts rely on."""
    codes = {code.name: int(code) for code in ExitCode}
    assert codes == {
        **{"OK": 0, "CHECK_FAILED": 1, "USAGE": 2, "INPUT": 3, "INTERNAL": 70, "ENVIRONMENT": 74},
        **{"INTERRUPTED": 130, "TERMINATED": 143},
    }
    assert (UsageError.exit_code, InputError.exit_code) == (ExitCode.USAGE, ExitCode.INPUT)
    page = (Path(__file__).parents[1] / "docs" / "reference" / "exit-codes.md").read_text()
    documented = page[page.index("Exit codes, the same for every command:") :].split("\n\n")[0]
    assert [int(n) for n in re.findall(r"[:;]\s+(\d+) ", documented)] == list(codes.values())


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("report", "results", "-o", ""), "'-o' / '--output'"),
        (("sweep", "--dry-run", "--out="), "'--out'"),
        (("parse", ""), "'trace'"),
    ],
)
def test_an_empty_path_is_refused_not_read_as_the_current_folder(
    tmp_path: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...], named: str
) -> None:
    """``Path("")`` is ``.``: an unset shell variable would write a report or a study into the current folder."""
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, *args)
    assert (code, out) == (ExitCode.USAGE, "")
    refusal = "is empty: name a file or folder (a shell variable that was not set?)"
    assert err == f"detprof: error: Invalid value for {named}: {refusal}\n"
    assert list(tmp_path.iterdir()) == []
