"""Weight-space normalizations: per-unit norms, weight norm, scaled / bounded weight norm, scaled WS.

Layouts follow Flax: a Dense kernel is ``(in, out)``, a Conv kernel ``HWIO``, so the output unit is the
last axis and a unit's weight vector is the slice ``w[..., j]``. Every per-unit quantity below reduces
over all axes but the last and has shape ``(out,)``.

References:
  Salimans & Kingma, *Weight normalization* (NeurIPS 2016), Sec. 2 (Eq. 2) and Sec. 3 (data-dependent init).
  Arpit, Campos & Bengio, *How to initialize your network? Robust initialization for WeightNorm & ResNets*
    (NeurIPS 2019); Arpit, *Normalization techniques* (slides), Sec. 5.
  Hoffer, Banner, Golan & Soudry, *Norm matters* (NeurIPS 2018), Sec. 4 (bounded weight norm).
  Qiao et al., *Micro-batch training with batch-channel normalization and weight standardization* (2019);
  Brock et al., *High-performance large-scale image recognition without normalization* (2021),
    Sec. 3 (scaled WS).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxnorm.functional.batch import batch_moments
from jaxnorm.functional.checks import (
    check_epsilon,
    check_floating,
    check_per_unit,
    check_positive_int,
    check_positive_values,
)

__all__ = [
    "bounded_weight_norm",
    "bounded_weight_norm_rho",
    "fans",
    "project_to_norm",
    "scaled_weight_norm",
    "unit_norm",
    "weight_norm",
    "weight_norm_data_init",
    "weight_standardization",
]


def _unit_axes(w: jnp.ndarray, name: str) -> tuple[int, ...]:
    check_floating(w, name)
    if w.ndim < 2:
        raise ValueError(
            f"{name} must be a kernel with the output unit on the last axis (rank >= 2: Dense (in, out), "
            f"Conv HWIO), got shape {w.shape}"
        )
    return tuple(range(w.ndim - 1))


def _unit_scale(w32: jnp.ndarray, axes: tuple[int, ...], epsilon: float) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Per-unit power of two ``c`` just above ``max(max|w|, sqrt(epsilon))``, and ``1 / c``.

    The norms below are computed on ``w / c``: its squares lie in [0, 4], so kernels of any finite
    magnitude neither overflow nor underflow, and the epsilon term ``(sqrt(epsilon) / c)**2 <= 1``. A power
    of two makes the scaling exact, and its exponent is clamped so that ``1 / c`` is a normal number (XLA
    flushes subnormals to zero). Every formula is homogeneous in ``c``, so ``c`` is a constant for
    differentiation (``stop_gradient``) and the gradients stay exact.
    """
    # initial=0: a unit with no entries (an input axis of length 0) has norm sqrt(epsilon)
    m = jnp.maximum(jnp.max(jnp.abs(w32), axis=axes, keepdims=True, initial=0.0), math.sqrt(epsilon))
    bound = -jnp.finfo(w32.dtype).minexp - 1
    exponent = jnp.clip(jnp.frexp(m)[1], -bound, bound)
    one = jnp.ones_like(m)
    return jax.lax.stop_gradient(jnp.ldexp(one, exponent)), jax.lax.stop_gradient(jnp.ldexp(one, -exponent))


def _scaled_sumsq(w: jnp.ndarray, epsilon: float, name: str) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """``(u, c, t)`` with ``u = w / c`` in at least float32 and ``t = sum(u**2) + epsilon / c**2`` per unit,
    so that ``||w||^2 + epsilon = c**2 * t``; ``t`` and ``c`` have shape ``(1, ..., 1, out)``."""
    axes = _unit_axes(w, name)
    w32 = w.astype(jnp.promote_types(w.dtype, jnp.float32))
    c, inv_c = _unit_scale(w32, axes, epsilon)
    u = w32 * inv_c
    t = jnp.sum(jnp.square(u), axis=axes, keepdims=True) + jnp.square(math.sqrt(epsilon) * inv_c)
    return u, c, t


def fans(shape: tuple[int, ...], feature_group_count: int = 1) -> tuple[int, int]:
    """``(fan_in, fan_out)`` of a kernel: Dense ``(in, out)``; Conv ``(*window, in / G, out)`` with
    ``G = feature_group_count`` groups.

    fan_in = (in / G) * prod(window), the inputs of one output unit; fan_out = (out / G) *
    prod(window), the outputs one input reaches (Arpit et al. 2019, Sec. 3; a grouped or depthwise
    conv connects each input to the ``out / G`` units of its group only).
    """
    if len(shape) < 2:
        raise ValueError(f"fans needs a kernel shape of rank >= 2, got {shape}")
    shape = tuple(int(d) for d in shape)
    if 0 in shape:
        raise ValueError(f"fans needs a kernel shape without empty axes, got shape {shape}")
    groups = check_positive_int(feature_group_count, "feature_group_count")
    if shape[-1] % groups:
        raise ValueError(
            f"feature_group_count={groups} must divide the kernel's {shape[-1]} output features"
        )
    receptive = math.prod(shape[:-2])
    return shape[-2] * receptive, shape[-1] // groups * receptive


