"""``detprof gpu-study``: the plan a GPU lease gets, and its whole pipeline run here at tiny sizes.

The study runs as a user runs it, in two windows: the first with a budget that stops its first
part (SIGTERM at the window's end: its completed runs kept) and leaves every other part, the second
``--resume`` finishing everything on PyTorch and JAX. What it wrote is read as ``detprof report``
reads a bundle on another machine.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import synthetic_sweep as synth

from detprof import backends, bundle, cli
from detprof.analysis.overhead import model_overheads
from detprof.errors import ExitCode, InputError
from detprof.gpu_study import study as gpu_study
from detprof.gpu_study.costs import Costs, Measured
from detprof.gpu_study.plan import SCALES, Known, StudyPlan, build_plan
from detprof.gpu_study.state import PartOutcome, StudyState
from detprof.gpu_study.study import (
    Prepared,
    StudyRequest,
    failed_in_one_process,
    gpu_checks,
    knob_model,
    learned_costs,
    measured_costs,
    note_pairing,
    pairing_lines,
    prepare,
    windows_of,
)
from detprof.gpu_study.window import StudyWindow
from detprof.models import own, registry
from detprof.reports.command import render_report
from detprof.store import ResultsStore

Capture = pytest.CaptureFixture[str]
TINY = ["gpu-study", "--scale", "tiny", "--backends", "torch,jax"]
pytestmark = pytest.mark.timeout(480)
"""The first test to ask for ``study`` runs the tiny study's two windows in its setup: 220-280 s beside the suite's
other worker, near the suite's 300 s."""
FIRST_WINDOW_S = 52
"""A window whose parts get 2 s: 52 less the 30 s kept for the report and bundle and the 20 s grace a stopped part
gets, so its first part is stopped, whatever this machine's speed."""


H100_STUDY = Path(__file__).resolve().parents[1] / "reference" / "h100-2026-11-28" / "gpu-study.zip"
"""The bundle ``make gpu-study`` brought back from an H100 in two windows."""


def plan_of(state: StudyState) -> StudyPlan:
    return build_plan(SCALES[state.scale], state.backends, 600.0, Costs(), on_gpu=False, known=state.known())


def detprof(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "detprof.cli", *map(str, args)]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=1200, check=False)


def test_the_dry_run_for_an_h100_puts_what_only_a_gpu_answers_in_its_first_window(
    capsys: Capture, tmp_path: Path
) -> None:
    printed = dry_run_text(capsys, tmp_path, "jax,torch")
    lines = {line.split()[0]: line for line in printed.splitlines() if line.startswith("  ") and "not run:" not in line}
    # torchvision's and timm's models are planned where both are installed (a GPU image), not with a CPU PyTorch.
    assert "  torch-overhead-libraries     not run: torchvision is not installed: pip install torchvision; " in printed
    first_window = [
        "jax-pairing-in-process",
        "jax-pairing-processes",
        "jax-pairing-shared",
        "torch-pairing-in-process",
        "torch-pairing-processes",
        "torch-pairing-shared",
        "jax-stability-smallcnn-first",
        "torch-stability-smallcnn-first",
        "jax-verify-first",
        "torch-verify-first",
        "jax-knobs-first",
        "torch-knobs-first",
        "jax-overhead-flax",
    ]
    names = list(lines)
    assert names[: len(first_window)] == first_window  # the value first: nothing else comes before them
    later = names[len(first_window) :]
    # Then the native PyTorch models people train (issue: your PyTorch model), a knob study of a Flax GPT pricing
    # each of XLA's switches, then the paper's zoo.
    assert later[:6] == [
        "torch-overhead-native",
        "jax-knobs-flax",
        "jax-overhead-first",
        "torch-overhead-first",
        "jax-overhead-rest",
        "torch-overhead-rest",
    ]
    assert (
        "--backend torch --models hf_resnet50_small,hf_vit_small,hf_gpt2_small,hf_llama_small "
        in (lines["torch-overhead-native"])
    )
    # JAX users' own kind of model, the registry's Flax NNX models, close the first window.
    assert "--backend jax --models flax_resnet_small,flax_gpt_small " in lines["jax-overhead-flax"]
    assert "--models flax_gpt_small " in lines["jax-knobs-flax"] and "--knobs all " in lines["jax-knobs-flax"]
    assert {"jax-knobs", "torch-knobs-1", "jax-stability-gpt_tiny", "jax-verify-1", "torch-verify"} <= set(later)
    # The pairing check: the same sweep with both modes in one process and with a process per mode.
    for route in ("in-process", "processes"):
        assert "--models mediumcnn_k5,gpt_small " in lines[f"jax-pairing-{route}"]
        assert f"--pairing {route} " in lines[f"jax-pairing-{route}"]
        assert "--models mediumcnn_k3 " in lines[f"torch-pairing-{route}"]
    assert "window 1 " in lines["jax-pairing-in-process"] and "window 1 " in lines["torch-pairing-processes"]
    # The repeats check: the in-process sweep again, every repeat of a model in one process.
    assert "--pairing in-process --shared-repeats " in lines["torch-pairing-shared"]
    assert "window 1 " in lines["torch-pairing-shared"]
    assert "torch: every repeat of a model in one process, until its repeats check answers" in printed
    # The overhead parts measure what the check did not, as the check finds valid (one process until it answers).
    assert "--models mediumcnn_k1,mediumcnn_k3,mediumcnn_k7 " in lines["jax-overhead-first"]
    assert "--models mediumcnn_k1,mediumcnn_k5,mediumcnn_k7,gpt_small " in lines["torch-overhead-first"]
    assert "--pairing in-process --shared-repeats " in lines["torch-overhead-first"]
    assert "torch: in one process, until its pairing check answers" in printed
    # The first window's knob studies: few steps, the switches of the mode that can matter on a GPU.
    assert "--steps 3 --warmup 2 " in lines["torch-knobs-first"] and "--steps 10" not in lines["torch-knobs-first"]
    assert "--knobs torch.use_deterministic_algorithms,torch.cudnn_deterministic " in lines["torch-knobs-first"]
    # Expected seconds from what the H100 measured, as it was paired there; scaled, and saying so, where not.
    expected = {name: float(line.split()[1]) for name, line in lines.items()}
    assert "(measured on NVIDIA H100 80GB HBM3, 2026-11-28)" in lines["torch-pairing-processes"]
    assert expected["torch-pairing-processes"] == pytest.approx(4 + 2 * 29.2, abs=0.6)
    assert "scaled to one process" in lines["torch-pairing-in-process"]
    assert expected["torch-pairing-in-process"] == pytest.approx(4 + 2 * 29.2 / 1.5, abs=0.6)
    # gpt_small failed there in one process: estimated from PyTorch's gpt_small (a process per mode), and saying so.
    assert (
        "for 1 of 2, else estimated from a measured model like it: gpt_small as measured on torch)"
        in (lines["jax-pairing-in-process"])
    )
    assert expected["jax-pairing-in-process"] == pytest.approx(4 + 2 * (13.0 + 31.5 / 1.5), abs=0.6)
    # A re-run repeat: its measured steps and 3 s, until the study measures one.
    assert "a re-run repeat as its measured steps and 3 s" in lines["torch-pairing-shared"]
    assert expected["torch-pairing-shared"] == pytest.approx(4 + 29.2 / 1.5 + 1.372 + 3, abs=0.6)
    windows = [line for line in printed.splitlines() if line.startswith("window ")]
    assert windows[0].startswith("window 1: 8 parts, ")
    assert re.search(r"; measured steps \d+\.\d% of the \d+ s of the 6 parts whose steps a GPU measured", windows[0])
    unknown = "; its share in measured steps not known (no GPU measured the steps of its parts)"
    assert all(
        "whose steps a GPU measured (theirs, or a model's like theirs)" in line or unknown in line for line in windows
    )
    assert any(line.endswith(unknown) for line in windows)  # verify: no GPU timed its steps
    assert f"{len(windows)} windows" in printed.splitlines()[-1]


