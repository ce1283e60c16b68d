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
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxnorm.enorm.spec import Junction, chain, entry_index, get_leaf, unwrap_variables
from jaxnorm.enorm.trees import is_nnx_state, is_variables, split_params

__all__ = [
    "Plan", "Slice", "apply_scale", "check_c", "check_cycles", "check_max_scale", "check_p",
    "compute_dtype", "enorm_balance", "flatten_params", "junction_c", "junction_scale", "multipliers",
    "objective", "plan_spec",
]

PyTree = Any


class Slice(NamedTuple):
    leaf: int  # index into the flat leaves
    axis: int
    index: np.ndarray | None  # None: unit i at position i along axis
    bias: bool


class Plan(NamedTuple):
    units: int
    producers: tuple[Slice, ...]
    consumers: tuple[Slice, ...]


# ----------------------------------------------------------------------------------------------
# Validation and planning (static, Python).


def check_p(p: Any, what: str) -> float:
    """``p`` as a float (``math.inf`` for ``"inf"``); ``ValueError`` naming ``p`` otherwise.

    Accepted: a finite Python / NumPy number > 0, ``"inf"`` (any case) or ``math.inf``. Not a bool,
    not a (traced) array: ``p`` selects the computation, it must be static.
    """
    if isinstance(p, str):
        if p.strip().lower() not in ("inf", "infinity"):
            raise ValueError(f"{what}: p must be a positive number or 'inf', got {p!r}")
        return math.inf
    if isinstance(p, bool) or not isinstance(p, int | float | np.integer | np.floating):
        raise ValueError(
            f"{what}: p must be a static positive number or 'inf', got {type(p).__name__} {p!r}")
    if math.isnan(p) or not p > 0:
        raise ValueError(f"{what}: p must be > 0, got {p!r}")
    return float(p)


def check_c(c: Any, what: str, *, per_junction: bool = False) -> None:
    """``c`` must be a real scalar > 0 and finite; checked whenever its value is known (Python
    and NumPy numbers, concrete JAX arrays). A traced ``c`` cannot be checked: a traced c <= 0
    turns the balanced params into NaN (never a silent no-op). With ``per_junction``, ``c`` may
    also be a sequence (or 1-D array) of such values, one per junction; its length is checked
    against the spec by :func:`junction_c`."""
    if per_junction and (isinstance(c, list | tuple) or (
            isinstance(c, np.ndarray | jax.Array) and np.ndim(c) == 1)):
        if len(c) == 0:
            raise ValueError(f"{what}: c must be a number > 0 or one per junction, got an empty sequence")
        for k, value in enumerate(c):
            try:
                check_c(value, what)
            except ValueError as err:
                raise ValueError(f"{what}: c[{k}]: {str(err).split(': ', 1)[-1]}") from None
        return
    if isinstance(c, bool):
        raise ValueError(f"{what}: c must be a number > 0, got {c!r}")
    if isinstance(c, jax.core.Tracer):
        if np.ndim(c) != 0:
            raise ValueError(f"{what}: c must be a scalar, got shape {np.shape(c)}")
        return
    try:
        value = np.asarray(c)
    except Exception:
        raise ValueError(f"{what}: c must be a number > 0, got {type(c).__name__}") from None
    if value.ndim != 0 or not (jnp.issubdtype(value.dtype, jnp.floating)  # bfloat16 too
                               or jnp.issubdtype(value.dtype, jnp.integer)):
        raise ValueError(f"{what}: c must be a real scalar > 0, got {c!r}")
    if not (np.isfinite(value) and value > 0):
        raise ValueError(f"{what}: c must be > 0 and finite, got {c!r}")


def junction_c(c: Any, junctions: int, what: str) -> Any:
    """``c`` as :func:`enorm_balance` passes it to the cycles: a scalar as it is, a per-junction
    sequence as a ``(junctions,)`` float array after checking that it has one value per junction."""
    if isinstance(c, list | tuple) or (isinstance(c, np.ndarray | jax.Array) and np.ndim(c) == 1):
        if len(c) != junctions:
            raise ValueError(
                f"{what}: c has {len(c)} values for the {junctions} junctions of the spec; give one "
                "per junction, in spec order, or a single number")
        return jnp.asarray(list(c) if isinstance(c, tuple) else c)
    return c


