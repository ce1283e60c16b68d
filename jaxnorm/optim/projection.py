"""Per-unit sphere projections after every step: bounded weight norm (BWN) and norm schedules.

For a unit followed by batch norm only the direction of its weight vector ``w[..., j]`` matters, and
an SGD step moves that direction by about ``eta / ||w_j||**2`` (Hoffer et al., *Norm matters*, Sec. 2;
Liu et al., Cor. 3.3). Fixing the norm therefore fixes the effective step size:

* :func:`bwn_projection` keeps every unit at the norm it had at ``init`` (or at ``rho``), the
  bounded-weight-norm recipe of *Norm matters* Sec. 4 when combined with mean-only batch norm;
* :func:`norm_schedule` projects every unit to ``rho(t)`` after each step, so that a constant
  learning rate with a growing norm replaces a decaying learning rate: with SGD (momentum included),
  learning rate ``eta`` at norm ``rho * sqrt(c)`` gives the same function trajectory as ``eta / c`` at
  norm ``rho`` (Norm matters, Sec. 2);
* :func:`norm_schedule_from_lr` makes that trade for a given learning-rate schedule: the selected
  units step at the constant base rate while their norms follow ``sqrt(eta_0 / eta(t))``.

Both express the projection ``P`` as the update ``P(p + u) - p`` and go last in an ``optax.chain``;
the projection is :func:`jaxnorm.functional.weight.project_to_norm`, computed in at least float32 and
returned as an update that ``optax.apply_updates`` lands on ``P(p + u)`` in every dtype
(:mod:`jaxnorm.optim.landing`; for bfloat16/float16 params the update of a projected leaf is float32).

Targets that are not positive and finite (a schedule returning 0, a negative or ``inf`` value, a
zero recorded norm) leave the unit unprojected on that step: its update passes through and its
scale (:func:`jaxnorm.optim.last_scales`) is 1. Where such a value is known at construction or
``init`` it raises instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxnorm.functional.weight import project_to_norm, unit_norm
from jaxnorm.optim import landing
from jaxnorm.optim.arguments import check_positive, check_positive_tree
from jaxnorm.optim.rescaling import (
    MaskOrFn,
    check_updates,
    flatten_like_params,
    ones_scales,
    pure_transform,
    resolve_mask,
)
from jaxnorm.optim.state import register_state_rule

__all__ = [
    "BWNProjectionState",
    "NormScheduleState",
    "bwn_projection",
    "norm_schedule",
    "norm_schedule_from_lr",
    "project_units",
]

PyTree = Any
NormTarget = float | jax.Array | PyTree


class BWNProjectionState(NamedTuple):
    """State of :func:`bwn_projection`.

    Attributes:
      norms: per-unit target norms recorded at ``init`` (``(out,)`` per selected kernel, ``None``
        elsewhere); all ``None`` when a fixed ``rho`` was given.
      scales: per selected kernel the ``(out,)`` factors ``s`` of the last update, ``w_new = w / s``
        with ``w = p + u`` (ones before the first update); ``None`` elsewhere
        (:func:`jaxnorm.optim.last_scales`).
    """

    norms: PyTree
    scales: PyTree = None


# The recorded targets are hyperparameters, not gradient statistics: a rescaling leaves them alone.
register_state_rule(BWNProjectionState)


class NormScheduleState(NamedTuple):
    """State of :func:`norm_schedule` and :func:`norm_schedule_from_lr`.

    Attributes:
      count: the number of updates applied so far.
      scales: as in :class:`BWNProjectionState`.
    """

    count: jnp.ndarray
    scales: PyTree = None


register_state_rule(NormScheduleState)


def _per_leaf_targets(rho: NormTarget, params: PyTree, flags: PyTree, fn_name: str) -> list:
    """Flat list, one target per params leaf: ``rho`` broadcast (scalar) or taken per leaf (tree)."""
    treedef = jax.tree.structure(params)
    if jax.tree_util.treedef_is_leaf(jax.tree.structure(rho)) and jnp.ndim(rho) == 0:
        return [rho] * treedef.num_leaves
    try:
        flat = flatten_like_params(params, rho)
    except (ValueError, TypeError) as err:
        raise ValueError(
            f"{fn_name}: target norms must be a scalar or a tree with the params structure "
            f"{treedef} (a scalar or an (out,) vector per selected kernel), got "
            f"{jax.tree.structure(rho)}"
        ) from err
    for target, flag, leaf in zip(
        flat, treedef.flatten_up_to(flags), treedef.flatten_up_to(params), strict=True
    ):
        if not flag:
            continue
        if target is None or (jnp.ndim(target) != 0 and jnp.shape(target) != (jnp.shape(leaf)[-1],)):
            raise ValueError(
                f"{fn_name}: target norms for a kernel of shape {jnp.shape(leaf)} must be a scalar "
                f"or of shape ({jnp.shape(leaf)[-1]},), got "
                f"{'None' if target is None else f'shape {jnp.shape(target)}'}"
            )
    return flat


def project_units(updates: PyTree, params: PyTree, flags: PyTree, targets: list) -> tuple[PyTree, PyTree]:
    """The update ``P(p + u) - p`` with ``P`` the per-unit projection to norm ``target`` on the
    leaves selected by ``flags`` (a bool tree); other leaves keep their update.

    Args:
      updates: incoming updates ``u``.
      params: current params ``p``.
      flags: bool tree with the params' structure.
      targets: one entry per params leaf (flattened order): scalar or ``(out,)`` norms.

    Returns:
      ``(updates, scales)``: the updates, and per selected kernel the ``(out,)`` factors
      ``s = ||p + u|| / rho`` (``P(p + u) = (p + u) / s``; 1 for the units left alone), else None.
    """
    treedef = jax.tree.structure(params)
    new_updates, scales = [], []
    for flag, p, u, rho in zip(
        treedef.flatten_up_to(flags),
        treedef.flatten_up_to(params),
        treedef.flatten_up_to(updates),
        targets,
        strict=True,
    ):
        if flag:
            u, scale = _project_leaf(p, u, rho)
        else:
            scale = None
        new_updates.append(u)
        scales.append(scale)
    return treedef.unflatten(new_updates), treedef.unflatten(scales)


def _project_leaf(p: jax.Array, u: jax.Array, rho: Any) -> tuple[jax.Array, jax.Array]:
    """One kernel: the landing update onto ``P(p + u)`` and the scales; units whose target is not
    positive and finite are not projected."""
    w = landing.stepped(p, u)
    rho = jnp.broadcast_to(jnp.asarray(rho, w.dtype), (p.shape[-1],))
    valid = jnp.isfinite(rho) & (rho > 0)
    safe_rho = jnp.where(valid, rho, jnp.ones_like(rho))
    update, moved = landing.land(p, u, project_to_norm(w, safe_rho, epsilon=0.0), valid)
    norm = unit_norm(w)
    moved = moved & (norm > 0)
    return update, jnp.where(moved, norm / safe_rho, jnp.ones_like(norm))


def bwn_projection(
    *, mask: MaskOrFn = None, rho: NormTarget | str | None = None
) -> optax.GradientTransformationExtraArgs:
    """Bounded weight norm as a projection (Hoffer et al., *Norm matters*, Sec. 4).

    After every update each selected unit has ``||w[..., j]||_2 = rho_j``:

    * ``rho=None``: ``rho_j`` is the unit's norm at ``init`` (recorded in the state); a unit that is
      zero at ``init`` gets the mean norm of the layer's nonzero units (it is not pinned at 0);
    * ``rho="layer"``: the paper's per-layer scalar, the mean of the layer's nonzero initial unit norms;
    * ``rho`` a positive finite number (every unit) or a tree with the params' structure holding a
      scalar or an ``(out,)`` vector per selected kernel.

    A selected kernel that is zero everywhere at ``init`` raises with ``rho=None`` / ``"layer"``.

    Place it last in ``optax.chain``; the update is ``P(p + u) - p``. Combine it with mean-only batch
    norm for the paper's BWN recipe. The optimizer's state is left as it is.

    Args:
      mask: bool tree or callable as in ``optax.masked``; default every leaf of rank >= 2.
      rho: target norms, see above.

    Returns:
      An ``optax.GradientTransformationExtraArgs`` whose ``update`` needs ``params``.

    References:
      Hoffer, Banner, Golan & Soudry, *Norm matters* (NeurIPS 2018), Sec. 4 and Supp. Table 1.
    """
    if isinstance(rho, str):
        if rho != "layer":
            raise ValueError(
                f"bwn_projection: rho must be None, 'layer', a positive number or a tree of them, got {rho!r}"
            )
    elif rho is not None:
        check_positive_tree(rho, "bwn_projection", "rho")

    def init_fn(params: PyTree) -> BWNProjectionState:
        flags = resolve_mask(mask, params, "bwn_projection")
        scales = ones_scales(params, flags)
        if rho is not None and not isinstance(rho, str):
            _per_leaf_targets(rho, params, flags, "bwn_projection")  # shape check
            return BWNProjectionState(norms=jax.tree.map(lambda _: None, params), scales=scales)
        paths = [jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
        treedef = jax.tree.structure(params)
        leaves = zip(paths, treedef.flatten_up_to(flags), treedef.flatten_up_to(params), strict=True)
        norms = [_initial_norms(p, rho == "layer", path) if flag else None for path, flag, p in leaves]
        return BWNProjectionState(norms=treedef.unflatten(norms), scales=scales)

    def update_fn(updates, state, params=None, **extra_args):
        del extra_args
        check_updates(updates, params, "bwn_projection")
        flags = resolve_mask(mask, params, "bwn_projection")
        if rho is None or isinstance(rho, str):
            targets = jax.tree.structure(params).flatten_up_to(state.norms)
        else:
            targets = _per_leaf_targets(rho, params, flags, "bwn_projection")
        updates, scales = project_units(updates, params, flags, targets)
        return updates, state._replace(scales=scales)

    return pure_transform(init_fn, update_fn)


def _initial_norms(p: jax.Array, layer: bool, path: str) -> jax.Array:
    """BWN's targets from the initial kernel: the unit norms, with zero units given the mean of the
    layer's nonzero unit norms (``layer=True``: that mean for every unit). A kernel that is zero
    everywhere has no norm to keep: ``ValueError`` (when ``p`` is concrete)."""
    norms = unit_norm(p)
    nonzero = norms > 0
    count = jnp.sum(nonzero)
    if not isinstance(count, jax.core.Tracer) and int(count) == 0:
        raise ValueError(
            f"bwn_projection: params{path} is zero at init, so it has no norm to keep; pass rho= "
            "(a positive number or tree) or leave it out of the mask"
        )
    mean = jnp.sum(jnp.where(nonzero, norms, 0.0)) / jnp.maximum(count, 1)
    return jnp.full_like(norms, mean) if layer else jnp.where(nonzero, norms, mean)


def norm_schedule(
    schedule: Callable[[jax.Array], NormTarget] | NormTarget, mask: MaskOrFn = None
) -> optax.GradientTransformationExtraArgs:
    """Norm schedule (Hoffer et al., *Norm matters*, Sec. 2): after every step, unit norms = rho(t).

    On update ``t`` (``t = 0, 1, ...``, the count before the update, as optax schedules are called)
    every selected unit is projected to ``||w[..., j]||_2 = schedule(t)``. For scale-invariant units
    (followed by batch norm) and SGD, multiplying the norm by ``sqrt(c)`` is equivalent to dividing
    the learning rate by ``c``: the direction moves by ``eta / ||w||**2`` per step. A constant learning
    rate with an increasing norm schedule thus replaces learning-rate decay.

    Args:
      schedule: ``count -> rho`` (an ``optax.Schedule``) or a constant; ``rho`` is a positive scalar
        or a tree with the params' structure (a scalar or ``(out,)`` vector per selected kernel).
        Under ``optax.inject_hyperparams`` the schedule is evaluated there and passed in as a value.
        A constant must be positive and finite (``ValueError``); a callable is evaluated at
        ``init`` on count 0 and must be positive and finite there (``ValueError``, unless ``init``
        runs under ``jit``). On later steps a value ``<= 0``, ``inf`` or NaN cannot be checked under
        ``jit``: the units it targets are not projected on that step (their update passes through,
        their scale is 1), never zeroed or flipped.
      mask: bool tree or callable as in ``optax.masked``; default every leaf of rank >= 2.

    Returns:
      An ``optax.GradientTransformationExtraArgs`` whose ``update`` needs ``params``.

    References:
      Hoffer, Banner, Golan & Soudry, *Norm matters* (NeurIPS 2018), Sec. 2 and Supp. Sec. 1.
    """
    if not callable(schedule):
        check_positive_tree(schedule, "norm_schedule", "schedule values")

    def init_fn(params: PyTree) -> NormScheduleState:
        flags = resolve_mask(mask, params, "norm_schedule")
        count = jnp.zeros([], jnp.int32)
        rho = schedule(count) if callable(schedule) else schedule
        if callable(schedule):
            check_positive_tree(rho, "norm_schedule", "schedule values (schedule(0))")
        _per_leaf_targets(rho, params, flags, "norm_schedule")
        return NormScheduleState(count=count, scales=ones_scales(params, flags))

    def update_fn(updates, state, params=None, **extra_args):
        del extra_args
        check_updates(updates, params, "norm_schedule")
        flags = resolve_mask(mask, params, "norm_schedule")
        rho = schedule(state.count) if callable(schedule) else schedule
        targets = _per_leaf_targets(rho, params, flags, "norm_schedule")
        updates, scales = project_units(updates, params, flags, targets)
        return updates, NormScheduleState(count=optax.safe_increment(state.count), scales=scales)

    return pure_transform(init_fn, update_fn)


# Where the schedule reaches 0, the norm stops growing at sqrt(1 / MIN_LR_RATIO) = 1000 times the base.
MIN_LR_RATIO = 1e-6


def norm_schedule_from_lr(
    learning_rate: optax.Schedule,
    base_learning_rate: float | None = None,
    mask: MaskOrFn = None,
) -> optax.GradientTransformationExtraArgs:
    """Replace the learning-rate decay of scale-invariant units by norm growth (*Norm matters*, Sec. 2).

    Goes after an optimizer whose step size follows ``learning_rate`` (the count is the same:
    ``optax.chain(optax.sgd(schedule, momentum=0.9), norm_schedule_from_lr(schedule))``). On
    update ``t`` (the count before it, as optax schedules are called), each selected leaf's update
    (``t >= 1``; update 0, at the initial norms, keeps the schedule's step ``eta(0)``) is multiplied by
    ``eta_0 / eta(t)``, so those units step at the constant base rate ``eta_0``,
    and the unit norms are then projected to

        rho(t + 1) = sqrt(eta_0 / eta(t + 1)).

    A unit followed by batch norm at norm ``rho`` moves its direction by ``eta / rho**2`` per SGD
    step, so the next update's effective step ``eta_0 / rho(t + 1)**2 = eta(t + 1)`` is the
    schedule's: the directions follow ``optax.chain(opt(schedule), norm_schedule(1.0))`` (norms
    held at 1, step ``eta(t)``) exactly for plain SGD, and up to the momentum buffer's memory of
    earlier norms with momentum. Every other leaf keeps the schedule. The first update starts at
    the initial norms, as the comparison run does.

    Where ``eta(t) = 0`` (a warmup's first step) the selected units do not move, as under the
    schedule; a target norm is capped at ``sqrt(1 / MIN_LR_RATIO) = 1000`` (a schedule that
    decays to 0 would ask for an infinite norm).

    Args:
      learning_rate: the optimizer's schedule ``count -> eta``.
      base_learning_rate: ``eta_0``, the constant step of the selected units and the norm-1 rate;
        default ``learning_rate(0)``, which must then be positive (pass the peak rate with a warmup).
      mask: bool tree or callable as in ``optax.masked``; default every leaf of rank >= 2. Select
        only scale-invariant kernels (:func:`jaxnorm.optim.scale_invariant_mask`): for any other
        leaf the trade changes the training.

    Returns:
      An ``optax.GradientTransformationExtraArgs`` whose ``update`` needs ``params``.

    References:
      Hoffer, Banner, Golan & Soudry, *Norm matters* (NeurIPS 2018), Sec. 2 and Supp. Sec. 1 (norm
      scheduling instead of learning-rate decay).
    """
    if not callable(learning_rate):
        raise TypeError(
            f"norm_schedule_from_lr: learning_rate must be a schedule (count -> eta), got {learning_rate!r}"
        )
    if base_learning_rate is None:
        base = check_positive(learning_rate(0), "learning_rate(0)", "norm_schedule_from_lr")
    else:
        base = check_positive(base_learning_rate, "base_learning_rate", "norm_schedule_from_lr")

    def init_fn(params: PyTree) -> NormScheduleState:
        flags = resolve_mask(mask, params, "norm_schedule_from_lr")
        return NormScheduleState(count=jnp.zeros([], jnp.int32), scales=ones_scales(params, flags))

    def update_fn(updates, state, params=None, **extra_args):
        del extra_args
        check_updates(updates, params, "norm_schedule_from_lr")
        flags = resolve_mask(mask, params, "norm_schedule_from_lr")
        eta = jnp.asarray(learning_rate(state.count))
        # update 0 starts at the initial norms, not yet at rho = sqrt(eta_0 / eta(0)): the schedule's
        # own step there, as in the comparison run (a base other than eta(0) made it eta_0 / eta(0) times)
        step_scale = jnp.where(eta > 0, base / jnp.where(eta > 0, eta, 1.0), 0.0)
        step_scale = jnp.where(state.count == 0, 1.0, step_scale)
        eta_next = jnp.asarray(learning_rate(state.count + 1))
        rho = jnp.sqrt(base / jnp.maximum(eta_next, base * MIN_LR_RATIO))
        updates = jax.tree.map(
            lambda flag, u: (u * step_scale).astype(u.dtype) if flag else u, flags, updates
        )
        targets = [rho] * jax.tree.structure(params).num_leaves
        updates, scales = project_units(updates, params, flags, targets)
        return updates, NormScheduleState(count=optax.safe_increment(state.count), scales=scales)

    return pure_transform(init_fn, update_fn)
