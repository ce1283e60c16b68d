r"""Moments and Lp dispersions, their Gaussian-calibrating constants, masks and cross-device reduction.

Every activation normalization in jaxnorm computes, per normalized group, a mean ``mu`` and an Lp
dispersion ``sigma_hat`` calibrated so that ``sigma_hat`` estimates the standard deviation of Gaussian
data (Hoffer et al., *Norm matters*, NeurIPS 2018, Sec. 3; supplementary Sec. 2, Eq. 1):

- ``p = 2``:  ``sigma_hat = sqrt(mean((x - mu)^2))`` (the biased std, as flax and PyTorch use)
- ``p = 1``:  ``sigma_hat = sqrt(pi / 2) * mean|x - mu|``
- ``p = inf``: ``sigma_hat = C(n) * max|x - mu|``, ``C(n) = (1 + sqrt(pi ln 4)) / (2 sqrt(2 ln n))``
- top-k:    ``sigma_hat = C(n) * mean of the k largest |x - mu|``

The functions return ``var = sigma_hat**2`` so that normalization is ``(x - mu) * rsqrt(var + eps)``
for every ``p`` — the train and eval paths share one formula and, for ``p = 2``, it is exactly flax's.

Numerics. Statistics are accumulated in float32 (or float64) for half-precision inputs. Batch-style
reductions read ``x`` once for the shifted sums ``sum (x - K)`` and ``sum (x - K)^2`` about one element
``K`` of each group, and check the conditioning of every group: where they would cancel, a
:func:`jax.lax.cond` recomputes the moments about the mean with the *shifted-data* algorithm.
Reductions over the last axis (layer norm) take the exact two passes, which XLA fuses into one kernel
per row. Partial moments — per device, per channel of a group — are merged with Chan et al.'s pairwise
formula (``count``, ``mean``, ``M2``), exact for unequal counts (masks) and needing one collective.
Derivatives are hand-written (custom JVPs) where autodiff would write full-size temporaries: see
:func:`local_moments`.

References:
  Hoffer, Banner, Golan & Soudry, *Norm matters*, NeurIPS 2018, Sec. 3 and supplementary Sec. 2.
  Chan, Golub & LeVeque, *Algorithms for computing the sample variance*, The American Statistician 1983.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxnorm.functional._checks import (
    PNorm,
    canonical_axes,
    canonical_p,
    check_axis_name,
    check_bool,
    check_floating,
    check_mask,
    check_positive_int,
)
from jaxnorm.functional.platform import distinct, separate_reads

__all__ = [
    "L1_CONSTANT",
    "batch_moments",
    "batch_stats",
    "expected_topk_abs_normal",
    "linf_constant",
]

Calibration = Literal["paper", "exact"]
AxisIndexGroups = Sequence[Sequence[int]] | None

L1_CONSTANT = math.sqrt(math.pi / 2)
"""``sqrt(pi / 2)``: ``E|x - mu| = sigma * sqrt(2 / pi)`` for Gaussian ``x`` (Norm matters, suppl. Sec. 2)."""

_LINF_NUMERATOR = (1 + math.sqrt(math.pi * math.log(4))) / 2


def linf_constant(n: jnp.ndarray | int) -> jnp.ndarray:
    """The paper's L∞ constant ``C(n) = (1 + sqrt(pi ln 4)) / (2 sqrt(2 ln n))`` (suppl. Sec. 2.1).

    It sits between the bounds of ``E max_i |x_i - mu| / sigma`` and over-estimates sigma by about
    1.4x on Gaussian data (normalized outputs have std ~0.7); see :func:`expected_topk_abs_normal` for
    the exactly calibrated alternative. ``n`` may be traced; ``n < 2`` is treated as ``n = 2``.
    """
    n = jnp.maximum(_as_float(n), 2.0)
    return _LINF_NUMERATOR / jnp.sqrt(2 * jnp.log(n))


def _as_float(n: jnp.ndarray | int) -> jnp.ndarray:
    """``n`` as a float array: its own floating dtype, else the default float (float64 under x64)."""
    n = jnp.asarray(n)
    return n if jnp.issubdtype(n.dtype, jnp.floating) else n.astype(jnp.result_type(float))


_QUADRATURE_NODES = 256


def expected_topk_abs_normal(n: jnp.ndarray | int, k: int = 1) -> jnp.ndarray:
    r"""``E[mean of the k largest of n i.i.d. |N(0, 1)|]``; ``n`` may be traced.

    With ``q(x) = P(|Z| > x) = erfc(x / sqrt 2)`` the number of samples above ``x`` is
    ``Binomial(n, q(x))``, and ``E[sum of top k] = \int_0^\infty E[min(N_x, k)] dx
    = \int_0^\infty \sum_{m=1}^k I_{q(x)}(m, n - m + 1) dx`` (``I`` the regularized incomplete beta).
    The integral is taken by 256-node Gauss–Legendre quadrature on ``[0, sqrt(2 (ln n + 30))]``, beyond
    which the integrand is below 1e-13: relative error ~1e-12 in float64, ~1e-4 in float32 (limited by
    float32 ``betainc``; negligible next to the sampling noise of a batch statistic). For ``k = 1``
    this is ``E max_i |Z_i|``, whose inverse is the exactly calibrated L∞ constant
    (``calibration="exact"``); deviations are taken from the batch mean, which makes ``sigma_hat``
    estimate the biased std, the same quantity that L2 batch norm uses.
    """
    k = check_positive_int(k, "k")
    n = jnp.maximum(_as_float(n), float(k))
    nodes, weights = (jnp.asarray(a, n.dtype) for a in _gauss_legendre(_QUADRATURE_NODES))
    upper = jnp.sqrt(2 * (jnp.log(n) + 30.0))
    x = 0.5 * upper[..., None] * (nodes + 1)  # (..., nodes)
    q = jax.scipy.special.erfc(x / math.sqrt(2))
    m = jnp.arange(1, k + 1, dtype=n.dtype)  # (k,)
    tail = jax.scipy.special.betainc(m, n[..., None, None] - m + 1, q[..., None])  # (..., nodes, k)
    integral = 0.5 * upper * jnp.sum(weights * jnp.sum(tail, axis=-1), axis=-1)
    return lax.stop_gradient(integral / k)


def _gauss_legendre(num: int) -> tuple[list[float], list[float]]:
    import numpy as np  # host-side constants only

    nodes, weights = np.polynomial.legendre.leggauss(num)
    return nodes.tolist(), weights.tolist()


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

    - Reductions over the last (contiguous) axis — layer norm, RMS-style per-example norms — take the
      exact two passes ``M2 = sum (x - mean)^2``: XLA fuses the whole normalization of a row into one
      kernel, so the second pass costs nothing.
    - Other reductions — batch norm, group / instance norm over spatial axes — read ``x`` once for the
      shifted sums ``sum (x - K)`` and ``sum (x - K)^2`` about ``K``, the group's first element
      (:func:`first_element`), and keep ``M2 = sum (x - K)^2 - (sum (x - K))^2 / n`` when every group
      is well conditioned, ``(mean - K)^2 <= CONDITION_LIMIT * var``. Otherwise — the cancellation case,
      where that M2 is rounding noise — a :func:`jax.lax.cond` takes a second pass on the data shifted
      by the mean, ``d = x - mean``: ``M2 = sum d^2 - (sum d)^2 / n`` and ``mean + sum d / n`` (the
      shifted-data algorithm, Chan et al. 1983). Only one branch runs (both under ``vmap`` with a
      batched predicate). ``one_pass=False`` always takes the second pass.

    The mean is ``K + sum (x - K) / n``: a constant group has exactly the mean ``K`` and ``M2 = 0``, so
    it normalizes to exactly 0 at every p. The derivatives are the
    exact ones, ``d mean = sum(dx) / n`` and ``d M2 = 2 sum((x - mean) dx)``, by a custom JVP: the branch
    taken does not change the backward pass.
    """
    dtype = stats_dtype(x)
    if mask is None:
        count = jnp.asarray(math.prod(x.shape[a] for a in axes), dtype)
    else:
        count = jnp.sum(mask, axis=axes, keepdims=True, dtype=dtype)
    if not with_m2:
        shift = first_element(x, axes, mask)
        total = jnp.sum(_shifted(x, shift, mask), axis=axes, keepdims=True)
        return Moments(count, shift + total / jnp.maximum(count, 1), None)
    return Moments(count, *_mean_m2(x, count, mask, axes, one_pass))


