"""What a run records of the machine's other load, and how the report and check judge it."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time

from fake_nvml import FakeNvml, a100
from fault_sweeps import cpu_hog

from detprof.analysis.conditions import load_rows, shared_device_warnings, shares_device
from detprof.profiler.machine_load import LoadWatch, own_process_tree
from detprof.profiler.telemetry import TelemetrySampler, summarize

SPIN = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass"


def test_a_core_spun_by_a_process_of_ours_counts_as_our_own_load() -> None:
    """However busy the machine, the child's CPU time (its own count, ``RUSAGE_CHILDREN``) is detprof's."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with LoadWatch() as watch:
        subprocess.run([sys.executable, "-c", SPIN.format(seconds=1.5)], check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = watch.result()
    assert load is not None and load["cores"] == len(os.sched_getaffinity(0)) and load["window_s"] >= 1.5
    spun = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    assert load["own_cores"] * load["window_s"] >= 0.9 * spun > 0
    assert len(load["load_average"]) == 2 and 0 <= load["steal_fraction"] < 1


def test_a_window_shorter_than_the_counters_resolve_reads_no_load() -> None:
    """The kernel counts CPU time in ticks of 10 ms: a window of a few milliseconds (a tiny model's few steps) would
    read one tick as several cores, so it reads nothing, as a run that did not look (records say why: no load)."""
    with LoadWatch() as watch:
        time.sleep(0.005)
    assert watch.result() is None


def test_a_core_spun_by_a_process_that_is_not_ours_counts_as_other_load() -> None:
    """A spinner started through a shell that exits is nobody's child here: its CPU time is other load."""
    spinner = cpu_hog()
    try:
        first = sum(spinner.cpu_times()[:2])
        with LoadWatch() as watch:
            time.sleep(1.5)
        spun = sum(spinner.cpu_times()[:2]) - first
    finally:
        spinner.kill()
    load = watch.result()
    assert load is not None and load["other_cores"] * load["window_s"] >= 0.8 * spun > 0.1, load


def run(mode: str, other_cores: float | None = 0.0, steal: float = 0.0, gpu: list[int] | None = None) -> dict:
    load = None if other_cores is None else {
        "cores": 2, "other_cores": other_cores, "steal_fraction": steal, "load_average": [1.0, 1.5],
    }  # fmt: skip
    telemetry = None if gpu is None else {"summary": {"other_processes": gpu}}
    return {"mode": mode, "status": "ok", "load": load, "telemetry": telemetry}


def test_runs_that_shared_their_device_are_counted_and_named_once_per_kind_of_load() -> None:
    records = [run("default", 1.8), run("deterministic"), run("default", 0.1, steal=0.09), run("deterministic", 0.2)]
    records += [run("default", None, gpu=[4242]), run("deterministic", None)]
    assert [shares_device(r) for r in records] == [True, False, True, False, True, False]
    assert shared_device_warnings(records) == [
        "1 of 5 runs measured while other processes used up to 1.8 of 2 cores; "
        "their ratios mix determinism with that load",
        "1 of 5 runs measured while the hypervisor took up to 9% of the cores (steal time); "
        "their ratios mix determinism with that load",
        "1 of 5 runs measured while another process used the GPU (pid 4242); "
        "their ratios mix determinism with that load",
    ]
    rows = {row.mode: row for row in load_rows(records)}
    assert rows["default"].runs == 3 and rows["default"].shared_runs == 3
    assert rows["default"].other_cores_max == 1.8 and rows["default"].steal_max == 0.09
    assert rows["deterministic"].runs == 2 and rows["deterministic"].shared_runs == 0


def test_records_that_did_not_look_at_the_machine_warn_of_nothing() -> None:
    older = [{"mode": "default", "status": "ok", "telemetry": None}] * 3
    assert shared_device_warnings(older) == [] and load_rows(older) == []


def test_the_gpu_telemetry_names_other_processes_on_the_device_but_not_detprofs_own() -> None:
    gpu = a100()
    gpu.processes = [min(own_process_tree()), 999_999]
    with TelemetrySampler(0, interval_s=0.05, nvml=FakeNvml([gpu])) as sampler:
        time.sleep(0.2)
    assert sampler.result()["summary"]["other_processes"] == [999_999]
    gpu.processes = [999_998]
    with TelemetrySampler(0, interval_s=0.05, nvml=FakeNvml([gpu])) as sampler:
        pass
    assert sampler.result()["summary"]["other_processes"] is None, "pids of another namespace: not told apart"
    gpu.processes = None
    with TelemetrySampler(0, interval_s=0.05, nvml=FakeNvml([gpu])) as sampler:
        pass
    assert sampler.result()["summary"]["other_processes"] is None


def test_a_summary_of_samples_without_the_process_list_has_no_verdict_on_other_processes() -> None:
    sample = {"t_s": 0.0, "sm_clock_mhz": 1400, "max_sm_clock_mhz": 1410, "temperature_c": 40, "power_w": 100.0,
              "utilization_pct": 90, "throttle_reasons": []}  # fmt: skip
    assert summarize([sample])["other_processes"] is None
