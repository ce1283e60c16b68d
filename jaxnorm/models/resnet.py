"""ResNets with basic blocks: ResNet-18 (ImageNet or CIFAR stem, type B or C shortcuts), ResNet-56."""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxnorm.models.norms import NormLayers, check_choice

SHORTCUTS = ("A", "B", "C")
STEMS = ("cifar", "imagenet")


def zero_pad_shortcut(x: jax.Array, features: int, strides: int) -> jax.Array:
    """He et al. (2016) option A: subsample spatially, append zero channels up to ``features``."""
    x = x[:, ::strides, ::strides, :]
    extra = features - x.shape[-1]
    return jnp.pad(x, ((0, 0), (0, 0), (0, 0), (0, extra))) if extra else x


class BasicBlock(nn.Module):
    """Two 3x3 convs with a shortcut: ``relu(norm(conv2(relu(norm(conv1(x))))) + shortcut(x))``; for
    ``norm="mp"`` EDM2's magnitude-preserving block (Karras et al. 2024, Sec. 3.3),
    ``mp_sum(shortcut(x), conv2(mp_silu(conv1(mp_silu(x)))), t=0.3)``, with no activation after the join.

    Shortcuts (He et al. 2016, Sec. 4.1 "options" A/B/C): ``"A"`` identity, zero-padded
    when the shape changes (no parameters); ``"B"`` identity, a 1x1 conv + norm when the shape
    changes; ``"C"`` a 1x1 conv + norm on every block. Type C is the architecture ENorm can
    balance (Stock et al. 2019, Sec. 4.3: "all shortcuts are learned 1x1 convolutions").

    Attributes:
      features: output channels.
      strides: stride of ``conv1`` and of the shortcut.
      shortcut: ``"A"``, ``"B"`` or ``"C"``.
      layers: the normalization's layer factory.
      residual_gain: scaled-WN gain of ``conv2`` (Arpit et al. 2019: 1/N for N blocks per stage).
    """

    features: int
    strides: int
    shortcut: str
    layers: NormLayers
    residual_gain: float = 1.0

    @nn.compact
    def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
        layers, features, strides = self.layers, self.features, self.strides
        # norm='mp': EDM2's block (Sec. 3.3), the branch starts with MP-SiLU and the stream stays linear;
        # an activation after each join gives the stream a growing mean (x1e5 over ResNet-56)
        magnitude_preserving = layers.norm == "mp"
        branch_in = layers.activation(x) if magnitude_preserving else x
        y = layers.conv(branch_in, features, 3, strides=strides, train=train, name="conv1")
        y = layers.conv(y, features, 3, train=train, name="conv2", act=False,
                        gain=self.residual_gain)
        reshaped = strides != 1 or x.shape[-1] != features
        if self.shortcut == "C" or (self.shortcut == "B" and reshaped):
            x = layers.conv(x, features, 1, strides=strides, train=train, name="shortcut",
                            act=False, gain=1.0)
        elif reshaped:
            x = zero_pad_shortcut(x, features, strides)
        joined = layers.residual(x, y)
        return joined if magnitude_preserving else layers.activation(joined)


class ResNet(nn.Module):
    """A ResNet of :class:`BasicBlock` stages, global average pooling and a classifier.

    Stems: ``"imagenet"`` = 7x7 conv stride 2 + norm + ReLU + 3x3 max-pool stride 2
    (He et al. 2016, Table 1); ``"cifar"`` = one 3x3 conv stride 1 + norm + ReLU (He et al.
    2016, Sec. 4.2). The first stage keeps the resolution, every later one halves it.

    Attributes:
      num_classes: output units.
      layers: the normalization's layer factory.
      stage_sizes: blocks per stage.
      widths: channels per stage; the stem has ``widths[0]`` channels.
      stem: ``"cifar"`` or ``"imagenet"``.
      shortcut: ``"A"``, ``"B"`` or ``"C"`` (see :class:`BasicBlock`).
      final_bn: add a BatchNorm after the classifier (Stock et al. 2019, Sec. 6.2).
    """

    num_classes: int
    layers: NormLayers
    stage_sizes: Sequence[int]
    widths: Sequence[int]
    stem: str = "cifar"
    shortcut: str = "B"
    final_bn: bool = False

    def __post_init__(self) -> None:  # checked where the model is made, not at its first init
        check_choice(self.stem, STEMS, "stem")
        check_choice(self.shortcut, SHORTCUTS, "shortcut")
        if len(self.stage_sizes) != len(self.widths):
            raise ValueError(
                f"stage_sizes and widths must have the same length, got {self.stage_sizes} "
                f"and {self.widths}")
        super().__post_init__()

    @nn.compact
    def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
        layers = self.layers
        if self.stem == "imagenet":
            x = layers.conv(x, self.widths[0], 7, strides=2, train=train, name="stem")
            x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
        else:
            x = layers.conv(x, self.widths[0], 3, train=train, name="stem")
        for stage, (blocks, width) in enumerate(zip(self.stage_sizes, self.widths, strict=True)):
            for block in range(blocks):
                strides = 2 if stage > 0 and block == 0 else 1
                x = BasicBlock(width, strides, self.shortcut, layers,
                               residual_gain=1.0 / blocks,
                               name=f"stage{stage}_block{block}")(x, train=train)
        x = jnp.mean(x, axis=(1, 2))
        return layers.head(x, self.num_classes, train=train, final_bn=self.final_bn)


def resnet18(*, num_classes: int, layers: NormLayers, stem: str = "cifar",
             shortcut: str = "B", width: int = 64, final_bn: bool = False) -> ResNet:
    """ResNet-18 (He et al. 2016, Table 1): stages of 2 blocks, widths ``width * (1, 2, 4, 8)``.

    ``shortcut="C"`` is the ENorm paper's type-C ResNet-18 (Stock et al. 2019, Sec. 4.3, 6.3).
    With ``stem="imagenet"`` and 1000 classes it has 11,689,512 parameters (torchvision's count).
    """
    return ResNet(num_classes=num_classes, layers=layers, stage_sizes=(2, 2, 2, 2),
                  widths=tuple(width * m for m in (1, 2, 4, 8)), stem=stem, shortcut=shortcut,
                  final_bn=final_bn)


def resnet56(*, num_classes: int, layers: NormLayers, shortcut: str = "A", width: int = 16,
             final_bn: bool = False) -> ResNet:
    """ResNet-56 for CIFAR (He et al. 2016, Sec. 4.2, n = 9): 3 stages of 9 blocks, widths
    ``width * (1, 2, 4)``, option-A shortcuts as in the paper (0.85M parameters, Table 6)."""
    return ResNet(num_classes=num_classes, layers=layers, stage_sizes=(9, 9, 9),
                  widths=(width, 2 * width, 4 * width), stem="cifar", shortcut=shortcut,
                  final_bn=final_bn)
