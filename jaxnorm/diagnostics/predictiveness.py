"""Loss landscape along the gradient: loss variation, gradient predictiveness, effective smoothness.

Santurkar, Tsipras, Ilyas & Madry, *How does batch normalization help optimization?* (NeurIPS
2018), Sec. 3.1, Fig. 4 (reproduced in Arpit, *Normalization techniques*, slides 001, Sec. 7): at
params ``p`` with gradient ``g``, move along the gradient to ``p_i = p - eta_i g`` for several step
sizes and record

* the loss ``L(p_i)`` (its range over ``i``: the loss landscape's variation),
* the gradient change ``||grad L(p_i) - g||`` (gradient predictiveness: small = predictive),
* ``||grad L(p_i) - g|| / ||p_i - p||``, whose maximum is the "effective" beta-smoothness.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from jaxnorm.diagnostics.hessian import check_float_params, scaled_l2_norm

__all__ = ["GradientPredictiveness", "gradient_predictiveness"]

PyTree = Any


class GradientPredictiveness(NamedTuple):
    """Result of :func:`gradient_predictiveness`; arrays of shape ``(len(step_sizes),)`` or scalars.

    Attributes:
      step_sizes: the ``eta_i``.
      losses: ``L(p - eta_i g)``.
      gradient_changes: ``||grad L(p - eta_i g) - g||``.
      loss_variation: ``max_i losses - min_i losses``.
      effective_smoothness: ``max_i ||grad L(p - eta_i g) - g|| / (eta_i ||g||)``.
      gradient_norm: ``||g||``.
    """

    step_sizes: jax.Array
    losses: jax.Array
    gradient_changes: jax.Array
    loss_variation: jax.Array
    effective_smoothness: jax.Array
    gradient_norm: jax.Array


def gradient_predictiveness(
    loss_fn: Callable[..., jax.Array],
    params: PyTree,
    *args,
    step_sizes: Sequence[float] | jax.Array = (0.05, 0.1, 0.2, 0.4),
    **kwargs,
) -> GradientPredictiveness:
    """Loss and gradient along the gradient direction (Santurkar et al. 2018, Sec. 3.1, Fig. 4).

    Args:
      loss_fn: scalar loss ``loss_fn(params, *args, **kwargs)``.
      params: the current params ``p``.
      *args, **kwargs: passed on to ``loss_fn`` (the same batch for every point).
      step_sizes: finite, positive ``eta_i`` (the paper uses a range around the training learning
        rate); checked unless traced.

    A zero gradient gives zero changes and zero smoothness (no direction to move in). Norms are taken
    on the vector divided by its largest magnitude, so gradients near the float range limits neither
    overflow nor underflow.

    Raises:
      ValueError: ``step_sizes`` not a non-empty 1-D sequence of finite, positive real numbers, or
        ``params`` without elements or with a leaf that is not floating point.
    """
    if isinstance(step_sizes, jax.core.Tracer):
        etas = step_sizes
    else:
        try:
            values = np.asarray(step_sizes)
        except Exception:
            values = np.asarray(None)
        real = np.issubdtype(values.dtype, np.integer) or np.issubdtype(values.dtype, np.floating)
        if values.ndim != 1 or values.size == 0 or not real:
            raise ValueError(
                f"gradient_predictiveness: step_sizes must be a non-empty 1-D sequence of real numbers, "
                f"got {step_sizes!r}"
            )
        if not np.all(np.isfinite(values) & (values > 0)):
            raise ValueError(
                f"gradient_predictiveness: step_sizes must be finite and positive, got {step_sizes!r}"
            )
        etas = jnp.asarray(step_sizes)
    if etas.ndim != 1 or etas.size == 0:
        raise ValueError(f"gradient_predictiveness: step_sizes must be a 1-D sequence, got {step_sizes!r}")
    if not (jnp.issubdtype(etas.dtype, jnp.floating) or jnp.issubdtype(etas.dtype, jnp.integer)):
        raise ValueError(f"gradient_predictiveness: step_sizes must be real numbers, got dtype {etas.dtype}")
    if not jax.tree.leaves(params) or all(jnp.size(leaf) == 0 for leaf in jax.tree.leaves(params)):
        raise ValueError(
            f"gradient_predictiveness: params must hold at least one array element, got {params!r}"
        )
    check_float_params(params, "gradient_predictiveness")

    value_and_grad = jax.value_and_grad(lambda p: loss_fn(p, *args, **kwargs))
    _, grads = value_and_grad(params)
    flat_grads, _ = ravel_pytree(grads)
    gradient_norm = scaled_l2_norm(flat_grads)

    def probe(eta):
        moved = jax.tree.map(lambda p, g: p - (eta * g).astype(p.dtype), params, grads)
        loss, new_grads = value_and_grad(moved)
        return loss, scaled_l2_norm(ravel_pytree(new_grads)[0] - flat_grads)

    losses, changes = jax.lax.map(probe, etas.astype(flat_grads.dtype))
    distance = etas * gradient_norm
    ratios = jnp.where(distance > 0, changes / jnp.where(distance > 0, distance, 1.0), 0.0)
    return GradientPredictiveness(
        step_sizes=etas,
        losses=losses,
        gradient_changes=changes,
        loss_variation=jnp.max(losses) - jnp.min(losses),
        effective_smoothness=jnp.max(ratios),
        gradient_norm=gradient_norm,
    )
