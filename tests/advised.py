"""The command lines a report advises, taken out of its words and resolved as a user would run them.

A suggested command resolves when its models are found and its options accepted, and, where the command has
``--dry-run``, its dry run passes: what a user who copies it meets before anything is measured.
"""

from __future__ import annotations

import re
import shlex
from contextlib import chdir
from pathlib import Path

import pytest
import typer

from detprof import cli
from detprof.models import own, registry
from detprof.models.plans import split_models

STAND_IN = "FILE.py:FUNCTION"
"""What a suggestion for a program names in place of a model: the user's own, in the form ``--models`` takes."""
IN_BACKTICKS = re.compile(r"`(detprof [^`]+)`")
MARKDOWN_ESCAPE = re.compile(r"\\(.)")


def advised(markdown: str) -> list[str]:
    """Every command line the Markdown report puts in backticks, its escapes undone, each once."""
    return list(dict.fromkeys(IN_BACKTICKS.findall(MARKDOWN_ESCAPE.sub(r"\1", markdown))))


def filled_in(line: str, model: str) -> str:
    """``line`` with ``model`` where it names the stand-in for a model of the user's own."""
    return line.replace(STAND_IN, model)


def resolve(line: str, cwd: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Fails the test unless ``line`` resolves in ``cwd`` (see the module's docstring)."""
    words = shlex.split(line)[1:]
    with chdir(cwd):
        if "--dry-run" in _options(words[0]):
            code = cli.main([*words, "--dry-run"])
            assert code == 0, f"{line}: exit {code}\n{capsys.readouterr().err[-2000:]}"
            return
        params = _parsed(words)
        for model in split_models(params.get("models") or params.get("model")) or ():
            own.parse(model) if own.is_own(model) else registry.get(model)


def _command(name: str) -> typer.core.TyperCommand:
    group = typer.main.get_command(cli.build_app([name]))
    return group.commands[name]  # type: ignore[attr-defined, no-any-return]


def _options(command: str) -> set[str]:
    return {option for param in _command(command).params for option in param.opts}


def _parsed(words: list[str]) -> dict[str, object]:
    """The command's parameters as its options parse: an option it does not take fails here."""
    return dict(_command(words[0]).make_context(words[0], words[1:]).params)
