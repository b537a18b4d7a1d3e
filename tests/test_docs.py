"""The documentation site: it builds with every warning an error, and what it names exists.

A page that names an option detprof does not have, a broken link between pages or a page left out
of the table of contents fails here, as a failing test, rather than in front of a reader. The
reference's options and the results' figures are made at build time from the CLI and from data
(``docs/_ext/detprof_docs.py``), so only the hand-written pages need their names checked.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

import pytest
import synthetic_sweep as synth

from detprof import cli
from detprof.reports.command import render_report

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
CODE = re.compile(r"```[^\n]*\n(.*?)```|`([^`\n]+)`", re.DOTALL)
DETPROF_CALL = re.compile(r"\bdetprof(?:\s+--?\w[\w-]*)*\s+([a-z][a-z-]*)((?:\s+[^\s|;&]+)*)")
OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
QUOTED = re.compile(r"\"[^\"]*\"|'[^']*'")


@cache
def options_of(command: str) -> frozenset[str]:
    """Every option ``detprof COMMAND`` takes, as its ``--help`` lists them."""
    import typer

    group = typer.main.get_command(cli.build_app([command]))
    params = group.commands[command].params  # type: ignore[attr-defined]
    return frozenset(o for p in params for o in (*p.opts, *p.secondary_opts)) | {"--help"}


def named_calls(text: str) -> list[tuple[str, list[str]]]:
    """Each ``detprof COMMAND --option ...`` in the page's code (blocks and inline), with the options it names."""
    calls = []
    for block, inline in CODE.findall(text):
        for line in (block or inline).splitlines():
            # A shell comment names no option of detprof's, nor a quoted argument (--command "train.py --epochs 1").
            for command, rest in DETPROF_CALL.findall(QUOTED.sub('""', line.split(" #")[0])):
                calls.append((command, OPTION.findall(rest)))
    return calls


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::PendingDeprecationWarning")
def test_the_site_builds_with_every_warning_an_error(tmp_path: Path) -> None:
    from sphinx.cmd.build import build_main

    code = build_main(["-W", "--keep-going", "-q", "-b", "html", str(DOCS), str(tmp_path / "html")])
    assert code == 0
    commands = (tmp_path / "html" / "reference" / "commands.html").read_text()
    for name in cli.command_names():
        assert f"Usage: detprof {name} [OPTIONS]" in commands
    results = (tmp_path / "html" / "results.html").read_text()
    assert "NVIDIA H100 80GB HBM3, 2026-11-27" in results and "reference/h100-2026-11-27" in results


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_every_command_and_option_a_page_names_exists(page: Path) -> None:
    commands = set(cli.command_names())
    for command, options in named_calls(page.read_text()):
        if command not in commands:
            continue  # "detprof report" in prose: only a command detprof has is held to its options
        unknown = [option for option in options if option not in options_of(command)]
        assert not unknown, f"{page.name}: detprof {command} has no {', '.join(unknown)}"


def test_the_option_check_catches_an_option_a_command_lacks() -> None:
    page = "Run `detprof sweep --models smallcnn --no-such-thing` or\n```sh\ndetprof report o -o r.html  # --nope\n```"
    calls = named_calls(page + '\n`detprof sweep --command "train.py --epochs 1" --name x`')
    assert calls == [("sweep", ["--models", "--no-such-thing"]), ("report", []), ("sweep", ["--command", "--name"])]
    assert "--no-such-thing" not in options_of("sweep") and "--models" in options_of("sweep")


def test_the_json_reports_page_lists_exactly_the_documents_keys(tmp_path: Path) -> None:
    records = synth.records({"smallcnn": [1.01, 1.02, 1.0]}, device={"label": "cpu", "name": "cpu", "cpu_count": 2})
    results = synth.write_sweep(tmp_path / "res", synth.config(["smallcnn"], 3, gpu_label="cpu"), records)
    document = json.loads(render_report([results], "json"))
    page = (DOCS / "reference" / "json-report.md").read_text()
    listed = page[page.index("## Top-level keys") :].split("\n## ")[0]
    assert re.findall(r"^- `([a-z_]+)`", listed, re.MULTILINE) == list(document)


def test_the_readme_is_a_few_screens_that_lead_to_the_site() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 200
    for page in ("getting-started.md", "overhead.md", "attribution.md", "reference/commands.md", "results.md"):
        assert f"docs/{page}" in readme
        assert (DOCS / page).exists()
