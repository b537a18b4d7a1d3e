"""The report of ``detprof verify`` studies: whether determinism held on the first screen, where runs part below.

Synthetic studies in the real format (``tests/synthetic_verify.py``) cover each answer: a swept
model that held (its default runs part late, so early layers never differ), a swept model that
did not hold, a swept model never verified, and two models verified without a sweep (one whose
default is deterministic already, one whose deterministic runs an op refused); a real
verification's report is read in ``tests/test_verify.py``. Every cell the HTML and the Markdown share must read alike
(``reports/cells.py``), and a report of results without a verification study must carry none
of it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import synthetic_sweep as synth
from synthetic_verify import Planted, write_verify
from test_report_cells import html_tables, md_tables

from detprof import backends
from detprof.analysis.verification import ModelVerification, compare
from detprof.fingerprints import RunFingerprints
from detprof.formatting import in_all
from detprof.reports import figures
from detprof.reports.cells import HOLDS, Words
from detprof.reports.command import render_report
from detprof.reports.headline import NOT_HELD_ADVICE
from detprof.reports.report_data import SECTIONS, build_report

LAYERS = ("conv1", "bn1", "relu1", "conv2", "logits")
ADVICE = backends.get("torch").nondeterministic_op_advice
OP = "max_unpooling2d_forward_out"
FINDING = {"op": OP, "message": f"RuntimeError: {OP} does not have a deterministic implementation", "layer": "unpool"}
FINDING["advice"] = ADVICE
MODELS = {
    "resnet50": Planted(LAYERS, default=(3, 2)),
    "vgg16": Planted(LAYERS, deterministic=(2, 1), default=(0, 1)),
    "mobilenet": Planted(LAYERS),
    "segnet": Planted(LAYERS, finding=FINDING),
}
SWEPT = {"resnet50": [1.3, 1.31, 1.32], "vgg16": [1.5, 1.52, 1.51], "inceptionv3": [1.02, 1.03, 1.02]}


def first_screen(page: str) -> str:
    """The HTML's answer section: what a reader sees before scrolling."""
    return page[page.index('<section id="answer">') : page.index('<section id="overhead">')]


def md_answer(text: str) -> str:
    return text[text.index(f"## {SECTIONS['answer']}") : text.index(f"## {SECTIONS['overhead']}")]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A torch sweep on t4 and a verification beside it, of the same device label and backend."""
    root = tmp_path_factory.mktemp("verified")
    synth.write_sweep(root, synth.config(list(SWEPT), 3, "torch"), synth.records(SWEPT, backend="torch"))
    return write_verify(root, MODELS)


@pytest.fixture(scope="module")
def rendered(results: Path) -> dict[str, str]:
    return {fmt: render_report([results], fmt, "cdn") for fmt in ("html", "md", "json")}


def test_the_first_screen_says_whether_determinism_held_beside_the_cost(rendered: dict[str, str]) -> None:
    headers, rows = html_tables(first_screen(rendered["html"]))[0]
    assert headers[:3] == ["Model on device", "Backend", HOLDS]
    by_model = {row[0][0]: dict(zip(headers, row, strict=True)) for row in rows}
    assert by_model["resnet50"][HOLDS] == ("held", "bitwise identical over 4 steps")
    assert by_model["vgg16"][HOLDS] == ("NOT held", "parts at step 2 in bn1's output")
    assert by_model["inceptionv3"][HOLDS] == ("not verified", "")
    assert by_model["vgg16"]["What to do"] == (NOT_HELD_ADVICE, "")
    assert by_model["resnet50"]["What to do"][0] != NOT_HELD_ADVICE
    screen = first_screen(rendered["html"])
    assert "Determinism does not hold here: its runs part at step 2, layer bn1 (output), max |diff| 1e-07" in screen
    assert '<span class="agree-no">NOT held</span>' in screen and '<span class="agree-yes">held</span>' in screen


def test_verified_models_without_a_sweep_get_a_table_of_their_own_with_their_findings(
    rendered: dict[str, str],
) -> None:
    screen = first_screen(rendered["html"])
    headers, rows = html_tables(screen)[1]
    assert headers == ["Model on device", "Backend", HOLDS, "Default mode", "What to do"]
    by_model = {row[0][0]: [cell for cell in row[2:]] for row in rows}
    assert list(by_model) == ["mobilenet", "segnet"]
    held, default, what = by_model["mobilenet"]
    assert held == ("held", "bitwise identical over 4 steps")
    assert default == ("already deterministic on this device", "")
    assert "determinism buys no reproducibility here" in what[0]
    assert by_model["segnet"][0] == ("NOT held", "max_unpooling2d_forward_out refused")
    finding = f"max_unpooling2d_forward_out in layer unpool has no deterministic implementation: {ADVICE}"
    assert f"<strong>segnet on t4 (torch)</strong>: {finding}".replace("'", "&#39;") in screen
    assert finding in md_answer(rendered["md"]).replace("\\", "")


def test_a_verification_alone_answers_first_and_says_the_cost_was_not_measured(results: Path) -> None:
    page, text = render_report([results / "verify"], "html", "cdn"), render_report([results / "verify"], "md")
    screen, answer = first_screen(page), md_answer(text)
    (headers, rows), *_ = html_tables(screen)
    assert headers == ["Model on device", "Backend", HOLDS, "Default mode", "What to do"]
    assert [row[0][0] for row in rows] == list(MODELS)
    assert screen.index("<table") < screen.index("No sweep results among the inputs")
    assert answer.index("| Device | Model | Backend |") < answer.index("No sweep results among the inputs")
    assert "Models verified but not swept" not in answer, "no headline here to be left out of"


def test_markdown_and_html_word_every_verification_cell_alike(rendered: dict[str, str]) -> None:
    """The HTML's note under a cell reads as the Markdown writes it on one line (``Words.line``)."""
    html = html_tables(first_screen(rendered["html"]))[:2]
    md = md_tables(md_answer(rendered["md"]))[:2]
    for (headers, rows), (md_headers, md_rows) in zip(html, md, strict=True):
        assert HOLDS in headers and HOLDS in md_headers
        for row, md_row in zip(rows, md_rows, strict=True):
            cells, shown = dict(zip(headers, row, strict=True)), dict(zip(md_headers, md_row, strict=True))
            assert cells["Model on device"][0] == shown["Model"]
            for header in set(headers) & set(md_headers):
                assert Words(*cells[header]).line == shown[header], header
    assert "held (bitwise identical over 4 steps)" in md_answer(rendered["md"])


