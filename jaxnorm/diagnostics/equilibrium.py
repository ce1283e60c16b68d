"""Rotational equilibrium: the angular update weight decay and the learning rate settle a
scale-invariant unit into.

For a unit whose loss is invariant to its scale (a kernel followed by normalization), gradient steps
grow its norm (orthogonal updates) and weight decay shrinks it; the two balance at an equilibrium norm
where every step turns the weight vector by the same expected angle (Kosson, Messmer & Jaggi,
*Rotational equilibrium: how weight decay balances learning across neural networks*, ICML 2024,
Sec. 3 and Table 1; the SGD case is Kodryan et al., NeurIPS 2022, and Wan et al. 2021):

* SGD with heavy-ball momentum ``beta`` and L2 weight decay ``lambda`` folded into the gradient,
  learning rate ``eta``: ``angle_eq = sqrt(2 eta lambda / (1 + beta))``;
* AdamW with decoupled decay (``w <- w - eta (u + lambda w)``) and first-moment decay ``beta1``:
  ``angle_eq = sqrt(2 eta lambda (1 - beta1) / (1 + beta1))``, which is ``sqrt(2 eta lambda)`` for
  ``beta1 = 0``. The factor ``(1 - beta1) / (1 + beta1)`` is the mean square of Adam's normalized
  update when successive gradients are uncorrelated (about 0.05 at Adam's default 0.9); jaxnorm
  keeps it rather than the bare ``sqrt(2 eta lambda)``, which overstates the angle 4.4-fold there.

Both are the exact equilibrium of the random-walk model (gradients orthogonal to the weights, of
size proportional to ``1 / ||w||``, in directions uncorrelated from step to step), which the tests
check by simulating the optimizers in float64. Measured per-step angles
(:func:`jaxnorm.diagnostics.angular_update`, or the training loop's ``angle/<layer>`` records with
``log_angular_update``) approach them after a transient of a few ``1 / (eta lambda)`` steps; real
gradients are correlated between steps, so a network's angles sit near, not at, the prediction. With
a schedule, ``eta`` is the current learning rate.
"""

from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["EQUILIBRIUM_OPTIMIZERS", "equilibrium_angular_update"]

EQUILIBRIUM_OPTIMIZERS = ("sgd", "adamw")
"""Optimizer families with a closed-form equilibrium angle: ``sgd`` (plain or heavy-ball momentum,
L2 weight decay in the gradient) and ``adamw`` (decoupled weight decay)."""


def equilibrium_angular_update(
    learning_rate: float | jax.Array,
    weight_decay: float | jax.Array,
    *,
    momentum: float | jax.Array = 0.0,
    optimizer: str = "sgd",
) -> float | jax.Array:
    """The expected angle (radians) a scale-invariant unit turns per step in rotational equilibrium.

    ``sqrt(2 eta lambda / (1 + beta))`` for SGD with momentum ``beta``; ``sqrt(2 eta lambda (1 - beta)
    / (1 + beta))`` for AdamW with ``beta = beta1`` (Kosson et al., ICML 2024, Sec. 3; the module
    docstring says why the factor is kept).

    Python (or NumPy scalar) numbers give a Python float computed in double precision. If any of
    ``learning_rate``, ``weight_decay`` and ``momentum`` is an array (NumPy or JAX, e.g. a learning-rate
    schedule's value or a sweep), the result is a JAX array of their broadcast shape in their floating
    dtype (at least float32), and the function is jit-able (``optimizer`` static). Concrete values are
    checked; traced values cannot be, and give NaN where they are out of range. The angle is formed as
    ``sqrt(2) sqrt(eta) sqrt(lambda) sqrt(factor)``, so it is accurate wherever it is representable.

    Args:
      learning_rate: ``eta`` >= 0, the current learning rate.
      weight_decay: ``lambda`` >= 0 (L2 coefficient in the gradient for ``sgd``; ``optax.adamw``'s
        decoupled ``weight_decay`` for ``adamw``).
      momentum: ``beta`` in [0, 1): SGD's heavy-ball momentum, or AdamW's ``b1``.
      optimizer: one of :data:`EQUILIBRIUM_OPTIMIZERS`.

    Raises:
      ValueError: an argument out of its range or not a real number, or an unknown optimizer.
    """
    if optimizer not in EQUILIBRIUM_OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {EQUILIBRIUM_OPTIMIZERS}, got {optimizer!r}")
    values = {"learning_rate": learning_rate, "weight_decay": weight_decay, "momentum": momentum}
    if any(isinstance(v, np.ndarray | jax.Array) for v in values.values()):
        return _equilibrium_array(values, optimizer)
    eta = _non_negative(learning_rate, "learning_rate")
    lam = _non_negative(weight_decay, "weight_decay")
    beta = _non_negative(momentum, "momentum")
    if beta >= 1.0:
        raise ValueError(f"momentum must be in [0, 1), got {momentum!r}")
    # sqrt of each factor apart: 2 eta lambda itself can under- or overflow where its root cannot
    factor = (1.0 - beta) / (1.0 + beta) if optimizer == "adamw" else 1.0 / (1.0 + beta)
    return math.sqrt(2.0) * math.sqrt(eta) * math.sqrt(lam) * math.sqrt(factor)


def _equilibrium_array(values: dict[str, object], optimizer: str) -> jax.Array:
    """The array form of :func:`equilibrium_angular_update`; NaN where a traced value is out of range."""
    arrays = {}
    for name, value in values.items():
        if isinstance(value, bool | str) or not (
            isinstance(value, np.ndarray | jax.Array | np.generic | numbers.Real)
        ):
            raise ValueError(f"{name} must be a finite number >= 0 or an array of them, got {value!r}")
        dtype = jnp.result_type(value)
        real = jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.floating)
        if dtype == jnp.bool_ or not real:
            raise ValueError(f"{name} must be a real number or a real array, got dtype {dtype}")
        if not isinstance(value, jax.core.Tracer):
            try:
                concrete = np.asarray(value, np.float64)
            except OverflowError:  # a Python int beyond the float range
                raise ValueError(f"{name} must be finite and >= 0, got {value!r}") from None
            if not np.all(np.isfinite(concrete) & (concrete >= 0)):
                raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
            if name == "momentum" and not np.all(concrete < 1):
                raise ValueError(f"momentum must be in [0, 1), got {value!r}")
        arrays[name] = value
    dtype = jnp.promote_types(jnp.result_type(*arrays.values()), jnp.float32)
    eta, lam, beta = (jnp.asarray(arrays[name], dtype) for name in values)
    factor = 1.0 / (1.0 + beta)
    if optimizer == "adamw":
        factor = factor * (1.0 - beta)
    valid = jnp.isfinite(eta) & (eta >= 0) & jnp.isfinite(lam) & (lam >= 0) & (beta >= 0) & (beta < 1)
    eta, lam, factor = (jnp.where(valid, v, 0.0) for v in (eta, lam, factor))
    angle = math.sqrt(2.0) * jnp.sqrt(eta) * jnp.sqrt(lam) * jnp.sqrt(factor)
    return jnp.where(valid, angle, jnp.nan)


def _non_negative(value: float, name: str) -> float:
    if isinstance(value, bool | str) or not hasattr(value, "__float__"):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    try:
        out = float(value)
    except OverflowError:  # a Python int beyond the float range
        out = math.inf
    if not (math.isfinite(out) and out >= 0.0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return out
