"""GPU clocks, temperature, power and utilization, sampled in the background during a run.

A deterministic/default ratio is only as good as the clocks both runs ran at: a GPU whose
clock fell under its power cap, or that hit a thermal limit, in one run and not the other
produces a ratio that says nothing about determinism. The sampler records what NVML
reports every ``interval_s`` so that a noisy ratio can be explained, and flags the run as
throttled. It costs a handful of NVML calls per sample (each a short ioctl that releases
the GIL), timed by the sampler itself and stored in the summary so every record shows its
own tax.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from statistics import fmean
from types import TracebackType
from typing import Any

import pynvml

from detprof.profiler.devices import DeviceChoice, Nvml, default_nvml, optional
from detprof.profiler.machine_load import own_process_tree
from detprof.records import CLOCK_DROP_FRACTION

DEFAULT_INTERVAL_S = 0.2
STOP_TIMEOUT_S = 5.0

# NVML's clock-event bits (nvml.h, nvmlClocksEventReason*). Written out rather than read from
# pynvml because the oldest nvidia-ml-py this project accepts lacks the newest names (0x200,
# 0x400); tests/test_telemetry.py checks every number against the installed binding.
REASON_BITS: dict[int, str] = {
    0x001: "gpu_idle",
    0x002: "applications_clocks_setting",
    0x004: "sw_power_cap",
    0x008: "hw_slowdown",
    0x010: "sync_boost",
    0x020: "sw_thermal_slowdown",
    0x040: "hw_thermal_slowdown",
    0x080: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
    0x200: "board_limit",
    0x400: "reliability",
}
BENIGN_REASONS = frozenset({"gpu_idle", "applications_clocks_setting"})
OPERATING_POINT_REASONS = frozenset({"sw_power_cap"})
_KNOWN_BITS = sum(REASON_BITS)


def decode_reasons(mask: int) -> list[str]:
    """NVML's clock-event bitmask as names; bits newer than this table are kept, as hex."""
    names = [name for bit, name in REASON_BITS.items() if mask & bit]
    unknown = mask & ~_KNOWN_BITS
    if unknown:
        names.append(f"unknown_{unknown:#x}")
    return names


def _stats(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"min": min(values), "mean": fmean(values), "max": max(values)}


def _is_idle(sample: dict[str, Any]) -> bool:
    """An idle GPU drops its clocks by design; that is not throttling."""
    return "gpu_idle" in (sample["throttle_reasons"] or []) or sample["utilization_pct"] == 0


def _limits_by_itself(reason: str) -> bool:
    """Whether naming ``reason`` is enough to call a run throttled, with or without a clock drop."""
    return reason not in BENIGN_REASONS and reason not in OPERATING_POINT_REASONS


