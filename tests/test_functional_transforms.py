"""The norms under JAX's transformations: second derivatives inside ``lax.scan`` / ``lax.fori_loop`` bodies
equal those of the direct call (which float64 finite differences confirm)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxnorm.functional as F

NORMS = {
    "layer_norm p=inf": lambda x: F.layer_norm(x, p="inf", epsilon=1e-5),
    "layer_norm axes p=inf": lambda x: F.layer_norm(x, axis=(0, 1), p="inf", epsilon=1e-5),
    "batch_norm p=inf": lambda x: F.batch_norm(x, p="inf", epsilon=1e-5),
    "group_norm p=inf": lambda x: F.group_norm(x.reshape(1, 4, 1, 6), 2, p="inf").reshape(4, 6),
    "batch_norm p=inf top-2": lambda x: F.batch_norm(x, p="inf", topk=2, epsilon=1e-5),
    "batch_norm p=1": lambda x: F.batch_norm(x, p=1, epsilon=1e-5),
    "layer_norm p=2": lambda x: F.layer_norm(x, epsilon=1e-5),
    "batch_norm p=2": lambda x: F.batch_norm(x, epsilon=1e-5),
    "group_norm p=2": lambda x: F.group_norm(x.reshape(1, 4, 1, 6), 2).reshape(4, 6),
    "instance_norm p=1": lambda x: F.instance_norm(x.reshape(1, 4, 1, 6), p=1).reshape(4, 6),
    "rms_norm axes": lambda x: F.rms_norm(x, axis=(0, 1)),
    "batch_norm p=2 epsilon=0": lambda x: F.batch_norm(x, epsilon=0.0),
}


@pytest.mark.parametrize("name", sorted(NORMS))
def test_second_derivative_inside_a_loop_body_equals_the_direct_one(x64, name):
    """Hessian-vector products (forward over reverse and reverse over reverse) of ``sum(f(x)^2 r)`` with
    ``f`` the body of a one-step ``lax.scan`` / ``lax.fori_loop`` (constant bounds: JAX lowers it to a scan
    too, the form a reverse-differentiable loop takes) equal the direct call's, in float64.
    L∞ norms passed their extremes ``stop_gradient``-ed into the ``custom_jvp`` of ``max |x - mean|``:
    inside a loop body their HVPs were off by as much as the HVP itself (13 vs an error of 11, no error
    raised); direct calls, ``jit``, ``checkpoint`` and ``vmap`` were right."""
    f = NORMS[name]
    rng = np.random.default_rng(3)
    x, r, v = (jnp.asarray(rng.standard_normal((4, 6))) for _ in range(3))
    losses = {
        "direct": lambda x: jnp.sum(f(x) ** 2 * r),
        "scan": lambda x: jnp.sum(lax.scan(lambda c, _: (f(c), None), x, None, length=1)[0] ** 2 * r),
        "fori_loop": lambda x: jnp.sum(lax.fori_loop(0, 1, lambda i, c: f(c), x) ** 2 * r),
    }
    want = jax.jvp(jax.grad(losses["direct"]), (x,), (v,))[1]
    gradient = jax.grad(losses["direct"])
    finite_difference = (gradient(x + 1e-6 * v) - gradient(x - 1e-6 * v)) / 2e-6
    np.testing.assert_allclose(want, finite_difference, atol=1e-5 * float(jnp.abs(want).max()))
    for kind, loss in losses.items():
        forward_over_reverse = jax.jvp(jax.grad(loss), (x,), (v,))[1]
        reverse_over_reverse = jax.grad(lambda x, loss=loss: jnp.vdot(jax.grad(loss)(x), v))(x)
        for got in (forward_over_reverse, reverse_over_reverse):
            scale = float(jnp.abs(want).max())
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9 * scale, err_msg=kind)
