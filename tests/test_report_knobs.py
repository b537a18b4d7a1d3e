"""The report of ``detprof sweep --knobs`` studies: which switch costs what, on the first screen and in a section.

Synthetic studies in the real format, with chosen costs: a torch study on a T4 of a model the
sweep beside it measured too (cuDNN's determinism carries most of the overhead and the model
needs it; the fill costs nothing worth reading), with a calibration of the same model whose
noise floor swallows a small knob; and a torch study on a CPU of a model no sweep measured
(cuDNN and cuBLAS cannot matter there; deterministic algorithms cost something and are not
needed). Each study's records are ``records.measured_run``s of a knob study's arms, written
with the manifest ``sweep.knobs.knobs_manifest`` writes and each arm's knobs read back as the
framework reports them, and its ``knob_checks`` hold fingerprints of full determinism and of
every arm without one knob.
"""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import synthetic_sweep as synth
from synthetic_verify import run_pair
from test_report_cells import html_tables, md_tables
from test_report_headline import calibration
from test_report_verify import first_screen, md_answer

from detprof import backends
from detprof.analysis.knobs import within_noise
from detprof.records import measured_run, verify_run
from detprof.reports.cells import KNOB_ADVICE, KNOB_HEADERS, WITHIN_NOISE, Words
from detprof.reports.command import render_report
from detprof.reports.report_data import SECTIONS, build_report
from detprof.store import ResultsStore
from detprof.sweep.knobs import knob_design

TORCH = backends.get(backends.TORCH)
ALGORITHMS, FILL = "torch.use_deterministic_algorithms", "torch.fill_uninitialized_memory"
CUDNN, BENCHMARK, CUBLAS = "torch.cudnn_deterministic", "torch.cudnn_benchmark", "torch.cublas_workspace_config"
LAUNCH_BLOCKING, INDUCTOR = "torch.cuda_launch_blocking", "torch.inductor_deterministic"
CPU = {"label": "cpu", "name": "AMD EPYC", "cpu_count": 2}
LAYERS = ("conv1", "relu1", "logits")
JITTER = (1.004, 0.996, 1.002, 0.998)
"""Each repeat's ratio is the chosen one times these: an interval about +/-0.5% wide around it."""
GPU_COSTS = {
    "total": 1.30,
    f"add:{ALGORITHMS}": 1.05,
    f"drop:{ALGORITHMS}": 1.06,
    f"drop:{FILL}": 1.0,
    f"add:{CUDNN}": 1.18,
    f"drop:{CUDNN}": 1.20,
    f"add:{BENCHMARK}": 1.0,
    f"drop:{BENCHMARK}": 1.0,
    f"add:{CUBLAS}": 1.02,
    f"drop:{CUBLAS}": 1.02,
    f"add:{LAUNCH_BLOCKING}": 1.12,
    "helper:hf_full_determinism": 1.45,
    "helper:lightning_deterministic": 1.09,
    "helper:accelerate_deterministic": 1.05,
}
CPU_COSTS = {"total": 1.08, f"add:{ALGORITHMS}": 1.02, f"drop:{ALGORITHMS}": 1.07, f"drop:{FILL}": 1.0}
SWEPT = {"resnet50": [1.3, 1.31, 1.29]}
KNOBS_SWEEP = "detprof sweep --knobs --backend torch --models"


def in_effect(asked: frozenset[str]) -> dict[str, bool]:
    """Each knob as PyTorch reads it back (``TorchBackend.knobs_in_effect``): the fill only under deterministic
    algorithms, cuDNN's benchmark off (its deterministic setting) by default."""
    return {
        ALGORITHMS: ALGORITHMS in asked,
        FILL: FILL in asked and ALGORITHMS in asked,
        CUDNN: CUDNN in asked,
        BENCHMARK: True,
        CUBLAS: CUBLAS in asked,
        LAUNCH_BLOCKING: LAUNCH_BLOCKING in asked,
        INDUCTOR: INDUCTOR in asked,
    }


def arm_settings(asked: frozenset[str]) -> dict[str, Any]:
    effect = in_effect(asked)
    settings = synth.settings("deterministic" if asked else "default", "torch")
    return settings | {"op_determinism": effect[ALGORITHMS], "cudnn_deterministic": effect[CUDNN], "knobs": effect}


