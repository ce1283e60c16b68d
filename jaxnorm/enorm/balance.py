"""ENorm cycles: exact block coordinate descent on the rescaling of every junction.

For a junction with producer slices W (scaled by d) and consumer slices W' (scaled by 1/d), let
``L_j = (sum_producers ||W[..., j]||_p^p)^(1/p)`` and ``R_j = (sum_consumers ||W'[j, ...]||_p^p)^(1/p)``.
The update ``d_j = sqrt(R_j / (c L_j))`` minimises ``d^p L_j^p + c^-p d^-p R_j^p`` exactly (Stock et
al. 2019, Sec. 3.3 Eq. 5; asymmetric c as in the authors' code, Sec. 3.7 Eqs. 11-12). One cycle
updates every junction once, in spec order, each update reading the norms the previous updates left
(true block coordinate descent; Theorem 1: for c = 1 the cycles converge to the unique minimiser of
``sum_k ||W_k||_p^p`` over the rescaling-equivalence class, Sec. 3.4). Units with a zero incoming
or outgoing norm (dead ReLUs) have no minimiser and keep ``d_j = 1``.

Biases of producers are always rescaled (Sec. 3.5, Eqs. 6-8: needed to preserve the function); they
count in ``L_j`` only with ``count_biases=True``. A producer entry is a bias when its path ends in
``"bias"``.

References:
  Stock, Defossez, Gribonval, Jegou, Usunier. Equi-normalization of neural networks. ICLR 2019.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxnorm.enorm.spec import Junction, chain, entry_index, get_leaf, unwrap_variables

__all__ = ["enorm_balance", "multipliers", "objective"]

PyTree = Any


class _Slice(NamedTuple):
    leaf: int  # index into the flat leaves
    axis: int
    index: np.ndarray | None  # None: unit i at position i along axis
    bias: bool


class _Plan(NamedTuple):
    units: int
    producers: tuple[_Slice, ...]
    consumers: tuple[_Slice, ...]


# ----------------------------------------------------------------------------------------------
# Validation and planning (static, Python).


def _check_p(p: Any, what: str) -> float:
    if isinstance(p, str):
        if p.lower() != "inf":
            raise ValueError(f"{what}: p must be a positive number or 'inf', got {p!r}")
        return math.inf
    if isinstance(p, bool) or not isinstance(p, int | float | np.number):
        raise ValueError(f"{what}: p must be a positive number or 'inf', got {p!r}")
    if not p > 0:
        raise ValueError(f"{what}: p must be > 0, got {p!r}")
    return float(p)


def _check_c(c: Any, what: str) -> None:
    if isinstance(c, int | float | np.number) and not c > 0:
        raise ValueError(f"{what}: c must be > 0, got {c!r}")


def _key_name(key: Any) -> Any:
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return getattr(key, attr)
    return key


def _flatten(params: PyTree) -> tuple[list[Any], Any, dict[tuple, int]]:
    with_paths, treedef = jax.tree_util.tree_flatten_with_path(params)
    positions = {tuple(_key_name(k) for k in path): i for i, (path, _) in enumerate(with_paths)}
    return [leaf for _, leaf in with_paths], treedef, positions


def _slice(params: PyTree, positions: dict, entry: Any, producer: bool, what: str) -> _Slice:
    if not isinstance(entry, tuple | list) or not entry or not isinstance(entry[0], tuple | list):
        raise ValueError(f"{what}: an entry must be (path, axis) with path a tuple, got {entry!r}")
    path = tuple(entry[0])
    leaf = get_leaf(params, path, what)
    axis, index = entry_index(tuple(entry), tuple(leaf.shape), what)
    return _Slice(positions[path], axis, index, producer and str(path[-1]) == "bias")


def _units(s: _Slice, shape: tuple[int, ...]) -> int:
    return shape[s.axis] if s.index is None else int(np.max(s.index, initial=-1)) + 1


def _plan(params: PyTree, spec: Sequence[Junction], what: str) -> tuple[_Plan, ...]:
    if isinstance(spec, Junction) or not isinstance(spec, Sequence):
        raise ValueError(f"{what}: spec must be a sequence of Junction, got {type(spec).__name__}")
    leaves, _, positions = _flatten(params)
    plans = []
    for k, junction in enumerate(spec):
        if not isinstance(junction, Junction):
            raise ValueError(f"{what}: spec[{k}] is {type(junction).__name__}, expected a Junction")
        if not junction.producers or not junction.consumers:
            raise ValueError(f"{what}: junction {k} needs at least one producer and one consumer")
        prods = tuple(_slice(params, positions, e, True, what) for e in junction.producers)
        cons = tuple(_slice(params, positions, e, False, what) for e in junction.consumers)
        slices = (*prods, *cons)
        entries = (*junction.producers, *junction.consumers)
        counts = [(tuple(e[0]), _units(sl, tuple(leaves[sl.leaf].shape)), sl.index is None)
                  for e, sl in zip(entries, slices, strict=True)]
        plain = {n for _, n, is_plain in counts if is_plain}
        units = max(n for _, n, _ in counts)
        if len(plain) > 1 or (plain and units not in plain):
            raise ValueError(
                f"{what}: the entries of junction {k} disagree on the number of units: "
                + ", ".join(f"{'/'.join(map(str, path))}: {n}" for path, n, _ in counts)
            )
        if units == 0:
            raise ValueError(f"{what}: junction {k} has no units")
        plans.append(_Plan(units, prods, cons))
    return tuple(plans)


# ----------------------------------------------------------------------------------------------
# The numerics (traced).


def _compute_dtype(leaf: jax.Array) -> Any:
    return jnp.promote_types(leaf.dtype, jnp.float32)


def _unit_power(leaf: jax.Array, s: _Slice, units: int, p: float) -> jax.Array:
    """Per unit: ``sum |w|^p`` over the slice (``max |w|`` for p = inf)."""
    a = jnp.abs(leaf.astype(_compute_dtype(leaf)))
    if p == 2:
        a = jnp.square(a)
    elif p != 1 and p != math.inf:
        a = a**p
    if s.index is None:
        axes = tuple(i for i in range(leaf.ndim) if i != s.axis)
        return jnp.max(a, axis=axes) if p == math.inf else jnp.sum(a, axis=axes)
    seg = np.broadcast_to(np.where(s.index < 0, units, s.index), leaf.shape).ravel()
    segment = jax.ops.segment_max if p == math.inf else jax.ops.segment_sum
    out = segment(a.ravel(), jnp.asarray(seg), num_segments=units + 1)[:units]
    return jnp.maximum(out, 0.0)  # segment_max of an empty segment is -inf


def _factor(d: jax.Array, s: _Slice, ndim: int) -> jax.Array:
    """``d`` laid out to broadcast against the leaf (1 outside the junction)."""
    if s.index is None:
        shape = [1] * ndim
        shape[s.axis] = d.shape[0]
        return d.reshape(shape)
    extended = jnp.concatenate([d, jnp.ones((1,), d.dtype)])
    return extended[np.where(s.index < 0, d.shape[0], s.index)]


def _combine(terms: list[jax.Array], p: float) -> jax.Array:
    out = terms[0]
    for t in terms[1:]:
        out = jnp.maximum(out, t) if p == math.inf else out + t
    return out


def _junction_scale(leaves, plan: _Plan, p: float, c: Any, count_biases: bool) -> jax.Array:
    """``d = sqrt(R / (c L))`` per unit, 1 where L or R is zero or the result is not finite."""
    left = [_unit_power(leaves[s.leaf], s, plan.units, p)
            for s in plan.producers if count_biases or not s.bias]
    right = [_unit_power(leaves[s.leaf], s, plan.units, p) for s in plan.consumers]
    dtype = jnp.result_type(*left, *right)
    if not left:
        return jnp.ones((plan.units,), dtype)
    lp, rp = _combine(left, p).astype(dtype), _combine(right, p).astype(dtype)
    ok = (lp > 0) & (rp > 0)
    safe_l, safe_r = jnp.where(ok, lp, 1.0), jnp.where(ok, rp, 1.0)
    exponent = 0.5 if p == math.inf else 0.5 / p
    d = jnp.exp(exponent * (jnp.log(safe_r) - jnp.log(safe_l)) - 0.5 * jnp.log(jnp.asarray(c, dtype)))
    return jnp.where(ok & jnp.isfinite(d), d, jnp.ones_like(d))


def _apply(leaves: list, plan: _Plan, d: jax.Array) -> None:
    for s, power in [(s, 1) for s in plan.producers] + [(s, -1) for s in plan.consumers]:
        leaf = leaves[s.leaf]
        f = _factor(d.astype(_compute_dtype(leaf)), s, leaf.ndim)
        scaled = leaf * f if power == 1 else leaf / f
        leaves[s.leaf] = scaled.astype(leaf.dtype)


def _cycle(leaves: list, plans: Sequence[_Plan], p: float, c: Any, count_biases: bool):
    scales = []
    for plan in plans:
        d = _junction_scale(leaves, plan, p, c, count_biases)
        _apply(leaves, plan, d)
        scales.append(d)
    return scales


def _plan_key(plans: tuple[_Plan, ...]) -> tuple:
    def sl(s: _Slice) -> tuple:
        index = None if s.index is None else (s.index.shape, s.index.tobytes())
        return (s.leaf, s.axis, index, s.bias)

    return tuple((pl.units, tuple(map(sl, pl.producers)), tuple(map(sl, pl.consumers)))
                 for pl in plans)


_CACHE: dict[tuple, Any] = {}


def _compiled(plans: tuple[_Plan, ...], p: float, count_biases: bool):
    """One jitted runner per (spec layout, p, count_biases): all cycles in one ``fori_loop``."""
    key = (_plan_key(plans), p, count_biases)
    if key in _CACHE:
        return _CACHE[key]

    def run(leaves, c, cycles):
        def body(_, carry):
            current, totals = carry
            current = list(current)
            scales = _cycle(current, plans, p, c, count_biases)
            totals = tuple(t * s.astype(t.dtype) for t, s in zip(totals, scales, strict=True))
            return tuple(current), totals

        ones = tuple(
            jnp.ones((plan.units,), jnp.result_type(
                *[_compute_dtype(leaves[s.leaf]) for s in (*plan.producers, *plan.consumers)]))
            for plan in plans
        )
        return jax.lax.fori_loop(0, cycles, body, (tuple(leaves), ones))

    if len(_CACHE) > 64:
        _CACHE.clear()
    _CACHE[key] = jax.jit(run)
    return _CACHE[key]


def _rebuild(tree: PyTree, is_variables: bool, new_params: PyTree) -> PyTree:
    if not is_variables:
        return new_params
    if hasattr(tree, "copy") and not isinstance(tree, dict):  # flax FrozenDict
        return tree.copy({"params": new_params})
    out = dict(tree)
    out["params"] = new_params
    return type(tree)(out) if isinstance(tree, dict) and type(tree) is not dict else out


def enorm_balance(
    params: PyTree,
    spec: Sequence[Junction] | None = None,
    *,
    p: float | str = 2,
    c: float = 1.0,
    cycles: int = 1,
    return_scales: bool = False,
    count_biases: bool = False,
) -> PyTree | tuple[PyTree, tuple[jax.Array, ...]]:
    """Run ``cycles`` ENorm cycles: params of the same structure computing the same function.

    Each cycle visits every junction in spec order and sets, per unit,
    ``d_j = sqrt(R_j / (c L_j))`` with ``L_j`` / ``R_j`` the p-norms of the unit's incoming (producer)
    and outgoing (consumer) weights as they are after the previous updates; producers are
    multiplied by ``d_j``, consumers divided by it. All cycles run in one ``lax.fori_loop``, so the
    whole call is a single compiled computation for any ``cycles`` (also a traced one); it is
    compiled once per spec layout and reused across calls.

    Args:
      params: a params tree or a Flax variables dict with a ``"params"`` key (other collections
        are returned unchanged).
      spec: a sequence of :class:`Junction`; ``None`` infers a chain with :func:`chain` and raises
        where the tree is not one.
      p: norm order, a positive number or ``"inf"``.
      c: asymmetry (> 0): at the fixed point ``||outgoing_j||_p = c ||incoming_j||_p``. For c != 1
        there is an objective (see :func:`objective`) only where all paths have equal length.
      cycles: number of cycles (>= 0).
      return_scales: also return the accumulated scale of each junction over all cycles.
      count_biases: count producer biases in ``L_j`` (they are rescaled either way).

    Returns:
      ``params`` balanced (same structure and dtypes), or ``(params, scales)`` with one ``(n,)``
      array per junction such that producers were multiplied and consumers divided by it.

    Raises:
      ValueError: p <= 0, c <= 0, negative cycles, a spec whose paths or axes do not exist or whose
        entries disagree on the number of units, or (``spec=None``) a tree that is not a chain.

    References:
      Stock et al. 2019, Alg. 1, Sec. 3.3 Eq. 5, Sec. 3.5 Eqs. 6-8, Sec. 3.7 Eqs. 11-12, Sec. 4.
    """
    p = _check_p(p, "enorm_balance")
    _check_c(c, "enorm_balance")
    if isinstance(cycles, int | np.integer) and cycles < 0:
        raise ValueError(f"enorm_balance: cycles must be >= 0, got {cycles}")
    inner, is_variables = unwrap_variables(params)
    if spec is None:
        spec = chain(inner)
    plans = _plan(inner, spec, "enorm_balance")
    leaves, treedef, _ = _flatten(inner)
    run = _compiled(plans, p, count_biases)
    out_leaves, totals = run(tuple(jnp.asarray(x) for x in leaves), c, cycles)
    new_params = jax.tree_util.tree_unflatten(treedef, list(out_leaves))
    result = _rebuild(params, is_variables, new_params)
    return (result, totals) if return_scales else result


def multipliers(params: PyTree, spec: Sequence[Junction], scales: Sequence[jax.Array]) -> PyTree:
    """The per-leaf factor ``m`` with ``balanced = params * m`` for junction ``scales``.

    A leaf's factor is the product of its producer scales along their unit axes and the inverse of
    its consumer scales along theirs (Stock et al. 2019, Sec. 3.6: the ``D_{k-1}^-1 W_k D_k`` of
    Eq. 2). Leaves outside the spec get ``None``. The tree has the structure of the bare params
    (``params["params"]`` for a variables dict); leaves broadcast against the params leaves.
    """
    inner, _ = unwrap_variables(params)
    plans = _plan(inner, spec, "multipliers")
    if len(scales) != len(plans):
        raise ValueError(f"multipliers: got {len(scales)} scales for {len(plans)} junctions")
    leaves, treedef, _ = _flatten(inner)
    factors: list[Any] = [None] * len(leaves)
    for plan, d in zip(plans, scales, strict=True):
        for s, power in [(s, 1) for s in plan.producers] + [(s, -1) for s in plan.consumers]:
            f = _factor(jnp.asarray(d), s, jnp.ndim(leaves[s.leaf]))
            f = f if power == 1 else 1.0 / f
            factors[s.leaf] = f if factors[s.leaf] is None else factors[s.leaf] * f
    return jax.tree_util.tree_unflatten(treedef, factors)


def _levels(spec: Sequence[Junction]) -> dict[tuple, int]:
    """Depth of every spec leaf: consumers one deeper than the producers of their junction."""
    nodes: dict[tuple, list[tuple[tuple, int]]] = {}

    def link(a: tuple, b: tuple, delta: int) -> None:
        nodes.setdefault(a, []).append((b, delta))
        nodes.setdefault(b, []).append((a, -delta))

    for junction in spec:
        paths = [(tuple(e[0]), 0) for e in junction.producers]
        paths += [(tuple(e[0]), 1) for e in junction.consumers]
        for path, level in paths[1:]:
            link(paths[0][0], path, level)
    level: dict[tuple, int] = {}
    for start in nodes:
        if start in level:
            continue
        level[start] = 0
        stack = [start]
        while stack:
            a = stack.pop()
            for b, delta in nodes[a]:
                if b not in level:
                    level[b] = level[a] + delta
                    stack.append(b)
                elif level[b] != level[a] + delta:
                    raise ValueError(
                        "objective: c != 1 has an objective only for graphs whose paths have equal "
                        f"length; {'/'.join(map(str, b))} sits at two depths. The per-junction "
                        "update of enorm_balance is still defined."
                    )
    return level


def objective(
    params: PyTree,
    spec: Sequence[Junction] | None = None,
    *,
    p: float | str = 2,
    c: float = 1.0,
    count_biases: bool = False,
) -> jax.Array:
    """``sum_k c^(-p l_k) ||W_k||_p^p`` over the spec's leaves: what an ENorm cycle does not increase.

    ``l_k`` is the depth of leaf k (producers of a junction at depth l, its consumers at l + 1);
    for c = 1 this is the paper's ``sum_k ||W_k||_p^p`` (Stock et al. 2019, Sec. 3.2 Eqs. 3-4),
    for c != 1 the asymmetric objective of Sec. 3.7 (Eq. 12), defined only where all paths have
    equal length. Biases count only with ``count_biases=True``. For p = inf each leaf contributes
    ``c^-l_k max|W_k|`` (a cycle balances max norms but need not decrease this sum).

    Raises:
      ValueError: bad p or c; c != 1 on a graph with paths of unequal length.
    """
    p = _check_p(p, "objective")
    _check_c(c, "objective")
    inner, _ = unwrap_variables(params)
    if spec is None:
        spec = chain(inner)
    _plan(inner, spec, "objective")
    weighted = not (isinstance(c, int | float) and c == 1)
    level = _levels(spec) if weighted else {}
    seen: dict[tuple, None] = {}
    for junction in spec:
        for e in junction.producers:
            if count_biases or str(e[0][-1]) != "bias":
                seen[tuple(e[0])] = None
        for e in junction.consumers:
            seen[tuple(e[0])] = None
    total = jnp.zeros((), jnp.float32)
    for path in seen:
        leaf = jnp.asarray(get_leaf(inner, path, "objective"))
        a = jnp.abs(leaf.astype(_compute_dtype(leaf)))
        term = jnp.max(a) if p == math.inf else jnp.sum(a**p)
        if weighted:
            term = term * jnp.asarray(c, term.dtype) ** (-(1 if p == math.inf else p) * level[path])
        total = total + term
    return total
