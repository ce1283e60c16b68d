"""The L∞ dispersion, ``sigma_hat = C(n) * max|x - mu|`` (Hoffer et al., *Norm matters*, NeurIPS 2018,
Sec. 3; supplementary Sec. 2.1 for ``C(n)``, :func:`jaxnorm.functional.calibration.linf_calibration`).

``max|x - mu| = max(max x - mu, mu - min x)``: two plain reductions of ``x`` that do not need the mean,
so across devices they travel in the moments' all-gather (one collective), and no pass over the
deviations is taken. The extremes also make the mean of a constant group exact.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from jaxnorm.functional.calibration import linf_calibration
from jaxnorm.functional.collectives import gather_combine
from jaxnorm.functional.moments import group_combine, group_reduce, local_moments
from jaxnorm.functional.options import BatchOptions
from jaxnorm.functional.platform import separate_reads
from jaxnorm.functional.reduction import (
    Reduction,
    column_extreme,
    empty_statistics,
    exact_mean_from_extremes,
    masked_extremes,
    masked_mean,
)
from jaxnorm.functional.units import Statistics, variance_in_unit

__all__ = ["linf_statistics", "max_deviation"]


def linf_statistics(r: Reduction, options: BatchOptions) -> Statistics:
    """``(mean, sigma_hat**2, unit)`` with the calibrated L∞ ``sigma_hat``, keepdims; the mean exact for
    constant groups."""
    moments_source, extremes_source = separate_reads(r.x, 2)
    moments = group_combine(local_moments(moments_source, r.axes, mask=r.mask, with_m2=False), r.groups)
    # max and min are exact in the input dtype: no widening (for bf16, none written to memory)
    extreme = lambda a, op: column_extreme(a, r.axes, op).astype(moments.mean.dtype)
    high, low = masked_extremes(extremes_source, r.mask, extreme)
    high, low = group_reduce(high, r.groups, jnp.max), group_reduce(low, r.groups, jnp.min)
    if r.axis_name is not None:
        # a device without elements has extremes -inf / +inf: it sends 0 instead, and is skipped
        occupied = jnp.broadcast_to(moments.count, moments.mean.shape) > 0
        sent = (jnp.where(occupied, high, 0), jnp.where(occupied, low, 0))
        moments, device_counts, (highs, lows) = gather_combine(
            moments, r.axis_name, r.axis_index_groups, sent
        )
        high = jnp.max(jnp.where(device_counts > 0, highs, -jnp.inf), axis=0)
        low = jnp.min(jnp.where(device_counts > 0, lows, jnp.inf), axis=0)
    moments = masked_mean(moments, r.mask)
    # high and low enter max_deviation as ordinary (differentiable) arguments, whose tangents its rule
    # ignores: stop_gradient'ed there, a second derivative through a lax.scan / fori_loop body came out
    # wrong (the same pattern without jaxnorm reproduces it; direct calls were right)
    # about the exact mean: a constant group's max |x - mean| is 0, not the rounding error of sum x / n
    mean = masked_mean(moments._replace(mean=exact_mean_from_extremes(moments.mean, high, low)), r.mask).mean
    dispersion = max_deviation(r.x, mean, high, low, r.mask, r.axes, r.sum)
    constant = linf_calibration(moments.count, None, options.calibration)
    dispersion = dispersion * constant.astype(dispersion.dtype)
    var, unit, sigma = variance_in_unit(dispersion, options.tiny_groups)
    var, sigma = (empty_statistics(a, moments.count, r.mask) for a in (var, sigma))
    return Statistics(mean, var, unit, sigma)


@functools.partial(jax.custom_jvp, nondiff_argnums=(5, 6))
def max_deviation(
    values: jnp.ndarray,
    mean: jnp.ndarray,
    high: jnp.ndarray,
    low: jnp.ndarray,
    mask: jnp.ndarray | None,
    axes: tuple[int, ...],
    reduce_sum: Callable,
) -> jnp.ndarray:
    """``max |x - mean| = max(high - mean, mean - low)`` from the extremes of the group (0 if it is empty).

    Its derivative (custom JVP) goes to the elements equal to the extreme on the far side of the mean
    (the upper one when both are as far: a valid subgradient), shared equally among ties, minus the
    mean's: one fused counting pass, where ``jnp.max``'s own rule writes a full-size indicator for each
    of the two extremes. Zero where the dispersion is zero.
    ``values`` is ``x`` in its own dtype (``high`` and ``low`` are among its elements, so the tie
    comparison is exact there too). ``reduce_sum`` merges a per-channel sum over the channels of a
    group and the devices.
    """
    del values, mask, axes, reduce_sum
    return jnp.maximum(jnp.maximum(high - mean, mean - low), 0)


@max_deviation.defjvp
def _max_deviation_jvp(axes, reduce_sum, primals, tangents):
    values, mean, high, low, mask = primals
    values_dot, mean_dot = tangents[0], tangents[1]
    dispersion = max_deviation(values, mean, high, low, mask, axes, reduce_sum)
    upper = high - mean >= mean - low
    extreme = jnp.where(upper, high, low)

    def hits(extreme: jnp.ndarray) -> jnp.ndarray:
        hit = values == extreme.astype(values.dtype)  # exact: the extremes are elements of ``values``
        return hit if mask is None else hit & mask

    # counted through bfloat16 (0 and 1 exactly); a CPU-only distinct copy of the extreme here bought
    # < 10 % (benchmarks/platform_forms.py)
    indicator = hits(extreme).astype(jnp.bfloat16)
    count = reduce_sum(jnp.sum(indicator, axes, keepdims=True, dtype=mean.dtype))
    picked_dot = jnp.where(hits(extreme), values_dot, 0)
    picked = reduce_sum(jnp.sum(picked_dot, axes, keepdims=True, dtype=mean.dtype))
    slope = jnp.where(upper, 1, -1).astype(mean.dtype) * (picked / jnp.maximum(count, 1) - mean_dot)
    return dispersion, jnp.where(dispersion > 0, slope, 0)
