"""The report of real CPU results, opened in a real headless Chromium.

The module reads the run's real TensorFlow studies (``shared_studies``: a tiny sweep of two
models with the tf tracer, a small stability study of one of them on the same device label,
learning, and a kernels bench), so every section has real data, and in its own copy renames
one real kernel in the sweep's tables to a name full of ``<``, ``>`` and ``&`` (with markup
that would run if it were not escaped). The browser is Debian's ``chromium`` (``make test``
installs it), driven by playwright through ``executable_path``: no browser is downloaded.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from shared_studies import Study

from detprof.cli import main
from detprof.reports.command import render_report
from detprof.store import ResultsStore
from detprof.traces.classify import classify

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
HOSTILE = 'void tensorflow::LaunchConv2DBackpropFilterOp<float>&::operator()<img src=x onerror="window.__xss=1">'
ALL_PLOTS_DRAWN = (
    "() => { const d = document.querySelectorAll('.plotly-graph-div');"
    " return d.length > 0 && Array.from(d).every(e => e.querySelector('svg.main-svg')); }"
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed (make test installs it)"),
]


def rename_top_kernel(results: Path, model: str) -> None:
    """Give the model's biggest kernel a hostile name in every run of both modes, and every kernel of the hostile
    name's kind too: the report's hover names each kind's largest kernel per mode, which would otherwise depend
    on which of them came out larger in this run's timings."""
    store = ResultsStore(results, "sweep")
    records = [r for r in store.records() if r["model"] == model and r.get("kernel_table")]
    first = store.read_table(records[0]["kernel_table"])
    top = first.groupby("name", observed=True)["dur_ns"].sum().idxmax()
    kind = classify(HOSTILE)
    for rec in records:
        path = store.dir / rec["kernel_table"]
        frame = pd.read_parquet(path)
        names = frame["name"].astype("string")
        hostile = (names == top) | (names.map(classify) == kind)
        for col in ("name", "short_name"):
            frame[col] = frame[col].astype("string").mask(hostile, HOSTILE)
        frame.to_parquet(path, index=False)


@pytest.fixture(scope="module")
def results(tensorflow_study: Study, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tensorflow_study.copy(tmp_path_factory.mktemp("report") / "res")
    rename_top_kernel(out, "smallcnn")
    return out


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def open_report(browser: Any, path: Path, viewport: tuple[int, int] = (1280, 900)) -> tuple[Any, list[str], list[str]]:
    """The page with every plot drawn; console errors and requests that left the file."""
    page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
    errors: list[str] = []
    outside: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))

    def route(r: Any) -> None:
        if r.request.url.startswith(("file:", "data:")):
            r.continue_()
        else:
            outside.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.goto(path.resolve().as_uri())
    page.wait_for_function(ALL_PLOTS_DRAWN, timeout=30_000)
    return page, errors, outside


