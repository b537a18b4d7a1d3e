"""One-line failure reasons and what a failed measured run is recorded as.

The messages are TensorFlow's own (from its kernels and XLA, as TensorFlow 2.21 words
them), so the test pins the wording the classification relies on; the exception type only
prefixes the reason, so plain RuntimeErrors carry them without importing TensorFlow.
"""

from __future__ import annotations

import pytest

from detprof.errors import first_line, last_line
from detprof.profiler.worker import classify_failure

DEPTH_POOL = (
    "{{function_node __inference_<lambda>_14}} MaxPoolingGrad is not yet supported on the depth dimension.\n"
    "\t [[{{node MaxPoolGrad}}]] [Op:__inference_<lambda>_14]"
)
REFUSALS = [
    "Determinism is not yet supported for MaxPoolGradWithArgmax.",
    "GPU MaxPool gradient ops do not yet have a deterministic XLA implementation.",
    "HLO instruction %scatter.1 does not have a deterministic implementation, but run-to-run determinism is required.",
    "Deterministic GPU implementation of unsorted segment reduction op not available.",
    "The GPU implementation of SparseSoftmaxCrossEntropyWithLogits that would have been executed is not "
    "deterministic. Note that the Python API uses an alternative, deterministic, GPU-accelerated path when "
    "determinsim is enabled.",
]


def test_first_line_skips_blank_lines_and_strips() -> None:
    assert first_line(ValueError("\n\n  shape mismatch  \n  at layer dense\n")) == "shape mismatch"
    assert first_line(ValueError("\n\n  shape mismatch\n"), with_type=True) == "ValueError: shape mismatch"


def test_first_line_of_an_empty_message_is_the_type() -> None:
    assert first_line(MemoryError()) == "MemoryError"
    assert first_line(KeyboardInterrupt("  \n"), with_type=True) == "KeyboardInterrupt"


def test_last_line_is_where_a_crashed_child_says_why() -> None:
    log = 'Traceback (most recent call last):\n  File "x.py", line 1\nRuntimeError: boom  \n\n \n'
    assert last_line(log) == "RuntimeError: boom"
    assert last_line(" \n\t\n") == ""
    assert last_line("") == ""


@pytest.mark.parametrize("deterministic", [False, True])
def test_an_op_failing_in_both_modes_is_a_failure_not_a_determinism_refusal(deterministic: bool) -> None:
    status, reason = classify_failure(RuntimeError(DEPTH_POOL), deterministic)
    assert status == "failed"
    assert reason == (
        "RuntimeError: {{function_node __inference_<lambda>_14}} "
        "MaxPoolingGrad is not yet supported on the depth dimension."
    )


@pytest.mark.parametrize("message", REFUSALS)
def test_tensorflow_refusing_determinism_is_unsupported_only_in_deterministic_mode(message: str) -> None:
    assert classify_failure(RuntimeError(message), deterministic=True) == (
        "unsupported",
        f"RuntimeError: {message}",
    )
    assert classify_failure(RuntimeError(message), deterministic=False)[0] == "failed"


def test_the_refusal_may_follow_tensorflows_graph_error_header() -> None:
    message = (
        "Graph execution error:\n\nDetected at node MaxPoolGradWithArgmax defined at (most recent call last):\n"
        '  File "train.py", line 11, in step\n\nDeterminism is not yet supported for MaxPoolGradWithArgmax.\n'
        "\t [[{{node MaxPoolGradWithArgmax}}]] [Op:__inference_step_14]"
    )
    assert classify_failure(RuntimeError(message), deterministic=True)[0] == "unsupported"


def test_any_other_crash_of_a_deterministic_run_is_a_failure() -> None:
    exc = ValueError("Input 0 of layer 'dense' is incompatible with the layer: expected axis -1 to have value 8")
    assert classify_failure(exc, deterministic=True) == (
        "failed",
        "ValueError: Input 0 of layer 'dense' is incompatible with the layer: expected axis -1 to have value 8",
    )


def test_a_reason_stays_short() -> None:
    status, reason = classify_failure(RuntimeError("x" * 5000), deterministic=False)
    assert status == "failed" and len(reason) == 500


def test_tf_function_errors_give_the_message_after_the_stack_excerpt() -> None:
    text = (
        "Graph execution error:\n\nDetected at node gradient_tape/max_pool_grad defined at (most recent call last):\n"
        '  File "train.py", line 3, in <module>\n\n  File "train.py", line 9, in step\n\n'
        "GPU MaxPool gradient ops do not yet have a deterministic XLA implementation.\n"
        "\t [[{{node gradient_tape/max_pool_grad}}]] [Op:__inference_train_step_88]"
    )
    assert first_line(RuntimeError(text)) == (
        "GPU MaxPool gradient ops do not yet have a deterministic XLA implementation."
    )
