"""The transformers people train now, in Keras 3 so that one definition runs on TensorFlow, JAX and PyTorch.

A GPT (token and position embeddings, pre-norm causal self-attention blocks, GELU MLP, LM head), the same
GPT with its MLP replaced by a top-k routed mixture of experts, and a ViT (patch embedding, class token,
encoder blocks). Their determinism tax sits in ops the paper's CNNs never run: the embedding's backward
pass (a scatter-add), attention's backward pass (``keras.ops.dot_product_attention``, each backend's fused
path where it has one), layer norm's reductions, and the mixture's dispatch (a scatter) and combine (a
gather and a segment sum, scatter-adds again).

Each block's layers carry its name (``block0_attn``) and their sublayers Keras's short names (``qkv``,
``router``): the layer leaderboard names a kernel by its path (``block0_attn/qkv``), as it names the
sublayers of Keras's own attention (``multi_head_attention_1/value``).
"""

from __future__ import annotations

from typing import Any

import keras
from keras import layers, ops

from detprof.models.routing import CAPACITY_FACTOR, TOP_K, expert_capacity

PACKAGE = "detprof"


@keras.saving.register_keras_serializable(package=PACKAGE)
class PositionEmbedding(layers.Layer):
    """A learned embedding per position, added to the input (tokens or patches)."""

    def build(self, input_shape: tuple[int | None, ...]) -> None:
        self.positions = self.add_weight(
            name="positions", shape=tuple(input_shape[1:]), initializer=keras.initializers.RandomNormal(stddev=0.02)
        )

    def call(self, x: Any) -> Any:
        return x + self.positions


@keras.saving.register_keras_serializable(package=PACKAGE)
class ClassToken(layers.Layer):
    """A learned token put before the patches; the head reads the encoder's output at its position."""

    def build(self, input_shape: tuple[int | None, ...]) -> None:
        self.token = self.add_weight(name="token", shape=(1, 1, input_shape[-1]), initializer="zeros")

    def call(self, x: Any) -> Any:
        token = ops.broadcast_to(self.token, (ops.shape(x)[0], 1, x.shape[-1]))
        return ops.concatenate([ops.cast(token, x.dtype), x], axis=1)

    def compute_output_shape(self, input_shape: tuple[int | None, ...]) -> tuple[int | None, ...]:
        return (input_shape[0], None if input_shape[1] is None else input_shape[1] + 1, input_shape[2])


@keras.saving.register_keras_serializable(package=PACKAGE)
class FirstToken(layers.Layer):
    """The sequence's first position (a ViT's class token)."""

    def call(self, x: Any) -> Any:
        return x[:, 0]

    def compute_output_shape(self, input_shape: tuple[int | None, ...]) -> tuple[int | None, ...]:
        return (input_shape[0], input_shape[2])


@keras.saving.register_keras_serializable(package=PACKAGE)
class SelfAttention(layers.Layer):
    """Multi-head self-attention through ``keras.ops.dot_product_attention``: the backend's fused attention where
    it has one (PyTorch's scaled_dot_product_attention, JAX's dot_product_attention), causal for a GPT."""

    def __init__(self, heads: int, causal: bool, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.heads, self.causal = heads, causal
        self.qkv: layers.Dense | None = None
        self.out: layers.Dense | None = None

    def build(self, input_shape: tuple[int | None, ...]) -> None:
        width = int(input_shape[-1])
        self.qkv = layers.Dense(3 * width, name="qkv")
        self.out = layers.Dense(width, name="out")
        self.qkv.build(input_shape)
        self.out.build(input_shape)

    def call(self, x: Any) -> Any:
        length, width = x.shape[1], x.shape[2]
        qkv = ops.reshape(self.qkv(x), (-1, length, 3, self.heads, width // self.heads))
        attended = ops.dot_product_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], is_causal=self.causal)
        return self.out(ops.reshape(attended, (-1, length, width)))

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "heads": self.heads, "causal": self.causal}