def test_verify_is_planned_with_a_modes_runs_side_by_side_where_they_run_so() -> None:
    """A mode's two verify runs side by side take one run's time: on a GPU PyTorch's deterministic runs (picked by
    heuristics, not timed), three runs in turn for each model, JAX's four; a knob study's checks and default mode
    have the device to themselves; on a CPU both modes run side by side, two in turn."""
    from detprof.gpu_study.plan import COMMAND_START_S
    from detprof.verify.run import VerifyArm, replicas_side_by_side

    full, default = VerifyArm("deterministic", "deterministic"), VerifyArm("default", "default")
    check = VerifyArm("without-torch.cudnn_benchmark", "deterministic", ("torch.use_deterministic_algorithms",))
    assert replicas_side_by_side([full], backends.TORCH, on_gpu=True)
    assert not any(replicas_side_by_side([arm], backends.TORCH, on_gpu=True) for arm in (default, check))
    assert not any(replicas_side_by_side([full], b, on_gpu=True) for b in (backends.JAX, backends.TENSORFLOW))
    assert all(replicas_side_by_side([arm], b, on_gpu=False) for arm in (full, default, check) for b in backends.NAMES)
    costs = measured_costs("h100")
    for on_gpu, in_turn in ((True, {"torch": 3, "jax": 4}), (False, {"torch": 2, "jax": 2})):
        plan = build_plan(SCALES["gpu"], ["jax", "torch"], 3600.0, costs, on_gpu=on_gpu)
        for backend, runs in in_turn.items():
            (part,) = (p for p in plan.parts if p.name == f"{backend}-verify-first")
            each = [costs.verify_run(backend, model).seconds for model in part.models]
            expected = COMMAND_START_S + runs * (sum(each) + costs.worker_start(backend).seconds)
            assert part.estimate_s == pytest.approx(expected, abs=0.6), (backend, on_gpu)


def test_torchvisions_and_timms_models_are_swept_as_a_user_names_them_where_both_are_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for package in ("torchvision", "timm"):  # what the plan asks of them: that they are installed
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    plan = build_plan(SCALES["gpu"], ["jax", "torch"], 600.0, measured_costs("NVIDIA H200"), on_gpu=True)
    names = [part.name for part in plan.parts]
    assert "torch-overhead-libraries" not in plan.not_run
    assert names.index("torch-overhead-libraries") == names.index("torch-overhead-native") + 1
    (part,) = (p for p in plan.parts if p.name == "torch-overhead-libraries")
    assert part.models == ("torchvision.models:convnext_tiny", "timm.models.efficientnet:efficientnet_b0")
    assert part.argv("out")[:4] == ["sweep", "--backend", "torch", "--models"]
    assert "--input-shape 3x224x224 " in " ".join(part.options) and "--pairing in-process" in " ".join(part.options)
    # Each costs what the registry model of its size measured, and says so.
    resnet50 = measured_costs("NVIDIA H200").repeat("torch", "resnet50", "in_process")
    convnext = measured_costs("NVIDIA H200").repeat("torch", "torchvision.models:convnext_tiny", "in_process")
    assert convnext.seconds == resnet50.seconds
    assert convnext.like == ("torchvision.models:convnext_tiny as resnet50 on torch (its size)",)
    # A stand-in no GPU measured is itself estimated, and both say so.
    efficientnet = measured_costs("NVIDIA H200").repeat("torch", part.models[1], "in_process")
    assert efficientnet.like == (
        "timm.models.efficientnet:efficientnet_b0 as efficientnetb0 on torch (its size)",
        "efficientnetb0 as resnet50 on torch (its family, keras-applications)",
    )
    # Split over windows too short for both, each part cites the links of its own model only, all of them.
    narrow = build_plan(SCALES["gpu"], ["torch"], 120.0, measured_costs("NVIDIA H200"), on_gpu=True)
    halves = [p for p in narrow.parts if p.name.startswith("torch-overhead-libraries-")]
    assert [half.estimate.like for half in halves] == [convnext.like, efficientnet.like]
    # Their labels are no registry model's, so that a study's rows of one model never hold another's.
    assert not {own.parse(model).label for model in part.models} & registry.BUILT_IN.keys()
    # The knob study takes the costliest model the registry sizes: a library's takes its images from its part.
    for name, model, ratio in (("torch-overhead-first", "mediumcnn_k1", 1.1), (part.name, "convnext_tiny", 3.0)):
        records = synth.records({model: [ratio, ratio]}, backend="torch")
        synth.write_sweep(tmp_path / name, synth.config([model], 2, backend="torch"), records)
    assert knob_model(plan, tmp_path, "torch") == "mediumcnn_k1"
    (tmp_path / "timm" / "__init__.py").unlink()
    (tmp_path / "timm").rmdir()
    plan = build_plan(SCALES["gpu"], ["torch"], 600.0, Costs(), on_gpu=True)
    assert plan.not_run["torch-overhead-libraries"] == "timm is not installed: pip install timm"


