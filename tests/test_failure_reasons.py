"""One-line failure reasons, what a failed measured run is recorded as, and the finding an op's refusal makes.

The messages are TensorFlow's own (from its kernels and XLA, as TensorFlow 2.21 words
them), so the test pins the wording the classification relies on; the exception type only
prefixes the reason, so plain RuntimeErrors carry them without importing TensorFlow.
"""

from __future__ import annotations

import pytest

from detprof import backends
from detprof.errors import first_line, last_line
from detprof.findings import Finding, finding_of
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


def test_a_refusal_keras_rewraps_is_found_by_the_frameworks_own_line() -> None:
    """Keras re-raises an error from a layer's call under a line of its own, the framework's message in bold."""
    refusal = (
        "max_unpooling2d_forward_out does not have a deterministic implementation, but you set "
        "'torch.use_deterministic_algorithms(True)'."
    )
    exc = RuntimeError(
        f"Exception encountered when calling Unpool.call().\n\n\x1b[1m{refusal}\x1b[0m\n\n"
        "Arguments received by Unpool.call():\n  • x=torch.Tensor(shape=torch.Size([4, 8, 8, 4]), dtype=float32)"
    )
    assert classify_failure(exc, deterministic=True)[0] == "unsupported"
    found = finding_of(exc, "torch")
    assert found.op == "max_unpooling2d_forward_out"
    assert found.message == f"RuntimeError: {refusal}"
    assert found.advice == backends.get("torch").nondeterministic_op_advice
    assert Finding.from_json(found.to_json()) == found


def test_a_refusal_after_a_stack_excerpt_naming_a_deterministic_file_is_the_refusal() -> None:
    exc = RuntimeError(
        "Graph execution error:\n\nDetected at node MaxPoolGradWithArgmax defined at (most recent call last):\n"
        '  File "deterministic_train.py", line 11, in step\n\n'
        "Determinism is not yet supported for MaxPoolGradWithArgmax.\n\t [[{{node MaxPoolGradWithArgmax}}]]"
    )
    found = finding_of(exc, "tensorflow")
    assert (found.op, found.message) == (
        "MaxPoolGradWithArgmax",
        "RuntimeError: Determinism is not yet supported for MaxPoolGradWithArgmax.",
    )


def test_a_finding_a_record_holds_reads_back_whatever_it_lacks() -> None:
    assert Finding.from_json({"message": "RuntimeError: x"}) == Finding(None, "RuntimeError: x", None, "")
    assert Finding.from_json({"op": "scatter", "layer": 3, "advice": "a"}) == Finding("scatter", "", "3", "a")
