"""Tests of weight rescaling (WRS) against a float64 NumPy re-implementation of Liu et al., Sec. 5."""

from __future__ import annotations

import textwrap

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from multidevice import run_on_devices

from jaxnorm.optim import last_scales
from jaxnorm.optim.masks import scale_invariant_mask
from jaxnorm.optim.rescaling import unit_multiplier, weight_rescaling
from jaxnorm.optim.state import rescale_state

LR, MOMENTUM, B1, B2, EPS = 0.3, 0.9, 0.9, 0.999, 1e-8


def _np_unit_norm(w):
    return np.sqrt(np.sum(w**2, axis=tuple(range(w.ndim - 1))))


class NumpyOptimizer:
    """Float64 oracle: SGD / momentum / Adam written from their definitions, plus WRS."""

    def __init__(self, kind, params, tau, mask, rescale_state):
        self.kind, self.tau, self.mask, self.rescale_state = kind, tau, mask, rescale_state
        self.trace = {k: np.zeros_like(v) for k, v in params.items()}
        self.mu = {k: np.zeros_like(v) for k, v in params.items()}
        self.nu = {k: np.zeros_like(v) for k, v in params.items()}
        self.k = 0

    def step(self, params, grads):
        self.k += 1
        new = {}
        for name, w in params.items():
            g = grads[name]
            if self.kind == "sgd":
                u = -LR * g
            elif self.kind == "momentum":
                self.trace[name] = g + MOMENTUM * self.trace[name]
                u = -LR * self.trace[name]
            else:
                self.mu[name] = B1 * self.mu[name] + (1 - B1) * g
                self.nu[name] = B2 * self.nu[name] + (1 - B2) * g**2
                mu_hat = self.mu[name] / (1 - B1**self.k)
                nu_hat = self.nu[name] / (1 - B2**self.k)
                u = -LR * mu_hat / (np.sqrt(nu_hat) + EPS)
            w_new = w + u
            if self.mask[name] and self.k % self.tau == 0:
                s = _np_unit_norm(w_new)
                w_new = w_new / s
                if self.rescale_state:  # w' = w / s: first moments * s, second * s**2
                    self.trace[name] = self.trace[name] * s
                    self.mu[name] = self.mu[name] * s
                    self.nu[name] = self.nu[name] * s**2
            new[name] = w_new
        return new


def _optax(kind):
    if kind == "sgd":
        return optax.sgd(LR)
    if kind == "momentum":
        return optax.sgd(LR, momentum=MOMENTUM)
    return optax.adam(LR, b1=B1, b2=B2, eps=EPS)


def _problem(seed=0):
    rng = np.random.default_rng(seed)
    params = {
        "conv": rng.normal(size=(3, 3, 2, 4)) * 0.5,
        "dense": rng.normal(size=(5, 3)) * 2.0,
        "bias": rng.normal(size=(3,)),
    }
    targets = {k: rng.normal(size=v.shape) for k, v in params.items()}
    noise = [{k: rng.normal(size=v.shape) for k, v in params.items()} for _ in range(40)]
    return params, targets, noise


def _grads(params, targets, noise_t):
    """Gradient of 0.5 ||w - target||^2 + <noise_t, w>: depends on the params, so state matters."""
    return {k: params[k] - targets[k] + noise_t[k] for k in params}