def test_a_part_longer_than_any_window_is_split_so_that_each_window_ends_with_finished_parts() -> None:
    plan = build_plan(SCALES["gpu"], ["jax"], 600.0, measured_costs("h100"), on_gpu=True)
    verify = [part for part in plan.parts if part.kind == "verify" and not part.first_window]
    assert [part.name for part in verify] == ["jax-verify-1", "jax-verify-2"]
    assert all(part.estimate_s <= plan.window_s for part in verify)
    asked = tuple(m for m in SCALES["gpu"].models if m not in SCALES["gpu"].verify_first)
    assert tuple(m for part in verify for m in part.models) == asked
    whole = build_plan(SCALES["gpu"], ["jax"], 3600.0, measured_costs("h100"), on_gpu=True)
    assert [part.name for part in whole.parts if part.kind == "verify"] == ["jax-verify-first", "jax-verify"]
    # A knob study is split by its knobs, each part pricing its own against full determinism (here a process per
    # repeat: the repeats check disagreed).
    known = Known(knob_models={"torch": "gpt_small"}, shared={"torch": False})
    knobs = [
        part
        for part in build_plan(SCALES["gpu"], ["torch"], 600.0, measured_costs("h100"), on_gpu=True, known=known).parts
        if part.kind == "knobs" and not part.first_window
    ]
    assert len(knobs) > 1 and [part.name for part in knobs] == [f"torch-knobs-{n}" for n in range(1, len(knobs) + 1)]
    assert all(part.estimate_s <= plan.window_s and part.models == ("gpt_small",) for part in knobs)
    priced = [knob for part in knobs for knob in (part.knobs or "").split(",")]
    torch = backends.get("torch")
    # Every switch can matter on a GPU (but Inductor's, which the study's eager steps do not run); the libraries'
    # helpers come last, a part of their own.
    switches = [knob.name for knob in torch.knobs if knob.compiled_only is None]
    assert priced == switches + [helper.key for helper in torch.helpers]


def test_a_folder_holding_a_bundle_beside_its_readme_reports_as_the_bundle(capsys: Capture) -> None:
    folder = H100_STUDY.parent
    assert cli.main(["report", str(folder), "--format", "json", "-o", "-"]) == ExitCode.OK
    read = json.loads(capsys.readouterr().out)
    assert read["sources"] == [str(folder)]
    # What the bundle holds (the README's table): PyTorch's GPT, JAX's medium CNN.
    swept = {(m["backend"], m["model"]): m["overhead"]["kernel"]["ratio"] for m in read["models"] if m["verdict"]}
    assert round(swept["torch", "gpt_small"], 2) == 1.07 and round(swept["jax", "mediumcnn_k1"], 2) == 2.99


def test_a_plan_of_one_window_bounds_the_repeats_its_overhead_parts_add_for_precision() -> None:
    plan = build_plan(SCALES["gpu"], ["jax"], 1800.0, Costs(), on_gpu=True)
    first = next(part for part in plan.parts if part.name == "jax-overhead-first")
    budget = first.options[first.options.index("--budget") + 1]
    assert budget == f"{round(1800 * 0.55 / 2 - first.estimate_s)}s"
    assert plan.not_run == {}


def test_the_plan_learns_each_cost_from_what_its_own_windows_measured(tmp_path: Path) -> None:
    state = StudyState("gpu", ["jax"])

    def measured(name: str, fields: Callable[[dict[str, Any]], dict[str, Any]]) -> Costs:
        """The costs learned once part ``name`` swept mediumcnn_k5 twice, each record's ``fields`` as given."""
        records = synth.records({"mediumcnn_k5": [2.17, 2.18]}, tracer="jax", backend="jax")
        for record in records:
            record.update(fields(record))
        synth.write_sweep(tmp_path / name, synth.config(["mediumcnn_k5"], 2), records)
        state.parts[name] = PartOutcome("done", 20.0, 90.0, 0, 1)
        return learned_costs(measured_costs("h100"), SCALES["gpu"].family_repeat_s, tmp_path, state)

    costs = measured(
        "jax-pairing-in-process",
        lambda r: {"duration_s": 6.0, "pairing": "in_process", "started_at": f"t{r['repeat']}"},
    )
    learned = costs.repeat("jax", "mediumcnn_k5", "in_process")
    assert (learned.seconds, learned.source) == (6.0, "measured in this study")
    assert costs.repeat("jax", "mediumcnn_k5", "processes").seconds == pytest.approx(9.0)
    shipped = costs.repeat("jax", "mediumcnn_k3", "in_process")
    assert (shipped.seconds, shipped.source) == (11.2, "measured on NVIDIA H100 80GB HBM3, 2026-11-28")
    # A repeat that re-ran its process's steps (--shared-repeats) is learned apart from one that built them.
    costs = measured(
        "jax-pairing-shared",
        lambda r: {
            "duration_s": 1.5 if r["repeat"] > 0 else 6.5,
            "pairing": "in_process",
            "started_at": f"t{r['repeat']}",
            "steps_reused": r["repeat"] > 0,
        },
    )
    three = costs.repeats("jax", "mediumcnn_k5", "in_process", 3, shared=True)
    assert three.seconds == pytest.approx(6.5 + 2 * 1.5) and "a re-run repeat measured in this study" in three.source
    # Where it measured a model both ways (the pairing check), a process per mode is scaled by what it measured on
    # that backend, not by the estimate.
    costs = measured(
        "jax-pairing-processes",
        lambda r: {"duration_s": 5.4, "pairing": "processes", "started_at": f"{r['mode']}{r['repeat']}"},
    )
    assert costs.apart_factor == {"jax": pytest.approx(10.8 / 6.25)}  # over both sweeps that built in one process
    scaled = costs.repeat("jax", "mediumcnn_k3", "processes")
    assert scaled.seconds == pytest.approx(11.2 * 10.8 / 6.25)
    assert scaled.source.endswith("scaled to a process per mode (1.73x, as this study's pairing check measured)")
    assert costs.repeat("torch", "mediumcnn_k3", "in_process").source.endswith("scaled to one process")


