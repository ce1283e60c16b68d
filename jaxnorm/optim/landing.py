"""Projections as optax updates that land on the projected params in every dtype.

optax expresses a projection ``P`` as the update ``P(p + u) - p`` (``optax.keep_params_nonnegative``),
which ``optax.apply_updates`` adds back as ``(p + update).astype(p.dtype)``. Computed in the params'
own dtype this loses the projected values whenever ``|p|`` is much larger than ``|P(p + u)|``: a
bfloat16 kernel with entries near 1000 projected to unit norm has the update ``-p`` after rounding,
and ``p + update`` is 0 (the unit is lost).

Here the projection and the update are computed in at least float32 and the update is returned in
that dtype, so that ``optax.apply_updates`` adds in float32 and rounds once to the params' dtype: the
result is ``P(p + u)`` to within one unit in the last place (ulp) of the params' dtype per entry as
long as ``max|p| / |P(p + u)|`` stays below about ``2**16`` (bfloat16), ``2**14`` (float16). For
float32 params the update is float32 and each entry is off by at most half an ulp of ``|p|``.

A unit whose landing would still be off by more than :data:`LANDING_TOLERANCE` of its target norm
(e.g. a float32 kernel with entries near ``1e20`` asked for norm 1: no float32 update can reach it),
or whose target is not finite, is not projected on that step: its update passes through unchanged
and its recorded scale is 1. A unit is never zeroed or turned into NaN by rounding.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxnorm.functional.weight import unit_norm

__all__ = ["LANDING_TOLERANCE", "land", "stepped", "to_target", "update_dtype"]

# Relative per-unit error ||landed - target|| / ||target|| above which a unit is left unprojected.
LANDING_TOLERANCE = 2.0**-6


def update_dtype(p: jax.Array, u: jax.Array | None = None) -> jnp.dtype:
    """The dtype of a projection's update: the params' (and the update's) dtype, at least float32."""
    dtype = jnp.promote_types(jnp.result_type(p), jnp.float32)
    return dtype if u is None else jnp.promote_types(dtype, jnp.result_type(u))


def stepped(p: jax.Array, u: jax.Array) -> jax.Array:
    """``p + u`` in :func:`update_dtype` (the params a plain step would reach, before rounding)."""
    dtype = update_dtype(p, u)
    return p.astype(dtype) + u.astype(dtype)


def to_target(p: jax.Array, u: jax.Array, target: jax.Array) -> jax.Array:
    """``target - p`` in :func:`update_dtype`: the update that ``optax.apply_updates`` adds to ``p``."""
    dtype = update_dtype(p, u)
    return target.astype(dtype) - p.astype(dtype)


def land(p: jax.Array, u: jax.Array, target: jax.Array, move: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The update taking ``p`` to ``target`` under ``optax.apply_updates``, unit by unit.

    Args:
      p: current params (a kernel, output unit last).
      u: the incoming update, returned for the units that do not move.
      target: the projected params ``P(p + u)`` in :func:`update_dtype`.
      move: ``(out,)`` bools, the units to move onto ``target``.

    Returns:
      ``(update, moved)``: the update in :func:`update_dtype`, and the ``(out,)`` bools of the units
      that land on ``target`` (``move`` and landing within :data:`LANDING_TOLERANCE`).
    """
    dtype = update_dtype(p, u)
    candidate = to_target(p, u, target)
    landed = (p.astype(dtype) + candidate).astype(p.dtype).astype(dtype)  # as optax.apply_updates
    error = unit_norm(landed - target)
    # a target of norm 0 (a quotient flushed to zero) is never landed on: a unit is never zeroed
    target_norm = unit_norm(target)
    moved = move & jnp.isfinite(error) & (error <= LANDING_TOLERANCE * target_norm) & (target_norm > 0)
    return jnp.where(moved, candidate, u.astype(dtype)), moved
