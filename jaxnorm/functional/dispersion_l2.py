"""The L2 dispersion, ``sigma_hat = sqrt(M2 / n)``: the biased standard deviation that flax and PyTorch
use (Ioffe & Szegedy, *Batch normalization*, ICML 2015, Alg. 1).

Count, mean and ``M2`` come from :func:`jaxnorm.functional.moments.local_moments` (stable shifted sums),
merged over the channels of a group and over devices with Chan et al.'s formula: one collective, an
all-gather of count, mean and M2 (:func:`jaxnorm.functional.collectives.gather_combine`). Groups whose
variance (or mean) leaves :func:`~jaxnorm.functional.units.in_range` are computed again on ``x * unit``
(:mod:`jaxnorm.functional.units`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from jaxnorm.functional.collectives import gather_combine, psum_flat
from jaxnorm.functional.moments import (
    Moments,
    element_count,
    group_combine,
    local_moments,
    mean_m2_unit,
    stats_dtype,
)
from jaxnorm.functional.options import BatchOptions
from jaxnorm.functional.reduction import Reduction, empty_statistics, masked_mean
from jaxnorm.functional.units import (
    Statistics,
    in_range,
    lift_tiny,
    refine_variance,
    statistics_in_units_where_needed,
    underflows,
    unit_deviations,
)

__all__ = ["l2_statistics"]


def l2_statistics(r: Reduction, options: BatchOptions) -> Statistics:
    """``(mean, M2 / n, unit)`` of ``r.x`` over ``r.axes``, keepdims; the variance itself, not the square
    of its root, and ``unit = 1`` except in groups whose variance leaves ``in_range`` (then the statistics of
    ``x * unit``, :mod:`jaxnorm.functional.units`, the unit refined to ``sigma_hat * unit`` in ``[16, 32)``:
    :func:`~jaxnorm.functional.units.refine_variance`) and, with ``options.tiny_groups``, in groups whose
    variance is tiny (then the same variance in :func:`~jaxnorm.functional.units.tiny_unit`,
    :func:`~jaxnorm.functional.units.lift_tiny`). A constant group has an exact mean and ``M2 = 0``
    (the shifted-data pass of :func:`~jaxnorm.functional.moments.local_moments`).

    Groups that need no merge (no channel groups, no devices) find their unit inside the conditional
    that already takes the careful pass (:func:`~jaxnorm.functional.moments.mean_m2_unit`); merged
    groups are checked after the merge over channels and devices, so the choice is the same on every
    device that shares the statistics, and only then (a :func:`jax.lax.cond`) taken again in the unit.
    The derivatives are the exact ones for either branch, written out as a custom JVP,
    ``d mean = sum(dx) / n`` and ``d var = 2 sum((x - mean) unit * dx unit) / n``, so that the backward
    pass holds no conditional; ``sigma_hat = sqrt(var) / unit`` of ``x`` itself
    (:attr:`~jaxnorm.functional.units.Statistics.sigma`) has ``d sigma_hat = sum((x - mean) unit * dx) /
    (n sqrt(var))``, no factor ``1 / unit`` formed (a constant group: 0).
    """
    layout = r._replace(x=None, deviations=None, mask=None)
    _, mean, var, unit, sigma = _l2_with_unit(r.x, r.mask, layout, options)
    # the unit is a constant for differentiation: a symbolic zero tangent, not an array of zeros that
    # the normalization would multiply by the input
    return Statistics(mean, var, lax.stop_gradient(unit), sigma)


def _l2_in_unit(
    x: jnp.ndarray, mask: jnp.ndarray | None, layout: Reduction, options: BatchOptions
) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """``(count, mean, M2 / n)`` of ``x`` merged over groups and devices (empty groups: 0 and 1)."""
    moments = local_moments(x, layout.axes, mask=mask, with_m2=True, one_pass=options.use_fast_variance)
    moments = group_combine(moments, layout.groups)
    if layout.axis_name is not None:
        moments, _, _ = gather_combine(moments, layout.axis_name, layout.axis_index_groups)
    moments = masked_mean(moments, mask)
    var = moments.m2 / jnp.maximum(moments.count, 1)
    return moments.count, moments.mean, empty_statistics(var, moments.count, mask)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3))
def _l2_with_unit(
    x: jnp.ndarray, mask: jnp.ndarray | None, layout: Reduction, options: BatchOptions
) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """``(count, mean, var, unit, sigma_hat)``; see :func:`l2_statistics`."""
    if layout.groups is None and layout.axis_name is None:
        count, mean, var, unit = _local_l2(x, mask, layout.axes, options)
    else:
        count, mean, var, unit = _merged_l2(x, mask, layout, options)
    if options.tiny_groups:
        var, unit = lift_tiny(var, unit)
    var, unit = refine_variance(var, unit)
    return count, mean, var, unit, jnp.sqrt(var) / unit


def _merged_l2(
    x: jnp.ndarray, mask: jnp.ndarray | None, layout: Reduction, options: BatchOptions
) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """``(count, mean, var, unit)`` of groups merged over channels or devices, the unit chosen after
    the merge (:func:`~jaxnorm.functional.units.statistics_in_units_where_needed`)."""
    count, mean, var = _l2_in_unit(x, mask, layout, options)
    underflowing = (count > 0) & underflows(var) if options.tiny_groups else None

    def in_unit(unit: float | jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
        return _l2_in_unit(x.astype(var.dtype) * unit, mask, layout, options)[1:]

    # the count stays outside the conditional: a constant where there is no mask
    return count, *statistics_in_units_where_needed((mean, var), in_range(mean, var), underflowing, in_unit)


def _local_l2(
    x: jnp.ndarray, mask: jnp.ndarray | None, axes: tuple[int, ...], options: BatchOptions
) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """``(count, mean, var, unit)`` of groups that need no merge: the unit is chosen inside the
    conditional that already takes the careful pass (:func:`~jaxnorm.functional.moments.mean_m2_unit`)."""
    count = element_count(x, axes, mask)
    mean, m2, unit = mean_m2_unit(x, count, mask, axes, options.use_fast_variance, True, options.tiny_groups)
    moments = masked_mean(Moments(count, mean, m2), mask)
    var = empty_statistics(moments.m2 / jnp.maximum(count, 1), count, mask)
    return count, moments.mean, var, unit


@_l2_with_unit.defjvp
def _l2_with_unit_jvp(layout, options, primals, tangents):
    x, mask = primals
    primals_out = _l2_with_unit(x, mask, layout, options)
    count, mean, var, unit, _ = primals_out
    dtype = stats_dtype(x)
    x_dot = tangents[0].astype(dtype)
    deviation = unit_deviations(x.astype(dtype), mean, unit)
    if mask is not None:
        x_dot, deviation = jnp.where(mask, x_dot, 0), jnp.where(mask, deviation, 0)
    # sigma_hat's: the deviations over sqrt(var) first, numbers of order 1, so that neither the tangent
    # nor its transpose forms the cotangent's product with 1 / sqrt(var) (2^40 in a huge group)
    standardized = deviation / jnp.where(var > 0, jnp.sqrt(var), 1)
    sums = tuple(
        layout.group_sum(jnp.sum(a, layout.axes, keepdims=True))
        for a in (x_dot, deviation * (x_dot * unit), standardized * x_dot)
    )
    if layout.axis_name is not None:
        sums = psum_flat(sums, layout.axis_name, layout.axis_index_groups)
    per_element = 1 / jnp.maximum(count, 1)
    zero = jnp.zeros_like(count), jnp.zeros_like(unit)
    tangents = (zero[0], sums[0] * per_element, 2 * sums[1] * per_element, zero[1], sums[2] * per_element)
    return primals_out, tangents
