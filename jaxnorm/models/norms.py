"""The factory that maps a normalization name to the layers a model is built from.

Every model in :mod:`jaxnorm.models` is written once against :class:`NormLayers`; the
normalization is chosen by name (:data:`NORMS`) when the model is created. A model asks
its ``NormLayers`` for "a conv (or dense) unit followed, if the method has one, by its
normalization and, if asked, a ReLU"; the factory decides which weight parametrization,
which activation normalization and whether the linear layer keeps a bias.

=============  =========================================  ==================================
name           weight layer                               after it
=============  =========================================  ==================================
``none``       plain ``Conv`` / ``Dense`` with bias       nothing (the ENorm setting)
``bn``         plain, no bias                             ``BatchNorm`` (L2)
``l1bn``       plain, no bias                             ``BatchNorm(p=1)``
``linfbn``     plain, no bias                             ``BatchNorm(p="inf")``
``topk``       plain, no bias                             ``BatchNorm(p="inf", topk=k)``
``ghostbn``    plain, no bias                             ``BatchNorm(virtual_batch_size=v)``
``gn``         plain, no bias                             ``GroupNorm``
``ln``         plain, no bias                             ``LayerNorm`` over all non-batch axes
``wn``         ``WeightNorm*`` with bias                  nothing
``swn``        ``ScaledWeightNorm*(gain)`` with bias      nothing
``bwn``        ``BoundedWeightNorm*``, no bias            mean-only ``BatchNorm``
``ws``         ``WSConv`` (dense layers plain), no bias   ``GroupNorm``
``normprop``   ``NormProp*`` (normalizes itself)          its own ReLU moment correction
``mp``         ``MPDense`` / ``MPConv`` (gain 1), no bias  nothing; MP-SiLU in place of ReLU
=============  =========================================  ==================================

The classifier ("head") is a plain ``Dense`` with bias for every activation normalization;
for ``wn`` / ``swn`` / ``bwn`` it uses the same weight parametrization (scaled weight norm
with gain 1, a linear layer). ``mp`` (EDM2's magnitude-preserving layers: forced weight
normalization in the forward pass, ``silu(x) / 0.596``) keeps the plain ``Dense`` head, so the
logits' scale is learned. ``final_bn`` adds the ENorm paper's BatchNorm after it.

References:
  Ioffe & Szegedy (2015), batch normalization. Hoffer et al., *Norm matters* (NeurIPS 2018),
  Sec. 3 (L1 / L-inf BN), Sec. 5 and suppl. (bounded weight norm + mean-only BN).
  Salimans & Kingma (2016), weight normalization. Arpit, Campos & Bengio (2019), scaled weight
  norm: gain 2 before ReLU, 1 for linear layers, 1/N for the last layer of a residual branch.
  Wu & He (2018), group norm. Ba et al. (2016), layer norm. Qiao et al. (2019), weight
  standardization + GN. Arpit et al. (2016), normalization propagation.
  Stock et al., *Equi-normalization* (ICLR 2019), Sec. 6.2: one BN after the classifier.
  Karras et al., *Analyzing and improving the training dynamics of diffusion models* (EDM2,
  CVPR 2024), Sec. 3.2-3.3: magnitude-preserving layers and MP-SiLU.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxnorm import nn as jnn
from jaxnorm.functional.checks import is_real
from jaxnorm.nn.weight import mp_kernel_init

Array = jax.Array
Initializer = Callable[..., Array]

NORMS: tuple[str, ...] = (
    "none", "bn", "l1bn", "linfbn", "topk", "ghostbn", "gn", "ln",
    "wn", "swn", "bwn", "ws", "normprop", "mp",
)
"""Every normalization name a model accepts."""

_BATCH_NORMS = {
    "bn": {},
    "l1bn": {"p": 1},
    "linfbn": {"p": "inf"},
    "topk": {"p": "inf"},
    "ghostbn": {},
}
_WEIGHT_NORMS = ("wn", "swn", "bwn")

KERNEL_INITS: dict[str, Initializer] = {
    # He et al. (2015a), "Delving deep into rectifiers", Sec. 2.2: N(0, 2 / fan_in).
    "kaiming": nn.initializers.variance_scaling(2.0, "fan_in", "normal"),
    # Glorot & Bengio (2010), Eq. 16: U(-a, a) with a = sqrt(6 / (fan_in + fan_out)).
    "xavier": nn.initializers.xavier_uniform(),
}


def check_choice(value: Any, choices: Any, argument: str) -> None:
    """Raise ``ValueError`` naming ``argument`` and the valid ``choices`` unless ``value`` is one."""
    try:
        known = value in choices
    except TypeError:  # an unhashable value (a list) is no choice
        known = False
    if not known:
        raise ValueError(
            f"{argument} must be one of {sorted(choices)}, got {value!r}")


def check_count(value: Any, argument: str, minimum: int = 1) -> None:
    """Raise ``ValueError`` naming ``argument`` unless ``value`` is an int (a NumPy integer too, not a
    bool: ``True`` would be read as 1) of at least ``minimum``."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer) or value < minimum:
        kind = "a positive int" if minimum == 1 else f"an int >= {minimum}"
        raise ValueError(f"{argument} must be {kind}, got {value!r}")


