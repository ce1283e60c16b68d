"""Per-unit weight-norm dynamics of scale-invariant networks, as pytrees a training loop can log.

A unit's weight vector is ``w[..., j]`` of a kernel with the output unit last (Flax Dense
``(in, out)``, Conv HWIO). Every function maps a params tree to a tree with the same structure
holding an ``(out,)`` array per selected kernel and ``None`` elsewhere (``mask`` as in
``optax.masked``; default: every leaf of rank >= 2). A Flax NNX ``nnx.State`` (``nnx.state(model,
nnx.Param)``, ``nnx.grad``'s output, or the array-leaf state of ``nnx.Optimizer``) is accepted
wherever a params tree is, and gives an ``nnx.State`` of the results.

For a unit followed by batch norm the loss is invariant to ``w -> c w``, hence (Liu et al.,
*The implicit biases of SGD on deep neural networks with batch normalization*):

* Thm 3.1: ``<w_j, dL/dw_j> = 0`` (:func:`weight_gradient_inner`);
* Cor. 3.3: one SGD step gives ``||w_j(t+1)||^2 = ||w_j(t)||^2 + eta^2 ||g_j||^2``
  (:func:`predicted_norm_growth`): norms only grow;
* the direction moves by about ``eta / ||w_j||^2`` (Hoffer et al., *Norm matters*, Sec. 2): the
  effective learning rate (:func:`effective_learning_rate`), measured by :func:`angular_update`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxnorm.functional.weight import unit_norm
from jaxnorm.optim.rescaling import MaskOrFn, flatten_like_params, pure, resolve_mask

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
    ``None`` on the other leaves. ``mask`` as in ``optax.masked``; default every leaf of rank >= 2.

    Every tree in ``others`` must have the params structure, and its leaves at the selected paths the
    shape of the params leaf (no broadcasting); a ``ValueError`` names the tree and the leaf path.
    An ``nnx.State`` is read through its values (:func:`jaxnorm.optim.rescaling.pure`); next to an
    ``nnx.State`` of params the other trees may also be its ``nnx.to_pure_dict`` form, and vice versa.
    """
    names = [f"others[{i}]" for i in range(len(others))]
    return _per_unit(fn, params, dict(zip(names, others, strict=True)), mask, "per_unit")


