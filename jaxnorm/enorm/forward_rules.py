"""discover's forward pass: an abstract interpreter of "which unit scales each element", a rule per primitive.

For a hypothesis (params leaves multiplied by a positive per-unit ``d``), :class:`ForwardPass`
walks the flattened graph (:mod:`jaxnorm.enorm.jaxpr_graph`) once and gives every var an abstract
value of :mod:`jaxnorm.enorm.lattice`: unscaled, :class:`~jaxnorm.enorm.lattice.Scaled` (unit ids
and power) or :class:`~jaxnorm.enorm.lattice.Broken`. An equation with a scaled operand is handled
by ``FORWARD_RULES[eqn.prim]``; a primitive with no rule breaks the scaling (conservative: a
symmetry is never claimed across a map that is not known to be positively homogeneous).

The rules encode ``f(d x) = d f(x)`` for ``d > 0`` (Stock et al. 2019, Sec. 3.1):

- layout primitives, ``neg``, ``abs``; ReLU / leaky ReLU as ``max(x, 0)`` or ``select_n`` on a
  comparison with zero; max / average pooling (``reduce_window*``) and reductions whose windows or
  axes do not mix units; ``concatenate``, ``split``, zero ``pad``, ``gather`` along unit-constant
  axes, ``top_k``; products and quotients with unscaled values (BN's ``x_hat * gamma``);
- a *consumer*: ``dot_general`` / ``conv_general_dilated`` contracting the scaled units against a
  params leaf (recorded: that slice is divided by ``d``; the result is unscaled); a value of one
  unit everywhere (a hidden layer of width 1) is consumed by a params operand, not passed on;
- additions: every operand scaled alike, or an unscaled addend raises
  :class:`~jaxnorm.enorm.lattice.AddendMustScale` so that the search scales it too (junction mode);
- in the invariance and transport modes powers are tracked (``square``, ``sqrt``, ``rsqrt``,
  ``integer_pow``, products of scaled values), which is how BN's ``(x - mean) * rsqrt(var)``
  is seen to cancel a kernel's scale.

A rule is ``rule(fp, eqn, vals) -> list`` (one abstract value per output; ``vals`` one per input,
at least one of them scaled). Adding a primitive is one entry: ``FORWARD_RULES[my_p] = rule``, e.g.
``keeps_scaling`` for an elementwise map with ``f(d x) = d f(x)``. Numerics: NumPy integer arrays
of unit ids and exact fractions for powers; nothing is evaluated.

References:
  Stock, Defossez, Gribonval, Jegou, Usunier. Equi-normalization of neural networks. ICLR 2019,
  Sec. 3.1, 3.5, 4.1-4.3.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Primitive

from jaxnorm.enorm.jaxpr_graph import (
    LAYOUT_RULES,
    Const,
    Eqn,
    JaxprGraph,
    apply_layout,
    constant_addend_reason,
    find_primitives,
    is_zero_const,
)
from jaxnorm.enorm.lattice import (
    AddendMustScale,
    Broken,
    Refuted,
    Scaled,
    broadcast_ids,
    constant_along,
    squash,
)

__all__ = [
    "FORWARD_RULES",
    "ForwardPass",
    "ForwardRule",
    "TraceMode",
    "compare_rule",
    "concatenate_rule",
    "conv_rule",
    "dot_rule",
    "drops_scaling",
    "gather_rule",
    "keeps_scaling",
    "layout_rule",
    "merge_rule",
    "not_homogeneous",
    "pad_rule",
    "power_rule",
    "product_rule",
    "reduce_rule",
    "same_scaling",
    "split_rule",
    "top_k_rule",
    "window_rule",
]


class TraceMode(enum.Enum):
    """What the forward pass is looking for.

    - ``JUNCTION`` (:func:`~jaxnorm.enorm.discover`): the scale must enter linearly (power 1); an
      unscaled addend must be scaled with the units (:class:`AddendMustScale`).
    - ``INVARIANCE`` (``scale_invariant_kernels``): powers tracked; any unscaled addend refutes.
    - ``TRANSPORT`` (``input_links``): powers tracked; an unscaled addend must be scaled with the
      units, and may be a non-params input (a BN running mean).
    """

    JUNCTION = "junction"
    INVARIANCE = "invariance"
    TRANSPORT = "transport"


class ForwardPass:
    """One forward pass for a set of producer hypotheses.

    Args:
      graph: the flattened function.
      seeds: params leaf -> unit ids of that leaf's elements (power 1).
      mode: a :class:`TraceMode`.
      input_seeds: var of a non-params input -> its :class:`Scaled` value (transport mode).
    """

    def __init__(
        self,
        graph: JaxprGraph,
        seeds: dict[int, np.ndarray],
        mode: TraceMode,
        input_seeds: dict[int, Scaled] | None = None,
    ):
        self.g, self.seeds, self.mode = graph, seeds, mode
        self.consumers: dict[int, np.ndarray] = {}
        self.consumed: dict[int, set[int]] = {}
        self.at = -1
        self.val: dict[int, Any] = {}
        for v, leaf in graph.param_in.items():
            if leaf in seeds:
                self.val[v] = Scaled(seeds[leaf], Fraction(1))
        for v, scaled in (input_seeds or {}).items():
            self.val[v] = scaled

    def read(self, x: Any) -> Any:
        return None if isinstance(x, Const) else self.val.get(x)

    def is_zero(self, x: Any) -> bool:
        return is_zero_const(x) or (isinstance(x, int) and x in self.g.zero)

    def is_constant(self, x: Any) -> bool:
        """Whether ``x`` is made of constants only: a literal, or layout moves, products and choices
        (``select_n``, whatever the predicate) of such values (the epsilon ``epsilon * unit^2`` of
        :func:`jaxnorm.functional.units.inverse_std`, whose unit is 1 or a constant power of two)."""
        if isinstance(x, Const):
            return True
        k = self.g.producer.get(x)
        if k is None:
            return False
        e = self.g.eqns[k]
        operands = e.ins[1:] if e.prim is lax.select_n_p else e.ins
        return e.prim in _CONSTANT_MAPS and all(self.is_constant(a) for a in operands)

    def literal_value(self, x: Any, depth: int = 0) -> np.ndarray | None:
        """The value of ``x`` where it is computed from literals alone (a captured array is state, not
        a literal), evaluated primitive by primitive, else None: ``jnp.var``'s predicate ``n - ddof >
        0``."""
        if isinstance(x, Const):
            return None if x.captured else np.asarray(x.value)
        k = self.g.producer.get(x)
        if k is None or depth > 8:
            return None
        e = self.g.eqns[k]
        values = [self.literal_value(a, depth + 1) for a in e.ins]
        if len(e.outs) != 1 or any(v is None for v in values):
            return None
        try:
            with jax.ensure_compile_time_eval():
                return np.asarray(e.prim.bind(*values, **e.params))
        except Exception:  # a primitive that cannot run eagerly here: not known
            return None

    def shape(self, x: Any) -> tuple[int, ...]:
        return tuple(np.shape(x.value)) if isinstance(x, Const) else self.g.shapes[x]

    def run(self) -> dict[int, np.ndarray]:
        """The consumers (leaf -> unit id of each flat element, -1: not divided) of a confirmed
        hypothesis; raises :class:`Refuted` or :class:`AddendMustScale`."""
        for k, e in enumerate(self.g.eqns):
            self.at = k
            vals = [self.read(x) for x in e.ins]
            if all(v is None for v in vals):
                continue
            broken = next((v for v in vals if isinstance(v, Broken)), None)
            if broken is not None:
                outs = [broken] * len(e.outs)
            else:
                try:
                    outs = self.step(e, vals)
                except Refuted as fail:
                    outs = [Broken(f"{fail} (at {e.prim.name})")] * len(e.outs)
            for o, v in zip(e.outs, outs, strict=True):
                if v is not None:
                    self.val[o] = v
        self.check_outputs()
        return self.consumers

    def step(self, e: Eqn, vals: list) -> list:
        rule = FORWARD_RULES.get(e.prim)
        if rule is None:
            not_homogeneous(e)
        return rule(self, e, vals)

    def check_outputs(self) -> None:
        for o, name in zip(self.g.outs, self.g.out_names, strict=True):
            v = self.read(o)
            if isinstance(v, Broken):
                raise Refuted(v.reason)
            if isinstance(v, Scaled) and v.power != 0 and np.any(v.ids >= 0):
                where = f"the function output {name}" if name else "the function output"
                raise Refuted(f"the scaled units reach {where} without a consumer")
        for leaf, eqns in self.consumed.items():
            if self.g.uses[leaf] - eqns:
                raise Refuted("a consumer parameter is also used where the units do not flow")

    def scaled(self, ids: np.ndarray, power: Fraction) -> Scaled | None:
        """``Scaled(ids, power)``, None where nothing is scaled; refuted in junction mode unless
        the power is 1."""
        if power == 0 or not np.any(ids >= 0):
            return None
        if self.mode is TraceMode.JUNCTION and power != 1:
            raise Refuted("scale enters non-linearly (a product or power of scaled values)")
        return Scaled(ids, power)

    def consume(self, x: Any, b_ids: np.ndarray) -> None:
        """Record that params-derived operand ``x`` is divided by d where ``b_ids >= 0``."""
        if not isinstance(x, int) or x not in self.g.pos:
            raise Refuted("scaled units are contracted with a value that is not a parameter")
        leaf, posn = self.g.pos[x]
        if leaf in self.seeds:
            raise Refuted("a parameter would be both a producer and a consumer of the same units")
        posn = broadcast_ids(posn, self.shape(x)).ravel()
        b_ids = broadcast_ids(b_ids, self.shape(x)).ravel()
        cur = self.consumers.get(leaf, np.full(self.leaf_size(leaf), -1)).copy()
        keep = b_ids >= 0
        before = cur[posn[keep]]
        if np.any((before >= 0) & (before != b_ids[keep])):
            raise Refuted("a parameter element would consume two different units")
        cur[posn[keep]] = b_ids[keep]
        # every use of the same element must agree (a broadcast parameter)
        if not np.array_equal(cur[posn[keep]], b_ids[keep]):
            raise Refuted("a broadcast parameter would consume two different units")
        self.consumers[leaf] = cur
        self.consumed.setdefault(leaf, set()).add(self.at)

    def leaf_size(self, leaf: int) -> int:
        var = next(v for v, i in self.g.param_in.items() if i == leaf)
        return int(np.prod(self.g.shapes[var], dtype=np.int64))


ForwardRule = Callable[[ForwardPass, Eqn, list], list]


def not_homogeneous(e: Eqn) -> None:
    """Refute: ``e``'s primitive is not (known to be) positively homogeneous."""
    raise Refuted(f"{e.prim.name} is not positively homogeneous (or not known to be)")


