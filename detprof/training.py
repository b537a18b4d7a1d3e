"""``detprof.Training``: a native module with the loss and optimizer it trains with.

A model function (``--models FILE.py:FUNCTION``) may return a bare ``torch.nn.Module`` or Flax NNX
module, which detprof trains with cross-entropy on its logits and AdamW, or this, where the model
trains with a loss or an optimizer of its own (for a Flax module, an optax transformation), or where
it is a Linen module, with the example input its ``init`` takes::

    import detprof
    import torch

    def net(input_shape, classes):
        model = Net(classes)
        return detprof.Training(model, loss=torch.nn.MSELoss(), optimizer=torch.optim.SGD(model.parameters(), 0.1))

The function is called once per arm, each from the same seed, so the optimizer is made there, over
that module's parameters. ``loss(logits, labels)`` takes the module's logits as its forward returns
them (a Hugging Face output's ``logits``) and the batch's labels, and returns a scalar. A Linen module::

    def net():
        return detprof.Training(Net(classes=10), example=jnp.zeros((1, 32, 32, 3)))

Nothing here
imports a framework: ``import detprof`` stays cheap for a program that never runs under detprof.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Training:
    """A native module (``model``) with its ``loss`` (None: cross-entropy on its logits) and its ``optimizer`` over
    its parameters (None: AdamW); a Linen module with its ``example`` input."""

    model: Any
    loss: Callable[[Any, Any], Any] | None = None
    optimizer: Any | None = None
    example: Any | None = None
    """A Linen module's example input (a batch as it takes it), which its ``init`` is called on; None otherwise."""
