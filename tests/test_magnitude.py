"""Magnitude-preserving blocks (EDM2, Karras et al. 2024): float64 NumPy oracles of the published
formulas, their invariances, the zero unit, argument checks, and the linen / NNX layers."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate
from flax import nnx
from hypothesis import given
from hypothesis import strategies as st

import jaxnorm.nn as jnn
import jaxnorm.nnx as jnnx
from jaxnorm import functional as F


def _oracle_mp_weight(v, gain, eps=1e-4):
    """EDM2's MPConv kernel in float64: normalize(v) * gain / sqrt(fan_in), normalize(v) = v / (eps +
    ||v|| sqrt(#norm / #v)) per output unit (torch layout out-first; here out is the last axis)."""
    v = np.asarray(v, np.float64)
    flat = v.reshape(-1, v.shape[-1])
    fan_in = flat.shape[0]
    normalized = flat / (eps + np.linalg.norm(flat, axis=0) * np.sqrt(1 / fan_in))
    return (normalized * gain / np.sqrt(fan_in)).reshape(v.shape)


@pytest.mark.parametrize("shape", [(7, 5), (3, 3, 4, 6)])
@pytest.mark.parametrize("gain", [1.0, 2.5, "vector"])
def test_mp_weight_matches_edm2(x64, shape, gain):
    v = jax.random.normal(jax.random.key(0), shape, jnp.float64) * 3
    g = np.linspace(0.5, 2.0, shape[-1]) if gain == "vector" else gain
    w = F.mp_weight(v, jnp.asarray(g))
    np.testing.assert_allclose(w, _oracle_mp_weight(v, g), rtol=1e-13)
    np.testing.assert_allclose(np.linalg.norm(np.reshape(w, (-1, shape[-1])), axis=0), g, rtol=1e-3)
    normalized = F.mp_normalize(v)
    np.testing.assert_allclose(
        normalized, _oracle_mp_weight(v, 1.0) * math.sqrt(v.size // shape[-1]), rtol=1e-13
    )


@given(st.floats(1e-3, 1e3), st.integers(0, 2**16))
def test_mp_weight_ignores_each_units_scale(scale, seed):
    """The effective kernel depends on each unit's direction only: exactly with ``epsilon=0``; EDM2's
    eps (on the per-element RMS) moves it by about ``eps / RMS``."""
    v = jax.random.normal(jax.random.key(seed), (16, 4))
    scales = jnp.asarray([scale, 1.0, 1 / scale, 7.0])
    np.testing.assert_allclose(
        F.mp_weight(v * scales, epsilon=0.0), F.mp_weight(v, epsilon=0.0), rtol=1e-5, atol=1e-7
    )
    rms = np.sqrt(np.mean(np.square(v * scales), axis=0))
    drift = np.abs(np.asarray(F.mp_weight(v * scales) - F.mp_weight(v, epsilon=0.0))).max(axis=0)
    assert (drift <= 2e-4 / rms * np.abs(np.asarray(F.mp_weight(v, epsilon=0.0))).max(axis=0) + 1e-7).all()


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_mp_weight_half_precision_and_degenerate_units(dtype):
    """Huge, tiny and zero units: finite, zero stays zero, the others get norm ``gain`` (in the
    kernel's dtype); gradients finite everywhere, the zero unit included."""
    big = float(jnp.finfo(dtype).max) / 8
    v = jnp.stack([jnp.full(6, big), jnp.full(6, 1e-3), jnp.zeros(6), jnp.arange(6.0) - 2], axis=1).astype(
        dtype
    )
    w = F.mp_weight(v, 2.0)
    assert w.dtype == dtype and bool(jnp.isfinite(w).all())
    norms = np.linalg.norm(np.asarray(w, np.float64), axis=0)
    np.testing.assert_allclose(norms[[0, 3]], 2.0, rtol=2e-2)
    assert norms[2] == 0
    grads = jax.grad(lambda k: F.mp_weight(k).astype(jnp.float32).sum())(v)
    assert bool(jnp.isfinite(grads.astype(jnp.float32)).all())


def test_mp_silu_constant_and_values():
    second_moment, _ = scipy.integrate.quad(
        lambda z: (z / (1 + np.exp(-z))) ** 2 * np.exp(-z * z / 2) / np.sqrt(2 * np.pi), -40, 40
    )
    assert F.MP_SILU_SCALE == pytest.approx(math.sqrt(second_moment), abs=1e-3)
    x = np.linspace(-6, 6, 101)
    np.testing.assert_allclose(F.mp_silu(jnp.asarray(x)), x / (1 + np.exp(-x)) / 0.596, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("t", [0.0, 0.3, 0.5, 1.0])
def test_mp_sum_and_concat_match_the_formulas(t):
    rng = np.random.default_rng(0)
    a, b, c = rng.normal(size=(50, 3)), rng.normal(size=(50, 3)), rng.normal(size=(50, 9))
    np.testing.assert_allclose(
        F.mp_sum(jnp.asarray(a), jnp.asarray(b), t),
        ((1 - t) * a + t * b) / np.sqrt((1 - t) ** 2 + t**2),
        rtol=1e-5,
        atol=1e-7,
    )
    got = np.asarray(F.mp_concat(jnp.asarray(a), jnp.asarray(c), t))
    C = np.sqrt(12 / ((1 - t) ** 2 + t**2))
    np.testing.assert_allclose(
        got, np.concatenate([C * (1 - t) / np.sqrt(3) * a, C * t / 3 * c], -1), rtol=1e-5, atol=1e-7
    )
    # the parts' shares of the concatenation's energy are (1 - t)^2 : t^2, whatever their widths
    ea, ec = (got[:, :3] ** 2).sum(1) / (a**2).mean(1), (got[:, 3:] ** 2).sum(1) / (c**2).mean(1)
    np.testing.assert_allclose(ea * t**2, ec * (1 - t) ** 2, rtol=1e-6, atol=1e-9)


def test_unit_variance_in_unit_variance_out():
    """Uncorrelated standard-normal inputs: mp_sum and mp_concat keep the second moment at 1 (a large
    sample, 1 % tolerance); an MPDense of gain 1 maps it to 1."""
    x = jax.random.normal(jax.random.key(1), (4, 20000, 64))
    assert float(jnp.mean(F.mp_sum(x[0], x[1], 0.3) ** 2)) == pytest.approx(1.0, rel=1e-2)
    assert float(jnp.mean(F.mp_concat(x[2][:, :16], x[3], 0.3) ** 2)) == pytest.approx(1.0, rel=1e-2)
    layer = jnn.MPDense(32)
    variables = layer.init(jax.random.key(2), x[0])
    assert float(jnp.mean(layer.apply(variables, x[0]) ** 2)) == pytest.approx(1.0, rel=1e-2)


def test_default_mp_layers_have_unit_norm_kernels_as_edm2s_randn_init_gives():
    """EDM2 initialises the stored v standard normal (torch.randn): its eps = 1e-4 on the per-element
    RMS is then negligible. flax's lecun_normal default (RMS 1 / sqrt(fan_in)) made eps shrink each
    kernel by eps sqrt(fan_in): per-unit norm 0.9933 at fan-in 4608, and 30 stacked MPDense(4096)
    layers ended at output RMS 0.81 instead of 1."""
    x = jnp.ones((1, 4608))
    kernel = jnn.MPDense(8).init(jax.random.key(0), x)["params"]["kernel"]
    norms = jnp.linalg.norm(F.mp_weight(kernel), axis=0)
    np.testing.assert_allclose(norms, 1.0, atol=2e-4)  # eps sqrt(fan_in) / ||v|| ~ 1e-4
    twin = jnnx.MPDense(4608, 8, rngs=nnx.Rngs(0))
    np.testing.assert_allclose(jnp.linalg.norm(F.mp_weight(twin.kernel[...]), axis=0), 1.0, atol=2e-4)
    conv = jnn.MPConv(4, (3, 3)).init(jax.random.key(1), jnp.ones((1, 8, 8, 512)))["params"]["kernel"]
    np.testing.assert_allclose(jnp.linalg.norm(F.mp_weight(conv).reshape(-1, 4), axis=0), 1.0, atol=2e-4)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: F.mp_weight(jnp.ones((3, 2)), 0.0), "gain"),
        (lambda: F.mp_weight(jnp.ones((3, 2)), epsilon=-1.0), "epsilon"),
        (lambda: F.mp_weight(jnp.ones(3)), "v must be a kernel of rank >= 2"),
        (lambda: F.mp_weight(jnp.ones((0, 2))), "no empty axis"),
        (lambda: F.mp_sum(jnp.ones(2), jnp.ones(2), 1.5), r"t must be a number in \[0, 1\]"),
        (lambda: F.mp_concat(jnp.ones((2, 2)), jnp.ones(2)), "same rank"),
        (lambda: F.mp_concat(jnp.ones(2), jnp.ones(2), axis=1), "axis must be an int"),
        (lambda: F.mp_concat(jnp.ones((4, 0)), jnp.ones((4, 8))), "both have elements along axis 1"),
        (lambda: jnnx.MPDense(3, 2, gain=-1.0, rngs=nnx.Rngs(0)), "gain"),
        (lambda: jnn.MPDense(2, gain=-1.0).init(jax.random.key(0), jnp.ones((1, 3))), "gain"),
    ],
)
def test_bad_arguments_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("conv", [False, True])
def test_linen_and_nnx_layers_agree_and_compute_x_at_mp_weight(conv):
    x = jax.random.normal(jax.random.key(3), (2, 5, 5, 3) if conv else (4, 3))
    if conv:
        linen = jnn.MPConv(6, (3, 3), gain=1.5)
        twin = jnnx.MPConv(3, 6, (3, 3), gain=1.5, rngs=nnx.Rngs(0))
    else:
        linen, twin = jnn.MPDense(6, gain=1.5), jnnx.MPDense(3, 6, gain=1.5, rngs=nnx.Rngs(0))
    variables = linen.init(jax.random.key(4), x)
    assert set(variables["params"]) == {"kernel"}  # no bias, as EDM2's MPConv
    twin.kernel[...] = variables["params"]["kernel"]
    np.testing.assert_array_equal(linen.apply(variables, x), twin(x))
    kernel = F.mp_weight(variables["params"]["kernel"], 1.5)
    if conv:
        expected = jax.lax.conv_general_dilated(
            x, kernel, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )
    else:
        expected = x @ kernel
    np.testing.assert_allclose(linen.apply(variables, x), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("call", "message"), [
    (lambda: F.mp_concat(jnp.ones(2, jnp.int32), jnp.ones(2, jnp.int32)), "a must have a floating dtype"),
    (lambda: F.mp_concat([1.0, 2.0], jnp.ones(2)), "a must be an array"),
    (lambda: jnnx.NormPropDense(3, 2, activation="no", rngs=nnx.Rngs(0)), "activation must be True or False"),
    (lambda: jnn.NormPropDense(2, activation="False").init(jax.random.key(0), jnp.ones((1, 3))),
     "activation must be True or False"),
])
def test_bad_argument_types_are_named(call, message):
    """Accepted before: integer / bool inputs to ``mp_concat`` came out as floats, and ``activation="no"``
    switched NormProp's normalized ReLU on."""
    with pytest.raises(TypeError, match=message):
        call()


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("entry", [1e37, 1e38, 1.5e38])
def test_mp_weight_of_a_unit_near_the_largest_float(dtype, entry):
    """Units of norm ``2 * entry``: ``mp_weight(v, gain=1, epsilon=0)`` is 0.5 everywhere and
    ``mp_normalize`` 1.0 (float64: ``v / ||v||``). The quotient by a per-unit scale >= 2^126 was a product
    by its reciprocal, flushed to zero: the whole kernel came out 0 from norms of 1e38 on."""
    v = jnp.full((4, 2), entry, dtype)
    np.testing.assert_allclose(np.asarray(F.mp_weight(v, 1.0, epsilon=0.0), np.float64), 0.5, rtol=1e-2)
    np.testing.assert_allclose(np.asarray(F.mp_normalize(v, epsilon=0.0), np.float64), 1.0, rtol=1e-2)
    jitted = jax.jit(lambda v: F.mp_weight(v, 1.0, epsilon=0.0))(v)
    np.testing.assert_allclose(np.asarray(jitted, np.float64), 0.5, rtol=1e-2)


