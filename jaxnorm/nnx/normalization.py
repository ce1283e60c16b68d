"""flax.nnx activation-normalization modules: drop-ins for their ``flax.nnx`` namesakes.

Constructors take flax.nnx's arguments with flax's defaults (``num_features`` first, ``rngs`` keyword),
the modules hold the same attributes (``scale``, ``bias`` as :class:`flax.nnx.Param`; ``mean``, ``var``
as :class:`flax.nnx.BatchStat`), and for ``p = 2`` they compute flax's numbers. jaxnorm's own arguments
are those of :mod:`jaxnorm.nn`: ``p`` (2, 1 or 'inf'), ``topk``, ``calibration``, ``virtual_batch_size``,
``mean_only``. As ``nnx.BatchNorm`` does, :class:`BatchNorm` moves its running statistics on every call
with ``use_running_average=False`` (nnx has no separate init pass).

Differences from flax, on purpose: ``use_fast_variance=True`` is a stable one-pass computation (shifted
sums, :mod:`jaxnorm.functional.moments`) rather than ``E[x^2] - E[x]^2``; running statistics stay float32
whatever ``dtype`` is; statistics of half-precision inputs are float32.

The computation lives in :mod:`jaxnorm.functional.layers`, shared with :mod:`jaxnorm.nn`; these classes
only hold variables.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax.numpy as jnp
from flax import nnx
from flax.nnx.nn import dtypes
from flax.typing import Dtype, Initializer, PromoteDtypeFn

from jaxnorm.functional import layers
from jaxnorm.functional.calibration import Calibration
from jaxnorm.functional.checks import (
    PNorm,
    canonical_axes,
    canonical_p,
    check_bool,
    check_compute_dtype,
    check_epsilon,
    check_floating,
    check_momentum,
    check_param_dtype,
    check_positive_int,
)
from jaxnorm.functional.options import BatchOptions, check_batch_options
from jaxnorm.nnx._variables import NO_METADATA, optional_param, value_or_none

__all__ = ["BatchNorm", "GroupNorm", "InstanceNorm", "LayerNorm", "RMSNorm"]

Axes = int | Sequence[int]


def _check_features(x: jnp.ndarray, axes: Axes, num_features: int, name: str) -> tuple[int, ...]:
    """Canonical ``axes`` of ``x``, checking that they hold ``num_features`` elements."""
    axes = canonical_axes(axes, x.ndim, name)
    size = math.prod(x.shape[a] for a in axes)
    if size != num_features:
        raise ValueError(
            f"num_features={num_features} does not match the input: x.shape={x.shape} has {size} "
            f"elements along {name}={axes}"
        )
    return axes


class _Affine(nnx.Module):
    """Shared constructor part: ``scale`` then ``bias`` (flax's key order) and the common settings."""

    def _init_affine(self, num_features, *, epsilon, dtype, param_dtype, use_bias, use_scale, bias_init,
                     scale_init, axis_name, axis_index_groups, use_fast_variance, promote_dtype, rngs,
                     bias_metadata, scale_metadata):
        num_features = check_positive_int(num_features, "num_features")
        shape = (num_features,)
        # checked: flax.nnx takes any value's truthiness, and integer parameters
        use_scale, use_bias = check_bool(use_scale, "use_scale"), check_bool(use_bias, "use_bias")
        param_dtype = check_param_dtype(param_dtype)
        self.scale = optional_param(use_scale, scale_init, shape, param_dtype, rngs, scale_metadata)
        self.bias = optional_param(use_bias, bias_init, shape, param_dtype, rngs, bias_metadata)
        self.num_features = num_features
        self.epsilon = check_epsilon(epsilon)
        check_compute_dtype(dtype)  # at construction, where flax.nnx raises at the first call
        self.dtype = dtype
        self.param_dtype = param_dtype
        self.use_bias = use_bias
        self.use_scale = use_scale
        self.axis_name = axis_name
        self.axis_index_groups = axis_index_groups
        self.use_fast_variance = check_bool(use_fast_variance, "use_fast_variance")
        self.promote_dtype = promote_dtype

    def _promoted(
        self, x: jnp.ndarray, statistics: tuple[jnp.ndarray, ...] = ()
    ) -> tuple[jnp.ndarray, jnp.ndarray | None, jnp.ndarray | None]:
        """``x``, ``scale``, ``bias`` through ``promote_dtype`` as flax.nnx does (``x`` floating or
        complex, as flax's). BatchNorm passes its running
        ``statistics`` along, as flax.nnx's ``(x, mean, var, scale, bias)``: with ``dtype=None`` their
        float32 promotes half-precision ``x`` and parameters, and the output, to float32. The promoted
        statistics are not used: the running averages stay float32 whatever ``dtype``."""
        check_floating(x, "x", allow_complex=True)
        promoted = self.promote_dtype(
            (x, *statistics, value_or_none(self.scale), value_or_none(self.bias)), dtype=self.dtype
        )
        return promoted[0], promoted[-2], promoted[-1]


class BatchNorm(_Affine):
    """Batch normalization with L2, L1, L∞ or top-k L∞ statistics (Hoffer et al., *Norm matters*, Sec. 3).

    A drop-in for ``flax.nnx.BatchNorm``: same constructor, attributes (``scale``, ``bias``, ``mean``,
    ``var``) and, for ``p=2``, numbers. jaxnorm's arguments, as :class:`jaxnorm.nn.BatchNorm`:

    Args:
      p: 2 (default), 1 (``sqrt(pi/2) * mean|x - mu|``) or 'inf' (``C(n) * max|x - mu|``).
      topk: with ``p='inf'``, the mean of the ``topk`` largest deviations replaces the max.
      calibration: 'paper' (the paper's ``C(n)``) or 'exact' (``1 / E[max of n |N(0,1)|]``).
      virtual_batch_size: ghost batch norm — statistics per sub-batch of this size along axis 0.
      mean_only: subtract the batch mean only (for bounded weight norm / weight norm networks).

    ``var`` holds ``sigma_hat**2`` for every ``p``, so evaluation is the same for all. ``axis`` may be a
    sequence of axes; ``num_features`` is then the number of elements they span.
    """

    def __init__(
        self,
        num_features: int,
        *,
        use_running_average: bool | None = False,
        axis: Axes = -1,
        momentum: float = 0.99,
        epsilon: float = 1e-5,
        dtype: Dtype | None = None,
        param_dtype: Dtype = jnp.float32,
        use_bias: bool = True,
        use_scale: bool = True,
        bias_init: Initializer = nnx.initializers.zeros,
        scale_init: Initializer = nnx.initializers.ones,
        axis_name: str | None = None,
        axis_index_groups: Any = None,
        use_fast_variance: bool = True,
        promote_dtype: PromoteDtypeFn = dtypes.promote_dtype,
        rngs: nnx.Rngs,
        bias_metadata: Mapping[str, Any] = NO_METADATA,
        scale_metadata: Mapping[str, Any] = NO_METADATA,
        p: PNorm | float = 2,
        topk: int | None = None,
        calibration: Calibration = "paper",
        virtual_batch_size: int | None = None,
        mean_only: bool = False,
    ):
        options = check_batch_options(p, topk, calibration, virtual_batch_size, mean_only, use_fast_variance)
        self.p = options.p
        momentum = check_momentum(momentum)
        num_features = check_positive_int(num_features, "num_features")
        self.mean = nnx.BatchStat(jnp.zeros((num_features,), jnp.float32))
        self.var = nnx.BatchStat(jnp.ones((num_features,), jnp.float32))
        self._init_affine(
            num_features, epsilon=epsilon, dtype=dtype, param_dtype=param_dtype, use_bias=use_bias,
            use_scale=use_scale, bias_init=bias_init, scale_init=scale_init, axis_name=axis_name,
            axis_index_groups=axis_index_groups, use_fast_variance=use_fast_variance,
            promote_dtype=promote_dtype, rngs=rngs, bias_metadata=bias_metadata,
            scale_metadata=scale_metadata,
        )
        if use_running_average is not None:  # None: given at call or by model.eval() / model.train()
            check_bool(use_running_average, "use_running_average")
        self.use_running_average = use_running_average
        self.axis = axis
        self.momentum = momentum
        self.topk = options.topk
        self.calibration = options.calibration
        self.virtual_batch_size = options.virtual_batch_size
        self.mean_only = options.mean_only

    @property
    def options(self) -> BatchOptions:
        """The statistics' options as one validated value (checked again: attributes may be reassigned)."""
        return check_batch_options(
            self.p, self.topk, self.calibration, self.virtual_batch_size, self.mean_only,
            self.use_fast_variance,
        )

    def set_view(self, use_running_average: bool | None = None):
        """What ``nnx.view(model, use_running_average=...)`` calls, as flax.nnx.BatchNorm's: sets the
        mode of the view (``None`` leaves it)."""
        if use_running_average is not None:
            self.use_running_average = use_running_average

    def __call__(self, x, use_running_average: bool | None = None, *, mask=None):
        """Normalize ``x``; ``mask`` (boolean, broadcastable to ``x``) selects the elements of the statistics.

        ``use_running_average`` given here takes precedence over the constructor's. In training mode the
        running statistics move towards the batch statistics: ``ra = momentum * ra + (1 - momentum) * b``.
        """
        if use_running_average is None:
            use_running_average = self.use_running_average
        if use_running_average is None:
            raise ValueError(
                "use_running_average must be given to BatchNorm's constructor or call (or set with "
                "model.eval() / model.train()), got None in both"
            )
        use_running_average = check_bool(use_running_average, "use_running_average")
        feature_axes = _check_features(x, self.axis, self.num_features, "axis")
        x, scale, bias = self._promoted(x, statistics=(self.mean[...], self.var[...]))
        running_mean, running_var = self.mean[...], self.var[...]
        if use_running_average and not jnp.iscomplexobj(x):
            # evaluation in the wider of the statistics' and x's dtypes, as flax.nnx promotes them: float64
            # x is normalized in float64 (flax.linen, and jaxnorm.nn, take the float32 statistics' rsqrt)
            wide = jnp.promote_types(running_var.dtype, x.dtype)
            running_mean, running_var = running_mean.astype(wide), running_var.astype(wide)
        out = layers.batch_norm_layer(
            x, running_mean=running_mean, running_var=running_var, scale=scale, bias=bias,
            use_running_average=use_running_average, axis=feature_axes, momentum=self.momentum,
            epsilon=self.epsilon, options=self.options, axis_name=self.axis_name,
            axis_index_groups=self.axis_index_groups, mask=mask, dtype=self.dtype,
        )
        if not use_running_average:
            # a complex batch mean is stored as its real part, as flax.nnx's float32 BatchStat does
            self.mean[...] = jnp.real(out.running_mean).astype(self.mean.dtype)
            self.var[...] = out.running_var.astype(self.var.dtype)
        return out.y


class LayerNorm(_Affine):
    """Layer normalization (Ba et al. 2016, Sec. 3) with an L2, L1 or L∞ dispersion.

    A drop-in for ``flax.nnx.LayerNorm`` (``reduction_axes``, ``feature_axes``, ...) plus ``p``.
    """

    def __init__(
        self,
        num_features: int,
        *,
        epsilon: float = 1e-6,
        dtype: Dtype | None = None,
        param_dtype: Dtype = jnp.float32,
        use_bias: bool = True,
        use_scale: bool = True,
        bias_init: Initializer = nnx.initializers.zeros,
        scale_init: Initializer = nnx.initializers.ones,
        reduction_axes: Axes = -1,
        feature_axes: Axes = -1,
        axis_name: str | None = None,
        axis_index_groups: Any = None,
        use_fast_variance: bool = True,
        promote_dtype: PromoteDtypeFn = dtypes.promote_dtype,
        rngs: nnx.Rngs,
        bias_metadata: Mapping[str, Any] = NO_METADATA,
        scale_metadata: Mapping[str, Any] = NO_METADATA,
        p: PNorm | float = 2,
    ):
        self.p = canonical_p(p)
        self._init_affine(
            num_features, epsilon=epsilon, dtype=dtype, param_dtype=param_dtype, use_bias=use_bias,
            use_scale=use_scale, bias_init=bias_init, scale_init=scale_init, axis_name=axis_name,
            axis_index_groups=axis_index_groups, use_fast_variance=use_fast_variance,
            promote_dtype=promote_dtype, rngs=rngs, bias_metadata=bias_metadata,
            scale_metadata=scale_metadata,
        )
        self.reduction_axes = reduction_axes
        self.feature_axes = feature_axes

    def __call__(self, x, *, mask=None):
        """Normalize each example over ``reduction_axes``; ``mask`` selects the elements of the statistics."""
        feature_axes = _check_features(x, self.feature_axes, self.num_features, "feature_axes")
        x, scale, bias = self._promoted(x)
        return layers.layer_norm_layer(
            x, scale=scale, bias=bias, reduction_axes=self.reduction_axes, feature_axes=feature_axes,
            epsilon=self.epsilon, p=self.p, axis_name=self.axis_name,
            axis_index_groups=self.axis_index_groups, use_fast_variance=self.use_fast_variance,
            mask=mask, dtype=self.dtype,
        )


class InstanceNorm(_Affine):
    """Instance normalization (Ulyanov et al. 2016): per example and channel over the spatial axes.

    A drop-in for ``flax.nnx.InstanceNorm`` plus ``p``.
    """

    def __init__(
        self,
        num_features: int,
        *,
        epsilon: float = 1e-6,
        dtype: Dtype | None = None,
        param_dtype: Dtype = jnp.float32,
        use_bias: bool = True,
        use_scale: bool = True,
        bias_init: Initializer = nnx.initializers.zeros,
        scale_init: Initializer = nnx.initializers.ones,
        feature_axes: Axes = -1,
        axis_name: str | None = None,
        axis_index_groups: Any = None,
        use_fast_variance: bool = True,
        promote_dtype: PromoteDtypeFn = dtypes.promote_dtype,
        rngs: nnx.Rngs,
        bias_metadata: Mapping[str, Any] = NO_METADATA,
        scale_metadata: Mapping[str, Any] = NO_METADATA,
        p: PNorm | float = 2,
    ):
        self.p = canonical_p(p)
        self._init_affine(
            num_features, epsilon=epsilon, dtype=dtype, param_dtype=param_dtype, use_bias=use_bias,
            use_scale=use_scale, bias_init=bias_init, scale_init=scale_init, axis_name=axis_name,
            axis_index_groups=axis_index_groups, use_fast_variance=use_fast_variance,
            promote_dtype=promote_dtype, rngs=rngs, bias_metadata=bias_metadata,
            scale_metadata=scale_metadata,
        )
        if 0 in ((feature_axes,) if isinstance(feature_axes, int) else tuple(feature_axes)):
            layers.check_instance_feature_axes((0,))  # axis 0 is the batch axis whatever the input
        self.feature_axes = feature_axes

    def __call__(self, x, *, mask=None):
        """Normalize each example and channel over every axis but the batch and ``feature_axes``."""
        layers.check_instance_feature_axes(canonical_axes(self.feature_axes, x.ndim, "feature_axes"))
        feature_axes = _check_features(x, self.feature_axes, self.num_features, "feature_axes")
        reduction_axes = layers.instance_reduction_axes(x.shape, feature_axes)
        x, scale, bias = self._promoted(x)
        return layers.layer_norm_layer(
            x, scale=scale, bias=bias, reduction_axes=reduction_axes, feature_axes=feature_axes,
            epsilon=self.epsilon, p=self.p, axis_name=self.axis_name,
            axis_index_groups=self.axis_index_groups, use_fast_variance=self.use_fast_variance,
            mask=mask, dtype=self.dtype,
        )


class GroupNorm(_Affine):
    """Group normalization (Wu & He 2018, Eq. 1-3) with an L2, L1 or L∞ dispersion, channels last.

    A drop-in for ``flax.nnx.GroupNorm`` (``num_groups=32`` or ``group_size``, ``reduction_axes``) plus
    ``p``. After construction ``num_groups`` and ``group_size`` both hold their resolved values, as in
    flax. Computed as per-channel reductions merged per group (see :func:`jaxnorm.functional.group_norm`).
    """

    def __init__(
        self,
        num_features: int,
        num_groups: int | None = 32,
        group_size: int | None = None,
        *,
        epsilon: float = 1e-6,
        dtype: Dtype | None = None,
        param_dtype: Dtype = jnp.float32,
        use_bias: bool = True,
        use_scale: bool = True,
        bias_init: Initializer = nnx.initializers.zeros,
        scale_init: Initializer = nnx.initializers.ones,
        reduction_axes: Axes | None = None,
        axis_name: str | None = None,
        axis_index_groups: Any = None,
        use_fast_variance: bool = True,
        promote_dtype: PromoteDtypeFn = dtypes.promote_dtype,
        rngs: nnx.Rngs,
        bias_metadata: Mapping[str, Any] = NO_METADATA,
        scale_metadata: Mapping[str, Any] = NO_METADATA,
        p: PNorm | float = 2,
    ):
        self.p = canonical_p(p)
        self.feature_axis = -1  # as flax.nnx.GroupNorm's attribute: channels last
        self.num_groups = layers.num_groups_of(num_features, num_groups, group_size)
        self.group_size = num_features // self.num_groups
        self._init_affine(
            num_features, epsilon=epsilon, dtype=dtype, param_dtype=param_dtype, use_bias=use_bias,
            use_scale=use_scale, bias_init=bias_init, scale_init=scale_init, axis_name=axis_name,
            axis_index_groups=axis_index_groups, use_fast_variance=use_fast_variance,
            promote_dtype=promote_dtype, rngs=rngs, bias_metadata=bias_metadata,
            scale_metadata=scale_metadata,
        )
        self.reduction_axes = reduction_axes

    def __call__(self, x, *, mask=None):
        """Normalize each example and channel group over ``reduction_axes`` (default: all non-batch)."""
        _check_features(x, -1, self.num_features, "the channel axis -1")
        x, scale, bias = self._promoted(x)
        return layers.group_norm_layer(
            x, scale=scale, bias=bias, num_groups=self.num_groups, reduction_axes=self.reduction_axes,
            epsilon=self.epsilon, p=self.p, axis_name=self.axis_name,
            axis_index_groups=self.axis_index_groups, use_fast_variance=self.use_fast_variance,
            mask=mask, dtype=self.dtype,
        )


class RMSNorm(nnx.Module):
    """RMS normalization (Zhang & Sennrich 2019, Eq. 4); a drop-in for ``flax.nnx.RMSNorm``.

    ``use_fast_variance`` is accepted for flax compatibility; with no mean subtracted it changes nothing.
    """

    def __init__(
        self,
        num_features: int,
        *,
        epsilon: float = 1e-6,
        dtype: Dtype | None = None,
        param_dtype: Dtype = jnp.float32,
        use_scale: bool = True,
        scale_init: Initializer = nnx.initializers.ones,
        reduction_axes: Axes = -1,
        feature_axes: Axes = -1,
        axis_name: str | None = None,
        axis_index_groups: Any = None,
        use_fast_variance: bool = True,
        promote_dtype: PromoteDtypeFn = dtypes.promote_dtype,
        rngs: nnx.Rngs,
        scale_metadata: Mapping[str, Any] = NO_METADATA,
    ):
        use_scale, param_dtype = check_bool(use_scale, "use_scale"), check_param_dtype(param_dtype)
        num_features = check_positive_int(num_features, "num_features")
        self.scale = optional_param(use_scale, scale_init, (num_features,), param_dtype, rngs, scale_metadata)
        self.num_features = num_features
        self.epsilon = check_epsilon(epsilon)
        check_compute_dtype(dtype)  # at construction, where flax.nnx raises at the first call
        self.dtype = dtype
        self.param_dtype = param_dtype
        self.use_scale = use_scale
        self.reduction_axes = reduction_axes
        self.feature_axes = feature_axes
        self.axis_name = axis_name
        self.axis_index_groups = axis_index_groups
        self.use_fast_variance = check_bool(use_fast_variance, "use_fast_variance")
        self.promote_dtype = promote_dtype

    def __call__(self, x, mask=None):
        """``x * rsqrt(mean(x^2) + epsilon) * scale`` over ``reduction_axes``."""
        feature_axes = _check_features(x, self.feature_axes, self.num_features, "feature_axes")
        check_floating(x, "x", allow_complex=True)  # complex x as flax's
        x, scale = self.promote_dtype((x, value_or_none(self.scale)), dtype=self.dtype)
        return layers.rms_norm_layer(
            x, scale=scale, reduction_axes=self.reduction_axes, feature_axes=feature_axes,
            epsilon=self.epsilon, axis_name=self.axis_name, axis_index_groups=self.axis_index_groups,
            mask=mask, dtype=self.dtype,
        )
