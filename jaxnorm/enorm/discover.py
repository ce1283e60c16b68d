"""Find a network's rescaling symmetries by tracing it to a jaxpr: one tracer of "what scales with what".

Hypothesis for a candidate producer (a params leaf and an axis): multiply the leaf by a positive
per-unit vector d along that axis. The tracer, split by concept:

- :mod:`jaxnorm.enorm.jaxpr_graph`: the function traced and flattened to one graph of equations;
- :mod:`jaxnorm.enorm.lattice`: the abstract values (which unit scales each element, with which
  power);
- :mod:`jaxnorm.enorm.forward_rules`: the forward pass, ``FORWARD_RULES`` keyed by primitive,
  following the scaling through positively homogeneous maps (ReLU / leaky ReLU, pooling, means,
  layout, concatenation, products with unscaled values) into *consumers* (a ``dot_general`` /
  ``conv_general_dilated`` contracting the units against a params leaf, which is divided by d);
- :mod:`jaxnorm.enorm.backward_rules`: the backward pass, ``BACKWARD_RULES`` keyed by primitive:
  where two values meet in an addition, an unscaled addend is traced back to the params that must
  be scaled with it (a bias, the other branch of a residual, a type-C shortcut, every block writing
  an identity residual stream);
- this module: the search (producers added until a fixed point, refuted hypotheses left out with
  the reason) and the public entry points.

Anything without a rule (tanh, sigmoid, GELU, softmax, LayerNorm / BN normalization statistics, a
non-zero threshold, control flow) or a scaled value reaching the function output refutes the
hypothesis: nothing is guessed. A confirmed hypothesis is one :class:`~jaxnorm.enorm.spec.Junction`
(paper Sec. 3.1, 4.1-4.3).

References:
  Stock, Defossez, Gribonval, Jegou, Usunier. Equi-normalization of neural networks. ICLR 2019.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxnorm.enorm.backward_rules import addend_sources
from jaxnorm.enorm.forward_rules import ForwardPass, TraceMode
from jaxnorm.enorm.jaxpr_graph import JaxprGraph, build_graph
from jaxnorm.enorm.lattice import (
    AddendMustScale,
    Refuted,
    Scaled,
    broadcast_ids,
    constant_along,
    merge_seeds,
    squash,
)
from jaxnorm.enorm.spec import Junction, Spec
from jaxnorm.enorm.trees import is_variables, split_params

__all__ = ["discover", "input_links", "scale_invariant_kernels"]

PyTree = Any

_MAX_EXPANSIONS = 1000


# ----------------------------------------------------------------------------------------------
# The search.


def _is_float(leaf: Any) -> bool:
    """Whether a params leaf can be rescaled: a floating dtype, bfloat16 and float8 included
    (``np.issubdtype(bfloat16, np.floating)`` is False; ``jnp.issubdtype`` knows JAX's dtypes)."""
    return jnp.issubdtype(jnp.result_type(leaf), jnp.floating)


def _expand_producers(g: JaxprGraph, leaf: int, ids: np.ndarray, mode: TraceMode):
    """``(producers, consumers)`` of the hypothesis "``leaf`` scaled by unit ``ids``": each unscaled
    addend met by the forward pass is traced back to the params that must scale with it, which
    join the producers, until a pass goes through (or the hypothesis is refuted)."""
    seeds = {leaf: ids}
    for _ in range(_MAX_EXPANSIONS):
        try:
            return seeds, ForwardPass(g, seeds, mode).run()
        except AddendMustScale as need:
            extra = addend_sources(g, need.var, need.target)
            if not extra:
                raise Refuted("an addend that cannot be scaled") from None
            before = {k: v.copy() for k, v in seeds.items()}
            merge_seeds(seeds, extra)
            if all(k in before and np.array_equal(before[k], v) for k, v in seeds.items()):
                raise Refuted("tracing the addend back added no parameters") from None
    raise Refuted(f"no fixed point in {_MAX_EXPANSIONS} expansions")


def _entry(path: tuple, ids: np.ndarray, unit_axis: int = -1) -> tuple:
    """The spec entry of a leaf whose elements carry unit ``ids``; where the ids are unit 0
    everywhere along an axis of size 1 (one unit) that is ``(path, axis)``, ``unit_axis`` if it
    has size 1 (producers: the last axis; consumers: the fan-in axis, as :func:`chain` writes)."""
    varying = [a for a in range(ids.ndim) if not constant_along(ids, [a])]
    n = int(ids.max()) + 1
    ones = [a for a in range(ids.ndim) if ids.shape[a] == 1]
    if not varying and ones and np.all(ids == 0):
        return (path, unit_axis % ids.ndim if ids.shape[unit_axis] == 1 else ones[-1])
    if not varying:  # one unit on every element: a full-rank index (1-D: one id per position)
        index = ids if ids.ndim == 1 else squash(ids, range(ids.ndim))
        return (path, ids.ndim - 1, np.array(index, np.int32))
    if len(varying) == 1:
        a = varying[0]
        vec = squash(ids, [d for d in range(ids.ndim) if d != a]).ravel()
        if vec.size == n and np.array_equal(vec, np.arange(n)):
            return (path, a)
        return (path, a, vec.astype(np.int32))
    compact = squash(ids, [d for d in range(ids.ndim) if d not in varying])
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

        graph, leaves, _ = build_graph(fn, inner, ((others, *args), kwargs))
        other_paths = _paths(others)
        inputs = dict(zip(graph.input_vars[: len(other_paths)], other_paths, strict=True))
    else:
        graph, leaves, _ = build_graph(
            lambda p, *a, **kw: apply_fn(rebuild(p), *a, **kw), inner, (args, kwargs)
        )
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
    Floating leaves only (bfloat16 and float8 included). A last axis of size 1 is one unit (a
    hidden layer of width 1, consumed by the contraction that reads it); other axes of size 1
    are not tried (scaling along them scales the whole leaf, which its last axis covers).

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
        if ndim == 0 or not _is_float(leaf):
            continue
        for axis in [ndim - 1, *range(ndim - 1)]:
            if (leaf_i, axis) in covered or (np.shape(leaf)[axis] == 1 and axis != ndim - 1):
                continue  # one unit along an input axis is a uniform scaling of the whole leaf
            shape = [1] * ndim
            shape[axis] = np.shape(leaf)[axis]
            ids = np.broadcast_to(np.arange(shape[axis]).reshape(shape), np.shape(leaf))
            try:
                seeds, consumers = _expand_producers(graph, leaf_i, ids, TraceMode.JUNCTION)
            except Refuted as fail:
                if axis == ndim - 1:
                    left_out.append((paths[leaf_i], axis, str(fail)))
                continue
            if not consumers:
                continue
            producers = [_entry(paths[i], broadcast_ids(s, np.shape(leaves[i]))) for i, s in seeds.items()]
            cons = [
                _entry(paths[i], c.reshape(np.shape(leaves[i])), -2 if np.ndim(leaves[i]) > 1 else -1)
                for i, c in consumers.items()
            ]
            for (i, s), entry in zip(seeds.items(), producers, strict=True):
                full = broadcast_ids(s, np.shape(leaves[i]))
                covered.update((i, a) for a in range(full.ndim) if not constant_along(full, [a]))
                if full.ndim == 1 or len(entry) == 2:  # a unit axis (one unit: of size 1)
                    covered.add((i, entry[1]))
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
            _, consumers = _expand_producers(graph, leaf_i, ids, TraceMode.INVARIANCE)
            out[paths[leaf_i]] = not consumers
        except Refuted:
            out[paths[leaf_i]] = False
    return out


def _solve_inputs(
    g: JaxprGraph,
    leaf: int,
    ids: np.ndarray,
    inputs: dict[int, tuple],
    seeds: dict[int, Scaled],
    tried: set[frozenset],
) -> dict[int, Scaled] | None:
    """Input seeds (non-params inputs scaled with a power) under which scaling ``leaf``'s units
    alone leaves the function unchanged, or None. Addends met by the scaled units are traced back
    to inputs (a BN running mean: power 1); where the pass then fails, an unseeded input beside a
    seeded one (same collection module, same shape: the running variance) is tried with power 2,
    and so on from there: units feeding several BNs get each BN's mean, then its variance.
    ``tried`` holds the seed sets already searched from (each is searched once)."""
    seeds = dict(seeds)
    for _ in range(64):
        try:
            consumers = ForwardPass(g, {leaf: ids}, TraceMode.TRANSPORT, seeds).run()
            if seeds and not consumers:
                return seeds
            # the scaling reached the next layer (a BN without a bias, whose running mean alone does not
            # absorb it): the running variance may
            break
        except AddendMustScale as need:
            try:
                extra = addend_sources(g, need.var, need.target, to_inputs=True)
            except Refuted:
                extra = {}
            if extra and all(k < 0 and -1 - k not in seeds for k in extra):
                for key, target in extra.items():
                    seeds[-1 - key] = Scaled(broadcast_ids(target, g.shapes[-1 - key]), need.power)
                continue
        except Refuted:
            pass
        break  # refuted: a parameter would have to move with the units, or the pass failed
    return _try_variance(g, leaf, ids, inputs, seeds, tried)


def _try_variance(
    g: JaxprGraph,
    leaf: int,
    ids: np.ndarray,
    inputs: dict[int, tuple],
    seeds: dict[int, Scaled],
    tried: set[frozenset],
) -> dict[int, Scaled] | None:
    """Retry with one unseeded input beside a seeded one (same collection module and shape: a
    BN's running variance beside its mean) scaled with twice its power. Each retry adds a seed and
    skips the seed sets in ``tried``, so the search ends (at most one pass per subset of inputs)."""
    key = frozenset((var, scaled.power, scaled.ids.tobytes()) for var, scaled in seeds.items())
    if key in tried:
        return None
    tried.add(key)
    for var, scaled in list(seeds.items()):
        path = inputs.get(var)
        for other, other_path in inputs.items():
            if (
                other in seeds
                or path is None
                or other_path[:-1] != path[:-1]
                or g.shapes[other] != g.shapes[var]
            ):
                continue
            trial = {**seeds, other: Scaled(scaled.ids, scaled.power * 2)}
            found = _solve_inputs(g, leaf, ids, inputs, trial, tried)
            if found is not None:
                return found
    return None


def input_links(apply_fn: Callable, variables: PyTree, *args: Any, **kwargs: Any) -> dict:
    """For each params leaf of rank >= 2: the non-params inputs that must be divided by ``s^k``
    when its output units (last axis) alone are divided by ``s``, for the function to stay the
    same; ``{kernel_path: ((input_path, k, index), ...)}`` with ``input_path`` starting with the
    collection name and ``index`` None (a 1-D input of one element per unit, unit i at position i)
    or the unit of each element (-1: not scaled; e.g. ``[0, 1, 2]`` for 3 of 4 units). Only
    kernels for which such inputs exist and make the function exactly invariant (BN's epsilon
    neglected) are listed, with the inputs of every BN the units feed. See
    :mod:`jaxnorm.enorm.transport`."""
    graph, leaves, paths, inputs = _analyse(apply_fn, variables, args, kwargs)
    out = {}
    for leaf_i, leaf in enumerate(leaves):
        ndim = np.ndim(leaf)
        if ndim < 2 or not _is_float(leaf):
            continue
        shape = [1] * ndim
        shape[-1] = np.shape(leaf)[-1]
        ids = np.broadcast_to(np.arange(shape[-1]).reshape(shape), np.shape(leaf))
        found = _solve_inputs(graph, leaf_i, ids, inputs, {}, set())
        if not found or any(var not in inputs for var in found):
            continue
        links = []
        for var, scaled in found.items():
            full = broadcast_ids(scaled.ids, graph.shapes[var])
            # index None: every unit of the kernel, in order (a slice keeps an explicit index)
            plain = full.ndim == 1 and np.array_equal(full, np.arange(shape[-1]))
            power = int(scaled.power) if scaled.power.denominator == 1 else float(scaled.power)
            links.append((inputs[var], power, None if plain else np.array(full, np.int32)))
        out[paths[leaf_i]] = tuple(sorted(links, key=lambda item: (item[1], str(item[0]))))
    return out