def summarize(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Ranges of every metric and one verdict: did anything but idleness slow the clock?

    A busy sample's SM clock below ``CLOCK_DROP_FRACTION`` of the run's highest busy clock
    is throttling, whatever NVML says. Idleness and clocks the user pinned never are.
    The power cap (``sw_power_cap``) is the board's normal operating point under load, not
    a slowdown: a T4 sits at its 70 W cap for a whole run at a steady clock, so the cap
    counts only through the clock drop above. Every other reason (thermal and hardware
    slowdowns, the power brake, sync boost, board and reliability limits, bits newer than
    this module) is throttling by itself: none is a steady state of a healthy board under
    load, and a run slowed by one from its first sample shows no drop against its own peak,
    so the reason is the only evidence. With no samples there is no verdict (None).
    """

    def values(key: str, which: list[dict[str, Any]] = samples) -> list[float]:
        return [s[key] for s in which if s[key] is not None]

    reasons = sorted({r for s in samples for r in (s["throttle_reasons"] or [])})
    others = [s.get("other_processes") for s in samples]
    known = [set(pids) for pids in others if pids is not None]
    busy_clocks = values("sm_clock_mhz", [s for s in samples if not _is_idle(s)])
    peak = max(busy_clocks, default=None)
    low_clock = 0 if peak is None else sum(c < CLOCK_DROP_FRACTION * peak for c in busy_clocks)
    return {
        "sample_count": len(samples),
        "sm_clock_mhz": _stats(values("sm_clock_mhz")),
        "temperature_c": _stats(values("temperature_c")),
        "power_w": _stats(values("power_w")),
        "utilization_pct": _stats(values("utilization_pct")),
        "throttle_reasons": reasons,
        "low_clock_samples": low_clock,
        "throttled": (bool(low_clock) or any(map(_limits_by_itself, reasons))) if samples else None,
        "other_processes": sorted(set().union(*known)) if known else None,
    }


class NoTelemetry:
    """What a run without a GPU samples: nothing, at no cost."""

    def __enter__(self) -> NoTelemetry:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def result(self, window: tuple[float, float] | None = None) -> None:
        return None


class TelemetrySampler:
    """``with TelemetrySampler(0) as s: run(); record["telemetry"] = s.result()``.

    One sample is taken on entry and one on exit, so even a run shorter than the interval
    has a before and after. A failure of NVML never fails the run: it is recorded in
    ``result()["error"]`` next to whatever was sampled. Sample times are ``time.monotonic()``
    offsets from ``started_monotonic``; that clock is shared by every process on a Linux
    machine, so a worker's own stamps of its measured window can select the samples
    that the summary judges.
    """

    def __init__(self, gpu_index: int, interval_s: float = DEFAULT_INTERVAL_S, nvml: Nvml | None = None) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, not {interval_s}")
        self.gpu_index = gpu_index
        self.interval_s = interval_s
        self._nvml = nvml or default_nvml()
        self._samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="detprof-telemetry", daemon=True)
        self._handle: Any = None
        self._reasons: Callable[[Any], int] | None = None
        self._max_clock: int | None = None
        self.started_monotonic = 0.0
        self._busy_s = 0.0
        self._error: str | None = None
        self._started = False

    @classmethod
    def for_device(
        cls, choice: DeviceChoice, interval_s: float = DEFAULT_INTERVAL_S, nvml: Nvml | None = None
    ) -> TelemetrySampler | NoTelemetry:
        if choice.gpu is None:
            return NoTelemetry()
        return cls(choice.gpu.index, interval_s, nvml)

    def _reason_getter(self) -> Callable[[Any], int] | None:
        """The clock-event call was renamed in driver 535; older drivers only have the old name."""
        for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            getter = getattr(self._nvml, name, None)
            if getter is None:
                continue
            try:
                getter(self._handle)
            except pynvml.NVMLError_FunctionNotFound:
                continue
            except pynvml.NVMLError:
                return None
            return getter
        return None

    def _sample(self) -> dict[str, Any]:
        start = time.perf_counter()
        t_s = time.monotonic() - self.started_monotonic
        nvml, handle = self._nvml, self._handle
        power_mw = optional(nvml.nvmlDeviceGetPowerUsage, handle)
        utilization = optional(nvml.nvmlDeviceGetUtilizationRates, handle)
        reasons = None if self._reasons is None else optional(self._reasons, handle)
        sample = {
            "t_s": t_s,
            "sm_clock_mhz": optional(nvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM),
            "max_sm_clock_mhz": self._max_clock,
            "temperature_c": optional(nvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU),
            "power_w": None if power_mw is None else power_mw / 1000.0,
            "utilization_pct": None if utilization is None else utilization.gpu,
            "throttle_reasons": None if reasons is None else decode_reasons(reasons),
            "other_processes": self._other_processes(),
        }
        self._busy_s += time.perf_counter() - start
        return sample

    def _other_processes(self) -> list[int] | None:
        """The pids of the processes other than detprof's own that hold the GPU; None where that cannot be told.

        NVML names processes by the host's pids: inside a container whose pids differ, no listed
        pid is one of detprof's even while its worker computes, and which are others is unknown.
        """
        listed = optional(self._nvml.nvmlDeviceGetComputeRunningProcesses, self._handle)
        if listed is None:
            return None
        pids = {process.pid for process in listed}
        ours = own_process_tree()
        if pids and not pids & ours:
            return None
        return sorted(pids - ours)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._samples.append(self._sample())

    def __enter__(self) -> TelemetrySampler:
        try:
            self._nvml.nvmlInit()
        except pynvml.NVMLError as exc:
            self._error = f"NVML: {exc}"
            return self
        self._started = True
        try:
            self._handle = self._nvml.nvmlDeviceGetHandleByIndex(self.gpu_index)
        except pynvml.NVMLError as exc:
            self._error = f"NVML: GPU {self.gpu_index}: {exc}"
            return self
        self._max_clock = optional(self._nvml.nvmlDeviceGetMaxClockInfo, self._handle, pynvml.NVML_CLOCK_SM)
        self._reasons = self._reason_getter()
        self.started_monotonic = time.monotonic()
        self._samples.append(self._sample())
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join(STOP_TIMEOUT_S)
            if self._thread.is_alive():
                self._error = f"NVML did not answer within {STOP_TIMEOUT_S:g} s; telemetry stops early"
                return
            self._samples.append(self._sample())
        if self._started:
            optional(self._nvml.nvmlShutdown)

    def result(self, window: tuple[float, float] | None = None) -> dict[str, Any]:
        """Every sample, and a summary of those inside ``window`` (``time.monotonic()`` start
        and end of the measured steps) so that start-up and warm-up do not count."""
        samples = list(self._samples)
        if not samples:
            return {"samples": [], "summary": None, "error": self._error}
        judged = samples
        window_s = None
        if window is not None:
            window_s = [window[0] - self.started_monotonic, window[1] - self.started_monotonic]
            judged = [s for s in samples if window_s[0] <= s["t_s"] <= window_s[1]]
        summary = summarize(judged)
        summary.update(window_s=window_s, interval_s=self.interval_s, sampler_busy_s=self._busy_s)
        return {"samples": samples, "summary": summary, "error": self._error}