def test_a_model_no_gpu_measured_is_estimated_from_a_measured_model_like_it_and_says_which() -> None:
    h100 = measured_costs("h100")
    # Its family on its backend: of the Keras applications JAX ran there (24.9, 32.5, 40.4, 103.1 s), the median.
    efficientnet = h100.repeat("jax", "efficientnetb0", "in_process")
    assert efficientnet.seconds == 40.4 and efficientnet.steps_s == 0.431
    assert efficientnet.like == ("efficientnetb0 as mobilenet on jax (its family, keras-applications)",)
    assert efficientnet.source == "estimated from a measured model like it"
    # The model itself on another backend (JAX's gpt_small failed in one process there), scaled to how it is paired.
    gpt = h100.repeat("jax", "gpt_small", "in_process")
    assert (gpt.seconds, gpt.steps_s, gpt.like) == (
        pytest.approx(31.5 / 1.5),
        2.248,
        ("gpt_small as measured on torch",),
    )
    # With its steps known, a re-run repeat is its steps and the rest, not a whole repeat again.
    assert h100.repeats("jax", "gpt_small", "in_process", 2, shared=True).seconds == pytest.approx(21.0 + 2.248 + 3.0)
    # Its family on another backend, then the family built most like it.
    vit = h100.repeat("torch", "hf_vit_small", "in_process")
    assert (vit.seconds, vit.like) == (20.5, ("hf_vit_small as vit_small on jax (its family, vit)",))
    llama = h100.repeat("torch", "hf_llama_small", "in_process")
    assert llama.like == ("hf_llama_small as gpt_small on torch (a gpt model: no llama model was measured)",)
    # Its family on its own backend comes before the model itself elsewhere.
    tiny = Measured(10.0, 1.0, "in_process", "on a GPU")
    mixed = Costs({("jax", "gpt_tiny"): tiny, ("torch", "gpt_small"): Measured(30.0, 2.0, "processes", "on a GPU")})
    assert mixed.repeat("jax", "gpt_small", "in_process").like == ("gpt_small as gpt_tiny on jax (its family, gpt)",)
    # Nothing like it measured: the family's guess, its steps not known, and saying so.
    guesses = Costs(family_repeat_s={"gpt": 30.0, "keras-applications": 45.0})
    guessed = guesses.repeat("jax", "gpt_small", "in_process")
    assert (guessed.seconds, guessed.steps_s, guessed.like) == (30.0, 0.0, ())
    assert guessed.source == "estimated for a gpt model"
    # A library's model whose stand-in is itself a guess says so, not that a measured model stood in.
    library = guesses.repeat("torch", "torchvision.models:convnext_tiny", "in_process")
    assert (library.seconds, library.source) == (45.0, "estimated for a keras-applications model")
    assert library.like == ("torchvision.models:convnext_tiny as resnet50 on torch (its size)",)
    # A sum cites each model estimated, once.
    plan = build_plan(SCALES["gpu"], ["jax"], 600.0, h100, on_gpu=True)
    flax = next(part for part in plan.parts if part.name == "jax-overhead-flax")
    assert flax.estimated_from.endswith(
        ": flax_resnet_small as mobilenet on jax (a keras-applications model: no resnet model was measured), "
        "flax_gpt_small as gpt_small on torch (its family, gpt)"
    )


def test_later_parts_pair_the_modes_as_the_pairing_check_found() -> None:
    agreed = build_plan(
        SCALES["gpu"], ["torch"], 600.0, Costs(), on_gpu=True, known=Known(routes={"torch": "in_process"})
    )
    apart = build_plan(
        SCALES["gpu"], ["torch"], 600.0, Costs(), on_gpu=True, known=Known(routes={"torch": "processes"})
    )
    for plan, route in ((agreed, "in-process"), (apart, "processes")):
        later = [p for p in plan.parts if p.kind == "overhead" and not p.first_window]
        assert later and all(f"--pairing {route}" in " ".join(p.argv("f")) for p in later)
    # Their repeats share a process until the repeats check answers, and after it only where it agreed.
    sharing = [p for p in agreed.parts if p.kind == "overhead" and not p.first_window]
    assert all("--shared-repeats" in p.argv("f") for p in sharing)
    # PyTorch's knob studies follow the check too: where it agreed, the comparisons whose arms start alike share a
    # process, and only those whose arms differ in cuBLAS's workspace (which a process takes when it starts) take a
    # process per arm (``sweep.knobs.knob_settings``), priced so; where it disagreed, every arm a process.
    # A part that prices only a switch a GPU process takes at its start (CUDA's launch blocking) has no comparison
    # whose arms share one: a process per arm. The libraries' helpers are a part of their own.
    for plan, route in ((agreed, "in-process"), (apart, "processes")):
        knobs = {p.knobs: " ".join(p.argv("f")) for p in plan.parts if p.kind == "knobs"}
        alone = "torch.cuda_launch_blocking"
        assert knobs and all(f"--pairing {'processes' if k == alone else route}" in v for k, v in knobs.items())
        assert route == "in-process" or not any("--shared-repeats" in k for k in knobs.values())
        assert "hf_full_determinism,lightning_deterministic,accelerate_deterministic" in knobs
    knobs_s = [sum(p.estimate_s for p in plan.parts if p.kind == "knobs") for plan in (agreed, apart)]
    assert knobs_s[0] < knobs_s[1], knobs_s
    first = next(p for p in agreed.parts if p.name == "torch-knobs-first")
    assert "1 of 5 comparisons a process per arm" in first.estimate.source
    # JAX's follow the check: where it agreed, one worker per repeat measures every comparison, a start saved each.
    jax = {
        route: next(
            p
            for p in build_plan(SCALES["gpu"], ["jax"], 600.0, Costs(), on_gpu=True, known=known).parts
            if p.name == "jax-knobs-first"
        )
        for route, known in (
            ("in_process", Known(routes={"jax": "in_process"}, shared={"jax": False})),
            ("processes", Known(routes={"jax": "processes"})),
        )
    }
    assert "--pairing in-process" in " ".join(jax["in_process"].argv("f"))
    assert jax["in_process"].estimate_s < jax["processes"].estimate_s / 1.5 + 1
    known = Known(routes={"torch": "in_process"}, shared={"torch": False})
    disagreed = build_plan(SCALES["gpu"], ["torch"], 600.0, Costs(), on_gpu=True, known=known)
    assert not any("--shared-repeats" in p.argv("f") for p in disagreed.parts if p.kind != "pairing")
    assert not any("--shared-repeats" in p.argv("f") for p in apart.parts if p.kind != "pairing")
    one = next(p for p in agreed.parts if p.name == "torch-overhead-first")
    each = next(p for p in apart.parts if p.name == "torch-overhead-first")
    assert each.estimate_s - 4 == pytest.approx(1.5 * (one.estimate_s - 4))


