"""Diagnostics against float64 NumPy / SciPy oracles and against the theorems they measure."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.flatten_util import ravel_pytree

from jaxnorm import diagnostics as dg


def _np_unit_norm(w):
    w = np.asarray(w, np.float64)
    return np.sqrt(np.sum(w**2, axis=tuple(range(w.ndim - 1))))


def _params(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "conv": jnp.asarray(rng.normal(size=(3, 3, 2, 4))),
        "dense": {"kernel": jnp.asarray(rng.normal(size=(5, 3)) * 3.0), "bias": jnp.ones(3)},
    }


# ----------------------------------------------------------------------------- per-unit norms


def test_unit_norms_and_effective_lr(x64):
    params = _params()
    norms = dg.unit_norms(params)
    assert norms["dense"]["bias"] is None
    np.testing.assert_allclose(norms["conv"], _np_unit_norm(params["conv"]), rtol=1e-14)
    lr = dg.effective_learning_rate(params, 0.1)
    np.testing.assert_allclose(
        lr["dense"]["kernel"], 0.1 / _np_unit_norm(params["dense"]["kernel"]) ** 2, rtol=1e-10
    )
    only_conv = dg.unit_norms(
        params, mask=lambda p: {"conv": True, "dense": {"kernel": False, "bias": False}}
    )
    assert only_conv["dense"]["kernel"] is None
    assert np.isfinite(np.asarray(dg.effective_learning_rate({"w": jnp.zeros((2, 2))}, 0.1)["w"])).all()
    with pytest.raises(ValueError, match="params structure"):
        dg.angular_update(params, {"conv": params["conv"]})
    with pytest.raises(ValueError, match="inputs must be"):
        dg.input_span_projection(params["conv"], jnp.ones((10, 17)))


def test_angular_update_against_arccos_and_tiny_angles(x64):
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(6, 5)), rng.normal(size=(6, 5))
    expected = np.arccos(np.sum(a * b, 0) / (_np_unit_norm(a) * _np_unit_norm(b)))
    got = dg.angular_update({"w": jnp.asarray(a)}, {"w": jnp.asarray(b)})["w"]
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    # a rotation by 1e-9 rad in the plane of two orthonormal vectors: arccos would return 0 or 1e-8
    e1, e2 = np.eye(4)[:, :1], np.eye(4)[:, 1:2]
    theta = 1e-9
    rotated = np.cos(theta) * e1 + np.sin(theta) * e2
    got = dg.angular_update({"w": jnp.asarray(e1 * 3.0)}, {"w": jnp.asarray(rotated * 0.2)})["w"]
    np.testing.assert_allclose(got, [theta], rtol=1e-6)
    got = dg.angular_update({"w": jnp.asarray(e1)}, {"w": jnp.asarray(-e1)})["w"]
    np.testing.assert_allclose(got, [np.pi], rtol=1e-12)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**16), log_c1=st.floats(-3, 3), log_c2=st.floats(-3, 3))
def test_angular_update_is_scale_invariant(seed, log_c1, log_c2):
    rng = np.random.default_rng(seed)
    a, b = rng.normal(size=(4, 3)), rng.normal(size=(4, 3))
    base = dg.angular_update({"w": jnp.asarray(a, jnp.float32)}, {"w": jnp.asarray(b, jnp.float32)})["w"]
    scaled = dg.angular_update(
        {"w": jnp.asarray(a * 10**log_c1, jnp.float32)}, {"w": jnp.asarray(b * 10**log_c2, jnp.float32)}
    )["w"]
    np.testing.assert_allclose(scaled, base, rtol=1e-5, atol=1e-6)


def test_angular_update_of_a_zero_unit_is_zero():
    """A unit that is zero before or after the step has no direction: 0, as documented (was pi/2)."""
    old = {"dense": {"kernel": jnp.zeros((4, 3)).at[0, 2].set(1.0)}}
    new = {"dense": {"kernel": 0.01 * jnp.ones((4, 3)).at[:, 1].set(0.0)}}
    np.testing.assert_array_equal(dg.angular_update(old, new)["dense"]["kernel"][:2], [0.0, 0.0])
    np.testing.assert_array_equal(dg.angular_update(new, old)["dense"]["kernel"][:2], [0.0, 0.0])
    np.testing.assert_allclose(dg.angular_update(old, new)["dense"]["kernel"][2], np.pi / 3, rtol=1e-6)


@pytest.mark.parametrize("scale", [1e-30, 9e37, 3e38])
def test_angular_update_at_extreme_float32_scales(scale):
    """Finite kernels near the float32 range limits (1 / 9e37 is subnormal and flushed to zero)."""
    a = np.eye(2) * scale
    b = np.array([[0.6, 1.0], [0.8, 0.0]]) * scale
    got = dg.angular_update({"k": jnp.asarray(a, jnp.float32)}, {"k": jnp.asarray(b, jnp.float32)})["k"]
    np.testing.assert_allclose(got, [np.arccos(0.6), np.pi / 2], rtol=1e-6)


def test_per_unit_diagnostics_reject_mismatched_leaf_shapes():
    """A second tree whose leaf broadcasts against the params leaf is an error naming the leaf."""
    w = {"layer": {"k": jnp.ones((4, 5))}}
    wrong = {"layer": {"k": jnp.ones((1, 5))}}
    with pytest.raises(
        ValueError, match=r"weight_gradient_inner: grads\['layer'\]\['k'\] has shape \(1, 5\)"
    ):
        dg.weight_gradient_inner(w, wrong)
    with pytest.raises(ValueError, match=r"angular_update: new_params\['layer'\]\['k'\] has shape \(1, 5\)"):
        dg.angular_update(w, wrong)
    with pytest.raises(ValueError, match=r"per_unit: others\[0\]\['layer'\]\['k'\] has shape"):
        dg.per_unit(lambda a, b: a[0] * b[0], w, wrong)
    # unselected leaves are not compared
    mask = {"layer": {"k": False}}
    assert dg.weight_gradient_inner(w, wrong, mask=mask)["layer"]["k"] is None


def test_effective_learning_rate_rejects_bad_arguments():
    params = {"k": jnp.ones((2, 2))}
    with pytest.raises(ValueError, match="learning_rate must be a finite number >= 0"):
        dg.effective_learning_rate(params, -0.1)
    with pytest.raises(ValueError, match="learning_rate must be a finite number >= 0"):
        dg.effective_learning_rate(params, float("nan"))
    with pytest.raises(ValueError, match="epsilon must be a finite number >= 0"):
        dg.effective_learning_rate(params, 0.1, epsilon=-1.0)
    # a traced learning rate (a schedule inside jit) is accepted
    got = jax.jit(lambda lr: dg.effective_learning_rate(params, lr)["k"])(0.1)
    np.testing.assert_allclose(got, [0.05, 0.05], rtol=1e-6)


class _BNNet(nn.Module):
    @nn.compact
    def __call__(self, x):
        for width in (12, 6):
            x = nn.Dense(width, use_bias=False, param_dtype=jnp.float64)(x)
            x = nn.BatchNorm(use_running_average=False, epsilon=1e-14, param_dtype=jnp.float64)(x)
            x = nn.relu(x)
        return nn.Dense(3, param_dtype=jnp.float64)(x)


def _bn_problem(batch=32):
    model = _BNNet()
    x = jax.random.normal(jax.random.key(0), (batch, 8), jnp.float64)
    y = jax.random.randint(jax.random.key(1), (batch,), 0, 3)
    params = model.init(jax.random.key(2), x)["params"]

    def loss(p, x=x):
        logits, _ = model.apply({"params": p}, x, mutable=["batch_stats"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    return params, loss, x


def _kernels_before_bn(params):
    return jax.tree_util.tree_map_with_path(
        lambda path, p: p.ndim >= 2 and path[0].key in ("Dense_0", "Dense_1"), params
    )


def test_theorem_3_1_weight_gradient_orthogonal(x64):
    params, loss, _ = _bn_problem()
    grads = jax.jit(jax.grad(loss))(params)
    inner = dg.weight_gradient_inner(params, grads)
    scale = jax.tree.map(
        lambda w, g: None if w is None else w * g,
        dg.unit_norms(params),
        dg.unit_norms(grads),
        is_leaf=lambda x: x is None,
    )
    for name in ("Dense_0", "Dense_1"):
        assert np.all(np.abs(inner[name]["kernel"]) <= 1e-10 * scale[name]["kernel"])
    # the output layer is not followed by BN: its <w, g> is not zero (the check can fail)
    assert np.max(np.abs(inner["Dense_2"]["kernel"]) / scale["Dense_2"]["kernel"]) > 1e-3


def test_corollary_3_3_norm_growth(x64):
    params, loss, _ = _bn_problem()
    eta = 0.7
    grads = jax.jit(jax.grad(loss))(params)
    new = jax.tree.map(lambda p, g: p - eta * g, params, grads)
    mask = _kernels_before_bn(params)
    predicted = dg.predicted_norm_growth(grads, eta, mask=mask)
    before, after = dg.unit_norms(params, mask=mask), dg.unit_norms(new, mask=mask)
    for name in ("Dense_0", "Dense_1"):
        growth = np.asarray(after[name]["kernel"]) ** 2 - np.asarray(before[name]["kernel"]) ** 2
        assert np.all(growth > 0)
        np.testing.assert_allclose(growth, predicted[name]["kernel"], rtol=1e-8)
    # the effective step: the angle moved is about eta ||g|| / ||w||
    angle = dg.angular_update(params, new, mask=mask)["Dense_0"]["kernel"]
    first_order = eta * _np_unit_norm(grads["Dense_0"]["kernel"]) / _np_unit_norm(params["Dense_0"]["kernel"])
    np.testing.assert_allclose(angle, np.arctan(first_order), rtol=1e-8)


# ----------------------------------------------------------------------------- input span


@pytest.mark.parametrize("strides,padding", [((1, 1), "SAME"), ((2, 2), "VALID")])
def test_conv_patches_match_flax_conv(strides, padding):
    x = jax.random.normal(jax.random.key(0), (2, 7, 6, 3))
    conv = nn.Conv(5, (3, 2), strides=strides, padding=padding, use_bias=False)
    variables = conv.init(jax.random.key(1), x)
    kernel = variables["params"]["kernel"]
    expected = conv.apply(variables, x).reshape(-1, 5)
    got = dg.conv_patches(x, (3, 2), strides=strides, padding=padding) @ kernel.reshape(-1, 5)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_input_span_projection_against_numpy(x64):
    rng = np.random.default_rng(2)
    inputs = rng.normal(size=(200, 6)) @ rng.normal(size=(6, 6))
    kernel = rng.normal(size=(6, 4))
    result = dg.input_span_projection(jnp.asarray(kernel), jnp.asarray(inputs))
    centered = inputs - inputs.mean(0)
    eigenvalues, eigenvectors = np.linalg.eigh(centered.T @ centered / len(inputs))
    np.testing.assert_allclose(result.eigenvalues, eigenvalues[::-1], rtol=1e-10)
    # eigenvectors are defined up to sign: compare |V| and the reconstruction U V = W
    np.testing.assert_allclose(np.abs(result.projected), np.abs(eigenvectors[:, ::-1].T @ kernel), rtol=1e-8)
    np.testing.assert_allclose(result.eigenvectors @ result.projected, kernel, atol=1e-10)
    np.testing.assert_allclose(_np_unit_norm(result.projected), _np_unit_norm(kernel), rtol=1e-12)
    assert int(result.rank) == 6
    np.testing.assert_allclose(result.in_span_fraction, 1.0, rtol=1e-12)


def test_sgd_updates_only_inside_the_input_span(x64):
    """Liu et al., Sec. 4.2: a batch of B rows spans B - 1 directions; the BN layer's gradient lies
    in them, so the weight component outside never changes."""
    batch, fan_in = 6, 16
    x = jax.random.normal(jax.random.key(3), (batch, 8), jnp.float64)
    x = jnp.concatenate([x, x], axis=1)  # 16 input features, rank of the centered batch = 5
    model = _BNNet()
    params = model.init(jax.random.key(4), x)["params"]
    y = jnp.arange(batch) % 3

    def loss(p):
        logits, _ = model.apply({"params": p}, x, mutable=["batch_stats"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    grads = jax.jit(jax.grad(loss))(params)
    kernel, grad = params["Dense_0"]["kernel"], grads["Dense_0"]["kernel"]
    result = dg.input_span_projection(kernel, x)
    assert int(result.rank) == batch - 1
    projected_grad = result.eigenvectors.T @ grad
    outside = np.abs(np.asarray(projected_grad[batch - 1 :]))
    assert outside.max() <= 1e-10 * np.abs(np.asarray(projected_grad)).max()
    assert fan_in == kernel.shape[0]
    # the initial kernel is not in the span: most of its energy lies outside
    assert np.all(np.asarray(result.in_span_fraction) < 0.9)


# ----------------------------------------------------------------------------- GGD fit


@pytest.mark.parametrize("beta", [0.6, 1.0, 2.0, 4.0])
def test_ggd_fit_recovers_known_beta(beta):
    x = scipy.stats.gennorm.rvs(beta, scale=0.03, size=200_000, random_state=np.random.default_rng(5))
    fit = dg.fit_generalized_gaussian(jnp.asarray(x, jnp.float32))
    np.testing.assert_allclose(fit.beta, beta, rtol=0.03)
    np.testing.assert_allclose(fit.scale, 0.03, rtol=0.03)


@pytest.mark.parametrize("beta", [0.8, 2.5])
def test_ggd_fit_is_the_scipy_mle(x64, beta):
    rng = np.random.default_rng(6)
    x = scipy.stats.gennorm.rvs(beta, loc=0.3, scale=2.0, size=5000, random_state=rng)
    fit = dg.fit_generalized_gaussian(jnp.asarray(x), loc=0.3)
    beta_ref, _, scale_ref = scipy.stats.gennorm.fit(x, floc=0.3)
    np.testing.assert_allclose(fit.beta, beta_ref, rtol=1e-4)
    np.testing.assert_allclose(fit.scale, scale_ref, rtol=1e-4)
    np.testing.assert_allclose(fit.loc, 0.3)
    # beta does not depend on the units of x
    np.testing.assert_allclose(
        dg.fit_generalized_gaussian(jnp.asarray((x - 0.3) * 1e4)).beta, fit.beta, rtol=1e-8
    )


def test_ggd_fit_edge_cases():
    fit = dg.fit_generalized_gaussian(jnp.zeros(10))
    assert np.isfinite(fit.beta) and float(fit.scale) == 0.0
    uniform = jnp.linspace(-1.0, 1.0, 10_001)
    assert float(dg.fit_generalized_gaussian(uniform).beta) > 20
    fit = jax.jit(dg.fit_generalized_gaussian)(jnp.asarray([0.0, 1.0, -2.0, 0.5]))
    assert np.isfinite(fit.beta)
    with pytest.raises(ValueError, match="beta_range"):
        dg.fit_generalized_gaussian(uniform, beta_range=(2.0, 1.0))
    with pytest.raises(ValueError, match="at least 2"):
        dg.fit_generalized_gaussian(jnp.ones(1))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(num_iters=0), "num_iters must be a positive int"),
        (dict(num_iters=-3), "num_iters must be a positive int"),
        (dict(num_iters=2.5), "num_iters must be a positive int"),
        (dict(num_iters=True), "num_iters must be a positive int"),
        (dict(beta_range=(0.05, float("inf"))), "beta_range must be finite"),
        (dict(beta_range=(float("nan"), 2.0)), "beta_range must be finite"),
        (dict(beta_range=(0.05,)), r"beta_range must be a pair \(low, high\)"),
        (dict(beta_range=(0.05, 1.0, 2.0)), r"beta_range must be a pair \(low, high\)"),
        (dict(loc=float("nan")), "loc must be None or a finite number"),
        (dict(loc=float("inf")), "loc must be None or a finite number"),
        (dict(loc=np.zeros(3)), "loc must be None or a finite number"),
    ],
)
def test_ggd_fit_rejects_malformed_arguments(kwargs, message):
    x = jnp.asarray(np.random.default_rng(0).laplace(size=100), jnp.float32)
    with pytest.raises(ValueError, match=message):
        dg.fit_generalized_gaussian(x, **kwargs)


@pytest.mark.parametrize("scale", [1e-30, 9e37, 3e38])
def test_ggd_fit_at_extreme_float32_scales(scale):
    """beta does not depend on the units of x, up to the float32 range limit."""
    x = scipy.stats.gennorm.rvs(1.0, size=2000, random_state=np.random.default_rng(1))
    x = (x / np.abs(x).max()).astype(np.float32)
    base = dg.fit_generalized_gaussian(jnp.asarray(x))
    fit = dg.fit_generalized_gaussian(jnp.asarray(x * np.float32(scale)))
    np.testing.assert_allclose(fit.beta, base.beta, rtol=1e-4)
    np.testing.assert_allclose(float(fit.scale) / scale, base.scale, rtol=1e-4)


# ----------------------------------------------------------------------------- Hessian


def _quadratic(eigenvalues, seed=7):
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(10, 10)))
    a = q @ np.diag(eigenvalues) @ q.T
    b = rng.normal(size=10)
    params = {"m": jnp.asarray(rng.normal(size=(3, 2))), "v": jnp.asarray(rng.normal(size=4))}

    a_j, b_j = jnp.asarray(a), jnp.asarray(b)

    def loss(p):
        flat = jnp.concatenate([p["m"].ravel(), p["v"]])
        return 0.5 * flat @ a_j @ flat + b_j @ flat

    return params, loss, a, b


def test_hessian_top_eigenvalue_of_quadratic(x64):
    spectrum = np.array([5.0, 3.0, 2.5, 1.0, 0.5, 0.1, -0.2, -1.0, 0.0, 0.3])
    params, loss, a, _ = _quadratic(spectrum)
    lanczos = dg.hessian_top_eigenvalue(loss, params, key=jax.random.key(0), num_iters=10)
    np.testing.assert_allclose(lanczos.eigenvalue, 5.0, rtol=1e-10)
    vector = np.concatenate([np.ravel(lanczos.eigenvector["m"]), lanczos.eigenvector["v"]])
    np.testing.assert_allclose(a @ vector, 5.0 * vector, atol=1e-8)
    power = jax.jit(
        lambda p: dg.hessian_top_eigenvalue(loss, p, key=jax.random.key(1), num_iters=200, method="power")
    )(params)
    np.testing.assert_allclose(power.eigenvalue, 5.0, rtol=1e-8)
    # Lanczos converges fast: 6 products already give the top eigenvalue to 1e-3
    short = dg.hessian_top_eigenvalue(loss, params, key=jax.random.key(2), num_iters=6)
    assert 5.0 - 5e-3 < float(short.eigenvalue) <= 5.0 + 1e-9


def test_hessian_negative_spectrum_and_breakdown(x64):
    spectrum = -np.arange(1.0, 11.0)
    params, loss, _, _ = _quadratic(spectrum)
    lanczos = dg.hessian_top_eigenvalue(loss, params, key=jax.random.key(0), num_iters=10)
    np.testing.assert_allclose(lanczos.eigenvalue, -1.0, rtol=1e-8)  # largest algebraic
    power = dg.hessian_top_eigenvalue(loss, params, key=jax.random.key(0), num_iters=400, method="power")
    np.testing.assert_allclose(power.eigenvalue, -10.0, rtol=1e-6)  # largest magnitude
    # two distinct eigenvalues: the Krylov space is exhausted after 2 steps, 20 requested
    params, loss, _, _ = _quadratic(np.array([4.0] * 5 + [-3.0] * 5))
    result = dg.hessian_top_eigenvalue(loss, params, key=jax.random.key(3), num_iters=20)
    np.testing.assert_allclose(result.eigenvalue, 4.0, rtol=1e-8)
    assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(result.eigenvector))
    with pytest.raises(ValueError, match="method"):
        dg.hessian_top_eigenvalue(loss, params, key=jax.random.key(0), method="arnoldi")


def test_lanczos_low_rank_least_squares():
    """Least squares with a batch of 5 and 30 params: rank-5 Hessian X^T X / 5, 20 Lanczos steps. The
    Krylov space is exhausted after 5 steps; continuing on rounding noise gave 296 instead of 8.02."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5, 30))
    y = rng.normal(size=5)
    x32, y32 = jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32)

    def loss(p, x, y):
        return 0.5 * jnp.mean((x @ p["w"] - y) ** 2)

    oracle = np.linalg.eigvalsh(x.T @ x / 5)[-1]
    for key in range(3):
        result = dg.hessian_top_eigenvalue(loss, {"w": jnp.zeros(30)}, x32, y32, key=jax.random.key(key))
        np.testing.assert_allclose(result.eigenvalue, oracle, rtol=1e-4)
        vector = np.asarray(result.eigenvector["w"], np.float64)
        np.testing.assert_allclose(x.T @ (x @ vector) / 5, oracle * vector, atol=1e-4 * oracle)


