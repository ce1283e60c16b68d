"""Models by name: ``jaxnorm.models.create(name, num_classes=..., norm=...)``.

Every model is a ``flax.linen`` module called as ``model.apply(variables, x, train=bool)``
on NHWC float inputs, returning float32 logits; the normalization is chosen by name from
:data:`NORMS` (see :mod:`jaxnorm.models.norms`).
"""

from jaxnorm.models.cifar_nv import CifarNV
from jaxnorm.models.mlp import MLP
from jaxnorm.models.norms import NORMS, NormLayers, norm_layers
from jaxnorm.models.registry import NORM_OPTIONS, create, describe, model_options, names
from jaxnorm.models.resnet import BasicBlock, ResNet, resnet18, resnet56
from jaxnorm.models.vgg import VGG
from jaxnorm.models.wrn import WideBlock, WideResNet

__all__ = [
    "MLP",
    "NORMS",
    "NORM_OPTIONS",
    "VGG",
    "BasicBlock",
    "CifarNV",
    "NormLayers",
    "ResNet",
    "WideBlock",
    "WideResNet",
    "create",
    "describe",
    "model_options",
    "names",
    "norm_layers",
    "resnet18",
    "resnet56",
]
