"""Argument checks shared by the functional core: one wording for every error."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

PNorm = Literal[1, 2, "inf"]


def canonical_p(p: object, name: str = "p") -> PNorm:
    """Return ``1``, ``2`` or ``"inf"``; accepts ``float("inf")``, ``jnp.inf``, ``"inf"`` and NumPy
    scalars (``np.int64(2)``, e.g. from a config array)."""
    if isinstance(p, str):
        if p.lower() in ("inf", "infinity"):
            return "inf"
    elif isinstance(p, numbers.Real) and not isinstance(p, bool | np.bool_):
        if p == 1:
            return 1
        if p == 2:
            return 2
        if math.isinf(p) and p > 0:
            return "inf"
    raise ValueError(f"{name} must be 1, 2 or 'inf' (float('inf') also accepted), got {p!r}")


def check_floating(x: jnp.ndarray, name: str = "x") -> None:
    """Raise ``TypeError`` unless ``x`` has a floating dtype."""
    if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
        raise TypeError(
            f"{name} must have a floating dtype (float32, bfloat16, float16, float64), "
            f"got {jnp.result_type(x)}; cast it first, e.g. {name}.astype(jnp.float32)"
        )


def canonical_axes(axis: int | Sequence[int], ndim: int, name: str = "axis") -> tuple[int, ...]:
    """Normalise an int or sequence of ints to sorted non-negative axes, checking the range."""
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    out = []
    for a in axes:
        if not isinstance(a, int) or isinstance(a, bool):
            raise TypeError(f"{name} must be an int or a tuple of ints, got {axis!r}")
        if not -ndim <= a < ndim:
            raise ValueError(f"{name}={axis!r} is out of range for an input of rank {ndim}")
        out.append(a % ndim)
    if len(set(out)) != len(out):
        raise ValueError(f"{name}={axis!r} names the same axis twice")
    return tuple(sorted(out))


def check_positive_int(value: object, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def check_mask(mask: object, x: jnp.ndarray, name: str = "mask") -> jnp.ndarray | None:
    """Broadcast a boolean mask to ``x.shape`` (True = the element enters the statistics)."""
    if mask is None:
        return None
    mask = jnp.asarray(mask)
    if mask.dtype != jnp.bool_:
        raise TypeError(f"{name} must be a boolean array (True = use the element), got dtype {mask.dtype}")
    try:
        return jnp.broadcast_to(mask, x.shape)
    except ValueError:
        raise ValueError(f"{name} of shape {mask.shape} does not broadcast to x.shape {x.shape}") from None


def num_groups_of(channels: int, num_groups: int | None, group_size: int | None) -> int:
    """The group count from flax's ``num_groups`` / ``group_size`` pair, with flax's checks."""
    if (num_groups is None) == (group_size is None):
        raise ValueError(
            "exactly one of num_groups and group_size must be given (to use group_size, pass "
            f"num_groups=None); got num_groups={num_groups!r}, group_size={group_size!r}"
        )
    if group_size is not None:
        check_positive_int(group_size, "group_size")
        if channels % group_size:
            raise ValueError(f"group_size={group_size} must divide the number of channels {channels}")
        return channels // group_size
    check_positive_int(num_groups, "num_groups")
    if channels % num_groups:
        raise ValueError(f"num_groups={num_groups} must divide the number of channels {channels}")
    return num_groups


def check_epsilon(value: object, name: str = "epsilon") -> float:
    """A finite, non-negative real number (Python or NumPy scalar); returned as a float."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a non-negative real number, got {value!r}")
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite real number >= 0, got {value!r}")
    return float(value)


def check_positive_values(value: object, name: str) -> None:
    """Every element of ``value`` finite and > 0 (checked only when ``value`` is concrete, not traced)."""
    if isinstance(value, jax.core.Tracer):
        return
    if isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be a positive real number or array, got {value!r}")
    try:
        arr = np.asarray(value)
    except Exception:
        raise TypeError(f"{name} must be a positive real number or array, got {value!r}") from None
    real = np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)
    if arr.dtype == np.bool_ or not (real or arr.dtype.name == "bfloat16"):
        raise TypeError(f"{name} must be a positive real number or array, got {value!r}")
    arr = arr.astype(np.float64)
    if not np.all(np.isfinite(arr) & (arr > 0)):
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
