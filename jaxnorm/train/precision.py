"""Mixed precision: compute-dtype casting and dynamic loss scaling for float16.

bfloat16 has float32's exponent range and needs no loss scaling; float16 does. The dynamic scheme is
that of Micikevicius et al. (2018), "Mixed Precision Training", Sec. 3.2: multiply the loss by S before
differentiating, divide the gradients by S; if any gradient is non-finite, skip the update and halve S;
after ``period`` consecutive finite steps, double S.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

PyTree = Any

PRECISIONS = ("float32", "bfloat16", "float16")


class LossScale(NamedTuple):
    """Dynamic loss-scale state: the scale and the count of finite steps since it last changed."""

    scale: jax.Array
    good_steps: jax.Array


def no_loss_scale() -> LossScale:
    """A loss scale of 1 (used for float32 and bfloat16)."""
    return LossScale(jnp.ones((), jnp.float32), jnp.zeros((), jnp.int32))


def initial_loss_scale(precision: str, init_scale: float = 2.0**15) -> LossScale:
    """The starting loss scale: ``init_scale`` for float16, 1 otherwise."""
    compute_dtype(precision)  # validates
    if precision == "float16":
        return LossScale(jnp.asarray(init_scale, jnp.float32), jnp.zeros((), jnp.int32))
    return no_loss_scale()


def compute_dtype(precision: str) -> jnp.dtype:
    """The activation / matmul dtype for a precision name."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return jnp.dtype(precision)


def cast_floating(tree: PyTree, dtype: jnp.dtype) -> PyTree:
    """Casts every floating leaf of ``tree`` to ``dtype`` (integer leaves unchanged)."""
    return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def all_finite(tree: PyTree) -> jax.Array:
    """Scalar bool: every element of every leaf is finite."""
    leaves = jax.tree.leaves(tree)
    if not leaves:
        return jnp.asarray(True)
    return jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]).all()


def adjust_loss_scale(
    state: LossScale, grads_finite: jax.Array, *, period: int = 2000, factor: float = 2.0
) -> LossScale:
    """Next loss scale: divide by ``factor`` on overflow, multiply after ``period`` finite steps.

    The scale never drops below 1.
    """
    grow = jnp.logical_and(grads_finite, state.good_steps + 1 >= period)
    scale = jnp.where(
        grads_finite,
        jnp.where(grow, state.scale * factor, state.scale),
        jnp.maximum(state.scale / factor, 1.0),
    )
    good = jnp.where(jnp.logical_and(grads_finite, ~grow), state.good_steps + 1, 0)
    return LossScale(scale.astype(jnp.float32), good.astype(jnp.int32))
