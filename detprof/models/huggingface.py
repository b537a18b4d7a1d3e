"""Models people train, native: Hugging Face transformers' ResNet-50, ViT, GPT-2 and a Llama-style decoder.

Each is built from its configuration (no weights downloaded: the machines detprof measures on may
reach no hub) at detprof's two sizes, ``tiny`` for a CPU and ``small`` for the GPU study, and trained
as any native PyTorch module is (``models.torch_modules``): the registry names them ``hf_*``, so
that they cannot be taken for the Keras models of the same architectures, and plans them as
modules of this file's factories (``registry.native_model``). A factory takes ``(input_shape,
classes)`` in the module's own layout: an image's channels first, a sequence's length; for a
language model, ``classes`` is its vocabulary. Runs in workers only: transformers is imported where
a model is built.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from detprof.models.registry import PATCHES, TRANSFORMER_SIZES, sized_factories

RESNET50_WIDTHS = {"tiny": (16, [32, 64, 128, 256]), "small": (64, [256, 512, 1024, 2048])}
"""ResNet-50's stem and its four stages' widths: the paper's at ``small``, a sixteenth of them at ``tiny``; both
keep its bottleneck blocks and depths (3, 4, 6, 3)."""
RESNET50_DEPTHS = [3, 4, 6, 3]


def resnet50(input_shape: Sequence[int], classes: int, size: str) -> Any:
    from transformers import ResNetConfig, ResNetForImageClassification

    stem, widths = RESNET50_WIDTHS[size]
    config = ResNetConfig(
        num_channels=input_shape[0],
        embedding_size=stem,
        hidden_sizes=widths,
        depths=RESNET50_DEPTHS,
        layer_type="bottleneck",
        num_labels=classes,
    )
    return ResNetForImageClassification(config)


def vit(input_shape: Sequence[int], classes: int, size: str) -> Any:
    from transformers import ViTConfig, ViTForImageClassification

    shape = TRANSFORMER_SIZES[size]
    config = ViTConfig(
        image_size=input_shape[-1],
        patch_size=PATCHES[size],
        num_channels=input_shape[0],
        hidden_size=shape["width"],
        num_hidden_layers=shape["depth"],
        num_attention_heads=shape["heads"],
        intermediate_size=4 * shape["width"],
        num_labels=classes,
    )
    return ViTForImageClassification(config)


def gpt2(input_shape: Sequence[int], classes: int, size: str) -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    shape = TRANSFORMER_SIZES[size]
    config = GPT2Config(
        vocab_size=classes,
        bos_token_id=classes - 1,
        eos_token_id=classes - 1,
        n_positions=input_shape[0],
        n_embd=shape["width"],
        n_layer=shape["depth"],
        n_head=shape["heads"],
    )
    return GPT2LMHeadModel(config)


def llama(input_shape: Sequence[int], classes: int, size: str) -> Any:
    """A Llama-style decoder: RMS norm, rotary positions, SwiGLU, grouped-query attention (a key and value head per
    two query heads); the transformers' widths, depths and heads of the Keras registry's own (``gpt_tiny``)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = TRANSFORMER_SIZES[size]
    config = LlamaConfig(
        vocab_size=classes,
        hidden_size=shape["width"],
        intermediate_size=8 * shape["width"] // 3,
        num_hidden_layers=shape["depth"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["heads"] // 2,
        max_position_embeddings=input_shape[0],
    )
    return LlamaForCausalLM(config)


ARCHITECTURES = {"resnet50": resnet50, "vit": vit, "gpt2": gpt2, "llama": llama}
__getattr__ = sized_factories(__name__, ARCHITECTURES)
