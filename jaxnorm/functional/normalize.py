"""Per-example normalizations and the shared affine map: layer (Ba, Kiros & Hinton 2016, Sec. 3), group
(Wu & He, ECCV 2018, Eq. 1-3), instance (Ulyanov et al. 2016) and RMS norm (Zhang & Sennrich 2019, Eq. 4)
with an Lp dispersion, and NormProp's ReLU (Arpit et al., ICML 2016, Sec. 3).

Each function is ``(x - mu) * rsqrt(sigma_hat^2 + epsilon)`` over its own reduction, with the dispersion
of :mod:`jaxnorm.functional.dispersion` (``p = 2`` is the usual variance); outputs have the dtype of ``x``,
statistics are float32 (or float64).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_derivatives import SymbolicZero

from jaxnorm.functional._checks import (
    PNorm,
    canonical_axes,
    canonical_p,
    check_axis_name,
    check_bool,
    check_broadcasts,
    check_epsilon,
    check_floating,
    check_mask,
    num_groups_of,
)
from jaxnorm.functional.collectives import AxisIndexGroups
from jaxnorm.functional.dispersion import deviations_in_unit, dispersion_statistics
from jaxnorm.functional.eager import compiled_when_concrete
from jaxnorm.functional.moments import CONDITION_LIMIT, ChannelGroups, stats_dtype
from jaxnorm.functional.options import BatchOptions
from jaxnorm.functional.platform import distinct, per_platform, separate_reads
from jaxnorm.functional.units import (
    Statistics,
    add_epsilon,
    huge_unit,
    in_range,
    inverse_std,
    lift_tiny,
    needs_tiny_unit,
)

__all__ = [
    "RELU_MEAN",
    "RELU_STD",
    "group_norm",
    "instance_norm",
    "layer_norm",
    "normalize",
    "normprop_relu",
    "per_example_norm",
    "rms_norm",
]


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
    ``(x * unit - mean * unit) * rsqrt(var + epsilon * unit^2) * scale + bias``, or, with
    ``scaled_deviations=False`` (statistics whose every deviation ``x - mean`` is finite: :func:`~jaxnorm.
    functional.dispersion.deviations_in_unit`), ``(x - mean) * (rsqrt(var + epsilon * unit^2) * unit)
    * scale + bias``: one product per group instead of two per element.

    Where the statistics are per feature, like ``scale`` (batch norm), the derivative is written out
    (:func:`_affine`): autodiff of this expression makes XLA write ``cotangent * rsqrt(var) * scale`` to
    memory and reduce it again for the mean's cotangent, which is ``-sum(cotangent) * rsqrt(var) * scale``,
    a plain sum that the bias gradient needs anyway. Per-example statistics (group norm; layer norm off
    the last axis) keep autodiff, which XLA compiles better there; layer norm over the last axis has
    its own derivative (``_last_axis_norm``).
    """
    epsilon = check_epsilon(epsilon)
    if dtype is not None and not jnp.issubdtype(dtype, jnp.inexact):
        raise TypeError(f"dtype must be a floating dtype (or None for x's dtype), got {dtype!r}")
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
        inv, unit = inv * unit, None
    stats_shape = jnp.broadcast_shapes(jnp.shape(mean), () if inv is None else jnp.shape(inv))
    affine_shape = jnp.broadcast_shapes(*(jnp.shape(a) for a in (scale, bias) if a is not None))
    if jnp.broadcast_shapes(stats_shape, affine_shape) != stats_shape:  # per-example statistics
        y = x - mean if unit is None else x * unit - mean * unit
        if inv is not None:
            y = y * (inv if scale is None else inv * scale)
        elif scale is not None:
            y = y * scale
        if bias is not None:
            y = y + bias
        return y.astype(dtype or x.dtype)
    ones = jnp.ones((), jnp.result_type(x, mean))
    y = _affine(
        x,
        mean,
        ones if inv is None else inv,
        ones if scale is None else scale,
        jnp.zeros((), ones.dtype) if bias is None else bias,
        ones if unit is None else unit,
    )
    return y.astype(dtype or x.dtype)


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
    return (x * unit - mean * unit) * (inv * scale) + bias


