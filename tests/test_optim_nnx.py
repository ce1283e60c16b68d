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
from flax.core import FrozenDict

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
LRS = optax.piecewise_constant_schedule(0.1, {1: 0.25})  # the rate drops after the first update
MASK = {"bn": {"bias": False, "scale": False}, "l1": {"kernel": True}, "l2": {"bias": False, "kernel": True}}


def _both():
    """An nnx model and linen variables holding the same weights."""
    model = NnxNet(nnx.Rngs(0))
    variables = LinenNet().init(jax.random.key(0), X)
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
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
    "schedule_from_lr": lambda: optax.chain(
        optax.sgd(LRS, momentum=0.9), optim.norm_schedule_from_lr(LRS, mask=MASK)
    ),
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
    got = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(params), strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
    if name == "record":
        linen_norms = opt_state[1].norms
        nnx_norms = nnx.to_pure_dict(nnx.as_pure(optimizer.opt_state)[1].norms)
        for a, b in zip(jax.tree.leaves(nnx_norms), jax.tree.leaves(linen_norms), strict=True):
            np.testing.assert_allclose(a, b, rtol=2e-5)
        return
    scales_linen = optim.last_scales(opt_state)
    scales_nnx = optim.last_scales(optimizer.opt_state)
    assert isinstance(scales_nnx, nnx.State)
    for a, b in zip(
        jax.tree.leaves(nnx.to_pure_dict(scales_nnx)), jax.tree.leaves(scales_linen), strict=True
    ):
        np.testing.assert_allclose(a, b, rtol=2e-5)
    if name in ("wrs_inner", "masked_wrs"):
        np.testing.assert_allclose(jnp.linalg.norm(model.l1.kernel[...], axis=0), 1.0, rtol=1e-5)


def test_nnx_state_with_variables_directly():
    """tx.init / tx.update on nnx.state(model, nnx.Param) (Variables) and nnx.grad's output."""
    model = NnxNet(nnx.Rngs(0))
    params = nnx.state(model, nnx.Param)
    grads = nnx.grad(_nnx_loss)(model)
    for tx, target in (
        (optim.weight_rescaling(1), 1.0),
        (optim.bwn_projection(rho=2.0), 2.0),
        (optim.norm_schedule(3.0), 3.0),
    ):
        updates, _ = tx.update(grads, tx.init(params), params)
        assert jax.tree.structure(updates) == jax.tree.structure(grads)
        new = optax.apply_updates(params, updates)
        assert jax.tree.structure(new) == jax.tree.structure(params)
        np.testing.assert_allclose(jnp.linalg.norm(new["l1"]["kernel"][...], axis=0), target, rtol=1e-5)


INVARIANT = {**MASK, "l2": {"bias": False, "kernel": False}}


def _linen_apply(v, x):
    return LinenNet().apply(v, x, mutable=["batch_stats"])[0]


def _nnx_apply(model):
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    return params, lambda p, x: nnx.merge(graphdef, p, nnx.as_pure(rest))(x)


def test_scale_invariant_mask_keeps_the_container():
    """nnx.State in (with or without Variable wrappers), nnx.State of bools out (old code: a nested
    dict); a variables dict gives its params' container, a FrozenDict a FrozenDict."""
    model, variables = _both()
    params, apply = _nnx_apply(model)
    for given in (params, nnx.as_pure(params)):
        mask = optim.scale_invariant_mask(apply, given, X)
        assert isinstance(mask, nnx.State)
        assert jax.tree.structure(mask) == jax.tree.structure(nnx.as_pure(params))
        assert nnx.to_pure_dict(mask) == INVARIANT
    mask = optim.scale_invariant_mask(_linen_apply, variables, X)
    assert type(mask) is dict and mask == INVARIANT
    frozen = FrozenDict(variables)
    mask = optim.scale_invariant_mask(_linen_apply, frozen, X)
    assert isinstance(mask, FrozenDict)
    assert jax.tree.structure(mask) == jax.tree.structure(frozen["params"])
    stats = variables["batch_stats"]
    mask = optim.scale_invariant_mask(
        lambda p, x: _linen_apply({"params": p, "batch_stats": stats}, x), variables["params"], X
    )
    assert mask == INVARIANT


