"""Edge cases of :mod:`jaxnorm.diagnostics` found by fuzzing, each against a float64 NumPy oracle."""

from __future__ import annotations

import decimal

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize
import scipy.special
from flax import nnx

from jaxnorm import diagnostics as dg


def _np_sum_units(x):
    return np.sum(x, axis=tuple(range(x.ndim - 1)))


# ----------------------------------------------------------------------------- norms


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_weight_gradient_inner_in_half_precision_is_computed_in_float32(dtype):
    w = jnp.array([[300.0], [300.0]], dtype)
    g = jnp.array([[300.0], [-300.0]], dtype)
    out = dg.weight_gradient_inner({"k": w}, {"k": g})["k"]
    assert out.dtype == jnp.float32
    np.testing.assert_array_equal(out, [0.0])  # 300 * 300 = 90000 overflows float16
    np.testing.assert_array_equal(dg.weight_gradient_inner({"k": w}, {"k": w})["k"], [180000.0])
    rng = np.random.default_rng(0)
    wb = jnp.asarray(rng.normal(size=(256, 3)), dtype)
    gb = jnp.asarray(rng.normal(size=(256, 3)), dtype)
    oracle = _np_sum_units(np.asarray(wb, np.float64) * np.asarray(gb, np.float64))
    np.testing.assert_allclose(dg.weight_gradient_inner({"k": wb}, {"k": gb})["k"], oracle, rtol=1e-5)


class _Net(nnx.Module):
    def __init__(self, rngs):
        self.conv = nnx.Conv(2, 3, (3, 3), rngs=rngs)
        self.dense = nnx.Linear(12, 4, rngs=rngs)

    def __call__(self, x):
        return self.dense(self.conv(x).reshape(x.shape[0], -1)[:, :12])


def _nnx_net_params_and_grads():
    model = _Net(nnx.Rngs(0))
    x = jnp.asarray(np.random.default_rng(1).normal(size=(2, 4, 4, 2)), jnp.float32)
    grads = nnx.grad(lambda m: jnp.sum(m(x) ** 2))(model)
    return nnx.state(model, nnx.Param), grads


def _assert_same_tree(got_state, expected_dict):
    got = nnx.to_pure_dict(got_state) if isinstance(got_state, nnx.State) else got_state
    assert jax.tree.structure(got, is_leaf=lambda v: v is None) == jax.tree.structure(
        expected_dict, is_leaf=lambda v: v is None
    )
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected_dict), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_norm_diagnostics_accept_an_nnx_state_like_its_pure_dict():
    state, grads = _nnx_net_params_and_grads()
    params, g = nnx.to_pure_dict(state), nnx.to_pure_dict(grads)
    kernels = {"conv": params["conv"]["kernel"], "dense": params["dense"]["kernel"]}
    gk = {"conv": g["conv"]["kernel"], "dense": g["dense"]["kernel"]}

    def np_norm(w):
        return np.sqrt(_np_sum_units(np.asarray(w, np.float64) ** 2))

    norms = dg.unit_norms(state)
    assert isinstance(norms, nnx.State)
    _assert_same_tree(norms, dg.unit_norms(params))
    for name, w in kernels.items():
        np.testing.assert_allclose(norms[name]["kernel"], np_norm(w), rtol=1e-6)
        assert norms[name]["bias"] is None
    _assert_same_tree(dg.effective_learning_rate(state, 0.1), dg.effective_learning_rate(params, 0.1))
    inner = dg.weight_gradient_inner(state, grads)
    _assert_same_tree(inner, dg.weight_gradient_inner(params, g))
    for name, w in kernels.items():
        oracle = _np_sum_units(np.asarray(w, np.float64) * np.asarray(gk[name], np.float64))
        np.testing.assert_allclose(inner[name]["kernel"], oracle, rtol=1e-5, atol=1e-6)
    growth = dg.predicted_norm_growth(grads, 0.5)
    _assert_same_tree(growth, dg.predicted_norm_growth(g, 0.5))
    for name, gw in gk.items():
        np.testing.assert_allclose(growth[name]["kernel"], (0.5 * np_norm(gw)) ** 2, rtol=1e-5)
    new_state = jax.tree.map(lambda p, d: p - 0.1 * d, state, grads)
    expected = dg.angular_update(params, nnx.to_pure_dict(new_state))
    _assert_same_tree(dg.angular_update(state, new_state), expected)
    # mixed containers: an nnx.State next to its pure dict, a dict mask for a State
    _assert_same_tree(dg.weight_gradient_inner(state, g), dg.weight_gradient_inner(params, g))
    _assert_same_tree(dg.weight_gradient_inner(params, grads), dg.weight_gradient_inner(params, g))
    mask = jax.tree.map(lambda v: v.ndim == 4, params)
    _assert_same_tree(dg.unit_norms(state, mask=mask), dg.unit_norms(params, mask=mask))
    # the array-leaf state nnx.Optimizer passes around works too
    _assert_same_tree(dg.unit_norms(nnx.as_pure(state)), dg.unit_norms(params))