@_affine.defjvp
def _affine_jvp(primals, tangents):
    x, mean, inv, scale, bias, unit = primals
    x_dot, mean_dot, inv_dot, scale_dot, bias_dot, _ = tangents
    y = _affine(x, mean, inv, scale, bias, unit)
    # Grouped so that the transpose reduces plain cotangents: the mean's term is a small product
    # broadcast once (its cotangent is ``sum(ct)``), and inv and scale share one ``sum(ct * (x - mean))``.
    # (A CPU-only distinct copy of the mean here bought < 10 %: benchmarks/platform_forms.py.)
    y_dot = (
        (x_dot * unit) * (inv * scale)
        - ((mean_dot * unit) * inv) * scale
        + (x * unit - mean * unit) * (inv_dot * scale + inv * scale_dot)
        + bias_dot
    )
    return y, y_dot.astype(y.dtype)


@functools.partial(jax.custom_jvp, nondiff_argnums=(3, 4))
def _last_axis_norm(
    x: jnp.ndarray, scale: jnp.ndarray, bias: jnp.ndarray, epsilon: float, centred: bool = True
) -> jnp.ndarray:
    """Layer norm (``centred``) or RMS norm over the last axis: ``xhat * scale + bias`` with
    ``xhat = (x - mean) * rsqrt(var + eps)`` (``var`` accurate whatever the mean: :func:`_row_statistics`),
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
    mean, inv, unit = _row_statistics(x, epsilon, centred)
    return _centre(_widen(x, unit), mean) * (inv * scale) + bias


def _widen(x: jnp.ndarray, unit: jnp.ndarray | None = None) -> jnp.ndarray:
    """``x`` in the statistics dtype, times the row's ``unit`` where there is one (RMS norm)."""
    wide = x.astype(stats_dtype(x))
    return wide if unit is None else wide * unit


@compiled_when_concrete(static_argnames=("epsilon", "centred"))
def _row_statistics(
    x: jnp.ndarray, epsilon: float, centred: bool
) -> tuple[jnp.ndarray | None, jnp.ndarray, jnp.ndarray | None]:
    """The row mean (None unless ``centred``), ``rsqrt`` of the row variance (or mean square) + eps, and
    the row's unit (RMS norm; None when ``centred``): the normalized row is ``(x * unit - mean) * inv``.
    RMS norm takes :func:`rms_row_statistics`, except in XLA:CPU's one fused kernel
    (:func:`~jaxnorm.functional.platform.per_platform`).

    Centred: one pass for ``m = mean(x)`` and ``var = mean(x^2) - m^2`` (the two sums XLA fuses with the
    row's normalization), kept when every row is well conditioned, ``m^2 <= CONDITION_LIMIT * var``
    (at most 5 bits lost to cancellation; see :data:`~jaxnorm.functional.moments.CONDITION_LIMIT`).
    Otherwise (a large mean, or a constant non-zero row, whose ``var`` is rounding noise) a
    :func:`jax.lax.cond` takes the shifted-data pass about ``m`` (Chan et al. 1983): ``d = x - m``,
    ``mean = m + mean(d)``, ``var = mean(d^2) - mean(d)^2``; a constant row has one deviation ``d``,
    so its mean comes out exact and it normalizes to exactly 0. Rows whose variance overflows the dtype
    (huge input) take a third pass on deviations scaled by their largest magnitude (:func:`_huge_rows`),
    also behind a :func:`jax.lax.cond`. Each pass widens ``x`` itself (the
    :func:`jax.lax.cond` takes ``x`` as it is; the two sums read :func:`separate_reads` of it), so a
    half-precision ``x`` is not copied to memory as float32.
    """
    if not centred:
        forms = (_fused_rms_row_statistics, rms_row_statistics)
        return (None, *per_platform(*(functools.partial(f, epsilon=epsilon) for f in forms), x))
    sum_source, square_source = separate_reads(x, 2)
    rough = jnp.mean(_widen(sum_source), -1, keepdims=True)
    raw_var = jnp.mean(jnp.square(_widen(square_source)), -1, keepdims=True) - jnp.square(rough)

    def one_pass() -> tuple[jnp.ndarray, jnp.ndarray]:
        return rough, lax.rsqrt(add_epsilon(jnp.maximum(raw_var, 0), epsilon))

    def shifted_pass() -> tuple[jnp.ndarray, jnp.ndarray]:
        d = _widen(x) - rough
        correction = jnp.mean(d, -1, keepdims=True)
        var = jnp.mean(jnp.square(d), -1, keepdims=True) - jnp.square(correction)
        in_range = jnp.isfinite(rough) & jnp.isfinite(var)
        shifted = (rough + correction, lax.rsqrt(add_epsilon(jnp.maximum(var, 0), epsilon)))
        return lax.cond(jnp.all(in_range), lambda: shifted, lambda: _huge_rows(x, rough, in_range, shifted))

    # raw_var not finite: squares that overflow (huge rows) go to the careful passes too
    well_conditioned = jnp.all((jnp.square(rough) <= CONDITION_LIMIT * raw_var) & jnp.isfinite(raw_var))
    return (*lax.cond(well_conditioned, one_pass, shifted_pass), None)


