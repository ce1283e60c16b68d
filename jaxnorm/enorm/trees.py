"""The params containers ENorm accepts, seen as one pure nested dict of arrays.

``jaxnorm.enorm`` works on a pure params tree: nested mappings whose keys are strings (module and
parameter names) or integers (``nnx.List`` entries) and whose leaves are arrays. Users hold their
parameters in one of four containers, all accepted transparently:

- a bare linen params dict (``variables["params"]``) or a pure dict from ``nnx.State.to_pure_dict()``;
- a linen variables dict ``{"params": ..., "batch_stats": ...}`` (only ``"params"`` is rescaled, the
  other collections come back unchanged);
- a flax ``FrozenDict`` of either;
- an ``nnx.State`` (``nnx.state(model, nnx.Param)``, with ``nnx.Variable`` leaves, or the array-leaf
  state that ``nnx.Optimizer`` hands to optax).

:func:`split_params` returns the pure params and a ``rebuild`` function that puts new pure params
back into the caller's container (same type, same other collections, same Variable types).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
from flax import nnx

__all__ = ["is_nnx_state", "is_variables", "pure_params", "split_params"]

PyTree = Any


def is_nnx_state(tree: Any) -> bool:
    """True for an ``nnx.State`` (any leaves: ``nnx.Variable`` or plain arrays)."""
    return isinstance(tree, nnx.State)


def _pure(tree: Any) -> Any:
    """A pure nested dict with array leaves (``nnx.State`` and ``FrozenDict`` unwrapped)."""
    if is_nnx_state(tree):
        return nnx.to_pure_dict(tree)
    if isinstance(tree, Mapping):
        return {k: _pure(v) for k, v in tree.items()}
    if isinstance(tree, nnx.Variable):
        return tree.get_value()
    return tree


def _rebuild_state(state: nnx.State, new: PyTree) -> nnx.State:
    out = jax.tree.map(lambda x: x, state)  # fresh State and Variables: the input is not mutated
    nnx.replace_by_pure_dict(out, new)
    return out


def is_variables(tree: Any) -> bool:
    """True for a Flax variables dict (a mapping with a ``"params"`` mapping), not an ``nnx.State``."""
    return isinstance(tree, Mapping) and not is_nnx_state(tree) and "params" in tree and isinstance(
        tree["params"], Mapping)


def split_params(tree: PyTree) -> tuple[PyTree, Callable[[PyTree], PyTree]]:
    """``(params, rebuild)``: the pure params of ``tree`` and ``rebuild(new_params)``, the caller's
    container with ``new_params`` in place of its params.

    ``tree`` may be a params dict, a Flax variables dict with a ``"params"`` key (other collections
    kept), a ``FrozenDict`` of either, or an ``nnx.State``.
    """
    if is_nnx_state(tree):
        return nnx.to_pure_dict(tree), lambda new: _rebuild_state(tree, new)
    if is_variables(tree):
        inner, rebuild_inner = split_params(tree["params"])

        def rebuild(new: PyTree) -> PyTree:
            if hasattr(tree, "copy") and not isinstance(tree, dict):  # flax FrozenDict
                return tree.copy({"params": rebuild_inner(new)})
            out = dict(tree)
            out["params"] = rebuild_inner(new)
            return out

        return inner, rebuild
    if isinstance(tree, Mapping) and not isinstance(tree, dict):  # FrozenDict of params
        return _pure(tree), lambda new: type(tree)(new)
    return _pure(tree), lambda new: new


def pure_params(tree: PyTree) -> PyTree:
    """The pure params dict of any accepted container (see :func:`split_params`)."""
    return split_params(tree)[0]