def check_sweeps(out: Path, state: StudyState, suffix: str, k5: dict[str, list[float]], outcome: str = "done") -> None:
    """The checks' three sweeps on JAX (``suffix``: "" for the first, "-more" for a follow-up's), mediumcnn_k5's
    per-repeat ratios each way as given (``k5``, by way) and gpt_small's alike both ways; none where they failed."""
    for way, ratios in k5.items():
        name = f"jax-pairing-{way}{suffix}"
        if outcome == "done":
            gpt = [1.0700, 1.0702, 1.0701][: len(ratios)]
            records = synth.records({"mediumcnn_k5": ratios, "gpt_small": gpt}, tracer="jax", backend="jax")
            config = synth.config(["mediumcnn_k5", "gpt_small"], len(ratios), backend="jax")
            synth.write_sweep(out / name, config, records)
        state.parts[name] = PartOutcome(outcome, 30.0, 30.0, 0 if outcome == "done" else 1, 1)


def test_a_check_that_cannot_tell_is_followed_up_once_and_the_parts_it_decides_wait_for_it(tmp_path: Path) -> None:
    from test_pairing_check import spread

    # Two repeats a way at a 1% spread (an H100's mediumcnn_k3 on JAX) cannot tell a 0.4% difference from 2%.
    state = StudyState("gpu", ["jax"])
    apart, together = spread(2.17, 0.01, 2), spread(2.17 * 1.004, 0.01, 2)
    check_sweeps(tmp_path, state, "", {"in-process": together, "processes": apart, "shared": together})
    plan = build_plan(SCALES["gpu"], ["jax"], 600.0, Costs(), on_gpu=True)
    prepared = Prepared(plan, state, "NVIDIA H200", "GPU-0", on_gpu=True)
    note_pairing(prepared, tmp_path)
    # Neither check answers yet: mediumcnn_k5's follow-up runs first, as many more repeats a way as would answer.
    assert state.pairing == {} and state.shared == {}
    asked = state.follow_ups["jax"]
    assert asked == {"models": ("mediumcnn_k5",), "repeats": 3, "ways": ("in-process", "processes", "shared")}
    prepared = prepared.replanned(tmp_path)
    plan = prepared.plan
    more = ["jax-pairing-in-process-more", "jax-pairing-processes-more", "jax-pairing-shared-more"]
    assert [part.name for part in plan.parts][3:6] == more  # after every backend's first repeats (here one)
    processes = " ".join(plan.parts[4].argv("f"))
    assert "--models mediumcnn_k5 " in processes and "--repeats 3 " in processes and "--pairing processes" in processes
    assert "--shared-repeats" in plan.parts[5].argv("f") and plan.parts[3].first_window
    # The parts that pair the modes as the checks find wait for it, in a window and in the plan's windows alike;
    # stability and verify do not.
    overhead = next(part for part in plan.parts if part.name == "jax-overhead-first")
    assert plan.waiting(overhead) == tuple(more)
    assert plan.waiting(next(part for part in plan.parts if part.kind == "stability")) == ()
    window = StudyWindow(plan, state, tmp_path, lambda line: None, kept_s=plan.budget_s)  # runs nothing
    window._consider(overhead, lambda backend: None)
    assert window.left["jax-overhead-first"] == f"waits for its pairing check's follow-up ({', '.join(more)})"
    placed = windows_of(plan, state)
    assert all(placed["jax-knobs-first"] >= placed[name] for name in more)
    said = "\n".join(pairing_lines(prepared))
    assert (
        "until its pairing check answers (its first repeats could not tell: 3 more repeats a way of mediumcnn_k5"
        in said
    )
    # Its repeats read with the first ones answer both checks; the study asks no second follow-up.
    apart, together = spread(2.17, 0.01, 3), spread(2.17 * 1.004, 0.01, 3)  # the same ratio and spread
    check_sweeps(tmp_path, state, "-more", {"in-process": together, "processes": apart, "shared": together})
    note_pairing(prepared, tmp_path)
    assert state.pairing["jax"]["answer"] == "agrees", state.pairing
    assert "5 and 5 repeats" in state.pairing["jax"]["models"][0]["why"]
    assert state.shared["jax"]["answer"] == "agrees" and list(state.follow_ups) == ["jax"]
    plan = prepared.replanned(tmp_path).plan
    assert plan.waits == {} and plan.routes["jax"] == "in_process"
    assert [part.name for part in plan.parts][3:6] == more  # kept in the plan, its summary and its report
    # A follow-up whose parts failed ends the wait too: the checks answer from the first repeats.
    failed = StudyState("gpu", ["jax"], follow_ups={"jax": asked})
    apart, together = spread(2.17, 0.01, 2), spread(2.17 * 1.004, 0.01, 2)
    check_sweeps(tmp_path / "failed", failed, "", {"in-process": together, "processes": apart, "shared": together})
    check_sweeps(
        tmp_path / "failed", failed, "-more", {way: [] for way in ("in-process", "processes", "shared")}, "failed"
    )
    note_pairing(Prepared(plan, failed, "NVIDIA H200", "GPU-0", on_gpu=True), tmp_path / "failed")
    assert failed.pairing["jax"]["answer"] == "cannot tell" and failed.known().routes == {"jax": "processes"}


