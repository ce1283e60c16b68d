"""Checks of the optim transforms' scalar arguments: at construction, with an error naming the argument."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "check_bool",
    "check_in_range",
    "check_learning_rate",
    "check_non_negative",
    "check_positive",
    "check_positive_tree",
    "check_static",
    "check_steps",
    "is_scalar_number",
]


def check_static(fn_name: str, **arguments: Any) -> None:
    """``TypeError`` where an argument that fixes a transformation's structure (a loop length, a norm's
    exponent, a flag) arrives as a JAX array, as ``optax.inject_hyperparams`` passes every numeric
    argument, defaults included: the error names them and the ``static_args`` that keeps them Python
    values (it said "p must be a static positive number" of a ``p`` the user never passed)."""
    injected = [name for name, value in arguments.items() if isinstance(value, jax.Array)]
    if injected:
        raise TypeError(
            f"{fn_name}: {', '.join(injected)} fix the transformation's structure and must be Python "
            "values, got JAX arrays: optax.inject_hyperparams injects every numeric argument, defaults "
            f"included; pass static_args={tuple(arguments)!r}"
        )


def is_scalar_number(value: Any) -> bool:
    """A Python, NumPy or 0-d JAX number (not a bool or a string)."""
    if isinstance(value, bool | np.bool_ | str) or not hasattr(value, "__float__"):
        return False
    return jnp.ndim(value) == 0 and jnp.result_type(value) != jnp.bool_


def check_in_range(
    value: Any, name: str, fn_name: str, *, low: float, high: float, closed_high: bool
) -> float:
    """``value`` as a float in ``[low, high]`` (or ``[low, high)``), else a ValueError naming ``name``.

    A traced value (``optax.inject_hyperparams`` builds the transform again inside each update, with the
    injected numbers as arrays) is returned as it is: it was checked concretely when the state was built
    outside ``jit`` (under ``jax.jit(tx.init)`` the numbers are traced there too, and go unchecked).
    """
    if isinstance(value, jax.core.Tracer):
        return value
    v = float(value) if is_scalar_number(value) else math.nan
    inside = low <= v <= high if closed_high else low <= v < high
    if not inside:
        bracket = "]" if closed_high else ")"
        raise ValueError(f"{fn_name}: {name} must be a number in [{low}, {high}{bracket}, got {value!r}")
    return v


def check_non_negative(value: Any, name: str, fn_name: str) -> float:
    """A finite number ``>= 0``."""
    return check_in_range(value, name, fn_name, low=0.0, high=math.inf, closed_high=False)


def check_positive(value: Any, name: str, fn_name: str) -> float:
    """A finite number ``> 0``."""
    v = check_non_negative(value, name, fn_name)
    if isinstance(v, jax.core.Tracer):
        return v
    if v <= 0:
        raise ValueError(f"{fn_name}: {name} must be a positive number, got {value!r}")
    return v


def check_learning_rate(learning_rate: Any, fn_name: str) -> None:
    """A number ``>= 0`` or a schedule (a callable of the step count)."""
    if not callable(learning_rate):
        check_non_negative(learning_rate, "learning_rate", fn_name)


def check_bool(value: Any, name: str, fn_name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{fn_name}: {name} must be a bool, got {value!r}")
    return value


def check_positive_tree(rho: Any, fn_name: str, name: str) -> None:
    """Every concrete leaf of ``rho`` a positive finite number (traced leaves are left to the caller)."""
    for leaf in jax.tree.leaves(rho):
        if isinstance(leaf, jax.core.Tracer):
            continue
        value = np.asarray(leaf)
        if not jnp.issubdtype(value.dtype, jnp.number) or value.dtype == np.bool_:  # bfloat16 too
            raise TypeError(f"{fn_name}: {name} must be positive numbers, got {leaf!r}")
        if np.any(~(value > 0)) or np.any(~np.isfinite(value)):
            raise ValueError(f"{fn_name}: {name} must be positive finite norms, got {leaf!r}")


# The step counter is int32 (optax.safe_increment saturates there): a larger tau never fires.
_MAX_STEPS = int(np.iinfo(np.int32).max)


def check_steps(value: Any, name: str, fn_name: str) -> None:
    """``value`` must be an integer number of steps in ``[1, 2**31 - 1]``: a Python or NumPy int or
    a 0-d integer array (a traced value, from ``optax.inject_hyperparams``, is checked there)."""
    if isinstance(value, jax.core.Tracer):
        return
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer | np.ndarray | jax.Array):
        kind = "non-integer" if isinstance(value, float | np.floating) else "not an integer"
        raise (ValueError if isinstance(value, float | np.floating) else TypeError)(
            f"{fn_name}: {name} must be a positive integer number of steps, got {value!r} ({kind})"
        )
    array = np.asarray(value)
    if array.ndim != 0 or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{fn_name}: {name} must be a positive integer number of steps, got {value!r}")
    if not 1 <= int(array) <= _MAX_STEPS:
        raise ValueError(
            f"{fn_name}: {name} must be an integer in [1, 2**31 - 1] (the int32 step counter), got {value!r}"
        )
