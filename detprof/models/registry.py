"""``name -> builder(input_shape, classes)`` for every model detprof can profile or train.

The paper's models are listed statically so that validating ``--model`` names in the
sweep's parent process does not import TensorFlow; the remaining Keras applications are
discovered from ``keras.applications`` only when a name is not one of ours.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from detprof.errors import UsageError
from detprof.models import paper_cnns

if TYPE_CHECKING:
    import keras

InputShape = tuple[int, int, int]
Builder = Callable[[InputShape, int], "keras.Model"]

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

    def build(self, input_shape: InputShape | None = None, classes: int | None = None) -> keras.Model:
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


PAPER_MODELS: dict[str, ModelSpec] = _paper_specs()


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
            if name not in PAPER_MODELS:
                found[name] = _application_spec(name, attr)
    return found


def all_models() -> dict[str, ModelSpec]:
    return {**PAPER_MODELS, **_other_keras_applications()}


def get(name: str) -> ModelSpec:
    key = name.strip().lower()
    if key in PAPER_MODELS:
        return PAPER_MODELS[key]
    every = all_models()
    if key in every:
        return every[key]
    raise UsageError(f"unknown model {name!r}; valid models: {', '.join(sorted(every))}")


def build(name: str, input_shape: InputShape | None = None, classes: int | None = None) -> keras.Model:
    return get(name).build(input_shape, classes)
