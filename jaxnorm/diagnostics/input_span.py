"""Input-span projection (ISP) of a layer's weights (Liu et al., Sec. 4.2, Fig. 4-5, Supp. A.4).

With ``Sigma = U Lambda U^T`` the eigendecomposition of the covariance of a layer's inputs (the
rows ``h`` that multiply the kernel: features for Dense, patches for Conv), SGD only changes the
components of ``V_j = U^T W_j`` along eigenvectors with nonzero eigenvalue: in one step at most
``B - 1`` of them (Liu et al., Sec. 4.2). What lies outside the input span (initial noise) is never
removed by SGD; WD and WRS shrink it. ``U`` is orthogonal, so ``||V_j|| = ||W_j||`` (Supp. A.4).
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxnorm.functional.linear import canonical_window

__all__ = ["InputSpanProjection", "conv_patches", "input_span_projection"]


class InputSpanProjection(NamedTuple):
    """Result of :func:`input_span_projection`.

    Attributes:
      projected: ``V = U^T W``, shape ``(fan_in, out)``; row ``i`` is the component along the
        ``i``-th eigenvector, eigenvalues in descending order.
      eigenvalues: ``(fan_in,)`` eigenvalues of the input covariance, descending.
      eigenvectors: ``U``, shape ``(fan_in, fan_in)``, column ``i`` for eigenvalue ``i``.
      rank: number of eigenvalues above ``rtol * max(eigenvalues)``: the dimension of the span.
      in_span_fraction: ``(out,)`` share of each unit's squared norm inside the span,
        ``sum_{i < rank} V[i, j]^2 / ||W_j||^2`` (0 for a zero unit).
    """

    projected: jax.Array
    eigenvalues: jax.Array
    eigenvectors: jax.Array
    rank: jax.Array
    in_span_fraction: jax.Array


def conv_patches(
    x: jax.Array,
    window: tuple[int, int],
    *,
    strides: tuple[int, int] = (1, 1),
    padding: str = "SAME",
) -> jax.Array:
    """The rows a 2-D convolution multiplies with its flattened HWIO kernel.

    For ``x`` of shape ``(N, H, W, C)`` returns ``(N * H' * W', kh * kw * C)`` with columns in the
    order of ``kernel.reshape(-1, out)``, so ``conv_patches(x, (kh, kw)) @ kernel.reshape(-1, out)``
    equals ``flax.linen.Conv`` without bias (same ``strides`` and ``padding``). ``window`` and
    ``strides`` are pairs of positive ints, or one int ``n`` for ``(n, n)`` (as ``flax.linen.Conv``'s
    ``strides``).
    """
    if not isinstance(x, np.ndarray | jax.Array):
        raise ValueError(f"conv_patches: x must be a NumPy or JAX array, got {type(x)}")
    if x.ndim != 4:
        raise ValueError(f"conv_patches: x must be (N, H, W, C), got shape {x.shape}")
    window = _int_pair(window, "window")
    strides = _int_pair(strides, "strides")
    patches = jax.lax.conv_general_dilated_patches(
        x,
        filter_shape=tuple(window),
        window_strides=tuple(strides),
        padding=padding,
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
    )  # features ordered (C, kh, kw)
    kh, kw = window
    channels = x.shape[-1]
    patches = patches.reshape(*patches.shape[:-1], channels, kh, kw)
    patches = jnp.moveaxis(patches, -3, -1)  # (..., kh, kw, C): HWIO order
    return patches.reshape(-1, kh * kw * channels)


def _int_pair(value: object, name: str) -> tuple[int, int]:
    """``(n, n)`` for an int ``n``, else a pair of ints (:func:`jaxnorm.functional.linear.canonical_window`,
    as a 2-D convolution reads them); all positive, or a ``ValueError`` naming ``name``."""
    try:
        return canonical_window(value, 2, name)
    except (ValueError, TypeError):
        raise ValueError(
            f"conv_patches: {name} must be a positive int or a pair of positive ints, got {value!r}"
        ) from None


def input_span_projection(kernel: jax.Array, inputs: jax.Array, *, rtol: float = 1e-6) -> InputSpanProjection:
    """Project each unit's weights onto the eigenvectors of the input covariance (Liu et al., Sec. 4.2).

    ``Sigma = (H - mean)^T (H - mean) / n`` over the ``n`` rows of ``inputs``; ``V = U^T W`` with
    ``W = kernel.reshape(fan_in, out)``. Computed in at least float32; the eigendecomposition is
    ``jnp.linalg.eigh``; ``H`` is centred twice, so that the rounding error of the first mean leaves no
    spurious direction for inputs with a large mean. ``H`` and each unit ``W_j`` are first multiplied
    by a power of two near their largest magnitude (exact), so rank and in-span fractions do not
    depend on the units of either; the eigenvalues are returned in the units of ``inputs`` squared
    (``inf`` or ``0`` where those leave the float range).

    Args:
      kernel: ``(in, out)`` Dense or ``(kh, kw, in, out)`` Conv kernel, a NumPy or JAX array.
      inputs: ``(n, fan_in)`` rows, ``n >= 1`` (features, or :func:`conv_patches` for a
        convolution) with ``fan_in = prod(kernel.shape[:-1])``, a NumPy or JAX array.
      rtol: eigenvalues above ``rtol * max`` count as inside the span; a finite number >= 0.

    Returns:
      :class:`InputSpanProjection`. A NaN or infinity in ``inputs`` makes every ``in_span_fraction``
      NaN (and ``rank`` meaningless); one in a unit of ``kernel`` makes that unit's fraction NaN.

    Raises:
      ValueError: ``kernel``, ``inputs`` or ``rtol`` malformed (the message names the argument).
    """
    for name, value in (("kernel", kernel), ("inputs", inputs)):
        if not isinstance(value, np.ndarray | jax.Array):
            raise ValueError(f"input_span_projection: {name} must be a NumPy or JAX array, got {type(value)}")
        kind = jnp.result_type(value)
        if not (jnp.issubdtype(kind, jnp.floating) or jnp.issubdtype(kind, jnp.integer)):
            raise ValueError(f"input_span_projection: {name} must hold real numbers, got dtype {kind}")
    if not isinstance(rtol, jax.core.Tracer):
        if isinstance(rtol, bool | np.bool_) or not isinstance(rtol, numbers.Real | np.ndarray | jax.Array):
            raise ValueError(f"input_span_projection: rtol must be a finite number >= 0, got {rtol!r}")
        value = np.asarray(rtol)
        if value.shape != () or not np.issubdtype(value.dtype, np.number) or np.iscomplexobj(value) or not (
            np.isfinite(value) and value >= 0
        ):
            raise ValueError(f"input_span_projection: rtol must be a finite number >= 0, got {rtol!r}")
    if kernel.ndim < 2:
        raise ValueError(f"input_span_projection: kernel must have rank >= 2, got {kernel.shape}")
    fan_in = math.prod(kernel.shape[:-1])
    if inputs.ndim != 2 or inputs.shape[1] != fan_in:
        raise ValueError(
            f"input_span_projection: inputs must be (n, {fan_in}) for a kernel of shape "
            f"{kernel.shape} (use conv_patches for convolutions), got {inputs.shape}"
        )
    if inputs.shape[0] < 1:
        raise ValueError(f"input_span_projection: inputs must have at least one row, got {inputs.shape}")
    dtype = jnp.promote_types(jnp.result_type(kernel, inputs), jnp.float32)
    h = jnp.asarray(inputs).astype(dtype)
    inputs_finite = jnp.all(jnp.isfinite(h))
    # h 2^-e with 2^e above twice max |h|: centering cannot overflow, the covariance neither
    # overflows nor underflows; the eigenvalues are scaled back by 2^(2e) at the end.
    exponent = _exponent(jnp.max(jnp.abs(h)), dtype, extra=1)
    h = h * jnp.ldexp(jnp.ones((), dtype), -exponent)
    centered = h - jnp.mean(h, axis=0)
    centered = centered - jnp.mean(centered, axis=0)  # second pass: the rounding error of the mean
    covariance = centered.T @ centered / h.shape[0]
    eigenvalues, eigenvectors = jnp.linalg.eigh(covariance)  # ascending
    eigenvalues, eigenvectors = eigenvalues[::-1], eigenvectors[:, ::-1]
    w = jnp.asarray(kernel).astype(dtype).reshape(fan_in, -1)
    projected = eigenvectors.T @ w
    rank = jnp.sum(eigenvalues > rtol * jnp.maximum(eigenvalues[0], 0.0))
    # the fraction of each unit from w_j 2^-e_j, 2^e_j just above max |w_j|
    unit_exponent = _exponent(jnp.max(jnp.abs(w), axis=0), dtype, extra=0)
    w_unit = w * jnp.ldexp(jnp.ones((), dtype), -unit_exponent)
    projected_unit = eigenvectors.T @ w_unit
    inside = jnp.arange(fan_in)[:, None] < rank
    in_span = jnp.sum(jnp.where(inside, jnp.square(projected_unit), 0.0), axis=0)
    total = jnp.sum(jnp.square(w_unit), axis=0)
    fraction = jnp.where(total > 0, in_span / jnp.where(total > 0, total, 1.0), 0.0)
    valid = inputs_finite & jnp.all(jnp.isfinite(w), axis=0)
    fraction = jnp.where(valid, fraction, jnp.nan)
    eigenvalues = jnp.where(inputs_finite, jnp.ldexp(eigenvalues, 2 * exponent), jnp.nan)
    return InputSpanProjection(projected, eigenvalues, eigenvectors, rank, fraction)


def _exponent(largest: jax.Array, dtype, *, extra: int) -> jax.Array:
    """``e`` with ``2^(e - extra)`` just above ``largest``, clamped so that ``2^-e`` is a normal number
    (0 for a non-finite ``largest``)."""
    bound = -jnp.finfo(dtype).minexp - 1
    exponent = jnp.clip(jnp.frexp(largest)[1] + extra, -bound, bound)
    return jnp.where(jnp.isfinite(largest), exponent, 0)
