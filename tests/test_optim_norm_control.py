"""decay_to_norm / adamwn (Loshchilov 2023, weight norm control): target 0 is AdamW exactly; with no
gradient the distance of each norm to the target shrinks by (1 - lr wd) per step (float64 recursion)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxnorm

OPT = jaxnorm.optim
RNG = np.random.default_rng(0)
PARAMS = {
    "k": jnp.asarray(RNG.normal(size=(6, 4)), jnp.float32),
    "c": jnp.asarray(RNG.normal(size=(3, 3, 2, 5)), jnp.float32),
    "b": jnp.asarray(RNG.normal(size=(4,)), jnp.float32),
}


def grads(step):
    rng = np.random.default_rng(step)
    return jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), PARAMS)


def run(tx, steps, zero_grads=False):
    params, state = PARAMS, tx.init(PARAMS)
    for t in range(steps):
        g = jax.tree.map(jnp.zeros_like, PARAMS) if zero_grads else grads(t)
        updates, state = tx.update(g, state, params)
        params = optax.apply_updates(params, updates)
    return params


def test_target_zero_is_adamw():
    mask = jax.tree.map(lambda p: p.ndim >= 2, PARAMS)
    want = run(optax.adamw(1e-2, weight_decay=0.1, mask=mask), 5)
    got = run(OPT.adamwn(1e-2, 0.0, weight_decay=0.1), 5)
    for k in want:
        np.testing.assert_allclose(np.asarray(got[k]), np.asarray(want[k]), rtol=1e-6, atol=1e-7)


def test_float64_updates_keep_their_precision(x64):
    """float64 params and updates: target 0 is ``optax.adamw`` bit for bit, and a target of 0.1 the
    float64 formula ``g + wd (w - 0.1 w / ||w_j||)``; both were rounded through float32 (3e-9 and 5e-8
    off)."""
    params = {"k": jnp.asarray(RNG.normal(size=(6, 4)))}
    g = {"k": jnp.asarray(RNG.normal(size=(6, 4)))}
    mask = {"k": True}
    a, b = optax.adamw(0.1, weight_decay=0.1, mask=mask), OPT.adamwn(0.1, 0.0, weight_decay=0.1)
    want, _ = a.update(g, a.init(params), params)
    got, _ = b.update(g, b.init(params), params)
    np.testing.assert_array_equal(np.asarray(got["k"]), np.asarray(want["k"]))
    tx = OPT.decay_to_norm(0.5, target=0.1)
    got, _ = tx.update(g, tx.init(params), params)
    w = np.asarray(params["k"])
    want = np.asarray(g["k"]) + 0.5 * (w - 0.1 * w / np.linalg.norm(w, axis=0))
    np.testing.assert_allclose(np.asarray(got["k"]), want, rtol=1e-15, atol=1e-15)
    assert got["k"].dtype == jnp.float64


@pytest.mark.parametrize("per_unit", [True, False])
def test_norm_distance_to_target_contracts_by_one_minus_lr_wd(per_unit):
    lr, wd, target, steps = 0.1, 0.5, 2.0, 7
    tx = optax.chain(OPT.decay_to_norm(wd, target, per_unit=per_unit), optax.scale_by_learning_rate(lr))
    got = run(tx, steps, zero_grads=True)
    for k in ("k", "c"):
        w = np.asarray(PARAMS[k], np.float64)
        norms = np.sqrt((w.reshape(-1, w.shape[-1]) ** 2).sum(0)) if per_unit else np.sqrt((w**2).sum())
        want = target + (norms - target) * (1 - lr * wd) ** steps
        g = np.asarray(got[k], np.float64)
        have = np.sqrt((g.reshape(-1, g.shape[-1]) ** 2).sum(0)) if per_unit else np.sqrt((g**2).sum())
        np.testing.assert_allclose(have, want, rtol=1e-5)
        # direction unchanged: the decay is radial
        cos = (g * w).reshape(-1, w.shape[-1]).sum(0) / (
            np.sqrt((g.reshape(-1, w.shape[-1]) ** 2).sum(0))
            * np.sqrt((w.reshape(-1, w.shape[-1]) ** 2).sum(0))
        )
        np.testing.assert_allclose(cos, 1.0, rtol=1e-6)
    np.testing.assert_array_equal(got["b"], PARAMS["b"])  # rank 1: not in the default mask


def test_schedule_target_and_zero_unit():
    tx = optax.chain(OPT.decay_to_norm(1.0, lambda count: 3.0 + count), optax.scale_by_learning_rate(1.0))
    p = {"w": jnp.concatenate([jnp.ones((4, 1)), jnp.zeros((4, 1))], axis=1)}
    updates, state = tx.update(jax.tree.map(jnp.zeros_like, p), tx.init(p), p)
    new = optax.apply_updates(p, updates)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(new["w"][:, 0])), 3.0, rtol=1e-6)  # lr*wd = 1
    np.testing.assert_array_equal(new["w"][:, 1], 0.0)
    assert int(state[0].count) == 1


@pytest.mark.parametrize("scale", [1e-30, 1e20])
def test_degenerate_scales_finite(scale):
    p = {"w": jnp.full((5, 3), scale, jnp.float32)}
    tx = OPT.adamwn(1e-3, 1.0, weight_decay=0.1)
    updates, _ = tx.update(jax.tree.map(jnp.zeros_like, p), tx.init(p), p)
    assert bool(jnp.all(jnp.isfinite(updates["w"])))


def test_nnx_optimizer_matches_pure_params():
    model = nnx.Linear(6, 4, rngs=nnx.Rngs(0))
    x = jnp.asarray(RNG.normal(size=(8, 6)), jnp.float32)
    tx = OPT.adamwn(1e-2, 1.5, weight_decay=0.3)
    opt = nnx.Optimizer(model, tx, wrt=nnx.Param)
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    state = tx.init(params)
    for _ in range(3):
        g = nnx.grad(lambda m: jnp.sum(jnp.tanh(m(x))))(model)
        updates, state = tx.update(nnx.to_pure_dict(g), state, params)
        params = optax.apply_updates(params, updates)
        opt.update(model, g)
    np.testing.assert_allclose(model.kernel[...], params["kernel"], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    ("build", "name"),
    [
        (lambda: OPT.decay_to_norm(-0.1), "weight_decay"),
        (lambda: OPT.decay_to_norm(float("nan")), "weight_decay"),
        (lambda: OPT.decay_to_norm(0.1, -1.0), "target"),
        (lambda: OPT.decay_to_norm(0.1, "1"), "target"),
        (lambda: OPT.decay_to_norm(0.1, per_unit=1), "per_unit"),
        (lambda: OPT.decay_to_norm(0.1, mask={"v": True}).init({"w": jnp.ones((2, 2))}), "mask"),
    ],
)
def test_bad_arguments_refused_by_name(build, name):
    with pytest.raises((ValueError, TypeError), match=name):
        build()
