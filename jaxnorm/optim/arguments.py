"""Checks of the optim transforms' scalar arguments: at construction, with an error naming the argument."""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp

__all__ = ["check_bool", "check_in_range", "check_non_negative", "check_positive", "is_scalar_number"]


def is_scalar_number(value: Any) -> bool:
    """A Python, NumPy or 0-d JAX number (not a bool or a string)."""
    return not isinstance(value, bool | str) and hasattr(value, "__float__") and jnp.ndim(value) == 0


def check_in_range(
    value: Any, name: str, fn_name: str, *, low: float, high: float, closed_high: bool
) -> float:
    """``value`` as a float in ``[low, high]`` (or ``[low, high)``), else a ValueError naming ``name``."""
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
    if v <= 0:
        raise ValueError(f"{fn_name}: {name} must be a positive number, got {value!r}")
    return v


def check_bool(value: Any, name: str, fn_name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{fn_name}: {name} must be a bool, got {value!r}")
    return value
