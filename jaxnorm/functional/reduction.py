"""What a dispersion reduces (:class:`Reduction`) and the steps the dispersions of
:mod:`jaxnorm.functional.dispersion` share: the exact mean of a constant group, the statistics of an
empty group, and the extremes ``max x`` / ``min x`` of a group.

A constant group must normalize to exactly 0 at every p, so its mean must be exact: the float sum of
``n`` copies of ``c`` divided by ``n`` need not be ``c``. :func:`exact_mean` takes either the group's
extremes (``max x == min x``: the mean is that value) or one shifted-data correction
``m + sum (x - m) / n`` (Chan, Golub & LeVeque, *Algorithms for computing the sample variance*, 1983),
whose deviations are all one value in a constant group.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax.numpy as jnp
from jax import lax

from jaxnorm.functional.collectives import AxisIndexGroups
from jaxnorm.functional.moments import ChannelGroups, Moments, group_reduce, keepdims_shape

__all__ = [
    "WIDE_ROW",
    "Reduction",
    "column_extreme",
    "deviation_sum",
    "empty_statistics",
    "exact_mean",
    "exact_mean_from_extremes",
    "largest_divisor",
    "masked_extremes",
    "masked_mean",
]


class Reduction(NamedTuple):
    """What a dispersion reduces: ``x`` (``deviations`` is the alias of it that the deviation pass reads,
    :func:`jaxnorm.functional.platform.separate_reads`), over ``axes``, with ``mask``, merged over
    channel ``groups`` and the devices of ``axis_name``."""

    x: jnp.ndarray
    deviations: jnp.ndarray
    axes: tuple[int, ...]
    mask: jnp.ndarray | None
    groups: ChannelGroups | None
    axis_name: str | Sequence[str] | None
    axis_index_groups: AxisIndexGroups

    def group_sum(self, stat: jnp.ndarray) -> jnp.ndarray:
        """A per-channel keepdims sum merged over the channels of a group (this device only)."""
        return group_reduce(stat, self.groups, jnp.sum)

    def sum(self, stat: jnp.ndarray) -> jnp.ndarray:
        """A per-channel keepdims sum merged over the channels of a group and over the devices."""
        stat = self.group_sum(stat)
        if self.axis_name is None:
            return stat
        return lax.psum(stat, self.axis_name, axis_index_groups=self.axis_index_groups)


def masked_mean(moments: Moments, mask: jnp.ndarray | None) -> Moments:
    """``moments`` with mean 0 where a group keeps no element of ``mask``."""
    if mask is None:
        return moments
    return moments._replace(mean=jnp.where(moments.count > 0, moments.mean, 0))


def deviation_sum(moments: Moments, r: Reduction, reduce_sum: Callable) -> jnp.ndarray:
    """``sum (x - m)`` over the unmasked elements, merged by ``reduce_sum``: the shifted-data correction
    of the mean ``m`` is this over ``n``."""
    d = r.deviations.astype(moments.mean.dtype) - moments.mean
    d = d if r.mask is None else jnp.where(r.mask, d, 0)
    return reduce_sum(jnp.sum(d, r.axes, keepdims=True))


def exact_mean(moments: Moments, r: Reduction) -> jnp.ndarray:
    """The mean ``m = sum x / n`` made exact for a constant group, so that it normalizes to exactly 0:
    ``m + sum (x - m) / n`` (a constant group has a single deviation). One more pass over ``x`` (and
    a ``psum`` with ``axis_name``). The correction's derivative is 0, as the mean's is ``sum(dx) / n``
    either way, so it is a constant for differentiation."""
    correction = deviation_sum(moments, r, r.sum) / jnp.maximum(moments.count, 1)
    return moments.mean + lax.stop_gradient(correction)


def exact_mean_from_extremes(mean: jnp.ndarray, high: jnp.ndarray, low: jnp.ndarray) -> jnp.ndarray:
    """The mean made exact for a constant group from its extremes: ``max x`` where ``max x == min x``.
    No pass over ``x`` (the L∞ and top-k dispersions have the extremes at hand)."""
    return mean + lax.stop_gradient(jnp.where(high == low, high - mean, 0))


def empty_statistics(var: jnp.ndarray, count: jnp.ndarray, mask: jnp.ndarray | None) -> jnp.ndarray:
    """``var`` with 1 where a group keeps no element of ``mask`` (its mean is 0): such a group is
    normalized as ``x / sqrt(1 + epsilon)``, neither amplified nor NaN, and its gradient is 0."""
    return var if mask is None else jnp.where(count > 0, var, 1)


def masked_extremes(
    values: jnp.ndarray, mask: jnp.ndarray | None, extreme: Callable
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """``extreme(values, jnp.max)`` and ``extreme(values, jnp.min)`` over the elements where ``mask`` is
    True (the others take -inf for the max and +inf for the min)."""
    if mask is None:
        return extreme(values, jnp.max), extreme(values, jnp.min)
    high = extreme(jnp.where(mask, values, -jnp.inf), jnp.max)
    return high, extreme(jnp.where(mask, values, jnp.inf), jnp.min)


def largest_divisor(n: int, bound: int) -> int:
    """The largest divisor of ``n`` that is at most ``bound`` (1 if ``bound < 1``)."""
    return next((d for d in range(bound, 1, -1) if n % d == 0), 1)


WIDE_ROW = 512
"""Row width (elements) of the view :func:`column_extreme` reduces (see ``docs/benchmarks.md``)."""


def column_extreme(values: jnp.ndarray, axes: tuple[int, ...], op: Callable) -> jnp.ndarray:
    """``op`` (``jnp.max`` or ``jnp.min``) of ``values`` over ``axes``, keepdims.

    When ``axes`` are the leading axes, fewer than ``WIDE_ROW / 2`` features remain (a batch norm over a
    narrow layer) and the values are float32 or wider, ``w`` rows are reduced side by side, as a
    ``(rows / w, w * features)`` view with rows of up to ``WIDE_ROW`` elements, then the ``w`` partial
    results. That is exact for a max or a min; bf16 keeps the plain reduction (why, and the measurements:
    ``docs/benchmarks.md``).
    """
    features = math.prod(values.shape[len(axes) :])
    rows = values.size // features
    width = 1
    if axes == tuple(range(len(axes))) and features < WIDE_ROW // 2 and values.dtype.itemsize >= 4:
        width = largest_divisor(rows, WIDE_ROW // features)
    if width == 1:
        return op(values, axes, keepdims=True)
    partial = op(values.reshape(rows // width, width * features), axis=0)
    return op(partial.reshape(width, features), axis=0).reshape(keepdims_shape(values, axes))
