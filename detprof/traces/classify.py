"""Kernel categories: which kind of work a kernel (or CPU op type) does.

Determinism changes *which* kernels run (atomics-free reductions, different cuDNN
algorithms, sorted scatters), so the report groups kernel time into a few kinds of work
that a user can relate to their model. The rules are an ordered table of regular
expressions, first match wins; the order encodes the decisions that a flat keyword list
gets wrong:

- Names are matched without their trailing argument list: cuDNN signatures carry
  argument types such as ``cudnn::reduced_divisor`` that would look like reductions.
- Collective and host transfers, optimizer updates, softmax/loss, normalization and
  pooling come first, because their kernels also contain generic words ("reduce",
  "gemm", "backward").
- Convolution backward-filter before backward-data before forward, and all three before
  gemm: cuDNN/CUTLASS conv kernels are implicit GEMMs (``sm80_xmma_dgrad_implicit_gemm``).
  cuDNN's FFT and Winograd helper kernels serve every direction; without more context they
  count as forward. ``flip_filter`` only runs for backward data. ``stridedB_splitK`` cuDNN
  kernels are its split-K weight-gradient kernels.
- ``cublasLt::splitKreduce_kernel`` finishes a split-K matrix multiply, so it is
  gemm/matmul, not reduction.
- "memory" means kernels that move or lay out bytes without arithmetic: memcpy/memset,
  layout transposes (``SwapDimension1And2InTensor3``, ``nchwToNhwcKernel``, ``Transpose``),
  concat/slice/gather/broadcast, variable reads, send/recv and NCCL collectives (the time
  is communication, not compute). A transpose is data movement even though it runs as a
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
- Shape-only ops (``Reshape``, ``Const``, ``NoOp``, function calls) stay "other".
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
    "optimizer update",
    "memory",
    "other",
)

_MKL = r"_?(?:Mkl)?(?:Native)?(?:Fused)?"
"""TF CPU op types carry oneDNN/fusion prefixes: ``_MklNativeFusedConv2D``."""


def _op_types(*names: str) -> str:
    """A pattern matching exactly one of these TF op types, with or without oneDNN prefixes."""
    return rf"^{_MKL}(?:{'|'.join(names)})$"


_RULES: tuple[tuple[str, str], ...] = (
    (
        "memory",
        r"memcpy|memset|\[CUDA mem|redzone|nccl|" + _op_types("_?Send", "_?Recv", "_HostSend", "_HostRecv"),
    ),
    (
        "optimizer update",
        r"apply_?adam|adam_?(?:update|kernel|functor)|adamw|ResourceApply|SparseApply|"
        r"Apply(?:GradientDescent|Momentum|KerasMomentum|RMSProp|CenteredRMSProp|Adagrad\w*|Adadelta|"
        r"AdaMax|Ftrl\w*|ProximalAdagrad|ProximalGradientDescent|AddSign|PowerSign)|"
        r"multi_tensor_apply|Assign(?:Sub|Add)VariableOp|(?<![a-z])sgd(?![a-z])",
    ),
    ("softmax/loss", r"softmax|xent|cross_?entropy|GenerateNormalizedProb|loss(?!less)"),
    ("batch-norm", r"batch_?norm|(?<![a-z])bn_(?:fw|bw)|(?:layer|instance|group)_?norm|(?<![a-z])lrn"),
    ("pooling", r"(?:max|avg|average|adaptive\w*)_?pool|pooling|pool_?(?:fw|bw|fwd|bwd|forward|backward)"),
    (
        "conv backward filter",
        r"(?<![a-z])wgrad|(?-i:Wgrad)|backprop_?filter|conv\w*(?:backward|bwd)_?(?:filter|weight)|conv\w*grad_?weight|"
        r"stridedB_splitK",
    ),
    (
        "conv backward data",
        r"(?<![a-z])dgrad|(?-i:Dgrad)|backprop_?input|conv\w*(?:backward|bwd)|col2im|flip_filter",
    ),
    (
        "conv forward",
        r"conv(?!er)|fprop|winograd|convolve|implicit_?gemm|scudnn|\dcudnn|fft\dd_(?:r2c|c2r|c2c)|im2col|"
        r"cudnn::gemm::compute\w*Offsets",
    ),
    (
        "memory",
        r"transpose|SwapDimension|ShuffleInTensor|nchw_?to_?nhwc|nhwc_?to_?nchw",
    ),
    (
        "gemm/matmul",
        r"gemm|gemv|matmul|splitKreduce|cublas|cutlass|Contraction|Einsum|(?<![a-z])dot_kernel",
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


@functools.lru_cache(maxsize=65536)
def classify(name: str) -> str:
    """The category of a kernel or TF op type name; "other" when no rule knows it."""
    head = _without_arguments(name)
    for pattern, category in _TABLE:
        if pattern.search(head):
            return category
    return "other"
