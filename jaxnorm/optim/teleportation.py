"""Symmetry teleportation as an optax wrapper: every ``every`` updates, teleport, then step.

On a teleporting update the wrapper moves the params along the spec's rescaling symmetries to
``T(w) = w * m`` (:func:`jaxnorm.enorm.teleport`: projected gradient ascent on the log-scales of
the squared gradient norm, or of a callable objective; Zhao et al., NeurIPS 2022, Alg. 1), then
lets ``inner`` step from there. Nothing is recomputed: because the loss is invariant under ``T``,
the gradient at the teleported point is ``g / m`` (Stock et al. 2019, Sec. 3.6 Eq. 10), where ``g``
is the incoming gradient, and ``inner``'s state is transported to the teleported params with the
one table every rescaling wrapper uses (:func:`jaxnorm.optim.state.rescale_state`: first moments
``x / m``, second moments ``x / m**2``), exactly as :func:`jaxnorm.optim.enorm` does. The default
objective ``||grad L(T(w))||^2 = sum ||g / m||^2`` is also a closed form in ``g``, so a teleport
costs ``steps`` elementwise passes over the params and no extra forward or backward pass.

The design, against a ``loss_fn`` argument: the wrapper reads the batch's gradient from its own
input (``updates``), so it must see the raw loss gradient, i.e. wrap the whole optimizer
(``teleportation(optax.chain(clip, adam))``, not ``optax.chain(clip, teleportation(adam))``). A
callable objective needs the batch: pass it at each update as the extra argument ``batch=``
(``tx.update(grads, state, params, batch=batch)``; ``nnx.Optimizer.update(model, grads,
batch=batch)`` forwards it; ``optax.chain`` forwards it to every element).

References:
  Zhao, Dehmamy, Walters, Yu. Symmetry teleportation for accelerated optimization. NeurIPS 2022.
  Stock, Defossez, Gribonval, Jegou, Usunier. Equi-normalization of neural networks. ICLR 2019.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxnorm.enorm.balance import compute_dtype, multipliers, plan_spec
from jaxnorm.enorm.spec import ChainMemory, Junction
from jaxnorm.enorm.teleport import MAX_TELEPORT_SCALE, check_teleport_arguments, teleport
from jaxnorm.enorm.trees import pure_params
from jaxnorm.optim import landing
from jaxnorm.optim import state as state_lib
from jaxnorm.optim.arguments import check_static
from jaxnorm.optim.rescaling import check_inner, check_steps, check_updates, pure_transform

__all__ = ["TeleportationState", "teleportation"]

PyTree = Any


class TeleportationState(NamedTuple):
    """State of :func:`teleportation`.

    Attributes:
      count: number of updates so far (int32 scalar).
      inner_state: the wrapped optimizer's state (transported at every teleport).
      junction_scales: per junction the ``(n,)`` scales of the last teleport (producers were
        multiplied, consumers divided by them; ones before the first teleport).
      objective: ``(before, after)`` of the last teleport's objective (zeros before the first).
    """

    count: jax.Array
    inner_state: optax.OptState
    junction_scales: tuple[jax.Array, ...]
    objective: jax.Array


state_lib.register_state_rule(TeleportationState, nested=("inner_state",))


def teleportation(
    inner: optax.GradientTransformation,
    spec: Sequence[Junction] | None = None,
    *,
    every: int,
    until: int | None = None,
    steps: int = 10,
    step_size: float = 0.1,
    objective: str | Callable[[PyTree, Any], jax.Array] = "grad_norm",
    max_scale: float | None = MAX_TELEPORT_SCALE,
    power_of_two: bool | None = None,
) -> optax.GradientTransformationExtraArgs:
    """Wrap ``inner``: on updates number ``every``, ``2 * every``, ... (up to ``until``) teleport,
    then step.

    A teleporting update, with ``g`` the incoming gradient at ``w``:

    1. ``T(w) = w * m``, ``m = multipliers(w, spec, s)`` with ``s`` from
       ``jaxnorm.enorm.teleport(w, None, batch, spec, grads=g, ...)``;
    2. ``inner``'s state transported by :func:`jaxnorm.optim.state.rescale_state` with ``m``;
    3. ``inner`` applied to the gradient at the teleported point, ``g / m``, at ``T(w)``;

    and the returned update lands on ``T(w) + inner_update`` (computed in at least float32, so
    that ``optax.apply_updates`` reaches it in every dtype). The other updates are ``inner``'s.

    Args:
      inner: the optimizer, e.g. ``optax.sgd(0.1, momentum=0.9)``, ``optax.adam(1e-3)``, a chain.
        Its input must be the raw loss gradient (wrap the whole optimizer).
      spec: junctions (:func:`jaxnorm.enorm.discover`); ``None`` infers a chain
        (:func:`jaxnorm.enorm.chain`, ReLU-like activations assumed).
      every: teleport on every ``every``-th update (an integer >= 1; required: each teleport
        moves the scales by up to ``max_scale``, and these compound, so how often is a choice).
      until: ``None`` or an integer >= 1: teleport only on updates ``<= until`` (Zhao et al.
        teleport early in training).
      steps, step_size, objective, max_scale, power_of_two: as in :func:`jaxnorm.enorm.teleport`;
        a callable ``objective(params, batch)`` needs ``batch=`` at each update.

    Returns:
      An ``optax.GradientTransformationExtraArgs`` whose ``update`` requires ``params`` (and
      ``batch=`` for a callable objective; other extra arguments are passed on to ``inner``).
      Works on params dicts, ``FrozenDict`` and ``nnx.State`` (``nnx.Optimizer(model, tx,
      wrt=nnx.Param)``), in ``optax.chain`` as its first element and under ``jax.jit``.

    Raises:
      TypeError: ``inner`` not an optax transformation, ``every`` not an integer; (at ``init``) a
        state of ``inner`` that :func:`jaxnorm.optim.state.rescale_state` does not know, a
        non-floating params leaf.
      ValueError: (at construction) ``every`` or ``until`` < 1, ``steps`` < 0, ``step_size`` <= 0, an unknown
        ``objective``, ``max_scale`` <= 1, a non-bool ``power_of_two``; (at ``init``) a spec
        that does not fit the params; (at ``update``) no params, updates of another structure,
        no ``batch`` for a callable objective.

    References:
      Zhao et al., NeurIPS 2022, Alg. 1; Stock et al. 2019, Sec. 3.6 Eq. 10.
    """
    what = "teleportation"
    check_inner(inner, what)
    check_static(what, steps=steps, max_scale=max_scale, power_of_two=power_of_two)
    check_steps(every, "every", what)
    if until is not None:
        check_steps(until, "until", what)
    max_scale = check_teleport_arguments(steps, step_size, objective, max_scale, power_of_two, what)
    inner = optax.with_extra_args_support(inner)
    named = isinstance(objective, str)

    remembered_chain = ChainMemory()  # the call order of init's params, for update under jit

    def junctions(params: PyTree) -> Sequence[Junction]:
        return remembered_chain(params) if spec is None else spec

    def ones(params: PyTree) -> tuple[jax.Array, ...]:
        bare = pure_params(params)
        leaves = jax.tree.leaves(bare)
        plans = plan_spec(bare, junctions(bare), what)
        return tuple(
            jnp.ones(
                (plan.units,),
                jnp.result_type(*[compute_dtype(leaves[s.leaf]) for s in (*plan.producers, *plan.consumers)]),
            )
            for plan in plans
        )

    def objective_dtype(params: PyTree) -> jnp.dtype:
        return jnp.result_type(*[compute_dtype(jnp.asarray(x)) for x in jax.tree.leaves(params)])

    def init_fn(params: PyTree) -> TeleportationState:
        for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
            if not jnp.issubdtype(jnp.result_type(leaf), jnp.inexact):
                raise TypeError(
                    f"{what}: params{jax.tree_util.keystr(path)} has dtype {jnp.result_type(leaf)}; "
                    "teleportation rescales floating params only"
                )
        scales = ones(params)  # validates the spec against the params
        inner_state = inner.init(params)
        state_lib.rescale_state(inner_state, jax.tree.map(lambda _: None, params))  # unknown: raise
        state_lib.check_rescaling_law(inner, params, what)  # known types holding other quantities
        return TeleportationState(
            count=jnp.zeros([], jnp.int32),
            inner_state=inner_state,
            junction_scales=scales,
            objective=jnp.zeros((2,), objective_dtype(params)),
        )

    def update_fn(updates: PyTree, state: TeleportationState, params: PyTree | None = None, **extra_args):
        check_updates(updates, params, what)
        batch = extra_args.get("batch")
        if not named and batch is None:
            raise ValueError(
                f"{what}: a callable objective needs the batch: call update(updates, state, params, "
                "batch=batch) (nnx.Optimizer.update(model, grads, batch=batch))"
            )
        the_spec = junctions(params)
        count = optax.safe_int32_increment(state.count)
        fired = count % every == 0
        if until is not None:
            fired = fired & (count <= until)
        always = every == 1 and until is None

        def go(_):
            moved, scales, (before, after) = teleport(
                params,
                None,
                batch,
                the_spec,
                steps=steps,
                step_size=step_size,
                objective=objective,
                max_scale=max_scale,
                power_of_two=power_of_two,
                grads=updates if named else None,
                return_objective=True,
            )
            values = jnp.stack([before, after]).astype(state.objective.dtype)
            return (
                moved,
                tuple(s.astype(o.dtype) for s, o in zip(scales, state.junction_scales, strict=True)),
                values,
            )

        def stay(_):
            return params, tuple(jnp.ones_like(o) for o in state.junction_scales), state.objective

        moved, scales, values = go(None) if always else jax.lax.cond(fired, go, stay, None)
        factors = multipliers(params, the_spec, scales)
        grads = jax.tree.map(
            lambda g, m: g if m is None else state_lib.saturating_divide(g, m),
            updates,
            factors,
            is_leaf=lambda x: x is None,
        )
        inner_state = state_lib.rescale_state(state.inner_state, factors)
        inner_updates, inner_state = inner.update(grads, inner_state, moved, **extra_args)

        def leaf_update(w, u, t, m):
            if m is None:  # outside the spec: the inner update as it is
                return u
            target = landing.to_target(w, u, landing.stepped(t, u))
            return target if always else jnp.where(fired, target, u.astype(target.dtype))

        new_updates = jax.tree.map(
            leaf_update, params, inner_updates, moved, factors, is_leaf=lambda x: x is None
        )
        new_state = TeleportationState(
            count=count,
            inner_state=inner_state,
            junction_scales=scales
            if always
            else tuple(jnp.where(fired, s, o) for s, o in zip(scales, state.junction_scales, strict=True)),
            objective=values,
        )
        return new_updates, new_state

    return pure_transform(init_fn, update_fn)
