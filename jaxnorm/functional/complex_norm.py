"""Normalization of complex input, as flax computes it (``flax.linen.normalization._compute_stats``):
the complex mean ``mu = E[x]`` and the real variance ``E|x - mu|^2``, then

    y = (x - mu) * rsqrt(var + epsilon) * scale + bias

(RMS norm: ``mu = 0``, ``var = E|x|^2``). Only ``p = 2``: Norm matters' L1 / L∞ dispersions are of real
data. The statistics are those of flax, not of jaxnorm's real path (no unit for huge groups, no exact
mean for constant ones): a module's complex numbers match flax's.

With ``use_fast_variance`` the variance is ``E|x|^2 - |E x|^2`` clipped at 0 (one pass), else
``E|x - E x|^2``. Without a mask, with ``axis_name``, each device's means are averaged (``pmean``, as
flax). With ``mask`` the means are over its True elements, and across devices each element weighs once
(sums and counts summed, as in jaxnorm's real path; flax averages the devices' masked means with equal
weight, which differs where devices keep different numbers of elements, and is NaN where a device keeps
none); a group that keeps no element has mean 0 and variance 1, as in the real path (flax: NaN).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp
from jax import lax

from jaxnorm.functional.checks import PNorm, canonical_p, check_epsilon, check_mask
from jaxnorm.functional.collectives import AxisIndexGroups

__all__ = [
    "check_complex_p",
    "complex_mask_counts",
    "complex_moments",
    "complex_normalize",
    "complex_statistics_dtype",
]


def check_complex_p(p: PNorm | float, layer: str) -> None:
    """Complex input takes ``p = 2`` only: a ``TypeError`` naming ``p`` otherwise."""
    if canonical_p(p) != 2:
        raise TypeError(f"complex x is supported with p=2 only (as flax's {layer}), got p={p!r}")


def complex_statistics_dtype(x: jnp.ndarray, dtype: jnp.dtype | None) -> jnp.dtype:
    """flax's rule for the statistics: ``promote_types(dtype, float32)`` (``dtype``: the module's, else
    ``x``'s). A real ``dtype`` for complex ``x`` raises a ``TypeError`` naming ``dtype``: flax casts ``x``
    to it, discarding the imaginary part (a ``ComplexWarning``), which no caller means."""
    wide = jnp.promote_types(x.dtype if dtype is None else dtype, jnp.float32)
    if not jnp.issubdtype(wide, jnp.complexfloating):
        raise TypeError(
            f"dtype={jnp.dtype(dtype).name} is real but x is {x.dtype}: its imaginary part would be "
            "discarded (flax casts it away); pass a complex dtype or None"
        )
    return wide


def _abs_square(x: jnp.ndarray) -> jnp.ndarray:
    """``|x|^2`` as flax writes it, ``re^2 + im^2``."""
    if jnp.iscomplexobj(x):
        return lax.square(lax.real(x)) + lax.square(lax.imag(x))
    return lax.square(x)


def complex_moments(
    x: jnp.ndarray,
    axes: tuple[int, ...],
    *,
    centred: bool = True,
    use_fast_variance: bool = True,
    mask: jnp.ndarray | None = None,
    axis_name: str | Sequence[str] | None = None,
    axis_index_groups: AxisIndexGroups = None,
    dtype: jnp.dtype | None = None,
    count: jnp.ndarray | None = None,
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """``(mu, var)`` of complex ``x`` over ``axes``, keepdims, in :func:`complex_statistics_dtype` of
    ``x`` and the module's ``dtype`` (``var`` real); ``centred=False``: ``(0, E|x|^2)``. ``count``: the
    mask's :func:`complex_mask_counts`, where the caller has them already (one collective fewer)."""
    x = x.astype(complex_statistics_dtype(x, dtype))
    mask = check_mask(mask, x)
    if mask is not None and count is None:
        count = complex_mask_counts(mask, axes, axis_name, axis_index_groups)

    def mean(*values: jnp.ndarray) -> tuple[jnp.ndarray, ...]:
        if mask is not None:
            return _masked_means(values, mask, count, axes, axis_name, axis_index_groups)
        means = tuple(jnp.mean(v, axes, keepdims=True) for v in values)
        if axis_name is None:
            return means
        return lax.pmean(means, axis_name, axis_index_groups=axis_index_groups)

    if not centred:
        (var,) = mean(_abs_square(x))
        return jnp.zeros_like(var), _empty_groups_at_one(var, count)
    if use_fast_variance:
        mu, mean_square = mean(x, _abs_square(x))
        var = jnp.maximum(0.0, mean_square - _abs_square(mu))
    else:
        (mu,) = mean(x)
        (var,) = mean(_abs_square(x - mu))
    return mu, _empty_groups_at_one(var, count)


def complex_mask_counts(
    mask: jnp.ndarray, axes: tuple[int, ...], axis_name=None, axis_index_groups: AxisIndexGroups = None
) -> jnp.ndarray:
    """The number of True elements of ``mask`` per group (keepdims, float32), on every device of
    ``axis_name`` together."""
    count = jnp.sum(mask, axes, keepdims=True, dtype=jnp.float32)
    if axis_name is None:
        return count
    return lax.psum(count, axis_name, axis_index_groups=axis_index_groups)


def _masked_means(
    values: tuple[jnp.ndarray, ...],
    mask: jnp.ndarray,
    count: jnp.ndarray,
    axes: tuple[int, ...],
    axis_name,
    axis_index_groups,
) -> tuple[jnp.ndarray, ...]:
    """The means of ``values`` over the True elements of ``mask`` on every device together (each element
    weighs once; ``count``: :func:`complex_mask_counts`), 0 for a group without elements (no ``0 / 0``)."""
    totals = tuple(jnp.sum(jnp.where(mask, v, 0), axes, keepdims=True) for v in values)
    if axis_name is not None:
        totals = lax.psum(totals, axis_name, axis_index_groups=axis_index_groups)
    return tuple(total / jnp.maximum(count, 1).astype(total.real.dtype) for total in totals)


def _empty_groups_at_one(var: jnp.ndarray, count: jnp.ndarray | None) -> jnp.ndarray:
    """``var`` with 1 where a group keeps no element of the mask (``count`` 0; its mean is 0):
    ``x / sqrt(1 + eps)`` there, as in the real path, neither amplified nor NaN (``None``: no mask)."""
    return var if count is None else jnp.where(count > 0, var, 1)


def complex_normalize(
    x: jnp.ndarray,
    mean: jnp.ndarray,
    var: jnp.ndarray,
    *,
    epsilon: float,
    scale: jnp.ndarray | None = None,
    bias: jnp.ndarray | None = None,
    dtype: jnp.dtype | None = None,
) -> jnp.ndarray:
    """``(x - mean) * (rsqrt(var + epsilon) * scale) + bias`` in the order flax writes it, cast to
    ``dtype`` (default: ``x``'s)."""
    epsilon = check_epsilon(epsilon)
    factor = lax.rsqrt(var + epsilon)
    if scale is not None:
        factor = factor * scale
    y = (x - mean) * factor
    if bias is not None:
        y = y + bias
    return y.astype(x.dtype if dtype is None else dtype)
