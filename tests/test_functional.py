"""The functional core against float64 NumPy oracles, gradient checks, invariances and bad input."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import oracles
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.test_util import check_grads as _check_grads
from oracles import normal

import jaxnorm.functional as F


def check_grads(f, args, **kwargs):
    """``jax.test_util.check_grads`` on ``jax.jit(f)``: the same finite-difference checks of the same
    function, compiled once instead of dispatched op by op (2-3x faster on these small inputs)."""
    _check_grads(jax.jit(f), args, **kwargs)

P_VALUES = [2, 1, "inf"]



# ---------------------------------------------------------------------------------------------------
# Oracles (float64)


@pytest.mark.parametrize("p", P_VALUES)
@pytest.mark.parametrize("shape,axis", [((64, 5), -1), ((8, 6, 6, 4), 3), ((7, 3, 9), 1)])
def test_batch_stats_matches_oracle(x64, p, shape, axis):
    x = normal(shape, loc=2.0, scale=3.0)
    mean, sigma = F.batch_stats(jnp.asarray(x), p=p, axis=axis)
    want_mean, want_var = oracles.batch_moments(x, p, axis)
    np.testing.assert_allclose(mean, want_mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(sigma, np.sqrt(want_var), rtol=1e-12)


@pytest.mark.parametrize("k", [1, 3, 10])
def test_topk_matches_oracle(x64, k):
    x = normal((40, 3, 5), seed=1)
    _, sigma = F.batch_stats(jnp.asarray(x), p="inf", topk=k)
    _, want_var = oracles.batch_moments(x, "inf", -1, topk=k)
    np.testing.assert_allclose(sigma, np.sqrt(want_var), rtol=1e-12)


def test_topk_1_is_max(x64):
    x = jnp.asarray(normal((50, 4), seed=2))
    np.testing.assert_allclose(F.batch_stats(x, p="inf", topk=1)[1], F.batch_stats(x, p="inf")[1], rtol=1e-14)


@pytest.mark.parametrize("p", P_VALUES)
def test_masked_stats_match_oracle(x64, p):
    x = normal((30, 6), seed=3)
    mask = np.random.default_rng(4).random((30, 6)) < 0.6
    mean, sigma = F.batch_stats(jnp.asarray(x), p=p, mask=jnp.asarray(mask))
    want_mean, want_var = oracles.batch_moments(x, p, -1, mask=mask)
    np.testing.assert_allclose(mean, want_mean, rtol=1e-12)
    np.testing.assert_allclose(sigma, np.sqrt(want_var), rtol=1e-12)


@pytest.mark.parametrize("k", [1, 10, 40])
@pytest.mark.parametrize("masked", [False, True])
def test_topk_over_many_rows_with_ties_matches_oracle(x64, k, masked):
    """Many rows take the two-stage top-k (block maxima, then the best k blocks); rounding to 0.1
    makes ties, within and across blocks, and the mask hides whole blocks."""
    x = np.round(normal((16, 8, 8, 3), seed=33, scale=2.0), 1)
    mask = np.random.default_rng(34).random(x.shape) < 0.7 if masked else None
    if masked:
        mask[:4] = False
    jax_mask = None if mask is None else jnp.asarray(mask)
    _, sigma = F.batch_stats(jnp.asarray(x), p="inf", topk=k, mask=jax_mask)
    _, want_var = oracles.batch_moments(x, "inf", -1, topk=k, mask=mask)
    np.testing.assert_allclose(sigma, np.sqrt(want_var), rtol=1e-12)


@pytest.mark.parametrize("masked", [False, True])
def test_topk_two_stage_gradient_equals_one_stage(x64, monkeypatch, masked):
    """The two-stage top-k computes deviations of the k best blocks only; its gradient (to ``x``
    through the gathered candidates and the mean) equals that of one ``top_k`` over every deviation."""
    from jaxnorm.functional import dispersion_topk

    x = jnp.asarray(normal((16, 8, 8, 3), seed=37, scale=2.0))
    mask = None if not masked else jnp.asarray(np.random.default_rng(38).random(x.shape) < 0.7)
    ct = jnp.asarray(normal((16, 8, 8, 3), seed=39))
    loss = lambda x: jnp.sum(F.batch_norm(x, p="inf", topk=10, mask=mask) * ct)
    two_stage = jax.grad(loss)(x)
    monkeypatch.setattr(dispersion_topk, "TOPK_BLOCK", 1)  # blocks of one row: one top_k over every deviation
    one_stage = jax.grad(loss)(x)
    np.testing.assert_allclose(two_stage, one_stage, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("shape", "axes"), [
    ((16, 4, 4, 8), (0, 1, 2)),  # 256 rows of 8 features: a (4, 512) view
    ((6, 5, 64), (0, 1)),  # 30 rows: 6 of them side by side
    ((7, 3), (0,)),  # 7 rows, a prime: the plain reduction
    ((4, 300), (0,)),  # wide enough already
    ((4, 5, 6), (1, 2)),  # not the leading axes
])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_extreme_through_a_wider_view_is_the_plain_max_and_min(shape, axes, dtype):
    from jaxnorm.functional.reduction import column_extreme

    x = jnp.asarray(normal(shape, seed=41), dtype)
    for op in (jnp.max, jnp.min):
        got = column_extreme(x, axes, op)
        assert got.shape == op(x, axes, keepdims=True).shape
        np.testing.assert_array_equal(got, op(x, axes, keepdims=True))


def test_masked_topk_with_fewer_elements_than_k(x64):
    x = normal((12, 2), seed=5)
    mask = np.zeros((12, 2), bool)
    mask[:3, 0] = True  # 3 unmasked elements in feature 0, k = 5
    mask[:, 1] = True
    sigma = F.batch_stats(jnp.asarray(x), p="inf", topk=5, mask=jnp.asarray(mask))[1]
    col = x[:3, 0]
    want = oracles.linf_c(3) * np.mean(np.abs(col - col.mean()))
    np.testing.assert_allclose(sigma[0], want, rtol=1e-12)


@pytest.mark.parametrize("p", P_VALUES)
def test_batch_norm_matches_oracle(x64, p):
    x = normal((16, 4, 4, 8), seed=6, loc=-1.0, scale=0.5)
    np.testing.assert_allclose(
        F.batch_norm(jnp.asarray(x), p=p), oracles.batch_norm(x, p), rtol=1e-10, atol=1e-12
    )


@pytest.mark.parametrize("p", P_VALUES)
def test_layer_group_instance_norm_match_oracles(x64, p):
    x = normal((3, 5, 5, 8), seed=7, loc=4.0, scale=2.0)
    xj = jnp.asarray(x)
    np.testing.assert_allclose(
        F.layer_norm(xj, p=p, axis=(1, 2, 3)), oracles.layer_norm(x, p), rtol=1e-10, atol=1e-12
    )
    np.testing.assert_allclose(F.group_norm(xj, 4, p=p), oracles.group_norm(x, 4, p), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(F.instance_norm(xj, p=p), oracles.instance_norm(x, p), rtol=1e-10, atol=1e-12)


def test_group_norm_without_spatial_axes(x64):
    x = normal((6, 8), seed=8)
    np.testing.assert_allclose(F.group_norm(jnp.asarray(x), 2), oracles.group_norm(x, 2), rtol=1e-10)


def test_rms_norm(x64):
    x = normal((5, 7), seed=9, loc=1.0)
    scale = normal((7,), seed=19)
    want = x / np.sqrt(np.mean(x**2, axis=-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(F.rms_norm(jnp.asarray(x)), want, rtol=1e-12)
    np.testing.assert_allclose(F.rms_norm(jnp.asarray(x), scale=jnp.asarray(scale)), want * scale, rtol=1e-12)
    want_axis0 = x / np.sqrt(np.mean(x**2, axis=0, keepdims=True) + 1e-6)
    np.testing.assert_allclose(F.rms_norm(jnp.asarray(x), axis=0), want_axis0, rtol=1e-12)


def test_ghost_batch_norm_is_batch_norm_per_sub_batch(x64):
    x = normal((12, 3, 5), seed=10)
    y = F.batch_norm(jnp.asarray(x), p=1, virtual_batch_size=4)
    for g in range(3):
        np.testing.assert_allclose(
            y[4 * g : 4 * g + 4], oracles.batch_norm(x[4 * g : 4 * g + 4], 1), rtol=1e-10
        )


def test_mean_only_batch_norm(x64):
    x = normal((10, 3), seed=11, loc=5.0)
    np.testing.assert_allclose(
        F.batch_norm(jnp.asarray(x), mean_only=True), x - x.mean(0), rtol=1e-12, atol=1e-12
    )


def test_weight_functions_match_oracles(x64):
    v = normal((3, 3, 4, 6), seed=12)
    g = normal((6,), seed=13)
    np.testing.assert_allclose(F.unit_norm(jnp.asarray(v)), oracles.unit_norms(v), rtol=1e-12)
    np.testing.assert_allclose(
        F.weight_norm(jnp.asarray(v), jnp.asarray(g)), oracles.weight_norm(v, g), rtol=1e-10
    )
    fan_in, fan_out = oracles.fans(v.shape)
    np.testing.assert_allclose(
        F.scaled_weight_norm(jnp.asarray(v), jnp.asarray(g), gain=2.0),
        oracles.weight_norm(v, g * math.sqrt(2.0 * fan_in / fan_out)),
        rtol=1e-10,
    )
    np.testing.assert_allclose(
        F.bounded_weight_norm(jnp.asarray(v), 3.0), oracles.weight_norm(v, 3.0), rtol=1e-10
    )
    np.testing.assert_allclose(
        F.weight_standardization(jnp.asarray(v), gain=jnp.asarray(g)),
        oracles.weight_standardization(v, g),
        rtol=1e-10,
    )
    assert F.fans((10, 20)) == (10, 20) and F.fans((3, 3, 4, 6)) == (36, 54)


def test_normprop_relu_normalizes_a_standard_normal():
    u = jax.random.normal(jax.random.key(0), (400_000,))
    y = F.normprop_relu(u)
    assert abs(float(y.mean())) < 5e-3 and abs(float(y.std()) - 1) < 5e-3


# ---------------------------------------------------------------------------------------------------
# Constants


def test_paper_linf_constant():
    assert F.linf_constant(100) == pytest.approx(
        (1 + math.sqrt(math.pi * math.log(4))) / (2 * math.sqrt(2 * math.log(100)))
    )
    assert F.L1_CONSTANT == pytest.approx(1.2533141373155)


@pytest.mark.parametrize("n,k", [(2, 1), (128, 1), (1000, 1), (50, 10), (1000, 10)])
def test_expected_topk_abs_normal_matches_quadrature(n, k):
    want = oracles.expected_topk_abs_normal(n, k)
    assert float(F.expected_topk_abs_normal(n, k)) == pytest.approx(want, rel=1e-4)  # float32
    with oracles.float64():
        assert float(F.expected_topk_abs_normal(n, k)) == pytest.approx(want, rel=1e-10)


@pytest.mark.parametrize("n,k", [(50_000, 1), (300_000, 1), (1_000_000, 1), (5_000_000, 1), (1_000_000, 10)])
def test_expected_topk_abs_normal_is_accurate_in_float32_for_large_n(n, k):
    """A BatchNorm channel of a conv net holds ``n ~ 1e5-1e6`` values; float32 ``betainc`` with
    ``b = n - m + 1`` put ``E max|Z|`` (and so ``calibration="exact"``) 0.2-4 % off there."""
    want = oracles.expected_topk_abs_normal_binomial(n, k)
    assert float(F.expected_topk_abs_normal(jnp.float32(n), k)) == pytest.approx(want, rel=2e-6)


def test_exact_linf_calibration_of_a_large_channel():
    """``batch_stats(p="inf", calibration="exact")`` on a channel of 300,000 values: ``max|x - mean|``
    over ``E max`` of 300,000 half-normals (float64 oracle), not 1 % off."""
    x = np.random.default_rng(0).standard_normal((300_000, 1)).astype(np.float32)
    _, sigma = F.batch_stats(x, p="inf", calibration="exact")
    x64 = x.astype(np.float64)
    want = np.abs(x64 - x64.mean()).max() / oracles.expected_topk_abs_normal_binomial(300_000)
    assert float(sigma[0]) == pytest.approx(want, rel=1e-5)


def test_expected_max_abs_normal_closed_form():
    # E max(|Z1|, |Z2|) = 2 / sqrt(pi); E|Z| = sqrt(2 / pi); to the documented ~1e-4 in float32 (1e-6 held
    # with XLA's default optimization and not without it: float32 betainc), 1e-10 in float64
    for n, want in ((2, 2 / math.sqrt(math.pi)), (1, math.sqrt(2 / math.pi))):
        assert float(F.expected_topk_abs_normal(n)) == pytest.approx(want, rel=1e-4)
        with oracles.float64():
            assert float(F.expected_topk_abs_normal(n)) == pytest.approx(want, rel=1e-10)


@pytest.mark.parametrize("n", [32, 256])
def test_exact_calibration_is_unbiased_on_gaussian_data(n):
    """Exact L∞ calibration makes sigma_hat an unbiased estimate of the (biased) std; the paper's does not."""
    x = jax.random.normal(jax.random.key(n), (n, 4000))
    exact = F.batch_stats(x, p="inf", calibration="exact")[1]
    paper = F.batch_stats(x, p="inf")[1]
    std = jnp.std(x, axis=0)
    assert float(jnp.mean(exact / std)) == pytest.approx(1.0, abs=0.01)
    assert float(jnp.mean(paper / std)) > 1.25


