"""Weight-space functions at their edges: zero units, huge kernels, constant units, bad arguments."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxnorm.functional as F


def _finite(tree):
    return all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in jax.tree.leaves(tree))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_unit_norm_gradient_is_finite_at_a_zero_unit(dtype):
    w = jnp.zeros((4, 3), dtype).at[:, 0].set(1.0)
    grad = jax.grad(lambda w: jnp.sum(F.unit_norm(w)))(w)
    assert _finite(grad)
    np.testing.assert_array_equal(np.asarray(grad[:, 1:], np.float32), 0.0)
    np.testing.assert_allclose(np.asarray(grad[:, 0], np.float32), 0.5)


def test_projection_and_weight_norm_are_finite_at_a_zero_unit_without_epsilon():
    w = jnp.zeros((4, 3))
    for f in (
        lambda w: F.project_to_norm(w, 2.0, epsilon=0.0),
        lambda w: F.weight_norm(w, 1.0, epsilon=0.0),
        lambda w: F.bounded_weight_norm(w, 1.0, epsilon=0.0),
        lambda w: F.weight_standardization(w, epsilon=0.0),
    ):
        out, vjp = jax.vjp(f, w)
        np.testing.assert_array_equal(out, 0.0)
        assert _finite(vjp(jnp.ones_like(out)))


@pytest.mark.parametrize("magnitude", [1e19, 1e26, 3e38])
def test_unit_norm_and_projections_do_not_overflow_float32(magnitude):
    direction = np.array([[1.0, -2.0], [2.0, 0.5], [-2.0, 1.0]], np.float32)  # unit norms 3 and sqrt(5.25)
    w = jnp.asarray(direction / 3.0 * magnitude, jnp.float32)
    np.testing.assert_allclose(F.unit_norm(w), np.linalg.norm(direction, axis=0) / 3.0 * magnitude, rtol=1e-6)
    want = direction / np.linalg.norm(direction, axis=0)
    np.testing.assert_allclose(F.project_to_norm(w, 1.0), want, rtol=1e-6)
    np.testing.assert_allclose(F.weight_norm(w, 2.0), 2.0 * want, rtol=1e-6)
    assert _finite(jax.grad(lambda w: jnp.sum(F.unit_norm(w)))(w))
    assert _finite(jax.grad(lambda w: jnp.sum(F.weight_norm(w, 2.0) * direction))(w))
    ws = F.weight_standardization(w)
    centred = direction - direction.mean(0)
    np.testing.assert_allclose(ws, centred / np.sqrt(3 * centred.var(0)), rtol=1e-5)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("value", [1234.5678, -3.3e-3, 6.0e4])
def test_weight_standardization_of_a_constant_unit_is_zero(dtype, value):
    w = jnp.full((3, 3, 8, 2), value, jnp.float32).astype(dtype)
    np.testing.assert_array_equal(np.asarray(F.weight_standardization(w), np.float32), 0.0)


@pytest.mark.parametrize(
    "call,name",
    [
        (lambda w: F.unit_norm(w, epsilon=-1e-3), "epsilon"),
        (lambda w: F.project_to_norm(w, 0.0), "rho"),
        (lambda w: F.project_to_norm(w, -1.0), "rho"),
        (lambda w: F.bounded_weight_norm(w, jnp.array([1.0, 0.0])), "rho"),
        (lambda w: F.scaled_weight_norm(w, 1.0, gain=0.0), "gain"),
        (lambda w: F.scaled_weight_norm(w, 1.0, gain=-2.0), "gain"),
        (lambda w: F.weight_norm(w, 1.0, epsilon=float("nan")), "epsilon"),
        (lambda w: F.weight_standardization(w, epsilon=-1.0), "epsilon"),
        (lambda w: F.weight_standardization(w, gain=jnp.ones(3)), "gain"),
    ],
)
def test_weight_functions_reject_bad_arguments_by_name(call, name):
    with pytest.raises((ValueError, TypeError), match=name):
        call(jnp.ones((4, 2)))


def test_numpy_scalars_are_accepted():
    w = jnp.ones((4, 2))
    np.testing.assert_allclose(F.unit_norm(w, epsilon=np.float32(0.0)), 2.0)
    np.testing.assert_allclose(F.unit_norm(F.project_to_norm(w, np.float64(3.0))), 3.0, rtol=1e-6)
