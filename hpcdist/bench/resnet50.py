"""The trainable tensors of ResNet-50, by shape: a realistic gradient list for benchmarks.

ResNet-50 (He et al., 2015, the ImageNet model with 1000 classes) is a 7x7
stem convolution with batch norm, four stages of bottleneck blocks (3, 4, 6
and 3 blocks of widths 64, 128, 256 and 512, each block 1x1 -> 3x3 -> 1x1
convolutions with 4x expansion and a batch norm after each; the first block
of a stage adds a 1x1 projection with its batch norm), global pooling and a
fully connected layer. Convolutions have no bias; each batch norm has a
``gamma`` and a ``beta``. That gives 161 tensors and 25,557,032 parameters,
the count every framework reports for the model (the "25.6 M").
Batch-norm running statistics are buffers, not gradients, and are not listed.

Example:
    >>> shapes = resnet50_shapes()
    >>> len(shapes), parameter_count(shapes)
    (161, 25557032)
    >>> shapes[0], shapes[-2]
    (('conv1.weight', (64, 3, 7, 7)), ('fc.weight', (1000, 2048)))
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import DTypeLike

#: (blocks, bottleneck width, stride of the first block) of each stage.
STAGES = ((3, 64, 1), (4, 128, 2), (6, 256, 2), (3, 512, 2))
EXPANSION = 4
NUM_CLASSES = 1000
TENSORS = 161
PARAMETERS = 25_557_032


def _batch_norm(name: str, channels: int) -> list[tuple[str, tuple[int, ...]]]:
    return [(f"{name}.weight", (channels,)), (f"{name}.bias", (channels,))]


def resnet50_shapes(num_classes: int = NUM_CLASSES) -> list[tuple[str, tuple[int, ...]]]:
    """``(name, shape)`` of every trainable tensor of ResNet-50, in the network's order.

    Names follow the usual layout (``layer2.0.conv2.weight``, ``layer2.0.downsample.0.weight``).

    Example:
        >>> dict(resnet50_shapes())["layer4.2.conv3.weight"]
        (2048, 512, 1, 1)
    """
    shapes: list[tuple[str, tuple[int, ...]]] = [("conv1.weight", (64, 3, 7, 7))]
    shapes += _batch_norm("bn1", 64)
    channels = 64
    for stage, (blocks, width, _stride) in enumerate(STAGES, start=1):
        out = width * EXPANSION
        for block in range(blocks):
            prefix = f"layer{stage}.{block}"
            shapes.append((f"{prefix}.conv1.weight", (width, channels, 1, 1)))
            shapes += _batch_norm(f"{prefix}.bn1", width)
            shapes.append((f"{prefix}.conv2.weight", (width, width, 3, 3)))
            shapes += _batch_norm(f"{prefix}.bn2", width)
            shapes.append((f"{prefix}.conv3.weight", (out, width, 1, 1)))
            shapes += _batch_norm(f"{prefix}.bn3", out)
            if block == 0:  # channels or resolution change: a 1x1 projection
                shapes.append((f"{prefix}.downsample.0.weight", (out, channels, 1, 1)))
                shapes += _batch_norm(f"{prefix}.downsample.1", out)
            channels = out
    shapes.append(("fc.weight", (num_classes, channels)))
    shapes.append(("fc.bias", (num_classes,)))
    return shapes


def parameter_count(shapes: list[tuple[str, tuple[int, ...]]]) -> int:
    """The number of scalars in tensors of these shapes.

    Example:
        >>> parameter_count([("w", (3, 4)), ("b", (4,))])
        16
    """
    return sum(math.prod(shape) for _, shape in shapes)


def resnet50_gradients(dtype: DTypeLike = np.float32, fill: float = 1.0) -> list[np.ndarray]:
    """One new array per trainable tensor of ResNet-50, filled with ``fill``.

    Example:
        >>> grads = resnet50_gradients()
        >>> len(grads), grads[-1].shape, grads[0].dtype
        (161, (1000,), dtype('float32'))
    """
    return [np.full(shape, fill, dtype=dtype) for _, shape in resnet50_shapes()]
