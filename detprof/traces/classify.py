"""Kernel categories: which kind of work a kernel (or CPU op type) does.

Determinism changes *which* kernels run (atomics-free reductions, different cuDNN
algorithms, sorted scatters), so the report groups kernel time into a few kinds of work
that a user can relate to their model. The rules are an ordered table of regular
expressions, first match wins; the order encodes the decisions that a flat keyword list
gets wrong:

- Names are matched without their trailing argument list: cuDNN signatures carry
  argument types such as ``cudnn::reduced_divisor`` that would look like reductions.
- Communication comes first: NCCL and RCCL kernels (``ncclKernel_AllReduce_...``,
  ``ncclDevKernel_SendRecv``), gloo and c10d collectives, XLA's collective ops
  (``all-reduce``, ``reduce-scatter``, ...) and TensorFlow's Send/Recv and collective ops.
  People who train on several GPUs read computation, communication and memory apart (as
  HTA does), and collective names contain generic words ("Reduce", "Sum").
- XLA's ``select_and_scatter`` is max pooling's gradient (the op JAX and TensorFlow's XLA lower it to): pooling,
  ahead of the scatter rule. Under XLA's determinism it runs as sorts named after its own instructions
  (``sort_5_1``), which ``classify`` files under their op's category where the trace names it.
- Host transfers, optimizer updates, softmax/loss, normalization and pooling come next,
  because their kernels also contain generic words ("reduce", "gemm", "backward").
- Convolution backward-filter before backward-data before forward, and all three before
  gemm: cuDNN/CUTLASS conv kernels are implicit GEMMs (``sm80_xmma_dgrad_implicit_gemm``).
  cuDNN's FFT and Winograd helper kernels serve every direction; without more context they
  count as forward. ``flip_filter`` only runs for backward data. ``stridedB_splitK`` cuDNN
  kernels are its split-K weight-gradient kernels.
- ``cublasLt::splitKreduce_kernel`` finishes a split-K matrix multiply, so it is
  gemm/matmul, not reduction; so is cuBLASLt's ``epilogue::impl::globalKernel``, the bias
  or activation epilogue of a matrix multiply.
- "memory" means kernels that move or lay out bytes without arithmetic: memcpy/memset,
  layout transposes (``SwapDimension1And2InTensor3``, ``nchwToNhwcKernel``, ``Transpose``),
  concat/slice/gather/broadcast and variable reads. A transpose is data movement even though it runs as a
  kernel, and it is exactly the cost a layout change adds.
- Scatter-add and segment sums (``ScatterNd``, ``UnsortedSegmentSum``) and scans combine
  many values into fewer: reduction. They are the ops TensorFlow makes deterministic by
  sorting, so they must not hide in "other".
- Eigen GPU kernels are all ``EigenMetaKernel<TensorAssignOp<...>>``; the expression inside
  decides: a ``TensorReductionOp`` (or any ``*Reducer``) is a reduction; a
  ``TensorCwise*Op`` is elementwise even when its functor is ``scalar_sum_op`` (that is
  ``a + b``, e.g. ``AddV2``); a bare broadcast/slice/shuffle/concat is data movement.
- Random number generation (``FillPhiloxRandom``) produces one value per element:
  elementwise. Normalization layers other than batch norm (layer/instance/group norm, LRN)
  share the "batch-norm" category, the closest one.
- A recurrent layer's kernels (an LSTM's, a GRU's, a plain RNN's: oneDNN's ``aten::mkldnn_rnn_layer`` on a CPU,
  cuDNN's ``RNN_blockPersist_fp_LSTM`` and ``LSTM_elementWise_fp``, PyTorch's fused ``lstm_cell_forward``,
  TensorFlow's ``CudnnRNNV3`` and ``BlockLSTM``) are "recurrent": each runs a whole layer's or cell's steps, its
  matrix products and gates together, and would otherwise be "other" (or, named cuDNN, a convolution).
- Shape-only ops (``Reshape``, ``Const``, ``NoOp``, function calls) stay "other", and so
  do ATen's view ops (``aten::view``, ``aten::t``, ``aten::transpose``, ``aten::slice``):
  unlike TensorFlow's ``Transpose`` they move no bytes.
- PyTorch CPU ops (``aten::<op>``, the rows of a CPU-only PyTorch profiler trace) are
  matched by their exact name first, so that generic words cannot misfile them:
  ``aten::mm``/``addmm``/``linear`` are gemm, ``aten::sum``/``mean`` reduction,
  ``aten::add``/``mul``/``clamp_min`` elementwise, ``aten::copy_``/``cat`` memory,
  ``aten::_foreach_*`` and ``_fused_adam`` optimizer updates (``torch.optim`` runs its
  updates as foreach ops). ``aten::convolution_backward`` computes the input and the weight
  gradient in one op whose time a CPU trace cannot split; it counts as conv backward data,
  the direction every layer but the first needs. An autograd node (``AddmmBackward0``,
  also inside ``autograd::engine::evaluate_function: ...``) has its forward op's category,
  except that a convolution's is backward data and a gather's (embedding, index_select)
  is a reduction: its gradient is a scatter-add.
- ROCm: rocBLAS/hipBLASLt Tensile kernels (``Cijk_...``) are gemm. MIOpen names its
  convolution directions ``fwd``, ``bwd`` (data) and ``wrw`` (weights):
  ``igemm_wrw_gtcx_...``, ``naive_conv_wrw_nchw`` are backward filter, ``igemm_bwd_...``
  backward data, ``igemm_fwd_...`` forward.
- Triton kernels that PyTorch Inductor generates are named
  ``triton_<kind>_fused_<ops>_<n>``: ``poi`` (pointwise), ``red``/``per`` (reductions),
  ``tem`` (matmul or convolution templates), ``for`` (foreach). The fused op words decide
  where they name softmax/loss, normalization, pooling or an optimizer; otherwise the kind
  does: a pointwise kernel named after ``convolution`` or ``addmm`` is their epilogue (bias,
  activation), elementwise. A ``triton_`` kernel of a kind Inductor does not write is
  "other": hand-written Triton kernels (attention, say) can be anything.
- fbgemm_gpu (``fbgemm_gpu::permute_2D_lengths_kernel``) is PyTorch's embedding library,
  not a GEMM: its names do not count as gemm for containing "gemm"; ``permute`` kernels
  are data movement. ATen's ``direct_copy_kernel_cuda`` (inside an elementwise kernel
  template) is a copy: memory. Layer norm's ``GammaBetaBackward`` kernel is normalization.
"""

