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

__all__ = ["EQUILIBRIUM_OPTIMIZERS", "equilibrium_angular_update"]

EQUILIBRIUM_OPTIMIZERS = ("sgd", "adamw")
"""Optimizer families with a closed-form equilibrium angle: ``sgd`` (plain or heavy-ball momentum,
L2 weight decay in the gradient) and ``adamw`` (decoupled weight decay)."""


def equilibrium_angular_update(
    learning_rate: float, weight_decay: float, *, momentum: float = 0.0, optimizer: str = "sgd"
) -> float:
    """The expected angle (radians) a scale-invariant unit turns per step in rotational equilibrium.

    ``sqrt(2 eta lambda / (1 + beta))`` for SGD with momentum ``beta``; ``sqrt(2 eta lambda (1 - beta)
    / (1 + beta))`` for AdamW with ``beta = beta1`` (Kosson et al., ICML 2024, Sec. 3; the module
    docstring says why the factor is kept). Computed in Python floats (double precision).

    Args:
      learning_rate: ``eta`` >= 0, the current learning rate.
      weight_decay: ``lambda`` >= 0 (L2 coefficient in the gradient for ``sgd``; ``optax.adamw``'s
        decoupled ``weight_decay`` for ``adamw``).
      momentum: ``beta`` in [0, 1): SGD's heavy-ball momentum, or AdamW's ``b1``.
      optimizer: one of :data:`EQUILIBRIUM_OPTIMIZERS`.

    Raises:
      ValueError: an argument out of its range, or an unknown optimizer.
    """
    if optimizer not in EQUILIBRIUM_OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {EQUILIBRIUM_OPTIMIZERS}, got {optimizer!r}")
    eta = _non_negative(learning_rate, "learning_rate")
    lam = _non_negative(weight_decay, "weight_decay")
    beta = _non_negative(momentum, "momentum")
    if beta >= 1.0:
        raise ValueError(f"momentum must be in [0, 1), got {momentum!r}")
    if optimizer == "adamw":
        return math.sqrt(2.0 * eta * lam * (1.0 - beta) / (1.0 + beta))
    return math.sqrt(2.0 * eta * lam / (1.0 + beta))


def _non_negative(value: float, name: str) -> float:
    if isinstance(value, bool | str) or not hasattr(value, "__float__"):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    out = float(value)
    if not (math.isfinite(out) and out >= 0.0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return out
