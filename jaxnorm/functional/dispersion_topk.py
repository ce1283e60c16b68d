"""The top-k L∞ dispersion, ``sigma_hat = C(n) * mean of the k largest |x - mu|`` (Hoffer et al.,
*Norm matters*, NeurIPS 2018, Sec. 3 and supplementary Eq. 1; calibrated as L∞).

Whatever the mean ``mu``, the k largest ``|x - mu|`` of a set lie among its k largest and its k smallest
values, and over several devices among those of each device: across devices each sends these
candidates with its moments, in one collective (an all-gather), and the largest and smallest
candidates are the extremes that make the mean of a constant group exact. On one device a two-stage
``top_k`` finds the k largest deviations without sorting every one.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from jaxnorm.functional.calibration import linf_calibration
from jaxnorm.functional.collectives import gather_combine
from jaxnorm.functional.moments import (
    as_columns,
    group_combine,
    keepdims_shape,
    kept_shape,
    local_moments,
    stats_dtype,
)
from jaxnorm.functional.options import BatchOptions
from jaxnorm.functional.platform import separate_reads
from jaxnorm.functional.reduction import (
    Reduction,
    empty_statistics,
    exact_mean,
    exact_mean_from_extremes,
    largest_divisor,
    masked_extremes,
    masked_mean,
)
from jaxnorm.functional.units import Statistics, variance_in_unit

__all__ = ["TOPK_BLOCK", "topk_statistics"]


def topk_statistics(r: Reduction, options: BatchOptions) -> Statistics:
    """``(mean, sigma_hat**2, unit)`` with the calibrated top-k ``sigma_hat``, keepdims; the mean exact for
    constant groups."""
    k = options.topk
    moments_source, deviations = separate_reads(r.x, 2)
    moments = group_combine(local_moments(moments_source, r.axes, mask=r.mask, with_m2=False), r.groups)
    if r.axis_name is None:
        moments = masked_mean(moments, r.mask)
        # the deviations about the exact mean: a constant group's are 0, not sum x / n's rounding error
        exact = exact_mean(moments, r._replace(deviations=deviations))
        largest = _largest_deviations_per_feature(deviations, exact, r.axes, k, r.mask)
    else:
        candidates = _extreme_candidates(deviations, moments.count, r.axes, k, r.mask)
        moments, _, (values, valid) = gather_combine(moments, r.axis_name, r.axis_index_groups, candidates)
        moments = masked_mean(moments, r.mask)
        exact = exact_mean_from_extremes(moments.mean, *_candidate_extremes(values, valid, moments.mean))
        largest = _largest_candidate_deviations(values, valid, exact, r.axes, k)
    dispersion = _topk_mean(largest, moments.mean, moments.count, k)
    constant = linf_calibration(moments.count, k, options.calibration)
    dispersion = dispersion * constant.astype(dispersion.dtype)
    mean = masked_mean(moments._replace(mean=exact), r.mask).mean
    var, unit, sigma = variance_in_unit(dispersion, options.tiny_groups)
    var, sigma = (empty_statistics(a, moments.count, r.mask) for a in (var, sigma))
    return Statistics(mean, var, unit, sigma)


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

    Returns, per feature, this device's ``k' = min(k, rows)`` largest and ``k'`` smallest values and
    which of them are real elements, ``(values, valid)``, each (features..., 2k'), in the statistics
    dtype, zero where not valid (gathered across devices, they must be finite). The j-th smallest is
    dropped when it is also among the ``k'`` largest (fewer than ``2k'`` elements), so that no element
    is counted twice.
    """
    columns = as_columns(values, axes)
    valid = None if mask is None else as_columns(jnp.broadcast_to(mask, values.shape), axes)
    kept = min(k, columns.shape[0])
    dtype = stats_dtype(values)
    largest = _largest_values(columns, valid, kept, dtype)  # (features, k')
    smallest = -_largest_values(-columns, valid, kept, dtype)
    elements = as_columns(jnp.broadcast_to(count, keepdims_shape(values, axes)), axes)[0][:, None]
    rank = jnp.arange(kept, dtype=dtype)
    is_valid = jnp.concatenate(
        [
            jnp.broadcast_to(rank < elements, largest.shape),
            jnp.broadcast_to(rank < elements - kept, smallest.shape),
        ],
        axis=-1,
    )
    candidates = jnp.where(is_valid, jnp.concatenate([largest, smallest], axis=-1), 0)
    shape = (*kept_shape(values, axes), 2 * kept)
    return candidates.reshape(shape), is_valid.astype(dtype).reshape(shape)


def _merged(a: jnp.ndarray) -> jnp.ndarray:
    """Gathered candidates (devices, features..., 2k') as (features..., devices * 2k')."""
    return jnp.moveaxis(a, 0, -2).reshape(*a.shape[1:-1], -1)


def _candidate_extremes(
    values: jnp.ndarray, valid: jnp.ndarray, mean: jnp.ndarray
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """``max x`` and ``min x`` of each group, in the keepdims shape of ``mean``: the largest and the
    smallest of the gathered candidates (every device's largest and smallest values are among them)."""
    is_valid = _merged(valid) > 0
    high = jnp.max(jnp.where(is_valid, _merged(values), -jnp.inf), axis=-1)
    low = jnp.min(jnp.where(is_valid, _merged(values), jnp.inf), axis=-1)
    return high.reshape(mean.shape), low.reshape(mean.shape)


def _largest_candidate_deviations(
    values: jnp.ndarray, valid: jnp.ndarray, mean: jnp.ndarray, axes: tuple[int, ...], k: int
) -> jnp.ndarray:
    """The k largest ``|candidate - mean|`` per feature, (features..., k), from the candidates of every
    device (:func:`_extreme_candidates`, gathered: (devices, features..., 2k'))."""
    centre = jnp.squeeze(mean, axes)[..., None]
    deviations = jnp.where(_merged(valid) > 0, jnp.abs(_merged(values) - centre), -1.0)
    return lax.top_k(deviations, k)[0]


TOPK_BLOCK = 32
"""Rows per block of the two-stage top-k (:func:`_two_stage_top_k`)."""


def _two_stage_top_k(
    columns: jnp.ndarray, valid: jnp.ndarray | None, k: int, score, block_bound
) -> jnp.ndarray:
    """The ``k`` largest ``score(values, valid)`` of each column of ``columns`` (rows, features), as
    (features, k).

    Two stages instead of one ``lax.top_k`` over every score (a sort on CPU, after a transposed
    copy): the rows are cut into blocks of up to ``TOPK_BLOCK``, and the k largest scores all lie in the
    k blocks whose largest score is largest (an entry outside them is below k block maxima).
    ``block_bound(blocks, valid)`` gives each block's largest score (num_blocks, features) from
    reductions of the blocks; only the k blocks kept are scored element by element. Ties do not change
    the values returned.
    """
    rows = columns.shape[0]
    size = largest_divisor(rows, TOPK_BLOCK)
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
    ``max(max x - centre, centre - min x)``, from its extremes, which are exact in the input dtype: no
    full-size ``|x - centre|`` is computed, only those of the k blocks kept.
    """

    def deviations(values: jnp.ndarray, valid: jnp.ndarray | None) -> jnp.ndarray:
        deviation = jnp.abs(values.astype(centre.dtype) - centre)
        return deviation if valid is None else jnp.where(valid, deviation, -1.0)

    def block_largest(blocks: jnp.ndarray, valid: jnp.ndarray | None) -> jnp.ndarray:
        high, low = masked_extremes(blocks, valid, lambda a, op: op(a, axis=1).astype(centre.dtype))
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
