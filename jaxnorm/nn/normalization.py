"""flax.linen activation-normalization modules: drop-ins for their ``flax.linen`` namesakes.

Every flax argument keeps its name and default, the variables keep flax's collections and names
(``params/scale``, ``params/bias``, ``batch_stats/mean``, ``batch_stats/var``), and for ``p = 2`` the
numbers are flax's — code and checkpoints written for flax keep working. jaxnorm's own arguments:
``p`` (2, 1 or 'inf'), ``topk``, ``calibration``, ``virtual_batch_size``, ``mean_only``.
Differences from flax, on purpose: ``use_fast_variance=True`` is a stable one-pass computation
(shifted sums) rather than ``E[x^2] - E[x]^2`` (see :mod:`jaxnorm.functional.moments`);
``force_float32_reductions`` is accepted and has no effect, since the statistics are always float32 or
wider; a BatchNorm ``init`` batch too small for batch statistics is normalized with the initial running
statistics rather than raising.

The computation lives in :mod:`jaxnorm.functional.layers`; these classes only declare variables.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax.numpy as jnp
from flax.linen import initializers
from flax.typing import Dtype, Initializer

from jaxnorm.functional import layers
from jaxnorm.functional.batch import batch_gives_statistics
from jaxnorm.functional.checks import PNorm, canonical_axes, check_bool, check_param_dtype
from jaxnorm.functional.options import BatchOptions, check_batch_options

__all__ = ["BatchNorm", "GroupNorm", "InstanceNorm", "LayerNorm", "RMSNorm"]

Axes = int | Sequence[int]


def _scale_and_bias(mdl: nn.Module, shape: tuple[int, ...]) -> tuple[Any, Any]:
    """Declare ``params/scale`` and ``params/bias`` as flax does (feature-shaped, param_dtype; RMSNorm has
    no bias), after checking ``use_scale``, ``use_bias``, ``param_dtype`` and the flags
    ``use_fast_variance`` and ``force_float32_reductions`` (flax takes any value's truthiness, and
    integer parameters)."""
    param_dtype = check_param_dtype(mdl.param_dtype)
    for flag in ("use_fast_variance", "force_float32_reductions"):
        check_bool(getattr(mdl, flag), flag)

    def declare(name: str, use: object, init: Initializer) -> Any:
        return mdl.param(name, init, shape, param_dtype) if check_bool(use, f"use_{name}") else None

    scale = declare("scale", mdl.use_scale, mdl.scale_init)
    bias = declare("bias", mdl.use_bias, mdl.bias_init) if hasattr(mdl, "use_bias") else None
    return scale, bias


def _init_batch_too_small(
    shape: tuple[int, ...], feature_axes: tuple[int, ...], options: BatchOptions, axis_name: str | None
) -> bool:
    """Whether ``init`` (which takes no collective: ``axis_name`` is dropped there) must normalize its batch
    with the initial running statistics: one example, or too few elements per feature without ghost
    batches; with ``axis_name``, also fewer per feature on this device than ``topk`` (the global batch of
    training may hold enough). A larger batch that is not a multiple of ``virtual_batch_size``, or
    ``topk`` above the batch without ``axis_name``, is left to raise as it would in training."""
    vbs = options.virtual_batch_size
    if not batch_gives_statistics(shape, feature_axes, vbs) and (shape[0] == 1 or vbs is None):
        return True
    ghosts_fit = vbs is None or shape[0] % vbs == 0
    return (
        axis_name is not None
        and options.topk is not None
        and ghosts_fit
        and not batch_gives_statistics(shape, feature_axes, vbs, topk=options.topk)
    )


class BatchNorm(nn.Module):
    """Batch normalization with L2, L1, L∞ or top-k L∞ statistics (Hoffer et al., *Norm matters*, Sec. 3).

    A drop-in for ``flax.linen.BatchNorm`` (same arguments, variables and, for ``p=2``, numbers).

    Attributes:
      use_running_average, axis, momentum, epsilon, dtype, param_dtype, use_bias, use_scale, bias_init,
      scale_init, axis_name, axis_index_groups, use_fast_variance: as flax.
      force_float32_reductions: accepted for flax's signature; no effect (statistics are float32 or wider).
      p: 2 (default), 1 (``sqrt(pi/2) * mean|x - mu|``) or 'inf' (``C(n) * max|x - mu|``).
      topk: with ``p='inf'``, the mean of the ``topk`` largest deviations replaces the max.
      calibration: 'paper' (the paper's ``C(n)``) or 'exact' (``1 / E[max of n |N(0,1)|]``).
      virtual_batch_size: ghost batch norm — statistics per sub-batch of this size along axis 0.
      mean_only: subtract the batch mean only (for bounded weight norm / weight norm networks).

    ``batch_stats/var`` holds ``sigma_hat**2`` for every ``p`` so evaluation code stays the same.
    Running statistics are not updated during ``init``, as in flax; an ``init`` batch too small for
    batch statistics (one example) is normalized with the initial running statistics instead of
    raising, so ``model.init(key, x[:1])`` works as with flax; a larger ``init`` batch that is not a
    multiple of ``virtual_batch_size`` raises, as it would in training.
    """

    use_running_average: bool | None = None
    axis: int | Sequence[int] = -1
    momentum: float = 0.99
    epsilon: float = 1e-5
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    use_bias: bool = True
    use_scale: bool = True
    bias_init: Initializer = initializers.zeros
    scale_init: Initializer = initializers.ones
    axis_name: str | None = None
    axis_index_groups: Any = None
    use_fast_variance: bool = True
    force_float32_reductions: bool = True
    p: PNorm | float = 2
    topk: int | None = None
    calibration: str = "paper"
    virtual_batch_size: int | None = None
    mean_only: bool = False

    @nn.compact
    def __call__(self, x, use_running_average: bool | None = None, *, mask=None):
        """Normalize ``x``; ``mask`` (boolean, broadcastable to ``x``) selects the statistics' elements."""
        use_running_average = check_bool(
            nn.merge_param("use_running_average", self.use_running_average, use_running_average),
            "use_running_average",
        )
        options = check_batch_options(
            self.p, self.topk, self.calibration, self.virtual_batch_size, self.mean_only,
            self.use_fast_variance,
        )
        feature_axes = canonical_axes(self.axis, x.ndim, "axis")
        feature_shape = tuple(x.shape[a] for a in feature_axes)
        ra_mean = self.variable("batch_stats", "mean", jnp.zeros, feature_shape, jnp.float32)
        ra_var = self.variable("batch_stats", "var", jnp.ones, feature_shape, jnp.float32)
        scale, bias = _scale_and_bias(self, feature_shape)
        initializing = self.is_initializing()
        if initializing and _init_batch_too_small(x.shape, feature_axes, options, self.axis_name):
            # init needs the shapes only: a dummy batch too small for batch statistics is normalized
            # with the initial running ones; any other batch is checked as in training
            use_running_average = True
        out = layers.batch_norm_layer(
            x,
            running_mean=ra_mean.value,
            running_var=ra_var.value,
            scale=scale,
            bias=bias,
            use_running_average=use_running_average,
            update_running_stats=not initializing,
            axis=feature_axes,
            momentum=self.momentum,
            epsilon=self.epsilon,
            options=options,
            axis_name=None if initializing else self.axis_name,
            axis_index_groups=self.axis_index_groups,
            mask=mask,
            dtype=self.dtype,
        )
        if not use_running_average and not initializing:
            ra_mean.value, ra_var.value = out.running_mean, out.running_var
        return out.y


class LayerNorm(nn.Module):
    """Layer normalization (Ba et al. 2016) with an L2, L1 or L∞ dispersion; drop-in for flax's.

    Attributes as ``flax.linen.LayerNorm`` (``reduction_axes``, ``feature_axes``, ...) plus ``p``.
    """

    epsilon: float = 1e-6
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    use_bias: bool = True
    use_scale: bool = True
    bias_init: Initializer = initializers.zeros
    scale_init: Initializer = initializers.ones
    reduction_axes: Axes = -1
    feature_axes: Axes = -1
    axis_name: str | None = None
    axis_index_groups: Any = None
    use_fast_variance: bool = True
    force_float32_reductions: bool = True
    p: PNorm | float = 2

    @nn.compact
    def __call__(self, x, *, mask=None):
        feature_axes = canonical_axes(self.feature_axes, x.ndim, "feature_axes")
        scale, bias = _scale_and_bias(self, tuple(x.shape[a] for a in feature_axes))
        return layers.layer_norm_layer(
            x,
            scale=scale,
            bias=bias,
            reduction_axes=self.reduction_axes,
            feature_axes=feature_axes,
            epsilon=self.epsilon,
            p=self.p,
            axis_name=self.axis_name,
            axis_index_groups=self.axis_index_groups,
            use_fast_variance=self.use_fast_variance,
            mask=mask,
            dtype=self.dtype,
        )


class InstanceNorm(nn.Module):
    """Instance normalization (Ulyanov et al. 2016): per example and channel over the spatial axes.

    Attributes as ``flax.linen.InstanceNorm`` plus ``p``.
    """

    epsilon: float = 1e-6
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    use_bias: bool = True
    use_scale: bool = True
    bias_init: Initializer = initializers.zeros
    scale_init: Initializer = initializers.ones
    feature_axes: Axes = -1
    axis_name: str | None = None
    axis_index_groups: Any = None
    use_fast_variance: bool = True
    force_float32_reductions: bool = True
    p: PNorm | float = 2

    @nn.compact
    def __call__(self, x, *, mask=None):
        feature_axes = canonical_axes(self.feature_axes, x.ndim, "feature_axes")
        layers.check_instance_feature_axes(feature_axes)
        reduction_axes = layers.instance_reduction_axes(x.shape, feature_axes)
        scale, bias = _scale_and_bias(self, tuple(x.shape[a] for a in feature_axes))
        return layers.layer_norm_layer(
            x,
            scale=scale,
            bias=bias,
            reduction_axes=reduction_axes,
            feature_axes=feature_axes,
            epsilon=self.epsilon,
            p=self.p,
            axis_name=self.axis_name,
            axis_index_groups=self.axis_index_groups,
            use_fast_variance=self.use_fast_variance,
            mask=mask,
            dtype=self.dtype,
        )


class GroupNorm(nn.Module):
    """Group normalization (Wu & He 2018) with an L2, L1 or L∞ dispersion; drop-in for flax's.

    Attributes as ``flax.linen.GroupNorm`` (``num_groups=32`` or ``group_size``, ``reduction_axes``)
    plus ``p``. Computed as per-channel reductions merged per group (:func:`jaxnorm.functional.group_norm`;
    speed against flax in ``docs/benchmarks.md``).
    """

    num_groups: int | None = 32
    group_size: int | None = None
    epsilon: float = 1e-6
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    use_bias: bool = True
    use_scale: bool = True
    bias_init: Initializer = initializers.zeros
    scale_init: Initializer = initializers.ones
    reduction_axes: Axes | None = None
    axis_name: str | None = None
    axis_index_groups: Any = None
    use_fast_variance: bool = True
    force_float32_reductions: bool = True
    p: PNorm | float = 2

    @nn.compact
    def __call__(self, x, *, mask=None):
        scale, bias = _scale_and_bias(self, (x.shape[-1],))
        return layers.group_norm_layer(
            x,
            scale=scale,
            bias=bias,
            num_groups=self.num_groups,
            group_size=self.group_size,
            reduction_axes=self.reduction_axes,
            epsilon=self.epsilon,
            p=self.p,
            axis_name=self.axis_name,
            axis_index_groups=self.axis_index_groups,
            use_fast_variance=self.use_fast_variance,
            mask=mask,
            dtype=self.dtype,
        )


class RMSNorm(nn.Module):
    """RMS normalization (Zhang & Sennrich 2019); drop-in for ``flax.linen.RMSNorm``."""

    epsilon: float = 1e-6
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    use_scale: bool = True
    scale_init: Initializer = initializers.ones
    reduction_axes: Axes = -1
    feature_axes: Axes = -1
    axis_name: str | None = None
    axis_index_groups: Any = None
    use_fast_variance: bool = True
    force_float32_reductions: bool = True

    @nn.compact
    def __call__(self, x, *, mask=None):
        feature_axes = canonical_axes(self.feature_axes, x.ndim, "feature_axes")
        shape = tuple(x.shape[a] for a in feature_axes)
        scale, _ = _scale_and_bias(self, shape)
        return layers.rms_norm_layer(
            x,
            scale=scale,
            reduction_axes=self.reduction_axes,
            feature_axes=feature_axes,
            epsilon=self.epsilon,
            axis_name=self.axis_name,
            axis_index_groups=self.axis_index_groups,
            mask=mask,
            dtype=self.dtype,
        )
