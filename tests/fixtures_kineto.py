"""Small PyTorch profiler (Kineto Chrome-trace JSON) traces written by test code.

The layout is that of real traces (../shared/traces/kineto-*.json.gz): one JSON object with
``schemaVersion``, ``deviceProperties``, ``distributedInfo`` (distributed jobs only) and
``traceEvents``. A kernel is a ``cat: kernel`` complete event on ``pid`` = its device with
``args.device/stream/correlation/grid/block``; its launch is a ``cuda_runtime`` event on the
launching CPU thread with the same ``args.correlation``; steps are ``user_annotation`` events,
mirrored on the GPU as ``gpu_user_annotation``. Times are microseconds.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

CPU_PID = 4242
MAIN_THREAD = 4242
AUTOGRAD_THREAD = 4300


@dataclass
class Launch:
    """A kernel and the CPU call that launched it (``launch_ts`` None: launched before the trace began)."""

    name: str
    ts: float
    dur: float
    launch_ts: float | None
    device: int = 0
    stream: int = 7
    grid: tuple[int, int, int] = (1, 1, 1)
    block: tuple[int, int, int] = (128, 1, 1)
    thread: int = MAIN_THREAD


def gpu_events(launches: list[Launch], first_correlation: int = 1000) -> list[dict[str, object]]:
    """Kernel events and, for those launched inside the trace, their runtime calls and flow arrows."""
    events: list[dict[str, object]] = []
    for correlation, k in enumerate(launches, start=first_correlation):
        events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": k.name,
                "pid": k.device,
                "tid": k.stream,
                "ts": k.ts,
                "dur": k.dur,
                "args": {
                    "External id": correlation,
                    "device": k.device,
                    "context": 1,
                    "stream": k.stream,
                    "correlation": correlation,
                    "registers per thread": 32,
                    "grid": list(k.grid),
                    "block": list(k.block),
                },
            }
        )
        events.append({"ph": "f", "id": correlation, "pid": k.device, "tid": k.stream, "ts": k.ts, "cat": "ac2g"})
        if k.launch_ts is not None:
            events.append(
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": "cudaLaunchKernel",
                    "pid": CPU_PID,
                    "tid": k.thread,
                    "ts": k.launch_ts,
                    "dur": 2.5,
                    "args": {"External id": correlation, "cbid": 211, "correlation": correlation},
                }
            )
            events.append(
                {"ph": "s", "id": correlation, "pid": CPU_PID, "tid": k.thread, "ts": k.launch_ts, "cat": "ac2g"}
            )
    return events


def annotation(
    name: str, ts: float, dur: float, *, gpu: bool = False, device: int = 0, stream: int = 7
) -> dict[str, object]:
    """A ``record_function`` range: CPU-side (``user_annotation``) or its GPU-side copy."""
    if gpu:
        return {
            "ph": "X",
            "cat": "gpu_user_annotation",
            "name": name,
            "pid": device,
            "tid": stream,
            "ts": ts,
            "dur": dur,
        }
    return {"ph": "X", "cat": "user_annotation", "name": name, "pid": CPU_PID, "tid": MAIN_THREAD, "ts": ts, "dur": dur}


def cpu_op(name: str, ts: float, dur: float, tid: int = MAIN_THREAD) -> dict[str, object]:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": CPU_PID, "tid": tid, "ts": ts, "dur": dur, "args": {}}


def memory_event(
    cat: str, name: str, ts: float, dur: float, nbytes: int | None, device: int = 0, stream: int = 7
) -> dict[str, object]:
    args: dict[str, object] = {"device": device, "stream": stream, "correlation": 1}
    if nbytes is not None:
        args["bytes"] = nbytes
    return {"ph": "X", "cat": cat, "name": name, "pid": device, "tid": stream, "ts": ts, "dur": dur, "args": args}


def device_properties(count: int) -> list[dict[str, object]]:
    """``deviceProperties`` as Kineto writes them: every GPU of the machine, whichever ran kernels."""
    return [
        {
            "id": i,
            "name": f"NVIDIA Test GPU {i}",
            "totalGlobalMem": 42_505_273_344 + i,
            "computeMajor": 8,
            "computeMinor": 6,
            "maxThreadsPerBlock": 1024,
            "numSms": 100 + i,
        }
        for i in range(count)
    ]


def trace_document(events: list[dict[str, object]], *, devices: int = 0, rank: int | None = None) -> dict[str, object]:
    doc: dict[str, object] = {"schemaVersion": 1, "deviceProperties": device_properties(devices)}
    if rank is not None:
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": 8}
    doc["traceEvents"] = [
        {"name": "process_name", "ph": "M", "ts": 0, "pid": CPU_PID, "tid": 0, "args": {"name": "python3"}},
        *events,
        {"ph": "X", "cat": "Trace", "ts": 0, "dur": 1, "pid": "Spans", "tid": "PyTorch Profiler", "name": "Trace"},
    ]
    return doc


def write_trace(path: Path, doc: dict[str, object], *, compress: bool = False) -> Path:
    """Write a document as Kineto does (``json.dumps``), gzip-compressed if asked whatever the name says."""
    text = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(text) if compress else text)
    return path


def simple_gpu_trace(path: Path, *, rank: int | None = None, compress: bool = False) -> Path:
    """Two kernels on device 1 of a 2-GPU machine, one step."""
    launches = [
        Launch("void k<float>(float*)", 110.0, 4.0, 101.0, device=1),
        Launch("gemm_nn", 120.0, 6.0, 103.0, device=1),
    ]
    events = [annotation("ProfilerStep#1", 100.0, 10.0), *gpu_events(launches)]
    return write_trace(path, trace_document(events, devices=2, rank=rank), compress=compress)
