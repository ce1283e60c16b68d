"""AdamP and SGDP: remove the radial component of the update of scale-invariant weights.

Heo, Chun, Oh, Han, Yun, Kim, Uh, Ha. *AdamP: Slowing down the slowdown for momentum optimizers on
scale-invariant weights*, ICLR 2021, Algorithms 1-2 (and the authors' code, ``clovaai/AdamP``).

For a weight ``w`` whose loss is invariant to its scale, the gradient is orthogonal to ``w``, but a
momentum update ``u`` is not, and its radial part only grows ``||w||``, shrinking the effective step
size. The projection removes it:

    Pi_w(u) = u - (w_hat . u) w_hat,        w_hat = w / (||w|| + eps),

applied where the gradient looks orthogonal to ``w``: the largest cosine ``|cos(g, w)|`` is below
``delta / sqrt(d)`` (``d`` the dimension of the view) in the *unit view* (each output unit's weight
vector, ``w[..., j]``, the paper's channel view) or else in the *layer view* (the whole kernel). Only
kernels (rank >= 2) are tested, as in the paper. A projected weight's decoupled weight decay is
multiplied by ``wd_ratio``.

``mask=`` (e.g. :func:`jaxnorm.optim.scale_invariant_mask`, the tracer's answer) replaces the cosine
test: selected kernels are projected per unit on every step, the others never.

Numerics: cosines and projections are computed in float32 or wider on vectors divided by their norms
(:func:`jaxnorm.functional.unit_norm`, overflow-safe), so no finite kernel gives NaN or Inf.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxnorm.functional.weight import unit_norm
from jaxnorm.optim.arguments import (
    check_bool,
    check_in_range,
    check_learning_rate,
    check_non_negative,
    check_positive,
)
from jaxnorm.optim.rescaling import (
    MaskOrFn,
    check_inner,
    check_updates,
    pure,
    pure_transform,
    resolve_mask,
)

__all__ = [
    "NOT_PROJECTED",
    "PROJECTED_LAYER",
    "PROJECTED_UNITS",
    "RadialProjectionState",
    "RadialState",
    "adamp",
    "project_radial",
    "radial_projection",
    "sgdp",
]

PyTree = Any

NOT_PROJECTED, PROJECTED_UNITS, PROJECTED_LAYER = 0, 1, 2
"""Per-leaf record of the last step's choice (``RadialState.projected``)."""


class RadialProjectionState(NamedTuple):
    """State of :func:`radial_projection`: the wrapped optimizer's state and, per params leaf, which
    view the last step projected in (``NOT_PROJECTED``, ``PROJECTED_UNITS``, ``PROJECTED_LAYER``)."""

    inner_state: Any
    projected: PyTree


class RadialState(NamedTuple):
    """State of :func:`adamp` / :func:`sgdp`: step count, first moment (AdamP and SGDP's momentum
    buffer), second moment (AdamP; empty for SGDP) and the last step's projection per leaf."""

    count: jax.Array
    mu: PyTree
    nu: PyTree
    projected: PyTree


def _wide(x: jax.Array) -> jax.Array:
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def _direction(x: jax.Array, eps: float) -> jax.Array:
    """``x / max(||x_j||, eps)`` per output unit (last axis)."""
    return x / jnp.maximum(unit_norm(x), eps)


def _radial_part(w_hat: jax.Array, u: jax.Array, axes: tuple[int, ...]) -> jax.Array:
    return w_hat * jnp.sum(w_hat * u, axis=axes, keepdims=True)


