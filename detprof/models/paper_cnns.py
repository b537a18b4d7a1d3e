"""The CNNs of Zhuang et al. that are not Keras applications.

The medium CNN isolates the effect of convolution kernel size on determinism overhead
(the paper's Figure 8b); the small CNN is the fast model of the stability experiments;
ResNet-18 is the CIFAR-style network both papers train.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import keras

MEDIUM_CNN_CHANNELS = (16, 32, 64, 128, 256, 512)
MEDIUM_CNN_KERNEL_SIZES = (1, 3, 5, 7)
SMALL_CNN_CHANNELS = (16, 32, 32)
RESNET18_STAGES = ((64, 2), (128, 2), (256, 2), (512, 2))


def medium_cnn(input_shape: tuple[int, ...], classes: int, kernel_size: int) -> keras.Model:
    import keras
    from keras import layers

    inputs = keras.Input(shape=input_shape)
    x = inputs
    for i, channels in enumerate(MEDIUM_CNN_CHANNELS):
        x = layers.Conv2D(channels, kernel_size, strides=1, padding="same", name=f"conv{i + 1}")(x)
        x = layers.BatchNormalization(name=f"bn{i + 1}")(x)
        x = layers.ReLU(name=f"relu{i + 1}")(x)
        x = layers.MaxPooling2D(2, padding="same", name=f"pool{i + 1}")(x)
    x = layers.GlobalAveragePooling2D(name="gap")(x)
    outputs = layers.Dense(classes, name="logits")(x)
    return keras.Model(inputs, outputs, name=f"mediumcnn_k{kernel_size}")


def small_cnn(input_shape: tuple[int, ...], classes: int, batch_norm: bool = False) -> keras.Model:
    import keras
    from keras import layers

    inputs = keras.Input(shape=input_shape)
    x = inputs
    for i, channels in enumerate(SMALL_CNN_CHANNELS):
        x = layers.Conv2D(channels, 3, padding="same", name=f"conv{i + 1}")(x)
        if batch_norm:
            x = layers.BatchNormalization(name=f"bn{i + 1}")(x)
        x = layers.ReLU(name=f"relu{i + 1}")(x)
        x = layers.MaxPooling2D(2, padding="same", name=f"pool{i + 1}")(x)
    x = layers.GlobalAveragePooling2D(name="gap")(x)
    x = layers.Dense(32, activation="relu", name="penultimate")(x)
    outputs = layers.Dense(classes, name="logits")(x)
    return keras.Model(inputs, outputs, name="smallcnn_bn" if batch_norm else "smallcnn")


def resnet18(input_shape: tuple[int, ...], classes: int) -> keras.Model:
    import keras
    from keras import layers

    def basic_block(x: keras.KerasTensor, channels: int, stride: int, name: str) -> keras.KerasTensor:
        shortcut = x
        y = layers.Conv2D(channels, 3, strides=stride, padding="same", use_bias=False, name=f"{name}_conv1")(x)
        y = layers.BatchNormalization(name=f"{name}_bn1")(y)
        y = layers.ReLU(name=f"{name}_relu1")(y)
        y = layers.Conv2D(channels, 3, padding="same", use_bias=False, name=f"{name}_conv2")(y)
        y = layers.BatchNormalization(name=f"{name}_bn2")(y)
        if stride != 1 or shortcut.shape[-1] != channels:
            shortcut = layers.Conv2D(channels, 1, strides=stride, use_bias=False, name=f"{name}_proj")(shortcut)
            shortcut = layers.BatchNormalization(name=f"{name}_proj_bn")(shortcut)
        y = layers.Add(name=f"{name}_add")([y, shortcut])
        return layers.ReLU(name=f"{name}_out")(y)

    inputs = keras.Input(shape=input_shape)
    x = layers.Conv2D(64, 3, padding="same", use_bias=False, name="stem_conv")(inputs)
    x = layers.BatchNormalization(name="stem_bn")(x)
    x = layers.ReLU(name="stem_relu")(x)
    for stage, (channels, blocks) in enumerate(RESNET18_STAGES):
        for block in range(blocks):
            stride = 2 if stage > 0 and block == 0 else 1
            x = basic_block(x, channels, stride, name=f"stage{stage + 1}_block{block + 1}")
    x = layers.GlobalAveragePooling2D(name="gap")(x)
    outputs = layers.Dense(classes, name="logits")(x)
    return keras.Model(inputs, outputs, name="resnet18")
