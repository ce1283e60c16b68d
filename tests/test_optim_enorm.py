"""jaxnorm.optim.enorm: balanced params and the Eq. 10 state law for every supported optimizer."""

from __future__ import annotations

import functools
import textwrap
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from multidevice import run_on_devices

from jaxnorm.enorm import chain, enorm_balance
from jaxnorm.enorm.spec import ChainMemory
from jaxnorm.optim import enorm
from tests import enorm_models as models


@functools.cache
def setup():
    model = models.MLP(widths=(6, 5), dtype=jnp.float64)
    with jax.enable_x64(True):
        variables, x = models.init(model, (8, 3), 0, jnp.float64)
        params = variables["params"]
        y = jnp.asarray(np.random.default_rng(0).standard_normal((8, 3)))
    return model, params, x, y


def setup32():
    model, params, x, y = setup()
    cast = lambda v: jnp.asarray(np.asarray(v, np.float32))
    return model.clone(dtype=jnp.float32), jax.tree.map(cast, params), cast(x), cast(y)


def loss(model, params, x, y):
    return jnp.mean((model.apply({"params": params}, x) - y) ** 2)


OPTIMIZERS = {
    "sgd": lambda: optax.sgd(0.05),
    "momentum": lambda: optax.sgd(0.05, momentum=0.9),
    "nesterov": lambda: optax.sgd(0.05, momentum=0.9, nesterov=True),
    "adam": lambda: optax.adam(1e-2),
    "adamw": lambda: optax.adamw(1e-2, weight_decay=1e-3),
    "chain": lambda: optax.chain(optax.clip_by_global_norm(1.0), optax.scale_by_adam(), optax.scale(-1e-2)),
    "inject": lambda: optax.inject_hyperparams(optax.sgd)(learning_rate=0.05, momentum=0.9),
}


def _first_second(state):
    """(first-moment fields, second-moment fields) found in an optax state, as lists of trees."""
    first, second = [], []

    def visit(node):
        if isinstance(node, optax.TraceState):
            first.append(node.trace)
        elif isinstance(node, optax.ScaleByAdamState):
            first.append(node.mu)
            second.append(node.nu)
        elif isinstance(node, optax.InjectHyperparamsState):
            visit(node.inner_state)
        elif isinstance(node, tuple):
            for child in node:
                visit(child)

    visit(state)
    return first, second


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_eq10_state_law(name):
    """After a wrapped step: params are the balanced inner step; mu * w and nu * w^2 are what the
    unwrapped inner optimizer holds at the unbalanced params (Stock et al. 2019, Eq. 10)."""
    with jax.enable_x64(True):
        model, params, x, y = setup()
        spec = chain(params)
        inner, tx = OPTIMIZERS[name](), enorm(OPTIMIZERS[name](), spec, cycles=3)
        inner_state, state = inner.init(params), tx.init(params)
        for _ in range(3):
            grads = jax.grad(functools.partial(loss, model))(params, x, y)
            u_inner, inner_state = inner.update(grads, inner_state, params)
            stepped = optax.apply_updates(params, u_inner)
            updates, state = tx.update(grads, state, params)
            new = optax.apply_updates(params, updates)
            want = enorm_balance(stepped, spec, cycles=3)
            for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(want), strict=True):
                np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)
            f_ref, s_ref = _first_second(inner_state)
            f_got, s_got = _first_second(state.inner_state)
            assert len(f_got) == len(f_ref) and len(s_got) == len(s_ref)
            assert (len(f_got) > 0) == (name != "sgd")
            for got, ref in zip(f_got, f_ref, strict=True):
                for g, r, w_new, w_old in zip(*map(jax.tree.leaves, (got, ref, new, stepped)), strict=True):
                    np.testing.assert_allclose(g * w_new, r * w_old, rtol=1e-9, atol=1e-18)
            for got, ref in zip(s_got, s_ref, strict=True):
                for g, r, w_new, w_old in zip(*map(jax.tree.leaves, (got, ref, new, stepped)), strict=True):
                    np.testing.assert_allclose(g * w_new**2, r * w_old**2, rtol=1e-9, atol=1e-20)
            # continue the reference from the balanced point with the transformed state
            params, inner_state = new, state.inner_state


def test_balancing_changes_momentum():
    with jax.enable_x64(True):
        model, params, x, y = setup()
        tx, plain = enorm(optax.sgd(0.05, momentum=0.9), cycles=2), optax.sgd(0.05, momentum=0.9)
        grads = jax.grad(functools.partial(loss, model))(params, x, y)
        _, state = tx.update(grads, tx.init(params), params)
        _, ref = plain.update(grads, plain.init(params), params)
        diff = jax.tree.leaves(jax.tree.map(lambda a, b: jnp.max(jnp.abs(a - b)), state.inner_state, ref))
        assert max(diff) > 1e-6