def test_json_holds_each_models_verification_with_its_device_and_backend(rendered: dict[str, str]) -> None:
    document = json.loads(rendered["json"])
    verified = {v["model"]: v for v in document["verification"]}
    assert list(verified) == list(MODELS)
    keys = {"model", "command", "backend", "device", "device_name", "deterministic", "default", "held"}
    keys |= {"findings", "failures", "compilation_cache", "compiled", "side_by_side"}
    for v in verified.values():
        assert set(v) == keys | {"device_label"}
        assert (v["device_label"], v["backend"], v["compilation_cache"], v["compiled"]) == ("t4", "torch", None, False)
        assert v["side_by_side"] == []  # records from before the field: none said so
    assert [verified[m]["held"] for m in MODELS] == [True, False, True, False]
    parted = verified["vgg16"]["deterministic"]["first_difference"]
    assert (parted["step"], parted["layer"], parted["kind"]) == (2, "bn1", "output")
    assert verified["resnet50"]["default"]["first_difference"]["layer"] == "relu1"
    assert verified["segnet"]["findings"] == [FINDING]
    advice = {row["model"]: row["advice"] for row in document["models"]}
    assert advice["vgg16"] == NOT_HELD_ADVICE


def test_where_nondeterminism_enters_has_a_section_and_a_plot_per_model_whose_default_runs_part(
    rendered: dict[str, str],
) -> None:
    page, text = rendered["html"], rendered["md"]
    assert '<a href="#verification">Nondeterminism</a>' in page
    section = page[page.index('<section id="verification">') : page.index('<section id="stability">')]
    assert page.index('<section id="cost">') < page.index('<section id="verification">')
    for model in ("resnet50", "vgg16"):
        assert f"Default mode, {model} on t4 (torch)" in section
    assert "Default mode, mobilenet" not in section
    identical = "The default-mode runs stayed bitwise identical over 4 steps in all 5 layers"
    assert section.count(identical) == 2  # mobilenet, and segnet (whose deterministic runs an op refused)
    lines = [
        "Deterministic mode: bitwise identical over 4 steps in all 5 layers",
        "Default mode: the runs part at step 3, layer relu1 (output), max |diff| 1e-07",
        "Deterministic mode: the runs part at step 2, layer bn1 (output), max |diff| 1e-07",
    ]
    md_section = text[text.index(f"## {SECTIONS['verification']}") : text.index(f"## {SECTIONS['stability']}")]
    for line in lines:
        assert line in section
        assert line.replace("|", "\\|") in md_section


def test_a_module_compiled_whole_is_one_layer_in_words(tmp_path: Path) -> None:
    """Under ``--compile`` a module is one row, the compiled region: its identity holds "in its one layer"."""
    root = write_verify(tmp_path, {"net": Planted(("(compiled)",))})
    text = render_report([root], "md")
    assert "Deterministic mode: bitwise identical over 4 steps in its one layer" in text
    assert "in all 1 layers" not in text


def test_a_compiled_modules_submodules_count_by_their_weights() -> None:
    """A compiled run fingerprints its module's logits alone (a hook inside the graph would be compiled in), then every
    module's weights: the comparison held in each of those modules, not in "its one module"."""
    a = RunFingerprints()
    a.begin_step()
    a.add("Net", "output", [np.ones((4, 5))])
    for path in ("features.0", "features.2", "head"):
        a.add(path, "weights", [np.ones(3)])
        a.add(f"{path}.weight", "gradients", [np.ones(3)])
    held = compare("deterministic", a, a)
    assert held.identical and held.layers == 4
    assert in_all(held.layers, "module") == "in all 4 modules"


