"""The Lp dispersion ``sigma_hat`` of Norm matters (Hoffer et al., NeurIPS 2018, Sec. 3; supplementary
Sec. 2, Eq. 1) over any reduction axes, with channel groups and devices, one small module per p:

- ``p = 2``:  ``sigma_hat = sqrt(M2 / n)``, the biased std (:mod:`.dispersion_l2`)
- ``p = 1``:  ``sigma_hat = sqrt(pi / 2) * mean|x - mu|`` (:mod:`.dispersion_l1`)
- ``p = inf``: ``sigma_hat = C(n) * max|x - mu|`` (:mod:`.dispersion_linf`)
- top-k:    ``sigma_hat = C(n) * mean of the k largest |x - mu|`` (:mod:`.dispersion_topk`)
- mean only: the mean, no dispersion (Salimans & Kingma 2016, Sec. 2.2)

The dispersion of :func:`dispersion_statistics` comes from :data:`DISPERSIONS`, as
``(mu, sigma_hat**2, unit)`` (:class:`~jaxnorm.functional.units.Statistics`; ``unit``: where the
variance of huge input is kept in a unit, the L2 one from the sums of ``x * unit``, the others from
their ``sigma_hat``), so that every norm is
``(x - mu) * rsqrt(var + eps)``; :func:`dispersion_moments` returns ``(mu, sigma_hat**2)``. Every mean
is exact for a constant group (which then
normalizes to exactly 0); a group that a mask leaves empty gets mean 0 and variance 1
(:func:`~jaxnorm.functional.reduction.empty_statistics`). Across the devices of ``axis_name`` L2, L∞ and
top-k take one collective, L1 and mean-only two.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax.numpy as jnp
from jax import lax

from jaxnorm.functional.collectives import AxisIndexGroups, gather_combine
from jaxnorm.functional.dispersion_l1 import l1_statistics
from jaxnorm.functional.dispersion_l2 import l2_statistics
from jaxnorm.functional.dispersion_linf import linf_statistics
from jaxnorm.functional.dispersion_topk import topk_statistics
from jaxnorm.functional.eager import compiled_when_concrete
from jaxnorm.functional.moments import ChannelGroups, group_combine, local_moments
from jaxnorm.functional.options import BatchOptions
from jaxnorm.functional.reduction import Reduction, exact_mean, masked_mean
from jaxnorm.functional.units import (
    Statistics,
    huge_unit,
    kept_after_rescue,
    max_unit,
    refinement,
    subnormal_unit,
    true_variance,
    underflows,
    with_derivative_of,
)

__all__ = [
    "DISPERSIONS",
    "dispersion_kind",
    "dispersion_moments",
    "dispersion_statistics",
    "mean_statistics",
]


def mean_statistics(r: Reduction, options: BatchOptions) -> tuple[jnp.ndarray, None]:
    """``(mean, None)``: the mean only, exact for constant groups (one correction pass, and a ``psum``
    across devices). Groups whose sum of ``x`` overflows (finite input near the dtype's maximum) take the
    mean of ``x * h`` over ``h`` instead (``h`` :func:`~jaxnorm.functional.units.huge_unit`, a power of
    two: exact), behind a :func:`jax.lax.cond`."""
    mean = _exact_mean_only(r)
    dtype = mean.dtype

    def rescaled() -> jnp.ndarray:
        h = huge_unit(dtype)
        scaled_x = r.x.astype(dtype) * h
        in_unit = _exact_mean_only(r._replace(x=scaled_x, deviations=scaled_x)) / h
        # the value of the unit's mean, the derivative of the plain one (sum(dx) / n, whatever its value)
        return jnp.where(jnp.isfinite(mean), mean, with_derivative_of(in_unit, mean))

    finite = jnp.isfinite(lax.stop_gradient(mean))
    return lax.cond(jnp.all(finite), lambda: mean, rescaled), None


def _exact_mean_only(r: Reduction) -> jnp.ndarray:
    """The mean of ``r``, merged over channel groups and devices, exact for a constant group."""
    moments = group_combine(local_moments(r.x, r.axes, mask=r.mask, with_m2=False), r.groups)
    if r.axis_name is not None:
        moments, _, _ = gather_combine(moments, r.axis_name, r.axis_index_groups)
    moments = masked_mean(moments, r.mask)
    return masked_mean(moments._replace(mean=exact_mean(moments, r)), r.mask).mean


DISPERSIONS: dict[object, Callable[[Reduction, BatchOptions], tuple]] = {
    2: l2_statistics,
    1: l1_statistics,
    "inf": linf_statistics,
    "topk": topk_statistics,
    "mean": mean_statistics,
}
"""``(mean, sigma_hat**2)`` (or :class:`~jaxnorm.functional.units.Statistics`) of a
:class:`~jaxnorm.functional.reduction.Reduction`, by kind (:func:`dispersion_kind`)."""


def dispersion_kind(options: BatchOptions) -> object:
    """The key of :data:`DISPERSIONS` that ``options`` select: ``"mean"`` (mean only), ``"topk"`` or p."""
    if options.mean_only:
        return "mean"
    return "topk" if options.topk is not None else options.p


@compiled_when_concrete(
    static_argnames=("axes", "options", "axis_name", "axis_index_groups", "groups")
)
def dispersion_statistics(
    x: jnp.ndarray,
    axes: tuple[int, ...],
    options: BatchOptions,
    *,
    mask: jnp.ndarray | None = None,
    axis_name: str | Sequence[str] | None = None,
    axis_index_groups: AxisIndexGroups = None,
    groups: ChannelGroups | None = None,
) -> Statistics:
    """``(mean, sigma_hat**2, unit)`` of ``x`` over ``axes`` (keepdims, float32 or wider); the engine of
    every norm. ``var`` is ``None`` with ``options.mean_only``; ``unit`` (:mod:`jaxnorm.functional.units`)
    is 1 except in groups whose statistics are huge (``None`` with ``options.mean_only``).

    The arguments have been validated by the caller. ``groups`` merges channels after the per-channel
    reduction; ``axis_name`` merges devices (``axis_index_groups``: per group of devices).
    """
    r = Reduction(x, x, axes, mask, groups, axis_name, axis_index_groups)
    kind = dispersion_kind(options)
    if kind in (2, "mean"):  # L2 keeps its own unit in its sums; mean-only has no unit
        return Statistics(*DISPERSIONS[kind](r, options))
    return _overflowed_groups_in_unit(DISPERSIONS[kind], r, options)


def _overflowed_groups_in_unit(
    statistics_of: Callable[[Reduction, BatchOptions], Statistics], r: Reduction, options: BatchOptions
) -> Statistics:
    """The L1, L∞ or top-k statistics of ``r``, with the groups whose sums of ``x`` overflow (finite
    input near the dtype's maximum: ``sum x`` or ``sum |x - mu|`` beyond it, the mean or ``sigma_hat``
    not finite) taken of ``x * h`` instead, ``h`` :func:`~jaxnorm.functional.units.huge_unit`: their
    mean is that of ``x * h`` over ``h`` and their unit ``h`` times the unit of ``x * h``'s variance
    (exact: powers of two); a constant such group stays in unit 1 (variance 0 in any unit, and
    ``epsilon * h^2`` underflows). With ``options.tiny_groups`` (``epsilon = 0``) the groups whose
    ``sigma_hat`` is tiny (:func:`~jaxnorm.functional.units.is_tiny` squared, or 0) are taken of ``x * s``
    the same way, ``s`` :func:`~jaxnorm.functional.units.subnormal_unit`: their deviations may be
    subnormal, which XLA flushes to 0 (such groups read as constant, or a wrong dispersion), and
    ``x * s - mean * s`` is not (a constant group, whose spread stays 0, keeps its statistics:
    :func:`~jaxnorm.functional.units.kept_after_rescue`). Every other group keeps the same statistics (to
    rounding: the conditional can change how XLA fuses the reductions, a few ulps on ordinary input).

    The check is per group after the merge over channels and devices (the same on every device that
    shares the statistics); only where some group failed does a :func:`jax.lax.cond` take the second
    computation. The failed groups' own statistics have a finite derivative (a dispersion that
    overflowed has none, :func:`~jaxnorm.functional.units.variance_in_unit`), so the select's zero
    cotangent gives 0 there, not ``0 * inf``; and both operands of each select scale alike with ``x``,
    which keeps the norm scale-invariant to the tracer of :mod:`jaxnorm.enorm`.
    """
    plain = statistics_of(r, options)
    finite = lax.stop_gradient(jnp.isfinite(plain.mean) & jnp.isfinite(plain.var))
    if options.tiny_groups:
        return _huge_and_tiny_groups_in_unit(statistics_of, r, options, plain, finite)

    def rescaled() -> Statistics:
        # one unit for every group, huge_unit; a constant group (equal values near the maximum) has
        # variance 0 in any unit and is finite: it stays in unit 1 (epsilon * h^2 is 0: 0 * rsqrt(0))
        unit = huge_unit(plain.var.dtype)
        scaled = _statistics_of_scaled(statistics_of, r, options, unit, plain.var.dtype)
        return _selected(finite, plain, _in_total_unit(scaled, unit), unit)

    return lax.cond(jnp.all(finite), lambda: plain, rescaled)


def _huge_and_tiny_groups_in_unit(
    statistics_of: Callable[[Reduction, BatchOptions], Statistics],
    r: Reduction,
    options: BatchOptions,
    plain: Statistics,
    finite: jnp.ndarray,
) -> Statistics:
    """:func:`_overflowed_groups_in_unit` with ``options.tiny_groups`` (``epsilon = 0``): the groups whose
    ``sigma_hat`` squared :func:`~jaxnorm.functional.units.underflows` taken again on ``x * s`` (``s``
    :func:`~jaxnorm.functional.units.subnormal_unit`; where ``x * s`` stays finite: a group of equal large
    values has ``sigma_hat`` 0 too), the others that did not overflow in unit 1 (a per-group unit)."""
    dtype = plain.var.dtype
    s = subnormal_unit(dtype)
    tiny = finite & underflows(jnp.square(plain.sigma)) & jnp.isfinite(plain.mean * (2 * s))
    tiny = lax.stop_gradient(tiny)

    def rescaled() -> Statistics:
        unit = jnp.where(tiny, s, jnp.where(finite, 1, huge_unit(dtype))).astype(dtype)
        scaled = _statistics_of_scaled(statistics_of, r, options, unit, dtype)
        # a constant group, whose spread stays 0 in any unit, keeps its statistics
        kept = finite & kept_after_rescue(tiny, scaled.var)
        capped = scaled._replace(unit=_capped_unit(scaled, tiny, dtype))
        return _selected(kept, plain, _in_total_unit(capped, unit), unit)

    return lax.cond(jnp.all(finite & ~tiny), lambda: plain, rescaled)


def _statistics_of_scaled(
    statistics_of: Callable[[Reduction, BatchOptions], Statistics],
    r: Reduction,
    options: BatchOptions,
    unit: float | jnp.ndarray,
    dtype: jnp.dtype,
) -> Statistics:
    """The statistics of ``x * unit`` in ``dtype`` (their own unit, of ``x * unit``'s variance, not yet
    times ``unit``)."""
    scaled_x = r.x.astype(dtype) * unit
    return statistics_of(r._replace(x=scaled_x, deviations=scaled_x), options)


def _in_total_unit(scaled: Statistics, unit: float | jnp.ndarray) -> Statistics:
    """The statistics ``scaled`` of ``x * unit`` in the total unit ``scaled.unit * unit``, refined where it
    is below 1 to ``sigma_hat * unit`` in ``[16, 32)`` (:func:`~jaxnorm.functional.units.refinement`): the
    variance is the square of ``scaled.sigma`` times the refined unit, so that its derivative forms no
    cotangent in the unrefined variance."""
    refine = refinement(scaled.sigma * scaled.unit, scaled.unit * unit)
    in_unit = scaled.sigma * (scaled.unit * refine)
    return scaled._replace(var=jnp.square(in_unit), unit=scaled.unit * refine * unit)


def _selected(
    kept: jnp.ndarray, plain: Statistics, scaled: Statistics, unit: float | jnp.ndarray
) -> Statistics:
    """Per group, the ``plain`` statistics where ``kept``, else the ``scaled`` ones of ``x * unit`` with
    their mean and ``sigma_hat`` taken back to ``x``'s scale (``scaled.unit`` already the total unit;
    a group of variance 0 in the unit stays in unit 1). The mean keeps the derivative of the plain one,
    ``sum(dx) / n`` (:func:`~jaxnorm.functional.units.with_derivative_of`)."""
    return Statistics(
        jnp.where(kept, plain.mean, with_derivative_of(scaled.mean / unit, plain.mean)),
        jnp.where(kept, plain.var, scaled.var),
        jnp.where(kept, plain.unit, jnp.where(scaled.var > 0, scaled.unit, 1)),
        jnp.where(kept, plain.sigma, scaled.sigma / unit),
    )


def _capped_unit(scaled: Statistics, tiny: jnp.ndarray, dtype: jnp.dtype) -> jnp.ndarray:
    """The unit of the statistics of ``x * subnormal_unit`` with the tiny groups' total unit at most
    :func:`~jaxnorm.functional.units.max_unit`: their ``sigma_hat`` lifted by powers of ``tiny_unit`` can
    pass it (a single deviation of ``2^-149`` among many elements), and is then squared in the largest
    unit instead (:func:`_in_total_unit` squares ``sigma_hat`` times the unit)."""
    room = max_unit(dtype) / subnormal_unit(dtype)
    return jnp.where(tiny & (scaled.unit > room), room, scaled.unit)


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
    """``(mean, sigma_hat**2)`` of :func:`dispersion_statistics`, the variance of ``x`` itself (the largest
    finite number where it overflows the dtype)."""
    statistics = dispersion_statistics(
        x, axes, options, mask=mask, axis_name=axis_name, axis_index_groups=axis_index_groups, groups=groups
    )
    return statistics.mean, true_variance(statistics)