# ---------------------------------------------------------------------------------------------------
# Numerics


def test_cancellation_case_normalizes_to_unit_std():
    """float32, mean 1000, std 0.01: flax's fast variance gives 0 here; jaxnorm must give unit std."""
    x = jnp.asarray(normal((512, 8), seed=14, loc=1000.0, scale=0.01, dtype=np.float32))
    for fast in (True, False):
        y = F.batch_norm(x, use_fast_variance=fast, epsilon=1e-12)
        np.testing.assert_allclose(jnp.std(y, axis=0), 1.0, rtol=1e-3)
    np.testing.assert_allclose(F.layer_norm(x.T, epsilon=1e-12).std(axis=-1), 1.0, rtol=1e-3)
    grouped = F.group_norm(x.reshape(64, 8, 8), 2, epsilon=1e-12)
    np.testing.assert_allclose(grouped.std(axis=(1, 2)), 1.0, rtol=1e-3)
    # L1 / L∞: centred to within the float32 resolution of the mean (ulp(1000) / 2 = 0.3 % of the std)
    for p in (1, "inf"):
        y = F.batch_norm(x, p=p, epsilon=1e-12)
        np.testing.assert_allclose(jnp.mean(y, axis=0), 0.0, atol=1e-2)
        want = np.sqrt(oracles.batch_moments(np.asarray(x, np.float64), p)[1] / np.var(x, axis=0))
        np.testing.assert_allclose(jnp.std(y, axis=0), 1 / want, rtol=5e-3)


