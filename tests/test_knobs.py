"""``detprof sweep --knobs``: which determinism switch costs what, and which ones a model needs.

First the plan and the reading on records and fingerprints written in the real formats with
chosen values (a knob with a known cost, a check whose runs part at a known step); then the
knobs read back from the frameworks themselves, in a fresh process per arm; then the real study
on PyTorch on this CPU, through the command, the console, the JSON and the HTML report.

No PyTorch CPU op parts two runs without ``use_deterministic_algorithms`` here reliably through
a model's training step except one that races on purpose: ``index_put_`` of repeated indices
without accumulation writes each slot from whichever thread comes last (2,048 slots, 2 million
writes: about two calls in five differ on two cores), and under deterministic algorithms PyTorch
sorts the writes. That layer is the "needed" case.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from detprof import backends
from detprof.analysis.knobs import knob_checks, model_knobs, read_knob_study, within_noise
from detprof.analysis.verification import compare
from detprof.backends.base import NO_ATTENTION
from detprof.cli import main
from detprof.errors import ExitCode, UsageError
from detprof.fingerprints import RunFingerprints
from detprof.reports.command import render_report
from detprof.store import ResultsStore
from detprof.sweep.knobs import comparisons_apart, knob_design, split_knobs
from detprof.sweep.run import check_arms

TORCH = backends.get(backends.TORCH)
ALGORITHMS, FILL = "torch.use_deterministic_algorithms", "torch.fill_uninitialized_memory"
SDPA = "torch.sdpa_math"


def test_the_plan_prices_each_knob_that_can_matter_and_lists_the_others_with_the_reason() -> None:
    cpu = knob_design(TORCH, on_gpu=False, only=None)
    assert [c.name for c in cpu.comparisons] == ["total", f"add:{ALGORITHMS}", f"drop:{ALGORITHMS}", f"drop:{FILL}"]
    assert set(cpu.not_applicable) == {
        "torch.cudnn_deterministic",
        "torch.cudnn_benchmark",
        "torch.cublas_workspace_config",
        LAUNCH_BLOCKING,
        INDUCTOR,
    }
    assert (
        cpu.not_applicable.pop(INDUCTOR) == "only a step compiled by torch.compile (--compile) runs Inductor's kernels"
    )
    assert all("CUDA" in reason for reason in cpu.not_applicable.values())
    # Under --compile, Inductor's deterministic mode is priced both ways, as a switch of deterministic mode.
    compiled = knob_design(TORCH, on_gpu=False, only=None, compiled=True)
    assert {f"add:{INDUCTOR}", f"drop:{INDUCTOR}"} <= {c.name for c in compiled.comparisons}
    assert not any(knob.attention_only for knob in cpu.knobs)  # no model runs attention: its knobs are left out
    # A transformer has attention: its back ends are priced, each added to the default; on a CPU flash and math.
    gpt = knob_design(TORCH, on_gpu=False, only=None, models=("smallcnn", "gpt_tiny"))
    assert [c.name for c in gpt.comparisons][-2:] == ["add:torch.sdpa_math", "add:torch.sdpa_flash"]
    efficient = gpt.not_applicable["torch.sdpa_efficient"]
    assert efficient == (
        "memory-efficient attention runs only on a CUDA GPU; on a GPU, switched between steps: both arms in one process"
    )
    mine = knob_design(TORCH, on_gpu=False, only=("torch.sdpa_math",), models=("net.py:build",))
    assert [c.name for c in mine.comparisons] == ["total", "add:torch.sdpa_math"]  # yours may run attention: named
    assert SDPA not in {k.name for k in knob_design(TORCH, on_gpu=False, only=None, models=("net.py:build",)).knobs}
    cnn = knob_design(TORCH, on_gpu=False, only=(SDPA,), models=("smallcnn",))
    assert cnn.not_applicable == {SDPA: NO_ATTENTION} and len(cnn.comparisons) == 1
    drop_fill = cpu.comparisons[-1]
    assert drop_fill.treated == TORCH.mode_knobs() and drop_fill.reference == TORCH.mode_knobs() - {FILL}
    gpu = knob_design(TORCH, on_gpu=True, only=(FILL, "torch.cudnn_benchmark"))
    assert [c.name for c in gpu.comparisons] == [
        "total",
        f"drop:{FILL}",
        "add:torch.cudnn_benchmark",
        "drop:torch.cudnn_benchmark",
    ]
    assert gpu.dropped() == [FILL, "torch.cudnn_benchmark"] and not gpu.not_applicable
    with pytest.raises(UsageError, match=r"--knobs: torch\.nope is not a knob of torch; its knobs: torch\.use_det"):
        knob_design(TORCH, on_gpu=False, only=("torch.nope",))
    assert split_knobs("all") is None and split_knobs(f" {FILL} ,") == (FILL,)


LAUNCH_BLOCKING = "torch.cuda_launch_blocking"
INDUCTOR = "torch.inductor_deterministic"
HELPERS = ("hf_full_determinism", "lightning_deterministic", "accelerate_deterministic")


def test_each_librarys_helper_is_priced_whole_by_a_comparison_of_its_own_or_of_the_same_switches() -> None:
    """On a CPU every helper sets what deterministic mode sets (the GPU's switches cannot matter): the total prices
    them, and nothing more runs. On a GPU each sets its own switches (Hugging Face's also CUDA_LAUNCH_BLOCKING, which
    a process takes at its start), each a comparison against the default, each verified bitwise; a study of some
    knobs prices no helper."""
    from detprof.sweep.run import check_arms

    cpu = knob_design(TORCH, on_gpu=False, only=None)
    assert cpu.helpers == dict.fromkeys(HELPERS, "total")
    assert not any(c.name.startswith("helper:") for c in cpu.comparisons)
    gpu = knob_design(TORCH, on_gpu=True, only=None)
    assert gpu.helpers == {key: f"helper:{key}" for key in HELPERS}
    by_name = {c.name: c for c in gpu.comparisons}
    hf = by_name["helper:hf_full_determinism"]
    assert hf.reference == frozenset() and hf.treated == TORCH.mode_knobs() | {LAUNCH_BLOCKING}
    assert by_name["helper:accelerate_deterministic"].treated == {ALGORITHMS, FILL, INDUCTOR}
    assert "helper:hf_full_determinism" in comparisons_apart(gpu, on_gpu=True)  # launch blocking: at CUDA's start
    helpers = {arm.helper: arm.knobs for arm in check_arms(gpu) if arm.helper}
    assert helpers == {key: by_name[f"helper:{key}"].knobs("b") for key in HELPERS}
    assert knob_design(TORCH, on_gpu=True, only=(ALGORITHMS,)).helpers == {}


def test_hugging_faces_helper_sets_the_switches_detprof_prices_it_with() -> None:
    """The installed transformers' own enable_full_determinism, read: each switch its knob set names, set as the knob
    sets it (its cuBLAS workspace's other value is said)."""
    import inspect

    import transformers

    source = inspect.getsource(transformers.enable_full_determinism)
    (helper,) = (h for h in TORCH.helpers if h.key == "hf_full_determinism")
    set_as = {
        ALGORITHMS: "torch.use_deterministic_algorithms(True",
        FILL: None,  # PyTorch's default under deterministic algorithms: the helper leaves it on
        INDUCTOR: None,  # use_deterministic_algorithms(True) turns it on
        "torch.cudnn_deterministic": "torch.backends.cudnn.deterministic = True",
        "torch.cudnn_benchmark": "torch.backends.cudnn.benchmark = False",
        "torch.cublas_workspace_config": 'os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":16:8"',
        LAUNCH_BLOCKING: 'os.environ["CUDA_LAUNCH_BLOCKING"] = "1"',
    }
    assert set(set_as) == helper.knobs
    assert all(words in source for words in set_as.values() if words), source
    assert ":16:8" in helper.differs


def test_tensorflow_and_jax_declare_their_knobs_and_which_cannot_matter_on_a_cpu() -> None:
    tensorflow = knob_design(backends.get(backends.TENSORFLOW), on_gpu=False, only=None)
    assert [c.name for c in tensorflow.comparisons] == [
        "total",
        "add:tensorflow.op_determinism",
        "drop:tensorflow.op_determinism",
    ]
    autotune = (
        "cuDNN runs only on a CUDA GPU; on a GPU, a process per arm "
        "(TF_CUDNN_USE_AUTOTUNE is set for the whole process)"
    )
    assert tensorflow.not_applicable == {"tensorflow.cudnn_autotune": autotune}
    jax = knob_design(backends.get(backends.JAX), on_gpu=False, only=None, models=["flax_gpt_tiny"])
    assert [c.name for c in jax.comparisons] == ["total"] and not jax.every
    # On a CPU each of XLA's switches is listed with the route a GPU's study takes it by.
    assert set(jax.not_applicable) == {f"jax.xla_gpu_{s}" for s in XLA_SWITCHES}
    route = "a compile option of each arm's step, both arms in one process, where the pairing check"
    assert all(route in reason and "XLA_FLAGS, a process per arm" in reason for reason in jax.not_applicable.values())


XLA_SWITCHES = (
    "deterministic_ops",
    "exclude_nondeterministic_ops",
    "autotune_level",
    "enable_scatter_determinism_expander",
)


def test_on_a_gpu_each_of_xlas_switches_is_priced_added_alone_and_left_out_of_every_switch_on() -> None:
    jax = backends.get(backends.JAX)
    design = knob_design(jax, on_gpu=True, only=None)
    every = frozenset(f"jax.xla_gpu_{s}" for s in XLA_SWITCHES)
    assert design.full == {"jax.xla_gpu_deterministic_ops"} and design.every == every
    by_name = {c.name: c for c in design.comparisons}
    assert list(by_name)[:2] == ["total", "every"] and by_name["every"].treated == every
    for knob in every:
        assert by_name[f"add:{knob}"].treated == {knob}
        assert (by_name[f"drop:{knob}"].reference, by_name[f"drop:{knob}"].treated) == (every - {knob}, every)
    # The checks: full determinism, every switch on, and every switch on less each one.
    arms = check_arms(design)
    assert [arm.name for arm in arms][:2] == ["deterministic", "every"] and arms[1].every
    assert {arm.without: frozenset(arm.knobs or ()) for arm in arms[2:]} == {k: every - {k} for k in every}
    # A study of one extra switch leaves it out of full determinism with it.
    autotune = knob_design(jax, on_gpu=True, only=("jax.xla_gpu_autotune_level",))
    assert [c.name for c in autotune.comparisons] == [
        "total",
        "every",
        "add:jax.xla_gpu_autotune_level",
        "drop:jax.xla_gpu_autotune_level",
    ]
    assert autotune.comparisons[-1].reference == {"jax.xla_gpu_deterministic_ops"}
    # PyTorch has no extra switch that joins: its leave-one-out stays within full determinism.
    assert not knob_design(TORCH, on_gpu=True, only=None).every


def arm_records(model: str, comparison: str, ratios: list[float]) -> list[dict[str, Any]]:
    """Two runs per repeat: arm a at a drifting time, arm b at ``ratio`` times it."""
    runs = []
    for repeat, ratio in enumerate(ratios):
        base = 1e6 * (1 + 0.05 * repeat)
        for arm, time in (("a", base), ("b", base * ratio)):
            runs.append(
                {
                    "run_id": f"{model}--{comparison}--{arm}--r{repeat}",
                    "model": model,
                    "mode": "deterministic",
                    "arm": arm,
                    "comparison": comparison,
                    "repeat": repeat,
                    "status": "ok",
                    "measures": "both",
                    "step_wall_ns": [time] * 5,
                    "step_kernel_ns": [time / 2] * 5,
                    "kernel_ns_per_step": time / 2,
                    "device": {"label": "cpu"},
                }
            )
    return runs


def fingerprints(folder: Path, parts_at: int | None) -> str:
    """Three steps of one layer; the second replica differs from step ``parts_at`` on."""
    for replica in "ab":
        taken = RunFingerprints()
        for step in range(3):
            taken.begin_step()
            value = np.full((2, 2), float(step), dtype=np.float32)
            if replica == "b" and parts_at is not None and step >= parts_at:
                value = value + 0.5
            taken.add("scatter", "output", [value])
        taken.save(folder / replica)
    return str(folder)


def check_store(root: Path, arms: dict[str, int | None]) -> ResultsStore:
    store = ResultsStore(root, "knob_checks")
    store.open({"models": ["m"]}, "test", resume=False)
    for without, parts_at in arms.items():
        folder = fingerprints(store.dir / "fingerprints" / (without or "full"), parts_at)
        for replica in "ab":
            record = {"run_id": f"m--{without or 'full'}--{replica}", "model": "m", "mode": "deterministic"}
            record |= {"replica": replica, "status": "ok", "fingerprints": str(Path(folder) / replica)}
            arm = {"every": True} if without == "every" else {"without": without} if without else {}
            store.write_record(record | arm)
    return store


def test_each_knob_gets_its_costs_with_intervals_and_the_bitwise_verdict_says_which_is_needed(tmp_path: Path) -> None:
    records = [
        *arm_records("m", "total", [1.30, 1.32, 1.28, 1.31]),
        *arm_records("m", f"add:{ALGORITHMS}", [1.10, 1.11, 1.09, 1.10]),
        *arm_records("m", f"drop:{ALGORITHMS}", [1.09, 1.10, 1.11, 1.10]),
        *arm_records("m", f"drop:{FILL}", [1.19, 1.20, 1.21, 1.20]),
    ]
    checks = knob_checks(check_store(tmp_path, {"": None, ALGORITHMS: 1, FILL: None}))
    manifest = {"backend": "torch", "knobs": [ALGORITHMS, FILL, "torch.cudnn_deterministic"]}
    manifest["not_applicable"] = {"torch.cudnn_deterministic": "cuDNN and cuBLAS run only on a CUDA GPU"}
    (study,) = model_knobs(records, checks, manifest)
    algorithms, fill, cudnn = study.knobs
    assert study.total is not None and study.total.ratio == pytest.approx(1.3025, abs=0.01)
    assert algorithms.add_one.ratio == pytest.approx(1.10, abs=0.005) and algorithms.add_one.ci_low > 1
    assert algorithms.needed is True and "part at step 1, layer scatter (output)" in algorithms.check
    assert fill.add_one is None and fill.reason == f"alone it has no effect: it works only with {ALGORITHMS}"
    assert fill.leave_one_out.ratio == pytest.approx(1.20, abs=0.005)
    assert fill.needed is False and fill.check == "still bitwise identical over 3 steps without it"
    assert not cudnn.applies and cudnn.add_one is None and cudnn.needed is None
    assert study.top() is fill
    share = study.share(fill)
    assert share is not None and share[0] == pytest.approx(math.log(1.20) / math.log(1.3025), abs=0.01)
    assert study.advice().startswith(f"turn off {FILL}: it costs +20.0% [")
    assert study.unexplained() == pytest.approx(1 - math.log(1.10) / math.log(1.3025), abs=0.02)
    parted = knob_checks(check_store(tmp_path / "parted", {"": 0, ALGORITHMS: 1}))
    (broken,) = model_knobs(records, parted, manifest)
    assert broken.knobs[0].needed is None and broken.knobs[0].check.startswith("full determinism itself is not")


def test_within_every_switch_on_each_knob_is_left_out_of_them_all_its_share_and_verdict_read_against_them(
    tmp_path: Path,
) -> None:
    ops, exclude = "jax.xla_gpu_deterministic_ops", "jax.xla_gpu_exclude_nondeterministic_ops"
    records = [
        *arm_records("m", "total", [1.50, 1.52, 1.49, 1.50]),
        *arm_records("m", "every", [2.00, 2.02, 1.99, 2.01]),
        *arm_records("m", f"add:{exclude}", [1.30, 1.31, 1.29, 1.30]),
        *arm_records("m", f"drop:{ops}", [1.20, 1.21, 1.19, 1.20]),
        *arm_records("m", f"drop:{exclude}", [1.05, 1.06, 1.04, 1.05]),
    ]
    # Full determinism parts here, every switch on holds: the verdicts are read against every switch on.
    checks = knob_checks(check_store(tmp_path, {"": 1, "every": None, ops: 1, exclude: None}))
    manifest = {"backend": "jax", "knobs": [ops, exclude], "every": [ops, exclude]}
    (study,) = model_knobs(records, checks, manifest)
    assert study.has_every and study.every is not None and study.every.ratio == pytest.approx(2.005, abs=0.01)
    deterministic_ops, excluded = study.knobs
    assert deterministic_ops.in_full and excluded.in_full
    assert deterministic_ops.needed is True and "part at step 1" in deterministic_ops.check
    assert excluded.needed is False and excluded.check == "still bitwise identical over 3 steps without it"
    share = study.share(deterministic_ops)
    assert share is not None and share[0] == pytest.approx(math.log(1.20) / math.log(2.005), abs=0.01)
    assert study.least_set() == (ops,)
    assert study.advice().startswith(f"{ops} costs most (with every switch on it costs +20.0% [")


def log_means_and_shares(ratios: list[float]) -> tuple[float, float, int]:
    """A comparison's mean log ratio, the variance of that mean and its repeats, from its ratios alone."""
    logs = np.log(ratios)
    return float(logs.mean()), float(logs.var(ddof=1)) / len(logs), len(logs)


def test_each_helper_is_priced_beyond_the_least_set_through_the_comparisons_that_measured_both(tmp_path: Path) -> None:
    """The least set is full determinism less the fill (the runs hold without it): its cost over the default is
    the total's over the fill's saving. A helper priced by the total costs beyond it exactly what the fill saves
    (the total cancels, one measurement); one priced by its own comparison, its cost over the least set's, the
    three comparisons' variances added (Welch-Satterthwaite), as computed here from the ratios alone."""
    from scipy import stats

    total, fill, own = [1.50, 1.56, 1.47, 1.52], [1.10, 1.13, 1.08, 1.11], [1.80, 1.95, 1.70, 1.85, 1.90]
    records = [
        *arm_records("m", "total", total),
        *arm_records("m", f"drop:{FILL}", fill),
        *arm_records("m", f"drop:{ALGORITHMS}", [1.3, 1.32, 1.29, 1.31]),
        *arm_records("m", "helper:hf_full_determinism", own),
    ]
    checks = knob_checks(check_store(tmp_path, {"": None, FILL: None, ALGORITHMS: 2}))
    helpers = {"hf_full_determinism": "helper:hf_full_determinism", "lightning_deterministic": "total"}
    manifest = {"backend": "torch", "knobs": [ALGORITHMS, FILL], "helpers": helpers}
    (study,) = model_knobs(records, checks, manifest)
    assert study.least_set() == (ALGORITHMS,)
    transformers, lightning = study.helpers
    saving = study.knobs[1].leave_one_out
    assert lightning.over_least is not None and saving is not None
    assert (lightning.over_least.ratio, lightning.over_least.ci_low, lightning.over_least.ci_high) == (
        saving.ratio,
        pytest.approx(saving.ci_low),
        pytest.approx(saving.ci_high),
    )
    parts = [log_means_and_shares(r) for r in (own, fill, total)]
    mean = parts[0][0] + parts[1][0] - parts[2][0]
    spread = sum(q for _, q, _ in parts)
    df = spread**2 / sum(q**2 / (n - 1) for _, q, n in parts)
    half = stats.t.ppf(0.975, df) * math.sqrt(spread)
    priced = transformers.over_least
    assert priced is not None
    assert priced.ratio == pytest.approx(math.exp(mean))
    assert (priced.ci_low, priced.ci_high) == (
        pytest.approx(math.exp(mean - half)),
        pytest.approx(math.exp(mean + half)),
    )
    line = transformers.line()
    assert f"beyond the least set that holds bitwise ({ALGORITHMS})" in line
    assert f"{math.exp(mean) - 1:+.1%} [" in line
    # Where every switch could go, the least set is the default: a helper costs beyond it what it costs over it.
    both_go = knob_checks(check_store(tmp_path / "both", {"": None, FILL: None, ALGORITHMS: None}))
    (loose,) = model_knobs(records, both_go, manifest)
    assert loose.least_set() == () and loose.least_set_cost() == ([], [])
    for helper in loose.helpers:
        assert helper.cost is not None and helper.over_least is not None
        assert (helper.over_least.ratio, helper.over_least.ci_low) == (helper.cost.ratio, helper.cost.ci_low)
        assert "beyond the least set that holds bitwise (none of the switches)" in helper.line()
    # Some switches could go, others not, and those that could were never left off together: not priced (cuDNN's
    # switch as a GPU's study has it).
    cudnn = "torch.cudnn_deterministic"
    dropped = arm_records("m", f"drop:{cudnn}", [1.01, 1.02, 1.0, 1.01])
    mixed = knob_checks(check_store(tmp_path / "mixed", {"": None, FILL: None, cudnn: None, ALGORITHMS: 2}))
    (partial,) = model_knobs([*records, *dropped], mixed, manifest | {"knobs": [ALGORITHMS, FILL, cudnn]})
    assert partial.least_set() == (ALGORITHMS,) and partial.least_set_cost() is None
    never = "not priced (the switches that could go were never left off together)"
    assert all(never in h.line() for h in partial.helpers)


def test_a_cost_within_noise_says_so(tmp_path: Path) -> None:
    records = [
        *arm_records("m", "total", [1.01, 0.99, 1.0]),
        *arm_records("m", f"add:{ALGORITHMS}", [1.01, 0.98, 1.01]),
    ]
    (study,) = model_knobs(records, {}, {"backend": "torch", "knobs": [ALGORITHMS]})
    (algorithms,) = study.knobs
    assert within_noise(algorithms.add_one, None) is True and study.share(algorithms) is None
    assert study.advice().startswith("every knob's cost is within noise")


def test_a_bad_knob_or_a_study_with_nothing_to_run_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["sweep", "--knobs", "torch.nope", "--backend", "torch", "--models", "smallcnn", "--out", str(tmp_path)]
    )
    assert code == ExitCode.USAGE and "is not a knob of torch" in capsys.readouterr().err
    code = main(["sweep", "--knobs", "--models", "flax_gpt_tiny", "--out", str(tmp_path)])  # a Flax model: on JAX
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE and "no knob of jax studied can matter on cpu (jax.xla_gpu_deterministic_ops, " in err
    assert "on a GPU, a compile option of each arm's step, both arms in one process" in err and err.count("\n") == 1
    code = main(["sweep", "--knobs", "--models", "flax_gpt_tiny", "--dry-run", "--out", str(tmp_path)])
    assert code == ExitCode.USAGE and capsys.readouterr().err == err  # its dry run plans nothing it would refuse
    code = main(["sweep", "--knobs", "--calibrate", "--out", str(tmp_path)])
    assert code == ExitCode.USAGE and "--knobs is a study of its own: not with --calibrate" in capsys.readouterr().err


def test_the_dry_run_shows_every_arm_with_its_knobs_and_the_checks(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["sweep", "--knobs", "--backend", "torch", "--models", "smallcnn", "--repeats", "1", "--dry-run"]
    assert main([*args, "--out", "/nonexistent/out"]) == ExitCode.OK
    out = capsys.readouterr().out
    assert out.startswith("detprof knobs --dry-run: the plan, in order; nothing runs and nothing is written")
    assert "in-process: one worker per repeat runs both modes" in out
    assert out.count("one worker on core 0, both arms of each pair: ") == 1
    assert f"default (no knob) + deterministic ({ALGORITHMS}) in turn" in out
    assert f"Comparisons (arm b against arm a): total, add:{ALGORITHMS}, drop:{ALGORITHMS}, drop:{FILL}" in out
    # the knobs that cannot matter here are grouped by why, cuDNN's two switches in one line
    assert "Not run: torch.cudnn_deterministic, torch.cudnn_benchmark: cuDNN and cuBLAS run only on a CUDA GPU" in out
    assert (
        f"without {ALGORITHMS}, {FILL}, into /nonexistent/out/knobs/knob_checks (each replica's runs in one process)."
        in out
    )
    assert not Path("/nonexistent/out").exists()


def test_a_knob_a_gpu_process_takes_at_its_start_keeps_only_the_comparisons_it_parts_in_a_process_per_arm(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """On a GPU the total's arms differ in cuBLAS's workspace, which a process takes when it starts: that comparison
    takes a process per arm, while the others share one per repeat, started with the workspace where both their arms
    set it (leave-one-out) and without it where neither does (add-one); the checks' arms all set it: one process."""
    args = ["sweep", "--knobs", f"{ALGORITHMS},torch.cudnn_deterministic", "--backend", "torch", "--models", "smallcnn"]
    args += ["--gpu", "h100", "--force", "--pairing", "in-process", "--repeats", "2", "--dry-run"]
    assert main([*args, "--out", "/nonexistent/out"]) == ExitCode.OK
    out = capsys.readouterr().out
    said = " ".join(out.split())
    apart = "a process per arm for the comparisons whose arms differ in a knob a process takes when it starts (total)"
    assert apart in said
    assert "then total: a process per arm, one after the other" in out
    sessions = [line for line in out.splitlines() if line.startswith("  repeat ")]
    assert [line.split(":")[0] for line in sessions] == ["  repeat 0", "  repeat 0", "  repeat 1", "  repeat 1"]
    assert sum("started with torch.cublas_workspace_config" in line for line in sessions) == 2
    for repeat in (0, 1):
        assert f"smallcnn--add-{ALGORITHMS}--a--r{repeat} + smallcnn--add-{ALGORITHMS}--b--r{repeat}" in said or (
            f"smallcnn--add-{ALGORITHMS}--b--r{repeat} + smallcnn--add-{ALGORITHMS}--a--r{repeat}" in said
        )
        assert f". smallcnn--total--a--r{repeat}: default (no knob)" in out
    assert "(each replica's runs in one process)" in out


@pytest.mark.parametrize(("steps", "checked"), [([], 20), (["--steps", "5"], 5), (["--steps", "150"], 20)])
def test_the_checks_train_the_steps_the_arms_measured_up_to_verifys_default(
    steps: list[str], checked: int, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["sweep", "--knobs", "--backend", "torch", "--models", "smallcnn", *steps, "--dry-run"]
    assert main([*args, "--out", "/nonexistent/out"]) == ExitCode.OK
    assert f"Then verified bitwise ({checked} steps, two runs each)" in capsys.readouterr().out


RACING = '''
import os

import keras
import torch

WRITES, SLOTS = 200_000, 2048
INDEX = torch.randint(0, SLOTS, (WRITES,), generator=torch.Generator().manual_seed(0))


class RacingScatter(keras.layers.Layer):
    """Values written into 2,048 slots at repeated indices without accumulation: which write lands is up to the
    threads (``index_put`` races) unless deterministic algorithms sort the writes. A loaded 2-core machine may run
    the writes without a race: without the switch the layer also adds an unseeded draw, as a GPU's racing writes
    would, so that what is tested is the verdict, not this machine's thread scheduling."""

    def call(self, x):
        flat = torch.flatten(x)
        values = flat.repeat(WRITES // flat.numel() + 1)[:WRITES]
        slots = torch.zeros(SLOTS, dtype=x.dtype, device=x.device).index_put((INDEX.to(x.device),), values)
        if not torch.are_deterministic_algorithms_enabled():
            unseeded = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
            slots = slots + 1e-3 * torch.rand(SLOTS, generator=unseeded).to(x.device, x.dtype)
        return x + slots.mean()


def racing(input_shape, classes):
    inputs = keras.Input(input_shape)
    x = keras.layers.Conv2D(4, 3, padding="same", name="conv")(inputs)
    x = RacingScatter(name="scatter")(x)
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    return keras.Model(inputs, keras.layers.Dense(classes, name="logits")(x))
'''
SMALL = ["--steps", "3", "--warmup", "1", "--no-report"]


def knob_study(tmp_path: Path, backend: str, model: str, *options: str) -> tuple[int, list[dict[str, Any]]]:
    """A real knob study on this CPU, small (``options``: ``--knobs``' value first, if any); its exit code and
    records."""
    args = [
        "sweep",
        "--knobs",
        *options,
        "--backend",
        backend,
        "--models",
        model,
        *SMALL,
        "--out",
        str(tmp_path / "out"),
    ]
    return main(args), list(ResultsStore(tmp_path / "out", "knobs").records())


def assert_read_back(records: list[dict[str, Any]], studied: list[str]) -> None:
    """Each knob studied is in effect in exactly the runs whose arm set it (with the knob it needs, where it needs
    one), as the framework reports it."""
    assert records and all(r["status"] == "ok" for r in records)
    for record in records:
        backend = backends.get(record["backend"])
        for name in studied:
            needs = backend.knob(name).needs
            expected = name in record["knobs"] and (needs is None or needs in record["knobs"])
            assert record["settings"]["knobs"][name] is expected, (record["run_id"], name)


@pytest.mark.slow
def test_a_comparison_whose_arms_start_apart_runs_a_process_per_arm_beside_those_sharing_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cuBLAS's workspace as a GPU has it (a knob that can matter, which a process takes when it starts), in a real
    knob study on this CPU, where its variable is read back and changes nothing else: the total's arms differ in it,
    each in a process of its own; leaving out deterministic algorithms keeps it in both arms, which share a process
    started with it; adding them keeps it out of both, which share a process started without it."""
    torch_backend = type(backends.get(backends.TORCH))
    cublas = "torch.cublas_workspace_config"
    as_on_a_gpu = tuple(replace(k, gpu_only=None) if k.name == cublas else k for k in torch_backend.knobs)
    monkeypatch.setattr(torch_backend, "knobs", as_on_a_gpu)
    code, records = knob_study(
        tmp_path, backends.TORCH, "smallcnn", ALGORITHMS, "--pairing", "in-process", "--repeats", "1"
    )
    assert code == ExitCode.OK
    assert_read_back(records, [ALGORITHMS, cublas])
    by_id = {r["run_id"].removeprefix("smallcnn--").removesuffix("--r0"): r for r in records}
    assert set(by_id) == {f"{c}--{s}" for c in ("total", f"add-{ALGORITHMS}", f"drop-{ALGORITHMS}") for s in "ab"}
    total = [by_id["total--a"], by_id["total--b"]]
    assert [r.get("pairing") for r in total] == [None, None] and total[0]["log"] != total[1]["log"]
    for comparison, started_with in ((f"add-{ALGORITHMS}", False), (f"drop-{ALGORITHMS}", True)):
        pair = [by_id[f"{comparison}--{side}"] for side in "ab"]
        assert [r["pairing"] for r in pair] == ["in_process", "in_process"] and pair[0]["log"] == pair[1]["log"]
        assert [r["settings"]["knobs"][cublas] for r in pair] == [started_with, started_with]
    manifest = ResultsStore(tmp_path / "out", "knobs").manifest()
    assert manifest["config"]["apart"] == ["total"] and manifest["config"]["pairing"] == "in_process"


@pytest.mark.slow
def test_the_needed_verdict_on_a_layer_that_races_without_deterministic_algorithms(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "nets.py").write_text(RACING)
    model = f"{tmp_path / 'nets.py'}:racing"
    code, records = knob_study(tmp_path, backends.TORCH, model, "--input-shape", "16x16x3", "--repeats", "1")
    out = capfd.readouterr()
    assert code == ExitCode.OK, out.err[-2000:]
    assert_read_back(records, [ALGORITHMS, FILL])
    assert {r["comparison"] for r in records} == {"total", f"add:{ALGORITHMS}", f"drop:{ALGORITHMS}", f"drop:{FILL}"}
    listed = "torch.cudnn_deterministic, torch.cudnn_benchmark: not applicable: cuDNN and cuBLAS run only on a"
    table = out.out[: out.out.index(listed)]
    assert ALGORITHMS in table and "torch.cudnn_benchmark" not in table  # only the knobs that can matter are rows
    assert "needed: without it the runs part at step" in out.out and "layer scatter (output)" in out.out
    (study,) = read_knob_study(ResultsStore(tmp_path / "out", "knobs"))
    algorithms, fill, *gpu_only = study.knobs
    assert algorithms.needed is True and algorithms.add_one is not None and algorithms.leave_one_out is not None
    assert fill.needed is False and fill.leave_one_out is not None and fill.add_one is None
    assert [k.applies for k in gpu_only] == [False, False, False, False, False]
    # Every library's helper sets here what deterministic mode sets: the total prices each, bitwise identical; the
    # least set that holds is deterministic algorithms alone.
    assert study.least_set() == (ALGORITHMS,)
    assert [(h.priced_by, h.identical, h.cost) for h in study.helpers] == [("total", True, study.total)] * 3
    assert f"the least set that holds bitwise here: {ALGORITHMS} (the runs part without each)" in out.out
    advice = study.advice()
    assert advice.startswith(f"{ALGORITHMS} costs most") or f"{ALGORITHMS} is needed: without it" in advice
    assert "needed: without it the runs part at step" in advice and "nan" not in advice
    page = render_report([tmp_path / "out"], "html", "cdn")
    assert "Which switch costs what" in page and "needed: without it the runs part at step" in page
    assert "transformers.enable_full_determinism(seed): " in page
    (entry,) = json.loads(render_report([tmp_path / "out"], "json"))["knobs"]
    assert entry["least_set"] == [ALGORITHMS] and [h["priced_by"] for h in entry["helpers"]] == ["total"] * 3
    # Beyond that least set a helper costs what the fill saves: one repeat gives it no interval.
    assert all(h["least_set"] == [ALGORITHMS] and h["over_least_set"] is None for h in entry["helpers"])
    assert "not priced (a comparison it is taken through has no interval: use --repeats 3 or more)" in out.out
    by_knob = {k["knob"]: k for k in entry["knobs"]}
    assert by_knob[ALGORITHMS]["needed"] is True and by_knob[FILL]["needed"] is False
    assert set(by_knob[ALGORITHMS]["add_one"]) >= {"ratio", "lo", "hi"} and by_knob[FILL]["add_one"] is None
    assert by_knob["torch.cudnn_deterministic"]["applies"] is False
    # One process measured every comparison (the first pair's records carry its start), and each replica's checks
    # ran in one process too, each arm under its own switches: without the fill (the racing writes sorted again
    # after the arm without deterministic algorithms ran) the runs are those of full determinism, bit for bit.
    assert sorted(r["run_id"] for r in records if "start" in r["time_parts"]) == [
        "racing--total--a--r0",
        "racing--total--b--r0",
    ]
    checks = ResultsStore(tmp_path / "out" / "knobs", "knob_checks")
    logs = {(r["replica"], r["log"]) for r in checks.records()}
    assert logs == {(replica, f"logs/racing--deterministic--{replica}+more.log") for replica in "ab"}
    assert "verified bitwise (each replica's runs in one process)" in " ".join((out.out + out.err).split())
    for record in checks.records():
        assert record["settings"]["knobs"][ALGORITHMS] is (record.get("without") != ALGORITHMS), record["run_id"]
        assert record["settings"]["knobs"][FILL] is (record.get("without") is None), record["run_id"]
    full, without_fill = (
        RunFingerprints.load(checks.dir / "fingerprints" / f"racing--{arm}--a")
        for arm in ("deterministic", f"without-{FILL}")
    )
    assert compare("deterministic", full, without_fill).identical


@pytest.mark.slow
def test_op_determinism_is_priced_on_tensorflow_and_cudnn_autotune_listed_as_not_applicable(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code, records = knob_study(tmp_path, backends.TENSORFLOW, "smallcnn", "--input-size", "16", "--repeats", "1")
    out = capfd.readouterr()
    assert code == ExitCode.OK, out.err[-2000:]
    assert_read_back(records, ["tensorflow.op_determinism", "tensorflow.cudnn_autotune"])
    (study,) = read_knob_study(ResultsStore(tmp_path / "out", "knobs"))
    op_determinism, autotune = study.knobs
    assert op_determinism.add_one is not None and op_determinism.leave_one_out is not None
    assert op_determinism.needed is False and op_determinism.check == "still bitwise identical over 3 steps without it"
    assert not autotune.applies and autotune.reason.startswith("cuDNN runs only on a CUDA GPU; on a GPU, a process per")
    assert "not applicable: cuDNN runs only on a CUDA GPU" in out.out


def test_knobs_that_save_nothing_told_from_noise_but_cost_added_alone_say_both(tmp_path: Path) -> None:
    """Leaving either knob off saves nothing told from noise, yet one costs plainly added alone: the line says both,
    not that every cost is within noise."""
    records = [
        *arm_records("m", "total", [1.18, 1.2, 1.17, 1.19]),
        *arm_records("m", f"add:{ALGORITHMS}", [1.17, 1.19, 1.16, 1.18]),
        *arm_records("m", f"drop:{ALGORITHMS}", [1.0, 1.1, 0.9, 1.02]),
        *arm_records("m", f"drop:{FILL}", [0.98, 1.05, 0.95, 1.01]),
    ]
    (study,) = model_knobs(records, {}, {"backend": "torch", "knobs": [ALGORITHMS, FILL]})
    advice = study.advice()
    assert advice.startswith("leaving any one knob off saves nothing told from noise (the most, "), advice
    assert f"though added alone to the default they cost: {ALGORITHMS} +17." in advice, advice
    # one that makes the step faster added alone is not said to cost
    faster = [
        *arm_records("m", "total", [1.18, 1.2, 1.17, 1.19]),
        *arm_records("m", f"add:{ALGORITHMS}", [0.98, 0.99, 0.985, 0.99]),
        *arm_records("m", f"drop:{ALGORITHMS}", [1.0, 1.1, 0.9, 1.02]),
        *arm_records("m", f"drop:{FILL}", [0.98, 1.05, 0.95, 1.01]),
    ]
    (study,) = model_knobs(faster, {}, {"backend": "torch", "knobs": [ALGORITHMS, FILL]})
    assert f"though added alone to the default they change the step's time by: {ALGORITHMS} -1." in study.advice()


@pytest.mark.parametrize(
    ("alone", "says"),
    [
        ([1.0, 1.01, 0.99, 1.0], "No knob added alone explains any of the overhead: it comes from knobs together"),
        ([1.1, 1.11, 1.09, 1.1], "The knobs added alone leave 50% of the overhead unexplained: knobs interact."),
        ([1.3, 1.31, 1.29, 1.3], "The knobs added alone add up to 38% more than the overhead: knobs interact."),
    ],
)
def test_what_the_knobs_added_alone_leave_unexplained_is_said_in_words(alone: list[float], says: str) -> None:
    """A knob that works only with another (the fill, under deterministic algorithms) costs nothing alone: the whole
    overhead is theirs together, said so rather than as more than 100% left unexplained."""
    records = [*arm_records("m", "total", [1.21, 1.2, 1.22, 1.21]), *arm_records("m", f"add:{ALGORITHMS}", alone)]
    (study,) = model_knobs(records, {}, {"backend": "torch", "knobs": [ALGORITHMS, FILL]})
    assert (study.unexplained_line() or "").startswith(says)
