"""Sphere projection: after every update, each unit's weights back to a target norm.

The step that nGPT (Loshchilov, Hsieh, Sun, Ginsburg, *nGPT: normalized transformer with
representation learning on the hypersphere*, 2024, Sec. 2.6: "after each batch pass, all matrices
and embeddings are normalized along their embedding dimension") and EDM2's forced weight
normalization (Karras et al., *Analyzing and improving the training dynamics of diffusion models*,
CVPR 2024, Sec. 3.2 and App. B.2: ``w <- sqrt(fan_in) w / ||w||`` before each step) apply:

    P(w)_j = rho_t * w_j / ||w_j||,        w = p + u,

per unit ``j``: the slices of a kernel along ``unit_axis`` (default the last axis, a Dense/Conv kernel's
output units; ``unit_axis=0`` for the rows of an ``(vocab, d)`` embedding table). ``rho_t`` is a
positive number, ``"sqrt_fan_in"`` (norm ``sqrt(fan_in)``: per-element RMS 1, EDM2) or a schedule of
the step count. As a chain element it is the update ``P(p + u) - p`` (optax's form of a projection,
``optax.keep_params_nonnegative``), computed in float32 or wider so that it lands on ``P(p + u)`` in
every dtype (:mod:`jaxnorm.optim.landing`); a zero unit, a unit no update can land, and a step whose
scheduled target is not a positive finite number are left as the plain step leaves them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxnorm.functional.weight import unit_norm
from jaxnorm.optim import landing
from jaxnorm.optim.arguments import is_scalar_number
from jaxnorm.optim.rescaling import MaskOrFn, check_updates, ones_scales, pure_transform, resolve_mask

__all__ = ["SQRT_FAN_IN", "SphereProjectionState", "sphere_projection"]

PyTree = Any
SQRT_FAN_IN = "sqrt_fan_in"
"""``target=SQRT_FAN_IN``: each unit at norm ``sqrt(fan_in)`` (per-element RMS 1, EDM2's projection)."""


class SphereProjectionState(NamedTuple):
    """``count``: updates so far; ``scales``: per selected kernel the factors ``s = ||w_j|| / rho``
    the last update divided its units by (``w_new = w / s``, ones for units left alone), as the other
    rescaling transforms record them for :func:`jaxnorm.optim.last_scales`."""

    count: jax.Array
    scales: PyTree


def _is_sqrt_fan_in(target: Any) -> bool:
    return isinstance(target, str) and target == SQRT_FAN_IN


def _check_target(target: Any) -> None:
    if callable(target) or _is_sqrt_fan_in(target) or isinstance(target, jax.core.Tracer):
        return  # a traced target (optax.inject_hyperparams) was checked when the state was built
    if not is_scalar_number(target) or not (math.isfinite(float(target)) and float(target) > 0):
        raise ValueError(
            "sphere_projection: target must be a positive finite number, 'sqrt_fan_in' or a schedule "
            f"(a callable of the step count), got {target!r}"
        )


def _check_unit_axis(unit_axis: Any) -> int:
    if isinstance(unit_axis, jax.core.Tracer):
        raise TypeError(
            "sphere_projection: unit_axis is an axis, not a hyperparameter: optax.inject_hyperparams "
            "injects every numeric argument, defaults included; pass static_args=('unit_axis',)"
        )
    if isinstance(unit_axis, bool) or not hasattr(unit_axis, "__index__"):
        raise TypeError(f"sphere_projection: unit_axis must be an int, got {unit_axis!r}")
    return int(unit_axis)


def _check_leaf_axes(params: PyTree, flags: PyTree, unit_axis: int) -> None:
    for (path, p), flag in zip(
        jax.tree_util.tree_flatten_with_path(params)[0], jax.tree.leaves(flags), strict=True
    ):
        if flag and not -jnp.ndim(p) <= unit_axis < jnp.ndim(p):
            raise ValueError(
                f"sphere_projection: unit_axis={unit_axis} is out of range for params"
                f"{jax.tree_util.keystr(path)} of shape {jnp.shape(p)}"
            )


def _target_norm(target: Any, count: jax.Array, fan_in: int) -> jax.Array:
    if _is_sqrt_fan_in(target):
        return jnp.asarray(math.sqrt(fan_in), jnp.result_type(float))
    value = target(count) if callable(target) else target
    return jnp.asarray(value, jnp.result_type(float))


def _project_leaf(p: jax.Array, u: jax.Array, rho: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(update, s)`` for one kernel with its units on the last axis."""
    w = landing.stepped(p, u)
    norm = unit_norm(w)
    move = (norm > 0) & jnp.isfinite(norm) & (rho > 0) & jnp.isfinite(rho)
    scale = jnp.where(move, norm / jnp.where(move, rho, 1.0), 1.0).astype(w.dtype)
    update, moved = landing.land(p, u, w / scale, move)
    return update, jnp.where(moved, scale, jnp.ones_like(scale))


def sphere_projection(
    target: float | str | Callable[[jax.Array], Any] = 1.0, *, unit_axis: int = -1, mask: MaskOrFn = None
) -> optax.GradientTransformationExtraArgs:
    """After every update, each selected unit at norm ``target`` (nGPT, Sec. 2.6; EDM2, App. B.2).

    Args:
      target: a positive number, ``"sqrt_fan_in"`` (``sqrt`` of the unit's size: EDM2's forced weight
        normalization, with ``jaxnorm.nn.MPDense`` / ``MPConv`` in the forward pass) or a schedule
        ``count -> norm`` (a step whose value is not positive and finite leaves the units as the plain
        step does).
      unit_axis: the axis that indexes units; the norm is taken over all the others (``-1``: a
        kernel's output units; ``0``: the rows of an embedding table, as nGPT).
      mask: which leaves, as in ``optax.masked``: a bool tree or ``params -> bool tree``. Default:
        every leaf of rank >= 2.

    Returns:
      A chain element (place it after the optimizer) whose ``update`` needs ``params``.
    """
    _check_target(target)
    unit_axis = _check_unit_axis(unit_axis)

    def init_fn(params):
        flags = resolve_mask(mask, params, "sphere_projection")
        _check_leaf_axes(params, flags, unit_axis)
        moved_params = jax.tree.map(
            lambda p: jnp.moveaxis(p, unit_axis, -1) if jnp.ndim(p) >= 2 else p, params
        )
        return SphereProjectionState(count=jnp.zeros([], jnp.int32), scales=ones_scales(moved_params, flags))

    def update_fn(updates, state, params=None, **extra_args):
        del extra_args
        check_updates(updates, params, "sphere_projection")
        flags = resolve_mask(mask, params, "sphere_projection")
        _check_leaf_axes(params, flags, unit_axis)

        def leaf(flag, p, u):
            if not flag:
                return u, None
            p_units, u_units = jnp.moveaxis(p, unit_axis, -1), jnp.moveaxis(u, unit_axis, -1)
            rho = _target_norm(target, state.count, p_units.size // p_units.shape[-1])
            update, scale = _project_leaf(p_units, u_units, rho)
            return jnp.moveaxis(update, -1, unit_axis), scale

        treedef = jax.tree.structure(params)
        pairs = [
            leaf(f, p, u)
            for f, p, u in zip(
                treedef.flatten_up_to(flags),
                treedef.flatten_up_to(params),
                treedef.flatten_up_to(updates),
                strict=True,
            )
        ]
        new_updates = treedef.unflatten([pair[0] for pair in pairs])
        scales = treedef.unflatten([pair[1] for pair in pairs])
        return new_updates, SphereProjectionState(count=optax.safe_increment(state.count), scales=scales)

    return pure_transform(init_fn, update_fn)