@pytest.mark.parametrize("p", [*P_VALUES, "top3"])
@pytest.mark.parametrize("offset", [0.5, 5.0, 50.0, 1e5])
def test_float32_statistics_accurate_whatever_the_mean(p, offset):
    """Per-channel means of +-offset std: below CONDITION_LIMIT the one-pass raw sums are kept, above it
    (50, 1e5) the shifted pass runs; both must match float64 statistics of the same float32 data."""
    signs = np.array([1.0, -1.0, 0.5, -2.0, 1.5, -0.25])
    x = (normal((256, 6), seed=21) + offset * signs).astype(np.float32)
    p, topk = ("inf", 3) if p == "top3" else (p, None)
    mean, sigma = F.batch_stats(jnp.asarray(x), p=p, topk=topk)
    want_mean, want_var = oracles.batch_moments(x.astype(np.float64), p, topk=topk)
    ulp = np.spacing(np.abs(want_mean).astype(np.float32))
    np.testing.assert_allclose(mean, want_mean, rtol=0, atol=4 * ulp.max() + 1e-6)
    # at 1e5 the float32 mean itself is only known to ulp(1e5) / 2 = 0.004 std, which the L∞ range inherits
    np.testing.assert_allclose(sigma, np.sqrt(want_var), rtol=2e-5 if offset < 1e5 else 5e-3)


