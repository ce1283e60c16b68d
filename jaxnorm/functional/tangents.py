"""Tangents of the functional core's custom JVPs (:mod:`.last_axis`, :mod:`.per_example_l2`), which are
defined with ``symbolic_zeros=True`` so that an input not differentiated costs no full-size work."""

from __future__ import annotations

import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

__all__ = ["instantiate_zeros"]


def instantiate_zeros(tangent):
    """A symbolic-zero tangent (an input not differentiated) as an array of zeros; any other tangent as
    it is."""
    return jnp.zeros(tangent.shape, tangent.dtype) if isinstance(tangent, SymbolicZero) else tangent
