"""Weight rescaling (WRS): every ``tau`` steps, put each output unit's weights on the unit sphere.

Liu, Cui, Wan, Mao & Chan, *The implicit biases of SGD on deep neural networks with batch
normalization*, Sec. 5: "Weight rescaling (WRS) consists of scaling weight vectors or conv kernels
to the unit norm every tau steps during training". A unit's weight vector is the slice
``w[..., j]`` of a kernel whose last axis is the output unit (Flax Dense ``(in, out)``, Conv HWIO);
rescaling is

    r(w)[..., j] = w[..., j] / s_j,        s_j = ||w[..., j]||_2.

For a unit followed by batch norm the network function is unchanged (Liu et al., Thm 3.1; Hoffer et
al., *Norm matters*, Sec. 2), but the optimization is not: gradients scale by ``s_j`` and the next
steps move the direction by ``eta * s_j**2 / ||w||**2`` more.

Two forms (the paper is silent about optimizer state, so both exist):

* chain element, ``optax.chain(opt, weight_rescaling(tau))``: the update becomes ``r(p + u) - p`` on
  rescaling steps (as optax expresses projections, ``optax.keep_params_nonnegative``); ``opt``'s
  state is untouched, so momenta keep the scale of the weights before rescaling (the plain reading);
* wrapper, ``weight_rescaling(tau, inner=opt, rescale_state=True)``: also maps ``opt``'s state
  through :func:`jaxnorm.optim.state.rescale_state` with multipliers ``1 / s`` (``w' = w / s``:
  first moments ``* s``, second moments ``* s**2``), the state the optimizer would hold had it run
  on ``w / s`` from the start (Stock et al., *Equi-normalization*, Eq. 10).

Rescaling steps are chosen by ``lax.cond`` on a step counter; only the per-unit multipliers
``m = 1 / s`` come out of it (ones on the other ``tau - 1`` steps, where no norm is computed), and
the update ``r(p + u) - p = (p + u) m - p`` (``u`` itself where ``m = 1``) is elementwise, so it
fuses with the optimizer's own update.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxnorm.functional.weight import unit_norm
from jaxnorm.optim import landing
from jaxnorm.optim import state as state_lib
from jaxnorm.optim.arguments import check_bool, check_steps

__all__ = [
    "WeightRescalingState",
    "check_inner",
    "check_params",
    "check_steps",
    "check_updates",
    "default_mask",
    "flatten_like_params",
    "ones_scales",
    "pure",
    "pure_transform",
    "resolve_mask",
    "unit_multiplier",
    "weight_rescaling",
]

PyTree = Any
MaskOrFn = PyTree | Callable[[PyTree], PyTree] | None


class WeightRescalingState(NamedTuple):
    """State of :func:`weight_rescaling`.

    Attributes:
      count: number of updates applied so far (int32 scalar).
      inner_state: the wrapped optimizer's state (``optax.EmptyState()`` as a chain element).
      scales: per selected kernel the ``(out,)`` factors ``s`` of the last update, ``w_new = w / s``
        with ``w = p + u`` the stepped params (ones when it did not rescale); ``None`` elsewhere.
        Read them with :func:`jaxnorm.optim.last_scales`.
    """

    count: jnp.ndarray
    inner_state: optax.OptState
    scales: PyTree = None


state_lib.register_state_rule(WeightRescalingState, nested=("inner_state",))


def pure(tree: PyTree) -> PyTree:
    """``tree`` with Flax NNX ``Variable`` wrappers replaced by their values (``nnx.as_pure``); any
    other tree is returned as it is. ``nnx.state(model, nnx.Param)`` thus becomes an ``nnx.State``
    of arrays, the pytree ``nnx.Optimizer`` passes to ``tx.update``."""
    from flax import nnx  # only NNX trees need it; imported here to keep jaxnorm.optim light

    is_variable = lambda x: isinstance(x, nnx.Variable)
    wrapped = any(map(is_variable, jax.tree.leaves(tree, is_leaf=is_variable)))
    if not isinstance(tree, nnx.State) and not wrapped:
        # the tree itself: ``as_pure`` rebuilds plain dicts with sorted keys, and the order of a params
        # dict is Flax's call order, which ENorm's chain reads (``jaxnorm.enorm.chain``)
        return tree
    return nnx.as_pure(tree)


def pure_transform(init_fn: Callable, update_fn: Callable) -> optax.GradientTransformationExtraArgs:
    """An optax transformation that sees params and updates without NNX ``Variable`` wrappers.

    ``init`` and ``update`` accept plain pytrees, ``nnx.State`` of arrays (what ``nnx.Optimizer``
    passes) and ``nnx.State`` of ``Variable`` objects (``nnx.state(model, nnx.Param)``, ``nnx.grad``'s
    output); the returned updates have the structure of the incoming ``updates``.
    """

    def init(params: PyTree):
        return init_fn(pure(params))

    def update(updates: PyTree, state: Any, params: PyTree = None, **extra_args):
        new_updates, state = update_fn(pure(updates), state, pure(params), **extra_args)
        restored = jax.tree.unflatten(jax.tree.structure(updates), jax.tree.leaves(new_updates))
        return restored, state

    return optax.GradientTransformationExtraArgs(init, update)


def default_mask(params: PyTree) -> PyTree:
    """The paper's selection: every kernel, i.e. every leaf of rank >= 2 (output layer included)."""
    return jax.tree.map(lambda p: jnp.ndim(p) >= 2, params)