@pytest.mark.parametrize("kind", ["sgd", "momentum", "adam"])
@pytest.mark.parametrize("mode", ["chain", "inner", "inner_rescale_state"])
@pytest.mark.parametrize("tau", [1, 3])
def test_matches_numpy_oracle(x64, kind, mode, tau):
    params_np, targets, noise = _problem()
    mask = {"conv": True, "dense": True, "bias": False}
    steps = 4 * tau + 1  # several multiples of tau and a step past the last one
    if mode == "chain":
        tx = optax.chain(_optax(kind), weight_rescaling(tau))
    else:
        tx = weight_rescaling(tau, inner=_optax(kind), rescale_state=mode == "inner_rescale_state")
    oracle = NumpyOptimizer(kind, params_np, tau, mask, mode == "inner_rescale_state")

    params = jax.tree.map(jnp.asarray, params_np)
    state = tx.init(params)
    targets_j = jax.tree.map(jnp.asarray, targets)

    @jax.jit
    def step(params, state, noise_t):
        grads = jax.tree.map(lambda p, t, n: p - t + n, params, targets_j, noise_t)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    for t in range(steps):
        params, state = step(params, state, jax.tree.map(jnp.asarray, noise[t]))
        params_np = oracle.step(params_np, _grads(params_np, targets, noise[t]))
        for name in params_np:
            np.testing.assert_allclose(params[name], params_np[name], rtol=1e-10, atol=1e-12)
        if (t + 1) % tau == 0:
            np.testing.assert_allclose(_np_unit_norm(np.asarray(params["conv"])), 1.0, rtol=1e-12)
            np.testing.assert_allclose(_np_unit_norm(np.asarray(params["dense"])), 1.0, rtol=1e-12)


def test_rescale_state_changes_the_trajectory(x64):
    """The two state modes are really different for momentum (guards the oracle comparison)."""
    params_np, targets, noise = _problem(1)
    finals = []
    for rescale in (False, True):
        tx = weight_rescaling(2, inner=_optax("momentum"), rescale_state=rescale)
        params = jax.tree.map(jnp.asarray, params_np)
        state = tx.init(params)
        for t in range(5):
            grads = jax.tree.map(jnp.asarray, _grads(jax.tree.map(np.asarray, params), targets, noise[t]))
            updates, state = tx.update(grads, state, params)
            params = optax.apply_updates(params, updates)
        finals.append(np.asarray(params["dense"]))
    assert np.max(np.abs(finals[0] - finals[1])) > 1e-3


def test_chain_leaves_earlier_state_untouched():
    params = {"w": jnp.full((2, 3), 3.0)}
    grads = {"w": jnp.ones((2, 3))}
    plain = optax.sgd(0.1, momentum=0.9)
    tx = optax.chain(plain, weight_rescaling(1))
    state = tx.init(params)
    _, state = tx.update(grads, state, params)
    _, plain_state = plain.update(grads, plain.init(params), params)
    chex.assert_trees_all_equal(state[0], plain_state)
    assert int(state[1].count) == 1


class _BNNet(nn.Module):
    @nn.compact
    def __call__(self, x):
        for width in (16, 8):
            x = nn.Dense(width, use_bias=False)(x)
            x = nn.BatchNorm(use_running_average=False, epsilon=1e-12)(x)
            x = nn.relu(x)
        return nn.Dense(3)(x)


def test_bn_network_function_unchanged_by_rescaling_step(x64):
    model = _BNNet()
    x = jax.random.normal(jax.random.key(0), (32, 10), jnp.float64)
    variables = model.init(jax.random.key(1), x)
    # far from the unit sphere, in float64
    params = jax.tree.map(lambda p: p.astype(jnp.float64) * 7.0, variables["params"])

    @jax.jit
    def apply(p):
        out, _ = model.apply({**variables, "params": p}, x, mutable=["batch_stats"])
        return out

    scale_invariant = {
        "Dense_0": {"kernel": True},
        "Dense_1": {"kernel": True},
        "Dense_2": {"kernel": False, "bias": False},
        "BatchNorm_0": {"scale": False, "bias": False},
        "BatchNorm_1": {"scale": False, "bias": False},
    }
    traced = scale_invariant_mask(
        lambda v, x: model.apply(v, x, mutable=["batch_stats"])[0], {**variables, "params": params}, x
    )
    assert traced == scale_invariant  # the jaxpr tracer finds the kernels followed by BN
    zeros = jax.tree.map(jnp.zeros_like, params)
    tx = weight_rescaling(1, mask=traced)
    updates, _ = tx.update(zeros, tx.init(params), params)
    rescaled = optax.apply_updates(params, updates)
    np.testing.assert_allclose(_np_unit_norm(np.asarray(rescaled["Dense_0"]["kernel"])), 1.0)
    assert np.max(np.abs(np.asarray(rescaled["Dense_0"]["kernel"] - params["Dense_0"]["kernel"]))) > 1
    np.testing.assert_allclose(apply(rescaled), apply(params), rtol=1e-9, atol=1e-9)

    # The default mask also rescales the output layer, which is not followed by BN: logits change.
    tx_all = weight_rescaling(1)
    updates, _ = tx_all.update(zeros, tx_all.init(params), params)
    assert np.max(np.abs(np.asarray(apply(optax.apply_updates(params, updates)) - apply(params)))) > 1e-2


