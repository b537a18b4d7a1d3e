"""An op without a deterministic implementation, swept: recorded as a finding, shown on the report's first screen.

PyTorch refuses ``max_unpool2d`` in deterministic mode on a CPU too, so a model of your own
whose custom layer unpools (``max_pool2d`` with indices, then ``max_unpool2d``) is a real
refusal here. Keras re-raises it under a first line of its own, and the record must still
name PyTorch's op, the layer that called it and what to do.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from detprof import backends
from detprof.cli import main
from detprof.reports.command import render_report
from detprof.reports.report_data import SECTIONS
from detprof.store import ResultsStore

UNPOOLING_MODEL = '''
import keras
import torch


class Unpool(keras.layers.Layer):
    """Max-pools with the indices and unpools back: PyTorch has no deterministic max_unpool2d."""

    def call(self, x):
        nchw = x.permute(0, 3, 1, 2)
        pooled, indices = torch.nn.functional.max_pool2d(nchw, 2, return_indices=True)
        restored = torch.nn.functional.max_unpool2d(pooled, indices, 2, output_size=nchw.shape[-2:])
        return restored.permute(0, 2, 3, 1)

    def compute_output_shape(self, input_shape):
        return input_shape


def unpooling(input_shape=(8, 8, 1), classes=10):
    inputs = keras.Input(input_shape)
    x = keras.layers.Conv2D(4, 3, padding="same", name="conv")(inputs)
    x = Unpool(name="unpool")(x)
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    return keras.Model(inputs, keras.layers.Dense(classes, name="logits")(x))
'''
OP = "max_unpooling2d_forward_out"
"""The op as PyTorch's refusal names it (``F.max_unpool2d`` runs it)."""
SWEEP = ["--repeats", "1", "--steps", "2", "--warmup", "0", "--batch-size", "8", "--input-shape", "8x8x1"]
SWEEP += ["--gpu", "cpu", "--tracer", "none", "--no-report"]


@pytest.mark.slow
def test_an_op_refusing_determinism_is_a_finding_on_the_first_screen(tmp_path: Path) -> None:
    (tmp_path / "nets.py").write_text(UNPOOLING_MODEL)
    out = tmp_path / "out"
    args = ["sweep", "--models", f"{tmp_path / 'nets.py'}:unpooling", "--backend", "torch", *SWEEP, "--out", str(out)]
    assert main(args) == 0
    records = {r["mode"]: r for r in ResultsStore(out, "sweep").records()}
    assert records["default"]["status"] == "ok" and "finding" not in records["default"]
    refused = records["deterministic"]
    advice = backends.get("torch").nondeterministic_op_advice
    assert refused["status"] == "unsupported"
    assert refused["finding"]["op"] == OP and refused["finding"]["layer"] == "unpool"
    assert refused["finding"]["advice"] == advice
    assert refused["finding"]["message"].startswith(f"RuntimeError: {OP} does not have a deterministic implementation")
    assert refused["reason"] == refused["finding"]["message"], "the framework's words, not Keras's wrapper line"

    line = f"{OP} in layer unpool has no deterministic implementation: {advice}"
    text = render_report([out], "md")
    answer = text[text.index(f"## {SECTIONS['answer']}") : text.index(f"## {SECTIONS['overhead']}")]
    assert f"**unpooling** on cpu (torch): {line}" in answer.replace("\\_", "_")
    page = render_report([out], "html", "cdn")
    screen = page[page.index('<section id="answer">') : page.index('<section id="overhead">')]
    assert f"<strong>unpooling on cpu (torch)</strong>: {line}" in screen