@pytest.mark.parametrize("offset", [0.5, 5.0, 50.0, 1e5])
def test_float32_layer_norm_rows_accurate_whatever_the_mean(offset):
    """Layer norm over the last axis (its own row statistics): below CONDITION_LIMIT the one-pass raw
    sums are kept, above it the shifted pass runs; the output and the input gradient must match float64
    on the same float32 data."""
    signs = np.array([1.0, -1.0, 0.5, -2.0, 1.5, -0.25])
    x = (normal((6, 256), seed=31) + offset * signs[:, None]).astype(np.float32)
    cotangent = normal((6, 256), seed=32)

    def value_and_grad(x):
        ct = jnp.asarray(cotangent, x.dtype)
        return jax.value_and_grad(lambda x: jnp.sum(F.layer_norm(x, epsilon=1e-12) * ct))(x), F.layer_norm(
            x, epsilon=1e-12
        )

    (_, got_grad), got = value_and_grad(jnp.asarray(x))
    with oracles.float64():
        (_, want_grad), want = value_and_grad(jnp.asarray(x, jnp.float64))
    want = np.asarray(want)
    np.testing.assert_allclose(want.std(axis=-1), 1.0, rtol=1e-9)
    # the float32 mean is known to ulp(mean) / 2 (0.004 std at 1e5), which every output inherits
    atol = 2 * np.spacing(np.float32(2 * offset)) + 2e-5
    np.testing.assert_allclose(got, want, rtol=0, atol=atol)
    np.testing.assert_allclose(got_grad, want_grad, rtol=0, atol=max(atol, 1e-4) * np.abs(want_grad).max())


@pytest.mark.parametrize("p", P_VALUES)
def test_float32_gradients_accurate_in_cancellation_case(p):
    """Mean 1000 std: the float32 gradient of batch norm equals the float64 one on the same data.

    (With the raw float32 sums, the variance would be off by ~6e-8 * 1000^2, i.e. 6 %.)"""
    x = normal((128, 4), seed=22, loc=1000.0, scale=1.0).astype(np.float32)
    cotangent = normal((128, 4), seed=23)

    def grad(x):
        ct = jnp.asarray(cotangent, x.dtype)
        return jax.grad(lambda x: jnp.sum(F.batch_norm(x, p=p, epsilon=1e-12) * ct))(x)

    got = grad(jnp.asarray(x))
    with oracles.float64():
        want = np.asarray(grad(jnp.asarray(x, jnp.float64)))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-3 * np.abs(want).max())


def test_linf_gradient_shares_tied_extremes_equally(x64):
    """d max|x - mean| / dx_i = 1/|T| on the tied extremes T (far side of the mean) - 1/n: written out."""
    x = normal((10, 2), seed=24)
    x[[2, 7], 0] = 9.0  # two tied maxima, far above the mean
    x[[1, 4, 8], 1] = -6.0  # three tied minima, far below the mean
    got = jax.grad(lambda x: jnp.sum(F.batch_stats(x, p="inf")[1]))(jnp.asarray(x))
    want = np.full_like(x, -1 / 10)
    want[[2, 7], 0] += 1 / 2
    want[:, 1] = 1 / 10
    want[[1, 4, 8], 1] -= 1 / 3
    np.testing.assert_allclose(got, oracles.linf_c(10) * want, rtol=1e-12, atol=1e-15)



@pytest.mark.parametrize("masked", [False, True])
def test_l1_gradient_takes_minus_one_at_ties_with_the_mean(x64, masked):
    """d sum|x - mean| / dx_i = s_i - mean(s), with s = +1 above the mean, -1 at and below it (the
    documented subgradient); masked elements get 0 and leave the count. Written out in float64."""
    x = np.array([[1.0, 3.0], [2.0, 3.0], [3.0, 3.0], [6.0, 3.0], [-2.0, 5.0]])  # column 0: mean 2
    mask = np.array([[True], [True], [True], [True], [masked is False]])
    if masked:
        x[4, 0] = 100.0  # hidden: without the mask it would move the mean
    mask_arg = jnp.asarray(mask) if masked else None
    got = jax.grad(lambda x: jnp.sum(F.batch_stats(x, p=1, mask=mask_arg)[1]))(jnp.asarray(x))
    want = np.zeros_like(x)
    keep = mask[:, 0]
    for c in range(2):
        values = x[keep, c]
        mean = values.mean()
        s = np.where(values > mean, 1.0, -1.0)
        # batch_stats gives sigma = C mean|x - mean|:  d sigma / dx_i = C (s_i - mean(s)) / n
        want[keep, c] = oracles.L1 * (s - s.mean()) / len(values)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