def test_non_rescaling_steps_use_cond():
    """The norms are computed only inside a lax.cond branch; only (out,) multipliers leave it."""
    params = {"w": jnp.ones((4, 5)), "v": jnp.ones((2, 3, 4, 6))}
    tx = optax.chain(optax.sgd(0.1), weight_rescaling(20))
    jaxpr = jax.make_jaxpr(lambda s, p: tx.update(p, s, p))(tx.init(params), params).jaxpr
    conds = [eqn for eqn in jaxpr.eqns if eqn.primitive.name == "cond"]
    assert len(conds) == 1
    assert sorted(v.aval.shape for v in conds[0].outvars) == [(5,), (6,)]
    top_level = {eqn.primitive.name for eqn in jaxpr.eqns}
    assert not top_level & {"reduce_sum", "sqrt", "rsqrt"}
    branch_ops = {eqn.primitive.name for eqn in conds[0].params["branches"][1].jaxpr.eqns}
    assert "reduce_sum" in branch_ops


def test_inject_hyperparams_and_masked():
    params = {"w": jnp.full((3, 2), 2.0), "b": jnp.ones((2,))}
    grads = jax.tree.map(jnp.ones_like, params)
    tx = optax.inject_hyperparams(weight_rescaling)(tau=2, inner=optax.sgd(0.1))
    state = tx.init(params)
    norms = []
    for _ in range(4):
        updates, state = jax.jit(tx.update)(grads, state, params)
        params = optax.apply_updates(params, updates)
        norms.append(float(jnp.linalg.norm(params["w"][:, 0])))
    np.testing.assert_allclose(norms[1], 1.0, rtol=1e-6)
    np.testing.assert_allclose(norms[3], 1.0, rtol=1e-6)
    assert abs(norms[2] - 1.0) > 1e-3

    masked = optax.masked(weight_rescaling(1), {"w": False, "b": False})
    updates, _ = masked.update(grads, masked.init(params), params)
    np.testing.assert_array_equal(updates["w"], grads["w"])


def test_inject_hyperparams_callable_mask_and_outer_rescaling():
    params = {"w": jnp.full((3, 2), 2.0), "b": jnp.ones((2,))}
    grads = jax.tree.map(jnp.ones_like, params)
    only_w = lambda p: {"w": True, "b": False}
    tx = optax.inject_hyperparams(weight_rescaling, static_args=("mask",))(tau=1, mask=only_w)
    updates, _ = jax.jit(tx.update)(grads, tx.init(params), params)
    np.testing.assert_allclose(jnp.linalg.norm(params["w"] + updates["w"], axis=0), 1.0, rtol=1e-6)
    # an outer rescaling (ENorm's) passes through WRS's state into the wrapped momentum
    tx = weight_rescaling(5, inner=optax.sgd(0.1, momentum=0.9))
    _, state = tx.update(grads, tx.init(params), params)
    rescaled = rescale_state(state, {"w": jnp.array([2.0, 4.0]), "b": None})
    np.testing.assert_allclose(rescaled.inner_state[0].trace["w"], grads["w"] / jnp.array([2.0, 4.0]))
    np.testing.assert_array_equal(rescaled.inner_state[0].trace["b"], grads["b"])


