"""jaxnorm.optim on Flax NNX: the same networks built with linen and with nnx, trained by the same
transforms (linen: plain optax loop on a params dict; nnx: ``nnx.Optimizer(model, tx, wrt=nnx.Param)``)
reach the same params, unit norms and recorded scales."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxnorm import optim


class LinenNet(nn.Module):
    @nn.compact
    def __call__(self, x, train=True):
        x = nn.Dense(6, use_bias=False, name="l1")(x)
        x = nn.BatchNorm(use_running_average=not train, name="bn")(x)
        return nn.Dense(3, name="l2")(jax.nn.relu(x))


class NnxNet(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(4, 6, use_bias=False, rngs=rngs)
        self.bn = nnx.BatchNorm(6, rngs=rngs)
        self.l2 = nnx.Linear(6, 3, rngs=rngs)

    def __call__(self, x):
        return self.l2(jax.nn.relu(self.bn(self.l1(x))))


X = jnp.asarray(np.random.default_rng(0).normal(size=(16, 4)), jnp.float32)
Y = jnp.asarray(np.random.default_rng(1).normal(size=(16, 3)), jnp.float32)
MASK = {"bn": {"bias": False, "scale": False}, "l1": {"kernel": True}, "l2": {"bias": False, "kernel": True}}


def _both():
    """An nnx model and linen variables holding the same weights."""
    model = NnxNet(nnx.Rngs(0))
    variables = LinenNet().init(jax.random.key(0), X)
    params = nnx.state(model, nnx.Param).to_pure_dict()
    return model, {"params": params, "batch_stats": variables["batch_stats"]}


def _linen_loss(params, batch_stats):
    out, _ = LinenNet().apply({"params": params, "batch_stats": batch_stats}, X, mutable=["batch_stats"])
    return jnp.mean((out - Y) ** 2)


def _nnx_loss(model):
    return jnp.mean((model(X) - Y) ** 2)


TRANSFORMS = {
    "wrs": lambda: optax.chain(optax.sgd(0.1), optim.weight_rescaling(2)),
    "wrs_inner": lambda: optim.weight_rescaling(1, inner=optax.adam(1e-2), rescale_state=True),
    "bwn": lambda: optax.chain(optax.sgd(0.1, momentum=0.9), optim.bwn_projection()),
    "schedule": lambda: optax.chain(optax.sgd(0.1), optim.norm_schedule(lambda t: 1.0 + 0.5 * t)),
    "masked_wrs": lambda: optax.chain(optax.sgd(0.1), optim.weight_rescaling(1, mask=MASK)),
    "record": lambda: optax.chain(optax.sgd(0.1), optim.record_norms(3)),
}


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_nnx_optimizer_matches_linen(name):
    model, variables = _both()
    tx = TRANSFORMS[name]()
    params, batch_stats = variables["params"], variables["batch_stats"]
    opt_state = tx.init(params)
    optimizer = nnx.Optimizer(model, TRANSFORMS[name](), wrt=nnx.Param)

    @nnx.jit
    def nnx_step(model, optimizer):
        optimizer.update(model, nnx.grad(_nnx_loss)(model))

    for _ in range(2):
        grads = jax.grad(_linen_loss)(params, batch_stats)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        nnx_step(model, optimizer)
    got = nnx.state(model, nnx.Param).to_pure_dict()
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(params), strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
    if name == "record":
        linen_norms = opt_state[1].norms
        nnx_norms = nnx.as_pure(optimizer.opt_state)[1].norms.to_pure_dict()
        for a, b in zip(jax.tree.leaves(nnx_norms), jax.tree.leaves(linen_norms), strict=True):
            np.testing.assert_allclose(a, b, rtol=2e-5)
        return
    scales_linen = optim.last_scales(opt_state)
    scales_nnx = optim.last_scales(optimizer.opt_state)
    assert isinstance(scales_nnx, nnx.State)
    for a, b in zip(jax.tree.leaves(scales_nnx.to_pure_dict()), jax.tree.leaves(scales_linen), strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-5)
    if name in ("wrs_inner", "masked_wrs"):
        np.testing.assert_allclose(jnp.linalg.norm(model.l1.kernel[...], axis=0), 1.0, rtol=1e-5)


def test_nnx_state_with_variables_directly():
    """tx.init / tx.update on nnx.state(model, nnx.Param) (Variables) and nnx.grad's output."""
    model = NnxNet(nnx.Rngs(0))
    params = nnx.state(model, nnx.Param)
    grads = nnx.grad(_nnx_loss)(model)
    for tx, target in ((optim.weight_rescaling(1), 1.0), (optim.bwn_projection(rho=2.0), 2.0),
                       (optim.norm_schedule(3.0), 3.0)):
        updates, _ = tx.update(grads, tx.init(params), params)
        assert jax.tree.structure(updates) == jax.tree.structure(grads)
        new = optax.apply_updates(params, updates)
        assert jax.tree.structure(new) == jax.tree.structure(params)
        np.testing.assert_allclose(jnp.linalg.norm(new["l1"]["kernel"][...], axis=0), target, rtol=1e-5)