def test_vmap_over_differently_conditioned_inputs():
    """A batched cond predicate (one slice needs the shifted pass, one does not) gives per-slice results.
    Where the platform sums a vmapped slice in another order than the slice alone (GPU), the nearly
    constant slice (|mean| / sigma = 1e5) may round its mean to the neighbouring float32: the tolerance
    is 2 units of that resolution, ``spacing(|mean|) / sigma`` (1e-6 on CPU's equal orders would do)."""
    xs = np.stack([normal((64, 3), seed=25), normal((64, 3), seed=26, loc=1000.0, scale=0.01)])
    xs = jnp.asarray(xs.astype(np.float32))
    resolutions = [max(1e-6, 2 * float(np.max(np.spacing(np.abs(x.mean(0)).astype(np.float32)) / x.std(0))))
                   for x in np.asarray(xs, np.float64)]
    assert resolutions[0] == 1e-6 and 1e-3 < resolutions[1] < 0.05  # float32's spacing at 1000, not float64's
    for p in P_VALUES:
        norm = jax.jit(functools.partial(F.batch_norm, p=p, epsilon=1e-12))
        for got, x, atol in zip(jax.jit(jax.vmap(norm))(xs), xs, resolutions, strict=True):
            np.testing.assert_allclose(got, norm(x), rtol=1e-6, atol=atol)


@pytest.mark.parametrize(("p", "topk"), [(p, None) for p in P_VALUES] + [("inf", 3)])
def test_bf16_input_masked_stats_and_gradients_match_float32(p, topk):
    """bf16 input is widened once per reduction (separate reads): statistics and gradients equal those of
    the same values given in float32, masked or not."""
    x = jnp.asarray(normal((32, 3, 8), seed=31, loc=2.0, scale=1.5), jnp.bfloat16)
    mask = jnp.asarray(normal((32, 3, 1), seed=32) > -0.5)
    cotangent = jnp.asarray(normal((32, 3, 8), seed=33))
    for m in (None, mask):

        def loss(x, m=m):
            y = F.batch_norm(x, p=p, topk=topk, mask=m, axis=-1).astype(jnp.float32)
            return jnp.sum(y * cotangent)

        got = F.batch_moments(x, p=p, topk=topk, mask=m, axis=-1)
        want = F.batch_moments(x.astype(jnp.float32), p=p, topk=topk, mask=m, axis=-1)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-6)
        np.testing.assert_allclose(
            jax.grad(loss)(x).astype(jnp.float32),
            jax.grad(loss)(x.astype(jnp.float32)).astype(jnp.bfloat16).astype(jnp.float32),
            rtol=1e-2, atol=1e-2,
        )
        oracle_mean, oracle_var = oracles.batch_moments(np.asarray(x, np.float64), p, topk=topk,
                                                        mask=None if m is None else np.asarray(m))
        np.testing.assert_allclose(got[0], oracle_mean, rtol=1e-5)
        np.testing.assert_allclose(got[1], oracle_var, rtol=1e-4)


@pytest.mark.parametrize("p", P_VALUES)
def test_bf16_input_float32_stats_finite_output(p):
    x = jnp.asarray(normal((64, 4, 4, 16), seed=15, loc=3.0, scale=2.0), jnp.bfloat16)
    mean, var = F.batch_moments(x, p=p)
    assert mean.dtype == jnp.float32 and var.dtype == jnp.float32
    for y in (F.batch_norm(x, p=p), F.layer_norm(x, p=p), F.group_norm(x, 4, p=p)):
        assert y.dtype == jnp.bfloat16
        assert bool(jnp.all(jnp.isfinite(y)))
    want_mean, _ = oracles.batch_moments(np.asarray(x, np.float64), p)
    np.testing.assert_allclose(mean, want_mean, rtol=1e-5)


@pytest.mark.parametrize("p", P_VALUES)
def test_constant_input_gives_finite_zero_output(p):
    x = jnp.full((16, 4), 3.0)
    assert bool(jnp.all(F.batch_norm(x, p=p) == 0))
    grads = jax.grad(lambda x: jnp.sum(F.batch_norm(x, p=p) * jnp.arange(4.0)))(x)
    assert bool(jnp.all(jnp.isfinite(grads)))
    assert bool(jnp.all(jnp.isfinite(F.weight_norm(jnp.zeros((3, 2)), 1.0))))


# ---------------------------------------------------------------------------------------------------
# Gradients


@pytest.mark.parametrize("p", P_VALUES)
def test_check_grads_activation(x64, p):
    x = jnp.asarray(normal((6, 3, 4), seed=16, loc=0.5))
    check_grads(lambda x: F.batch_norm(x, p=p), (x,), order=2 if p == 2 else 1, modes=["rev"], eps=1e-6)
    for f in (
        lambda x: F.layer_norm(x, p=p),
        lambda x: F.group_norm(x, 2, p=p),
        lambda x: F.instance_norm(x[..., None], p=p),
    ):
        check_grads(f, (x,), order=1, modes=["rev"], eps=1e-6)


