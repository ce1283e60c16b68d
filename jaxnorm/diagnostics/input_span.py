"""Input-span projection (ISP) of a layer's weights (Liu et al., Sec. 4.2, Fig. 4-5, Supp. A.4).

With ``Sigma = U Lambda U^T`` the eigendecomposition of the covariance of a layer's inputs (the
rows ``h`` that multiply the kernel: features for Dense, patches for Conv), SGD only changes the
components of ``V_j = U^T W_j`` along eigenvectors with nonzero eigenvalue: in one step at most
``B - 1`` of them (Liu et al., Sec. 4.2). What lies outside the input span (initial noise) is never
removed by SGD; WD and WRS shrink it. ``U`` is orthogonal, so ``||V_j|| = ||W_j||`` (Supp. A.4).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

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
    equals ``flax.linen.Conv`` without bias (same ``strides`` and ``padding``).
    """
    if x.ndim != 4:
        raise ValueError(f"conv_patches: x must be (N, H, W, C), got shape {x.shape}")
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


def input_span_projection(kernel: jax.Array, inputs: jax.Array, *, rtol: float = 1e-6) -> InputSpanProjection:
    """Project each unit's weights onto the eigenvectors of the input covariance (Liu et al., Sec. 4.2).

    ``Sigma = (H - mean)^T (H - mean) / n`` over the ``n`` rows of ``inputs``; ``V = U^T W`` with
    ``W = kernel.reshape(fan_in, out)``. Computed in at least float32; the eigendecomposition is
    ``jnp.linalg.eigh``.

    Args:
      kernel: ``(in, out)`` Dense or ``(kh, kw, in, out)`` Conv kernel.
      inputs: ``(n, fan_in)`` rows (features, or :func:`conv_patches` for a convolution) with
        ``fan_in = prod(kernel.shape[:-1])``.
      rtol: eigenvalues above ``rtol * max`` count as inside the span.
    """
    if kernel.ndim < 2:
        raise ValueError(f"input_span_projection: kernel must have rank >= 2, got {kernel.shape}")
    fan_in = math.prod(kernel.shape[:-1])
    if inputs.ndim != 2 or inputs.shape[1] != fan_in:
        raise ValueError(
            f"input_span_projection: inputs must be (n, {fan_in}) for a kernel of shape "
            f"{kernel.shape} (use conv_patches for convolutions), got {inputs.shape}"
        )
    dtype = jnp.promote_types(jnp.result_type(kernel, inputs), jnp.float32)
    h = inputs.astype(dtype)
    centered = h - jnp.mean(h, axis=0)
    covariance = centered.T @ centered / h.shape[0]
    eigenvalues, eigenvectors = jnp.linalg.eigh(covariance)  # ascending
    eigenvalues, eigenvectors = eigenvalues[::-1], eigenvectors[:, ::-1]
    w = kernel.astype(dtype).reshape(fan_in, -1)
    projected = eigenvectors.T @ w
    rank = jnp.sum(eigenvalues > rtol * jnp.maximum(eigenvalues[0], 0.0))
    inside = jnp.arange(fan_in)[:, None] < rank
    in_span = jnp.sum(jnp.where(inside, jnp.square(projected), 0.0), axis=0)
    total = jnp.sum(jnp.square(w), axis=0)
    fraction = jnp.where(total > 0, in_span / jnp.where(total > 0, total, 1.0), 0.0)
    return InputSpanProjection(projected, eigenvalues, eigenvectors, rank, fraction)