def same_scaling(a: Scaled, b: Scaled, shape: tuple[int, ...]) -> bool:
    return a.power == b.power and np.array_equal(broadcast_ids(a.ids, shape), broadcast_ids(b.ids, shape))


def _out_shape(fp: ForwardPass, e: Eqn) -> tuple[int, ...]:
    return fp.g.shapes[e.outs[0]]


# ----------------------------------------------------------------------------------------------
# Elementwise maps.


def keeps_scaling(fp: ForwardPass, e: Eqn, vals: list) -> list:
    """An elementwise map with ``f(d x) = d f(x)`` for ``d > 0`` (``neg``, ``abs``)."""
    return [vals[0]]


def drops_scaling(fp: ForwardPass, e: Eqn, vals: list) -> list:
    """An elementwise map with ``f(d x) = f(x)`` for ``d > 0`` (``sign``; ``is_finite``, in the exact
    arithmetic the tracer reasons in: the overflow checks of :mod:`jaxnorm.functional.units`)."""
    return [None]


def layout_rule(fp: ForwardPass, e: Eqn, vals: list) -> list:
    """A layout primitive (:data:`~jaxnorm.enorm.jaxpr_graph.LAYOUT_RULES`) moves the unit ids."""
    if e.prim is lax.convert_element_type_p and not jnp.issubdtype(e.params["new_dtype"], jnp.floating):
        raise Refuted("scaled values converted to a non-float type")
    v = vals[0]
    ids = apply_layout(e, broadcast_ids(v.ids, fp.shape(e.ins[0])), _out_shape(fp, e))
    return [Scaled(ids, v.power)]


