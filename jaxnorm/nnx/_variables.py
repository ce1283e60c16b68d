"""Helpers that create and read the optional variables of the NNX modules, as flax.nnx does."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import jax
from flax import nnx
from flax.typing import Dtype, Initializer

__all__ = ["NO_METADATA", "optional_param", "value_or_none"]

NO_METADATA: Mapping[str, Any] = MappingProxyType({})


def optional_param(use: bool, init: Initializer, shape: tuple[int, ...], param_dtype: Dtype, rngs: nnx.Rngs,
                   metadata: Mapping[str, Any]) -> nnx.Param | None:
    """``nnx.Param(init(rngs.params(), shape, param_dtype))`` as flax draws it, or ``nnx.data(None)``."""
    if not use:
        return nnx.data(None)
    return nnx.Param(init(rngs.params(), shape, param_dtype), **metadata)


def value_or_none(variable: nnx.Variable | None) -> jax.Array | None:
    """The array held by ``variable``, or ``None`` for an absent one."""
    return None if variable is None else variable[...]
