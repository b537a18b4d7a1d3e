"""Models JAX users train, native: a ResNet and a GPT written in Flax NNX, as the Flax examples write them.

Trained as any Flax module is (``models.flax_modules``): the registry names them ``flax_*`` at
detprof's two sizes, ``tiny`` for a CPU and ``small`` for the GPU study, sized as the Keras
registry's own (``registry.TRANSFORMER_SIZES``, ``IMAGES``, ``TOKENS``). The ResNet keeps max pooling
after its stem: on a GPU, XLA's deterministic mode rewrote max pooling's gradient into sorts,
the costliest change detprof has measured on JAX. A factory takes ``(input_shape, classes)`` in
Flax's layout: an image's channels last, a sequence's length; for the GPT, ``classes`` is its
vocabulary. Runs in workers only.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
from flax import nnx

from detprof.models.registry import TRANSFORMER_SIZES, sized_factories

RESNET_WIDTHS = {"tiny": (8, 16, 32, 64), "small": (64, 128, 256, 512)}
"""ResNet-18's four stages' widths: its own at ``small``, an eighth of them at ``tiny``; both keep its basic blocks
and depths (2, 2, 2, 2)."""
RESNET_DEPTHS = (2, 2, 2, 2)
DROPOUT = 0.1


class BasicBlock(nnx.Module):
    """Two 3x3 convolutions with batch normalisation, and the shortcut around them (projected where the shape
    changes)."""

    def __init__(self, features_in: int, features: int, stride: int, rngs: nnx.Rngs) -> None:
        self.conv1 = nnx.Conv(features_in, features, (3, 3), strides=stride, use_bias=False, rngs=rngs)
        self.bn1 = nnx.BatchNorm(features, rngs=rngs)
        self.conv2 = nnx.Conv(features, features, (3, 3), use_bias=False, rngs=rngs)
        self.bn2 = nnx.BatchNorm(features, rngs=rngs)
        projected = stride != 1 or features_in != features
        self.shortcut = nnx.Conv(features_in, features, (1, 1), strides=stride, rngs=rngs) if projected else None

    def __call__(self, x: jax.Array) -> jax.Array:
        y = nnx.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return nnx.relu(y + (x if self.shortcut is None else self.shortcut(x)))


class ResNet(nnx.Module):
    """ResNet-18's layout: a 3x3 stem (7x7 with stride 2 at ImageNet's size), 3x3 max pooling with stride 2, four
    stages of basic blocks, global average pooling, a dense head."""

    def __init__(self, channels: int, classes: int, widths: Sequence[int], large: bool, rngs: nnx.Rngs) -> None:
        kernel, stride = ((7, 7), 2) if large else ((3, 3), 1)
        self.stem = nnx.Conv(channels, widths[0], kernel, strides=stride, use_bias=False, rngs=rngs)
        self.stem_bn = nnx.BatchNorm(widths[0], rngs=rngs)
        blocks = []
        features_in = widths[0]
        for stage, (features, depth) in enumerate(zip(widths, RESNET_DEPTHS, strict=True)):
            for index in range(depth):
                stride = 2 if stage > 0 and index == 0 else 1
                blocks.append(BasicBlock(features_in, features, stride, rngs))
                features_in = features
        self.blocks = nnx.List(blocks)
        self.head = nnx.Linear(features_in, classes, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = nnx.relu(self.stem_bn(self.stem(x)))
        x = nnx.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(axis=(1, 2)))


class DecoderBlock(nnx.Module):
    """Pre-norm causal self-attention and a GELU MLP of four times the width, each with dropout on its residual."""

    def __init__(self, width: int, heads: int, rngs: nnx.Rngs) -> None:
        self.attention_norm = nnx.LayerNorm(width, rngs=rngs)
        self.attention = nnx.MultiHeadAttention(heads, width, decode=False, rngs=rngs)
        self.mlp_norm = nnx.LayerNorm(width, rngs=rngs)
        self.mlp_in = nnx.Linear(width, 4 * width, rngs=rngs)
        self.mlp_out = nnx.Linear(4 * width, width, rngs=rngs)
        self.dropout = nnx.Dropout(DROPOUT, rngs=rngs)

    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        x = x + self.dropout(self.attention(self.attention_norm(x), mask=mask))
        return x + self.dropout(self.mlp_out(nnx.gelu(self.mlp_in(self.mlp_norm(x)))))


class GPT(nnx.Module):
    """A decoder-only language model: token embedding and learned positions, pre-norm blocks, a final norm, logits
    over the vocabulary at every position."""

    def __init__(self, length: int, vocabulary: int, width: int, depth: int, heads: int, rngs: nnx.Rngs) -> None:
        self.embed = nnx.Embed(vocabulary, width, rngs=rngs)
        self.positions = nnx.Param(jax.random.normal(rngs.params(), (length, width)) * 0.02)
        self.blocks = nnx.List([DecoderBlock(width, heads, rngs) for _ in range(depth)])
        self.norm = nnx.LayerNorm(width, rngs=rngs)
        self.head = nnx.Linear(width, vocabulary, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = self.embed(tokens) + self.positions[: tokens.shape[1]]
        mask = nnx.make_causal_mask(tokens)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.norm(x))


def resnet(input_shape: Sequence[int], classes: int, size: str, seed: int = 0) -> ResNet:
    large = input_shape[0] >= 128
    return ResNet(input_shape[-1], classes, RESNET_WIDTHS[size], large, nnx.Rngs(params=seed, dropout=seed))


def gpt(input_shape: Sequence[int], classes: int, size: str, seed: int = 0) -> GPT:
    shape = TRANSFORMER_SIZES[size]
    rngs = nnx.Rngs(params=seed, dropout=seed)
    return GPT(input_shape[0], classes, shape["width"], shape["depth"], shape["heads"], rngs)


ARCHITECTURES = {"resnet": resnet, "gpt": gpt}
__getattr__ = sized_factories(__name__, ARCHITECTURES)
