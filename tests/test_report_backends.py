"""The report of one device swept on three Keras backends: every row, section and output keyed by backend too.

Each backend's sweep is its own results directory (``detprof sweep --backend torch`` writes
one), written through the record builders (``tests/synthetic_sweep.py``) with overheads that
differ per backend, so a row that took another backend's numbers shows. TensorFlow's sweep is
written as detprof wrote it before there was a choice (no ``backend`` anywhere): it must read
as TensorFlow's. A stability study and a calibration exist for torch only, so they must
attach to the torch rows and to no other.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import synthetic_sweep as synth
from test_report_headline import calibration, stability

from detprof.reports.command import render_report
from detprof.reports.report_data import Report, build_report

RATIOS: dict[str, dict[str, list[float]]] = {
    "tensorflow": {"resnet50": [1.30, 1.32, 1.31], "vgg16": [1.80, 1.85, 1.82]},
    "jax": {"resnet50": [1.05, 1.06, 1.04], "vgg16": [1.20, 1.22, 1.21]},
    "torch": {"resnet50": [1.50, 1.52, 1.49], "vgg16": [1.02, 1.03, 1.02]},
}
BACKENDS = ("tensorflow", "jax", "torch")
FRAMEWORKS = {"tensorflow": "TensorFlow 2.21.0", "jax": "JAX 0.4.38", "torch": "PyTorch 2.6.0"}


def expected(backend: str, model: str) -> str:
    """The headline ratio the report shows: the geometric mean of the per-repeat ratios."""
    ratios = RATIOS[backend][model]
    return f"{math.exp(sum(math.log(r) for r in ratios) / len(ratios)):.3f}x"


def sweep_of(root: Path, backend: str, *, old: bool = False) -> Path:
    """One backend's sweep; ``old``: as written before records had a backend (TensorFlow only)."""
    ratios = RATIOS[backend]
    on = None if old else backend
    return synth.write_sweep(root, synth.config(list(ratios), 3, on), synth.records(ratios, backend=on))


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """TensorFlow (old records), torch (with a stability study and a calibration) and JAX, in that order."""
    base = tmp_path_factory.mktemp("backends")
    tf = sweep_of(base / "tf", "tensorflow", old=True)
    torch = sweep_of(base / "torch", "torch")
    stability(torch, "resnet50", "t4", accuracy=0.9, churn_impl=0.05, backend="torch")
    calibration(torch, {"resnet50": [1.01, 0.99, 1.0]}, backend="torch")
    return [tf, torch, sweep_of(base / "jax", "jax")]


@pytest.fixture(scope="module")
def report(results: list[Path]) -> Report:
    return build_report(results)


def test_older_records_read_as_tensorflow_and_every_study_keeps_its_backend(report: Report) -> None:
    assert [s.backend for s in report.sweeps] == ["tensorflow", "torch", "jax"]
    assert report.backends == list(BACKENDS)
    assert [(s.backend, s.model) for s in report.stability] == [("torch", "resnet50")]
    assert [c.backend for c in report.calibrations] == ["torch"]
    assert {b: report.framework(b) for b in BACKENDS} == FRAMEWORKS
    assert report.where("t4", "jax") == "t4 (jax)"


def test_headline_rows_are_keyed_by_backend_and_grouped_by_model(report: Report) -> None:
    rows = [(r.model, r.device, r.backend) for r in report.headline]
    assert rows == [(m, "t4", b) for m in ("resnet50", "vgg16") for b in BACKENDS]
    for r in report.headline:
        assert f"{r.kernel.ratio:.3f}x" == expected(r.backend, r.model), (r.model, r.backend)
        assert r.framework_version == FRAMEWORKS[r.backend].split()[-1]


def test_stability_and_noise_floor_attach_to_their_own_backend_only(report: Report) -> None:
    by_key = {(r.model, r.backend): r for r in report.headline}
    torch = by_key[("resnet50", "torch")]
    assert torch.stability is not None and torch.stability.noise.churn_impl == 0.05
    assert torch.noise_floor is not None and torch.calibrated
    for backend in ("tensorflow", "jax"):
        row = by_key[("resnet50", backend)]
        assert row.stability is None and row.noise_floor is None and not row.calibrated
        assert f"--backend {backend}" in row.advice if backend != "tensorflow" else "--backend" not in row.advice
    assert [(p.model, p.device, p.backend) for p in report.tradeoff] == [("resnet50", "t4", "torch")]
    uncalibrated = [n for n in report.notes if n.startswith("No noise floor")]
    assert [n.split(":")[0] for n in uncalibrated] == [
        "No noise floor for t4 (tensorflow)",
        "No noise floor for t4 (jax)",
    ]
    assert "`detprof sweep --calibrate --models resnet50,vgg16 --backend jax`" in uncalibrated[1]


def cells(row: str) -> list[list[str]]:
    """Each cell's words, markup dropped: its value first, then its note."""
    return [re.sub(r"<[^>]+>", " ", c).split() for c in re.findall(r"<td[^>]*>(.*?)</td>", row)]