# ----------------------------------------------------------------------------- GGD fit


def _np_profile_nll(beta, y):
    """float64 mean negative log-likelihood at the MLE scale (Varanasi & Aazhang, Sec. 2)."""
    s = np.mean(y**beta)
    alpha = (beta * s) ** (1.0 / beta)
    log_density = np.log(beta) - np.log(2 * alpha) - scipy.special.gammaln(1 / beta)
    return -(log_density - np.mean((y / alpha) ** beta))


def _np_ggd_beta(x, loc=0.0, low=0.05, high=50.0):
    """The global maximum of the float64 profile likelihood: a 4001-point log grid, then a bounded
    scalar minimisation between the best point's neighbours."""
    y = np.abs(np.asarray(x, np.float64) - loc)
    y = y / y.max()
    grid = np.exp(np.linspace(np.log(low), np.log(high), 4001))
    values = np.array([_np_profile_nll(b, y) for b in grid])
    i = int(np.argmin(values))
    bounds = (np.log(grid[max(i - 1, 0)]), np.log(grid[min(i + 1, grid.size - 1)]))
    res = scipy.optimize.minimize_scalar(lambda lb: _np_profile_nll(np.exp(lb), y), bounds=bounds,
                                         method="bounded", options={"xatol": 1e-10})
    best = float(np.exp(res.x)) if res.fun <= values[i] else float(grid[i])
    return best, y


def _ggd_cases():
    rng = np.random.default_rng(3)
    return {
        "three values": np.array([0.1, -0.5, 2.0]),
        "two values": np.array([1.0, 3.0]),
        "integers -3..3": rng.integers(-3, 4, size=1000).astype(float),
        "4-bit quantised": np.round(rng.normal(size=4096) / 4.0 * 7),
        "outlier": np.r_[rng.normal(size=500), 1e4],
        **{f"normal n=5 #{i}": rng.normal(size=5) for i in range(12)},
    }


@pytest.mark.parametrize("name", list(_ggd_cases()))
def test_ggd_fit_is_the_global_maximum_of_the_profile_likelihood(name):
    """Bisection on the score alone stopped at a stationary point or bracket end that was not the
    maximum ([0.1, -0.5, 2.0] gave beta 0.858 where beta = 50 is more likely; integers gave 50)."""
    x = _ggd_cases()[name]
    beta_ref, y = _np_ggd_beta(x)
    beta = float(dg.fit_generalized_gaussian(jnp.asarray(x, jnp.float32)).beta)
    assert 0.05 <= beta <= 50.0
    # as likely as the float64 optimum, up to float32 rounding of the score
    assert _np_profile_nll(beta, y) <= _np_profile_nll(beta_ref, y) + 1e-5
    np.testing.assert_allclose(beta, beta_ref, rtol=2e-3)


def test_ggd_fit_with_exact_zeros_takes_the_lower_end():
    """Exact zeros make the likelihood unbounded as beta -> 0: with many zeros the fit is beta_range[0]."""
    x = np.where(np.random.default_rng(0).random(2000) < 0.3, 0.0, np.random.default_rng(1).normal(size=2000))
    assert _np_ggd_beta(x)[0] == pytest.approx(0.05)
    np.testing.assert_allclose(dg.fit_generalized_gaussian(jnp.asarray(x, jnp.float32)).beta, 0.05, rtol=1e-6)
    fit = dg.fit_generalized_gaussian(jnp.asarray(x[x != 0], jnp.float32))
    np.testing.assert_allclose(fit.beta, _np_ggd_beta(x[x != 0])[0], rtol=1e-3)