def test_a_follow_up_is_asked_only_where_more_repeats_would_answer_within_a_window(tmp_path: Path) -> None:
    from test_pairing_check import spread

    apart, edge = spread(2.17, 0.01, 2), spread(2.17 * 1.02, 0.01, 2)
    ways = {"in-process": edge, "processes": apart, "shared": edge}
    # On the band's edge no number of repeats tells the pairing check; the repeats check (its ratio 1) is followed up
    # alone, in the two ways it compares.
    state = StudyState("gpu", ["jax"])
    check_sweeps(tmp_path / "edge", state, "", ways)
    plan = build_plan(SCALES["gpu"], ["jax"], 600.0, Costs(), on_gpu=True)
    note_pairing(Prepared(plan, state, "NVIDIA H200", "GPU-0", on_gpu=True), tmp_path / "edge")
    assert state.follow_ups["jax"]["ways"] == ("in-process", "shared") and state.pairing == {}
    # Where the follow-up would not fit a window, none: both checks answer from their first repeats, and say how many
    # repeats a way would have answered.
    state = StudyState("gpu", ["jax"])
    check_sweeps(tmp_path / "long", state, "", ways)
    short = build_plan(SCALES["gpu"], ["jax"], 80.0, Costs(), on_gpu=True)  # a 30 s window
    note_pairing(Prepared(short, state, "NVIDIA H200", "GPU-0", on_gpu=True), tmp_path / "long")
    assert state.follow_ups == {} and state.pairing["jax"]["answer"] == state.shared["jax"]["answer"] == "cannot tell"
    k5 = {check: next(m for m in answers["jax"]["models"] if m["model"] == "mediumcnn_k5") for check, answers in
          (("pairing", state.pairing), ("shared", state.shared))}  # fmt: skip
    assert k5["pairing"]["why"].endswith("no number of repeats would answer")
    assert k5["shared"]["why"].endswith("about 4 repeats a way would answer")


def test_models_whose_pairs_failed_in_one_process_are_rerun_a_process_per_mode_after_the_overhead_parts() -> None:
    with bundle.unpacked([H100_STUDY]) as (h100,):
        # On the H100, XLA failed gpt_small's and moe_small's deterministic steps compiled in one process with the
        # default one; the medium CNNs and the Keras applications ran.
        assert failed_in_one_process([h100 / "jax-overhead-first", h100 / "jax-overhead-rest"]) == [
            "gpt_small",
            "moe_small",
        ]
        assert failed_in_one_process([h100 / "torch-overhead-first"]) == []
        # The report's note on them names the same fix, read from the records as every report reads them.
        records = ResultsStore(h100 / "jax-overhead-first", "sweep").records()
        note = model_overheads(records)["gpt_small"].failure_note()
        assert note is not None and note.endswith("(fix: --pairing processes runs each mode in a process of its own)")
    apart = {"torch": [], "jax": ["gpt_small", "moe_small"]}
    plan = build_plan(SCALES["gpu"], ["torch", "jax"], 3600.0, Costs(), on_gpu=True, known=Known(apart_models=apart))
    names = [part.name for part in plan.parts if part.kind == "overhead"]
    assert names == [
        "jax-overhead-flax",
        "torch-overhead-native",
        "torch-overhead-first",
        "jax-overhead-first",
        "torch-overhead-rest",
        "jax-overhead-rest",
        "jax-overhead-apart",
    ]
    rerun = next(part for part in plan.parts if part.name == "jax-overhead-apart")
    assert rerun.models == ("gpt_small", "moe_small")
    assert " --pairing processes " in f" {' '.join(rerun.argv('folder'))} "


