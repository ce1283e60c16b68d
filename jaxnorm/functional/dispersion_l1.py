"""The L1 dispersion, ``sigma_hat = sqrt(pi / 2) * mean|x - mu|`` (Hoffer et al., *Norm matters*,
NeurIPS 2018, Sec. 3; the constant makes it the standard deviation on Gaussian data).

``sum |x - mu|`` needs the mean first: one pass for the mean ``m``, one over the deviations, which also
gives the shifted-data correction ``sum (x - m)`` of the mean (exact for a constant group) and the sign
balance that moves ``sum |x - m|`` to the corrected mean. Across devices the mean travels in the
moments' all-gather and the three sums of the deviation pass in one ``psum``: two collectives.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

from jaxnorm.functional.calibration import L1_CONSTANT
from jaxnorm.functional.collectives import gather_combine, psum_flat
from jaxnorm.functional.moments import (
    CONDITION_LIMIT,
    Moments,
    group_combine,
    keepdims_shape,
    local_moments,
)
from jaxnorm.functional.options import BatchOptions
from jaxnorm.functional.platform import distinct, per_platform, separate_reads
from jaxnorm.functional.reduction import (
    Reduction,
    deviation_sum,
    empty_statistics,
    masked_mean,
)
from jaxnorm.functional.units import Statistics, variance_in_unit

__all__ = ["abs_deviation_sum", "l1_statistics"]


def l1_statistics(r: Reduction, options: BatchOptions) -> Statistics:
    """``(mean, sigma_hat**2, unit)`` with the L1 ``sigma_hat``, keepdims (the variance in a unit where it
    is huge, :func:`~jaxnorm.functional.units.variance_in_unit`); the mean exact for constant groups."""
    moments_source, deviations = separate_reads(r.x, 2)
    r = r._replace(deviations=deviations)
    local = local_moments(moments_source, r.axes, mask=r.mask, with_m2=False)
    moments = group_combine(local, r.groups)
    if r.axis_name is None:
        moments = masked_mean(moments, r.mask)
        dispersion, correction = _local_dispersion(moments, r)
    else:
        # this device's element count per group: the derivative of its share of sum |x - mu|
        local_count = r.group_sum(jnp.broadcast_to(local.count, keepdims_shape(r.x, r.axes)))
        moments, _, _ = gather_combine(moments, r.axis_name, r.axis_index_groups)
        moments = masked_mean(moments, r.mask)
        dispersion, correction = _cross_device_dispersion(moments, local_count, r)
    mean = masked_mean(moments._replace(mean=moments.mean + correction), r.mask).mean
    var, unit, sigma = variance_in_unit(dispersion, options.tiny_groups)
    var, sigma = (empty_statistics(a, moments.count, r.mask) for a in (var, sigma))
    return Statistics(mean, var, unit, sigma)


def _local_dispersion(moments: Moments, r: Reduction) -> tuple[jnp.ndarray, jnp.ndarray]:
    """The L1 dispersion and the shifted-data correction of the mean, on one device, in the form the
    platform runs fastest (:func:`~jaxnorm.functional.platform.per_platform`); both forms correct the
    mean of every ill-conditioned group (:func:`_refined_where_ill_conditioned`)."""
    return per_platform(
        lambda: _refined_where_ill_conditioned(moments, r),
        lambda: _dispersion_and_shift(moments, moments.count, r, lambda sums: sums),
    )


def _refined_where_ill_conditioned(moments: Moments, r: Reduction) -> tuple[jnp.ndarray, jnp.ndarray]:
    """XLA:CPU's form: ``sum |x - m|`` alone in the deviation pass (XLA:CPU runs a sibling ``sum (x - m)``
    as a second loop over ``x``), and the corrections of :func:`_about_the_corrected_mean` taken by a
    :func:`jax.lax.cond` only where some group is ill conditioned, ``|m| > sqrt(CONDITION_LIMIT)
    sigma_hat`` (a constant group included; compared unsquared, as the squares overflow from 1.8e19 on):
    there the plain mean's rounding error is no longer small against the dispersion. On other platforms
    the cond would run as a speculative extra pass; they take the sums in the deviation pass
    (:func:`_dispersion_and_shift`)."""
    values = r.deviations.astype(moments.mean.dtype)
    total = abs_deviation_sum(values, moments.mean, moments.count, r.mask, r.axes, r.group_sum)
    safe_count = jnp.maximum(moments.count, 1)
    ill_conditioned = jnp.abs(moments.mean) > math.sqrt(CONDITION_LIMIT) * L1_CONSTANT * total / safe_count
    total, shift = lax.cond(
        jnp.any(ill_conditioned & (moments.count > 0)),
        lambda: _about_the_corrected_mean(
            total,
            deviation_sum(moments, r, r.group_sum),
            _sign_balance(values, moments.mean, moments.count, r.mask, r.axes, r.group_sum),
            safe_count,
        ),
        lambda: (total, jnp.zeros_like(moments.mean)),
    )
    return L1_CONSTANT * total / safe_count, shift / safe_count


def _cross_device_dispersion(
    moments: Moments, local_count: jnp.ndarray, r: Reduction
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """The L1 dispersion and the mean's correction across the devices of ``r.axis_name``: each device's
    ``sum |x - mu|``, ``sum (x - mu)`` and sign balance about the global mean, summed in one ``psum``."""
    return _dispersion_and_shift(
        moments, local_count, r, lambda sums: psum_flat(sums, r.axis_name, r.axis_index_groups))


def _dispersion_and_shift(
    moments: Moments, local_count: jnp.ndarray, r: Reduction, combine: Callable
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """``(sqrt(pi / 2) * sum |x - mu| / n, sum (x - m) / n)`` with ``mu = m + sum (x - m) / n`` the
    corrected mean of ``m`` (:func:`_about_the_corrected_mean`): this device's three sums about ``m``
    (``local_count`` its element count per group, for the derivative), merged by ``combine``; sibling
    reductions of one ``x - m``, a single read of ``x`` where XLA fuses them (GPU, TPU). The corrected
    mean is exact for a constant group and accurate to the dtype's resolution for a nearly constant
    one, whatever order the platform sums ``x`` in."""
    values = r.deviations.astype(moments.mean.dtype)
    local_total = abs_deviation_sum(values, moments.mean, local_count, r.mask, r.axes, r.group_sum)
    local_shift = deviation_sum(moments, r, r.group_sum)
    local_balance = _sign_balance(values, moments.mean, local_count, r.mask, r.axes, r.group_sum)
    total, shift, balance = combine((local_total, local_shift, local_balance))
    safe_count = jnp.maximum(moments.count, 1)
    total, shift = _about_the_corrected_mean(total, shift, balance, safe_count)
    return L1_CONSTANT * total / safe_count, shift / safe_count


def _about_the_corrected_mean(
    total: jnp.ndarray, shift: jnp.ndarray, balance: jnp.ndarray, count: jnp.ndarray
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """``(sum |x - mu|, sum (x - m))`` from the sums about the plain mean ``m``: ``mu = m + delta``,
    ``delta = sum (x - m) / n``, and ``sum |x - mu| = sum |x - m| - delta * balance`` with ``balance =
    #{x > m} - #{x <= m}``, exact but for elements between ``m`` and ``mu`` (each off by at most
    ``2 |delta|``). A constant group (every ``x - m`` the same) comes out at exactly 0: ``delta *
    balance`` is taken as ``shift * (balance / n)``, where ``balance / n = +-1``. The corrections are
    constants for differentiation (the mean's derivative is ``sum(dx) / n`` either way)."""
    correction = lax.stop_gradient(shift * (balance / count))
    return jnp.maximum(total - correction, 0), lax.stop_gradient(shift)


def _sign_balance(
    values: jnp.ndarray,
    centre: jnp.ndarray,
    count: jnp.ndarray,
    mask: jnp.ndarray | None,
    axes: tuple[int, ...],
    reduce_sum: Callable,
) -> jnp.ndarray:
    """``#{x > centre} - #{x <= centre}`` over the ``count`` unmasked elements of each group, as
    ``2 #{x > centre} - count`` (the sign convention of :func:`abs_deviation_sum`'s derivative); the
    indicator is counted through bfloat16 (0 and 1 exactly, summed in ``count``'s dtype)."""
    above = values > centre
    above = above if mask is None else above & mask
    num_above = jnp.sum(above.astype(jnp.bfloat16), axes, keepdims=True, dtype=count.dtype)
    return lax.stop_gradient(2 * reduce_sum(num_above) - count)


@functools.partial(jax.custom_jvp, nondiff_argnums=(4, 5))
def abs_deviation_sum(
    values: jnp.ndarray,
    mean: jnp.ndarray,
    count: jnp.ndarray,
    mask: jnp.ndarray | None,
    axes: tuple[int, ...],
    reduce_sum: Callable,
) -> jnp.ndarray:
    """``sum |x - mean|`` over ``axes`` (masked; merged by ``reduce_sum`` over the channels of a group).

    ``count`` is the merged number of unmasked elements. Custom JVP ``sum(s (dx - dmean))`` with the
    subgradient ``s = +1`` where ``x > mean`` and ``s = -1`` elsewhere, ties ``x == mean`` included
    (any ``s`` in [-1, 1] is a subgradient of ``|.|`` at 0): then ``sum s = 2 #{x > mean} - count`` is
    one count of a comparison, where a three-valued sign would be written out first; where the deviation
    is zero everywhere, every ``s - mean(s)`` is 0 either way.
    """
    deviation = values - distinct(mean)
    deviation = deviation if mask is None else jnp.where(mask, deviation, 0)
    return reduce_sum(jnp.sum(jnp.abs(deviation), axes, keepdims=True))


@abs_deviation_sum.defjvp
def _abs_deviation_sum_jvp(axes, reduce_sum, primals, tangents):
    values, mean, count, mask = primals
    values_dot, mean_dot = tangents[0], tangents[1]

    def above(centre: jnp.ndarray) -> jnp.ndarray:
        is_above = values > centre
        return is_above if mask is None else is_above & mask

    total = abs_deviation_sum(values, mean, count, mask, axes, reduce_sum)
    balance = _sign_balance(values, distinct(mean, tag=1), count, mask, axes, reduce_sum)
    signs = jnp.where(above(mean), 1, -1 if mask is None else jnp.where(mask, -1, 0)).astype(values.dtype)
    picked = reduce_sum(jnp.sum(signs * values_dot, axes, keepdims=True))
    return total, picked - mean_dot * balance
