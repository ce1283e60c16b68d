"""discover: the junctions of ReLU networks, and none through non-homogeneous maps."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxnorm.models
from jaxnorm.enorm import batch_stats_map, chain, discover, enorm_balance, multipliers
from jaxnorm.optim import scale_invariant_mask
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


# the largest float64 networks, and the CNN that the float32 test also runs, with the slow suite (CI
# time); the float32 test keeps the CNN and one ResNet in CI
SLOW_FLOAT64 = {"cnn", "resnet_c", "resnet_id_bn", "vgg"}


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=[pytest.mark.slow] if n in SLOW_FLOAT64 else []) for n in sorted(ARCHS)]
)
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
    rescaled = jax.tree.map(lambda w, f: w if f is None else w * f, params, m, is_leaf=lambda v: v is None)
    ref = model.apply(variables, x)
    assert rel_err(model.apply({**variables, "params": rescaled}, x), ref) < 1e-12
    balanced = enorm_balance(variables, spec, cycles=3)
    assert rel_err(model.apply(balanced, x), ref) < 1e-12
    assert (
        max(
            rel_err(a, b)
            for a, b in zip(jax.tree.leaves(balanced["params"]), jax.tree.leaves(params), strict=True)
        )
        > 1e-3
    )


@pytest.mark.parametrize("name", ["cnn", pytest.param("resnet_c", marks=pytest.mark.slow), "resnet_id"])
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
    """``train=False`` reaches the model as a Python bool (a traced bool would fail in ``not train``).
    A library model with BN (its ``use_running_average=not train``); the MLP keeps it quick."""
    model = jaxnorm.models.create("mlp", num_classes=10, depth=3, width=8)
    x = jnp.ones((2, 8, 8, 1))
    variables = model.init(jax.random.key(0), x, train=False)
    spec = discover(model.apply, variables, x, train=False)
    bound = discover(functools.partial(model.apply, train=False), variables, x)
    assert as_set(spec) == as_set(bound) and len(spec) > 0


def test_final_bn_leaves_classifier_out():
    _, variables, _, spec = build("final_bn", jnp.float32)
    assert as_set(spec) == as_set(
        chain({k: v for k, v in variables["params"].items() if k.startswith("Dense")})
    )
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


@pytest.mark.parametrize(
    ("act", "word"),
    [
        (jnp.tanh, "tanh"),
        (jax.nn.sigmoid, "logistic"),
        (jax.nn.gelu, "not positively homogeneous"),
        (jax.nn.relu6, "non-zero"),
        (jax.nn.softplus, "not positively homogeneous"),
    ],
)
def test_no_junction_through_non_homogeneous(act, word):
    model = models.MLP(act=act)
    variables, x = models.init(model, (3, 3))
    spec = discover(model.apply, variables, x)
    assert len(spec) == 0
    reasons = {tuple(p): r for p, _, r in spec.left_out}
    assert word in reasons[("Dense_0", "kernel")]
    assert "left out Dense_0/kernel" in spec.report()


def test_no_junction_through_softmax_layernorm_or_bn_normalization():
    for model, blocked in [
        (models.Softmax(), "Dense_0"),
        (models.LayerNormMLP(), "Dense_0"),
        (models.BNMLP(), "Dense_0"),
    ]:
        variables, x = models.init(model, (3, 3))
        spec = discover(model.apply, variables, x)
        producers = {tuple(e[0]) for j in spec for e in j.producers}
        assert (blocked, "kernel") not in producers
        assert (blocked, "kernel") in {tuple(p) for p, _, _ in spec.left_out}
    spec = discover(models.LayerNormMLP().apply, *models.init(models.LayerNormMLP(), (3, 3)))
    assert {tuple(e[0]) for e in spec[0].producers} == {("LayerNorm_0", "scale"), ("LayerNorm_0", "bias")}


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


# ---------------------------------------------------------------------------------------------
# bfloat16 / float8 params and casts (np.issubdtype(bfloat16, np.floating) is False).


def _stat_links(stats_map):
    return {k: tuple((s.path, s.power) for s in v) for k, v in stats_map.items()}


def test_bfloat16_params_give_the_float32_spec_mask_and_stat_links():
    """A bfloat16 copy of a BN ResNet: the same junctions, the same scale-invariant mask (train
    mode) and the same running-statistics links (eval mode) as float32. Old code: an empty spec
    and no stat links (bf16 leaves were skipped)."""
    found = {}
    for dtype in (jnp.float32, jnp.bfloat16):
        model, variables, x, spec = build("resnet_id_bn", dtype)
        train = lambda v, x, model=model: model.apply(v, x, train=True, mutable=["batch_stats"])[0]
        mask = scale_invariant_mask(train, variables, x)
        links = batch_stats_map(functools.partial(model.apply, train=False), variables, x)
        found[dtype] = (as_set(spec), jax.tree.leaves(mask), _stat_links(links))
    spec32, mask32, links32 = found[jnp.float32]
    assert len(spec32) == 6 and sum(mask32) == 10 and len(links32) == 10
    assert found[jnp.bfloat16] == found[jnp.float32]


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float8_e4m3fn])
def test_scaled_values_cast_to_a_narrow_float_keep_the_junction(dtype):
    """Mixed precision: float32 kernels cast to ``dtype`` for the matmuls (a convert_element_type
    of the scaled values). Old code: the cast to bfloat16 / float8 refuted the junction."""

    def apply(p, x):
        h = jax.nn.relu(x.astype(dtype) @ p["a"].astype(dtype))
        return (h @ p["b"].astype(dtype)).astype(jnp.float32)

    params = {"a": jnp.ones((3, 4)), "b": jnp.ones((4, 2))}
    spec = discover(apply, params, jnp.ones((2, 3)))
    assert as_set(spec) == {(frozenset({(("a",), 1, None)}), frozenset({(("b",), 0, None)}))}


# ---------------------------------------------------------------------------------------------
# Hidden layers of width 1: one unit is a junction; a broadcast of it is no unit correspondence.


def _assert_spec_keeps_function(apply, params, x, spec, seed=0):
    """float64: a random positive scaling of every junction of ``spec`` keeps ``apply``."""
    params = jax.tree.map(lambda v: jnp.asarray(v, jnp.float64), params)
    x = jnp.asarray(x, jnp.float64)
    keys = jax.random.split(jax.random.key(seed), len(spec))
    ds = []
    for k, j in zip(keys, spec, strict=True):
        e = j.producers[0]
        leaf = functools.reduce(lambda t, key: t[key], e[0], params)
        n = leaf.shape[e[1]] if len(e) < 3 else int(np.max(e[2])) + 1
        ds.append(jnp.exp(jax.random.normal(k, (n,), jnp.float64)))
    m = multipliers(params, spec, ds)
    rescaled = jax.tree.map(lambda w, f: w if f is None else w * f, params, m, is_leaf=lambda v: v is None)
    assert rel_err(apply(rescaled, x), apply(params, x)) < 1e-12
    assert (
        max(rel_err(a, b) for a, b in zip(jax.tree.leaves(rescaled), jax.tree.leaves(params), strict=True))
        > 1e-3
    )


def test_width_one_hidden_layers_are_junctions(x64):
    """An MLP 3-1-4-1-2 (biases) gives chain()'s spec; a ResNet whose first stage has one channel
    (stem, identity stream, both inner convs, the projection) gives a one-unit stream junction and
    keeps the function under any positive scaling. Old code: no junction through a width-1 layer."""
    model = models.MLP(widths=(1, 4, 1), out=2, dtype=jnp.float64)
    variables, x = models.init(model, (3, 3), 0, jnp.float64)
    spec = discover(model.apply, variables, x)
    assert as_set(spec) == as_set(chain(variables)) and len(spec) == 3
    _assert_spec_keeps_function(lambda p, x: model.apply({"params": p}, x), variables["params"], x, spec)

    def taps(p, x):  # a width-1 layer read by a convolution written as shifted matmuls
        h = jax.nn.relu(x @ p["a"])
        return jax.nn.relu(h[:-1] @ p["k"][0] + h[1:] @ p["k"][1]) @ p["c"]

    rng = np.random.default_rng(0)
    params = {k: jnp.asarray(rng.normal(size=s)) for k, s in [("a", (3, 1)), ("k", (2, 1, 4)), ("c", (4, 2))]}
    spec = discover(taps, params, x)
    assert len(spec) == 2 and (spec[0].producers, spec[0].consumers) == (((("a",), 1),), ((("k",), 1),))
    _assert_spec_keeps_function(taps, params, x, spec)

    def residual(p, x):  # an identity stream of width 1: its addend is traced back to p["b"]
        h = jax.nn.relu(x @ p["stem"])
        h = jax.nn.relu(h + jax.nn.relu(h @ p["a"]) @ p["b"])
        return h @ p["head"]

    shapes = [("stem", (3, 1)), ("a", (1, 2)), ("b", (2, 1)), ("head", (1, 2))]
    params = {k: jnp.asarray(rng.normal(size=s)) for k, s in shapes}
    spec = discover(residual, params, x)
    found = {(frozenset(e[0] for e in j.producers), frozenset(e[0] for e in j.consumers)) for j in spec}
    assert (frozenset({("stem",), ("b",)}), frozenset({("a",), ("head",)})) in found
    _assert_spec_keeps_function(residual, params, x, spec)

    model = models.ResNetId(stages=(1, 3), blocks=1, dtype=jnp.float64)
    variables, x = models.init(model, (2, 6, 6, 3), 0, jnp.float64)
    spec = discover(model.apply, variables, x)
    assert len(spec) == 4  # the 1-channel stream, its inner conv, the 3-channel stream, its inner conv
    stream = next(j for j in spec if ("stem", "kernel") in {tuple(e[0]) for e in j.producers})
    assert {tuple(e[0]) for e in stream.producers} >= {("stem", "kernel"), ("s0b0_conv2", "kernel")}
    assert {tuple(e[0]) for e in stream.consumers} == {("s0b0_conv1", "kernel"), ("proj1", "kernel")}
    _assert_spec_keeps_function(lambda p, x: model.apply({"params": p}, x), variables["params"], x, spec)


def test_a_broadcast_of_one_unit_is_no_unit_correspondence(x64):
    """A (batch, 1) activation broadcast against (batch, n): never a junction of the n units.

    - added to n units of another layer: those n units are left out (the single unit would stand
      for all of them), and the one junction found scales the whole other layer with the single
      unit, which keeps the function;
    - added to a (batch, n) input of the function: nothing can scale with it, no junction;
    - n units contracted against a (1, m) params leaf broadcast to (n, m): each kernel entry would
      consume n different units, no junction.
    """
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(4, 3)))
    z = jnp.asarray(rng.normal(size=(4, 5)))
    params = {
        name: jnp.asarray(rng.normal(size=s))
        for name, s in [("one", (3, 1)), ("many", (3, 5)), ("out", (5, 2)), ("row", (1, 2))]
    }
    relu = jax.nn.relu

    def added(p, x):
        return relu(relu(x @ p["one"]) + relu(x @ p["many"])) @ p["out"]

    spec = discover(added, params, x)
    reasons = {tuple(p): r for p, _, r in spec.left_out}
    assert "broadcast addend would need several units" in reasons[("many",)]
    assert len(spec) == 1 and spec[0].producers[0] == (("one",), 1)
    many = next(e for e in spec[0].producers if e[0] == ("many",))
    assert len(many) == 3 and not np.any(np.asarray(many[2]))  # every entry: the one unit
    _assert_spec_keeps_function(added, params, x, spec)

    def with_input(p, x, z):
        return relu(relu(x @ p["one"]) + z) @ p["out"]

    spec = discover(with_input, params, x, z)
    assert len(spec) == 0
    assert "unscaled input" in {tuple(p): r for p, _, r in spec.left_out}[("one",)]

    def broadcast_consumer(p, x):
        return relu(x @ p["many"]) @ jnp.broadcast_to(p["row"], (5, 2))

    spec = discover(broadcast_consumer, params, x)
    assert len(spec) == 0
    assert "two different units" in {tuple(p): r for p, _, r in spec.left_out}[("many",)]


def test_arrays_the_function_closes_over_are_never_taken_as_zero():
    """BN running statistics read from a closure (the NNX ``nnx.split(model, nnx.Param, ...)`` pattern)
    are 0 at init: ``x - mean`` looked like ``x - 0`` and discover returned a junction through the BN
    that held at init alone (after training the statistics, ENorm with it moved the eval-mode output
    by 0.3 of 9.3, and one lr=0 ``optim.enorm`` step the train-mode output by 6). A captured array is
    now a value that may change: that junction is left out, naming the closure."""
    from flax import nnx

    import jaxnorm

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.l0 = nnx.Linear(8, 16, rngs=rngs)
            self.bn = nnx.BatchNorm(16, rngs=rngs)
            self.l1 = nnx.Linear(16, 4, rngs=rngs)

        def __call__(self, x):
            return self.l1(nnx.relu(self.bn(self.l0(x))))

    x = jax.random.normal(jax.random.key(1), (32, 8))
    model = Net(nnx.Rngs(0))
    model.l0.kernel[...] *= 5.0  # out of balance, so a junction at l0 would move it
    model.eval()
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    spec = jaxnorm.enorm.discover(lambda p, x: nnx.merge(graphdef, p, rest)(x), params, x)
    assert all(path[0] != "l0" for junction in spec for path, _ in junction.producers)
    assert "an array the function closes over" in spec.report()
    model.train()
    model(x * 2 + 1)  # the running statistics move
    model.eval()
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    apply = lambda p: nnx.merge(graphdef, p, rest)(x)
    balanced = jaxnorm.enorm_balance(params, spec, cycles=3)
    np.testing.assert_allclose(np.asarray(apply(balanced)), np.asarray(apply(params)), atol=1e-5)


@pytest.mark.parametrize("addend", ["scalar", "reduced"])
def test_a_scalar_or_reduced_addend_refutes_its_units_without_crashing(addend):
    """``f(x) + c`` with ``c`` a learnable scalar (or ``b.sum()``) broadcast into the output: the trace back
    from the sum crashed (``cannot broadcast a non-scalar to a scalar array``, f7e5cd2); now the output
    units are left out with a reason and the hidden junction is still found."""
    rng = np.random.default_rng(0)
    params = {
        "w1": jnp.asarray(rng.normal(size=(6, 5)), jnp.float32),
        "w2": jnp.asarray(4 * rng.normal(size=(5, 4)), jnp.float32),
        "c": jnp.ones(()),
        "b": jnp.ones((3,)),
    }
    offset = (lambda p: p["c"]) if addend == "scalar" else (lambda p: p["b"].sum())
    f = lambda p, x: jax.nn.relu(x @ p["w1"]) @ p["w2"] + offset(p)
    spec = discover(f, params, jnp.ones((7, 6)))
    assert [(j.producers[0][0], j.consumers[0][0]) for j in spec] == [(("w1",), ("w2",))]
    assert any("w2" in str(entry) for entry in spec.left_out)
    balanced = enorm_balance(params, spec)
    assert not np.allclose(balanced["w1"], params["w1"])
    x = jnp.asarray(rng.normal(size=(7, 6)), jnp.float32)
    np.testing.assert_allclose(f(balanced, x), f(params, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["add", "mul", "zero"])
def test_a_scalar_operand_of_a_traced_back_addend_refutes_its_units_without_crashing(x64, op):
    """``relu(x @ w1) @ w2 + (x @ w3 + c)`` (or ``c * (x @ w3)``) with ``c`` a learnable scalar: tracing
    the addend back handed the output's unit ids to the scalar whole (``cannot broadcast a non-scalar
    to a scalar array``). Now ``c`` is reduced to its shape as the forward pass reduces a scalar
    addend: several units refute (a product tries its other operand: ``w3``); one unit (a width-1
    layer) would need the scalar leaf in the spec, which has no axis: refuted with that reason. The
    ``+ 0.0`` of an absent bias (a scalar literal, on both branches) carries any units: reducing the
    ids to it refuted the junction ``(w2, w3) -> w4`` from either side."""
    rng = np.random.default_rng(0)
    relu = jax.nn.relu
    x = jnp.asarray(np.abs(rng.normal(size=(7, 6))))
    branch = {
        "add": lambda p, x: x @ p["w3"] + p["c"],
        "mul": lambda p, x: p["c"] * (x @ p["w3"]),
        "zero": lambda p, x: x @ p["w3"] + 0.0,
    }[op]
    for width in (4, 1):
        shapes = [("w1", (6, 5)), ("w2", (5, width)), ("w3", (6, width)), ("c", ()), ("w4", (width, 2))]
        # positive, so that no ReLU is dead everywhere at width 1 (the output would not depend on d)
        params = {k: jnp.asarray(np.abs(rng.normal(size=s))) for k, s in shapes}
        f = lambda p, x: relu(relu(x @ p["w1"]) @ p["w2"] + 0.0 + branch(p, x)) @ p["w4"]
        spec = discover(f, params, x)
        found = [({e[0] for e in j.producers}, {e[0] for e in j.consumers}) for j in spec]
        reasons = {tuple(p): r for p, _, r in spec.left_out}
        assert found[0] == ({("w1",)}, {("w2",)})
        if op == "add":
            assert len(spec) == 1
            assert ("scalar parameter" if width == 1 else "would need several units") in reasons[("w2",)]
        else:
            assert found[1:] == [({("w2",), ("w3",)}, {("w4",)})]
        _assert_spec_keeps_function(f, params, x, spec)
        balanced = enorm_balance(params, spec, cycles=3)
        assert rel_err(f(balanced, x), f(params, x)) < 1e-12
        assert not np.allclose(balanced["w1"], params["w1"]) and balanced["c"] == params["c"]
