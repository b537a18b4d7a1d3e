"""A study kind is its module plus one registry line: ``sorting_kind`` (nothing else of detprof knows it) runs from
the CLI, stores its records, appears in the HTML, Markdown and JSON reports and in their provenance, and is frozen
by ``detprof baseline`` and compared by ``detprof check``; every listing of kinds comes from the registry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sorting_kind

import detprof.study_kinds as study_kinds
from detprof.cli import command_names, main
from detprof.reports import markdown
from detprof.reports.report_data import SECTIONS, build_report
from detprof.store import ResultsStore, find_studies


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(study_kinds, "KINDS", dict(study_kinds.KINDS))
    study_kinds.register(sorting_kind.REGISTRY_LINE)


@pytest.fixture
def sorted_runs(registered: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    out = tmp_path / "results"
    assert main(["sorting", "--out", str(out), "--repeats", "3", "--steps", "3"]) == 0
    assert f"sorting: {out}" in capsys.readouterr().out
    return out


def test_the_six_kinds_are_listed_once_in_the_registrys_order() -> None:
    assert study_kinds.names() == ("sweep", "calibration", "kernels", "stability", "verify", "knobs")
    assert [k.name for k in study_kinds.kinds()] == list(study_kinds.names())
    assert list(study_kinds.commands()) == ["sweep", "kernels", "stability", "verify"]
    listed = command_names()
    assert listed[listed.index("sweep") : listed.index("verify") + 1] == ["sweep", "kernels", "stability", "verify"]


def test_a_registered_kind_runs_from_the_cli_and_stores_its_records(sorted_runs: Path) -> None:
    assert "sorting" in command_names()
    (store,) = find_studies(sorted_runs)
    assert store.kind == "sorting"
    records = list(store.records())
    assert sorted(r["run_id"] for r in records) == sorted(
        f"sort20000-{mode}-r{r}" for r in range(3) for mode in ("default", "deterministic")
    )
    assert all(r["status"] == "ok" and len(r["step_wall_ns"]) == 3 for r in records)


def test_its_records_are_checked_against_the_fields_it_declares(sorted_runs: Path, capsys) -> None:
    path = next((sorted_runs / "sorting" / "runs").glob("*.json"))
    record = json.loads(path.read_text())
    del record["model"]
    path.write_text(json.dumps(record))
    assert main(["report", str(sorted_runs), "--format", "md", "-o", "-"]) == 3
    assert f"{path}: run record {record['run_id']} has no valid 'model'" in capsys.readouterr().err


def test_a_registered_kind_has_its_section_in_every_report_format(sorted_runs: Path, capsys) -> None:
    report = build_report([sorted_runs])
    assert [s.name for s in report.studies] == ["sorting cpu"]
    (section,) = report.sections
    assert section.headers == ("Device", "Array", "Stable / default") and len(section.rows) == 1
    device, size, overhead = section.rows[0]
    assert (device, size) == ("cpu", "sort20000") and overhead.endswith("]")

    assert main(["report", str(sorted_runs), "--format", "md", "-o", "-"]) == 0
    md = capsys.readouterr().out
    table = md[md.index("## What a stable sort costs") : md.index("## Warnings")]
    assert f"| cpu | sort20000 | {markdown.md(overhead)} |" in table
    assert md.index(f"## {SECTIONS['tradeoff']}") < md.index("## What a stable sort costs")

    assert main(["report", str(sorted_runs), "--format", "json", "-o", "-"]) == 0
    document = json.loads(capsys.readouterr().out)
    row = {"Device": "cpu", "Array": "sort20000", "Stable / default": overhead}
    assert document["sections"]["sorting"]["rows"] == [row]

    html_file = sorted_runs / "report.html"
    assert main(["report", str(sorted_runs), "-o", str(html_file), "--plotlyjs", "cdn"]) == 0
    html = html_file.read_text()
    nav = html[html.index("<nav>") : html.index("</nav>")]
    assert nav.index('href="#tradeoff"') < nav.index('<a href="#sorting">Sorting</a>') < nav.index('href="#conditions"')
    section_html = html[html.index('<section id="sorting">') : html.index('<section id="conditions">')]
    assert "<h2>What a stable sort costs</h2>" in section_html and f"<td>{overhead}</td>" in section_html
    provenance = html[html.index('<section id="provenance">') :]
    assert "sorting" in provenance and "detprof sorting --out" in provenance


def test_check_compares_a_registered_kind_with_its_baseline(sorted_runs: Path, tmp_path: Path, capsys) -> None:
    baseline = tmp_path / "baseline.json"
    assert main(["baseline", str(sorted_runs), "-o", str(baseline)]) == 0
    assert "baseline: 1 model(s), 3 repeats, CPU " in capsys.readouterr().out  # measured here, on the CPU
    assert json.loads(baseline.read_text())["source"]["study"] == "sorting"

    assert main(["check", "--baseline", str(baseline), "--current", str(sorted_runs)]) == 0
    assert "sort20000" in capsys.readouterr().out

    assert main(["check", "--baseline", str(baseline), "--run"]) == 2
    assert "--run cannot measure a baseline of a sorting study again" in capsys.readouterr().err


def test_an_unregistered_kinds_folder_is_no_study(tmp_path: Path, capsys) -> None:
    store = ResultsStore(tmp_path, "sorting")
    store.open({}, "detprof sorting", resume=False)
    assert main(["report", str(tmp_path), "--format", "md", "-o", "-"]) == 3
    assert "no detprof results here (no manifest in sweep/, calibration/, kernels/" in capsys.readouterr().err