def project_radial(
    w: jax.Array, g: jax.Array, u: jax.Array, *, delta: float, eps: float, selected: bool | None
) -> tuple[jax.Array, jax.Array]:
    """AdamP's projection of one kernel's update ``u`` (Heo et al., Alg. 1, ``Pi``), ``(u', choice)``.

    ``selected=None``: the cosine test decides (unit view first, then layer view), ``True``: project
    per unit, ``False``: leave ``u``. ``choice`` is one of ``NOT_PROJECTED``, ``PROJECTED_UNITS``,
    ``PROJECTED_LAYER`` (an int32 scalar). ``u'`` has ``u``'s dtype.
    """
    if selected is False or jnp.ndim(w) < 2 or jnp.size(w) == 0:  # size 0: nothing to project
        return u, jnp.asarray(NOT_PROJECTED, jnp.int32)
    w32, g32, u32 = _wide(w), _wide(g), _wide(u)
    unit_axes = tuple(range(w.ndim - 1))
    every_axis = tuple(range(w.ndim))
    w_unit = w32 / (unit_norm(w32) + eps)
    projected_units = u32 - _radial_part(w_unit, u32, unit_axes)
    if selected:
        return projected_units.astype(u.dtype), jnp.asarray(PROJECTED_UNITS, jnp.int32)
    flat = w32.reshape(-1, 1)
    w_layer = w32 / (unit_norm(flat)[0] + eps)
    projected_layer = u32 - _radial_part(w_layer, u32, every_axis)
    fan_in = w.size // w.shape[-1]
    cos_units = jnp.max(jnp.abs(jnp.sum(_direction(g32, eps) * _direction(w32, eps), axis=unit_axes)))
    cos_layer = jnp.abs(jnp.sum(_direction(g32.reshape(-1, 1), eps) * _direction(flat, eps)))
    by_units = cos_units < delta / math.sqrt(fan_in)
    by_layer = cos_layer < delta / math.sqrt(w.size)
    choice = jnp.where(by_units, PROJECTED_UNITS, jnp.where(by_layer, PROJECTED_LAYER, NOT_PROJECTED))
    out = jnp.where(by_units, projected_units, jnp.where(by_layer, projected_layer, u32))
    return out.astype(u.dtype), choice.astype(jnp.int32)


def _check_mask(mask: Any, fn_name: str) -> None:
    if mask is not None and not callable(mask) and not jax.tree.leaves(mask):
        raise ValueError(f"{fn_name}: mask must be None, a callable or a bool tree, got {mask!r}")


def _selection(mask: MaskOrFn, params: PyTree, fn_name: str) -> list:
    """Per flat params leaf: ``None`` (cosine test) or the mask's bool."""
    leaves = jax.tree.leaves(params)
    if mask is None:
        return [None] * len(leaves)
    flags = resolve_mask(mask, params, fn_name)
    return jax.tree.structure(params).flatten_up_to(flags)


def _decay_flags(decay_mask: MaskOrFn, params: PyTree, fn_name: str) -> list[bool]:
    """Per flat params leaf: whether it gets weight decay (``decay_mask``: ``None`` for every leaf, a
    bool tree or ``params -> bool tree``, as ``optax.adamw``'s ``mask``; any rank may be selected)."""
    treedef = jax.tree.structure(params)
    if decay_mask is None:
        return [True] * treedef.num_leaves
    tree = pure(decay_mask(params) if callable(decay_mask) else decay_mask)
    try:
        flat = treedef.flatten_up_to(tree)
    except (ValueError, TypeError) as err:
        raise ValueError(
            f"{fn_name}: decay_mask does not match the params tree: expected one bool per params leaf "
            f"with structure {treedef}, got {jax.tree.structure(tree)}"
        ) from err
    for flag in flat:
        if not isinstance(flag, bool | np.bool_):
            raise TypeError(f"{fn_name}: decay_mask leaves must be Python bools, got {flag!r}")
    return [bool(flag) for flag in flat]


def _check_decay_mask(decay_mask: Any, fn_name: str) -> None:
    if decay_mask is not None and not callable(decay_mask) and not jax.tree.leaves(decay_mask):
        raise ValueError(f"{fn_name}: decay_mask must be None, a callable or a bool tree, got {decay_mask!r}")


def _project_tree(params, grads, updates, mask, delta, eps, fn_name):
    treedef = jax.tree.structure(params)
    chosen = _selection(mask, params, fn_name)
    pairs = [
        project_radial(w, g, u, delta=delta, eps=eps, selected=s)
        for w, g, u, s in zip(
            treedef.flatten_up_to(params),
            treedef.flatten_up_to(grads),
            treedef.flatten_up_to(updates),
            chosen,
            strict=True,
        )
    ]
    return treedef.unflatten([p[0] for p in pairs]), treedef.unflatten([p[1] for p in pairs])


