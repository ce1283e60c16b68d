"""discover: the junctions of ReLU networks, and none through non-homogeneous maps."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxnorm.models
from jaxnorm.enorm import chain, discover, enorm_balance, multipliers
from tests import enorm_models as models
from tests.test_enorm_balance import resnet_c_spec

ARCHS = {
    "mlp": (models.MLP, (3, 3)),
    "cnn": (models.CNN, (2, 12, 12, 2)),
    "vgg": (models.VGG, (2, 8, 8, 3)),
    "resnet_c": (models.ResNetC, (2, 8, 8, 3)),
    "resnet_id": (models.ResNetId, (2, 8, 8, 3)),
    "resnet_id_bn": (functools.partial(models.ResNetId, bn=True), (2, 8, 8, 3)),
    "concat": (models.Concat, (2, 6, 6, 2)),
    "final_bn": (functools.partial(models.MLP, final_bn=True), (3, 3)),
}


@functools.cache
def build(name, dtype):
    cls, shape = ARCHS[name]
    model = cls(dtype=dtype)
    variables, x = models.init(model, shape, 0, dtype)
    return model, variables, x, discover(model.apply, variables, x)


def as_set(spec):
    norm = lambda e: (tuple(e[0]), e[1], None if len(e) < 3 else tuple(np.ravel(e[2])))
    return {(frozenset(map(norm, j.producers)), frozenset(map(norm, j.consumers))) for j in spec}


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@pytest.mark.parametrize("name", sorted(ARCHS))
def test_discovered_spec_preserves_function_float64(x64, name):
    model, variables, x, spec = build(name, jnp.float64)
    assert len(spec) > 0
    params = variables["params"]
    # an independent random rescaling of every junction
    keys = jax.random.split(jax.random.key(1), len(spec))
    ds = []
    for k, j in zip(keys, spec, strict=True):
        e = j.producers[0]
        leaf = functools.reduce(lambda t, key: t[key], e[0], params)
        n = leaf.shape[e[1]] if len(e) < 3 else int(np.max(e[2])) + 1
        ds.append(jnp.exp(jax.random.normal(k, (n,), jnp.float64)))
    m = multipliers(params, spec, ds)
    rescaled = jax.tree.map(lambda w, f: w if f is None else w * f, params, m,
                            is_leaf=lambda v: v is None)
    ref = model.apply(variables, x)
    assert rel_err(model.apply({**variables, "params": rescaled}, x), ref) < 1e-12
    balanced = enorm_balance(variables, spec, cycles=3)
    assert rel_err(model.apply(balanced, x), ref) < 1e-12
    assert max(rel_err(a, b) for a, b in zip(jax.tree.leaves(balanced["params"]),
                                             jax.tree.leaves(params), strict=True)) > 1e-3


@pytest.mark.parametrize("name", ["cnn", "resnet_c", "resnet_id"])
def test_discovered_spec_preserves_function_float32(name):
    model, variables, x, spec = build(name, jnp.float32)
    balanced = enorm_balance(variables, spec, cycles=5)
    assert rel_err(model.apply(balanced, x), model.apply(variables, x)) < 1e-5


def test_mlp_and_vgg_match_chain():
    for name in ("mlp", "vgg"):
        _, variables, _, spec = build(name, jnp.float32)
        assert as_set(spec) == as_set(chain(variables))


def test_resnet_c_matches_hand_spec():
    _, variables, _, spec = build("resnet_c", jnp.float32)
    assert as_set(spec) == as_set(resnet_c_spec(variables["params"]))


def test_identity_residual_stream_is_one_junction_per_stage():
    _, _, _, spec = build("resnet_id", jnp.float32)
    streams = [j for j in spec if len(j.producers) > 2]
    producers = [{e[0][0] for e in j.producers} for j in streams]
    consumers = [{e[0][0] for e in j.consumers} for j in streams]
    assert {"stem", "s0b0_conv2", "s0b1_conv2"} in producers
    assert {"s0b0_conv1", "s0b1_conv1", "proj1"} in consumers
    assert {"proj1", "s1b0_conv2", "s1b1_conv2"} in producers
    assert {"s1b0_conv1", "s1b1_conv1", "head"} in consumers
    assert len(spec) == 6  # 2 streams + 4 inner junctions


def test_bn_gamma_beta_are_producers_and_bn_input_is_not():
    _, _, _, spec = build("resnet_id_bn", jnp.float32)
    producers = {tuple(e[0]) for j in spec for e in j.producers}
    assert ("s0b0_bn1", "scale") in producers and ("s0b0_bn1", "bias") in producers
    assert not any(p[0].startswith("s") and p[1] == "kernel" for p in producers)
    left = {tuple(p): r for p, _, r in spec.left_out}
    assert "unscaled input" in left[("s0b0_conv1", "kernel")]


def test_python_keyword_arguments_stay_static():
    """``train=False`` reaches the model as a Python bool (a traced bool would fail in ``not train``)."""
    model = jaxnorm.models.create("resnet18", num_classes=10, shortcut="C", width=4)
    x = jnp.ones((2, 8, 8, 3))
    variables = model.init(jax.random.key(0), x, train=False)
    spec = discover(model.apply, variables, x, train=False)
    bound = discover(functools.partial(model.apply, train=False), variables, x)
    assert as_set(spec) == as_set(bound) and len(spec) > 0


def test_final_bn_leaves_classifier_out():
    _, variables, _, spec = build("final_bn", jnp.float32)
    assert as_set(spec) == as_set(chain({k: v for k, v in variables["params"].items()
                                          if k.startswith("Dense")}))
    assert any(p == ("Dense_3", "kernel") for p, _, _ in spec.left_out)


def test_units_reaching_the_output_are_left_out_with_the_output_named():
    """The classifier's units reach the output (no consumer can compensate them); when the function
    returns a pytree, the reason names the leaf they reach."""
    model = models.MLP()
    variables, x = models.init(model, (3, 3))
    reasons = {tuple(p): r for p, _, r in discover(model.apply, variables, x).left_out}
    assert reasons[("Dense_3", "kernel")] == "the scaled units reach the function output without a consumer"
    spec = discover(lambda v, x: {"aux": jnp.sum(x), "logits": model.apply(v, x)}, variables, x)
    reasons = {tuple(p): r for p, _, r in spec.left_out}
    assert reasons[("Dense_3", "kernel")] == (
        "the scaled units reach the function output ['logits'] without a consumer"
    )


def test_concat_and_groups():
    _, _, _, spec = build("concat", jnp.float32)
    by_producer = {j.producers[0][0][0]: j for j in spec}
    cons = by_producer["Conv_1"].consumers[0]
    assert cons[0] == ("Conv_2", "kernel") and len(cons) == 3  # an index entry
    assert len(spec) == 3


@pytest.mark.parametrize(("act", "word"), [
    (jnp.tanh, "tanh"), (jax.nn.sigmoid, "logistic"), (jax.nn.gelu, "not positively homogeneous"),
    (jax.nn.relu6, "non-zero"), (jax.nn.softplus, "not positively homogeneous"),
])
def test_no_junction_through_non_homogeneous(act, word):
    model = models.MLP(act=act)
    variables, x = models.init(model, (3, 3))
    spec = discover(model.apply, variables, x)
    assert len(spec) == 0
    reasons = {tuple(p): r for p, _, r in spec.left_out}
    assert word in reasons[("Dense_0", "kernel")]
    assert "left out Dense_0/kernel" in spec.report()


def test_no_junction_through_softmax_layernorm_or_bn_normalization():
    for model, blocked in [(models.Softmax(), "Dense_0"), (models.LayerNormMLP(), "Dense_0"),
                           (models.BNMLP(), "Dense_0")]:
        variables, x = models.init(model, (3, 3))
        spec = discover(model.apply, variables, x)
        producers = {tuple(e[0]) for j in spec for e in j.producers}
        assert (blocked, "kernel") not in producers
        assert (blocked, "kernel") in {tuple(p) for p, _, _ in spec.left_out}
    spec = discover(models.LayerNormMLP().apply, *models.init(models.LayerNormMLP(), (3, 3)))
    assert {tuple(e[0]) for e in spec[0].producers} == {("LayerNorm_0", "scale"),
                                                        ("LayerNorm_0", "bias")}


class _Shared(nn.Module):
    @nn.compact
    def __call__(self, x):
        dense = nn.Dense(3)
        h = nn.relu(nn.Dense(3)(x))
        return dense(h) + dense(x)  # the consumer is also applied to unscaled x


def test_consumer_used_elsewhere_is_refused():
    variables, x = models.init(_Shared(), (2, 3))
    spec = discover(_Shared().apply, variables, x)
    assert len(spec) == 0
    reasons = {tuple(p): r for p, _, r in spec.left_out}
    assert "also used" in reasons[("Dense_1", "kernel")]  # Dense_0 is the shared layer
