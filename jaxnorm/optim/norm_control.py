"""Weight norm control: decoupled weight decay towards a target norm instead of towards zero.

Loshchilov, *Weight norm control*, arXiv:2311.11446, 2023: decoupled weight decay (AdamW) is the
special case, target norm 0, of moving the weights towards a chosen norm ``r_t``. jaxnorm's reading of
it, as the decay term that :func:`optax.add_decayed_weights` adds before the learning-rate scaling:

    d = lambda * (w - r_t * w / ||w||),         update = -lr * (direction + d),

so that, the gradient aside, ``||w||`` moves towards ``r_t`` at the rate AdamW shrinks it towards 0:
``||w'|| - r_t = (1 - lr lambda)(||w|| - r_t)`` (the decay is radial). ``r_t = 0`` is exactly
``optax.add_decayed_weights(lambda)``. The norm is per output unit (``per_unit=True``: the
hyperball variant, every unit of a kernel at norm ``r_t``) or of the whole leaf.

Numerics: norms are overflow-safe (:func:`jaxnorm.functional.unit_norm`) and taken in float32 or
wider; a zero unit gets no decay (``w / ||w||`` is undefined there, and ``w = 0`` has nothing to shrink).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxnorm.functional.weight import unit_norm
from jaxnorm.optim.arguments import (
    check_bool,
    check_in_range,
    check_learning_rate,
    check_non_negative,
    check_positive,
)
from jaxnorm.optim.rescaling import MaskOrFn, check_updates, pure_transform, resolve_mask

__all__ = ["DecayToNormState", "adamwn", "decay_to_norm"]

PyTree = Any


class DecayToNormState(NamedTuple):
    """``count``: updates so far (the argument of a scheduled target)."""

    count: jax.Array


def _check_target(target: Any, fn_name: str) -> None:
    if not callable(target):
        check_non_negative(target, "target", fn_name)


def _norms(w: jax.Array, per_unit: bool) -> jax.Array:
    """``||w_j||`` per unit (broadcastable to ``w``) or ``||w||`` of the whole leaf, float32 or wider."""
    wide = w.astype(jnp.promote_types(w.dtype, jnp.float32))
    if per_unit and wide.ndim >= 2:
        return unit_norm(wide)
    return unit_norm(wide.reshape(-1, 1))[0]


def _decay(w: jax.Array, weight_decay: float, radius: jax.Array, per_unit: bool) -> jax.Array:
    wide = w.astype(jnp.promote_types(w.dtype, jnp.float32))
    norm = _norms(w, per_unit)
    pull = jnp.where(norm > 0, radius / jnp.where(norm > 0, norm, 1.0), 0.0)
    return weight_decay * wide * (1.0 - pull)


def decay_to_norm(
    weight_decay: float,
    target: float | Callable[[jax.Array], Any] = 0.0,
    *,
    per_unit: bool = True,
    mask: MaskOrFn = None,
) -> optax.GradientTransformationExtraArgs:
    """Add ``weight_decay * (w - target * w / ||w||)`` to the updates (Loshchilov 2023): in place of
    ``optax.add_decayed_weights``, before the learning-rate scaling.

    Args:
      weight_decay: ``lambda >= 0``.
      target: the norm ``r_t >= 0`` to decay towards, or a schedule ``count -> r_t``; 0 is AdamW's decay.
      per_unit: the norm of each output unit (kernels of rank >= 2; last axis) instead of the leaf's.
      mask: which leaves, as in ``optax.masked`` (a bool tree or ``params -> bool tree``). Default: every
        leaf of rank >= 2.
    """
    fn_name = "decay_to_norm"
    weight_decay = check_non_negative(weight_decay, "weight_decay", fn_name)
    _check_target(target, fn_name)
    check_bool(per_unit, "per_unit", fn_name)

    def init_fn(params):
        resolve_mask(mask, params, fn_name)
        return DecayToNormState(count=jnp.zeros([], jnp.int32))

    def update_fn(updates, state, params=None, **extra_args):
        del extra_args
        check_updates(updates, params, fn_name)
        flags = resolve_mask(mask, params, fn_name)
        radius = jnp.asarray(target(state.count) if callable(target) else target, jnp.result_type(float))

        def leaf(flag, u, w):
            if not flag:
                return u
            # in float32 or wider: a half-precision update is summed once; a float64 one keeps its bits
            wide = jnp.promote_types(u.dtype, jnp.float32)
            return (u.astype(wide) + _decay(w, weight_decay, radius, per_unit).astype(wide)).astype(u.dtype)

        new_updates = jax.tree.map(leaf, flags, updates, params)
        return new_updates, DecayToNormState(count=optax.safe_increment(state.count))

    return pure_transform(init_fn, update_fn)


def adamwn(
    learning_rate: optax.ScalarOrSchedule,
    target: float | Callable[[jax.Array], Any] = 0.0,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 1e-4,
    *,
    per_unit: bool = True,
    mask: MaskOrFn = None,
) -> optax.GradientTransformation:
    """AdamWN (Loshchilov 2023): ``optax.adamw`` with its decay replaced by :func:`decay_to_norm`:
    ``chain(scale_by_adam(b1, b2, eps), decay_to_norm(weight_decay, target), scale_by_learning_rate)``.
    ``target=0`` is ``optax.adamw(learning_rate, b1, b2, eps, weight_decay, mask=...)`` (leaves of rank
    >= 2 decayed by default)."""
    fn_name = "adamwn"
    check_learning_rate(learning_rate, fn_name)
    b1 = check_in_range(b1, "b1", fn_name, low=0.0, high=1.0, closed_high=False)
    b2 = check_in_range(b2, "b2", fn_name, low=0.0, high=1.0, closed_high=False)
    eps = check_positive(eps, "eps", fn_name)
    return optax.chain(
        optax.scale_by_adam(b1=b1, b2=b2, eps=eps),
        decay_to_norm(weight_decay, target, per_unit=per_unit, mask=mask),
        optax.scale_by_learning_rate(learning_rate),
    )
