"""Normalization propagation's ReLU (Arpit et al., ICML 2016, Sec. 3): the ReLU of a standard normal,
re-centred and re-scaled to zero mean and unit variance."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from jaxnorm.functional.checks import check_floating

__all__ = ["RELU_MEAN", "RELU_STD", "normprop_relu"]


RELU_MEAN = 1 / math.sqrt(2 * math.pi)
"""``E[max(0, z)]`` for ``z ~ N(0, 1)`` (Arpit et al. 2016, Sec. 3)."""


RELU_STD = math.sqrt((1 - 1 / math.pi) / 2)
"""``std[max(0, z)]`` for ``z ~ N(0, 1)`` (Arpit et al. 2016, Sec. 3)."""


def normprop_relu(u: jnp.ndarray) -> jnp.ndarray:
    """Normalization propagation's ReLU (Arpit et al. 2016, Sec. 3): ``(relu(u) - RELU_MEAN) / RELU_STD``.

    If ``u ~ N(0, 1)`` the output has zero mean and unit variance, so a network of
    ``u = gamma * W x / ||W|| + beta`` layers (:func:`jaxnorm.functional.weight_norm`) followed by this
    activation stays normalized without any batch statistics. Computed in at least float32 and rounded
    once to ``u``'s dtype (the constants rounded to bfloat16 bias the output's variance by 0.5 %).
    """
    check_floating(u, "u")
    wide = u.astype(jnp.promote_types(u.dtype, jnp.float32))
    return ((jax.nn.relu(wide) - RELU_MEAN) / RELU_STD).astype(u.dtype)
