"""``name -> builder(input_shape, classes)`` for every model detprof can profile or train.

The paper's models are listed statically so that validating ``--model`` names in the
sweep's parent process does not import TensorFlow; the remaining Keras applications are
discovered from ``keras.applications`` only when a name is not one of ours.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from detprof.errors import UsageError
from detprof.models import kinds, paper_cnns

if TYPE_CHECKING:
    import keras

    from detprof.models.own import OwnModel

InputShape = tuple[int, ...]
"""An image's (height, width, channels), or a token model's (sequence length,)."""
Builder = Callable[[InputShape, int], Any]
"""A Keras model's builder, or a native module's factory (``ModelSpec.native``)."""

IMAGENET_SHAPE: InputShape = (224, 224, 3)
PAPER_KERAS_APPLICATIONS = {
    "vgg16": "VGG16",
    "vgg19": "VGG19",
    "resnet50": "ResNet50",
    "resnet152": "ResNet152",
    "densenet121": "DenseNet121",
    "densenet201": "DenseNet201",
    "inceptionv3": "InceptionV3",
    "xception": "Xception",
    "mobilenet": "MobileNet",
    "efficientnetb0": "EfficientNetB0",
}


@dataclass(frozen=True)
class ModelSpec:
    name: str
    family: str
    builder: Builder
    input_shape: InputShape
    classes: int
    takes: str = "images"
    """``images`` (float HxWxC) or ``tokens`` (integer ids; ``classes`` is then the vocabulary)."""
    gpu_dtype_policy: str | None = None
    """The Keras dtype policy the model trains in on a GPU, as its users train it there (a transformer in bfloat16
    mixed precision, where the fused attention kernels run); None: float32 everywhere."""
    native: str | None = None
    """``package.module:FUNCTION`` of a native module's factory (``models.huggingface``, ``models.flax_zoo``),
    planned and trained as a module of your own is (``native_model``); None: a Keras model. Its input shape is the
    module's own layout: an image's channels first for PyTorch, last for Flax."""
    api: str = kinds.KERAS.api
    """The kind of model it is (``kinds.ModelKind.api``)."""
    needs: str | None = None
    """The package of ``MODEL_PACKAGES`` it is built with, which detprof's own extras may not install."""

    @property
    def channels_first(self) -> bool:
        return self.native is not None and self.api == kinds.TORCH.api

    def shape_at(self, size: int) -> InputShape:
        """The input shape at ``--input-size``: square images with the model's channels (first, for a PyTorch
        module), or ``size`` tokens."""
        if self.takes == "tokens":
            return (size,)
        return (self.input_shape[0], size, size) if self.channels_first else (size, size, self.input_shape[-1])

    def build(self, input_shape: InputShape | None = None, classes: int | None = None) -> Any:
        """The Keras model, or the native module."""
        return self.builder(input_shape or self.input_shape, classes or self.classes)


def _keras_application(class_name: str, input_shape: InputShape, classes: int) -> keras.Model:
    import keras

    constructor = getattr(keras.applications, class_name)
    return constructor(weights=None, input_shape=input_shape, classes=classes)


def _application_spec(name: str, class_name: str) -> ModelSpec:
    return ModelSpec(name, "keras-applications", partial(_keras_application, class_name), IMAGENET_SHAPE, 1000)


def _paper_specs() -> dict[str, ModelSpec]:
    specs = {name: _application_spec(name, cls) for name, cls in PAPER_KERAS_APPLICATIONS.items()}
    for k in paper_cnns.MEDIUM_CNN_KERNEL_SIZES:
        specs[f"mediumcnn_k{k}"] = ModelSpec(
            f"mediumcnn_k{k}",
            "medium-cnn",
            partial(paper_cnns.medium_cnn, kernel_size=k),
            IMAGENET_SHAPE,
            1000,
        )
    specs["smallcnn"] = ModelSpec("smallcnn", "small-cnn", paper_cnns.small_cnn, (32, 32, 3), 10)
    specs["smallcnn_bn"] = ModelSpec(
        "smallcnn_bn", "small-cnn", partial(paper_cnns.small_cnn, batch_norm=True), (32, 32, 3), 10
    )
    specs["resnet18"] = ModelSpec("resnet18", "resnet", paper_cnns.resnet18, (32, 32, 3), 10)
    return specs


