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
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from detprof.profiler.workloads import switched_arms

if TYPE_CHECKING:
    from detprof.backends.base import ArmStep
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
}


def op_benchmark_arms(workers: Sequence[WorkerSpec]) -> tuple[list[ArmStep], dict[str, Any]]:
    """Both modes of one op case in one process, each its own ``tf.function`` traced under its mode."""
    return switched_arms(workers, op_benchmark)


def op_benchmark(worker: WorkerSpec) -> tuple[Step, dict[str, Any]]:
    """The worker's workload for one op case: the spec's ``params`` hold ``op`` and its ``params``."""
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
