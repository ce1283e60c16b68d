"""Layer norm (Ba, Kiros & Hinton 2016, Sec. 3) and RMS norm (Zhang & Sennrich 2019, Eq. 4) over the last
axis alone, without a mask: XLA fuses a row's statistics and its normalization into one kernel, so these
have their own row statistics (:func:`row_statistics`: one pass, the shifted-data pass behind a
conditional, huge rows in a unit) and their own derivative (:func:`last_axis_norm`), computed in float32
(or wider) whatever the dtype of ``x``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_derivatives import SymbolicZero

from jaxnorm.functional.eager import compiled_when_concrete
from jaxnorm.functional.moments import CONDITION_LIMIT, shifted_pass, stats_dtype
from jaxnorm.functional.platform import distinct, no_copy, per_platform, separate_reads
from jaxnorm.functional.tangents import instantiate_zeros
from jaxnorm.functional.units import add_epsilon, huge_unit, refine_variance, select_in_unit, unit_deviations

__all__ = ["last_axis_norm", "rms_row_statistics", "row_statistics"]


@functools.partial(jax.custom_jvp, nondiff_argnums=(3, 4))
def last_axis_norm(
    x: jnp.ndarray, scale: jnp.ndarray, bias: jnp.ndarray, epsilon: float, centred: bool = True
) -> jnp.ndarray:
    """Layer norm (``centred``) or RMS norm over the last axis: ``xhat * scale + bias`` with
    ``xhat = (x - mean) * rsqrt(var + eps)`` (``var`` accurate whatever the mean: :func:`row_statistics`),
    or ``xhat = x * rsqrt(mean(x^2) + eps)``, computed in float32 (or wider) whatever the dtype of ``x``:
    ``x`` is widened where it is read, so a half-precision ``x`` is never copied to memory as float32.

    Custom JVP (Ba et al. 2016, Sec. 3, differentiated): with ``m(.)`` the mean over the last axis,
    ``d xhat = rsqrt(var + eps) * (dx - m(dx) - xhat * m(xhat dx))`` (RMS: without ``m(dx)``); its
    transpose is the usual ``rsqrt(var + eps) * (g - m(g) - xhat * m(xhat g))``,
    ``g = cotangent * scale``, two row reductions (autodiff of the two-pass formula would differentiate
    through the mean twice). Each full-size use of ``xhat`` in the tangent recomputes it from its own
    copy of the row statistics, so the backward pass writes no full-size temporary (measurements in
    ``docs/benchmarks.md``).
    """
    mean, inv, unit = row_statistics(x, epsilon, centred)
    return _deviations(_widen(x), mean, unit) * (inv * scale) + bias


def _widen(x: jnp.ndarray) -> jnp.ndarray:
    """``x`` in the statistics dtype."""
    return x.astype(stats_dtype(x))


def _deviations(wide: jnp.ndarray, mean: jnp.ndarray | None, unit: jnp.ndarray) -> jnp.ndarray:
    """``x * unit - mean * unit`` (RMS norm: ``x * unit``), ``x`` already widened."""
    return wide * unit if mean is None else unit_deviations(wide, mean, unit)


@compiled_when_concrete(static_argnames=("epsilon", "centred"))
def row_statistics(
    x: jnp.ndarray, epsilon: float, centred: bool
) -> tuple[jnp.ndarray | None, jnp.ndarray, jnp.ndarray | None]:
    """The row mean (None unless ``centred``), ``rsqrt`` of the row variance (or mean square) + eps, both
    of ``x * unit``, and the row's unit (1 except in rows held in
    :func:`~jaxnorm.functional.units.huge_unit`): the normalized row is ``(x * unit - mean * unit) * inv``.
    RMS norm takes :func:`rms_row_statistics`, except in XLA:CPU's one fused kernel
    (:func:`~jaxnorm.functional.platform.per_platform`).

    Centred: one pass for ``m = mean(x)`` and ``var = mean(x^2) - m^2`` (the two sums XLA fuses with the
    row's normalization), kept when every row is well conditioned, ``m^2 <= CONDITION_LIMIT * var``
    (at most 5 bits lost to cancellation; see :data:`~jaxnorm.functional.moments.CONDITION_LIMIT`).
    Otherwise (a large mean, or a constant non-zero row, whose ``var`` is rounding noise) a
    :func:`jax.lax.cond` takes the shifted-data pass about ``m`` (Chan et al. 1983): ``d = x - m``,
    ``mean = m + mean(d)``, ``var = mean(d^2) - mean(d)^2``; a constant row has one deviation ``d``,
    so its mean comes out exact and it normalizes to exactly 0. Rows whose variance or mean overflows the
    dtype (huge input) take a third pass in the unit (:func:`_huge_rows`), also behind a
    :func:`jax.lax.cond`. Each pass widens ``x`` itself (the
    :func:`jax.lax.cond` takes ``x`` as it is; the two sums read :func:`separate_reads` of it), so a
    half-precision ``x`` is not copied to memory as float32.
    """
    if not centred:
        forms = (_fused_rms_row_statistics, rms_row_statistics)
        return (None, *per_platform(*(functools.partial(f, epsilon=epsilon) for f in forms), x))
    sum_source, square_source = separate_reads(x, 2)
    rough = jnp.mean(_widen(sum_source), -1, keepdims=True)
    raw_var = jnp.mean(jnp.square(_widen(square_source)), -1, keepdims=True) - jnp.square(rough)
    ones = jnp.ones_like(rough)

    def one_pass() -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
        return rough, lax.rsqrt(add_epsilon(jnp.maximum(raw_var, 0), epsilon)), ones

    def shifted_pass() -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
        mean, var = _shifted_moments(_widen(x), rough)
        in_range = jnp.isfinite(mean) & jnp.isfinite(var)

        def shifted(mean: jnp.ndarray, var: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
            return mean, lax.rsqrt(add_epsilon(jnp.maximum(var, 0), epsilon)), ones

        def with_huge_rows() -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
            # the rows in range again, the huge ones zeroed: the inf / NaN statistics of the huge rows
            # would make every derivative through the select NaN (0 * inf), second ones included
            safe = jnp.where(in_range, _widen(x), 0)
            in_range_moments = _shifted_moments(safe, jnp.where(in_range, rough, 0))
            return _huge_rows(x, in_range, in_range_moments, epsilon)

        return lax.cond(jnp.all(in_range), lambda: shifted(mean, var), with_huge_rows)

    # raw_var not finite: squares that overflow (huge rows) go to the careful passes too
    well_conditioned = jnp.all((jnp.square(rough) <= CONDITION_LIMIT * raw_var) & jnp.isfinite(raw_var))
    return lax.cond(well_conditioned, one_pass, shifted_pass)


def _shifted_moments(wide: jnp.ndarray, centre: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """The row mean and variance about ``centre``: :func:`~jaxnorm.functional.moments.shifted_pass` over
    the last axis, ``M2 / n``."""
    count = wide.shape[-1]
    mean, m2 = shifted_pass(wide, centre, None, (wide.ndim - 1,), count)
    return mean, m2 / count


def rms_row_statistics(x: jnp.ndarray, epsilon: float) -> tuple[jnp.ndarray, jnp.ndarray]:
    """``(inv, unit)`` of RMS norm over the last axis, ``y = (x * unit) * inv``:
    ``inv = rsqrt(mean((x * unit)^2) + eps unit^2)``, ``unit = 1`` where the row's mean square is
    finite (its sum of squares too), else :func:`~jaxnorm.functional.units.huge_unit` (``rms > 1.8e19 /
    sqrt(n)`` in float32), refined to ``rms * unit`` in ``[16, 32)`` where some row needs it
    (:func:`~jaxnorm.functional.units.refine_variance`). Both mean squares are taken, sibling reductions
    of one read of the row, and selected per row (``epsilon unit^2`` is below rounding where the unit is
    not 1: :mod:`~jaxnorm.functional.units`)."""
    wide = _widen(x)
    unit_value = huge_unit(wide.dtype)
    mean_square, scaled_mean_square = _row_mean_square(wide), _row_mean_square(wide * unit_value)
    plain = jnp.isfinite(mean_square)
    unit = jnp.where(plain, 1, unit_value).astype(wide.dtype)
    scaled_mean_square, unit = refine_variance(jnp.where(plain, 1, scaled_mean_square), unit)
    # the unselected side of each select is kept finite, so that its zero cotangent stays zero
    inv = jnp.where(
        plain,
        lax.rsqrt(add_epsilon(jnp.where(plain, mean_square, 1), epsilon)),
        lax.rsqrt(scaled_mean_square),
    )
    return inv, lax.stop_gradient(unit)


def _fused_rms_row_statistics(x: jnp.ndarray, epsilon: float) -> tuple[jnp.ndarray, jnp.ndarray]:
    """:func:`rms_row_statistics` as XLA:CPU fuses it into one kernel with the normalization: one mean
    square, ``unit = 1``; a row whose sum of squares overflows (``rms > 1.8e19 / sqrt(n)`` in float32,
    ``n`` the row's length) comes out as zeros, as in flax (documented in ``docs/functional.md``, "Huge
    activations")."""
    mean_square = _row_mean_square(_widen(x))
    return lax.rsqrt(add_epsilon(mean_square, epsilon)), jnp.ones_like(mean_square)


def _row_mean_square(values: jnp.ndarray) -> jnp.ndarray:
    return jnp.mean(jnp.square(values), -1, keepdims=True)


def _huge_rows(
    x: jnp.ndarray, in_range: jnp.ndarray, in_range_moments: tuple[jnp.ndarray, jnp.ndarray], epsilon: float
) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """Row statistics ``(mean, inv, unit)`` where the mean or ``var`` overflows the dtype (``sigma > 1.8e19``
    in float32, or a sum of ``x`` beyond the largest float): taken again on ``x * unit``,
    :func:`~jaxnorm.functional.units.huge_unit` (``2^-96`` in float32), about their rough mean
    (:func:`_shifted_moments`), selected per row with the ``in_range_moments`` ``(mean, var)`` of the rows
    in range (:func:`~jaxnorm.functional.units.select_in_unit`: a constant row of huge values keeps unit
    1, where ``epsilon`` does not underflow), then refined by a power of two to ``sigma_hat * unit`` in
    ``[16, 32)`` (:func:`~jaxnorm.functional.units.refine_variance`). The row is normalized as
    ``(x * unit - mean * unit) * rsqrt(var + epsilon * unit^2)``, every factor a normal number up to the
    largest float (a factor ``1 / sigma_hat`` is subnormal beyond ``2^126``) and the inverse below 1 (no
    overflow of ``inv * scale`` or of the cotangent times ``inv``)."""
    unit_value = huge_unit(stats_dtype(x))
    scaled = _widen(x) * unit_value
    scaled_moments = _shifted_moments(scaled, jnp.mean(scaled, -1, keepdims=True))
    mean, var, unit = select_in_unit(in_range, in_range_moments, scaled_moments, unit_value)
    var, unit = refine_variance(jnp.maximum(var, 0), unit)
    return mean, lax.rsqrt(add_epsilon(var, epsilon, unit)), unit


def _centre(x: jnp.ndarray, mean: jnp.ndarray | None) -> jnp.ndarray:
    return x if mean is None else x - mean


def last_axis_norm_jvp(epsilon, centred, primals, tangents):
    x, scale, bias = primals
    x_dot, scale_dot, bias_dot = (instantiate_zeros(t) for t in tangents)
    mean, inv, unit = row_statistics(x, epsilon, centred)
    wide = _widen(x)
    y = _deviations(wide, mean, unit) * (inv * scale) + bias
    # scale not differentiated (symbolic-zero tangent: the input-only gradient): the plain form, which
    # platform_forms.py measures faster there; otherwise distinct copies, faster for the full gradient
    opaque = not isinstance(tangents[1], SymbolicZero)
    copies = distinct if opaque else no_copy

    def xhat(tag: int) -> jnp.ndarray:
        # each full-size use recomputes xhat from its own copy of the row statistics: XLA would write a
        # shared ``x * unit - mean * unit`` or broadcast ``inv`` or ``unit`` to memory; this way only the
        # gradient is written
        tag_mean = None if mean is None else copies(mean, tag)
        return _deviations(wide, tag_mean, copies(unit, tag)) * copies(inv, tag)

    x_dot = _widen(x_dot) * copies(unit, 4)
    x_dot_centred = _centre(x_dot, None if mean is None else jnp.mean(x_dot, -1, keepdims=True))
    xhat_dot = inv * (x_dot_centred - xhat(1) * jnp.mean(xhat(2) * x_dot, -1, keepdims=True))
    if opaque:
        return y, xhat_dot * scale + xhat(3) * scale_dot + bias_dot
    return y, xhat_dot * scale + bias_dot


last_axis_norm.defjvp(last_axis_norm_jvp, symbolic_zeros=True)