from __future__ import annotations

import functools
import re

CATEGORIES: tuple[str, ...] = (
    "conv forward",
    "conv backward data",
    "conv backward filter",
    "gemm/matmul",
    "elementwise",
    "reduction",
    "batch-norm",
    "pooling",
    "softmax/loss",
    "recurrent",
    "optimizer update",
    "memory",
    "communication",
    "other",
)

_MKL = r"_?(?:Mkl)?(?:Native)?(?:Fused)?"
"""TF CPU op types carry oneDNN/fusion prefixes: ``_MklNativeFusedConv2D``."""


def _op_types(*names: str) -> str:
    """A pattern matching exactly one of these TF op types, with or without oneDNN prefixes."""
    return rf"^{_MKL}(?:{'|'.join(names)})$"


def _aten_ops(*names: str) -> str:
    """A pattern matching exactly one of these ATen ops, also internal (``_op``) and in-place (``op_``)."""
    return rf"^aten::_?(?:{'|'.join(names)})_?$"


_ATEN_RULES: tuple[tuple[str, str], ...] = (
    (
        "other",
        _aten_ops(
            "view", "view_as", "reshape", "reshape_alias", "unsafe_view", "t", "transpose", "permute",
            "expand", "expand_as", "as_strided", "squeeze", "unsqueeze", "flatten", "unflatten", "detach",
            "alias", "slice", "select", "narrow", "split", "split_with_sizes", "chunk", "unbind",
            "resolve_conj", "resolve_neg", "empty", "empty_like", "empty_strided", "resize", "lift_fresh",
            "to", "contiguous", "numpy_T",
        ),
    ),
    (
        "optimizer update",
        r"^aten::_foreach_\w+$|" + _aten_ops("fused_adam", "fused_adamw", "fused_sgd", "fused_adagrad"),
    ),
    (
        "gemm/matmul",
        _aten_ops(
            "mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "mv", "addmv", "dot", "vdot",
            "einsum", "tensordot", "addmm_activation", "mkldnn_linear", "mkldnn_matmul", "linear_backward",
        ),
    ),
    (
        "reduction",
        _aten_ops(
            "sum", "mean", "max", "min", "amax", "amin", "argmax", "argmin", "cumsum", "cumprod", "prod",
            "var", "std", "var_mean", "std_mean", "logsumexp", "norm", "linalg_vector_norm", "all", "any",
            "scatter_add", "index_add", "bincount", "embedding_dense_backward", "embedding_backward",
        ),
    ),
    (
        "memory",
        _aten_ops(
            "copy", "clone", "to_copy", "cat", "stack", "index_select", "gather", "index", "embedding",
            "constant_pad_nd", "pad", "repeat", "flip", "roll", "masked_select", "take", "index_put",
        ),
    ),
    (
        "elementwise",
        _aten_ops(
            "add", "sub", "rsub", "mul", "div", "neg", "abs", "sign", "reciprocal", "exp", "log", "log1p",
            "pow", "sqrt", "rsqrt", "square", "clamp", "clamp_min", "clamp_max", "threshold",
            "threshold_backward", "where", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge",
            "logical_and", "logical_or", "logical_not", "floor", "ceil", "round", "trunc", "erf", "addcmul",
            "addcdiv", "lerp", "masked_fill", "fill", "zero", "zeros", "ones", "zeros_like", "ones_like", "full",
            "full_like", "bernoulli", "uniform", "normal", "hardtanh", "hardtanh_backward", "leaky_relu",
            "leaky_relu_backward", "elu", "elu_backward", "softplus", "mish", "hardswish", "hardsigmoid",
        ),
    ),
)  # fmt: skip
"""Exact ATen op names, tried before the generic rules (which would read ``aten::transpose`` as data
movement and ``aten::addmm`` as nothing)."""

