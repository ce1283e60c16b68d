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
    """Dynamic loss-scale state.

    Attributes:
      scale: the factor the loss is multiplied by before differentiating.
      good_steps: finite steps since the scale last changed.
      skipped: steps skipped for overflow so far (int32). The optimizer's own update count, which its
        learning-rate schedule reads, is the loop's step less ``skipped``. ``None`` in a state built
        without it (a checkpoint written before the count existed): the skips are then not counted.
    """

    scale: jax.Array
    good_steps: jax.Array
    skipped: jax.Array | None = None


def no_loss_scale() -> LossScale:
    """A loss scale of 1 (used for float32 and bfloat16)."""
    return LossScale(jnp.ones((), jnp.float32), jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))


def initial_loss_scale(precision: str, init_scale: float = 2.0**15) -> LossScale:
    """The starting loss scale: ``init_scale`` for float16, 1 otherwise."""
    compute_dtype(precision)  # validates
    if precision == "float16":
        return no_loss_scale()._replace(scale=jnp.asarray(init_scale, jnp.float32))
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

    The scale never drops below 1; ``skipped`` counts the overflows (the skipped updates).
    """
    grow = jnp.logical_and(grads_finite, state.good_steps + 1 >= period)
    scale = jnp.where(
        grads_finite,
        jnp.where(grow, state.scale * factor, state.scale),
        jnp.maximum(state.scale / factor, 1.0),
    )
    good = jnp.where(jnp.logical_and(grads_finite, ~grow), state.good_steps + 1, 0)
    skipped = state.skipped
    if skipped is not None:
        skipped = (skipped + jnp.where(grads_finite, 0, 1)).astype(jnp.int32)
    return LossScale(scale.astype(jnp.float32), good.astype(jnp.int32), skipped)


def applied_steps(step: jax.Array, loss_scale: LossScale) -> jax.Array:
    """The micro-steps whose update was applied: the loop's ``step`` less the skipped ones (``step``
    itself where the skips were not counted)."""
    return step if loss_scale.skipped is None else step - loss_scale.skipped