@pytest.mark.parametrize("num_iters", [2, 5, 20, 30])
def test_lanczos_two_distinct_negative_eigenvalues(num_iters):
    """A negative-definite Hessian with spectrum {-5, -3}: the top eigenvalue is -3 for any number of
    steps (was 67.6 at 20 steps and 1140 at 30)."""
    u = np.linalg.qr(np.random.default_rng(3).normal(size=(30, 30)))[0]
    a = jnp.asarray(u @ np.diag([-5.0] * 15 + [-3.0] * 15) @ u.T, jnp.float32)
    result = dg.hessian_top_eigenvalue(
        lambda p: 0.5 * p @ a @ p, jnp.zeros(30), key=jax.random.key(0), num_iters=num_iters
    )
    np.testing.assert_allclose(result.eigenvalue, -3.0, rtol=1e-4)
    jitted = jax.jit(
        lambda p: (
            dg.hessian_top_eigenvalue(
                lambda q: 0.5 * q @ a @ q, p, key=jax.random.key(1), num_iters=num_iters
            ).eigenvalue
        )
    )
    np.testing.assert_allclose(jitted(jnp.zeros(30)), -3.0, rtol=1e-4)


@pytest.mark.parametrize("key", [0, 1, 2])
def test_lanczos_logistic_regression_small_batch(key):
    """Softmax regression on a batch of 2 (Hessian rank <= 4 of 33 params) against the float64 Hessian
    (was 107, 7.1 and 14.3 for keys 0..2 instead of 3.658)."""
    rng = np.random.default_rng(0)
    kernel, x = rng.normal(size=(10, 3)) * 0.1, rng.normal(size=(2, 10))
    labels = jnp.asarray([0, 2])

    def loss(p, x):
        logits = x @ p["kernel"] + p["bias"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    with jax.enable_x64(True):
        p64 = {"kernel": jnp.asarray(kernel, jnp.float64), "bias": jnp.zeros(3, jnp.float64)}
        flat, unravel = ravel_pytree(p64)
        hessian = np.asarray(jax.hessian(lambda f: loss(unravel(f), jnp.asarray(x)))(flat))
    oracle = np.linalg.eigvalsh((hessian + hessian.T) / 2)[-1]
    p32 = {"kernel": jnp.asarray(kernel, jnp.float32), "bias": jnp.zeros(3, jnp.float32)}
    result = dg.hessian_top_eigenvalue(loss, p32, jnp.asarray(x, jnp.float32), key=jax.random.key(key))
    np.testing.assert_allclose(result.eigenvalue, oracle, rtol=1e-4)


@pytest.mark.parametrize("c", [1e-19, 1e20])
@pytest.mark.parametrize("method", ["lanczos", "power"])
def test_hessian_at_extreme_float32_scales(c, method):
    """Norms of Hessian-vector products of size 1e-19 or 1e20 neither underflow nor overflow."""
    a = jnp.asarray(np.diag([c, c / 2, c / 10]), jnp.float32)
    num_iters = 3 if method == "lanczos" else 100
    result = dg.hessian_top_eigenvalue(
        lambda p: 0.5 * p @ a @ p, jnp.zeros(3), key=jax.random.key(1), num_iters=num_iters, method=method
    )
    np.testing.assert_allclose(float(result.eigenvalue) / c, 1.0, rtol=1e-4)


def test_hessian_rejects_bad_arguments():
    def loss(p):
        return jnp.sum(p**2)

    with pytest.raises(ValueError, match="key must be a single PRNG key"):
        dg.hessian_top_eigenvalue(loss, jnp.ones(3), key=None)
    with pytest.raises(ValueError, match="key must be a single PRNG key"):
        dg.hessian_top_eigenvalue(loss, jnp.ones(3), key=jax.random.split(jax.random.key(0)))
    with pytest.raises(ValueError, match="num_iters must be a positive int"):
        dg.hessian_top_eigenvalue(loss, jnp.ones(3), key=jax.random.key(0), num_iters=True)
    with pytest.raises(ValueError, match="num_iters must be a positive int"):
        dg.hessian_top_eigenvalue(loss, jnp.ones(3), key=jax.random.key(0), num_iters=0)
    with pytest.raises(ValueError, match="params must hold at least one array element"):
        dg.hessian_top_eigenvalue(lambda p: 0.0, {}, key=jax.random.key(0))
    # a legacy uint32 key still works
    legacy = dg.hessian_top_eigenvalue(loss, jnp.ones(3), key=jax.random.PRNGKey(0))
    np.testing.assert_allclose(legacy.eigenvalue, 2.0, rtol=1e-5)


# ----------------------------------------------------------------------------- predictiveness


def test_gradient_predictiveness_on_quadratic(x64):
    params, loss, a, b = _quadratic(np.linspace(0.1, 4.0, 10))
    etas = np.array([0.01, 0.1, 0.5])
    result = dg.gradient_predictiveness(loss, params, step_sizes=etas)
    p = np.concatenate([np.ravel(params["m"]), params["v"]])
    g = a @ p + b
    ag = a @ g
    expected_losses = [0.5 * (p - e * g) @ a @ (p - e * g) + b @ (p - e * g) for e in etas]
    np.testing.assert_allclose(result.losses, expected_losses, rtol=1e-10)
    np.testing.assert_allclose(result.gradient_changes, etas * np.linalg.norm(ag), rtol=1e-10)
    np.testing.assert_allclose(
        result.effective_smoothness, np.linalg.norm(ag) / np.linalg.norm(g), rtol=1e-10
    )
    np.testing.assert_allclose(result.gradient_norm, np.linalg.norm(g), rtol=1e-12)
    np.testing.assert_allclose(result.loss_variation, np.ptp(expected_losses), rtol=1e-10)
    with pytest.raises(ValueError, match="positive"):
        dg.gradient_predictiveness(loss, params, step_sizes=[0.1, -0.1])


@pytest.mark.parametrize("bad", [[0.1, float("inf")], [float("nan")], [0.1, 0.0], [], [[0.1]], ["a"]])
def test_gradient_predictiveness_rejects_bad_step_sizes(bad):
    with pytest.raises(ValueError, match="gradient_predictiveness: step_sizes must be"):
        dg.gradient_predictiveness(lambda p: jnp.sum(p**2), jnp.ones(3), step_sizes=bad)


def test_gradient_predictiveness_with_a_tiny_gradient():
    """||g|| = 2e-20: its square underflows float32; the scaled norm does not."""
    result = dg.gradient_predictiveness(lambda p: 0.5 * jnp.sum(p**2), jnp.full(4, 1e-20), step_sizes=[0.1])
    np.testing.assert_allclose(result.gradient_norm, 2e-20, rtol=1e-5)
    np.testing.assert_allclose(result.effective_smoothness, 1.0, rtol=1e-4)
    big = dg.gradient_predictiveness(lambda p: 0.5 * 1e20 * jnp.sum(p**2), jnp.ones(4), step_sizes=[1e-21])
    np.testing.assert_allclose(big.gradient_norm, 2e20, rtol=1e-5)
    np.testing.assert_allclose(big.effective_smoothness, 1e20, rtol=1e-3)


def _equilibrium_angle_by_simulation(optimizer, eta, lam, beta, *, dim=400, seed=0):
    """Mean per-step angle of a scale-invariant unit in float64 NumPy: gradients orthogonal to w, of
    norm 1 / ||w||, in fresh random directions (the random-walk model), run for 10 / (eta lam) steps
    (the transient is a few 1 / (eta lam)); the mean over the last fifth."""
    rng = np.random.default_rng(seed)
    w, m, v = rng.normal(size=dim), np.zeros(dim), np.zeros(dim)
    steps = int(10 / (eta * lam))
    angles = []
    for t in range(steps):
        g = rng.normal(size=dim)
        g -= (g @ w) / (w @ w) * w
        g /= np.linalg.norm(g) * np.linalg.norm(w)
        old = w
        if optimizer == "sgd":  # optax.chain(add_decayed_weights(lam), sgd(eta, momentum=beta))
            m = beta * m + g + lam * w
            w = w - eta * m
        else:  # optax.adamw(eta, b1=beta, b2=0.999, eps=0, weight_decay=lam)
            m = beta * m + (1 - beta) * g
            v = 0.999 * v + 0.001 * g * g
            update = (m / (1 - beta ** (t + 1))) / np.sqrt(v / (1 - 0.999 ** (t + 1)))
            w = w - eta * (update + lam * w)
        cos = old @ w / (np.linalg.norm(old) * np.linalg.norm(w))
        angles.append(np.arccos(min(cos, 1.0)))
    return float(np.mean(angles[-steps // 5 :]))


@pytest.mark.parametrize(
    ("optimizer", "eta", "lam", "beta"),
    [("sgd", 0.1, 0.01, 0.9), ("sgd", 0.2, 0.02, 0.0), ("adamw", 0.01, 0.1, 0.0), ("adamw", 0.01, 0.1, 0.9)],
)
def test_equilibrium_angle_is_the_random_walk_equilibrium(optimizer, eta, lam, beta):
    """Kosson et al.'s sqrt(2 eta lam / (1 + beta)) (SGD) and sqrt(2 eta lam (1 - b1) / (1 + b1))
    (AdamW; sqrt(2 eta lam) at b1 = 0) against a float64 simulation of the optimizers."""
    predicted = dg.equilibrium_angular_update(eta, lam, momentum=beta, optimizer=optimizer)
    expected = np.sqrt(2 * eta * lam * ((1 - beta) if optimizer == "adamw" else 1) / (1 + beta))
    assert predicted == pytest.approx(expected, rel=1e-15)
    measured = _equilibrium_angle_by_simulation(optimizer, eta, lam, beta)
    assert measured == pytest.approx(predicted, rel=0.03)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(learning_rate=-0.1, weight_decay=1e-4), "learning_rate must be a finite number >= 0"),
        (dict(learning_rate=0.1, weight_decay=float("nan")), "weight_decay must be a finite number"),
        (dict(learning_rate=0.1, weight_decay=1e-4, momentum=1.0), r"momentum must be in \[0, 1\)"),
        (dict(learning_rate="0.1", weight_decay=1e-4), "learning_rate must be a finite number"),
        (dict(learning_rate=0.1, weight_decay=1e-4, optimizer="adam"), "optimizer must be one of"),
    ],
)
def test_equilibrium_angle_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        dg.equilibrium_angular_update(**kwargs)


def test_equilibrium_angle_accepts_arrays_and_jit():
    """NumPy / JAX arrays give an array of the broadcast shape, equal to the scalar results; jit-able."""
    lrs = np.array([0.1, 0.2])
    got = dg.equilibrium_angular_update(lrs, 5e-4, momentum=0.9)
    expected = [dg.equilibrium_angular_update(float(lr), 5e-4, momentum=0.9) for lr in lrs]
    assert got.shape == (2,)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    adamw = dg.equilibrium_angular_update(1e-3, jnp.asarray([0.1, 0.01]), momentum=0.9, optimizer="adamw")
    expected = [
        dg.equilibrium_angular_update(1e-3, wd, momentum=0.9, optimizer="adamw") for wd in (0.1, 0.01)
    ]
    np.testing.assert_allclose(adamw, expected, rtol=1e-6)
    jitted = jax.jit(dg.equilibrium_angular_update, static_argnames="optimizer")
    np.testing.assert_allclose(
        jitted(0.1, 5e-4, momentum=0.9), dg.equilibrium_angular_update(0.1, 5e-4, momentum=0.9), rtol=1e-6
    )
    # traced values cannot be checked: out of range gives NaN
    assert np.isnan(jitted(-0.1, 5e-4))
    assert np.isnan(jitted(0.1, 5e-4, momentum=1.0))
    with pytest.raises(ValueError, match="learning_rate must be finite and >= 0"):
        dg.equilibrium_angular_update(np.array([0.1, -0.2]), 5e-4)
    with pytest.raises(ValueError, match=r"momentum must be in \[0, 1\)"):
        dg.equilibrium_angular_update(0.1, 5e-4, momentum=jnp.asarray([0.5, 1.0]))
    with pytest.raises(ValueError, match="weight_decay must be a real number"):
        dg.equilibrium_angular_update(0.1, np.array([True]))


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_generalized_gaussian_fit_of_a_sample_with_nan_or_inf_is_nan(bad):
    """A diverged kernel has no fit: NaN ``beta`` and ``scale``. A NaN made ``max |x|`` NaN, the all-zero
    branch ran, and the fit read ``beta = 0.05, scale = 0`` ("maximally sparse"), like an all-zero kernel."""
    x = np.random.default_rng(0).laplace(size=1000).astype(np.float32)
    x[17] = bad
    fit = dg.fit_generalized_gaussian(jnp.asarray(x))
    assert np.isnan(float(fit.beta)) and np.isnan(float(fit.scale))
    zeros = dg.fit_generalized_gaussian(jnp.zeros(10))
    assert float(zeros.beta) == np.float32(0.05) and float(zeros.scale) == 0.0


@pytest.mark.parametrize(("kwargs", "error"), [
    (dict(beta_range="12"), ValueError), (dict(beta_range=(True, 2)), ValueError),
    (dict(x=jnp.ones(4, jnp.complex64)), TypeError),
])
def test_generalized_gaussian_fit_malformed_arguments(kwargs, error):
    """``beta_range="12"`` and ``(True, 2)`` were read as (1, 2); complex ``x`` failed inside ``ldexp``."""
    kwargs = {"x": jnp.arange(4.0), **kwargs}
    with pytest.raises(error, match=r"beta_range|x must hold real numbers"):
        dg.fit_generalized_gaussian(kwargs.pop("x"), **kwargs)