TRANSFORMER_SIZES = {"tiny": {"width": 32, "depth": 2, "heads": 2}, "small": {"width": 384, "depth": 4, "heads": 6}}
"""Each transformer at two sizes: ``tiny`` trains on a CPU in seconds, ``small`` is sized for a GPU step of tens of
milliseconds (the kernels bench times its ops at ``small``)."""
EXPERTS = {"tiny": 4, "small": 8}
"""A mixture's experts per size."""
TOKENS = {"tiny": ((16,), 64), "small": ((256,), 8192)}
"""A GPT's (sequence length,) and vocabulary per size."""
IMAGES = {"tiny": ((32, 32, 3), 10), "small": (IMAGENET_SHAPE, 1000)}
PATCHES = {"tiny": 8, "small": 16}
"""A ViT's images and classes, and its patches' side, per size."""


def _transformer(family: str, size: str) -> Builder:
    def build(input_shape: InputShape, classes: int) -> keras.Model:
        from detprof.models import transformers

        sizes = TRANSFORMER_SIZES[size]
        if family == "vit":
            return transformers.vit(input_shape, classes, patch=PATCHES[size], **sizes)
        return transformers.gpt(input_shape, classes, experts=EXPERTS[size] if family == "moe" else 0, **sizes)

    return build


def _transformer_specs() -> dict[str, ModelSpec]:
    """``gpt``, ``moe`` and ``vit`` at each of ``TRANSFORMER_SIZES``. A GPT's ``--input-size`` is its sequence length
    and ``--classes`` its vocabulary. On a GPU they train in bfloat16 mixed precision, as their users train them
    there."""
    specs = {}
    for family in ("gpt", "moe", "vit"):
        for size in TRANSFORMER_SIZES:
            takes = "images" if family == "vit" else "tokens"
            shape, classes = (IMAGES if family == "vit" else TOKENS)[size]
            name = f"{family}_{size}"
            builder = _transformer(family, size)
            specs[name] = ModelSpec(name, family, builder, shape, classes, takes, gpu_dtype_policy="mixed_bfloat16")
    return specs


NATIVE_FACTORIES = "detprof.models.huggingface"
FLAX_FACTORIES = "detprof.models.flax_zoo"
HUGGING_FACE = {
    "resnet50": ("resnet", "images"),
    "vit": ("vit", "images"),
    "gpt2": ("gpt", "tokens"),
    "llama": ("llama", "tokens"),
}
"""The native models: Hugging Face transformers' architectures people train, each a family and what it takes."""
NATIVE_NEEDS = "transformers"
FLAX_NEEDS = "flax"
MODEL_PACKAGES = {
    "torchvision": "pip install torchvision",
    "timm": "pip install timm",
    NATIVE_NEEDS: "pip install 'detprof[huggingface]'",
    FLAX_NEEDS: "pip install 'detprof[flax]'",
}
"""Packages of models people train that detprof does not install (``detprof[torch]`` stays light), each with what
installs it."""


LIBRARY_MODELS = {
    "torchvision.models:convnext_tiny": "resnet50",
    "timm.models.efficientnet:efficientnet_b0": "efficientnetb0",
}
"""Model functions of torchvision and timm as you name them to ``--models`` (called with no arguments: 1,000
classes, 3x224x224 images), each with the registry model of its size and kind whose measured cost stands in for
its own until a GPU measured it (ConvNeXt-T: 4.5 GFLOPs and 29 M parameters; ResNet-50: 4.1 and 26 M). Their
labels (``convnext_tiny``, ``efficientnet_b0``) are no registry name."""


def not_installed(given: str, package: str) -> str:
    """The one line for a model (``given``) that needs ``package`` of ``MODEL_PACKAGES`` where it is missing."""
    return f"{given} needs {package}, which is not installed here: {MODEL_PACKAGES[package]}"


def sized_factories(module: str, architectures: dict[str, Callable[..., Any]]) -> Callable[[str], Any]:
    """A factories module's ``__getattr__``: each architecture's factory of ``(input_shape, classes)`` at each of
    ``TRANSFORMER_SIZES`` as that module's function ``ARCHITECTURE_SIZE`` (``gpt2_tiny``), as ``--models`` and the
    registry name them (``detprof.models.huggingface:gpt2_tiny``)."""
    factories = {
        f"{name}_{size}": partial(build, size=size)
        for name, build in architectures.items()
        for size in TRANSFORMER_SIZES
    }

    def attribute(name: str) -> Any:
        try:
            return factories[name]
        except KeyError:
            raise AttributeError(f"module {module!r} has no attribute {name!r}") from None

    return attribute


def _native_factory(module: str, function: str) -> Builder:
    def build(input_shape: InputShape, classes: int) -> Any:
        return getattr(importlib.import_module(module), function)(input_shape, classes)

    return build


FLAX_ZOO = {"resnet": ("resnet", "images"), "gpt": ("gpt", "tokens")}
"""The Flax NNX models (``models.flax_zoo``), each a family and what it takes."""


