"""The worker side of the PyTorch suite: one operation, built from its case's parameters, run once per step.

The ops are those PyTorch itself lists under ``torch.use_deterministic_algorithms``: some
switch to another implementation when determinism is on, others refuse ("... does not have
a deterministic implementation"), and the worker records a refusal as "unsupported" with
PyTorch's message. Most of those lists are about CUDA, so on a CPU most ops run the same
code in both modes: there ``index_put_`` and ``put_`` with ``accumulate=True`` change
implementation, and ``max_unpool2d`` refuses (as it does everywhere).

A gradient is timed as training computes it: ``torch.autograd.grad`` over a one-op graph
built once and retained, with only the input whose gradient is the case requiring one
(a convolution's data or filter gradient alone, as PyTorch's autograd asks
``convolution_backward`` for exactly the gradients it needs). Inputs are made on the op's
device from a generator seeded by the run's seed, so no host-to-device copy is timed; the
step waits for the GPU before returning.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from detprof.profiler.worker_spec import WorkerSpec

Step = Callable[[], None]
Params = dict[str, Any]


class _Inputs:
    """Seeded random tensors on ``device``, each from its own stream so that adding one changes no other."""

    def __init__(self, seed: int, device: str) -> None:
        self.seed = seed
        self.device = device
        self.count = 0

    def _generator(self) -> torch.Generator:
        import torch

        self.count += 1
        return torch.Generator(self.device).manual_seed(self.seed * 1_000_003 + self.count)

    def normal(self, shape: list[int], *, grad: bool = False) -> torch.Tensor:
        import torch

        tensor = torch.randn(shape, generator=self._generator(), device=self.device)
        return tensor.requires_grad_(grad)

    def ints(self, shape: list[int], high: int, low: int = 0) -> torch.Tensor:
        import torch

        return torch.randint(low, high, shape, generator=self._generator(), device=self.device)


Builder = Callable[[Params, _Inputs], Callable[[], Any]]


def _gradient(output: torch.Tensor, wrt: torch.Tensor, inputs: _Inputs) -> Callable[[], Any]:
    """The backward pass of the graph that made ``output``, for ``wrt`` alone, as often as the step asks."""
    import torch

    grad_output = inputs.normal(list(output.shape)) if output.dim() else None
    return lambda: torch.autograd.grad(output, wrt, grad_output, retain_graph=True)


def _conv_args(p: Params) -> dict[str, Any]:
    return {"stride": p["stride"], "padding": p["padding"], "dilation": p["dilation"]}


def _conv_forward(p: Params, inputs: _Inputs) -> Callable[[], Any]:
    from torch.nn import functional as F

    x, w = inputs.normal(p["input_shape"]), inputs.normal(p["weight_shape"])
    return lambda: F.conv2d(x, w, **_conv_args(p))


def _conv_backward(wrt_data: bool) -> Builder:
    """The data gradient (``dL/dx``) or the filter gradient (``dL/dw``) alone."""

    def build(p: Params, inputs: _Inputs) -> Callable[[], Any]:
        from torch.nn import functional as F

        x, w = inputs.normal(p["input_shape"], grad=wrt_data), inputs.normal(p["weight_shape"], grad=not wrt_data)
        return _gradient(F.conv2d(x, w, **_conv_args(p)), x if wrt_data else w, inputs)

    return build


def _rows_into_table(p: Params, inputs: _Inputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``updates`` rows added into a table at random rows: the gradient of looking rows up in it."""
    rows, features = p["table_shape"]
    table = inputs.normal(p["table_shape"])
    return table, inputs.ints([p["updates"]], rows), inputs.normal([p["updates"], features])


def _index_add(p: Params, inputs: _Inputs) -> Callable[[], Any]:
    table, index, updates = _rows_into_table(p, inputs)
    return lambda: table.index_add_(0, index, updates)


def _scatter_add(p: Params, inputs: _Inputs) -> Callable[[], Any]:
    """The message-passing form: the row index broadcast over the features (a view, no copy)."""
    table, index, updates = _rows_into_table(p, inputs)
    expanded = index[:, None].expand_as(updates)
    return lambda: table.scatter_add_(0, expanded, updates)


def _index_put_accumulate(p: Params, inputs: _Inputs) -> Callable[[], Any]:
    """What autograd runs for the backward of ``table[index]``."""
    table, index, updates = _rows_into_table(p, inputs)
    return lambda: table.index_put_((index,), updates, accumulate=True)


def _put_accumulate(p: Params, inputs: _Inputs) -> Callable[[], Any]:
    import math

    table = inputs.normal(p["table_shape"])
    index, values = inputs.ints([p["updates"]], math.prod(p["table_shape"])), inputs.normal([p["updates"]])
    return lambda: table.put_(index, values, accumulate=True)


def _embedding_bag_backward(p: Params, inputs: _Inputs) -> Callable[[], Any]:
    import torch
    from torch.nn import functional as F

    rows, _ = p["table_shape"]
    table = inputs.normal(p["table_shape"], grad=True)
    lookups = p["bags"] * p["bag_size"]
    offsets = torch.arange(0, lookups, p["bag_size"], device=inputs.device)
    bags = F.embedding_bag(inputs.ints([lookups], rows), table, offsets, mode=p["mode"])
    return _gradient(bags, table, inputs)


def _interpolate_backward(p: Params, inputs: _Inputs) -> Callable[[], Any]:
    from torch.nn import functional as F

    x = inputs.normal(p["input_shape"], grad=True)
    y = F.interpolate(x, scale_factor=p["scale_factor"], mode=p["mode"], align_corners=p["align_corners"])
    return _gradient(y, x, inputs)