def test_a_verification_whose_runs_each_compiled_their_steps_says_so(tmp_path: Path, rendered: dict[str, str]) -> None:
    """JAX keeps compiled steps across processes (its persistent compilation cache): where every run turned it off,
    the model's section says the runs could part in what compiling chose. PyTorch's runs keep none to turn off and
    their section says nothing of it."""
    compiled = {"compilation_cache": "off"}
    root = write_verify(tmp_path, {"mobilenet": Planted(LAYERS)}, backend="jax", compiled=compiled)
    line = (
        "Each run compiled its steps itself (JAX's persistent compilation cache off in its process): the runs of a "
        "mode could differ in what compiling chose, as processes on a GPU do."
    )
    page, text = render_report([root], "html", "cdn"), render_report([root], "md")
    section = page[page.index('<section id="verification">') : page.index('<section id="stability">')]
    md_section = text[text.index(f"## {SECTIONS['verification']}") : text.index(f"## {SECTIONS['stability']}")]
    assert f"<li>{line}</li>".replace("'", "&#39;") in section and f"- {line}" in md_section
    (verified,) = json.loads(render_report([root], "json"))["verification"]
    assert verified["compilation_cache"] == "off"
    assert "compiled its steps itself" not in rendered["html"] + rendered["md"]


def test_a_gpu_verification_whose_deterministic_runs_shared_the_device_says_so(tmp_path: Path) -> None:
    """PyTorch's deterministic runs of a GPU verification run side by side (``verify.run.replicas_side_by_side``):
    the model's section says so, and why that cannot part them; the JSON lists the mode."""
    root = write_verify(tmp_path, {"mobilenet": Planted(LAYERS)}, compiled={"side_by_side": True})
    line = (
        "Its deterministic runs ran side by side on the GPU: in that mode PyTorch picks its kernels without timing "
        "them, so sharing the device cannot part them."
    )
    page, text = render_report([root], "html", "cdn"), render_report([root], "md")
    assert f"<li>{line}</li>" in page and f"- {line}" in text
    (verified,) = json.loads(render_report([root], "json"))["verification"]
    assert verified["side_by_side"] == ["default", "deterministic"]


def test_the_plot_draws_each_layer_in_model_order_on_a_log_scale(results: Path) -> None:
    """resnet50's default runs part at the last step in relu1: conv1 and bn1 never differ, named so in the legend."""
    report = build_report([results])
    v: ModelVerification = next(m for m in report.verifications[0].models if m.model == "resnet50")
    fig = figures.divergence_figure(v, "t4 (torch)")
    assert [trace.name for trace in fig.data] == ["conv1 (identical)", "bn1 (identical)", "relu1", "conv2", "logits"]
    assert [trace.visible for trace in fig.data] == ["legendonly", "legendonly", True, True, True]
    assert fig.layout.yaxis.type == "log"
    relu1 = fig.data[2].y
    assert relu1[:3] == (None, None, None) and relu1[3] == pytest.approx(1e-7)


def test_what_ran_lists_the_verification_and_its_command(rendered: dict[str, str]) -> None:
    page, text = rendered["html"], rendered["md"]
    provenance = page[page.index('<section id="provenance">') :]
    command = "detprof verify --models resnet50,vgg16,mobilenet,segnet --backend torch --steps 4"
    assert re.search(r"<td>verify</td><td>t4</td><td>torch</td>", provenance)
    assert command in provenance and "<td>verify t4</td>" in provenance
    assert command in text[text.index(f"## {SECTIONS['provenance']}") :]


def test_a_report_without_a_verification_shows_none_of_it(tmp_path: Path) -> None:
    root = synth.write_sweep(tmp_path, synth.config(list(SWEPT), 3, "torch"), synth.records(SWEPT, backend="torch"))
    page, text = render_report([root], "html", "cdn"), render_report([root], "md")
    document: dict[str, Any] = json.loads(render_report([root], "json"))
    for shown in (page, text):
        assert HOLDS not in shown and "verify" not in shown and "Nondeterminism" not in shown
        assert SECTIONS["verification"] not in shown
    assert "verification" not in document
    assert all(row["advice"] != NOT_HELD_ADVICE for row in document["models"])


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda run: (run / "fingerprints.json").write_text("{}"), "KeyError: 'steps'"),
        (lambda run: (run / "fingerprints.json").write_text("{"), "JSONDecodeError"),
        (lambda run: (run / "samples.npz").unlink(), "FileNotFoundError"),
    ],
)
def test_a_runs_damaged_fingerprints_are_one_line_naming_them_and_the_record_to_delete(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: Any, why: str
) -> None:
    from detprof.cli import main

    root = write_verify(tmp_path / "res", {"resnet50": Planted(LAYERS)})
    run = root / "verify" / "fingerprints" / "resnet50--default--b"
    damage(run)
    assert main(["report", str(root), "-o", str(tmp_path / "r.html")]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{run}: unreadable fingerprints ({why}" in err, err
    assert f"delete {root / 'verify' / 'runs' / 'resnet50--default--b.json'} and run the study again" in err