def rms_row_statistics(x: jnp.ndarray, epsilon: float) -> tuple[jnp.ndarray, jnp.ndarray]:
    """``(inv, unit)`` of RMS norm over the last axis, ``y = (x * unit) * inv``:
    ``inv = rsqrt(mean((x * unit)^2) + eps unit^2)``, ``unit = 1`` where the row's mean square is
    finite, else :func:`~jaxnorm.functional.units.huge_unit` (``rms > 1.8e19`` in float32). Both mean
    squares are taken, sibling reductions of one read of the row, and selected per row without a
    conditional (``epsilon unit^2`` is below rounding where the unit is not 1:
    :mod:`~jaxnorm.functional.units`)."""
    wide = _widen(x)
    unit_value = huge_unit(wide.dtype)
    mean_square, scaled_mean_square = _row_mean_square(wide), _row_mean_square(wide * unit_value)
    plain = jnp.isfinite(mean_square)
    # the unselected side of each select is kept finite, so that its zero cotangent stays zero
    inv = jnp.where(
        plain,
        lax.rsqrt(add_epsilon(jnp.where(plain, mean_square, 1), epsilon)),
        lax.rsqrt(jnp.where(plain, 1, scaled_mean_square)),
    )
    return inv, lax.stop_gradient(jnp.where(plain, 1, unit_value).astype(wide.dtype))


def _fused_rms_row_statistics(x: jnp.ndarray, epsilon: float) -> tuple[jnp.ndarray, jnp.ndarray]:
    """:func:`rms_row_statistics` as XLA:CPU fuses it into one kernel with the normalization: one mean
    square, ``unit = 1``; a row whose mean square overflows (``rms > 1.8e19`` in float32) comes out as
    zeros, as in flax (documented in ``docs/functional.md``, "Huge activations")."""
    mean_square = _row_mean_square(_widen(x))
    return lax.rsqrt(add_epsilon(mean_square, epsilon)), jnp.ones_like(mean_square)


def _row_mean_square(values: jnp.ndarray) -> jnp.ndarray:
    return jnp.mean(jnp.square(values), -1, keepdims=True)