@keras.saving.register_keras_serializable(package=PACKAGE)
class MixtureOfExperts(layers.Layer):
    """A top-k routed mixture of GELU MLP experts with a capacity per expert, as Switch and GShard route.

    Each token's k choices are dispatched by a scatter-add into each expert's slots (a token past its expert's
    capacity is dropped from it), the experts run as one batched matrix product, and the outputs come back by
    a gather and a segment sum over tokens, weighted by the router's renormalised probabilities. The load
    balancing loss (Switch Transformer's: experts times the sum of each expert's share of assignments and mean
    router probability) is an ``add_loss``, which the model's compiled loss includes. The dispatch is
    ``scatter_update(..., reduction="add")``, not ``ops.scatter``, which Keras' PyTorch backend runs as a Python
    loop over the indices (170 ms for one tiny step on a CPU).
    """

    def __init__(
        self,
        experts: int,
        top_k: int,
        hidden: int,
        capacity_factor: float = CAPACITY_FACTOR,
        balance: float = 0.01,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.experts, self.top_k, self.hidden = experts, top_k, hidden
        self.capacity_factor, self.balance = capacity_factor, balance
        self.router: layers.Dense | None = None

    def build(self, input_shape: tuple[int | None, ...]) -> None:
        width = int(input_shape[-1])
        self.router = layers.Dense(self.experts, name="router")
        self.router.build((None, width))
        self.w_in = self.add_weight(name="w_in", shape=(self.experts, width, self.hidden), initializer="glorot_uniform")
        self.w_out = self.add_weight(
            name="w_out", shape=(self.experts, self.hidden, width), initializer="glorot_uniform"
        )

    def compute_output_shape(self, input_shape: tuple[int | None, ...]) -> tuple[int | None, ...]:
        return input_shape

    def call(self, x: Any) -> Any:
        batch, length, width = x.shape
        count = batch * length
        capacity = expert_capacity(count, self.experts, self.top_k, self.capacity_factor)
        tokens = ops.reshape(x, (count, width))
        probabilities = ops.softmax(ops.cast(self.router(tokens), "float32"))
        weights, chosen = ops.top_k(probabilities, self.top_k)
        weights = weights / ops.sum(weights, axis=-1, keepdims=True)
        expert = ops.reshape(chosen, (-1,))
        assigned = ops.one_hot(expert, self.experts)
        position = ops.cast(ops.sum(ops.cumsum(assigned, axis=0) * assigned, axis=-1), "int32") - 1
        kept = ops.cast(position < capacity, x.dtype)
        slot = ops.cast(expert, "int32") * capacity + ops.minimum(position, capacity - 1)
        token = ops.repeat(ops.arange(count, dtype="int32"), self.top_k)
        dispatched = ops.take(tokens, token, axis=0) * kept[:, None]
        empty = ops.zeros((self.experts * capacity, width), dtype=x.dtype)
        slots = ops.scatter_update(empty, slot[:, None], dispatched, reduction="add")
        hidden = ops.gelu(ops.einsum("ecw,ewh->ech", ops.reshape(slots, (self.experts, capacity, width)), self.w_in))
        done = ops.reshape(ops.einsum("ech,ehw->ecw", hidden, self.w_out), (self.experts * capacity, width))
        gate = ops.cast(ops.reshape(weights, (-1,)), x.dtype) * kept
        combined = ops.segment_sum(ops.take(done, slot, axis=0) * gate[:, None], token, num_segments=count)
        share = ops.mean(assigned, axis=0)
        self.add_loss(self.balance * self.experts * ops.sum(share * ops.mean(probabilities, axis=0)))
        return ops.reshape(combined, (batch, length, width))

    def get_config(self) -> dict[str, Any]:
        settings = ("experts", "top_k", "hidden", "capacity_factor", "balance")
        return {**super().get_config(), **{name: getattr(self, name) for name in settings}}


def _block(x: Any, index: int, *, heads: int, causal: bool, mlp: int, experts: int, top_k: int) -> Any:
    """One pre-norm encoder or decoder block: attention, then an MLP or a mixture of experts, each residual."""
    name = f"block{index}"
    h = layers.LayerNormalization(epsilon=1e-5, name=f"{name}_norm1")(x)
    x = layers.Add(name=f"{name}_residual1")([x, SelfAttention(heads, causal, name=f"{name}_attn")(h)])
    h = layers.LayerNormalization(epsilon=1e-5, name=f"{name}_norm2")(x)
    if experts:
        h = MixtureOfExperts(experts, top_k, mlp, name=f"{name}_moe")(h)
    else:
        h = layers.Dense(mlp, activation="gelu", name=f"{name}_mlp_in")(h)
        h = layers.Dense(x.shape[-1], name=f"{name}_mlp_out")(h)
    return layers.Add(name=f"{name}_residual2")([x, h])


def gpt(
    input_shape: tuple[int, ...],
    classes: int,
    *,
    width: int,
    depth: int,
    heads: int,
    experts: int = 0,
) -> keras.Model:
    """A decoder-only language model: ``input_shape`` is ``(sequence length,)`` and ``classes`` the vocabulary; it
    predicts each next token (logits per position). With ``experts``, each block's MLP is a mixture of that many,
    each token routed to its ``TOP_K``."""
    (length,) = input_shape
    tokens = keras.Input(shape=(length,), dtype="int32", name="tokens")
    x = layers.Embedding(classes, width, name="token_embedding")(tokens)
    x = PositionEmbedding(name="position_embedding")(x)
    for index in range(depth):
        x = _block(x, index, heads=heads, causal=True, mlp=4 * width, experts=experts, top_k=TOP_K)
    x = layers.LayerNormalization(epsilon=1e-5, name="final_norm")(x)
    return keras.Model(tokens, layers.Dense(classes, name="lm_head")(x), name="gpt")


def vit(
    input_shape: tuple[int, ...], classes: int, *, patch: int, width: int, depth: int, heads: int, name: str = "vit"
) -> keras.Model:
    """A vision transformer on the CNNs' image inputs: square patches embedded by a strided convolution, a class
    token, position embeddings, encoder blocks, and a head on the class token."""
    images = keras.Input(shape=input_shape, name="images")
    x = layers.Conv2D(width, patch, strides=patch, name="patch_embedding")(images)
    x = layers.Reshape((-1, width), name="patches")(x)
    x = ClassToken(name="class_token")(x)
    x = PositionEmbedding(name="position_embedding")(x)
    for index in range(depth):
        x = _block(x, index, heads=heads, causal=False, mlp=4 * width, experts=0, top_k=0)
    x = layers.LayerNormalization(epsilon=1e-6, name="final_norm")(x)
    return keras.Model(images, layers.Dense(classes, name="head")(FirstToken(name="class_output")(x)), name=name)
