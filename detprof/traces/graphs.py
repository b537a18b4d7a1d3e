"""Whether a trace holds the kernels of the CUDA graphs its process launched.

XLA launches its fusions and library calls through CUDA graphs, and so may TensorFlow
itself. nsys records a launched graph as one block unless it runs with
``--cuda-graph-trace=node``; its kernels then carry the graph node that launched them.
A trace with graph launches but no kernel from a graph node has lost those kernels: its
kernel time per step, its kernel table and every attribution drawn from it would be
wrong, so the run is not used. Where the trace records no API calls (nvprof, TensorFlow's
profiler), nothing can be checked and nothing is claimed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from detprof.traces.kernel_table import KernelTable


@dataclass(frozen=True)
class CudaGraphUse:
    launches: int | None
    """Graph launches in the trace; None where it records no API calls."""
    graph_kernels: int | None
    """Kernels a graph node launched; None where the trace cannot say."""

    @property
    def hidden(self) -> str | None:
        """Why the kernel table misses the graphs' kernels; None when it does not."""
        if self.launches and not self.graph_kernels:
            return (
                f"the trace records {self.launches} CUDA graph launch(es) but none of their kernels: "
                "nsys traced each graph as one block (it needs --cuda-graph-trace=node)"
            )
        return None

    def record(self) -> dict[str, Any]:
        """The run record's fields; none where the trace could not tell."""
        if self.launches is None:
            return {}
        return {"cuda_graph_launches": self.launches, "graph_kernel_count": self.graph_kernels}


def cuda_graph_use(table: KernelTable) -> CudaGraphUse:
    """How many graphs the trace's process launched and how many of its kernels came from them."""
    if table.graph_launches is None or table.is_summary:
        return CudaGraphUse(table.graph_launches, None)
    nodes = table.kernels["graph_node_id"]
    return CudaGraphUse(table.graph_launches, int((nodes.notna() & (nodes != 0)).sum()))