def power_rule(fp: ForwardPass, e: Eqn, vals: list) -> list:
    """``x ** k`` scales by ``d ** k`` (powers tracked outside junction mode only)."""
    if fp.mode is TraceMode.JUNCTION:
        not_homogeneous(e)
    k = {lax.square_p: Fraction(2), lax.sqrt_p: Fraction(1, 2), lax.rsqrt_p: Fraction(-1, 2)}.get(
        e.prim, Fraction(e.params.get("y", 1))
    )
    return [fp.scaled(vals[0].ids, vals[0].power * k)]


def compare_rule(fp: ForwardPass, e: Eqn, vals: list) -> list:
    """A comparison with zero, or of two values scaled alike, does not depend on ``d``."""
    a, b = vals
    zero_other = fp.is_zero(e.ins[1]) if a is not None else fp.is_zero(e.ins[0])
    if (a is None or b is None) and zero_other:
        return [None]
    if a is not None and b is not None and same_scaling(a, b, _out_shape(fp, e)):
        return [None]
    raise Refuted("a comparison with a non-zero threshold")


def merge_rule(fp: ForwardPass, e: Eqn, vals: list) -> list:
    """add / sub / max / min / select_n: every non-zero operand scaled the same way; an unscaled
    addend must be scaled with the units (:class:`AddendMustScale`)."""
    shape = _out_shape(fp, e)
    ins, vals = list(e.ins), list(vals)
    if e.prim is lax.select_n_p:
        if vals[0] is not None:
            raise Refuted("a selection predicate that depends on the scale")
        chosen = _uniform_choice(fp.literal_value(ins[0]))
        if chosen is not None:  # a choice fixed by literals: the chosen case passes through
            return [vals[1 + chosen]]
        ins, vals = ins[1:], vals[1:]
    scaled = [v for v in vals if v is not None]
    ref = scaled[0]
    for v in scaled[1:]:
        if not same_scaling(ref, v, shape):
            raise Refuted("values scaled by different units meet")
    for x, v in zip(ins, vals, strict=True):
        if v is not None or fp.is_zero(x):
            continue
        _unscaled_operand(fp, e, x, ref, shape)
    return [Scaled(broadcast_ids(ref.ids, shape), ref.power)]


