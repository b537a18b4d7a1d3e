"""The PyTorch suite's cases: the medium CNN's convolutions, and the ops PyTorch lists under determinism.

The conv suite is the TensorFlow suite's, case for case: the same derivation reads the
layers off the registry's ``mediumcnn_k{k}`` (``cases.derive_in_subprocess``, so detprof's
own process loads no framework), and each case is rewritten in PyTorch's terms (NCHW, an
``[out, in, kh, kw]`` weight, symmetric padding), so that the two backends time the very
same convolutions and their model totals compare.

The ops suite is PyTorch's own lists in ``torch.use_deterministic_algorithms``: ops that
switch to a deterministic implementation (``index_add_``, ``scatter_add_``, ``index_put_``
and ``put_`` with ``accumulate=True``) and ops that refuse on CUDA (EmbeddingBag backward
with ``mode='max'``, bilinear ``interpolate`` backward, AdaptiveAvgPool2d backward, CTC loss
backward, ``bincount`` with weights, ``histc``, ``median`` with indices, floating-point
``cumsum``) or everywhere (``max_unpool2d``). The registry's CNNs have none of these layers,
so their sizes are typed here, each the size of the workload it is named after; ops with a
batch dimension take ``--batch-size`` (the paper preset's 64 puts bilinear upsampling at
64x128x56x56). The transformers' ops (``TRANSFORMER_OPS``) run at ``gpt_small``'s and
``moe_small``'s sizes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from detprof import backends
from detprof.kernels_bench.cases import CONV_OPS, OpCase, derive_in_subprocess
from detprof.models import registry
from detprof.models.routing import TOP_K, expert_capacity

Params = dict[str, Any]

LOOKUPS = 1_000_000
"""Rows added into a table per step: the gradient of a step's embedding lookups."""
TABLE_SHAPE = [100_000, 16]
VALUES = 10_000_000
"""Values a statistics op reads per step."""
MATRIX_SHAPE = [1_000, 10_000]
"""The same number of values, as rows reduced or scanned along their last dimension."""


@dataclass(frozen=True)
class TorchOpCase(OpCase):
    """An op case of the PyTorch suite: its own worker entry and PyTorch's layout in its description."""

    workload: ClassVar[str] = "detprof.kernels_bench.torch_ops:op_benchmark"

    @property
    def shape(self) -> str:
        return describe(self.op, self.params)


def _dims(shape: list[int]) -> str:
    return "x".join(str(d) for d in shape)


def describe(op: str, p: Params) -> str:
    """A shape as a person reads it: NCHW in, output channels, window/stride and padding for a convolution."""
    if op in CONV_OPS:
        out, _, kh, kw = p["weight_shape"]
        return f"{_dims(p['input_shape'])} -> {out}, {kh}x{kw}/{p['stride'][0]} pad {p['padding'][0]}"
    if op in ("index_add", "scatter_add", "index_put_accumulate", "moe_dispatch"):
        return f"{p['updates']} rows into {_dims(p['table_shape'])}"
    if op == "put_accumulate":
        return f"{p['updates']} values into {_dims(p['table_shape'])}"
    if op == "embedding_bag_backward":
        return f"{p['bags']} bags of {p['bag_size']} from {_dims(p['table_shape'])}, {p['mode']}"
    if op == "interpolate_bilinear_backward":
        return f"{_dims(p['input_shape'])}, x{p['scale_factor']} {p['mode']}"
    if op == "adaptive_avg_pool2d_backward":
        return f"{_dims(p['input_shape'])} -> {_dims(p['output_size'])}"
    if op == "max_unpool2d":
        n, c, h, w = p["output_shape"]
        k = p["kernel_size"]
        return f"{_dims([n, c, h // k, w // k])} -> {h}x{w}"
    if op == "ctc_loss_backward":
        return f"T={p['frames']} N={p['batch']} C={p['classes']} S={p['target_length']}"
    if op in ("bincount", "histc"):
        weighted = ", weighted" if op == "bincount" else ""
        return f"{p['values']} values into {p['bins']} bins{weighted}"
    if op == "embedding_backward":
        return f"{_dims(p['tokens'])} tokens from {_dims(p['table_shape'])}"
    if op == "sdpa_backward":
        return f"{_dims(p['shape'])}" + (", causal" if p["causal"] else "")
    if op == "layer_norm_backward_weight":
        return _dims(p["input_shape"])
    if op in ("median", "cumsum"):
        return f"{_dims(p['shape'])} along dim {p['dim']}"
    raise ValueError(f"no shape description for op {op!r}")


def _lookups(batch: int) -> Params:
    return {"updates": LOOKUPS, "table_shape": TABLE_SHAPE}


SizedOp = tuple[str, str, Callable[[int], Params]]
"""The workload a size is taken from (the case's model), the tensor it is (its layer), its params by batch size."""