MASKED = {
    "wrs": lambda m: optax.chain(optax.sgd(0.1), optim.weight_rescaling(1, mask=m)),
    "wrs_inner": lambda m: optim.weight_rescaling(1, mask=m, inner=optax.adam(1e-2), rescale_state=True),
    "bwn": lambda m: optax.chain(optax.sgd(0.1, momentum=0.9), optim.bwn_projection(mask=m, rho="layer")),
    "schedule": lambda m: optax.chain(optax.sgd(0.1), optim.norm_schedule(lambda t: 1.0 + 0.5 * t, mask=m)),
    "schedule_from_lr": lambda m: optax.chain(
        optax.sgd(LRS, momentum=0.9), optim.norm_schedule_from_lr(LRS, mask=m)
    ),
    "record": lambda m: optax.chain(optim.record_norms(3, mask=m), optax.sgd(0.1)),
    "optax_masked": lambda m: optax.chain(optax.sgd(0.1), optax.masked(optim.weight_rescaling(1), m)),
}


@pytest.mark.parametrize("name", sorted(MASKED))
def test_scale_invariant_mask_drives_transforms_in_nnx_optimizer(name):
    """The nnx.State mask from scale_invariant_mask inside nnx.Optimizer gives the numbers of the
    linen run with the linen mask; only l1 (followed by BN) is touched."""
    model, variables = _both()
    params, apply = _nnx_apply(model)
    mask_nnx = optim.scale_invariant_mask(apply, params, X)
    mask_linen = optim.scale_invariant_mask(_linen_apply, variables, X)
    tx = MASKED[name](mask_linen)
    params, batch_stats = variables["params"], variables["batch_stats"]
    opt_state = tx.init(params)
    optimizer = nnx.Optimizer(model, MASKED[name](mask_nnx), wrt=nnx.Param)
    step = nnx.jit(lambda m, o: o.update(m, nnx.grad(_nnx_loss)(m)))
    for _ in range(2):
        updates, opt_state = tx.update(jax.grad(_linen_loss)(params, batch_stats), opt_state, params)
        params = optax.apply_updates(params, updates)
        step(model, optimizer)
    got = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(params), strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
    norms = jnp.linalg.norm(model.l1.kernel[...], axis=0)
    if name in ("wrs", "wrs_inner", "optax_masked"):
        np.testing.assert_allclose(norms, 1.0, rtol=1e-5)
    elif name == "schedule":
        np.testing.assert_allclose(norms, 1.5, rtol=1e-5)
    assert not np.allclose(jnp.linalg.norm(model.l2.kernel[...], axis=0), 1.0)
    if name == "record":
        recorded = nnx.as_pure(optimizer.opt_state)[0].norms
        assert isinstance(recorded, nnx.State)
        np.testing.assert_allclose(
            nnx.to_pure_dict(recorded)["l1"]["kernel"], opt_state[0].norms["l1"]["kernel"], rtol=2e-5
        )


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


def _wd_reference_run(linen: bool):
    """Three SGD steps with weight decay recording the masked kernels' unit norms: the recorded
    norms (a dict for linen, an nnx.State for nnx)."""
    tx = optax.chain(optim.record_norms(3, mask=MASK), optax.add_decayed_weights(1e-2), optax.sgd(0.2))
    model, variables = _both()
    if linen:
        params, batch_stats = variables["params"], variables["batch_stats"]
        state = tx.init(params)
        for _ in range(3):
            updates, state = tx.update(jax.grad(_linen_loss)(params, batch_stats), state, params)
            params = optax.apply_updates(params, updates)
        return state[0].norms
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    for _ in range(3):
        optimizer.update(model, nnx.grad(_nnx_loss)(model))
    return nnx.as_pure(optimizer.opt_state)[0].norms