def write_checks(study: ResultsStore, model: str, device: Mapping[str, Any], needed: set[str]) -> None:
    """Full determinism and each arm without one knob, two runs each, their fingerprints as ``verify.run`` saves
    them: the runs without a ``needed`` knob part at step 1 in relu1."""
    checks = ResultsStore(study.dir, "knob_checks")
    without = [name.removeprefix("drop:") for name in study.manifest()["config"]["comparisons"] if "drop:" in name]
    checks.open({"models": [model], "steps": 3, "without": without}, f"{KNOBS_SWEEP} {model}", resume=False)
    for knob in ["", *without]:
        arm = f"without-{knob}" if knob else "deterministic"
        asked = TORCH.mode_knobs() - {knob}
        for replica, taken in zip("ab", run_pair(LAYERS, 3, (1, 1) if knob in needed else None), strict=True):
            run_id = f"{model}--{arm}--{replica}"
            folder = Path("fingerprints") / run_id
            taken.save(checks.dir / folder)
            record = verify_run(
                run_id=run_id,
                model=model,
                mode="deterministic",
                replica=replica,
                status="ok",
                reason=None,
                backend="torch",
                steps=3,
                steps_asked=3,
                fingerprints=str(folder),
                layers=list(LAYERS),
                settings=arm_settings(asked),
                versions=dict(synth.BACKEND_VERSIONS["torch"]),
                device=dict(device),
            )
            checks.write_record(dict(record) | ({"without": knob, "knobs": sorted(asked)} if knob else {}))