def _adaptive_avg_pool2d_backward(p: Params, inputs: _Inputs) -> Callable[[], Any]:
    from torch.nn import functional as F

    x = inputs.normal(p["input_shape"], grad=True)
    return _gradient(F.adaptive_avg_pool2d(x, p["output_size"]), x, inputs)


def _ctc_loss_backward(p: Params, inputs: _Inputs) -> Callable[[], Any]:
    """Every utterance ``frames`` long with a ``target_length`` transcript; class 0 is the blank."""
    import torch
    from torch.nn import functional as F

    frames, batch, classes, length = p["frames"], p["batch"], p["classes"], p["target_length"]
    log_probs = inputs.normal([frames, batch, classes]).log_softmax(2).requires_grad_()
    targets = inputs.ints([batch, length], classes, low=1)
    input_lengths = torch.full((batch,), frames, dtype=torch.long, device=inputs.device)
    target_lengths = torch.full((batch,), length, dtype=torch.long, device=inputs.device)
    loss = F.ctc_loss(log_probs, targets, input_lengths, target_lengths)
    return _gradient(loss, log_probs, inputs)


def _bincount(p: Params, inputs: _Inputs) -> Callable[[], Any]:
    import torch

    values, weights = inputs.ints([p["values"]], p["bins"]), inputs.normal([p["values"]])
    return lambda: torch.bincount(values, weights, minlength=p["bins"])


def _histc(p: Params, inputs: _Inputs) -> Callable[[], Any]:
    """PyTorch's defaults (``min = max = 0``): the range is the data's own, as a histogram logger uses it."""
    import torch

    values = inputs.normal([p["values"]])
    return lambda: torch.histc(values, bins=p["bins"])


def _median(p: Params, inputs: _Inputs) -> Callable[[], Any]:
    import torch

    x = inputs.normal(p["shape"])
    return lambda: torch.median(x, dim=p["dim"])


def _cumsum(p: Params, inputs: _Inputs) -> Callable[[], Any]:
    import torch

    x = inputs.normal(p["shape"])
    return lambda: torch.cumsum(x, dim=p["dim"])


def _max_unpool2d(p: Params, inputs: _Inputs) -> Callable[[], Any]:
    """A SegNet decoder's unpooling: the max-pool indices of the matching encoder stage put values back."""
    from torch.nn import functional as F

    k = p["kernel_size"]
    pooled, indices = F.max_pool2d(inputs.normal(p["output_shape"]), k, return_indices=True)
    return lambda: F.max_unpool2d(pooled, indices, k)


def _embedding_backward(p: Params, inputs: _Inputs) -> Callable[[], Any]:
    """The token embedding's gradient: every looked-up row's gradient added into the table."""
    from torch.nn import functional as F

    table = inputs.normal(p["table_shape"], grad=True)
    return _gradient(F.embedding(inputs.ints(p["tokens"], p["table_shape"][0]), table), table, inputs)


def _sdpa_backward(p: Params, inputs: _Inputs) -> Callable[[], Any]:
    """Attention's backward pass for the queries, keys and values together, as training asks for all three."""
    import torch
    from torch.nn import functional as F

    q, k, v = (inputs.normal(p["shape"], grad=True) for _ in range(3))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=p["causal"])
    grad_output = inputs.normal(p["shape"])
    return lambda: torch.autograd.grad(out, (q, k, v), grad_output, retain_graph=True)


def _layer_norm_backward_weight(p: Params, inputs: _Inputs) -> Callable[[], Any]:
    """Layer norm's scale gradient: a sum over every position of the batch."""
    from torch.nn import functional as F

    width = p["input_shape"][-1]
    weight = inputs.normal([width], grad=True)
    return _gradient(F.layer_norm(inputs.normal(p["input_shape"]), [width], weight), weight, inputs)


BUILDERS: dict[str, Builder] = {
    "conv2d_forward": _conv_forward,
    "conv2d_backward_data": _conv_backward(wrt_data=True),
    "conv2d_backward_filter": _conv_backward(wrt_data=False),
    "index_add": _index_add,
    "scatter_add": _scatter_add,
    "index_put_accumulate": _index_put_accumulate,
    "put_accumulate": _put_accumulate,
    "embedding_bag_backward": _embedding_bag_backward,
    "interpolate_bilinear_backward": _interpolate_backward,
    "adaptive_avg_pool2d_backward": _adaptive_avg_pool2d_backward,
    "ctc_loss_backward": _ctc_loss_backward,
    "bincount": _bincount,
    "histc": _histc,
    "median": _median,
    "cumsum": _cumsum,
    "max_unpool2d": _max_unpool2d,
    "embedding_backward": _embedding_backward,
    "sdpa_backward": _sdpa_backward,
    "layer_norm_backward_weight": _layer_norm_backward_weight,
    "moe_dispatch": _index_put_accumulate,
}


def op_benchmark(worker: WorkerSpec) -> tuple[Step, dict[str, Any]]:
    """The worker's workload for a PyTorch op case: the spec's ``params`` hold ``op`` and its ``params``.

    Runs where the worker has already switched PyTorch into the run's mode; the op is built
    (and any refusal at build time raised) here, so that a refusal is the run's finding.
    """
    import torch

    spec = worker.params
    device = "cuda" if torch.cuda.is_available() else "cpu"
    compute = BUILDERS[spec["op"]](spec["params"], _Inputs(worker.determinism.seed, device))
    on_gpu = device == "cuda"

    def step() -> None:
        compute()
        if on_gpu:
            torch.cuda.synchronize()

    facts = {"op": spec["op"], "params": spec["params"], "dtype": "float32", "on_gpu": on_gpu}
    return step, facts
