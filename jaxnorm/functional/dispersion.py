"""The Lp dispersion ``sigma_hat`` of Norm matters (Hoffer et al., NeurIPS 2018, Sec. 3; supplementary
Sec. 2, Eq. 1) over any reduction axes, with channel groups and devices:

- ``p = 2``:  ``sigma_hat = sqrt(M2 / n)`` (the biased std, as flax and PyTorch use)
- ``p = 1``:  ``sigma_hat = sqrt(pi / 2) * mean|x - mu|``
- ``p = inf``: ``sigma_hat = C(n) * max|x - mu|``
- top-k:    ``sigma_hat = C(n) * mean of the k largest |x - mu|``

:func:`dispersion_moments` returns ``(mu, sigma_hat**2)`` so that every norm is
``(x - mu) * rsqrt(var + eps)``. A group that a mask leaves empty gets mean 0 and variance 1
(:func:`empty_statistics`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxnorm.functional.calibration import L1_CONSTANT, Calibration, expected_topk_abs_normal, linf_constant
from jaxnorm.functional.collectives import AxisIndexGroups, gather_combine
from jaxnorm.functional.moments import (
    ChannelGroups,
    Moments,
    as_columns,
    group_combine,
    group_reduce,
    keepdims_shape,
    kept_shape,
    local_moments,
    stats_dtype,
)
from jaxnorm.functional.options import BatchOptions
from jaxnorm.functional.platform import distinct, separate_reads

__all__ = [
    "DISPERSIONS",
    "Reduction",
    "dispersion_moments",
    "empty_statistics",
    "exact_mean",
    "l1_dispersion",
    "l1_dispersion_and_correction",
    "l2_dispersion",
    "linf_calibration",
    "linf_dispersion",
    "topk_dispersion",
]


def dispersion_moments(
    x: jnp.ndarray,
    axes: tuple[int, ...],
    options: BatchOptions,
    *,
    mask: jnp.ndarray | None = None,
    axis_name: str | Sequence[str] | None = None,
    axis_index_groups: AxisIndexGroups = None,
    groups: ChannelGroups | None = None,
) -> tuple[jnp.ndarray, jnp.ndarray | None]:
    """``(mean, sigma_hat**2)`` of ``x`` over ``axes`` (keepdims, float32 or wider); the engine of every norm.

    The arguments have been validated by the caller. ``groups`` merges channels after the per-channel
    reduction; ``axis_name`` merges devices, in one collective for L2 (an all-gather of count, mean and
    M2) and L∞ (count, mean, ``max x`` and ``min x``; with top-k, each device's k largest and k smallest
    values, among which the k largest deviations from the global mean lie). L1 takes two: its
    ``sum |x - mu|`` needs the global mean first.

    L∞ takes ``max |x - mu| = max(max x - mu, mu - min x)``: two plain reductions of ``x``, no pass over
    the deviations. The dispersion itself is one small function per p (:data:`DISPERSIONS`).
    """
    p, topk, calibration, mean_only, one_pass = (
        options.p, options.topk, options.calibration, options.mean_only, options.use_fast_variance
    )
    # the deviations (L1, L-inf, top-k) read x once more
    with_deviations = p != 2 and not mean_only
    moments_source, deviation_source = separate_reads(x, 2) if with_deviations else (x, x)
    moments = local_moments(
        moments_source, axes, mask=mask, with_m2=(p == 2 and not mean_only), one_pass=one_pass
    )
    moments = group_combine(moments, groups)
    # What L-inf needs besides the mean does not depend on it, so it joins the moments' collective:
    # the extremes max x and min x, or for top-k each device's k largest and k smallest values.
    extremes = p == "inf" and not mean_only and topk is None
    extra = ()
    if extremes:
        # max and min are exact in the input dtype: no widening (for bf16, none written to memory)
        extreme = lambda a, op: _extreme(a, axes, op).astype(moments.mean.dtype)
        high, low = _masked_extremes(deviation_source, mask, extreme)
        extra = (group_reduce(high, groups, jnp.max), group_reduce(low, groups, jnp.min))
    elif topk is not None and axis_name is not None:
        extra = _extreme_candidates(deviation_source, moments.count, axes, topk, mask)
    if axis_name is not None:
        if extremes:  # a device without elements has extremes -inf / +inf: it sends 0 instead
            occupied = jnp.broadcast_to(moments.count, moments.mean.shape) > 0
            extra = tuple(jnp.where(occupied, a, 0) for a in extra)
        moments, device_counts, extra = gather_combine(moments, axis_name, axis_index_groups, extra)
        if extremes:
            high, low = extra
            occupied = device_counts > 0
            extra = (jnp.max(jnp.where(occupied, high, -jnp.inf), axis=0),
                     jnp.min(jnp.where(occupied, low, jnp.inf), axis=0))
    reduction = Reduction(x, deviation_source, axes, mask, groups, axis_name, axis_index_groups)
    raw = moments  # the dispersions take the raw mean: L1's pass also gives exact_mean's correction
    if mask is not None:
        raw = raw._replace(mean=jnp.where(raw.count > 0, raw.mean, 0))
    l1 = None
    if p == 1 and not mean_only:
        l1 = l1_dispersion_and_correction(raw, reduction)
        moments = moments._replace(mean=raw.mean + l1[1])
    elif p != 2 or mean_only:
        moments = moments._replace(mean=exact_mean(moments, extra if extremes else None, reduction))
    if mask is not None:  # a group without elements: mean 0 and variance 1 (see empty_statistics)
        moments = moments._replace(mean=jnp.where(moments.count > 0, moments.mean, 0))
    if mean_only:
        return moments.mean, None
    if p == 2:  # the variance itself, not the square of its root
        return moments.mean, empty_statistics(moments.m2 / jnp.maximum(moments.count, 1), moments.count, mask)
    if l1 is not None:
        dispersion = l1[0]
    else:
        dispersion = DISPERSIONS["topk" if topk is not None else p](raw, extra, reduction, topk)
    if p == "inf":
        dispersion = dispersion * linf_calibration(moments.count, topk, calibration).astype(dispersion.dtype)
    return moments.mean, empty_statistics(jnp.square(dispersion), moments.count, mask)


def exact_mean(
    moments: Moments, extremes: tuple[jnp.ndarray, jnp.ndarray] | None, r: Reduction
) -> jnp.ndarray:
    """The mean ``m = sum x / n`` made exact for a constant group, so that it normalizes to exactly 0.

    With the extremes at hand (L∞): ``max x`` where ``max x == min x``. Otherwise one correction
    ``m + sum (x - m) / n`` (the shifted-data mean; a constant group has a single deviation); L1 takes
    it from its own pass (:func:`l1_dispersion_and_correction`). The correction's derivative is 0, as
    the mean's is ``sum(dx) / n`` either way, so it is a constant for differentiation.
    """
    mean = moments.mean
    if extremes is not None:
        high, low = extremes
        return mean + lax.stop_gradient(jnp.where(high == low, high - mean, 0))
    d = r.deviations.astype(mean.dtype) - mean
    d = d if r.mask is None else jnp.where(r.mask, d, 0)
    correction = r.sum(jnp.sum(d, r.axes, keepdims=True)) / jnp.maximum(moments.count, 1)
    return mean + lax.stop_gradient(correction)


class Reduction(NamedTuple):
    """What a dispersion reduces: ``x`` (``deviations`` is the alias of it that the deviation pass reads),
    over ``axes``, with ``mask``, merged over channel ``groups`` and the devices of ``axis_name``."""

    x: jnp.ndarray
    deviations: jnp.ndarray
    axes: tuple[int, ...]
    mask: jnp.ndarray | None
    groups: ChannelGroups | None
    axis_name: str | Sequence[str] | None
    axis_index_groups: AxisIndexGroups

    def sum(self, stat: jnp.ndarray) -> jnp.ndarray:
        """A per-channel keepdims sum merged over the channels of a group and over the devices."""
        stat = group_reduce(stat, self.groups, jnp.sum)
        if self.axis_name is None:
            return stat
        return lax.psum(stat, self.axis_name, axis_index_groups=self.axis_index_groups)


def l2_dispersion(moments: Moments, extra: tuple, r: Reduction, topk: None) -> jnp.ndarray:
    """``sqrt(M2 / n)``, the biased standard deviation."""
    return jnp.sqrt(moments.m2 / jnp.maximum(moments.count, 1))


def l1_dispersion(moments: Moments, extra: tuple, r: Reduction, topk: None) -> jnp.ndarray:
    """``sqrt(pi / 2) * mean|x - mu|`` (Norm matters, Sec. 3)."""
    return l1_dispersion_and_correction(moments, r)[0]


def l1_dispersion_and_correction(moments: Moments, r: Reduction) -> tuple[jnp.ndarray, jnp.ndarray]:
    """The L1 dispersion and the correction that makes the mean exact for constant groups.

    A constant group has ``mean|x - m| <= a few ulps of m``; only when some group is that close to
    constant does a :func:`jax.lax.cond` take the extra pass of :func:`exact_mean` (always with
    ``axis_name``, whose collective cannot sit in a branch), so ordinary batches read ``x`` twice, as
    before.
    """
    values = r.deviations.astype(moments.mean.dtype)
    total = _abs_deviation_sum(values, moments.mean, moments.count, r.mask, r.axes, r.sum)
    safe_count = jnp.maximum(moments.count, 1)
    dispersion = L1_CONSTANT * total / safe_count
    if r.axis_name is not None:
        return dispersion, exact_mean(moments, None, r) - moments.mean
    resolution = 16 * jnp.finfo(moments.mean.dtype).eps * jnp.abs(moments.mean)
    near_constant = jnp.any((total / safe_count <= resolution) & (moments.count > 0))
    correction = lax.cond(
        near_constant,
        lambda: exact_mean(moments, None, r) - moments.mean,
        lambda: jnp.zeros_like(moments.mean),
    )
    return dispersion, lax.stop_gradient(correction)


def linf_dispersion(moments: Moments, extra: tuple, r: Reduction, topk: None) -> jnp.ndarray:
    """``max|x - mu| = max(max x - mu, mu - min x)`` from the extremes gathered with the moments (the
    calibration ``C(n)`` is applied by :func:`dispersion_moments`)."""
    high, low = lax.stop_gradient(extra)
    return _max_deviation(r.x, moments.mean, high, low, r.mask, r.axes, r.sum)


def topk_dispersion(moments: Moments, extra: tuple, r: Reduction, topk: int) -> jnp.ndarray:
    """The mean of the ``topk`` largest ``|x - mu|`` (Norm matters, Sec. 3; calibrated as L∞)."""
    if r.axis_name is None:
        largest = _largest_deviations_per_feature(r.deviations, moments.mean, r.axes, topk, r.mask)
    else:
        largest = _largest_candidate_deviations(*extra, moments.mean, r.axes, topk)
    return _topk_mean(largest, moments.mean, moments.count, topk)


DISPERSIONS = {2: l2_dispersion, 1: l1_dispersion, "inf": linf_dispersion, "topk": topk_dispersion}
"""``sigma_hat`` before calibration, by ``p`` (``"topk"`` for the top-k L∞ dispersion)."""


def linf_calibration(count: jnp.ndarray, topk: int | None, calibration: Calibration) -> jnp.ndarray:
    """The factor that makes an L∞ / top-k dispersion estimate sigma on Gaussian data: the paper's
    ``C(n)`` or ``1 / E[mean of the top k of n |N(0, 1)|]`` (``calibration="exact"``)."""
    if calibration == "exact":
        return 1 / expected_topk_abs_normal(count, topk or 1)
    return linf_constant(count)


def empty_statistics(var: jnp.ndarray, count: jnp.ndarray, mask: jnp.ndarray | None) -> jnp.ndarray:
    """``var`` with 1 where a group keeps no element of ``mask`` (its mean is 0): such a group is
    normalized as ``x / sqrt(1 + epsilon)``, neither amplified nor NaN, and its gradient is 0."""
    return var if mask is None else jnp.where(count > 0, var, 1)


def _masked_extremes(
    values: jnp.ndarray, mask: jnp.ndarray | None, extreme
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """``extreme(values, jnp.max)`` and ``extreme(values, jnp.min)`` over the elements where ``mask`` is
    True (the others take -inf for the max and +inf for the min)."""
    if mask is None:
        return extreme(values, jnp.max), extreme(values, jnp.min)
    high = extreme(jnp.where(mask, values, -jnp.inf), jnp.max)
    return high, extreme(jnp.where(mask, values, jnp.inf), jnp.min)


def _largest_divisor(n: int, bound: int) -> int:
    """The largest divisor of ``n`` that is at most ``bound`` (1 if ``bound < 1``)."""
    return next((d for d in range(bound, 1, -1) if n % d == 0), 1)


_WIDE_ROW = 512


"""Row width (elements) at which XLA:CPU's column max / min of 4-byte values run fastest."""