def _native_specs(
    prefix: str, zoo: dict[str, tuple[str, str]], factories: str, kind: kinds.ModelKind, needs: str
) -> dict[str, ModelSpec]:
    """``PREFIX_ARCHITECTURE_SIZE`` for each architecture of ``zoo`` (built by ``factories``, with ``needs``) at each
    of ``TRANSFORMER_SIZES``, sized as the Keras models are (images channels first for a PyTorch module)."""
    specs = {}
    for architecture, (family, takes) in zoo.items():
        for size in TRANSFORMER_SIZES:
            shape, classes = (IMAGES if takes == "images" else TOKENS)[size]
            if takes == "images" and kind is kinds.TORCH:
                shape = (shape[-1], *shape[:-1])
            function = f"{architecture}_{size}"
            builder = _native_factory(factories, function)
            name, native = f"{prefix}_{function}", f"{factories}:{function}"
            specs[name] = ModelSpec(
                name, family, builder, shape, classes, takes, native=native, api=kind.api, needs=needs
            )
    return specs


PAPER_MODELS: dict[str, ModelSpec] = _paper_specs()
"""The paper's zoo, which the ``paper`` preset sweeps."""
NATIVE_MODELS: dict[str, ModelSpec] = {
    **_native_specs("hf", HUGGING_FACE, NATIVE_FACTORIES, kinds.TORCH, NATIVE_NEEDS),
    **_native_specs("flax", FLAX_ZOO, FLAX_FACTORIES, kinds.FLAX, FLAX_NEEDS),
}
"""Native modules people train (Hugging Face's on PyTorch, Flax NNX's on JAX), trained as modules of your own
are."""
BUILT_IN: dict[str, ModelSpec] = PAPER_MODELS | _transformer_specs() | NATIVE_MODELS
"""Every model detprof defines itself: the paper's, the transformers and the native modules."""


def _other_keras_applications() -> dict[str, ModelSpec]:
    """Every Keras application not in the paper's list.

    Reached in detprof's own process when ``--model`` is not one of ours (sweep, kernels and
    stability validate names before starting workers), hence Keras on the framework installed,
    loaded quietly.
    """
    from detprof.backends import import_keras

    keras = import_keras()

    found = {}
    for attr in dir(keras.applications):
        if attr[0].isupper() and callable(getattr(keras.applications, attr)):
            name = attr.lower()
            if name not in BUILT_IN:
                found[name] = _application_spec(name, attr)
    return found


def all_models() -> dict[str, ModelSpec]:
    return {**BUILT_IN, **_other_keras_applications()}


ATTENTION_FAMILIES = frozenset({"gpt", "moe", "vit", "llama"})


def runs_attention(name: str) -> bool | None:
    """Whether a model runs attention: the transformers do, the paper's zoo does not; None for a model this
    registry does not define (yours, or a Keras application outside the paper's), which may."""
    spec = BUILT_IN.get(name.strip().lower())
    return None if spec is None else spec.family in ATTENTION_FAMILIES


def get(name: str) -> ModelSpec:
    key = name.strip().lower()
    if key in BUILT_IN:
        return BUILT_IN[key]
    every = all_models()
    if key in every:
        return every[key]
    if key.endswith(".py"):
        raise UsageError(
            f"{name.strip()!r} is a file, not a model: name the function in it that returns the model "
            f"({name.strip()}:FUNCTION)"
        )
    close = difflib.get_close_matches(key, every, n=3, cutoff=0.7)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise UsageError(f"unknown model {name!r}{hint}; valid models: {', '.join(sorted(every))}")


def build(name: str, input_shape: InputShape | None = None, classes: int | None = None) -> Any:
    """The Keras model, or the native module, ``name`` names."""
    return get(name).build(input_shape, classes)


def is_native(name: str) -> bool:
    """Whether ``name`` is a native registry model (``ModelSpec.native``)."""
    spec = BUILT_IN.get(name.strip().lower())
    return spec is not None and spec.native is not None


def kind_of(name: str) -> kinds.ModelKind | None:
    """The native kind of a registry model (``kinds.NATIVE``); None for a Keras model or a name it does not define."""
    spec = BUILT_IN.get(name.strip().lower())
    return None if spec is None else kinds.native(spec.api)


def native_model(name: str) -> OwnModel | None:
    """A native registry model as a module of your own (labelled by its registry name), which the study plans,
    inspects and trains as it does yours; None for a Keras model. One line where the package it needs is not
    installed."""
    if not is_native(name):
        return None
    spec = get(name)
    if spec.needs is not None and importlib.util.find_spec(spec.needs) is None:
        raise UsageError(not_installed(spec.name, spec.needs))
    from detprof.models.own import OwnModel

    module, _, function = str(spec.native).partition(":")
    return OwnModel(spec.name, "factory", spec.name, module=module, function=function)
