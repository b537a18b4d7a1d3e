"""The worker side of kernels_bench: one operation, built from its case's parameters, run once per step.

Each op calls the raw TensorFlow kernel that a training step would run for it, so that the
forward pass, the gradient with respect to the data and the gradient with respect to the
filter are timed apart: determinism changes them differently (cuDNN restricts its
backward algorithms, bias and segment gradients trade atomics for reductions, scatters
move to the CPU). The one exception is sparse softmax cross-entropy, which goes through
``tf.nn``: there it is the Python API that swaps in another implementation under
determinism, and measuring the raw op would miss exactly that.

Inputs are made on the op's device by stateless random ops seeded from the run's seed,
so no host-to-device copy is timed. The step is a ``tf.function`` (the TF profiler sees
no op events of eager execution on the CPU) and waits for the device before returning.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from detprof.profiler.worker_spec import WorkerSpec

Step = Callable[[], None]
Params = dict[str, Any]


class _Inputs:
    """Seeded random tensors, each from its own stream so that adding one changes no other."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.count = 0

    def _next_seed(self) -> list[int]:
        self.count += 1
        return [self.seed, self.count]

    def normal(self, shape: list[int]) -> Any:
        import tensorflow as tf

        return tf.random.stateless_normal(shape, seed=self._next_seed())

    def ints(self, shape: list[int], high: int) -> Any:
        import tensorflow as tf

        return tf.random.stateless_uniform(shape, seed=self._next_seed(), maxval=high, dtype=tf.int32)


Builder = Callable[[Params, "_Inputs"], Callable[[], Any]]


def _conv_attrs(p: Params) -> dict[str, Any]:
    return {"strides": p["strides"], "padding": p["padding"], "dilations": p["dilations"]}


def _conv_forward(raw_op: str) -> Builder:
    """Forward convolution through ``tf.raw_ops.<raw_op>`` (Conv2D or its depthwise twin)."""

    def build(p: Params, inputs: _Inputs) -> Callable[[], Any]:
        import tensorflow as tf

        op = getattr(tf.raw_ops, raw_op)
        x, w = inputs.normal(p["input_shape"]), inputs.normal(p["filter_shape"])
        return lambda: op(input=x, filter=w, **_conv_attrs(p))

    return build


def _conv_backward(raw_op: str, operand: str, gradient_of: str) -> Builder:
    """One gradient alone: ``dL/d<gradient_of>`` (input or filter) from the other operand and the output gradient."""

    def build(p: Params, inputs: _Inputs) -> Callable[[], Any]:
        import tensorflow as tf

        op = getattr(tf.raw_ops, raw_op)
        tensors = {operand: inputs.normal(p[f"{operand}_shape"]), "out_backprop": inputs.normal(p["output_shape"])}
        tensors[f"{gradient_of}_sizes"] = tf.constant(p[f"{gradient_of}_shape"], tf.int32)
        return functools.partial(op, **tensors, **_conv_attrs(p))

    return build


def _max_pool_backward(p: Params, inputs: _Inputs) -> Callable[[], Any]:
    import tensorflow as tf

    x = inputs.normal(p["input_shape"])
    window = {"ksize": p["ksize"], "strides": p["strides"], "padding": p["padding"]}
    y = tf.raw_ops.MaxPool(input=x, **window)
    dy = inputs.normal(y.shape.as_list())
    return lambda: tf.raw_ops.MaxPoolGrad(orig_input=x, orig_output=y, grad=dy, **window)


def _bias_add_backward(p: Params, inputs: _Inputs) -> Callable[[], Any]:
    import tensorflow as tf

    dy = inputs.normal(p["output_shape"])
    return lambda: tf.raw_ops.BiasAddGrad(out_backprop=dy)