def check_cycles(cycles: Any, what: str) -> None:
    """``cycles``: a Python / NumPy integer >= 0, or an integer-dtype scalar JAX array (may be
    traced; a traced negative value runs no cycle, as ``lax.fori_loop`` does)."""
    if isinstance(cycles, bool):
        raise ValueError(f"{what}: cycles must be an integer >= 0, got {cycles!r}")
    if isinstance(cycles, int | np.integer):
        if cycles < 0:
            raise ValueError(f"{what}: cycles must be >= 0, got {cycles}")
        return
    if isinstance(cycles, jax.Array | np.ndarray) and np.ndim(cycles) == 0 and np.issubdtype(
            cycles.dtype, np.integer):
        if not isinstance(cycles, jax.core.Tracer) and int(cycles) < 0:
            raise ValueError(f"{what}: cycles must be >= 0, got {int(cycles)}")
        return
    raise ValueError(f"{what}: cycles must be an integer >= 0, got {type(cycles).__name__} {cycles!r}")


def check_max_scale(max_scale: Any, what: str) -> float | None:
    """``max_scale``: ``None`` or a static real number > 1 (``inf`` means no bound); as a float."""
    if max_scale is None:
        return None
    if isinstance(max_scale, bool) or not isinstance(max_scale, int | float | np.integer | np.floating):
        raise ValueError(f"{what}: max_scale must be None or a number > 1, got {max_scale!r}")
    if not max_scale > 1:
        raise ValueError(f"{what}: max_scale must be > 1, got {max_scale!r}")
    return None if math.isinf(max_scale) else float(max_scale)


def _check_bool(value: Any, name: str, what: str) -> None:
    if not isinstance(value, bool | np.bool_):
        raise ValueError(f"{what}: {name} must be True or False, got {value!r}")


def _key_name(key: Any) -> Any:
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return getattr(key, attr)
    return key


def flatten_params(params: PyTree) -> tuple[list[Any], Any, dict[tuple, int]]:
    with_paths, treedef = jax.tree_util.tree_flatten_with_path(params)
    positions = {tuple(_key_name(k) for k in path): i for i, (path, _) in enumerate(with_paths)}
    return [leaf for _, leaf in with_paths], treedef, positions


def _slice(params: PyTree, positions: dict, entry: Any, producer: bool, what: str) -> Slice:
    if not isinstance(entry, tuple | list) or not entry or not isinstance(entry[0], tuple | list):
        raise ValueError(f"{what}: an entry must be (path, axis) with path a tuple, got {entry!r}")
    path = tuple(entry[0])
    leaf = get_leaf(params, path, what)
    if not jnp.issubdtype(leaf.dtype, jnp.floating):
        raise ValueError(
            f"{what}: params leaf {'/'.join(map(str, path))} has dtype {leaf.dtype}; only floating "
            "params can be rescaled (an integer leaf would be truncated and the function changed). "
            "Leave it out of the spec."
        )
    axis, index = entry_index(tuple(entry), tuple(leaf.shape), what)
    return Slice(positions[path], axis, index, producer and str(path[-1]) == "bias")


def _units(s: Slice, shape: tuple[int, ...]) -> int:
    return shape[s.axis] if s.index is None else int(np.max(s.index, initial=-1)) + 1


def plan_spec(params: PyTree, spec: Sequence[Junction], what: str) -> tuple[Plan, ...]:
    if isinstance(spec, Junction) or not isinstance(spec, Sequence):
        raise ValueError(f"{what}: spec must be a sequence of Junction, got {type(spec).__name__}")
    leaves, _, positions = flatten_params(params)
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
        for role, role_slices, role_entries in (
            ("producers", prods, junction.producers), ("consumers", cons, junction.consumers)
        ):
            _check_no_overlap(role_slices, role_entries, leaves, f"{what}: junction {k} {role}")
        plans.append(Plan(units, prods, cons))
    return tuple(plans)