def test_zero_unit_and_low_precision():
    params = {"w": jnp.array([[0.0, 3.0], [0.0, 4.0]], jnp.bfloat16)}
    tx = weight_rescaling(1, inner=optax.sgd(0.1, momentum=0.9), rescale_state=True)
    state = tx.init(params)
    updates, state = tx.update(jax.tree.map(jnp.zeros_like, params), state, params)
    # the update of a bf16 kernel is float32, so that optax.apply_updates lands on r(p + u)
    assert updates["w"].dtype == jnp.float32
    new = optax.apply_updates(params, updates)["w"]
    assert new.dtype == jnp.bfloat16
    new = np.asarray(new, np.float32)
    np.testing.assert_array_equal(new[:, 0], 0.0)
    # within one bf16 ulp of 0.6 / 0.8 (it was 1/64, the ulp of |p| = 3-4, before)
    np.testing.assert_allclose(new[:, 1], [0.6, 0.8], rtol=2.0**-8)
    assert all(np.isfinite(np.asarray(leaf, np.float32)).all() for leaf in jax.tree.leaves(state))
    np.testing.assert_allclose(unit_multiplier(params["w"]), [1.0, 0.2])


@settings(max_examples=25, deadline=None)
@given(
    shape=st.sampled_from([(3, 2), (2, 2, 3, 4), (7, 1)]),
    log_scale=st.floats(-6, 6),
    seed=st.integers(0, 2**16),
)
def test_rescaled_units_are_unit_norm_and_same_direction(shape, log_scale, seed):
    w = np.random.default_rng(seed).normal(size=shape) * 10.0**log_scale
    multiplier = unit_multiplier(jnp.asarray(w, jnp.float32))
    new = jnp.asarray(w, jnp.float32) * multiplier
    np.testing.assert_allclose(_np_unit_norm(np.asarray(new, np.float64)), 1.0, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(new), w * np.asarray(multiplier), rtol=1e-5, atol=1e-30)
    assert np.all(np.asarray(multiplier) > 0)


def test_errors():
    params = {"w": jnp.ones((2, 2)), "b": jnp.ones((2,))}
    for bad in (0, -3, 2.5):
        with pytest.raises(ValueError, match="tau"):
            weight_rescaling(bad)
    for bad in (True, "20", None):
        with pytest.raises(TypeError, match="tau"):
            weight_rescaling(bad)
    with pytest.raises(ValueError, match="rescale_state"):
        weight_rescaling(2, rescale_state=True)
    tx = weight_rescaling(2)
    with pytest.raises(ValueError, match="params"):
        tx.update(params, tx.init(params))
    with pytest.raises(ValueError, match="mask does not match"):
        weight_rescaling(2, mask={"w": True}).update(params, tx.init(params), params)
    with pytest.raises(ValueError, match=r"params\['b'\]"):
        weight_rescaling(2, mask={"w": True, "b": True}).update(params, tx.init(params), params)
    with pytest.raises(TypeError, match="Python bool"):
        weight_rescaling(2, mask={"w": jnp.ones(2, bool), "b": False}).update(params, tx.init(params), params)
    # a string ("False" is truthy: the kernel was rescaled) or a number is not a bool either
    for bad in ("False", 0.5, 1, np.float32(0.0), jnp.asarray(1)):
        with pytest.raises(TypeError, match=r"mask leaf at .*w.* must be a Python bool"):
            weight_rescaling(2, mask={"w": bad, "b": False}).init(params)
    for good in (np.bool_(True), jnp.asarray(True), np.asarray(False)):
        weight_rescaling(2, mask={"w": good, "b": False}).init(params)


