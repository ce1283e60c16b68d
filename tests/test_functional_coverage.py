"""Exact L∞ calibration, float16 inputs, masked and ghost derivatives, linen's constructors vs flax.

1. Exactly calibrated L∞ statistics, ``batch_stats(p="inf", calibration="exact")``, plain, top-k and
   masked, against the float64 NumPy oracle (``oracles.batch_moments(..., calibration="exact")``).
2. float16 input: batch norm (p = 2, 1, inf), layer, group and RMS norm take float32 statistics (equal
   to the float32 computation on the same values), return float16, stay finite where float16 sums
   would overflow; the linen and NNX BatchNorm keep float32 running statistics (the documented rule:
   "running statistics stay float32 whatever dtype is", and flax's variables), with flax's output dtype.
3. ``jax.test_util.check_grads`` to second order, forward and reverse, float64, for masked L1 / L∞
   batch norm, masked group norm (p = 2, 1) and ghost batch norm (p = 2, inf), on tie-free data.
4. The linen modules' dataclass fields against flax.linen's: every flax field exists with the same
   default (the linen counterpart of test_nnx.py's ``test_constructor_is_a_superset_of_flax``), in
   flax's positional order.
5. L∞'s derivative with a masked element equal to the unmasked extreme: it gets no share of it.
"""

import dataclasses
import math

import flax.linen as fnn
import jax
import jax.numpy as jnp
import numpy as np
import oracles
import pytest
from flax import nnx
from jax.test_util import check_grads
from oracles import normal

import jaxnorm
import jaxnorm.functional as F
import jaxnorm.nn as jn
import jaxnorm.nnx as jnnx

P_VALUES = [2, 1, "inf"]
KEY = jax.random.key(0)



def _distinct(shape, seed, spread=2.0):
    """Tie-free data: a random permutation of a jittered grid on (-spread, spread).

    Neighbouring values are more than ``spread / size`` apart, so no finite-difference step of 1e-6
    moves an element past another (the L∞ argmax and the L1 kinks stay where they are)."""
    rng = np.random.default_rng(seed)
    n = math.prod(shape)
    grid = (np.arange(n) + rng.uniform(0.25, 0.75, n)) / n
    return (spread * (2 * grid - 1))[rng.permutation(n)].reshape(shape)


def _mask(shape, seed, keep=0.7):
    """A random boolean mask that keeps the first two rows (every feature has >= 2 elements)."""
    mask = np.random.default_rng(seed).random(shape) < keep
    mask[:2] = True
    return mask


# ---------------------------------------------------------------------------------------------------
# 1. Exact L∞ calibration against the float64 oracle


