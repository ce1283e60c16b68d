"""Forward passes shared by the linen (:mod:`jaxnorm.nn`) and NNX (:mod:`jaxnorm.nnx`) modules.

Each function takes the module's variables as arrays (``scale``, ``bias``, running statistics) and
returns the output and, for batch norm, the new running statistics, so that both Flax APIs are thin
shells around one pure computation. Conventions follow flax: running averages are
``ra = momentum * ra + (1 - momentum) * batch``; ``var`` holds ``sigma_hat**2`` for every ``p``
(exactly the variance for ``p = 2``), so evaluation is ``(x - mean) * rsqrt(var + epsilon)`` for all p.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax.numpy as jnp
from jax import lax

from jaxnorm.functional.batch import batch_statistics_with_unit, normalize_batch
from jaxnorm.functional.checks import (
    PNorm,
    canonical_axes,
    check_compute_dtype,
    check_epsilon,
    check_floating,
    check_mask,
    check_momentum,
    num_groups_of,
)
from jaxnorm.functional.collectives import AxisIndexGroups
from jaxnorm.functional.complex_norm import (
    check_complex_p,
    complex_mask_counts,
    complex_moments,
    complex_normalize,
)
from jaxnorm.functional.moments import ChannelGroups, stats_dtype, widened_float16
from jaxnorm.functional.normalize import normalize
from jaxnorm.functional.options import BatchOptions
from jaxnorm.functional.per_example import per_example_norm, rms_norm
from jaxnorm.functional.units import needs_tiny_unit, true_variance

__all__ = [
    "INSTANCE_BATCH_AXIS_MESSAGE",
    "BatchNormOutput",
    "ComplexReduction",
    "batch_norm_layer",
    "check_instance_feature_axes",
    "complex_batch_norm_layer",
    "complex_per_example_layer",
    "group_norm_layer",
    "layer_norm_layer",
    "num_groups_of",
    "rms_norm_layer",
]


def _expand(param: jnp.ndarray | None, shape: tuple[int, ...]) -> jnp.ndarray | None:
    return None if param is None else jnp.reshape(param, shape)


def _feature_shape(x: jnp.ndarray, feature_axes: tuple[int, ...]) -> tuple[int, ...]:
    """Broadcastable shape with the feature axes kept and every other axis 1."""
    return tuple(x.shape[a] if a in feature_axes else 1 for a in range(x.ndim))


def _output_dtype(dtype, *arrays) -> jnp.dtype:
    """flax's rule: the requested dtype (floating: :func:`~jaxnorm.functional.checks.check_compute_dtype`),
    else the promotion of the input and the parameters."""
    dtype = check_compute_dtype(dtype)
    return dtype if dtype is not None else jnp.result_type(*[a for a in arrays if a is not None])


class BatchNormOutput(NamedTuple):
    """Output of :func:`batch_norm_layer`: ``y`` and the running statistics after this call."""

    y: jnp.ndarray
    running_mean: jnp.ndarray
    running_var: jnp.ndarray


def batch_norm_layer(
    x: jnp.ndarray,
    *,
    running_mean: jnp.ndarray,
    running_var: jnp.ndarray,
    scale: jnp.ndarray | None,
    bias: jnp.ndarray | None,
    use_running_average: bool,
    update_running_stats: bool = True,
    axis: int | Sequence[int] = -1,
    momentum: float = 0.99,
    epsilon: float = 1e-5,
    options: BatchOptions | None = None,
    axis_name: str | Sequence[str] | None = None,
    axis_index_groups: AxisIndexGroups = None,
    mask: jnp.ndarray | None = None,
    dtype: jnp.dtype | None = None,
) -> BatchNormOutput:
    """The BatchNorm layer: Lp batch normalization with scale, bias and running statistics.

    Training: ``y = (x - mu_B) * rsqrt(sigma_hat_B^2 + epsilon) * scale + bias`` with the statistics of
    :func:`jaxnorm.functional.batch_moments` (Hoffer et al. 2018, Sec. 3), and the running statistics
    move towards ``(mu_B, sigma_hat_B^2)``. Ghost batches (``virtual_batch_size``) contribute the mean
    of their statistics to the running averages. Evaluation (``use_running_average=True``) uses the
    running statistics. ``mean_only=True``: ``y = (x - mu) * scale + bias`` and ``running_var`` is
    returned unchanged (Salimans & Kingma 2016, Sec. 2.2). ``options`` (:func:`check_batch_options`)
    carries ``p``, ``topk``, ``calibration``, ``virtual_batch_size``, ``mean_only`` and
    ``use_fast_variance``, built once by the module (``None``: the defaults).
    """
    options = BatchOptions() if options is None else options
    if not isinstance(options, BatchOptions):
        raise TypeError(f"options must be a BatchOptions (see check_batch_options), got {options!r}")
    if jnp.iscomplexobj(x):
        return complex_batch_norm_layer(
            x, running_mean=running_mean, running_var=running_var, scale=scale, bias=bias,
            use_running_average=use_running_average, update_running_stats=update_running_stats, axis=axis,
            momentum=momentum, epsilon=epsilon, p=options.p, axis_name=axis_name,
            axis_index_groups=axis_index_groups, mask=mask, dtype=dtype,
        )
    check_floating(x, "x")
    momentum, epsilon = check_momentum(momentum), check_epsilon(epsilon)
    feature_axes = canonical_axes(axis, x.ndim, "axis")
    shape = _feature_shape(x, feature_axes)
    out_dtype = _output_dtype(dtype, x, scale, bias)
    scale, bias = _expand(scale, shape), _expand(bias, shape)
    if use_running_average:
        check_mask(mask, x)  # not used here (as in flax), but a wrong one is refused in evaluation too
        # in the running statistics' dtype, as flax.linen (the NNX module promotes them first, as flax.nnx)
        var = None if options.mean_only else running_var.reshape(shape)
        y = normalize(
            x, running_mean.reshape(shape), var, scale=scale, bias=bias, epsilon=epsilon, dtype=out_dtype
        )
        return BatchNormOutput(y, running_mean, running_var)

    x = widened_float16(x)
    statistics = batch_statistics_with_unit(
        x,
        options._replace(tiny_groups=needs_tiny_unit(epsilon, stats_dtype(x))),
        axis=feature_axes,
        mask=mask,
        axis_name=axis_name,
        axis_index_groups=axis_index_groups,
        keepdims=True,
    )
    mean, var, unit = statistics.mean, statistics.var, statistics.unit
    y = normalize_batch(
        x,
        mean,
        var,
        virtual_batch_size=options.virtual_batch_size,
        scale=scale,
        bias=bias,
        epsilon=epsilon,
        dtype=out_dtype,
        unit=unit,
    )
    if not update_running_stats:
        return BatchNormOutput(y, running_mean, running_var)
    new_mean, new_var = _running_update(
        running_mean,
        running_var,
        mean,
        true_variance(statistics),
        _occupied(x, feature_axes, mask, options.virtual_batch_size, axis_name, axis_index_groups),
        momentum,
        ghosts=options.virtual_batch_size is not None,
    )
    return BatchNormOutput(y, new_mean, new_var)


def _occupied(
    x: jnp.ndarray,
    feature_axes: tuple[int, ...],
    mask: jnp.ndarray | None,
    virtual_batch_size: int | None,
    axis_name: str | Sequence[str] | None,
    axis_index_groups: AxisIndexGroups,
) -> jnp.ndarray | None:
    """Whether each feature (of each ghost batch) keeps an element of ``mask`` on any device of
    ``axis_name``, shaped like the keepdims batch statistics; ``None`` without a mask."""
    mask = check_mask(mask, x)
    if mask is None:
        return None
    if virtual_batch_size is not None:
        mask = mask.reshape(x.shape[0] // virtual_batch_size, virtual_batch_size, *x.shape[1:])
        feature_axes = (0, *(a + 1 for a in feature_axes))
    axes = tuple(a for a in range(mask.ndim) if a not in feature_axes)
    count = jnp.sum(mask, axis=axes, keepdims=True, dtype=jnp.int32)
    if axis_name is not None:
        count = lax.psum(count, axis_name, axis_index_groups=axis_index_groups)
    return count > 0


def _running_update(
    running_mean: jnp.ndarray,
    running_var: jnp.ndarray,
    mean: jnp.ndarray,
    var: jnp.ndarray | None,
    occupied: jnp.ndarray | None,
    momentum: float,
    ghosts: bool,
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """``ra = momentum * ra + (1 - momentum) * batch`` in float32 (or wider) whatever the compute dtype,
    stored in the running statistics' dtype. With ``ghosts`` the statistics carry a leading ghost-batch
    axis and the batch value is the mean over the ghost batches. Features (or ghost batches) that keep
    no element of the mask contribute nothing: a feature empty in the whole batch keeps its running
    statistics bit for bit."""
    acc = jnp.promote_types(running_mean.dtype, jnp.float32)
    weights = jnp.ones(mean.shape, acc)
    if occupied is not None:
        weights = jnp.broadcast_to(occupied, mean.shape).astype(acc)
    if ghosts:
        total = jnp.sum(weights, axis=0)
        # each weight over the total before the sum: ghost variances clipped to the dtype's maximum
        # average to it, where their sum overflowed (inf running variance)
        average = lambda stat: jnp.sum(stat * (weights / jnp.maximum(total, 1)), axis=0)
    else:
        total = weights
        average = lambda stat: stat

    def update(running: jnp.ndarray, stat: jnp.ndarray) -> jnp.ndarray:
        batch = average(lax.stop_gradient(stat).astype(acc)).reshape(running.shape)
        ra = running.astype(acc)
        moved = momentum * ra + (1 - momentum) * batch
        return jnp.where(total.reshape(running.shape) > 0, moved, ra).astype(running.dtype)

    new_var = running_var if var is None else update(running_var, var)
    return update(running_mean, mean), new_var


def complex_batch_norm_layer(
    x: jnp.ndarray,
    *,
    running_mean: jnp.ndarray,
    running_var: jnp.ndarray,
    scale: jnp.ndarray | None,
    bias: jnp.ndarray | None,
    use_running_average: bool,
    update_running_stats: bool = True,
    axis: int | Sequence[int] = -1,
    momentum: float = 0.99,
    epsilon: float = 1e-5,
    p: PNorm | float = 2,
    axis_name: str | Sequence[str] | None = None,
    axis_index_groups: AxisIndexGroups = None,
    mask: jnp.ndarray | None = None,
    dtype: jnp.dtype | None = None,
) -> BatchNormOutput:
    """BatchNorm of complex ``x`` as flax computes it (:mod:`jaxnorm.functional.complex_norm`): complex
    mean, real variance ``E|x - mu|^2``; the running mean becomes complex as flax's does. ``p = 2`` only."""
    check_complex_p(p, "BatchNorm")
    momentum, epsilon = check_momentum(momentum), check_epsilon(epsilon)
    feature_axes = canonical_axes(axis, x.ndim, "axis")
    reduce_axes = tuple(a for a in range(x.ndim) if a not in feature_axes)
    shape = _feature_shape(x, feature_axes)
    out_dtype = _output_dtype(dtype, x, scale, bias)
    scale, bias = _expand(scale, shape), _expand(bias, shape)
    mask = check_mask(mask, x)
    count = None
    if use_running_average:
        mean, var = running_mean.reshape(shape), running_var.reshape(shape)
    else:
        if mask is not None:  # once: the masked means and the running update both read it
            count = complex_mask_counts(mask, reduce_axes, axis_name, axis_index_groups)
        mean, var = complex_moments(
            x,
            reduce_axes,
            mask=mask,
            axis_name=axis_name,
            axis_index_groups=axis_index_groups,
            dtype=dtype,
            count=count,
        )
    y = complex_normalize(x, mean, var, epsilon=epsilon, scale=scale, bias=bias, dtype=out_dtype)
    if use_running_average or not update_running_stats:
        return BatchNormOutput(y, running_mean, running_var)
    new_mean = momentum * running_mean + (1 - momentum) * lax.stop_gradient(mean).reshape(running_mean.shape)
    new_var = momentum * running_var + (1 - momentum) * lax.stop_gradient(var).reshape(running_var.shape)
    if count is not None:  # a feature that keeps no element of the mask keeps its running statistics
        occupied = count > 0
        new_mean = jnp.where(occupied.reshape(running_mean.shape), new_mean, running_mean)
        new_var = jnp.where(occupied.reshape(running_var.shape), new_var, running_var)
    return BatchNormOutput(y, new_mean, new_var)