MIMICRY = {
    "wd_mimicry": lambda ref: optax.chain(optax.sgd(0.2), optim.wd_mimicry(ref, step_decay=2e-3)),
    "reference_schedule": lambda ref: optax.chain(
        optax.sgd(0.2), optim.norm_schedule(optim.reference_schedule(ref), mask=MASK)
    ),
}


@pytest.mark.parametrize("name", sorted(MIMICRY))
def test_wd_mimicry_nnx_matches_linen(name):
    """record_norms in nnx.Optimizer records what the linen run records (an nnx.State); wd_mimicry
    and reference_schedule driven by it inside nnx.Optimizer reach the linen run's params; the
    linen (dict) recording drives the nnx run to the same numbers."""
    ref_linen, ref_nnx = _wd_reference_run(True), _wd_reference_run(False)
    assert isinstance(ref_nnx, nnx.State)
    pure_ref = nnx.to_pure_dict(ref_nnx)
    for path in (("l1", "kernel"), ("l2", "kernel")):
        np.testing.assert_allclose(pure_ref[path[0]][path[1]], ref_linen[path[0]][path[1]], rtol=2e-5)
    _, variables = _both()
    params, batch_stats = variables["params"], variables["batch_stats"]
    tx = MIMICRY[name](ref_linen)
    state = tx.init(params)
    for _ in range(4):
        updates, state = tx.update(jax.grad(_linen_loss)(params, batch_stats), state, params)
        params = optax.apply_updates(params, updates)
    for reference in (ref_nnx, ref_linen):
        model, _ = _both()
        optimizer = nnx.Optimizer(model, MIMICRY[name](reference), wrt=nnx.Param)
        step = nnx.jit(lambda m, o: o.update(m, nnx.grad(_nnx_loss)(m)))
        for _ in range(4):
            step(model, optimizer)
        got = nnx.to_pure_dict(nnx.state(model, nnx.Param))
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(params), strict=True):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)


