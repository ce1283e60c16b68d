"""flax.nnx weight-space normalization layers: weight norm, scaled / bounded weight norm, WS, NormProp.

NNX twins of :mod:`jaxnorm.nn.weight`, with ``flax.nnx.Linear`` / ``flax.nnx.Conv``'s constructors
(``in_features``, ``out_features``, ``kernel_size``, ..., ``rngs``). Every layer stores the raw direction
``kernel`` (``v``, flax layout) and computes its effective kernel ``W(v)`` with
:mod:`jaxnorm.functional.weight` on each call: unlike ``nnx.WeightNorm`` (flax#5576/#5577) nothing is
overwritten in place and the gains are trainable :class:`flax.nnx.Param`\\ s.

Attributes: ``kernel`` (v) and ``bias`` (``nnx.Param``); ``scale`` (g, ``nnx.Param``) for weight norm,
scaled weight norm and NormProp (gamma); ``gain`` for :class:`WSConv`; ``rho`` (:class:`Constant`, not a
``Param``, so ``nnx.Optimizer(..., wrt=nnx.Param)`` leaves it alone) for bounded weight norm.
Kernel and bias keys are drawn from ``rngs`` as ``nnx.Linear`` / ``nnx.Conv`` draw them, so with the same
seed the direction ``v`` equals their kernel.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
from flax import nnx
from flax.typing import Dtype, Initializer

from jaxnorm.functional import linear
from jaxnorm.functional.checks import (
    check_bool,
    check_compute_dtype,
    check_epsilon,
    check_param_dtype,
    check_positive_int,
    check_positive_values,
)
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
from jaxnorm.nnx._variables import NO_METADATA, optional_param, value_or_none

__all__ = [
    "BoundedWeightNormConv",
    "BoundedWeightNormDense",
    "Constant",
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

GInit = Literal["norm", "ones"]
default_kernel_init = nnx.initializers.lecun_normal()
mp_kernel_init = nnx.initializers.normal(1.0)  # EDM2's torch.randn: jaxnorm.nn.weight.mp_kernel_init
default_bias_init = nnx.initializers.zeros
Metadata = Mapping[str, Any]


class Constant(nnx.Variable):
    """A non-trainable constant fixed at initialisation (bounded weight norm's ``rho``)."""


class _Dense(nnx.Module):
    """``y = x @ W(v) + b`` with ``v`` shaped ``(in, out)``; constructor part as ``flax.nnx.Linear``."""

    def _init_dense(self, in_features, out_features, *, use_bias, dtype, param_dtype, kernel_init, bias_init,
                    rngs, kernel_metadata, bias_metadata):
        check_positive_int(out_features, "out_features")
        shape = linear.kernel_shape(in_features, out_features, None)
        use_bias, param_dtype = check_bool(use_bias, "use_bias"), check_param_dtype(param_dtype)
        self.kernel = nnx.Param(kernel_init(rngs.params(), shape, param_dtype), **kernel_metadata)
        self.bias = optional_param(use_bias, bias_init, (out_features,), param_dtype, rngs, bias_metadata)
        self.in_features = in_features
        self.out_features = out_features
        self.use_bias = use_bias
        check_compute_dtype(dtype)  # at construction, where flax.nnx raises at the first call
        self.dtype = dtype
        self.param_dtype = param_dtype

    def _check_input(self, x):
        if x.shape[-1] != self.in_features:
            raise ValueError(
                f"x must have in_features={self.in_features} on its last axis, got x.shape={x.shape}"
            )

    def _linear(self, x, kernel, bias=None):
        self._check_input(x)
        return linear.apply_linear(x, kernel, bias, conv=False, dtype=self.dtype)

    def __call__(self, x):
        """The layer's output on ``x`` with the effective kernel computed from ``v`` now."""
        return self._activate(self._linear(x, self._effective_kernel(), value_or_none(self.bias)))

    def _activate(self, y):
        return y


class _Conv(_Dense):
    """Channels-last convolution with kernel ``W(v)``, ``v`` HWIO; constructor part as ``flax.nnx.Conv``."""

    def _init_conv(self, in_features, out_features, kernel_size, strides, *, padding, input_dilation,
                   kernel_dilation, feature_group_count, use_bias, dtype, param_dtype, kernel_init, bias_init,
                   rngs, kernel_metadata, bias_metadata):
        kernel_size = linear.canonical_kernel_size(kernel_size)
        check_positive_int(out_features, "out_features")
        # checked here, where flax.nnx.Conv raises (or not) at the first call
        for value, name in ((strides, "strides"), (input_dilation, "input_dilation"),
                            (kernel_dilation, "kernel_dilation")):
            linear.canonical_window(value, len(kernel_size), name)
        linear.canonical_padding(padding, len(kernel_size))
        shape = linear.kernel_shape(in_features, out_features, kernel_size, feature_group_count)
        use_bias, param_dtype = check_bool(use_bias, "use_bias"), check_param_dtype(param_dtype)
        self.kernel = nnx.Param(kernel_init(rngs.params(), shape, param_dtype), **kernel_metadata)
        self.bias = optional_param(use_bias, bias_init, (out_features,), param_dtype, rngs, bias_metadata)
        self.in_features = in_features
        self.out_features = out_features
        self.kernel_size = kernel_size
        self.strides = strides
        self.padding = padding
        self.input_dilation = input_dilation
        self.kernel_dilation = kernel_dilation
        self.feature_group_count = feature_group_count
        self.use_bias = use_bias
        check_compute_dtype(dtype)  # at construction, where flax.nnx raises at the first call
        self.dtype = dtype
        self.param_dtype = param_dtype

    def _linear(self, x, kernel, bias=None):
        """The convolution; like ``nnx.Conv``, ``x`` may have no batch axis or several
        (:func:`~jaxnorm.functional.linear.apply_linear`)."""
        rank = len(self.kernel_size)
        if x.ndim < rank + 1:
            raise ValueError(
                f"x must be ([*batch], *spatial, features) with {rank} spatial axes for "
                f"kernel_size={self.kernel_size}, got x.shape={x.shape}"
            )
        self._check_input(x)
        return linear.apply_linear(
            x, kernel, bias, conv=True, strides=self.strides, padding=self.padding,
            input_dilation=self.input_dilation, kernel_dilation=self.kernel_dilation,
            feature_group_count=self.feature_group_count, dtype=self.dtype,
        )


class _WeightNorm:
    """``W = g * v / ||v||`` per output unit (Salimans & Kingma 2016, Eq. 2), ``g`` a trainable ``scale``.

    ``g_init``: 'norm' (default) sets ``g = ||v||`` so the layer computes the same function as its plain
    twin (``nnx.Linear`` / ``nnx.Conv`` with the same seed) at initialisation; 'ones' is flax's ``g = 1``.
    The data-dependent initialisation of Salimans & Kingma (Sec. 3) is :meth:`data_init`, called on a batch
    after construction (NNX modules are mutable; there is no init pass to hook into).
    """

    def _init_weight_norm(self, g_init, epsilon, data_init_epsilon):
        if g_init == "norm":
            g = unit_norm(self.kernel[...], epsilon=epsilon)
        elif g_init == "ones":
            g = jnp.ones((self.out_features,))
        else:
            hint = " (for the data-dependent init call layer.data_init(x))" if g_init == "data" else ""
            raise ValueError(f"g_init must be 'norm' or 'ones'{hint}, got {g_init!r}")
        self.scale = nnx.Param(jnp.asarray(g, self.param_dtype))
        self.g_init = g_init
        self.epsilon = check_epsilon(epsilon)
        self.data_init_epsilon = check_epsilon(data_init_epsilon, "data_init_epsilon")

    def _effective_kernel(self):
        return weight_norm(self.kernel[...], self.scale[...], epsilon=self.epsilon)

    def data_init(self, x: jax.Array) -> jax.Array:
        """Data-dependent initialisation (Salimans & Kingma 2016, Sec. 3) from the batch ``x``.

        With ``t = x * (v / ||v||)`` per output unit: ``g = 1 / sqrt(var(t) + data_init_epsilon)`` and
        ``b = -mean(t) * g`` (:func:`jaxnorm.functional.weight_norm_data_init`), so that the layer's
        pre-activations on ``x`` have zero mean and unit variance per unit; with ``use_bias=False`` only
        ``g`` is set: unit variance, the mean kept. Sets ``scale`` and ``bias`` in place (``kernel`` is
        untouched) and returns the layer's output on ``x`` with the new values, so a network can be
        initialised layer by layer. Works under ``nnx.jit``.
        """
        direction = weight_norm(self.kernel[...], 1.0, epsilon=self.epsilon)
        g, bias = weight_norm_data_init(self._linear(x, direction), epsilon=self.data_init_epsilon)
        self.scale[...] = g.astype(self.param_dtype)
        if self.bias is not None:
            self.bias[...] = bias.astype(self.param_dtype)
        return self(x)


class _ScaledWeightNorm:
    """``W = g * sqrt(gain * fan_in / fan_out) * v / ||v||``, ``g`` initialised to 1 (Arpit et al. 2019).

    ``gain``: 2 before a ReLU, 1 for a linear layer, ``1 / N`` for the last layer of each of the N
    residual branches of a stage.
    """

    def _init_scaled_weight_norm(self, gain, epsilon, scale_init, rngs):
        self.scale = nnx.Param(scale_init(rngs.params(), (self.out_features,), self.param_dtype))
        check_positive_values(gain, "gain")
        self.gain = gain
        self.epsilon = check_epsilon(epsilon)

    def _effective_kernel(self):
        groups = getattr(self, "feature_group_count", 1)
        return scaled_weight_norm(
            self.kernel[...], self.scale[...], gain=self.gain, epsilon=self.epsilon,
            feature_group_count=groups,
        )


class _BoundedWeightNorm:
    """``W = rho * v / ||v||`` with ``rho`` fixed at initialisation (Hoffer et al. 2018, Sec. 4).

    ``rho`` is the initial norm of each unit (``per_unit=True``) or their mean per layer (the paper's
    scalar), held as a :class:`Constant`, so no optimizer over ``nnx.Param`` changes it.
    """

    def _init_bounded_weight_norm(self, per_unit, epsilon):
        per_unit = check_bool(per_unit, "per_unit")
        rho = bounded_weight_norm_rho(self.kernel[...], per_unit=per_unit, layer=type(self).__name__)
        self.rho = Constant(rho)
        self.per_unit = per_unit
        self.epsilon = check_epsilon(epsilon)

    def _effective_kernel(self):
        return bounded_weight_norm(self.kernel[...], self.rho[...], epsilon=self.epsilon)


class _WeightStandardization:
    """Scaled weight standardization (Brock et al. 2021, Eq. 2) with a learned per-unit ``gain``."""

    def _init_weight_standardization(self, use_gain, epsilon, gain_init, rngs):
        shape, use_gain = (self.out_features,), check_bool(use_gain, "use_gain")
        self.gain = optional_param(use_gain, gain_init, shape, self.param_dtype, rngs, NO_METADATA)
        self.use_gain = use_gain
        self.epsilon = check_epsilon(epsilon)

    def _effective_kernel(self):
        return weight_standardization(self.kernel[...], gain=value_or_none(self.gain), epsilon=self.epsilon)


class _NormProp:
    """Normalization propagation (Arpit et al. 2016, Sec. 3): ``u = gamma * W x / ||W|| + beta``, then
    with ``activation=True`` the normalized ReLU ``(relu(u) - 1/sqrt(2 pi)) / sqrt((1 - 1/pi) / 2)``."""

    def _init_normprop(self, activation, epsilon, scale_init, rngs):
        self.scale = nnx.Param(scale_init(rngs.params(), (self.out_features,), self.param_dtype))
        self.activation = check_bool(activation, "activation")
        self.epsilon = check_epsilon(epsilon)

    def _effective_kernel(self):
        return weight_norm(self.kernel[...], self.scale[...], epsilon=self.epsilon)

    def _activate(self, y):
        return normprop_relu(y) if self.activation else y


Strides = int | Sequence[int]


class WeightNormDense(_WeightNorm, _Dense):
    def __init__(self, in_features: int, out_features: int, *, use_bias: bool = True,
                 dtype: Dtype | None = None, param_dtype: Dtype = jnp.float32,
                 kernel_init: Initializer = default_kernel_init, bias_init: Initializer = default_bias_init,
                 g_init: GInit = "norm", epsilon: float = 1e-12,
                 data_init_epsilon: float = 1e-5, rngs: nnx.Rngs, kernel_metadata: Metadata = NO_METADATA,
                 bias_metadata: Metadata = NO_METADATA):
        self._init_dense(in_features, out_features, use_bias=use_bias, dtype=dtype, param_dtype=param_dtype,
                         kernel_init=kernel_init, bias_init=bias_init, rngs=rngs,
                         kernel_metadata=kernel_metadata, bias_metadata=bias_metadata)
        self._init_weight_norm(g_init, epsilon, data_init_epsilon)

    __doc__ = "Dense layer with weight normalization. " + _WeightNorm.__doc__


class WeightNormConv(_WeightNorm, _Conv):
    def __init__(self, in_features: int, out_features: int, kernel_size: int | Sequence[int],
                 strides: Strides = 1, *, padding: linear.Padding = "SAME", input_dilation: Strides = 1,
                 kernel_dilation: Strides = 1, feature_group_count: int = 1, use_bias: bool = True,
                 dtype: Dtype | None = None, param_dtype: Dtype = jnp.float32,
                 kernel_init: Initializer = default_kernel_init, bias_init: Initializer = default_bias_init,
                 g_init: GInit = "norm", epsilon: float = 1e-12, data_init_epsilon: float = 1e-5,
                 rngs: nnx.Rngs, kernel_metadata: Metadata = NO_METADATA,
                 bias_metadata: Metadata = NO_METADATA):
        self._init_conv(in_features, out_features, kernel_size, strides, padding=padding,
                        input_dilation=input_dilation, kernel_dilation=kernel_dilation,
                        feature_group_count=feature_group_count, use_bias=use_bias, dtype=dtype,
                        param_dtype=param_dtype, kernel_init=kernel_init, bias_init=bias_init, rngs=rngs,
                        kernel_metadata=kernel_metadata, bias_metadata=bias_metadata)
        self._init_weight_norm(g_init, epsilon, data_init_epsilon)

    __doc__ = "Conv layer with weight normalization. " + _WeightNorm.__doc__


class ScaledWeightNormDense(_ScaledWeightNorm, _Dense):
    def __init__(self, in_features: int, out_features: int, *, use_bias: bool = True,
                 dtype: Dtype | None = None, param_dtype: Dtype = jnp.float32,
                 kernel_init: Initializer = default_kernel_init, bias_init: Initializer = default_bias_init,
                 gain: float = 2.0, epsilon: float = 1e-12,
                 scale_init: Initializer = nnx.initializers.ones, rngs: nnx.Rngs,
                 kernel_metadata: Metadata = NO_METADATA, bias_metadata: Metadata = NO_METADATA):
        self._init_dense(in_features, out_features, use_bias=use_bias, dtype=dtype, param_dtype=param_dtype,
                         kernel_init=kernel_init, bias_init=bias_init, rngs=rngs,
                         kernel_metadata=kernel_metadata, bias_metadata=bias_metadata)
        self._init_scaled_weight_norm(gain, epsilon, scale_init, rngs)

    __doc__ = "Dense layer with scaled weight normalization. " + _ScaledWeightNorm.__doc__


class ScaledWeightNormConv(_ScaledWeightNorm, _Conv):
    def __init__(self, in_features: int, out_features: int, kernel_size: int | Sequence[int],
                 strides: Strides = 1, *, padding: linear.Padding = "SAME", input_dilation: Strides = 1,
                 kernel_dilation: Strides = 1, feature_group_count: int = 1, use_bias: bool = True,
                 dtype: Dtype | None = None, param_dtype: Dtype = jnp.float32,
                 kernel_init: Initializer = default_kernel_init, bias_init: Initializer = default_bias_init,
                 gain: float = 2.0, epsilon: float = 1e-12,
                 scale_init: Initializer = nnx.initializers.ones, rngs: nnx.Rngs,
                 kernel_metadata: Metadata = NO_METADATA, bias_metadata: Metadata = NO_METADATA):
        self._init_conv(in_features, out_features, kernel_size, strides, padding=padding,
                        input_dilation=input_dilation, kernel_dilation=kernel_dilation,
                        feature_group_count=feature_group_count, use_bias=use_bias, dtype=dtype,
                        param_dtype=param_dtype, kernel_init=kernel_init, bias_init=bias_init, rngs=rngs,
                        kernel_metadata=kernel_metadata, bias_metadata=bias_metadata)
        self._init_scaled_weight_norm(gain, epsilon, scale_init, rngs)

    __doc__ = "Conv layer with scaled weight normalization. " + _ScaledWeightNorm.__doc__


class BoundedWeightNormDense(_BoundedWeightNorm, _Dense):
    def __init__(self, in_features: int, out_features: int, *, use_bias: bool = True,
                 dtype: Dtype | None = None, param_dtype: Dtype = jnp.float32,
                 kernel_init: Initializer = default_kernel_init, bias_init: Initializer = default_bias_init,
                 per_unit: bool = True, epsilon: float = 1e-12,
                 rngs: nnx.Rngs, kernel_metadata: Metadata = NO_METADATA,
                 bias_metadata: Metadata = NO_METADATA):
        self._init_dense(in_features, out_features, use_bias=use_bias, dtype=dtype, param_dtype=param_dtype,
                         kernel_init=kernel_init, bias_init=bias_init, rngs=rngs,
                         kernel_metadata=kernel_metadata, bias_metadata=bias_metadata)
        self._init_bounded_weight_norm(per_unit, epsilon)

    __doc__ = "Dense layer with bounded weight normalization. " + _BoundedWeightNorm.__doc__


class BoundedWeightNormConv(_BoundedWeightNorm, _Conv):
    def __init__(self, in_features: int, out_features: int, kernel_size: int | Sequence[int],
                 strides: Strides = 1, *, padding: linear.Padding = "SAME", input_dilation: Strides = 1,
                 kernel_dilation: Strides = 1, feature_group_count: int = 1, use_bias: bool = True,
                 dtype: Dtype | None = None, param_dtype: Dtype = jnp.float32,
                 kernel_init: Initializer = default_kernel_init, bias_init: Initializer = default_bias_init,
                 per_unit: bool = True, epsilon: float = 1e-12, rngs: nnx.Rngs,
                 kernel_metadata: Metadata = NO_METADATA, bias_metadata: Metadata = NO_METADATA):
        self._init_conv(in_features, out_features, kernel_size, strides, padding=padding,
                        input_dilation=input_dilation, kernel_dilation=kernel_dilation,
                        feature_group_count=feature_group_count, use_bias=use_bias, dtype=dtype,
                        param_dtype=param_dtype, kernel_init=kernel_init, bias_init=bias_init, rngs=rngs,
                        kernel_metadata=kernel_metadata, bias_metadata=bias_metadata)
        self._init_bounded_weight_norm(per_unit, epsilon)

    __doc__ = "Conv layer with bounded weight normalization. " + _BoundedWeightNorm.__doc__


class WSConv(_WeightStandardization, _Conv):
    def __init__(self, in_features: int, out_features: int, kernel_size: int | Sequence[int],
                 strides: Strides = 1, *, padding: linear.Padding = "SAME", input_dilation: Strides = 1,
                 kernel_dilation: Strides = 1, feature_group_count: int = 1, use_bias: bool = True,
                 dtype: Dtype | None = None, param_dtype: Dtype = jnp.float32,
                 kernel_init: Initializer = default_kernel_init, bias_init: Initializer = default_bias_init,
                 use_gain: bool = True, epsilon: float = 1e-5,
                 gain_init: Initializer = nnx.initializers.ones, rngs: nnx.Rngs,
                 kernel_metadata: Metadata = NO_METADATA, bias_metadata: Metadata = NO_METADATA):
        self._init_conv(in_features, out_features, kernel_size, strides, padding=padding,
                        input_dilation=input_dilation, kernel_dilation=kernel_dilation,
                        feature_group_count=feature_group_count, use_bias=use_bias, dtype=dtype,
                        param_dtype=param_dtype, kernel_init=kernel_init, bias_init=bias_init, rngs=rngs,
                        kernel_metadata=kernel_metadata, bias_metadata=bias_metadata)
        self._init_weight_standardization(use_gain, epsilon, gain_init, rngs)

    __doc__ = "Conv layer with scaled weight standardization. " + _WeightStandardization.__doc__


class NormPropDense(_NormProp, _Dense):
    def __init__(self, in_features: int, out_features: int, *, use_bias: bool = True,
                 dtype: Dtype | None = None, param_dtype: Dtype = jnp.float32,
                 kernel_init: Initializer = default_kernel_init, bias_init: Initializer = default_bias_init,
                 activation: bool = True, epsilon: float = 1e-12,
                 scale_init: Initializer = nnx.initializers.ones, rngs: nnx.Rngs,
                 kernel_metadata: Metadata = NO_METADATA, bias_metadata: Metadata = NO_METADATA):
        self._init_dense(in_features, out_features, use_bias=use_bias, dtype=dtype, param_dtype=param_dtype,
                         kernel_init=kernel_init, bias_init=bias_init, rngs=rngs,
                         kernel_metadata=kernel_metadata, bias_metadata=bias_metadata)
        self._init_normprop(activation, epsilon, scale_init, rngs)

    __doc__ = "Dense normalization-propagation layer. " + _NormProp.__doc__


class NormPropConv(_NormProp, _Conv):
    def __init__(self, in_features: int, out_features: int, kernel_size: int | Sequence[int],
                 strides: Strides = 1, *, padding: linear.Padding = "SAME", input_dilation: Strides = 1,
                 kernel_dilation: Strides = 1, feature_group_count: int = 1, use_bias: bool = True,
                 dtype: Dtype | None = None, param_dtype: Dtype = jnp.float32,
                 kernel_init: Initializer = default_kernel_init, bias_init: Initializer = default_bias_init,
                 activation: bool = True, epsilon: float = 1e-12,
                 scale_init: Initializer = nnx.initializers.ones, rngs: nnx.Rngs,
                 kernel_metadata: Metadata = NO_METADATA, bias_metadata: Metadata = NO_METADATA):
        self._init_conv(in_features, out_features, kernel_size, strides, padding=padding,
                        input_dilation=input_dilation, kernel_dilation=kernel_dilation,
                        feature_group_count=feature_group_count, use_bias=use_bias, dtype=dtype,
                        param_dtype=param_dtype, kernel_init=kernel_init, bias_init=bias_init, rngs=rngs,
                        kernel_metadata=kernel_metadata, bias_metadata=bias_metadata)
        self._init_normprop(activation, epsilon, scale_init, rngs)

    __doc__ = "Conv normalization-propagation layer. " + _NormProp.__doc__


class _MagnitudePreserving:
    """Magnitude-preserving layer with forced weight normalization (Karras et al. 2024, EDM2, Sec. 3.2):
    ``W = gain * v / ||v||`` per output unit (:func:`jaxnorm.functional.magnitude.mp_weight`, ``eps``
    1e-4 on the per-element RMS), so unit-variance inputs give outputs of variance ``gain^2``. No bias
    by default and ``v`` initialised standard normal (``mp_kernel_init``), as in EDM2. The *forced*
    part, writing ``sqrt(fan_in) v / ||v||`` back into the stored
    weights before every step, is an optimizer transform (``jaxnorm.optim``), not the layer's."""

    def _init_magnitude_preserving(self, gain, epsilon):
        check_positive_values(gain, "gain")
        self.gain = gain
        self.epsilon = check_epsilon(epsilon)

    def _effective_kernel(self):
        return mp_weight(self.kernel[...], self.gain, epsilon=self.epsilon)


class MPDense(_MagnitudePreserving, _Dense):
    def __init__(self, in_features: int, out_features: int, *, use_bias: bool = False,
                 dtype: Dtype | None = None, param_dtype: Dtype = jnp.float32,
                 kernel_init: Initializer = mp_kernel_init, bias_init: Initializer = default_bias_init,
                 gain: float = 1.0, epsilon: float = 1e-4, rngs: nnx.Rngs,
                 kernel_metadata: Metadata = NO_METADATA, bias_metadata: Metadata = NO_METADATA):
        self._init_dense(in_features, out_features, use_bias=use_bias, dtype=dtype, param_dtype=param_dtype,
                         kernel_init=kernel_init, bias_init=bias_init, rngs=rngs,
                         kernel_metadata=kernel_metadata, bias_metadata=bias_metadata)
        self._init_magnitude_preserving(gain, epsilon)

    __doc__ = "Dense layer. " + _MagnitudePreserving.__doc__


class MPConv(_MagnitudePreserving, _Conv):
    def __init__(self, in_features: int, out_features: int, kernel_size: int | Sequence[int],
                 strides: Strides = 1, *, padding: linear.Padding = "SAME", input_dilation: Strides = 1,
                 kernel_dilation: Strides = 1, feature_group_count: int = 1, use_bias: bool = False,
                 dtype: Dtype | None = None, param_dtype: Dtype = jnp.float32,
                 kernel_init: Initializer = mp_kernel_init, bias_init: Initializer = default_bias_init,
                 gain: float = 1.0, epsilon: float = 1e-4, rngs: nnx.Rngs,
                 kernel_metadata: Metadata = NO_METADATA, bias_metadata: Metadata = NO_METADATA):
        self._init_conv(in_features, out_features, kernel_size, strides, padding=padding,
                        input_dilation=input_dilation, kernel_dilation=kernel_dilation,
                        feature_group_count=feature_group_count, use_bias=use_bias, dtype=dtype,
                        param_dtype=param_dtype, kernel_init=kernel_init, bias_init=bias_init, rngs=rngs,
                        kernel_metadata=kernel_metadata, bias_metadata=bias_metadata)
        self._init_magnitude_preserving(gain, epsilon)

    __doc__ = "Conv layer. " + _MagnitudePreserving.__doc__
