"""The background GPU sampler, against a fake NVML at the boundary only."""

from __future__ import annotations

import threading
import time

import pynvml
import pytest
from fake_nvml import FakeNvml, a100, t4

from detprof.profiler import telemetry
from detprof.profiler.devices import DeviceChoice, GpuInfo
from detprof.profiler.telemetry import REASON_BITS, NoTelemetry, TelemetrySampler, decode_reasons, summarize

SAMPLE_KEYS = {
    "t_s",
    "other_processes",
    "sm_clock_mhz",
    "max_sm_clock_mhz",
    "temperature_c",
    "power_w",
    "utilization_pct",
    "throttle_reasons",
}


def sample(clock: int | None = 1400, reasons: list[str] | None = None, util: int | None = 90) -> dict:
    return {
        "t_s": 0.0,
        "sm_clock_mhz": clock,
        "max_sm_clock_mhz": 1410,
        "temperature_c": 50,
        "power_w": 200.0,
        "utilization_pct": util,
        "throttle_reasons": [] if reasons is None else reasons,
    }


def collect(nvml: FakeNvml, seconds: float = 0.15, interval_s: float = 0.01, index: int = 0) -> dict:
    with TelemetrySampler(index, interval_s=interval_s, nvml=nvml) as sampler:
        time.sleep(seconds)
    return sampler.result()


def test_decode_reasons() -> None:
    assert decode_reasons(0) == []
    assert decode_reasons(0x1 | 0x4) == ["gpu_idle", "sw_power_cap"]
    assert decode_reasons(0x20 | 0x40) == ["sw_thermal_slowdown", "hw_thermal_slowdown"]
    assert decode_reasons(0x200 | 0x400) == ["board_limit", "reliability"]
    assert decode_reasons(0x8 | 0x800) == ["hw_slowdown", "unknown_0x800"]
    assert decode_reasons(0x1000 | 0x800) == ["unknown_0x1800"]


def test_reason_bits_are_the_ones_nvml_defines() -> None:
    """Each name is NVML's own (nvmlClocksThrottleReasonSwPowerCap is sw_power_cap), and none is missing."""
    for bit, name in REASON_BITS.items():
        constant = "nvmlClocksThrottleReason" + "".join(word.capitalize() for word in name.split("_"))
        assert getattr(pynvml, constant) == bit, constant
    assert sum(REASON_BITS) == pynvml.nvmlClocksThrottleReasonAll


def test_summary_of_a_steady_run() -> None:
    summary = summarize([sample(1400), sample(1300), sample(1350)])
    assert summary["sample_count"] == 3
    assert summary["sm_clock_mhz"] == {"min": 1300, "mean": 1350.0, "max": 1400}
    assert summary["power_w"] == {"min": 200.0, "mean": 200.0, "max": 200.0}
    assert summary["throttled"] is False and summary["low_clock_samples"] == 0
    assert summary["throttle_reasons"] == []


@pytest.mark.parametrize(
    "reason",
    [
        "hw_slowdown",
        "sync_boost",
        "sw_thermal_slowdown",
        "hw_thermal_slowdown",
        "hw_power_brake_slowdown",
        "display_clock_setting",
        "board_limit",
        "reliability",
        "unknown_0x800",
    ],
)
def test_a_limiting_reason_marks_the_run_throttled_even_at_a_steady_clock(reason: str) -> None:
    summary = summarize([sample(), sample(reasons=[reason]), sample()])
    assert summary["low_clock_samples"] == 0
    assert summary["throttled"] is True
    assert summary["throttle_reasons"] == [reason]


def test_a_board_at_its_power_cap_with_a_steady_clock_is_not_throttled() -> None:
    t4_at_cap = [sample(clock, ["sw_power_cap"]) | {"power_w": 70.0} for clock in (1590, 1575, 1590, 1560)]
    summary = summarize(t4_at_cap)
    assert summary["throttle_reasons"] == ["sw_power_cap"]
    assert summary["low_clock_samples"] == 0
    assert summary["throttled"] is False


def test_a_board_at_its_power_cap_whose_clock_drops_is_throttled() -> None:
    t4_at_cap = [sample(clock, ["sw_power_cap"]) | {"power_w": 70.0} for clock in (1590, 1590, 1305, 1590)]
    summary = summarize(t4_at_cap)
    assert summary["low_clock_samples"] == 1
    assert summary["throttled"] is True


