"""A traced function as one flat graph of equations: the input of discover's forward and backward passes.

``build_graph(fn, params, rest)`` traces ``fn(params, *rest)`` with :func:`jax.make_jaxpr` and
flattens the closed jaxpr: nested calls (``jit``, ``closed_call``, ``custom_jvp_call``,
``custom_vjp_call``, ``remat`` / ``checkpoint``) are inlined, ``optimization_barrier`` and
``stop_gradient`` dropped (identities on values), and every branch of a ``cond`` inlined with the
results merged by a ``select_n`` on the branch index, so that a unit is confirmed only where every
branch keeps it. Variables become ints; literals and closed-over constants become :class:`Const`.

Alongside the equations the graph records what the passes ask about a variable: its shape, the
equation defining it, which params leaf an input is, whether it is all zeros (a zero bias, a zero
padding value), and, for views of a params leaf through layout primitives (:data:`LAYOUT_RULES`),
the flat leaf position of each element. Numerics: NumPy index arithmetic on shapes only, nothing
is evaluated on device.

Primitives are keyed by their :class:`jax.extend.core.Primitive` objects (JAX's own idiom, as
``ad.primitive_jvps``), never by name: names change between JAX versions (``pjit`` -> ``jit``,
``remat`` -> ``remat2``) where the objects stay the same.

References:
  Stock, Defossez, Gribonval, Jegou, Usunier. Equi-normalization of neural networks. ICLR 2019,
  Sec. 3.1, 4.1-4.3 (the networks whose graphs are read here).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np
from jax import lax
from jax.extend import core as jcore

try:  # the full list of primitives (jit, closed_call, custom_jvp_call, remat, ...)
    from jax.extend.core import primitives as _extend_primitives
except ImportError:  # pragma: no cover - older JAX
    _extend_primitives = None

__all__ = [
    "CALL_JAXPR_PARAM",
    "IDENTITY_PRIMITIVES",
    "LAYOUT_RULES",
    "Const",
    "Eqn",
    "JaxprGraph",
    "apply_layout",
    "build_graph",
    "find_primitives",
    "flatten_jaxpr",
    "is_var_in",
    "is_zero_const",
]

PyTree = Any
Primitive = jcore.Primitive


def find_primitives(*names: str) -> tuple[Primitive, ...]:
    """The primitives named ``names`` (attribute names such as ``"add_p"``) in ``jax.lax`` or
    ``jax.extend.core.primitives``; names absent from the installed JAX are skipped."""
    found: list[Primitive] = []
    for name in names:
        for module in (lax, _extend_primitives):
            prim = getattr(module, name, None) if module is not None else None
            if isinstance(prim, Primitive) and prim not in found:
                found.append(prim)
                break
    return tuple(found)


class Const(NamedTuple):
    """A literal or closed-over constant operand. ``captured``: an array the traced function closed
    over (a constvar), which may be state that changes after the trace, such as BN running statistics
    read from a closure: never taken to be zero (:func:`is_zero_const`), whatever it holds now."""

    value: Any
    captured: bool = False


class Eqn(NamedTuple):
    """One equation of the flattened graph."""

    prim: Primitive
    ins: tuple  # var ids (int) or Const
    outs: tuple[int, ...]
    params: dict


class JaxprGraph(NamedTuple):
    """The flattened equations of a traced function and what the passes need to know of its vars."""

    eqns: list[Eqn]
    shapes: dict[int, tuple[int, ...]]
    producer: dict[int, int]  # var -> index of the eqn that defines it
    param_in: dict[int, int]  # var -> params leaf index
    other_in: set[int]
    input_vars: tuple[int, ...]  # the traced non-params inputs, in flattening order
    outs: list[Any]
    out_names: list[str]  # the path of each output leaf in the function's result ('' for a lone array)
    zero: set[int]  # vars known to be all zeros
    pos: dict[int, tuple[int, np.ndarray]]  # var -> (leaf, flat leaf position of each element)
    uses: dict[int, set[int]]  # leaf -> eqns (other than layout ops) reading a view of it


def is_zero_const(x: Any) -> bool:
    """Whether ``x`` is a non-empty literal constant that is all zeros. A captured array (a closure's
    value at trace time, :class:`Const`) is not: a running mean of 0 at init is not 0 after training,
    and a junction found through ``x - mean`` would hold at init alone."""
    return (
        isinstance(x, Const)
        and not x.captured
        and np.size(x.value) > 0
        and not np.any(np.asarray(x.value))
    )


def constant_addend_reason(x: Const) -> str:
    """Why a scaled value plus the constant ``x`` refutes a junction, naming a captured array as such."""
    if x.captured:
        return (
            "a scaled value plus an array the function closes over (state such as BN running "
            "statistics: pass it as an input, e.g. nnx.split(model, nnx.Param, nnx.BatchStat, ...))"
        )
    return "a scaled value plus a constant"


def is_var_in(x: Any, table: Any) -> bool:
    """Whether operand ``x`` is a var (not a constant) present in ``table``."""
    return isinstance(x, int) and x in table


# ----------------------------------------------------------------------------------------------
# Layout primitives: they only move elements. Each rule maps an array of the operand's full shape
# (unit ids, leaf positions) to the output's: ``rule(x, params, out_shape) -> array``.


def _reshape(x: np.ndarray, params: dict, out_shape: tuple[int, ...]) -> np.ndarray:
    return np.reshape(x, out_shape)


def _same(x: np.ndarray, params: dict, out_shape: tuple[int, ...]) -> np.ndarray:
    return x


def _transpose(x: np.ndarray, params: dict, out_shape: tuple[int, ...]) -> np.ndarray:
    return np.transpose(x, params["permutation"])


def _broadcast_in_dim(x: np.ndarray, params: dict, out_shape: tuple[int, ...]) -> np.ndarray:
    shape = [1] * len(out_shape)
    for src, dst in enumerate(params["broadcast_dimensions"]):
        shape[dst] = x.shape[src]
    return np.broadcast_to(np.reshape(x, shape), out_shape)


def _rev(x: np.ndarray, params: dict, out_shape: tuple[int, ...]) -> np.ndarray:
    return np.flip(x, axis=tuple(params["dimensions"]))


def _slice(x: np.ndarray, params: dict, out_shape: tuple[int, ...]) -> np.ndarray:
    strides = params.get("strides") or (1,) * x.ndim
    idx = tuple(
        slice(a, b, s)
        for a, b, s in zip(params["start_indices"], params["limit_indices"], strides, strict=True)
    )
    return x[idx]


LayoutRule = Callable[[np.ndarray, dict, tuple[int, ...]], np.ndarray]

LAYOUT_RULES: dict[Primitive, LayoutRule] = {
    lax.reshape_p: _reshape,
    lax.squeeze_p: _reshape,
    lax.transpose_p: _transpose,
    lax.broadcast_in_dim_p: _broadcast_in_dim,
    lax.rev_p: _rev,
    lax.slice_p: _slice,
    **dict.fromkeys(find_primitives("convert_element_type_p", "copy_p", "reduce_precision_p"), _same),
}


def apply_layout(e: Eqn, x: np.ndarray, out_shape: tuple[int, ...]) -> np.ndarray:
    """Apply layout equation ``e`` to a numpy array (ids or positions) of the operand's full shape."""
    return LAYOUT_RULES[e.prim](x, e.params, out_shape)


