"""Dense and convolution applications shared by the weight-normalized layers (linen and NNX).

Flax layouts: Dense kernel ``(in, out)``; Conv kernel ``(*window, in // feature_group_count, out)`` on
channels-last inputs. Kept here so that every weight-space layer computes ``y = x * W(v) + b`` with one
implementation, whatever reparametrization ``W`` it uses.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxnorm.functional.checks import check_compute_dtype, check_positive_int, is_int

__all__ = [
    "apply_linear",
    "canonical_kernel_size",
    "canonical_padding",
    "canonical_window",
    "kernel_shape",
]

Padding = str | int | Sequence[int] | Sequence[tuple[int, int]]


def kernel_shape(
    in_features: int, features: int, kernel_size: Sequence[int] | None, feature_group_count: int = 1
) -> tuple[int, ...]:
    """``(in, out)`` for Dense (``kernel_size=None``), ``(*kernel_size, in // groups, out)`` for Conv;
    every size a positive integer (a ``ValueError`` naming it)."""
    check_positive_int(features, "features")
    if kernel_size is None:
        return (in_features, features)
    kernel_size = canonical_kernel_size(kernel_size)
    feature_group_count = check_positive_int(feature_group_count, "feature_group_count")
    if in_features % feature_group_count or features % feature_group_count:
        raise ValueError(
            f"feature_group_count={feature_group_count} must divide the input ({in_features}) and output "
            f"({features}) channels"
        )
    return (*kernel_size, in_features // feature_group_count, features)


def canonical_kernel_size(kernel_size: int | Sequence[int]) -> tuple[int, ...]:
    """``kernel_size`` as a tuple of positive ints (an int, Python or NumPy, is one spatial axis)."""
    sizes = (kernel_size,) if is_int(kernel_size) else _sequence(kernel_size, "kernel_size")
    return tuple(check_positive_int(size, f"kernel_size={kernel_size!r}: every size") for size in sizes)


def canonical_window(value: int | Sequence[int], rank: int, name: str) -> tuple[int, ...]:
    """A convolution's ``strides``, ``input_dilation`` or ``kernel_dilation`` (``name``): one positive int
    (Python or NumPy) for every spatial axis, or one per axis (``rank`` of them)."""
    values = (value,) * rank if is_int(value) else _sequence(value, name)
    if len(values) != rank:
        raise ValueError(f"{name}={value!r} must have one entry per spatial axis ({rank})")
    return tuple(check_positive_int(v, f"{name}={value!r}: every entry") for v in values)


def canonical_padding(padding: Padding, rank: int) -> str | list[tuple[int, int]]:
    """'SAME' / 'VALID' / flax's 'CIRCULAR' and 'CAUSAL' (1-D), an int (Python or NumPy), a sequence of ints
    or a sequence of (low, high) pairs."""
    if isinstance(padding, str):
        if padding.upper() not in ("SAME", "VALID", "CIRCULAR", "CAUSAL"):
            raise ValueError(
                f"padding must be 'SAME', 'VALID', 'CIRCULAR', 'CAUSAL', an int or pairs, got {padding!r}"
            )
        if padding.upper() == "CAUSAL" and rank != 1:
            raise ValueError(f"padding='CAUSAL' is for 1-D convolutions (as flax's), got {rank} spatial axes")
        return padding.upper()
    if is_int(padding):
        return [(int(padding), int(padding))] * rank
    pads = _sequence(padding, "padding")
    if len(pads) != rank:
        raise ValueError(f"padding {padding!r} must have one entry per spatial axis ({rank})")
    return [(int(p), int(p)) if is_int(p) else tuple(int(e) for e in p) for p in pads]


def _sequence(value: object, name: str) -> tuple:
    if isinstance(value, str) or not isinstance(value, Sequence | np.ndarray):
        raise TypeError(f"{name} must be an int or a sequence of ints, got {value!r}")
    return tuple(value)


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
    """``x @ kernel + bias`` (Dense) or the channels-last convolution of ``x`` with ``kernel`` (+ bias);
    like flax's ``Conv``, ``x`` may have no batch axis or several (flattened into one for the convolution).

    Computed in ``dtype`` (default: the promotion of ``x``, ``kernel`` and ``bias``), as flax does.
    """
    dtype = check_compute_dtype(dtype)
    if dtype is None:
        dtype = jnp.result_type(*[a for a in (x, kernel, bias) if a is not None])
    x, kernel = x.astype(dtype), kernel.astype(dtype)
    if not conv:
        y = lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))
    else:
        rank = kernel.ndim - 2
        if x.ndim < rank + 1:
            raise ValueError(
                f"x must be ([*batch], *spatial, features) with {rank} spatial axes for a kernel of shape "
                f"{kernel.shape} (kernel_size={kernel.shape[:rank]}), got x.shape={x.shape}"
            )
        batch_shape = x.shape[: x.ndim - rank - 1]  # none or several, flattened into one (as flax's Conv)
        spatial = "".join("HWDUVXYZ"[:rank])
        dimension_numbers = (f"N{spatial}C", f"{spatial}IO", f"N{spatial}C")
        dilation = canonical_window(kernel_dilation, rank, "kernel_dilation")
        flat, padding = _pre_padded(
            x.reshape(-1, *x.shape[x.ndim - rank - 1 :]), canonical_padding(padding, rank), kernel, dilation
        )
        y = lax.conv_general_dilated(
            flat,
            kernel,
            window_strides=canonical_window(strides, rank, "strides"),
            padding=padding,
            lhs_dilation=canonical_window(input_dilation, rank, "input_dilation"),
            rhs_dilation=dilation,
            dimension_numbers=dimension_numbers,
            feature_group_count=check_positive_int(feature_group_count, "feature_group_count"),
        )
        y = y.reshape(*batch_shape, *y.shape[1:])
    if bias is not None:
        y = y + bias.astype(dtype)
    return y


def _pre_padded(
    x: jnp.ndarray, padding: str | list[tuple[int, int]], kernel: jnp.ndarray, dilation: tuple[int, ...]
) -> tuple[jnp.ndarray, str | list[tuple[int, int]]]:
    """flax's two paddings that ``lax.conv_general_dilated`` lacks, applied to ``x`` (``N...C``) before a
    'VALID' convolution: 'CIRCULAR' wraps ``((k - 1) // 2, k // 2)`` around each spatial axis of a
    dilated window of ``k``; 'CAUSAL' (1-D) pads ``dilation * (size - 1)`` zeros on the left only.
    Other paddings pass through to the convolution."""
    if padding not in ("CIRCULAR", "CAUSAL"):
        return x, padding
    sizes = kernel.shape[:-2]
    if padding == "CAUSAL":
        return jnp.pad(x, [(0, 0), (dilation[0] * (sizes[0] - 1), 0), (0, 0)]), "VALID"
    dilated = [(k - 1) * d + 1 for k, d in zip(sizes, dilation, strict=True)]
    pads = [(0, 0), *(((k - 1) // 2, k // 2) for k in dilated), (0, 0)]
    return jnp.pad(x, pads, mode="wrap"), "VALID"
