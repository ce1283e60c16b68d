"""Find a network's rescaling symmetries by tracing it to a jaxpr: one tracer of "what scales with what".

Hypothesis for a candidate producer (a params leaf and an axis): multiply the leaf by a positive
per-unit vector d along that axis. An abstract interpreter follows, for every intermediate value,
which elements are scaled by which unit's d (an integer "unit id" array, -1 for unscaled):

- through positively homogeneous maps: ReLU / leaky ReLU (``max(x, 0)``, ``select`` on ``x >= 0``),
  max / average pooling (``reduce_window`` whose windows do not mix units), means, reshapes,
  transposes, slices, concatenations, multiplication by unscaled values (BN's ``x_hat * gamma``),
  division by unscaled values;
- into a *consumer*: a ``dot_general`` / ``conv_general_dilated`` contracting the scaled units
  against a params leaf; that leaf's slice is divided by d and the result is unscaled;
- where two values meet in an addition, both must carry the same scaling; an unscaled addend is
  traced back to the params that would have to be scaled with it (a bias, the other branch of a
  residual, the shortcut of a type-C ResNet, every block writing an identity residual stream),
  they join the producers, and the pass restarts;
- anything else (tanh, sigmoid, GELU, softmax, LayerNorm / BN normalization statistics, a
  non-zero threshold, control flow, a scaled value reaching the function output) refutes the
  hypothesis. Nothing is guessed: refuted unit axes are left out with the reason.

A confirmed hypothesis is one :class:`~jaxnorm.enorm.spec.Junction` (paper Sec. 3.1, 4.1-4.3).

References:
  Stock, Defossez, Gribonval, Jegou, Usunier. Equi-normalization of neural networks. ICLR 2019.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jcore

from jaxnorm.enorm.spec import Junction, Spec
from jaxnorm.enorm.trees import is_variables, split_params

__all__ = ["discover", "input_links", "scale_invariant_kernels"]

PyTree = Any


class _Fail(Exception):
    """The hypothesis is refuted; the message is the printable reason."""


class _Need(Exception):
    """An unscaled addend must be scaled too: (var, target ids)."""

    def __init__(self, var: int, target: np.ndarray, power: Fraction = Fraction(1)):
        super().__init__()
        self.var, self.target, self.power = var, target, power


class _Eqn(NamedTuple):
    prim: str
    ins: tuple  # var ids (int) or _Lit
    outs: tuple[int, ...]
    params: dict


class _Lit(NamedTuple):
    value: Any


class _Graph(NamedTuple):
    eqns: list[_Eqn]
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


# ----------------------------------------------------------------------------------------------
# Flattening a jaxpr (nested jit / custom_jvp / custom_vjp / remat inlined; optimization barriers
# and stop_gradient dropped; every branch of a cond inlined, the results merged by a select_n on
# the branch index).

_INLINE = {"jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
           "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr",
           "custom_vjp_call_jaxpr": "fun_jaxpr", "remat": "jaxpr", "checkpoint": "jaxpr"}


def _flatten_jaxpr(closed: jcore.ClosedJaxpr) -> tuple[list[_Eqn], dict, list, list]:
    counter = iter(range(1 << 62))
    shapes: dict[int, tuple[int, ...]] = {}
    eqns: list[_Eqn] = []

    def fresh(var) -> int:
        i = next(counter)
        shapes[i] = tuple(getattr(var.aval, "shape", ()))
        return i

    def inline(jaxpr: jcore.Jaxpr, consts: list, args: list) -> list:
        env: dict[Any, Any] = {}
        for v, c in zip(jaxpr.constvars, consts, strict=True):
            env[v] = _Lit(c)
        for v, a in zip(jaxpr.invars, args, strict=True):
            env[v] = a

        def read(v):
            return _Lit(v.val) if isinstance(v, jcore.Literal) else env[v]

        for e in jaxpr.eqns:
            ins = [read(v) for v in e.invars]
            if e.primitive.name in ("optimization_barrier", "stop_gradient"):  # identities on values
                for v, x in zip(e.outvars, ins, strict=True):
                    env[v] = x
                continue
            if e.primitive.name == "cond":  # every branch inlined, the results chosen by select_n
                branch_outs = [inline(b.jaxpr, list(b.consts), ins[1:]) for b in e.params["branches"]]
                for k, v in enumerate(e.outvars):
                    env[v] = fresh(v)
                    eqns.append(_Eqn("select_n", (ins[0], *(outs[k] for outs in branch_outs)), (env[v],), {}))
                continue
            key = _INLINE.get(e.primitive.name)
            sub = e.params.get(key) if key else None
            if sub is not None:
                sub_jaxpr = sub.jaxpr if hasattr(sub, "jaxpr") else sub
                sub_consts = list(sub.consts) if hasattr(sub, "consts") else []
                n_in = len(sub_jaxpr.invars)
                outs = inline(sub_jaxpr, sub_consts, ins[len(ins) - n_in:])
                for v, o in zip(e.outvars, outs, strict=True):
                    env[v] = o
                continue
            outs = tuple(fresh(v) for v in e.outvars)
            for v, o in zip(e.outvars, outs, strict=True):
                env[v] = o
            eqns.append(_Eqn(e.primitive.name, tuple(ins), outs, dict(e.params)))
        return [read(v) for v in jaxpr.outvars]

    invars = [fresh(v) for v in closed.jaxpr.invars]
    outs = inline(closed.jaxpr, list(closed.consts), invars)
    return eqns, shapes, invars, outs


def _is_zero_lit(x: Any) -> bool:
    return isinstance(x, _Lit) and np.size(x.value) > 0 and not np.any(np.asarray(x.value))


_LAYOUT = {"reshape", "transpose", "broadcast_in_dim", "squeeze", "expand_dims", "convert_element_type",
           "copy", "copy_p", "rev", "slice", "reduce_precision"}


def _layout(e: _Eqn, x: np.ndarray, out_shape: tuple[int, ...]) -> np.ndarray:
    """Apply a layout primitive to a numpy array (ids or positions) of the operand's full shape."""
    p = e.params
    if e.prim == "reshape":
        return np.reshape(x, out_shape)
    if e.prim == "transpose":
        return np.transpose(x, p["permutation"])
    if e.prim == "broadcast_in_dim":
        shape = [1] * len(out_shape)
        for src, dst in enumerate(p["broadcast_dimensions"]):
            shape[dst] = x.shape[src]
        return np.broadcast_to(np.reshape(x, shape), out_shape)
    if e.prim == "squeeze":
        return np.reshape(x, out_shape)
    if e.prim == "expand_dims":
        return np.reshape(x, out_shape)
    if e.prim == "rev":
        return np.flip(x, axis=tuple(p["dimensions"]))
    if e.prim == "slice":
        strides = p.get("strides") or (1,) * x.ndim
        idx = tuple(slice(a, b, s) for a, b, s in zip(p["start_indices"], p["limit_indices"],
                                                       strides, strict=True))
        return x[idx]
    return x  # convert_element_type, copy, reduce_precision