def _fused_batch_norm_backward(p: Params, inputs: _Inputs) -> Callable[[], Any]:
    import tensorflow as tf

    shape = p["input_shape"]
    channels = shape[-1]
    x, dy = inputs.normal(shape), inputs.normal(shape)
    scale, offset = inputs.normal([channels]), inputs.normal([channels])
    empty = tf.zeros([0])
    forward = tf.raw_ops.FusedBatchNormV3(
        x=x, scale=scale, offset=offset, mean=empty, variance=empty, epsilon=p["epsilon"], is_training=True
    )
    return lambda: tf.raw_ops.FusedBatchNormGradV3(
        y_backprop=dy,
        x=x,
        scale=scale,
        reserve_space_1=forward.reserve_space_1,
        reserve_space_2=forward.reserve_space_2,
        reserve_space_3=forward.reserve_space_3,
        epsilon=p["epsilon"],
        is_training=True,
    )


def _rows_into_table(p: Params, inputs: _Inputs) -> tuple[Any, Any, list[int]]:
    """One row per example added into a (classes x features) table at the example's label."""
    rows, table = p["rows"], p["table_shape"]
    return inputs.normal([rows, table[1]]), inputs.ints([rows], table[0]), table


def _unsorted_segment_sum(p: Params, inputs: _Inputs) -> Callable[[], Any]:
    import tensorflow as tf

    updates, labels, table = _rows_into_table(p, inputs)
    return lambda: tf.raw_ops.UnsortedSegmentSum(data=updates, segment_ids=labels, num_segments=table[0])


def _scatter_nd(p: Params, inputs: _Inputs) -> Callable[[], Any]:
    import tensorflow as tf

    updates, labels, table = _rows_into_table(p, inputs)
    indices = labels[:, None]
    return lambda: tf.raw_ops.ScatterNd(indices=indices, updates=updates, shape=tf.constant(table, tf.int32))


def _tensor_scatter_nd_add(p: Params, inputs: _Inputs) -> Callable[[], Any]:
    import tensorflow as tf

    updates, labels, table = _rows_into_table(p, inputs)
    base, indices = inputs.normal(table), labels[:, None]
    return lambda: tf.raw_ops.TensorScatterAdd(tensor=base, indices=indices, updates=updates)


def _sparse_softmax_xent_backward(p: Params, inputs: _Inputs) -> Callable[[], Any]:
    import tensorflow as tf

    rows, classes = p["logits_shape"]
    logits, labels = inputs.normal([rows, classes]), inputs.ints([rows], classes)

    def run() -> Any:
        with tf.GradientTape() as tape:
            tape.watch(logits)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
        return tape.gradient(loss, logits)

    return run


def _dense_matmul(p: Params, inputs: _Inputs) -> Callable[[], Any]:
    import tensorflow as tf

    a, b = inputs.normal(p["input_shape"]), inputs.normal(p["kernel_shape"])
    return lambda: tf.raw_ops.MatMul(a=a, b=b)


def _embedding_backward(p: Params, inputs: _Inputs) -> Callable[[], Any]:
    """The token embedding's gradient made dense, as an optimizer's update of the whole table needs it: every
    looked-up row's gradient added into the table (``UnsortedSegmentSum``)."""
    import tensorflow as tf

    table = inputs.normal(p["table_shape"])
    ids = inputs.ints(p["tokens"], p["table_shape"][0])
    upstream = inputs.normal([*p["tokens"], p["table_shape"][1]])

    def run() -> Any:
        with tf.GradientTape() as tape:
            tape.watch(table)
            loss = tf.reduce_sum(tf.gather(table, ids) * upstream)
        return tf.convert_to_tensor(tape.gradient(loss, table))

    return run


