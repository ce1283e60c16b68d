"""The L2 dispersion, ``sigma_hat = sqrt(M2 / n)``: the biased standard deviation that flax and PyTorch
use (Ioffe & Szegedy, *Batch normalization*, ICML 2015, Alg. 1).

Count, mean and ``M2`` come from :func:`jaxnorm.functional.moments.local_moments` (stable shifted sums),
merged over the channels of a group and over devices with Chan et al.'s formula: one collective, an
all-gather of count, mean and M2 (:func:`jaxnorm.functional.collectives.gather_combine`). On one device,
where a group's variance is huge (``sigma_hat > 2**(maxexp / 4)``: 4.3e9 in float32, or its square
overflowed), a :func:`jax.lax.cond` recomputes the moments of ``x / unit`` with ``unit`` the power of two
above the group's ``max |x|`` (:mod:`jaxnorm.functional.units`); ordinary input takes the first branch
only, and the derivative is written out (:func:`_statistics_in_units`), so the branch is never
differentiated.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from jaxnorm.functional.collectives import gather_combine
from jaxnorm.functional.moments import (
    ChannelGroups,
    Moments,
    group_combine,
    group_reduce,
    local_moments,
    stats_dtype,
)
from jaxnorm.functional.options import BatchOptions
from jaxnorm.functional.platform import distinct
from jaxnorm.functional.reduction import Reduction, Statistics, empty_statistics, masked_mean
from jaxnorm.functional.units import largest_plain_sigma, power_of_two_above

__all__ = ["l2_statistics"]


def l2_statistics(r: Reduction, options: BatchOptions) -> Statistics:
    """``(mean, M2 / n)`` of ``r.x`` over ``r.axes``, keepdims, in units (:class:`Statistics`); the
    variance itself, not the square of its root. A constant group has an exact mean and ``M2 = 0`` (the
    shifted-data pass of :func:`~jaxnorm.functional.moments.local_moments`)."""
    if r.axis_name is None:
        mean, var, unit, count, _, _ = _statistics_in_units(
            r.x, r.mask, r.axes, r.groups, options.use_fast_variance
        )
        return Statistics(mean, empty_statistics(var, count, r.mask), unit)
    # across devices no recomputation (its collective cannot sit in a branch): a finite variance is
    # expressed in units, an overflowed one stays inf
    moments = _moments(r.x, r.mask, r.axes, r.groups, options.use_fast_variance)
    moments, _, _ = gather_combine(moments, r.axis_name, r.axis_index_groups)
    moments = masked_mean(moments, r.mask)
    var = moments.m2 / jnp.maximum(moments.count, 1)
    plain = var <= largest_plain_sigma(var.dtype) ** 2
    unit = lax.stop_gradient(jnp.where(plain, 1, power_of_two_above(jnp.sqrt(var))).astype(var.dtype))
    return Statistics(moments.mean, empty_statistics(var / unit / unit, moments.count, r.mask), unit)


def _moments(x, mask, axes, groups, one_pass) -> Moments:
    moments = local_moments(x, axes, mask=mask, with_m2=True, one_pass=one_pass)
    return group_combine(moments, groups)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3, 4))
def _statistics_in_units(
    x: jnp.ndarray,
    mask: jnp.ndarray | None,
    axes: tuple[int, ...],
    groups: ChannelGroups | None,
    one_pass: bool,
) -> tuple[jnp.ndarray, ...]:
    """``(mean, var, unit, count, channel_mean, channel_count)`` of each group on one device:
    ``var = M2 / (n unit**2)`` with ``unit = 1`` unless the group's variance is huge (then the power of
    two above its ``max |x|``); the per-channel mean and count before the merge of a group's channels.

    Custom JVP, the exact derivative whatever the branch: ``d mean = sum(dx) / n`` and
    ``d var = 2 sum((x - mean) dx) / (n unit**2)`` over the unmasked elements of the group, taken per
    channel and merged as Chan's formula is differentiated (``2 sum_c n_c (m_c - m) (dm_c - dm)``).
    """
    local = local_moments(x, axes, mask=mask, with_m2=True, one_pass=one_pass)
    moments = masked_mean(group_combine(local, groups), mask)
    var = moments.m2 / jnp.maximum(moments.count, 1)
    plain = var <= largest_plain_sigma(var.dtype) ** 2  # False for inf and NaN too
    mean, var, unit, channel_mean = lax.cond(
        jnp.all(plain),
        lambda: (moments.mean, var, jnp.ones_like(var), local.mean),
        lambda: _scaled(x, mask, axes, groups, one_pass, plain),
    )
    return mean, var, unit, moments.count, channel_mean, local.count


def _scaled(x, mask, axes, groups, one_pass, plain) -> tuple[jnp.ndarray, ...]:
    """Mean, variance in units, the units and the channel means: the moments of ``x / unit``, ``unit``
    the power of two above each huge group's ``max |x|`` (1 for the others); exact scaling, no square
    above ``unit**2``."""
    values = x.astype(stats_dtype(x))
    magnitude = jnp.abs(values) if mask is None else jnp.where(mask, jnp.abs(values), 0)
    largest = group_reduce(jnp.max(magnitude, axes, keepdims=True), groups, jnp.max)
    unit = jnp.where(plain, 1, power_of_two_above(largest)).astype(values.dtype)
    local = local_moments(values / unit, axes, mask=mask, with_m2=True, one_pass=one_pass)
    moments = masked_mean(group_combine(local, groups), mask)
    var = moments.m2 / jnp.maximum(moments.count, 1)
    return moments.mean * unit, var, unit, local.mean * unit


@_statistics_in_units.defjvp
def _statistics_in_units_jvp(axes, groups, one_pass, primals, tangents):
    x, mask = primals
    out = _statistics_in_units(x, mask, axes, groups, one_pass)
    mean, _, unit, count, channel_mean, channel_count = out
    values_dot = tangents[0].astype(mean.dtype)
    values_dot = values_dot if mask is None else jnp.where(mask, values_dot, 0)
    # in units: (x - mean) / unit stays finite, and so does the transpose's factor 1 / unit (1 / unit**2
    # would underflow to 0 on huge groups)
    per_unit = 1 / unit
    channel_total = jnp.sum(values_dot, axis=axes, keepdims=True)
    # a distinct copy of the mean: ``x - mean`` is then not shared with the caller's ``x - mean``,
    # which XLA would write to memory rather than recompute inside each of the two reductions
    deviation = (x.astype(mean.dtype) - distinct(channel_mean, tag=1)) * per_unit
    m2_dot = 2 * jnp.sum(deviation * values_dot, axis=axes, keepdims=True)
    mean_dot = group_reduce(channel_total, groups, jnp.sum) / jnp.maximum(count, 1)
    channel_mean_dot = channel_total / jnp.maximum(channel_count, 1)
    if groups is not None:
        between = channel_count * (channel_mean - mean) * per_unit * (channel_mean_dot - mean_dot)
        m2_dot = m2_dot + 2 * between
    var_dot = group_reduce(m2_dot, groups, jnp.sum) * per_unit / jnp.maximum(count, 1)
    zeros = jnp.zeros_like
    tangents_out = (mean_dot, var_dot, zeros(unit), zeros(count), channel_mean_dot, zeros(channel_count))
    return out, tangents_out