class LinenMlp3(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = jax.nn.relu(nn.Dense(5, name="Dense_0")(x))
        x = jax.nn.relu(nn.Dense(5, name="Dense_1")(x))
        return nn.Dense(3, name="Dense_2")(x)


class NnxMlp3(nnx.Module):
    def __init__(self, rngs):
        self.Dense_0 = nnx.Linear(4, 5, rngs=rngs)
        self.Dense_1 = nnx.Linear(5, 5, rngs=rngs)
        self.Dense_2 = nnx.Linear(5, 3, rngs=rngs)

    def __call__(self, x):
        return self.Dense_2(jax.nn.relu(self.Dense_1(jax.nn.relu(self.Dense_0(x)))))


class LinenCnn(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.max_pool(jax.nn.relu(nn.Conv(4, (3, 3), name="conv1")(x)), (2, 2), strides=(2, 2))
        x = jax.nn.relu(nn.Conv(5, (3, 3), strides=(2, 2), name="conv2")(x))
        x = jax.nn.relu(nn.Dense(6, name="linear1")(x.reshape((x.shape[0], -1))))
        return nn.Dense(3, name="linear2")(x)


class NnxCnn(nnx.Module):
    def __init__(self, rngs):
        self.conv1 = nnx.Conv(2, 4, (3, 3), rngs=rngs)
        self.conv2 = nnx.Conv(4, 5, (3, 3), strides=(2, 2), rngs=rngs)
        self.linear1 = nnx.Linear(5 * 3 * 3, 6, rngs=rngs)
        self.linear2 = nnx.Linear(6, 3, rngs=rngs)

    def __call__(self, x):
        x = nnx.max_pool(jax.nn.relu(self.conv1(x)), (2, 2), strides=(2, 2))
        x = jax.nn.relu(self.conv2(x))
        x = jax.nn.relu(self.linear1(x.reshape((x.shape[0], -1))))
        return self.linear2(x)


RNG = np.random.default_rng(2)
NETS = {
    "mlp": (NnxMlp3, LinenMlp3, X, Y),
    "cnn": (
        NnxCnn,
        LinenCnn,
        jnp.asarray(RNG.normal(size=(4, 12, 12, 2)), jnp.float32),
        jnp.asarray(RNG.normal(size=(4, 3)), jnp.float32),
    ),
}
ENORM_INNER = {
    "momentum": lambda: optim.enorm(optax.sgd(0.05, momentum=0.9), cycles=2),
    "adam_every2": lambda: optim.enorm(optax.adam(1e-2), every=2),
}


def _first_moments(state):
    """The params-shaped first moments (SGD trace, Adam mu) in an optax state."""
    found = []

    def visit(node):
        if isinstance(node, optax.TraceState):
            found.append(node.trace)
        elif isinstance(node, optax.ScaleByAdamState):
            found.append(node.mu)
        elif isinstance(node, tuple):
            for child in node:
                visit(child)

    visit(state)
    return found


@pytest.mark.parametrize(("net", "inner"), [("mlp", "adam_every2"), ("cnn", "momentum"), ("mlp", "momentum")])
def test_enorm_in_nnx_optimizer_matches_linen(net, inner):
    """optim.enorm inside nnx.Optimizer(..., wrt=nnx.Param) under nnx.jit: the params and the
    rescaled optimizer moments equal the linen run's; the moments are nnx.States with the params'
    structure (old code: nested dicts, a round trip through to_pure_dict)."""
    nnx_net, linen_net, x, y = NETS[net]
    model = nnx_net(nnx.Rngs(0))
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    tx = ENORM_INNER[inner]()
    state = tx.init(params)
    optimizer = nnx.Optimizer(model, ENORM_INNER[inner](), wrt=nnx.Param)

    def linen_loss(p):
        return jnp.mean((linen_net().apply({"params": p}, x) - y) ** 2)

    step = nnx.jit(lambda m, o: o.update(m, nnx.grad(lambda m: jnp.mean((m(x) - y) ** 2))(m)))
    for _ in range(3):
        updates, state = tx.update(jax.grad(linen_loss)(params), state, params)
        params = optax.apply_updates(params, updates)
        step(model, optimizer)
    got = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(params), strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
    moments = _first_moments(nnx.as_pure(optimizer.opt_state).inner_state)
    assert moments
    for got, want in zip(moments, _first_moments(state.inner_state), strict=True):
        assert isinstance(got, nnx.State)
        assert jax.tree.structure(got) == jax.tree.structure(nnx.as_pure(nnx.state(model, nnx.Param)))
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)


def test_enorm_updates_keep_the_container():
    """tx.update on nnx.State params and grads, with and without Variable wrappers, jitted: updates of
    the grads' type and structure, params of the same type after apply_updates, the function of the
    plainly stepped params (the balancing changes nothing but the parametrisation)."""
    model = NnxMlp3(nnx.Rngs(1))
    graphdef, variables = nnx.split(model, nnx.Param)
    grads = nnx.grad(_nnx_loss)(model)
    tx, plain = optim.enorm(optax.sgd(0.1, momentum=0.9), cycles=3), optax.sgd(0.1, momentum=0.9)
    for params, g in ((variables, grads), (nnx.as_pure(variables), nnx.as_pure(grads))):
        state = tx.init(params)
        assert isinstance(state.inner_state[0].trace, nnx.State)
        updates, state = jax.jit(tx.update)(g, state, params)
        assert type(updates) is type(g) and jax.tree.structure(updates) == jax.tree.structure(g)
        assert isinstance(state.inner_state[0].trace, nnx.State)
        new = optax.apply_updates(params, updates)
        assert jax.tree.structure(new) == jax.tree.structure(params)
        stepped = optax.apply_updates(params, plain.update(g, plain.init(params), params)[0])
        out = lambda p: nnx.merge(graphdef, p)(X)
        np.testing.assert_allclose(out(new), out(stepped), rtol=1e-5, atol=1e-6)
        assert not np.allclose(
            nnx.as_pure(new)["Dense_0"]["kernel"], nnx.as_pure(stepped)["Dense_0"]["kernel"]
        )
