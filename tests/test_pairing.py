"""How a repeat's two runs become one paired log ratio: lockstep step by step, else run by run."""

from __future__ import annotations

import math

import pytest

from detprof.analysis.overhead import model_overheads, noise_floors, paired_log_ratios
from detprof.records import outlying_steps, pair_log_ratio, time_per_step


def run(mode: str, steps: list[int], *, repeat: int = 0, lockstep: bool = True, **extra: object) -> dict:
    record = {"model": "m", "mode": mode, "repeat": repeat, "status": "ok", "step_wall_ns": steps}
    record["wall_ns_per_step"] = sum(steps) / len(steps)
    return record | ({"pairing": "lockstep"} if lockstep else {}) | extra


def test_time_per_step_is_the_median_of_the_steps_so_one_interrupted_step_does_not_count() -> None:
    assert time_per_step(run("default", [100, 100, 100, 5000, 100]), "wall") == 100
    assert time_per_step({"kernel_ns_per_step": 42.0}, "kernel") == 42.0
    assert time_per_step({"status": "failed"}, "kernel") is None


def test_the_steps_set_aside_stand_out_from_the_median_by_deviations_and_by_half_again() -> None:
    """GPT-2's first deterministic run on a loaded CPU: four steps of 248-788 ms among steps of 30-43 ms."""
    ms = 1_000_000
    gpt2 = [788 * ms, 512 * ms, 301 * ms, 248 * ms, *(ms * t for t in (30, 43, 35, 31, 38, 33, 36))]
    assert outlying_steps(gpt2) == [0, 1, 2, 3]
    assert outlying_steps([100, 101, 99, 100, 104]) == []  # 4% slow in steady steps: jitter, not an interruption
    assert outlying_steps([100, 160, 100, 220, 180, 300]) == []  # 1.8x the median, within 3 deviations of these
    assert outlying_steps([100, 160, 100, 220, 180, 900]) == [5]
    assert outlying_steps([100, 900]) == []  # two steps have no median to stand out from


def test_lockstep_pairs_compare_step_by_step() -> None:
    # Step i of both ran side by side: a slow phase hits both, and the paired ratio stays 1.5.
    base = run("default", [100, 100, 400, 400, 400])
    other = run("deterministic", [150, 150, 600, 600, 600])
    assert pair_log_ratio(base, other, "wall") == pytest.approx(math.log(1.5))


def test_runs_one_after_the_other_compare_their_medians() -> None:
    base = run("default", [100, 100, 400, 400, 400], lockstep=False)
    other = run("deterministic", [150, 150, 150, 150, 150], lockstep=False)
    assert pair_log_ratio(base, other, "wall") == pytest.approx(math.log(150 / 400))


def test_a_calibration_pairs_its_arms_and_gives_a_noise_floor() -> None:
    records = []
    for repeat, factor in enumerate((1.01, 0.99, 1.02, 0.98)):
        steps = [1000] * 9
        records.append(run("deterministic", steps, repeat=repeat, arm="a"))
        records.append(run("deterministic", [round(s * factor) for s in steps], repeat=repeat, arm="b"))
    logs = paired_log_ratios(records, "wall")["m"]
    assert logs == pytest.approx([math.log(f) for f in (1.01, 0.99, 1.02, 0.98)], abs=1e-3)
    wall = model_overheads(records)["m"].wall
    assert wall is not None and wall.ci_low < 1 < wall.ci_high
    floor = noise_floors(records)["m"]
    assert floor == pytest.approx(max(wall.ci_high - 1, 1 - wall.ci_low))
    assert 0.01 < floor < 0.05