@pytest.mark.parametrize(("x", "loc"), [([3e38, 3e38, 1e38], None), ([3e38, 2e38, 1e38], -3e38),
                                        ([-3e38, 3e38, 1e38, -2e38], 0.0)])
def test_ggd_fit_near_the_float32_limit_does_not_overflow(x, loc):
    """|x - loc| and mean(x) overflowed float32 for finite data and loc."""
    x64 = np.asarray(x, np.float64)
    mu = x64.mean() if loc is None else loc
    beta_ref, y = _np_ggd_beta(x64, loc=mu)
    fit = dg.fit_generalized_gaussian(jnp.asarray(x, jnp.float32), loc=loc)
    np.testing.assert_allclose(fit.loc, mu, rtol=1e-6)
    np.testing.assert_allclose(fit.beta, beta_ref, rtol=2e-3)
    scale_ref = np.abs(x64 - mu).max() * (beta_ref * np.mean(y**beta_ref)) ** (1 / beta_ref)
    if scale_ref < np.finfo(np.float32).max:
        np.testing.assert_allclose(fit.scale, scale_ref, rtol=1e-3)
    else:
        assert float(fit.scale) == np.inf


def test_ggd_fit_accepts_numpy_integer_counts_and_jits():
    x = jnp.asarray(np.random.default_rng(0).laplace(size=500), jnp.float32)
    expected = dg.fit_generalized_gaussian(x, num_iters=30)
    got = dg.fit_generalized_gaussian(x, num_iters=np.int64(30))
    np.testing.assert_array_equal(got.beta, expected.beta)
    jitted = jax.jit(dg.fit_generalized_gaussian, static_argnames="num_iters")(x, num_iters=30)
    np.testing.assert_allclose(jitted.beta, expected.beta, rtol=1e-6)
    np.testing.assert_allclose(expected.beta, _np_ggd_beta(np.asarray(x, np.float64))[0], rtol=1e-4)


# ----------------------------------------------------------------------------- input span


def _np_isp(kernel, inputs, rtol=1e-6):
    """float64 oracle: rank of the input covariance and each unit's share of ||w||^2 in its span."""
    h = np.asarray(inputs, np.float64)
    w = np.asarray(kernel, np.float64).reshape(-1, kernel.shape[-1])
    centered = h - h.mean(0)
    lam, u = np.linalg.eigh(centered.T @ centered / h.shape[0])
    lam, u = lam[::-1], u[:, ::-1]
    rank = int(np.sum(lam > rtol * max(lam[0], 0.0)))
    v = u.T @ w
    return rank, np.sum(v[:rank] ** 2, 0) / np.sum(w**2, 0), lam


def _isp_data(rows=8, fan_in=6):
    rng = np.random.default_rng(0)
    h = rng.normal(size=(rows, fan_in)).astype(np.float32)
    w = rng.normal(size=(fan_in, 3)).astype(np.float32)
    return w, h


@pytest.mark.parametrize("rows", [4, 8])
@pytest.mark.parametrize("h_scale", [1e-20, 1.0, 1e20])
@pytest.mark.parametrize("w_scale", [1e-30, 1.0, 1e25])
def test_input_span_projection_does_not_depend_on_units(rows, h_scale, w_scale):
    """Inputs of 1e20 overflowed the covariance (rank 0, fraction 0), 1e-20 underflowed it."""
    w, h = _isp_data(rows)
    rank_ref, frac_ref, lam_ref = _np_isp(w, h)
    res = dg.input_span_projection(jnp.asarray(w * np.float32(w_scale)), jnp.asarray(h * np.float32(h_scale)))
    assert int(res.rank) == rank_ref
    np.testing.assert_allclose(res.in_span_fraction, frac_ref, rtol=1e-4, atol=1e-5)
    if h_scale == 1.0:
        np.testing.assert_allclose(res.eigenvalues[:rank_ref], lam_ref[:rank_ref], rtol=1e-4)


