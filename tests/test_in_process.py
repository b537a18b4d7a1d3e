"""Both modes in one process, a step of each in turn: PyTorch flips its switches between steps, JAX compiles its
step once per mode, TensorFlow traces a function per mode and sets its switch before each step
(``Backend.arm_steps``, ``worker.run_arms``).

Real sweeps on each backend that can, at a tiny size: the records of a pair share one process and one trace, each
arm's steps are marked apart in it and read apart from it, and each arm reports what it had in effect. An op that
refuses determinism fails its own arm only. The step split is checked on a table built here. TensorFlow's sweep is
the run's shared one (``shared_studies``), read in ``test_sweep_e2e``.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import sys
import textwrap
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from conftest import SUITE_XLA_FLAGS
from in_process_pairs import check_pairs
from scipy import stats

from detprof import backends, locks
from detprof.backends.base import step_range_name
from detprof.cli import main
from detprof.determinism import DeterminismSettings
from detprof.profiler.devices import usable_core_ids
from detprof.profiler.measured_runs import PlannedRun, Workload, in_process_sessions, mode_pairs
from detprof.profiler.worker import build_key
from detprof.profiler.worker_spec import MIN_SIZED_STEPS, WorkerSpec, sized_steps, typical_step_ns
from detprof.reports.command import render_report
from detprof.reports.report_data import SECTIONS
from detprof.store import ResultsStore
from detprof.traces.kernel_table import KernelTable
from detprof.traces.step_split import kernel_ns_by_step, within_steps

TINY = ["--gpu", "cpu", "--input-size", "16", "--batch-size", "8", "--steps", "4", "--warmup", "2"]
STEPS = 4


def _table(ranges: list[tuple[str, int, int]], kernels: list[tuple[int, int]]) -> KernelTable:
    nvtx = pd.DataFrame(ranges, columns=["text", "start_ns", "end_ns"])
    frame = pd.DataFrame({"name": [f"k{i}" for i in range(len(kernels))], "start_ns": [s for s, _ in kernels]})
    frame["dur_ns"] = [d for _, d in kernels]
    return KernelTable("synthetic", "kineto-cpu-json", kernels=frame, nvtx=nvtx, cpu_ops=True)


def test_each_arms_steps_are_read_apart_from_one_trace() -> None:
    arms = ("deterministic", "default")
    starts = [(step_range_name(i, arm), 100 + 100 * (2 * i + k)) for i in range(3) for k, arm in enumerate(arms)]
    ranges = [(name, start, start + 90) for name, start in starts]
    kernels = [(110 + 100 * j, 10 + j) for j in range(6)] + [(5, 7)]  # the last: before any step (settling)
    table = _table([*ranges, ("layer:conv1", 0, 700)], kernels)
    assert kernel_ns_by_step(table, "deterministic") == [10, 12, 14]
    assert kernel_ns_by_step(table, "default") == [11, 13, 15]
    assert kernel_ns_by_step(table) == [10, 11, 12, 13, 14, 15]
    default = within_steps(table, "default")
    assert default is not None and default.kernels["name"].tolist() == ["k1", "k3", "k5"]
    assert default.kernels["step"].tolist() == [0, 1, 2]
    assert default.nvtx is not None and sorted(default.nvtx["text"]) == [
        "layer:conv1",
        "step 0 default",
        "step 1 default",
        "step 2 default",
    ]
    assert kernel_ns_by_step(default) == [11, 13, 15]
    assert within_steps(table, "a") is None


def test_steps_are_sized_to_the_machine_within_their_bounds() -> None:
    assert sized_steps(80, None, 40_000_000) == 80
    assert sized_steps(80, 3.0, 40_000_000) == 75
    assert sized_steps(80, 3.0, 10_000_000) == 80
    assert sized_steps(80, 3.0, 2_000_000_000) == MIN_SIZED_STEPS
    assert sized_steps(3, 3.0, 2_000_000_000) == 3
    assert sized_steps(80, 3.0, 0) == 80
    assert typical_step_ns([900, 50, 40, 42, 41]) == 41
    assert typical_step_ns([]) == 0


def _log_ratios(records: Iterable[Mapping[str, Any]], base: str, other: str) -> list[float]:
    """Each repeat's ln(other / base) in kernel time, read off the records' per-step kernel times as a pair whose
    steps ran in turn pairs them: step i with step i, the median of their log ratios (``base`` and ``other``: modes,
    or a calibration's arms)."""
    steps = {(r["repeat"], r.get("arm") or r["mode"]): r["step_kernel_ns"] for r in records}
    repeats = sorted({repeat for repeat, _ in steps})
    pairs = [zip(steps[repeat, base], steps[repeat, other], strict=True) for repeat in repeats]
    return [statistics.median(math.log(b / a) for a, b in pair) for pair in pairs]


def _t(n: int, confidence: float = 0.95) -> float:
    return float(stats.t.ppf(0.5 + confidence / 2, n - 1))


def _printed_kernel_interval(printed: str, model: str) -> tuple[float, float, float]:
    """The kernel-time cell of ``model``'s row in the overhead table a sweep prints: ratio [low, high]."""
    found = re.search(rf"{model}\s+│\s+(\S+)x \[(\S+), (\S+)\]", printed)
    assert found is not None, printed
    return float(found[1]), float(found[2]), float(found[3])


def _records(out: Path) -> dict[str, dict[str, Any]]:
    return {r["run_id"]: r for r in ResultsStore(out, "sweep").records()}


def _sweep(tmp_path: Path, backend: str, *more: str, models: str = "smallcnn") -> dict[str, dict[str, Any]]:
    out = tmp_path / "res"
    args = ["sweep", "--backend", backend, "--models", models, "--repeats", "2", "--precision", "off", *TINY]
    assert main([*args, *more, "--no-report", "--out", str(out)]) == 0
    return _records(out)


@pytest.mark.slow
def test_torch_runs_both_modes_in_one_process_and_an_op_that_refuses_determinism_fails_its_own_arm_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each repeat's process runs the small CNN's pair, then the pair of a model whose op has no deterministic
    implementation: that model's deterministic arm alone is unsupported, its default arm and the CNN's two ok. The
    parent reads each pair's trace only once the worker has ended, as on a loaded machine, where the worker ran its
    next pair while the parent read the last one's: the worker's end then is no reason to measure that pair again.

    The refusal is a finding, on the report's first screen: Keras re-raises PyTorch's error under a first line of
    its own, and the record must still name PyTorch's op, the layer that called it and what to do."""
    _read_traces_once_the_worker_ended(monkeypatch, tmp_path / "res")
    source = tmp_path / "refusing.py"
    source.write_text(textwrap.dedent(REFUSING))
    records = _sweep(tmp_path, "torch", models=f"smallcnn,{source}:unpooling")
    check_pairs(tmp_path / "res", records, "smallcnn", STEPS)
    det, default = records["smallcnn--deterministic--r0"], records["smallcnn--default--r0"]
    assert det["settings"]["knobs"]["torch.use_deterministic_algorithms"] is True
    assert default["settings"]["knobs"]["torch.use_deterministic_algorithms"] is False
    assert "the arms in turn in one process" in det["train_step"]
    advice = backends.get(backends.TORCH).nondeterministic_op_advice
    for repeat in (0, 1):
        det, default = records[f"unpooling--deterministic--r{repeat}"], records[f"unpooling--default--r{repeat}"]
        assert det["status"] == "unsupported" and "finding" not in default
        finding = det["finding"]
        assert (finding["op"], finding["layer"], finding["advice"]) == (REFUSED_OP, "unpool", advice)
        assert finding["message"].startswith(f"RuntimeError: {REFUSED_OP} does not have a deterministic")
        assert det["reason"] == finding["message"], "the framework's words, not Keras's wrapper line"
        assert default["status"] == "ok" and len(default["step_kernel_ns"]) == STEPS
        assert default["trace_file"] == f"traces/{'+'.join(_pair_name(repeat))}.pt.trace.json"
        assert default["command"] == records[f"smallcnn--default--r{repeat}"]["command"]  # one process
    line = f"{REFUSED_OP} in layer unpool has no deterministic implementation: {advice}"
    text = render_report([tmp_path / "res"], "md")
    answer = text[text.index(f"## {SECTIONS['answer']}") : text.index(f"## {SECTIONS['overhead']}")]
    assert f"**unpooling** on cpu (torch): {line}" in answer.replace("\\_", "_")
    page = render_report([tmp_path / "res"], "html", "cdn")
    screen = page[page.index('<section id="answer">') : page.index('<section id="overhead">')]
    assert f"<strong>unpooling on cpu (torch)</strong>: {line}" in screen


@pytest.mark.slow
def test_jax_compiles_its_step_once_per_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each pair's process compiles the training step twice, once per mode with that mode's compile options, and
    never again while the steps run: XLA's own log of its compilations (``JAX_LOG_COMPILES``) counts them."""
    monkeypatch.setenv("JAX_LOG_COMPILES", "1")
    records = _sweep(tmp_path, "jax")
    check_pairs(tmp_path / "res", records, "smallcnn", STEPS)
    for repeat in (0, 1):
        log = (tmp_path / "res" / "sweep" / records[f"smallcnn--default--r{repeat}"]["log"]).read_text()
        assert len(re.findall(r"Finished XLA compilation of jit\(train_step\) ", log)) == 2, log[-3000:]
    det, default = records["smallcnn--deterministic--r0"], records["smallcnn--default--r0"]
    assert det["settings"]["compiler_options"] == {"xla_gpu_deterministic_ops": True}
    assert default["settings"]["compiler_options"] == {}
    # Traced with XLA_FLAGS as its own process would have it, for Python code that reads it: the suite's own flag
    # (conftest) kept as a user's, the deterministic arm's added.
    assert det["settings"]["xla_flags"] == f"{SUITE_XLA_FLAGS} --xla_gpu_deterministic_ops=true"
    assert default["settings"]["xla_flags"] == SUITE_XLA_FLAGS


@pytest.mark.slow
def test_shared_repeats_build_and_compile_each_model_once_for_all_its_repeats(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--shared-repeats``: one process runs every repeat of each model in turn; a model's first repeat compiles its
    step once per mode, and its later repeats re-run those steps, each repeat still a pair of its own with its own
    trace and the modes' order alternating, so the overhead reads as from a process per repeat. Its one session
    pins its steps to a core no other detprof claimed: here the first is claimed as another measurement's (in a
    folder of the test's own, which the suite's other measurements do not claim in)."""
    monkeypatch.setenv("JAX_LOG_COMPILES", "1")
    monkeypatch.setattr(locks, "CORE_CLAIMS", tmp_path / "cores")
    cores = sorted(usable_core_ids())
    with locks.claimed_core(cores):
        records = _sweep(tmp_path, "jax", "--shared-repeats", models="smallcnn,mediumcnn_k3")
    assert {rec["cpu_core"] for rec in records.values()} == {cores[1 % len(cores)]}
    out = tmp_path / "res"
    for model in ("smallcnn", "mediumcnn_k3"):
        check_pairs(out, records, model, STEPS)
        for repeat, reused in ((0, False), (1, True)):
            pair = [records[f"{model}--{mode}--r{repeat}"] for mode in ("deterministic", "default")]
            assert [rec["steps_reused"] for rec in pair] == [reused, reused]
            log = (out / "sweep" / pair[0]["log"]).read_text()
            compiled = len(re.findall(r"Finished XLA compilation of jit\(train_step\) ", log))
            assert compiled == (0 if reused else 2), log[-3000:]
            assert pair[0]["time_parts"].get("build", 0) < (0.5 if reused else math.inf)
    assert len({rec["command"] for rec in records.values()}) == 1
    assert ResultsStore(out, "sweep").manifest()["config"]["shared_repeats"] is True


def test_a_process_runs_the_pairs_it_starts_alike_for_and_shared_repeats_each_models_repeats_in_turn() -> None:
    """A worker runs the pairs of a repeat whose process starts with the same knobs, whatever else their arms set
    (a knob study's comparisons, as a sweep's models); with shared repeats, every repeat of a model (of a model's
    arm settings) after the other, whatever order the plan has them in; and a pair's build is the same for every
    repeat of its model whichever arm steps first, and another for any other model or setting."""

    def run(model: str, mode: str, repeat: int, knobs: tuple[str, ...] | None = None) -> PlannedRun:
        return PlannedRun(
            f"{model}-{mode}-{repeat}", model, mode, repeat, Workload("m:f", {"model": model}), {}, knobs=knobs
        )

    plan = [run(model, mode, r) for r in range(3) for model in ("a", "b") for mode in ("deterministic", "default")]
    plan += [run("a", mode, r, ("x",)) for r in range(2) for mode in ("deterministic", "default")]
    pairs = mode_pairs(plan)

    def sessions(starts_with: Callable[[Any], frozenset[str]], shared: bool) -> list[list[tuple[str, int, bool]]]:
        grouped = in_process_sessions(pairs, starts_with, shared_repeats=shared)
        return [[(p[0].label, p[0].repeat, p[0].knobs is not None) for p in session] for session in grouped]

    alike, apart = (lambda pair: frozenset()), (lambda pair: frozenset({"x"} & set(pair[0].knobs or ())))
    a, b, x = ("a", "b", "a")
    assert sessions(alike, shared=False) == [
        [(a, 0, False), (b, 0, False), (x, 0, True)],
        [(a, 1, False), (b, 1, False), (x, 1, True)],
        [(a, 2, False), (b, 2, False)],
    ]
    assert sessions(apart, shared=False) == [
        [(a, 0, False), (b, 0, False)],
        [(a, 1, False), (b, 1, False)],
        [(a, 2, False), (b, 2, False)],
        [(x, 0, True)],
        [(x, 1, True)],
    ]
    each_a, each_b, each_x = (
        [(m, r, knobs) for r in range(n)] for m, n, knobs in ((a, 3, False), (b, 3, False), (x, 2, True))
    )
    assert sessions(alike, shared=True) == [each_a + each_b + each_x]
    assert sessions(apart, shared=True) == [each_a + each_b, each_x]

    def spec(model: str, arm: str, repeat: int) -> WorkerSpec:
        paths = {name: f"{model}-{arm}-{repeat}.{name}" for name in ("trace_path", "result_path", "log_path")}
        mode = "deterministic" if arm == "deterministic" else "default"
        settings = DeterminismSettings(mode, backend="torch")
        common = {"warmup": 2, "wall_steps": 4, "traced_steps": 4, "settling_steps": 1, "tracer": "torch"}
        return WorkerSpec(
            f"{model}-{arm}-{repeat}", "m:f", settings, **common, **paths, params={"model": model}, arm=arm
        )

    first = [spec("a", "deterministic", 0), spec("a", "default", 0)]
    again = [spec("a", "default", 1), spec("a", "deterministic", 1)]
    assert build_key(first) == build_key(again)
    assert build_key(first) != build_key([spec("b", "deterministic", 0), spec("b", "default", 0)])
    assert build_key(first) != build_key([replace(first[0], warmup=3), first[1]])


def test_shared_repeats_need_a_process_that_runs_both_modes(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["sweep", "--backend", "torch", "--models", "smallcnn", "--pairing", "processes", "--shared-repeats"]
    assert main([*args, *TINY, "--dry-run"]) == 2
    assert "--shared-repeats" in capsys.readouterr().err.strip().splitlines()[-1]


def test_jax_compiles_the_arm_with_most_knobs_first_whichever_steps_first() -> None:
    from detprof.backends.jax import compile_order

    det = frozenset({"jax.xla_gpu_deterministic_ops"})
    assert compile_order([frozenset(), det]) == [1, 0]
    assert compile_order([det, frozenset()]) == [0, 1]
    assert compile_order([det, det | {"jax.xla_gpu_autotune_level"}, frozenset()]) == [1, 0, 2]


REFUSING = '''
import keras
import torch


class Unpool(keras.layers.Layer):
    """Max pooling and back: PyTorch has no deterministic max_unpool2d, on any device."""

    def call(self, x):
        nchw = x.permute(0, 3, 1, 2)
        pooled, indices = torch.nn.functional.max_pool2d(nchw, 2, return_indices=True)
        restored = torch.nn.functional.max_unpool2d(pooled, indices, 2, output_size=nchw.shape[-2:])
        return restored.permute(0, 2, 3, 1)

    def compute_output_shape(self, input_shape):
        return input_shape


def unpooling(input_shape, classes):
    inputs = keras.Input(input_shape)
    x = keras.layers.Conv2D(4, 3, padding="same", name="conv")(inputs)
    x = Unpool(name="unpool")(x)
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    return keras.Model(inputs, keras.layers.Dense(classes, name="logits")(x))
'''
REFUSED_OP = "max_unpooling2d_forward_out"
"""The op as PyTorch's refusal names it (``F.max_unpool2d`` runs it)."""


@pytest.mark.slow
def test_an_aa_calibration_in_one_process_contains_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "res"
    args = ["sweep", "--calibrate", "--backend", "torch", "--models", "smallcnn", "--repeats", "4"]
    assert main([*args, "--precision", "off", *TINY, "--steps", "10", "--out", str(out)]) == 0
    records = list(ResultsStore(out, "calibration").records())
    assert {r["arm"] for r in records} == {"a", "b"} and {r["pairing"] for r in records} == {"in_process"}
    assert all(r["settings"]["op_determinism"] is True for r in records)
    printed = capsys.readouterr().out
    # The printed interval is the paired t-interval of the arms' log ratios, read here off the records.
    logs = _log_ratios(records, "a", "b")
    mean, sem = statistics.mean(logs), statistics.stdev(logs) / math.sqrt(len(logs))
    expected = (math.exp(mean), math.exp(mean - _t(len(logs)) * sem), math.exp(mean + _t(len(logs)) * sem))
    assert _printed_kernel_interval(printed, "smallcnn") == pytest.approx(expected, abs=5e-4), (printed, logs)
    # Its 95% interval misses 1 in one A/A of twenty by design (the more so on a loaded machine); at 99.9% a miss is
    # a pairing that favours one arm.
    half = _t(len(logs), 0.999) * sem
    assert mean - half <= 0.0 <= mean + half, (printed, logs)


@pytest.mark.slow
def test_a_sweep_adds_repeats_until_its_budget_is_spent_and_says_what_is_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unreachable precision: repeats are added while the next fits the budget, and the summary names the rest.
    The repeats Stein's rule asks for, which each added repeat names, and the interval printed are worked out here
    from the records' per-step kernel times: the first n with t(1) * s2 / sqrt(n) <= ln(1.0001), s2 the first two
    repeats' spread; the interval's half-width t(1) * s2 / sqrt(n) with the n repeats taken, around the mean of all
    their log ratios."""
    monkeypatch.setenv("COLUMNS", "160")  # the table's rows whole, each on one line
    out, budget_s = tmp_path / "res", 8  # one added repeat is all this needs to see (a repeat takes 1-4 s here)
    args = ["sweep", "--backend", "torch", "--models", "smallcnn", "--repeats", "2", *TINY, "--steps", "3"]
    done = _cli([*args, "--precision", "0.01%", "--budget", f"{budget_s}s", "--no-report", "--out", str(out)])
    assert done.returncode == 0, done.stderr[-2000:]
    records = list(ResultsStore(out, "sweep").records())
    repeats = {r["repeat"] for r in records}
    assert len(repeats) > 2 and len(records) == 2 * len(repeats)
    assert all(r["first_stage"] == 2 and r["precision"] == 0.0001 for r in records)
    # The budget is the added repeats' time, after the first stage: each added while the next fitted.
    first_stage = max(r["finished_at"] for r in records if r["repeat"] < 2)
    finished = max(r["finished_at"] for r in records)
    assert (pd.Timestamp(finished) - pd.Timestamp(first_stage)).total_seconds() < budget_s + 10
    said = " ".join(done.stdout.split())
    added = rf"repeats added after the first 2: {len(repeats) - 2}, in (\d+) s of the {budget_s} s budget"
    spent = re.search(added, said)
    assert spent is not None and int(spent[1]) < budget_s + 10, said
    assert "kernel time +/-" in said and f"after {len(repeats)} repeats: not within +/-0.0%" in said
    assert "more repeats would reach it" in said
    logs = _log_ratios(records, "default", "deterministic")
    spread = _t(2) * statistics.stdev(logs[:2])
    needed = math.ceil((spread / math.log1p(0.0001)) ** 2)
    assert f"for +/-0% (repeats so far of needed: smallcnn 2 of {needed})" in " ".join(done.stderr.split()), logs
    mean, half = statistics.mean(logs), spread / math.sqrt(len(logs))
    expected = (math.exp(mean), math.exp(mean - half), math.exp(mean + half))
    assert _printed_kernel_interval(done.stdout, "smallcnn") == pytest.approx(expected, abs=5e-4), (done.stdout, logs)


@pytest.mark.slow
def test_a_sweep_whose_first_stage_settles_runs_the_repeats_steins_rule_asks_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A precision the first stage can reach: exactly the repeats it asks for (none while the budget lasts), and
    the interval within the precision. Three first-stage repeats (t(2) = 4.3, against t(1) = 12.7 for two) keep the
    count small when load spreads the kernel times; the budget bounds the run either way. What Stein's rule asks for
    and the interval printed are worked out here from the records' per-step kernel times: the first n >= 3 with
    t(2) * s3 / sqrt(n) <= ln(1.9), s3 the first three repeats' spread; the interval's half-width the same with
    every repeat's n, around the mean of all their log ratios."""
    monkeypatch.setenv("COLUMNS", "160")  # the table's rows whole, each on one line
    out = tmp_path / "settled"
    args = ["sweep", "--backend", "torch", "--models", "smallcnn", "--repeats", "3", *TINY, "--steps", "3"]
    args += ["--shared-repeats"]  # the first stage in one process; each repeat Stein's rule adds in one of its own
    done = _cli([*args, "--precision", "90%", "--budget", "90s", "--no-report", "--out", str(out)])
    assert done.returncode == 0, done.stderr[-2000:]
    records = list(ResultsStore(out, "sweep").records())
    logs = _log_ratios(records, "default", "deterministic")
    spread = _t(3) * statistics.stdev(logs[:3])
    assert len(logs) == max(3, math.ceil((spread / math.log(1.9)) ** 2)), logs
    reused = {r["repeat"]: r["steps_reused"] for r in records}
    assert reused == {repeat: 0 < repeat < 3 for repeat in range(len(logs))}
    mean, half = statistics.mean(logs), spread / math.sqrt(len(logs))
    expected = (math.exp(mean), math.exp(mean - half), math.exp(mean + half))
    assert _printed_kernel_interval(done.stdout, "smallcnn") == pytest.approx(expected, abs=5e-4), (done.stdout, logs)
    said = " ".join(done.stdout.split())
    assert f"kernel time +/-{math.expm1(half):.1%} after {len(logs)} repeats, within +/-90.0%" in said, said


def _read_traces_once_the_worker_ended(monkeypatch: pytest.MonkeyPatch, out: Path) -> None:
    """A sweep into ``out`` run here (``main``) reads each in-process pair's trace once none of its workers is left
    running."""
    from fault_sweeps import wait_until, workers_of

    from detprof.profiler import sessions

    read = sessions.read_trace

    def read_late(path: Path) -> Any:
        wait_until(lambda: not workers_of(out), 120, "end of the session's worker")
        return read(path)

    monkeypatch.setattr(sessions, "read_trace", read_late)


def _pair_name(repeat: int) -> tuple[str, str]:
    """The trace of the refusing model's pair is named after its first run and the other's mode, which alternate by
    repeat."""
    return ("unpooling--deterministic--r0", "default") if repeat == 0 else ("unpooling--default--r1", "deterministic")


def _cli(args: list[str]) -> Any:
    import subprocess

    return subprocess.run([sys.executable, "-m", "detprof.cli", *args], capture_output=True, text=True)


def test_records_of_a_pair_name_how_it_was_paired() -> None:
    """A pair whose steps ran in turn (both arms in one process, or two processes in lockstep) pairs step i with
    step i: the median of the steps' ratios, 1.2 here. Two runs in processes of their own, one after the other, or
    a pair whose records do not both name one pairing, compare their median steps: 180 against 100."""
    from detprof.records import pair_log_ratio

    base = {"step_kernel_ns": [100, 200, 90], "kernel_ns_per_step": 130.0}
    other = {"step_kernel_ns": [120, 210, 180], "kernel_ns_per_step": 170.0}
    for pairing in ("in_process", "lockstep"):
        paired = pair_log_ratio(base | {"pairing": pairing}, other | {"pairing": pairing}, "kernel")
        assert paired == pytest.approx(math.log(1.2)), pairing
    assert pair_log_ratio(base, other, "kernel") == pytest.approx(math.log(1.8))
    assert pair_log_ratio(base | {"pairing": "in_process"}, other, "kernel") == pytest.approx(math.log(1.8))


TF_ARMS_PROBE = textwrap.dedent(
    """
    import json
    import keras
    import tensorflow as tf
    from tensorflow.python.framework import config

    from detprof import backends, determinism
    from detprof.determinism import DeterminismSettings

    ON = frozenset({"tensorflow.op_determinism"})
    arms = [DeterminismSettings(mode, backend="tensorflow") for mode in ("deterministic", "default")]
    determinism.apply_shared(arms, ())

    def attempt(step):
        try:
            step()
            return "ran"
        except RuntimeError as error:
            return "refused" if "require a seed" in str(error) else f"other: {error}"

    # One function, traced before the switch: determinism does not reach what it traced.
    @tf.function
    def unseeded():
        return tf.random.uniform([2])

    said = {"traced_off": attempt(unseeded)}
    config.enable_op_determinism()
    said["traced_off_after"] = attempt(unseeded)
    config.disable_op_determinism()

    # Each arm's own step: the switch as read when the step is traced, and when it runs.
    read = {"traced": [], "ran": []}

    class Probe(keras.layers.Layer):
        def call(self, x):
            read["traced"].append(bool(config.is_op_determinism_enabled()))

            def running(x):
                read["ran"].append(bool(config.is_op_determinism_enabled()))
                return x

            read_at_run = tf.py_function(running, [x], x.dtype)
            read_at_run.set_shape(x.shape)
            return read_at_run

        def compute_output_shape(self, shape):
            return shape

    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(2)(Probe()(inputs)))
    read["traced"].clear()  # what building the model read is not a step's
    model.compile(optimizer="sgd", loss="mse", jit_compile=False)
    x, y = tf.ones((2, 4)), tf.zeros((2, 2))
    steps = backends.get("tensorflow").arm_steps(model, x, y, [ON, frozenset()])
    for _ in range(3):
        for step, _ in steps:
            step()
    said |= {"effect": [effect["op_determinism"] for _, effect in steps], **read}
    print(json.dumps(said))
    """
)


@pytest.mark.slow
def test_tensorflow_reads_each_arms_switch_when_its_step_is_traced_and_when_it_runs(tmp_path: Path) -> None:
    """TensorFlow reads op determinism when a function is traced (an unseeded random op traced before the switch runs
    on after it) and when its kernels run, so each arm has a function of its own, traced under its switch, and the
    switch is set again before each of its steps: the deterministic arm reads it on, the default arm off, at both."""
    import subprocess

    from detprof.backends import get

    (tmp_path / "arms.py").write_text(TF_ARMS_PROBE)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, "arms.py"], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    said = json.loads(done.stdout.splitlines()[-1])
    assert (said["traced_off"], said["traced_off_after"]) == ("ran", "ran")
    assert said["effect"] == [True, False]
    assert said["traced"] == [True, False]
    assert said["ran"] == [True, False] * 3
    tensorflow, arms = get("tensorflow"), [frozenset(), frozenset({"tensorflow.op_determinism"})]
    assert tensorflow.shared_process_refusal(arms, compile=False, on_gpu=False) is None
    assert "cuDNN's autotuned algorithms" in str(tensorflow.shared_process_refusal(arms, compile=False, on_gpu=True))
    autotune = [frozenset(), frozenset({"tensorflow.cudnn_autotune"})]
    assert tensorflow.shared_process_refusal(autotune, compile=False, on_gpu=False) is not None
