"""Power-of-two units that keep the statistics of huge activations finite.

``sigma_hat**2`` of float32 data overflows once ``sigma_hat > 1.8e19`` although ``sigma_hat`` itself,
the mean and the normalized output are representable. The dispersions therefore return
``var = (sigma_hat / unit)**2`` with a power of two ``unit`` (:func:`squared_in_units`), and every norm
takes ``rsqrt(sigma_hat**2 + epsilon) = rsqrt(var + epsilon / unit**2) / unit`` (:func:`inverse_std`).
A power of two scales exactly (barring underflow of elements ``2**-149`` times smaller than the largest),
so the result is the unscaled formula's; ``unit`` is exactly 1 while ``sigma_hat <= 2**(maxexp / 4)``
(``4.3e9`` in float32), where the numbers are bit for bit those without units. The bound also keeps
``rsqrt``'s derivative ``-var**-1.5 / 2`` a normal number.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

__all__ = ["inverse_std", "largest_plain_sigma", "power_of_two_above", "squared_in_units"]


def largest_plain_sigma(dtype: jnp.dtype) -> float:
    """The largest ``sigma_hat`` kept with unit 1: ``2**(maxexp / 4)`` of ``dtype``."""
    return 2.0 ** (jnp.finfo(dtype).maxexp // 4)


def power_of_two_above(value: jnp.ndarray) -> jnp.ndarray:
    """The least power of two ``>= |value|`` (``2**e`` with ``|value| = m 2**e``, ``0.5 <= m < 1``),
    and 1 for ``|value| <= 1`` (no unit below 1: ``epsilon / unit**2`` could overflow)."""
    _, exponent = jnp.frexp(value)
    return jnp.where(exponent > 0, jnp.ldexp(jnp.ones_like(value), exponent), 1).astype(value.dtype)


def squared_in_units(sigma: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """``((sigma / unit)**2, unit)``: ``unit`` is 1 up to :func:`largest_plain_sigma`, beyond it the
    power of two above ``sigma`` (a constant for differentiation)."""
    huge = sigma > largest_plain_sigma(sigma.dtype)
    unit = lax.stop_gradient(jnp.where(huge, power_of_two_above(sigma), 1).astype(sigma.dtype))
    return jnp.square(sigma / unit), unit


def inverse_std(var: jnp.ndarray, epsilon: float, unit: jnp.ndarray | None) -> jnp.ndarray:
    """``rsqrt(var * unit**2 + epsilon)`` computed as ``rsqrt(var + epsilon / unit / unit) / unit``
    (no ``unit**2``, which could overflow); ``rsqrt(var + epsilon)`` without a unit."""
    if unit is None:
        return lax.rsqrt(var + epsilon)
    return lax.rsqrt(var + epsilon / unit / unit) / unit
