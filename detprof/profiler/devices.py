"""Which device a sweep measures, and whether the label the user gave it is true.

A results directory is named and compared by its device label (``t4``, ``a100``, ``cpu``),
so a wrong label silently corrupts every comparison made later: the label is checked
against what NVML reports, and only ``--force`` lets a mismatch through (recorded as
forced). A label must also name a GPU model detprof knows (``KNOWN_GPUS``) or the GPU
that is detected, whatever ``--force`` says: ``--force`` vouches for a label the device
cannot confirm, never for a typo such as ``v101``. NVML is reached only through the small
``Nvml`` interface below, which the ``pynvml`` module satisfies as it is; tests hand in a
fake with the same method names, so everything above that boundary runs unchanged on a
machine without a GPU.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pynvml

from detprof.errors import UsageError
from detprof.gpu_labels import (
    CPU_LABEL,
    GPU_ONLY_FIELDS,
    known_label,
    label_matches,
    normalize_label,
    refuse_unknown,
    slug,
)

RECORD_FIELDS = {"driver": "driver_version", "cuda_driver": "cuda_driver_version"}
"""A record's device field -> the ``GpuInfo`` field it comes from, where their names differ."""

T = TypeVar("T")


class Nvml(Protocol):
    """The NVML calls detprof makes, named as ``pynvml`` names them."""

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str: ...
    def nvmlSystemGetCudaDriverVersion(self) -> int: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetName(self, handle: Any) -> str: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str: ...
    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]: ...
    def nvmlDeviceGetAttributes(self, handle: Any) -> Any: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int: ...
    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock_type: int) -> int: ...
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int: ...
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int: ...
    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]: ...


def default_nvml() -> Nvml:
    """The real library; the one place product code names it, so tests replace only this."""
    return pynvml


def optional(call: Callable[..., T], *args: Any) -> T | None:
    """NVML answers NOT_SUPPORTED for many queries on many boards: unknown, not an error."""
    try:
        return call(*args)
    except pynvml.NVMLError:
        return None


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as NVML reports it; what it cannot say is None (an SM count outside MIG, on most drivers)."""

    index: int
    name: str
    uuid: str | None = None
    """What names this GPU however it is numbered: a ``CUDA_VISIBLE_DEVICES`` entry may give it instead of an index."""
    compute_capability: str | None = None
    """``major.minor`` ("9.0" on an H100): which tracer works (nvprof stops at 8.0) and which kernels exist."""
    sm_count: int | None = None
    memory_bytes: int | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    """The newest CUDA the driver runs, which a framework's CUDA build must not exceed."""

    @property
    def cc_tuple(self) -> tuple[int, int] | None:
        if self.compute_capability is None:
            return None
        major, minor = self.compute_capability.split(".")
        return int(major), int(minor)


@dataclass(frozen=True)
class GpuProbe:
    """What NVML reported, and why it reported less than it might have."""

    gpus: list[GpuInfo]
    problems: list[str] = field(default_factory=list)


def _cuda_version(encoded: int | None) -> str | None:
    """NVML encodes the driver's CUDA version as 1000 * major + 10 * minor (12040 is 12.4)."""
    if encoded is None:
        return None
    return f"{encoded // 1000}.{(encoded % 1000) // 10}"


def _sm_count(nvml: Nvml, handle: Any) -> int | None:
    """NVML has no documented SM count for a whole GPU (the attributes call is specified for
    MIG instances only); report it where the driver answers and leave it unknown elsewhere."""
    attributes = optional(nvml.nvmlDeviceGetAttributes, handle)
    count = getattr(attributes, "multiprocessorCount", None)
    return int(count) if count else None


def _read_gpu(nvml: Nvml, index: int, driver: str | None, cuda: str | None) -> GpuInfo:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    cc = optional(nvml.nvmlDeviceGetCudaComputeCapability, handle)
    memory = optional(nvml.nvmlDeviceGetMemoryInfo, handle)
    return GpuInfo(
        index=index,
        name=str(nvml.nvmlDeviceGetName(handle)),
        uuid=optional(nvml.nvmlDeviceGetUUID, handle),
        compute_capability=None if cc is None else f"{cc[0]}.{cc[1]}",
        sm_count=_sm_count(nvml, handle),
        memory_bytes=None if memory is None else int(memory.total),
        driver_version=driver,
        cuda_driver_version=cuda,
    )


