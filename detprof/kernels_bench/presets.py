"""kernels_bench's presets, in one place: what ``detprof kernels`` runs when an option is not given.

Each backend has the same presets by name (``choose_target`` picks one by device), each with
its own suite's ops.
"""

from __future__ import annotations

from typing import Any

from detprof import backends
from detprof.kernels_bench.op_names import CONV_OPS
from detprof.profiler.presets import PAPER_PROTOCOL

PRESETS: dict[str, dict[str, Any]] = {
    "paper": {"suite": "all", "ops": None, "kernel_sizes": (1, 3, 5, 7), **PAPER_PROTOCOL, "max_shapes": None},
    # Five cases x 2 modes x 3 repeats = 30 worker processes, which is what 2 cores start and
    # trace in about 3 minutes. On a CPU only the Python-level switch of sparse cross-entropy
    # changes kernels; the convolutions (the conv suite's question) and the overlapping
    # max-pool (the ops suite's cross-model shapes) show that the rest stay the same.
    "cpu-small": {
        "suite": "all",
        "ops": (*CONV_OPS, "max_pool_backward", "sparse_softmax_xent_backward"),
        "kernel_sizes": (3,),
        "steps": 30,
        "warmup": 3,
        "repeats": 3,
        "batch_size": 8,
        "input_size": 32,
        "max_shapes": 1,
    },
}

TORCH_PRESETS: dict[str, dict[str, Any]] = {
    "paper": PRESETS["paper"],
    # The whole suite: 16 cases x 2 modes x 3 repeats, with the ops at their full sizes (up to
    # 0.6 s a step on one core), so 3 steps per phase: about 3 minutes of CPU time on 2 cores.
    # On a CPU PyTorch's lists change little (max_unpool2d refuses); what shows is the memory
    # that determinism fills before use (+aten::fill_) and the cases that stay the same.
    "cpu-small": {
        "suite": "all",
        "ops": None,
        "kernel_sizes": (3,),
        "steps": 3,
        "warmup": 1,
        "repeats": 3,
        "batch_size": 8,
        "input_size": 32,
        "max_shapes": 1,
    },
}
BACKEND_PRESETS: dict[str, dict[str, dict[str, Any]]] = {backends.TENSORFLOW: PRESETS, backends.TORCH: TORCH_PRESETS}
