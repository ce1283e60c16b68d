"""The abstract values of discover's tracer: which unit scales each element, and with which power.

Hypothesis: a params leaf is multiplied by a positive per-unit vector ``d``. Every intermediate
value is then one of

- ``None``: unscaled (no element depends on ``d``);
- :class:`Scaled`: element ``i`` is multiplied by ``d[ids[i]] ** power`` (``ids[i] = -1``: not
  scaled), ``ids`` an integer array broadcastable to the value's shape;
- :class:`Broken`: scaled in a way no consumer can undo (the printable reason).

Unit ids are plain NumPy integer arrays (shapes only, nothing is evaluated on device); powers are
exact :class:`~fractions.Fraction` values (``rsqrt`` of a variance gives ``-1``, never ``-0.999``).
:class:`Refuted` and :class:`AddendMustScale` are the two signals between the forward pass, the
backward pass and the search in :mod:`jaxnorm.enorm.discover`.

References:
  Stock, Defossez, Gribonval, Jegou, Usunier. Equi-normalization of neural networks. ICLR 2019,
  Sec. 3.1 (the per-unit rescaling ``D^-1 W D`` whose propagation is tracked here).
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import NamedTuple

import numpy as np

__all__ = [
    "AddendMustScale",
    "Broken",
    "Refuted",
    "Scaled",
    "broadcast_ids",
    "constant_along",
    "merge_seeds",
    "squash",
]


class Scaled(NamedTuple):
    """A value whose element ``i`` is multiplied by ``d[ids[i]] ** power``."""

    ids: np.ndarray  # broadcastable to the var's shape; -1: unscaled element
    power: Fraction


class Broken(NamedTuple):
    """A value scaled in a way no consumer can undo; ``reason`` says why (printable)."""

    reason: str


class Refuted(Exception):
    """The hypothesis is refuted; the message is the printable reason."""


class AddendMustScale(Exception):
    """An unscaled addend ``var`` must carry the unit ids ``target`` (with ``power``) for the
    addition to stay homogeneous: the search traces it back to the params (or inputs) that would
    scale it, adds them to the hypothesis and restarts the forward pass."""

    def __init__(self, var: int, target: np.ndarray, power: Fraction = Fraction(1)):
        super().__init__()
        self.var, self.target, self.power = var, target, power


def broadcast_ids(ids: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``ids`` broadcast (read-only view) to the full ``shape`` of its value."""
    return np.broadcast_to(ids, shape)


def constant_along(ids: np.ndarray, axes: Sequence[int]) -> bool:
    """Whether ``ids`` is the same along every axis in ``axes`` (a reduction there mixes no units)."""
    for a in axes:
        if ids.shape[a] > 1 and not np.all(ids == np.take(ids, [0], axis=a)):
            return False
    return True


def squash(ids: np.ndarray, axes: Sequence[int]) -> np.ndarray:
    """Keep one slice along ``axes`` (ids known constant there), keepdims."""
    for a in axes:
        ids = np.take(ids, [0], axis=a)
    return ids


def merge_seeds(into: dict[int, np.ndarray], new: dict[int, np.ndarray]) -> None:
    """Add ``new`` (leaf -> unit ids) to ``into`` in place; a leaf element claimed by two
    different units refutes the hypothesis."""
    for leaf, ids in new.items():
        if leaf in into:
            a, b = into[leaf], ids
            clash = (a >= 0) & (b >= 0) & (a != b)
            if np.any(clash):
                raise Refuted("a parameter would carry two different units")
            into[leaf] = np.where(a >= 0, a, b)
        else:
            into[leaf] = ids