def test_idleness_and_pinned_application_clocks_are_not_throttling() -> None:
    samples = [
        sample(1410, ["applications_clocks_setting"]),
        sample(210, ["gpu_idle"], util=0),
        sample(300, util=0),
        sample(1400),
    ]
    summary = summarize(samples)
    assert summary["throttled"] is False
    assert summary["throttle_reasons"] == ["applications_clocks_setting", "gpu_idle"]
    assert summary["sm_clock_mhz"]["min"] == 210


def test_a_busy_clock_below_90_percent_of_the_peak_is_throttling() -> None:
    summary = summarize([sample(1400), sample(1270), sample(1250)])
    assert summary["low_clock_samples"] == 1
    assert summary["throttled"] is True


def test_no_samples_no_verdict() -> None:
    summary = summarize([])
    assert summary["throttled"] is None and summary["sm_clock_mhz"] is None


def test_metrics_the_board_cannot_report_stay_unknown() -> None:
    summary = summarize([sample(clock=None, reasons=None, util=None) | {"power_w": None}])
    assert summary["sm_clock_mhz"] is None and summary["power_w"] is None
    assert summary["throttled"] is False


def test_sampler_collects_samples_from_the_gpu() -> None:
    nvml = FakeNvml([t4(), a100()])
    result = collect(nvml, index=1)
    samples = result["samples"]
    assert result["error"] is None
    assert len(samples) >= 3
    assert all(set(s) == SAMPLE_KEYS for s in samples)
    assert [s["t_s"] for s in samples] == sorted(s["t_s"] for s in samples)
    first = samples[0]
    assert (first["sm_clock_mhz"], first["max_sm_clock_mhz"]) == (1410, 1410)
    assert (first["temperature_c"], first["power_w"], first["utilization_pct"]) == (45, 250.0, 100)
    assert first["throttle_reasons"] == []
    summary = result["summary"]
    assert summary["sample_count"] == len(samples)
    assert summary["interval_s"] == 0.01
    assert 0 <= summary["sampler_busy_s"] < 0.15
    assert summary["throttled"] is False
    assert (nvml.inits, nvml.shutdowns) == (1, 1)


def test_only_the_measured_window_is_judged() -> None:
    gpu = a100()
    gpu.sm_clocks = [900, 900, 900, 900, 1410]
    with TelemetrySampler(0, interval_s=0.01, nvml=FakeNvml([gpu])) as sampler:
        while gpu.clock_reads < 5:
            time.sleep(0.005)
        measured_from = time.monotonic()
        time.sleep(0.06)
        measured_to = time.monotonic()
        time.sleep(0.03)
    whole = sampler.result()
    assert whole["summary"]["throttled"] is True and whole["summary"]["window_s"] is None
    measured = sampler.result(window=(measured_from, measured_to))
    assert measured["samples"] == whole["samples"]
    start, end = measured["summary"]["window_s"]
    inside = [s for s in whole["samples"] if start <= s["t_s"] <= end]
    assert inside and len(inside) < len(whole["samples"])
    assert measured["summary"]["sample_count"] == len(inside)
    assert measured["summary"]["sm_clock_mhz"] == {"min": 1410, "mean": 1410.0, "max": 1410}
    assert measured["summary"]["throttled"] is False


def test_sampler_sees_a_clock_drop_and_throttle_reasons() -> None:
    gpu = a100()
    gpu.sm_clocks = [1410, 1410, 1100]
    gpu.reasons = 0x4 | 0x40
    result = collect(FakeNvml([gpu]))
    assert result["summary"]["throttled"] is True
    assert result["summary"]["low_clock_samples"] >= 1
    assert result["summary"]["throttle_reasons"] == ["hw_thermal_slowdown", "sw_power_cap"]
    assert result["samples"][0]["throttle_reasons"] == ["sw_power_cap", "hw_thermal_slowdown"]


def test_sampler_on_a_t4_at_its_power_cap_with_a_steady_clock_is_not_throttled() -> None:
    gpu = t4()
    gpu.reasons = 0x4
    result = collect(FakeNvml([gpu]))
    assert all(s["throttle_reasons"] == ["sw_power_cap"] for s in result["samples"])
    assert result["summary"]["power_w"]["max"] == 70.0
    assert result["summary"]["throttled"] is False


