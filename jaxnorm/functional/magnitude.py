"""Magnitude-preserving building blocks (Karras et al., *Analyzing and improving the training dynamics
of diffusion models* (EDM2), CVPR 2024, Sec. 3-4 and App. B).

Each block keeps unit-variance inputs at unit variance out, so activations neither grow nor shrink
through a network without normalization layers:

* :func:`mp_weight`: forced weight normalization's effective kernel, ``W = gain * v / ||v||`` per
  output unit (the kernel of EDM2's ``MPConv``: ``normalize(v) * gain / sqrt(fan_in)``);
* :func:`mp_normalize`: the projection EDM2 applies to the *stored* weights before every training
  step, ``v <- sqrt(fan_in) * v / ||v||`` per unit (per-element RMS 1);
* :func:`mp_silu`: ``silu(x) / 0.596``, with ``0.596 ~ sqrt(E[silu(z)^2])`` for ``z ~ N(0, 1)``;
* :func:`mp_sum`: ``((1 - t) a + t b) / sqrt((1 - t)^2 + t^2)``;
* :func:`mp_concat`: ``[w_a a, w_b b]`` with ``w_a = C (1 - t) / sqrt(N_a)``, ``w_b = C t / sqrt(N_b)``,
  ``C = sqrt((N_a + N_b) / ((1 - t)^2 + t^2))``.

Numerics: norms are taken by :func:`jaxnorm.functional.unit_norm` (float32 for half-precision kernels,
scaled so that no finite kernel overflows) and EDM2's ``eps = 1e-4`` is added to the per-element RMS,
``||v|| / sqrt(fan_in)``, so a zero unit maps to zero, not NaN.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from jaxnorm.functional.checks import check_epsilon, check_floating, check_per_unit, check_positive_values
from jaxnorm.functional.weight import unit_norm

__all__ = ["MP_SILU_SCALE", "mp_concat", "mp_normalize", "mp_silu", "mp_sum", "mp_weight"]

MP_SILU_SCALE = 0.596
"""EDM2's divisor of SiLU, ``sqrt(E[silu(z)^2])`` for ``z ~ N(0, 1)`` (0.59647) rounded as the paper's code
has it."""


def _fan_in(v: jnp.ndarray) -> int:
    check_floating(v, "v")
    if v.ndim < 2 or v.shape[-1] == 0 or v.size == 0:
        raise ValueError(
            f"v must be a kernel of rank >= 2 with output units last and no empty axis, got shape {v.shape}"
        )
    return v.size // v.shape[-1]


def _unit_rms(v: jnp.ndarray, epsilon: float) -> jnp.ndarray:
    """``eps + ||v_j|| / sqrt(fan_in)`` per unit ``j`` (EDM2's ``normalize`` denominator)."""
    fan_in = _fan_in(v)  # checks v before unit_norm reads it
    return check_epsilon(epsilon) + unit_norm(v) / math.sqrt(fan_in)


def _per_unit_quotient(v: jnp.ndarray, scale: jnp.ndarray) -> jnp.ndarray:
    """``v / scale`` per unit (``scale`` of shape ``(out,)``), 0 for units of scale 0.

    XLA turns a division by a broadcast value into a product by its reciprocal, which is subnormal, and
    flushed to 0, for ``scale >= 2^126`` (float32): units of scale ``>= 2^(emax / 2)`` divide twice by
    ``sqrt(scale)`` instead, whose reciprocal is a normal number.
    A zero unit at ``epsilon = 0`` has ``scale = 0``: 0, not ``0 / 0``, with a zero gradient.
    """
    positive = scale > 0
    safe = jnp.where(positive, scale, jnp.ones_like(scale))
    huge = safe >= 2.0 ** (jnp.finfo(safe.dtype).maxexp // 2)
    root = jnp.sqrt(jnp.where(huge, safe, jnp.ones_like(safe)))
    quotient = jnp.where(huge, v / root / root, v / safe)
    return jnp.where(positive, quotient, jnp.zeros_like(quotient))


def mp_normalize(v: jnp.ndarray, *, epsilon: float = 1e-4) -> jnp.ndarray:
    """``v_j / (eps + ||v_j|| / sqrt(fan_in))`` per output unit (last axis): every unit gets norm
    ``sqrt(fan_in)`` (per-element RMS 1). EDM2 (App. B.2, "forced weight normalization") writes this back
    into the stored weights before each training step; jaxnorm's ``sphere_projection`` does that as an
    optax transform. Returned in ``v``'s dtype."""
    scale = _unit_rms(v, epsilon)
    return _per_unit_quotient(v.astype(scale.dtype), scale).astype(v.dtype)


def mp_weight(v: jnp.ndarray, gain: float | jnp.ndarray = 1.0, *, epsilon: float = 1e-4) -> jnp.ndarray:
    """Magnitude-preserving kernel: ``gain * v_j / (eps sqrt(fan_in) + ||v_j||)`` per unit, i.e.
    ``mp_normalize(v) * gain / sqrt(fan_in)`` (EDM2's ``MPConv``, Sec. 3.2, Eq. 5 without learned
    gain), so ``x @ W`` has variance ``gain^2`` for unit-variance, uncorrelated inputs.

    Args:
      v: kernel with the output units on the last axis (Dense ``(in, out)``, Conv HWIO).
      gain: positive scalar or ``(out,)`` vector.
      epsilon: added to the per-element RMS ``||v_j|| / sqrt(fan_in)`` (EDM2: 1e-4).
    """
    check_positive_values(gain, "gain")
    check_per_unit(gain, v, "gain")
    scale = _unit_rms(v, epsilon) * math.sqrt(_fan_in(v))
    gain = jnp.asarray(gain, scale.dtype)
    return (_per_unit_quotient(v.astype(scale.dtype), scale) * gain).astype(v.dtype)


def mp_silu(x: jnp.ndarray) -> jnp.ndarray:
    """``silu(x) / 0.596`` (EDM2, Sec. 3.3): unit second moment for standard normal input. Computed in
    at least float32 and rounded once to ``x``'s dtype (0.596 rounded to bfloat16 is 0.5977: a second
    moment 0.5 % low)."""
    check_floating(x, "x")
    wide = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    return (jax.nn.silu(wide) / MP_SILU_SCALE).astype(x.dtype)


def _check_t(t: float) -> float:
    if isinstance(t, bool) or not isinstance(t, int | float) or not 0.0 <= t <= 1.0:
        raise ValueError(f"t must be a number in [0, 1], got {t!r}")
    return float(t)


def mp_sum(a: jnp.ndarray, b: jnp.ndarray, t: float = 0.5) -> jnp.ndarray:
    """``((1 - t) a + t b) / sqrt((1 - t)^2 + t^2)`` (EDM2, Sec. 3.3, Eq. 6): the weighted sum of two
    uncorrelated unit-variance signals at unit variance (``t = 0.3`` for EDM2's residual branches)."""
    t = _check_t(t)
    check_floating(a, "a")
    check_floating(b, "b")
    try:
        jnp.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise ValueError(f"a and b must broadcast together, got shapes {a.shape} and {b.shape}") from None
    return ((1.0 - t) * a + t * b) / math.sqrt((1.0 - t) ** 2 + t**2)


def mp_concat(a: jnp.ndarray, b: jnp.ndarray, t: float = 0.5, *, axis: int = -1) -> jnp.ndarray:
    """``concat([w_a a, w_b b], axis)`` with ``w_a = C (1 - t) / sqrt(N_a)``, ``w_b = C t / sqrt(N_b)``,
    ``C = sqrt((N_a + N_b) / ((1 - t)^2 + t^2))`` (EDM2, Sec. 3.3, ``mp_cat``): the concatenation has
    unit variance and the two parts contribute ``(1 - t)^2 : t^2`` of it to a following layer, whatever
    their sizes ``N_a``, ``N_b`` along ``axis``."""
    t = _check_t(t)
    check_floating(a, "a")
    check_floating(b, "b")
    shapes: Sequence[tuple[int, ...]] = (a.shape, b.shape)
    if a.ndim != b.ndim or a.ndim == 0:
        raise ValueError(f"a and b must have the same rank >= 1, got shapes {shapes}")
    if isinstance(axis, bool) or not isinstance(axis, int) or not -a.ndim <= axis < a.ndim:
        raise ValueError(
            f"axis must be an int in [-{a.ndim}, {a.ndim}) for inputs of shapes {shapes}, got {axis!r}"
        )
    axis %= a.ndim
    if a.shape[:axis] + a.shape[axis + 1 :] != b.shape[:axis] + b.shape[axis + 1 :]:
        raise ValueError(f"a and b must have the same shape except along axis {axis}, got shapes {shapes}")
    na, nb = a.shape[axis], b.shape[axis]
    # with an empty part the other would come out at variance t^2 / ((1 - t)^2 + t^2) (or its mirror)
    if na == 0 or nb == 0:
        raise ValueError(f"a and b must both have elements along axis {axis}, got shapes {shapes}")
    c = math.sqrt((na + nb) / ((1.0 - t) ** 2 + t**2))
    wa = c * (1.0 - t) / math.sqrt(na)
    wb = c * t / math.sqrt(nb)
    return jnp.concatenate([wa * a, wb * b], axis=axis)