@pytest.mark.slow  # CI time; batch norm p = 2 keeps a second-order check (test_check_grads_activation)
def test_check_grads_l2_statistics_second_order(x64):
    """p = 2 statistics (shifted sums, Chan's merge of a group's channels, masks) against finite
    differences to second order."""
    x = jnp.asarray(normal((3, 4, 4, 6), seed=51, loc=0.5))
    mask = jnp.asarray(np.random.default_rng(52).random(x.shape) < 0.7)
    for f in (
        lambda a: F.group_norm(a, 2),
        lambda a: F.group_norm(a, 3, mask=mask),
        lambda a: F.batch_norm(a, mask=mask),
        lambda a: F.layer_norm(a, axis=(1, 2)),
    ):
        check_grads(f, (x,), order=2, modes=["fwd", "rev"], eps=1e-6)


def test_check_grads_normalize(x64):
    """The written-out derivative of the affine output (per-feature statistics) and autodiff's
    (per-example statistics), both against finite differences, to second order."""
    x = jnp.asarray(normal((6, 3, 4), seed=27))
    mean, var = jnp.asarray(normal((1, 1, 4), seed=28)), jnp.asarray(np.exp(normal((1, 1, 4), seed=29)))
    scale, bias = jnp.asarray(normal((4,), seed=30)), jnp.asarray(normal((4,), seed=31))
    row_var = jnp.asarray(np.exp(normal((6, 3, 1), seed=32)))
    for f, args in (
        (lambda x, m, v, s, b: F.normalize(x, m, v, scale=s, bias=b), (x, mean, var, scale, bias)),
        (lambda x, m, s: F.normalize(x, m, None, scale=s), (x, mean, scale)),
        (lambda x, m, v: F.normalize(x, m, v), (x, mean, var)),
        (
            lambda x, v, s, b: F.normalize(x, x.mean(-1, keepdims=True), v, scale=s, bias=b),
            (x, row_var, scale, bias),
        ),
    ):
        check_grads(f, args, order=2, modes=["fwd", "rev"], eps=1e-6)


def _layer_norm_last_axis(x, scale, bias, mask=None):
    from jaxnorm.functional.per_example import per_example_norm

    return per_example_norm(
        x, (2,), p=2, epsilon=1e-5, mask=mask, use_fast_variance=True, scale=scale, bias=bias
    )


def _rms_norm_last_axis(x, scale, mask=None):
    return F.rms_norm(x, scale=scale, mask=mask)


