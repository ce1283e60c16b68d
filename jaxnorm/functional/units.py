"""Statistics of huge input, kept in a unit: :class:`Statistics` ``(mean, var, unit)``.

A float32 variance overflows beyond ``sigma_hat = 1.8e19`` (``1e154`` in float64), and the sum of
squares on its way there sooner, although such input is finite and normalizes to ordinary numbers.
Well before that the derivatives fail: the cotangent of the variance is of order ``n / sigma_hat^2``,
below the smallest normal float32 number from ``sigma_hat ~ 2^63``, and the derivative of ``rsqrt``
as written by autodiff, ``-0.5 rsqrt(v) / v``, underflows from ``sigma_hat ~ 2^42`` (4e12). So the
statistics of a group leave ``x``'s own scale from ``var > 2^(emax - emax / 8)`` (:func:`in_range`;
``sigma_hat > 2^56 = 7e16`` in float32) and :func:`inverse_std` writes its derivative as
``-0.5 rsqrt(v) (dv / v)``. Where that happens the statistics are taken of ``x * unit`` instead,
with ``unit`` the power of two :func:`huge_unit` (``2^-96`` in float32), so that ``var`` is the
variance of ``x * unit`` and

    y = (x * unit - mean * unit) * rsqrt(var + epsilon * unit^2)

is the usual ``(x - mean) * rsqrt(sigma_hat^2 + epsilon)``: scaling by a power of two is exact, and
``epsilon * unit^2`` is below the rounding error of such a ``var``. Every other group keeps
``unit = 1`` and the unscaled statistics bit for bit. One unit for every dtype of the same width means
that groups merged across channels and devices are all in the same unit; the choice is made per group
after the merge (:func:`jaxnorm.functional.dispersion_l2.l2_statistics`).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

__all__ = [
    "Statistics",
    "epsilon_floor",
    "huge_unit",
    "in_range",
    "inverse_std",
    "select_in_unit",
    "true_variance",
    "variance_in_unit",
]


class Statistics(NamedTuple):
    """Per-group statistics, keepdims, in the statistics dtype (float32 or wider).

    Attributes:
      mean: the mean ``mu`` of ``x``.
      var: ``sigma_hat**2`` of ``x * unit`` (``None``: mean-only normalization).
      unit: 1, or :func:`huge_unit` where the statistics of ``x`` itself leave :func:`in_range`
        (``None``: 1 everywhere).
    """

    mean: jnp.ndarray
    var: jnp.ndarray | None
    unit: jnp.ndarray | None = None


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
    (module docstring); beyond, the unit puts ``sigma_hat * unit`` between ``2^-40`` and ``2^32``."""
    headroom = 2.0 ** (jnp.finfo(spread.dtype).maxexp // 8)
    return jnp.isfinite(mean) & jnp.isfinite(spread * headroom)


def select_in_unit(
    in_range: jnp.ndarray,
    plain: tuple[jnp.ndarray, jnp.ndarray],
    scaled: tuple[jnp.ndarray, jnp.ndarray],
    unit: float,
) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """Per group, ``(mean, spread, unit)``: the ``plain`` statistics of ``x`` (``unit = 1``) where
    ``in_range``, else the ``scaled`` ones of ``x * unit``, whose mean is taken back to ``x``'s scale
    (``spread``: M2 or the variance, left in the unit)."""
    (mean, spread), (scaled_mean, scaled_spread) = plain, scaled
    return (
        jnp.where(in_range, mean, scaled_mean / unit),
        jnp.where(in_range, spread, scaled_spread),
        jnp.where(in_range, 1, unit).astype(spread.dtype),
    )


def variance_in_unit(dispersion: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """``((sigma_hat * unit)^2, unit)`` from a finite dispersion ``sigma_hat`` (the L1, L∞ and top-k
    ones): ``unit = 1`` where ``sigma_hat^2`` is :func:`in_range`, :func:`huge_unit` beyond. Per group,
    no pass over ``x``: the mean and ``sigma_hat`` are homogeneous of degree 1 in ``x``, so
    ``(sigma_hat * unit)^2`` is the variance of ``x * unit``, and a power of two times ``sigma_hat`` is
    exact (ordinary groups keep ``sigma_hat^2`` bit for bit)."""
    plain = in_range(dispersion, jnp.square(dispersion))
    unit = lax.stop_gradient(jnp.where(plain, 1, huge_unit(dispersion.dtype)).astype(dispersion.dtype))
    return jnp.square(dispersion * unit), unit


def true_variance(statistics: Statistics) -> jnp.ndarray | None:
    """``sigma_hat**2`` of ``x`` itself, the largest finite number where it overflows the dtype (what the
    running statistics and :func:`jaxnorm.functional.batch_moments` hold)."""
    var, unit = statistics.var, statistics.unit
    if var is None or unit is None:
        return var
    top = jnp.finfo(var.dtype).max
    return jnp.where(unit == 1, var, jnp.minimum(var / unit / unit, top))


def epsilon_floor(epsilon: float, dtype: jnp.dtype) -> float:
    """``epsilon``, or the smallest normal number of the statistics ``dtype`` where ``epsilon`` is 0.

    With ``epsilon = 0`` a constant group (variance exactly 0, deviations exactly 0) would be ``0 / 0``;
    floored, it normalizes to exactly 0 with finite derivatives, and every group whose variance is a
    normal number is unchanged (the floor is below its rounding). A static choice: a positive
    ``epsilon`` gives the same program as before."""
    return max(float(epsilon), float(jnp.finfo(dtype).tiny))


def inverse_std(statistics: Statistics, epsilon: float) -> jnp.ndarray | None:
    """``rsqrt(var + epsilon * unit^2)``: the factor of the scaled deviations ``(x - mean) * unit``
    (``epsilon * unit^2`` is 0 in the dtype where ``unit`` is not 1; ``epsilon`` floored by
    :func:`epsilon_floor`)."""
    var, unit = statistics.var, statistics.unit
    if var is None:
        return None
    epsilon = epsilon_floor(epsilon, var.dtype)
    return _rsqrt(var + (epsilon if unit is None else epsilon * unit * unit))


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
