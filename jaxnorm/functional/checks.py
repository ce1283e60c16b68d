"""The argument checks of the functional core and of the Flax modules over it (``jaxnorm.nn``,
``jaxnorm.nnx``) and the array data pipeline: one wording for every error, naming the argument and what
is expected, raised before any computation."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

PNorm = Literal[1, 2, "inf"]


def is_int(value: object) -> bool:
    """A Python or NumPy integer, not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool | np.bool_)


def is_real(value: object) -> bool:
    """A Python or NumPy real number, not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_)


def canonical_p(p: object, name: str = "p") -> PNorm:
    """Return ``1``, ``2`` or ``"inf"``; accepts ``float("inf")``, ``jnp.inf``, ``"inf"`` and NumPy
    scalars (``np.int64(2)``, e.g. from a config array)."""
    if isinstance(p, str):
        if p.lower() in ("inf", "infinity"):
            return "inf"
    elif is_real(p):
        if p == 1:
            return 1
        if p == 2:
            return 2
        if math.isinf(p) and p > 0:
            return "inf"
    raise ValueError(f"{name} must be 1, 2 or 'inf' (float('inf') also accepted), got {p!r}")


def check_floating(x: jnp.ndarray, name: str = "x", allow_complex: bool = False) -> None:
    """Raise ``TypeError`` unless ``x`` is an array (or scalar) with a floating dtype (or, with
    ``allow_complex``, a complex one: the layers that take complex input as flax's do)."""
    try:
        if x is None:
            raise TypeError
        dtype = jnp.result_type(x)
    except TypeError:  # a list, None, a string: no dtype at all
        raise TypeError(f"{name} must be an array with a floating dtype, got {type(x).__name__}") from None
    if allow_complex and jnp.issubdtype(dtype, jnp.complexfloating):
        return
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(
            f"{name} must have a floating dtype (float32, bfloat16, float16, float64), "
            f"got {jnp.result_type(x)}; cast it first, e.g. {name}.astype(jnp.float32)"
        )


def canonical_axes(axis: int | Sequence[int], ndim: int, name: str = "axis") -> tuple[int, ...]:
    """Normalise an int or sequence of ints (Python or NumPy integers) to sorted non-negative axes,
    checking the range."""
    if isinstance(axis, numbers.Integral):
        axes = (axis,)
    elif isinstance(axis, Sequence) and not isinstance(axis, str):
        axes = tuple(axis)
    else:
        raise TypeError(f"{name} must be an int or a tuple of ints, got {axis!r}")
    out = []
    for a in axes:
        if not is_int(a):
            raise TypeError(f"{name} must be an int or a tuple of ints, got {axis!r}")
        a = int(a)
        if not -ndim <= a < ndim:
            raise ValueError(f"{name}={axis!r} is out of range for an input of rank {ndim}")
        out.append(a % ndim)
    if len(set(out)) != len(out):
        raise ValueError(f"{name}={axis!r} names the same axis twice")
    return tuple(sorted(out))


def check_positive_int(value: object, name: str) -> int:
    """A positive Python or NumPy integer (not a bool), returned as an int."""
    if not is_int(value):
        raise TypeError(f"{name} must be a positive int, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def check_bool(value: object, name: str) -> bool:
    """A Python or NumPy bool (or a concrete 0-d boolean array, as flax accepts), returned as a bool."""
    if isinstance(value, np.ndarray | jax.Array) and value.dtype == np.bool_ and value.ndim == 0:
        value = bool(value)  # a traced one raises JAX's own error here, as in flax's `if`
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_param_dtype(value: object, name: str = "param_dtype") -> jnp.dtype:
    """A floating (or complex) dtype for parameters: an integer ``scale`` or ``bias`` would be rounded."""
    try:
        dtype = jnp.dtype(value)
    except TypeError:
        raise TypeError(f"{name} must be a floating dtype, got {value!r}") from None
    if not jnp.issubdtype(dtype, jnp.inexact):
        raise TypeError(f"{name} must be a floating dtype (parameters are trained), got {dtype.name}")
    return dtype


def check_compute_dtype(value: object, name: str = "dtype") -> jnp.dtype | None:
    """``None`` (the promotion of the input and the parameters), or a floating (or complex) dtype to
    compute in: an integer one would truncate the normalized output to integers (flax raises too)."""
    if value is None:
        return None
    try:
        dtype = jnp.dtype(value)
    except TypeError:
        raise TypeError(f"{name} must be a floating dtype or None, got {value!r}") from None
    if not jnp.issubdtype(dtype, jnp.inexact):
        raise TypeError(
            f"{name} must be a floating dtype (or None for the input's dtype), got {dtype.name}: "
            "an integer dtype would truncate the output"
        )
    return dtype


def check_momentum(value: object, name: str = "momentum") -> float:
    """A real number in [0, 1]."""
    if not is_real(value):
        raise TypeError(f"{name} must be a real number in [0, 1], got {value!r}")
    if not 0 <= value <= 1:
        raise ValueError(f"{name} must be in [0, 1] (the weight of the old running average), got {value!r}")
    return float(value)


def check_axis_name(axis_name: object, name: str = "axis_name") -> None:
    """``axis_name`` (None, or a name or tuple of names) must be bound by an enclosing pmap / shard_map /
    vmap."""
    if axis_name is None:
        return
    try:
        jax.lax.axis_size(axis_name)
    except NameError as error:
        raise ValueError(
            f"{name}={axis_name!r} is not bound by an enclosing jax.pmap, shard_map or vmap(axis_name=...) "
            f"({error}); pass axis_name=None outside a mapped computation"
        ) from None


def check_broadcasts(value: object, shape: tuple[int, ...], name: str, target: str = "x") -> None:
    """``value`` (None or an array) must broadcast to ``shape`` without changing it."""
    if value is None:
        return
    try:
        out = jnp.broadcast_shapes(jnp.shape(value), shape)
    except ValueError:
        out = None
    if out != tuple(shape):
        raise ValueError(
            f"{name} of shape {jnp.shape(value)} does not broadcast to {target}.shape {tuple(shape)}"
        )


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
        group_size = check_positive_int(group_size, "group_size")
        if channels % group_size:
            raise ValueError(f"group_size={group_size} must divide the number of channels {channels}")
        return channels // group_size
    num_groups = check_positive_int(num_groups, "num_groups")
    if channels % num_groups:
        raise ValueError(f"num_groups={num_groups} must divide the number of channels {channels}")
    return num_groups


def check_epsilon(value: object, name: str = "epsilon") -> float:
    """A finite, non-negative real number (Python or NumPy scalar); returned as a float."""
    if not is_real(value):
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


def check_per_unit(value: jnp.ndarray | float, w: jnp.ndarray, name: str) -> None:
    """``value`` must be a scalar or one value per output unit, ``(out,)``."""
    if jnp.shape(value) not in ((), (1,), (w.shape[-1],)):
        raise ValueError(
            f"{name} must be a scalar or have one value per output unit, shape ({w.shape[-1]},) for a "
            f"kernel of shape {w.shape}, got shape {jnp.shape(value)}"
        )
