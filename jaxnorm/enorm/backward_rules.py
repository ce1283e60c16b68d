"""discover's backward pass: which parameters must scale for an unscaled addend to carry given units.

Where the forward pass (:mod:`jaxnorm.enorm.forward_rules`) meets ``a + b`` with ``a`` scaled by
units ``d`` and ``b`` unscaled, the sum is homogeneous only if ``b`` is scaled by ``d`` too. The
backward pass follows ``b`` to the function's inputs: through layout primitives, negation,
additions (every operand), products (one operand: ``(d x) * y = d (x y)``), reductions and
pooling, concatenation, and into the producers of a contraction (``dot_general`` output units sit
in one operand's free dims, a convolution's in the kernel's output features). It ends at params
leaves (a bias, a residual branch, a type-C shortcut, every block writing an identity residual
stream; Stock et al. 2019, Sec. 4.2-4.3) which the search adds to the hypothesis; in transport
mode it may also end at non-params inputs (a BN running mean).

A rule is ``rule(tb, eqn, target) -> {leaf: ids}`` with ``target`` the unit ids the output of
``eqn`` must carry (full shape); it calls ``tb.back(operand, ids)`` for the operands that must
carry them. Adding a primitive is one entry: ``BACKWARD_RULES[my_p] = rule``. A primitive without
a rule refutes the hypothesis (conservative). Numerics: NumPy index arrays only.

References:
  Stock, Defossez, Gribonval, Jegou, Usunier. Equi-normalization of neural networks. ICLR 2019,
  Sec. 3.1, 4.2-4.3.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from jax import lax
from jax.extend.core import Primitive

from jaxnorm.enorm.jaxpr_graph import (
    Const,
    Eqn,
    JaxprGraph,
    constant_addend_reason,
    find_primitives,
    is_var_in,
    is_zero_const,
)
from jaxnorm.enorm.lattice import Refuted, broadcast_ids, constant_along, merge_seeds, squash

__all__ = [
    "BACKWARD_RULES",
    "BackwardRule",
    "TraceBack",
    "addend_sources",
    "broadcast_back",
    "concatenate_back",
    "conv_back",
    "dot_back",
    "merge_back",
    "product_back",
    "reduce_back",
    "reshape_back",
    "rev_back",
    "transpose_back",
    "window_back",
]

_MAX_DEPTH = 10_000


class TraceBack:
    """One trace from an addend back to the params (and, with ``to_inputs``, other inputs) that
    would scale it. Keys of the result: a params leaf index (>= 0), or ``-1 - var`` for a
    non-params input var."""

    def __init__(self, graph: JaxprGraph, to_inputs: bool = False):
        self.g, self.to_inputs, self.depth = graph, to_inputs, 0

    def in_shape(self, x: Any) -> tuple[int, ...]:
        return tuple(np.shape(x.value)) if isinstance(x, Const) else self.g.shapes[x]

    def to_operand(self, x: Any, target: np.ndarray) -> np.ndarray:
        """``target`` (the output's shape) reduced to operand ``x``'s shape: constant along its
        size-1 dims and along the leading dims a lower-rank operand lacks (a scalar of ``c * x`` or
        ``x + c`` broadcasts along all of them), as the forward pass reduces an unscaled addend."""
        s = self.in_shape(x)
        padded = (1,) * (target.ndim - len(s)) + s
        axes = [i for i, n in enumerate(padded) if n == 1 and target.shape[i] > 1]
        if not constant_along(target, axes):
            raise Refuted("a broadcast operand would need several units")
        return squash(target, axes).reshape(s)

    def back(self, var: Any, target: np.ndarray) -> dict[int, np.ndarray]:
        """The leaves (and inputs) that must carry ``target`` for ``var`` to carry it."""
        g = self.g
        if isinstance(var, Const) or var in g.zero or not np.any(target >= 0):
            if isinstance(var, Const) and not is_zero_const(var) and np.any(target >= 0):
                raise Refuted(constant_addend_reason(var))
            return {}
        if self.depth > _MAX_DEPTH:
            raise Refuted("the graph is too deep to trace back")
        target = broadcast_ids(target, g.shapes[var])
        if var in g.param_in:
            if not g.shapes[var]:  # discover never tries a scalar leaf either: no axis to scale along
                raise Refuted("a scalar parameter would carry the units (a spec entry needs an axis)")
            return {g.param_in[var]: np.array(target)}
        if self.to_inputs and var in g.other_in:
            return {-1 - var: np.array(target)}
        if var in g.other_in or var not in g.producer:
            raise Refuted("scaled units meet an unscaled input of the function (e.g. a BN running mean)")
        e = g.eqns[g.producer[var]]
        rule = BACKWARD_RULES.get(e.prim)
        if rule is None:
            raise Refuted(f"cannot trace the units back through {e.prim.name}")
        self.depth += 1
        try:
            return rule(self, e, target)
        finally:
            self.depth -= 1


BackwardRule = Callable[[TraceBack, Eqn, np.ndarray], dict[int, np.ndarray]]


def addend_sources(
    graph: JaxprGraph, var: Any, target: np.ndarray, *, to_inputs: bool = False
) -> dict[int, np.ndarray]:
    """The params leaves (keys >= 0) that must be scaled by ``target`` for ``var`` to carry it;
    with ``to_inputs``, non-params inputs of the function reached this way too (key ``-1 - var``)."""
    return TraceBack(graph, to_inputs).back(var, target)


# ----------------------------------------------------------------------------------------------
# Rules.


def reshape_back(tb: TraceBack, e: Eqn, target: np.ndarray) -> dict[int, np.ndarray]:
    """Element-preserving maps (reshape, squeeze, dtype casts, copies, neg): same ids, reshaped."""
    return tb.back(e.ins[0], np.reshape(target, tb.in_shape(e.ins[0])))


def transpose_back(tb: TraceBack, e: Eqn, target: np.ndarray) -> dict[int, np.ndarray]:
    return tb.back(e.ins[0], np.transpose(target, np.argsort(e.params["permutation"])))


def rev_back(tb: TraceBack, e: Eqn, target: np.ndarray) -> dict[int, np.ndarray]:
    return tb.back(e.ins[0], np.flip(target, axis=tuple(e.params["dimensions"])))


def broadcast_back(tb: TraceBack, e: Eqn, target: np.ndarray) -> dict[int, np.ndarray]:
    """broadcast_in_dim: the ids must be constant along the broadcast dims."""
    dims = e.params["broadcast_dimensions"]
    s = tb.in_shape(e.ins[0])
    new = [i for i in range(target.ndim) if i not in dims or s[dims.index(i)] == 1]
    if not constant_along(target, new):
        raise Refuted("a broadcast operand would need several units")
    return tb.back(e.ins[0], np.reshape(squash(target, new), s))


def merge_back(tb: TraceBack, e: Eqn, target: np.ndarray) -> dict[int, np.ndarray]:
    """add / sub / max / min / select_n: every operand but a zero must carry the ids. A zero (the
    ``+ 0.0`` of an absent bias: a scalar literal) carries any units and a constant none, whatever
    their shapes: both are settled before the ids are reduced to the operand, as merge_rule does."""
    out: dict[int, np.ndarray] = {}
    operands = e.ins[1:] if e.prim is lax.select_n_p else e.ins
    for x in operands:
        if is_zero_const(x) or is_var_in(x, tb.g.zero):
            continue
        if isinstance(x, Const):
            raise Refuted(constant_addend_reason(x))
        merge_seeds(out, tb.back(x, tb.to_operand(x, target)))
    return out


def product_back(tb: TraceBack, e: Eqn, target: np.ndarray) -> dict[int, np.ndarray]:
    """mul / div: one operand carries the ids (params-derived operands tried first; a quotient's
    numerator only)."""
    ins = e.ins
    operands = list(ins[:1]) if e.prim is lax.div_p else sorted(ins, key=lambda x: not is_var_in(x, tb.g.pos))
    reasons = []
    for x in operands:
        if isinstance(x, Const):
            continue
        try:
            return tb.back(x, tb.to_operand(x, target))
        except Refuted as fail:
            reasons.append(str(fail))
    raise Refuted("; ".join(reasons) or "a product of constants")


def window_back(tb: TraceBack, e: Eqn, target: np.ndarray) -> dict[int, np.ndarray]:
    """Pooling: the ids must be constant along every pooled axis."""
    s = tb.in_shape(e.ins[0])
    p = e.params
    axes = [
        i
        for i in range(len(s))
        if p["window_dimensions"][i] > 1 or p["window_strides"][i] > 1 or tuple(p["padding"][i]) != (0, 0)
    ]
    if not constant_along(target, axes):
        raise Refuted("a pooling window would need several units")
    return tb.back(e.ins[0], squash(target, axes))


def reduce_back(tb: TraceBack, e: Eqn, target: np.ndarray) -> dict[int, np.ndarray]:
    """reduce_sum / max / min: the operand carries the ids broadcast along the reduced axes."""
    return tb.back(e.ins[0], np.expand_dims(target, tuple(e.params["axes"])))


def concatenate_back(tb: TraceBack, e: Eqn, target: np.ndarray) -> dict[int, np.ndarray]:
    dim = e.params["dimension"]
    cuts = np.cumsum([tb.in_shape(x)[dim] for x in e.ins])[:-1]
    out: dict[int, np.ndarray] = {}
    for x, part in zip(e.ins, np.split(target, cuts, axis=dim), strict=True):
        merge_seeds(out, tb.back(x, part))
    return out


def dot_back(tb: TraceBack, e: Eqn, target: np.ndarray) -> dict[int, np.ndarray]:
    """dot_general: the operand whose free dims hold the units (constant along the others). Where
    both qualify (one unit everywhere: a layer of width 1), params-derived operands are tried
    first and the first that traces back is taken, as for a product."""
    (ca, cb), (ba, bb) = e.params["dimension_numbers"]
    sa, sb = tb.in_shape(e.ins[0]), tb.in_shape(e.ins[1])
    nb = len(ba)
    fa = [i for i in range(len(sa)) if i not in ca and i not in ba]
    fb = [i for i in range(len(sb)) if i not in cb and i not in bb]
    out_a = list(range(nb, nb + len(fa)))
    out_b = list(range(nb + len(fa), target.ndim))
    sides = [(e.ins[0], sa, fa, out_a, out_b), (e.ins[1], sb, fb, out_b, out_a)]
    sides = [side for side in sides if constant_along(target, list(range(nb)) + side[4])]
    if not sides:
        raise Refuted("units spread over both operands of a contraction")
    reasons = []
    for x, s, free, mine, theirs in sorted(sides, key=lambda side: not is_var_in(side[0], tb.g.pos)):
        t = squash(target, list(range(nb)) + theirs)
        t = t.reshape([target.shape[i] for i in mine])
        t_shape = [1] * len(s)
        for d, n in zip(free, t.shape, strict=True):
            t_shape[d] = n
        try:
            return tb.back(x, np.broadcast_to(t.reshape(t_shape), s))
        except Refuted as fail:
            reasons.append(str(fail))
    raise Refuted("; ".join(reasons))


def conv_back(tb: TraceBack, e: Eqn, target: np.ndarray) -> dict[int, np.ndarray]:
    """conv_general_dilated: the kernel's output features carry the units."""
    dn = e.params["dimension_numbers"]
    other = [d for d in range(target.ndim) if d != dn.out_spec[1]]
    if not constant_along(target, other):
        raise Refuted("units that are not per output feature of a convolution")
    vec = squash(target, other).ravel()
    k_shape = tb.in_shape(e.ins[1])
    t_shape = [1] * len(k_shape)
    t_shape[dn.rhs_spec[0]] = vec.size
    return tb.back(e.ins[1], np.broadcast_to(vec.reshape(t_shape), k_shape))


# ----------------------------------------------------------------------------------------------
# The table.

BACKWARD_RULES: dict[Primitive, BackwardRule] = {
    **dict.fromkeys(
        (
            lax.reshape_p,
            lax.squeeze_p,
            lax.neg_p,
            *find_primitives("convert_element_type_p", "copy_p", "reduce_precision_p"),
        ),
        reshape_back,
    ),
    lax.transpose_p: transpose_back,
    lax.rev_p: rev_back,
    lax.broadcast_in_dim_p: broadcast_back,
    **dict.fromkeys(
        find_primitives("add_p", "sub_p", "add_jaxvals_p", "max_p", "min_p", "select_n_p"), merge_back
    ),
    lax.mul_p: product_back,
    lax.div_p: product_back,
    **dict.fromkeys(
        find_primitives(
            # not the generic reduce_window_p: JAX takes it only for a reducer or initial value that is
            # not a standard pool's (lax.max with init 1.0, a product), which is not homogeneous
            "reduce_window_sum_p", "reduce_window_max_p", "reduce_window_min_p"
        ),
        window_back,
    ),
    **dict.fromkeys((lax.reduce_sum_p, lax.reduce_max_p, lax.reduce_min_p), reduce_back),
    lax.concatenate_p: concatenate_back,
    lax.dot_general_p: dot_back,
    lax.conv_general_dilated_p: conv_back,
}
