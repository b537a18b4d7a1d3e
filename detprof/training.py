"""``detprof.Training``: a native PyTorch module with the loss and optimizer it trains with.

A model function (``--models FILE.py:FUNCTION``) may return a bare ``torch.nn.Module``, which detprof
trains with cross-entropy on its logits and AdamW, or this, where the model trains with a loss or an
optimizer of its own::

    import detprof
    import torch

    def net(input_shape, classes):
        model = Net(classes)
        return detprof.Training(model, loss=torch.nn.MSELoss(), optimizer=torch.optim.SGD(model.parameters(), 0.1))

The function is called once per arm, each from the same seed, so the optimizer is made there, over
that module's parameters. ``loss(logits, labels)`` takes the module's logits as its forward returns
them (a Hugging Face output's ``logits``) and the batch's labels, and returns a scalar. Nothing here
imports a framework: ``import detprof`` stays cheap for a program that never runs under detprof.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Training:
    """A ``torch.nn.Module`` (``model``) with its ``loss`` (None: cross-entropy on its logits) and its ``optimizer``
    over its parameters (None: AdamW)."""

    model: Any
    loss: Callable[[Any, Any], Any] | None = None
    optimizer: Any | None = None
