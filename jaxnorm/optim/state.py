"""How optimizer state transforms when the parameters are rescaled: one table for every wrapper.

If every parameter entry is multiplied by a positive factor, ``w' = w * m`` (ENorm's producer and
consumer scalings, WRS's ``w' = w / s``, a BWN projection), the loss gradient transforms inversely,
``g' = g / m`` (Stock et al., *Equi-normalization of neural networks*, ICLR 2019, Sec. 3.6, Eq. 10).
Optimizer statistics that accumulate gradients (SGD momentum, Adam's first moment, EMAs of updates)
therefore transform as ``x' = x / m``, statistics of squared gradients (Adam's ``nu``, RMSProp,
Adagrad) as ``x' = x / m**2``. Counters, hyperparameters and RNG keys are left alone.

:func:`rescale_state` walks an optax state with the rules below; :func:`register_state_rule` adds
the rule of a state type jaxnorm does not know. A state that holds arrays and has no rule raises a
``TypeError`` naming its type, rather than being silently left inconsistent.

The rules read a state by its type, and some optax types hold other quantities in other optimizers:
``optax.adamax`` keeps the infinity norm (``x / m``) in ``ScaleByAdamState.nu``, ADOPT a normalized
first moment (unchanged) in its ``mu``, and a ``trace`` chained after ``scale_by_adam`` accumulates
normalized updates (unchanged). :func:`check_rescaling_law` therefore runs the optimizer once on probe
parameters and on their rescaling, and the wrappers call it at ``init``: an optimizer whose state the
table would carry wrongly is an error there, not a silently inconsistent state.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

__all__ = ["StateRule", "check_rescaling_law", "register_state_rule", "rescale_state", "saturating_divide"]

PyTree = Any


class StateRule(NamedTuple):
    """Which fields of a NamedTuple optimizer state hold what.

    Attributes:
      first: fields shaped like the params that transform like gradients (``x / m``).
      second: fields shaped like the params that transform like squared gradients (``x / m**2``).
      nested: fields holding an inner optimizer state (recursed into with the same multipliers).
    """

    first: tuple[str, ...] = ()
    second: tuple[str, ...] = ()
    nested: tuple[str, ...] = ()


_RULES: dict[type, StateRule] = {
    optax.EmptyState: StateRule(),
    optax.ScaleByScheduleState: StateRule(),
    optax.AddNoiseState: StateRule(),
    optax.TraceState: StateRule(first=("trace",)),
    optax.EmaState: StateRule(first=("ema",)),
    optax.ScaleByAdamState: StateRule(first=("mu",), second=("nu",)),
    optax.ScaleByAmsgradState: StateRule(first=("mu",), second=("nu", "nu_max")),
    optax.ScaleByBeliefState: StateRule(first=("mu",), second=("nu",)),
    optax.ScaleByRmsState: StateRule(second=("nu",)),
    optax.ScaleByRssState: StateRule(second=("sum_of_squares",)),
    optax.ScaleByRStdDevState: StateRule(first=("mu",), second=("nu",)),
    optax.ScaleByLionState: StateRule(first=("mu",)),
    optax.InjectHyperparamsState: StateRule(nested=("inner_state",)),
    optax.InjectStatefulHyperparamsState: StateRule(nested=("inner_state",)),
    optax.MaskedState: StateRule(nested=("inner_state",)),
    optax.ConditionallyTransformState: StateRule(nested=("inner_state",)),
    optax.ConditionallyMaskState: StateRule(nested=("inner_state",)),
    optax.PartitionState: StateRule(nested=("inner_states",)),
}


def register_state_rule(
    state_type: type,
    *,
    first: tuple[str, ...] = (),
    second: tuple[str, ...] = (),
    nested: tuple[str, ...] = (),
) -> None:
    """Teach :func:`rescale_state` how a custom optimizer state transforms.

    Args:
      state_type: the NamedTuple class of the state.
      first: params-shaped fields that transform like gradients.
      second: params-shaped fields that transform like squared gradients.
      nested: fields holding an inner optax state.
    """
    unknown = set(first + second + nested) - set(getattr(state_type, "_fields", ()))
    if unknown:
        raise ValueError(f"register_state_rule: {state_type.__name__} has no fields {sorted(unknown)}")
    _RULES[state_type] = StateRule(first, second, nested)


def _is_masked(x: Any) -> bool:
    return isinstance(x, optax.MaskedNode)


def _divide(field: PyTree, multipliers: PyTree, power: int) -> PyTree:
    def leaf(state_leaf, multiplier):
        if multiplier is None or _is_masked(state_leaf):
            return state_leaf
        return saturating_divide(state_leaf, multiplier, power)

    return jax.tree.map(leaf, field, multipliers, is_leaf=lambda x: x is None or _is_masked(x))


def saturating_divide(x: jax.Array, m: jax.Array, power: int = 1) -> jax.Array:
    """``x / m**power`` computed in at least float32 and returned in ``x``'s dtype, saturated at that
    dtype's largest finite value: a float16 Adam ``nu`` divided by ``m**2 = 1e-4`` stays finite
    instead of overflowing to ``inf`` (and then NaN updates); an ``inf`` state divided by an ``m**2`` that
    overflows stays ``inf`` (saturated), not ``inf / inf``. NaN stays NaN."""
    dtype = jnp.result_type(x)
    wide = jnp.promote_types(jnp.promote_types(dtype, jnp.float32), jnp.result_type(m))
    m, x_wide = jnp.asarray(m, wide), jnp.asarray(x, wide)
    if power == 1:
        out = x_wide / m
    else:  # where m^2 leaves the dtype's range (|w| ~ 1e-19 or 1e19 in float32), by 1/m twice: no inf / inf
        square = jnp.square(m)
        in_range = jnp.isfinite(square) & (square > jnp.finfo(wide).tiny)
        reciprocal = 1 / m
        out = jnp.where(in_range, x_wide / jnp.where(in_range, square, 1), x_wide * reciprocal * reciprocal)
    if jnp.issubdtype(dtype, jnp.floating):
        big = jnp.finfo(dtype).max
        out = jnp.clip(out, -big, big)
    return out.astype(dtype)


def _has_arrays(node: Any) -> bool:
    return any(jnp.ndim(leaf) > 0 for leaf in jax.tree.leaves(node))


def rescale_state(state: PyTree, multipliers: PyTree) -> PyTree:
    """Transform an optax state for the parameter rescaling ``w' = w * multipliers``.

    Gradient-like fields become ``x / m``, squared-gradient fields ``x / m**2`` (Stock et al. 2019,
    Eq. 10); the product ``first_moment * w`` is invariant. Chains (tuples), ``inject_hyperparams``,
    ``masked`` and ``conditionally_*`` states are recursed into.

    Args:
      state: an optax state, e.g. ``tx.init(params)``.
      multipliers: a tree with the params' structure whose leaves broadcast against the params leaves
        (a per-unit vector of shape ``(out,)`` for a ``(in, out)`` kernel, a full array, or ``None``
        for a leaf left unchanged).

    Returns:
      The state with the same structure and dtypes. Each field is divided in at least float32 and
      saturated at its dtype's largest finite value (:func:`saturating_divide`), so a float16 state
      stays finite (an entry that would overflow is clipped to the largest float16, about 65504).

    Raises:
      TypeError: a state node that holds arrays and has no registered rule.
    """
    if isinstance(state, tuple) and not hasattr(state, "_fields"):
        return tuple(rescale_state(inner, multipliers) for inner in state)
    if isinstance(state, list):
        return [rescale_state(inner, multipliers) for inner in state]
    if isinstance(state, dict):  # optax.partition / multi_transform: one state per label
        return {key: rescale_state(inner, multipliers) for key, inner in state.items()}
    rule = _RULES.get(type(state))
    if rule is None:
        if not _has_arrays(state):  # counters, RNG keys, empty states
            return state
        raise TypeError(
            f"rescale_state: no rule for optimizer state {type(state).__name__} with fields "
            f"{getattr(state, '_fields', '?')}; register one with "
            "jaxnorm.optim.state.register_state_rule(type, first=..., second=..., nested=...)"
        )
    updates: dict[str, PyTree] = {}
    for name in rule.first:
        updates[name] = _divide(getattr(state, name), multipliers, 1)
    for name in rule.second:
        updates[name] = _divide(getattr(state, name), multipliers, 2)
    for name in rule.nested:
        updates[name] = rescale_state(getattr(state, name), multipliers)
    return state._replace(**updates) if updates else state


def check_rescaling_law(tx: optax.GradientTransformation, params: PyTree, fn_name: str) -> None:
    """Raises ``ValueError`` where :func:`rescale_state` would not carry ``tx``'s state across a
    rescaling ``w' = w * m`` (Eq. 10): two steps of ``tx`` on probe parameters of ``params``' structure
    and ranks (each axis at most 3 long: the rules are per entry) with gradients ``g``, their state
    rescaled by :func:`rescale_state`, must be the state of the same two steps on ``w * m`` with
    ``g / m``. ``m`` is 1/2 or 2 per entry (exact in every float dtype);
    the gradients are small (global norm 1e-3), so that clipping and other non-homogeneous steps of
    ordinary gradients stay out of the probe, and the parameters far smaller (1e-9 per entry), so that
    weight decay added to the gradient does too (SGD with L2 decay keeps the paper's momentum rule).
    Runs eagerly, also inside ``jit`` (the probe's values are constants); an ``update`` that needs a
    loss ``value`` (``optax.contrib.reduce_on_plateau``, ``momo``) is given 1.0 (:func:`_probe_arguments`)."""
    flat, treedef = jax.tree.flatten(params)
    if not flat:
        return
    rng = np.random.default_rng(0)
    floating = [jnp.issubdtype(jnp.result_type(leaf), jnp.inexact) for leaf in flat]
    size = max(sum(int(np.prod([min(d, 3) for d in np.shape(leaf)])) for leaf in flat), 1)

    def draw(scale: float, values=None) -> PyTree:
        leaves = []
        for leaf, is_float in zip(flat, floating, strict=True):
            # each axis at most 3 long: the rank (which masks may read) kept, the probe cheap; half
            # precision probed in float32 (the rules are algebra; its small gradients would be subnormal)
            shape, dtype = tuple(min(d, 3) for d in np.shape(leaf)), jnp.result_type(leaf)
            dtype = jnp.promote_types(dtype, jnp.float32) if is_float else dtype
            if not is_float:
                leaves.append(jnp.zeros(shape, dtype))
            else:
                drawn = rng.normal(size=shape) * scale if values is None else values(shape)
                leaves.append(jnp.asarray(drawn, dtype))
        return treedef.unflatten(leaves)

    with jax.ensure_compile_time_eval():
        # tiny params: weight decay added to the gradient (wd * w, degree +1, which Eq. 10 as the
        # papers apply it leaves to the momentum's rule) stays below the probe's tolerance
        w = draw(1e-9)
        m = draw(1.0, lambda shape: np.where(rng.random(shape) < 0.5, 0.5, 2.0))
        m = jax.tree.map(lambda leaf, f: leaf if f else None, m, treedef.unflatten(floating))
        grads = [draw(1e-3 / np.sqrt(size)) for _ in range(2)]
        scaled = lambda tree, op: jax.tree.map(lambda a, b: a if b is None else op(a, b), tree, m,
                                               is_leaf=lambda x: x is None)
        state, state_scaled = tx.init(w), tx.init(scaled(w, jnp.multiply))
        extra_args = _probe_arguments(tx, grads[0], state, w, fn_name)
        update = functools.partial(optax.with_extra_args_support(tx).update, **extra_args)
        for g in grads:
            _, state = update(g, state, w)
            _, state_scaled = update(scaled(g, jnp.divide), state_scaled, scaled(w, jnp.multiply))
        carried = rescale_state(state, m)
    for (path, got), want in zip(
        jax.tree_util.tree_flatten_with_path(carried)[0], jax.tree.leaves(state_scaled), strict=True
    ):
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        tolerance = 1e-3 * np.max(np.abs(want), initial=0) + 1e-30
        if got.shape != want.shape or np.any(np.abs(got - want) > tolerance):
            raise ValueError(
                f"{fn_name}: the optimizer's state{jax.tree_util.keystr(path)} does not transform as "
                "rescale_state's rule for its type says when the parameters are rescaled (Eq. 10 of "
                "Stock et al. 2019; e.g. optax.adamax's nu, ADOPT's mu, a trace after scale_by_adam), "
                "so it would be left inconsistent; use an optimizer whose state rescale_state knows "
                "(sgd, momentum, adam(w), amsgrad, rmsprop, lion, ...; adagrad's initial accumulator "
                "does not scale), register a rule for a custom state "
                "(jaxnorm.optim.state.register_state_rule), or do not rescale the state"
            )


def _probe_arguments(
    tx: optax.GradientTransformation, grads: PyTree, state: Any, params: PyTree, fn_name: str
) -> dict[str, Any]:
    """The extra arguments :func:`check_rescaling_law` passes to ``tx.update`` (tried on its first
    probe step): none, or a loss ``value`` of 1.0 where ``update`` needs one (optax's name for it). An
    ``update`` that needs yet others raises ``TypeError``: its state would go unchecked (it was skipped,
    and an adamax under ``reduce_on_plateau`` was carried wrongly without a word)."""
    update = optax.with_extra_args_support(tx).update
    try:
        update(grads, state, params)
        return {}
    except TypeError as first:
        value = {"value": jnp.ones((), jnp.float32)}
        try:
            update(grads, state, params, **value)
        except TypeError as err:
            raise TypeError(
                f"{fn_name}: the optimizer's update fails on probe parameters, without and with a loss "
                f"value ({first}; {err}), so its state's rule under rescaling (Eq. 10 of Stock et al. "
                "2019) cannot be checked; use an optimizer whose update takes (updates, state, params) "
                "and at most value="
            ) from err
        return value