def _uniform_choice(predicate: np.ndarray | None) -> int | None:
    """The case a ``select_n`` predicate of known value picks everywhere, else None."""
    if predicate is None or np.size(predicate) == 0:
        return None
    flat = np.asarray(predicate).astype(np.int64).ravel()
    return int(flat[0]) if np.all(flat == flat[0]) else None


def _unscaled_operand(fp: ForwardPass, e: Eqn, x: Any, ref: Scaled, shape: tuple[int, ...]) -> None:
    """An unscaled non-zero operand ``x`` of a merge: skipped (an epsilon, outside junction mode),
    refuted, or raised as an addend that must scale."""
    if e.prim in (lax.max_p, lax.min_p, lax.select_n_p) or ref.power != 1:
        if fp.mode is not TraceMode.JUNCTION and e.prim is lax.add_p and fp.is_constant(x):
            return  # an epsilon added to a scale statistic
        raise Refuted(f"{e.prim.name} with an unscaled non-zero operand")
    if not isinstance(x, int):
        raise Refuted(constant_addend_reason(x))
    target = broadcast_ids(ref.ids, shape)
    # a lower-rank addend (a scalar, a reduced value) broadcasts along the leading axes it lacks
    x_shape = tuple(fp.shape(x))
    padded = (1,) * (len(shape) - len(x_shape)) + x_shape
    axes = [i for i, n in enumerate(padded) if n == 1 and shape[i] > 1]
    if not constant_along(target, axes):
        raise Refuted("a broadcast addend would need several units")
    if fp.mode is TraceMode.INVARIANCE:
        raise Refuted("a scaled value plus an unscaled one")
    raise AddendMustScale(x, squash(target, axes).reshape(x_shape), ref.power)


def product_rule(fp: ForwardPass, e: Eqn, vals: list) -> list:
    """mul / div: a product with an unscaled value keeps the scaling; powers add (subtract)."""
    shape = _out_shape(fp, e)
    a, b = vals
    if any(fp.is_zero(x) for x in e.ins) and e.prim is lax.mul_p:
        return [None]
    if e.prim is lax.div_p and b is not None:
        if a is None:
            return [fp.scaled(broadcast_ids(b.ids, shape), -b.power)]
        if not np.array_equal(broadcast_ids(a.ids, shape), broadcast_ids(b.ids, shape)):
            raise Refuted("division of values scaled by different units")
        return [fp.scaled(broadcast_ids(a.ids, shape), a.power - b.power)]
    if a is not None and b is not None:
        if not np.array_equal(broadcast_ids(a.ids, shape), broadcast_ids(b.ids, shape)):
            raise Refuted("product of values scaled by different units")
        return [fp.scaled(broadcast_ids(a.ids, shape), a.power + b.power)]
    v = a if a is not None else b
    return [Scaled(v.ids, v.power)]