def _check_no_overlap(
    slices: Sequence[Slice], entries: Sequence[Any], leaves: Sequence[Any], what: str
) -> None:
    """Entries of one role (producers or consumers) of a junction must not cover an element of a leaf twice
    along the same axis: it would be scaled twice (``d^2`` for ``d``), which changes the function. Entries
    of one leaf over disjoint ``index`` positions are fine."""
    covered: dict[tuple[int, int], np.ndarray] = {}
    for entry, s in zip(entries, slices, strict=True):
        shape = tuple(leaves[s.leaf].shape)
        mask = np.ones(shape, bool) if s.index is None else np.broadcast_to(np.asarray(s.index) >= 0, shape)
        seen = covered.get((s.leaf, s.axis))
        if seen is not None and np.any(seen & mask):
            path = "/".join(map(str, entry[0]))
            raise ValueError(
                f"{what}: {path} (axis {s.axis}) is listed twice over the same elements; each element may "
                "appear once per role (it would be scaled twice and the function would change)"
            )
        covered[(s.leaf, s.axis)] = mask if seen is None else seen | mask


# ----------------------------------------------------------------------------------------------
# The numerics (traced).


def compute_dtype(leaf: jax.Array) -> Any:
    return jnp.promote_types(leaf.dtype, jnp.float32)


def _unit_power(leaf: jax.Array, s: Slice, units: int, p: float,
                factors: Sequence[jax.Array] = ()) -> jax.Array:
    """Per unit: ``sum |w * f_1 * f_2 ...|^p`` over the slice (``max |w|`` for p = inf) with the
    per-unit ``(units,)`` multipliers ``factors``, applied one after the other."""
    a = jnp.abs(leaf.astype(compute_dtype(leaf)))
    for f in factors:
        a = a * _factor(f.astype(a.dtype), s, leaf.ndim)
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


def _unit_max(leaves, slices, units: int) -> jax.Array:
    """Per unit, the largest ``|w|`` over ``slices`` (0 for a unit without entries)."""
    return _combine([_unit_power(leaves[s.leaf], s, units, math.inf) for s in slices], math.inf)