_RULES: tuple[tuple[str, str], ...] = (
    *_ATEN_RULES,
    (
        "communication",
        r"(?<![a-z])[nr]ccl|(?<![a-z])gloo|c10d::|record_param_comms|(?<![a-z])all[-_]?(?:reduce|gather|to[-_]?all)|"
        r"reduce[-_]?scatter|collective[-_]?permute|"
        + _op_types("_?Send", "_?Recv", "_HostSend", "_HostRecv", r"Collective\w*", r"Nccl\w*"),
    ),
    ("memory", r"memcpy|memset|\[CUDA mem|redzone"),
    ("recurrent", r"lstm|rnn|(?<![a-z])gru"),
    (
        "optimizer update",
        r"apply_?adam|adam_?(?:update|kernel|functor)|adamw|ResourceApply|SparseApply|"
        r"Apply(?:GradientDescent|Momentum|KerasMomentum|RMSProp|CenteredRMSProp|Adagrad\w*|Adadelta|"
        r"AdaMax|Ftrl\w*|ProximalAdagrad|ProximalGradientDescent|AddSign|PowerSign)|"
        r"multi_tensor_apply|Assign(?:Sub|Add)VariableOp|(?<![a-z])sgd(?![a-z])|(?<![a-z])adagrad",
    ),
    ("softmax/loss", r"softmax|xent|cross_?entropy|GenerateNormalizedProb|loss(?!less)"),
    (
        "batch-norm",
        r"batch_?norm|(?<![a-z])bn_(?:fw|bw)|(?:layer|instance|group)_?norm|(?<![a-z])lrn|GammaBetaBackward",
    ),
    (
        "pooling",
        r"(?:max|avg|average|adaptive\w*)_?pool|pooling|pool_?(?:fw|bw|fwd|bwd|forward|backward)|select[-_]and[-_]scatter",
    ),
    (
        "conv backward filter",
        r"(?<![a-z])wgrad|(?-i:Wgrad)|backprop_?filter|conv\w*(?:backward|bwd)_?(?:filter|weight)|conv\w*grad_?weight|"
        r"stridedB_splitK|wrw",
    ),
    (
        "conv backward data",
        r"(?<![a-z])dgrad|(?-i:Dgrad)|backprop_?input|conv\w*(?:backward|bwd)|col2im|flip_filter|igemm_bwd",
    ),
    (
        "conv forward",
        r"conv(?!er)|fprop|winograd|convolve|implicit_?gemm|scudnn|\dcudnn|fft\dd_(?:r2c|c2r|c2c)|im2col|"
        r"cudnn::gemm::compute\w*Offsets|(?<![a-z])igemm",
    ),
    (
        "memory",
        r"transpose|SwapDimension|ShuffleInTensor|nchw_?to_?nhwc|nhwc_?to_?nchw|permute|direct_copy_kernel|"
        r"indexSelect",
    ),
    (
        "gemm/matmul",
        r"(?<!fb)gemm|gemv|matmul|splitKreduce|cublas|cutlass|Contraction|Einsum|(?<![a-z])dot_kernel|(?<![a-z])Cijk_|"
        r"(?<![a-z])epilogue::impl",
    ),
    (
        "reduction",
        r"reduc|BiasGrad|BiasAddGrad|segment|scatter|DeviceScan|(?<![a-z])scan|argm(?:ax|in)|"
        + _op_types("Sum", "Mean", "Max", "Min", "Prod", "All", "Any", "Cumsum", "Cumprod", "EuclideanNorm"),
    ),
    (
        "elementwise",
        r"elementwise|cwise|scalar_\w+_op|TensorConversionOp|TensorSelectOp|relu|sigmoid|tanh|gelu|"
        r"swish|silu|dropout|philox|random|(?<![a-z])fill|axpy|scal_kernel|scalePackedTensor|"
        r"(?<![a-z])cast|(?<![a-z])bias|"
        + _op_types(
            "Add",
            "AddV2",
            "AddN",
            "Sub",
            "Mul",
            "MulNoNan",
            "RealDiv",
            "Div",
            "DivNoNan",
            "FloorDiv",
            "FloorMod",
            "Maximum",
            "Minimum",
            "Pow",
            "Sqrt",
            "Rsqrt",
            "SqrtGrad",
            "RsqrtGrad",
            "Square",
            "SquaredDifference",
            "Exp",
            "Log",
            "Log1p",
            "Neg",
            "Abs",
            "Sign",
            "Reciprocal",
            "Inv",
            "Select",
            "SelectV2",
            "Equal",
            "NotEqual",
            "Greater",
            "GreaterEqual",
            "Less",
            "LessEqual",
            "LogicalAnd",
            "LogicalOr",
            "LogicalNot",
            "ZerosLike",
            "OnesLike",
            "Floor",
            "Ceil",
            "Round",
            "Erf",
            "Cast",
            "Elu",
            "EluGrad",
            "Selu",
            "SeluGrad",
            "Softplus",
            "SoftplusGrad",
            "ClipByValue",
        ),
    ),
    (
        "memory",
        r"TensorBroadcastingOp|TensorSlicingOp|TensorStridingSlicingOp|TensorPaddingOp|"
        r"TensorConcatenationOp|TensorReverseOp|TensorShufflingOp|TensorChippingOp|Gather|concat|"
        r"Split|CatArrayBatchedCopy|copy_kernel|"
        + _op_types(
            "Identity",
            "IdentityN",
            "ReadVariableOp",
            "AssignVariableOp",
            "ConcatV2",
            "Concat",
            "Pack",
            "Unpack",
            "Slice",
            "StridedSlice",
            "StridedSliceGrad",
            "Tile",
            "BroadcastTo",
            "Pad",
            "PadV2",
            "MirrorPad",
            "ReverseV2",
            "Copy",
            "CopyHost",
        ),
    ),
    ("conv forward", r"cudnn"),
    # XLA HLO instructions (XLA:CPU thunks of JAX and TF jit_compile programs): an opcode
    # (``dot``), a fusion named after the opcodes it fuses (``multiply_subtract_fusion``) or
    # one op wrapped in a fusion (``wrapped_broadcast``). Last, so only names no rule above
    # knows get here: convolutions, reduce/scatter and transposes are caught above. A fusion
    # that computes anything is elementwise before it is data movement.
    ("gemm/matmul", r"(?<![a-z])dot(?:[-_]general)?(?![a-z])"),
    (
        "elementwise",
        r"(?<![a-z])(?:add|subtract|multiply|divide|remainder|maximum|minimum|negate|abs|sign|"
        r"exponential(?:-minus-one)?|log(?:-plus-one)?|r?sqrt|cbrt|power|logistic|sine|cosine|atan2|erf|floor|"
        r"ceil|round-nearest-(?:afz|even)|clamp|select|compare|convert|is-finite|iota|rng(?:-bit-generator)?)"
        r"(?![a-z])",
    ),
    ("memory", r"(?<![a-z])(?:broadcast|bitcast|copy|slice|pad|reverse)(?![a-z])"),
)