_SHARDED_SCRIPT = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np, optax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from jaxnorm.optim.rescaling import weight_rescaling
    assert jax.device_count() == 8
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.normal(size=(6, 16))), "v": jnp.asarray(rng.normal(size=(3, 3, 4, 8)))}
    grads = [jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), p.dtype), params)
             for _ in range(4)]
    tx = weight_rescaling(2, inner=optax.sgd(0.1, momentum=0.9), rescale_state=True)

    def run(params):
        state = tx.init(params)
        step = jax.jit(lambda p, s, g: tx.update(g, s, p))
        for g in grads:
            u, state = step(params, state, g)
            params = optax.apply_updates(params, u)
        return params
    single = run(params)
    mesh = Mesh(np.array(jax.devices()), ("d",))
    sharded = {
        "w": jax.device_put(params["w"], NamedSharding(mesh, P(None, "d"))),
        "v": jax.device_put(params["v"], NamedSharding(mesh, P(None, None, None, "d"))),
    }
    out = run(sharded)
    assert len(out["w"].sharding.device_set) == 8
    for k in params:
        np.testing.assert_allclose(out[k], single[k], rtol=1e-5, atol=1e-6)
    print("OK")
    """
)


def test_sharded_params_match_single_device():
    assert "OK" in run_on_devices(_SHARDED_SCRIPT)


def test_rescaled_adam_state_that_is_inf_stays_saturated_not_nan():
    """Weights ~1e-30 with gradients ~1e30 (both finite): Adam's ``nu`` is inf (optax's own overflow; its
    update is then 0), and WRS with ``rescale_state=True`` divided it by ``m**2``, which overflows float32 for
    ``m ~ 6e29``: inf / inf, NaN state and NaN params from the second step (fails on f7e5cd2)."""
    rng = np.random.default_rng(0)
    params = {"k": jnp.asarray(rng.normal(size=(3, 4)) * 1e-30, jnp.float32)}
    tx = weight_rescaling(1, inner=optax.adam(0.1), rescale_state=True)
    state = tx.init(params)
    for _ in range(3):
        grads = {"k": jnp.asarray(rng.normal(size=(3, 4)) * 1e30, jnp.float32)}
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
        assert bool(jnp.all(jnp.isfinite(params["k"])))
        assert not any(bool(jnp.any(jnp.isnan(leaf))) for leaf in jax.tree.leaves(state))
    np.testing.assert_allclose(np.linalg.norm(np.asarray(params["k"]), axis=0), 1.0, rtol=1e-5)


def _wrs_after_sgd():
    return optax.chain(optax.sgd(0.1), weight_rescaling(1))


@pytest.mark.parametrize(
    ("wrap", "skips"),
    [
        (lambda tx: optax.MultiSteps(tx, 2).gradient_transformation(), False),
        (lambda tx: optax.MultiSteps(tx, 2, should_skip_update_fn=optax.skip_not_finite)
         .gradient_transformation(), True),
        (lambda tx: optax.apply_if_finite(tx, 5), True),
    ],
    ids=["multisteps", "multisteps-skip", "apply_if_finite"],
)
def test_last_scales_are_ones_after_a_call_that_applied_nothing(wrap, skips):
    """``last_scales`` of a call that moved no parameter (a micro-step that only accumulated, a skipped
    non-finite step) used to repeat the last update's factors, so BN statistics transported after
    every call were divided again (a helper's composition fuzz). The params are the oracle: where they
    did not move the factors are 1, where they moved ``w_new = (w + u) / s``."""
    params = {"k": jnp.full((3, 2), 2.0)}
    good = {"k": jnp.array([[1.0, 0.0], [0.0, 2.0], [3.0, 1.0]])}
    bad = {"k": jnp.full((3, 2), jnp.nan)}
    tx = wrap(_wrs_after_sgd())
    state, p = tx.init(params), params
    moved = []
    for grads in (good, good, good, bad if skips else good, good, good):
        updates, state = tx.update(grads, state, p)
        new = optax.apply_updates(p, updates)
        s = np.asarray(last_scales(state)["k"])
        if np.array_equal(np.asarray(new["k"]), np.asarray(p["k"])):
            np.testing.assert_array_equal(s, 1.0)
        else:
            moved.append(True)
            assert np.all(s != 1.0)
            np.testing.assert_allclose(np.linalg.norm(np.asarray(new["k"]), axis=0), 1.0, rtol=1e-6)
        p = new
    assert moved, "the test needs updates that move the params"