SIZED_OPS: dict[str, SizedOp] = {
    "index_add": ("embedding", "table", _lookups),
    "scatter_add": ("gnn", "node_features", _lookups),
    "index_put_accumulate": ("embedding", "table", _lookups),
    "put_accumulate": ("embedding", "table", _lookups),
    "embedding_bag_backward": (
        "recsys",
        "table",
        lambda b: {"table_shape": [100_000, 128], "bags": 4_096, "bag_size": 32, "mode": "max"},
    ),
    "interpolate_bilinear_backward": (
        "segmentation",
        "upsample",
        lambda b: {"input_shape": [b, 128, 56, 56], "scale_factor": 2, "mode": "bilinear", "align_corners": False},
    ),
    # ResNet-50's head: the global average pool of its last 7x7 feature map.
    "adaptive_avg_pool2d_backward": (
        "resnet50",
        "avg_pool",
        lambda b: {"input_shape": [b, 2048, 7, 7], "output_size": [1, 1]},
    ),
    # SegNet's first decoder stage unpools back to the 224x224 input.
    "max_unpool2d": ("segnet", "decoder1", lambda b: {"output_shape": [b, 64, 224, 224], "kernel_size": 2}),
    # Ten seconds of speech in 10 ms frames subsampled 4x, a 100-character transcript, 31 characters and the blank.
    "ctc_loss_backward": (
        "asr",
        "ctc",
        lambda b: {"frames": 250, "batch": b, "classes": 32, "target_length": 100},
    ),
    "bincount": ("statistics", "values", lambda b: {"values": VALUES, "bins": 1_000}),
    "histc": ("statistics", "values", lambda b: {"values": VALUES, "bins": 100}),
    "median": ("statistics", "rows", lambda b: {"shape": MATRIX_SHAPE, "dim": 1}),
    "cumsum": ("statistics", "rows", lambda b: {"shape": MATRIX_SHAPE, "dim": 1}),
}
(LENGTH,), VOCABULARY = registry.TOKENS["small"]
WIDTH, HEADS = registry.TRANSFORMER_SIZES["small"]["width"], registry.TRANSFORMER_SIZES["small"]["heads"]
"""``gpt_small``'s sizes: the transformer ops run at them, ``--batch-size`` sequences."""


def _moe_dispatch(batch: int) -> Params:
    """``moe_small``'s dispatch: each token's choices added into its experts' slots."""
    tokens, experts = batch * LENGTH, registry.EXPERTS["small"]
    slots = experts * expert_capacity(tokens, experts)
    return {"updates": tokens * TOP_K, "table_shape": [slots, WIDTH]}


TRANSFORMER_OPS: dict[str, SizedOp] = {
    "embedding_backward": (
        "gpt_small",
        "token_embedding",
        lambda b: {"tokens": [b, LENGTH], "table_shape": [VOCABULARY, WIDTH]},
    ),
    "sdpa_backward": (
        "gpt_small",
        "attention",
        lambda b: {"shape": [b, HEADS, LENGTH, WIDTH // HEADS], "causal": True},
    ),
    "layer_norm_backward_weight": (
        "gpt_small",
        "layer_norm",
        lambda b: {"input_shape": [b, LENGTH, WIDTH]},
    ),
    "moe_dispatch": ("moe_small", "dispatch", _moe_dispatch),
}
"""The ops the transformers add: the embedding's gradient (a scatter-add into the table), attention's backward pass
(``scaled_dot_product_attention``, whichever back end PyTorch picks), layer norm's weight gradient (a reduction
over every position) and the experts' dispatch (``index_put_`` with ``accumulate=True``)."""
SIZED_OPS |= TRANSFORMER_OPS
OTHER_OPS = tuple(SIZED_OPS)
SUITES: dict[str, tuple[str, ...]] = {"conv": CONV_OPS, "ops": OTHER_OPS, "all": CONV_OPS + OTHER_OPS}


def _nchw(shape: list[int]) -> list[int]:
    n, h, w, c = shape
    return [n, c, h, w]


def _padding(size: int, out: int, k: int, stride: int, dilation: int, padding: str) -> int:
    """TensorFlow's padding as PyTorch's one symmetric number; one that TensorFlow splits unevenly has none."""
    total = 0 if padding == "VALID" else max((out - 1) * stride + (k - 1) * dilation + 1 - size, 0)
    if total % 2:
        raise ValueError(f"TensorFlow pads {total} unevenly here, which PyTorch's conv2d cannot express")
    return total // 2


def conv_case(case: OpCase) -> TorchOpCase:
    """A TensorFlow conv case (NHWC, ``[kh, kw, in, out]`` filter) as the same convolution in PyTorch."""
    p = case.params
    kh, kw, cin, cout = p["filter_shape"]
    (_, h, w, _), (_, oh, ow, _) = p["input_shape"], p["output_shape"]
    stride, dilation = p["strides"][1:3], p["dilations"][1:3]
    padding = [
        _padding(size, out, k, s, d, p["padding"])
        for size, out, k, s, d in zip((h, w), (oh, ow), (kh, kw), stride, dilation, strict=True)
    ]
    params = {
        "input_shape": _nchw(p["input_shape"]),
        "weight_shape": [cout, cin, kh, kw],
        "output_shape": _nchw(p["output_shape"]),
        "stride": stride,
        "padding": padding,
        "dilation": dilation,
    }
    return TorchOpCase(case.op, case.model, case.layers, params, case.work)


def derive_cases(
    ops: list[str], kernel_sizes: list[int], batch_size: int, input_size: int | None, max_shapes: int | None = None
) -> list[OpCase]:
    """Every case of ``ops``: the conv cases from the registry's medium CNNs, the others at their sizes."""
    conv_ops = [op for op in ops if op in CONV_OPS]
    cases: list[OpCase] = []
    if conv_ops:
        derived = derive_in_subprocess(
            backends.TORCH,
            ops=conv_ops,
            kernel_sizes=kernel_sizes,
            batch_size=batch_size,
            input_size=input_size,
            max_shapes=max_shapes,
        )
        cases = [conv_case(case) for case in derived]
    for op in ops:
        if op in SIZED_OPS:
            model, layer, params = SIZED_OPS[op]
            cases.append(TorchOpCase(op, model, (layer,), params(batch_size)))
    return cases