def test_function_preserved_and_jit():
    model, params, x, y = setup32()
    tx = enorm(optax.adam(1e-2))
    grads = jax.grad(functools.partial(loss, model))(params, x, y)

    @jax.jit
    def step(params, state):
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    new, state = step(params, tx.init(params))
    stepped = optax.apply_updates(
        params, optax.adam(1e-2).update(grads, optax.adam(1e-2).init(params), params)[0]
    )
    np.testing.assert_allclose(
        model.apply({"params": new}, x), model.apply({"params": stepped}, x), rtol=1e-5, atol=1e-6
    )
    assert int(state.count) == 1


def test_every():
    with jax.enable_x64(True):
        model, params, x, y = setup()
        tx, plain = enorm(optax.sgd(0.05, momentum=0.9), every=2), optax.sgd(0.05, momentum=0.9)
        state, ref_state = tx.init(params), plain.init(params)
        grads = jax.grad(functools.partial(loss, model))(params, x, y)
        u, state = tx.update(grads, state, params)
        u_ref, ref_state = plain.update(grads, ref_state, params)
        for a, b in zip(jax.tree.leaves(u), jax.tree.leaves(u_ref), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12)  # step 1: no balancing
        p1 = optax.apply_updates(params, u)
        u, state = tx.update(grads, state, p1)
        p2 = optax.apply_updates(p1, u)
        stepped = optax.apply_updates(p1, plain.update(grads, ref_state, p1)[0])
        want = enorm_balance(stepped)
        for a, b in zip(jax.tree.leaves(p2), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)  # step 2: balanced


class _OddState(NamedTuple):
    acc: jax.Array


def test_unknown_state_raises_at_init():
    odd = optax.GradientTransformation(
        lambda p: _OddState(jax.tree.map(jnp.zeros_like, p)), lambda u, s, p=None: (u, s)
    )
    _, params, _, _ = setup32()
    with pytest.raises(TypeError, match="_OddState"):
        enorm(optax.chain(odd, optax.sgd(0.1))).init(params)


def test_bad_arguments():
    _, params, _, _ = setup32()
    with pytest.raises(ValueError, match="every"):
        enorm(optax.sgd(0.1), every=0)
    with pytest.raises(ValueError, match="p must be > 0"):
        enorm(optax.sgd(0.1), p=0).init(params)
    with pytest.raises(ValueError, match="c must be > 0"):
        enorm(optax.sgd(0.1), c=-1.0).init(params)
    tx = enorm(optax.sgd(0.1))
    with pytest.raises(ValueError, match="needs the params"):
        tx.update(params, tx.init(params))