def unit_norm(w: jnp.ndarray, *, epsilon: float = 0.0) -> jnp.ndarray:
    """L2 norm of each output unit's weight vector: ``sqrt(sum_{i} w[i, j]**2 + epsilon)``, shape ``(out,)``.

    Computed and returned in float32 for bf16/f16 kernels (in the kernel's dtype for float32/float64),
    on the kernel scaled by its per-unit max, so no finite kernel overflows; a zero unit has norm
    ``sqrt(epsilon)`` and, with ``epsilon = 0``, the (sub)gradient 0 there instead of NaN.
    """
    epsilon = check_epsilon(epsilon)
    _, c, t = _scaled_sumsq(w, epsilon, "w")
    norm = jnp.where(t > 0, c * jnp.sqrt(jnp.where(t > 0, t, jnp.ones_like(t))), jnp.zeros_like(t))
    return norm.reshape(w.shape[-1])


def project_to_norm(w: jnp.ndarray, rho: jnp.ndarray | float, *, epsilon: float = 1e-12) -> jnp.ndarray:
    """Rescale each output unit of ``w`` to L2 norm ``rho``: ``rho * w / sqrt(||w||^2 + epsilon)``.

    ``rho`` is a scalar or a ``(out,)`` vector. A zero unit stays zero (no NaN). This is the per-unit
    sphere projection that WRS (Liu et al., Sec. 5) and bounded weight norm (Hoffer et al., Sec. 4) apply.
    """
    check_positive_values(rho, "rho")
    return _project(w, rho, epsilon, "rho", "w")


def _project(w: jnp.ndarray, rho: jnp.ndarray | float, epsilon: float, name: str, w_name: str) -> jnp.ndarray:
    """``rho * w / sqrt(||w||^2 + epsilon)`` computed as ``rho * u / sqrt(t)`` on ``u = w / c``."""
    epsilon = check_epsilon(epsilon)
    check_per_unit(rho, w, name)
    u, _, t = _scaled_sumsq(w, epsilon, w_name)
    inv_norm = jax.lax.rsqrt(jnp.where(t > 0, t, jnp.ones_like(t)))
    return (u * (jnp.asarray(rho, inv_norm.dtype) * inv_norm)).astype(w.dtype)


def weight_norm(v: jnp.ndarray, g: jnp.ndarray | float, *, epsilon: float = 1e-12) -> jnp.ndarray:
    """Weight normalization (Salimans & Kingma 2016, Eq. 2): ``w = g * v / ||v||`` per output unit.

    ``||v||`` is ``sqrt(sum v**2 + epsilon)`` over all axes but the last, so a zero ``v`` gives ``w = 0``
    with finite gradients. ``g`` is a scalar or ``(out,)``. For ``g``'s data-dependent initialisation see
    :func:`weight_norm_data_init`.
    """
    return _project(v, g, epsilon, "g", "v")