def resolve_kernel_init(kernel_init: str | Initializer) -> Initializer:
    """Map ``"kaiming"`` / ``"xavier"`` to a Flax initializer; pass callables through."""
    if callable(kernel_init):
        return kernel_init
    check_choice(kernel_init, KERNEL_INITS, "kernel_init")
    return KERNEL_INITS[kernel_init]


def groups_for(channels: int, num_groups: int) -> int:
    """The largest divisor of ``channels`` that is at most ``num_groups`` and leaves at least two
    channels per group (one channel per group would zero a Dense layer's output).

    Wu & He (2018) use 32 groups; narrow layers (tiny test widths, 16-channel ResNet-56 stages)
    get the largest group count that fits.
    """
    return max((g for g in range(1, min(num_groups, channels // 2) + 1) if channels % g == 0),
               default=1)


@dataclasses.dataclass(frozen=True)
class NormLayers:
    """Builds a model's layers for one normalization; create with :func:`norm_layers`.

    The methods are called inside a parent module's ``@nn.compact`` ``__call__``: they create
    the parent's submodules under the names given, so a network without normalization
    (``norm="none"``) has the plain params tree ``{name: {"kernel", "bias"}}`` that ENorm's
    chain inference reads.

    Attributes:
      norm: one of :data:`NORMS`.
      kernel_init: initializer of every weight kernel.
      num_groups: groups for ``gn`` and ``ws`` (clipped per layer by :func:`groups_for`).
      topk: k of top-k L-inf BN (Hoffer et al.'s code uses 10).
      calibration: the constant of L-inf / top-k BN (``linfbn``, ``topk``): ``"paper"`` (Hoffer
        et al.'s ``C(n)``) or ``"exact"`` (``1 / E[max of n |N(0,1)|]``).
      g_init: initialization of weight norm's ``g`` (``wn``): ``"norm"`` (``g = ||v||``, the plain
        layer's function), ``"ones"`` (flax's ``g = 1``) or ``"data"`` (Salimans & Kingma, Sec. 3:
        from the batch given to ``init``).
      virtual_batch_size: ghost-BN batch size.
      momentum: running-average momentum of every BatchNorm (Flax convention).
      epsilon: epsilon of every activation normalization.
      axis_name: BatchNorm's cross-device axis name (``pmap`` / ``shard_map``); ``None`` under
        ``jit`` with a sharded global batch.
      dtype: computation dtype (params stay float32; logits are returned in float32).
    """

    norm: str = "bn"
    kernel_init: Initializer = KERNEL_INITS["kaiming"]
    num_groups: int = 32
    topk: int = 10
    calibration: str = "paper"
    g_init: str = "norm"
    virtual_batch_size: int = 32
    momentum: float = 0.9
    epsilon: float = 1e-5
    axis_name: str | None = None
    dtype: Any = None

    @property
    def has_activation_norm(self) -> bool:
        """Whether a normalization layer follows each weight layer."""
        return self.norm in (*_BATCH_NORMS, "gn", "ln", "bwn", "ws")

    def _batch_norm(self, name: str, **extra: Any) -> nn.Module:
        return jnn.BatchNorm(
            momentum=self.momentum, epsilon=self.epsilon, axis_name=self.axis_name,
            dtype=self.dtype, name=name, **extra)

    def _norm_module(self, channels: int, ndim: int, name: str) -> nn.Module | None:
        norm = self.norm
        if norm in _BATCH_NORMS:
            extra = dict(_BATCH_NORMS[norm])
            if norm == "topk":
                extra["topk"] = self.topk
            if norm in ("linfbn", "topk"):
                extra["calibration"] = self.calibration
            if norm == "ghostbn":
                extra["virtual_batch_size"] = self.virtual_batch_size
            return self._batch_norm(name, **extra)
        if norm == "bwn":
            return self._batch_norm(name, mean_only=True, use_scale=False)
        if norm in ("gn", "ws"):
            return jnn.GroupNorm(
                num_groups=groups_for(channels, self.num_groups), epsilon=self.epsilon,
                dtype=self.dtype, name=name)
        if norm == "ln":
            return jnn.LayerNorm(
                epsilon=self.epsilon, reduction_axes=tuple(range(1 - ndim, 0)),
                feature_axes=-1, dtype=self.dtype, name=name)
        return None

    def activation(self, x: Array) -> Array:
        """ReLU, or MP-SiLU for ``mp`` (EDM2 Sec. 3.3: unit second moment for unit-normal input)."""
        return jnn.mp_silu(x) if self.norm == "mp" else nn.relu(x)

    def residual(self, shortcut: Array, branch: Array) -> Array:
        """``shortcut + branch``, or for ``mp`` EDM2's residual weighting ``mp_sum(shortcut, branch,
        t=0.3)`` (Sec. 3.3, Eq. 6): two unit-variance signals joined at unit variance, where the plain
        sum grows the residual stream by about sqrt(2) per block (x1e10 over ResNet-56's 27 blocks)."""
        return jnn.mp_sum(shortcut, branch, t=0.3) if self.norm == "mp" else shortcut + branch

    def _apply_norm(self, x: Array, *, train: bool, name: str) -> Array:
        module = self._norm_module(x.shape[-1], x.ndim, name)
        if module is None:
            return x
        if isinstance(module, jnn.BatchNorm):
            return module(x, use_running_average=not train)
        return module(x)

    def norm_act(self, x: Array, *, train: bool, name: str, act: bool = True) -> Array:
        """The activation normalization alone (if the method has one), then ReLU if ``act``.

        Used by pre-activation blocks (WRN). For weight-space methods this is just the ReLU.
        """
        x = self._apply_norm(x, train=train, name=name)
        return self.activation(x) if act else x

    def conv(
        self, x: Array, features: int, kernel_size: int, *, train: bool, name: str,
        strides: int = 1, act: bool = True, gain: float = 2.0, normalize: bool = True,
    ) -> Array:
        """Conv (symmetric zero padding ``kernel_size // 2``), its normalization, then ReLU.

        Args:
          x: NHWC input.
          features: output channels.
          kernel_size: square kernel size.
          train: batch statistics (True) or running averages (False).
          name: the conv's name; its normalization is ``name + "_norm"``.
          strides: square stride.
          act: apply ReLU at the end (NormProp: its ReLU moment correction too).
          gain: scaled-WN gain (2 before ReLU, 1 linear, 1/N ending a residual branch).
          normalize: apply the activation normalization (False in pre-activation blocks,
            which normalize before the conv through :meth:`norm_act`).
        """
        pad = kernel_size // 2
        common = dict(
            features=features, kernel_size=(kernel_size, kernel_size),
            strides=(strides, strides), padding=((pad, pad), (pad, pad)),
            kernel_init=self.kernel_init, dtype=self.dtype, name=name)
        norm = self.norm
        if norm == "normprop":
            return jnn.NormPropConv(activation=act, **common)(x)
        if norm == "ws":
            layer = jnn.WSConv(use_bias=False, **common)
        elif norm == "wn":
            layer = jnn.WeightNormConv(use_bias=True, g_init=self.g_init, **common)
        elif norm == "swn":
            layer = jnn.ScaledWeightNormConv(gain=gain, use_bias=True, **common)
        elif norm == "bwn":
            layer = jnn.BoundedWeightNormConv(use_bias=False, **common)
        elif norm == "mp":  # EDM2's standard-normal v (jnn.weight.mp_kernel_init), whatever kernel_init
            layer = jnn.MPConv(**{**common, "kernel_init": mp_kernel_init})
        else:
            layer = nn.Conv(use_bias=not self.has_activation_norm, **common)
        x = layer(x)
        if normalize:
            x = self._apply_norm(x, train=train, name=name + "_norm")
        return self.activation(x) if act else x

    def dense(
        self, x: Array, features: int, *, train: bool, name: str, act: bool = True,
        gain: float = 2.0,
    ) -> Array:
        """Dense layer, its normalization, then ReLU (arguments as in :meth:`conv`)."""
        common = dict(features=features, kernel_init=self.kernel_init, dtype=self.dtype,
                      name=name)
        norm = self.norm
        if norm == "normprop":
            return jnn.NormPropDense(activation=act, **common)(x)
        if norm == "wn":
            layer = jnn.WeightNormDense(use_bias=True, g_init=self.g_init, **common)
        elif norm == "swn":
            layer = jnn.ScaledWeightNormDense(gain=gain, use_bias=True, **common)
        elif norm == "bwn":
            layer = jnn.BoundedWeightNormDense(use_bias=False, **common)
        elif norm == "mp":
            layer = jnn.MPDense(**{**common, "kernel_init": mp_kernel_init})
        else:
            layer = nn.Dense(use_bias=not self.has_activation_norm, **common)
        x = self._apply_norm(layer(x), train=train, name=name + "_norm")
        return self.activation(x) if act else x

    def head(self, x: Array, num_classes: int, *, train: bool, final_bn: bool,
             name: str = "head") -> Array:
        """The classifier: logits ``(batch, num_classes)`` in float32.

        Weight-normed families parametrize it like their other layers (scaled WN with gain 1:
        a linear layer); everything else uses a plain ``Dense`` with bias. ``final_bn`` adds a
        standard BatchNorm after it (Stock et al. 2019, Sec. 6.2: "a BatchNorm layer at the end
        of the network after the FC layer").
        """
        common = dict(features=num_classes, kernel_init=self.kernel_init, dtype=self.dtype,
                      name=name)
        if self.norm == "wn":
            layer = jnn.WeightNormDense(g_init=self.g_init, **common)
        elif self.norm == "swn":
            layer = jnn.ScaledWeightNormDense(gain=1.0, **common)
        elif self.norm == "bwn":
            layer = jnn.BoundedWeightNormDense(**common)
        else:
            layer = nn.Dense(**common)
        x = layer(x)
        if final_bn:
            x = jnn.BatchNorm(
                momentum=self.momentum, epsilon=self.epsilon, axis_name=self.axis_name,
                dtype=self.dtype, name="final_bn")(x, use_running_average=not train)
        return x.astype(jnp.float32)


def norm_layers(
    norm: str = "bn", *, kernel_init: str | Initializer = "kaiming", num_groups: int = 32,
    topk: int = 10, calibration: str = "paper", g_init: str = "norm",
    virtual_batch_size: int = 32, bn_momentum: float = 0.9,
    epsilon: float = 1e-5, axis_name: str | None = None, dtype: Any = None,
) -> NormLayers:
    """Validate the options and return the :class:`NormLayers` for ``norm``.

    Args:
      norm: one of :data:`NORMS`.
      kernel_init: ``"kaiming"`` (He et al. 2015a), ``"xavier"`` (Glorot & Bengio 2010) or an
        initializer.
      num_groups: GroupNorm groups (``gn``, ``ws``); Wu & He use 32.
      topk: k for ``topk`` (Hoffer et al.'s code: 10).
      calibration: ``"paper"`` or ``"exact"``: the constant of ``linfbn`` / ``topk`` (Hoffer et
        al., Sec. 3 and suppl. Sec. 2; see :class:`jaxnorm.nn.BatchNorm`).
      g_init: ``"norm"``, ``"ones"`` or ``"data"``: the init of ``wn``'s ``g`` (Salimans &
        Kingma 2016, Sec. 3; see :class:`jaxnorm.nn.WeightNormDense`). ``"data"`` sets ``g`` and
        the bias from the batch passed to ``model.init``, so pass a real batch there.
      virtual_batch_size: ghost-BN batch size (``ghostbn``).
      bn_momentum: BatchNorm running-average momentum (Flax convention, 0.9 = PyTorch's 0.1).
      epsilon: epsilon of the activation normalizations.
      axis_name: BatchNorm cross-device axis name (``pmap``); ``None`` under ``jit``.
      dtype: computation dtype, e.g. ``jnp.bfloat16``.

    Raises:
      ValueError: unknown ``norm``, ``kernel_init``, ``calibration`` or ``g_init``, or a
        non-positive count.
    """
    check_choice(norm, NORMS, "norm")
    check_choice(calibration, ("paper", "exact"), "calibration")
    check_choice(g_init, ("norm", "ones", "data"), "g_init")
    for argument, value in (("num_groups", num_groups), ("topk", topk),
                            ("virtual_batch_size", virtual_batch_size)):
        check_count(value, argument)
    if not (is_real(bn_momentum) and 0.0 <= bn_momentum < 1.0):
        raise ValueError(f"bn_momentum must be a number in [0, 1), got {bn_momentum!r}")
    if not (is_real(epsilon) and epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    return NormLayers(
        norm=norm, kernel_init=resolve_kernel_init(kernel_init), num_groups=num_groups,
        topk=topk, calibration=calibration, g_init=g_init,
        virtual_batch_size=virtual_batch_size, momentum=bn_momentum, epsilon=epsilon,
        axis_name=axis_name, dtype=dtype)