_SHARDED = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np, optax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from jaxnorm.optim import enorm
    from tests import enorm_models as models
    model = models.MLP(widths=(16, 8))
    variables, x = models.init(model, (8, 3), 0)
    params = variables["params"]
    grads = jax.tree.map(lambda v: jnp.cos(v), params)
    tx = enorm(optax.sgd(0.05, momentum=0.9), cycles=2)
    step = jax.jit(lambda p, s: tx.update(grads, s, p))
    u_ref, s_ref = step(params, tx.init(params))
    mesh = Mesh(np.array(jax.devices()), ("d",))
    shard = lambda v: jax.device_put(v, NamedSharding(mesh, P(*([None] * (v.ndim - 1)), "d")
                                     if v.shape[-1] % 8 == 0 else P()))
    sharded = jax.tree.map(shard, params)
    u, s = step(sharded, tx.init(sharded))
    assert len(jax.devices()) == 8
    assert len(jax.tree.leaves(sharded)[1].sharding.device_set) == 8
    for a, b in zip(jax.tree.leaves((u, s)), jax.tree.leaves((u_ref, s_ref)), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    print("OK")
""")


def test_sharded_params_match_single_device():
    assert "OK" in run_on_devices(_SHARDED)


def _imbalanced(dtype, scale0):
    rng = np.random.default_rng(3)
    return {
        "Dense_0": {
            "kernel": jnp.asarray(rng.normal(size=(3, 5)) * scale0, dtype),
            "bias": jnp.asarray(rng.normal(size=5) * scale0, dtype),
        },
        "Dense_1": {"kernel": jnp.asarray(rng.normal(size=(5, 4)), dtype), "bias": jnp.zeros(4, dtype)},
        "Dense_2": {"kernel": jnp.asarray(rng.normal(size=(4, 2)), dtype), "bias": jnp.zeros(2, dtype)},
    }


def _forward64(params, x):
    q = jax.tree.map(lambda v: np.asarray(jnp.asarray(v, jnp.float32), np.float64), params)
    for name in ("Dense_0", "Dense_1"):
        x = np.maximum(x @ q[name]["kernel"] + q[name]["bias"], 0.0)
    return x @ q["Dense_2"]["kernel"] + q["Dense_2"]["bias"]


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_half_precision_update_lands_exactly(dtype):
    """bf16 / f16 params: applying the update gives enorm_balance(stepped) bit for bit (old code:
    the update (b - w).astype(bf16) rounded, e.g. 7 w for a scale 8)."""
    params = _imbalanced(dtype, 20.0)
    grads = jax.tree.map(lambda v: jnp.full_like(v, 0.01), params)
    tx, plain = enorm(optax.sgd(0.1)), optax.sgd(0.1)
    updates, _ = tx.update(grads, tx.init(params), params)
    stepped = optax.apply_updates(params, plain.update(grads, plain.init(params), params)[0])
    want, scales = enorm_balance(stepped, return_scales=True)
    assert all(float(jnp.max(jnp.abs(jnp.log2(s)))) <= 4 for s in scales)  # within max_scale: no box
    new = optax.apply_updates(params, updates)
    for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(want), strict=True):
        assert a.dtype == dtype
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_float32_large_rescale_lands_within_tolerance():
    """A float32 layer 1e6 times too large: unbounded, the first update b - p lands on rounding
    noise (the function moves); with the default max_scale (16 per junction per update) the
    function is kept to float32 precision and the imbalance is removed over a few updates."""
    params = _imbalanced(jnp.float32, 1e6)
    x = np.random.default_rng(4).normal(size=(6, 3))
    zeros = jax.tree.map(jnp.zeros_like, params)
    devs = {}
    for max_scale in (None, 16.0):
        tx, current = enorm(optax.sgd(0.1), max_scale=max_scale), params
        state = tx.init(current)
        for _ in range(4):
            updates, state = tx.update(zeros, state, current)
            current = optax.apply_updates(current, updates)
        devs[max_scale] = rel_err(_forward64(current, x), _forward64(params, x))
    assert devs[16.0] < 1e-5 < devs[None], devs
    assert float(jnp.max(jnp.abs(current["Dense_0"]["kernel"]))) < 1e3  # mostly balanced by now


def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


class HeadFirst(nn.Module):
    """The output layer built first (``Dense_0``) and called last: the names do not number the
    layers in call order; the params dict, inserted in call order, does."""

    @nn.compact
    def __call__(self, x):
        head, body = nn.Dense(6), nn.Dense(6)
        return head(nn.relu(body(x)))


@pytest.mark.parametrize("jit", [False, True])
def test_the_chain_of_a_call_ordered_dict_is_the_bare_balance_s(jit):
    """``optim.enorm`` reads the chain as ``enorm_balance`` does, from the dict's call order, also under
    ``jit`` (which sorts the keys): the update passed the params through ``nnx.as_pure``, which sorted
    them, and balanced the output layer into the hidden one (a 21 % change of the output at lr 0)."""
    net, x = HeadFirst(), jax.random.normal(jax.random.key(0), (10, 6))
    params = net.init(jax.random.key(1), x)["params"]
    params = {"Dense_1": {**params["Dense_1"], "kernel": params["Dense_1"]["kernel"] * 8.0},
              "Dense_0": params["Dense_0"]}
    assert list(params) == ["Dense_1", "Dense_0"]
    tx = enorm(optax.sgd(0.0))
    update = jax.jit(tx.update) if jit else tx.update
    updates, _ = update(jax.tree.map(jnp.zeros_like, params), tx.init(params), params)
    new = optax.apply_updates(params, updates)
    reference = net.apply({"params": params}, x)
    np.testing.assert_allclose(net.apply({"params": new}, x), reference, rtol=1e-5,
                               atol=1e-5 * float(jnp.abs(reference).max()))
    balanced = enorm_balance(params)
    np.testing.assert_allclose(new["Dense_1"]["kernel"], balanced["Dense_1"]["kernel"], rtol=1e-5)


def test_chain_memory_gives_sorted_params_the_call_order_seen_before():
    net, x = HeadFirst(), jnp.ones((2, 6))
    params = net.init(jax.random.key(1), x)["params"]
    ordered = {"Dense_1": params["Dense_1"], "Dense_0": params["Dense_0"]}
    rebuilt = jax.tree.map(lambda a: a, ordered)  # what jit hands a transformation: sorted keys
    assert list(rebuilt) == ["Dense_0", "Dense_1"] and chain(rebuilt) != chain(ordered)
    memory = ChainMemory()
    assert memory(rebuilt) == chain(rebuilt)  # nothing seen yet: the names' order
    assert memory(ordered) == chain(ordered)
    assert memory(rebuilt) == chain(ordered)  # the same structure: the call order seen


def test_a_junction_leaf_masked_out_by_optax_is_named():
    params = {"a": {"kernel": jnp.ones((3, 4)), "bias": jnp.zeros(4)},
              "b": {"kernel": jnp.ones((4, 2)), "bias": jnp.zeros(2)}}
    tx = optax.masked(enorm(optax.sgd(0.1)), jax.tree.map(lambda x: x.ndim == 2, params))
    with pytest.raises(ValueError, match=r"\('a', 'bias'\) .*\(got MaskedNode\): optax.masked / multi"):
        tx.init(params)
