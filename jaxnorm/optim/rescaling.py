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
from jaxnorm.optim import state as state_lib

__all__ = [
    "WeightRescalingState",
    "default_mask",
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
    """

    count: jnp.ndarray
    inner_state: optax.OptState


state_lib.register_state_rule(WeightRescalingState, nested=("inner_state",))


def default_mask(params: PyTree) -> PyTree:
    """The paper's selection: every kernel, i.e. every leaf of rank >= 2 (output layer included)."""
    return jax.tree.map(lambda p: jnp.ndim(p) >= 2, params)


def _as_bool(flag: Any, path: str, fn_name: str) -> bool:
    if isinstance(flag, bool | np.bool_):
        return bool(flag)
    if isinstance(flag, jax.core.Tracer) or jnp.ndim(flag) != 0:
        raise TypeError(
            f"{fn_name}: mask leaf at {path} must be a Python bool (one per params leaf), got {flag!r}"
        )
    return bool(flag)


def resolve_mask(mask: MaskOrFn, params: PyTree, fn_name: str) -> PyTree:
    """Turn ``mask`` (``None``, a bool tree or a callable, as in ``optax.masked``) into a bool tree.

    Checks that the mask has the params' structure and that every selected leaf is a kernel of rank
    >= 2 with a floating dtype, raising a ``ValueError`` / ``TypeError`` that names the leaf.
    """
    if mask is None:
        mask = default_mask
    mask_tree = mask(params) if callable(mask) else mask
    params_def = jax.tree.structure(params)
    try:
        flat_mask = params_def.flatten_up_to(mask_tree)
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
        flags.append(selected)
    return params_def.unflatten(flags)


def check_params(params: PyTree, fn_name: str) -> None:
    """Raise the optax error for a params-dependent transform called without params."""
    if params is None:
        raise ValueError(
            f"{fn_name}: update needs the current params, got params=None; call "
            "tx.update(updates, state, params)"
        )


def _norm_dtype(w: jax.Array) -> jnp.dtype:
    return jnp.promote_types(w.dtype, jnp.float32)


def unit_multiplier(w: jax.Array) -> jax.Array:
    """``1 / ||w[..., j]||_2`` per output unit, shape ``(out,)``; 1 for a zero unit (left as it is).

    ``w * unit_multiplier(w)`` has every nonzero unit at norm 1 (Liu et al., Sec. 5); the multiplier is
    what :func:`jaxnorm.optim.state.rescale_state` takes for ``w' = w * m``.
    """
    norm = unit_norm(w)
    return jnp.where(norm > 0, 1.0 / jnp.where(norm > 0, norm, 1.0), 1.0)


def _check_tau(tau: Any) -> None:
    if isinstance(tau, bool) or not isinstance(tau, int | float | np.ndarray | jax.Array):
        raise TypeError(f"weight_rescaling: tau must be a positive int (steps), got {tau!r}")
    if isinstance(tau, jax.core.Tracer):
        return  # a hyperparameter injected by optax.inject_hyperparams, checked at construction
    value = np.asarray(tau)
    if value.ndim != 0 or value <= 0 or value != np.floor(value):
        raise ValueError(f"weight_rescaling: tau must be a positive integer number of steps, got {tau!r}")


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
    _check_tau(tau)
    if rescale_state and inner is None:
        raise ValueError(
            "weight_rescaling: rescale_state=True needs inner=<optimizer> whose state to rescale; "
            "as a chain element the earlier states are left untouched"
        )
    wrapped = None if inner is None else optax.with_extra_args_support(inner)

    def init_fn(params: PyTree) -> WeightRescalingState:
        inner_state = optax.EmptyState() if wrapped is None else wrapped.init(params)
        return WeightRescalingState(count=jnp.zeros([], jnp.int32), inner_state=inner_state)

    def update_fn(updates, state, params=None, **extra_args):
        check_params(params, "weight_rescaling")
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

        # Only the per-unit multipliers come out of the cond: on the other steps its identity branch
        # returns ones of shape (out,) and touches no parameter-sized buffer.
        def norms_branch(ps, us):
            return tuple(unit_multiplier(p + u) for p, u in zip(ps, us, strict=True))

        def ones_branch(ps, us):
            del us
            return tuple(jnp.ones(p.shape[-1], _norm_dtype(p)) for p in ps)

        chosen_p = tuple(flat_params[i] for i in selected)
        chosen_u = tuple(flat_updates[i] for i in selected)
        multipliers = jax.lax.cond(do_rescale, norms_branch, ones_branch, chosen_p, chosen_u)
        flat_multipliers: list = [None] * len(flat_flags)
        for i, multiplier in zip(selected, multipliers, strict=True):
            p, u = flat_params[i], flat_updates[i]
            # r(p + u) - p, and exactly u on the steps (and units) with m == 1
            flat_updates[i] = jnp.where(multiplier == 1, u, (p + u) * multiplier - p).astype(u.dtype)
            flat_multipliers[i] = multiplier
        updates = treedef.unflatten(flat_updates)
        if rescale_state:
            inner_state = jax.lax.cond(
                do_rescale,
                lambda s, m: state_lib.rescale_state(s, treedef.unflatten(list(m))),
                lambda s, m: s,
                inner_state,
                tuple(flat_multipliers),
            )
        return updates, WeightRescalingState(count=count, inner_state=inner_state)

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)