@pytest.mark.parametrize(("norm", "seed", "loc", "num_params"), [
    (_layer_norm_last_axis, 33, 2.0, 2),  # scale and bias
    (_rms_norm_last_axis, 43, 1.0, 1),  # scale
])
def test_last_axis_norm_derivative(x64, norm, seed, loc, num_params):
    """Layer and RMS norm over the last axis have a written-out JVP: finite differences to second order,
    and the same gradients as the general (autodiff) path, taken here through an all-true mask."""
    x = jnp.asarray(normal((6, 3, 4), seed=seed, loc=loc))
    params = tuple(jnp.asarray(normal((4,), seed=seed + 1 + i)) for i in range(num_params))
    ct = jnp.asarray(normal((6, 3, 4), seed=seed + 1 + num_params))
    argnums = tuple(range(1 + num_params))

    check_grads(norm, (x, *params), order=2, modes=["fwd", "rev"], eps=1e-6)
    fast = jax.grad(lambda *a: jnp.sum(norm(*a) * ct), argnums=argnums)(x, *params)
    general = jax.grad(lambda *a: jnp.sum(norm(*a, mask=jnp.ones(x.shape, bool)) * ct), argnums=argnums)(
        x, *params
    )
    for a, b in zip(fast, general, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    # one argument at a time: the others' tangents are symbolic zeros (the input-only gradient takes the
    # plain form, no distinct copies), and each gradient must equal its part of the full one
    for i in argnums:
        alone = jax.grad(lambda *a: jnp.sum(norm(*a) * ct), argnums=i)(x, *params)
        np.testing.assert_allclose(alone, fast[i], rtol=1e-12, atol=1e-14)
    check_grads(lambda x: norm(x, *params), (x,), order=2, modes=["fwd", "rev"], eps=1e-6)


PER_EXAMPLE_L2 = {
    "instance": ((1, 2), None),
    "layer_axes": ((1, 2, 3), None),
    "group": ((1, 2), 2),
}


def _per_example_l2(x, scale, bias, axes, num_groups, mask=None):
    from jaxnorm.functional.moments import ChannelGroups
    from jaxnorm.functional.per_example import per_example_norm

    groups = None if num_groups is None else ChannelGroups(x.ndim - 1, num_groups)
    return per_example_norm(
        x, axes, p=2, epsilon=1e-5, mask=mask, use_fast_variance=True, groups=groups, scale=scale, bias=bias
    )


@pytest.mark.parametrize("form", ["cpu", "accelerator"])
@pytest.mark.parametrize("loc", [0.0, 300.0])
@pytest.mark.parametrize("name", sorted(PER_EXAMPLE_L2))
def test_per_example_l2_derivative(x64, accelerator_forms, name, loc, form):
    """Instance, group and several-axes layer norm at p = 2 have a written-out JVP
    (:func:`jaxnorm.functional.per_example_l2.l2_normalize`), in XLA:CPU's folded form and in the GPU/TPU
    form: finite differences to second order, and the gradients of the general (autodiff) path, taken
    through an all-true mask, to rounding, also for groups whose mean is 300 times their spread; one
    argument at a time equals its part of the full gradient."""
    if form == "accelerator":
        accelerator_forms()
    axes, num_groups = PER_EXAMPLE_L2[name]
    x = jnp.asarray(normal((3, 4, 2, 4), seed=61, loc=loc))
    params = tuple(jnp.asarray(normal((1, 1, 1, 4), seed=62 + i)) for i in range(2))
    ct = jnp.asarray(normal(x.shape, seed=64))

    def norm(x, scale, bias, mask=None):
        return _per_example_l2(x, scale, bias, axes, num_groups, mask)

    def loss(*a, **kw):
        return jnp.sum(norm(*a, **kw) * ct)

    fast = jax.grad(loss, argnums=(0, 1, 2))(x, *params)
    general = jax.grad(lambda *a: loss(*a, mask=jnp.ones(x.shape, bool)), argnums=(0, 1, 2))(x, *params)
    for a, b in zip(fast, general, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-11)
    for i in range(3):
        alone = jax.grad(loss, argnums=i)(x, *params)
        np.testing.assert_allclose(alone, fast[i], rtol=1e-12, atol=1e-14)
    if loc == 0.0:
        check_grads(norm, (x, *params), order=2, modes=["fwd", "rev"], eps=1e-6)


def test_check_grads_topk_ghost_masked(x64):
    x = jnp.asarray(normal((8, 5), seed=17))
    mask = jnp.asarray(np.random.default_rng(18).random((8, 5)) < 0.7)
    check_grads(lambda x: F.batch_norm(x, p="inf", topk=3), (x,), order=1, modes=["rev"], eps=1e-6)
    check_grads(lambda x: F.batch_norm(x, p=1, virtual_batch_size=4), (x,), order=1, modes=["rev"], eps=1e-6)
    check_grads(lambda x: F.batch_norm(x, mask=mask), (x,), order=1, modes=["rev"], eps=1e-6)
    check_grads(lambda x: F.rms_norm(x), (x,), order=1, modes=["rev"], eps=1e-6)
    check_grads(lambda x: F.batch_norm(x, mean_only=True), (x,), order=1, modes=["rev"], eps=1e-6)


def test_check_grads_weight(x64):
    v = jnp.asarray(normal((3, 4, 5), seed=19))
    g = jnp.asarray(normal((5,), seed=20))
    check_grads(lambda v, g: F.weight_norm(v, g), (v, g), order=2, modes=["rev"], eps=1e-6)
    check_grads(lambda v, g: F.scaled_weight_norm(v, g), (v, g), order=1, modes=["rev"], eps=1e-6)
    check_grads(lambda v: F.bounded_weight_norm(v, 2.0), (v,), order=1, modes=["rev"], eps=1e-6)
    check_grads(lambda v, g: F.weight_standardization(v, gain=g), (v, g), order=1, modes=["rev"], eps=1e-6)
    check_grads(lambda u: F.normprop_relu(u), (v + 0.1,), order=1, modes=["rev"], eps=1e-6)


# ---------------------------------------------------------------------------------------------------
# Invariances (hypothesis)


@given(
    scales=st.lists(st.floats(0.01, 100.0), min_size=4, max_size=4),
    shift=st.floats(-50.0, 50.0),
    p=st.sampled_from(P_VALUES),
    seed=st.integers(0, 2**16),
)
def test_batch_norm_invariant_to_weight_scale_and_shift(scales, shift, p, seed):
    """BN(x W D + b) = BN(x W) for any positive per-unit scaling D and shift b: scale invariance."""
    with oracles.float64():
        x = jnp.asarray(normal((32, 6), seed=seed))
        w = jnp.asarray(normal((6, 4), seed=seed + 1))
        base = _batch_norm(x @ w, p=p, epsilon=0.0)
        scaled = _batch_norm(x @ (w * jnp.asarray(scales)) + shift, p=p, epsilon=0.0)
        np.testing.assert_allclose(scaled, base, rtol=1e-8, atol=1e-8)


# compiled once per p (and per x64 mode): each hypothesis example then runs in microseconds
_layer_norm = jax.jit(F.layer_norm, static_argnames=("p", "epsilon"))
_group_norm = jax.jit(F.group_norm, static_argnums=1, static_argnames=("p", "epsilon"))
_batch_norm = jax.jit(F.batch_norm, static_argnames=("p", "epsilon"))


@given(scale=st.floats(0.01, 100.0), p=st.sampled_from(P_VALUES), seed=st.integers(0, 2**16))
def test_layer_and_group_norm_invariant_to_input_scale(scale, p, seed):
    with oracles.float64():
        x = jnp.asarray(normal((3, 4, 8), seed=seed))
        np.testing.assert_allclose(
            _layer_norm(scale * x, p=p, epsilon=0.0), _layer_norm(x, p=p, epsilon=0.0), rtol=1e-8, atol=1e-8
        )
        np.testing.assert_allclose(
            _group_norm(scale * x, 2, p=p, epsilon=0.0),
            _group_norm(x, 2, p=p, epsilon=0.0),
            rtol=1e-8,
            atol=1e-8,
        )


@given(rho=st.floats(0.1, 10.0), seed=st.integers(0, 2**16))
def test_projection_gives_requested_unit_norms(rho, seed):
    v = jnp.asarray(normal((3, 3, 2, 5), seed=seed, dtype=np.float32))
    np.testing.assert_allclose(F.unit_norm(F.project_to_norm(v, rho)), rho, rtol=1e-5)


# ---------------------------------------------------------------------------------------------------
# Bad input


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda x: F.batch_norm(x, p=3), ValueError, "p must be 1, 2 or 'inf'"),
        (lambda x: F.layer_norm(x, p=0.5), ValueError, "p must be 1, 2 or 'inf'"),
        (lambda x: F.batch_norm(x, axis=4), ValueError, "axis=4 is out of range"),
        (lambda x: F.layer_norm(x, axis=(1, 1)), ValueError, "same axis twice"),
        (lambda x: F.group_norm(x, 3), ValueError, "num_groups=3 must divide the number of channels 4"),
        (lambda x: F.batch_norm(x, p="inf", topk=1000), ValueError, "topk=1000 exceeds the reduction size"),
        (lambda x: F.batch_norm(x, p=2, topk=3), ValueError, "topk applies to p='inf'"),
        (lambda x: F.batch_norm(x, virtual_batch_size=3), ValueError,
         r"virtual_batch_size=3 must divide .*\(the batch this call sees: under pmap"),
        (lambda x: F.batch_norm(x.astype(jnp.int32)), TypeError, "x must have a floating dtype"),
        (lambda x: F.batch_norm(x[:1, :1, :1]), ValueError, "at least 2 elements per feature"),
        (lambda x: F.batch_norm(x, mask=jnp.ones((3,), bool)), ValueError, "does not broadcast"),
        (lambda x: F.batch_norm(x, mask=jnp.ones(x.shape)), TypeError, "mask must be a boolean array"),
        (lambda x: F.batch_norm(x, calibration="exakt"), ValueError, "calibration must be"),
        (lambda x: F.batch_norm(x, p=1, calibration="exact"), ValueError, "applies to p='inf'"),
        (lambda x: F.batch_norm(x[:, 0, 0], virtual_batch_size=1), ValueError, "size=1 leaves 1 per"),
        (lambda x: F.weight_norm(x[0, 0], jnp.ones(2)), ValueError, r"g must be a scalar or .* shape \(4,\)"),
        (lambda x: F.bounded_weight_norm(x[0, 0], jnp.ones(3)), ValueError, "rho must be a scalar"),
        (lambda x: F.weight_norm_data_init(x[:1, 0, 0]), ValueError, "at least 2 values per output unit"),
        (lambda x: F.weight_norm(x[0, 0, 0], 1.0), ValueError, "rank >= 2"),
        (lambda x: F.instance_norm(x[:, 0, 0]), ValueError, "instance_norm needs"),
    ],
)
def test_bad_input_raises_clear_error(call, error, match):
    x = jnp.ones((4, 2, 2, 4))
    with pytest.raises(error, match=match):
        call(x)