@pytest.fixture(scope="module")
def report(results: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("html") / "report.html"
    assert main(["report", str(results), "-o", str(target)]) == 0
    return target


def test_every_section_renders_without_errors_or_requests(browser: Any, report: Path) -> None:
    page, errors, outside = open_report(browser, report)
    assert errors == []
    assert outside == []
    plots = page.eval_on_selector_all(".plotly-graph-div", "ds => ds.map(d => !!d.querySelector('svg.main-svg'))")
    assert len(plots) >= 5 and all(plots)
    sections = (
        *("answer", "overhead", "on-gpus", "kernel-size", "cost", "stability", "tradeoff", "conditions"),
        "provenance",
    )
    for section in sections:
        assert page.locator(f"#{section}").count() == 1
    order = page.eval_on_selector_all("body > section", "ss => ss.map(s => s.id)")
    assert order == list(sections)
    for section in ("answer", "provenance", "overhead", "on-gpus", "kernel-size", "cost", "stability", "tradeoff"):
        assert page.locator(f"#{section} table").count() >= 1, section
    empty = page.eval_on_selector_all("h1, h2, h3, h4", "hs => hs.filter(h => !h.textContent.trim()).length")
    assert empty == 0
    overhead_models = page.eval_on_selector_all(
        "#overhead table tbody tr td:first-child", "c => c.map(e => e.textContent)"
    )
    assert {"smallcnn", "mediumcnn_k3"} <= set(overhead_models)
    assert page.locator("#stability .badge.verified").count() == 1
    ops = page.eval_on_selector_all("#kernel-size table tbody tr td:first-child", "c => c.map(e => e.textContent)")
    assert "conv2d_backward_filter" in ops
    sources = page.eval_on_selector_all("#kernel-size table tbody tr td:nth-child(2)", "c => c.map(e => e.textContent)")
    assert {"sweep", "kernels_bench"} <= set(sources)
    tradeoff = page.locator("#tradeoff tbody tr").first.inner_text()
    assert "smallcnn" in tradeoff and "cpu" in tradeoff
    legend = page.eval_on_selector_all("#tradeoff .legendtext", "ts => ts.map(t => t.textContent)")
    assert legend == ["smallcnn on cpu"]
    assert page.locator("#tradeoff .scatterlayer text").count() == 0
    page.close()


def test_kernel_names_show_literally_and_never_run(browser: Any, report: Path) -> None:
    page, errors, _ = open_report(browser, report)
    names = page.eval_on_selector_all("#cost code", "cs => cs.map(c => c.textContent)")
    assert HOSTILE in names
    assert page.evaluate("window.__xss") is None
    assert page.locator("img").count() == 0
    hover = page.evaluate(
        "() => Array.from(document.querySelectorAll('#cost .plotly-graph-div'))"
        ".flatMap(d => d.data.flatMap(t => t.hovertext || []))"
    )
    assert any("&lt;float&gt;&amp;" in h for h in hover)
    assert errors == []
    page.close()


def test_sweep_without_stability_leaves_those_sections_out(
    browser: Any, results: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    only = tmp_path_factory.mktemp("only") / "res"
    shutil.copytree(results / "sweep", only / "sweep")
    target = only / "report.html"
    assert main(["report", str(only), "-o", str(target)]) == 0
    page, errors, outside = open_report(browser, target)
    assert errors == [] and outside == []
    assert page.locator("#stability p.absent").inner_text().startswith("No stability study among the inputs")
    assert page.locator("#stability .plotly-graph-div").count() == 0
    assert page.locator("#tradeoff .plotly-graph-div").count() == 0
    assert page.locator("#conditions p.absent").first.inner_text().startswith("No GPU telemetry")
    page.close()


def test_markdown_of_real_results(results: Path, tmp_path: Path) -> None:
    target = tmp_path / "comment.md"
    assert main(["report", str(results), "--format", "md", "-o", str(target)]) == 0
    text = target.read_text()
    assert "### smallcnn on digits, cpu" in text
    assert "| smallcnn | cpu |" in text
    assert "- **smallcnn** on cpu: " in text


def test_first_screen_answers_for_every_model(browser: Any, report: Path, tmp_path: Path) -> None:
    """At 1440x900 the headline table starts on the first screen and holds a row (and a verdict) per model."""
    page, errors, _ = open_report(browser, report, viewport=(1440, 900))
    assert errors == []
    headline = page.locator("#answer table.answer")
    box = headline.bounding_box()
    assert box is not None and box["y"] < 900
    models = page.eval_on_selector_all(
        "#answer table.answer tbody tr td:first-child code", "c => c.map(e => e.textContent)"
    )
    assert set(models) == {"smallcnn", "mediumcnn_k3"}
    for row in page.locator("#answer table.answer tbody tr").all():
        row_box = row.bounding_box()
        assert row_box is not None and row_box["y"] + row_box["height"] < 900
        verdict = row.locator(".verdict").inner_text()
        assert verdict in ("cheap", "expensive") or verdict.startswith("not settled")
    first_screen = page.evaluate(
        "() => Array.from(document.querySelectorAll('#answer p, #answer th'))"
        ".filter(e => e.getBoundingClientRect().top < 900).map(e => e.textContent).join(' ')"
    )
    assert "CPU op time does not predict what determinism costs on a GPU" in first_screen
    assert "Published GPU reference" in first_screen
    assert page.locator("#provenance").bounding_box()["y"] > page.locator("#conditions").bounding_box()["y"]
    page.screenshot(path=str(tmp_path / "first-screen.png"))
    page.close()


def test_first_screen_shows_each_models_backends_side_by_side(browser: Any, tmp_path: Path) -> None:
    """Three Keras backends on one GPU at 1440x900: each model's backends in adjacent rows, every row with its
    backend and verdict on the first screen, and the table within the page's width."""
    from test_report_backends import BACKENDS, sweep_of

    dirs = [sweep_of(tmp_path / b, b, old=b == "tensorflow") for b in ("torch", "tensorflow", "jax")]
    target = tmp_path / "report.html"
    assert main(["report", *map(str, dirs), "-o", str(target)]) == 0
    page, errors, outside = open_report(browser, target, viewport=(1440, 900))
    assert errors == [] and outside == []
    rows = page.locator("#answer table.answer tbody tr").all()
    shown = [tuple(row.locator("td:nth-child(-n+2) > code").all_inner_texts()) for row in rows]  # model, backend
    assert shown == [(m, b) for m in ("resnet50", "vgg16") for b in BACKENDS]
    for row in rows:
        box = row.bounding_box()
        assert box is not None and box["y"] + box["height"] < 900
        assert row.locator(".verdict").inner_text() in ("cheap", "expensive")
    table, section = page.locator("#answer table.answer").bounding_box(), page.locator("#answer").bounding_box()
    assert table is not None and section is not None
    assert table["x"] + table["width"] <= section["x"] + section["width"] + 1
    page.close()


def test_console_table_and_report_give_one_attribution(
    results: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep's closing table prints the report's verdict and attribution sentence, word for word."""
    from detprof.sweep.render import print_summary

    monkeypatch.setenv("COLUMNS", "2000")
    print_summary(ResultsStore(results, "sweep"))
    console = " ".join(capsys.readouterr().out.split())
    doc = json.loads(render_report([results], "json"))
    assert {m["model"] for m in doc["models"]} == {"smallcnn", "mediumcnn_k3"}
    for model in doc["models"]:
        assert model["attribution"] and " ".join(model["attribution"].split()) in console
        assert model["verdict_text"] in console
    page = render_report([results], "html", "cdn")
    for model in doc["models"]:
        assert f"<strong>{model['model']}</strong>: " in page


def test_study_that_did_not_learn_is_set_apart(
    browser: Any, results: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The same real study, its accuracies lowered to near chance: flagged, shown apart, out of the verdicts."""
    flat = tmp_path_factory.mktemp("flat") / "res"
    shutil.copytree(results / "sweep", flat / "sweep")
    shutil.copytree(results / "stability", flat / "stability")
    path = flat / "stability" / "summary.json"
    summary = json.loads(path.read_text())
    for variant in summary["variants"]:
        variant["accuracy"]["mean"] = 0.12
    path.write_text(json.dumps(summary))
    target = flat / "report.html"
    assert main(["report", str(flat), "-o", str(target)]) == 0
    page, errors, _ = open_report(browser, target, viewport=(1440, 900))
    assert errors == []
    row = page.locator("#answer table.answer tbody tr", has_text="smallcnn").inner_text()
    assert "did not learn" in row
    assert "mean test accuracy 12.0%, chance 10.0%, learning needs 20%" in page.locator("#answer").inner_text()
    assert page.locator("#stability h3.warn").count() == 1
    assert page.locator("#tradeoff .plotly-graph-div").count() == 0
    assert page.locator("#tradeoff p.absent").inner_text().endswith("left out, did not learn: smallcnn on cpu).")
    page.close()


def test_a_verification_fits_the_first_screen_and_plots_how_runs_part(browser: Any, tmp_path: Path) -> None:
    """A torch sweep with a verification beside it at 1440x900: whether determinism held is a column of the answer,
    which stays within the page's width, and each model whose default runs part has its log-scale plot drawn."""
    import synthetic_sweep as synth
    from synthetic_verify import write_verify
    from test_report_verify import MODELS, SWEPT

    synth.write_sweep(tmp_path, synth.config(list(SWEPT), 3, "torch"), synth.records(SWEPT, backend="torch"))
    write_verify(tmp_path, MODELS)
    target = tmp_path / "report.html"
    assert main(["report", str(tmp_path), "-o", str(target)]) == 0
    page, errors, outside = open_report(browser, target, viewport=(1440, 900))
    assert errors == [] and outside == []
    section = page.locator("#answer").bounding_box()
    assert section is not None
    for table in page.locator("#answer table.answer").all():
        box = table.bounding_box()
        assert box is not None and box["x"] + box["width"] <= section["x"] + section["width"] + 1
    assert page.locator("#answer table.answer").first.locator("th").nth(2).inner_text() == "Does determinism hold?"
    plots = page.locator("#verification .plotly-graph-div")
    assert plots.count() == 2
    assert page.locator("#verification .plotly-graph-div .ytick").count() > 0
    axis = page.evaluate("() => document.querySelector('#verification .plotly-graph-div').layout.yaxis.type")
    assert axis == "log"
    page.screenshot(path=str(tmp_path / "verification.png"), full_page=True)
    page.close()