def radial_projection(
    inner: optax.GradientTransformation, *, delta: float = 0.1, eps: float = 1e-8, mask: MaskOrFn = None
) -> optax.GradientTransformationExtraArgs:
    """Any optimizer with AdamP's projection (Heo et al., Sec. 3.2): ``Pi_w(inner(g))``.

    The cosine test reads the raw gradients, so the projection wraps ``inner`` instead of following it
    in a chain. Decoupled weight decay inside ``inner`` (``optax.adamw``) is radial and would be removed
    with the rest; for AdamP's ``wd_ratio`` use :func:`adamp` / :func:`sgdp`, or chain weight decay
    after this wrapper.

    Args:
      inner: the optimizer whose updates are projected, e.g. ``optax.sgd(0.1, momentum=0.9)``.
      delta: the cosine threshold ``delta / sqrt(d)`` (paper: 0.1).
      eps: added to norms (paper: 1e-8).
      mask: ``None`` for the cosine test; else a bool tree or ``params -> bool tree`` (e.g.
        :func:`jaxnorm.optim.scale_invariant_mask`): selected kernels projected per unit each step.
    """
    fn_name = "radial_projection"
    check_inner(inner, fn_name)
    delta = check_positive(delta, "delta", fn_name)
    eps = check_positive(eps, "eps", fn_name)
    _check_mask(mask, fn_name)
    wrapped = optax.with_extra_args_support(inner)

    def init_fn(params):
        _selection(mask, params, fn_name)
        projected = jax.tree.map(lambda _: jnp.asarray(NOT_PROJECTED, jnp.int32), params)
        return RadialProjectionState(inner_state=wrapped.init(params), projected=projected)

    def update_fn(grads, state, params=None, **extra_args):
        check_updates(grads, params, fn_name)
        updates, inner_state = wrapped.update(grads, state.inner_state, params, **extra_args)
        updates, projected = _project_tree(params, grads, updates, mask, delta, eps, fn_name)
        return updates, RadialProjectionState(inner_state=inner_state, projected=projected)

    return pure_transform(init_fn, update_fn)


def _radial_optimizer(
    fn_name: str,
    learning_rate: optax.ScalarOrSchedule,
    direction: Callable,
    decay_factor: float,
    weight_decay: float,
    wd_ratio: float,
    delta: float,
    eps: float,
    mask: MaskOrFn,
    decay_mask: MaskOrFn = None,
) -> optax.GradientTransformationExtraArgs:
    """The shared body of AdamP and SGDP: ``direction`` maps ``(grads, state, count)`` to the step
    direction and new moments; then projection, decoupled weight decay ``lr * wd * ratio * w`` (times
    ``decay_factor``; only the leaves ``decay_mask`` selects) and the step ``-lr * direction``."""

    def init_fn(params):
        _selection(mask, params, fn_name)
        _decay_flags(decay_mask, params, fn_name)

        def zeros():  # one buffer per moment: a state donated to jit must not hold one array twice
            return jax.tree.map(lambda p: jnp.zeros(jnp.shape(p), _wide(jnp.asarray(p)).dtype), params)

        projected = jax.tree.map(lambda _: jnp.asarray(NOT_PROJECTED, jnp.int32), params)
        return RadialState(count=jnp.zeros([], jnp.int32), mu=zeros(), nu=zeros(), projected=projected)

    def update_fn(grads, state, params=None, **extra_args):
        check_updates(grads, params, fn_name)
        count = optax.safe_increment(state.count)
        d, mu, nu = direction(grads, state, count)
        d, projected = _project_tree(params, grads, d, mask, delta, eps, fn_name)
        lr = learning_rate(state.count) if callable(learning_rate) else learning_rate
        treedef = jax.tree.structure(params)
        decayed = treedef.unflatten(_decay_flags(decay_mask, params, fn_name))

        def step(w, di, choice, flag):
            if not flag:
                return (-lr * di).astype(jnp.asarray(w).dtype)
            ratio = jnp.where(choice == NOT_PROJECTED, 1.0, wd_ratio)
            decay = lr * weight_decay * decay_factor * ratio * _wide(w)
            return (-lr * di - decay).astype(jnp.asarray(w).dtype)

        updates = jax.tree.map(step, params, d, projected, decayed)
        return updates, RadialState(count=count, mu=mu, nu=nu, projected=projected)

    return pure_transform(init_fn, update_fn)