def test_zero_unit_at_epsilon_zero_is_zero_with_a_zero_gradient():
    """``epsilon=0`` (accepted, and in the docs): a zero unit maps to 0, as in ``weight_norm``, and its
    kernel gradient is 0 (``0 / 0``: NaN before)."""
    v = jnp.asarray([[1.0, 0.0], [2.0, 0.0], [2.0, 0.0]])
    for fn in (lambda v: F.mp_weight(v, epsilon=0.0), lambda v: F.mp_normalize(v, epsilon=0.0)):
        np.testing.assert_array_equal(np.asarray(fn(v))[:, 1], 0.0)
        grad = jax.grad(lambda v, fn=fn: jnp.sum(fn(v) * jnp.arange(6.0).reshape(3, 2)))(v)
        assert np.all(np.isfinite(grad)) and np.all(np.asarray(grad)[:, 1] == 0)


@pytest.mark.parametrize("fn", ["mp_silu", "normprop_relu"])
def test_bfloat16_activations_are_rounded_once(fn):
    """bfloat16 input: the float32 result rounded once to bfloat16 (the constants were rounded to bfloat16
    first: ``mp_silu(1.0)`` one bfloat16 ulp low, its second moment 0.5 % low)."""
    x = jnp.asarray(np.random.default_rng(0).normal(size=4096), jnp.bfloat16)
    got = getattr(F, fn)(x)
    want = getattr(F, fn)(x.astype(jnp.float32)).astype(jnp.bfloat16)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