# ----------------------------------------------------------------------------------------------
# Reductions, pooling, selections.


def reduce_rule(fp: ForwardPass, e: Eqn, vals: list) -> list:
    """reduce_sum / max / min along axes where every unit is the same; argmax / argmin unscaled."""
    v, axes = vals[0], tuple(e.params["axes"])
    full = broadcast_ids(v.ids, fp.shape(e.ins[0]))
    if not constant_along(full, axes):
        raise Refuted("a reduction mixes different units")
    if e.prim in (lax.argmax_p, lax.argmin_p):
        return [None]
    return [Scaled(np.squeeze(squash(full, axes), axis=axes), v.power)]


def window_rule(fp: ForwardPass, e: Eqn, vals: list) -> list:
    """Max / sum pooling whose windows do not mix units."""
    p, v = e.params, vals[0]
    in_shape = fp.shape(e.ins[0])
    full = broadcast_ids(v.ids, in_shape)
    axes = [
        i
        for i in range(len(in_shape))
        if p["window_dimensions"][i] > 1
        or p["window_strides"][i] > 1
        or tuple(p["padding"][i]) != (0, 0)
        or p["base_dilation"][i] > 1
        or p["window_dilation"][i] > 1
    ]
    if not constant_along(full, axes):
        raise Refuted("a pooling window mixes units")
    return [Scaled(squash(full, axes), v.power)]


def top_k_rule(fp: ForwardPass, e: Eqn, vals: list) -> list:
    """top_k along the last axis: values scale with x, indices do not."""
    v = vals[0]
    full = broadcast_ids(v.ids, fp.shape(e.ins[0]))
    if not constant_along(full, (full.ndim - 1,)):
        raise Refuted("top_k mixes different units")
    values = np.broadcast_to(full[..., :1], fp.g.shapes[e.outs[0]])
    return [Scaled(values, v.power), None]


def gather_rule(fp: ForwardPass, e: Eqn, vals: list) -> list:
    """A gather whose indices pick along axes where every unit is the same: each output entry
    belongs to the unit of the operand entries at its batching / slice coordinates."""
    if vals[1] is not None:
        raise Refuted("gather indices that depend on the scale")
    v, shape = vals[0], _out_shape(fp, e)
    dims = e.params["dimension_numbers"]
    full = broadcast_ids(v.ids, fp.shape(e.ins[0]))
    if not constant_along(full, tuple(dims.start_index_map)):
        raise Refuted("a gather that picks among different units")
    for axis, size in enumerate(e.params["slice_sizes"]):
        if size != full.shape[axis] and axis not in (*dims.start_index_map, *dims.operand_batching_dims):
            if not constant_along(full, (axis,)):
                raise Refuted("a gather that slices across units")
    batch_out = [d for d in range(len(shape)) if d not in dims.offset_dims]
    index_dims = list(range(len(fp.shape(e.ins[1])) - 1))  # the last holds the index vector
    grid = np.indices(shape, sparse=True)
    coords: list[Any] = [0] * full.ndim
    offset_axes = [
        a
        for a in range(full.ndim)
        if a not in dims.collapsed_slice_dims and a not in dims.operand_batching_dims
    ]
    for axis, out_dim in zip(offset_axes, dims.offset_dims, strict=True):
        coords[axis] = grid[out_dim] if e.params["slice_sizes"][axis] == full.shape[axis] else 0
    for axis, index_dim in zip(dims.operand_batching_dims, dims.start_indices_batching_dims, strict=True):
        coords[axis] = grid[batch_out[index_dims.index(index_dim)]]
    return [fp.scaled(np.broadcast_to(full[tuple(coords)], shape), v.power)]


def concatenate_rule(fp: ForwardPass, e: Eqn, vals: list) -> list:
    """Unit ids concatenated (unscaled parts: -1); every scaled part with the same power."""
    dim = e.params["dimension"]
    parts = [
        broadcast_ids(v.ids, fp.shape(x)) if v is not None else np.full(fp.shape(x), -1)
        for v, x in zip(vals, e.ins, strict=True)
    ]
    powers = {v.power for v in vals if v is not None}
    if len(powers) > 1:
        raise Refuted("concatenation of differently scaled values")
    return [Scaled(np.concatenate(parts, axis=dim), powers.pop())]


