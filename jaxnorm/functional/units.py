"""Statistics of huge input, kept in a unit: :class:`Statistics` ``(mean, var, unit, sigma)``.

A float32 variance overflows beyond ``sigma_hat = 1.8e19`` (``1e154`` in float64), and the sum of
squares on its way there sooner, although such input is finite and normalizes to ordinary numbers.
Well before that the derivatives fail: the cotangent of the variance is of order ``n / sigma_hat^2``,
below the smallest normal float32 number from ``sigma_hat ~ 2^63``, and the derivative of ``rsqrt``
as written by autodiff, ``-0.5 rsqrt(v) / v``, underflows from ``sigma_hat ~ 2^42`` (4e12). So the
statistics of a group leave ``x``'s own scale from ``var > 2^(emax - emax / 8)`` (:func:`in_range`;
``sigma_hat > 2^56 = 7e16`` in float32) and :func:`inverse_std` writes its derivative as
``-0.5 rsqrt(v) (dv / v)``. Where that happens the statistics are taken of ``x * unit`` instead,
with ``unit`` the power of two :func:`huge_unit` (``2^-96`` in float32), then refined per group by a
power of two to ``sigma_hat * unit`` in ``[16, 32)`` (:func:`refinement`: the inverse below 1, so that
neither ``inv * scale`` nor a cotangent times ``inv`` overflows), so that ``var`` is the variance of
``x * unit`` and

    y = (x * unit - mean * unit) * rsqrt(var + epsilon * unit^2)

is the usual ``(x - mean) * rsqrt(sigma_hat^2 + epsilon)``: scaling by a power of two is exact, and
``epsilon * unit^2`` is below the rounding error of such a ``var``. Every other group keeps
``unit = 1`` and the unscaled statistics bit for bit. One unit for every dtype of the same width means
that groups merged across channels and devices are all in the same unit; the choice is made per group
after the merge (:func:`jaxnorm.functional.dispersion_l2.l2_statistics`).

The mirror image at the other end: with ``epsilon = 0`` the inverse of a group whose variance is tiny
is huge, and the variance's cotangent, of order ``n / sigma_hat^2`` times the inverse's, overflows from
``sigma_hat ~ 2^-60`` in float32 although the gradient itself (``~ 1 / sigma_hat``) is finite. Such
groups (:func:`is_tiny`: variance below ``2^(-emax / 2)``) are kept in :func:`tiny_unit`, ``2^32`` in
float32 (:func:`lift_tiny`, :func:`variance_in_unit`): no other pass over ``x``, the same power-of-two
rescaling of statistics already taken, inside the statistics' own derivative. Below ``sigma_hat ~
2^-63`` the L2 statistics themselves fail (the squared deviations underflow): such groups are taken again
on ``x * unit`` (:func:`rescue_unit`: :func:`underflow_unit`, or :func:`subnormal_unit` where every
square underflowed; :func:`underflows`, :func:`kept_after_rescue`). Deviations below the smallest normal
number are flushed to zero before any unit applies, at every p: with ``epsilon = 0`` every norm subtracts
in the unit, ``x * unit - mean * unit``, and the p != 2 groups of tiny ``sigma_hat`` are taken again on
``x * subnormal_unit`` (:mod:`jaxnorm.functional.dispersion`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxnorm.functional.platform import per_platform

__all__ = [
    "Statistics",
    "add_epsilon",
    "huge_unit",
    "in_range",
    "inverse_std",
    "is_tiny",
    "kept_after_rescue",
    "lift_tiny",
    "max_unit",
    "needs_tiny_unit",
    "refine_variance",
    "refinement",
    "refinement_where_needed",
    "reported_sigma",
    "rescue_unit",
    "select_in_unit",
    "statistics_in_units",
    "statistics_in_units_where_needed",
    "subnormal_unit",
    "tiny_unit",
    "true_variance",
    "underflow_unit",
    "underflows",
    "unit_deviations",
    "variance_in_unit",
    "with_derivative_of",
]


class Statistics(NamedTuple):
    """Per-group statistics, keepdims, in the statistics dtype (float32 or wider).

    Attributes:
      mean: the mean ``mu`` of ``x``.
      var: ``sigma_hat**2`` of ``x * unit`` (``None``: mean-only normalization).
      unit: 1, :func:`huge_unit` times its :func:`refinement` where the statistics of ``x`` itself
        leave :func:`in_range`, or, at
        ``epsilon = 0``, a power of two above 1 for tiny groups, at most :func:`max_unit`
        (:func:`lift_tiny`, :func:`rescue_unit`; ``None``: 1 everywhere).
      sigma: ``sigma_hat`` of ``x`` itself, whose derivative is taken in ``x``'s scale (``None``: not
        computed). What :func:`true_variance` and :func:`reported_sigma` differentiate in groups held in
        a unit: through ``var`` the cotangent of ``var / unit^2`` is ``2^192`` times the variance's in a
        huge group (inf in float32) before the unit's small factors cancel it.
    """

    mean: jnp.ndarray
    var: jnp.ndarray | None
    unit: jnp.ndarray | None = None
    sigma: jnp.ndarray | None = None


def huge_unit(dtype: jnp.dtype) -> float:
    """``2^(-3/4 emax)`` of ``dtype`` (``2^-96`` in float32, ``2^-768`` in float64): the scale of ``x`` for
    groups whose statistics leave :func:`in_range`.

    Such a group has ``sum (x - mean)^2 >= 2^(7 emax / 8)``, so with ``n <= 2^30`` elements its largest
    scaled square is at least ``2^(-5 emax / 8 - 30)`` (``2^-110`` in float32: normal, 16 binades above
    the flush-to-zero limit), and the largest finite ``x`` gives a sum of scaled squares below
    ``n 2^(emax / 2 + 2)`` (``2^96``): no underflow that matters and no overflow.
    """
    emax = jnp.finfo(dtype).maxexp
    return 2.0 ** (-(3 * emax // 4))


def in_range(mean: jnp.ndarray, spread: jnp.ndarray) -> jnp.ndarray:
    """Per group, whether its statistics stay in ``x``'s own scale: ``mean`` finite and ``spread`` (a
    variance or M2) below ``2^(emax - emax / 8)`` (``2^112`` in float32, ``2^896`` in float64), tested as
    ``isfinite(spread * 2^(emax / 8))``: a finiteness test, which the scale-invariance tracer of
    :mod:`jaxnorm.enorm` sees through where it could not see through a threshold.
    ``sigma_hat <= 2^56`` there keeps the derivatives of the normalization normal numbers
    (module docstring); beyond, :func:`huge_unit` puts ``sigma_hat * unit`` between ``2^-40`` and
    ``2^32``, and :func:`refinement` in ``[16, 32)``."""
    headroom = 2.0 ** (jnp.finfo(spread.dtype).maxexp // 8)
    return jnp.isfinite(mean) & jnp.isfinite(spread * headroom)


def select_in_unit(
    keep: jnp.ndarray,
    plain: tuple[jnp.ndarray, ...],
    scaled: tuple[jnp.ndarray, jnp.ndarray],
    unit: float | jnp.ndarray,
) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """Per group, ``(mean, spread, unit)``: the ``plain`` statistics ``(mean, spread)`` of ``x`` (``unit
    = 1``; or ``(mean, spread, unit)`` already chosen) where ``keep`` (e.g. :func:`in_range`), else the
    ``scaled`` ones of ``x * unit``, whose mean is taken back to ``x``'s scale (``spread``: M2 or the
    variance, left in the unit). A scaled group of spread 0 (a constant group: large equal values whose
    rounded sums left the range) stays in unit 1 with that spread and the unit's exact mean, where
    ``epsilon`` does not underflow (``epsilon * huge^2`` is 0 in float32: ``0 * rsqrt(0)``, NaN)."""
    mean, spread, plain_unit = plain if len(plain) == 3 else (*plain, 1)
    scaled_mean, scaled_spread = scaled
    return (
        jnp.where(keep, mean, scaled_mean / unit),
        jnp.where(keep, spread, scaled_spread),
        jnp.where(keep, plain_unit, jnp.where(scaled_spread > 0, unit, 1)).astype(spread.dtype),
    )


def unit_deviations(x: jnp.ndarray, mean: jnp.ndarray, unit: jnp.ndarray) -> jnp.ndarray:
    """``x * unit - mean * unit``: the deviations of a group held in ``unit``, each term scaled before the
    subtraction (exact, powers of two), so that ``x - mean`` is never formed where it overflows (huge
    groups) or is subnormal (tiny ones). Every normalization multiplies them by its inverse."""
    return x * unit - mean * unit


def refinement(sigma_in_unit: jnp.ndarray, unit: jnp.ndarray) -> jnp.ndarray:
    """Per group, a power of two ``r`` that puts ``sigma_in_unit * r`` in ``[16, 32)`` where ``unit`` is
    below 1 (a huge group) and ``sigma_in_unit`` (``sigma_hat * unit``) positive and finite, else 1; no
    derivative. :func:`huge_unit` alone leaves ``sigma_hat * unit`` anywhere from ``2^-40`` to ``2^32``,
    so the inverse ``1 / (sigma_hat * unit)`` up to ``2^40``, and ``inv * scale`` or a cotangent times
    ``inv`` overflowed from about ``1e29`` where the true values are finite; in the unit ``unit * r`` the
    inverse is at most ``1 / 16``.

    Found bit by bit with finiteness tests, ``r`` from ``2^(-emax / 2)`` up, a bit kept where
    ``sigma_in_unit * r * 2^(emax - 5)`` stays finite (``sigma_in_unit * r < 32``): exact powers of two,
    and the scale-invariance tracer of :mod:`jaxnorm.enorm` reads each test as it reads :func:`in_range`
    (no dependence on ``x``'s scale in exact arithmetic), where an exponent taken from the bits
    (``frexp``) made every norm look not scale-invariant to it."""
    dtype = sigma_in_unit.dtype
    emax = jnp.finfo(dtype).maxexp
    top = 2.0 ** (emax - 5)
    value = lax.stop_gradient(sigma_in_unit)
    refine = jnp.full_like(value, 2.0 ** -(emax // 2))
    step = emax // 2
    while step >= 1:
        candidate = refine * 2.0**step
        refine = jnp.where(jnp.isfinite((value * candidate) * top), candidate, refine)
        step //= 2
    huge = (unit < 1) & (value > 0) & jnp.isfinite(value)
    return lax.stop_gradient(jnp.where(huge, refine, 1).astype(dtype))


def refinement_where_needed(sigma_in_unit: jnp.ndarray, unit: jnp.ndarray) -> jnp.ndarray:
    """:func:`refinement`, on XLA:CPU behind a :func:`jax.lax.cond` on some group's ``unit`` being below 1
    (ordinary input takes ones): XLA:CPU otherwise fuses the refinement's tests into the normalization's
    per-element kernel, repeated for every element (twice the forward time), where a conditional's
    result is a per-group buffer. GPU and TPU compute it without a conditional, as the rest of their
    statistics (:func:`~jaxnorm.functional.platform.per_platform`); the values are the same."""

    def branching(sigma_in_unit, unit):
        ones = jnp.ones_like(sigma_in_unit)
        return lax.cond(jnp.any(unit < 1), lambda: refinement(sigma_in_unit, unit), lambda: ones)

    return per_platform(branching, refinement, lax.stop_gradient(sigma_in_unit), unit)


def refine_variance(var: jnp.ndarray, unit: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """``(var r^2, unit r)``, ``r`` the :func:`refinement` of ``sqrt(var)`` (:func:`refinement_where_needed`):
    the variance of ``x * unit * r`` (exact, a power of two), for statistics whose derivative is written
    with their own unit (a custom JVP, as :func:`lift_tiny`), so that no cotangent is formed in the
    unrefined variance (``r^2`` up to ``2^90`` times the refined one's)."""
    refine = refinement_where_needed(jnp.sqrt(var), unit)
    return var * (refine * refine), unit * refine


InUnit = Callable[[float | jnp.ndarray], tuple[jnp.ndarray, jnp.ndarray]]
"""``unit -> (mean, spread)``: the statistics of ``x * unit``, both in the unit (the ``scaled`` argument
of :func:`select_in_unit`)."""


def statistics_in_units(
    plain: tuple[jnp.ndarray, jnp.ndarray],
    keep: jnp.ndarray,
    underflowing: jnp.ndarray | None,
    in_unit: InUnit,
    rescued_in_unit: InUnit | None = None,
) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """Per group ``(mean, spread, unit)``: the ``plain`` statistics ``(mean, spread)`` of ``x`` where ``keep``
    (:func:`in_range`), else those of ``x * huge_unit`` (``in_unit``); then, where ``underflowing`` (with
    ``epsilon = 0``, a spread that :func:`underflows`; ``None``: no such check), those of
    ``x * rescue_unit`` (``rescued_in_unit``, default ``in_unit``) unless :func:`kept_after_rescue`. A
    group whose spread is 0 in the huge unit (a constant group) keeps unit 1.
    Selects, no conditional: every unit's statistics are computed (:func:`statistics_in_units_where_needed`
    takes them only where some group needs them)."""
    huge = huge_unit(plain[1].dtype)
    statistics = select_in_unit(keep, plain, in_unit(huge), huge)
    if underflowing is None:
        return statistics
    unit = rescue_unit(plain[1])
    rescued = (rescued_in_unit or in_unit)(unit)
    return select_in_unit(kept_after_rescue(underflowing, rescued[1]), statistics, rescued, unit)


def statistics_in_units_where_needed(
    plain: tuple[jnp.ndarray, jnp.ndarray],
    keep: jnp.ndarray,
    underflowing: jnp.ndarray | None,
    in_unit: InUnit,
) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """:func:`statistics_in_units` (one ``in_unit`` for both units) behind a :func:`jax.lax.cond`:
    ``(*plain, 1)`` where every group is kept and none is underflowing, so ordinary input takes no other
    pass over ``x``."""
    stands = keep if underflowing is None else keep & ~underflowing
    ones = jnp.ones_like(plain[1])
    rescaled = lambda: statistics_in_units(plain, keep, underflowing, in_unit)
    return lax.cond(jnp.all(stands), lambda: (*plain, ones), rescaled)


def underflow_unit(dtype: jnp.dtype) -> float:
    """``2^(emax / 2)`` of ``dtype`` (``2^64`` in float32, ``2^512`` in float64): the scale of ``x`` for
    L2 groups whose variance :func:`underflows` where ``epsilon`` is 0 (:func:`needs_tiny_unit`).

    Their squared deviations leave the normal numbers from ``|x - mean| ~ 2^-63`` (flushed to 0 on
    XLA:CPU), so the variance of ``x`` itself is wrong long before the variance of ``x * unit``:
    with ``sigma_hat`` from the smallest normal number to ``2^-32``, ``(sigma_hat * unit)^2`` lies
    between ``2^-124`` and ``2^64``. A variance only rescaled afterwards (:func:`lift_tiny`) keeps the
    error; with ``epsilon = 0`` it was floored, and such groups came out shrunk toward 0. The
    reciprocal of :func:`is_tiny`'s bound."""
    return _tiny_headroom(dtype)


def subnormal_unit(dtype: jnp.dtype) -> float:
    """``2^(53 emax / 64)`` of ``dtype`` (``2^106`` in float32, ``2^848`` in float64): the scale of ``x``
    for groups whose deviations may be subnormal, where ``epsilon`` is 0 (:func:`rescue_unit`).

    XLA flushes subnormal numbers to zero, so ``x - mean`` is 0 where it is below the smallest normal
    number (``2^-126``) however small ``sigma_hat`` is: such groups read as constant, or, where a few
    deviations survive, as a wrong dispersion. Scaled before subtracting, a group whose only deviation
    is the smallest subnormal (``2^-149``) among ``n <= 2^30`` elements has ``sigma_hat`` above
    ``2^-58`` in the unit and a normal variance. At the other end an L2 group whose squared deviations
    all underflowed has ``sigma_hat < 2^-63`` (``< 2^43`` in the unit: no sum of ``2^30`` squares
    overflows), and a p != 2 ``sigma_hat`` up to ``2^-32`` is ``2^74`` in it, which
    :func:`variance_in_unit` takes to :func:`huge_unit` (a unit of ``2^10`` in all). Units composed
    with it stop at :func:`max_unit`."""
    return 2.0 ** (53 * jnp.finfo(dtype).maxexp // 64)


def max_unit(dtype: jnp.dtype) -> float:
    """``2^(emax - 2)`` of ``dtype`` (``2^126`` in float32): the largest unit a group is kept in. A tiny
    lift (:func:`lift_tiny`, :func:`variance_in_unit`) that would take a unit beyond it is not made: such a
    group's ``sigma_hat`` is below ``2^-158``, its variance in the unit is still a normal number (the
    output exact), and its gradient, ``~ 1 / sigma_hat``, is beyond the dtype's range anyway."""
    return 2.0 ** (jnp.finfo(dtype).maxexp - 2)


def rescue_unit(spread: jnp.ndarray) -> jnp.ndarray:
    """Per group, the scale of ``x`` that a group with an underflowing L2 ``spread`` (variance, M2 or
    mean square) is taken again in: :func:`underflow_unit` where the spread is positive (``sigma_hat``
    from ``2^-63`` to ``2^-32``, some squares flushed), :func:`subnormal_unit` where it is 0 (every square
    flushed: ``sigma_hat < 2^-63``, down to subnormal deviations, which ``underflow_unit`` left
    underflowing: such groups came out as zeros). Powers of two: the rescaling is exact."""
    dtype = spread.dtype
    return jnp.where(spread > 0, underflow_unit(dtype), subnormal_unit(dtype)).astype(dtype)


def kept_after_rescue(underflowing: jnp.ndarray, rescued_spread: jnp.ndarray) -> jnp.ndarray:
    """Per group, whether the statistics already chosen stand after the rescue in :func:`rescue_unit`:
    where the group did not underflow, or where the spread (variance, M2 or mean square) of ``x *
    rescue_unit`` is not positive and finite. A constant group keeps unit 1 that way, where
    ``epsilon``'s floor bounds its gradient: its spread is 0 in any unit, or, where the deviations about
    a rounded centre do not cancel exactly, the rounding of its values squared (inf where they are not
    small)."""
    return ~underflowing | ~((rescued_spread > 0) & jnp.isfinite(rescued_spread))


def underflows(var: jnp.ndarray) -> jnp.ndarray:
    """Per group, a variance below :func:`is_tiny`'s bound, zero included (an underflowed sum of
    squares is 0 like a constant group's, and the two cannot be told apart from it); not NaN (an
    overflowed one, ``inf - inf``, which :func:`in_range` leaves to the huge unit)."""
    return (var >= 0) & _below_tiny_bound(var)


def variance_in_unit(
    dispersion: jnp.ndarray, tiny_groups: bool = False
) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """``((sigma_hat * unit)^2, unit, sigma_hat)`` from a finite dispersion ``sigma_hat`` (the L1, L∞ and
    top-k ones): ``unit = 1`` where ``sigma_hat^2`` is :func:`in_range`, :func:`huge_unit` beyond (refined
    to ``sigma_hat * unit`` in ``[16, 32)``, :func:`refinement`), and,
    with ``tiny_groups`` (:func:`needs_tiny_unit`), the power of :func:`tiny_unit` (up to
    :data:`_TINY_LIFTS`) that takes a ``sigma_hat^2`` that :func:`is_tiny` or underflows out of it. Per
    group, no pass over ``x``: the mean and ``sigma_hat`` are homogeneous of degree 1 in ``x``, so
    ``(sigma_hat * unit)^2`` is the variance of ``x * unit``, and a power of two times ``sigma_hat`` is
    exact (ordinary groups keep ``sigma_hat^2`` bit for bit). ``sigma_hat`` itself is returned for
    :attr:`Statistics.sigma`."""
    # a dispersion whose sums overflowed (taken again in a unit, :mod:`jaxnorm.functional.dispersion`)
    # has no derivative here: its square's, inf times the zero cotangent, would be NaN
    dispersion = jnp.where(jnp.isfinite(dispersion), dispersion, lax.stop_gradient(dispersion))
    square = jnp.square(dispersion)
    plain = in_range(dispersion, square)
    dtype = dispersion.dtype
    small = jnp.ones_like(dispersion)
    if tiny_groups:  # sigma_hat^2 tiny, or underflowed to 0 from a positive sigma_hat
        for _ in range(_TINY_LIFTS):
            lifted = dispersion * small
            still_tiny = (lifted > 0) & _below_tiny_bound(jnp.square(lifted))
            small = jnp.where(still_tiny, small * tiny_unit(dtype), small)
    unit = lax.stop_gradient(jnp.where(plain, small, huge_unit(dtype)).astype(dtype))
    unit = unit * refinement_where_needed(dispersion * unit, unit)
    return jnp.square(dispersion * unit), unit, dispersion


def with_derivative_of(value: jnp.ndarray, source: jnp.ndarray) -> jnp.ndarray:
    """``value`` (taken back from a unit, e.g. ``mean(x * unit) / unit``) with the derivative of ``source``,
    the same statistic computed in ``x``'s own scale, whatever ``source``'s value (inf where its sums
    overflowed). Differentiated through the unit, the cotangent is multiplied by ``1 / unit`` before
    ``unit`` (``2^96`` first: inf from a cotangent of ``4e9``; ``2^-106`` first: flushed to 0)."""
    return lax.stop_gradient(value) + _zero_with_derivative(source)


@jax.custom_jvp
def _zero_with_derivative(source: jnp.ndarray) -> jnp.ndarray:
    """0, with the derivative of ``source`` (no ``source - source``: inf - inf where it overflowed)."""
    return jnp.zeros_like(source)


@_zero_with_derivative.defjvp
def _zero_with_derivative_jvp(primals, tangents):
    return jnp.zeros_like(primals[0]), tangents[0]


def true_variance(statistics: Statistics) -> jnp.ndarray | None:
    """``sigma_hat**2`` of ``x`` itself, the largest finite number where it overflows the dtype (what the
    running statistics and :func:`jaxnorm.functional.batch_moments` hold); in a group held in a unit
    (``unit != 1``) with the derivative ``2 sigma_hat d sigma_hat`` of :attr:`Statistics.sigma`, where
    it is given."""
    var, unit = statistics.var, statistics.unit
    if var is None or unit is None:
        return var
    top = jnp.finfo(var.dtype).max
    # var / unit^2 as two products by 1 / unit (a power of two, exact): XLA rewrites var / unit / unit as
    # var / (unit * unit), whose 2^-192 is 0 in float32 (inf, then the clip, for every huge group); and
    # the derivative of a group clipped to the maximum is 0, not 0 * inf (ldexp's derivative is 2^192)
    scale = lax.stop_gradient(1 / unit)
    in_x_scale = var * scale * scale
    reported = jnp.where(unit == 1, var, jnp.minimum(in_x_scale, top))
    if statistics.sigma is None:
        return reported
    # the same value; its derivative that of sigma_hat^2, a term of value 0 whose slope is 2 sigma_hat
    # (0 where the variance is clipped: no 0 * inf)
    unclipped = in_x_scale < top
    slope = lax.stop_gradient(jnp.where(unclipped, 2 * statistics.sigma, 0))
    sigma = jnp.where(unclipped, statistics.sigma, 0)
    carried = lax.stop_gradient(reported) + slope * (sigma - lax.stop_gradient(sigma))
    return jnp.where(unit == 1, reported, carried)


def reported_sigma(statistics: Statistics) -> jnp.ndarray:
    """``sigma_hat`` of ``x`` itself (:func:`jaxnorm.functional.batch_stats`): :attr:`Statistics.sigma`
    where it is given and positive (exact where its square underflows, its derivative in ``x``'s scale),
    else ``sqrt(var) / unit``, whose derivative is 0 where the variance is 0 (a constant group)."""
    sigma = _sqrt_zero_slope_at_zero(statistics.var)
    if statistics.unit is not None:
        sigma = sigma / statistics.unit
    if statistics.sigma is None:
        return sigma
    return jnp.where(statistics.sigma > 0, statistics.sigma, sigma)


@jax.custom_jvp
def _sqrt_zero_slope_at_zero(var: jnp.ndarray) -> jnp.ndarray:
    """``sqrt(var)`` whose derivative is 0 where ``var == 0`` (a constant group), not ``inf * 0 = NaN``."""
    return jnp.sqrt(var)


@_sqrt_zero_slope_at_zero.defjvp
def _sqrt_zero_slope_at_zero_jvp(primals, tangents):
    (var,), (var_dot,) = primals, tangents
    sigma = jnp.sqrt(var)
    return sigma, jnp.where(var > 0, var_dot / (2 * jnp.where(var > 0, sigma, 1)), 0)


_TINY_LIFTS = 3
"""How many times :func:`variance_in_unit` lifts a tiny ``sigma_hat`` by :func:`tiny_unit`: once puts
``sigma_hat`` from ``2^-64`` up in ``[2^-32, 2^0)``, three times the smallest normal ``sigma_hat``
(``2^-126`` in float32) at ``2^-30``, whose square is a normal number (one lift left the variance of
``sigma_hat < 2^-95`` underflowing, and ``epsilon = 0`` shrank such groups' output toward 0)."""


def tiny_unit(dtype: jnp.dtype) -> float:
    """``2^(emax / 4)`` of ``dtype`` (``2^32`` in float32, ``2^256`` in float64): the scale of ``x`` for
    groups whose variance is :func:`is_tiny`, which puts it between ``2^(-emax + 2)`` and ``2^0``."""
    return 2.0 ** (jnp.finfo(dtype).maxexp // 4)


def is_tiny(spread: jnp.ndarray) -> jnp.ndarray:
    """Per group, ``0 < spread < 2^(-emax / 2)`` (``2^-64`` in float32, ``sigma_hat < 2^-32``), tested as
    ``spread > 0`` and ``2^(emax / 2) / spread`` overflowing (a finiteness test, like :func:`in_range`).

    Below it the variance's cotangent, of order ``n / sigma_hat^2`` times the inverse's, overflows
    where ``epsilon`` is 0: the gradient of such a group was NaN although it is a finite number."""
    return (spread > 0) & _below_tiny_bound(spread)


def _tiny_headroom(dtype: jnp.dtype) -> float:
    """``2^(emax / 2)``: the reciprocal of :func:`is_tiny`'s bound."""
    return 2.0 ** (jnp.finfo(dtype).maxexp // 2)


def _below_tiny_bound(spread: jnp.ndarray) -> jnp.ndarray:
    """``spread < 2^(-emax / 2)``, zero included, as ``2^(emax / 2) / spread`` overflowing."""
    return ~jnp.isfinite(_tiny_headroom(spread.dtype) / spread)


def needs_tiny_unit(epsilon: float, dtype: jnp.dtype) -> bool:
    """Whether a normalization with this ``epsilon`` keeps tiny groups in :func:`tiny_unit`: where
    ``epsilon`` is below :func:`is_tiny`'s bound (``epsilon = 0``). A static choice: above it,
    ``var + epsilon >= epsilon`` bounds the inverse and the variance's cotangent (at most
    ``n |cotangent| / epsilon``), and a variance that underflows is below ``epsilon``'s rounding, so
    the statistics are taken as before, with no other operation."""
    return float(epsilon) * _tiny_headroom(dtype) < 1


def lift_tiny(var: jnp.ndarray, unit: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """``(var * t^2, unit * t)`` with ``t`` :func:`tiny_unit` where ``var`` :func:`is_tiny`, else
    ``(var, unit)`` (and where ``unit * t`` would pass :func:`max_unit`): the variance of ``x * unit * t``
    (exact, a power of two). For statistics whose derivative is written with their own ``unit`` (a custom
    JVP), so that no cotangent is formed in the unscaled variance."""
    liftable = is_tiny(var) & (unit <= max_unit(var.dtype) / tiny_unit(var.dtype))
    lift = lax.stop_gradient(jnp.where(liftable, tiny_unit(var.dtype), 1).astype(var.dtype))
    return var * (lift * lift), unit * lift


def add_epsilon(var: jnp.ndarray, epsilon: float, unit: jnp.ndarray | None = None) -> jnp.ndarray:
    """``var + epsilon * unit^2``, at least the smallest normal number of the dtype where ``epsilon`` is
    below it (``epsilon = 0``).

    With ``epsilon = 0`` a constant group (variance exactly 0, deviations exactly 0) would be
    ``0 * rsqrt(0)``, NaN; with the floor it normalizes to exactly 0, with the derivative 0 through its
    variance, and every group whose (unit's) variance is a normal number is unchanged. A static
    choice: an ``epsilon`` of at least that number gives the same program as without the floor."""
    tiny = float(jnp.finfo(var.dtype).tiny)
    if unit is None:
        total = var + epsilon
    elif 0 < epsilon < tiny:
        # a subnormal epsilon is flushed to 0 as an operand (XLA:CPU): scaled into the normal numbers
        # first, then times the unit's two factors (a tiny group's unit is up to max_unit)
        lift = _tiny_headroom(var.dtype)
        total = var + (epsilon * lift) * unit * (unit / lift)
    else:
        total = var + epsilon * unit * unit
    # a select, not jnp.maximum: the derivative of a floored group is then 0, where maximum's would be
    # an overflowed cotangent times 0 (NaN)
    return total if epsilon >= tiny else jnp.where(total < tiny, tiny, total)


def inverse_std(statistics: Statistics, epsilon: float) -> jnp.ndarray | None:
    """``rsqrt(var + epsilon * unit^2)``: the factor of the scaled deviations ``(x - mean) * unit``
    (``epsilon * unit^2`` is 0 in the dtype where ``unit`` is huge; floored by :func:`add_epsilon`; where
    it overflows, in a tiny group's unit, ``1 / (sqrt(epsilon) unit)``)."""
    var, unit = statistics.var, statistics.unit
    if var is None:
        return None
    total = add_epsilon(var, epsilon, unit)
    if unit is None or epsilon == 0 or not needs_tiny_unit(epsilon, var.dtype):
        return _rsqrt(total)
    # a positive epsilon below the tiny bound with a tiny group's unit (up to max_unit): epsilon * unit^2
    # can overflow; the variance is negligible beside it there, and the inverse is 1 / (sqrt(epsilon) unit)
    overflowed = ~jnp.isfinite(total)
    # (an epsilon too small for this to overflow, below 2^-124 in float32, may have an inverse square
    # root beyond the dtype: clipped, it is never selected)
    inverse = min(1 / math.sqrt(epsilon), float(jnp.finfo(var.dtype).max))
    beside_epsilon = jnp.asarray(inverse, var.dtype) / unit
    return jnp.where(overflowed, beside_epsilon, _rsqrt(jnp.where(overflowed, 1, total)))


@jax.custom_jvp
def _rsqrt(v: jnp.ndarray) -> jnp.ndarray:
    """``rsqrt(v)`` whose derivative is written ``-0.5 rsqrt(v) (dv / v)``: autodiff's
    ``-0.5 (rsqrt(v) / v) dv`` forms ``v^-1.5``, which underflows for ``v > 2^84`` in float32 (the
    transpose, ``(ct (-0.5 rsqrt(v))) / v``, then forms ``ct / sqrt(v)`` first)."""
    return lax.rsqrt(v)


@_rsqrt.defjvp
def _rsqrt_jvp(primals, tangents):
    (v,), (v_dot,) = primals, tangents
    inv = lax.rsqrt(v)
    return inv, (-0.5 * inv) * (v_dot / v)