def _build_graph(fn: Callable, params: PyTree, rest: tuple) -> tuple[_Graph, list, Any]:
    p_leaves, p_def = jax.tree_util.tree_flatten(params)
    r_leaves, r_def = jax.tree_util.tree_flatten(rest)
    # arrays are traced; Python values (``train=False``, a string option) stay static, as in the call
    traced = [isinstance(leaf, jax.Array | np.ndarray) for leaf in r_leaves]

    def flat_fn(pl, tl):
        arrays = iter(tl)
        rl = [next(arrays) if is_traced else leaf for leaf, is_traced in zip(r_leaves, traced, strict=True)]
        args, kwargs = jax.tree_util.tree_unflatten(r_def, rl)
        return fn(jax.tree_util.tree_unflatten(p_def, pl), *args, **kwargs)

    arrays = [leaf for leaf, is_traced in zip(r_leaves, traced, strict=True) if is_traced]
    closed, out_tree = jax.make_jaxpr(flat_fn, return_shape=True)(p_leaves, arrays)
    out_names = [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(out_tree)[0]]
    eqns, shapes, invars, outs = _flatten_jaxpr(closed)
    param_in = {v: i for i, v in enumerate(invars[: len(p_leaves)])}
    producer = {o: k for k, e in enumerate(eqns) for o in e.outs}
    zero: set[int] = set()
    pos: dict[int, tuple[int, np.ndarray]] = {
        v: (i, np.arange(int(np.prod(shapes[v], dtype=np.int64))).reshape(shapes[v]))
        for v, i in param_in.items()
    }
    for e in eqns:
        ins = e.ins
        if e.prim in _LAYOUT and len(ins) >= 1:
            src = ins[0]
            if (isinstance(src, int) and src in zero) or _is_zero_lit(src):
                zero.add(e.outs[0])
            if isinstance(src, int) and src in pos:
                leaf, arr = pos[src]
                pos[e.outs[0]] = (leaf, _layout(e, arr, shapes[e.outs[0]]))
        elif e.prim == "mul" and any(
            _is_zero_lit(a) or (isinstance(a, int) and a in zero) for a in ins
        ):
            zero.add(e.outs[0])
    uses: dict[int, set[int]] = {i: set() for i in param_in.values()}
    for k, e in enumerate(eqns):
        if e.prim not in _LAYOUT:
            for x in e.ins:
                if _in(x, pos):
                    uses[pos[x][0]].add(k)
    graph = _Graph(eqns, shapes, producer, param_in, set(invars[len(p_leaves):]),
                   tuple(invars[len(p_leaves):]), outs, out_names, zero,
                   pos, uses)
    return graph, p_leaves, p_def


# ----------------------------------------------------------------------------------------------
# Abstract values: None (unscaled), _Scaled (ids, power), or _Broken(reason).


class _Scaled(NamedTuple):
    ids: np.ndarray  # broadcastable to the var's shape; -1: unscaled element
    power: Fraction


class _Broken(NamedTuple):
    reason: str