def _log_norms(leaves, slices, units: int, p: float, biggest: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(log ||.||_p, ok)`` per unit over ``slices`` (the p-norm of all their entries of that unit),
    without overflow or underflow at any p: each unit is first divided by its largest entry
    ``biggest`` (:func:`_unit_max`), so every ``|w / biggest|^p`` is at most 1 (1 for the largest)
    and the sum at most the entry count, for weights up to the dtype's maximum and p in the hundreds
    alike. The division is three products: by the two halves of ``biggest``'s power of two, then by
    its mantissa (``biggest = m 2^e``, ``0.5 <= m < 1``): one factor ``2^-e`` would be subnormal, and
    flushed to 0, for ``biggest >= 2^126``. ``ok``: the norm is positive and finite."""
    ok = (biggest > 0) & jnp.isfinite(biggest)
    safe = jnp.where(ok, biggest, 1.0)
    if p == math.inf:
        return jnp.log(safe), ok
    mantissa, exponent = jnp.frexp(safe)
    half = exponent // 2
    ones = jnp.ones_like(safe)
    factors = (jnp.ldexp(ones, -half), jnp.ldexp(ones, half - exponent), 1.0 / mantissa)
    total = _combine([_unit_power(leaves[s.leaf], s, units, p, factors) for s in slices], p)
    ok = ok & (total > 0) & jnp.isfinite(total)
    return jnp.log(safe) + jnp.log(jnp.where(ok, total, 1.0)) / p, ok


def _finite_bounds(leaves, plan: Plan, big_producers: jax.Array, big_consumers: jax.Array,
                   power_of_two: bool) -> tuple[jax.Array, jax.Array]:
    """Per unit ``(lo, hi)`` on ``log d`` (on ``log2 d`` with ``power_of_two``) that keep every scaled
    entry finite in its leaf's dtype: ``max|producer| * d`` and ``max|consumer| / d`` at most the
    dtype's maximum. Always ``lo <= 0 <= hi`` (finite weights stay finite unscaled). For powers of
    two the bound is exact (from the exponent of the largest entry); otherwise ``1e-5`` in ``log d``
    is kept for the rounding of ``exp`` and of the product."""
    finfos = lambda slices: [jnp.finfo(leaves[s.leaf].dtype) for s in slices]
    up, down = finfos(plan.producers), finfos(plan.consumers)
    positive = lambda big: jnp.where(big > 0, big, 1.0)
    if power_of_two:  # big = m 2^e with 0.5 <= m < 1: big * 2^k is finite iff e + k <= maxexp
        _, e_producers = jnp.frexp(positive(big_producers))
        _, e_consumers = jnp.frexp(positive(big_consumers))
        hi = min(f.maxexp for f in up) - e_producers
        lo = e_consumers - min(f.maxexp for f in down)
    else:
        log_max = lambda fs: min(math.log(float(f.max)) for f in fs) - 1e-5
        hi = log_max(up) - jnp.log(positive(big_producers))
        lo = jnp.log(positive(big_consumers)) - log_max(down)
    return jnp.minimum(lo, 0), jnp.maximum(hi, 0)


def _factor(d: jax.Array, s: Slice, ndim: int) -> jax.Array:
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


def junction_scale(leaves, plan: Plan, p: float, c: Any, count_biases: bool,
                   power_of_two: bool = False, bounds: tuple | None = None) -> jax.Array:
    """``d = sqrt(R / (c L))`` per unit (float32 or wider), 1 where L or R is zero or the result is
    not finite; NaN everywhere for a (traced) c <= 0. With ``power_of_two``, ``d`` is rounded to
    the nearest power of two in log space, ``2^round(log2 d)``: the best such factor for the
    convex 1-D objective ``d^p L^p + c^-p d^-p R^p`` (symmetric in ``log d`` around its minimum),
    so a cycle still does not increase the objective, and multiplying by it is exact in every
    binary float format (no rounding, no drift of the function). ``bounds``: ``(lo, hi)`` per-unit
    limits on ``log d`` (the box of :func:`enorm_balance`'s ``max_scale``); clipping the 1-D
    minimiser to an interval gives the interval's minimiser, so the objective still does not
    increase. The same clipping keeps every scaled entry finite in its dtype
    (:func:`_finite_bounds`): near the dtype's maximum a unit is balanced only as far as it can be.
    """
    left = [s for s in plan.producers if count_biases or not s.bias]
    dtype = jnp.result_type(*[compute_dtype(leaves[s.leaf]) for s in (*left, *plan.consumers)])
    if not left:
        return jnp.ones((plan.units,), dtype)
    big_left = _unit_max(leaves, left, plan.units)
    big_right = _unit_max(leaves, plan.consumers, plan.units)
    log_l, ok_l = _log_norms(leaves, left, plan.units, p, big_left)
    log_r, ok_r = _log_norms(leaves, plan.consumers, plan.units, p, big_right)
    ok = ok_l & ok_r
    c = jnp.asarray(c, dtype)
    log_d = 0.5 * (log_r - log_l).astype(dtype) - 0.5 * jnp.log(jnp.where(c > 0, c, 1.0))
    log_d = jnp.where(ok & jnp.isfinite(log_d), log_d, 0.0)
    rest = [s for s in plan.producers if s.bias and not count_biases]  # biases scaled but not counted
    big_producers = jnp.maximum(big_left, _unit_max(leaves, rest, plan.units)) if rest else big_left
    lo, hi = _finite_bounds(leaves, plan, big_producers, big_right, power_of_two)
    if bounds is not None:
        lo, hi = jnp.maximum(lo, bounds[0]), jnp.minimum(hi, bounds[1])
    if power_of_two:
        k = jnp.clip(jnp.round(log_d / math.log(2.0)), lo, hi)
        d = jnp.ldexp(jnp.ones_like(log_d), k.astype(jnp.int32))
    else:
        d = jnp.exp(jnp.clip(log_d, lo, hi))
    d = jnp.where(ok & jnp.isfinite(d), d, jnp.ones_like(d))
    return jnp.where(c > 0, d, jnp.nan)


def apply_scale(leaves: list, plan: Plan, d: jax.Array) -> None:
    for s, power in [(s, 1) for s in plan.producers] + [(s, -1) for s in plan.consumers]:
        leaf = leaves[s.leaf]
        f = _factor(d.astype(compute_dtype(leaf)), s, leaf.ndim)
        scaled = leaf * f if power == 1 else leaf / f
        leaves[s.leaf] = scaled.astype(leaf.dtype)


def _cycle(leaves: list, plans: Sequence[Plan], p: float, c: Any, count_biases: bool,
           exact: Sequence[bool], totals: Sequence[jax.Array], max_scale: float | None):
    """One BCD cycle; with ``max_scale``, each junction's scale is kept such that its running
    total (over the cycles of this call) stays in ``[1 / max_scale, max_scale]``."""
    scales = []
    for k, (plan, power_of_two, total) in enumerate(zip(plans, exact, totals, strict=True)):
        c_k = c if jnp.ndim(c) == 0 else c[k]
        bounds = None
        if max_scale is not None:
            log_total = jnp.log(total)
            if power_of_two:  # totals are exact powers of two; so are the bounds
                top = math.floor(math.log2(max_scale))
                k = jnp.round(log_total / math.log(2.0))
                bounds = (-top - k, top - k)
            else:
                bounds = (-math.log(max_scale) - log_total, math.log(max_scale) - log_total)
        d = junction_scale(leaves, plan, p, c_k, count_biases, power_of_two, bounds)
        apply_scale(leaves, plan, d)
        scales.append(d)
    return scales


def _plan_key(plans: tuple[Plan, ...]) -> tuple:
    def sl(s: Slice) -> tuple:
        index = None if s.index is None else (s.index.shape, s.index.tobytes())
        return (s.leaf, s.axis, index, s.bias)

    return tuple((pl.units, tuple(map(sl, pl.producers)), tuple(map(sl, pl.consumers)))
                 for pl in plans)


_CACHE: dict[tuple, Any] = {}


def _compiled(plans: tuple[Plan, ...], p: float, count_biases: bool, exact: tuple[bool, ...],
              max_scale: float | None = None):
    """One jitted runner per (spec layout, p, count_biases, power-of-two flags, max_scale): all
    cycles in one ``fori_loop``."""
    key = (_plan_key(plans), p, count_biases, exact, max_scale)
    if key in _CACHE:
        return _CACHE[key]

    def run(leaves, c, cycles):
        def body(_, carry):
            current, totals = carry
            current = list(current)
            scales = _cycle(current, plans, p, c, count_biases, exact, totals, max_scale)
            totals = tuple(t * s.astype(t.dtype) for t, s in zip(totals, scales, strict=True))
            return tuple(current), totals

        ones = tuple(
            jnp.ones((plan.units,), jnp.result_type(
                *[compute_dtype(leaves[s.leaf]) for s in (*plan.producers, *plan.consumers)]))
            for plan in plans
        )
        return jax.lax.fori_loop(0, cycles, body, (tuple(leaves), ones))

    if len(_CACHE) > 64:
        _CACHE.clear()
    _CACHE[key] = jax.jit(run)
    return _CACHE[key]


def _exact_flags(leaves: list, plans: tuple[Plan, ...], power_of_two: bool | None) -> tuple:
    """Per junction: round its scales to powers of two? ``None``: where any of its leaves is
    narrower than float32 (float16, bfloat16, float8), whose rounding would otherwise drift the
    function a little at every cycle."""
    if power_of_two is not None:
        return (bool(power_of_two),) * len(plans)
    narrow = lambda s: jnp.finfo(leaves[s.leaf].dtype).bits < 32
    return tuple(any(narrow(s) for s in (*plan.producers, *plan.consumers)) for plan in plans)


def enorm_balance(
    params: PyTree,
    spec: Sequence[Junction] | None = None,
    *,
    p: float | str = 2,
    c: float | Sequence[float] = 1.0,
    cycles: int = 1,
    return_scales: bool = False,
    count_biases: bool = False,
    power_of_two: bool | None = None,
    max_scale: float | None = None,
) -> PyTree | tuple[PyTree, tuple[jax.Array, ...]]:
    """Run ``cycles`` ENorm cycles: params of the same structure computing the same function.

    Each cycle visits every junction in spec order and sets, per unit,
    ``d_j = sqrt(R_j / (c L_j))`` with ``L_j`` / ``R_j`` the p-norms of the unit's incoming (producer)
    and outgoing (consumer) weights as they are after the previous updates; producers are
    multiplied by ``d_j``, consumers divided by it. Norms and scales are computed in float32 (or
    the params' wider dtype), each unit first divided by its largest entry, so that ``|w|^p``
    neither overflows nor underflows for entries up to the dtype's maximum or down to ~1e-20, nor
    for p in the hundreds. A scale stops where a producer or consumer entry would overflow its
    dtype (float16 weights near 65504): the unit is balanced as far as it can be.
    All cycles run in one ``lax.fori_loop``, so the whole call is a
    single compiled computation for any ``cycles`` (also a traced one); it is compiled once per
    spec layout and reused across calls.

    **The bare call** (``spec=None``) cannot see the network's activations: it infers a chain with
    :func:`jaxnorm.enorm.chain` (call order from the tree, see there) and *assumes* that every
    hidden activation is positively homogeneous (ReLU, leaky ReLU, identity, max / average pooling)
    and that nothing else sits between the layers. On a GELU / tanh network it would change the
    function. Verify in one call with ``jaxnorm.enorm.check(apply_fn, params, balanced, x)``, or
    let the function itself give the spec, which assumes nothing:
    ``enorm_balance(params, jaxnorm.enorm.discover(apply_fn, params, x))``.

    Args:
      params: a params tree, a Flax variables dict with a ``"params"`` key (other collections
        are returned unchanged), an ``nnx.State`` (e.g. ``nnx.state(model, nnx.Param)``) or its
        pure dict; the result is of the same kind.
      spec: a sequence of :class:`Junction`; ``None`` infers a chain with :func:`chain` and raises
        where the tree is not one or its layer order is ambiguous.
      p: norm order, a positive number or ``"inf"``.
      c: asymmetry (> 0): at the fixed point ``||outgoing_j||_p = c ||incoming_j||_p``. For c != 1
        there is an objective (see :func:`objective`) only where all paths have equal length.
        May be a traced scalar; a traced c <= 0 gives NaN params. Or one value per junction (a
        sequence or 1-D array in spec order): junction ``j`` is balanced to
        ``||outgoing_j||_p = c[j] ||incoming_j||_p`` (e.g. c = 1 at the classifier's junction
        only; the authors' code leaves that junction out, Sec. 3.7).
      cycles: number of cycles, an integer >= 0 (or an integer scalar array, also traced).
      return_scales: also return the accumulated scale of each junction over all cycles.
      count_biases: count producer biases in ``L_j`` (they are rescaled either way).
      power_of_two: round every scale to a power of two, so that rescaling is exact in the params'
        dtype and no cycle moves the function by rounding (the balance is then within a factor
        sqrt(2) per unit, and no cycle increases the objective). ``None`` (default): only for
        junctions with a leaf narrower than float32 (float16, bfloat16).
      max_scale: ``None`` (default) or a number > 1: keep every junction's accumulated scale over
        this call in ``[1 / max_scale, max_scale]`` (rounded down to a power of two where scales
        are powers of two). Each junction update is then the minimiser within that box, so no
        cycle increases the objective; a larger imbalance is removed over several calls.
        :func:`jaxnorm.optim.enorm` uses it so that its updates land on the balanced params.

    Returns:
      ``params`` balanced (same container, structure and dtypes), or ``(params, scales)`` with one
      ``(n,)`` array per junction such that producers were multiplied and consumers divided by it.

    Raises:
      ValueError, naming the argument: p not a positive number or 'inf'; c not a finite real > 0
        (where its value is known) or a per-junction c not of the spec's length; cycles not an
        integer >= 0; non-bool flags; a spec whose paths or axes do not exist, whose entries
        disagree on the number of units, or that names an integer-dtype leaf (integer params are
        never rescaled: truncation would change the function); with ``spec=None``, a tree that is
        not a chain or an ambiguous layer order.

    References:
      Stock et al. 2019, Alg. 1, Sec. 3.3 Eq. 5, Sec. 3.5 Eqs. 6-8, Sec. 3.7 Eqs. 11-12, Sec. 4.
    """
    what = "enorm_balance"
    p = check_p(p, what)
    check_c(c, what, per_junction=True)
    check_cycles(cycles, what)
    _check_bool(return_scales, "return_scales", what)
    _check_bool(count_biases, "count_biases", what)
    if power_of_two is not None:
        _check_bool(power_of_two, "power_of_two", what)
    max_scale = check_max_scale(max_scale, what)
    inner, rebuild = split_params(params)
    if spec is None:
        spec = chain(inner)
    plans = plan_spec(inner, spec, what)
    c = junction_c(c, len(plans), what)
    leaves, treedef, _ = flatten_params(inner)
    leaves = [jnp.asarray(x) for x in leaves]
    run = _compiled(plans, p, count_biases, _exact_flags(leaves, plans, power_of_two), max_scale)
    out_leaves, totals = run(tuple(leaves), c, cycles)
    result = rebuild(jax.tree_util.tree_unflatten(treedef, list(out_leaves)))
    return (result, totals) if return_scales else result


def multipliers(params: PyTree, spec: Sequence[Junction], scales: Sequence[jax.Array]) -> PyTree:
    """The per-leaf factor ``m`` with ``balanced = params * m`` for junction ``scales``.

    A leaf's factor is the product of its producer scales along their unit axes and the inverse of
    its consumer scales along theirs (Stock et al. 2019, Sec. 3.6: the ``D_{k-1}^-1 W_k D_k`` of
    Eq. 2). Leaves outside the spec get ``None``. The tree has the structure of the bare params
    (``params["params"]`` for a variables dict; an ``nnx.State`` for an ``nnx.State``, so that it
    lines up with optimizer states built on it; a ``FrozenDict`` for a ``FrozenDict``); leaves
    broadcast against the params leaves.
    """
    inner, _ = unwrap_variables(params)
    bare = params["params"] if is_variables(params) else params
    plans = plan_spec(inner, spec, "multipliers")
    if len(scales) != len(plans):
        raise ValueError(f"multipliers: got {len(scales)} scales for {len(plans)} junctions")
    leaves, treedef, _ = flatten_params(inner)
    factors: list[Any] = [None] * len(leaves)
    for plan, d in zip(plans, scales, strict=True):
        for s, power in [(s, 1) for s in plan.producers] + [(s, -1) for s in plan.consumers]:
            f = _factor(jnp.asarray(d), s, jnp.ndim(leaves[s.leaf]))
            f = f if power == 1 else 1.0 / f
            factors[s.leaf] = f if factors[s.leaf] is None else factors[s.leaf] * f
    out = jax.tree_util.tree_unflatten(treedef, factors)
    if is_nnx_state(bare):
        return nnx.State(out)
    return type(bare)(out) if isinstance(bare, Mapping) and not isinstance(bare, dict) else out


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
      ValueError: bad p or c (a per-junction sequence too); c != 1 on a graph with paths of unequal
        length.
    """
    p = check_p(p, "objective")
    if isinstance(c, list | tuple) or (isinstance(c, np.ndarray | jax.Array) and np.ndim(c) == 1):
        raise ValueError(
            "objective: c must be one number; the objective of a per-junction c (which enorm_balance "
            "takes) is not defined here (Eq. 12 weights each layer by one c to the power of its depth)"
        )
    check_c(c, "objective")
    inner, _ = unwrap_variables(params)
    if spec is None:
        spec = chain(inner)
    plan_spec(inner, spec, "objective")
    weighted = not (np.ndim(c) == 0 and not isinstance(c, jax.core.Tracer) and float(np.asarray(c)) == 1)
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
        a = jnp.abs(leaf.astype(compute_dtype(leaf)))
        term = jnp.max(a) if p == math.inf else jnp.sum(a**p)
        if weighted:
            term = term * jnp.asarray(c, term.dtype) ** (-(1 if p == math.inf else p) * level[path])
        total = total + term
    return total
