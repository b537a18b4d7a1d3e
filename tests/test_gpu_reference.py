"""What detprof measured on GPUs ships with the package and shows in every report, read off reference/'s runs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import synthetic_sweep as synth

from detprof.reports import cells, gpu_reference, reference_build
from detprof.reports.command import render_report

ROOT = Path(__file__).resolve().parents[1]
RUNS = sorted(p for p in (ROOT / "reference").iterdir() if p.is_dir())
CPU = {"label": "cpu", "name": "AMD EPYC", "cpu_count": 2}


@pytest.fixture
def cpu_results(tmp_path: Path) -> Path:
    """A CPU sweep's results (synthetic records): a report a user makes on a laptop."""
    records = synth.records({"smallcnn": [1.01, 1.02, 1.0]}, device=CPU)
    return synth.write_sweep(tmp_path / "res", synth.config(["smallcnn"], 3, gpu_label="cpu"), records)


def test_the_shipped_figures_are_the_reference_runs_read_again() -> None:
    """Never written by hand: ``make reference`` reads every run under reference/ as ``detprof report`` does."""
    shipped = gpu_reference.shipped()
    assert shipped == reference_build.summarize(RUNS), "run `make reference` after changing reference/"
    h100 = {(m.backend, m.model): m for m in shipped if m.source == "h100-2026-11-27"}
    assert h100["jax", "mediumcnn_k1"].measured == "2.99x [2.97, 3.01]"
    assert h100["torch", "vgg19"].measured == "1.04x (one pair)"
    assert h100["jax", "mediumcnn_k7"].versions == "JAX 0.11.2, Keras 3.15.1"
    assert h100["torch", "resnet50"].driver == "580.159.04 (CUDA 13.0)"
    assert {m.gpu for m in h100.values()} == {"NVIDIA H100 80GB HBM3"}


def test_each_run_is_a_table_of_models_by_framework_with_its_versions() -> None:
    run, study = [t for t in cells.gpu_reference_tables(gpu_reference.shipped()) if "H100" in t.title]
    assert run.title == "NVIDIA H100 80GB HBM3, 2026-11-27" and run.headers == ["Model", "JAX", "PyTorch"]
    rows = {row[0]: row[1:] for row in run.rows}
    assert rows["mobilenet"] == ["0.89x (one pair)", "-"]  # not reached on PyTorch in that lease
    assert [row[0] for row in run.rows][-4:] == [f"mediumcnn_k{k}" for k in (1, 3, 5, 7)]
    assert run.versions.endswith("driver 580.159.04 (CUDA 13.0); reference/h100-2026-11-27")
    # The next day's gpu-study, read from its bundle: its GPT on PyTorch; on JAX it failed, so no figure.
    assert study.title == "NVIDIA H100 80GB HBM3, 2026-11-28"
    assert {row[0]: row[1:] for row in study.rows}["gpt_small"] == ["-", "1.07x [1.05, 1.08]"]
    assert study.versions.endswith("reference/h100-2026-11-28")
    line = cells.gpu_reference_line(gpu_reference.shipped())
    assert line is not None and "NVIDIA H100 80GB HBM3 (2026-11-27): JAX 0.89x-2.99x, PyTorch 1.03x-1.11x" in line
    assert "NVIDIA H100 80GB HBM3 (2026-11-28): JAX 1.01x-2.99x, PyTorch 1.04x-1.12x over 10 models" in line


def test_every_report_has_the_section_a_cpu_one_on_its_first_screen_too(
    cpu_results: Path,
) -> None:
    html = render_report([cpu_results], "html")
    assert '<a href="#on-gpus">On GPUs</a>' in html and "Measured by detprof on GPUs" in html
    assert '<p class="ref"><a href="#on-gpus">Measured by detprof on GPUs: NVIDIA H100' in html
    markdown = render_report([cpu_results], "md")
    assert "## Measured by detprof on GPUs" in markdown and "| mediumcnn\\_k1 | 2.99x \\[2.97, 3.01\\] |" in markdown
    document = json.loads(render_report([cpu_results], "json"))
    assert document["measured_on_gpus"][0]["gpu"] == "NVIDIA H100 80GB HBM3"


def test_a_gpu_reports_first_screen_redraws_the_papers_figure_and_a_cpu_reports_does_not(cpu_results: Path) -> None:
    html = render_report([ROOT / "reference" / "h100-2026-11-27"], "html")
    answer = html[html.index('<section id="answer"') : html.index("</section>", html.index('<section id="answer"'))]
    figure = answer[: answer.index("<table")]  # above the answer's table: what 1440x900 shows first
    assert "The paper's figure on this GPU" in figure
    for curve in ("nvidia-h100-80gb-hbm3 (jax)", "nvidia-h100-80gb-hbm3 (torch)"):
        assert f"{curve}: whole step (kernel time)" in figure
    for gpu in ("T4", "V100", "P100"):
        assert f"published, {gpu} (Zhuang et al.)" in figure
    assert '"y":[2.84,7.46]' in figure.replace(" ", "")  # the P100's ends at 1x1 and 7x7
    cpu = render_report([cpu_results], "html")
    assert "The paper's figure on this GPU" not in cpu


def test_a_gpu_study_expects_a_repeat_to_take_what_it_took_on_that_gpu() -> None:
    h100 = {(m.backend, m.model): m.repeat_s for m in gpu_reference.shipped() if m.source == "h100-2026-11-27"}
    assert h100["jax", "mediumcnn_k1"] == 18.8  # one process per repeat: its runs' shared duration, once
    assert h100["torch", "mediumcnn_k3"] == 29.3  # a process per mode: the two runs' durations added


def test_an_installation_without_the_file_says_so(cpu_results: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_reference, "REFERENCE_FILE", "nonexistent.json")
    assert gpu_reference.shipped() == []
    assert "This installation of detprof ships no GPU measurements." in render_report([cpu_results], "html")


def test_a_changed_row_is_read_back_as_written(tmp_path: Path) -> None:
    rows = [replace(gpu_reference.shipped()[0], ratio=1.5, lo=None, hi=None, pairs=1)]
    gpu_reference.write(rows, tmp_path / "reference.json")
    assert json.loads((tmp_path / "reference.json").read_text())[0]["ratio"] == 1.5
    assert rows[0].measured == "1.50x (one pair)"
