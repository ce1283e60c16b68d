"""The normalization every norm ends in, ``y = (x - mu) * rsqrt(sigma_hat^2 + epsilon) * scale + bias``
(Ioffe & Szegedy, ICML 2015, Alg. 1), with statistics kept in a unit (:mod:`jaxnorm.functional.units`)
and the derivative of per-feature statistics written out (:func:`_affine`).

The per-example norms that call it live in :mod:`.per_example`, the last-axis kernels of layer and RMS
norm in :mod:`.last_axis`, NormProp's ReLU in :mod:`.normprop`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxnorm.functional.checks import check_bool, check_broadcasts, check_compute_dtype, check_epsilon
from jaxnorm.functional.platform import distinct, per_platform
from jaxnorm.functional.units import Statistics, inverse_std, unit_deviations

__all__ = ["normalize"]


def normalize(
    x: jnp.ndarray,
    mean: jnp.ndarray,
    var: jnp.ndarray | None,
    *,
    scale: jnp.ndarray | None = None,
    bias: jnp.ndarray | None = None,
    epsilon: float = 1e-5,
    dtype: jnp.dtype | None = None,
    unit: jnp.ndarray | None = None,
    scaled_deviations: bool = True,
) -> jnp.ndarray:
    """``y = (x - mean) * rsqrt(var + epsilon) * scale + bias`` (Ioffe & Szegedy 2015, Alg. 1).

    ``var=None`` gives mean-only normalization ``(x - mean) * scale + bias``. ``mean``/``var``/``scale``/
    ``bias`` broadcast against ``x``. Computed in the statistics' precision; returned as ``dtype``
    (default ``x.dtype``). Used for both the batch-statistics and the running-statistics path. With
    ``unit`` (:mod:`jaxnorm.functional.units`: ``var`` is the variance of ``x * unit``) it is
    ``(x * unit - mean * unit) * rsqrt(var + epsilon * unit^2) * scale + bias``. With
    ``scaled_deviations=False`` XLA:CPU folds the unit into the inverse instead,
    ``(x - mean) * (rsqrt(var + epsilon * unit^2) * unit) * scale + bias``: one product per group instead
    of two per element, the same numbers wherever ``x - mean`` is finite and ``sigma_hat`` below
    ``2^126`` (float32; beyond, the folded inverse is subnormal and XLA:CPU flushes it to 0); other
    platforms keep the scaled deviations (:func:`~jaxnorm.functional.platform.per_platform`). No norm of
    the library asks for it (until 2026-11-28 the p != 2 ones did, on CPU).

    Where the statistics are per feature, like ``scale`` (batch norm), the derivative is written out
    (:func:`_affine`): autodiff of this expression makes XLA write ``cotangent * rsqrt(var) * scale`` to
    memory and reduce it again for the mean's cotangent, which is ``-sum(cotangent) * rsqrt(var) * scale``,
    a plain sum that the bias gradient needs anyway. Per-example statistics keep autodiff here (a mask,
    devices, p != 2); at p = 2 without either, instance, group and layer norm have their own derivative
    (:func:`jaxnorm.functional.per_example_l2.l2_normalize`, and
    :func:`jaxnorm.functional.last_axis.last_axis_norm` over the last axis alone).
    """
    epsilon = check_epsilon(epsilon)
    dtype = check_compute_dtype(dtype)
    check_broadcasts(mean, x.shape, "mean")
    check_broadcasts(var, x.shape, "var")
    check_broadcasts(scale, x.shape, "scale")
    check_broadcasts(bias, x.shape, "bias")
    check_broadcasts(unit, x.shape, "unit")
    if unit is not None and var is None:
        raise ValueError("unit scales the variance (var is that of x * unit); it needs var, got var=None")
    scaled_deviations = check_bool(scaled_deviations, "scaled_deviations")
    inv = inverse_std(Statistics(mean, var, unit), epsilon)
    if unit is not None and not scaled_deviations:
        def folded(x, mean, inv, scale, bias, unit):
            return _scaled(x, mean, inv * unit, scale, bias, None, dtype)

        return per_platform(folded, lambda *args: _scaled(*args, dtype), x, mean, inv, scale, bias, unit)
    return _scaled(x, mean, inv, scale, bias, unit, dtype)


def _scaled(
    x: jnp.ndarray,
    mean: jnp.ndarray,
    inv: jnp.ndarray | None,
    scale: jnp.ndarray | None,
    bias: jnp.ndarray | None,
    unit: jnp.ndarray | None,
    dtype: jnp.dtype | None,
) -> jnp.ndarray:
    """``(x * unit - mean * unit) * (inv * scale) + bias`` as ``dtype`` (absent factors: 1, bias 0)."""
    stats_shape = jnp.broadcast_shapes(jnp.shape(mean), () if inv is None else jnp.shape(inv))
    affine_shape = jnp.broadcast_shapes(*(jnp.shape(a) for a in (scale, bias) if a is not None))
    if jnp.broadcast_shapes(stats_shape, affine_shape) != stats_shape:  # per-example statistics
        y = x - mean if unit is None else unit_deviations(x, mean, unit)
        if inv is not None:
            y = y * (inv if scale is None else inv * scale)
        elif scale is not None:
            y = y * scale
        if bias is not None:
            y = y + bias
        return y.astype(x.dtype if dtype is None else dtype)
    ones = jnp.ones((), jnp.result_type(x, mean))
    y = _affine(
        x,
        mean,
        ones if inv is None else inv,
        ones if scale is None else scale,
        jnp.zeros((), ones.dtype) if bias is None else bias,
        ones if unit is None else unit,
    )
    return y.astype(x.dtype if dtype is None else dtype)


@jax.custom_jvp
def _affine(
    x: jnp.ndarray,
    mean: jnp.ndarray,
    inv: jnp.ndarray,
    scale: jnp.ndarray,
    bias: jnp.ndarray,
    unit: jnp.ndarray,
) -> jnp.ndarray:
    """``(x * unit - mean * unit) * (inv * scale) + bias``, all broadcasting against ``x`` (``unit`` is a
    constant 1 unless the statistics of huge input are kept in a unit)."""
    return unit_deviations(x, mean, unit) * (inv * scale) + bias


@_affine.defjvp
def _affine_jvp(primals, tangents):
    x, mean, inv, scale, bias, unit = primals
    x_dot, mean_dot, inv_dot, scale_dot, bias_dot, _ = tangents
    y = _affine(x, mean, inv, scale, bias, unit)
    # Grouped so that the transpose reduces plain cotangents: the mean's term is a small product
    # broadcast once (its cotangent is ``sum(ct)``), and inv and scale share one ``sum(ct * (x - mean))``.
    # The unit (and the mean beside it) has its own XLA:CPU copy per full-size use: a shared one is a
    # broadcast that XLA:CPU writes to memory (docs/benchmarks.md, "Scaled deviations at p != 2").
    u1, u2 = distinct(unit, 1), distinct(unit, 2)
    y_dot = (
        (x_dot * u1) * (inv * scale)
        - ((mean_dot * unit) * inv) * scale
        + unit_deviations(x, distinct(mean, 2), u2) * (inv_dot * scale + inv * scale_dot)
        + bias_dot
    )
    return y, y_dot.astype(y.dtype)