def test_scale_invariant_mask_nnx_matches_linen():
    model, variables = _both()
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def apply_nnx(p, x):
        return nnx.merge(graphdef, p, nnx.as_pure(rest))(x)

    mask_nnx = optim.scale_invariant_mask(apply_nnx, params, X)
    mask_linen = optim.scale_invariant_mask(
        lambda v, x: LinenNet().apply(v, x, mutable=["batch_stats"])[0], variables, X)
    pure = mask_nnx.to_pure_dict() if hasattr(mask_nnx, "to_pure_dict") else mask_nnx
    assert pure == mask_linen == {**MASK, "l2": {"bias": False, "kernel": False}}
    # the mask drives WRS inside nnx.Optimizer
    optimizer = nnx.Optimizer(model, optax.chain(optax.sgd(0.1), optim.weight_rescaling(1, mask=mask_nnx)),
                              wrt=nnx.Param)
    l2_before = model.l2.kernel[...]
    optimizer.update(model, nnx.grad(_nnx_loss)(model))
    np.testing.assert_allclose(jnp.linalg.norm(model.l1.kernel[...], axis=0), 1.0, rtol=1e-5)
    assert not np.allclose(jnp.linalg.norm(model.l2.kernel[...], axis=0), 1.0)
    assert model.l2.kernel[...].shape == l2_before.shape


class LinenMlp(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = jax.nn.relu(nn.Dense(5, name="Dense_0")(x))
        return nn.Dense(3, name="Dense_1")(x)


class NnxMlp(nnx.Module):
    def __init__(self, rngs):
        self.Dense_0 = nnx.Linear(4, 5, rngs=rngs)
        self.Dense_1 = nnx.Linear(5, 3, rngs=rngs)

    def __call__(self, x):
        return self.Dense_1(jax.nn.relu(self.Dense_0(x)))


def test_enorm_in_nnx_optimizer_matches_linen():
    model = NnxMlp(nnx.Rngs(0))
    params = nnx.state(model, nnx.Param).to_pure_dict()
    tx = optim.enorm(optax.sgd(0.05, momentum=0.9))
    state = tx.init(params)
    optimizer = nnx.Optimizer(model, optim.enorm(optax.sgd(0.05, momentum=0.9)), wrt=nnx.Param)

    def linen_loss(p):
        return jnp.mean((LinenMlp().apply({"params": p}, X) - Y) ** 2)

    for _ in range(3):
        updates, state = tx.update(jax.grad(linen_loss)(params), state, params)
        params = optax.apply_updates(params, updates)
        optimizer.update(model, nnx.grad(_nnx_loss)(model))
    got = nnx.state(model, nnx.Param).to_pure_dict()
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(params), strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