def split_rule(fp: ForwardPass, e: Eqn, vals: list) -> list:
    v = vals[0]
    full = broadcast_ids(v.ids, fp.shape(e.ins[0]))
    cuts = np.cumsum(e.params["sizes"])[:-1]
    return [fp.scaled(part, v.power) for part in np.split(full, cuts, axis=e.params["axis"])]


def pad_rule(fp: ForwardPass, e: Eqn, vals: list) -> list:
    """Padding with zero (``d * 0 = 0``): padded entries take their neighbour's unit."""
    v, pad_value = vals
    if pad_value is not None or not fp.is_zero(e.ins[1]):
        raise Refuted("padding with a non-zero value")
    config = e.params["padding_config"]
    full = broadcast_ids(v.ids, fp.shape(e.ins[0]))
    if any(lo < 0 or hi < 0 or interior for lo, hi, interior in config):
        axes = [i for i, (lo, hi, it) in enumerate(config) if lo < 0 or hi < 0 or it]
        if not constant_along(full, axes):
            raise Refuted("interior or negative padding across units")
        return [Scaled(squash(full, axes), v.power)]
    return [Scaled(np.pad(full, [(lo, hi) for lo, hi, _ in config], mode="edge"), v.power)]


# ----------------------------------------------------------------------------------------------
# Contractions: the producers' scaling passes through, or a params operand consumes it.


def _single_unit_consumer(fp: ForwardPass, e: Eqn, full: np.ndarray, other: Any, b_dims) -> bool:
    """Whether a contraction of a value scaled by one unit everywhere (a hidden layer of width 1,
    or a broadcast of it) against a params leaf should consume the unit rather than pass it on.

    ``(d x) W = d (x W) = x (d W)``: both are sound, so the contraction stays a pass-through (the
    rule for n > 1 units constant along the contracted dims) unless the other operand is a view of
    a params leaf that is not a producer and there are no batch dims: then that leaf is the layer
    that consumes the unit, as for n > 1 units varying along the contracted dims (a leaf also used
    where the unit does not flow refutes the hypothesis at the end of the pass, as for n > 1)."""
    unit = full.flat[0] if full.size else -1
    if unit < 0 or b_dims or not np.all(full == unit):
        return False
    return isinstance(other, int) and other in fp.g.pos and fp.g.pos[other][0] not in fp.seeds


def dot_rule(fp: ForwardPass, e: Eqn, vals: list) -> list:
    """dot_general: scaled free / batch dims pass to the output; scaled contracted dims are
    consumed by the other operand (a params leaf), which is then divided by ``d``."""
    shape = _out_shape(fp, e)
    (ca, cb), (ba, bb) = e.params["dimension_numbers"]
    a, b = vals
    if a is not None and b is not None:
        raise Refuted("a product of two scaled tensors")
    sa, sb = fp.shape(e.ins[0]), fp.shape(e.ins[1])
    side = 0 if a is not None else 1
    v = a if side == 0 else b
    s_shape, c_dims, b_dims = (sa, ca, ba) if side == 0 else (sb, cb, bb)
    o_shape, oc_dims = (sb, cb) if side == 0 else (sa, ca)
    full = broadcast_ids(v.ids, s_shape)
    free = [i for i in range(len(s_shape)) if i not in c_dims and i not in b_dims]
    if constant_along(full, c_dims) and not _single_unit_consumer(fp, e, full, e.ins[1 - side], b_dims):
        sq = squash(full, c_dims)
        kept = [sq.shape[i] for i in (*b_dims, *free)]
        sq = np.transpose(sq, (*b_dims, *free, *c_dims)).reshape(kept)
        o_free = len(o_shape) - len(oc_dims) - len(b_dims)
        if side == 0:
            out = sq.reshape(kept + [1] * o_free)
        else:
            nb = len(b_dims)
            out = sq.reshape(kept[:nb] + [1] * o_free + kept[nb:])
        return [Scaled(np.broadcast_to(out, shape), v.power)]
    if not constant_along(full, (*b_dims, *free)) or b_dims:
        raise Refuted("a contraction that mixes units with other dimensions")
    units = np.transpose(squash(full, free), (*free, *c_dims))  # varies along c_dims only
    o_ids_shape = [1] * len(o_shape)
    for dc, do in zip(c_dims, oc_dims, strict=True):
        o_ids_shape[do] = s_shape[dc]
    order = np.argsort(oc_dims)
    c_arr = np.transpose(units.reshape([s_shape[d] for d in c_dims]), order)
    fp.consume(e.ins[1 - side], c_arr.reshape(o_ids_shape))
    return [None]


