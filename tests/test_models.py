"""The registry builds the architectures the papers describe."""

from __future__ import annotations

import keras
import pytest

from detprof.errors import UsageError
from detprof.models import registry
from detprof.models.paper_cnns import MEDIUM_CNN_CHANNELS


def conv_layers(model: keras.Model) -> list[keras.layers.Conv2D]:
    return [layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D)]


@pytest.mark.slow  # builds Keras models
@pytest.mark.parametrize("k", [1, 3, 5, 7])
def test_medium_cnn_has_six_blocks_of_the_given_kernel_size(k: int) -> None:
    model = registry.build(f"mediumcnn_k{k}", (64, 64, 3), 10)
    convs = conv_layers(model)
    assert [c.filters for c in convs] == list(MEDIUM_CNN_CHANNELS)
    assert all(c.kernel_size == (k, k) and c.strides == (1, 1) and c.padding == "same" for c in convs)
    kinds = [type(layer).__name__ for layer in model.layers]
    assert kinds.count("BatchNormalization") == 6 and kinds.count("MaxPooling2D") == 6
    assert kinds[-2:] == ["GlobalAveragePooling2D", "Dense"]
    assert registry.get(f"mediumcnn_k{k}").input_shape == (224, 224, 3)
    assert registry.get(f"mediumcnn_k{k}").classes == 1000


@pytest.mark.slow  # builds Keras models
def test_small_cnn_variants() -> None:
    plain = registry.build("smallcnn")
    with_bn = registry.build("smallcnn_bn")
    assert [c.filters for c in conv_layers(plain)] == [16, 32, 32]
    assert not any(isinstance(x, keras.layers.BatchNormalization) for x in plain.layers)
    assert sum(isinstance(x, keras.layers.BatchNormalization) for x in with_bn.layers) == 3
    assert plain.input_shape == (None, 32, 32, 3)
    assert plain.get_layer("penultimate").units == 32


@pytest.mark.slow  # builds a Keras model
def test_resnet18_is_cifar_style() -> None:
    model = registry.build("resnet18")
    assert model.get_layer("stem_conv").kernel_size == (3, 3)
    assert not any(isinstance(x, keras.layers.MaxPooling2D) for x in model.layers)
    blocks = {layer.name.rsplit("_", 1)[0] for layer in model.layers if layer.name.endswith("_add")}
    assert len(blocks) == 8
    assert sum(layer.name.endswith("_proj") for layer in model.layers) == 3
    assert model.count_params() == pytest.approx(11.17e6, rel=0.01)


def test_keras_applications_and_unknown_names() -> None:
    assert set(registry.PAPER_KERAS_APPLICATIONS) <= set(registry.all_models())
    assert registry.get("mobilenetv2").family == "keras-applications"
    assert registry.get("MobileNet").name == "mobilenet"
    with pytest.raises(UsageError, match=r"valid models: .*resnet18"):
        registry.get("alexnet")
