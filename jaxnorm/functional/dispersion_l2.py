"""The L2 dispersion, ``sigma_hat = sqrt(M2 / n)``: the biased standard deviation that flax and PyTorch
use (Ioffe & Szegedy, *Batch normalization*, ICML 2015, Alg. 1).

Count, mean and ``M2`` come from :func:`jaxnorm.functional.moments.local_moments` (stable shifted sums),
merged over the channels of a group and over devices with Chan et al.'s formula: one collective, an
all-gather of count, mean and M2 (:func:`jaxnorm.functional.collectives.gather_combine`). Where a group's
variance is huge (``sigma_hat > 2**(maxexp / 4)``: 4.3e9 in float32, or its square overflowed), a
:func:`jax.lax.cond` recomputes the moments of ``x / unit`` with ``unit`` the power of two above the
group's ``max |x|`` (:mod:`jaxnorm.functional.units`); ordinary input takes the first branch only.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from jaxnorm.functional.collectives import gather_combine
from jaxnorm.functional.moments import Moments, group_combine, group_reduce, local_moments, stats_dtype
from jaxnorm.functional.options import BatchOptions
from jaxnorm.functional.reduction import Reduction, Statistics, empty_statistics, masked_mean
from jaxnorm.functional.units import largest_plain_sigma, power_of_two_above, squared_in_units

__all__ = ["l2_statistics"]


def l2_statistics(r: Reduction, options: BatchOptions) -> Statistics:
    """``(mean, M2 / n)`` of ``r.x`` over ``r.axes``, keepdims; the variance itself, not the square of
    its root. A constant group has an exact mean and ``M2 = 0`` (the shifted-data pass of
    :func:`~jaxnorm.functional.moments.local_moments`)."""
    moments = _moments(r.x, r, options)
    var = moments.m2 / jnp.maximum(moments.count, 1)
    if r.axis_name is not None:
        # (no recomputation across devices: its collective cannot sit in a branch)
        var, unit = squared_in_units(jnp.sqrt(var))
        return Statistics(moments.mean, empty_statistics(var, moments.count, r.mask), unit)
    plain = var <= largest_plain_sigma(var.dtype) ** 2  # False for inf and NaN too
    ones = jnp.ones_like(var)
    return lax.cond(
        jnp.all(plain),
        lambda: Statistics(moments.mean, empty_statistics(var, moments.count, r.mask), ones),
        lambda: _scaled_statistics(r, options, plain),
    )


def _moments(x: jnp.ndarray, r: Reduction, options: BatchOptions) -> Moments:
    moments = local_moments(x, r.axes, mask=r.mask, with_m2=True, one_pass=options.use_fast_variance)
    moments = group_combine(moments, r.groups)
    if r.axis_name is not None:
        moments, _, _ = gather_combine(moments, r.axis_name, r.axis_index_groups)
    return masked_mean(moments, r.mask)


def _scaled_statistics(r: Reduction, options: BatchOptions, plain: jnp.ndarray) -> Statistics:
    """The statistics of ``x / unit``, ``unit`` the power of two above each huge group's ``max |x|``
    (1 for the others): exact scaling, no square above ``unit**2``."""
    values = r.x.astype(stats_dtype(r.x))
    magnitude = jnp.abs(values) if r.mask is None else jnp.where(r.mask, jnp.abs(values), 0)
    largest = group_reduce(jnp.max(magnitude, r.axes, keepdims=True), r.groups, jnp.max)
    unit = lax.stop_gradient(jnp.where(plain, 1, power_of_two_above(largest)).astype(values.dtype))
    moments = _moments(values / unit, r, options)
    var = moments.m2 / jnp.maximum(moments.count, 1)
    return Statistics(moments.mean * unit, empty_statistics(var, moments.count, r.mask), unit)