# ----------------------------------------------------------------------------------------------
# Flattening: which primitives are calls (and which param holds their jaxpr), which are identities.

CALL_JAXPR_PARAM: dict[Primitive, str] = {
    **dict.fromkeys(find_primitives("jit_p", "pjit_p", "remat_p"), "jaxpr"),
    **dict.fromkeys(
        find_primitives("closed_call_p", "call_p", "custom_jvp_call_p", "custom_vjp_call_p"), "call_jaxpr"
    ),
    **dict.fromkeys(find_primitives("custom_vjp_call_jaxpr_p"), "fun_jaxpr"),
}

IDENTITY_PRIMITIVES: frozenset[Primitive] = frozenset(
    find_primitives("optimization_barrier_p", "stop_gradient_p")
)


def _called_jaxpr(e: Any) -> Any:
    """The (closed) jaxpr that call equation ``e`` runs, or None where ``e`` is not a call."""
    key = CALL_JAXPR_PARAM.get(e.primitive)
    return e.params.get(key) if key else None


class _Flattener:
    """Inlines nested jaxprs into one list of :class:`Eqn` with int vars."""

    def __init__(self) -> None:
        self.count = 0
        self.shapes: dict[int, tuple[int, ...]] = {}
        self.eqns: list[Eqn] = []

    def fresh(self, var: Any) -> int:
        i = self.count
        self.count += 1
        self.shapes[i] = tuple(getattr(var.aval, "shape", ()))
        return i

    def inline(self, jaxpr: jcore.Jaxpr, consts: list, args: list) -> list:
        env: dict[Any, Any] = {}
        for v, c in zip(jaxpr.constvars, consts, strict=True):
            env[v] = Const(c, captured=True)
        for v, a in zip(jaxpr.invars, args, strict=True):
            env[v] = a

        def read(v: Any) -> Any:
            return Const(v.val) if isinstance(v, jcore.Literal) else env[v]

        for e in jaxpr.eqns:
            ins = [read(v) for v in e.invars]
            if e.primitive in IDENTITY_PRIMITIVES:
                outs = ins
            elif e.primitive is lax.cond_p:
                outs = self.inline_cond(e, ins)
            elif _called_jaxpr(e) is not None:
                sub = _called_jaxpr(e)
                sub_jaxpr = sub.jaxpr if hasattr(sub, "jaxpr") else sub
                sub_consts = list(sub.consts) if hasattr(sub, "consts") else []
                outs = self.inline(sub_jaxpr, sub_consts, ins[len(ins) - len(sub_jaxpr.invars) :])
            else:
                outs = [self.fresh(v) for v in e.outvars]
                self.eqns.append(Eqn(e.primitive, tuple(ins), tuple(outs), dict(e.params)))
            for v, o in zip(e.outvars, outs, strict=True):
                env[v] = o
        return [read(v) for v in jaxpr.outvars]

    def inline_cond(self, e: Any, ins: list) -> list:
        """Every branch inlined, the results chosen by ``select_n`` on the branch index."""
        branch_outs = [self.inline(b.jaxpr, list(b.consts), ins[1:]) for b in e.params["branches"]]
        outs = []
        for k, v in enumerate(e.outvars):
            out = self.fresh(v)
            self.eqns.append(Eqn(lax.select_n_p, (ins[0], *(b[k] for b in branch_outs)), (out,), {}))
            outs.append(out)
        return outs


