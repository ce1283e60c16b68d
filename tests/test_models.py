"""Models: registry, every norm on small models, published parameter counts, initialisations."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxnorm import models
from jaxnorm.models.norms import groups_for

KEY = jax.random.key(0)

# name -> (tiny kwargs, input shape): small enough to run eagerly in CI.
TINY = {
    "mlp": (dict(depth=2, width=16), (8, 28, 28, 1)),
    "cifar_nv": (dict(widths=(8, 8, 8)), (8, 28, 28, 3)),
    "vgg11": (dict(width_multiplier=1 / 16), (8, 32, 32, 3)),
    "vgg16": (dict(width_multiplier=1 / 16), (8, 28, 28, 1)),
    "resnet18": (dict(width=4, shortcut="C"), (8, 32, 32, 3)),
    "resnet56": (dict(width=4), (8, 16, 16, 3)),
    "wrn28_10": (dict(depth=10, widen_factor=1), (8, 16, 16, 3)),
}
NORM_OPTIONS = dict(topk=2, virtual_batch_size=4)


def n_params(tree):
    return sum(math.prod(x.shape) for x in jax.tree.leaves(tree))


def param_count(model, shape):
    """Parameter count from shapes alone (jax.eval_shape: nothing is allocated)."""
    variables = jax.eval_shape(lambda: model.init(KEY, jnp.zeros(shape), train=False))
    return n_params(variables["params"])


def run(name, norm, **kwargs):
    tiny, shape = TINY[name]
    model = models.create(name, num_classes=10, norm=norm, **{**tiny, **NORM_OPTIONS, **kwargs})
    x = jax.random.normal(jax.random.key(1), shape)
    variables = model.init(KEY, x, train=False)
    logits, updates = model.apply(variables, x, train=True, mutable=["batch_stats"])
    eval_logits = model.apply(variables, x, train=False)
    return model, variables, logits, updates, eval_logits


def abstract(name, norm, **kwargs):
    """Variables and train-mode logits as shapes only (traced, never computed)."""
    tiny, shape = TINY[name]
    model = models.create(name, num_classes=10, norm=norm, **{**tiny, **NORM_OPTIONS, **kwargs})
    x = jax.ShapeDtypeStruct(shape, jnp.float32)
    variables = jax.eval_shape(lambda x: model.init(KEY, x, train=False), x)
    logits, _ = jax.eval_shape(
        lambda v, x: model.apply(v, x, train=True, mutable=["batch_stats"]), variables, x
    )
    return variables, logits


def check_logits(logits, batch=8, classes=10):
    assert logits.shape == (batch, classes)
    assert logits.dtype == jnp.float32
    assert bool(jnp.all(jnp.isfinite(logits)))
    assert float(jnp.std(logits)) > 1e-3  # not a constant output


def test_names_and_descriptions():
    assert models.names() == tuple(sorted(TINY))
    for name in models.names():
        assert models.describe(name)


@pytest.mark.parametrize("norm", models.NORMS)
def test_every_norm_on_the_mlp(norm):
    _, variables, logits, updates, eval_logits = run("mlp", norm)
    check_logits(logits)
    check_logits(eval_logits)
    has_bn = norm in ("bn", "l1bn", "linfbn", "topk", "ghostbn", "bwn")
    assert ("batch_stats" in variables) == has_bn
    if has_bn:  # training mode moved the running averages away from their init
        before = jax.tree.leaves(variables["batch_stats"])
        after = jax.tree.leaves(updates["batch_stats"])
        assert any(not np.allclose(a, b) for a, b in zip(before, after, strict=True))


@pytest.mark.parametrize("norm", ["none", "linfbn", "gn", "swn", "bwn", "ws", "normprop"])
def test_norms_on_cifar_nv(norm):
    _, _, logits, _, eval_logits = run("cifar_nv", norm)
    check_logits(logits)
    check_logits(eval_logits)


SLOW_TO_TRACE = ("resnet56", "wrn28_10", "vgg16")
"""Deep or wide variants of blocks the other models share: BN only in the quick suite."""


def _model_norm_cases():
    """Every (model, norm) pair; those of :data:`SLOW_TO_TRACE` other than BN run with the slow suite
    (the MLP, CIFAR-NV, VGG-11 and ResNet-18 cover every norm in the quick one)."""
    return [
        pytest.param(name, norm, marks=[pytest.mark.slow] if name in SLOW_TO_TRACE and norm != "bn" else [])
        for name in sorted(TINY)
        for norm in models.NORMS
    ]


@pytest.mark.parametrize(("name", "norm"), _model_norm_cases())
def test_every_model_with_every_norm_traces(name, norm):
    variables, logits = abstract(name, norm)
    assert logits.shape == (8, 10) and logits.dtype == jnp.float32
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(variables["params"]))


@pytest.mark.parametrize(
    ("name", "norm"),
    [
        ("resnet18", "l1bn"),
        pytest.param("vgg11", "bn", marks=pytest.mark.slow),
        pytest.param("wrn28_10", "normprop", marks=pytest.mark.slow),
        pytest.param("vgg16", "gn", marks=pytest.mark.slow),
        pytest.param("resnet18", "swn", marks=pytest.mark.slow),
        pytest.param("resnet56", "bn", marks=pytest.mark.slow),
        pytest.param("resnet56", "ws", marks=pytest.mark.slow),
        pytest.param("wrn28_10", "bn", marks=pytest.mark.slow),
        pytest.param("wrn28_10", "wn", marks=pytest.mark.slow),
    ],
)
def test_deep_models_compute(name, norm):
    _, _, logits, _, eval_logits = run(name, norm)
    check_logits(logits)
    check_logits(eval_logits)


def test_imagenet_stem():
    model = models.create("resnet18", num_classes=7, norm="bn", width=2, stem="imagenet")
    x = jax.ShapeDtypeStruct((2, 64, 64, 3), jnp.float32)
    variables = jax.eval_shape(lambda x: model.init(KEY, x, train=False), x)
    assert variables["params"]["stem"]["kernel"].shape == (7, 7, 3, 2)
    logits, updates = jax.eval_shape(
        lambda v, x: model.apply(v, x, train=True, mutable=["batch_stats"]), variables, x
    )
    assert logits.shape == (2, 7)
    assert set(updates) == {"batch_stats"}


# Published parameter counts (no BN running statistics; BN scale and bias count as params).
@pytest.mark.parametrize(
    ("name", "kwargs", "shape", "classes", "expected"),
    [
        # torchvision resnet18 (He et al. 2016, Table 1: 11.7M)
        ("resnet18", dict(stem="imagenet"), (1, 224, 224, 3), 1000, 11_689_512),
        # CIFAR ResNet-18 (3x3 stem, no max-pool), 10 classes
        ("resnet18", dict(), (1, 32, 32, 3), 10, 11_173_962),
        # He et al. 2016, Table 6: ResNet-56, 0.85M
        ("resnet56", dict(), (1, 32, 32, 3), 10, 853_018),
        # Zagoruyko & Komodakis 2016, Table 4: WRN-28-10, 36.5M
        ("wrn28_10", dict(), (1, 32, 32, 3), 10, 36_479_194),
        # CIFAR VGG-16 with BN, bias-free convs, one classifier
        ("vgg16", dict(), (1, 32, 32, 3), 10, 14_724_042),
    ],
)
def test_published_parameter_counts(name, kwargs, shape, classes, expected):
    assert param_count(models.create(name, num_classes=classes, **kwargs), shape) == expected


def test_type_c_adds_a_learned_shortcut_to_every_block():
    shape = (1, 32, 32, 3)
    count_b = param_count(models.create("resnet18", num_classes=10), shape)
    count_c = param_count(models.create("resnet18", num_classes=10, shortcut="C"), shape)
    # Type C adds a 1x1 conv (c*c) + BN (2c) to the 5 blocks whose shortcut is an identity in B.
    identity_blocks = [64, 64, 128, 256, 512]
    assert count_c - count_b == sum(c * c + 2 * c for c in identity_blocks)
    variables = jax.eval_shape(
        lambda: models.create("resnet18", num_classes=10, shortcut="C", width=4).init(
            KEY, jnp.zeros(shape), train=False
        )
    )
    blocks = {k: v for k, v in variables["params"].items() if "block" in k}
    assert len(blocks) == 8 and all("shortcut" in b for b in blocks.values())


def test_resnet56_closed_form_count():
    # option A: 3x3 stem, 9 blocks per stage of two 3x3 convs + BN, classifier.
    def block(c_in, c):
        return 9 * c_in * c + 2 * c + 9 * c * c + 2 * c

    widths = (16, 32, 64)
    total = 27 * 16 + 2 * 16 + 64 * 10 + 10
    for i, c in enumerate(widths):
        c_in = widths[i - 1] if i else c
        total += block(c_in, c) + 8 * block(c, c)
    assert param_count(models.create("resnet56", num_classes=10), (1, 32, 32, 3)) == total


def test_unnormalized_models_have_plain_param_trees():
    # What ENorm reads: {layer: {"kernel", "bias"}}, nothing else.
    for name in ("mlp", "cifar_nv", "vgg11"):
        variables, _ = abstract(name, "none")
        assert set(variables) == {"params"}
        for layer in variables["params"].values():
            assert set(layer) == {"kernel", "bias"}
    variables, _ = abstract("mlp", "none")
    assert list(variables["params"]) == ["dense_0", "dense_1", "head"]


def test_enorm_balance_preserves_the_unnormalized_mlp_and_cifar_nv():
    enorm = pytest.importorskip("jaxnorm.enorm")
    for name in ("mlp", "cifar_nv"):
        model, variables, *_ = run(name, "none")
        x = jax.random.normal(jax.random.key(2), TINY[name][1])
        balanced = enorm.enorm_balance(variables, cycles=3)
        np.testing.assert_allclose(
            model.apply(balanced, x, train=False),
            model.apply(variables, x, train=False),
            rtol=2e-4,
            atol=2e-5,
        )


def test_final_bn():
    variables, _ = abstract("mlp", "none", final_bn=True)
    assert set(variables["params"]["final_bn"]) == {"scale", "bias"}
    assert "final_bn" in variables["batch_stats"]


def test_cifar_nv_official_norm_placement():
    variables, _ = abstract("cifar_nv", "bn", norm_every_conv=False)
    norms = sorted(k for k in variables["params"] if k.endswith("_norm"))
    assert norms == ["conv_2_norm", "conv_5_norm"]


def test_default_initialisations():
    # MLP: Xavier uniform, Var = 2 / (fan_in + fan_out) (Glorot & Bengio 2010; ENorm Sec. 6.1).
    mlp = models.create("mlp", num_classes=10, norm="none", depth=1, width=400)
    params = mlp.init(KEY, jnp.zeros((1, 600)), train=False)["params"]
    kernel = np.asarray(params["dense_0"]["kernel"])
    assert abs(kernel.var() / (2 / (600 + 400)) - 1) < 0.03
    assert np.abs(kernel).max() <= math.sqrt(6 / 1000)
    # ResNet: Kaiming normal, Var = 2 / fan_in (He et al. 2015a).
    net = models.create("resnet18", num_classes=10, width=64)
    shapes = jax.eval_shape(lambda: net.init(KEY, jnp.zeros((1, 8, 8, 3)), train=False))
    assert shapes["params"]["stage3_block1"]["conv2"]["kernel"].shape == (3, 3, 512, 512)
    kernel = models.norm_layers("bn").kernel_init(KEY, (3, 3, 256, 256))
    assert abs(float(kernel.var()) / (2 / (9 * 256)) - 1) < 0.02


def test_bfloat16_compute_keeps_float32_params_and_logits():
    _, variables, logits, *_ = run("cifar_nv", "bn", dtype=jnp.bfloat16)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(variables["params"]))
    assert logits.dtype == jnp.float32


def test_wrn_dropout_needs_an_rng_only_in_training():
    model = models.create("wrn28_10", num_classes=10, depth=10, widen_factor=1, dropout_rate=0.3)
    x = jax.ShapeDtypeStruct((2, 4, 4, 3), jnp.float32)
    variables = jax.eval_shape(lambda x: model.init(KEY, x, train=False), x)
    with pytest.raises(Exception, match="dropout"):
        jax.eval_shape(lambda v, x: model.apply(v, x, train=True, mutable=["batch_stats"]), variables, x)
    out, _ = jax.eval_shape(
        lambda v, x: model.apply(
            v, x, train=True, mutable=["batch_stats"], rngs={"dropout": jax.random.key(3)}
        ),
        variables,
        x,
    )
    assert out.shape == (2, 10)


def test_groups_for():
    assert groups_for(64, 32) == 32
    assert groups_for(16, 32) == 8  # at least two channels per group
    assert groups_for(500, 20) == 20
    assert groups_for(48, 32) == 24
    assert groups_for(3, 32) == 1


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: models.create("resnet50", num_classes=10), "resnet18"),
        (lambda: models.create("mlp", num_classes=10, norm="batchnorm"), "l1bn"),
        (lambda: models.create("mlp", num_classes=10, widht=3), "width"),
        (lambda: models.create("mlp", num_classes=0), "num_classes"),
        (lambda: models.create("mlp", num_classes=10, kernel_init="he"), "kaiming"),
        (lambda: models.create("mlp", num_classes=10, num_groups=0), "num_groups"),
        (lambda: models.create("mlp", num_classes=10, bn_momentum=1.0), "bn_momentum"),
        (
            lambda: models.create("mlp", num_classes=10, norm="linfbn", calibration="exactly"),
            "calibration.*'exact'",
        ),
        (lambda: models.create("mlp", num_classes=10, norm="wn", g_init="zeros"), "g_init.*'data'"),
        # silently another model before: a linear classifier, one class, one group
        (lambda: models.create("mlp", num_classes=10, depth=-1), "depth must be an int >= 0"),
        (lambda: models.create("mlp", num_classes=True), "num_classes must be a positive int"),
        (lambda: models.create("mlp", num_classes=10, num_groups=True), "num_groups"),
        (lambda: models.create("resnet18", num_classes=10, width=2.5), "width"),
        # found by the data / models fuzz of 2026-12-02: epsilon=True ran with epsilon 1, bn_momentum=False
        # with momentum 0 (running statistics = the last batch); the others raised a raw TypeError
        (lambda: models.create("mlp", num_classes=10, epsilon=True), "epsilon must be a finite number"),
        (lambda: models.create("mlp", num_classes=10, bn_momentum=False), "bn_momentum must be a number"),
        (lambda: models.create("mlp", num_classes=10, bn_momentum="0.9"), "bn_momentum must be a number"),
        (lambda: models.create("mlp", num_classes=10, epsilon=None), "epsilon must be a finite number"),
        (lambda: models.create("mlp", num_classes=10, kernel_init=["kaiming"]), "kernel_init must be one of"),
        (lambda: models.create(["mlp"], num_classes=10), "name must be one of"),
    ],
)
def test_bad_arguments_raise_clear_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(shortcut="D"), "shortcut"),
        (dict(stem="tiny"), "stem"),
    ],
)
def test_bad_resnet_options(kwargs, match):
    """Refused by ``create`` (where the model is made), not first at ``init`` (fuzz of 2026-12-02)."""
    with pytest.raises(ValueError, match=match):
        models.create("resnet18", num_classes=10, width=2, **kwargs)


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(depth=12), "depth must be 6 n \\+ 4"),
    (dict(depth=0), "depth must be 6 n \\+ 4"),
    (dict(dropout_rate="0.3"), "dropout_rate must be a number"),  # a raw "'<=' not supported" before
    (dict(dropout_rate=None), "dropout_rate must be a number"),
])
def test_bad_wrn_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        models.create("wrn28_10", num_classes=10, **kwargs)


def test_scaled_weight_norm_gains():
    """Arpit et al. (2019): gain 2 before ReLU, 1 for linear layers, 1/N ending a residual branch."""
    import flax.linen as nn

    from jaxnorm import nn as jnn

    gains = {}

    def record(next_fun, args, kwargs, context):
        module = context.module
        if isinstance(module, jnn.ScaledWeightNormConv | jnn.ScaledWeightNormDense):
            gains["/".join(module.scope.path)] = module.gain
        return next_fun(*args, **kwargs)

    model = models.create("resnet56", num_classes=10, norm="swn", width=2, shortcut="B")
    with nn.intercept_methods(record):
        jax.eval_shape(lambda: model.init(KEY, jnp.zeros((1, 8, 8, 3)), train=False))
    assert gains["stem"] == 2.0
    assert gains["stage1_block3/conv1"] == 2.0
    assert gains["stage1_block3/conv2"] == 1 / 9
    assert gains["stage1_block0/shortcut"] == 1.0
    assert gains["head"] == 1.0
    assert len(gains) == 1 + 27 * 2 + 2 + 1


def _batch_norm_calibrations(model, shape):
    """``{module path: calibration}`` of every ``jaxnorm.nn.BatchNorm`` the model builds."""
    import flax.linen as nn

    from jaxnorm import nn as jnn

    found = {}

    def record(next_fun, args, kwargs, context):
        if isinstance(context.module, jnn.BatchNorm):
            found["/".join(context.module.scope.path)] = context.module.calibration
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(record):
        jax.eval_shape(lambda: model.init(KEY, jnp.zeros(shape), train=False))
    return found


@pytest.mark.parametrize("norm", ["linfbn", "topk"])
def test_calibration_reaches_every_linf_batch_norm(norm):
    tiny, shape = TINY["cifar_nv"]
    for calibration in ("paper", "exact"):
        model = models.create(
            "cifar_nv", num_classes=10, norm=norm, calibration=calibration, **tiny, **NORM_OPTIONS
        )
        found = _batch_norm_calibrations(model, shape)
        assert len(found) == 8 and set(found.values()) == {calibration}, found
    # The two constants differ, so the train-mode outputs do (the same params).
    _, variables, paper, *_ = run("mlp", norm, calibration="paper")
    exact_model = models.create(
        "mlp", num_classes=10, norm=norm, calibration="exact", **TINY["mlp"][0], **NORM_OPTIONS
    )
    x = jax.random.normal(jax.random.key(1), TINY["mlp"][1])
    exact, _ = exact_model.apply(variables, x, train=True, mutable=["batch_stats"])
    assert not np.allclose(paper, exact, rtol=1e-3)


def test_calibration_is_ignored_by_l2_batch_norm():
    # Only L-inf statistics have a calibration constant; L2 BN keeps its (unused) default.
    model = models.create("mlp", num_classes=10, norm="bn", calibration="exact", **TINY["mlp"][0])
    found = _batch_norm_calibrations(model, TINY["mlp"][1])
    assert found and set(found.values()) == {"paper"}


def test_weight_norm_g_init_options():
    x = np.asarray(jax.random.normal(jax.random.key(1), (64, 12)) * 3.0 + 1.0, np.float64)
    inits = {}
    for g_init in ("norm", "ones", "data"):
        model = models.create("mlp", num_classes=5, norm="wn", depth=2, width=16, g_init=g_init)
        params = model.init(KEY, jnp.asarray(x, jnp.float32), train=False)["params"]
        inits[g_init] = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    for g_init, params in inits.items():
        assert set(params) == {"dense_0", "dense_1", "head"}
        for layer in params.values():
            v_norm = np.linalg.norm(layer["kernel"], axis=0)
            if g_init == "norm":  # g = ||v||: W = v, the plain layer
                np.testing.assert_allclose(layer["scale"], v_norm, rtol=1e-6)
            elif g_init == "ones":
                np.testing.assert_array_equal(layer["scale"], 1.0)
    # "data" (Salimans & Kingma Sec. 3): every layer's pre-activations on the init batch have
    # zero mean and unit variance per unit, recomputed here in float64 from the params.
    h = x
    for name in ("dense_0", "dense_1", "head"):
        layer = inits["data"][name]
        w = layer["scale"] * layer["kernel"] / np.linalg.norm(layer["kernel"], axis=0)
        pre = h @ w + layer["bias"]
        np.testing.assert_allclose(pre.mean(0), 0.0, atol=1e-4)
        np.testing.assert_allclose(pre.var(0), 1.0, rtol=1e-3)
        h = np.maximum(pre, 0.0)


def test_mp_resnet_has_no_relu_at_the_residual_join():
    """``norm="mp"``: no ReLU anywhere, the residual join included (it was ``nn.relu(y + x)``: 40 % of
    block outputs exactly 0, none negative); the join is EDM2's linear ``mp_sum``, its MP-SiLU at the
    start of the next branch."""
    x = jax.random.normal(jax.random.key(1), (8, 16, 16, 3))
    model = models.create("resnet18", num_classes=10, norm="mp", width=8)
    variables = model.init(jax.random.key(0), x, train=False)
    _, captured = model.apply(
        variables, x, train=False, mutable=["intermediates"], capture_intermediates=True
    )
    block = np.asarray(captured["intermediates"]["stage0_block0"]["__call__"][0])
    assert block.min() < -0.1 and np.mean(block == 0) < 0.01
    np.testing.assert_array_equal(models.create("mlp", num_classes=np.int64(10)).num_classes, 10)


@pytest.mark.parametrize(("name", "kwargs"), [("resnet56", {}), ("wrn28_10", {"widen_factor": 1})])
def test_magnitude_preserving_resnets_keep_their_scale_at_init(name, kwargs):
    """``norm="mp"``: EDM2's blocks (mp_sum joins, the stream linear), so unit-variance input gives logits
    of order 1 and an SGD step stays finite. With a plain ``y + x`` and MP-SiLU after each join the
    residual stream grew x2.5 per block: ResNet-56 logits RMS 1.3e10 at init, NaN after one step."""
    x = jax.random.normal(jax.random.key(1), (8, 32, 32, 3))
    model = models.create(name, num_classes=10, norm="mp", **kwargs)
    # jitted: op by op, ResNet-56's init, apply and gradient took twice as long as compiling them
    variables = jax.jit(lambda key: model.init(key, x, train=False))(jax.random.key(0))
    logits = jax.jit(lambda v: model.apply(v, x, train=False))(variables)
    assert float(jnp.sqrt(jnp.mean(logits**2))) < 10
    labels = jnp.arange(8) % 10

    def loss(params):
        out = model.apply({**variables, "params": params}, x, train=True)
        return optax.softmax_cross_entropy_with_integer_labels(out, labels).mean()

    @jax.jit
    def loss_after_a_step(params):
        stepped = jax.tree.map(lambda p, g: p - 0.1 * g, params, jax.grad(loss)(params))
        return loss(stepped)

    assert np.isfinite(float(loss_after_a_step(variables["params"])))


@pytest.mark.parametrize(("name", "kwargs"), [("resnet56", {}), ("vgg16", {"width_multiplier": 0.25})])
def test_weight_norm_data_init_on_a_constant_batch_stays_finite(name, kwargs):
    """``g_init="data"`` on ``jnp.zeros`` (the usual init idiom): units with constant pre-activations
    take ``g = 1`` instead of ``1 / sqrt(epsilon)`` (ResNet-56 gave NaN logits, VGG-16 1e33)."""
    x = jax.random.normal(jax.random.key(1), (8, 32, 32, 3))
    model = models.create(name, num_classes=10, norm="wn", g_init="data", **kwargs)
    variables = model.init(jax.random.key(0), jnp.zeros_like(x), train=False)
    logits = model.apply(variables, x, train=False)
    assert bool(jnp.all(jnp.isfinite(logits))) and float(jnp.max(jnp.abs(logits))) < 1e3


@pytest.mark.parametrize(
    ("name", "kwargs", "message"),
    [
        ("cifar_nv", {"widths": (True, 4, 4)}, "widths must be a positive int, got True"),
        ("cifar_nv", {"widths": (0, 4, 4)}, "widths must be a positive int, got 0"),
        ("cifar_nv", {"widths": (4, 4)}, r"widths must be 3 positive ints, got \(4, 4\)"),
        ("mlp", {"final_bn": "no"}, "final_bn must be a bool, got 'no'"),
        ("cifar_nv", {"norm_every_conv": "False"}, "norm_every_conv must be a bool, got 'False'"),
        ("vgg11", {"width_multiplier": True}, "width_multiplier must be a finite number > 0, got True"),
        ("vgg11", {"width_multiplier": float("nan")}, "width_multiplier must be a finite number > 0"),
        ("vgg11", {"width_multiplier": 0}, "width_multiplier must be a finite number > 0"),
    ],
)
def test_model_options_of_the_wrong_type_are_refused_by_name(name, kwargs, message):
    """A string for a bool option was read as True (``final_bn="no"`` added the layer), ``True`` for a
    width as 1, and ``width_multiplier=nan`` / ``widths=(0, ...)`` failed deep in the build."""
    with pytest.raises(ValueError, match=message):
        models.create(name, num_classes=10, **kwargs)
    good = {"widths": (4, 4, 4), "final_bn": np.bool_(True), "norm_every_conv": False,
            "width_multiplier": 0.25}
    option = next(iter(kwargs))
    models.create(name, num_classes=10, **{option: good[option]})  # the right type is taken


def test_mp_models_start_from_edm2s_standard_normal_kernels():
    """norm='mp' passed the models' kernel_init (kaiming) to MPDense / MPConv, whose eps = 1e-4 on the
    per-element RMS then shrank each layer (norm 0.9948 at fan-in 784) where EDM2's randn init keeps
    it at 1."""
    from jaxnorm import functional as F

    model = models.create("mlp", num_classes=10, norm="mp", depth=2, width=64)
    params = model.init(jax.random.key(0), jnp.ones((1, 28, 28, 1)), train=False)["params"]
    for name in ("dense_0", "dense_1"):
        norms = jnp.linalg.norm(F.mp_weight(params[name]["kernel"]), axis=0)
        np.testing.assert_allclose(norms, 1.0, atol=3e-4)