def probe_gpus(nvml: Nvml | None = None) -> GpuProbe:
    """Every GPU NVML sees; an absent library or driver is an answer (no GPU), not a crash."""
    nvml = nvml or default_nvml()
    try:
        nvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return GpuProbe([], [str(exc)])
    try:
        count = nvml.nvmlDeviceGetCount()
        driver = optional(nvml.nvmlSystemGetDriverVersion)
        cuda = _cuda_version(optional(nvml.nvmlSystemGetCudaDriverVersion))
        gpus: list[GpuInfo] = []
        problems: list[str] = []
        for index in range(count):
            try:
                gpus.append(_read_gpu(nvml, index, driver, cuda))
            except pynvml.NVMLError as exc:
                problems.append(f"GPU {index}: {exc}")
        if count == 0:
            problems.append("the driver is loaded but reports 0 devices")
        return GpuProbe(gpus, problems)
    except pynvml.NVMLError as exc:
        return GpuProbe([], [str(exc)])
    finally:
        optional(nvml.nvmlShutdown)


def list_gpus(nvml: Nvml | None = None) -> list[GpuInfo]:
    return probe_gpus(nvml).gpus


def free_memory(gpu: GpuInfo, nvml: Nvml | None = None) -> int | None:
    """The GPU's free memory now, in bytes, or None where NVML cannot tell (then nothing can be checked)."""
    nvml = nvml or default_nvml()
    try:
        nvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        memory = optional(nvml.nvmlDeviceGetMemoryInfo, nvml.nvmlDeviceGetHandleByIndex(gpu.index))
        return None if memory is None else int(memory.free)
    except pynvml.NVMLError:
        return None
    finally:
        optional(nvml.nvmlShutdown)


def visible_gpus(gpus: list[GpuInfo], environ: Mapping[str, str] | None = None) -> list[GpuInfo]:
    """The GPUs a worker's CUDA will see, in CUDA's order.

    NVML lists every GPU whatever ``CUDA_VISIBLE_DEVICES`` says, but TensorFlow trains on
    the first visible one, so that is the device a label must match. CUDA stops at the
    first entry it cannot resolve. Integer entries are taken as NVML (PCI) indices, which
    is CUDA's order under ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` and on every machine whose GPUs
    are one model. A MIG entry names an instance whose parent NVML cannot be asked about
    here, so the list is left as NVML gave it.
    """
    environ = os.environ if environ is None else environ
    spec = environ.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return gpus
    by_index = {gpu.index: gpu for gpu in gpus}
    seen: list[GpuInfo] = []
    for entry in (part.strip() for part in spec.split(",")):
        if entry.startswith("MIG-"):
            return gpus
        if entry.isdigit() and int(entry) in by_index:
            match: GpuInfo | None = by_index[int(entry)]
        else:
            match = next((g for g in gpus if entry and g.uuid and g.uuid.startswith(entry)), None)
        if match is None:
            break
        seen.append(match)
    return seen


def cpu_model() -> str:
    """``platform.processor()`` is empty on most Linux systems; /proc/cpuinfo names the CPU."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model") and value.strip():
                return value.strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def usable_core_ids() -> set[int]:
    """The cores this process may run on (its affinity mask), which bound a CPU sweep, not the host's total."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def usable_cpus() -> int:
    return len(usable_core_ids())


@dataclass(frozen=True)
class DeviceChoice:
    """The label results are filed under and the device that will actually run them."""

    label: str
    gpu: GpuInfo | None
    hide_gpus: bool = False
    forced: bool = False
    mig_devices: str | None = None
    """The user's own ``CUDA_VISIBLE_DEVICES`` when it names MIG instances: NVML here cannot say
    which instance of which GPU that is, so the workers keep it rather than a whole GPU's UUID."""

    @property
    def cuda_visible_devices(self) -> str | None:
        """What the workers' ``CUDA_VISIBLE_DEVICES`` is set to; None: left as it is (no GPU).

        Empty hides every GPU (label ``cpu``); otherwise the chosen GPU alone, by UUID, which
        names one card whatever order CUDA enumerates in. NVML may give no UUID: then its
        index, which ``gpu_env`` makes CUDA read in NVML's (PCI) order.
        """
        if self.hide_gpus:
            return ""
        if self.gpu is None:
            return None
        return self.mig_devices or self.gpu.uuid or str(self.gpu.index)

    @property
    def lock_key(self) -> str:
        """What two measurements must not share (``locks.holding``): the GPU the workers see, else the CPU."""
        cuda = self.cuda_visible_devices
        return f"gpu-{cuda}" if cuda else "cpu"

    def as_record(self) -> dict[str, Any]:
        """The ``device`` field of every run record, with the ``CUDA_VISIBLE_DEVICES`` the workers ran under."""
        record: dict[str, Any] = {
            "label": self.label,
            "forced": self.forced,
            "cuda_visible_devices": self.cuda_visible_devices,
        }
        if self.gpu is None:
            return record | {"name": cpu_model()} | dict.fromkeys(GPU_ONLY_FIELDS) | {"cpu_count": usable_cpus()}
        info = asdict(self.gpu)
        return (
            record
            | {"name": info["name"], "index": info["index"]}
            | {field: info[RECORD_FIELDS.get(field, field)] for field in GPU_ONLY_FIELDS}
        )


