"""Hypothesis fuzz of jaxnorm.optim's norm transforms: nested structures, dtypes (f32/bf16/f16/f64),
degenerate kernels (zero units, constant, huge, tiny) and bad arguments. Invariants: no NaN/inf, no
unit zeroed that was not zero, projected units at their target norm (to the dtype's precision),
``last_scales`` reconstructs the stepped params, and bad arguments raise naming the argument."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxnorm.optim import bwn_projection, last_scales, norm_schedule, weight_rescaling

DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]
KINDS = ["normal", "zero_unit", "constant", "huge", "tiny"]


def _kernel(rng, shape, kind, dtype):
    w = rng.normal(size=shape)
    big = {jnp.float16: 1e3, jnp.bfloat16: 1e30, jnp.float32: 1e30}[dtype]
    small = {jnp.float16: 1e-2, jnp.bfloat16: 1e-20, jnp.float32: 1e-20}[dtype]
    if kind == "zero_unit":
        w[..., 0] = 0.0
    elif kind == "constant":
        w = np.full(shape, 0.7)
    elif kind == "huge":
        w = w * big
    elif kind == "tiny":
        w = w * small
    return jnp.asarray(w, dtype)


@st.composite
def trees(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    dtype = draw(st.sampled_from(DTYPES))
    n_layers = draw(st.integers(1, 3))
    tree = {}
    for i in range(n_layers):
        rank = draw(st.sampled_from([2, 4]))
        out = draw(st.integers(1, 4))
        shape = (draw(st.integers(1, 5)), out) if rank == 2 else (2, 2, draw(st.integers(1, 3)), out)
        layer = {"kernel": _kernel(rng, shape, draw(st.sampled_from(KINDS)), dtype),
                 "bias": jnp.zeros(out, dtype)}
        tree[f"block{i}"] = {"inner": layer} if draw(st.booleans()) else layer
    return tree, dtype


def _units(w):
    w = np.asarray(jnp.asarray(w, jnp.float32), np.float64)
    return w.reshape(-1, w.shape[-1])


@pytest.mark.parametrize("name", ["wrs", "bwn", "schedule", "masked"])
@settings(max_examples=6, deadline=None)
@given(data=trees(), lr=st.sampled_from([0.0, 1e-3, 0.5]))
def test_fuzz_norm_transforms(name, data, lr):
    params, dtype = data
    kernels = jax.tree.map(lambda p: p.ndim >= 2, params)
    tx = {
        "wrs": weight_rescaling(1),
        "bwn": bwn_projection(rho=2.0),
        "schedule": norm_schedule(0.5),
        "masked": optax.masked(norm_schedule(0.5), kernels),
    }[name]
    target = {"wrs": 1.0, "bwn": 2.0, "schedule": 0.5, "masked": 0.5}[name]
    tx = optax.chain(optax.sgd(lr), tx)
    state = tx.init(params)
    grads = jax.tree.map(lambda p: jnp.ones_like(p), params)
    updates, state = tx.update(grads, state, params)
    new = optax.apply_updates(params, updates)
    scales = last_scales(state)
    eps = float(jnp.finfo(dtype).eps)
    for path, p in jax.tree_util.tree_flatten_with_path(params)[0]:
        n = _get(new, path)
        assert n.dtype == p.dtype
        assert np.all(np.isfinite(np.asarray(jnp.asarray(n, jnp.float32))))
        if p.ndim < 2:
            assert _get(scales, path) is None
            continue
        stepped = _units(p) - lr * _units(jnp.ones_like(p))
        before, after = np.linalg.norm(stepped, axis=0), np.linalg.norm(_units(n), axis=0)
        s = np.asarray(_get(scales, path), np.float64)
        moved = s != 1.0
        assert np.all(after[before > 0] > 0), "a nonzero unit was zeroed"
        np.testing.assert_allclose(after[moved], target, rtol=8 * eps * np.sqrt(stepped.shape[0]) + 1e-6)
        np.testing.assert_allclose(_units(n)[:, moved] * s[moved], stepped[:, moved],
                                   rtol=16 * eps, atol=16 * eps * np.abs(stepped).max())


def _get(tree, path):
    for key in path:
        tree = tree[key.key]
    return tree


@given(tau=st.one_of(st.integers(-5, 0), st.integers(2**31, 2**40), st.floats(allow_nan=True)))
def test_fuzz_bad_tau(tau):
    with pytest.raises(ValueError, match="tau"):
        weight_rescaling(tau)


@given(rho=st.one_of(st.floats(max_value=0.0), st.just(float("inf")), st.just(float("nan"))))
def test_fuzz_bad_rho(rho):
    with pytest.raises(ValueError, match="rho"):
        bwn_projection(rho=rho)
    with pytest.raises(ValueError, match="schedule"):
        norm_schedule(rho)
    with pytest.raises(ValueError, match="schedule"):
        norm_schedule(lambda t: rho).init({"w": jnp.ones((2, 2))})