def _huge_rows(
    x: jnp.ndarray, rough: jnp.ndarray, in_range: jnp.ndarray, shifted: tuple[jnp.ndarray, jnp.ndarray]
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Row statistics where ``var`` (or the mean) overflows the dtype (``sigma > 1.8e19`` in float32):
    the deviations ``d = x - c`` are divided by their largest magnitude ``D`` before they are summed,
    ``mean = c + D mean(d / D)``, ``inv = rsqrt(var(d / D)) / D`` (``epsilon / D^2`` is below rounding
    there). ``D`` is a homogeneous statistic, not a power of two, so the scale-invariance tracer
    (:mod:`jaxnorm.enorm`) sees through it. Rows ``in_range`` keep their ``shifted`` statistics."""
    centre = jnp.where(jnp.isfinite(rough), rough, 0)  # sum x itself overflowed
    d = _widen(x) - centre
    unit = jnp.max(jnp.abs(d), -1, keepdims=True)
    scaled = d / jnp.where(unit > 0, unit, 1)
    scaled_mean = jnp.mean(scaled, -1, keepdims=True)
    scaled_var = jnp.mean(jnp.square(scaled), -1, keepdims=True) - jnp.square(scaled_mean)
    inv = lax.rsqrt(jnp.maximum(scaled_var, jnp.finfo(scaled_var.dtype).tiny)) / unit
    mean, shifted_inv = shifted
    return jnp.where(in_range, mean, centre + unit * scaled_mean), jnp.where(in_range, shifted_inv, inv)


def _centre(x: jnp.ndarray, mean: jnp.ndarray | None) -> jnp.ndarray:
    return x if mean is None else x - mean


def _last_axis_norm_jvp(epsilon, centred, primals, tangents):
    x, scale, bias = primals
    x_dot, scale_dot, bias_dot = (_instantiate(t) for t in tangents)
    mean, inv, unit = _row_statistics(x, epsilon, centred)
    x, x_dot = _widen(x, unit), _widen(x_dot, unit)
    y = _centre(x, mean) * (inv * scale) + bias
    # scale not differentiated (symbolic-zero tangent: the input-only gradient): the plain form, which
    # platform_forms.py measures faster there; otherwise distinct copies, faster for the full gradient
    opaque = not isinstance(tangents[1], SymbolicZero)

    def xhat(tag: int) -> jnp.ndarray:
        # each full-size use recomputes xhat from its own copy of the row statistics: XLA would write a
        # shared ``x - mean`` or broadcast ``inv`` to memory; this way only the gradient is written
        if not opaque:
            return _centre(x, mean) * inv
        return _centre(x, None if mean is None else distinct(mean, tag)) * distinct(inv, tag)

    x_dot_centred = _centre(x_dot, None if mean is None else jnp.mean(x_dot, -1, keepdims=True))
    xhat_dot = inv * (x_dot_centred - xhat(1) * jnp.mean(xhat(2) * x_dot, -1, keepdims=True))
    if opaque:
        return y, xhat_dot * scale + xhat(3) * scale_dot + bias_dot
    return y, xhat_dot * scale + bias_dot


_last_axis_norm.defjvp(_last_axis_norm_jvp, symbolic_zeros=True)


def _instantiate(tangent):
    """A symbolic-zero tangent (an input not differentiated) as an array of zeros."""
    return jnp.zeros(tangent.shape, tangent.dtype) if isinstance(tangent, SymbolicZero) else tangent


def per_example_norm(
    x: jnp.ndarray,
    axes: tuple[int, ...],
    *,
    p: PNorm | float,
    epsilon: float,
    mask: jnp.ndarray | None,
    use_fast_variance: bool,
    groups: ChannelGroups | None = None,
    axis_name: str | Sequence[str] | None = None,
    axis_index_groups: AxisIndexGroups = None,
    scale: jnp.ndarray | None = None,
    bias: jnp.ndarray | None = None,
    dtype: jnp.dtype | None = None,
) -> jnp.ndarray:
    """Lp normalization of ``x`` over ``axes`` (per example; ``groups`` merges channels), then the
    optional ``scale`` and ``bias`` (broadcastable to ``x``): the path of layer, group and instance norm."""
    p = canonical_p(p)
    epsilon = check_epsilon(epsilon)
    use_fast_variance = check_bool(use_fast_variance, "use_fast_variance")
    check_axis_name(axis_name)
    mask = check_mask(mask, x)
    plain = mask is None and groups is None and axis_name is None
    if p == 2 and axes == (x.ndim - 1,) and plain:
        ones = jnp.ones((), stats_dtype(x))
        y = _last_axis_norm(
            x,
            ones if scale is None else scale,
            jnp.zeros((), ones.dtype) if bias is None else bias,
            epsilon,
        )
        return y.astype(dtype or x.dtype)
    tiny_groups = needs_tiny_unit(epsilon, stats_dtype(x))
    options = BatchOptions(p=p, use_fast_variance=use_fast_variance, tiny_groups=tiny_groups)
    mean, var, unit = dispersion_statistics(
        x, axes, options, mask=mask, groups=groups, axis_name=axis_name, axis_index_groups=axis_index_groups
    )
    affine = dict(scale=scale, bias=bias, epsilon=epsilon, dtype=dtype)
    return normalize(x, mean, var, **affine, unit=unit, scaled_deviations=deviations_in_unit(options))


def layer_norm(
    x: jnp.ndarray,
    *,
    p: PNorm | float = 2,
    axis: int | Sequence[int] = -1,
    epsilon: float = 1e-5,
    mask: jnp.ndarray | None = None,
    axis_name: str | Sequence[str] | None = None,
    axis_index_groups: AxisIndexGroups = None,
    use_fast_variance: bool = True,
) -> jnp.ndarray:
    """Layer normalization (Ba et al. 2016, Sec. 3) with an Lp dispersion: per example over ``axis``.

    ``y = (x - mu) / sqrt(sigma_hat^2 + epsilon)`` with ``mu``, ``sigma_hat`` over the axes in ``axis``
    (int or tuple) — the reduction axes, as flax's ``reduction_axes``. ``axis_name`` reduces over a
    mapped axis too (features sharded across devices).
    """
    check_floating(x, "x")
    axes = canonical_axes(axis, x.ndim, "axis")
    if not axes:
        raise ValueError(f"axis must name at least one axis to normalize over, got {axis!r}")
    return per_example_norm(
        x,
        axes,
        p=p,
        epsilon=epsilon,
        mask=mask,
        use_fast_variance=use_fast_variance,
        axis_name=axis_name,
        axis_index_groups=axis_index_groups,
    )


def group_norm(
    x: jnp.ndarray,
    num_groups: int,
    *,
    p: PNorm | float = 2,
    epsilon: float = 1e-5,
    mask: jnp.ndarray | None = None,
    use_fast_variance: bool = True,
) -> jnp.ndarray:
    """Group normalization (Wu & He 2018, Eq. 1-3) with an Lp dispersion, channels last.

    The ``C`` channels are split into ``num_groups`` contiguous groups; statistics are taken per example
    and group over all non-batch axes. Computed as per-channel reductions over the spatial axes followed
    by a merge of the ``C / num_groups`` channels of each group (Chan's formula for ``p = 2``, a sum or
    max for ``p = 1`` / ``inf``): the large reduction keeps the contiguous channel axis instead of
    reshaping to ``(..., G, C / G)`` first (measured in ``docs/benchmarks.md``).
    """
    check_floating(x, "x")
    if x.ndim < 2:
        raise ValueError(f"group_norm needs (batch, ..., channels) input, got shape {x.shape}")
    num_groups = num_groups_of(x.shape[-1], num_groups, None)
    spatial = tuple(range(1, x.ndim - 1))
    return per_example_norm(
        x,
        spatial,
        p=p,
        epsilon=epsilon,
        mask=mask,
        use_fast_variance=use_fast_variance,
        groups=ChannelGroups(channel_axis=x.ndim - 1, num_groups=num_groups),
    )


def instance_norm(
    x: jnp.ndarray,
    *,
    p: PNorm | float = 2,
    epsilon: float = 1e-5,
    mask: jnp.ndarray | None = None,
    use_fast_variance: bool = True,
) -> jnp.ndarray:
    """Instance normalization (Ulyanov et al. 2016): per example and channel over the spatial axes.

    Channels last: ``x`` is ``(batch, *spatial, channels)`` with at least one spatial axis.
    """
    check_floating(x, "x")
    if x.ndim < 3:
        raise ValueError(f"instance_norm needs (batch, *spatial, channels) input, got shape {x.shape}")
    return per_example_norm(
        x,
        tuple(range(1, x.ndim - 1)),
        p=p,
        epsilon=epsilon,
        mask=mask,
        use_fast_variance=use_fast_variance,
    )


def rms_norm(
    x: jnp.ndarray,
    *,
    axis: int | Sequence[int] = -1,
    epsilon: float = 1e-6,
    axis_name: str | Sequence[str] | None = None,
    axis_index_groups: AxisIndexGroups = None,
    mask: jnp.ndarray | None = None,
    scale: jnp.ndarray | None = None,
) -> jnp.ndarray:
    """RMS normalization (Zhang & Sennrich 2019, Eq. 4): ``y = x / sqrt(mean(x^2) + epsilon)`` over ``axis``.

    The mean square is float32 (or wider), over the True elements of ``mask`` if given, and, with
    ``axis_name``, averaged over a mapped axis. ``scale`` (broadcastable to ``x``; the gain ``g`` of
    Eq. 4) gives ``y * scale``, computed as ``x * (rsqrt(mean(x^2) + epsilon) * scale)``: one product
    per element with a broadcast factor.
    """
    check_floating(x, "x")
    axes = canonical_axes(axis, x.ndim, "axis")
    epsilon = check_epsilon(epsilon)
    check_axis_name(axis_name)
    mask = check_mask(mask, x)
    check_broadcasts(scale, x.shape, "scale")
    x32 = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    if axes == (x.ndim - 1,) and mask is None and axis_name is None:
        ones = jnp.ones((), x32.dtype)
        y = _last_axis_norm(x32, ones if scale is None else scale, jnp.zeros((), x32.dtype), epsilon, False)
        return y.astype(x.dtype)
    reduction = _SquareReduction(axes, axis_name, axis_index_groups, needs_tiny_unit(epsilon, x32.dtype))
    mean_square, unit = _mean_square_in_unit(x32, mask, reduction)
    inv = inverse_std(Statistics(jnp.zeros((), x32.dtype), mean_square, unit), epsilon)
    return ((x32 * unit) * (inv if scale is None else inv * scale)).astype(x.dtype)


class _SquareReduction(NamedTuple):
    """Where RMS norm's mean square is taken: ``axes``, and the devices of ``axis_name``; whether tiny
    rows are kept in a unit (:func:`~jaxnorm.functional.units.needs_tiny_unit`)."""

    axes: tuple[int, ...]
    axis_name: str | Sequence[str] | None
    axis_index_groups: AxisIndexGroups
    tiny_groups: bool = False


def _masked_mean(values: jnp.ndarray, mask: jnp.ndarray | None, r: _SquareReduction, empty: float):
    """The mean of ``values`` over the True elements of ``mask`` (averaged over the devices), ``empty``
    for a row without elements."""
    if mask is None:
        mean = jnp.mean(values, axis=r.axes, keepdims=True)
    else:
        count = jnp.sum(mask, axis=r.axes, keepdims=True, dtype=values.dtype)
        mean = jnp.sum(jnp.where(mask, values, 0), axis=r.axes, keepdims=True) / jnp.maximum(count, 1)
    if r.axis_name is not None:
        mean = lax.pmean(mean, r.axis_name, axis_index_groups=r.axis_index_groups)
    if mask is None:
        return mean
    has_elements = count > 0
    if r.axis_name is not None:
        has_elements = lax.psum(count, r.axis_name, axis_index_groups=r.axis_index_groups) > 0
    return jnp.where(has_elements, mean, empty)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _mean_square_in_unit(
    x: jnp.ndarray, mask: jnp.ndarray | None, r: _SquareReduction
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """``(mean((x * unit)^2), unit)`` per row (a row without elements: mean square 1, no amplification,
    as in batch norm): ``unit = 1`` except where the mean square of ``x`` leaves the dtype's range
    (:func:`~jaxnorm.functional.units.in_range`), taken again on ``x * unit`` behind a
    :func:`jax.lax.cond`, and, with ``r.tiny_groups``, in :func:`~jaxnorm.functional.units.tiny_unit`
    where it is tiny (:func:`~jaxnorm.functional.units.lift_tiny`). Derivative (custom JVP, no
    conditional in the backward pass): ``d mean((x u)^2) = 2 mean(x u * dx u)``."""
    mean_square = _masked_mean(jnp.square(x), mask, r, 1)
    plain = in_range(mean_square, mean_square)

    def rescaled() -> tuple[jnp.ndarray, jnp.ndarray]:
        unit = huge_unit(x.dtype)
        scaled = _masked_mean(jnp.square(x * unit), mask, r, 1)
        return jnp.where(plain, mean_square, scaled), jnp.where(plain, 1, unit).astype(x.dtype)

    plain_statistics = lambda: (mean_square, jnp.ones_like(mean_square))
    mean_square, unit = lax.cond(jnp.all(plain), plain_statistics, rescaled)
    return lift_tiny(mean_square, unit) if r.tiny_groups else (mean_square, unit)


@_mean_square_in_unit.defjvp
def _mean_square_in_unit_jvp(r, primals, tangents):
    x, mask = primals
    mean_square, unit = _mean_square_in_unit(x, mask, r)
    tangent = 2 * _masked_mean((x * unit) * (tangents[0] * unit), mask, r, 0)
    return (mean_square, unit), (tangent, jnp.zeros_like(unit))


RELU_MEAN = 1 / math.sqrt(2 * math.pi)


"""``E[max(0, z)]`` for ``z ~ N(0, 1)`` (Arpit et al. 2016, Sec. 3)."""


RELU_STD = math.sqrt((1 - 1 / math.pi) / 2)


"""``std[max(0, z)]`` for ``z ~ N(0, 1)`` (Arpit et al. 2016, Sec. 3)."""


def normprop_relu(u: jnp.ndarray) -> jnp.ndarray:
    """Normalization propagation's ReLU (Arpit et al. 2016, Sec. 3): ``(relu(u) - RELU_MEAN) / RELU_STD``.

    If ``u ~ N(0, 1)`` the output has zero mean and unit variance, so a network of
    ``u = gamma * W x / ||W|| + beta`` layers (:func:`jaxnorm.functional.weight_norm`) followed by this
    activation stays normalized without any batch statistics.
    """
    check_floating(u, "u")
    return ((jax.nn.relu(u) - RELU_MEAN) / RELU_STD).astype(u.dtype)
