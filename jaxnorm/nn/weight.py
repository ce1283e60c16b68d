"""flax.linen weight-space normalization layers: weight norm, scaled / bounded weight norm, WS, NormProp.

Every layer stores the raw direction ``params/kernel`` (``v``, flax layout) and computes its effective
kernel ``W(v)`` on each call with :mod:`jaxnorm.functional.weight`; nothing is overwritten in place.
Each reparametrization is a small mixin over one Dense and one Conv base, so
``WeightNormDense``/``WeightNormConv`` etc. share arguments with ``flax.linen.Dense``/``Conv``.

Variables:
  ``params/kernel`` (v), ``params/bias``; ``params/scale`` (g) for weight norm, scaled weight norm and
  NormProp (gamma), ``params/gain`` for ``WSConv``; ``constants/rho`` for bounded weight norm (fixed at
  initialisation, not trained — pass it to ``apply`` with the params, keep it out of the optimizer).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import flax.linen as nn
import jax.numpy as jnp
from flax.linen import initializers
from flax.typing import Dtype, Initializer

from jaxnorm.functional import linear
from jaxnorm.functional.checks import check_bool, check_epsilon, check_param_dtype, is_int
from jaxnorm.functional.magnitude import mp_weight
from jaxnorm.functional.normprop import normprop_relu
from jaxnorm.functional.weight import (
    bounded_weight_norm,
    bounded_weight_norm_rho,
    scaled_weight_norm,
    unit_norm,
    weight_norm,
    weight_norm_data_init,
    weight_standardization,
)

__all__ = [
    "BoundedWeightNormConv",
    "BoundedWeightNormDense",
    "MPConv",
    "MPDense",
    "NormPropConv",
    "NormPropDense",
    "ScaledWeightNormConv",
    "ScaledWeightNormDense",
    "WSConv",
    "WeightNormConv",
    "WeightNormDense",
]

GInit = Literal["norm", "ones", "data"]
default_kernel_init = initializers.lecun_normal()


class _Dense(nn.Module):
    """A Dense layer whose kernel is ``self._reparametrize(v, x)``; arguments as ``flax.linen.Dense``."""

    features: int
    use_bias: bool = True
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    kernel_init: Initializer = default_kernel_init
    bias_init: Initializer = initializers.zeros

    kernel_size = None

    def _linear(self, x, kernel, bias=None):
        return linear.apply_linear(x, kernel, bias, conv=False, dtype=self.dtype)

    @nn.compact
    def __call__(self, x):
        shape = linear.kernel_shape(x.shape[-1], self.features, None)
        v = self.param("kernel", self.kernel_init, shape, check_param_dtype(self.param_dtype))
        kernel, bias = self._reparametrize(v, x)
        return self._activate(self._linear(x, kernel, bias))

    def _bias(self, init_value=None):
        if not check_bool(self.use_bias, "use_bias"):
            return None
        init = self.bias_init if init_value is None else (lambda *_: init_value.astype(self.param_dtype))
        return self.param("bias", init, (self.features,), self.param_dtype)

    def _activate(self, y):
        return y


class _Conv(nn.Module):
    """A Conv layer whose kernel is ``self._reparametrize(v, x)``; arguments as ``flax.linen.Conv``."""

    features: int
    kernel_size: Sequence[int]
    strides: int | Sequence[int] = 1
    padding: linear.Padding = "SAME"
    input_dilation: int | Sequence[int] = 1
    kernel_dilation: int | Sequence[int] = 1
    feature_group_count: int = 1
    use_bias: bool = True
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    kernel_init: Initializer = default_kernel_init
    bias_init: Initializer = initializers.zeros

    def _linear(self, x, kernel, bias=None):
        return linear.apply_linear(
            x,
            kernel,
            bias,
            conv=True,
            strides=self.strides,
            padding=self.padding,
            input_dilation=self.input_dilation,
            kernel_dilation=self.kernel_dilation,
            feature_group_count=self.feature_group_count,
            dtype=self.dtype,
        )

    @nn.compact
    def __call__(self, x):
        if is_int(self.kernel_size):  # flax.linen.Conv's rule: with several batch axes, a 1-D window
            raise TypeError(
                f"kernel_size must be a tuple of ints, one per spatial axis (e.g. (3, 3)), got "
                f"{self.kernel_size!r}, as for flax.linen.Conv"
            )
        kernel_size = linear.canonical_kernel_size(self.kernel_size)
        shape = linear.kernel_shape(x.shape[-1], self.features, kernel_size, self.feature_group_count)
        v = self.param("kernel", self.kernel_init, shape, check_param_dtype(self.param_dtype))
        kernel, bias = self._reparametrize(v, x)
        return self._activate(self._linear(x, kernel, bias))

    _bias = _Dense._bias
    _activate = _Dense._activate


class _WeightNorm(nn.Module):
    """``W = g * v / ||v||`` per output unit (Salimans & Kingma 2016, Eq. 2).

    ``g_init``: 'norm' (default) sets ``g = ||v||`` so the layer computes the same function as its
    plain twin at initialisation; 'ones' is flax's ``g = 1``; 'data' is the data-dependent
    initialisation of Salimans & Kingma (Sec. 3) from the batch given to ``init``: with
    ``t = x * (v / ||v||)``, ``g = 1 / sqrt(var(t) + data_init_epsilon)`` and ``b = -mean(t) * g``
    (:func:`jaxnorm.functional.weight_norm_data_init`), so that pre-activations start with zero mean and
    unit variance per unit; with ``use_bias=False`` only ``g`` is set: unit variance, the mean kept.
    """

    g_init: GInit = "norm"
    epsilon: float = 1e-12
    data_init_epsilon: float = 1e-5

    def _reparametrize(self, v, x):
        if self.g_init not in ("norm", "ones", "data"):
            raise ValueError(f"g_init must be 'norm', 'ones' or 'data', got {self.g_init!r}")
        check_epsilon(self.epsilon)
        check_epsilon(self.data_init_epsilon, "data_init_epsilon")
        init_bias = None
        if self.g_init == "norm":
            init_g = lambda *_: unit_norm(v, epsilon=self.epsilon)
        elif self.g_init == "ones":
            init_g = lambda *_: jnp.ones((v.shape[-1],), jnp.float32)
        elif self.is_initializing() or not self.has_variable("params", "scale"):
            # the scale is created now: by init, or by apply(..., mutable=True) on empty variables
            # (that path used to fall back on flax's ones without a word)
            direction = weight_norm(v, 1.0, epsilon=self.epsilon)
            g, init_bias = weight_norm_data_init(self._linear(x, direction), epsilon=self.data_init_epsilon)
            init_g = lambda *_: g
        else:
            init_g = initializers.ones
        g = self.param(
            "scale",
            lambda key, shape, dtype: jnp.asarray(init_g(key, shape), dtype),
            (v.shape[-1],),
            self.param_dtype,
        )
        return weight_norm(v, g, epsilon=self.epsilon), self._bias(init_bias)


class _ScaledWeightNorm(nn.Module):
    """``W = g * sqrt(gain * fan_in / fan_out) * v / ||v||``, ``g`` initialised to 1 (Arpit et al. 2019).

    ``gain``: 2 before a ReLU, 1 for a linear layer, ``1 / N`` for the last layer of each of the N
    residual branches of a stage.
    """

    gain: float = 2.0
    epsilon: float = 1e-12
    scale_init: Initializer = initializers.ones

    def _reparametrize(self, v, x):
        g = self.param("scale", self.scale_init, (v.shape[-1],), self.param_dtype)
        groups = getattr(self, "feature_group_count", 1)
        w = scaled_weight_norm(v, g, gain=self.gain, epsilon=self.epsilon, feature_group_count=groups)
        return w, self._bias()


class _BoundedWeightNorm(nn.Module):
    """``W = rho * v / ||v||`` with ``rho`` fixed at initialisation (Hoffer et al. 2018, Sec. 4).

    ``rho`` is the initial norm of each unit (``per_unit=True``) or their mean per layer (the paper's
    scalar); it lives in the ``constants`` collection, so no optimizer changes it.
    """

    per_unit: bool = True
    epsilon: float = 1e-12

    def _reparametrize(self, v, x):
        def init_rho():
            per_unit = check_bool(self.per_unit, "per_unit")
            return bounded_weight_norm_rho(v, per_unit=per_unit, layer=type(self).__name__)

        rho = self.variable("constants", "rho", init_rho)
        return bounded_weight_norm(v, rho.value, epsilon=self.epsilon), self._bias()


class _WeightStandardization(nn.Module):
    """Scaled weight standardization (Brock et al. 2021, Eq. 2) with a learned per-unit gain."""

    use_gain: bool = True
    epsilon: float = 1e-5
    gain_init: Initializer = initializers.ones

    def _reparametrize(self, v, x):
        use_gain = check_bool(self.use_gain, "use_gain")
        gain = self.param("gain", self.gain_init, (v.shape[-1],), self.param_dtype) if use_gain else None
        return weight_standardization(v, gain=gain, epsilon=self.epsilon), self._bias()


class _NormProp(nn.Module):
    """Normalization propagation (Arpit et al. 2016, Sec. 3): ``u = gamma * W x / ||W|| + beta``, then
    with ``activation=True`` the normalized ReLU ``(relu(u) - 1/sqrt(2 pi)) / sqrt((1 - 1/pi) / 2)``."""

    activation: bool = True
    epsilon: float = 1e-12
    scale_init: Initializer = initializers.ones

    def _reparametrize(self, v, x):
        check_bool(self.activation, "activation")  # "no" would switch the normalized ReLU on
        gamma = self.param("scale", self.scale_init, (v.shape[-1],), self.param_dtype)
        return weight_norm(v, gamma, epsilon=self.epsilon), self._bias()

    def _activate(self, y):
        return normprop_relu(y) if self.activation else y


class WeightNormDense(_WeightNorm, _Dense):
    __doc__ = "Dense layer with weight normalization. " + _WeightNorm.__doc__


class WeightNormConv(_WeightNorm, _Conv):
    __doc__ = "Conv layer with weight normalization. " + _WeightNorm.__doc__


class ScaledWeightNormDense(_ScaledWeightNorm, _Dense):
    __doc__ = "Dense layer with scaled weight normalization. " + _ScaledWeightNorm.__doc__


class ScaledWeightNormConv(_ScaledWeightNorm, _Conv):
    __doc__ = "Conv layer with scaled weight normalization. " + _ScaledWeightNorm.__doc__


class BoundedWeightNormDense(_BoundedWeightNorm, _Dense):
    __doc__ = "Dense layer with bounded weight normalization. " + _BoundedWeightNorm.__doc__


class BoundedWeightNormConv(_BoundedWeightNorm, _Conv):
    __doc__ = "Conv layer with bounded weight normalization. " + _BoundedWeightNorm.__doc__


class WSConv(_WeightStandardization, _Conv):
    __doc__ = "Conv layer with scaled weight standardization. " + _WeightStandardization.__doc__


class NormPropDense(_NormProp, _Dense):
    __doc__ = "Dense normalization-propagation layer. " + _NormProp.__doc__


class NormPropConv(_NormProp, _Conv):
    __doc__ = "Conv normalization-propagation layer. " + _NormProp.__doc__


class _MagnitudePreserving(nn.Module):
    """Magnitude-preserving layer with forced weight normalization (Karras et al. 2024, EDM2, Sec. 3.2):
    ``W = gain * v / ||v||`` per output unit (:func:`jaxnorm.functional.magnitude.mp_weight`, ``eps``
    1e-4 on the per-element RMS), so unit-variance inputs give outputs of variance ``gain^2``. No bias
    by default and ``v`` initialised standard normal (``mp_kernel_init``), as in EDM2. The *forced*
    part, writing ``sqrt(fan_in) v / ||v||`` back into the stored
    weights before every step, is an optimizer transform (``jaxnorm.optim``), not the layer's."""

    gain: float = 1.0
    epsilon: float = 1e-4

    def _reparametrize(self, v, x):
        return mp_weight(v, self.gain, epsilon=self.epsilon), self._bias()


mp_kernel_init = initializers.normal(1.0)
"""EDM2's ``torch.randn`` init of the stored ``v`` (per-element RMS 1), under which its ``eps = 1e-4`` on
the per-element RMS is negligible. With flax's ``lecun_normal`` (RMS ``1 / sqrt(fan_in)``) the ``eps``
shrank every kernel by ``eps sqrt(fan_in)`` (0.7 % at fan-in 4608), 19 % over 30 layers."""


class MPDense(_MagnitudePreserving, _Dense):
    __doc__ = "Dense layer. " + _MagnitudePreserving.__doc__
    use_bias: bool = False
    kernel_init: Initializer = mp_kernel_init


class MPConv(_MagnitudePreserving, _Conv):
    __doc__ = "Conv layer. " + _MagnitudePreserving.__doc__
    use_bias: bool = False
    kernel_init: Initializer = mp_kernel_init