@pytest.mark.parametrize(("shape", "axis", "topk"), [
    ((64, 5), -1, None),  # the max
    ((64, 5), -1, 3),  # one top_k over every deviation
    ((16, 8, 8, 3), -1, 10),  # 1024 rows: the two-stage (block) top-k
    ((12, 4, 7), 1, 1),  # features in the middle; top-1 through the top-k path
])
def test_exact_linf_stats_match_oracle(x64, shape, axis, topk):
    """sigma_hat = mean of the top-k |x - mu| / E[mean of the top-k of n |N(0,1)|] (``1 / E max`` for
    the max). (Each k costs a compilation of the quadrature's betainc: ~1 s, hence few cases.)"""
    x = normal(shape, seed=61, loc=-2.0, scale=3.0)
    mean, sigma = jaxnorm.batch_stats(jnp.asarray(x), p="inf", topk=topk, axis=axis, calibration="exact")
    want_mean, want_var = oracles.batch_moments(x, "inf", axis, topk=topk, calibration="exact")
    np.testing.assert_allclose(mean, want_mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(sigma, np.sqrt(want_var), rtol=1e-10)


@pytest.mark.parametrize(("shape", "topk"), [((30, 6), None), ((16, 8, 8, 3), 3)])
def test_exact_linf_masked_stats_match_oracle(x64, shape, topk):
    """Masked: n is each feature's own count of unmasked elements (a different constant per feature)."""
    x = normal(shape, seed=62, loc=1.0, scale=2.0)
    mask = _mask(shape, seed=63, keep=0.6)
    if len(shape) == 4:
        mask[2:6] = False  # hide whole blocks of rows of the two-stage top-k
    counts = mask.reshape(-1, shape[-1]).sum(0)
    assert len(set(counts.tolist())) > 1  # the features' constants differ
    mean, sigma = F.batch_stats(
        jnp.asarray(x), p="inf", topk=topk, mask=jnp.asarray(mask), calibration="exact"
    )
    want_mean, want_var = oracles.batch_moments(x, "inf", -1, topk=topk, mask=mask, calibration="exact")
    np.testing.assert_allclose(mean, want_mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(sigma, np.sqrt(want_var), rtol=1e-10)


def test_exact_topk_with_fewer_unmasked_elements_than_k(x64):
    """3 unmasked elements, k = 5: the mean of all 3 deviations, whose expectation is E|Z| = sqrt(2/pi)
    for any n, so sigma_hat = mean|x - mu| / sqrt(2/pi). (The oracle's order-statistic sum needs k <= n.)"""
    x = normal((12, 2), seed=64)
    mask = np.zeros((12, 2), bool)
    mask[:3, 0] = True
    mask[:, 1] = True
    sigma = F.batch_stats(jnp.asarray(x), p="inf", topk=5, mask=jnp.asarray(mask), calibration="exact")[1]
    col = x[:3, 0]
    want = np.mean(np.abs(col - col.mean())) / math.sqrt(2 / math.pi)
    np.testing.assert_allclose(sigma[0], want, rtol=1e-10)
    _, want_var = oracles.batch_moments(x[:, 1:], "inf", -1, topk=5, calibration="exact")
    np.testing.assert_allclose(sigma[1], np.sqrt(want_var[0]), rtol=1e-10)


# ---------------------------------------------------------------------------------------------------
# 2. float16 input


def _f16(shape, seed, loc=20.0, scale=5.0):
    """float16 data with E[x^2] ~ 425: a sum of squares over 256 or more elements exceeds float16's
    largest finite value, 65504, so statistics accumulated in float16 would not be finite."""
    return jnp.asarray(normal(shape, seed=seed, loc=loc, scale=scale), jnp.float16)


def _assert_float16_rounding_of(y16, y32):
    """``y16`` is float16, finite, and ``y32`` rounded to float16 (to 1 ulp: rtol 2^-10)."""
    assert y16.dtype == jnp.float16
    assert bool(jnp.all(jnp.isfinite(y16)))
    np.testing.assert_allclose(np.asarray(y16, np.float32), np.asarray(y32), rtol=2**-10, atol=1e-6)


@pytest.mark.parametrize("p", P_VALUES)
def test_float16_batch_norm_has_float32_statistics(p):
    x = _f16((64, 4, 4, 8), seed=71)
    x32 = x.astype(jnp.float32)
    got, want = F.batch_moments(x, p=p), F.batch_moments(x32, p=p)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == jnp.float32
        np.testing.assert_allclose(g, w, rtol=1e-6)
    _assert_float16_rounding_of(F.batch_norm(x, p=p), F.batch_norm(x32, p=p))


@pytest.mark.parametrize("p", P_VALUES)
def test_float16_layer_and_group_norm_have_float32_statistics(p):
    x = _f16((4, 16, 16, 8), seed=72)  # rows of 8; 2048 elements per example, 1024 per group
    x32 = x.astype(jnp.float32)
    for norm in (
        lambda x: F.layer_norm(x, p=p),  # last axis: the fused two-pass path for p = 2
        lambda x: F.layer_norm(x, p=p, axis=(1, 2, 3)),
        lambda x: F.group_norm(x, 2, p=p),
    ):
        _assert_float16_rounding_of(norm(x), norm(x32))


def test_float16_rms_norm_has_float32_statistics():
    """Values ~300: the mean square (~9e4) exceeds float16's largest finite value, 65504."""
    x = _f16((4, 16, 16, 8), seed=73, loc=300.0, scale=50.0)
    x32 = x.astype(jnp.float32)
    scale = jnp.asarray(normal((8,), seed=74, loc=1.0, scale=0.2), jnp.float32)
    mask = jnp.asarray(_mask((4, 16, 16, 8), seed=75))
    for norm in (
        lambda x: F.rms_norm(x),
        lambda x: F.rms_norm(x, scale=scale),
        lambda x: F.rms_norm(x, axis=(1, 2, 3)),
        lambda x: F.rms_norm(x, axis=(1, 2, 3), mask=mask),
    ):
        _assert_float16_rounding_of(norm(x), norm(x32))


@pytest.mark.parametrize("dtype", [None, jnp.float16])
@pytest.mark.parametrize("p", P_VALUES)
def test_linen_batch_norm_float16_input_keeps_float32_running_stats(p, dtype):
    """Running statistics are float32 (flax's variables) and equal the float32 batch statistics of the
    same values (momentum 0); the output dtype follows flax's rule (dtype, else x promoted with params)."""
    x = _f16((256, 8), seed=76)
    ours = jn.BatchNorm(use_running_average=False, momentum=0.0, p=p, dtype=dtype)
    theirs = fnn.BatchNorm(use_running_average=False, momentum=0.0, dtype=dtype)
    v = ours.init(KEY, x)
    y, updates = ours.apply(v, x, mutable=["batch_stats"])
    y_flax, updates_flax = theirs.apply(theirs.init(KEY, x), x, mutable=["batch_stats"])
    want = F.batch_moments(x.astype(jnp.float32), p=p)
    for name, w in zip(("mean", "var"), want, strict=True):
        assert v["batch_stats"][name].dtype == jnp.float32
        got = updates["batch_stats"][name]
        assert got.dtype == updates_flax["batch_stats"][name].dtype == jnp.float32
        np.testing.assert_allclose(got, w, rtol=1e-6)
    assert y.dtype == y_flax.dtype == (dtype or jnp.float32)
    assert bool(jnp.all(jnp.isfinite(y)))
    y_eval = ours.clone(use_running_average=True).apply({**v, **updates}, x)
    assert y_eval.dtype == y.dtype and bool(jnp.all(jnp.isfinite(y_eval)))


@pytest.mark.parametrize("dtype", [None, jnp.float16])
@pytest.mark.parametrize("p", P_VALUES)
def test_nnx_batch_norm_float16_input_keeps_float32_running_stats(p, dtype):
    """jaxnorm.nnx's documented rule: "running statistics stay float32 whatever dtype is; statistics of
    half-precision inputs are float32". With dtype=float16 the input stays float16 through
    promote_dtype, so the statistics really are taken from float16 values."""
    x = _f16((256, 8), seed=77)
    ours = jnnx.BatchNorm(8, momentum=0.0, p=p, dtype=dtype, rngs=nnx.Rngs(0))
    theirs = nnx.BatchNorm(8, momentum=0.0, dtype=dtype, rngs=nnx.Rngs(0))
    y, y_flax = ours(x), theirs(x)
    want = F.batch_moments(x.astype(jnp.float32), p=p)
    for got, flax_stat, w in zip((ours.mean[...], ours.var[...]), (theirs.mean[...], theirs.var[...]), want,
                                 strict=True):
        assert got.dtype == flax_stat.dtype == jnp.float32
        np.testing.assert_allclose(got, w, rtol=1e-6)
    assert y.dtype == y_flax.dtype == (dtype or jnp.float32)
    assert bool(jnp.all(jnp.isfinite(y)))
    y_eval = ours(x, use_running_average=True)
    assert y_eval.dtype == y.dtype and bool(jnp.all(jnp.isfinite(y_eval)))


# ---------------------------------------------------------------------------------------------------
# 3. Second-order gradient checks (float64, forward and reverse)


def _check(f, x):
    """Second order, both modes, as test_functional.py's strictest checks (jitted: half the time)."""
    check_grads(jax.jit(f), (jnp.asarray(x),), order=2, modes=["fwd", "rev"], eps=1e-6)


@pytest.mark.parametrize("p", [1, "inf"])
def test_check_grads_masked_l1_and_linf_batch_norm(x64, p):
    """Masked L1 / L∞ batch norm; in features 0 and 1 the mask hides the largest element, in feature 2
    the smallest, so the L∞ derivative must go to the extreme of the unmasked elements only."""
    x = _distinct((10, 4), seed=81)
    mask = _mask((10, 4), seed=82)
    for feature, extreme in ((0, np.argmax), (1, np.argmax), (2, np.argmin)):
        mask[extreme(x[:, feature]), feature] = False
    _check(lambda x: F.batch_norm(x, p=p, mask=jnp.asarray(mask)), x)


@pytest.mark.parametrize("p", [2, 1])
def test_check_grads_masked_group_norm(x64, p):
    x = 1.0 + _distinct((3, 5, 4), seed=86)  # 3 examples, 5 positions, 4 channels in 2 groups
    mask = np.random.default_rng(87).random((3, 5, 4)) < 0.6
    mask[:, :2] = True  # >= 2 positions in every example and channel
    _check(lambda x: F.group_norm(x, 2, p=p, mask=jnp.asarray(mask)), x)


@pytest.mark.parametrize("p", [2, "inf"])
def test_check_grads_ghost_batch_norm(x64, p):
    x = _distinct((12, 2, 3), seed=89)
    _check(lambda x: F.batch_norm(x, p=p, virtual_batch_size=4), x)


# ---------------------------------------------------------------------------------------------------
# 4. linen constructors: a superset of flax.linen's

LINEN_NAMED = ["BatchNorm", "LayerNorm", "GroupNorm", "InstanceNorm", "RMSNorm"]


def _default(field):
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def _same_default(a, b):
    if a is b:
        return True
    if callable(a) and callable(b) and not isinstance(a, type):  # initializers: same function by name
        key = lambda f: (getattr(f, "__module__", None), getattr(f, "__qualname__", None))
        return key(a) == key(b) and key(a) != (None, None)
    try:
        return bool(a == b)
    except Exception:  # an uncomparable default is not the same default
        return False


@pytest.mark.parametrize("name", LINEN_NAMED)
def test_linen_constructor_is_a_superset_of_flax(name):
    ours = {f.name: f for f in dataclasses.fields(getattr(jn, name))}
    theirs = dataclasses.fields(getattr(fnn, name))
    missing = [f.name for f in theirs if f.name not in ours]
    assert not missing, f"jaxnorm.nn.{name} lacks flax.linen's fields {missing}"
    differ = [
        (f.name, _default(ours[f.name]), _default(f))
        for f in theirs
        if not _same_default(_default(ours[f.name]), _default(f))
        or ours[f.name].init != f.init
        or ours[f.name].kw_only != f.kw_only
    ]
    assert not differ, f"jaxnorm.nn.{name} fields unlike flax.linen's (name, ours, flax): {differ}"


@pytest.mark.parametrize("name", LINEN_NAMED)
def test_linen_positional_fields_in_flax_order(name):
    """Positional construction means the same thing (``GroupNorm(8)`` is ``num_groups=8``): flax's
    constructor fields come first, in flax's order, jaxnorm's own fields after them."""
    positional = lambda cls: [f.name for f in dataclasses.fields(cls) if f.init and not f.kw_only
                              and f.name not in ("parent", "name")]
    theirs = positional(getattr(fnn, name))
    assert positional(getattr(jn, name))[: len(theirs)] == theirs


def test_linf_derivative_ignores_a_masked_element_tied_with_the_extreme(x64):
    """The tie count at the extreme takes unmasked elements only: the masked copy of the maximum gets no
    gradient, and the others get that of the statistics of the unmasked elements alone."""
    x = np.array([[5.0, 1.0], [1.0, -2.0], [2.0, 0.5], [5.0, 4.0], [0.0, 1.5]])
    mask = np.ones(x.shape, bool)
    mask[3, 0] = False  # an element equal to the column's unmasked maximum, 5.0, masked out
    sigma = lambda a: jnp.sum(F.batch_stats(a, p="inf", mask=jnp.asarray(mask))[1] * jnp.array([1.0, 2.0]))
    grad = np.asarray(jax.grad(sigma)(jnp.asarray(x)))
    assert grad[3, 0] == 0
    kept = np.delete(x[:, 0], 3)
    want = jax.grad(lambda a: F.batch_stats(a[:, None], p="inf")[1][0])(jnp.asarray(kept))
    np.testing.assert_allclose(np.delete(grad[:, 0], 3), want, rtol=1e-12)