def check_label(label: str | None, gpus: list[GpuInfo], force: bool = False) -> DeviceChoice:
    """Pick the device and its label; ``gpus`` are the visible ones, first one trains.

    ``cpu`` is always allowed: with a GPU present the sweep hides it from the workers,
    so what is measured really is the CPU. A label that names the detected GPU is taken
    as it is; any other must be a known one (``KNOWN_GPUS``) before ``--force`` is even
    considered, since a forced typo would file results under a device that does not exist.
    """
    gpu = gpus[0] if gpus else None
    if label is None:
        return DeviceChoice(label=CPU_LABEL if gpu is None else slug(gpu.name), gpu=gpu)
    norm = normalize_label(label)
    if norm == CPU_LABEL:
        return DeviceChoice(label=CPU_LABEL, gpu=None, hide_gpus=gpu is not None)
    if gpu is not None and label_matches(norm, gpu.name):
        return DeviceChoice(label=norm, gpu=gpu)
    if not known_label(norm):
        refuse_unknown(norm)
    if gpu is None:
        if not force:
            raise UsageError(f"--gpu {norm} was given but no NVIDIA GPU was detected; pass --force to label it anyway")
        return DeviceChoice(label=norm, gpu=None, forced=True)
    if not force:
        raise UsageError(f"--gpu {norm} does not match the detected GPU {gpu.name!r}; pass --force to label it anyway")
    return DeviceChoice(label=norm, gpu=gpu, forced=True)


def _names_mig(spec: str | None) -> bool:
    return spec is not None and any(part.strip().startswith("MIG-") for part in spec.split(","))


def pick_gpu(wanted: str, gpus: list[GpuInfo], visible: list[GpuInfo], spec: str | None) -> GpuInfo:
    """The GPU ``--gpu-index`` names among the ``visible`` ones: an NVML index (as ``detprof gpus``
    lists it, which is PCI order, not CUDA's) or a UUID or a prefix of one that names a single GPU.

    ``gpus`` are all NVML sees and ``spec`` the user's ``CUDA_VISIBLE_DEVICES``, so that a
    refusal can say whether there is no GPU or the user's setting hides them, and list the
    ones that could be named.
    """
    key = wanted.strip()
    if key.isdigit():
        matches = [g for g in visible if g.index == int(key)]
    elif key.upper().startswith("GPU-"):
        matches = [g for g in visible if g.uuid and g.uuid.lower().startswith(key.lower())]
    else:
        raise UsageError(f"--gpu-index {wanted!r} is neither an NVML index (0, 1, ...) nor a GPU UUID (GPU-...)")
    if len(matches) == 1:
        return matches[0]
    if not gpus:
        raise UsageError(f"--gpu-index {key} was given but no NVIDIA GPU was detected")
    if not visible:
        raise UsageError(f"--gpu-index {key} was given but CUDA_VISIBLE_DEVICES={spec!r} hides every GPU")
    among = f" that CUDA_VISIBLE_DEVICES={spec!r} leaves visible" if spec is not None else ""
    listing = "; ".join(f"{g.index}: {g.name} {g.uuid or '(no UUID)'}" for g in visible)
    if not matches:
        raise UsageError(f"--gpu-index {key} matches no GPU{among} (GPUs: {listing})")
    raise UsageError(f"--gpu-index {key} matches {len(matches)} GPUs: give more of the UUID (GPUs: {listing})")


def choose_device(
    label: str | None,
    force: bool = False,
    nvml: Nvml | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    gpu_index: str | None = None,
) -> DeviceChoice:
    """``check_label`` against the GPU the workers will train on: ``gpu_index``'s, else the first
    one this process's CUDA would use. The workers are then pinned to it (``gpu_env``), so the
    label check, the telemetry and the training all concern that one card."""
    environ = os.environ if environ is None else environ
    spec = environ.get("CUDA_VISIBLE_DEVICES")
    gpus = list_gpus(nvml)
    visible = visible_gpus(gpus, environ)
    if gpu_index is not None:
        if label is not None and label.strip().lower() == CPU_LABEL:
            raise UsageError("--gpu-index picks the GPU to train on but --gpu cpu trains on the CPU: give one of them")
        if _names_mig(spec):
            raise UsageError(
                f"--gpu-index cannot choose among MIG instances: CUDA_VISIBLE_DEVICES={spec!r} already chooses one"
            )
        visible = [pick_gpu(gpu_index, gpus, visible, spec)]
    choice = check_label(label, visible, force)
    if choice.gpu is not None and _names_mig(spec):
        return replace(choice, mig_devices=spec)
    return choice