def first_element(x: jnp.ndarray, axes: tuple[int, ...], mask: jnp.ndarray | None = None) -> jnp.ndarray:
    """The first element of each group over the reduced ``axes`` (the first one ``mask`` keeps, if given),
    keepdims, in the statistics dtype: the shift ``K`` of the shifted-data sums ``sum (x - K)``. A
    constant group, or a group with one kept element, then has exactly the deviation 0 and its mean is
    exactly ``K``. A constant for differentiation (the mean and the moments do not depend on ``K``)."""
    if mask is None:
        index = tuple(slice(0, 1) if a in axes else slice(None) for a in range(x.ndim))
        return lax.stop_gradient(x[index].astype(stats_dtype(x)))
    front = tuple(range(len(axes)))
    kept_shape = _kept_shape(x, axes)
    values = jnp.moveaxis(x, axes, front).reshape(-1, *kept_shape)
    first = jnp.argmax(jnp.moveaxis(mask, axes, front).reshape(-1, *kept_shape), axis=0)
    shift = jnp.take_along_axis(values, first[None], axis=0).reshape(_keepdims_shape(x, axes))
    return lax.stop_gradient(shift.astype(stats_dtype(x)))


def _shifted(x: jnp.ndarray, shift: jnp.ndarray, mask: jnp.ndarray | None) -> jnp.ndarray:
    """``x - shift`` in the statistics dtype, zero where masked."""
    values = x.astype(shift.dtype) - shift
    return values if mask is None else jnp.where(mask, values, 0)


