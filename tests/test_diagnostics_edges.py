"""Edge cases of :mod:`jaxnorm.diagnostics` found by fuzzing, each against a float64 NumPy oracle."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
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