def weight_norm_data_init(
    pre_activations: jnp.ndarray, *, epsilon: float = 1e-5
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Weight norm's data-dependent initialisation (Salimans & Kingma 2016, Sec. 3): ``(g, b)``.

    ``pre_activations`` is ``t = x . (v / ||v||)``, the layer's output on an initialisation batch with
    ``g = 1`` and no bias, shape ``(..., out)``. With ``mu[t]`` and ``sigma^2[t]`` the mean and variance per
    output unit (over every axis but the last; float32 statistics)::

        g = 1 / sqrt(sigma^2[t] + epsilon),    b = -mu[t] * g

    so that ``g * t + b``, the pre-activations with these values, has zero mean and unit variance per
    unit on that batch. A layer without a bias can only take ``g``: its pre-activations then have unit
    variance and keep their mean. The modules' ``g_init='data'`` (linen) and ``data_init`` (NNX) use it.

    A unit whose pre-activations are constant on the batch (variance exactly 0: an all-zeros batch, a
    dead unit) has no scale to calibrate and takes ``g = 1`` (a unit-norm weight vector) and
    ``b = -mu[t]``, not ``1 / sqrt(epsilon)``, which multiplied through the depth of a network
    initialised on ``jnp.zeros`` (ResNet-56: NaN logits; VGG-16: 1e33). Initialise on real data.
    """
    check_floating(pre_activations, "pre_activations")
    epsilon = check_epsilon(epsilon)
    if pre_activations.ndim < 1 or pre_activations.size < 2 * pre_activations.shape[-1]:
        raise ValueError(
            "weight norm's data-dependent initialisation needs at least 2 values per output unit, got "
            f"pre_activations of shape {jnp.shape(pre_activations)}: initialise on a batch of at least 2 "
            "examples (linen: the batch given to init with g_init='data'; NNX: layer.data_init(x))"
        )
    mean, var = batch_moments(pre_activations, axis=-1)
    g = jnp.where(var > 0, jax.lax.rsqrt(var + epsilon), 1).astype(var.dtype)
    return g, -mean * g


def scaled_weight_norm(
    v: jnp.ndarray,
    g: jnp.ndarray | float,
    *,
    gain: float = 2.0,
    epsilon: float = 1e-12,
    feature_group_count: int = 1,
) -> jnp.ndarray:
    """Scaled weight normalization (Arpit, Campos & Bengio 2019; slides 001, Sec. 5):

        w = g * sqrt(gain * fan_in / fan_out) * v / ||v||

    with fans from the kernel shape (:func:`fans`; a grouped conv's ``feature_group_count``, which its
    kernel shape does not show) and ``g`` initialised to 1. ``gain`` is 2 for a layer
    followed by ReLU, 1 for a linear layer and ``1 / N`` for the last layer of each residual branch of a
    stage with N blocks; it keeps forward and backward norms constant with depth at initialisation.
    """
    check_positive_values(gain, "gain")
    fan_in, fan_out = fans(jnp.shape(v), feature_group_count)
    return weight_norm(v, jnp.asarray(g) * math.sqrt(gain * fan_in / fan_out), epsilon=epsilon)


def bounded_weight_norm(v: jnp.ndarray, rho: jnp.ndarray | float, *, epsilon: float = 1e-12) -> jnp.ndarray:
    """Bounded weight normalization (Hoffer et al., *Norm matters*, Sec. 4): ``w = rho * v / ||v||``.

    ``rho`` is a constant fixed at initialisation (the initial unit norms, or their per-layer mean), not
    a learned gain; the layer is meant to be followed by mean-only batch norm.
    """
    check_positive_values(rho, "rho")
    return _project(v, rho, epsilon, "rho", "v")


def bounded_weight_norm_rho(v: jnp.ndarray, *, per_unit: bool = True, layer: str = "v") -> jnp.ndarray:
    """The bound ``rho`` that bounded weight norm fixes at initialisation (Hoffer et al., Sec. 4): the
    L2 norm of each output unit of the initial kernel ``v`` (``per_unit``), or their mean (the paper's
    scalar).

    A unit of norm 0 would have ``rho = 0`` and output 0 forever, so a concrete ``v`` with one raises a
    ``ValueError`` naming the units and ``layer`` (e.g. ``kernel_init=zeros``). Under ``jax.jit`` the
    values cannot be checked: a jitted :func:`bounded_weight_norm` then keeps such a unit at 0, an eager
    one refuses its ``rho`` of 0."""
    norms = unit_norm(v)
    traced = isinstance(norms, jax.core.Tracer)
    zero_units = [] if traced else np.flatnonzero(~(np.asarray(norms) > 0)).tolist()
    if zero_units:
        raise ValueError(
            f"{layer}: the initial kernel's output units {zero_units} have norm 0, and bounded weight norm "
            "fixes each unit's norm at its initial one (rho), so they would output 0 forever; use a "
            "kernel_init that gives every unit a non-zero norm"
        )
    return norms if per_unit else jnp.mean(norms)


def weight_standardization(
    w: jnp.ndarray, *, gain: jnp.ndarray | float | None = None, epsilon: float = 1e-5
) -> jnp.ndarray:
    """Scaled weight standardization (Brock et al. 2021, Eq. 2; Qiao et al. 2019) per output unit:

        w_hat = (w - mean(w)) / sqrt(max(fan_in * var(w), epsilon)) [* gain]

    ``fan_in`` = every axis but the last. The ``max`` guard follows the NFNets reference code. Computed
    in at least float32 on ``d = w - w[0, ..., 0, j]`` (a constant unit gives exactly 0) scaled by its
    per-unit max (no overflow for any finite kernel).
    """
    epsilon = check_epsilon(epsilon)
    axes = _unit_axes(w, "w")
    fan_in = math.prod(w.shape[:-1])
    w32 = w.astype(jnp.promote_types(w.dtype, jnp.float32))
    shift = jax.lax.stop_gradient(w32[(0,) * len(axes)])
    d = w32 - shift
    _, inv_c = _unit_scale(d, axes, epsilon)
    u = d * inv_c
    centred = u - jnp.mean(u, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(centred), axis=axes, keepdims=True)
    denom = jnp.maximum(var * fan_in, jnp.square(math.sqrt(epsilon) * inv_c))
    scale = jax.lax.rsqrt(jnp.where(denom > 0, denom, jnp.ones_like(denom)))
    if gain is not None:
        check_per_unit(gain, w, "gain")
        scale = scale * jnp.asarray(gain, scale.dtype)
    return (centred * scale).astype(w.dtype)