def _widen(x: jnp.ndarray, mask: jnp.ndarray | None) -> jnp.ndarray:
    """``x`` in the statistics dtype, zero where masked."""
    values = x.astype(stats_dtype(x))
    return values if mask is None else jnp.where(mask, values, 0)


@functools.partial(jax.custom_jvp, nondiff_argnums=(3, 4))
def _mean_m2(
    x: jnp.ndarray, count: jnp.ndarray, mask: jnp.ndarray | None, axes: tuple[int, ...], one_pass: bool
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Mean and M2 of ``x`` (unmasked elements, statistics dtype) over ``axes``; see :func:`local_moments`."""
    return _mean_m2_value(x, count, mask, axes, one_pass, opaque_mean=False)


def _mean_m2_value(
    x: jnp.ndarray,
    count: jnp.ndarray,
    mask: jnp.ndarray | None,
    axes: tuple[int, ...],
    one_pass: bool,
    *,
    opaque_mean: bool,
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """:func:`_mean_m2`'s value. ``opaque_mean`` centres on a ``distinct`` copy of the mean: under
    differentiation the mean has other full-size consumers, and XLA would otherwise write ``x - mean``
    out; without it, a row's whole normalization stays one fused kernel."""
    safe_count = jnp.maximum(count, 1)
    last_axis = x.ndim - 1 in axes
    sum_source, square_source = (x, x) if last_axis else separate_reads(x, 2)
    # shifted-data sums about K, one element of the group: a constant group gives exactly 0 and K
    shift = first_element(x, axes, mask)
    total = jnp.sum(_shifted(sum_source, shift, mask), axis=axes, keepdims=True)
    mean = shift + total / safe_count

    def deviations(centre: jnp.ndarray) -> jnp.ndarray:
        d = x.astype(centre.dtype) - centre
        return d if mask is None else jnp.where(mask, d, 0)

    def centred_pass() -> tuple[jnp.ndarray, jnp.ndarray]:
        d = deviations(distinct(mean) if opaque_mean else mean)
        return mean, jnp.sum(jnp.square(d), axis=axes, keepdims=True)

    def shifted_pass() -> tuple[jnp.ndarray, jnp.ndarray]:
        # the shifted-data algorithm about the mean: exact whatever the rounding error of that mean
        d = deviations(distinct(mean))
        d_total = jnp.sum(d, axis=axes, keepdims=True)
        m2 = jnp.sum(jnp.square(d), axis=axes, keepdims=True) - d_total * d_total / safe_count
        return mean + d_total / safe_count, jnp.maximum(m2, 0)

    if last_axis:
        return centred_pass()
    if not one_pass:
        return shifted_pass()
    between = total * total / safe_count
    raw_m2 = jnp.sum(jnp.square(_shifted(square_source, shift, mask)), axis=axes, keepdims=True) - between
    well_conditioned = jnp.all(between <= CONDITION_LIMIT * raw_m2)
    return lax.cond(well_conditioned, lambda: (mean, jnp.maximum(raw_m2, 0)), shifted_pass)


@_mean_m2.defjvp
def _mean_m2_jvp(axes, one_pass, primals, tangents):
    x, count, mask = primals
    values_dot = _widen(tangents[0], mask)
    mean, m2 = _mean_m2_value(x, count, mask, axes, one_pass, opaque_mean=True)
    mean_dot = jnp.sum(values_dot, axis=axes, keepdims=True) / jnp.maximum(count, 1)
    # a distinct copy of the mean: ``x - mean`` is then not shared with the caller's ``x - mean``,
    # which XLA would write to memory rather than recompute inside each of the two reductions
    deviation = x.astype(mean.dtype) - distinct(mean, tag=1)
    m2_dot = 2 * jnp.sum(deviation * values_dot, axis=axes, keepdims=True)
    return (mean, m2), (mean_dot, m2_dot)


def combine_moments(moments: Moments, axis: int) -> Moments:
    """Merge partial moments along ``axis`` (keepdims) with Chan et al.'s formula.

    ``n = sum n_i``, ``mean = mean_0 + sum n_i (mean_i - mean_0) / n`` (about the first part's mean, so
    equal means merge exactly), ``M2 = sum M2_i + sum n_i (mean_i - mean)^2``.
    Exact for unequal counts; groups with ``n = 0`` contribute nothing.
    """
    count = jnp.broadcast_to(moments.count, moments.mean.shape)
    total = jnp.sum(count, axis=axis, keepdims=True)
    safe_total = jnp.maximum(total, 1)
    # about the first part's mean, so that equal means merge to exactly that mean (a constant group)
    reference = lax.index_in_dim(moments.mean, 0, axis, keepdims=True)
    mean = reference + jnp.sum(count * (moments.mean - reference), axis=axis, keepdims=True) / safe_total
    if moments.m2 is None:
        return Moments(total, mean, None)
    between = jnp.sum(count * jnp.square(moments.mean - mean), axis=axis, keepdims=True)
    return Moments(total, mean, jnp.sum(moments.m2, axis=axis, keepdims=True) + between)


def _axis_size(axis_name: str | Sequence[str] | None, axis_index_groups: AxisIndexGroups) -> int:
    """How many devices share the statistics: 1 without ``axis_name``, else the size of the mapped axis
    (or of a group of ``axis_index_groups``)."""
    if axis_name is None:
        return 1
    return len(axis_index_groups[0]) if axis_index_groups is not None else lax.axis_size(axis_name)


def gather_invariant(x, axis_name: str | Sequence[str], axis_index_groups: AxisIndexGroups = None):
    """Stack each array of the pytree ``x`` from every device of ``axis_name`` (or of this device's
    group) on a new axis 0, in one collective.

    The arrays travel as one flat vector, in one ``psum`` of one-hot slots rather than ``all_gather``:
    the same bytes on the wire, and the result is known to be replicated, so ``shard_map(...,
    out_specs=P())`` accepts statistics computed from it. The arrays must be finite (a slot of another
    device holds ``0 * x``) and share one dtype.
    """
    index = lax.axis_index(axis_name)
    size = _axis_size(axis_name, axis_index_groups)
    if axis_index_groups is not None:
        position = [0] * sum(len(group) for group in axis_index_groups)
        for group in axis_index_groups:
            for slot, device in enumerate(group):
                position[device] = slot
        index = jnp.asarray(position)[index]
    leaves, treedef = jax.tree.flatten(x)
    flat = jnp.concatenate([jnp.ravel(a) for a in leaves])
    onehot = (jnp.arange(size) == index).astype(flat.dtype)[:, None]
    gathered = lax.psum(onehot * flat[None], axis_name, axis_index_groups=axis_index_groups)
    offsets = list(itertools.accumulate(a.size for a in leaves))[:-1]
    parts = jnp.split(gathered, offsets, axis=1)
    return jax.tree.unflatten(
        treedef, [part.reshape(size, *a.shape) for part, a in zip(parts, leaves, strict=True)]
    )


def _gather_combine(
    moments: Moments, axis_name, axis_index_groups, extra: tuple[jnp.ndarray, ...] = ()
) -> tuple[Moments, jnp.ndarray, tuple[jnp.ndarray, ...]]:
    """Gather per-device moments and the ``extra`` arrays in one collective; merge the moments exactly
    (Chan et al.). Returns the merged moments, the per-device counts and the gathered ``extra``, each
    stacked on a new axis 0 (devices)."""
    count = jnp.broadcast_to(moments.count, moments.mean.shape)
    parts = [count, moments.mean] + ([] if moments.m2 is None else [moments.m2])
    gathered, gathered_extra = gather_invariant((jnp.stack(parts), extra), axis_name, axis_index_groups)
    merged = combine_moments(
        Moments(gathered[:, 0], gathered[:, 1], None if moments.m2 is None else gathered[:, 2]), 0
    )
    squeeze = lambda a: None if a is None else a[0]
    return Moments(*map(squeeze, merged)), gathered[:, 0], gathered_extra


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


def _group_reduce(stat: jnp.ndarray, groups: ChannelGroups | None, op) -> jnp.ndarray:
    """Reduce a keepdims per-channel statistic over the channels of each group (sum or max)."""
    if groups is None:
        return stat
    reduced = op(_split_groups(stat, groups, stat.shape), axis=groups.channel_axis + 1, keepdims=True)
    return _merge_groups(reduced, groups, stat.shape)


def _group_combine(moments: Moments, groups: ChannelGroups | None) -> Moments:
    """Merge per-channel moments into per-group moments, broadcast back to the channels."""
    if groups is None:
        return moments
    shape = moments.mean.shape
    split = lambda a: None if a is None else _split_groups(a, groups, shape)
    merged = combine_moments(Moments(*map(split, moments)), groups.channel_axis + 1)
    merge = lambda a: None if a is None else _merge_groups(a, groups, shape)
    return Moments(*map(merge, merged))


def dispersion_moments(
    x: jnp.ndarray,
    axes: tuple[int, ...],
    *,
    p: PNorm,
    topk: int | None = None,
    mask: jnp.ndarray | None = None,
    axis_name: str | Sequence[str] | None = None,
    axis_index_groups: AxisIndexGroups = None,
    calibration: Calibration = "paper",
    one_pass: bool = True,
    groups: ChannelGroups | None = None,
    mean_only: bool = False,
) -> tuple[jnp.ndarray, jnp.ndarray | None]:
    """``(mean, sigma_hat**2)`` of ``x`` over ``axes`` (keepdims, float32 or wider); the engine of every norm.

    The arguments have been validated by the caller. ``groups`` merges channels after the per-channel
    reduction; ``axis_name`` merges devices, in one collective for L2 (an all-gather of count, mean and
    M2) and L∞ (count, mean, ``max x`` and ``min x``; with top-k, each device's k largest and k smallest
    values, among which the k largest deviations from the global mean lie). L1 takes two: its
    ``sum |x - mu|`` needs the global mean first.

    L∞ takes ``max |x - mu| = max(max x - mu, mu - min x)``: two plain reductions of ``x``, no pass over
    the deviations. For L1, L∞ and top-k the mean is the plain ``sum x / n``: XLA reduces in a tree, so
    its error is a few float32 ulps of the mean, the resolution of the data at that magnitude anyway
    (the cancellation that needs care is the variance's, handled in :func:`local_moments`).
    """
    # the deviations (L1, L-inf, top-k) read x once more
    with_deviations = p != 2 and not mean_only
    moments_source, deviation_source = separate_reads(x, 2) if with_deviations else (x, x)
    moments = local_moments(
        moments_source, axes, mask=mask, with_m2=(p == 2 and not mean_only), one_pass=one_pass
    )
    moments = _group_combine(moments, groups)
    # What L-inf needs besides the mean does not depend on it, so it joins the moments' collective:
    # the extremes max x and min x, or for top-k each device's k largest and k smallest values.
    extremes = p == "inf" and not mean_only and topk is None
    extra = ()
    if extremes:
        # max and min are exact in the input dtype: no widening (for bf16, none written to memory)
        extreme = lambda a, op: _extreme(a, axes, op).astype(moments.mean.dtype)
        high, low = _masked_extremes(deviation_source, mask, extreme)
        extra = (_group_reduce(high, groups, jnp.max), _group_reduce(low, groups, jnp.min))
    elif topk is not None and axis_name is not None:
        extra = _extreme_candidates(deviation_source, moments.count, axes, topk, mask)
    if axis_name is not None:
        if extremes:  # a device without elements has extremes -inf / +inf: it sends 0 instead
            occupied = jnp.broadcast_to(moments.count, moments.mean.shape) > 0
            extra = tuple(jnp.where(occupied, a, 0) for a in extra)
        moments, device_counts, extra = _gather_combine(moments, axis_name, axis_index_groups, extra)
        if extremes:
            high, low = extra
            occupied = device_counts > 0
            extra = (jnp.max(jnp.where(occupied, high, -jnp.inf), axis=0),
                     jnp.min(jnp.where(occupied, low, jnp.inf), axis=0))
    if mask is not None:  # a group without elements: mean 0 and variance 1 (see empty_statistics)
        moments = moments._replace(mean=jnp.where(moments.count > 0, moments.mean, 0))
    if mean_only:
        return moments.mean, None
    if p == 2:
        return moments.mean, empty_statistics(moments.m2 / jnp.maximum(moments.count, 1), moments.count, mask)
    count, mean = moments.count, moments.mean

    def reduce_sum(stat: jnp.ndarray) -> jnp.ndarray:
        stat = _group_reduce(stat, groups, jnp.sum)
        return stat if axis_name is None else lax.psum(stat, axis_name, axis_index_groups=axis_index_groups)

    if topk is not None:
        if axis_name is None:
            largest = _largest_deviations_per_feature(deviation_source, mean, axes, topk, mask)
        else:
            largest = _largest_candidate_deviations(*extra, mean, axes, topk)
        dispersion = _topk_mean(largest, mean, count, topk)
    elif p == 1:
        total = _abs_deviation_sum(deviation_source.astype(mean.dtype), mean, count, mask, axes, reduce_sum)
        dispersion = L1_CONSTANT * total / jnp.maximum(count, 1)
    else:
        high, low = lax.stop_gradient(extra)
        dispersion = _max_deviation(x, mean, high, low, mask, axes, reduce_sum)
    if p == "inf":
        if calibration == "exact":
            dispersion = dispersion / expected_topk_abs_normal(count, topk or 1).astype(dispersion.dtype)
        else:
            dispersion = dispersion * linf_constant(count).astype(dispersion.dtype)
    return mean, empty_statistics(jnp.square(dispersion), count, mask)


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
    return op(partial.reshape(width, features), axis=0).reshape(_keepdims_shape(values, axes))


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
    deviation = jnp.abs(values - distinct(mean))
    deviation = deviation if mask is None else jnp.where(mask, deviation, 0)
    return reduce_sum(jnp.sum(deviation, axes, keepdims=True))


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


def _as_columns(a: jnp.ndarray, axes: tuple[int, ...]) -> jnp.ndarray:
    """``a`` as (reduced elements, features): the reduced ``axes`` first, the kept axes in order."""
    kept = tuple(i for i in range(a.ndim) if i not in axes)
    return jnp.transpose(a, axes + kept).reshape(-1, math.prod(a.shape[i] for i in kept))


def _kept_shape(a: jnp.ndarray, axes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(n for i, n in enumerate(a.shape) if i not in axes)


def _keepdims_shape(a: jnp.ndarray, axes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(1 if i in axes else n for i, n in enumerate(a.shape))


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
    valid = None if mask is None else _as_columns(jnp.broadcast_to(mask, values.shape), axes)
    largest = _largest_deviations(_as_columns(values, axes), _as_columns(mean, axes), valid, k)
    return largest.reshape(*_kept_shape(values, axes), k)


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
    columns = _as_columns(values, axes)
    valid = None if mask is None else _as_columns(jnp.broadcast_to(mask, values.shape), axes)
    kept = min(k, columns.shape[0])
    dtype = stats_dtype(values)
    largest = _largest_values(columns, valid, kept, dtype)  # (features, k')
    smallest = -_largest_values(-columns, valid, kept, dtype)
    elements = _as_columns(jnp.broadcast_to(count, _keepdims_shape(values, axes)), axes)[0][:, None]
    rank = jnp.arange(kept, dtype=dtype)
    is_valid = jnp.concatenate([jnp.broadcast_to(rank < elements, largest.shape),
                                jnp.broadcast_to(rank < elements - kept, smallest.shape)], axis=-1)
    candidates = jnp.where(is_valid, jnp.concatenate([largest, smallest], axis=-1), 0)
    shape = (*_kept_shape(values, axes), 2 * kept)
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


class BatchOptions(NamedTuple):
    """Batch norm's options after validation, passed down unchanged from the module to the kernel."""

    p: PNorm = 2
    topk: int | None = None
    calibration: Calibration = "paper"
    virtual_batch_size: int | None = None
    mean_only: bool = False
    use_fast_variance: bool = True


def check_batch_options(
    p: PNorm | float = 2,
    topk: int | None = None,
    calibration: Calibration = "paper",
    virtual_batch_size: int | None = None,
    mean_only: bool = False,
    use_fast_variance: bool = True,
) -> BatchOptions:
    """Validate batch norm's options, whatever the input; returns them canonical (``p`` in 1, 2, 'inf';
    NumPy integers and bools as Python ones).

    The modules call it in evaluation too, where the batch statistics (and their checks) are not
    computed: a wrong option fails at once, not at the first training step.
    """
    p = canonical_p(p)
    if topk is not None:
        topk = check_positive_int(topk, "topk")
        if p != "inf":
            raise ValueError(f"topk applies to p='inf' (top-k L∞ norm), got p={p!r}")
    if calibration not in ("paper", "exact"):
        raise ValueError(f"calibration must be 'paper' or 'exact', got {calibration!r}")
    if calibration == "exact" and p != "inf":
        raise ValueError(f"calibration='exact' (the L∞ constant) applies to p='inf', got p={p!r}")
    if virtual_batch_size is not None:
        virtual_batch_size = check_positive_int(virtual_batch_size, "virtual_batch_size")
    return BatchOptions(
        p,
        topk,
        calibration,
        virtual_batch_size,
        check_bool(mean_only, "mean_only"),
        check_bool(use_fast_variance, "use_fast_variance"),
    )


def _statistics_size(
    shape: tuple[int, ...], features: tuple[int, ...], virtual_batch_size: int | None
) -> int:
    """Elements per feature that batch statistics reduce over: every axis but ``features``, with axis 0
    cut into ghost batches of ``virtual_batch_size``."""
    batch = 1 if 0 in features else shape[0] if virtual_batch_size is None else virtual_batch_size
    return batch * math.prod(n for a, n in enumerate(shape) if a != 0 and a not in features)


def batch_gives_statistics(
    shape: tuple[int, ...], features: tuple[int, ...], virtual_batch_size: int | None = None
) -> bool:
    """Whether a batch of ``shape`` (feature axes ``features``) has the 2 elements per feature (per
    ghost batch of ``virtual_batch_size`` along axis 0) that :func:`batch_moments` needs."""
    if virtual_batch_size is not None and (virtual_batch_size < 1 or shape[0] % virtual_batch_size):
        return False  # (an invalid virtual_batch_size is reported by check_batch_options)
    return _statistics_size(shape, features, virtual_batch_size) >= 2


def ghost_batches(x: jnp.ndarray, virtual_batch_size: int) -> jnp.ndarray:
    """Split axis 0 of ``x`` into ghost batches: ``(B, ...) -> (B // v, v, ...)``."""
    return x.reshape(x.shape[0] // virtual_batch_size, virtual_batch_size, *x.shape[1:])


def batch_moments(
    x: jnp.ndarray,
    *,
    p: PNorm | float = 2,
    axis: int | Sequence[int] = -1,
    topk: int | None = None,
    mask: jnp.ndarray | None = None,
    axis_name: str | Sequence[str] | None = None,
    axis_index_groups: AxisIndexGroups = None,
    calibration: Calibration = "paper",
    virtual_batch_size: int | None = None,
    use_fast_variance: bool = True,
    mean_only: bool = False,
    keepdims: bool = False,
) -> tuple[jnp.ndarray, jnp.ndarray | None]:
    """Batch ``(mean, var)`` per feature, ``var = sigma_hat**2`` — what BatchNorm keeps as running stats.

    Reduces over every axis but ``axis`` (the feature axis or axes). Arguments as :func:`batch_stats`;
    ``mean_only=True`` returns ``(mean, None)``. With ``virtual_batch_size=v`` the leading (batch) axis
    is split into ``x.shape[0] // v`` ghost batches with statistics of their own, returned stacked on a
    new leading axis. Statistics are float32 (or float64) whatever ``x``'s dtype.
    """
    check_floating(x, "x")
    p, topk, calibration, virtual_batch_size, mean_only, use_fast_variance = check_batch_options(
        p, topk, calibration, virtual_batch_size, mean_only, use_fast_variance
    )
    check_axis_name(axis_name)
    features = canonical_axes(axis, x.ndim, "axis")
    mask = check_mask(mask, x)
    size = _statistics_size(x.shape, features, virtual_batch_size)
    if virtual_batch_size is not None:
        if 0 in features:
            raise ValueError(
                "virtual_batch_size splits axis 0 (the batch axis), which must not be a feature axis"
            )
        if x.shape[0] % virtual_batch_size:
            raise ValueError(
                f"virtual_batch_size={virtual_batch_size} must divide the batch size x.shape[0]={x.shape[0]}"
            )
        if axis_name is not None:
            raise ValueError(
                "virtual_batch_size (ghost batch norm) and axis_name are exclusive: ghost "
                "batches are formed from each device's local batch"
            )
        x = ghost_batches(x, virtual_batch_size)
        mask = None if mask is None else ghost_batches(mask, virtual_batch_size)
        features = (0, *(a + 1 for a in features))
    reduce_axes = tuple(a for a in range(x.ndim) if a not in features)
    if axis_name is None and size < 2:
        if virtual_batch_size is not None:
            raise ValueError(
                f"batch statistics need at least 2 elements per feature, and virtual_batch_size="
                f"{virtual_batch_size} leaves {size} per ghost batch (ghost batches of shape {x.shape[1:]}, "
                f"feature axis={axis!r}); use a larger virtual_batch_size"
            )
        raise ValueError(
            f"batch statistics need at least 2 elements per feature, got a reduction of size {size} "
            f"(x.shape={x.shape}, feature axis={axis!r}); use layer/group norm for single examples"
        )
    if topk is not None:
        devices = _axis_size(axis_name, axis_index_groups)
        if topk > size * devices:
            across = "" if devices == 1 else f" x {devices} devices of axis_name={axis_name!r}"
            raise ValueError(
                f"topk={topk} exceeds the reduction size {size}{across} (x.shape={x.shape}, axis={axis!r})"
            )
    mean, var = dispersion_moments(
        x,
        reduce_axes,
        p=p,
        topk=topk,
        mask=mask,
        axis_name=axis_name,
        axis_index_groups=axis_index_groups,
        calibration=calibration,
        one_pass=use_fast_variance,
        mean_only=mean_only,
    )
    if not keepdims:
        mean = jnp.squeeze(mean, reduce_axes)
        var = None if var is None else jnp.squeeze(var, reduce_axes)
    return mean, var


def batch_stats(
    x: jnp.ndarray,
    *,
    p: PNorm | float = 2,
    axis: int | Sequence[int] = -1,
    topk: int | None = None,
    mask: jnp.ndarray | None = None,
    axis_name: str | Sequence[str] | None = None,
    axis_index_groups: AxisIndexGroups = None,
    calibration: Calibration = "paper",
    virtual_batch_size: int | None = None,
    use_fast_variance: bool = True,
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Per-feature batch ``(mean, sigma_hat)`` with the Lp dispersion of *Norm matters* (Sec. 3).

    ``sigma_hat`` is the std for ``p=2``, ``sqrt(pi/2) * mean|x - mu|`` for ``p=1``,
    ``C(n) * max|x - mu|`` for ``p='inf'`` and ``C(n) * mean of the top-k |x - mu|`` with ``topk=k``
    (suppl. Eq. 1); ``calibration='exact'`` replaces ``C(n)`` by ``1 / E[top-k mean of n |N(0,1)|]``
    (:func:`expected_topk_abs_normal`), unbiased on Gaussian data where the paper's constant is not.

    Args:
      x: floating input; statistics are float32 (or float64) whatever its dtype.
      p: 2, 1 or 'inf' (``float('inf')`` accepted).
      axis: the feature axis or axes, kept; every other axis is reduced.
      topk: with ``p='inf'``, average the ``topk`` largest deviations instead of taking the max.
      mask: boolean, broadcastable to ``x``; only True elements enter the statistics.
      axis_name: a mapped axis (``pmap``/``shard_map``) over which the statistics are global; exact for
        unequal numbers of unmasked elements per device. Under plain ``jit`` with a sharded global batch
        no axis name is needed.
      axis_index_groups: groups of devices along ``axis_name`` with separate statistics.
      calibration: 'paper' (default) or 'exact' for ``p='inf'``.
      virtual_batch_size: ghost batch norm — statistics per sub-batch of axis 0 (stacked on a new axis 0).
      use_fast_variance: one pass over the data (stable shifted sums, the default) or two passes.

    Returns:
      ``(mean, sigma_hat)``, each of the features' shape. Where ``sigma_hat`` is 0 (a constant feature)
      its gradient is 0. For ``p=1`` the gradient of ``|x - mu|`` takes the subgradient +1 above the mean
      and -1 at or below it (ties with the mean are the only elements where it differs from ``sign``).
    """
    mean, var = batch_moments(
        x,
        p=p,
        axis=axis,
        topk=topk,
        mask=mask,
        axis_name=axis_name,
        axis_index_groups=axis_index_groups,
        calibration=calibration,
        virtual_batch_size=virtual_batch_size,
        use_fast_variance=use_fast_variance,
    )
    return mean, _sqrt_zero_slope_at_zero(var)


@jax.custom_jvp
def _sqrt_zero_slope_at_zero(var: jnp.ndarray) -> jnp.ndarray:
    """``sqrt(var)`` whose derivative is 0 where ``var == 0`` (a constant feature), not ``inf * 0 = NaN``."""
    return jnp.sqrt(var)


@_sqrt_zero_slope_at_zero.defjvp
def _sqrt_zero_slope_at_zero_jvp(primals, tangents):
    (var,), (var_dot,) = primals, tangents
    sigma = jnp.sqrt(var)
    return sigma, jnp.where(var > 0, var_dot / (2 * jnp.where(var > 0, sigma, 1)), 0)
