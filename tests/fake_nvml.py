"""A stand-in for the ``pynvml`` module: the one place tests replace the GPU.

It answers the same calls with the same shapes (handles, structs with ``.total`` and
``.gpu``, milliwatts, ``NVMLError`` subclasses for unsupported queries), so everything
above the NVML boundary runs as it would on a real GPU.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml

GIB = 2**30


@dataclass
class FakeGpu:
    name: str
    uuid: str
    cc: tuple[int, int] | None = (8, 0)
    sm_count: int | None = 108
    memory_bytes: int = 80 * GIB
    free_bytes: int | None = None
    sm_clocks: list[int] = field(default_factory=lambda: [1410])
    max_sm_clock: int = 1410
    temperature_c: int = 45
    power_mw: int | None = 250_000
    utilization_pct: int = 100
    reasons: int = 0
    clock_reads: int = 0
    processes: list[int] | None = field(default_factory=list)
    """The pids of the compute processes NVML lists on the GPU; None: the query is not supported."""


def _unsupported() -> pynvml.NVMLError:
    return pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)


class FakeNvml:
    def __init__(
        self,
        gpus: list[FakeGpu] | None = None,
        init_error: int | None = None,
        event_reasons: bool = True,
        broken_handles: frozenset[int] = frozenset(),
        hang: threading.Event | None = None,
    ) -> None:
        self.gpus = gpus or []
        self.init_error = init_error
        self.event_reasons = event_reasons
        self.broken_handles = broken_handles
        self.hang = hang
        self.inits = 0
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        if index in self.broken_handles:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return self.gpus[index]

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str:
        return handle.name

    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> str:
        return handle.uuid

    def nvmlDeviceGetCudaComputeCapability(self, handle: FakeGpu) -> tuple[int, int]:
        if handle.cc is None:
            raise _unsupported()
        return handle.cc

    def nvmlDeviceGetAttributes(self, handle: FakeGpu) -> SimpleNamespace:
        if handle.sm_count is None:
            raise _unsupported()
        return SimpleNamespace(multiprocessorCount=handle.sm_count, memorySizeMB=handle.memory_bytes // 2**20)

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu) -> SimpleNamespace:
        free = handle.memory_bytes if handle.free_bytes is None else handle.free_bytes
        return SimpleNamespace(total=handle.memory_bytes, free=free, used=handle.memory_bytes - free)

    def nvmlDeviceGetClockInfo(self, handle: FakeGpu, clock_type: int) -> int:
        assert clock_type == pynvml.NVML_CLOCK_SM
        if self.hang is not None:
            self.hang.wait()
        clock = handle.sm_clocks[min(handle.clock_reads, len(handle.sm_clocks) - 1)]
        handle.clock_reads += 1
        return clock

    def nvmlDeviceGetMaxClockInfo(self, handle: FakeGpu, clock_type: int) -> int:
        assert clock_type == pynvml.NVML_CLOCK_SM
        return handle.max_sm_clock

    def nvmlDeviceGetTemperature(self, handle: FakeGpu, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return handle.temperature_c

    def nvmlDeviceGetPowerUsage(self, handle: FakeGpu) -> int:
        if handle.power_mw is None:
            raise _unsupported()
        return handle.power_mw

    def nvmlDeviceGetUtilizationRates(self, handle: FakeGpu) -> SimpleNamespace:
        return SimpleNamespace(gpu=handle.utilization_pct, memory=0)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeGpu) -> int:
        if not self.event_reasons:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return handle.reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: FakeGpu) -> int:
        return handle.reasons

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeGpu) -> list[SimpleNamespace]:
        if handle.processes is None:
            raise _unsupported()
        return [SimpleNamespace(pid=pid, usedGpuMemory=2**30) for pid in handle.processes]


def a100(uuid: str = "GPU-aaaaaaaa-1111-2222-3333-444444444444") -> FakeGpu:
    return FakeGpu(name="NVIDIA A100-SXM4-80GB", uuid=uuid)


def t4(uuid: str = "GPU-bbbbbbbb-1111-2222-3333-444444444444") -> FakeGpu:
    return FakeGpu(
        name="Tesla T4",
        uuid=uuid,
        cc=(7, 5),
        sm_count=None,
        memory_bytes=15 * GIB,
        sm_clocks=[1590],
        max_sm_clock=1590,
        power_mw=70_000,
    )
