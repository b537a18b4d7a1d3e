"""The HTML and the Markdown report word every cell they share alike (``reports/cells.py``).

One report of synthetic results with every kind of headline cell (cheap, expensive, not
settled; a stability study that learned, one that did not, none; a calibration that lacks a
model; two Keras backends on one device, so a backend column and a side-by-side table) is
rendered in both formats. Each table of the Markdown is held against the HTML table that has
its columns, cell by cell under the same header; the HTML's note under a cell reads as the
Markdown writes it on one line (``Words.line``).
"""

from __future__ import annotations

import html
import re

import pytest
from test_report_backends import sweep_of
from test_report_headline import CHEAP, CROSSING, EXPENSIVE, calibration, stability, sweep

from detprof.reports.cells import Words
from detprof.reports.command import render_report

Table = tuple[list[str], list[list[str]]]
HtmlTable = tuple[list[str], list[list[tuple[str, str]]]]
ANSWER_COLUMNS = {
    "Costs: kernel time (det / default, 95% CI)": "Kernel time",
    "Costs: wall time": "Wall time",
    "Verdict": "Verdict",
    "Buys: churn under impl": "Churn under impl",
    "Buys: accuracy std drop": "Accuracy std drop",
    "Noise floor": "Noise floor",
    "What to do": "What to do",
    "Backend": "Backend",
}
"""The first screen's headers -> the Markdown answer's; its "Model on device" is Model, with Device as its note."""


CODE_CELL = re.compile(r"\s*<code>(?:(?!</?code>).)*</code>\s*", re.S)


def _text(markup: str) -> str:
    """A cell's words as the Markdown writes them: a code span among words is a command in backticks there; a cell
    that is code alone (a model's name) reads bare."""
    if not CODE_CELL.fullmatch(markup):
        markup = re.sub(r"<code>(.*?)</code>", r"`\1`", markup)
    return html.unescape(re.sub(r"<[^>]+>", "", markup)).strip()


def _html_cell(markup: str) -> tuple[str, str]:
    value, _, note = markup.partition("<br><small>")
    return _text(value), _text(note)


def html_tables(page: str) -> list[HtmlTable]:
    """Every table: its headers, and each cell as (text, note)."""
    tables = []
    for head, body in re.findall(r"<table[^>]*><thead><tr>(.*?)</tr></thead><tbody>(.*?)</tbody></table>", page, re.S):
        headers = [_text(h) for h in re.findall(r"<th>(.*?)</th>", head, re.S)]
        rows = [[_html_cell(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)] for row in body.split("<tr>")]
        tables.append((headers, [row for row in rows if row]))
    return tables


def _md_cells(line: str) -> list[str]:
    cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
    return [re.sub(r"\\(.)", r"\1", c.strip()).replace("**", "") for c in cells]


def md_tables(text: str) -> list[Table]:
    """Every table: its headers, and each cell as the reader sees it (escapes and bold undone)."""
    tables: list[Table] = []
    for block in re.findall(r"((?:^\|.*\n)+)", text, re.M):
        lines = block.splitlines()
        tables.append((_md_cells(lines[0]), [_md_cells(line) for line in lines[2:]]))
    return tables


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("cells")
    tf = sweep(root / "tf", {"resnet50": CHEAP, "vgg16": EXPENSIVE, "mediumcnn_k1": CROSSING})
    stability(tf, "resnet50", "t4", accuracy=0.9, churn_impl=0.05)
    stability(tf, "mediumcnn_k1", "t4", accuracy=0.1, churn_impl=0.05)
    calibration(tf / "calibration", {"resnet50": [1.01, 0.99, 1.0]})
    torch = sweep_of(root / "torch", "torch")
    paths = [tf, torch]
    return render_report(paths, "html", "cdn"), render_report(paths, "md")


def test_the_answer_says_the_same_in_html_and_markdown(rendered: tuple[str, str]) -> None:
    page, text = rendered
    headers, rows = html_tables(page)[0]
    md_headers, md_rows = md_tables(text)[0]
    assert len(rows) == len(md_rows) == 5
    for row, md_row in zip(rows, md_rows, strict=True):
        shown = dict(zip(md_headers, md_row, strict=True))
        model, device = row[0]
        assert (model, device) == (shown["Model"], shown["Device"])
        for header, (value, note) in zip(headers[1:], row[1:], strict=True):
            assert Words(value, note).line == shown[ANSWER_COLUMNS[header]], header
    words = {cell for md_row in md_rows for cell in md_row}
    assert {"no stability study", "did not learn (left out)", "not in the calibration", "not run"} <= words


def _counterpart(md_table: Table, tables: list[HtmlTable]) -> tuple[HtmlTable, list[str]] | None:
    """The first HTML table with the Markdown table's first column, rows and two or more of its other columns."""
    md_headers, md_rows = md_table
    for headers, rows in tables:
        shared = [h for h in md_headers if h in headers]
        if headers[0] == md_headers[0] and len(shared) >= 2 and len(rows) == len(md_rows):
            return (headers, rows), shared
    return None


def test_every_markdown_table_says_what_the_html_says_under_the_same_header(rendered: tuple[str, str]) -> None:
    page, text = rendered
    unmatched = html_tables(page)[1:]
    compared = []
    for md_headers, md_rows in md_tables(text)[1:]:
        found = _counterpart((md_headers, md_rows), unmatched)
        if found is None:
            continue
        (headers, rows), shared = found
        unmatched.remove((headers, rows))
        for row, md_row in zip(rows, md_rows, strict=True):
            cells = dict(zip(headers, row, strict=True))
            shown = dict(zip(md_headers, md_row, strict=True))
            assert [Words(*cells[h]).line for h in shared] == [shown[h] for h in shared]
        compared += shared
    expected = {"Accuracy std +/- s.e.", "Reading", "Smallest resolvable overhead", "Repeats", "Published"}
    assert expected <= set(compared)
    assert any(h.startswith("torch (") for h in compared), "the backends side by side"