def _full(ids: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    return np.broadcast_to(ids, shape)


def _const_along(ids: np.ndarray, axes) -> bool:
    for a in axes:
        if ids.shape[a] > 1 and not np.all(ids == np.take(ids, [0], axis=a)):
            return False
    return True


def _squash(ids: np.ndarray, axes) -> np.ndarray:
    """Keep one slice along ``axes`` (ids known constant there), keepdims."""
    for a in axes:
        ids = np.take(ids, [0], axis=a)
    return ids


class _Interp:
    """One forward pass for a set of producer hypotheses."""

    def __init__(self, graph: _Graph, seeds: dict[int, np.ndarray], strict: bool,
                 input_seeds: dict[int, Any] | None = None):
        self.g, self.seeds, self.strict = graph, seeds, strict
        self.transport = input_seeds is not None
        self.consumers: dict[int, np.ndarray] = {}
        self.consumed: dict[int, set[int]] = {}
        self.at = -1
        self.val: dict[int, Any] = {}
        for v, leaf in graph.param_in.items():
            if leaf in seeds:
                self.val[v] = _Scaled(seeds[leaf], Fraction(1))
        for v, scaled in (input_seeds or {}).items():
            self.val[v] = scaled

    def read(self, x: Any) -> Any:
        if isinstance(x, _Lit):
            return None
        return self.val.get(x)

    def is_zero(self, x: Any) -> bool:
        return _is_zero_lit(x) or (isinstance(x, int) and x in self.g.zero)

    def shape(self, x: Any) -> tuple[int, ...]:
        return tuple(np.shape(x.value)) if isinstance(x, _Lit) else self.g.shapes[x]

    def run(self) -> dict[int, np.ndarray]:
        for k, e in enumerate(self.g.eqns):
            self.at = k
            vals = [self.read(x) for x in e.ins]
            if all(v is None for v in vals):
                continue
            broken = next((v for v in vals if isinstance(v, _Broken)), None)
            if broken is not None:
                outs = [broken] * len(e.outs)
            else:
                try:
                    outs = self.step(e, vals)
                except _Fail as fail:
                    outs = [_Broken(f"{fail} (at {e.prim})")] * len(e.outs)
            for o, v in zip(e.outs, outs, strict=True):
                if v is not None:
                    self.val[o] = v
        for o, name in zip(self.g.outs, self.g.out_names, strict=True):
            v = self.read(o)
            if isinstance(v, _Broken):
                raise _Fail(v.reason)
            if isinstance(v, _Scaled) and v.power != 0 and np.any(v.ids >= 0):
                where = f"the function output {name}" if name else "the function output"
                raise _Fail(f"the scaled units reach {where} without a consumer")
        for leaf, eqns in self.consumed.items():
            if self.g.uses[leaf] - eqns:
                raise _Fail("a consumer parameter is also used where the units do not flow")
        return self.consumers

    # -- rules ----------------------------------------------------------------------------------

    def scaled(self, ids: np.ndarray, power: Fraction) -> Any:
        if power == 0 or not np.any(ids >= 0):
            return None
        if self.strict and power != 1:
            raise _Fail("scale enters non-linearly (a product or power of scaled values)")
        return _Scaled(ids, power)

    def step(self, e: _Eqn, vals: list) -> list:
        prim, out_shape = e.prim, self.g.shapes[e.outs[0]]
        if prim in _LAYOUT:
            if prim == "convert_element_type" and not np.issubdtype(e.params["new_dtype"],
                                                                    np.floating):
                raise _Fail("scaled values converted to a non-float type")
            v = vals[0]
            return [_Scaled(_layout(e, _full(v.ids, self.shape(e.ins[0])), out_shape), v.power)]
        if prim in ("neg", "abs"):
            return [vals[0]]
        if prim == "sign":
            return [None]
        if prim in ("add", "sub", "add_any", "max", "min", "select_n"):
            return [self.merge(e, vals, out_shape)]
        if prim in ("ge", "gt", "le", "lt", "eq", "ne"):
            a, b = vals
            zero_other = self.is_zero(e.ins[1]) if a is not None else self.is_zero(e.ins[0])
            if (a is None or b is None) and zero_other:
                return [None]
            if a is not None and b is not None and self.same(a, b, out_shape):
                return [None]
            raise _Fail("a comparison with a non-zero threshold")
        if prim in ("mul", "div"):
            return [self.product(e, vals, out_shape)]
        if prim in ("integer_pow", "square", "sqrt", "rsqrt") and not self.strict:
            k = {"square": Fraction(2), "sqrt": Fraction(1, 2), "rsqrt": Fraction(-1, 2)}.get(
                prim, Fraction(e.params.get("y", 1)))
            return [self.scaled(vals[0].ids, vals[0].power * k)]
        if prim in ("reduce_sum", "reduce_max", "reduce_min", "argmax", "argmin"):
            v, axes = vals[0], tuple(e.params["axes"])
            full = _full(v.ids, self.shape(e.ins[0]))
            if not _const_along(full, axes):
                raise _Fail("a reduction mixes different units")
            if prim in ("argmax", "argmin"):
                return [None]
            return [_Scaled(np.squeeze(_squash(full, axes), axis=axes), v.power)]
        if prim == "top_k":  # along the last axis: values scale with x, indices do not
            v = vals[0]
            full = _full(v.ids, self.shape(e.ins[0]))
            if not _const_along(full, (full.ndim - 1,)):
                raise _Fail("top_k mixes different units")
            values = np.broadcast_to(full[..., :1], self.g.shapes[e.outs[0]])
            return [_Scaled(values, v.power), None]
        if prim == "gather":
            if vals[1] is not None:
                raise _Fail("gather indices that depend on the scale")
            return [self.gather(e, vals[0], out_shape)]
        if prim.startswith("reduce_window"):
            return [self.window(e, vals[0], out_shape)]
        if prim == "concatenate":
            dim = e.params["dimension"]
            parts = [_full(v.ids, self.shape(x)) if v is not None else
                     np.full(self.shape(x), -1) for v, x in zip(vals, e.ins, strict=True)]
            powers = {v.power for v in vals if v is not None}
            if len(powers) > 1:
                raise _Fail("concatenation of differently scaled values")
            return [_Scaled(np.concatenate(parts, axis=dim), powers.pop())]
        if prim == "split":
            v = vals[0]
            full = _full(v.ids, self.shape(e.ins[0]))
            cuts = np.cumsum(e.params["sizes"])[:-1]
            return [self.scaled(part, v.power)
                    for part in np.split(full, cuts, axis=e.params["axis"])]
        if prim == "pad":
            v, pad_value = vals
            if pad_value is not None or not self.is_zero(e.ins[1]):
                raise _Fail("padding with a non-zero value")
            config = e.params["padding_config"]
            full = _full(v.ids, self.shape(e.ins[0]))
            if any(lo < 0 or hi < 0 or interior for lo, hi, interior in config):
                axes = [i for i, (lo, hi, it) in enumerate(config) if lo < 0 or hi < 0 or it]
                if not _const_along(full, axes):
                    raise _Fail("interior or negative padding across units")
                return [_Scaled(_squash(full, axes), v.power)]
            return [_Scaled(np.pad(full, [(lo, hi) for lo, hi, _ in config], mode="edge"), v.power)]
        if prim == "dot_general":
            return [self.dot(e, vals, out_shape)]
        if prim == "conv_general_dilated":
            return [self.conv(e, vals, out_shape)]
        raise _Fail(f"{prim} is not positively homogeneous (or not known to be)")

    def gather(self, e: _Eqn, v: _Scaled, shape) -> Any:
        """A gather whose indices pick along axes where every unit is the same: each output entry
        belongs to the unit of the operand entries at its batching / slice coordinates."""
        dims = e.params["dimension_numbers"]
        full = _full(v.ids, self.shape(e.ins[0]))
        if not _const_along(full, tuple(dims.start_index_map)):
            raise _Fail("a gather that picks among different units")
        for axis, size in enumerate(e.params["slice_sizes"]):
            if size != full.shape[axis] and axis not in (*dims.start_index_map, *dims.operand_batching_dims):
                if not _const_along(full, (axis,)):
                    raise _Fail("a gather that slices across units")
        batch_out = [d for d in range(len(shape)) if d not in dims.offset_dims]
        index_dims = [d for d in range(len(self.shape(e.ins[1])) - 1)]  # the last holds the index vector
        grid = np.indices(shape, sparse=True)
        coords: list[Any] = [0] * full.ndim
        offset_axes = [a for a in range(full.ndim)
                       if a not in dims.collapsed_slice_dims and a not in dims.operand_batching_dims]
        for axis, out_dim in zip(offset_axes, dims.offset_dims, strict=True):
            coords[axis] = grid[out_dim] if e.params["slice_sizes"][axis] == full.shape[axis] else 0
        for axis, index_dim in zip(dims.operand_batching_dims, dims.start_indices_batching_dims, strict=True):
            coords[axis] = grid[batch_out[index_dims.index(index_dim)]]
        return self.scaled(np.broadcast_to(full[tuple(coords)], shape), v.power)

    def same(self, a: _Scaled, b: _Scaled, shape) -> bool:
        return a.power == b.power and np.array_equal(_full(a.ids, shape), _full(b.ids, shape))

    def merge(self, e: _Eqn, vals: list, shape) -> Any:
        """add / sub / max / min / select_n: every non-zero operand scaled the same way."""
        ins, vals = list(e.ins), list(vals)
        if e.prim == "select_n":
            if vals[0] is not None:
                raise _Fail("a selection predicate that depends on the scale")
            ins, vals = ins[1:], vals[1:]
        scaled = [v for v in vals if v is not None]
        ref = scaled[0]
        for v in scaled[1:]:
            if not self.same(ref, v, shape):
                raise _Fail("values scaled by different units meet")
        for x, v in zip(ins, vals, strict=True):
            if v is not None or self.is_zero(x):
                continue
            if e.prim in ("max", "min", "select_n") or ref.power != 1:
                if not self.strict and e.prim == "add" and isinstance(x, _Lit):
                    continue  # an epsilon added to a scale statistic (mask mode)
                raise _Fail(f"{e.prim} with an unscaled non-zero operand")
            if not isinstance(x, int):
                raise _Fail("a scaled value plus a constant")
            target = _full(ref.ids, shape)
            axes = [i for i, n in enumerate(self.shape(x)) if n == 1 and shape[i] > 1]
            if not _const_along(target, axes):
                raise _Fail("a broadcast addend would need several units")
            if not self.strict and not self.transport:
                raise _Fail("a scaled value plus an unscaled one")
            raise _Need(x, _squash(target, axes), ref.power)
        return _Scaled(_full(ref.ids, shape), ref.power)

    def product(self, e: _Eqn, vals: list, shape) -> Any:
        a, b = vals
        if any(self.is_zero(x) for x in e.ins) and e.prim == "mul":
            return None
        if e.prim == "div" and b is not None:
            if a is None:
                return self.scaled(_full(b.ids, shape), -b.power)
            if not np.array_equal(_full(a.ids, shape), _full(b.ids, shape)):
                raise _Fail("division of values scaled by different units")
            return self.scaled(_full(a.ids, shape), a.power - b.power)
        if a is not None and b is not None:
            if not np.array_equal(_full(a.ids, shape), _full(b.ids, shape)):
                raise _Fail("product of values scaled by different units")
            return self.scaled(_full(a.ids, shape), a.power + b.power)
        v = a if a is not None else b
        return _Scaled(v.ids, v.power)

    def window(self, e: _Eqn, v: _Scaled, shape) -> Any:
        p = e.params
        in_shape = self.shape(e.ins[0])
        full = _full(v.ids, in_shape)
        axes = [i for i in range(len(in_shape))
                if p["window_dimensions"][i] > 1 or p["window_strides"][i] > 1
                or tuple(p["padding"][i]) != (0, 0) or p["base_dilation"][i] > 1
                or p["window_dilation"][i] > 1]
        if not _const_along(full, axes):
            raise _Fail("a pooling window mixes units")
        return _Scaled(_squash(full, axes), v.power)

    def consume(self, x: Any, b_ids: np.ndarray) -> None:
        """Record that params-derived operand ``x`` is divided by d where ``b_ids >= 0``."""
        if not isinstance(x, int) or x not in self.g.pos:
            raise _Fail("scaled units are contracted with a value that is not a parameter")
        leaf, posn = self.g.pos[x]
        if leaf in self.seeds:
            raise _Fail("a parameter would be both a producer and a consumer of the same units")
        posn = _full(posn, self.shape(x)).ravel()
        b_ids = _full(b_ids, self.shape(x)).ravel()
        size = int(np.prod(self.g.shapes[self._leaf_var(leaf)], dtype=np.int64))
        cur = self.consumers.get(leaf, np.full(size, -1)).copy()
        keep = b_ids >= 0
        before = cur[posn[keep]]
        if np.any((before >= 0) & (before != b_ids[keep])):
            raise _Fail("a parameter element would consume two different units")
        cur[posn[keep]] = b_ids[keep]
        # every use of the same element must agree (a broadcast parameter)
        if not np.array_equal(cur[posn[keep]], b_ids[keep]):
            raise _Fail("a broadcast parameter would consume two different units")
        self.consumers[leaf] = cur
        self.consumed.setdefault(leaf, set()).add(self.at)

    def _leaf_var(self, leaf: int) -> int:
        return next(v for v, i in self.g.param_in.items() if i == leaf)

    def dot(self, e: _Eqn, vals: list, shape) -> Any:
        (ca, cb), (ba, bb) = e.params["dimension_numbers"]
        a, b = vals
        if a is not None and b is not None:
            raise _Fail("a product of two scaled tensors")
        sa, sb = self.shape(e.ins[0]), self.shape(e.ins[1])
        side = 0 if a is not None else 1
        v = a if side == 0 else b
        s_shape, c_dims, b_dims = (sa, ca, ba) if side == 0 else (sb, cb, bb)
        o_shape, oc_dims = (sb, cb) if side == 0 else (sa, ca)
        full = _full(v.ids, s_shape)
        free = [i for i in range(len(s_shape)) if i not in c_dims and i not in b_dims]
        if _const_along(full, c_dims):
            sq = _squash(full, c_dims)
            kept = [sq.shape[i] for i in (*b_dims, *free)]
            sq = np.transpose(sq, (*b_dims, *free, *c_dims)).reshape(kept)
            o_free = len(o_shape) - len(oc_dims) - len(b_dims)
            if side == 0:
                out = sq.reshape(kept + [1] * o_free)
            else:
                nb = len(b_dims)
                out = sq.reshape(kept[:nb] + [1] * o_free + kept[nb:])
            return _Scaled(np.broadcast_to(out, shape), v.power)
        if not _const_along(full, (*b_dims, *free)) or b_dims:
            raise _Fail("a contraction that mixes units with other dimensions")
        units = np.transpose(_squash(full, free), (*free, *c_dims))  # varies along c_dims only
        o_ids_shape = [1] * len(o_shape)
        for dc, do in zip(c_dims, oc_dims, strict=True):
            o_ids_shape[do] = s_shape[dc]
        order = np.argsort(oc_dims)
        c_arr = np.transpose(units.reshape([s_shape[d] for d in c_dims]), order)
        self.consume(e.ins[1 - side], c_arr.reshape(o_ids_shape))
        return None

    def conv(self, e: _Eqn, vals: list, shape) -> Any:
        lhs, rhs = vals
        dn = e.params["dimension_numbers"]
        lhs_spec, rhs_spec, out_spec = dn.lhs_spec, dn.rhs_spec, dn.out_spec
        if lhs is not None and rhs is not None:
            raise _Fail("a convolution of two scaled tensors")
        if e.params.get("batch_group_count", 1) != 1:
            raise _Fail("batch_group_count convolutions")
        if rhs is not None:
            full = _full(rhs.ids, self.shape(e.ins[1]))
            other = [d for d in range(full.ndim) if d != rhs_spec[0]]
            if not _const_along(full, other):
                raise _Fail("kernel scaling that is not per output feature")
            vec = _squash(full, other).ravel()
            out = [1] * len(shape)
            out[out_spec[1]] = vec.size
            return _Scaled(np.broadcast_to(vec.reshape(out), shape), rhs.power)
        full = _full(lhs.ids, self.shape(e.ins[0]))
        other = [d for d in range(full.ndim) if d != lhs_spec[1]]
        if not _const_along(full, other):
            raise _Fail("input scaling that is not per feature")
        units = _squash(full, other).ravel()  # (C,)
        k_shape = self.shape(e.ins[1])
        groups = e.params["feature_group_count"]
        n_out, n_in = k_shape[rhs_spec[0]], k_shape[rhs_spec[1]]
        o = np.arange(n_out).reshape(-1, 1)
        r = np.arange(n_in).reshape(1, -1)
        table = units[(o // (n_out // groups)) * n_in + r]  # (O, I)
        k_ids_shape = [1] * len(k_shape)
        k_ids_shape[rhs_spec[0]], k_ids_shape[rhs_spec[1]] = n_out, n_in
        arr = table if rhs_spec[0] < rhs_spec[1] else table.T
        self.consume(e.ins[1], arr.reshape(k_ids_shape))
        return None


# ----------------------------------------------------------------------------------------------
# Tracing an unscaled addend back to the parameters that would scale it.


def _need(g: _Graph, var: Any, target: np.ndarray, depth: int = 0,
          inputs: bool = False) -> dict[int, np.ndarray]:
    """The params leaves (keys >= 0) that must be scaled by ``target`` for ``var`` to carry it;
    with ``inputs``, non-params inputs of the function reached this way too (key ``-1 - var``)."""
    if isinstance(var, _Lit) or var in g.zero or not np.any(target >= 0):
        if isinstance(var, _Lit) and not _is_zero_lit(var) and np.any(target >= 0):
            raise _Fail("a scaled value plus a constant")
        return {}
    if depth > 10_000:
        raise _Fail("the graph is too deep to trace back")
    shape = g.shapes[var]
    target = _full(target, shape)
    if var in g.param_in:
        return {g.param_in[var]: np.array(target)}
    if inputs and var in g.other_in:
        return {-1 - var: np.array(target)}
    if var in g.other_in or var not in g.producer:
        raise _Fail("scaled units meet an unscaled input of the function (e.g. a BN running mean)")
    e = g.eqns[g.producer[var]]
    ins = e.ins

    def in_shape(x):
        return tuple(np.shape(x.value)) if isinstance(x, _Lit) else g.shapes[x]

    def back(x, t):
        return _need(g, x, t, depth + 1, inputs)

    def to_operand(x, t):
        s = in_shape(x)
        axes = [i for i, n in enumerate(s) if n == 1 and t.shape[i] > 1]
        if not _const_along(t, axes):
            raise _Fail("a broadcast operand would need several units")
        return _squash(t, axes)

    if e.prim in ("reshape", "squeeze", "expand_dims", "convert_element_type", "copy", "copy_p",
                  "reduce_precision", "neg"):
        return back(ins[0], np.reshape(target, in_shape(ins[0])))
    if e.prim == "transpose":
        return back(ins[0], np.transpose(target, np.argsort(e.params["permutation"])))
    if e.prim == "rev":
        return back(ins[0], np.flip(target, axis=tuple(e.params["dimensions"])))
    if e.prim == "broadcast_in_dim":
        dims = e.params["broadcast_dimensions"]
        s = in_shape(ins[0])
        new = [i for i in range(len(shape)) if i not in dims or s[dims.index(i)] == 1]
        if not _const_along(target, new):
            raise _Fail("a broadcast operand would need several units")
        return back(ins[0], np.reshape(_squash(target, new), s))
    if e.prim in ("add", "sub", "add_any", "max", "min", "select_n"):
        out: dict[int, np.ndarray] = {}
        operands = ins[1:] if e.prim == "select_n" else ins
        for x in operands:
            if e.prim in ("max", "min") and (_is_zero_lit(x) or _in(x, g.zero)):
                continue
            _merge_seeds(out, back(x, to_operand(x, target)))
        return out
    if e.prim in ("mul", "div"):
        operands = list(ins[:1]) if e.prim == "div" else sorted(ins, key=lambda x: not _in(x, g.pos))
        reasons = []
        for x in operands:
            if isinstance(x, _Lit):
                continue
            try:
                return back(x, to_operand(x, target))
            except _Fail as fail:
                reasons.append(str(fail))
        raise _Fail("; ".join(reasons) or "a product of constants")
    if e.prim.startswith("reduce_window") or e.prim in ("reduce_sum", "reduce_max", "reduce_min"):
        s = in_shape(ins[0])
        if e.prim.startswith("reduce_window"):
            p = e.params
            axes = [i for i in range(len(s)) if p["window_dimensions"][i] > 1
                    or p["window_strides"][i] > 1 or tuple(p["padding"][i]) != (0, 0)]
            if not _const_along(target, axes):
                raise _Fail("a pooling window would need several units")
            return back(ins[0], _squash(target, axes))
        axes = tuple(e.params["axes"])
        return back(ins[0], np.expand_dims(target, axes))
    if e.prim == "concatenate":
        dim = e.params["dimension"]
        cuts = np.cumsum([in_shape(x)[dim] for x in ins])[:-1]
        out = {}
        for x, part in zip(ins, np.split(target, cuts, axis=dim), strict=True):
            _merge_seeds(out, back(x, part))
        return out
    if e.prim == "dot_general":
        (ca, cb), (ba, bb) = e.params["dimension_numbers"]
        sa, sb = in_shape(ins[0]), in_shape(ins[1])
        nb = len(ba)
        fa = [i for i in range(len(sa)) if i not in ca and i not in ba]
        fb = [i for i in range(len(sb)) if i not in cb and i not in bb]
        out_a = list(range(nb, nb + len(fa)))
        out_b = list(range(nb + len(fa), len(shape)))
        for x, s, free, mine, theirs in [(ins[0], sa, fa, out_a, out_b),
                                         (ins[1], sb, fb, out_b, out_a)]:
            if _const_along(target, list(range(nb)) + theirs):
                t = _squash(target, list(range(nb)) + theirs)
                t = t.reshape([target.shape[i] for i in mine])
                t_shape = [1] * len(s)
                for d, n in zip(free, t.shape, strict=True):
                    t_shape[d] = n
                return back(x, np.broadcast_to(t.reshape(t_shape), s))
        raise _Fail("units spread over both operands of a contraction")
    if e.prim == "conv_general_dilated":
        dn = e.params["dimension_numbers"]
        other = [d for d in range(len(shape)) if d != dn.out_spec[1]]
        if not _const_along(target, other):
            raise _Fail("units that are not per output feature of a convolution")
        vec = _squash(target, other).ravel()
        k_shape = in_shape(ins[1])
        t_shape = [1] * len(k_shape)
        t_shape[dn.rhs_spec[0]] = vec.size
        return back(ins[1], np.broadcast_to(vec.reshape(t_shape), k_shape))
    raise _Fail(f"cannot trace the units back through {e.prim}")


def _in(x: Any, table: Any) -> bool:
    return isinstance(x, int) and x in table


def _merge_seeds(into: dict[int, np.ndarray], new: dict[int, np.ndarray]) -> None:
    for leaf, ids in new.items():
        if leaf in into:
            a, b = into[leaf], ids
            clash = (a >= 0) & (b >= 0) & (a != b)
            if np.any(clash):
                raise _Fail("a parameter would carry two different units")
            into[leaf] = np.where(a >= 0, a, b)
        else:
            into[leaf] = ids


# ----------------------------------------------------------------------------------------------
# Public entry points.


def _hypothesis(g: _Graph, leaf: int, ids: np.ndarray, strict: bool):
    seeds = {leaf: ids}
    for _ in range(1000):
        try:
            return seeds, _Interp(g, seeds, strict).run()
        except _Need as need:
            extra = _need(g, need.var, need.target)
            if not extra:
                raise _Fail("an addend that cannot be scaled") from None
            before = {k: v.copy() for k, v in seeds.items()}
            _merge_seeds(seeds, extra)
            if all(k in before and np.array_equal(before[k], v) for k, v in seeds.items()):
                raise _Fail("tracing the addend back added no parameters") from None
    raise _Fail("no fixed point in 1000 expansions")


def _entry(path: tuple, ids: np.ndarray) -> tuple:
    varying = [a for a in range(ids.ndim) if not _const_along(ids, [a])]
    n = int(ids.max()) + 1
    if len(varying) == 1:
        a = varying[0]
        vec = _squash(ids, [d for d in range(ids.ndim) if d != a]).ravel()
        if vec.size == n and np.array_equal(vec, np.arange(n)):
            return (path, a)
        return (path, a, vec.astype(np.int32))
    compact = _squash(ids, [d for d in range(ids.ndim) if d not in varying])
    return (path, ids.ndim - 1, compact.astype(np.int32))


def _paths(params: PyTree) -> list[tuple]:
    with_paths, _ = jax.tree_util.tree_flatten_with_path(params)
    return [tuple(getattr(k, "key", getattr(k, "idx", k)) for k in path) for path, _ in with_paths]


def _analyse(apply_fn: Callable, params: PyTree, args: tuple, kwargs: dict):
    """``(graph, params leaves, params paths, other inputs)``: ``other inputs`` maps the var of
    each leaf of the variables' non-params collections to ``(collection, *path)``."""
    inner, rebuild = split_params(params)
    if is_variables(params):  # other collections (batch_stats) are traced inputs, never constants
        inner, rebuild_params = split_params(params["params"])
        split = {k: split_params(v) for k, v in params.items() if k != "params"}
        others = {k: jax.tree.map(jnp.asarray, pure) for k, (pure, _) in split.items()}

        def fn(p, state, *a, **kw):
            rebuilt = {k: split[k][1](v) for k, v in state.items()}
            return apply_fn({**rebuilt, "params": rebuild_params(p)}, *a, **kw)

        graph, leaves, _ = _build_graph(fn, inner, ((others, *args), kwargs))
        other_paths = _paths(others)
        inputs = dict(zip(graph.input_vars[: len(other_paths)], other_paths, strict=True))
    else:
        graph, leaves, _ = _build_graph(lambda p, *a, **kw: apply_fn(rebuild(p), *a, **kw), inner,
                                        (args, kwargs))
        inputs = {}
    return graph, leaves, _paths(inner), inputs


def discover(apply_fn: Callable, params: PyTree, *args: Any, **kwargs: Any) -> Spec:
    """The spec of every ENorm rescaling symmetry of ``apply_fn(params, *args, **kwargs)``.

    Traces the function to a jaxpr and, for each params leaf (unit axis last, then the other
    axes), tests the hypothesis "scaling this leaf per unit along this axis can be undone by
    scaling some consumer weights inversely", following per-unit positive scaling through
    positively homogeneous primitives (see the module docstring). Confirmed hypotheses become
    junctions, with every producer that must share the units (biases, residual branches,
    type-C shortcuts, identity residual streams, BN gamma/beta before a homogeneous path).

    Args:
      apply_fn: e.g. ``model.apply``; called as ``apply_fn(params, *args, **kwargs)``. Use
        inference mode (BN with running averages): batch statistics written to a mutable
        collection are outputs that scale.
      params: a params tree or a Flax variables dict (only ``"params"`` leaves are candidates).
      *args, **kwargs: example inputs (of arrays only shapes and dtypes matter); Python values such
        as ``train=False`` are passed as they are.

    Returns:
      A :class:`~jaxnorm.enorm.spec.Spec`: the junctions, and in ``spec.left_out`` a
      ``(path, axis, reason)`` for the last axis of every leaf that belongs to no junction;
      ``print(spec.report())`` shows both.

    References:
      Stock et al. 2019, Sec. 3.1, 3.5, 4.1-4.3 (the symmetries); identity-shortcut residual
      streams (one junction per stage) go beyond the paper.
    """
    graph, leaves, paths, _ = _analyse(apply_fn, params, args, kwargs)
    covered: set[tuple[int, int]] = set()
    junctions, left_out = [], []
    for leaf_i, leaf in enumerate(leaves):
        ndim = np.ndim(leaf)
        if ndim == 0 or not np.issubdtype(np.asarray(leaf).dtype if not hasattr(leaf, "dtype")
                                          else leaf.dtype, np.floating):
            continue
        for axis in [ndim - 1, *range(ndim - 1)]:
            if (leaf_i, axis) in covered or (np.shape(leaf)[axis] == 1 and ndim > 1):
                continue
            shape = [1] * ndim
            shape[axis] = np.shape(leaf)[axis]
            ids = np.broadcast_to(np.arange(shape[axis]).reshape(shape), np.shape(leaf))
            try:
                seeds, consumers = _hypothesis(graph, leaf_i, ids, strict=True)
            except _Fail as fail:
                if axis == ndim - 1:
                    left_out.append((paths[leaf_i], axis, str(fail)))
                continue
            if not consumers:
                continue
            producers = [_entry(paths[i], _full(s, np.shape(leaves[i]))) for i, s in seeds.items()]
            cons = [_entry(paths[i], c.reshape(np.shape(leaves[i]))) for i, c in consumers.items()]
            for i, s in seeds.items():
                full = _full(s, np.shape(leaves[i]))
                covered.update((i, a) for a in range(full.ndim) if not _const_along(full, [a]))
                if full.ndim == 1:
                    covered.add((i, 0))
            junctions.append(Junction(tuple(producers), tuple(cons)))
    covered_paths = {(paths[i], a) for i, a in covered}
    left_out = [item for item in left_out if (item[0], item[1]) not in covered_paths]
    return Spec(junctions, left_out)


def scale_invariant_kernels(
    apply_fn: Callable, params: PyTree, *args: Any, **kwargs: Any
) -> dict[tuple, bool]:
    """For each params leaf of rank >= 2: is the function invariant to scaling any of its output
    units (last axis) alone, with nothing compensating? True where the units feed a normalization
    that divides by their own scale (BatchNorm: ``(x - mean) * rsqrt(var + eps)``, epsilon
    neglected). Same tracer as :func:`discover`, with powers of the scale tracked.

    Returns:
      ``{path: bool}`` for every leaf of rank >= 2.
    """
    graph, leaves, paths, _ = _analyse(apply_fn, params, args, kwargs)
    out = {}
    for leaf_i, leaf in enumerate(leaves):
        ndim = np.ndim(leaf)
        if ndim < 2:
            continue
        shape = [1] * ndim
        shape[-1] = np.shape(leaf)[-1]
        ids = np.broadcast_to(np.arange(shape[-1]).reshape(shape), np.shape(leaf))
        try:
            _, consumers = _hypothesis(graph, leaf_i, ids, strict=False)
            out[paths[leaf_i]] = not consumers
        except _Fail:
            out[paths[leaf_i]] = False
    return out


def _solve_inputs(g: _Graph, leaf: int, ids: np.ndarray, inputs: dict[int, tuple],
                  seeds: dict[int, _Scaled], var_trial: bool) -> dict[int, _Scaled] | None:
    """Input seeds (non-params inputs scaled with a power) under which scaling ``leaf``'s units
    alone leaves the function unchanged, or None. Addends met by the scaled units are traced back
    to inputs (a BN running mean: power 1); where the pass then fails, an unseeded input beside a
    seeded one (same collection module, same shape: the running variance) is tried with power 2."""
    seeds = dict(seeds)
    for _ in range(64):
        try:
            consumers = _Interp(g, {leaf: ids}, False, seeds).run()
            return seeds if seeds and not consumers else None
        except _Need as need:
            try:
                extra = _need(g, need.var, need.target, inputs=True)
            except _Fail:
                extra = {}
            if extra and all(k < 0 and -1 - k not in seeds for k in extra):
                for key, target in extra.items():
                    seeds[-1 - key] = _Scaled(_full(target, g.shapes[-1 - key]), need.power)
                continue
        except _Fail:
            pass
        break  # refuted: a parameter would have to move with the units, or the pass failed
    return _try_variance(g, leaf, ids, inputs, seeds) if var_trial else None


def _try_variance(g: _Graph, leaf: int, ids: np.ndarray, inputs: dict[int, tuple],
                  seeds: dict[int, _Scaled]) -> dict[int, _Scaled] | None:
    """Retry with one unseeded input beside a seeded one (same collection module and shape: a
    BN's running variance beside its mean) scaled with twice its power."""
    for var, scaled in list(seeds.items()):
        path = inputs.get(var)
        for other, other_path in inputs.items():
            if (other in seeds or path is None or other_path[:-1] != path[:-1]
                    or g.shapes[other] != g.shapes[var]):
                continue
            trial = {**seeds, other: _Scaled(scaled.ids, scaled.power * 2)}
            found = _solve_inputs(g, leaf, ids, inputs, trial, False)
            if found is not None:
                return found
    return None


def input_links(apply_fn: Callable, variables: PyTree, *args: Any, **kwargs: Any) -> dict:
    """For each params leaf of rank >= 2: the non-params inputs that must be divided by ``s^k``
    when its output units (last axis) alone are divided by ``s``, for the function to stay the
    same; ``{kernel_path: ((input_path, k, index), ...)}`` with ``input_path`` starting with the
    collection name and ``index`` None (unit i at position i of a 1-D input) or the unit of each
    element (-1: not scaled). Only kernels for which such inputs exist and make the function
    exactly invariant (BN's epsilon neglected) are listed. See :mod:`jaxnorm.enorm.transport`."""
    graph, leaves, paths, inputs = _analyse(apply_fn, variables, args, kwargs)
    out = {}
    for leaf_i, leaf in enumerate(leaves):
        ndim = np.ndim(leaf)
        if ndim < 2 or not np.issubdtype(np.dtype(leaf.dtype), np.floating):
            continue
        shape = [1] * ndim
        shape[-1] = np.shape(leaf)[-1]
        ids = np.broadcast_to(np.arange(shape[-1]).reshape(shape), np.shape(leaf))
        found = _solve_inputs(graph, leaf_i, ids, inputs, {}, True)
        if not found or any(var not in inputs for var in found):
            continue
        links = []
        for var, scaled in found.items():
            full = _full(scaled.ids, graph.shapes[var])
            plain = full.ndim == 1 and np.array_equal(full, np.arange(full.size))
            power = int(scaled.power) if scaled.power.denominator == 1 else float(scaled.power)
            links.append((inputs[var], power, None if plain else np.array(full, np.int32)))
        out[paths[leaf_i]] = tuple(sorted(links, key=lambda item: (item[1], str(item[0]))))
    return out