def conv_rule(fp: ForwardPass, e: Eqn, vals: list) -> list:
    """conv_general_dilated: a kernel scaled per output feature scales the output features; input
    features scaled per unit are consumed by the kernel (grouped convolutions included)."""
    shape = _out_shape(fp, e)
    lhs, rhs = vals
    dn = e.params["dimension_numbers"]
    lhs_spec, rhs_spec, out_spec = dn.lhs_spec, dn.rhs_spec, dn.out_spec
    if lhs is not None and rhs is not None:
        raise Refuted("a convolution of two scaled tensors")
    if e.params.get("batch_group_count", 1) != 1:
        raise Refuted("batch_group_count convolutions")
    if rhs is not None:
        full = broadcast_ids(rhs.ids, fp.shape(e.ins[1]))
        other = [d for d in range(full.ndim) if d != rhs_spec[0]]
        if not constant_along(full, other):
            raise Refuted("kernel scaling that is not per output feature")
        vec = squash(full, other).ravel()
        out = [1] * len(shape)
        out[out_spec[1]] = vec.size
        return [Scaled(np.broadcast_to(vec.reshape(out), shape), rhs.power)]
    full = broadcast_ids(lhs.ids, fp.shape(e.ins[0]))
    other = [d for d in range(full.ndim) if d != lhs_spec[1]]
    if not constant_along(full, other):
        raise Refuted("input scaling that is not per feature")
    units = squash(full, other).ravel()  # (C,)
    k_shape = fp.shape(e.ins[1])
    groups = e.params["feature_group_count"]
    n_out, n_in = k_shape[rhs_spec[0]], k_shape[rhs_spec[1]]
    o = np.arange(n_out).reshape(-1, 1)
    r = np.arange(n_in).reshape(1, -1)
    table = units[(o // (n_out // groups)) * n_in + r]  # (O, I)
    k_ids_shape = [1] * len(k_shape)
    k_ids_shape[rhs_spec[0]], k_ids_shape[rhs_spec[1]] = n_out, n_in
    arr = table if rhs_spec[0] < rhs_spec[1] else table.T
    fp.consume(e.ins[1], arr.reshape(k_ids_shape))
    return [None]


# ----------------------------------------------------------------------------------------------
# The table.

_CONSTANT_MAPS = frozenset((*LAYOUT_RULES, lax.mul_p, lax.select_n_p))
"""Maps whose result is a constant when their (value) operands are: :meth:`ForwardPass.is_constant`."""

FORWARD_RULES: dict[Primitive, ForwardRule] = {
    **dict.fromkeys(LAYOUT_RULES, layout_rule),
    lax.neg_p: keeps_scaling,
    lax.abs_p: keeps_scaling,
    lax.sign_p: drops_scaling,
    lax.is_finite_p: drops_scaling,
    **dict.fromkeys(
        find_primitives("add_p", "sub_p", "add_jaxvals_p", "max_p", "min_p", "select_n_p"), merge_rule
    ),
    **dict.fromkeys((lax.ge_p, lax.gt_p, lax.le_p, lax.lt_p, lax.eq_p, lax.ne_p), compare_rule),
    lax.mul_p: product_rule,
    lax.div_p: product_rule,
    **dict.fromkeys((lax.integer_pow_p, lax.square_p, lax.sqrt_p, lax.rsqrt_p), power_rule),
    **dict.fromkeys(
        (lax.reduce_sum_p, lax.reduce_max_p, lax.reduce_min_p, lax.argmax_p, lax.argmin_p), reduce_rule
    ),
    lax.top_k_p: top_k_rule,
    lax.gather_p: gather_rule,
    **dict.fromkeys(
        find_primitives(
            # not the generic reduce_window_p: JAX takes it only for a reducer or initial value that is
            # not a standard pool's (lax.max with init 1.0, a product), which is not homogeneous
            "reduce_window_sum_p", "reduce_window_max_p", "reduce_window_min_p"
        ),
        window_rule,
    ),
    lax.concatenate_p: concatenate_rule,
    **dict.fromkeys(find_primitives("split_p"), split_rule),
    lax.pad_p: pad_rule,
    lax.dot_general_p: dot_rule,
    lax.conv_general_dilated_p: conv_rule,
}