def _per_unit(
    fn: Callable[..., jax.Array], params: PyTree, others: dict[str, PyTree], mask: MaskOrFn, caller: str
) -> PyTree:
    """:func:`per_unit` with the other trees named (for the error messages) by ``caller``'s arguments."""
    params = pure(params)  # nnx.State of Variables -> nnx.State of arrays; other trees unchanged
    flags = resolve_mask(mask, params, caller)
    treedef = jax.tree.structure(params)
    flat_others = []
    for name, other in others.items():
        try:
            flat_others.append(_flatten_other(params, pure(other)))
        except (ValueError, TypeError) as err:
            raise ValueError(
                f"{caller}: {name} must have the params structure {treedef}, got {jax.tree.structure(other)}"
            ) from err
    paths = [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    flat_flags, flat_params = treedef.flatten_up_to(flags), treedef.flatten_up_to(params)
    for name, leaves in zip(others, flat_others, strict=True):
        for path, flag, p, o in zip(paths, flat_flags, flat_params, leaves, strict=True):
            if flag and jnp.shape(o) != jnp.shape(p):
                raise ValueError(
                    f"{caller}: {name}{path} has shape {jnp.shape(o)}, expected the shape of "
                    f"params{path}, {jnp.shape(p)}"
                )
    out = [
        fn(p, *rest) if flag else None
        for flag, p, *rest in zip(flat_flags, flat_params, *flat_others, strict=True)
    ]
    return treedef.unflatten(out)


def _flatten_other(params: PyTree, other: PyTree) -> list:
    """The leaves of ``other`` in params order; an ``nnx.State`` next to a params dict is compared
    through its ``nnx.to_pure_dict`` form (the reverse case is :func:`flatten_like_params`'s)."""
    try:
        return flatten_like_params(params, other)
    except (ValueError, TypeError):
        from flax import nnx  # only NNX trees get here

        if not isinstance(other, nnx.State) or isinstance(params, nnx.State):
            raise
        return jax.tree.structure(params).flatten_up_to(nnx.to_pure_dict(other))


def _unit_sum(x: jax.Array) -> jax.Array:
    return jnp.sum(x, axis=tuple(range(x.ndim - 1)))


def unit_norms(params: PyTree, *, mask: MaskOrFn = None) -> PyTree:
    """``||w[..., j]||_2`` per output unit of every selected kernel (Liu et al., Fig. 3 trajectories)."""
    return _per_unit(unit_norm, params, {}, mask, "unit_norms")


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

    Args:
      params: the params tree.
      learning_rate: ``eta``, finite and >= 0 (a number or a scalar array; checked unless traced); an
        array that broadcasts to every selected kernel's ``(out,)`` units gives one rate per unit.
      mask: as in ``optax.masked``; default every leaf of rank >= 2.
      epsilon: a finite number >= 0 added to ``||w_j||^2``.
    """
    _check_learning_rate(learning_rate, "effective_learning_rate")
    if (
        isinstance(epsilon, bool)
        or not isinstance(epsilon, numbers.Real)
        or not (math.isfinite(epsilon) and epsilon >= 0)
    ):
        raise ValueError(f"effective_learning_rate: epsilon must be a finite number >= 0, got {epsilon!r}")

    def rate(w):
        _check_learning_rate_shape(learning_rate, w, "effective_learning_rate")
        return learning_rate / (jnp.square(unit_norm(w)) + epsilon)

    return _per_unit(rate, params, {}, mask, "effective_learning_rate")


def _check_learning_rate(learning_rate: object, caller: str) -> None:
    """A finite number >= 0, or an array of them (values checked unless traced)."""
    if isinstance(learning_rate, jax.core.Tracer):
        return
    try:
        value = np.asarray(learning_rate)
    except Exception:
        value = None
    if value is None or value.dtype == np.bool_ or not np.issubdtype(value.dtype, np.number):
        raise ValueError(f"{caller}: learning_rate must be a finite number >= 0, got {learning_rate!r}")
    if not np.all(np.isfinite(value) & (value >= 0)):
        raise ValueError(f"{caller}: learning_rate must be a finite number >= 0, got {learning_rate!r}")


def _check_learning_rate_shape(learning_rate: object, kernel: jax.Array, caller: str) -> None:
    """A scalar, or an array that broadcasts to the kernel's ``(out,)`` units (one rate per unit)."""
    units = jnp.shape(kernel)[-1:]
    try:
        shape = jnp.broadcast_shapes(jnp.shape(learning_rate), units)
    except ValueError:
        shape = None
    if shape != units:
        raise ValueError(
            f"{caller}: learning_rate of shape {jnp.shape(learning_rate)} does not broadcast to the "
            f"{units} units of a kernel of shape {jnp.shape(kernel)}; pass a scalar"
        )


def angular_update(params: PyTree, new_params: PyTree, *, mask: MaskOrFn = None) -> PyTree:
    """Angle (radians) between each unit's weight vector before and after a step.

    ``angle(a, b) = 2 atan2(||a_hat - b_hat||, ||a_hat + b_hat||)`` with ``a_hat = a / ||a||``, which
    is accurate for tiny and for near-pi angles (unlike ``arccos`` of the cosine). A unit that is zero
    before or after the step has no direction and gives 0. Each unit is first scaled by the power of
    two just above its largest magnitude, so that no finite kernel overflows or underflows.
    For SGD on a scale-invariant unit the angle is about ``eta ||g|| / ||w||`` (Norm matters, Sec. 2).
    ``new_params`` must have the params structure and, at every selected leaf, its shape.
    """

    def angle(a, b):
        a_hat, a_nonzero = _direction(a)
        b_hat, b_nonzero = _direction(b)
        diff = jnp.sqrt(_unit_sum(jnp.square(a_hat - b_hat)))
        total = jnp.sqrt(_unit_sum(jnp.square(a_hat + b_hat)))
        return jnp.where(a_nonzero & b_nonzero, 2.0 * jnp.arctan2(diff, total), 0.0)

    return _per_unit(angle, params, {"new_params": new_params}, mask, "angular_update")


def _direction(w: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(w / ||w||, ||w|| > 0)`` per unit, in at least float32.

    ``w`` is first multiplied by ``2^-e`` with ``2^e`` just above the unit's largest magnitude (``e``
    clamped so that ``2^-e`` is a normal number): exact, and the squares cannot overflow or underflow.
    """
    w = w.astype(jnp.promote_types(w.dtype, jnp.float32))
    axes = tuple(range(w.ndim - 1))
    largest = jnp.max(jnp.abs(w), axis=axes, keepdims=True)
    bound = -jnp.finfo(w.dtype).minexp - 1
    exponent = jnp.clip(jnp.frexp(largest)[1], -bound, bound)
    u = w * jnp.ldexp(jnp.ones_like(largest), -exponent)
    norm = jnp.sqrt(jnp.sum(jnp.square(u), axis=axes, keepdims=True))
    nonzero = norm > 0
    return u / jnp.where(nonzero, norm, 1.0), nonzero.reshape(w.shape[-1])


def weight_gradient_inner(params: PyTree, grads: PyTree, *, mask: MaskOrFn = None) -> PyTree:
    """``<w_j, dL/dw_j>`` per unit; zero for every unit followed by batch norm (Liu et al., Thm 3.1).

    Compare it with ``||w_j|| ||g_j||`` (e.g. :func:`unit_norms` of both trees) to judge how close
    to zero it is. ``grads`` must have the params structure and, at every selected leaf, its shape.
    Products and sum are taken in at least float32 (as :func:`unit_norms`), so that float16 and
    bfloat16 kernels neither overflow nor lose the cancellation that makes the inner product zero.
    """

    def inner(w, g):
        dtype = jnp.promote_types(jnp.result_type(w, g), jnp.float32)
        return _unit_sum(w.astype(dtype) * g.astype(dtype))

    return _per_unit(inner, params, {"grads": grads}, mask, "weight_gradient_inner")


def predicted_norm_growth(
    grads: PyTree, learning_rate: float | jax.Array, *, mask: MaskOrFn = None
) -> PyTree:
    """``eta^2 ||g_j||^2`` per unit: the growth of ``||w_j||^2`` in one SGD step of a scale-invariant
    unit, ``||w_j(t+1)||^2 = ||w_j(t)||^2 + eta^2 ||g_j(t)||^2`` (Liu et al., Cor. 3.3, Eq. 7).

    ``learning_rate`` is checked as in :func:`effective_learning_rate` (finite and >= 0 unless traced).
    """
    _check_learning_rate(learning_rate, "predicted_norm_growth")

    def growth(g):
        _check_learning_rate_shape(learning_rate, g, "predicted_norm_growth")
        return jnp.square(learning_rate * unit_norm(g))

    return _per_unit(growth, grads, {}, mask, "predicted_norm_growth")
