"""Models by name: :func:`create` and :func:`names`."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import numpy as np

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


def _check_options(builder: Callable[..., nn.Module], model_kwargs: dict[str, Any]) -> None:
    """Each model option against the type of its default, naming it: an int default (``depth``,
    ``width``, ``widen_factor``) takes an int, ``depth`` at least 0 (an MLP of depth 0 is a linear
    classifier), the others at least 1; a bool default (``final_bn``, ``norm_every_conv``) a bool (the
    string ``"no"`` was read as True); ``width_multiplier`` a finite number > 0 (``True`` was read as
    1.0); ``widths`` as many positive ints as its default."""
    for parameter in inspect.signature(builder).parameters.values():
        name, default = parameter.name, parameter.default
        if name not in model_kwargs:
            continue
        value = model_kwargs[name]
        if isinstance(default, bool):
            if not isinstance(value, bool | np.bool_):
                raise ValueError(f"{name} must be a bool, got {value!r}")
        elif isinstance(default, int):
            check_count(value, name, 0 if name == "depth" else 1)
        elif name == "width_multiplier":
            real = isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool)
            if not real or not math.isfinite(value) or value <= 0:
                raise ValueError(f"width_multiplier must be a finite number > 0, got {value!r}")
        elif name == "widths":
            if not isinstance(value, tuple | list) or len(value) != len(default):
                raise ValueError(f"widths must be {len(default)} positive ints, got {value!r}")
            for width in value:
                check_count(width, "widths", 1)


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
    _check_options(entry.builder, model_kwargs)
    return entry.builder(num_classes=num_classes, layers=layers, **model_kwargs)
