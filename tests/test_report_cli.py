"""``detprof report`` on inputs that lack pieces or are broken: one line, never a traceback."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import plotly.offline
import pytest
import synthetic_sweep as synth

from detprof.cli import main
from detprof.invocation import resumed_in
from detprof.reports.command import write_report
from detprof.store import ResultsStore
from detprof.traces.kernel_table import KERNEL_DTYPES, conform

PLOTLY_JS_HEAD = plotly.offline.get_plotlyjs()[:300]


def wall_only_sweep(root: Path) -> Path:
    """A sweep traced with --tracer none (wall time only), one model unsupported under determinism."""
    ratios = {"resnet50": [1.21, 1.25, 1.19], "vgg19": [1.7, 1.8, 1.75], "nasnetmobile": [1.0, 1.0, 1.0]}
    records = synth.records(
        ratios,
        tracer="none",
        unsupported={f"nasnetmobile--deterministic--r{r}": "no deterministic GPU implementation" for r in range(3)},
    )
    return synth.write_sweep(root, synth.config(list(ratios), 3, tracer="none"), records)


def test_wall_only_sweep_leaves_out_kernel_sections_with_one_line_each(tmp_path: Path) -> None:
    out = write_report(wall_only_sweep(tmp_path / "res"), tmp_path / "r.html", plotlyjs="cdn")
    page = out.read_text()
    assert "No kernel tables: every sweep ran with --tracer none or no run succeeded." in page
    assert "No stability study among the inputs: the answer names, beside each overhead" in page
    assert "detprof stability --model vgg19" in page
    assert "No model has both an overhead and a stability study whose models learned on the same device label" in page
    assert "No GPU telemetry" in page
    assert "No medium CNN was swept" in page
    assert "not supported under determinism: no deterministic GPU implementation" in page
    cost = page[page.index('<section id="cost">') : page.index('<section id="stability">')]
    assert "plotly-graph-div" not in cost
    assert page.count('class="plotly-graph-div"') == 1
    assert f"{(1.21 * 1.25 * 1.19) ** (1 / 3):.3f}x [" in page


def test_embed_writes_plotly_js_exactly_once_and_cdn_writes_a_script_tag(tmp_path: Path) -> None:
    res = wall_only_sweep(tmp_path / "res")
    embedded = write_report(res, tmp_path / "embed.html").read_text()
    assert embedded.count(PLOTLY_JS_HEAD) == 1
    assert not re.search(r"<(?:script|link|img)[^>]+(?:src|href)=", embedded)
    cdn = write_report(res, tmp_path / "cdn.html", plotlyjs="cdn").read_text()
    assert PLOTLY_JS_HEAD not in cdn
    assert len(re.findall(r'<script[^>]+src="https://cdn\.plot\.ly/plotly-[\d.]+\.min\.js"', cdn)) == 1
    assert len(cdn) < 500_000 < len(embedded)


def test_markdown_headline_tables(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    res = wall_only_sweep(tmp_path / "res")
    target = tmp_path / "comment.md"
    assert main(["report", str(res), "--format", "md", "-o", str(target)]) == 0
    assert capsys.readouterr().out.strip() == str(target)
    text = target.read_text()
    assert "| Model | Kernel time | Wall time | Repeats | Note |" in text
    row = next(line for line in text.splitlines() if line.startswith("| vgg19 |"))
    expected_ratio = f"{(1.7 * 1.8 * 1.75) ** (1 / 3):.3f}x"
    assert row.split(" | ")[2].startswith(expected_ratio)
    assert "<" not in text.replace("\\<", "")


def test_default_output_is_report_html_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    res = wall_only_sweep(tmp_path / "res")
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(res), "--plotlyjs", "cdn"]) == 0
    assert (tmp_path / "report.html").read_text().startswith("<!DOCTYPE html>")


def test_the_output_files_suffix_names_its_format_unless_format_is_given(tmp_path: Path) -> None:
    res = wall_only_sweep(tmp_path / "res")
    for name, opening in (("r.md", "# detprof"), ("r.JSON", "{"), ("r.htm", "<!DOCTYPE html>")):
        assert main(["report", str(res), "--plotlyjs", "cdn", "-o", str(tmp_path / name)]) == 0
        assert (tmp_path / name).read_text().startswith(opening), name
    assert main(["report", str(res), "--plotlyjs", "cdn", "--format", "html", "-o", str(tmp_path / "r.md")]) == 0
    assert (tmp_path / "r.md").read_text().startswith("<!DOCTYPE html>")


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    return err


def test_path_without_results_is_an_input_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path / "missing")]) == 3
    assert "no such results directory" in one_line_error(capsys)
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 3
    assert "no detprof results here" in one_line_error(capsys)


def test_unreadable_files_are_input_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    res = wall_only_sweep(tmp_path / "res")
    record = next((res / "sweep" / "runs").glob("*.json"))
    record.write_text("{not json")
    assert main(["report", str(res), "-o", str(tmp_path / "r.html")]) == 3
    assert "unreadable run record" in one_line_error(capsys)
    (res / "sweep" / "manifest.json").write_text("[garbage")
    assert main(["report", str(res / "sweep"), "-o", str(tmp_path / "r.html")]) == 3
    assert "unreadable" in one_line_error(capsys)
    assert not (tmp_path / "r.html").exists()


def test_corrupt_stability_summary_is_an_input_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = ResultsStore(tmp_path / "res", "stability")
    store.open({"model": "smallcnn"}, "detprof stability", resume=False)
    store.write_json("summary.json", {"kind": "stability"})
    assert main(["report", str(tmp_path / "res"), "-o", str(tmp_path / "r.html")]) == 3
    assert "not a detprof stability summary" in one_line_error(capsys)
    (store.dir / "summary.json").write_text("{")
    assert main(["report", str(tmp_path / "res"), "-o", str(tmp_path / "r.html")]) == 3
    assert "unreadable stability summary" in one_line_error(capsys)


def test_stability_study_without_summary_yet_is_one_line(tmp_path: Path) -> None:
    res = wall_only_sweep(tmp_path / "res")
    command = "detprof stability --model vgg19 --backend torch --out res"
    ResultsStore(res, "stability").open({"model": "vgg19"}, command, resume=False)
    page = write_report(res, tmp_path / "r.html", plotlyjs="cdn").read_text()
    again = f"detprof stability --model vgg19 --backend torch --out {res} --resume"
    assert f"has no summary.json yet (interrupted? <code>{again}</code> finishes it)" in page
    assert json.loads((res / "stability" / "manifest.json").read_text())["kind"] == "stability"


@pytest.mark.parametrize(
    "command",
    [
        "detprof stability --model smallcnn --out old --resume",
        "detprof stability --model smallcnn --out=old",
        "detprof stability --model smallcnn",
    ],
)
def test_a_moved_study_is_resumed_where_it_is_read(command: str) -> None:
    again = resumed_in(command, "/home/me/copied results")
    assert again == "detprof stability --model smallcnn --out '/home/me/copied results' --resume"


def stability_variant(name: str, varies: list[str], check: dict, subgroups: dict | None) -> dict:
    return {
        "variant": name,
        "varies": varies,
        "mode": "default" if "impl" in varies else "deterministic",
        "description": f"varies {', '.join(varies) or 'nothing'}",
        "runs_ok": 3,
        "runs_failed": 1,
        "failures": [{"run_id": f"{name}-r003", "reason": "worker died <OOM> & more"}],
        "accuracy": {"mean": 0.8, "std": 0.01, "std_se": 0.004},
        "churn": 0.05 if varies else 0.0,
        "l2": 0.2,
        "per_class": {"stds": [0.01, None, 0.03], "max_std": 0.03, "ratio": 3.0},
        "subgroups": subgroups,
        "determinism_check": check,
    }


def test_stability_sub_groups_failed_check_and_failed_runs(tmp_path: Path) -> None:
    """A hand-written summary in the study's format: the parts a tiny digits study never has."""
    store = ResultsStore(tmp_path / "res", "stability")
    store.open({"model": "smallcnn"}, "detprof stability --dataset npz:groups.npz", resume=False)
    groups = {
        "overall_std": {"accuracy": 0.01, "fpr": 0.02, "fnr": 0.03},
        "groups": [
            {"group": 0, "n": 40, "accuracy_mean": 0.8, "accuracy_std": 0.05, "accuracy_std_ratio": 5.0,
             "fpr_mean": 0.1, "fpr_std": 0.02, "fpr_std_ratio": 1.0, "fnr_mean": 0.2, "fnr_std": 0.06,
             "fnr_std_ratio": 2.0},
        ],
    }  # fmt: skip
    failed_check = {"applicable": True, "verified": False, "first_differing_layer": "conv<2>", "line": ""}
    summary = {
        "kind": "stability",
        "model": "smallcnn",
        "dataset": "npz:groups.npz",
        "device": "cpu",
        "runs_ok": 6,
        "runs_failed": 2,
        "variants": [
            stability_variant("impl", ["impl"], {"applicable": False}, groups),
            stability_variant("control", [], failed_check, None),
        ],
    }
    store.write_json("summary.json", summary)
    page = write_report(tmp_path / "res", tmp_path / "r.html", plotlyjs="cdn").read_text()
    assert "<h4>Sub-groups</h4>" in page
    assert '<td>impl</td><td>0</td><td class="num">40</td>' in page
    assert "NOT verified: first differing layer conv&lt;2&gt;" in page
    assert "worker died &lt;OOM&gt; &amp; more" in page
    assert page.count('class="plotly-graph-div"') == 1