def test_p_accepts_float_inf_string_and_numpy_scalars():
    x = jnp.asarray(normal((20, 3), seed=21, dtype=np.float32))
    a = F.batch_norm(x, p=float("inf"))
    b = F.batch_norm(x, p="inf")
    c = F.batch_norm(x, p=jnp.inf)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)
    np.testing.assert_array_equal(F.batch_norm(x, p=np.int64(1)), F.batch_norm(x, p=1))
    with pytest.raises(ValueError, match="p must be"):
        F.batch_norm(x, p=np.bool_(True))


def test_weight_norm_data_init_matches_oracle(x64):
    t = normal((6, 5, 5, 3), seed=23) * np.array([0.5, 2.0, 7.0]) + np.array([1.0, -3.0, 0.0])
    g, b = F.weight_norm_data_init(jnp.asarray(t), epsilon=1e-5)
    flat = t.reshape(-1, 3)
    want_g = 1 / np.sqrt(flat.var(axis=0) + 1e-5)
    np.testing.assert_allclose(g, want_g, rtol=1e-12)
    np.testing.assert_allclose(b, -flat.mean(axis=0) * want_g, rtol=1e-12)
    y = (g * t + b).reshape(-1, 3)
    np.testing.assert_allclose(y.mean(axis=0), 0, atol=1e-12)


def test_functions_jit():
    x = jnp.asarray(normal((16, 8), seed=22, dtype=np.float32))
    for p in P_VALUES:
        np.testing.assert_allclose(
            jax.jit(lambda x, p=p: F.batch_norm(x, p=p))(x), F.batch_norm(x, p=p), rtol=1e-6
        )


def test_weight_norm_data_init_of_a_constant_unit_is_the_unit_norm_init():
    """Constant pre-activations (variance exactly 0) have no scale to calibrate: ``g = 1`` and
    ``b = -mean``, not ``g = 1 / sqrt(epsilon)`` (316x per layer, multiplied through the depth)."""
    t = jnp.concatenate([jnp.full((8, 1), 2.5), jnp.arange(8.0)[:, None]], axis=1)
    g, b = F.weight_norm_data_init(t, epsilon=1e-5)
    assert float(g[0]) == 1.0 and float(b[0]) == -2.5
    np.testing.assert_allclose(float(g[1]), 1 / np.sqrt(np.var(np.arange(8.0)) + 1e-5), rtol=1e-6)