def test_sampler_on_a_t4_at_its_power_cap_sees_its_clock_drop() -> None:
    gpu = t4()
    gpu.reasons = 0x4
    gpu.sm_clocks = [1590, 1590, 1200]
    result = collect(FakeNvml([gpu]))
    assert result["summary"]["low_clock_samples"] >= 1
    assert result["summary"]["throttled"] is True


def test_drivers_without_the_clock_event_call_use_the_throttle_call() -> None:
    gpu = a100()
    gpu.reasons = 0x20
    result = collect(FakeNvml([gpu], event_reasons=False))
    assert all(s["throttle_reasons"] == ["sw_thermal_slowdown"] for s in result["samples"])


def test_unsupported_power_reading_is_recorded_as_unknown() -> None:
    gpu = a100()
    gpu.power_mw = None
    result = collect(FakeNvml([gpu]))
    assert all(s["power_w"] is None for s in result["samples"])
    assert result["summary"]["power_w"] is None
    assert result["summary"]["sm_clock_mhz"] is not None


def test_sampler_stops_at_once_instead_of_finishing_its_interval() -> None:
    nvml = FakeNvml([a100()])
    started = time.perf_counter()
    with TelemetrySampler(0, interval_s=30.0, nvml=nvml) as sampler:
        pass
    assert time.perf_counter() - started < 5.0
    assert not sampler._thread.is_alive()
    assert len(sampler.result()["samples"]) == 2


def test_an_exception_in_the_run_stops_the_sampler_and_propagates() -> None:
    nvml = FakeNvml([a100()])
    sampler = TelemetrySampler(0, interval_s=0.01, nvml=nvml)
    with pytest.raises(RuntimeError, match="worker died"), sampler:
        raise RuntimeError("worker died")
    assert not sampler._thread.is_alive()
    assert nvml.shutdowns == 1


def test_a_hung_nvml_call_does_not_hang_the_run(monkeypatch) -> None:
    monkeypatch.setattr(telemetry, "STOP_TIMEOUT_S", 0.1)
    release = threading.Event()
    nvml = FakeNvml([a100()])
    with TelemetrySampler(0, interval_s=0.01, nvml=nvml) as sampler:
        nvml.hang = release
        time.sleep(0.05)
    result = sampler.result()
    release.set()
    sampler._thread.join(1.0)
    assert result["error"] == "NVML did not answer within 0.1 s; telemetry stops early"
    assert result["samples"]


def test_nvml_failing_at_start_never_fails_the_run() -> None:
    nvml = FakeNvml([a100()], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    with TelemetrySampler(0, nvml=nvml) as sampler:
        ran = True
    assert ran
    assert sampler.result() == {"samples": [], "summary": None, "error": "NVML: Driver Not Loaded"}


def test_a_gpu_lost_before_the_run_is_an_error_not_a_crash() -> None:
    nvml = FakeNvml([a100()], broken_handles=frozenset({0}))
    with TelemetrySampler(0, nvml=nvml) as sampler:
        pass
    assert sampler.result()["error"] == "NVML: GPU 0: GPU is lost"
    assert (nvml.inits, nvml.shutdowns) == (1, 1)


def test_no_gpu_means_no_telemetry() -> None:
    for choice in (DeviceChoice(label="cpu", gpu=None, hide_gpus=True), DeviceChoice(label="cpu", gpu=None)):
        with TelemetrySampler.for_device(choice) as sampler:
            pass
        assert isinstance(sampler, NoTelemetry)
        assert sampler.result() is None


def test_for_device_samples_the_chosen_gpu() -> None:
    nvml = FakeNvml([t4(), a100()])
    choice = DeviceChoice(label="a100", gpu=GpuInfo(index=1, name="NVIDIA A100-SXM4-80GB"))
    with TelemetrySampler.for_device(choice, interval_s=0.01, nvml=nvml) as sampler:
        pass
    assert isinstance(sampler, TelemetrySampler)
    assert sampler.result()["samples"][0]["max_sm_clock_mhz"] == 1410


def test_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        TelemetrySampler(0, interval_s=0, nvml=FakeNvml([a100()]))