def dry_run_text(capsys: Capture, out: Path, names: str = "jax,torch", gpu: str = "h100") -> str:
    code = cli.main(["gpu-study", "--dry-run", "--gpu", gpu, "--backends", names, "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == ExitCode.OK, printed
    return printed


def dry_run(capsys: Capture, out: Path) -> dict[str, str]:
    printed = dry_run_text(capsys, out)
    return {line.split()[0]: line for line in printed.splitlines() if line.startswith("  ")}


def test_the_h100_study_continues_with_the_first_windows_answers_before_the_rest(
    capsys: Capture, tmp_path: Path
) -> None:
    with zipfile.ZipFile(H100_STUDY) as archive:
        (tmp_path / "gpu-study.json").write_bytes(archive.read("gpu-study.json"))
    continued = dry_run(capsys, tmp_path)
    assert "done" in continued["jax-overhead-first"] and "done" in continued["torch-overhead-first"]
    # What it has not measured yet comes next, the pairing check first; the parts it finished are not run again.
    assert list(continued)[:3] == ["jax-pairing-in-process", "jax-pairing-processes", "jax-pairing-shared"]
    assert "window 1 " in continued["jax-pairing-in-process"]
    assert "jax-overhead-rest" in continued and "done" not in continued["jax-overhead-rest"]


def test_a_study_continues_only_on_the_gpu_it_measured(
    capsys: Capture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with zipfile.ZipFile(H100_STUDY) as archive:
        archive.extractall(tmp_path)
    request = StudyRequest(tmp_path, None, None, 600.0, True, None, None)
    h100 = "NVIDIA H100 80GB HBM3"
    # Its state was written before a study named its GPU: the records of its runs name it.
    kept = StudyState.load(tmp_path)
    assert kept is not None and kept.gpu is None
    monkeypatch.setattr(gpu_study, "_gpu_here", lambda: (h100, "GPU-0b9bda97"))
    assert prepare(request, dry_run=False).state.gpu == h100
    for here, said in (
        ("NVIDIA H200", "this machine's GPU is the NVIDIA H200"),
        (None, "this machine has no NVIDIA GPU"),
    ):
        monkeypatch.setattr(gpu_study, "_gpu_here", lambda here=here: (here, here and "GPU-1"))
        code = cli.main(["gpu-study", "--resume", "--out", str(tmp_path)])
        err = capsys.readouterr().err.strip()
        assert code == ExitCode.USAGE and len(err.splitlines()) == 1
        assert f"is a study of the {h100} and {said}: a study measures one GPU" in err and "another --out" in err
    assert StudyState.load(tmp_path) == kept  # a window refused writes nothing


def test_a_gpu_detprof_never_measured_is_planned_from_its_architectures_last_run(
    capsys: Capture, tmp_path: Path
) -> None:
    h100, h200 = measured_costs("h100"), measured_costs("NVIDIA H200")
    assert h200.measured.keys() == h100.measured.keys() and h100.measured
    for key, measured in h200.measured.items():
        assert measured.seconds == h100.measured[key].seconds
        assert measured.source == h100.measured[key].source + ", taken for NVIDIA H200 (both Hopper)"
    assert not measured_costs("a100").measured  # no Ampere board's run was shipped
    planned = dry_run_text(capsys, tmp_path / "h200", "jax,torch", gpu="h200")
    assert "measured on NVIDIA H100 80GB HBM3, 2026-11-28, taken for h200 (both Hopper)" in planned


def test_without_a_gpu_the_study_says_what_to_run_instead_in_one_line(capsys: Capture, tmp_path: Path) -> None:
    code = cli.main(["gpu-study", "--out", str(tmp_path / "study")])
    err = capsys.readouterr().err.strip()
    assert code == ExitCode.USAGE
    assert len(err.splitlines()) == 1
    assert "no NVIDIA GPU here" in err and "--scale tiny" in err and "--dry-run --gpu h100" in err
    code = cli.main(["gpu-study", "--scale", "tiny", "--resume", "--out", str(tmp_path / "none")])
    assert code == ExitCode.USAGE
    assert "holds no GPU study to continue" in capsys.readouterr().err
    code = cli.main(["gpu-study", "--dry-run", "--gpu", "foo", "--out", str(tmp_path / "none")])
    assert code == ExitCode.USAGE and "unknown GPU label 'foo' (known: t4, " in capsys.readouterr().err


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The tiny study in two windows: one stopped by its budget, one resumed to the end."""
    base = tmp_path_factory.mktemp("gpu-study")
    out = base / "study"
    started = time.monotonic()
    first = detprof(*TINY, "--budget", f"{FIRST_WINDOW_S}s", "--out", out, cwd=base)
    first_s = time.monotonic() - started
    after_first = StudyState.load(out)
    second = detprof("gpu-study", "--resume", "--budget", "15m", "--out", out, "--bundle-to", base / "home", cwd=base)
    return {"out": out, "base": base, "first": first, "first_s": first_s, "after_first": after_first, "second": second}


@pytest.mark.slow
def test_a_window_stops_its_running_part_at_its_budget_and_leaves_the_rest_for_resume(study: dict[str, Any]) -> None:
    first, state = study["first"], study["after_first"]
    assert first.returncode == ExitCode.OK, first.stderr
    assert study["first_s"] < FIRST_WINDOW_S + 10  # the process's own start and exit aside, within its budget
    assert state is not None
    stopped = state.parts["torch-pairing-in-process"]
    assert (stopped.status, stopped.exit_code, stopped.window) == ("stopped", ExitCode.TERMINATED, 1)
    window = state.windows[0]
    assert window.ran == ["torch-pairing-in-process"]
    assert window.left["torch-pairing-in-process"] == "stopped at the window's end (its completed runs kept)"
    assert window.left["jax-verify-first"] == "the window's budget was spent"
    assert len(window.left) == 9  # every part of the plan
    assert "parts left" in first.stdout and "--resume" in first.stdout
    assert (study["out"] / "study.zip").exists()  # a window that measured almost nothing still leaves its bundle


@pytest.mark.slow
def test_resume_runs_every_part_on_pytorch_and_jax_and_each_part_answers(study: dict[str, Any]) -> None:
    out, second = study["out"], study["second"]
    assert second.returncode == ExitCode.OK, second.stdout + second.stderr
    assert "every part done" in second.stdout
    state = StudyState.load(out)
    assert state is not None
    assert {name: p.status for name, p in state.parts.items()} == {
        name: "done"
        for name in (
            "torch-pairing-in-process",
            "torch-pairing-processes",
            "torch-pairing-shared",
            "torch-stability-smallcnn-first",
            "jax-stability-smallcnn-first",
            "torch-verify-first",
            "jax-verify-first",
            "torch-knobs-first",
            "jax-overhead-first",
        )
    }
    assert state.parts["torch-pairing-in-process"].window == 2
    assert all(p.seconds > 0 and p.estimate_s > 0 for p in state.parts.values())
    # Each part says where its seconds went: a sweep's in its runs' parts, the rest the command's own.
    swept = state.parts["jax-overhead-first"].time_parts
    assert {"start", "build", "compile", "steps", "tracing", "parsing", "command"} <= swept.keys()
    assert sum(swept.values()) == pytest.approx(state.parts["jax-overhead-first"].seconds, rel=0.05)
    assert state.windows[1].time_parts["steps"] > 0
    trained = state.parts["torch-stability-smallcnn-first"].time_parts  # a stability study's runs say so too
    assert {"start", "build", "steps"} <= trained.keys() and trained["command"] < sum(trained.values()) / 2
    # The pairing check answered for PyTorch, one of three ways, and its later parts follow it.
    answer = state.pairing["torch"]
    assert answer["answer"] in ("agrees", "disagrees", "cannot tell")
    assert [m["model"] for m in answer["models"]] == ["gpt_tiny"]
    # So did the repeats check: gpt_tiny's repeats in one process, its steps built once, against a process each.
    shared = state.shared["torch"]
    assert shared["answer"] in ("agrees", "disagrees", "cannot tell") and "repeats in one process" in str(shared)
    reused = [r["steps_reused"] for r in ResultsStore(out / "torch-pairing-shared", "sweep").records()]
    assert sorted(reused) == [False, False, True, True]
    # The first window's knob study takes the pairing check's model; the full one (none at this scale) the model
    # whose determinism cost most in each backend's overhead parts, noted once they were done (here its one model).
    assert state.knob_models == {"torch": "gpt_tiny", "jax": "gpt_tiny"}
    assert state.apart_models == {"torch": [], "jax": []}
    summary = (out / "summary.md").read_text()
    assert "| jax-knobs-first | | | | | not run: no knob of jax studied can matter on a CPU" in summary
    assert (
        f"- torch: {'in one process' if answer['answer'] == 'agrees' else 'a process per mode'}: the pairing check"
        in summary
    )
    assert "- jax: in one process, no pairing check at this scale" in summary
    assert "- torch: every repeat of a model in one process: the repeats check" in summary or (
        "- torch: a process per repeat: the repeats check" in summary
    )
    assert "Where each window's time went (seconds):" in summary
    assert summary.rstrip().endswith("Done.")
    # The suite sets JAX_COMPILATION_CACHE_DIR (conftest): JAX's verification and stability runs compiled regardless.
    for part, kind in (("jax-verify-first", "verify"), ("jax-stability-smallcnn-first", "stability")):
        compiled = {
            json.loads(p.read_text()).get("compilation_cache") for p in (out / part / kind / "runs").glob("*.json")
        }
        assert compiled == {"off"}, part
    for backend, folder in (("torch", "torch-pairing-in-process"), ("jax", "jax-overhead-first")):
        records = [json.loads(p.read_text()) for p in (out / f"{folder}/sweep/runs").glob("*.json")]
        assert {(r["model"], r["mode"], r["status"]) for r in records} == {
            ("gpt_tiny", mode, "ok") for mode in ("default", "deterministic")
        }
        summary_json = json.loads((out / f"{backend}-stability-smallcnn-first/stability/summary.json").read_text())
        variants = {v["variant"]: v for v in summary_json["variants"]}
        assert set(variants) == {"impl", "control"}
        assert variants["control"]["determinism_check"]["verified"] is True
    # make gpu-check's checks read each part's results: here, on a CPU, they find no GPU kernels.
    prepared = Prepared(plan_of(state), state, "cpu", "GPU-none")
    problems = gpu_checks(prepared, out)
    assert "torch-pairing-in-process: default mode: not every traced run holds GPU kernels" in problems
    assert "jax-stability-smallcnn-first: the study trained on the CPU, not the GPU" in problems
    assert "torch-verify-first: gpt_tiny: verified on the CPU, not the GPU" in problems
    # On a CPU a mode's two verify runs ran side by side, each record says so.
    for part in ("torch-verify-first", "jax-verify-first"):
        assert {r["side_by_side"] for r in ResultsStore(out / part, "verify").records()} == {True}, part
    machine = json.loads((out / "machine" / "window-2.json").read_text())
    assert machine["packages"]["torch"] and machine["packages"]["jax"] and machine["python"]


@pytest.mark.slow
def test_the_bundle_is_within_16_mib_and_reports_as_the_folder_does(study: dict[str, Any], capsys: Capture) -> None:
    out, base = study["out"], study["base"]
    path = base / "home" / "study.zip"
    assert bundle.is_bundle(path)
    assert path.stat().st_size <= bundle.LIMIT_BYTES
    with zipfile.ZipFile(path) as archive:
        names = set(archive.namelist())
        said = json.loads(archive.read(bundle.MARKER))
    assert {"gpu-study.json", "summary.md", "report.html", "machine/window-2.json"} <= names
    assert not any(name.endswith(".zip") for name in names)
    assert said["files"] == len(names) - 1
    assert cli.main(["report", str(path), "--format", "json", "-o", "-"]) == ExitCode.OK
    read, kept = json.loads(capsys.readouterr().out), json.loads(render_report([out], "json"))
    assert read["sources"] == [str(path)]
    for key in ("generated_at", "sources"):
        read.pop(key), kept.pop(key)
    assert read == kept
    assert {m["backend"] for m in read["models"]} == {"torch", "jax"}
    assert {(v["backend"], v["model"]) for v in read["verification"]} == {("torch", "gpt_tiny"), ("jax", "gpt_tiny")}
    assert all(v["deterministic"]["identical"] for v in read["verification"])
    assert [k["backend"] for k in read["knobs"]] == ["torch"]


def test_a_bundle_over_its_limit_leaves_out_the_bulk_smallest_first(tmp_path: Path) -> None:
    folder = tmp_path / "res"
    (folder / "sweep" / "traces").mkdir(parents=True)
    (folder / "sweep" / "runs").mkdir()
    (folder / "sweep" / "runs" / "a.json").write_text("{}")
    rng = __import__("random").Random(0)
    for name, size in (("small.json", 10_000), ("large.json", 200_000)):
        (folder / "sweep" / "traces" / name).write_bytes(rng.randbytes(size))
    packed = bundle.write(folder, tmp_path / "b.zip", limit=120_000)
    assert packed.left_out == ["sweep/traces/large.json"]
    with zipfile.ZipFile(packed.path) as archive:
        assert set(archive.namelist()) == {"sweep/runs/a.json", "sweep/traces/small.json", bundle.MARKER}
    assert not bundle.is_bundle(folder / "sweep" / "runs" / "a.json")


def test_a_bundle_entry_pointing_outside_it_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "evil.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(bundle.MARKER, "{}")
        archive.writestr("../outside.json", "{}")
    with pytest.raises(InputError, match="points outside it"), bundle.unpacked([path]):
        pass
    assert not (tmp_path / "outside.json").exists()
