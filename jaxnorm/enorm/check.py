"""One-call verification that a rescaling kept the network function.

ENorm and the weight-norm transforms are meant to leave ``apply_fn(params, x)`` unchanged. Where a
spec was inferred from the params tree alone (:func:`jaxnorm.enorm.chain`, the bare
``enorm_balance(params)``) that rests on assumptions about the activations which the tree cannot
show; :func:`check` tests them on a probe batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["check"]

PyTree = Any


def _default_rtol(outputs: list) -> float:
    """``sqrt(eps)`` of the narrowest floating output dtype (3.5e-4 for float32, 0.03 for float16)."""
    eps = [float(jnp.finfo(o.dtype).eps) for o in outputs if jnp.issubdtype(o.dtype, jnp.floating)]
    return float(np.sqrt(max(eps, default=float(jnp.finfo(jnp.float32).eps))))


def check(
    apply_fn: Callable,
    before: PyTree,
    after: PyTree,
    *args: Any,
    rtol: float | None = None,
    **kwargs: Any,
) -> float:
    """Raise unless ``apply_fn(after, *args, **kwargs)`` equals ``apply_fn(before, *args, **kwargs)``.

    The deviation is ``max |f_after - f_before| / max |f_before|`` over all leaves of the outputs
    (computed in float64 on the host). Typical use, right after a bare call::

        balanced = jaxnorm.enorm_balance(params)
        jaxnorm.enorm.check(model.apply, params, balanced, x)   # raises on a GELU / tanh network

    Args:
      apply_fn: called as ``apply_fn(params, *args, **kwargs)`` (``model.apply``; for NNX, a pure
        function of the state, e.g. ``lambda s, x: nnx.merge(graphdef, s, rest)(x)``).
      before, after: the params (any container ``apply_fn`` takes) before and after the transform.
      *args, **kwargs: a probe batch and options (e.g. ``train=False``).
      rtol: the largest relative deviation accepted; default ``sqrt(eps)`` of the outputs' dtype.

    Returns:
      The relative deviation (a Python float), when it is within ``rtol``.

    Raises:
      ValueError: outputs of different structure or shapes, non-finite outputs after the transform,
        or a deviation above ``rtol`` (the message says how large, and what to do).
    """
    out_before = jax.tree.leaves(apply_fn(before, *args, **kwargs))
    out_after = jax.tree.leaves(apply_fn(after, *args, **kwargs))
    if len(out_before) != len(out_after) or any(
            np.shape(a) != np.shape(b) for a, b in zip(out_before, out_after, strict=True)):
        raise ValueError("check: apply_fn returns outputs of different structure or shapes")
    if rtol is None:
        rtol = _default_rtol([jnp.asarray(o) for o in out_before])
    elif isinstance(rtol, bool | np.bool_) or not (
            isinstance(rtol, int | float | np.integer | np.floating) and rtol >= 0):
        raise ValueError(f"check: rtol must be a number >= 0, got {rtol!r}")
    a = [np.asarray(o, np.float64) for o in out_after]
    b = [np.asarray(o, np.float64) for o in out_before]
    if not all(np.all(np.isfinite(x)) for x in a):
        raise ValueError("check: the outputs after the transform are not finite")
    scale = max((float(np.max(np.abs(x), initial=0.0)) for x in b), default=0.0)
    diff = max((float(np.max(np.abs(x - y), initial=0.0)) for x, y in zip(a, b, strict=True)),
               default=0.0)
    deviation = diff / scale if scale > 0 else diff
    if not deviation <= rtol:
        raise ValueError(
            f"check: the transform changed the function: relative output deviation {deviation:.3g} "
            f"> rtol {rtol:.3g}. For ENorm with an inferred chain, the network is not a plain "
            "ReLU chain (e.g. GELU / tanh activations, normalization or residual connections "
            "between layers); use spec = jaxnorm.enorm.discover(apply_fn, params, *example_inputs)"
        )
    return deviation
