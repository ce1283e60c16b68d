"""Models by name: :func:`create` and :func:`names`."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn

from jaxnorm.models.cifar_nv import CifarNV
from jaxnorm.models.mlp import MLP
from jaxnorm.models.norms import check_choice, check_count, norm_layers
from jaxnorm.models.resnet import resnet18, resnet56
from jaxnorm.models.vgg import CONFIGS, VGG
from jaxnorm.models.wrn import WideResNet

NORM_OPTIONS: tuple[str, ...] = tuple(
    name for name in inspect.signature(norm_layers).parameters if name != "norm")
"""Keyword arguments of :func:`create` that configure the normalization layers."""


class ModelEntry(NamedTuple):
    """A registered model: its builder, default keyword arguments and a one-line description."""

    builder: Callable[..., nn.Module]
    defaults: dict[str, Any]
    description: str


_REGISTRY: dict[str, ModelEntry] = {
    "mlp": ModelEntry(
        MLP, {"kernel_init": "xavier"},
        "fully connected ReLU net, `depth` hidden layers of `width` units (ENorm Sec. 6.1)"),
    "cifar_nv": ModelEntry(
        CifarNV, {"kernel_init": "xavier"},
        "Gitman & Ginsburg's fully convolutional CIFAR net on 28x28 crops (ENorm Sec. 6.2)"),
    "vgg11": ModelEntry(
        functools.partial(VGG, config=CONFIGS["vgg11"]), {},
        "VGG-11 (config A) with a norm after every conv, GAP + one classifier"),
    "vgg16": ModelEntry(
        functools.partial(VGG, config=CONFIGS["vgg16"]), {},
        "VGG-16 (config D) with a norm after every conv, GAP + one classifier"),
    "resnet18": ModelEntry(
        resnet18, {},
        "ResNet-18, shortcut 'B' or 'C' (ENorm type C), stem 'cifar' or 'imagenet'"),
    "resnet56": ModelEntry(
        resnet56, {}, "ResNet-56 for CIFAR (He et al. 2016, option-A shortcuts)"),
    "wrn28_10": ModelEntry(
        WideResNet, {},
        "Wide ResNet 28-10, pre-activation blocks (`depth`, `widen_factor` adjustable)"),
}
"""Every model, by name."""


def names() -> tuple[str, ...]:
    """The registered model names, sorted."""
    return tuple(sorted(_REGISTRY))


def describe(name: str) -> str:
    """One line describing model ``name``."""
    check_choice(name, _REGISTRY, "name")
    return _REGISTRY[name].description


def model_options(name: str) -> tuple[str, ...]:
    """The model-specific keyword arguments :func:`create` accepts for ``name``."""
    check_choice(name, _REGISTRY, "name")
    signature = inspect.signature(_REGISTRY[name].builder)
    skip = {"num_classes", "layers", "config", "parent", "name"}
    return tuple(p for p in signature.parameters if p not in skip)


def _check_counts(builder: Callable[..., nn.Module], model_kwargs: dict[str, Any]) -> None:
    """The model options whose default is an int (``depth``, ``width``, ``widen_factor``) are ints:
    ``depth`` at least 0 (an MLP of depth 0 is a linear classifier), the others at least 1."""
    for parameter in inspect.signature(builder).parameters.values():
        default = parameter.default
        if parameter.name in model_kwargs and isinstance(default, int) and not isinstance(default, bool):
            check_count(model_kwargs[parameter.name], parameter.name, 0 if parameter.name == "depth" else 1)


def create(name: str, *, num_classes: int, norm: str = "bn", **kwargs: Any) -> nn.Module:
    """Build model ``name`` with normalization ``norm``.

    Args:
      name: one of :func:`names`.
      num_classes: output units.
      norm: one of :data:`jaxnorm.models.norms.NORMS`.
      **kwargs: the model's own options (:func:`model_options`, e.g. ``depth``, ``width``,
        ``shortcut``, ``stem``, ``final_bn``) and the normalization options
        (:data:`NORM_OPTIONS`: ``kernel_init``, ``num_groups``, ``topk``, ``calibration``
        (``linfbn`` / ``topk``: ``"paper"`` or ``"exact"``), ``g_init`` (``wn``: ``"norm"``,
        ``"ones"`` or ``"data"``), ``virtual_batch_size``, ``bn_momentum``, ``epsilon``,
        ``axis_name``, ``dtype``).

    Returns:
      A ``flax.linen`` module; call ``model.apply(variables, x, train=..., mutable=[...])``
      with NHWC float ``x`` to get float32 logits ``(batch, num_classes)``.

    Raises:
      ValueError: unknown name, norm or option, listing the valid choices.
    """
    check_choice(name, _REGISTRY, "name")
    check_count(num_classes, "num_classes")
    entry = _REGISTRY[name]
    options = model_options(name)
    kwargs = {**entry.defaults, **kwargs}
    unknown = sorted(set(kwargs) - set(options) - set(NORM_OPTIONS))
    if unknown:
        raise ValueError(
            f"unknown option(s) {unknown} for model {name!r}; valid: "
            f"{sorted(options)} and normalization options {sorted(NORM_OPTIONS)}")
    layers = norm_layers(norm, **{k: v for k, v in kwargs.items() if k in NORM_OPTIONS})
    model_kwargs = {k: v for k, v in kwargs.items() if k in options}
    _check_counts(entry.builder, model_kwargs)
    return entry.builder(num_classes=num_classes, layers=layers, **model_kwargs)