def _as_bool(flag: Any, path: str, fn_name: str) -> bool:
    if isinstance(flag, bool | np.bool_):
        return bool(flag)
    # a concrete 0-d bool array is a bool; a string ("False" is truthy), a number or a tracer is not
    is_bool_array = isinstance(flag, np.ndarray | jax.Array) and not isinstance(flag, jax.core.Tracer)
    if not is_bool_array or jnp.ndim(flag) != 0 or jnp.asarray(flag).dtype != jnp.bool_:
        raise TypeError(
            f"{fn_name}: mask leaf at {path} must be a Python bool (one per params leaf), got {flag!r}"
        )
    return bool(flag)


def resolve_mask(mask: MaskOrFn, params: PyTree, fn_name: str) -> PyTree:
    """Turn ``mask`` (``None``, a bool tree or a callable, as in ``optax.masked``) into a bool tree.

    Checks that the mask has the params' structure and that every selected leaf is a kernel of rank
    >= 2 with a floating dtype, raising a ``ValueError`` / ``TypeError`` that names the leaf. Selected
    kernels of size 0 come out unselected.
    """
    if mask is None:
        mask = default_mask
    mask_tree = pure(mask(params) if callable(mask) else mask)
    params_def = jax.tree.structure(params)
    try:
        flat_mask = _flatten_mask(params, mask_tree)
    except (ValueError, TypeError) as err:
        raise ValueError(
            f"{fn_name}: mask does not match the params tree: expected one bool per params "
            f"leaf with structure {params_def}, got {jax.tree.structure(mask_tree)}"
        ) from err
    paths = [jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    flags = []
    for path, flag, leaf in zip(paths, flat_mask, params_def.flatten_up_to(params), strict=True):
        selected = _as_bool(flag, path, fn_name)
        if selected:
            if jnp.ndim(leaf) < 2:
                raise ValueError(
                    f"{fn_name}: mask selects params{path} of shape {jnp.shape(leaf)}, but "
                    "per-unit norms need a kernel of rank >= 2 with the output unit last (Dense "
                    "(in, out), Conv HWIO); leave biases and scales out of the mask"
                )
            if not jnp.issubdtype(jnp.result_type(leaf), jnp.floating):
                raise TypeError(
                    f"{fn_name}: params{path} has dtype {jnp.result_type(leaf)}, expected floating"
                )
        # a kernel with an axis of length 0 has nothing to rescale or project: its (empty) update
        # passes unchanged, as for an unselected leaf
        flags.append(selected and jnp.size(leaf) > 0)
    return params_def.unflatten(flags)


def _flatten_mask(params: PyTree, mask_tree: PyTree) -> list:
    return flatten_like_params(params, mask_tree)


def flatten_like_params(params: PyTree, tree: PyTree) -> list:
    """The leaves of ``tree`` (a mask, target norms, a reference) in params order, one per params
    leaf (``treedef.flatten_up_to``). An ``nnx.State`` of params also takes the nested dict of
    its ``nnx.to_pure_dict`` form (same keys, same sorted order), so that a tree written for linen
    params or by hand as a dict serves nnx too. Raises ``ValueError`` / ``TypeError`` where the
    structures differ."""
    try:
        return jax.tree.structure(params).flatten_up_to(tree)
    except (ValueError, TypeError):
        from flax import nnx  # only NNX trees get here

        if not (isinstance(tree, dict) and isinstance(params, nnx.State)):
            raise
        return jax.tree.structure(nnx.to_pure_dict(params)).flatten_up_to(tree)


def check_params(params: PyTree, fn_name: str) -> None:
    """Raise the optax error for a params-dependent transform called without params."""
    if params is None:
        raise ValueError(
            f"{fn_name}: update needs the params (got params=None); call tx.update(updates, state, params)"
        )


def check_updates(updates: PyTree, params: PyTree, fn_name: str) -> None:
    """``updates`` must have the params' tree structure and every leaf the params leaf's shape."""
    check_params(params, fn_name)
    treedef = jax.tree.structure(params)
    try:
        flat = treedef.flatten_up_to(updates)
    except (ValueError, TypeError) as err:
        raise ValueError(
            f"{fn_name}: updates (the gradients) must have the structure of params {treedef}, got "
            f"{jax.tree.structure(updates)}"
        ) from err
    for (path, p), u in zip(jax.tree_util.tree_flatten_with_path(params)[0], flat, strict=True):
        if jnp.shape(u) != jnp.shape(p):
            raise ValueError(
                f"{fn_name}: updates{jax.tree_util.keystr(path)} has shape {jnp.shape(u)}, but "
                f"params{jax.tree_util.keystr(path)} has shape {jnp.shape(p)}"
            )


def check_inner(inner: Any, fn_name: str) -> None:
    """``inner`` must be an optax transformation (``init`` and ``update``), e.g. ``optax.sgd(0.1)``."""
    if not (callable(getattr(inner, "init", None)) and callable(getattr(inner, "update", None))):
        raise TypeError(
            f"{fn_name}: inner must be an optax.GradientTransformation (e.g. optax.sgd(0.1)), got {inner!r}"
        )


def _norm_dtype(w: jax.Array) -> jnp.dtype:
    return jnp.promote_types(w.dtype, jnp.float32)


def unit_multiplier(w: jax.Array) -> jax.Array:
    """``1 / ||w[..., j]||_2`` per output unit, shape ``(out,)``; 1 for a zero unit (left as it is).

    ``w * unit_multiplier(w)`` has every nonzero unit at norm 1 (Liu et al., Sec. 5); the multiplier is
    what :func:`jaxnorm.optim.state.rescale_state` takes for ``w' = w * m``. The norm is computed
    without overflow (:func:`jaxnorm.functional.weight.unit_norm`); a unit whose norm is not finite
    gets 1.
    """
    norm = unit_norm(w)
    ok = (norm > 0) & jnp.isfinite(norm)
    return jnp.where(ok, 1.0 / jnp.where(ok, norm, 1.0), 1.0)


def weight_rescaling(
    tau: int,
    *,
    mask: MaskOrFn = None,
    inner: optax.GradientTransformation | None = None,
    rescale_state: bool = False,
) -> optax.GradientTransformationExtraArgs:
    """WRS (Liu et al., Sec. 5): after update ``k`` with ``k % tau == 0``, every unit has L2 norm 1.

    As a chain element (``inner=None``, placed last), the update on a rescaling step is
    ``r(p + u) - p`` with ``r`` the per-unit rescaling ``w[..., j] / ||w[..., j]||``; on other steps
    the incoming update passes through. With ``inner=opt``, ``opt``'s update is computed first and
    the same rule applied to it; ``rescale_state=True`` then also rescales ``opt``'s state with
    multipliers ``1 / s`` (first moments ``* s``, second moments ``* s**2``;
    :mod:`jaxnorm.optim.state`).

    Args:
      tau: rescale after every ``tau``-th update (``tau >= 1``; the paper uses 10, 20 or 40).
      mask: which leaves are rescaled, as in ``optax.masked``: a bool tree with the params'
        structure or a callable ``params -> bool tree``. Default: every leaf of rank >= 2 (all
        kernels, the output layer included, as in the paper). Selected leaves must have the output
        unit last.
      inner: an optimizer to wrap; its updates are rescaled and (optionally) its state.
      rescale_state: rescale ``inner``'s state consistently; requires ``inner``.

    Returns:
      An ``optax.GradientTransformationExtraArgs`` whose ``update`` needs ``params``.

    References:
      Liu et al., *The implicit biases of SGD on deep neural networks with batch normalization*,
      Sec. 5 and Supp. A.4; Stock et al., *Equi-normalization of neural networks* (ICLR 2019),
      Eq. 10.
    """
    check_steps(tau, "tau", "weight_rescaling")
    check_bool(rescale_state, "rescale_state", "weight_rescaling")
    if inner is not None:
        check_inner(inner, "weight_rescaling")
    if rescale_state and inner is None:
        raise ValueError(
            "weight_rescaling: rescale_state=True needs inner=<optimizer> whose state to rescale; "
            "as a chain element the earlier states are left untouched"
        )
    wrapped = None if inner is None else optax.with_extra_args_support(inner)

    def init_fn(params: PyTree) -> WeightRescalingState:
        flags = resolve_mask(mask, params, "weight_rescaling")
        inner_state = optax.EmptyState() if wrapped is None else wrapped.init(params)
        if rescale_state:
            state_lib.check_rescaling_law(wrapped, params, "weight_rescaling")
        return WeightRescalingState(
            count=jnp.zeros([], jnp.int32), inner_state=inner_state, scales=ones_scales(params, flags)
        )

    def update_fn(updates, state, params=None, **extra_args):
        check_updates(updates, params, "weight_rescaling")
        flags = resolve_mask(mask, params, "weight_rescaling")
        inner_state = state.inner_state
        if wrapped is not None:
            updates, inner_state = wrapped.update(updates, inner_state, params, **extra_args)
        count = optax.safe_increment(state.count)

        treedef = jax.tree.structure(params)
        flat_flags = treedef.flatten_up_to(flags)
        flat_params = treedef.flatten_up_to(params)
        flat_updates = treedef.flatten_up_to(updates)
        selected = [i for i, flag in enumerate(flat_flags) if flag]
        do_rescale = jnp.equal(jnp.mod(count, jnp.asarray(tau, count.dtype)), 0)
        # Only the (out,) factors come out of the cond: on the other tau - 1 steps its identity branch
        # returns ones and computes no norm; the update below is elementwise and fuses.
        chosen = tuple((flat_params[i], flat_updates[i]) for i in selected)
        scales = jax.lax.cond(do_rescale, _rescale_units, _keep_units, chosen)
        flat_scales: list = [None] * len(flat_flags)
        for i, s in zip(selected, scales, strict=True):
            p, u = flat_params[i], flat_updates[i]
            w = landing.stepped(p, u)
            flat_updates[i] = jnp.where(s == 1, u.astype(w.dtype), landing.to_target(p, u, w / s))
            flat_scales[i] = s
        updates = treedef.unflatten(flat_updates)
        if rescale_state:
            multipliers = treedef.unflatten([None if s is None else 1.0 / s for s in flat_scales])
            inner_state = jax.lax.cond(
                do_rescale, state_lib.rescale_state, lambda s, m: s, inner_state, multipliers
            )
        scales = treedef.unflatten(flat_scales)
        return updates, WeightRescalingState(count=count, inner_state=inner_state, scales=scales)

    return pure_transform(init_fn, update_fn)


def _rescale_units(chosen: tuple) -> tuple:
    """Per selected kernel the ``(out,)`` factors ``s = ||p + u||``, with which the update lands on
    ``r(p + u) = (p + u) / s`` (:func:`jaxnorm.optim.landing.land`); ``s = 1`` for the units it
    leaves alone (zero, non-finite, or a landing off by more than the tolerance)."""
    out = []
    for p, u in chosen:
        w = landing.stepped(p, u)
        norm = unit_norm(w)
        move = (norm > 0) & jnp.isfinite(norm)
        safe = jnp.where(move, norm, jnp.ones_like(norm))
        _, moved = landing.land(p, u, w / safe, move)
        out.append(jnp.where(moved, safe, jnp.ones_like(safe)))
    return tuple(out)


def _keep_units(chosen: tuple) -> tuple:
    """The identity branch: ``s = 1`` for every unit."""
    return tuple(jnp.ones(p.shape[-1], landing.update_dtype(p, u)) for p, u in chosen)


def ones_scales(params: PyTree, flags: PyTree) -> PyTree:
    """The ``scales`` of a transform that has not fired: ones ``(out,)`` per selected kernel, else None."""
    return jax.tree.map(
        lambda flag, p: jnp.ones(jnp.shape(p)[-1], landing.update_dtype(p)) if flag else None, flags, params
    )
