"""Junctions: which parameter slices share one set of rescalable hidden units.

A hidden unit j whose activation passes only through positively homogeneous maps (ReLU, leaky ReLU,
max / average pooling, concatenation, addition of equally scaled tensors) before it is consumed can
be rescaled: multiplying everything that *produces* j by d_j > 0 and dividing everything that
*consumes* j by d_j leaves the network function unchanged (Stock et al., *Equi-normalization of
neural networks*, ICLR 2019, Sec. 3.1 Eq. 2, Sec. 3.5 Eqs. 6-8, Sec. 4.1-4.3). A :class:`Junction`
names one such set of n units: its producer and consumer parameter slices, each with its unit axis.

Entries are ``(path, axis)``: ``path`` a tuple of keys into the params tree (without ``"params"``),
``axis`` the leaf axis along which unit i sits at position i. Where the units sit along an axis in
another order (a flattened feature map, a slice of a concatenation, a grouped convolution) an entry
is ``(path, axis, index)`` with ``index`` an integer array: either 1-D of length ``leaf.shape[axis]``
giving the unit of each position, or of the leaf's rank and broadcastable to its shape giving the
unit of each element; ``-1`` marks positions outside the junction.

References:
  Stock, Defossez, Gribonval, Jegou, Usunier. Equi-normalization of neural networks. ICLR 2019.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from jaxnorm.enorm.trees import is_variables, split_params

__all__ = [
    "ChainMemory",
    "Entry",
    "Junction",
    "Spec",
    "chain",
    "entry_index",
    "get_leaf",
    "unwrap_variables",
]

PyTree = Any
Path = tuple[Any, ...]
Entry = tuple  # (path, axis) or (path, axis, index)


class Junction(NamedTuple):
    """One set of n hidden units shared by producer and consumer parameter slices.

    Attributes:
      producers: ``(path, axis)`` or ``(path, axis, index)`` entries scaled by ``d`` (incoming
        weights, their biases, BN gamma / beta feeding a homogeneous path).
      consumers: entries scaled by ``1 / d`` (outgoing weights).
    """

    producers: tuple[Entry, ...]
    consumers: tuple[Entry, ...]


class Spec(tuple):
    """A tuple of :class:`Junction` that also carries why some units were left out.

    ``left_out`` is a tuple of ``(path, axis, reason)``; ``str(spec.report())`` prints it.
    """

    left_out: tuple[tuple[Path, int, str], ...]

    def __new__(cls, junctions: Sequence[Junction] = (), left_out=()) -> Spec:
        obj = super().__new__(cls, tuple(junctions))
        obj.left_out = tuple(left_out)
        return obj

    def report(self) -> str:
        """A printable summary: each junction, then each left-out unit axis with its reason."""
        lines = []
        for k, junction in enumerate(self):
            prod = ", ".join(_fmt_entry(e) for e in junction.producers)
            cons = ", ".join(_fmt_entry(e) for e in junction.consumers)
            lines.append(f"junction {k}: producers [{prod}] -> consumers [{cons}]")
        for path, axis, reason in self.left_out:
            lines.append(f"left out {'/'.join(map(str, path))} axis {axis}: {reason}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"Spec({tuple(self)!r}, left_out={self.left_out!r})"


def _fmt_entry(entry: Entry) -> str:
    return f"{'/'.join(map(str, entry[0]))}[{entry[1]}]" + ("*" if len(entry) > 2 else "")


def unwrap_variables(tree: PyTree) -> tuple[PyTree, bool]:
    """``(params, True)`` for a Flax variables dict with a ``"params"`` key, else ``(params, False)``;
    ``params`` a pure dict (``nnx.State`` and ``FrozenDict`` unwrapped, see
    :func:`jaxnorm.enorm.trees.split_params`)."""
    return split_params(tree)[0], is_variables(tree)


def get_leaf(params: PyTree, path: Path, what: str = "spec") -> Any:
    """The leaf of ``params`` at ``path``; a ``KeyError``-free, clear ``ValueError`` otherwise."""
    node = params
    for depth, key in enumerate(path):
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            have = list(node.keys()) if isinstance(node, Mapping) else type(node).__name__
            raise ValueError(
                f"{what}: path {tuple(path)!r} does not exist in params (no key {key!r} at depth "
                f"{depth}; available: {have})"
            ) from None
    if isinstance(node, Mapping) or not hasattr(node, "shape"):
        got = "a dict" if isinstance(node, Mapping) else type(node).__name__
        hint = ""
        if type(node).__name__ == "MaskedNode":
            hint = (": optax.masked / multi_transform left it out, but every leaf of a junction must "
                    "reach the transformation (mask whole layers, or pass a spec without it)")
        raise ValueError(f"{what}: path {tuple(path)!r} is not an array leaf of params (got {got}){hint}")
    return node


def entry_index(entry: Entry, shape: tuple[int, ...], what: str = "spec") -> tuple[int, Any]:
    """Normalise an entry to ``(axis, index)``: ``index`` is ``None`` for units at positions 0..n-1
    along ``axis``, else an int array broadcastable to ``shape`` (unit per element, -1 outside).

    Raises:
      ValueError: a malformed entry, an axis out of range, an index of the wrong shape.
    """
    if not isinstance(entry, tuple | list) or len(entry) not in (2, 3):
        raise ValueError(f"{what}: an entry must be (path, axis) or (path, axis, index), got {entry!r}")
    path, axis = entry[0], entry[1]
    ndim = len(shape)
    if not isinstance(axis, int | np.integer) or not -ndim <= axis < ndim:
        raise ValueError(
            f"{what}: axis {axis!r} of {tuple(path)!r} is out of range for a leaf of shape {shape}"
        )
    axis = int(axis) % ndim
    if len(entry) == 2 or entry[2] is None:
        return axis, None
    index = np.asarray(entry[2])
    if not np.issubdtype(index.dtype, np.integer):
        raise ValueError(f"{what}: index of {tuple(path)!r} must be integers, got {index.dtype}")
    if (index.ndim == 1 and ndim > 1) or ndim == 1:
        if index.shape != (shape[axis],):
            raise ValueError(
                f"{what}: index of {tuple(path)!r} has shape {index.shape}, expected "
                f"({shape[axis]},) for axis {axis} of a leaf of shape {shape}"
            )
        full_shape = [1] * ndim
        full_shape[axis] = shape[axis]
        return axis, index.reshape(full_shape)
    try:
        np.broadcast_shapes(index.shape, shape)
    except ValueError:
        raise ValueError(
            f"{what}: index of {tuple(path)!r} has shape {index.shape}, not broadcastable to the "
            f"leaf shape {shape}"
        ) from None
    if index.ndim != ndim:
        raise ValueError(f"{what}: index of {tuple(path)!r} must be 1-D or of rank {ndim}")
    return axis, index


# ----------------------------------------------------------------------------------------------
# chain(): the spec of a sequential Dense / Conv stack.

_NAME = re.compile(r"^(.*?)_?(\d+)$")
_SEARCH_BUDGET = 100_000


class _Module(NamedTuple):
    path: Path
    kernel_ndim: int
    units: int  # kernel.shape[-1]
    fan_in: int  # kernel.shape[-2]
    has_bias: bool
    ranks: tuple  # per level: ("recorded", insertion index) or ("named", stem, number) or None


def _recorded(node: Mapping) -> bool:
    """True where a dict's keys are not in sorted order: it is as ``init`` built it (Flax inserts
    modules in the order they are first called), not a ``jax.tree`` rebuild (which sorts keys)."""
    keys = list(node.keys())
    try:
        return keys != sorted(keys)
    except TypeError:  # mixed key types
        return False


def _name_rank(name: Any) -> tuple | None:
    if isinstance(name, int | np.integer):
        return ("named", "", int(name))
    match = _NAME.match(str(name))
    return ("named", match.group(1), int(match.group(2))) if match else None


def _modules(params: Mapping, prefix: Path = (), ranks: tuple = ()) -> list[_Module]:
    found = []
    recorded = _recorded(params)
    for position, (name, node) in enumerate(params.items()):
        path = (*prefix, name)
        rank = ("recorded", position) if recorded else _name_rank(name)
        if not isinstance(node, Mapping):
            raise ValueError(
                f"chain: params leaf {path!r} is not inside a Dense/Conv module; the tree is not a "
                "plain chain. Pass a spec, or get one with "
                "jaxnorm.enorm.discover(apply_fn, params, *example_inputs)"
            )
        if "kernel" in node and not isinstance(node["kernel"], Mapping):
            extra = set(node) - {"kernel", "bias"}
            if extra:
                raise ValueError(
                    f"chain: module {path!r} has parameters {sorted(map(str, extra))} besides "
                    "kernel/bias; the tree is not a plain Dense/Conv chain. Use "
                    "jaxnorm.enorm.discover(apply_fn, params, *example_inputs)"
                )
            shape = tuple(np.shape(node["kernel"]))
            if len(shape) < 2:
                raise ValueError(f"chain: kernel of module {path!r} has shape {shape}, rank < 2")
            found.append(_Module(path, len(shape), shape[-1], shape[-2], "bias" in node,
                                 (*ranks, rank)))
        else:
            found.extend(_modules(node, path, (*ranks, rank)))
    return found


def _before(a: _Module, b: _Module) -> bool:
    """Whether the tree says ``a`` is called before ``b``: at the first level where their paths
    differ, by insertion order where the dict records it, else by the numbers of names sharing a
    stem (``Dense_2`` before ``Dense_10``, ``layers_0`` before ``layers_2``, NNX list entries);
    and convolutions before dense layers."""
    if a.kernel_ndim > 2 >= b.kernel_ndim:
        return True
    for ra, rb, na, nb in zip(a.ranks, b.ranks, a.path, b.path, strict=False):
        if na == nb:
            continue
        if ra is None or rb is None or ra[0] != rb[0]:
            return False
        if ra[0] == "recorded":
            return ra[1] < rb[1]
        return ra[1] == rb[1] and ra[2] < rb[2]
    return False


def _link(a: _Module, b: _Module) -> Entry | None:
    """The consumer entry of ``b`` reading ``a``'s units, or None where the shapes do not chain."""
    kernel_b = (*b.path, "kernel")
    if b.fan_in == a.units:
        return (kernel_b, b.kernel_ndim - 2)
    if a.kernel_ndim > 2 and b.kernel_ndim == 2 and b.fan_in % a.units == 0:
        return (kernel_b, 0, np.arange(b.fan_in) % a.units)
    return None


