"""The per-unit factors the rescaling transforms applied at the last update, for running statistics.

WRS, BWN and norm schedules divide each selected unit by a factor ``s_j``: the params the update
produces are ``w_new[..., j] = w[..., j] / s_j`` with ``w = p + u`` the params the step alone would
reach. A unit followed by batch norm computes the same training-mode function, but BN's running
mean and variance (eval mode) are still in the old scale: they become ``mean / s`` and ``var / s**2``
(Liu et al., Thm 3.1; Hoffer et al., *Norm matters*, Sec. 2). Each transform records ``s`` in its
state (``scales``); :func:`last_scales` reads them out of any optax nesting, to be passed to
``jaxnorm.enorm.transport_batch_stats`` together with the map from kernels to BNs found by
``jaxnorm.enorm.batch_stats_map``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from jaxnorm.optim.rescaling import pure

__all__ = ["last_scales"]

PyTree = Any


def _is_hole(x: Any) -> bool:
    return x is None or isinstance(x, optax.MaskedNode)


def _applied_here(node: Any) -> jax.Array | None:
    """Whether the call that produced an optax wrapper's state ``node`` applied its inner update:
    ``optax.MultiSteps`` only at the end of a window (``mini_step`` back at 0) and not when its
    ``should_skip_update_fn`` skipped, ``optax.apply_if_finite`` only on finite updates; ``None``
    for other nodes."""
    if isinstance(node, optax.MultiStepsState):
        applied = node.mini_step == 0
        skip = node.skip_state
        if isinstance(skip, dict) and "should_skip" in skip:
            applied = jnp.logical_and(applied, jnp.logical_not(skip["should_skip"]))
        return applied
    if isinstance(node, optax.ApplyIfFiniteState):
        return jnp.asarray(node.last_finite)
    return None


def _collect(node: Any, found: list, applied: jax.Array | None = None) -> None:
    """Appends to ``found`` every rescaling state's ``scales`` under ``node``, as ones where a
    wrapper above it did not apply the update that produced ``node`` (the inner state then keeps
    the scales of an earlier update, by which the params did not move this time)."""
    here = _applied_here(node)
    if here is not None:
        applied = here if applied is None else jnp.logical_and(applied, here)
    if isinstance(node, dict):
        for value in node.values():
            _collect(value, found, applied)
        return
    if isinstance(node, list | tuple):
        fields = getattr(node, "_fields", None)
        if fields and "scales" in fields and node.scales is not None:
            found.append(node.scales if applied is None else _ones_unless(applied, node.scales))
        for value in node:
            _collect(value, found, applied)


def _ones_unless(applied: jax.Array, scales: PyTree) -> PyTree:
    return jax.tree.map(
        lambda s: s if _is_hole(s) else jnp.where(applied, s, jnp.ones_like(s)), scales, is_leaf=_is_hole
    )


def _product(a: PyTree, b: PyTree) -> PyTree:
    treedef = jax.tree.structure(a, is_leaf=_is_hole)
    try:
        flat_b = treedef.flatten_up_to(b)
    except (ValueError, TypeError) as err:
        raise ValueError(
            "last_scales: two rescaling transforms in opt_state were initialised on different params "
            f"trees ({treedef} and {jax.tree.structure(b, is_leaf=_is_hole)})"
        ) from err
    flat_a = treedef.flatten_up_to(a)
    out = [y if _is_hole(x) else x if _is_hole(y) else x * y for x, y in zip(flat_a, flat_b, strict=True)]
    return treedef.unflatten(out)


def last_scales(opt_state: PyTree) -> PyTree:
    """The per-output-unit factors ``s`` applied by the update that produced ``opt_state``:
    ``w_new = w / s``; ones where that call applied no update (an ``optax.MultiSteps`` micro-step that
    only accumulated or that it skipped, a non-finite step under ``optax.apply_if_finite``), whose
    inner state keeps the factors of an earlier update.

    Finds the ``scales`` recorded by :func:`jaxnorm.optim.weight_rescaling`,
    :func:`jaxnorm.optim.bwn_projection`, :func:`jaxnorm.optim.norm_schedule` and
    :func:`jaxnorm.optim.norm_schedule_from_lr` anywhere in ``opt_state`` (``optax.chain``,
    ``optax.masked``, ``optax.inject_hyperparams``, ``optax.partition``, an ``nnx.Optimizer``'s
    ``opt_state``). Several are multiplied leaf by leaf (their divisions compose).

    Args:
      opt_state: an optax state.

    Returns:
      A tree with the params' structure: an ``(out,)`` array per rescaled kernel (ones where the
      update did not rescale), ``None`` for leaves no transform touches.

    Raises:
      ValueError: ``opt_state`` holds no rescaling transform's state.

    Use after ``tx.update``: ``batch_stats = jaxnorm.enorm.transport_batch_stats(batch_stats,
    last_scales(opt_state), stats_map)`` maps BN running means by ``1 / s`` and variances by
    ``1 / s**2``, so eval-mode outputs do not jump at a rescaling step.
    """
    found: list = []
    _collect(pure(opt_state), found)
    if not found:
        raise ValueError(
            "last_scales: opt_state holds no state of weight_rescaling, bwn_projection, norm_schedule "
            "or norm_schedule_from_lr"
        )
    scales = found[0]
    for other in found[1:]:
        scales = _product(scales, other)
    return jax.tree.map(lambda x: None if _is_hole(x) else x, scales, is_leaf=_is_hole)