class ComplexReduction(NamedTuple):
    """Where a per-example layer takes the statistics of complex input (:func:`complex_per_example_layer`).

    Attributes:
      layer: the flax layer it stands for ("LayerNorm", "GroupNorm", "RMSNorm"), named in errors.
      axes: the reduced axes of ``x``.
      feature_shape: the broadcast shape of ``scale`` and ``bias``.
      num_groups: group norm's channel groups of the last axis, reduced over too (``None``: none).
      centred: subtract the mean (``False``: RMS norm, ``var = E|x|^2``).
      use_fast_variance: flax's one-pass variance.
      axis_name, axis_index_groups: the devices the statistics are taken over.
    """

    layer: str
    axes: tuple[int, ...]
    feature_shape: tuple[int, ...]
    num_groups: int | None = None
    centred: bool = True
    use_fast_variance: bool = True
    axis_name: str | Sequence[str] | None = None
    axis_index_groups: AxisIndexGroups = None


def complex_per_example_layer(
    x: jnp.ndarray,
    reduction: ComplexReduction,
    *,
    scale: jnp.ndarray | None,
    bias: jnp.ndarray | None,
    epsilon: float,
    p: PNorm | float,
    mask: jnp.ndarray | None,
    dtype: jnp.dtype | None,
) -> jnp.ndarray:
    """Layer / instance / group / RMS norm of complex ``x`` as flax computes it
    (:mod:`jaxnorm.functional.complex_norm`), over ``reduction.axes`` (and, with ``num_groups``, over the
    channels of each group of the last axis). ``p = 2`` only."""
    check_complex_p(p, reduction.layer)
    grouped, axes, num_groups = x, reduction.axes, reduction.num_groups
    if num_groups is not None:  # (..., C) -> (..., G, C / G), reduced over the channels of a group too
        grouped = x.reshape(*x.shape[:-1], num_groups, x.shape[-1] // num_groups)
        mask = None if mask is None else jnp.broadcast_to(mask, x.shape).reshape(grouped.shape)
        axes = (*axes, x.ndim)
    mean, var = complex_moments(
        grouped,
        axes,
        centred=reduction.centred,
        use_fast_variance=reduction.use_fast_variance,
        mask=mask,
        axis_name=reduction.axis_name,
        axis_index_groups=reduction.axis_index_groups,
        dtype=dtype,
    )
    if num_groups is not None:  # each group's statistics on each of its channels
        mean, var = (
            jnp.repeat(a, grouped.shape[-1], axis=-1).reshape(*a.shape[:-2], x.shape[-1]) for a in (mean, var)
        )
    return complex_normalize(
        x,
        mean,
        var,
        epsilon=epsilon,
        scale=_expand(scale, reduction.feature_shape),
        bias=_expand(bias, reduction.feature_shape),
        dtype=_output_dtype(dtype, x, scale, bias),
    )


INSTANCE_BATCH_AXIS_MESSAGE = (
    "The channel axes cannot include the leading dimension as this is assumed to be the batch axis."
)
"""flax's error for an InstanceNorm whose feature axes include axis 0 (the batch axis)."""


def check_instance_feature_axes(feature_axes: tuple[int, ...]) -> None:
    """InstanceNorm's canonical (non-negative) ``feature_axes`` must not include axis 0, with flax's error."""
    if 0 in feature_axes:
        raise ValueError(INSTANCE_BATCH_AXIS_MESSAGE)


def instance_reduction_axes(shape: tuple[int, ...], feature_axes: tuple[int, ...]) -> tuple[int, ...]:
    """InstanceNorm's reduced axes: every axis of an input of ``shape`` but the batch axis 0 and the
    canonical ``feature_axes``; ``ValueError`` where none is left (flax returns zeros; the error named
    ``reduction_axes``, which InstanceNorm does not take)."""
    axes = tuple(a for a in range(1, len(shape)) if a not in feature_axes)
    if not axes:
        raise ValueError(
            f"InstanceNorm: x of shape {tuple(shape)} has no axis to normalize over besides the batch "
            f"axis 0 and the feature axes {feature_axes} (instance norm needs spatial axes, e.g. NHWC)"
        )
    return axes


def layer_norm_layer(
    x: jnp.ndarray,
    *,
    scale: jnp.ndarray | None,
    bias: jnp.ndarray | None,
    reduction_axes: int | Sequence[int] = -1,
    feature_axes: int | Sequence[int] = -1,
    epsilon: float = 1e-6,
    p: PNorm | float = 2,
    axis_name: str | Sequence[str] | None = None,
    axis_index_groups: AxisIndexGroups = None,
    use_fast_variance: bool = True,
    mask: jnp.ndarray | None = None,
    dtype: jnp.dtype | None = None,
) -> jnp.ndarray:
    """LayerNorm / InstanceNorm layer: per-example Lp normalization over ``reduction_axes``, then
    ``scale`` and ``bias`` along ``feature_axes`` (Ba et al. 2016, Sec. 3); complex ``x`` as flax
    (:func:`complex_per_example_layer`)."""
    check_floating(x, "x", allow_complex=True)
    axes = canonical_axes(reduction_axes, x.ndim, "reduction_axes")
    if not axes:  # flax returns zeros (or the bias)
        raise ValueError(
            f"reduction_axes must name at least one axis to normalize over, got {reduction_axes!r}"
        )
    shape = _feature_shape(x, canonical_axes(feature_axes, x.ndim, "feature_axes"))
    if jnp.iscomplexobj(x):
        reduction = ComplexReduction(
            "LayerNorm", axes, shape, use_fast_variance=use_fast_variance, axis_name=axis_name,
            axis_index_groups=axis_index_groups,
        )
        return complex_per_example_layer(
            x, reduction, scale=scale, bias=bias, epsilon=epsilon, p=p, mask=mask, dtype=dtype
        )
    return per_example_norm(
        x,
        axes,
        p=p,
        epsilon=epsilon,
        mask=mask,
        use_fast_variance=use_fast_variance,
        axis_name=axis_name,
        axis_index_groups=axis_index_groups,
        scale=_expand(scale, shape),
        bias=_expand(bias, shape),
        dtype=_output_dtype(dtype, x, scale, bias),
    )


def group_norm_layer(
    x: jnp.ndarray,
    *,
    scale: jnp.ndarray | None,
    bias: jnp.ndarray | None,
    num_groups: int | None = 32,
    group_size: int | None = None,
    reduction_axes: int | Sequence[int] | None = None,
    epsilon: float = 1e-6,
    p: PNorm | float = 2,
    axis_name: str | Sequence[str] | None = None,
    axis_index_groups: AxisIndexGroups = None,
    use_fast_variance: bool = True,
    mask: jnp.ndarray | None = None,
    dtype: jnp.dtype | None = None,
) -> jnp.ndarray:
    """GroupNorm layer (Wu & He 2018, Eq. 1-3), channels last, Lp dispersion; see
    :func:`jaxnorm.functional.group_norm` for the per-channel-then-group reduction; complex ``x`` as
    flax (:func:`complex_per_example_layer`)."""
    check_floating(x, "x", allow_complex=True)
    groups = num_groups_of(x.shape[-1], num_groups, group_size)
    if reduction_axes is None:
        axes = tuple(range(1, x.ndim - 1))
    else:
        axes = canonical_axes(reduction_axes, x.ndim, "reduction_axes")
        if axes[-1] != x.ndim - 1:
            raise ValueError(f"reduction_axes={reduction_axes!r} must include the last (channel) axis")
        axes = axes[:-1]
    shape = _feature_shape(x, (x.ndim - 1,))
    if jnp.iscomplexobj(x):
        reduction = ComplexReduction(
            "GroupNorm", axes, shape, num_groups=groups, use_fast_variance=use_fast_variance,
            axis_name=axis_name, axis_index_groups=axis_index_groups,
        )
        return complex_per_example_layer(
            x, reduction, scale=scale, bias=bias, epsilon=epsilon, p=p, mask=mask, dtype=dtype
        )
    return per_example_norm(
        x,
        axes,
        p=p,
        epsilon=epsilon,
        mask=mask,
        use_fast_variance=use_fast_variance,
        groups=ChannelGroups(channel_axis=x.ndim - 1, num_groups=groups),
        axis_name=axis_name,
        axis_index_groups=axis_index_groups,
        scale=_expand(scale, shape),
        bias=_expand(bias, shape),
        dtype=_output_dtype(dtype, x, scale, bias),
    )


def rms_norm_layer(
    x: jnp.ndarray,
    *,
    scale: jnp.ndarray | None,
    reduction_axes: int | Sequence[int] = -1,
    feature_axes: int | Sequence[int] = -1,
    epsilon: float = 1e-6,
    axis_name: str | Sequence[str] | None = None,
    axis_index_groups: AxisIndexGroups = None,
    mask: jnp.ndarray | None = None,
    dtype: jnp.dtype | None = None,
) -> jnp.ndarray:
    """RMSNorm layer (Zhang & Sennrich 2019, Eq. 4): ``x * rsqrt(mean(x^2) + epsilon) * scale``; complex
    ``x`` as flax, with ``mean |x|^2`` (:func:`complex_per_example_layer`)."""
    # before the cast to the compute dtype, which would hide an integer x
    check_floating(x, "x", allow_complex=True)
    shape = _feature_shape(x, canonical_axes(feature_axes, x.ndim, "feature_axes"))
    reduction_axes = canonical_axes(reduction_axes, x.ndim, "reduction_axes")
    if jnp.iscomplexobj(x):
        reduction = ComplexReduction(
            "RMSNorm", reduction_axes, shape, centred=False, axis_name=axis_name,
            axis_index_groups=axis_index_groups,
        )
        return complex_per_example_layer(
            x, reduction, scale=scale, bias=None, epsilon=epsilon, p=2, mask=mask, dtype=dtype
        )
    compute_dtype = jnp.promote_types(x.dtype, jnp.float32)
    if scale is not None:
        compute_dtype = jnp.promote_types(compute_dtype, scale.dtype)
    y = rms_norm(
        x.astype(compute_dtype),
        axis=reduction_axes,
        epsilon=epsilon,
        axis_name=axis_name,
        axis_index_groups=axis_index_groups,
        mask=mask,
        scale=_expand(scale, shape),
    )
    return y.astype(_output_dtype(dtype, x, scale))