def test_input_span_projection_of_nan_is_nan():
    w, h = _isp_data()
    nan_kernel = dg.input_span_projection(jnp.full(w.shape, jnp.nan), jnp.asarray(h))
    assert np.all(np.isnan(nan_kernel.in_span_fraction))
    for bad in (np.nan, np.inf):
        h_bad = h.copy()
        h_bad[0, 0] = bad
        res = dg.input_span_projection(jnp.asarray(w), jnp.asarray(h_bad))
        assert np.all(np.isnan(res.in_span_fraction)) and np.all(np.isnan(res.eigenvalues))
    w_bad = w.copy()
    w_bad[2, 1] = np.nan
    frac = np.asarray(dg.input_span_projection(jnp.asarray(w_bad), jnp.asarray(h)).in_span_fraction)
    assert np.isnan(frac[1]) and np.all(np.isfinite(frac[[0, 2]]))
    np.testing.assert_allclose(frac[[0, 2]], _np_isp(w, h)[1][[0, 2]], rtol=1e-5)
    # a zero unit is still 0 in span, and jit works
    frac = jax.jit(dg.input_span_projection)(jnp.zeros((6, 2)), jnp.asarray(h)).in_span_fraction
    np.testing.assert_array_equal(frac, [0.0, 0.0])


@pytest.mark.parametrize(("kernel", "inputs", "kwargs", "message"), [
    (np.ones((6, 2)), np.ones((0, 6)), {}, "inputs must have at least one row"),
    (np.ones((6, 2)), np.ones((5, 6)), dict(rtol=float("nan")), "rtol must be a finite number"),
    (np.ones((6, 2)), np.ones((5, 6)), dict(rtol=-1.0), "rtol must be a finite number"),
    (np.ones((6, 2)), np.ones((5, 6)), dict(rtol="a"), "rtol must be a finite number"),
    (np.ones((6, 2)), np.ones((5, 6)), dict(rtol=True), "rtol must be a finite number"),
    (np.ones((6, 2)).tolist(), np.ones((5, 6)), {}, "kernel must be a NumPy or JAX array"),
    (np.ones((6, 2)), np.ones((5, 6)).tolist(), {}, "inputs must be a NumPy or JAX array"),
    (np.ones((6, 2), complex), np.ones((5, 6)), {}, "kernel must hold real numbers"),
])
def test_input_span_projection_rejects_malformed_arguments(kernel, inputs, kwargs, message):
    with pytest.raises(ValueError, match=message):
        dg.input_span_projection(kernel, inputs, **kwargs)


# ----------------------------------------------------------------------------- equilibrium


def _decimal_equilibrium(eta, lam, beta, optimizer):
    """Oracle in 50-digit decimal arithmetic, which has no float64 exponent range limits."""
    with decimal.localcontext() as ctx:
        ctx.prec = 50
        eta, lam, beta = (decimal.Decimal(float(v)) for v in (eta, lam, beta))
        square = 2 * eta * lam / (1 + beta) * ((1 - beta) if optimizer == "adamw" else 1)
        return float(square.sqrt())


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
@pytest.mark.parametrize(("eta", "lam"), [(1e-200, 1e-200), (1e308, 1e308), (1e-170, 1e300), (0.1, 5e-4)])
def test_equilibrium_angle_does_not_under_or_overflow(optimizer, eta, lam):
    """2 eta lambda was formed before the square root: 0 or inf where the angle is representable."""
    expected = _decimal_equilibrium(eta, lam, 0.5, optimizer)
    got = dg.equilibrium_angular_update(eta, lam, momentum=0.5, optimizer=optimizer)
    assert isinstance(got, float)
    np.testing.assert_allclose(got, expected, rtol=1e-15)


@pytest.mark.parametrize(("eta", "lam"), [(1e-25, 1e-25), (1e25, 1e25), (3e38, 1e-30)])
def test_equilibrium_angle_of_float32_arrays_does_not_under_or_overflow(eta, lam):
    got = dg.equilibrium_angular_update(jnp.float32(eta), jnp.asarray([lam, 0.0], jnp.float32), momentum=0.9)
    expected = _decimal_equilibrium(np.float32(eta), np.float32(lam), np.float32(0.9), "sgd")
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(got, [expected, 0.0], rtol=1e-6)


