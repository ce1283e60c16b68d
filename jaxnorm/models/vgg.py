"""VGG-11 / VGG-16 (Simonyan & Zisserman 2015, configurations A and D) with a norm after every conv."""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxnorm.models.norms import NormLayers

POOL = 0
"""Marks a 2x2 max-pool in a configuration."""

CONFIGS: dict[str, tuple[int, ...]] = {
    "vgg11": (64, POOL, 128, POOL, 256, 256, POOL, 512, 512, POOL, 512, 512, POOL),
    "vgg16": (64, 64, POOL, 128, 128, POOL, 256, 256, 256, POOL, 512, 512, 512, POOL,
              512, 512, 512, POOL),
}


class VGG(nn.Module):
    """3x3 conv -> norm -> ReLU units with 2x2 max-pools, global average pooling, one classifier.

    The convolutional part follows configurations A (VGG-11) and D (VGG-16) of Simonyan &
    Zisserman (2015, Table 1) with a normalization after every conv, as in the CIFAR VGGs of
    Hoffer et al. (2018). The three fully connected layers of the ImageNet model are replaced by
    global average pooling and one classifier (the usual CIFAR variant: on 32 x 32 inputs the
    features are 1 x 1 x 512 after the last pool). Pools use "SAME" padding (a ceiling), so
    28 x 28 inputs (Fashion-MNIST) work too: 28 -> 14 -> 7 -> 4 -> 2 -> 1.

    Attributes:
      num_classes: output units.
      layers: the normalization's layer factory.
      config: channels per conv, :data:`POOL` for a max-pool.
      width_multiplier: scales every conv's channel count, rounded to the nearest integer and at least 1
        (1.0 = the paper; small for tests).
      final_bn: add a BatchNorm after the classifier.
    """

    num_classes: int
    layers: NormLayers
    config: Sequence[int]
    width_multiplier: float = 1.0
    final_bn: bool = False

    @nn.compact
    def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
        if self.width_multiplier <= 0:
            raise ValueError(
                f"width_multiplier must be positive, got {self.width_multiplier}")
        index = 0
        for channels in self.config:
            if channels == POOL:
                x = nn.max_pool(x, (2, 2), strides=(2, 2), padding="SAME")
                continue
            features = max(1, round(channels * self.width_multiplier))
            x = self.layers.conv(x, features, 3, train=train, name=f"conv_{index}")
            index += 1
        x = jnp.mean(x, axis=(1, 2))
        return self.layers.head(x, self.num_classes, train=train, final_bn=self.final_bn)
