"""The bare call (spec=None), NNX containers and argument validation of jaxnorm.enorm."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxnorm
from jaxnorm.enorm import chain, check, discover, enorm_balance, multipliers, objective
from tests import enorm_models as models


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


# ---------------------------------------------------------------------------------------------
# 1. The bare call: call order from the tree, ambiguity raises, check() verifies.


def test_sequential_notebook_usage():
    """The card's notebook usage: nn.Sequential([Dense, relu, ...]) params, 12 layers (the
    lexicographic key order layers_10 < layers_2 is not the call order)."""
    layers = []
    for _ in range(6):
        layers += [nn.Dense(5), nn.relu]
    model = nn.Sequential([*layers, nn.Dense(3)])
    x = jnp.asarray(np.random.default_rng(0).standard_normal((4, 3)), jnp.float32)
    params = model.init(jax.random.key(0), x)["params"]
    for tree in (params, jax.tree.map(lambda v: v, params)):  # as init built it, and key-sorted
        balanced = jaxnorm.enorm_balance(tree)
        assert check(model.apply, {"params": tree}, {"params": balanced}, x) < 1e-5
        assert rel_err(model.apply({"params": balanced}, x), model.apply({"params": params}, x)) < 1e-5


def test_setup_call_order_followed():
    """setup() names a, b; the call is b then a: the chain follows the call order (the order
    init recorded), not the names. Old code: sorted by name, output changed."""
    model = models.SetupMLP()
    _variables, x = models.init(model, (4, 5))
    params = model.init(jax.random.key(0), x)["params"]
    assert list(params) == ["b", "a", "head"]
    spec = chain(params)
    assert [j.producers[0][0][0] for j in spec] == ["b", "a"]
    balanced = enorm_balance(params, cycles=3)
    assert rel_err(model.apply({"params": balanced}, x), model.apply({"params": params}, x)) < 1e-5


def test_unrecorded_order_is_ambiguous():
    """Same-width layers whose names carry no order and whose dict is key-sorted: raise, naming
    discover (old code: took the name order silently)."""
    params = {name: {"kernel": jnp.ones((5, 5)), "bias": jnp.zeros(5)} for name in ("b", "a", "c")}
    params = jax.tree.map(lambda v: v, params)  # keys sorted: no call order recorded
    with pytest.raises(ValueError, match=r"ambiguous.*discover"):
        chain(params)
    with pytest.raises(ValueError, match="ambiguous"):
        enorm_balance(params)


def test_unrecorded_order_decided_by_shapes():
    rng = np.random.default_rng(0)
    params = {"out": {"kernel": jnp.asarray(rng.standard_normal((6, 2)))},
              "hidden": {"kernel": jnp.asarray(rng.standard_normal((3, 6)))}}
    params = jax.tree.map(lambda v: v, params)
    spec = chain(params)
    assert spec[0].producers[0][0] == ("hidden", "kernel")


def test_gelu_tanh_bare_call_caught_by_check_and_discover():
    model = models.GeluMLP()
    variables, x = models.init(model, (4, 5))
    balanced = enorm_balance(variables, cycles=2)  # documented assumption: ReLU chain
    with pytest.raises(ValueError, match=r"changed the function.*discover"):
        check(model.apply, variables, balanced, x)
    spec = discover(model.apply, variables, x)
    assert len(spec) == 0 and spec.left_out


def test_check_arguments():
    model = models.MLP()
    variables, x = models.init(model, (3, 4))
    assert check(model.apply, variables, variables, x) == 0.0
    with pytest.raises(ValueError, match="rtol"):
        check(model.apply, variables, variables, x, rtol=-1.0)


def test_not_a_chain_message():
    params = {"Dense_0": {"kernel": jnp.ones((3, 4))}, "Dense_1": {"kernel": jnp.ones((5, 2))}}
    with pytest.raises(ValueError, match=r"do not form a chain.*discover"):
        chain(params)


# ---------------------------------------------------------------------------------------------
# 2. NNX: nnx.State, its pure dict, discover through nnx.split / nnx.merge.


NNX = models.nnx_models()


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_nnx_state_bare_call(name):
    """enorm_balance(nnx.state(model, nnx.Param)) (old code: KeyError) returns an nnx.State
    computing the same function; the pure dict works too and gives the same numbers."""
    model, x = NNX[name]
    apply, params, _ = models.nnx_apply(model)
    balanced = enorm_balance(params, cycles=3)
    assert isinstance(balanced, nnx.State)
    assert jax.tree.structure(balanced) == jax.tree.structure(params)
    assert check(apply, params, balanced, x) < 1e-5
    pure = enorm_balance(nnx.to_pure_dict(params), cycles=3)
    for a, b in zip(jax.tree.leaves(pure), jax.tree.leaves(nnx.to_pure_dict(balanced)), strict=True):
        np.testing.assert_array_equal(a, b)
    assert float(objective(balanced)) < float(objective(params))
    assert len(chain(params)) == len(chain(nnx.to_pure_dict(params)))


@pytest.mark.parametrize("name", ["mlp", "cnn", "residual", "bn_cnn"])
def test_nnx_discover(name):
    """discover on an NNX model through nnx.split / nnx.merge; the spec found on the state is
    accepted by enorm_balance, objective and multipliers, on the State and on its pure dict."""
    model, x = NNX[name]
    apply, params, _ = models.nnx_apply(model)
    spec = discover(apply, params, x)
    assert len(spec) >= 1
    balanced, scales = enorm_balance(params, spec, cycles=4, return_scales=True)
    assert isinstance(balanced, nnx.State)
    assert check(apply, params, balanced, x) < 1e-5
    assert float(objective(balanced, spec)) <= float(objective(params, spec)) * (1 + 1e-6)
    factors = multipliers(params, spec, scales)
    assert isinstance(factors, nnx.State)
    pure_factors = multipliers(nnx.to_pure_dict(params), spec, scales)
    for (path, f) in jax.tree_util.tree_flatten_with_path(pure_factors)[0]:
        keys = tuple(getattr(k, "key", k) for k in path)
        leaf = nnx.to_pure_dict(params)
        for k in keys:
            leaf = leaf[k]
        want = nnx.to_pure_dict(balanced)
        for k in keys:
            want = want[k]
        np.testing.assert_allclose(leaf * f, want, rtol=1e-5, atol=1e-7)
    if name == "residual":  # identity shortcut: the stem and conv2 share one junction
        shared = [j for j in spec if len(j.producers) >= 4]
        assert shared, spec.report()


def test_nnx_linen_parity():
    """A linen MLP and the NNX MLP with the same weights balance to the same numbers."""
    model, _x = NNX["mlp"]
    _, params, _ = models.nnx_apply(model)
    pure = nnx.to_pure_dict(params)
    linen = {f"Dense_{k}": v for k, v in pure["layers"].items()}
    a = nnx.to_pure_dict(enorm_balance(params, cycles=2))
    b = enorm_balance(linen, cycles=2)
    for k in pure["layers"]:
        np.testing.assert_array_equal(a["layers"][k]["kernel"], b[f"Dense_{k}"]["kernel"])


def test_nnx_in_jit():
    model, x = NNX["mlp"]
    apply, params, _ = models.nnx_apply(model)
    balanced = jax.jit(lambda s: enorm_balance(s, cycles=2))(params)
    assert isinstance(balanced, nnx.State)
    assert check(apply, params, balanced, x) < 1e-5


# ---------------------------------------------------------------------------------------------
# 5. Validation at call time, naming the argument.


@pytest.fixture(scope="module")
def mlp():
    model = models.MLP()
    return models.init(model, (3, 4))[0]


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"cycles": 2.5}, "cycles must be an integer"),
    ({"cycles": True}, "cycles must be an integer"),
    ({"cycles": jnp.array(1.5)}, "cycles must be an integer"),
    ({"cycles": jnp.array(-2)}, "cycles must be >= 0"),
    ({"c": jnp.array(-1.0)}, "c must be > 0"),
    ({"c": np.float32(0.0)}, "c must be > 0"),
    ({"c": float("nan")}, "c must be > 0"),
    ({"c": float("inf")}, "c must be > 0"),
    ({"c": jnp.ones((3, 2))}, "c must be a real scalar"),
    ({"c": jnp.ones(7)}, "c has 7 values for the"),
    ({"c": (1.0, -1.0)}, r"c\[1\]: c must be > 0"),
    ({"c": []}, "empty sequence"),
    ({"c": True}, "c must be a number"),
    ({"c": "1"}, "c must be a real scalar"),
    ({"p": float("nan")}, "p must be > 0"),
    ({"p": True}, "p must be a static"),
    ({"p": jnp.array(2.0)}, "p must be a static"),
    ({"p": "infinite"}, "'inf'"),
    ({"return_scales": 1}, "return_scales must be True or False"),
    ({"count_biases": None}, "count_biases must be True or False"),
    ({"power_of_two": "yes"}, "power_of_two must be True or False"),
])
def test_bad_arguments_named(mlp, kwargs, match):
    with pytest.raises(ValueError, match=match):
        enorm_balance(mlp, **kwargs)


def test_traced_c_nonpositive_is_nan_not_noop(mlp):
    out = jax.jit(lambda c: enorm_balance(mlp, c=c))(jnp.float32(-1.0))
    assert np.all(np.isnan(np.asarray(out["params"]["Dense_0"]["kernel"])))


def test_traced_cycles(mlp):
    f = jax.jit(lambda n: enorm_balance(mlp, cycles=n))
    np.testing.assert_allclose(f(jnp.int32(3))["params"]["Dense_1"]["kernel"],
                               enorm_balance(mlp, cycles=3)["params"]["Dense_1"]["kernel"], rtol=1e-6)


def test_integer_params_rejected():
    """int32 params were rescaled and truncated (old code); now rejected, naming the leaf."""
    params = {"Dense_0": {"kernel": jnp.ones((3, 4), jnp.int32)},
              "Dense_1": {"kernel": jnp.ones((4, 2), jnp.int32)}}
    with pytest.raises(ValueError, match="Dense_0/kernel has dtype int32"):
        enorm_balance(params)


@pytest.mark.parametrize(("entry", "match"), [
    ((("Dense_9", "kernel"), 1), "does not exist"),
    ((("Dense_0", "kernel"), 5), "out of range"),
    ((("Dense_0",), 0), "not an array leaf"),
    ((("Dense_0", "kernel"), 1.0), "out of range"),
    (("Dense_0", 1), "path a tuple"),
])
def test_bad_spec_entries(mlp, entry, match):
    from jaxnorm.enorm import Junction

    spec = [Junction((entry,), ((("Dense_1", "kernel"), 0),))]
    with pytest.raises(ValueError, match=match):
        enorm_balance(mlp, spec)