def _orders(modules: list[_Module]) -> list[list[int]]:
    """Up to two orders of all modules that respect :func:`_before` and chain by shape."""
    n = len(modules)
    preds = [{j for j in range(n) if j != i and _before(modules[j], modules[i])} for i in range(n)]
    found: list[list[int]] = []
    budget = [_SEARCH_BUDGET]

    def extend(order: list[int], placed: set[int]) -> None:
        if len(found) > 1 or budget[0] <= 0:
            return
        budget[0] -= 1
        if len(order) == n:
            found.append(list(order))
            return
        for i in range(n):
            if i in placed or not preds[i] <= placed:
                continue
            if order and _link(modules[order[-1]], modules[i]) is None:
                continue
            order.append(i)
            placed.add(i)
            extend(order, placed)
            placed.discard(i)
            order.pop()

    extend([], set())
    if budget[0] <= 0 and len(found) < 2:
        found.append([])  # undecided within the budget: reported as ambiguous
    return found


def chain(params: PyTree) -> Spec:
    """The spec of a sequential Dense / Conv stack: one junction per hidden layer.

    Modules are the sub-dicts holding a ``kernel`` (and optionally a ``bias``). Their call order
    is read from the tree where it records it, and from the shapes otherwise:

    1. a dict whose keys are not in sorted order is as Flax's ``init`` built it, in first-call
       order (linen ``setup()`` modules included); its entries are taken in that order;
    2. otherwise (sorted keys: any ``jax.tree`` rebuild, ``nnx.State``) names that share a stem
       and end in a number are taken in numeric order (``Dense_2`` before ``Dense_10``,
       ``layers_0`` before ``layers_2``, NNX list entries ``0, 1, ...``, ``fc1`` before ``fc2``);
    3. convolutions come before dense layers;
    4. among the orders these rules allow, the one in which every kernel reads the previous one's
       units (``kernel_b.shape[-2] == kernel_a.shape[-1]``, or a dense layer reading a convolution's
       NHWC map flattened row-major, ``x.reshape(n, -1)``, channel fastest) must be unique.

    Junction k has producers ``kernel_k`` (last axis) and ``bias_k``, consumer ``kernel_{k+1}``
    along its input axis (axis -2).

    What the tree cannot show, and is therefore assumed (check it with
    :func:`jaxnorm.enorm.check`, or use :func:`jaxnorm.enorm.discover`, which assumes nothing):
    every hidden activation is positively homogeneous (ReLU, leaky ReLU, identity, max / average
    pooling: not GELU, tanh, sigmoid, softplus); nothing else (normalization, residual
    connections) sits between the layers; numbered names number the layers in call order.

    Args:
      params: a params tree, a Flax variables dict, an ``nnx.State`` or its pure dict.

    Returns:
      A :class:`Spec` (tuple of :class:`Junction`).

    Raises:
      ValueError: where the tree is not such a chain (other parameters, shapes that do not chain
        in any allowed order) or where several orders are possible (ambiguous), pointing to
        :func:`jaxnorm.enorm.discover`.

    References:
      Stock et al. 2019, Sec. 3.1 (Eq. 1) and Alg. 1 (one rescaling per hidden layer).
    """
    params, _ = unwrap_variables(params)
    if not isinstance(params, Mapping):
        raise ValueError(f"chain: params must be a dict of modules, got {type(params).__name__}")
    modules = _modules(params)
    if len(modules) < 2:
        raise ValueError(
            f"chain: found {len(modules)} Dense/Conv module(s); a chain needs at least two"
        )
    orders = _orders(modules)
    names = ", ".join("/".join(map(str, m.path)) + f" {m.fan_in}->{m.units}" for m in modules)
    if not orders:
        raise ValueError(
            f"chain: the modules [{names}] do not form a chain in any order the tree allows (call "
            "order as recorded, numbered names, convolutions first, each kernel reading the "
            "previous one's units); the tree is not a plain chain. Use "
            "jaxnorm.enorm.discover(apply_fn, params, *example_inputs)"
        )
    if len(orders) > 1:
        raise ValueError(
            f"chain: the layer order of [{names}] is ambiguous: the tree records no call order "
            "for them (names without a common numbered stem, sorted keys) and their shapes chain "
            "in more than one order. Get the spec from the function itself: "
            "jaxnorm.enorm.discover(apply_fn, params, *example_inputs)"
        )
    ordered = [modules[i] for i in orders[0]]
    junctions = []
    for a, b in itertools.pairwise(ordered):
        producers: list[Entry] = [((*a.path, "kernel"), a.kernel_ndim - 1)]
        if a.has_bias:
            producers.append(((*a.path, "bias"), 0))
        junctions.append(Junction(tuple(producers), (_link(a, b),)))
    return Spec(junctions)


def _records_call_order(tree: Any) -> bool:
    """Whether some dict of ``tree`` keeps Flax's insertion order (rule 1 of :func:`chain`)."""
    if not isinstance(tree, Mapping):
        return False
    return _recorded(tree) or any(_records_call_order(value) for value in tree.values())


class ChainMemory:
    """:func:`chain` for an optax transformation, which sees the params again at every ``update``.

    Rule 1 of :func:`chain` reads the call order from a dict's insertion order, and every ``jax.tree``
    rebuild loses it, ``jit``'s included: an ``update`` under ``jit`` would see sorted keys and fall
    back on the names (rule 2), another chain where the names do not number the layers in call order
    (a module built before another and called after it). The chain of params that record their call
    order (``init`` on the params as the user holds them) is remembered per tree structure, and params
    of that structure with sorted keys get it.
    """

    def __init__(self) -> None:
        self._specs: dict[Any, Spec] = {}

    def __call__(self, params: PyTree) -> Spec:
        structure = jax.tree.structure(params)
        if _records_call_order(params):
            self._specs[structure] = chain(params)
        elif structure not in self._specs:
            return chain(params)
        return self._specs[structure]
