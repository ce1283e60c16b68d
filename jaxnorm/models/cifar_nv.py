"""CIFAR-NV: the fully convolutional CIFAR network of Gitman & Ginsburg (2017)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxnorm.models.norms import NormLayers


class CifarNV(nn.Module):
    """Gitman & Ginsburg's CIFAR network as the ENorm paper trains it (Stock et al. 2019, Sec. 6.2).

    Three blocks on 28 x 28 crops::

        3x3 conv w0 (x3)              -> max-pool 3x3 / 2 (pad 1)    28 -> 14
        3x3 conv w1 (x3)              -> max-pool 3x3 / 2 (pad 1)    14 -> 7
        3x3 conv w2, 1x1 conv w2, global average pool, classifier -> logits

    with ``widths = (w0, w1, w2) = (128, 256, 320)``. Every conv but the last is followed by
    the normalization and a ReLU. The paper's last layer, a 1x1 conv to the classes followed by
    average pooling, is written as pooling followed by a Dense classifier (the same linear map,
    as pooling commutes with a 1x1 conv), optionally followed by the paper's BN (``final_bn``).

    Differences from the authors' code (facebookresearch/enorm, ``FullyConvolutional``), all
    documented choices: their model always has exactly two BatchNorms (after convs 3 and 6;
    here ``norm_every_conv=False`` reproduces that placement), applies a ReLU to the class
    scores and averages a 5 x 5 window of a zero-padded 9 x 9 map; here the classifier output
    is averaged over the whole 7 x 7 map without a ReLU (a linear read-out, so logits can be
    negative), and the classifier has a bias. The paper text specifies Xavier initialisation
    (the ``create`` default); the code uses Kaiming.

    Attributes:
      num_classes: output units.
      layers: the normalization's layer factory.
      widths: channels of the three blocks.
      norm_every_conv: normalize after every hidden conv (default) or only after the last conv
        of the first two blocks, as the authors' code does.
      final_bn: add a BatchNorm after the classifier.
    """

    num_classes: int
    layers: NormLayers
    widths: tuple[int, int, int] = (128, 256, 320)
    norm_every_conv: bool = True
    final_bn: bool = False

    @nn.compact
    def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
        layers = self.layers
        w0, w1, w2 = self.widths
        plan = [(w0, 3), (w0, 3), (w0, 3), "pool", (w1, 3), (w1, 3), (w1, 3), "pool",
                (w2, 3), (w2, 1)]
        index = 0
        for i, item in enumerate(plan):
            if item == "pool":
                x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
                continue
            features, kernel = item
            block_end = plan[i + 1] == "pool" if i + 1 < len(plan) else False
            normalize = self.norm_every_conv or block_end
            x = layers.conv(x, features, kernel, train=train, name=f"conv_{index}",
                            normalize=normalize)
            index += 1
        x = jnp.mean(x, axis=(1, 2))
        return layers.head(x, self.num_classes, train=train, final_bn=self.final_bn)
