"""Symmetry teleportation: move along ENorm's rescaling symmetries to maximise another objective.

A junction of n hidden units with log-scales ``u`` (scales ``s = exp(u) > 0``) acts on the params
by ``T_u``: its producers (incoming weights, their biases) are multiplied by ``s_j``, its consumers
(outgoing weights) divided by ``s_j``. Where the junction is a symmetry (ReLU-like activations, as
:func:`jaxnorm.enorm.discover` certifies), ``L(T_u(w)) = L(w)`` for every batch (Stock et al. 2019,
Sec. 3.1 Eq. 2). Teleportation (Zhao, Dehmamy, Walters, Yu, *Symmetry teleportation for
accelerated optimization*, NeurIPS 2022, Sec. 3 and Alg. 1; Zhao, Gower, Walters, Yu, *Improving
convergence and generalization using parameter symmetries*, ICLR 2024, Sec. 3) moves along this
orbit, at an unchanged loss, to a point where another objective is larger; by default the squared
gradient norm, so that the next descent step goes further (Zhao et al. 2022, Sec. 4):

    J(u) = ||grad L(T_u(w))||^2 = sum_k ||g_k / m_k(u)||^2,        g = grad L(w),

with ``m(u) = multipliers(w, spec, exp(u))`` ENorm's per-leaf factor (``T_u(w) = w * m(u)``).
Because ``L o T_u = L`` for all ``w``, the gradient at the teleported point is ``g / m`` (Stock et
al. 2019, Sec. 3.6 Eq. 10), so ``J`` and its gradient in ``u`` come from one backward pass at
``w`` (no second-order differentiation through the network). ``u`` follows projected gradient
ascent from ``u_0 = 0``,

    u_{t+1} = clip(u_t + step_size * grad J(u_t), -log max_scale, log max_scale),

for ``steps`` steps (Zhao et al. 2022, Alg. 1: gradient ascent on the group element, then
``w <- g . w``), and the result is the iterate of largest finite ``J`` among ``u_0, ..., u_steps``
(so teleportation never decreases ``J``). ``J`` is convex in ``u`` and unbounded above on a ReLU
network (shrinking one layer and growing the next inflates the gradient without limit): the box
``max_scale`` is what keeps the teleported point, and the optimizer that continues from it, in a
sane range.

Numerics: ``u``, ``J`` and the scales are computed in float32 or the params' wider dtype; junctions
with a leaf narrower than float32 (bfloat16, float16) evaluate ``J`` and rescale at the nearest
power of two (``2^round(u / log 2)``, the gradient of ``J`` there moves ``u``), so that their
rescaling is exact and the loss does not move by rounding, as :func:`jaxnorm.enorm.enorm_balance`
does; a non-finite ``J`` or gradient is never stepped to or returned, and a teleport that would
overflow a params entry (possible only with ``max_scale=None``) is not applied.

References:
  Zhao, Dehmamy, Walters, Yu. Symmetry teleportation for accelerated optimization. NeurIPS 2022.
  Zhao, Gower, Walters, Yu. Improving convergence and generalization using parameter symmetries.
  ICLR 2024.
  Stock, Defossez, Gribonval, Jegou, Usunier. Equi-normalization of neural networks. ICLR 2019.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxnorm.enorm.balance import check_max_scale, compute_dtype, flatten_params, multipliers, plan_spec
from jaxnorm.enorm.spec import Junction, chain
from jaxnorm.enorm.trees import split_params

__all__ = [
    "MAX_TELEPORT_SCALE",
    "OBJECTIVES",
    "check_teleport_arguments",
    "teleport",
    "teleport_objective",
]

PyTree = Any
Objective = str | Callable[[PyTree, Any], jax.Array]

# The named objectives; a callable ``objective(params, batch) -> scalar`` is also accepted.
OBJECTIVES = ("grad_norm",)

# Default bound on how far one teleport moves a junction: scales in [1/16, 16].
MAX_TELEPORT_SCALE = 16.0


def check_teleport_arguments(
    steps: Any, step_size: Any, objective: Any, max_scale: Any, power_of_two: Any, what: str
) -> float | None:
    """Validate teleportation's options, raising an error that names the argument; returns
    ``max_scale`` as :func:`jaxnorm.enorm.balance.check_max_scale` normalises it.

    ``steps``: a Python / NumPy integer >= 0; ``step_size``: a finite number > 0 (a traced scalar
    is accepted unchecked); ``objective``: one of :data:`OBJECTIVES` or a callable;
    ``max_scale``: ``None`` or a number > 1; ``power_of_two``: ``None``, True or False.
    """
    if isinstance(steps, bool | np.bool_) or not isinstance(steps, int | np.integer):
        raise ValueError(f"{what}: steps must be an integer >= 0, got {type(steps).__name__} {steps!r}")
    if steps < 0:
        raise ValueError(f"{what}: steps must be >= 0, got {steps}")
    if not isinstance(step_size, jax.core.Tracer):
        ok = not isinstance(step_size, bool | str) and np.ndim(step_size) == 0
        try:
            value = float(step_size) if ok else math.nan
        except (TypeError, ValueError):
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{what}: step_size must be a finite number > 0, got {step_size!r}")
    elif np.ndim(step_size) != 0:
        raise ValueError(f"{what}: step_size must be a scalar, got shape {np.shape(step_size)}")
    if not (callable(objective) or (isinstance(objective, str) and objective in OBJECTIVES)):
        raise ValueError(
            f"{what}: objective must be one of {OBJECTIVES} or a callable objective(params, batch) "
            f"-> scalar to maximise, got {objective!r}"
        )
    if power_of_two is not None and not isinstance(power_of_two, bool | np.bool_):
        raise ValueError(f"{what}: power_of_two must be None, True or False, got {power_of_two!r}")
    return check_max_scale(max_scale, what)


def _objective_fn(
    inner: PyTree,
    rebuild: Callable,
    spec: Sequence[Junction],
    loss_fn: Callable | None,
    batch: Any,
    objective: Objective,
    grads: PyTree | None,
    what: str,
) -> Callable[[tuple[jax.Array, ...]], jax.Array]:
    """``J(log_scales)``: the objective at ``T_u(params)``, differentiable in ``u``."""
    leaves, treedef, _ = flatten_params(inner)

    def factors(log_scales: Sequence[jax.Array]) -> list:
        tree = multipliers(inner, spec, [jnp.exp(u) for u in log_scales])
        return treedef.flatten_up_to(tree)

    if callable(objective):

        def moved_objective(log_scales):
            moved = [
                w if m is None else (w.astype(compute_dtype(w)) * m).astype(w.dtype)
                for w, m in zip(leaves, factors(log_scales), strict=True)
            ]
            value = objective(rebuild(jax.tree_util.tree_unflatten(treedef, moved)), batch)
            if jnp.ndim(value) != 0:
                raise ValueError(f"{what}: objective must return a scalar, got shape {jnp.shape(value)}")
            return value

        return moved_objective

    if grads is None:
        if not callable(loss_fn):
            raise ValueError(
                f"{what}: loss_fn must be a callable loss_fn(params, batch) -> scalar (or pass grads=), "
                f"got {loss_fn!r}"
            )
        grads = jax.grad(lambda p: loss_fn(rebuild(p), batch), allow_int=True)(inner)
    else:
        grads = split_params(grads)[0]
    try:
        flat_grads = treedef.flatten_up_to(grads)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{what}: grads must have the structure of params {treedef}") from err
    flat_grads = [None if jnp.result_type(g) == jax.dtypes.float0 else jnp.asarray(g) for g in flat_grads]

    def grad_norm(log_scales):
        total = None
        for g, m in zip(flat_grads, factors(log_scales), strict=True):
            if g is None:
                continue
            a = g.astype(compute_dtype(g))
            if m is not None:
                a = a / m
            term = jnp.sum(jnp.square(a))
            total = term if total is None else total + term
        return jnp.zeros((), jnp.float32) if total is None else total

    return grad_norm


def teleport_objective(
    params: PyTree,
    loss_fn: Callable | None,
    batch: Any,
    log_scales: Sequence[jax.Array],
    spec: Sequence[Junction] | None = None,
    *,
    objective: Objective = "grad_norm",
    grads: PyTree | None = None,
) -> jax.Array:
    """``J(u)``: the objective :func:`teleport` maximises, at ``T_u(params)``; differentiable in
    ``log_scales``.

    For ``objective="grad_norm"``: ``sum_k ||g_k / m_k(u)||^2`` with ``g = grad loss_fn(params,
    batch)`` (or the given ``grads``) and ``m(u) = multipliers(params, spec, exp(u))``, which equals
    ``||grad L(T_u(params))||^2`` where the spec is a symmetry of the loss (Stock et al. 2019,
    Eq. 10). For a callable, ``objective(T_u(params), batch)``.

    Args:
      params, loss_fn, batch, spec, objective, grads: as in :func:`teleport`.
      log_scales: one ``(n,)`` array per junction of the spec.
    """
    what = "teleport_objective"
    check_teleport_arguments(0, 1.0, objective, None, None, what)
    inner, rebuild = split_params(params)
    if spec is None:
        spec = chain(inner)
    plans = plan_spec(inner, spec, what)
    if len(log_scales) != len(plans):
        raise ValueError(f"{what}: got {len(log_scales)} log_scales for {len(plans)} junctions")
    for k, (u, plan) in enumerate(zip(log_scales, plans, strict=True)):
        if jnp.shape(u) != (plan.units,):
            raise ValueError(f"{what}: log_scales[{k}] has shape {jnp.shape(u)}, expected ({plan.units},)")
    fn = _objective_fn(inner, rebuild, spec, loss_fn, batch, objective, grads, what)
    return fn(tuple(log_scales))


def _exact(leaves: list, plans: Sequence, power_of_two: bool | None) -> tuple[bool, ...]:
    if power_of_two is not None:
        return (bool(power_of_two),) * len(plans)
    narrow = lambda s: jnp.finfo(leaves[s.leaf].dtype).bits < 32
    return tuple(any(narrow(s) for s in (*plan.producers, *plan.consumers)) for plan in plans)


def _ascend(
    fn: Callable,
    zeros: tuple[jax.Array, ...],
    exact: tuple[bool, ...],
    steps: int,
    step_size: Any,
    max_scale: float | None,
) -> tuple[tuple[jax.Array, ...], jax.Array, jax.Array]:
    """Projected gradient ascent on ``fn``; ``(best u, J(0), J(best u))``."""
    log2 = math.log(2.0)
    bounds = tuple(
        None if max_scale is None else (math.floor(math.log2(max_scale)) * log2 if e else math.log(max_scale))
        for e in exact
    )

    def point(u):  # where J is evaluated: powers of two on exact junctions
        return tuple(jnp.round(x / log2) * log2 if e else x for x, e in zip(u, exact, strict=True))

    value_and_grad = jax.value_and_grad(fn)

    def body(i, carry):
        u, best_u, best_v, first = carry
        v = point(u)
        value, grad = value_and_grad(v)
        better = jnp.isfinite(value) & (value > best_v)
        best_u = tuple(jnp.where(better, x, b) for x, b in zip(v, best_u, strict=True))
        best_v = jnp.where(better, value, best_v)
        first = jnp.where(i == 0, value, first)
        finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(g)) for g in grad]))
        stepped = []
        for x, g, bound in zip(u, grad, bounds, strict=True):
            y = x + jnp.asarray(step_size, x.dtype) * g
            if bound is not None:
                y = jnp.clip(y, -bound, bound)
            stepped.append(jnp.where(finite, y, x))
        return tuple(stepped), best_u, best_v, first

    value0 = jax.eval_shape(fn, zeros)
    start = (zeros, zeros, jnp.full((), -jnp.inf, value0.dtype), jnp.zeros((), value0.dtype))
    u, best_u, best_v, first = jax.lax.fori_loop(0, steps, body, start)
    last_point = point(u)
    last = fn(last_point)
    if steps == 0:
        first = last
    better = jnp.isfinite(last) & (last > best_v)
    best_u = tuple(jnp.where(better, x, b) for x, b in zip(last_point, best_u, strict=True))
    best_v = jnp.where(better, last, best_v)
    after = jnp.where(jnp.isfinite(best_v), best_v, first)
    return best_u, first, after


def teleport(
    params: PyTree,
    loss_fn: Callable | None,
    batch: Any,
    spec: Sequence[Junction] | None = None,
    *,
    steps: int = 10,
    step_size: float = 0.1,
    objective: Objective = "grad_norm",
    max_scale: float | None = MAX_TELEPORT_SCALE,
    power_of_two: bool | None = None,
    grads: PyTree | None = None,
    return_objective: bool = False,
) -> tuple[PyTree, tuple[jax.Array, ...]] | tuple[PyTree, tuple[jax.Array, ...], tuple]:
    """Teleport ``params`` along the spec's rescaling symmetries to maximise ``objective``.

    Runs ``steps`` steps of projected gradient ascent on the per-junction log-scales ``u``
    (see the module docstring: ``u <- clip(u + step_size * grad J(u), +-log max_scale)``, Zhao et
    al. 2022, Alg. 1) and applies the best iterate: producers multiplied and consumers divided by
    ``s = exp(u)``. The loss is unchanged (where the spec is a symmetry of ``loss_fn``) and ``J``
    is not decreased. Pure; ``jax.jit``-able with ``loss_fn``, ``spec`` and the options static.

    Args:
      params: a params tree, a Flax variables dict (only ``"params"`` moves), a ``FrozenDict`` or
        an ``nnx.State``; ``loss_fn`` receives the same kind of container.
      loss_fn: ``loss_fn(params, batch) -> scalar``; used by ``"grad_norm"`` unless ``grads`` is
        given (then it may be ``None``), not by a callable objective.
      batch: the data ``loss_fn`` (or the callable objective) is evaluated on.
      spec: junctions, e.g. ``jaxnorm.enorm.discover(apply_fn, params, x)`` (which certifies that
        each junction is a symmetry); ``None`` infers a chain with :func:`jaxnorm.enorm.chain` and,
        like :func:`jaxnorm.enorm.enorm_balance`'s bare call, assumes ReLU-like activations.
      steps: number of ascent steps, an integer >= 0 (0: the params unchanged, scales 1).
      step_size: the ascent step on the log-scales, a number > 0. ``J`` has the scale of the
        squared gradient, so the step that moves ``u`` by O(0.1) depends on the loss.
      objective: ``"grad_norm"`` (``||grad L||^2``, the default of Zhao et al. 2022) or a callable
        ``objective(params, batch) -> scalar`` evaluated at the teleported params and
        differentiated by autodiff (e.g. a sharpness proxy, Zhao et al. 2024).
      max_scale: ``None`` (unbounded) or a number > 1: every scale stays in
        ``[1 / max_scale, max_scale]`` (a power of two below it on exact junctions).
      power_of_two: rescale by powers of two (exact in every binary float format); ``None``:
        only junctions with a leaf narrower than float32.
      grads: the gradient of ``loss_fn`` at ``params`` on ``batch`` if already computed (the
        structure of the bare params): ``"grad_norm"`` then needs no backward pass at all.
      return_objective: also return ``(J(0), J(u))``, the objective before and after.

    Returns:
      ``(teleported_params, scales)``, plus ``(before, after)`` with ``return_objective``.
      ``scales`` holds one ``(n,)`` array per junction such that producers were multiplied and
      consumers divided by it: ``jaxnorm.enorm.multipliers(params, spec, scales)`` is the per-leaf
      factor ``m``, and ``jaxnorm.optim.rescale_state(opt_state, m)`` transports an optimizer's
      state to the teleported params (Eq. 10), as :func:`jaxnorm.optim.enorm` does.

    Raises:
      ValueError, naming the argument: ``steps`` not an integer >= 0, ``step_size`` not a finite
        number > 0, an unknown ``objective``, ``max_scale`` not ``None`` or > 1, a non-bool
        ``power_of_two`` or ``return_objective``, ``loss_fn`` not callable where it is needed, a
        spec that does not fit the params (see :func:`jaxnorm.enorm.enorm_balance`), ``grads`` of
        another structure, a callable objective returning a non-scalar.

    References:
      Zhao et al., NeurIPS 2022, Sec. 3-4 and Alg. 1; Zhao et al., ICLR 2024, Sec. 3;
      Stock et al. 2019, Sec. 3.1 Eq. 2 and Sec. 3.6 Eq. 10.
    """
    what = "teleport"
    max_scale = check_teleport_arguments(steps, step_size, objective, max_scale, power_of_two, what)
    if not isinstance(return_objective, bool | np.bool_):
        raise ValueError(f"{what}: return_objective must be True or False, got {return_objective!r}")
    inner, rebuild = split_params(params)
    if spec is None:
        spec = chain(inner)
    plans = plan_spec(inner, spec, what)
    leaves, treedef, _ = flatten_params(inner)
    leaves = [jnp.asarray(x) for x in leaves]
    fn = _objective_fn(inner, rebuild, spec, loss_fn, batch, objective, grads, what)
    dtypes = [
        jnp.result_type(*[compute_dtype(leaves[s.leaf]) for s in (*plan.producers, *plan.consumers)])
        for plan in plans
    ]
    zeros = tuple(jnp.zeros((plan.units,), dtype) for plan, dtype in zip(plans, dtypes, strict=True))
    exact = _exact(leaves, plans, power_of_two)
    best_u, before, after = _ascend(fn, zeros, exact, int(steps), step_size, max_scale)
    scales = tuple(
        jnp.ldexp(jnp.ones_like(u), jnp.round(u / math.log(2.0)).astype(jnp.int32)) if e else jnp.exp(u)
        for u, e in zip(best_u, exact, strict=True)
    )
    factors = treedef.flatten_up_to(multipliers(inner, spec, scales))
    moved = [
        w if m is None else (w.astype(compute_dtype(w)) * m).astype(w.dtype)
        for w, m in zip(leaves, factors, strict=True)
    ]
    # an entry the rescaling would overflow (possible with max_scale=None): no teleport at all
    fits = jnp.all(
        jnp.stack([jnp.all(jnp.isfinite(v) | ~jnp.isfinite(w)) for w, v in zip(leaves, moved, strict=True)])
    )
    moved = [jnp.where(fits, v, w) for w, v in zip(leaves, moved, strict=True)]
    scales = tuple(jnp.where(fits, x, jnp.ones_like(x)) for x in scales)
    after = jnp.where(fits, after, before)
    result = rebuild(jax.tree_util.tree_unflatten(treedef, moved))
    if return_objective:
        return result, scales, (before, after)
    return result, scales