_TABLE: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), category) for category, pattern in _RULES
)


def _without_arguments(name: str) -> str:
    """Drop a demangled signature's trailing ``(...)`` argument list; keep the name if that is all."""
    if not name.endswith(")"):
        return name
    depth = 0
    for i in range(len(name) - 1, -1, -1):
        if name[i] == ")":
            depth += 1
        elif name[i] == "(":
            depth -= 1
            if depth == 0:
                return name[:i] if name[:i].strip() else name
    return name


_AUTOGRAD_FUNCTION = "autograd::engine::evaluate_function: "
_AUTOGRAD_NODE = re.compile(r"^(?P<forward>[A-Z]\w*?)Backward\d+$")
_CAMEL_WORD = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_GATHERS = frozenset({"aten::embedding", "aten::embedding_bag", "aten::index_select", "aten::gather", "aten::index"})
_TRITON = re.compile(r"^triton_(?P<kind>[a-z]+)_(?P<ops>.*)$")
_TRITON_KINDS = {
    "poi": "elementwise",
    "red": "reduction",
    "per": "reduction",
    "tem": "gemm/matmul",
    "for": "elementwise",
}
"""Inductor's kernel kinds: pointwise, reduction, persistent reduction, template, foreach."""
_TRITON_OP_WORDS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), category)
    for category, pattern in (
        ("softmax/loss", r"softmax|cross_entropy|nll_loss|_loss(?![a-z])"),
        ("batch-norm", r"batch_norm|layer_norm|group_norm|instance_norm|rms_norm"),
        ("pooling", r"(?:max|avg|adaptive_avg|adaptive_max)_pool"),
        ("optimizer update", r"(?<![a-z])(?:adam|adamw|sgd|adagrad|rmsprop)(?![a-z])"),
    )
)
_TRITON_TEMPLATE_CONV = re.compile(r"convolution|conv\dd|(?<![a-z])conv(?![a-z])")


