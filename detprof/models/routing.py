"""How a mixture of experts routes tokens and sizes its experts' slots, without Keras: the model
(``transformers.MixtureOfExperts``) and the kernels bench's dispatch case (``kernels_bench.torch_cases``) share it."""

from __future__ import annotations

import math

TOP_K = 2
"""Experts each token is routed to."""
CAPACITY_FACTOR = 1.25
"""Slots per expert over an even share of the assignments, as Switch and GShard size them."""


def expert_capacity(tokens: int, experts: int, top_k: int = TOP_K, capacity_factor: float = CAPACITY_FACTOR) -> int:
    """Each expert's slots: its even share of ``tokens`` x ``top_k`` assignments, times the capacity factor."""
    return math.ceil(tokens * top_k / experts * capacity_factor)