def _attention_backward(p: Params, inputs: _Inputs) -> Callable[[], Any]:
    """Attention's backward pass for queries, keys and values, computed as Keras on TensorFlow computes attention:
    scaled scores, the causal mask, a softmax and the weighted sum of the values."""
    import tensorflow as tf

    shape = p["shape"]
    q, k, v, upstream = (inputs.normal(shape) for _ in range(4))
    length, depth = shape[2], shape[3]
    allowed = tf.linalg.band_part(tf.ones([length, length], tf.bool), -1, 0) if p["causal"] else None

    def run() -> Any:
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            scores = tf.matmul(q, k, transpose_b=True) / depth**0.5
            if allowed is not None:
                scores = tf.where(allowed, scores, tf.fill(tf.shape(scores), -1e9))
            out = tf.matmul(tf.nn.softmax(scores), v)
        return tape.gradient(out, [q, k, v], output_gradients=upstream)

    return run


def _layer_norm_backward_weight(p: Params, inputs: _Inputs) -> Callable[[], Any]:
    """Layer norm's scale gradient: a sum over every position of the batch."""
    import tensorflow as tf

    x, upstream = inputs.normal(p["input_shape"]), inputs.normal(p["input_shape"])
    scale = inputs.normal(p["input_shape"][-1:])

    def run() -> Any:
        with tf.GradientTape() as tape:
            tape.watch(scale)
            mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
            out = (x - mean) * tf.math.rsqrt(variance + 1e-5) * scale
        return tape.gradient(out, scale, output_gradients=upstream)

    return run


def _moe_dispatch(p: Params, inputs: _Inputs) -> Callable[[], Any]:
    """The experts' dispatch: each token's choices added into its experts' slots, as the model's scatter-add."""
    import tensorflow as tf

    slots, width = p["table_shape"]
    base, updates = inputs.normal([slots, width]), inputs.normal([p["updates"], width])
    indices = inputs.ints([p["updates"], 1], slots)
    return lambda: tf.raw_ops.TensorScatterAdd(tensor=base, indices=indices, updates=updates)


BUILDERS: dict[str, Builder] = {
    "conv2d_forward": _conv_forward("Conv2D"),
    "conv2d_backward_data": _conv_backward("Conv2DBackpropInput", "filter", "input"),
    "conv2d_backward_filter": _conv_backward("Conv2DBackpropFilter", "input", "filter"),
    "depthwise_conv_forward": _conv_forward("DepthwiseConv2dNative"),
    "depthwise_conv_backward_data": _conv_backward("DepthwiseConv2dNativeBackpropInput", "filter", "input"),
    "depthwise_conv_backward_filter": _conv_backward("DepthwiseConv2dNativeBackpropFilter", "input", "filter"),
    "max_pool_backward": _max_pool_backward,
    "bias_add_backward": _bias_add_backward,
    "fused_batch_norm_backward": _fused_batch_norm_backward,
    "unsorted_segment_sum": _unsorted_segment_sum,
    "scatter_nd": _scatter_nd,
    "tensor_scatter_nd_add": _tensor_scatter_nd_add,
    "sparse_softmax_xent_backward": _sparse_softmax_xent_backward,
    "dense_matmul": _dense_matmul,
    "embedding_backward": _embedding_backward,
    "attention_backward": _attention_backward,
    "layer_norm_backward_weight": _layer_norm_backward_weight,
    "moe_dispatch": _moe_dispatch,
}


def op_benchmark(worker: WorkerSpec) -> tuple[Step, dict[str, Any]]:
    """The worker's workload for one op case: the spec's ``params`` hold ``op`` and its ``params``. Where one
    process runs both modes, each is its own ``tf.function`` traced under that mode (``workloads.switched_arms``)."""
    import tensorflow as tf

    spec = worker.params
    run = BUILDERS[spec["op"]](spec["params"], _Inputs(worker.determinism.seed))
    compute = tf.function(run, jit_compile=worker.determinism.jit_compile)
    on_gpu = bool(tf.config.list_logical_devices("GPU"))

    def step() -> None:
        compute()
        if on_gpu:
            tf.test.experimental.sync_devices()

    facts = {"op": spec["op"], "params": spec["params"], "dtype": "float32", "on_gpu": on_gpu}
    return step, facts