def classify(name: str, op_type: object = None) -> str:
    """The category of a kernel, TF op type or PyTorch op name; where no rule knows the name, that of ``op_type``,
    the op that ran the kernel where the trace says (XLA's ``sort_5_1`` of a ``select_and_scatter`` is pooling);
    "other" when neither is known."""
    category = _by_name(name)
    if category == "other" and isinstance(op_type, str):
        return _by_name(op_type)
    return category


@functools.lru_cache(maxsize=65536)
def _by_name(name: str) -> str:
    head = _without_arguments(name).removeprefix(_AUTOGRAD_FUNCTION)
    node = _AUTOGRAD_NODE.match(head)
    if node is not None:
        return _backward_of(node.group("forward"))
    triton = _TRITON.match(head)
    if triton is not None:
        return _triton_category(triton.group("kind"), triton.group("ops"))
    return _by_rules(head)


def _by_rules(head: str) -> str:
    for pattern, category in _TABLE:
        if pattern.search(head):
            return category
    return "other"


def _backward_of(forward: str) -> str:
    """An autograd node's category (``AddmmBackward0`` -> ``aten::addmm``'s), with the two backward ops that differ."""
    op = "aten::" + _CAMEL_WORD.sub("_", forward).lower()
    if op in _GATHERS:
        return "reduction"
    category = _by_rules(op)
    return "conv backward data" if category == "conv forward" else category


def _triton_category(kind: str, ops: str) -> str:
    """An Inductor kernel's category: its fused op words where they say, else its kind; unknown kinds are "other"."""
    base = _TRITON_KINDS.get(kind)
    if base is None:
        return "other"
    for pattern, category in _TRITON_OP_WORDS:
        if pattern.search(ops):
            return category
    if kind == "tem" and _TRITON_TEMPLATE_CONV.search(ops):
        return "conv forward"
    return base
