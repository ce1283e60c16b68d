"""Statistics of huge input, kept in a unit: :class:`Statistics` ``(mean, var, unit)``.

A float32 variance overflows beyond ``sigma_hat = 1.8e19`` (``1e154`` in float64), and the sum of
squares on its way there sooner, although such input is finite and normalizes to ordinary numbers.
Where that happens the L2 statistics are taken of ``x * unit`` instead, with ``unit`` the power of two
:func:`huge_unit` (``2^-96`` in float32), so that ``var`` is the variance of ``x * unit`` and

    y = (x * unit - mean * unit) * rsqrt(var + epsilon * unit^2)

is the usual ``(x - mean) * rsqrt(sigma_hat^2 + epsilon)``: scaling by a power of two is exact, and
``epsilon * unit^2`` is below the rounding error of such a ``var``. Every other group keeps
``unit = 1`` and the unscaled statistics bit for bit. One unit for every dtype of the same width means
that groups merged across channels and devices are all in the same unit; the choice is made per group
after the merge (:func:`jaxnorm.functional.dispersion_l2.l2_statistics`).
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
from jax import lax

__all__ = ["Statistics", "huge_unit", "inverse_std", "select_in_unit", "true_variance"]


class Statistics(NamedTuple):
    """Per-group statistics, keepdims, in the statistics dtype (float32 or wider).

    Attributes:
      mean: the mean ``mu`` of ``x``.
      var: ``sigma_hat**2`` of ``x * unit`` (``None``: mean-only normalization).
      unit: 1, or :func:`huge_unit` where the variance of ``x`` itself overflows (``None``: 1 everywhere).
    """

    mean: jnp.ndarray
    var: jnp.ndarray | None
    unit: jnp.ndarray | None = None


def huge_unit(dtype: jnp.dtype) -> float:
    """``2^(-3/4 emax)`` of ``dtype`` (``2^-96`` in float32, ``2^-768`` in float64): the scale of ``x`` for
    groups whose variance overflows.

    Such a group has ``sum (x - mean)^2 >= 2^emax``, so with ``n <= 2^30`` elements its largest scaled
    square is at least ``2^(-emax / 2 - 30)`` (``2^-94`` in float32: normal, 32 binades above the
    flush-to-zero limit), and the largest finite ``x`` gives a sum of scaled squares below
    ``n 2^(emax / 2 + 2)`` (``2^96``): no underflow that matters and no overflow.
    """
    emax = jnp.finfo(dtype).maxexp
    return 2.0 ** (-(3 * emax // 4))


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


def true_variance(statistics: Statistics) -> jnp.ndarray | None:
    """``sigma_hat**2`` of ``x`` itself, the largest finite number where it overflows the dtype (what the
    running statistics and :func:`jaxnorm.functional.batch_moments` hold)."""
    var, unit = statistics.var, statistics.unit
    if var is None or unit is None:
        return var
    top = jnp.finfo(var.dtype).max
    return jnp.where(unit == 1, var, jnp.minimum(var / unit / unit, top))


def inverse_std(statistics: Statistics, epsilon: float) -> jnp.ndarray | None:
    """``rsqrt(var + epsilon * unit^2)``: the factor of the scaled deviations ``(x - mean) * unit``
    (``epsilon * unit^2`` is 0 in the dtype where ``unit`` is not 1)."""
    var, unit = statistics.var, statistics.unit
    if var is None:
        return None
    return lax.rsqrt(var + (epsilon if unit is None else epsilon * unit * unit))