def write_knobs(root: Path, model: str, costs: dict[str, float], device: Mapping[str, Any], needed: set[str]) -> Path:
    """A knob study of ``model`` under ``root/knobs``, as ``sweep --knobs`` writes one: each comparison's arm b at
    its chosen cost times arm a, repeat by repeat (``JITTER``); returns ``root``."""
    plan = knob_design(TORCH, on_gpu=device["label"] != "cpu", only=None)
    assert [c.name for c in plan.comparisons] == list(costs), "the costs follow the plan"
    config = synth.config([model], len(JITTER), "torch", gpu_label=device["label"], tracer="torch")
    config |= {
        "knobs": [k.name for k in plan.knobs],
        "comparisons": list(costs),
        "not_applicable": plan.not_applicable,
        "helpers": plan.helpers,
    }
    store = ResultsStore(root, "knobs")
    store.open(config, f"{KNOBS_SWEEP} {model}", resume=False)
    for repeat, jitter in enumerate(JITTER):
        for comparison in plan.comparisons:
            base = 30e6 * (1 + 0.02 * repeat)
            for arm, scale in (("a", 1.0), ("b", costs[comparison.name] * jitter)):
                knobs = comparison.knobs(arm)  # type: ignore[arg-type]
                store.write_record(
                    measured_run(
                        run_id=f"{model}--{comparison.slug}--{arm}--r{repeat}",
                        model=model,
                        mode="deterministic" if knobs else "default",
                        repeat=repeat,
                        status="ok",
                        steps=synth.STEPS,
                        warmup=5,
                        batch_size=64,
                        tracer="torch",
                        measures="both",
                        step_wall_ns=[round(base * 1.2 * scale)] * synth.STEPS,
                        kernel_ns_per_step=base * scale,
                        settings=arm_settings(frozenset(knobs)),
                        versions=dict(synth.BACKEND_VERSIONS["torch"]),
                        device=dict(device),
                        started_at="2025-01-03T00:00:00+00:00",
                        finished_at="2025-01-03T00:00:10+00:00",
                        duration_s=10.0,
                        backend="torch",
                        arm=arm,
                        comparison=comparison.name,
                        knobs=list(knobs),
                    )
                )
    write_checks(store, model, device, needed)
    return root


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A torch sweep on t4 with a knob study and a calibration of the same model beside it; a knob study on a CPU."""
    root = tmp_path_factory.mktemp("knobs")
    synth.write_sweep(root / "t4", synth.config(list(SWEPT), 3, "torch"), synth.records(SWEPT, backend="torch"))
    calibration(root / "t4" / "calibration", {"resnet50": [1.02, 0.98, 1.015, 0.985]}, backend="torch")
    write_knobs(root / "t4", "resnet50", GPU_COSTS, synth.DEVICE, needed={CUDNN})
    write_knobs(root / "cpu", "smallcnn", CPU_COSTS, CPU, needed=set())
    return root


@pytest.fixture(scope="module")
def rendered(results: Path) -> dict[str, str]:
    return {fmt: render_report([results], fmt, "cdn") for fmt in ("html", "md", "json")}


def section(page: str) -> str:
    return page[page.index('<section id="knobs">') : page.index('<section id="stability">')]


def md_section(text: str) -> str:
    return text[text.index(f"## {SECTIONS['knobs']}") : text.index(f"## {SECTIONS['stability']}")]


def knob_tables(page: str) -> list[dict[str, dict[str, tuple[str, str]]]]:
    """Each knob table of the HTML, knob by knob, each cell (text, note) by header."""
    return [
        {row[0][0]: dict(zip(headers, row, strict=True)) for row in rows}
        for headers, rows in html_tables(page)
        if headers == list(KNOB_HEADERS)
    ]


def test_the_first_screen_says_which_switch_to_turn_off_beside_the_cost_or_on_its_own(
    rendered: dict[str, str],
) -> None:
    screen = first_screen(rendered["html"])
    _, rows = html_tables(screen)[0]
    assert [row[0][0] for row in rows] == ["resnet50"], "a knob study adds no headline row"
    beside = screen[screen.index("</table>") : screen.index(f"<h3>{SECTIONS['knobs']}</h3>")]
    advice = (
        f"<strong>resnet50 on t4 (torch)</strong>: {KNOB_ADVICE}: {CUDNN} costs most (in full determinism it costs "
        "+20.0% ["
    )
    assert advice in beside and "and is needed: without it the runs part at step 1, layer relu1 (output)" in beside
    alone = screen[screen.index(f"<h3>{SECTIONS['knobs']}</h3>") :]
    assert (
        f"<strong>smallcnn on cpu (torch)</strong>: turn off {ALGORITHMS}: it costs +7.0% [" in alone
        and "still bitwise identical over 3 steps without it" in alone
    )
    assert "resnet50" not in alone
    answer = md_answer(rendered["md"]).replace("\\", "")
    assert f"**resnet50** on t4 (torch): {KNOB_ADVICE}: {CUDNN} costs most" in answer
    assert (
        f"### {SECTIONS['knobs']}\n\n- **smallcnn** on cpu (torch): turn off {ALGORITHMS}: it costs +7.0% [" in answer
    )


def test_each_model_gets_a_table_of_its_knobs_with_both_costs_its_share_and_the_bitwise_check(
    rendered: dict[str, str],
) -> None:
    page = section(rendered["html"])
    assert '<a href="#knobs">Switches</a>' in rendered["html"]
    cpu, gpu = knob_tables(page)  # the studies in the order of their folders: cpu, t4
    assert list(gpu) == [ALGORITHMS, FILL, CUDNN, BENCHMARK, CUBLAS, INDUCTOR, LAUNCH_BLOCKING]
    assert gpu[INDUCTOR]["Added to the default alone"][1].startswith("not applicable: only a step compiled by")
    assert gpu[LAUNCH_BLOCKING]["Within full determinism"] == ("-", "not in deterministic mode")
    cudnn = gpu[CUDNN]
    assert cudnn["How it is set"] == ("torch.backends.cudnn.deterministic = True", "")
    assert cudnn["Added to the default alone"][0].startswith("1.180x [1.1")
    assert cudnn["Within full determinism"][0].startswith("1.200x [1.1")
    share = math.log(1.2) / math.log(1.3)
    assert cudnn["Share of the overhead"][0].startswith(f"{share:.0%} [")
    assert cudnn["Without it (bitwise)"] == (
        "needed: without it the runs part at step 1, layer relu1 (output), max |diff| 1e-07",
        "",
    )
    assert gpu[ALGORITHMS]["Without it (bitwise)"] == ("still bitwise identical over 3 steps without it", "")
    assert gpu[FILL]["Added to the default alone"] == (
        "-",
        f"alone it has no effect: it works only with {ALGORITHMS}",
    )
    assert gpu[FILL]["Within full determinism"][1] == WITHIN_NOISE
    assert cpu[CUDNN]["Added to the default alone"] == (
        "-",
        "not applicable: cuDNN and cuBLAS run only on a CUDA GPU; on a GPU, switched between steps: both arms in one "
        "process",
    )
    assert cpu[FILL]["Share of the overhead"][0].startswith("0% ["), "a share that rounds to none is not -0%"
    assert cpu[CUDNN]["Within full determinism"] == ("-", "") and cpu[CUDNN]["Without it (bitwise)"] == ("-", "")
    assert '<span class="agree-no">needed: without it' in page and '<span class="agree-yes">still bitwise' in page
    assert '<span class="noise">1.000x [' in page
    assert "Full determinism against the default: 1.300x [" in page and "4 paired repeats" in page
    assert "of the overhead unexplained: knobs interact" in page
    assert "What each switch costs: resnet50 on t4 (torch)" in page, "a chart per model"
    # Each library's helper priced whole on the GPU (Hugging Face's with CUDA's launch blocking); on the CPU the
    # total prices them all.
    assert "transformers.enable_full_determinism(seed): +45.0% [" in page
    assert "(on this device it sets what deterministic mode sets: the total)" in page


def test_a_noise_floor_of_the_same_model_device_and_backend_marks_a_small_cost_as_noise(results: Path) -> None:
    """The calibration's floor (about +/-3%) swallows cuBLAS's 1.02x on t4; the CPU study has no calibration."""
    report = build_report([results])
    cpu, gpu = report.knobs
    assert gpu.floor is not None and gpu.floor > 0.025 and cpu.floor is None
    cublas = next(k for k in gpu.knobs.knobs if k.knob == CUBLAS)
    assert within_noise(cublas.add_one, gpu.floor) and not within_noise(cublas.add_one, None)


def test_markdown_words_the_knob_tables_as_the_html_does(rendered: dict[str, str]) -> None:
    """The HTML's note under a cell (what a knob does, why a cost is missing, within noise) reads as the Markdown
    writes it on one line (``Words.line``)."""
    html = [rows for headers, rows in html_tables(section(rendered["html"])) if headers == list(KNOB_HEADERS)]
    md = [rows for headers, rows in md_tables(md_section(rendered["md"])) if headers == list(KNOB_HEADERS)]
    assert len(html) == len(md) == 2
    for html_rows, md_rows in zip(html, md, strict=True):
        assert len(html_rows) == len(md_rows) == len([k for k in TORCH.knobs if not k.attention_only])
        for row, md_row in zip(html_rows, md_rows, strict=True):
            assert [Words(*cell).line for cell in row] == md_row
    text = md_section(rendered["md"]).replace("\\", "")
    assert "### smallcnn on cpu (torch)" in text and "What to do: turn off torch.use_deterministic_algorithms" in text


def test_json_holds_each_model_of_a_knob_study_and_its_knobs(rendered: dict[str, str]) -> None:
    document = json.loads(rendered["json"])
    cpu, gpu = document["knobs"]
    assert (gpu["model"], gpu["device_label"], gpu["backend"]) == ("resnet50", "t4", "torch")
    assert (cpu["model"], cpu["device_label"], cpu["backend"]) == ("smallcnn", "cpu", "torch")
    assert gpu["total"]["ratio"] == pytest.approx(1.30, abs=0.002) and gpu["total"]["lo"] < 1.3 < gpu["total"]["hi"]
    knobs = {k["knob"]: k for k in gpu["knobs"]}
    for knob in knobs.values():
        assert {"knob", "applies", "reason", "add_one", "leave_one_out", "needed"} <= set(knob)
    assert knobs[CUDNN]["needed"] is True and knobs[ALGORITHMS]["needed"] is False
    assert set(knobs[CUDNN]["add_one"]) >= {"ratio", "lo", "hi"}
    assert knobs[CUDNN]["leave_one_out"]["ratio"] == pytest.approx(1.20, abs=0.002)
    assert knobs[FILL]["add_one"] is None and knobs[FILL]["reason"].startswith("alone it has no effect")
    assert knobs[CUBLAS]["add_one_within_noise"] is True, "read against the calibration's floor"
    not_applicable = {k["knob"]: k for k in cpu["knobs"] if not k["applies"]}
    assert set(not_applicable) == {CUDNN, BENCHMARK, CUBLAS, LAUNCH_BLOCKING, INDUCTOR}
    helpers = {h["call"]: h for h in gpu["helpers"]}
    assert helpers["transformers.enable_full_determinism(seed)"]["cost"]["ratio"] == pytest.approx(1.45, abs=0.003)
    assert [h["priced_by"] for h in cpu["helpers"]] == ["total"] * 3
    assert all(k["needed"] is None and k["leave_one_out"] is None for k in not_applicable.values())
    (row,) = document["models"]
    assert row["model"] == "resnet50" and row["knobs"] == gpu["knobs"]


def test_what_ran_lists_each_knob_study_with_full_determinisms_settings(rendered: dict[str, str]) -> None:
    page, text = rendered["html"], rendered["md"]
    provenance = page[page.index('<section id="provenance">') :]
    assert "<td>knobs</td><td>t4</td><td>torch</td>" in provenance
    assert "<td>knobs</td><td>cpu</td><td>torch</td>" in provenance
    assert f"{KNOBS_SWEEP} smallcnn" in text[text.index(f"## {SECTIONS['provenance']}") :]
    settings = [row for headers, rows in html_tables(provenance) for row in rows if row[0] == ("knobs t4", "")]
    assert [row[1][0] for row in settings] == ["default", "deterministic"]
    assert "determinism was not in effect" not in page, "an arm that leaves a knob off is as it asked"


def test_a_knob_study_alone_is_a_report(results: Path) -> None:
    page = render_report([results / "cpu"], "html", "cdn")
    screen = first_screen(page)
    assert f"<h3>{SECTIONS['knobs']}</h3>" in screen and "No sweep results among the inputs" in screen
    assert screen.index(SECTIONS["knobs"]) < screen.index("No sweep results")
    said = html.unescape(screen)
    full = re.search(r"the knob study's full determinism against the default: smallcnn on cpu \(torch\) (\S+)x", said)
    assert full is not None and float(full[1]) > 1.0
    assert "<code>detprof sweep</code> without <code>--knobs</code> measures the overhead itself" in said
    assert '<section id="knobs">' in page
    document = json.loads(render_report([results / "cpu"], "json"))
    assert document["models"] == [] and [k["model"] for k in document["knobs"]] == ["smallcnn"]


def test_an_arm_whose_knob_did_not_take_effect_is_a_warning(tmp_path: Path) -> None:
    root = write_knobs(tmp_path, "smallcnn", CPU_COSTS, CPU, needed=set())
    store = ResultsStore(root, "knobs")
    record = json.loads((store.dir / "runs" / f"smallcnn--add-{ALGORITHMS}--b--r0.json").read_text())
    record["settings"]["knobs"][ALGORITHMS] = False
    store.write_record(record)
    (warning,) = build_report([root]).warnings
    assert (
        warning == f"cpu (torch): determinism was not in effect as the run asked in smallcnn--add-{ALGORITHMS}--b--r0"
    )


def test_a_knob_that_cannot_matter_on_the_device_reads_back_off_without_a_warning(tmp_path: Path) -> None:
    """A PyTorch study on a CPU whose full-determinism arm asked for cuBLAS's workspace (GPU-only), which a CPU
    reads back off: the arm is as it asked. The same knob off on a GPU would be a warning."""
    for device, costs, warned in ((CPU, CPU_COSTS, False), (synth.DEVICE, GPU_COSTS, True)):
        root = write_knobs(tmp_path / device["label"], "smallcnn", costs, device, needed=set())
        store = ResultsStore(root, "knobs")
        for path in (store.dir / "runs").glob("smallcnn--total--b--r*.json"):
            record = json.loads(path.read_text())
            record["knobs"] = sorted({*record["knobs"], CUBLAS})
            record["settings"]["knobs"][CUBLAS] = False
            store.write_record(record)
        warnings = build_report([root]).warnings
        assert any("determinism was not in effect as the run asked" in w for w in warnings) is warned, warnings


def test_a_report_without_a_knob_study_shows_none_of_it(tmp_path: Path) -> None:
    root = synth.write_sweep(tmp_path, synth.config(list(SWEPT), 3, "torch"), synth.records(SWEPT, backend="torch"))
    page, text = render_report([root], "html", "cdn"), render_report([root], "md")
    for shown in (page, text):
        assert SECTIONS["knobs"] not in shown and KNOB_ADVICE not in shown and "Switches" not in shown
    document = json.loads(render_report([root], "json"))
    assert "knobs" not in document and all("knobs" not in row for row in document["models"])