def test_html_first_screen_shows_the_backends_side_by_side(results: list[Path]) -> None:
    page = render_report(results, "html", "cdn")
    answer = page[page.index('<section id="answer">') : page.index('<section id="overhead">')]
    assert answer.index("<table") == answer.index('<table class="answer backends">')
    headers = re.findall(r"<th>(.*?)</th>", answer.split("</thead>")[0])
    assert headers[:3] == ["Model on device", "Backend", "Costs: kernel time (det / default, 95% CI)"]
    rows = re.findall(r"<tr>(.*?)</tr>", answer.split("<tbody>")[1].split("</tbody>")[0])
    shown = [(c[0][0], c[1][0], c[2][0]) for c in map(cells, rows)]
    assert shown == [(m, b, expected(b, m)) for m in ("resnet50", "vgg16") for b in BACKENDS]
    assert "<small>2.6.0</small>" in rows[2] and "<small>0.4.38</small>" in rows[1]
    overhead = page[page.index('<section id="overhead">') : page.index('<section id="kernel-size">')]
    side = overhead.split("<h3>Keras backends side by side on t4: Tesla T4</h3>")[1].split("<h3>")[0]
    assert "plotly-graph-div" in side
    assert re.findall(r"<th>(.*?)</th>", side) == ["Model", *(f"{b} ({FRAMEWORKS[b]})" for b in BACKENDS)]
    for backend in BACKENDS:
        assert f"<h3>t4 ({backend}): Tesla T4</h3>" in overhead


def test_html_names_the_backend_in_every_section_and_provenance(results: list[Path]) -> None:
    page = render_report(results, "html", "cdn")
    assert "resnet50 on digits, t4 (torch): 12 runs ok" in page
    assert "without a GPU to sample (t4 (tensorflow), t4 (torch), t4 (jax))" in page
    provenance = page[page.index('<section id="provenance">') :]
    assert (
        "Keras backends: tensorflow (TensorFlow 2.21.0, Keras 3.15.0); jax (JAX 0.4.38, Keras 3.15.0); "
        "torch (PyTorch 2.6.0, Keras 3.15.0)." in provenance
    )
    assert "<th>Package</th><th>tensorflow</th><th>jax</th><th>torch</th>" in provenance
    assert "<h3>Determinism settings: torch (PyTorch 2.6.0)</h3>" in provenance
    assert "<th>CUBLAS_WORKSPACE_CONFIG</th>" in provenance and "<td>:4096:8</td>" in provenance
    assert "<th>op determinism (xla_gpu_deterministic_ops)</th>" in provenance


def test_markdown_and_json_carry_the_backend_per_row(results: list[Path]) -> None:
    text = render_report(results, "md")
    assert "| Device | Model | Backend | Kernel time |" in text
    for model in ("resnet50", "vgg16"):
        for backend in BACKENDS:
            version = FRAMEWORKS[backend].split()[-1]
            assert f"| t4 (Tesla T4) | {model} | {backend} ({version}) | {expected(backend, model)} \\[" in text
    assert "### Keras backends side by side on t4: Tesla T4" in text
    assert f"| resnet50 | {expected('tensorflow', 'resnet50')} \\[" in text
    assert "### resnet50 on digits, t4 (torch)" in text
    assert "Keras backends: tensorflow (TensorFlow 2.21.0, Keras 3.15.0); jax" in text
    doc = json.loads(render_report(results, "json"))
    assert doc["backends"] == FRAMEWORKS
    rows = [(m["model"], m["device"], m["backend"], m["framework_version"]) for m in doc["models"]]
    assert rows == [(m, "t4", b, FRAMEWORKS[b].split()[-1]) for m in ("resnet50", "vgg16") for b in BACKENDS]
    assert list(doc["models"][0])[:3] == ["device", "model", "backend"]


def test_a_tensorflow_report_reads_as_before(tmp_path: Path) -> None:
    """New TensorFlow records (with the field) and old ones give the same report, with no backend column."""
    old = render_report([sweep_of(tmp_path / "old", "tensorflow", old=True)], "html", "cdn")
    new = render_report([sweep_of(tmp_path / "new", "tensorflow")], "html", "cdn")

    def answer(page: str) -> str:
        """Everything before what ran, less the random ids plotly gives its figures."""
        shown = page[page.index('<section id="answer">') : page.index('<section id="provenance">')]
        return re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "ID", shown)

    assert answer(old).replace(str(tmp_path / "old"), "X") == answer(new).replace(str(tmp_path / "new"), "X")
    assert "<th>Backend</th>" not in answer(new).split("</thead>")[0]
    assert "(tensorflow)" not in answer(new) and "side by side" not in answer(new)
    assert "Keras backend: tensorflow (TensorFlow 2.21.0, Keras 3.15.0)." in new
    assert "| Backend |" not in render_report([tmp_path / "new"], "md")
    assert {m["backend"] for m in json.loads(render_report([tmp_path / "old"], "json"))["models"]} == {"tensorflow"}


def test_one_backend_that_is_not_tensorflow_is_named(tmp_path: Path) -> None:
    root = sweep_of(tmp_path / "torch", "torch")
    page = render_report([root], "html", "cdn")
    assert "<th>Backend</th>" in page and "<h3>t4 (torch): Tesla T4</h3>" in page
    assert "side by side" not in page
    assert "| t4 (Tesla T4) | resnet50 | torch (2.6.0) |" in render_report([root], "md")


def test_warnings_name_the_backend(tmp_path: Path) -> None:
    ratios = RATIOS["torch"]
    records = synth.records(ratios, backend="torch", failed={"vgg16--default--r1": "CUDA OOM"})
    failing = synth.write_sweep(tmp_path / "torch", synth.config(list(ratios), 3, "torch"), records)
    report = build_report([failing, sweep_of(tmp_path / "tf", "tensorflow", old=True)])
    failed = [w for w in report.warnings if "CUDA OOM" in w]
    assert failed and all(w.startswith("t4 (torch): vgg16: ") for w in failed)
