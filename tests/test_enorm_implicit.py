"""Implicit ENorm (Annex C): function invariance, zero loss gradient in u, penalty minimum."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxnorm.enorm import (
    apply_log_scales,
    chain,
    enorm_balance,
    implicit_penalty,
    init_log_scales,
    objective,
)
from tests import enorm_models as models


def _setup():
    model = models.MLP(widths=(5, 4), dtype=jnp.float64)
    variables, x = models.init(model, (6, 3), 0, jnp.float64)
    return model, variables["params"], x, chain(variables)


def test_function_invariant_and_loss_gradient_zero(x64):
    model, params, x, spec = _setup()
    u = tuple(jnp.asarray(np.random.default_rng(k).standard_normal(n.shape))
              for k, n in enumerate(init_log_scales(params, spec, jnp.float64)))
    out = lambda u: model.apply({"params": apply_log_scales(params, spec, u)}, x)
    np.testing.assert_allclose(out(u), model.apply({"params": params}, x), rtol=1e-12)
    grads = jax.grad(lambda u: jnp.sum(out(u) ** 2))(u)
    assert max(float(jnp.max(jnp.abs(g))) for g in grads) < 1e-10
    pen = jax.grad(lambda u: implicit_penalty(params, spec, u))(u)
    assert max(float(jnp.max(jnp.abs(g))) for g in pen) > 1e-3


def test_penalty_descent_reaches_the_enorm_minimum(x64):
    _, params, _, spec = _setup()
    u = init_log_scales(params, spec, jnp.float64)
    assert float(implicit_penalty(params, spec, u)) == pytest.approx(float(objective(params, spec)))
    tx = optax.lbfgs()
    state = tx.init(u)
    f = lambda u: implicit_penalty(params, spec, u)
    step = jax.jit(lambda u, s: tx.update(jax.grad(f)(u), s, u, value=f(u), grad=jax.grad(f)(u),
                                          value_fn=f))
    for _ in range(200):
        updates, state = step(u, state)
        u = optax.apply_updates(u, updates)
    want = float(objective(enorm_balance(params, spec, cycles=2000), spec))
    assert float(f(u)) == pytest.approx(want, rel=1e-8)


def test_joint_training_step_under_jit():
    model = models.MLP(widths=(5, 4))
    variables, x = models.init(model, (6, 3))
    params, spec = variables["params"], chain(variables)
    y = jnp.ones((6, 3))
    trainable = {"params": params, "log_scales": init_log_scales(params, spec)}

    def loss(t):
        w = apply_log_scales(t["params"], spec, t["log_scales"])
        fit = jnp.mean((model.apply({"params": w}, x) - y) ** 2)
        return fit + 1e-2 * implicit_penalty(t["params"], spec, t["log_scales"])

    tx = optax.sgd(0.1)
    state = tx.init(trainable)

    @jax.jit
    def step(t, s):
        g = jax.grad(loss)(t)
        u, s = tx.update(g, s, t)
        return optax.apply_updates(t, u), s

    before = loss(trainable)
    for _ in range(5):
        trainable, state = step(trainable, state)
    assert float(loss(trainable)) < float(before)
    assert any(float(jnp.max(jnp.abs(u))) > 0 for u in trainable["log_scales"])