def _extreme(values: jnp.ndarray, axes: tuple[int, ...], op) -> jnp.ndarray:
    """``op`` (``jnp.max`` or ``jnp.min``) of ``values`` over ``axes``, keepdims.

    When ``axes`` are the leading axes, fewer than 256 features remain (a batch norm over a narrow
    layer) and the values are float32 or wider, ``w`` rows are reduced side by side, as a
    ``(rows / w, w * features)`` view with rows of up to 512 elements, then the ``w`` partial results.
    That is exact for a max or a min. On XLA:CPU it is 12-20 % faster with 32-128 features, and L∞
    batch norm's float32 forward on 64 channels goes from 1.12-1.16x flax to 1.03-1.06x. bf16 columns
    were slower that way, so they keep the plain reduction (``docs/benchmarks.md``, finding 5).
    """
    features = math.prod(values.shape[len(axes):])
    rows = values.size // features
    width = 1
    if axes == tuple(range(len(axes))) and features < _WIDE_ROW // 2 and values.dtype.itemsize >= 4:
        width = _largest_divisor(rows, _WIDE_ROW // features)
    if width == 1:
        return op(values, axes, keepdims=True)
    partial = op(values.reshape(rows // width, width * features), axis=0)
    return op(partial.reshape(width, features), axis=0).reshape(keepdims_shape(values, axes))


@functools.partial(jax.custom_jvp, nondiff_argnums=(4, 5))
def _abs_deviation_sum(
    values: jnp.ndarray,
    mean: jnp.ndarray,
    count: jnp.ndarray,
    mask: jnp.ndarray | None,
    axes: tuple[int, ...],
    reduce_sum,
) -> jnp.ndarray:
    """``sum |x - mean|`` over ``axes`` (masked; merged by ``reduce_sum`` over group channels and devices).

    ``count`` is the merged number of unmasked elements. Custom JVP ``sum(s (dx - dmean))`` with the
    subgradient ``s = +1`` where ``x > mean`` and ``s = -1`` elsewhere, ties ``x == mean`` included
    (any ``s`` in [-1, 1] is a subgradient of ``|.|`` at 0; ``s = sign(x - mean)`` would take 0). This
    choice makes ``sum s = 2 #{x > mean} - count`` one count of a comparison, which XLA:CPU reduces at
    about the speed of a plain sum, where a three-valued sign is written out first; where the deviation
    is zero everywhere, every ``s - mean(s)`` is 0 either way.
    """
    deviation = values - distinct(mean)
    deviation = deviation if mask is None else jnp.where(mask, deviation, 0)
    return reduce_sum(jnp.sum(jnp.abs(deviation), axes, keepdims=True))


@_abs_deviation_sum.defjvp
def _abs_deviation_sum_jvp(axes, reduce_sum, primals, tangents):
    values, mean, count, mask = primals
    values_dot, mean_dot = tangents[0], tangents[1]

    def above(centre: jnp.ndarray) -> jnp.ndarray:
        is_above = values > centre
        return is_above if mask is None else is_above & mask

    total = _abs_deviation_sum(values, mean, count, mask, axes, reduce_sum)
    # counted through bfloat16 (0 and 1 exactly, summed in the statistics dtype): the narrowest
    # indicator that XLA:CPU's fast reductions accept
    indicator = above(distinct(mean, tag=1)).astype(jnp.bfloat16)
    num_above = jnp.sum(indicator, axes, keepdims=True, dtype=values.dtype)
    balance = 2 * reduce_sum(num_above) - count
    signs = jnp.where(above(mean), 1, -1 if mask is None else jnp.where(mask, -1, 0)).astype(values.dtype)
    picked = reduce_sum(jnp.sum(signs * values_dot, axes, keepdims=True))
    return total, picked - mean_dot * balance


@functools.partial(jax.custom_jvp, nondiff_argnums=(5, 6))
def _max_deviation(
    values: jnp.ndarray,
    mean: jnp.ndarray,
    high: jnp.ndarray,
    low: jnp.ndarray,
    mask: jnp.ndarray | None,
    axes: tuple[int, ...],
    reduce_sum,
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


@_max_deviation.defjvp
def _max_deviation_jvp(axes, reduce_sum, primals, tangents):
    values, mean, high, low, mask = primals
    values_dot, mean_dot = tangents[0], tangents[1]
    dispersion = _max_deviation(values, mean, high, low, mask, axes, reduce_sum)
    upper = high - mean >= mean - low
    extreme = jnp.where(upper, high, low)

    def hits(extreme: jnp.ndarray) -> jnp.ndarray:
        hit = values == extreme.astype(values.dtype)  # exact: the extremes are elements of ``values``
        return hit if mask is None else hit & mask

    # the count compares against a distinct copy of the extreme, so XLA fuses it into its reduction,
    # and is counted through bfloat16 (0 and 1 exactly), the narrowest indicator XLA:CPU reduces fast
    indicator = hits(distinct(extreme)).astype(jnp.bfloat16)
    count = reduce_sum(jnp.sum(indicator, axes, keepdims=True, dtype=mean.dtype))
    picked_dot = jnp.where(hits(extreme), values_dot, 0)
    picked = reduce_sum(jnp.sum(picked_dot, axes, keepdims=True, dtype=mean.dtype))
    slope = jnp.where(upper, 1, -1).astype(mean.dtype) * (picked / jnp.maximum(count, 1) - mean_dot)
    return dispersion, jnp.where(dispersion > 0, slope, 0)


def _topk_mean(largest: jnp.ndarray, mean: jnp.ndarray, count: jnp.ndarray, k: int) -> jnp.ndarray:
    """Mean of the k largest deviations (``largest``: (features..., k), -1 where fewer than k elements),
    in the keepdims shape of ``mean``; ``count`` is the number of elements per feature."""
    total = jnp.sum(jnp.maximum(largest, 0), axis=-1)
    return total.reshape(mean.shape) / jnp.clip(count, 1, k)


def _largest_deviations_per_feature(
    values: jnp.ndarray, mean: jnp.ndarray, axes: tuple[int, ...], k: int, mask: jnp.ndarray | None
) -> jnp.ndarray:
    """The k largest ``|values - mean|`` over ``axes`` per feature, (features..., k).

    ``values`` is ``x`` in its own dtype, ``mean`` its mean, keepdims, in the statistics dtype.
    """
    valid = None if mask is None else as_columns(jnp.broadcast_to(mask, values.shape), axes)
    largest = _largest_deviations(as_columns(values, axes), as_columns(mean, axes), valid, k)
    return largest.reshape(*kept_shape(values, axes), k)


def _extreme_candidates(
    values: jnp.ndarray, count: jnp.ndarray, axes: tuple[int, ...], k: int, mask: jnp.ndarray | None
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """This device's candidates for the k largest deviations from a mean not known yet.

    Whatever the mean ``mu``, the k largest ``|x - mu|`` of a set lie among its k largest and its k
    smallest values; over several devices, among those of each device. Returns, per feature, this
    device's ``k' = min(k, rows)`` largest and ``k'`` smallest values and which of them are real
    elements, ``(values, valid)``, each (features..., 2k'), in the statistics dtype, zero where not
    valid (gathered across devices, they must be finite). The j-th smallest is dropped when it is also
    among the ``k'`` largest (fewer than ``2k'`` elements), so that no element is counted twice.
    """
    columns = as_columns(values, axes)
    valid = None if mask is None else as_columns(jnp.broadcast_to(mask, values.shape), axes)
    kept = min(k, columns.shape[0])
    dtype = stats_dtype(values)
    largest = _largest_values(columns, valid, kept, dtype)  # (features, k')
    smallest = -_largest_values(-columns, valid, kept, dtype)
    elements = as_columns(jnp.broadcast_to(count, keepdims_shape(values, axes)), axes)[0][:, None]
    rank = jnp.arange(kept, dtype=dtype)
    is_valid = jnp.concatenate([jnp.broadcast_to(rank < elements, largest.shape),
                                jnp.broadcast_to(rank < elements - kept, smallest.shape)], axis=-1)
    candidates = jnp.where(is_valid, jnp.concatenate([largest, smallest], axis=-1), 0)
    shape = (*kept_shape(values, axes), 2 * kept)
    return candidates.reshape(shape), is_valid.astype(dtype).reshape(shape)


def _largest_candidate_deviations(
    candidates: jnp.ndarray, valid: jnp.ndarray, mean: jnp.ndarray, axes: tuple[int, ...], k: int
) -> jnp.ndarray:
    """The k largest ``|candidate - mean|`` per feature, (features..., k), from the candidates of every
    device (:func:`_extreme_candidates`, gathered: (devices, features..., 2k'))."""
    merged = lambda a: jnp.moveaxis(a, 0, -2).reshape(*a.shape[1:-1], -1)
    centre = jnp.squeeze(mean, axes)[..., None]
    deviations = jnp.where(merged(valid) > 0, jnp.abs(merged(candidates) - centre), -1.0)
    return lax.top_k(deviations, k)[0]


_TOPK_BLOCK = 32


def _two_stage_top_k(
    columns: jnp.ndarray, valid: jnp.ndarray | None, k: int, score, block_bound
) -> jnp.ndarray:
    """The ``k`` largest ``score(values, valid)`` of each column of ``columns`` (rows, features), as
    (features, k).

    Two stages instead of one ``lax.top_k`` over every score (a sort on CPU, after a transposed
    copy): the rows are cut into blocks of up to 32, and the k largest scores all lie in the k blocks
    whose largest score is largest (an entry outside them is below k block maxima).
    ``block_bound(blocks, valid)`` gives each block's largest score (num_blocks, features) from
    reductions of the blocks that XLA runs fast; only the k blocks kept are scored element by element.
    Ties do not change the values returned.
    """
    rows = columns.shape[0]
    size = _largest_divisor(rows, _TOPK_BLOCK)
    num_blocks = rows // size
    if size < 4 or num_blocks < k:
        return lax.top_k(jnp.transpose(score(columns, valid)), k)[0]
    blocks = columns.reshape(num_blocks, size, -1)
    valid = None if valid is None else valid.reshape(blocks.shape)
    _, best = lax.top_k(jnp.transpose(lax.stop_gradient(block_bound(blocks, valid))), k)  # (features, k)
    pick = lambda a: jnp.take_along_axis(a, jnp.transpose(best)[:, None, :], axis=0)  # (k, size, features)
    candidates = score(pick(blocks), None if valid is None else pick(valid))
    return lax.top_k(jnp.moveaxis(candidates, -1, 0).reshape(columns.shape[1], -1), k)[0]


def _largest_deviations(
    columns: jnp.ndarray, centre: jnp.ndarray, valid: jnp.ndarray | None, k: int
) -> jnp.ndarray:
    """The ``k`` largest ``|columns - centre|`` of each column (rows, features), as (features, k).

    ``centre`` is (1, features) in the statistics dtype; entries where ``valid`` is False never count
    (they take -1). A block's largest deviation (:func:`_two_stage_top_k`) is
    ``max(max x - centre, centre - min x)``, from its extremes, which are exact in the input dtype and
    the fastest reductions XLA:CPU has: no full-size ``|x - centre|`` is computed, only those of the k
    blocks kept.
    """

    def deviations(values: jnp.ndarray, valid: jnp.ndarray | None) -> jnp.ndarray:
        deviation = jnp.abs(values.astype(centre.dtype) - centre)
        return deviation if valid is None else jnp.where(valid, deviation, -1.0)

    def block_largest(blocks: jnp.ndarray, valid: jnp.ndarray | None) -> jnp.ndarray:
        high, low = _masked_extremes(blocks, valid, lambda a, op: op(a, axis=1).astype(centre.dtype))
        return jnp.maximum(high - centre, centre - low)

    return _two_stage_top_k(columns, valid, k, deviations, block_largest)


def _largest_values(columns: jnp.ndarray, valid: jnp.ndarray | None, k: int, dtype) -> jnp.ndarray:
    """The ``k`` largest entries of each column (rows, features), as (features, k) in ``dtype``;
    entries where ``valid`` is False never count (they take -inf)."""

    def values(entries: jnp.ndarray, valid: jnp.ndarray | None) -> jnp.ndarray:
        entries = entries.astype(dtype)
        return entries if valid is None else jnp.where(valid, entries, -jnp.inf)

    def block_largest(blocks: jnp.ndarray, valid: jnp.ndarray | None) -> jnp.ndarray:
        return jnp.max(blocks if valid is None else jnp.where(valid, blocks, -jnp.inf), axis=1).astype(dtype)

    return _two_stage_top_k(columns, valid, k, values, block_largest)
