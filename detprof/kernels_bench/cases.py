"""Which operation at which shape: every case is read off a layer of a registry model.

Shapes are never typed here. The conv suite builds ``mediumcnn_k{k}`` at the configured
input size and walks its Conv2D layers, so that a layer's forward, backward-data and
backward-filter costs add up to that model's convolution time in the sweep. The first
layer reads the data, which needs no gradient, so it has no backward-data case. The ops
suite reads its shapes off the models where each op matters:

- depthwise convolutions: MobileNet's and EfficientNet-B0's DepthwiseConv2D layers;
- max-pool backward: the medium CNN's 2x2/2 pools (windows that do not overlap) and
  ResNet-50's 3x3/2 stem pool (windows that overlap, so gradients collide);
- bias-add and fused batch-norm backward: the medium CNN's conv outputs and BatchNorm
  inputs. Keras 3 adds biases with a broadcast add and normalizes with plain reductions,
  so its models run neither kernel; tf.keras 2 models and ``tf.nn`` code do;
- unsorted_segment_sum, scatter_nd and tensor_scatter_nd_add: one row per example added
  into a (classes x features) table, which is the gradient of looking rows up in a table.
  The registry's CNNs have no embedding layer; the weight matrix of their logits layer is
  the one table-shaped tensor they all have, and at 1000 x 512..1280 it is the size of a
  mid-sized embedding. The three ops get the same work, so they compare with each other;
- sparse softmax cross-entropy backward and dense matmul: the logits layer (1000 classes);
- the transformers' ops, read off ``gpt_small`` and ``moe_small`` (``--input-size`` their sequence
  length): the token embedding's gradient (rows added into the table), attention's backward pass
  (each block's; Keras on TensorFlow runs attention as matrix products and a softmax), layer norm's
  scale gradient and the experts' dispatch (each token's choices added into its experts' slots).

The bench derives its cases in a child process (``derive_in_subprocess``) with GPUs
hidden: building the models needs Keras on the bench's framework, which the parent never
imports, so that it holds no memory of its own on the GPU or the host while the workers
measure, and prints none of the framework's start-up chatter.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar

from detprof import backends
from detprof.backends import import_keras
from detprof.errors import UsageError, first_line
from detprof.kernels_bench.op_names import CONV_OPS
from detprof.profiler.worker_call import call_in_worker

if TYPE_CHECKING:
    import keras

    from detprof.models import registry

OTHER_OPS = (
    "depthwise_conv_forward",
    "depthwise_conv_backward_data",
    "depthwise_conv_backward_filter",
    "max_pool_backward",
    "bias_add_backward",
    "fused_batch_norm_backward",
    "unsorted_segment_sum",
    "scatter_nd",
    "tensor_scatter_nd_add",
    "sparse_softmax_xent_backward",
    "dense_matmul",
    "embedding_backward",
    "attention_backward",
    "layer_norm_backward_weight",
    "moe_dispatch",
)
SUITES: dict[str, tuple[str, ...]] = {"conv": CONV_OPS, "ops": OTHER_OPS, "all": CONV_OPS + OTHER_OPS}

DEPTHWISE_MODELS = ("mobilenet", "efficientnetb0")
POOL_MODELS = ("mediumcnn_k3", "resnet50")
MEDIUM_CNN = "mediumcnn_k3"
LOGITS_MODELS = ("mediumcnn_k3", "efficientnetb0")
GPT, MOE = "gpt_small", "moe_small"


@dataclass(frozen=True)
class OpCase:
    """One op at one shape; ``layers`` are every model layer that has this very shape."""

    workload: ClassVar[str] = "detprof.kernels_bench.ops:op_benchmark"
    """The worker's entry point that builds and runs the op (``module:function``): TensorFlow's ops here. Both modes
    in one process are this step built under each mode's switches (``workloads.switched_arms``)."""

    op: str
    model: str
    layers: tuple[str, ...]
    params: dict[str, Any] = field(hash=False)
    work: int = field(default=0, compare=False)

    @property
    def layer(self) -> str:
        return self.layers[0]

    @property
    def key(self) -> str:
        return f"{self.op}@{self.model}.{self.layer}"

    @property
    def shape(self) -> str:
        return describe(self.op, self.params)

    def as_dict(self) -> dict[str, Any]:
        return {
            "case": self.key,
            "op": self.op,
            "model": self.model,
            "layers": list(self.layers),
            "shape": self.shape,
            "params": self.params,
            "work": self.work,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OpCase:
        return cls(d["op"], d["model"], tuple(d["layers"]), d["params"], int(d["work"]))


def _dims(shape: Iterable[int]) -> str:
    return "x".join(str(d) for d in shape)


def describe(op: str, p: dict[str, Any]) -> str:
    """A shape as a person reads it: NHWC in, output channels, window/stride, padding."""
    if op.startswith(("conv2d", "depthwise")):
        kh, kw, _, out = p["filter_shape"]
        window = f"{kh}x{kw}/{p['strides'][1]} {p['padding'].lower()}"
        if op.startswith("depthwise"):
            return f"{_dims(p['input_shape'])}, {window}"
        return f"{_dims(p['input_shape'])} -> {out}, {window}"
    if op == "max_pool_backward":
        return f"{_dims(p['input_shape'])}, {p['ksize'][1]}x{p['ksize'][2]}/{p['strides'][1]} " + p["padding"].lower()
    if op == "bias_add_backward":
        return _dims(p["output_shape"])
    if op == "fused_batch_norm_backward":
        return _dims(p["input_shape"])
    if op in ("unsorted_segment_sum", "scatter_nd", "tensor_scatter_nd_add"):
        return f"{p['rows']} rows into {_dims(p['table_shape'])}"
    if op == "sparse_softmax_xent_backward":
        return _dims(p["logits_shape"])
    if op == "dense_matmul":
        return f"{_dims(p['input_shape'])} @ {_dims(p['kernel_shape'])}"
    if op == "embedding_backward":
        return f"{_dims(p['tokens'])} tokens from {_dims(p['table_shape'])}"
    if op == "attention_backward":
        return _dims(p["shape"]) + (", causal" if p["causal"] else "")
    if op == "layer_norm_backward_weight":
        return _dims(p["input_shape"])
    if op == "moe_dispatch":
        return f"{p['updates']} rows into {_dims(p['table_shape'])}"
    raise ValueError(f"no shape description for op {op!r}")


def _batched(shape: tuple[int | None, ...], batch: int) -> list[int]:
    return [batch, *(int(d) for d in shape[1:] if d is not None)]


def _window(layer: Any, batch: int, out_channels: str) -> dict[str, Any]:
    """A convolution's parameters as the raw TF op takes them (NHWC, 4-D strides); the filter's
    last dimension is the layer's ``filters`` (Conv2D) or ``depth_multiplier`` (DepthwiseConv2D)."""
    config = layer.get_config()
    input_shape = _batched(layer.input.shape, batch)
    kh, kw = config["kernel_size"]
    sh, sw = config["strides"]
    dh, dw = config["dilation_rate"]
    return {
        "input_shape": input_shape,
        "filter_shape": [kh, kw, input_shape[-1], int(config[out_channels])],
        "output_shape": _batched(layer.output.shape, batch),
        "strides": [1, sh, sw, 1],
        "dilations": [1, dh, dw, 1],
        "padding": config["padding"].upper(),
    }


def _multiply_adds(params: dict[str, Any], depthwise: bool) -> int:
    """Each output element sums one window: over every input channel, or over its own in depthwise."""
    kh, kw, cin, _ = params["filter_shape"]
    return math.prod(params["output_shape"]) * kh * kw * (1 if depthwise else cin)


def _reads_input(layer: Any, model: keras.Model) -> bool:
    return any(layer.input is tensor for tensor in model.inputs)


class _Models:
    """Registry models, each built once, at the configured input size."""

    def __init__(self, input_size: int | None) -> None:
        self.input_size = input_size
        self._built: dict[str, keras.Model] = {}

    def get(self, name: str) -> keras.Model:
        """A registry model; a medium CNN of a kernel size the registry does not list is built
        from the registry's own definition (``paper_cnns.medium_cnn``) with that kernel size."""
        if name not in self._built:
            from detprof.models import paper_cnns, registry

            if name in registry.BUILT_IN:
                spec = registry.get(name)
                self._built[name] = self._build(name, spec, lambda s: spec.build(s, spec.classes))
            else:
                k = int(name.removeprefix("mediumcnn_k"))
                base = registry.get(MEDIUM_CNN)
                build = partial(paper_cnns.medium_cnn, classes=base.classes, kernel_size=k)
                self._built[name] = self._build(name, base, build)
        return self._built[name]

    def _build(
        self, name: str, spec: registry.ModelSpec, build: Callable[[registry.InputShape], keras.Model]
    ) -> keras.Model:
        size = self.input_size
        shape = spec.input_shape if size is None else spec.shape_at(size)
        try:
            return build(shape)
        except ValueError as exc:
            raise UsageError(f"--input-size {size}: {name} cannot be built at {shape} ({first_line(exc)})") from exc


def _layers(model: keras.Model, kind: str) -> list[Any]:
    import keras

    return [layer for layer in model.layers if isinstance(layer, getattr(keras.layers, kind))]


def _window_cases(models: _Models, op: str, model_name: str, batch: int, *, depthwise: bool) -> list[OpCase]:
    """One case per convolution layer of ``model_name``; backward-data skips the layer that reads the data."""
    model = models.get(model_name)
    cases = []
    for layer in _layers(model, "DepthwiseConv2D" if depthwise else "Conv2D"):
        if op.endswith("backward_data") and _reads_input(layer, model):
            continue
        params = _window(layer, batch, "depth_multiplier" if depthwise else "filters")
        cases.append(OpCase(op, model_name, (layer.name,), params, _multiply_adds(params, depthwise=depthwise)))
    return cases


def _depthwise_cases(models: _Models, op: str, batch: int) -> list[OpCase]:
    return [case for name in DEPTHWISE_MODELS for case in _window_cases(models, op, name, batch, depthwise=True)]


def _pool_cases(models: _Models, op: str, batch: int) -> list[OpCase]:
    cases = []
    for model_name in POOL_MODELS:
        for layer in _layers(models.get(model_name), "MaxPooling2D"):
            config = layer.get_config()
            (ph, pw), (sh, sw) = config["pool_size"], config["strides"]
            params = {
                "input_shape": _batched(layer.input.shape, batch),
                "ksize": [1, ph, pw, 1],
                "strides": [1, sh, sw, 1],
                "padding": config["padding"].upper(),
            }
            cases.append(OpCase(op, model_name, (layer.name,), params, math.prod(params["input_shape"])))
    return cases


def _bias_cases(models: _Models, op: str, batch: int) -> list[OpCase]:
    cases = []
    for layer in _layers(models.get(MEDIUM_CNN), "Conv2D"):
        if layer.get_config()["use_bias"]:
            params = {"output_shape": _batched(layer.output.shape, batch)}
            cases.append(OpCase(op, MEDIUM_CNN, (layer.name,), params, math.prod(params["output_shape"])))
    return cases


def _batch_norm_cases(models: _Models, op: str, batch: int) -> list[OpCase]:
    cases = []
    for layer in _layers(models.get(MEDIUM_CNN), "BatchNormalization"):
        params = {"input_shape": _batched(layer.input.shape, batch), "epsilon": float(layer.get_config()["epsilon"])}
        cases.append(OpCase(op, MEDIUM_CNN, (layer.name,), params, math.prod(params["input_shape"])))
    return cases


def _logits_cases(models: _Models, op: str, batch: int) -> list[OpCase]:
    cases = []
    for model_name in LOGITS_MODELS:
        logits = _layers(models.get(model_name), "Dense")[-1]
        features, classes = int(logits.input.shape[-1]), int(logits.get_config()["units"])
        if op == "dense_matmul":
            params: dict[str, Any] = {"input_shape": [batch, features], "kernel_shape": [features, classes]}
            work = batch * features * classes
        elif op == "sparse_softmax_xent_backward":
            params, work = {"logits_shape": [batch, classes]}, batch * classes
        else:
            params, work = {"rows": batch, "table_shape": [classes, features]}, batch * features
        cases.append(OpCase(op, model_name, (logits.name,), params, work))
    return cases


def _transformer_cases(models: _Models, op: str, batch: int) -> list[OpCase]:
    """The transformers' ops at ``gpt_small``'s layers (the experts' dispatch at ``moe_small``'s), each block's."""
    from detprof.models import transformers
    from detprof.models.routing import expert_capacity

    model = models.get(MOE if op == "moe_dispatch" else GPT)
    tokens = [batch, int(model.inputs[0].shape[1])]
    width = int(model.get_layer("token_embedding").output.shape[-1])
    cases = []
    if op == "embedding_backward":
        table = [int(model.get_layer("token_embedding").input_dim), width]
        cases.append(
            OpCase(op, GPT, ("token_embedding",), {"tokens": tokens, "table_shape": table}, math.prod(tokens) * width)
        )
    for layer in model.layers:
        if op == "attention_backward" and isinstance(layer, transformers.SelfAttention):
            params = {"shape": [batch, layer.heads, tokens[1], width // layer.heads], "causal": layer.causal}
            cases.append(OpCase(op, GPT, (layer.name,), params, batch * tokens[1] ** 2 * width))
        if op == "layer_norm_backward_weight" and isinstance(layer, _keras_layer("LayerNormalization")):
            cases.append(OpCase(op, GPT, (layer.name,), {"input_shape": [*tokens, width]}, math.prod(tokens) * width))
        if op == "moe_dispatch" and isinstance(layer, transformers.MixtureOfExperts):
            routed = math.prod(tokens)
            slots = layer.experts * expert_capacity(routed, layer.experts, layer.top_k, layer.capacity_factor)
            params = {"updates": routed * layer.top_k, "table_shape": [slots, width]}
            cases.append(OpCase(op, MOE, (layer.name,), params, routed * layer.top_k * width))
    return cases


def _keras_layer(kind: str) -> type:
    import keras

    return getattr(keras.layers, kind)


_OTHER_DERIVERS: dict[str, Callable[[_Models, str, int], list[OpCase]]] = {
    **{op: _depthwise_cases for op in OTHER_OPS if op.startswith("depthwise")},
    "max_pool_backward": _pool_cases,
    "bias_add_backward": _bias_cases,
    "fused_batch_norm_backward": _batch_norm_cases,
    **{
        op: _logits_cases
        for op in (
            "unsorted_segment_sum",
            "scatter_nd",
            "tensor_scatter_nd_add",
            "sparse_softmax_xent_backward",
            "dense_matmul",
        )
    },
    **{
        op: _transformer_cases
        for op in ("embedding_backward", "attention_backward", "layer_norm_backward_weight", "moe_dispatch")
    },
}


def _merge_same_shapes(cases: list[OpCase]) -> list[OpCase]:
    """Layers with one shape are one case: measuring it again would only cost time."""
    merged: dict[tuple[str, str], OpCase] = {}
    for case in cases:
        signature = (case.op, repr(sorted(case.params.items())))
        first = merged.get(signature)
        if first is None:
            merged[signature] = case
        else:
            named = (name if case.model == first.model else f"{case.model}.{name}" for name in case.layers)
            layers = (*first.layers, *named)
            merged[signature] = OpCase(first.op, first.model, layers, first.params, first.work)
    return list(merged.values())


def _largest(cases: list[OpCase], max_shapes: int, group: Callable[[OpCase], Any]) -> list[OpCase]:
    """The ``max_shapes`` cases with the most work in each group, in their original order."""
    keep: set[int] = set()
    groups: dict[Any, list[int]] = {}
    for index, case in enumerate(cases):
        groups.setdefault(group(case), []).append(index)
    for indices in groups.values():
        ranked = sorted(indices, key=lambda i: (-cases[i].work, i))
        keep.update(ranked[:max_shapes])
    return [case for index, case in enumerate(cases) if index in keep]


def derive_cases(
    ops: Iterable[str],
    kernel_sizes: Iterable[int],
    batch_size: int,
    input_size: int | None,
    max_shapes: int | None = None,
) -> list[OpCase]:
    """Every case of ``ops``, op by op; ``max_shapes`` keeps the largest per op (and kernel size)."""
    models = _Models(input_size)
    cases: list[OpCase] = []
    for op in ops:
        if op in CONV_OPS:
            for k in kernel_sizes:
                cases.extend(_window_cases(models, op, f"mediumcnn_k{k}", batch_size, depthwise=False))
        else:
            cases.extend(_OTHER_DERIVERS[op](models, op, batch_size))
    cases = _merge_same_shapes(cases)
    if max_shapes:
        cases = _largest(cases, max_shapes, lambda c: (c.op, c.model if c.op in CONV_OPS else None))
    return cases


def case_dicts(backend: str, **request: Any) -> list[dict[str, Any]]:
    """``derive_cases`` as JSON-ready dicts: what the worker process answers ``derive_in_subprocess`` with.

    The models are built by Keras on the bench's own framework: a machine that has only
    PyTorch has no TensorFlow for Keras to fall back on, and on one that has both, the layers'
    configurations read here would load TensorFlow into a PyTorch bench's worker for nothing
    (``backends.keep_out_for_good``).
    """
    backends.keep_out_for_good(backend)
    import_keras(backend)
    return [case.as_dict() for case in derive_cases(**request)]


def derive_in_subprocess(backend: str, **request: Any) -> list[OpCase]:
    """``derive_cases(**request)`` in a fresh worker process on ``backend`` that sees no GPU; its errors come back
    as they were."""
    answer = call_in_worker(
        "detprof.kernels_bench.cases:case_dicts",
        {"backend": backend, **request},
        "deriving the op shapes from the registry models",
    )
    return [OpCase.from_dict(d) for d in answer]
