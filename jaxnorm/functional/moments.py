"""Moments of groups of elements: count, mean and M2, their shifted-data sums and their exact merge.

Mean and ``M2 = sum (x - mean)^2`` of every group (batch-norm channel, layer-norm row, ...) are computed
in float32 (or float64) from the shifted sums ``sum (x - K)`` and ``sum (x - K)^2`` about one element
``K`` of the group, with a second pass about the mean where those would cancel (:func:`local_moments`).
Partial moments (per device, per channel of a group) merge with Chan, Golub & LeVeque's pairwise formula
(*Algorithms for computing the sample variance*, The American Statistician 1983), exact for unequal
counts (:func:`combine_moments`).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxnorm.functional.platform import per_platform, separate_reads
from jaxnorm.functional.units import in_range, statistics_in_units, underflows

__all__ = [
    "CONDITION_LIMIT",
    "ChannelGroups",
    "Moments",
    "as_columns",
    "combine_moments",
    "element_count",
    "group_combine",
    "group_reduce",
    "keepdims_shape",
    "kept_shape",
    "local_moments",
    "mean_m2_unit",
    "shifted_pass",
    "stats_dtype",
    "widened_float16",
]


class Moments(NamedTuple):
    """Partial statistics of a group of elements, kept with reduced axes of size 1.

    Attributes:
      count: number of (unmasked) elements, float.
      mean: their mean.
      m2: the sum of squared deviations from ``mean`` (``None`` where only the mean is needed).
    """

    count: jnp.ndarray
    mean: jnp.ndarray
    m2: jnp.ndarray | None


def stats_dtype(x: jnp.ndarray) -> jnp.dtype:
    return jnp.promote_types(x.dtype, jnp.float32)


def widened_float16(x: jnp.ndarray) -> jnp.ndarray:
    """float16 ``x`` as float32 (one conversion), any other ``x`` unchanged.

    The normalizations read ``x`` in several places (statistics, deviations), each widened to float32;
    differentiated, every place gives its part of the input gradient, and a separate conversion per place
    casts each part to ``x``'s dtype before they are summed. Parts of ``1 / sigma_hat`` in size exceed
    float16's range (65504) where their sum need not (tiny groups, ``epsilon`` near 0): ``inf - inf``
    was NaN. One conversion at the entry sums the parts in float32 and rounds once. bfloat16 keeps its
    separate conversions (float32's range: its parts overflow only where the gradient does).
    """
    return x.astype(jnp.float32) if x.dtype == jnp.float16 else x


CONDITION_LIMIT = 32.0


"""Largest ``mean^2 / var`` of a group for which :func:`local_moments` keeps the one-pass raw sums.

The raw-sum variance ``(sum x^2 - (sum x)^2 / n) / n`` loses ``log2(1 + mean^2 / var)`` bits to
cancellation; up to 32 this is at most 5 bits, about the rounding error of a float32 sum of a
few thousand terms. Beyond it (and for zero variance with a non-zero mean) the moments are recomputed
about the mean."""


def local_moments(
    x: jnp.ndarray,
    axes: tuple[int, ...],
    *,
    mask: jnp.ndarray | None = None,
    with_m2: bool = True,
    one_pass: bool = True,
) -> Moments:
    """Count, mean and M2 of ``x`` over ``axes`` (keepdims), accurate whatever the mean.

    Two ways to M2, each run where XLA (CPU and GPU) makes it cheapest:

    - Reductions over the last axis alone (masked or across devices; short rows) take two passes, the
      second over ``d = x - mean``: XLA fuses a row's normalization into one kernel, so it costs nothing.
    - Other reductions — batch norm, group / instance norm over spatial axes, layer norm over several
      axes (rows too long to stay in cache between passes) — read ``x`` once for
      ``sum x`` and ``sum x^2`` (the sums XLA reduces fastest) and keep ``M2 = sum x^2 - (sum x)^2 / n``
      when every group is well conditioned, ``mean^2 <= CONDITION_LIMIT * var``. Otherwise — the
      cancellation case (flax's ``use_fast_variance``), a constant group included — a
      :func:`jax.lax.cond` takes the second pass. Only one branch runs on CPU (both under ``vmap`` with
      a batched predicate). ``one_pass=False`` always takes the second pass. GPU and TPU, where XLA runs
      both branches of such a conditional, always take it, fused with the sums of the first pass
      (:func:`mean_m2_unit`).

    The second pass is the shifted-data algorithm about the raw mean ``m = sum x / n`` (Chan et al.
    1983): ``mean = m + sum d / n``, ``M2 = sum d^2 - (sum d)^2 / n``; a constant group has a single
    deviation ``d``, so its mean comes out exact and it normalizes to exactly 0. The derivatives are the
    exact ones, ``d mean = sum(dx) / n`` and ``d M2 = 2 sum((x - mean) dx)``, by a custom JVP: the
    branch taken does not change the backward pass. Without M2 the mean is ``sum x / n``
    (:func:`jaxnorm.functional.dispersion.dispersion_moments` makes it exact for constant groups).
    """
    count = element_count(x, axes, mask)
    if not with_m2:
        total = jnp.sum(_widen(x, mask), axis=axes, keepdims=True)
        return Moments(count, total / jnp.maximum(count, 1), None)
    return Moments(count, *_mean_m2(x, count, mask, axes, one_pass))


def element_count(x: jnp.ndarray, axes: tuple[int, ...], mask: jnp.ndarray | None) -> jnp.ndarray:
    """The number of (unmasked) elements of every group, in the statistics dtype (a scalar constant
    without a mask)."""
    if mask is None:
        return jnp.asarray(math.prod(x.shape[a] for a in axes), stats_dtype(x))
    return jnp.sum(mask, axis=axes, keepdims=True, dtype=stats_dtype(x))


def _widen(x: jnp.ndarray, mask: jnp.ndarray | None) -> jnp.ndarray:
    """``x`` in the statistics dtype, zero where masked."""
    values = x.astype(stats_dtype(x))
    return values if mask is None else jnp.where(mask, values, 0)


@functools.partial(jax.custom_jvp, nondiff_argnums=(3, 4))
def _mean_m2(
    x: jnp.ndarray, count: jnp.ndarray, mask: jnp.ndarray | None, axes: tuple[int, ...], one_pass: bool
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Mean and M2 of ``x`` (unmasked elements, statistics dtype) over ``axes``; see :func:`local_moments`."""
    mean, m2, _ = mean_m2_unit(x, count, mask, axes, one_pass, rescale=False)
    return mean, m2


def mean_m2_unit(
    x: jnp.ndarray,
    count: jnp.ndarray,
    mask: jnp.ndarray | None,
    axes: tuple[int, ...],
    one_pass: bool,
    rescale: bool = True,
    tiny_groups: bool = False,
) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """Mean, M2 and unit of every group of ``x`` over ``axes`` (see :func:`local_moments`): with
    ``rescale``, M2 is that of ``x * unit`` where the M2 (or the mean) of ``x`` itself leaves
    :func:`~jaxnorm.functional.units.in_range` (``unit`` :func:`~jaxnorm.functional.units.huge_unit`)
    and, with ``tiny_groups``, where its variance :func:`~jaxnorm.functional.units.underflows` (``unit``
    :func:`~jaxnorm.functional.units.rescue_unit`); ``unit = 1`` elsewhere. XLA:CPU takes the careful
    pass and the unit behind conditionals (:func:`_mean_m2_unit_branching`); GPU and TPU, which run both
    branches of such a conditional (XLA turns it into selects), take both always, in two reads of ``x``
    (:func:`_mean_m2_unit_fused`): :func:`~jaxnorm.functional.platform.per_platform`."""
    return per_platform(
        lambda: _mean_m2_unit_branching(x, count, mask, axes, one_pass, rescale, tiny_groups),
        lambda: _mean_m2_unit_fused(x, count, mask, axes, rescale, tiny_groups),
    )


def _kept_in_x_scale(
    mean: jnp.ndarray, m2: jnp.ndarray, count: jnp.ndarray, tiny_groups: bool
) -> jnp.ndarray:
    """Per group, whether the statistics of ``x`` itself stand: :func:`~jaxnorm.functional.units.in_range`
    and, with ``tiny_groups``, not :func:`_underflowing`."""
    kept = in_range(mean, m2)
    if tiny_groups:
        kept = kept & ~_underflowing(m2, count)
    return kept


def _underflowing(m2: jnp.ndarray, count: jnp.ndarray) -> jnp.ndarray:
    """Per group, a variance ``M2 / n`` that :func:`~jaxnorm.functional.units.underflows` (an empty group
    does not: it has no statistics to rescue)."""
    return (count > 0) & underflows(m2 / jnp.maximum(count, 1))


def _statistics_in_units(
    values: jnp.ndarray,
    plain: tuple[jnp.ndarray, jnp.ndarray],
    count: jnp.ndarray,
    mask: jnp.ndarray | None,
    axes: tuple[int, ...],
    tiny_groups: bool,
) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """``(mean, M2, unit)`` of :func:`~jaxnorm.functional.units.statistics_in_units`: the ``plain``
    statistics of ``values`` (``x`` widened, zero where masked) where they stand, else those of
    ``values * unit``, one careful pass over ``values`` per unit (a constant group stays in unit 1)."""
    safe_count = jnp.maximum(count, 1)

    def in_unit(unit: float | jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
        scaled = values * unit
        centre = jnp.sum(scaled, axis=axes, keepdims=True) / safe_count
        return shifted_pass(scaled, centre, mask, axes, safe_count)

    def rescued_about_plain_mean(unit: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
        # the tiny rescue, about the plain (exact) mean where it is finite in the unit: a constant
        # group's deviations are then exactly 0, where about a rounded centre they are not, and the
        # rescue would take their noise
        scaled, plain_centre = values * unit, plain[0] * unit
        rough = jnp.sum(scaled, axis=axes, keepdims=True) / safe_count
        centre = jnp.where(jnp.isfinite(plain_centre), plain_centre, rough)
        return shifted_pass(scaled, centre, mask, axes, safe_count)

    underflowing = _underflowing(plain[1], count) if tiny_groups else None
    return statistics_in_units(plain, in_range(*plain), underflowing, in_unit, rescued_about_plain_mean)


def shifted_pass(
    values: jnp.ndarray, centre: jnp.ndarray, mask: jnp.ndarray | None, axes: tuple[int, ...],
    safe_count: jnp.ndarray | int,
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """The shifted-data algorithm about ``centre`` (Chan et al. 1983): ``d = x - centre``,
    ``mean = centre + sum d / n``, ``M2 = sum d^2 - (sum d)^2 / n``, accurate whatever the centre's
    rounding error. ``safe_count`` is the groups' element count, at least 1.

    A constant group (every kept deviation equal) gets ``M2 = 0`` and ``mean = centre + d`` exactly,
    its value (:func:`_constant_groups`). The formula alone leaves it a rounding residue of
    ``(sum d)^2 / n`` (XLA divides by a constant ``n`` as a product with ``1 / n``), about
    ``2^-24 n d^2`` in float32 with ``d`` an ulp of the value: beyond ``epsilon`` from values of about
    ``3e7`` (``epsilon = 1e-5``), where the residue, not ``epsilon``, set the inverse and the
    gradient of a constant group came out too small by up to 12 orders of magnitude."""
    def deviations() -> jnp.ndarray:
        return values.astype(centre.dtype) - centre

    d = deviations()
    kept = d if mask is None else jnp.where(mask, d, 0)
    d_total = jnp.sum(kept, axis=axes, keepdims=True)
    cancelled = d_total * d_total / safe_count
    m2 = jnp.maximum(jnp.sum(jnp.square(kept), axis=axes, keepdims=True) - cancelled, 0)
    mean = centre + d_total / safe_count
    # a constant group's M2 is a residue of the cancellation, a few ulps of (sum d)^2 / n; any other
    # group's is far above it (its d_total is the centre's rounding error)
    suspect = m2 <= _RESIDUE * cancelled

    def resolved(mean, m2):
        # d taken again from values: a conditional's full-size operand would be written to memory
        constant, d_max = _constant_groups(deviations(), mask, axes)
        return jnp.where(constant, centre + d_max, mean), jnp.where(constant, 0, m2)

    def branching(mean, m2):
        return lax.cond(jnp.any(suspect), resolved, lambda mean, m2: (mean, m2), mean, m2)

    return per_platform(branching, resolved, mean, m2)


_RESIDUE = 2.0**-12
"""``M2 <= _RESIDUE * (sum d)^2 / n``: a group whose M2 may be the rounding residue of a constant
group's cancellation (a few ulps, ``2^-22`` in float32), checked for constancy."""


def _constant_groups(
    d: jnp.ndarray, mask: jnp.ndarray | None, axes: tuple[int, ...]
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Per group, whether every kept deviation ``d`` is the same (``max d == min d``; an empty group is
    not constant), and the largest."""
    kept = (lambda fill: d) if mask is None else (lambda fill: jnp.where(mask, d, fill))
    d_max = jnp.max(kept(-jnp.inf), axis=axes, keepdims=True)
    return d_max == jnp.min(kept(jnp.inf), axis=axes, keepdims=True), d_max


def _mean_m2_unit_fused(
    x: jnp.ndarray,
    count: jnp.ndarray,
    mask: jnp.ndarray | None,
    axes: tuple[int, ...],
    rescale: bool,
    tiny_groups: bool,
) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """The GPU / TPU form of :func:`mean_m2_unit`, no conditional: one read of ``x`` for ``sum x`` (and,
    with ``rescale``, ``sum x * unit``), one for the shifted-data pass about each mean (sibling
    reductions that XLA fuses), then per group the plain statistics where they stand, else those of
    ``x * unit`` (:func:`_statistics_in_units`). Always the careful pass: exact for cancellation and
    constant groups, whatever the mean."""
    safe_count = jnp.maximum(count, 1)
    values = _widen(x, mask)
    mean = jnp.sum(values, axis=axes, keepdims=True) / safe_count
    plain = shifted_pass(x, mean, mask, axes, safe_count)
    if not rescale:
        return (*plain, jnp.ones_like(mean))
    return _statistics_in_units(values, plain, count, mask, axes, tiny_groups)


def _mean_m2_unit_branching(
    x: jnp.ndarray,
    count: jnp.ndarray,
    mask: jnp.ndarray | None,
    axes: tuple[int, ...],
    one_pass: bool,
    rescale: bool,
    tiny_groups: bool = False,
) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """XLA:CPU's form of :func:`mean_m2_unit`: the one-pass raw sums where every group is well
    conditioned, else the careful pass behind a :func:`jax.lax.cond`, and the unit found inside the
    conditional that already takes the careful pass, so ordinary groups run no other conditional."""
    safe_count = jnp.maximum(count, 1)
    last_axis = axes == (x.ndim - 1,)
    sum_source, square_source = (x, x) if last_axis else separate_reads(x, 2)
    total = jnp.sum(_widen(sum_source, mask), axis=axes, keepdims=True)
    mean = total / safe_count
    ones = jnp.ones_like(mean)

    def careful() -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
        shifted = shifted_pass(x, mean, mask, axes, safe_count)
        if not rescale:
            return (*shifted, ones)
        return lax.cond(
            jnp.all(_kept_in_x_scale(*shifted, count, tiny_groups)),
            lambda: (*shifted, ones),
            lambda: _statistics_in_units(_widen(x, mask), shifted, count, mask, axes, tiny_groups),
        )

    if last_axis or not one_pass:
        return careful()
    raw_m2 = jnp.sum(jnp.square(_widen(square_source, mask)), axis=axes, keepdims=True) - total * mean
    # groups that may need a unit (huge input, in_range false; an underflowing variance) take the
    # careful pass too
    well_conditioned = total * mean <= CONDITION_LIMIT * raw_m2
    if rescale:
        representable = _kept_in_x_scale(mean, raw_m2, count, tiny_groups)
    else:
        representable = jnp.isfinite(raw_m2)
    well_conditioned = jnp.all(well_conditioned & representable)
    return lax.cond(well_conditioned, lambda: (mean, jnp.maximum(raw_m2, 0), ones), careful)


@_mean_m2.defjvp
def _mean_m2_jvp(axes, one_pass, primals, tangents):
    x, count, mask = primals
    values_dot = _widen(tangents[0], mask)
    mean, m2, _ = mean_m2_unit(x, count, mask, axes, one_pass, rescale=False)
    mean_dot = jnp.sum(values_dot, axis=axes, keepdims=True) / jnp.maximum(count, 1)
    deviation = x.astype(mean.dtype) - mean
    m2_dot = 2 * jnp.sum(deviation * values_dot, axis=axes, keepdims=True)
    return (mean, m2), (mean_dot, m2_dot)


def combine_moments(moments: Moments, axis: int) -> Moments:
    """Merge partial moments along ``axis`` (keepdims) with Chan et al.'s formula.

    ``n = sum n_i``, ``mean = mean_r + sum n_i (mean_i - mean_r) / n`` about the mean of ``r``, the first
    part with elements (so that equal means merge exactly: a constant group, whatever parts a mask
    empties), ``M2 = sum M2_i + sum n_i (mean_i - mean)^2``. Exact for unequal counts; parts with
    ``n = 0`` contribute nothing.
    """
    count = jnp.broadcast_to(moments.count, moments.mean.shape)
    total = jnp.sum(count, axis=axis, keepdims=True)
    safe_total = jnp.maximum(total, 1)
    if jnp.ndim(moments.count) == 0:  # one count for every part (no mask): the first part
        reference = lax.index_in_dim(moments.mean, 0, axis, keepdims=True)
    else:  # an empty part's mean is 0: about it, a constant group's merged mean would be rounded
        first_with_elements = jnp.argmax(count > 0, axis=axis, keepdims=True)
        reference = jnp.take_along_axis(moments.mean, first_with_elements, axis=axis)
    mean = reference + jnp.sum(count * (moments.mean - reference), axis=axis, keepdims=True) / safe_total
    if moments.m2 is None:
        return Moments(total, mean, None)
    between = jnp.sum(count * jnp.square(moments.mean - mean), axis=axis, keepdims=True)
    return Moments(total, mean, jnp.sum(moments.m2, axis=axis, keepdims=True) + between)


class ChannelGroups(NamedTuple):
    """Channels merged into groups after the per-channel reduction (group norm)."""

    channel_axis: int
    num_groups: int


def _split_groups(stat: jnp.ndarray, groups: ChannelGroups, shape: tuple[int, ...]) -> jnp.ndarray:
    """``(..., C, ...)`` -> ``(..., G, C // G, ...)`` at the channel axis, broadcasting ``stat`` first."""
    c = groups.channel_axis
    return jnp.broadcast_to(stat, shape).reshape((*shape[:c], groups.num_groups, -1, *shape[c + 1 :]))


def _merge_groups(grouped: jnp.ndarray, groups: ChannelGroups, shape: tuple[int, ...]) -> jnp.ndarray:
    """Broadcast a per-group statistic back to every channel of its group."""
    c = groups.channel_axis
    full = (*shape[:c], groups.num_groups, shape[c] // groups.num_groups, *shape[c + 1 :])
    return jnp.broadcast_to(grouped, full).reshape(shape)


def group_reduce(stat: jnp.ndarray, groups: ChannelGroups | None, op) -> jnp.ndarray:
    """Reduce a keepdims per-channel statistic over the channels of each group (sum or max)."""
    if groups is None:
        return stat
    reduced = op(_split_groups(stat, groups, stat.shape), axis=groups.channel_axis + 1, keepdims=True)
    return _merge_groups(reduced, groups, stat.shape)


def group_combine(moments: Moments, groups: ChannelGroups | None) -> Moments:
    """Merge per-channel moments into per-group moments, broadcast back to the channels."""
    if groups is None:
        return moments
    shape = moments.mean.shape
    split = lambda a: None if a is None else _split_groups(a, groups, shape)
    # a scalar count (no mask) stays one: the merge then knows that no part is empty
    count = moments.count if jnp.ndim(moments.count) == 0 else split(moments.count)
    merged = combine_moments(Moments(count, split(moments.mean), split(moments.m2)), groups.channel_axis + 1)
    merge = lambda a: None if a is None else _merge_groups(a, groups, shape)
    return Moments(*map(merge, merged))


def as_columns(a: jnp.ndarray, axes: tuple[int, ...]) -> jnp.ndarray:
    """``a`` as (reduced elements, features): the reduced ``axes`` first, the kept axes in order."""
    kept = tuple(i for i in range(a.ndim) if i not in axes)
    return jnp.transpose(a, axes + kept).reshape(-1, math.prod(a.shape[i] for i in kept))


def kept_shape(a: jnp.ndarray, axes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(n for i, n in enumerate(a.shape) if i not in axes)


def keepdims_shape(a: jnp.ndarray, axes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(1 if i in axes else n for i, n in enumerate(a.shape))
