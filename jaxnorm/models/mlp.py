"""Fully connected ReLU network (the ENorm paper's FC depth sweep)."""

from __future__ import annotations

import flax.linen as nn
import jax

from jaxnorm.models.norms import NormLayers


class MLP(nn.Module):
    """``depth`` hidden layers of ``width`` units (Dense -> norm -> ReLU), then a classifier.

    The input is flattened, so images of any shape work. ``depth + 1`` linear layers in all:
    Stock et al. (2019), Sec. 6.1, use a 3072 x 500 input layer, ``p`` 500 x 500 layers and a
    500 x 10 classifier with Xavier initialisation (``create("mlp", ...)`` defaults to Xavier).
    With ``norm="none"`` the params are ``{"dense_0", ..., "dense_{depth-1}", "head"}``, each
    ``{"kernel", "bias"}``: the chain that :func:`jaxnorm.enorm.chain` reads.

    Attributes:
      num_classes: output units.
      layers: the normalization's layer factory (:func:`jaxnorm.models.norms.norm_layers`).
      depth: number of hidden layers (>= 0).
      width: hidden units per layer.
      final_bn: add a BatchNorm after the classifier (Stock et al. 2019, Sec. 6.2).
    """

    num_classes: int
    layers: NormLayers
    depth: int = 2
    width: int = 500
    final_bn: bool = False

    @nn.compact
    def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
        x = x.reshape((x.shape[0], -1))
        for i in range(self.depth):
            x = self.layers.dense(x, self.width, train=train, name=f"dense_{i}")
        return self.layers.head(x, self.num_classes, train=train, final_bn=self.final_bn)
