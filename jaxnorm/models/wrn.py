"""Wide residual network WRN-d-k (Zagoruyko & Komodakis 2016), pre-activation blocks."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxnorm.functional.checks import is_int, is_real
from jaxnorm.models.norms import NormLayers


class WideBlock(nn.Module):
    """Pre-activation block (Zagoruyko & Komodakis 2016, Fig. 1d, B(3,3)).

    ``o = relu(norm1(x))``; ``y = conv2(dropout(relu(norm2(conv1(o)))))``; output ``y + x``,
    or ``y + conv1x1(o)`` when the shape changes. For weight-space methods (``wn``, ``swn``,
    ``normprop``, ``none``) the normalization steps are identities: ``normprop``'s convs
    normalize their own pre-activations, without the ReLU moment correction (the ReLU is
    applied before the next conv here).

    Attributes:
      features: output channels.
      strides: stride of ``conv1`` and the projection shortcut.
      layers: the normalization's layer factory.
      dropout_rate: dropout between the convs (the paper's WRN-28-10 uses 0.3 on CIFAR).
      residual_gain: scaled-WN gain of ``conv2`` (1/N for N blocks per stage).
    """

    features: int
    strides: int
    layers: NormLayers
    dropout_rate: float = 0.0
    residual_gain: float = 1.0

    @nn.compact
    def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
        layers = self.layers
        o = layers.norm_act(x, train=train, name="norm1")
        y = layers.conv(o, self.features, 3, strides=self.strides, train=train, name="conv1",
                        act=False, normalize=False)
        y = layers.norm_act(y, train=train, name="norm2")
        y = nn.Dropout(self.dropout_rate, deterministic=not train)(y)
        y = layers.conv(y, self.features, 3, train=train, name="conv2", act=False,
                        normalize=False, gain=self.residual_gain)
        if self.strides != 1 or x.shape[-1] != self.features:
            x = layers.conv(o, self.features, 1, strides=self.strides, train=train,
                            name="shortcut", act=False, normalize=False, gain=1.0)
        return layers.residual(x, y)  # y + x, or mp_sum(x, y, t=0.3) for norm='mp'


class WideResNet(nn.Module):
    """WRN-``depth``-``widen_factor`` for CIFAR: 3x3 stem (16 channels), three stages of
    ``(depth - 4) / 6`` wide blocks with ``16k, 32k, 64k`` channels, norm + ReLU, global average
    pooling, classifier. WRN-28-10 has 36.5M parameters (Zagoruyko & Komodakis 2016, Table 4).

    Attributes:
      num_classes: output units.
      layers: the normalization's layer factory.
      depth: ``6 n + 4``.
      widen_factor: ``k``.
      dropout_rate: dropout inside each block (needs a ``"dropout"`` rng when > 0 and training).
      final_bn: add a BatchNorm after the classifier.
    """

    num_classes: int
    layers: NormLayers
    depth: int = 28
    widen_factor: int = 10
    dropout_rate: float = 0.0
    final_bn: bool = False

    def __post_init__(self) -> None:  # checked where the model is made, not at its first init
        if not is_int(self.depth) or self.depth < 10 or (self.depth - 4) % 6:
            raise ValueError(f"depth must be 6 n + 4 with n >= 1, got {self.depth!r}")
        if not (is_real(self.dropout_rate) and 0.0 <= self.dropout_rate < 1.0):
            raise ValueError(f"dropout_rate must be a number in [0, 1), got {self.dropout_rate!r}")
        super().__post_init__()

    @nn.compact
    def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
        layers = self.layers
        blocks = (self.depth - 4) // 6
        x = layers.conv(x, 16, 3, train=train, name="stem", act=False, normalize=False)
        for stage, width in enumerate(16 * self.widen_factor * m for m in (1, 2, 4)):
            for block in range(blocks):
                strides = 2 if stage > 0 and block == 0 else 1
                x = WideBlock(width, strides, layers, self.dropout_rate, 1.0 / blocks,
                              name=f"stage{stage}_block{block}")(x, train=train)
        x = layers.norm_act(x, train=train, name="final_norm")
        x = jnp.mean(x, axis=(1, 2))
        return layers.head(x, self.num_classes, train=train, final_bn=self.final_bn)
