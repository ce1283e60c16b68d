"""Per-unit weight-norm dynamics of scale-invariant networks, as pytrees a training loop can log.

A unit's weight vector is ``w[..., j]`` of a kernel with the output unit last (Flax Dense
``(in, out)``, Conv HWIO). Every function maps a params tree to a tree with the same structure
holding an ``(out,)`` array per selected kernel and ``None`` elsewhere (``mask`` as in
``optax.masked``; default: every leaf of rank >= 2).

For a unit followed by batch norm the loss is invariant to ``w -> c w``, hence (Liu et al.,
*The implicit biases of SGD on deep neural networks with batch normalization*):

* Thm 3.1: ``<w_j, dL/dw_j> = 0`` (:func:`weight_gradient_inner`);
* Cor. 3.3: one SGD step gives ``||w_j(t+1)||^2 = ||w_j(t)||^2 + eta^2 ||g_j||^2``
  (:func:`predicted_norm_growth`): norms only grow;
* the direction moves by about ``eta / ||w_j||^2`` (Hoffer et al., *Norm matters*, Sec. 2): the
  effective learning rate (:func:`effective_learning_rate`), measured by :func:`angular_update`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxnorm.functional.weight import unit_norm
from jaxnorm.optim.rescaling import MaskOrFn, resolve_mask

__all__ = [
    "angular_update",
    "effective_learning_rate",
    "per_unit",
    "predicted_norm_growth",
    "unit_norms",
    "weight_gradient_inner",
]

PyTree = Any


def per_unit(fn: Callable[..., jax.Array], params: PyTree, *others: PyTree, mask: MaskOrFn = None) -> PyTree:
    """``fn(p, *o)`` on every selected leaf of ``params`` (and the matching leaves of ``others``),
    ``None`` on the other leaves. ``mask`` as in ``optax.masked``; default every leaf of rank >= 2."""
    flags = resolve_mask(mask, params, "diagnostics")
    treedef = jax.tree.structure(params)
    try:
        flat_others = [treedef.flatten_up_to(o) for o in others]
    except (ValueError, TypeError) as err:
        raise ValueError(
            f"diagnostics: every tree must have the params structure {treedef}, got "
            f"{[jax.tree.structure(o) for o in others]}"
        ) from err
    out = [
        fn(p, *rest) if flag else None
        for flag, p, *rest in zip(
            treedef.flatten_up_to(flags), treedef.flatten_up_to(params), *flat_others, strict=True
        )
    ]
    return treedef.unflatten(out)


def _unit_sum(x: jax.Array) -> jax.Array:
    return jnp.sum(x, axis=tuple(range(x.ndim - 1)))


def unit_norms(params: PyTree, *, mask: MaskOrFn = None) -> PyTree:
    """``||w[..., j]||_2`` per output unit of every selected kernel (Liu et al., Fig. 3 trajectories)."""
    return per_unit(unit_norm, params, mask=mask)


def effective_learning_rate(
    params: PyTree,
    learning_rate: float | jax.Array,
    *,
    mask: MaskOrFn = None,
    epsilon: float = 1e-12,
) -> PyTree:
    """Effective learning rate of each scale-invariant unit: ``eta / (||w_j||^2 + epsilon)``.

    The direction ``w / ||w||`` of a unit followed by batch norm moves by ``eta / ||w||^2`` times
    the projected gradient of the normalized weights (Hoffer et al., *Norm matters*, Sec. 2,
    ``w_hat(t+1) = w_hat(t) - eta ||w||^-2 (I - w_hat w_hat^T) grad L(w_hat) + O(eta^2)``).
    ``epsilon`` keeps zero units finite.
    """
    return per_unit(lambda w: learning_rate / (jnp.square(unit_norm(w)) + epsilon), params, mask=mask)


def angular_update(params: PyTree, new_params: PyTree, *, mask: MaskOrFn = None) -> PyTree:
    """Angle (radians) between each unit's weight vector before and after a step.

    ``angle(a, b) = 2 atan2(||a_hat - b_hat||, ||a_hat + b_hat||)`` with ``a_hat = a / ||a||``, which
    is accurate for tiny and for near-pi angles (unlike ``arccos`` of the cosine); zero units give 0.
    For SGD on a scale-invariant unit the angle is about ``eta ||g|| / ||w||`` (Norm matters, Sec. 2).
    """

    def angle(a, b):
        def direction(w):
            norm = unit_norm(w)
            return w / jnp.where(norm > 0, norm, 1.0)

        a_hat, b_hat = direction(a), direction(b)
        diff = jnp.sqrt(_unit_sum(jnp.square(a_hat - b_hat)))
        total = jnp.sqrt(_unit_sum(jnp.square(a_hat + b_hat)))
        return 2.0 * jnp.arctan2(diff, total)

    return per_unit(angle, params, new_params, mask=mask)


def weight_gradient_inner(params: PyTree, grads: PyTree, *, mask: MaskOrFn = None) -> PyTree:
    """``<w_j, dL/dw_j>`` per unit; zero for every unit followed by batch norm (Liu et al., Thm 3.1).

    Compare it with ``||w_j|| ||g_j||`` (e.g. :func:`unit_norms` of both trees) to judge how close
    to zero it is.
    """
    return per_unit(lambda w, g: _unit_sum(w * g), params, grads, mask=mask)


def predicted_norm_growth(
    grads: PyTree, learning_rate: float | jax.Array, *, mask: MaskOrFn = None
) -> PyTree:
    """``eta^2 ||g_j||^2`` per unit: the growth of ``||w_j||^2`` in one SGD step of a scale-invariant
    unit, ``||w_j(t+1)||^2 = ||w_j(t)||^2 + eta^2 ||g_j(t)||^2`` (Liu et al., Cor. 3.3, Eq. 7)."""
    return per_unit(lambda g: jnp.square(learning_rate * unit_norm(g)), grads, mask=mask)
