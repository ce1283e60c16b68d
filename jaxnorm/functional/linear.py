"""Dense and convolution applications shared by the weight-normalized layers (linen and NNX).

Flax layouts: Dense kernel ``(in, out)``; Conv kernel ``(*window, in // feature_group_count, out)`` on
channels-last inputs. Kept here so that every weight-space layer computes ``y = x * W(v) + b`` with one
implementation, whatever reparametrization ``W`` it uses.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp
from jax import lax

from jaxnorm.functional.checks import check_compute_dtype, check_positive_int

__all__ = ["apply_linear", "canonical_padding", "kernel_shape"]

Padding = str | int | Sequence[int] | Sequence[tuple[int, int]]


def kernel_shape(
    in_features: int, features: int, kernel_size: Sequence[int] | None, feature_group_count: int = 1
) -> tuple[int, ...]:
    """``(in, out)`` for Dense (``kernel_size=None``), ``(*kernel_size, in // groups, out)`` for Conv;
    every size a positive integer (a ``ValueError`` naming it)."""
    check_positive_int(features, "features")
    if kernel_size is not None:
        for size in kernel_size:
            check_positive_int(size, f"kernel_size={tuple(kernel_size)!r}: every size")
    if kernel_size is None:
        return (in_features, features)
    if in_features % feature_group_count or features % feature_group_count:
        raise ValueError(
            f"feature_group_count={feature_group_count} must divide the input ({in_features}) and output "
            f"({features}) channels"
        )
    return (*kernel_size, in_features // feature_group_count, features)


def canonical_padding(padding: Padding, rank: int) -> str | list[tuple[int, int]]:
    """'SAME' / 'VALID', an int, a sequence of ints or a sequence of (low, high) pairs."""
    if isinstance(padding, str):
        if padding.upper() not in ("SAME", "VALID"):
            raise ValueError(f"padding must be 'SAME', 'VALID', an int or pairs, got {padding!r}")
        return padding.upper()
    if isinstance(padding, int):
        return [(padding, padding)] * rank
    pads = list(padding)
    if len(pads) != rank:
        raise ValueError(f"padding {padding!r} must have one entry per spatial axis ({rank})")
    return [(p, p) if isinstance(p, int) else tuple(p) for p in pads]


def _as_tuple(value: int | Sequence[int], rank: int) -> tuple[int, ...]:
    return (value,) * rank if isinstance(value, int) else tuple(value)


def apply_linear(
    x: jnp.ndarray,
    kernel: jnp.ndarray,
    bias: jnp.ndarray | None = None,
    *,
    conv: bool,
    strides: int | Sequence[int] = 1,
    padding: Padding = "SAME",
    input_dilation: int | Sequence[int] = 1,
    kernel_dilation: int | Sequence[int] = 1,
    feature_group_count: int = 1,
    dtype: jnp.dtype | None = None,
) -> jnp.ndarray:
    """``x @ kernel + bias`` (Dense) or the channels-last convolution of ``x`` with ``kernel`` (+ bias).

    Computed in ``dtype`` (default: the promotion of ``x``, ``kernel`` and ``bias``), as flax does.
    """
    dtype = check_compute_dtype(dtype) or jnp.result_type(*[a for a in (x, kernel, bias) if a is not None])
    x, kernel = x.astype(dtype), kernel.astype(dtype)
    if not conv:
        y = lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))
    else:
        rank = kernel.ndim - 2
        spatial = "".join("HWDUVXYZ"[:rank])
        dimension_numbers = (f"N{spatial}C", f"{spatial}IO", f"N{spatial}C")
        y = lax.conv_general_dilated(
            x,
            kernel,
            window_strides=_as_tuple(strides, rank),
            padding=canonical_padding(padding, rank),
            lhs_dilation=_as_tuple(input_dilation, rank),
            rhs_dilation=_as_tuple(kernel_dilation, rank),
            dimension_numbers=dimension_numbers,
            feature_group_count=feature_group_count,
        )
    if bias is not None:
        y = y + bias.astype(dtype)
    return y
