"""``--help`` reads like any command line's, and ``--version`` answers, through the real entry point."""

from __future__ import annotations

import importlib.metadata
import json
import re

import pytest
from script_runner import run_script

import detprof
from detprof.cli import main

COMMANDS = ["parse", "diff", "models", "gpus", "sweep", "kernels", "stability", "verify", "report", "baseline"]
COMMANDS += ["check", "doctor"]
# Typer's labels for values: <bool>, <int>, <str>, <path>, <float>, <int range>, <list[Path]>, <table|json|csv>.
TYPE_LABEL = re.compile(
    r"<(?:bool|int|str|float|path|file|text|int range|float range|list\[[^>]*\]|[\w.-]+(?:\|[\w.-]+)+)>"
)


def help_of(capsys: pytest.CaptureFixture[str], *command: str) -> str:
    code = main([*command, "--help"])
    out, err = capsys.readouterr()
    assert (code, err) == (0, ""), command
    return out


@pytest.mark.parametrize("command", [[], *([c] for c in COMMANDS)], ids=["detprof", *COMMANDS])
def test_help_names_values_the_way_a_command_line_does(capsys, command: list[str]) -> None:
    out = help_of(capsys, *command)
    assert out.startswith(f"Usage: detprof {' '.join(command)}".rstrip() + " [OPTIONS]")
    assert TYPE_LABEL.search(out) is None, TYPE_LABEL.search(out)
    assert "{" not in out.splitlines()[0]  # no braces around required arguments
    flag_lines = [line for line in out.splitlines() if line.strip().startswith("--help")]
    assert flag_lines and all(line.split()[:2] == ["--help", "Show"] for line in flag_lines)


def test_help_of_options_arguments_and_flags(capsys) -> None:
    parse = help_of(capsys, "parse")
    assert "Usage: detprof parse [OPTIONS] TRACE\n" in parse
    assert re.search(r"^  --top INTEGER +How many kernels", parse, re.M)
    assert re.search(r"^  --format \[table\|json\|csv\] ", parse, re.M)
    assert re.search(r"^  --full-names +Table: ", parse, re.M)
    report = help_of(capsys, "report")
    assert "Usage: detprof report [OPTIONS] RESULTS_DIRS...\n" in report
    assert re.search(r"^  -o, --output PATH ", report, re.M)
    sweep = help_of(capsys, "sweep")  # options declared through options.with_run_options
    for line in ("--gpu TEXT", "--steps INTEGER", "--run-timeout FLOAT", "--out PATH", "--xla / --no-xla"):
        assert re.search(rf"^  {re.escape(line)} ", sweep, re.M), line
    assert re.search(r"^  --version +Print detprof's version", help_of(capsys), re.M)


def test_diff_help_documents_traces_without_a_common_kernel(capsys) -> None:
    out = " ".join(help_of(capsys, "diff").split())
    assert "Two traces that share no kernel are a result, not an error (exit 0)" in out
    assert "--by TEXT" in out and "--full-names" in out


def test_version(capsys) -> None:
    assert main(["--version"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out == f"detprof {importlib.metadata.version('detprof')}\n"
    assert detprof.__version__ == importlib.metadata.version("detprof")


@pytest.mark.parametrize("args", [["--help"], ["--version"], [], ["swep"]], ids=["help", "version", "bare", "typo"])
def test_detprof_itself_imports_no_command(args: list[str]) -> None:
    """``detprof --help`` lists every command from the table in ``cli``: start-up is all that these command lines
    cost, and each command module brings its own imports (pandas, the sweep's driver)."""
    done = run_script("without_tensorflow.py", "cli", *args)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["result"] == (2 if args == ["swep"] else 0), done.stderr
    commands = [m for m in report["modules"] if m.endswith("command") and m.startswith("detprof.")]
    assert commands == []
    assert not {"pandas", "numpy", "rich"} & set(report["modules"])


def test_every_command_that_takes_models_takes_either_spelling(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("sweep", "verify", "check"):
        assert "--models, --model" in help_of(capsys, command), command
    assert "--model, --models" in help_of(capsys, "stability")
    assert main(["sweep", "--model", "smallcnn", "--gpu", "cpu", "--repeats", "2", "--dry-run"]) == 0
    assert "smallcnn--deterministic--r0" in capsys.readouterr().out
