"""Implicit ENorm: learnable log-scales trained with the weights under a norm penalty.

Stock et al. 2019, Annex C: reparametrise every weight as ``D_{k-1}^-1 W_k D_k`` with learnable
positive diagonal rescalings ``D = exp(u)``, and train ``(W, u)`` jointly by SGD on
``L = CE(f(x; D^-1 W D)) + lambda * sum_k ||D_{k-1}^-1 W_k D_k||_2^2``. The network function does
not depend on ``u`` (``dCE/du = 0`` by construction), so ``u`` only follows the penalty: it
performs the balancing that explicit ENorm does by block coordinate descent.

Use in a training loop::

    u = init_log_scales(params, spec)
    def loss(trainable, x, y):
        w = apply_log_scales(trainable["params"], spec, trainable["log_scales"])
        ce = cross_entropy(model.apply({"params": w}, x), y)
        return ce + lam * implicit_penalty(trainable["params"], spec, trainable["log_scales"])
    # optimise {"params": params, "log_scales": u}; predict with apply_log_scales(...)

References:
  Stock, Defossez, Gribonval, Jegou, Usunier. Equi-normalization of neural networks. ICLR 2019,
  Annex C (Eq. 26 and the implicit formulation that follows it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jaxnorm.enorm.balance import multipliers, objective, plan_spec
from jaxnorm.enorm.spec import Junction, unwrap_variables
from jaxnorm.enorm.trees import split_params

__all__ = ["apply_log_scales", "implicit_penalty", "init_log_scales"]

PyTree = Any


def init_log_scales(params: PyTree, spec: Sequence[Junction], dtype: Any = jnp.float32):
    """Zero log-scales (``D = I``), one ``(n,)`` array per junction of ``spec``."""
    inner, _ = unwrap_variables(params)
    return tuple(jnp.zeros((plan.units,), dtype) for plan in plan_spec(inner, spec, "init_log_scales"))


def apply_log_scales(params: PyTree, spec: Sequence[Junction], log_scales: Sequence[jax.Array]):
    """The effective params ``D^-1 W D`` with ``D = exp(log_scales)``: the same function as
    ``params`` for any ``log_scales`` (producers times ``exp(u)``, consumers divided by it).
    Differentiable in both arguments; same structure as ``params``."""
    inner, rebuild = split_params(params)
    factors = multipliers(inner, spec, [jnp.exp(u) for u in log_scales])
    scaled = jax.tree.map(lambda w, f: w if f is None else (w * f).astype(w.dtype), inner, factors,
                          is_leaf=lambda v: v is None)
    return rebuild(scaled)


def implicit_penalty(
    params: PyTree, spec: Sequence[Junction], log_scales: Sequence[jax.Array], *, p: float = 2
) -> jax.Array:
    """``sum_k ||D_{k-1}^-1 W_k D_k||_p^p`` over the spec's weights (biases not counted): the
    weight-decay term of Annex C evaluated at the effective params."""
    return objective(apply_log_scales(params, spec, log_scales), spec, p=p)