def adamp(
    learning_rate: optax.ScalarOrSchedule = 1e-3,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    *,
    delta: float = 0.1,
    wd_ratio: float = 0.1,
    nesterov: bool = False,
    mask: MaskOrFn = None,
    decay_mask: MaskOrFn = None,
) -> optax.GradientTransformationExtraArgs:
    """AdamP (Heo et al., ICLR 2021, Alg. 2), the authors' defaults.

    ``m = b1 m + (1 - b1) g``, ``v = b2 v + (1 - b2) g^2``, ``p = m_hat / (sqrt(v_hat) + eps)`` (Nesterov:
    ``(b1 m + (1 - b1) g) / (1 - b1^t)`` for ``m_hat``); ``p`` projected by :func:`project_radial`;
    ``w <- w (1 - lr wd r) - lr p`` with ``r = wd_ratio`` where projected, else 1.

    Args:
      learning_rate: a positive float or an optax schedule of the step count.
      b1, b2, eps: Adam's.
      weight_decay: decoupled weight decay (0 disables it).
      delta: cosine threshold ``delta / sqrt(d)``; wd_ratio: weight decay factor for projected kernels.
      nesterov: Nesterov momentum as in the authors' code.
      mask: ``None`` (cosine test) or the kernels to project per unit (see :func:`radial_projection`).
      decay_mask: the leaves that get weight decay, as ``optax.adamw``'s ``mask`` (a bool tree or
        ``params -> bool tree``); ``None``: every leaf, as the authors' code on one param group.
    """
    fn_name = "adamp"
    check_learning_rate(learning_rate, fn_name)
    b1 = check_in_range(b1, "b1", fn_name, low=0.0, high=1.0, closed_high=False)
    b2 = check_in_range(b2, "b2", fn_name, low=0.0, high=1.0, closed_high=False)
    eps = check_positive(eps, "eps", fn_name)
    weight_decay = check_non_negative(weight_decay, "weight_decay", fn_name)
    delta = check_positive(delta, "delta", fn_name)
    wd_ratio = check_in_range(wd_ratio, "wd_ratio", fn_name, low=0.0, high=1.0, closed_high=True)
    nesterov = check_bool(nesterov, "nesterov", fn_name)
    _check_mask(mask, fn_name)

    def direction(grads, state, count):
        t = count.astype(jnp.result_type(float))  # float64 under x64: 1 - b2**t exact to its precision
        c1, c2 = 1.0 - b1**t, 1.0 - b2**t
        mu = jax.tree.map(lambda m, g: b1 * m + (1.0 - b1) * _wide(g), state.mu, grads)
        nu = jax.tree.map(lambda v, g: b2 * v + (1.0 - b2) * jnp.square(_wide(g)), state.nu, grads)
        first = jax.tree.map(lambda m, g: b1 * m + (1.0 - b1) * _wide(g), mu, grads) if nesterov else mu
        d = jax.tree.map(lambda m, v: (m / c1) / (jnp.sqrt(v / c2) + eps), first, nu)
        return d, mu, nu

    _check_decay_mask(decay_mask, fn_name)
    return _radial_optimizer(
        fn_name, learning_rate, direction, 1.0, weight_decay, wd_ratio, delta, eps, mask, decay_mask
    )


def sgdp(
    learning_rate: optax.ScalarOrSchedule,
    momentum: float = 0.0,
    dampening: float = 0.0,
    weight_decay: float = 0.0,
    nesterov: bool = False,
    *,
    eps: float = 1e-8,
    delta: float = 0.1,
    wd_ratio: float = 0.1,
    mask: MaskOrFn = None,
    decay_mask: MaskOrFn = None,
) -> optax.GradientTransformationExtraArgs:
    """SGDP (Heo et al., ICLR 2021, Alg. 1), the authors' defaults.

    ``b = momentum b + (1 - dampening) g``, ``p = g + momentum b`` (Nesterov) or ``b``; ``p`` projected by
    :func:`project_radial`; ``w <- w (1 - lr wd r / (1 - momentum)) - lr p`` with ``r = wd_ratio`` where
    projected, else 1 (the ``1 / (1 - momentum)`` is the authors' code's). ``decay_mask``: the leaves
    that get weight decay (``None``: all), as in :func:`adamp`.
    """
    fn_name = "sgdp"
    check_learning_rate(learning_rate, fn_name)
    momentum = check_in_range(momentum, "momentum", fn_name, low=0.0, high=1.0, closed_high=False)
    dampening = check_in_range(dampening, "dampening", fn_name, low=0.0, high=1.0, closed_high=True)
    weight_decay = check_non_negative(weight_decay, "weight_decay", fn_name)
    nesterov = check_bool(nesterov, "nesterov", fn_name)
    eps = check_positive(eps, "eps", fn_name)
    delta = check_positive(delta, "delta", fn_name)
    wd_ratio = check_in_range(wd_ratio, "wd_ratio", fn_name, low=0.0, high=1.0, closed_high=True)
    _check_mask(mask, fn_name)

    def direction(grads, state, count):
        del count
        mu = jax.tree.map(lambda b, g: momentum * b + (1.0 - dampening) * _wide(g), state.mu, grads)
        d = jax.tree.map(lambda b, g: _wide(g) + momentum * b, mu, grads) if nesterov else mu
        return d, mu, state.nu

    _check_decay_mask(decay_mask, fn_name)
    decay_factor = 1.0 / (1.0 - momentum)
    return _radial_optimizer(
        fn_name, learning_rate, direction, decay_factor, weight_decay, wd_ratio, delta, eps, mask, decay_mask
    )