def flatten_jaxpr(closed: jcore.ClosedJaxpr) -> tuple[list[Eqn], dict, list, list]:
    """``(eqns, shapes, input vars, output operands)`` of ``closed`` with nested jaxprs inlined."""
    flat = _Flattener()
    invars = [flat.fresh(v) for v in closed.jaxpr.invars]
    outs = flat.inline(closed.jaxpr, list(closed.consts), invars)
    return flat.eqns, flat.shapes, invars, outs


def _trace(fn: Callable, params: PyTree, rest: tuple) -> tuple[jcore.ClosedJaxpr, Any, list, Any]:
    """The closed jaxpr of ``fn(params, *rest)`` with params and the array leaves of ``rest``
    traced (Python values such as ``train=False`` stay static, as in the call)."""
    p_leaves, p_def = jax.tree_util.tree_flatten(params)
    r_leaves, r_def = jax.tree_util.tree_flatten(rest)
    traced = [isinstance(leaf, jax.Array | np.ndarray) for leaf in r_leaves]

    def flat_fn(pl, tl):
        arrays = iter(tl)
        rl = [next(arrays) if is_traced else leaf for leaf, is_traced in zip(r_leaves, traced, strict=True)]
        args, kwargs = jax.tree_util.tree_unflatten(r_def, rl)
        return fn(jax.tree_util.tree_unflatten(p_def, pl), *args, **kwargs)

    arrays = [leaf for leaf, is_traced in zip(r_leaves, traced, strict=True) if is_traced]
    closed, out_tree = jax.make_jaxpr(flat_fn, return_shape=True)(p_leaves, arrays)
    return closed, out_tree, p_leaves, p_def


def _zeros_and_positions(eqns: list[Eqn], shapes: dict, param_in: dict[int, int]):
    """The vars known to be all zeros, and the leaf position of each element of every view of a
    params leaf through layout primitives."""
    zero: set[int] = set()
    pos: dict[int, tuple[int, np.ndarray]] = {
        v: (i, np.arange(int(np.prod(shapes[v], dtype=np.int64))).reshape(shapes[v]))
        for v, i in param_in.items()
    }
    for e in eqns:
        ins = e.ins
        if e.prim in LAYOUT_RULES and len(ins) >= 1:
            src = ins[0]
            if is_var_in(src, zero) or is_zero_const(src):
                zero.add(e.outs[0])
            if is_var_in(src, pos):
                leaf, arr = pos[src]
                pos[e.outs[0]] = (leaf, apply_layout(e, arr, shapes[e.outs[0]]))
        elif e.prim is lax.mul_p and any(is_zero_const(a) or is_var_in(a, zero) for a in ins):
            zero.add(e.outs[0])
    return zero, pos


def build_graph(fn: Callable, params: PyTree, rest: tuple) -> tuple[JaxprGraph, list, Any]:
    """``(graph, params leaves, params treedef)`` of ``fn(params, *args, **kwargs)`` with
    ``rest = (args, kwargs)``."""
    closed, out_tree, p_leaves, p_def = _trace(fn, params, rest)
    out_names = [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(out_tree)[0]]
    eqns, shapes, invars, outs = flatten_jaxpr(closed)
    param_in = {v: i for i, v in enumerate(invars[: len(p_leaves)])}
    producer = {o: k for k, e in enumerate(eqns) for o in e.outs}
    zero, pos = _zeros_and_positions(eqns, shapes, param_in)
    uses: dict[int, set[int]] = {i: set() for i in param_in.values()}
    for k, e in enumerate(eqns):
        if e.prim not in LAYOUT_RULES:
            for x in e.ins:
                if is_var_in(x, pos):
                    uses[pos[x][0]].add(k)
    other = tuple(invars[len(p_leaves) :])
    graph = JaxprGraph(eqns, shapes, producer, param_in, set(other), other, outs, out_names, zero, pos, uses)
    return graph, p_leaves, p_def