@pytest.mark.parametrize("name", ["learning_rate", "weight_decay"])
def test_equilibrium_angle_rejects_a_python_int_beyond_the_float_range(name):
    kwargs = {"learning_rate": 0.1, "weight_decay": 1e-4, name: 10**400}
    with pytest.raises(ValueError, match=name):
        dg.equilibrium_angular_update(**kwargs)
    kwargs = {"learning_rate": np.array([0.1]), "weight_decay": 1e-4, name: 10**400}
    with pytest.raises(ValueError, match=name):
        dg.equilibrium_angular_update(**kwargs)


# ----------------------------------------------------------------------------- argument checks


@pytest.mark.parametrize("lr", [-1.0, float("nan"), float("inf"), True, "a", None])
def test_predicted_norm_growth_checks_the_learning_rate(lr):
    """A negative or NaN learning rate gave a (positive / NaN) growth, True was read as 1."""
    with pytest.raises(ValueError, match="predicted_norm_growth: learning_rate"):
        dg.predicted_norm_growth({"k": jnp.ones((2, 2))}, lr)


def test_predicted_norm_growth_against_numpy():
    g = np.random.default_rng(0).normal(size=(3, 3, 2, 4))
    got = dg.predicted_norm_growth({"k": jnp.asarray(g, jnp.float32)}, np.float32(0.3))["k"]
    np.testing.assert_allclose(got, 0.09 * np.sum(g**2, axis=(0, 1, 2)), rtol=1e-5)


@pytest.mark.parametrize("bad", [[0.1 + 1j], np.array([0.1, 0.2], complex), jnp.array([0.1 + 0j])])
def test_gradient_predictiveness_refuses_complex_step_sizes(bad):
    """Complex step sizes were accepted: losses used the real part, the smoothness came back complex."""
    with pytest.raises(ValueError, match="step_sizes"):
        dg.gradient_predictiveness(lambda p: jnp.sum(p**2), jnp.ones(3), step_sizes=bad)


@pytest.mark.parametrize("params", [{}, {"a": jnp.ones(0)}, []])
def test_gradient_predictiveness_refuses_empty_params(params):
    with pytest.raises(ValueError, match="params must hold at least one array element"):
        dg.gradient_predictiveness(lambda p: 0.0, params)


def _np_patches(x, kh, kw, sh, sw):
    """VALID patches in HWIO order by explicit slicing (float64)."""
    x = np.asarray(x, np.float64)
    n, h, w, _ = x.shape
    rows = []
    for b in range(n):
        for i in range(0, h - kh + 1, sh):
            for j in range(0, w - kw + 1, sw):
                rows.append(x[b, i : i + kh, j : j + kw, :].reshape(-1))
    return np.asarray(rows)


def test_conv_patches_takes_an_int_as_a_square_window_and_stride():
    x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 7, 6, 3)), jnp.float32)
    got = dg.conv_patches(x, 3, strides=2, padding="VALID")
    np.testing.assert_allclose(got, _np_patches(x, 3, 3, 2, 2), rtol=1e-6)
    np.testing.assert_array_equal(got, dg.conv_patches(x, (3, 3), strides=(2, 2), padding="VALID"))
    got = dg.conv_patches(x, (2, 3), strides=np.int64(1), padding="VALID")
    np.testing.assert_allclose(got, _np_patches(x, 2, 3, 1, 1), rtol=1e-6)


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(window=(2, 2, 2)), "window must be"), (dict(window=(0, 2)), "window must be"),
    (dict(window=-1), "window must be"), (dict(window=(2.0, 2)), "window must be"),
    (dict(window="33"), "window must be"), (dict(window=True), "window must be"),
    (dict(window=(2, 2), strides=(1,)), "strides must be"),
    (dict(window=(2, 2), strides=0), "strides must be"),
    (dict(window=(2, 2), x=np.ones((1, 4, 4, 1)).tolist()), "x must be a NumPy or JAX array"),
])
def test_conv_patches_rejects_malformed_arguments_by_name(kwargs, message):
    kwargs = {"x": jnp.ones((1, 4, 4, 1)), **kwargs}
    with pytest.raises(ValueError, match=f"conv_patches: {message}"):
        dg.conv_patches(kwargs.pop("x"), kwargs.pop("window"), **kwargs)