@pytest.mark.parametrize("field", ["model", "mode"])
def test_hand_edited_sweep_record_without_identity_is_input_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str
) -> None:
    root = wall_only_sweep(tmp_path / "res")
    record_path = root / "sweep" / "runs" / "resnet50--default--r1.json"
    record = json.loads(record_path.read_text())
    del record[field]
    record_path.write_text(json.dumps(record))
    assert main(["report", str(root), "-o", str(tmp_path / "r.html")]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"has no valid '{field}'" in err and "resnet50--default--r1.json" in err


def test_kernels_manifest_without_cases_is_input_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = ResultsStore(tmp_path / "res", "kernels")
    store.open({"ops": ["dense_matmul"], "repeats": 3}, "detprof kernels (hand-edited)", resume=False)
    for record in synth.records({"smallcnn": [1.0]}):
        store.write_record(record | {"case": "dense_matmul@smallcnn.logits", "op": "dense_matmul"})
    assert main(["report", str(tmp_path / "res"), "-o", str(tmp_path / "r.html")]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no valid 'cases'" in err and "manifest.json" in err


def test_kernels_whose_traces_name_no_layer_are_said_to_name_none(tmp_path: Path) -> None:
    """nvprof names no op or layer for a kernel: the cost section says so under each model instead of showing
    empty leaderboards."""
    ratios = {"resnet50": [1.21, 1.25, 1.19]}
    records = synth.records(ratios, tracer="nvprof")
    res = synth.write_sweep(tmp_path / "res", synth.config(list(ratios), 3, tracer="nvprof"), [])
    store = ResultsStore(res, "sweep")
    for record in records:
        names = ["volta_sgemm_128x64_nn"] * 4 + ["scatter_atomic_add"] * (record["mode"] == "deterministic")
        frame = pd.DataFrame({"name": names, "short_name": names, "start_ns": range(len(names)), "dur_ns": 10})
        table = store.write_table(record["run_id"], conform(frame, KERNEL_DTYPES))
        store.write_record({**record, "kernel_table": table, "kernel_table_kind": "launches"})
    page = write_report(res, tmp_path / "r.html", plotlyjs="cdn").read_text()
    cost = page[page.index('<section id="cost">') : page.index('<section id="stability">')]
    assert "These traces name no op or layer for their kernels (nvprof records none" in cost
    assert "by time determinism adds" not in cost
