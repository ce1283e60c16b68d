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

import numpy as np

__all__ = ["Entry", "Junction", "Spec", "chain", "entry_index", "get_leaf", "unwrap_variables"]

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
    """``(params, True)`` for a Flax variables dict with a ``"params"`` key, else ``(tree, False)``."""
    if isinstance(tree, Mapping) and "params" in tree and isinstance(tree["params"], Mapping):
        return tree["params"], True
    return tree, False


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
        raise ValueError(f"{what}: path {tuple(path)!r} is not an array leaf of params")
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


def _module_key(path: Path, kernel_ndim: int) -> tuple:
    """Sort key of a module path: convolutions before dense layers, then natural order of names
    (``Dense_2`` before ``Dense_10``)."""
    key: list[Any] = [0 if kernel_ndim > 2 else 1]
    for part in path:
        match = _NAME.match(str(part))
        key.append((match.group(1), int(match.group(2))) if match else (str(part), -1))
    return tuple(key)


def _modules(params: Mapping, prefix: Path = ()) -> list[tuple[Path, Mapping]]:
    found = []
    for name, node in params.items():
        if not isinstance(node, Mapping):
            raise ValueError(
                f"chain: params leaf {(*prefix, name)!r} is not inside a Dense/Conv module; "
                "the tree is not a plain chain. Pass a spec, or get one with "
                "jaxnorm.enorm.discover(apply_fn, params, *example_inputs)"
            )
        if "kernel" in node and not isinstance(node["kernel"], Mapping):
            extra = set(node) - {"kernel", "bias"}
            if extra:
                raise ValueError(
                    f"chain: module {(*prefix, name)!r} has parameters {sorted(extra)} besides "
                    "kernel/bias; the tree is not a plain Dense/Conv chain. Use "
                    "jaxnorm.enorm.discover(apply_fn, params, *example_inputs)"
                )
            found.append(((*prefix, name), node))
        else:
            found.extend(_modules(node, (*prefix, name)))
    return found


def chain(params: PyTree) -> Spec:
    """The spec of a sequential Dense / Conv stack: one junction per hidden layer.

    Modules are the sub-dicts holding a ``kernel`` (and optionally a ``bias``); they are ordered
    convolutions first, then dense layers, each in natural name order (``Dense_2`` before
    ``Dense_10``). Junction k has producers ``kernel_k`` (last axis) and ``bias_k``, consumer
    ``kernel_{k+1}`` along its input axis (axis -2). A dense layer after a convolution whose
    input size is a multiple m of the convolution's channels is taken to read the NHWC feature map
    flattened in row-major order (``x.reshape(n, -1)``), channel fastest.

    Args:
      params: a params tree or a Flax variables dict.

    Returns:
      A :class:`Spec` (tuple of :class:`Junction`).

    Raises:
      ValueError: where the tree is not such a chain (other parameters, shapes that do not chain),
        pointing to :func:`jaxnorm.enorm.discover`.

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
    modules.sort(key=lambda m: _module_key(m[0], np.ndim(m[1]["kernel"])))
    junctions = []
    for (path_a, mod_a), (path_b, mod_b) in itertools.pairwise(modules):
        kernel_a, kernel_b = mod_a["kernel"], mod_b["kernel"]
        units, fan_in = kernel_a.shape[-1], kernel_b.shape[-2]
        producers: list[Entry] = [((*path_a, "kernel"), kernel_a.ndim - 1)]
        if "bias" in mod_a:
            producers.append(((*path_a, "bias"), 0))
        if fan_in == units:
            consumer: Entry = ((*path_b, "kernel"), kernel_b.ndim - 2)
        elif kernel_a.ndim > 2 and kernel_b.ndim == 2 and fan_in % units == 0:
            consumer = ((*path_b, "kernel"), 0, np.arange(fan_in) % units)
        else:
            raise ValueError(
                f"chain: {'/'.join(map(str, path_a))} has {units} output units but the next module "
                f"{'/'.join(map(str, path_b))} reads {fan_in} inputs; the tree is not a plain chain. "
                "Use jaxnorm.enorm.discover(apply_fn, params, *example_inputs)"
            )
        junctions.append(Junction(tuple(producers), (consumer,)))
    return Spec(junctions)