def test_hessian_accepts_numpy_integer_counts_and_names_an_integer_leaf():
    a = np.diag([3.0, -1.0, 0.5])

    def loss(p):
        return 0.5 * p["w"] @ jnp.asarray(a, jnp.float32) @ p["w"]

    params = {"w": jnp.ones(3)}
    for method in ("lanczos", "power"):
        eig = dg.hessian_top_eigenvalue(loss, params, key=jax.random.key(0), num_iters=np.int64(50),
                                        method=method)
        np.testing.assert_allclose(eig.eigenvalue, np.linalg.eigvalsh(a)[-1], rtol=1e-5)
    with pytest.raises(ValueError, match=r"params\['n'\] has dtype int32"):
        dg.hessian_top_eigenvalue(loss, {**params, "n": jnp.ones(2, jnp.int32)}, key=jax.random.key(0))
    with pytest.raises(ValueError, match="at least one array element"):
        dg.hessian_top_eigenvalue(loss, {}, key=jax.random.key(0))
    with pytest.raises(ValueError, match="num_iters must be a positive int"):
        dg.hessian_top_eigenvalue(loss, params, key=jax.random.key(0), num_iters=np.bool_(True))


@pytest.mark.parametrize("fn", [dg.effective_learning_rate, dg.predicted_norm_growth])
def test_learning_rate_arrays_broadcast_per_unit_or_are_refused_by_name(fn):
    """An lr array that did not broadcast to the (out,) units failed with a raw TypeError in jnp."""
    w = np.random.default_rng(0).normal(size=(3, 2))
    with pytest.raises(ValueError, match=r"learning_rate of shape \(3,\)"):
        fn({"k": jnp.asarray(w, jnp.float32)}, np.array([1.0, 2.0, 3.0]))
    got = fn({"k": jnp.asarray(w, jnp.float32)}, np.array([1.0, 2.0]))["k"]
    sq = np.sum(w**2, axis=0)
    if fn is dg.effective_learning_rate:
        expected = np.array([1.0, 2.0]) / (sq + 1e-12)
    else:
        expected = np.array([1.0, 4.0]) * sq
    np.testing.assert_allclose(got, expected, rtol=1e-5)


@pytest.mark.parametrize(
    ("offset", "spread", "rows", "fan_in"),
    [(100.0, 0.01, 16, 64), (1000.0, 1.0, 16, 64), (100.0, 1.0, 64, 512)],
)
def test_input_span_projection_of_offset_inputs(offset, spread, rows, fan_in):
    """Inputs with a large mean (post-ReLU features, raw pixels): the float32 rounding error of the
    mean left an extra direction in the covariance (rank ``rows`` instead of ``rows - 1``)."""
    rng = np.random.default_rng(2)
    h = (offset + spread * rng.normal(size=(rows, fan_in))).astype(np.float32)
    w = rng.normal(size=(fan_in, 2)).astype(np.float32)
    h64 = h.astype(np.float64)
    basis = np.linalg.svd(h64 - h64.mean(0), full_matrices=False)[2][: rows - 1].T
    oracle = np.sum((basis.T @ w.astype(np.float64)) ** 2, 0) / np.sum(w.astype(np.float64) ** 2, 0)
    res = dg.input_span_projection(jnp.asarray(w), jnp.asarray(h))
    assert int(res.rank) == rows - 1
    np.testing.assert_allclose(res.in_span_fraction, oracle, rtol=1e-4)


def test_gradient_predictiveness_names_an_integer_leaf():
    """An int leaf failed inside jax.grad with a message about allow_int."""
    params = {"w": jnp.ones(2), "n": jnp.ones(2, jnp.int32)}
    with pytest.raises(ValueError, match=r"params\['n'\] has dtype int32"):
        dg.gradient_predictiveness(lambda p: jnp.sum(p["w"] ** 2), params)
    got = dg.gradient_predictiveness(lambda p: jnp.sum(p["w"] ** 2), {"w": jnp.ones(2)}, step_sizes=[0.25])
    # L = |w|^2, g = 2w: w - eta g = 0.5 w gives L = 0.5 and gradient change |w - 2w| = sqrt(2)
    np.testing.assert_allclose(got.losses, [0.5], rtol=1e-6)
    np.testing.assert_allclose(got.gradient_changes, [np.sqrt(2.0)], rtol=1e-6)
