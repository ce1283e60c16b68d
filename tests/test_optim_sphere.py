"""sphere_projection (nGPT's and EDM2's per-unit projection after every step) against float64
re-computations: every selected unit lands at its target norm in the direction of ``p + u``, for any
unit axis, target and dtype; it is WRS with tau = 1 where they coincide."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxnorm
from jaxnorm import functional as F

OPT = jaxnorm.optim
RNG = np.random.default_rng(0)


def params_and_grads(dtype=jnp.float32):
    params = {
        "dense": jnp.asarray(RNG.normal(size=(6, 4)), dtype),
        "conv": jnp.asarray(RNG.normal(size=(3, 3, 2, 5)), dtype),
        "bias": jnp.asarray(RNG.normal(size=(4,)), dtype),
    }
    grads = jax.tree.map(lambda p: jnp.asarray(RNG.normal(size=p.shape), dtype), params)
    return params, grads


def expected(p, u, rho, unit_axis):
    """float64: rho * w_j / ||w_j|| with w = p - 0.1 g (the SGD step), units along unit_axis."""
    w = np.moveaxis(np.asarray(p, np.float64) + np.asarray(u, np.float64), unit_axis, -1)
    norms = np.sqrt((w.reshape(-1, w.shape[-1]) ** 2).sum(0))
    rho = math.sqrt(w.size // w.shape[-1]) if rho == "sqrt_fan_in" else rho
    return np.moveaxis(w * (rho / norms), -1, unit_axis)


@pytest.mark.parametrize("unit_axis", [-1, 0])
@pytest.mark.parametrize("target", [1.0, 3.5, "sqrt_fan_in"])
def test_units_land_on_the_target_sphere(target, unit_axis):
    params, grads = params_and_grads()
    tx = optax.chain(optax.sgd(0.1), OPT.sphere_projection(target, unit_axis=unit_axis))
    updates, state = tx.update(grads, tx.init(params), params)
    new = optax.apply_updates(params, updates)
    sgd = jax.tree.map(lambda g: -0.1 * g, grads)
    for name in ("dense", "conv"):
        want = expected(params[name], sgd[name], target, unit_axis)
        np.testing.assert_allclose(np.asarray(new[name]), want, rtol=2e-6, atol=2e-6, err_msg=name)
    np.testing.assert_allclose(new["bias"], params["bias"] + sgd["bias"], rtol=1e-6)  # rank 1: untouched
    assert state[1].scales["bias"] is None


def test_tau_one_weight_rescaling_is_the_unit_sphere_projection():
    params, grads = params_and_grads()
    a = optax.chain(optax.sgd(0.1, momentum=0.9), OPT.sphere_projection())
    b = optax.chain(optax.sgd(0.1, momentum=0.9), OPT.weight_rescaling(1))
    sa, sb, pa, pb = a.init(params), b.init(params), params, params
    for _ in range(3):
        ua, sa = a.update(grads, sa, pa)
        ub, sb = b.update(grads, sb, pb)
        pa, pb = optax.apply_updates(pa, ua), optax.apply_updates(pb, ub)
    for name in params:
        np.testing.assert_allclose(np.asarray(pa[name]), np.asarray(pb[name]), rtol=1e-6, atol=1e-7)
    scales_a, scales_b = OPT.last_scales(sa), OPT.last_scales(sb)
    np.testing.assert_allclose(scales_a["dense"], scales_b["dense"], rtol=1e-6)


def test_sqrt_fan_in_target_is_edm2_forced_weight_normalization():
    params, grads = params_and_grads()
    tx = optax.chain(optax.sgd(0.1), OPT.sphere_projection(OPT.SQRT_FAN_IN))
    new = optax.apply_updates(params, tx.update(grads, tx.init(params), params)[0])
    stepped = params["conv"] - 0.1 * grads["conv"]
    np.testing.assert_allclose(new["conv"], F.mp_normalize(stepped, epsilon=0.0), rtol=1e-5, atol=1e-6)


def test_schedule_target_and_non_positive_values_leave_the_step_alone():
    params, grads = params_and_grads()
    tx = optax.chain(optax.sgd(0.1), OPT.sphere_projection(lambda count: jnp.where(count == 0, 2.0, 0.0)))
    state = tx.init(params)
    updates, state = tx.update(grads, state, params)
    first = optax.apply_updates(params, updates)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(first["dense"]), axis=0), 2.0, rtol=1e-6)
    updates, state = tx.update(grads, state, first)
    second = optax.apply_updates(first, updates)
    np.testing.assert_allclose(second["dense"], first["dense"] - 0.1 * grads["dense"], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_half_precision_kernel_of_large_entries_is_not_lost(dtype):
    """Entries ~1000 projected to norm 1: the update is float32 and lands (a bf16 update would be -p)."""
    p = {"w": jnp.full((8, 3), 1000.0, dtype)}
    u = {"w": jnp.ones((8, 3), dtype)}
    tx = OPT.sphere_projection()
    new = optax.apply_updates(p, tx.update(u, tx.init(p), p)[0])
    assert new["w"].dtype == dtype
    np.testing.assert_allclose(np.linalg.norm(np.asarray(new["w"], np.float32), axis=0), 1.0, rtol=1e-2)


@pytest.mark.parametrize("scale", [0.0, 1e-30, 1e20])
def test_degenerate_units_finite(scale):
    p = {"w": jnp.full((5, 3), scale, jnp.float32)}
    u = {"w": jnp.zeros((5, 3), jnp.float32)}
    tx = OPT.sphere_projection()
    updates, state = tx.update(u, tx.init(p), p)
    new = optax.apply_updates(p, updates)
    assert bool(jnp.all(jnp.isfinite(new["w"])))
    if scale == 0.0:
        np.testing.assert_array_equal(new["w"], 0.0)  # a zero unit stays zero
        np.testing.assert_array_equal(state.scales["w"], 1.0)


def test_inside_nnx_optimizer_matches_pure_params():
    model = nnx.Embed(10, 4, rngs=nnx.Rngs(0))
    tx = optax.chain(optax.sgd(0.5), OPT.sphere_projection(unit_axis=0))  # nGPT: embedding rows
    opt = nnx.Optimizer(model, tx, wrt=nnx.Param)
    ids = jnp.arange(6)
    grads = nnx.grad(lambda m: jnp.sum(jnp.sin(m(ids))))(model)
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    updates, _ = tx.update(nnx.to_pure_dict(grads), tx.init(params), params)
    want = optax.apply_updates(params, updates)
    opt.update(model, grads)
    got = model.embedding[...]
    np.testing.assert_allclose(got, want["embedding"], rtol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(got), axis=1), 1.0, rtol=1e-5)


@pytest.mark.parametrize(
    ("build", "name"),
    [
        (lambda: OPT.sphere_projection(0.0), "target"),
        (lambda: OPT.sphere_projection(-1.0), "target"),
        (lambda: OPT.sphere_projection(float("nan")), "target"),
        (lambda: OPT.sphere_projection("fan_in"), "target"),
        (lambda: OPT.sphere_projection(unit_axis="0"), "unit_axis"),
        (lambda: OPT.sphere_projection(unit_axis=2).init({"w": jnp.ones((2, 2))}), "unit_axis"),
        (lambda: OPT.sphere_projection(mask={"v": True}).init({"w": jnp.ones((2, 2))}), "mask"),
        (lambda: OPT.sphere_projection(mask={"w": True}).init({"w": jnp.ones(3)}), "w"),
    ],
)
def test_bad_arguments_refused_by_name(build, name):
    with pytest.raises((ValueError, TypeError), match=name):
        build()


@pytest.mark.parametrize(("target", "norm"), [(0.1, 0.1), ("sqrt_fan_in", math.sqrt(6.0))])
def test_float64_kernels_land_on_the_float64_target(x64, target, norm):
    """The target norm was a float32 constant: float64 units landed 1.5e-8 off 0.1."""
    params = {"w": jnp.asarray(np.random.default_rng(0).normal(size=(6, 3)))}
    tx = jaxnorm.optim.sphere_projection(target)
    updates, _ = tx.update({"w": jnp.zeros((6, 3))}, tx.init(params), params)
    landed = np.asarray(optax.apply_updates(params, updates)["w"])
    np.testing.assert_allclose(np.linalg.norm(landed, axis=0), norm, rtol=1e-14)


@pytest.mark.parametrize("norm", [1e38, 3e38])
@pytest.mark.parametrize("name", ["sphere_projection", "weight_rescaling"])
def test_a_unit_near_the_largest_float_is_left_alone_not_zeroed(name, norm):
    """A float32 unit of norm >= 2^126 cannot land on norm 1 (entries ~1e38 leave no float32 update that
    reaches it), so it stays as the plain step leaves it, scale 1, as a unit of norm 1e37 does. Its target
    ``w / s`` was a product by the subnormal ``1 / s``, flushed to 0, and the unit "landed" on zero: it was
    zeroed for good (zero units are never projected again)."""
    p = {"k": jnp.full((4, 2), norm / 2, jnp.float32)}
    tx = (jaxnorm.optim.sphere_projection(1.0) if name == "sphere_projection"
          else jaxnorm.optim.weight_rescaling(1))
    tx = optax.chain(optax.sgd(0.1), tx)
    updates, state = tx.update({"k": jnp.zeros((4, 2))}, tx.init(p), p)
    new = optax.apply_updates(p, updates)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(new["k"], np.float64), axis=0), norm, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(jaxnorm.optim.last_scales(state)["k"]), 1.0)
