"""Per-example normalizations with an Lp dispersion: layer (Ba, Kiros & Hinton 2016, Sec. 3), group (Wu &
He, ECCV 2018, Eq. 1-3), instance (Ulyanov et al. 2016) and RMS norm (Zhang & Sennrich 2019, Eq. 4).

Each is ``(x - mu) * rsqrt(sigma_hat^2 + epsilon)`` over its own reduction, with the dispersion of
:mod:`jaxnorm.functional.dispersion` (``p = 2`` is the usual variance) and :func:`~jaxnorm.functional.
normalize.normalize`; layer and RMS norm over the last axis alone take :mod:`.last_axis`. Outputs have the
dtype of ``x``, statistics are float32 (or float64).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxnorm.functional.checks import (
    PNorm,
    canonical_axes,
    canonical_p,
    check_axis_name,
    check_bool,
    check_broadcasts,
    check_epsilon,
    check_floating,
    check_mask,
    num_groups_of,
)
from jaxnorm.functional.collectives import AxisIndexGroups
from jaxnorm.functional.dispersion import dispersion_statistics
from jaxnorm.functional.last_axis import last_axis_norm
from jaxnorm.functional.moments import ChannelGroups, stats_dtype, widened_float16
from jaxnorm.functional.normalize import normalize
from jaxnorm.functional.options import BatchOptions
from jaxnorm.functional.per_example_l2 import L2Groups, l2_normalize
from jaxnorm.functional.units import (
    Statistics,
    in_range,
    inverse_std,
    lift_tiny,
    needs_tiny_unit,
    refine_variance,
    statistics_in_units_where_needed,
    underflows,
)

__all__ = ["group_norm", "instance_norm", "layer_norm", "per_example_norm", "rms_norm"]


def per_example_norm(
    x: jnp.ndarray,
    axes: tuple[int, ...],
    *,
    p: PNorm | float,
    epsilon: float,
    mask: jnp.ndarray | None,
    use_fast_variance: bool,
    groups: ChannelGroups | None = None,
    axis_name: str | Sequence[str] | None = None,
    axis_index_groups: AxisIndexGroups = None,
    scale: jnp.ndarray | None = None,
    bias: jnp.ndarray | None = None,
    dtype: jnp.dtype | None = None,
) -> jnp.ndarray:
    """Lp normalization of ``x`` over ``axes`` (per example; ``groups`` merges channels), then the
    optional ``scale`` and ``bias`` (broadcastable to ``x``): the path of layer, group and instance norm."""
    p = canonical_p(p)
    epsilon = check_epsilon(epsilon)
    use_fast_variance = check_bool(use_fast_variance, "use_fast_variance")
    check_axis_name(axis_name)
    mask = check_mask(mask, x)
    check_broadcasts(scale, x.shape, "scale")
    check_broadcasts(bias, x.shape, "bias")
    dtype = x.dtype if dtype is None else dtype
    tiny_groups = needs_tiny_unit(epsilon, stats_dtype(x))
    # the kernels with their own derivative keep no underflowing group in a unit: epsilon = 0 takes the
    # general path
    if p == 2 and mask is None and axis_name is None and not tiny_groups:
        ones = jnp.ones((), stats_dtype(x))
        scale = ones if scale is None else scale
        bias = jnp.zeros((), ones.dtype) if bias is None else bias
        if axes == (x.ndim - 1,) and groups is None:
            y = last_axis_norm(x, scale, bias, epsilon)
        else:
            y = l2_normalize(
                widened_float16(x), scale, bias, L2Groups(axes, groups, epsilon, use_fast_variance)
            )
        return y.astype(dtype)
    x = widened_float16(x)
    options = BatchOptions(p=p, use_fast_variance=use_fast_variance, tiny_groups=tiny_groups)
    statistics = dispersion_statistics(
        x, axes, options, mask=mask, groups=groups, axis_name=axis_name, axis_index_groups=axis_index_groups
    )
    affine = dict(scale=scale, bias=bias, epsilon=epsilon, dtype=dtype, unit=statistics.unit)
    return normalize(x, statistics.mean, statistics.var, **affine)


def layer_norm(
    x: jnp.ndarray,
    *,
    p: PNorm | float = 2,
    axis: int | Sequence[int] = -1,
    epsilon: float = 1e-5,
    mask: jnp.ndarray | None = None,
    axis_name: str | Sequence[str] | None = None,
    axis_index_groups: AxisIndexGroups = None,
    use_fast_variance: bool = True,
) -> jnp.ndarray:
    """Layer normalization (Ba et al. 2016, Sec. 3) with an Lp dispersion: per example over ``axis``.

    ``y = (x - mu) / sqrt(sigma_hat^2 + epsilon)`` with ``mu``, ``sigma_hat`` over the axes in ``axis``
    (int or tuple) — the reduction axes, as flax's ``reduction_axes``. ``axis_name`` reduces over a
    mapped axis too (features sharded across devices).
    """
    check_floating(x, "x")
    axes = canonical_axes(axis, x.ndim, "axis")
    if not axes:
        raise ValueError(f"axis must name at least one axis to normalize over, got {axis!r}")
    return per_example_norm(
        x,
        axes,
        p=p,
        epsilon=epsilon,
        mask=mask,
        use_fast_variance=use_fast_variance,
        axis_name=axis_name,
        axis_index_groups=axis_index_groups,
    )


def group_norm(
    x: jnp.ndarray,
    num_groups: int,
    *,
    p: PNorm | float = 2,
    epsilon: float = 1e-5,
    mask: jnp.ndarray | None = None,
    use_fast_variance: bool = True,
) -> jnp.ndarray:
    """Group normalization (Wu & He 2018, Eq. 1-3) with an Lp dispersion, channels last.

    The ``C`` channels are split into ``num_groups`` contiguous groups; statistics are taken per example
    and group over all non-batch axes. Computed as per-channel reductions over the spatial axes followed
    by a merge of the ``C / num_groups`` channels of each group (Chan's formula for ``p = 2``, a sum or
    max for ``p = 1`` / ``inf``): the large reduction keeps the contiguous channel axis instead of
    reshaping to ``(..., G, C / G)`` first (measured in ``docs/benchmarks.md``).
    """
    check_floating(x, "x")
    if x.ndim < 2:
        raise ValueError(f"group_norm needs (batch, ..., channels) input, got shape {x.shape}")
    num_groups = num_groups_of(x.shape[-1], num_groups, None)
    spatial = tuple(range(1, x.ndim - 1))
    return per_example_norm(
        x,
        spatial,
        p=p,
        epsilon=epsilon,
        mask=mask,
        use_fast_variance=use_fast_variance,
        groups=ChannelGroups(channel_axis=x.ndim - 1, num_groups=num_groups),
    )


def instance_norm(
    x: jnp.ndarray,
    *,
    p: PNorm | float = 2,
    epsilon: float = 1e-5,
    mask: jnp.ndarray | None = None,
    use_fast_variance: bool = True,
) -> jnp.ndarray:
    """Instance normalization (Ulyanov et al. 2016): per example and channel over the spatial axes.

    Channels last: ``x`` is ``(batch, *spatial, channels)`` with at least one spatial axis.
    """
    check_floating(x, "x")
    if x.ndim < 3:
        raise ValueError(f"instance_norm needs (batch, *spatial, channels) input, got shape {x.shape}")
    return per_example_norm(
        x,
        tuple(range(1, x.ndim - 1)),
        p=p,
        epsilon=epsilon,
        mask=mask,
        use_fast_variance=use_fast_variance,
    )


def rms_norm(
    x: jnp.ndarray,
    *,
    axis: int | Sequence[int] = -1,
    epsilon: float = 1e-6,
    axis_name: str | Sequence[str] | None = None,
    axis_index_groups: AxisIndexGroups = None,
    mask: jnp.ndarray | None = None,
    scale: jnp.ndarray | None = None,
) -> jnp.ndarray:
    """RMS normalization (Zhang & Sennrich 2019, Eq. 4): ``y = x / sqrt(mean(x^2) + epsilon)`` over ``axis``.

    The mean square is float32 (or wider), over the True elements of ``mask`` if given, and, with
    ``axis_name``, averaged over a mapped axis. ``scale`` (broadcastable to ``x``; the gain ``g`` of
    Eq. 4) gives ``y * scale``, computed as ``x * (rsqrt(mean(x^2) + epsilon) * scale)``: one product
    per element with a broadcast factor.
    """
    check_floating(x, "x")
    axes = canonical_axes(axis, x.ndim, "axis")
    if not axes:
        raise ValueError(f"axis must name at least one axis to normalize over, got {axis!r}")
    epsilon = check_epsilon(epsilon)
    check_axis_name(axis_name)
    mask = check_mask(mask, x)
    check_broadcasts(scale, x.shape, "scale")
    x32 = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    tiny_groups = needs_tiny_unit(epsilon, x32.dtype)
    # the last-axis kernel keeps no underflowing row in a unit: epsilon = 0 takes the general path
    if axes == (x.ndim - 1,) and mask is None and axis_name is None and not tiny_groups:
        ones = jnp.ones((), x32.dtype)
        y = last_axis_norm(x32, ones if scale is None else scale, jnp.zeros((), x32.dtype), epsilon, False)
        return y.astype(x.dtype)
    reduction = _SquareReduction(axes, axis_name, axis_index_groups, tiny_groups)
    mean_square, unit = _mean_square_in_unit(x32, mask, reduction)
    inv = inverse_std(Statistics(jnp.zeros((), x32.dtype), mean_square, unit), epsilon)
    return ((x32 * unit) * (inv if scale is None else inv * scale)).astype(x.dtype)


class _SquareReduction(NamedTuple):
    """Where RMS norm's mean square is taken: ``axes``, and the devices of ``axis_name``; whether tiny
    rows are kept in a unit (:func:`~jaxnorm.functional.units.needs_tiny_unit`)."""

    axes: tuple[int, ...]
    axis_name: str | Sequence[str] | None
    axis_index_groups: AxisIndexGroups
    tiny_groups: bool = False


def _masked_mean(values: jnp.ndarray, mask: jnp.ndarray | None, r: _SquareReduction, empty: float):
    """The mean of ``values`` over the True elements of ``mask`` on every device of ``r.axis_name``
    together (the sums and counts summed across devices, so unequal masks weigh each element once),
    ``empty`` for a row without elements."""
    if mask is None:
        mean = jnp.mean(values, axis=r.axes, keepdims=True)
        if r.axis_name is not None:
            mean = lax.pmean(mean, r.axis_name, axis_index_groups=r.axis_index_groups)
        return mean
    count = jnp.sum(mask, axis=r.axes, keepdims=True, dtype=values.dtype)
    total = jnp.sum(jnp.where(mask, values, 0), axis=r.axes, keepdims=True)
    if r.axis_name is not None:
        total, count = lax.psum((total, count), r.axis_name, axis_index_groups=r.axis_index_groups)
    return jnp.where(count > 0, total / jnp.maximum(count, 1), empty)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _mean_square_in_unit(
    x: jnp.ndarray, mask: jnp.ndarray | None, r: _SquareReduction
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """``(mean((x * unit)^2), unit)`` per row (a row without elements: mean square 1, no amplification,
    as in batch norm): ``unit = 1`` except where the mean square of ``x`` leaves the dtype's range
    (:func:`~jaxnorm.functional.units.in_range`), taken again on ``x * unit`` behind a
    :func:`jax.lax.cond` (refined, :func:`~jaxnorm.functional.units.refine_variance`), and, with
    ``r.tiny_groups``, in :func:`~jaxnorm.functional.units.tiny_unit`
    where it is tiny (:func:`~jaxnorm.functional.units.lift_tiny`). Derivative (custom JVP, no
    conditional in the backward pass): ``d mean((x u)^2) = 2 mean(x u * dx u)``."""
    mean_square = _masked_mean(jnp.square(x), mask, r, 1)
    underflowing = underflows(mean_square) if r.tiny_groups else None
    zero = jnp.zeros_like(mean_square)  # RMS norm has no mean: the statistics are (0, mean square)

    def in_unit(unit: float | jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
        # (a row of zeros stays in unit 1 after the rescue, where epsilon's floor bounds it)
        return zero, _masked_mean(jnp.square(x * unit), mask, r, 1)

    plain = (zero, mean_square)
    _, mean_square, unit = statistics_in_units_where_needed(
        plain, in_range(mean_square, mean_square), underflowing, in_unit
    )
    mean_square, unit = refine_variance(mean_square, unit)
    return lift_tiny(mean_square, unit) if r.tiny_groups else (mean_square, unit)


@_mean_square_in_unit.defjvp
def _mean_square_in_unit_jvp(r, primals, tangents):
    x, mask = primals
    mean_square, unit = _mean_square_in_unit(x, mask, r)
    tangent = 2 * _masked_mean((x * unit) * (tangents[0] * unit), mask, r, 0)
    return (mean_square, unit), (tangent, jnp.zeros_like(unit))
