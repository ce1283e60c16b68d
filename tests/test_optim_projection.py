"""Tests of bwn_projection and norm_schedule: NumPy oracle, fixed norms, the LR / norm equivalence."""

from __future__ import annotations

import textwrap

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from multidevice import run_on_devices

from jaxnorm.optim.projection import bwn_projection, norm_schedule, norm_schedule_from_lr


def _np_unit_norm(w):
    w = np.asarray(w, np.float64)
    return np.sqrt(np.sum(w**2, axis=tuple(range(w.ndim - 1))))


def _params(seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return {
        "conv": (rng.normal(size=(3, 3, 2, 4)) * 0.3).astype(dtype),
        "dense": (rng.normal(size=(5, 3)) * 2.0).astype(dtype),
        "bias": rng.normal(size=(3,)).astype(dtype),
    }


def test_bwn_matches_numpy_oracle(x64):
    params_np = _params()
    rng = np.random.default_rng(1)
    lr, momentum = 0.2, 0.9
    init_norms = {k: _np_unit_norm(v) for k, v in params_np.items() if v.ndim >= 2}
    trace = {k: np.zeros_like(v) for k, v in params_np.items()}
    tx = optax.chain(optax.sgd(lr, momentum=momentum), bwn_projection())
    params = jax.tree.map(jnp.asarray, params_np)
    state = tx.init(params)
    step = jax.jit(lambda p, s, g: tx.update(g, s, p))
    for _ in range(5):
        grads = {k: rng.normal(size=v.shape) for k, v in params_np.items()}
        updates, state = step(params, state, jax.tree.map(jnp.asarray, grads))
        params = optax.apply_updates(params, updates)
        for k, w in params_np.items():
            trace[k] = grads[k] + momentum * trace[k]
            w = w - lr * trace[k]
            if w.ndim >= 2:
                w = w * init_norms[k] / _np_unit_norm(w)
            params_np[k] = w
        for k in params_np:
            np.testing.assert_allclose(params[k], params_np[k], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("rho", [None, "layer", 0.5, "tree"])
def test_bwn_norms_stay_fixed(rho):
    params = jax.tree.map(jnp.asarray, _params(2, np.float32))
    init = {k: _np_unit_norm(v) for k, v in params.items() if v.ndim >= 2}
    if rho == "tree":
        rho = {"conv": jnp.arange(1.0, 5.0), "dense": 3.0, "bias": None}
        expected = {"conv": np.arange(1.0, 5.0), "dense": np.full(3, 3.0)}
    elif rho == "layer":
        expected = {k: np.full_like(v, v.mean()) for k, v in init.items()}
    elif rho is None:
        expected = init
    else:
        expected = {k: np.full_like(v, rho) for k, v in init.items()}
    tx = optax.chain(optax.adam(0.3), bwn_projection(rho=rho))
    state = tx.init(params)
    step = jax.jit(lambda p, s, g: tx.update(g, s, p))
    key = jax.random.key(0)
    for t in range(20):
        step_key = jax.random.fold_in(key, t)
        grads = jax.tree.map(lambda p, k=step_key: jax.random.normal(k, p.shape), params)
        updates, state = step(params, state, grads)
        params = optax.apply_updates(params, updates)
        for k, norms in expected.items():
            np.testing.assert_allclose(_np_unit_norm(params[k]), norms, rtol=2e-6)
    # the directions did move (the projection is not a freeze)
    assert np.max(np.abs(np.asarray(params["dense"]) - _params(2)["dense"])) > 0.1


def test_norm_schedule_follows_schedule(x64):
    params = jax.tree.map(jnp.asarray, _params(3))
    schedule = optax.linear_schedule(1.0, 3.0, transition_steps=4)
    tx = optax.chain(optax.sgd(0.1), norm_schedule(schedule))
    state = tx.init(params)
    for t in range(6):
        grads = jax.tree.map(jnp.ones_like, params)
        updates, state = jax.jit(tx.update)(grads, state, params)
        params = optax.apply_updates(params, updates)
        for k in ("conv", "dense"):
            np.testing.assert_allclose(_np_unit_norm(params[k]), float(schedule(t)), rtol=1e-12)
    np.testing.assert_allclose(params["bias"], _params(3)["bias"] - 0.6)


class _ScaleInvariantNet(nn.Module):
    """Every kernel is followed by a batch norm without scale / bias: each unit is scale-invariant."""

    @nn.compact
    def __call__(self, x):
        for i, width in enumerate((16, 8, 3)):
            x = nn.Dense(width, use_bias=False, param_dtype=jnp.float64)(x)
            x = nn.BatchNorm(use_running_average=False, use_scale=False, use_bias=False, epsilon=1e-14)(x)
            if i < 2:
                x = nn.relu(x)
        return x


def _train(tx, params, model, x, y, steps):
    def loss(p):
        logits, _ = model.apply({"params": p}, x, mutable=["batch_stats"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    @jax.jit
    def step(p, s):
        updates, s = tx.update(jax.grad(loss)(p), s, p)
        return optax.apply_updates(p, updates), s

    def outputs(p):
        return np.asarray(model.apply({"params": p}, x, mutable=["batch_stats"])[0])

    state, trajectory = tx.init(params), []
    for _ in range(steps):
        params, state = step(params, state)
        trajectory.append(outputs(params))
    return params, np.stack(trajectory)


def _invariant_problem():
    model = _ScaleInvariantNet()
    x = jax.random.normal(jax.random.key(0), (64, 10), jnp.float64)
    y = jax.random.randint(jax.random.key(1), (64,), 0, 3)
    params = model.init(jax.random.key(2), x)["params"]
    return model, x, y, params


def _project(params, rho):
    return jax.tree.map(lambda w: w * rho / _np_unit_norm(w), params)


def test_lr_over_10_equals_norm_times_sqrt10(x64):
    """Norm matters, Sec. 2: (eta, rho * sqrt(10)) and (eta / 10, rho) give the same function."""
    model, x, y, params = _invariant_problem()
    eta, rho, c = 2.0, 1.0, np.sqrt(10.0)
    tx_big_norm = optax.chain(optax.sgd(eta, momentum=0.9), norm_schedule(rho * c))
    tx_small_lr = optax.chain(optax.sgd(eta / 10, momentum=0.9), norm_schedule(rho))
    p_a, out_a = _train(tx_big_norm, _project(params, rho * c), model, x, y, 12)
    p_b, out_b = _train(tx_small_lr, _project(params, rho), model, x, y, 12)
    np.testing.assert_allclose(out_a, out_b, rtol=1e-8, atol=1e-8)
    for k in p_a:
        np.testing.assert_allclose(p_a[k]["kernel"], c * p_b[k]["kernel"], rtol=1e-8, atol=1e-10)
    # control: the same learning rate at the smaller norm is a different trajectory
    _, out_c = _train(
        optax.chain(optax.sgd(eta, momentum=0.9), norm_schedule(rho)), _project(params, rho), model, x, y, 12
    )
    assert np.max(np.abs(out_c - out_b)) > 1e-2
    assert np.max(np.abs(out_b[-1] - out_b[0])) > 1e-2  # training moved


def test_norm_schedule_replaces_lr_decay(x64):
    """Constant LR with the norm raised by sqrt(10) at step 4 == LR divided by 10 at step 4."""
    model, x, y, params = _invariant_problem()
    eta, rho, decay_at = 1.0, 1.0, 4
    norms = optax.piecewise_constant_schedule(rho, {decay_at - 1: np.sqrt(10.0)})
    lrs = optax.piecewise_constant_schedule(eta, {decay_at: 0.1})
    _, out_a = _train(
        optax.chain(optax.sgd(eta), norm_schedule(norms)), _project(params, rho), model, x, y, 9
    )
    _, out_b = _train(optax.chain(optax.sgd(lrs), norm_schedule(rho)), _project(params, rho), model, x, y, 9)
    np.testing.assert_allclose(out_a, out_b, rtol=1e-8, atol=1e-8)
    _, out_c = _train(optax.chain(optax.sgd(eta), norm_schedule(rho)), _project(params, rho), model, x, y, 9)
    assert np.max(np.abs(out_c - out_b)) > 1e-3


def test_norm_schedule_from_lr_follows_the_lr_schedule_run(x64):
    """SGD: lr(t) at unit norm == constant lr_0 at norm sqrt(lr_0 / lr(t)), outputs equal at every step."""
    model, x, y, params = _invariant_problem()
    lrs = optax.cosine_decay_schedule(1.0, 9, alpha=0.05)
    _, out_a = _train(
        optax.chain(optax.sgd(lrs), norm_schedule_from_lr(lrs)), _project(params, 1.0), model, x, y, 9
    )
    _, out_b = _train(optax.chain(optax.sgd(lrs), norm_schedule(1.0)), _project(params, 1.0), model, x, y, 9)
    np.testing.assert_allclose(out_a, out_b, rtol=1e-8, atol=1e-8)
    # control: the constant rate at norm 1 is another trajectory
    _, out_c = _train(optax.chain(optax.sgd(1.0), norm_schedule(1.0)), _project(params, 1.0), model, x, y, 9)
    assert np.max(np.abs(out_c - out_b)) > 1e-3


def test_norm_schedule_from_lr_with_a_warmup_follows_the_lr_schedule_run(x64):
    """The peak rate as the base under a warmup that starts above 0: update 0, at the initial norms, is
    the schedule's step (it was base / lr(0) = 10 times it, and the run stayed 1e-4 off after)."""
    model, x, y, params = _invariant_problem()
    lrs = optax.warmup_cosine_decay_schedule(0.1, 1.0, 3, 9)
    tx = optax.chain(optax.sgd(lrs), norm_schedule_from_lr(lrs, base_learning_rate=1.0))
    _, out_a = _train(tx, _project(params, 1.0), model, x, y, 9)
    _, out_b = _train(optax.chain(optax.sgd(lrs), norm_schedule(1.0)), _project(params, 1.0), model, x, y, 9)
    # (optax evaluates the warmup's rates in float32: 5e-8 apart; 1e-4 before the fix)
    np.testing.assert_allclose(out_a, out_b, rtol=1e-6, atol=1e-6)


def test_norm_schedule_from_lr_matches_numpy_oracle(x64):
    """One update against float64 NumPy: selected leaves u * lr_0 / lr(t), then norm sqrt(lr_0 / lr(t+1))."""
    params = _params(5)
    grads = jax.tree.map(lambda w: np.random.default_rng(6).normal(size=w.shape), params)

    def lrs(count):  # float64 (optax's schedules evaluate an int32 count in float32)
        return 0.4 - 0.03 * count

    mask = {"conv": True, "dense": True, "bias": False}
    tx = optax.chain(optax.sgd(lrs), norm_schedule_from_lr(lrs, mask=mask))
    state = tx.init(params)
    for t in range(3):
        updates, state = tx.update(grads, state, params)
        eta, eta_next = 0.4 - 0.03 * t, 0.4 - 0.03 * (t + 1)
        for k in ("conv", "dense"):
            stepped = params[k] - 0.4 * grads[k]  # the constant base rate
            expected = stepped / _np_unit_norm(stepped) * np.sqrt(0.4 / eta_next)
            np.testing.assert_allclose(params[k] + np.asarray(updates[k]), expected, rtol=1e-12)
        np.testing.assert_allclose(np.asarray(updates["bias"]), -eta * grads["bias"], rtol=1e-12)
        params = optax.apply_updates(params, updates)


def test_norm_schedule_from_lr_zero_rate_and_errors():
    warmup = optax.linear_schedule(0.0, 0.5, 4)
    params = {"w": jnp.full((3, 2), 2.0)}
    tx = optax.chain(optax.sgd(warmup), norm_schedule_from_lr(warmup, base_learning_rate=0.5))
    updates, _ = tx.update({"w": jnp.ones((3, 2))}, tx.init(params), params)
    moved = params["w"] + updates["w"]  # lr(0) = 0: no step, the norm set to sqrt(0.5 / lr(1)) = 2
    np.testing.assert_allclose(moved / _np_unit_norm(moved), params["w"] / _np_unit_norm(params["w"]))
    np.testing.assert_allclose(_np_unit_norm(moved), 2.0, rtol=1e-6)
    with pytest.raises(ValueError, match=r"learning_rate\(0\) must be (a positive number|a number in)"):
        norm_schedule_from_lr(warmup)
    with pytest.raises(ValueError, match=r"base_learning_rate must be (a positive number|a number in)"):
        norm_schedule_from_lr(warmup, base_learning_rate=-1.0)
    with pytest.raises(TypeError, match="learning_rate must be a schedule"):
        norm_schedule_from_lr(0.1)


def test_inject_hyperparams_and_masked():
    params = jax.tree.map(jnp.asarray, _params(4, np.float32))
    grads = jax.tree.map(jnp.ones_like, params)
    tx = optax.inject_hyperparams(norm_schedule)(schedule=lambda count: 2.0 + count)
    state = tx.init(params)
    for t in range(3):
        updates, state = jax.jit(tx.update)(grads, state, params)
        params = optax.apply_updates(params, updates)
        np.testing.assert_allclose(_np_unit_norm(params["dense"]), 2.0 + t, rtol=1e-6)
    tx = optax.inject_hyperparams(bwn_projection)(rho=0.5)
    state = tx.init(params)
    updates, state = jax.jit(tx.update)(grads, state, params)
    np.testing.assert_allclose(_np_unit_norm(optax.apply_updates(params, updates)["conv"]), 0.5, rtol=1e-6)
    masked = optax.masked(bwn_projection(rho=3.0), {"conv": True, "dense": False, "bias": False})
    updates, _ = masked.update(grads, masked.init(params), params)
    np.testing.assert_array_equal(updates["dense"], grads["dense"])
    np.testing.assert_allclose(_np_unit_norm(optax.apply_updates(params, updates)["conv"]), 3.0, rtol=1e-6)


@settings(max_examples=25, deadline=None)
@given(
    shape=st.sampled_from([(3, 2), (2, 2, 3, 4), (7, 1)]),
    log_scale=st.floats(-4, 4),
    log_rho=st.floats(-2, 2),
    seed=st.integers(0, 2**16),
)
def test_projection_keeps_direction_and_sets_norm(shape, log_scale, log_rho, seed):
    rng = np.random.default_rng(seed)
    p = jnp.asarray(rng.normal(size=shape) * 10.0**log_scale, jnp.float32)
    u = jnp.asarray(rng.normal(size=shape) * 10.0**log_scale, jnp.float32)
    tx = norm_schedule(10.0**log_rho)
    updates, _ = tx.update({"w": u}, tx.init({"w": p}), {"w": p})
    new = np.asarray(p + updates["w"], np.float64)
    # P(p + u) - p added back to p: exact up to the float32 rounding of p (optax's projection form)
    tolerance = 1e-5 * 10.0**log_rho + 4e-7 * _np_unit_norm(p)
    assert np.all(np.abs(_np_unit_norm(new) - 10.0**log_rho) <= tolerance)
    target = np.asarray(p + u, np.float64)
    cosine = np.sum(new * target, axis=tuple(range(len(shape) - 1))) / (
        _np_unit_norm(new) * _np_unit_norm(target)
    )
    np.testing.assert_allclose(cosine, 1.0, rtol=1e-5)


def test_zero_unit_stays_finite():
    params = {"w": jnp.zeros((3, 2))}
    tx = norm_schedule(1.0)
    updates, _ = tx.update(params, tx.init(params), params)
    np.testing.assert_array_equal(updates["w"], 0.0)


def test_errors():
    params = jax.tree.map(jnp.asarray, _params(5, np.float32))
    for bad in (0.0, -1.0, {"conv": -1.0}):
        with pytest.raises(ValueError, match="rho must be positive"):
            bwn_projection(rho=bad)
    with pytest.raises(ValueError, match="'layer'"):
        bwn_projection(rho="mean")
    with pytest.raises(ValueError, match="schedule values must be positive"):
        norm_schedule(0.0)
    for tx in (bwn_projection(), norm_schedule(1.0)):
        with pytest.raises(ValueError, match="params"):
            tx.update(params, tx.init(params))
    with pytest.raises(ValueError, match="mask does not match"):
        bwn_projection(mask={"conv": True}).init(params)
    with pytest.raises(ValueError, match="target norms"):
        norm_schedule({"conv": 1.0}).update(params, norm_schedule(1.0).init(params), params)
    with pytest.raises(ValueError, match="got None"):
        bwn_projection(rho={"conv": 1.0, "dense": None, "bias": None}).init(params)
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        tx = bwn_projection(rho={"conv": jnp.ones(3), "dense": 1.0, "bias": None})
        tx.init(params)


_SHARDED_SCRIPT = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np, optax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from jaxnorm.optim.projection import bwn_projection, norm_schedule, norm_schedule_from_lr
    assert jax.device_count() == 8
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.normal(size=(6, 16)), jnp.float32)}
    grads = [{"w": jnp.asarray(rng.normal(size=(6, 16)), jnp.float32)} for _ in range(3)]
    mesh = Mesh(np.array(jax.devices()), ("d",))
    for proj in (bwn_projection(), bwn_projection(rho="layer"), norm_schedule(lambda t: 1.0 + t)):
        tx = optax.chain(optax.adam(0.1), proj)
        def run(p):
            s = tx.init(p)
            step = jax.jit(lambda p, s, g: tx.update(g, s, p))
            for g in grads:
                u, s = step(p, s, g)
                p = optax.apply_updates(p, u)
            return p
        single = run(params)
        out = run({"w": jax.device_put(params["w"], NamedSharding(mesh, P(None, "d")))})
        assert len(out["w"].sharding.device_set) == 8
        np.testing.assert_allclose(out["w"], single["w"], rtol=1e-5, atol=1e-6)
    print("OK")
    """
)


def test_sharded_params_match_single_device():
    assert "OK" in run_on_devices(_SHARDED_SCRIPT)
