"""jaxnorm.nn (linen) against flax.linen for p = 2, and the jaxnorm-only behaviour of each module."""

import flax.linen as fnn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxnorm.functional as F
import jaxnorm.nn as jn
import jaxnorm.nnx as jnnx

KEY = jax.random.key(0)


def _x(shape=(16, 5, 5, 32), seed=1, loc=1.0, scale=2.0, dtype=jnp.float32):
    return (jax.random.normal(jax.random.key(seed), shape) * scale + loc).astype(dtype)


def _train_steps(module, variables, xs, **kwargs):
    ys = []
    for x in xs:
        y, updates = module.apply(variables, x, mutable=["batch_stats"], **kwargs)
        variables = {**variables, **updates}
        ys.append(y)
    return ys, variables


def _close(a, b, tol=2e-6):
    jax.tree.map(lambda u, v: np.testing.assert_allclose(u, v, rtol=tol, atol=tol), a, b)


BN_CASES = [
    {},
    {"use_fast_variance": False},
    {"momentum": 0.9, "epsilon": 1e-3},
    {"use_bias": False, "use_scale": False},
    {"axis": 1},
    {"scale_init": fnn.initializers.constant(2.0), "bias_init": fnn.initializers.constant(0.5)},
]


@pytest.mark.parametrize("kwargs", BN_CASES, ids=lambda k: ",".join(k) or "defaults")
def test_batch_norm_equals_flax(kwargs):
    ours = jn.BatchNorm(use_running_average=False, **kwargs)
    theirs = fnn.BatchNorm(use_running_average=False, **kwargs)
    xs = [_x(seed=s) for s in range(3)]
    v_ours, v_theirs = ours.init(KEY, xs[0]), theirs.init(KEY, xs[0])
    _close(v_ours, v_theirs, 0)  # same collections, names, shapes and initial values
    ys_ours, v_ours = _train_steps(ours, v_ours, xs)
    ys_theirs, v_theirs = _train_steps(theirs, v_theirs, xs)
    _close(ys_ours, ys_theirs)
    _close(v_ours["batch_stats"], v_theirs["batch_stats"])
    _close(
        ours.clone(use_running_average=True).apply(v_ours, xs[0]),
        theirs.clone(use_running_average=True).apply(v_theirs, xs[0]),
    )


def test_batch_norm_mask_equals_flax():
    x = _x((32, 8))
    mask = jax.random.bernoulli(jax.random.key(3), 0.7, x.shape)
    ours, theirs = jn.BatchNorm(use_running_average=False), fnn.BatchNorm(use_running_average=False)
    v = theirs.init(KEY, x)
    _close(
        ours.apply(v, x, mask=mask, mutable=["batch_stats"]),
        theirs.apply(v, x, mask=mask, mutable=["batch_stats"]),
    )


@pytest.mark.parametrize(
    "ours,theirs",
    [
        (jn.LayerNorm(), fnn.LayerNorm()),
        (
            jn.LayerNorm(reduction_axes=(1, 2, 3), feature_axes=-1),
            fnn.LayerNorm(reduction_axes=(1, 2, 3), feature_axes=-1),
        ),
        (jn.LayerNorm(use_bias=False, epsilon=1e-3), fnn.LayerNorm(use_bias=False, epsilon=1e-3)),
        (jn.GroupNorm(num_groups=8), fnn.GroupNorm(num_groups=8)),
        (jn.GroupNorm(num_groups=None, group_size=2), fnn.GroupNorm(num_groups=None, group_size=2)),
        (
            jn.GroupNorm(num_groups=4, reduction_axes=(2, 3)),
            fnn.GroupNorm(num_groups=4, reduction_axes=(2, 3)),
        ),
        (jn.InstanceNorm(), fnn.InstanceNorm()),
        (jn.RMSNorm(), fnn.RMSNorm()),
        (jn.RMSNorm(reduction_axes=(1, 2, 3)), fnn.RMSNorm(reduction_axes=(1, 2, 3))),
    ],
    ids=lambda m: type(m).__name__,
)
def test_per_example_norms_equal_flax(ours, theirs):
    x = _x()
    v_ours, v_theirs = ours.init(KEY, x), theirs.init(KEY, x)
    _close(v_ours, v_theirs, 0)
    _close(ours.apply(v_ours, x), theirs.apply(v_theirs, x))
    g_ours = jax.grad(lambda v: jnp.sum(jnp.sin(ours.apply(v, x))))(v_ours)
    g_theirs = jax.grad(lambda v: jnp.sum(jnp.sin(theirs.apply(v, x))))(v_theirs)
    _close(g_ours, g_theirs, 2e-4)


@pytest.mark.parametrize(
    "name,kwargs",
    [("BatchNorm", {"use_running_average": False}), ("LayerNorm", {}), ("GroupNorm", {"num_groups": 8})],
)
@pytest.mark.parametrize("dtype", [None, jnp.bfloat16])
def test_bf16_dtype_rules_match_flax(name, kwargs, dtype):
    """bf16 input, float32 params: float32 statistics; output dtype by flax's rule; finite values."""
    x = _x(dtype=jnp.bfloat16)
    ours, theirs = getattr(jn, name)(dtype=dtype, **kwargs), getattr(fnn, name)(dtype=dtype, **kwargs)
    v = theirs.init(KEY, x)
    y_ours = ours.apply(v, x, mutable=["batch_stats"])[0]
    y_theirs = theirs.apply(v, x, mutable=["batch_stats"])[0]
    assert y_ours.dtype == y_theirs.dtype == (dtype or jnp.float32)
    assert bool(jnp.all(jnp.isfinite(y_ours)))
    np.testing.assert_allclose(
        y_ours.astype(jnp.float32), y_theirs.astype(jnp.float32), atol=0.05 if dtype else 1e-3
    )


@pytest.mark.parametrize("p,topk", [(1, None), ("inf", None), ("inf", 10)])
def test_lp_batch_norm_running_var_holds_sigma_hat_squared(p, topk):
    xs = [_x((64, 8), seed=s) for s in range(2)]
    bn = jn.BatchNorm(use_running_average=False, momentum=0.0, p=p, topk=topk)
    v = bn.init(KEY, xs[0])
    np.testing.assert_array_equal(v["batch_stats"]["var"], 1.0)  # init does not update running stats
    (y,), v = _train_steps(bn, v, xs[1:])
    mean, var = F.batch_moments(xs[1], p=p, topk=topk)
    _close(v["batch_stats"]["mean"], mean)
    _close(v["batch_stats"]["var"], var)
    _close(y, F.batch_norm(xs[1], p=p, topk=topk))
    _close(
        bn.clone(use_running_average=True).apply(v, xs[1]), y, 1e-5
    )  # momentum 0: eval == train on that batch


def test_ghost_batch_norm_running_stats_are_ghost_means():
    x = _x((32, 6))
    bn = jn.BatchNorm(use_running_average=False, momentum=0.0, virtual_batch_size=8)
    v = bn.init(KEY, x)
    y, updates = bn.apply(v, x, mutable=["batch_stats"])
    means, variances = F.batch_moments(x, virtual_batch_size=8)
    _close(updates["batch_stats"]["mean"], means.mean(0))
    _close(updates["batch_stats"]["var"], variances.mean(0))
    _close(y, F.batch_norm(x, virtual_batch_size=8))


def test_mean_only_batch_norm_module():
    x = _x((32, 6))
    bn = jn.BatchNorm(use_running_average=False, mean_only=True, use_scale=False, momentum=0.0)
    v = bn.init(KEY, x)
    y, updates = bn.apply(v, x, mutable=["batch_stats"])
    _close(y, x - x.mean(0))
    np.testing.assert_array_equal(updates["batch_stats"]["var"], 1.0)
    _close(bn.clone(use_running_average=True).apply({**v, **updates}, x), y)


def test_batch_norm_under_jit_and_grad():
    x = _x((32, 4, 4, 8))
    bn = jn.BatchNorm(use_running_average=False, p=1)
    v = bn.init(KEY, x)

    @jax.jit
    def loss(params, x):
        y, _ = bn.apply({"params": params, "batch_stats": v["batch_stats"]}, x, mutable=["batch_stats"])
        return jnp.mean(jnp.square(y - 1.0))

    grads = jax.grad(loss)(v["params"], x)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))


def test_module_errors_name_the_argument():
    x = _x((8, 6))
    with pytest.raises(ValueError, match="p must be 1, 2 or 'inf'"):
        jn.BatchNorm(use_running_average=False, p=3).init(KEY, x)
    with pytest.raises(ValueError, match="num_groups=4 must divide the number of channels 6"):
        jn.GroupNorm(num_groups=4).init(KEY, x)
    with pytest.raises(ValueError, match="exactly one of num_groups and group_size"):
        jn.GroupNorm(num_groups=2, group_size=3).init(KEY, x)
    with pytest.raises(ValueError, match="reduction_axes"):
        jn.LayerNorm(reduction_axes=5).init(KEY, x)
    with pytest.raises(ValueError, match="g_init must be"):
        jn.WeightNormDense(3, g_init="zeros").init(KEY, x)
    with pytest.raises(TypeError, match="x must have a floating dtype"):
        jn.RMSNorm().init(KEY, x.astype(jnp.int32))
    with pytest.raises(ValueError, match="at least 2 values per output unit"):
        jn.WeightNormDense(3, g_init="data").init(KEY, x[:1])


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"p": 3}, "p must be 1, 2 or 'inf'"),
        ({"topk": 2}, "topk applies to p='inf'"),
        ({"p": "inf", "calibration": "nonsense"}, "calibration must be"),
        ({"calibration": "exact"}, "applies to p='inf'"),
        ({"virtual_batch_size": 0}, "virtual_batch_size must be a positive int"),
    ],
)
def test_batch_norm_options_are_checked_in_evaluation_too(options, match):
    """The batch statistics (and their checks) are not computed in evaluation; the options still are."""
    with pytest.raises(ValueError, match=match):
        jn.BatchNorm(use_running_average=True, **options).init(KEY, _x((8, 6)))


@pytest.mark.parametrize("options", [{}, {"p": 1}, {"p": "inf", "topk": 3}, {"virtual_batch_size": 4}])
def test_batch_norm_init_on_a_batch_too_small_for_statistics(options):
    """As with flax, ``init`` on one example works (there, batch statistics would raise): the variables
    are those of a full batch, and training on a real batch then proceeds normally."""
    module = jn.BatchNorm(use_running_average=False, **options)
    one, batch = _x((1, 6)), _x((8, 6))
    y_init, variables = module.init_with_output(KEY, one)
    _close(variables, module.init(KEY, batch), 0)
    _close(y_init, one / np.sqrt(1 + 1e-5), 1e-6)  # the initial running statistics: mean 0, var 1
    y, _ = module.apply(variables, batch, mutable=["batch_stats"])
    want = F.batch_norm(batch, p=options.get("p", 2), topk=options.get("topk"),
                        virtual_batch_size=options.get("virtual_batch_size"))
    _close(y, want, 1e-5)


# --------------------------------------------------------------------------------------------------
# Weight-space layers


def test_weight_norm_g_init_norm_equals_plain_layer_at_init():
    x = _x((4, 8, 8, 3))
    wn = jn.WeightNormConv(6, (3, 3), strides=2, padding="VALID")
    v = wn.init(KEY, x)
    plain = fnn.Conv(6, (3, 3), strides=2, padding="VALID")
    y_plain = plain.apply({"params": {k: v["params"][k] for k in ("kernel", "bias")}}, x)
    _close(wn.apply(v, x), y_plain, 1e-5)
    ones = jn.WeightNormDense(5, g_init="ones")
    v1 = ones.init(KEY, _x((4, 7)))
    _close(F.unit_norm(F.weight_norm(v1["params"]["kernel"], v1["params"]["scale"])), 1.0, 1e-6)


@pytest.mark.parametrize(
    ("padding", "shape", "kernel_size", "strides", "dilation"),
    [("CIRCULAR", (2, 7, 6, 3), (3, 2), 1, (1, 2)), ("CIRCULAR", (2, 9, 3), (4,), 2, 1),
     ("circular", (9, 9, 3), (3, 3), 1, 1), ("CAUSAL", (2, 9, 3), (3,), 1, 2),
     ("CAUSAL", (2, 10, 3), (2,), 3, 1)],
)
def test_conv_layers_take_flax_circular_and_causal_padding(padding, shape, kernel_size, strides, dilation):
    """flax's Conv pads 'CIRCULAR' by wrapping and 'CAUSAL' (1-D) on the left before a 'VALID'
    convolution; jaxnorm's Conv layers refused both (a helper's module fuzz). With g = ||v|| the weight-norm
    layer is flax's Conv at init, linen and NNX."""
    x = _x(shape)
    wn = jn.WeightNormConv(5, kernel_size, strides=strides, padding=padding, kernel_dilation=dilation)
    v = wn.init(KEY, x)
    plain = fnn.Conv(5, kernel_size, strides=strides, padding=padding.upper(), kernel_dilation=dilation)
    want = plain.apply({"params": {k: v["params"][k] for k in ("kernel", "bias")}}, x)
    _close(wn.apply(v, x), want, 1e-5)
    layer = jnnx.WeightNormConv(3, 5, kernel_size, strides=strides, padding=padding, kernel_dilation=dilation,
                                rngs=nnx.Rngs(0))
    layer.kernel[...], layer.bias[...] = v["params"]["kernel"], v["params"]["bias"]
    layer.scale[...] = v["params"]["scale"]
    _close(layer(x), want, 1e-5)


def test_causal_padding_is_for_1d_convolutions():
    with pytest.raises(ValueError, match="padding='CAUSAL' is for 1-D convolutions"):
        jn.WeightNormConv(4, (3, 3), padding="CAUSAL").init(KEY, _x((2, 6, 6, 3)))


@pytest.mark.parametrize("shape", [(6, 6, 3), (2, 3, 6, 6, 3)], ids=["no batch axis", "two batch axes"])
def test_weight_norm_conv_takes_flax_conv_batch_axes(shape):
    """flax.linen.Conv takes input without a batch axis, or with several (flattened for the convolution);
    the linen conv layers raised a raw XLA error there (the NNX ones already took both)."""
    x = _x(shape)
    wn = jn.WeightNormConv(4, (3, 3))
    v = wn.init(KEY, x)
    y_plain = fnn.Conv(4, (3, 3)).apply({"params": {k: v["params"][k] for k in ("kernel", "bias")}}, x)
    y = wn.apply(v, x)
    assert y.shape == y_plain.shape == (*shape[:-1], 4)
    _close(y, y_plain, 1e-5)


def test_weight_norm_data_dependent_init_standardizes_preactivations():
    x = _x((256, 10), loc=3.0, scale=4.0)
    layer = jn.WeightNormDense(6, g_init="data")
    y = layer.apply(layer.init(KEY, x), x)
    _close(y.mean(0), 0.0, 1e-4)
    _close(y.std(0), 1.0, 1e-3)


@pytest.mark.parametrize(
    ("layer", "shape"),
    [(jn.WeightNormDense(6, g_init="data"), (64, 10)),
     (jn.WeightNormConv(4, (3, 3), g_init="data"), (8, 6, 6, 3))],
)
def test_weight_norm_data_init_also_when_apply_creates_the_params(layer, shape):
    """``apply({}, x, mutable=True)`` creates the params too; it used to give flax's g = 1 there
    (pre-activations with mean up to 4.4 and std 2.9, a helper's module fuzz)."""
    x = _x(shape, loc=2.0, scale=3.0)
    by_init = layer.init(KEY, x)
    _, by_apply = layer.apply({}, x, mutable=True, rngs={"params": KEY})
    for a, b in zip(jax.tree.leaves(by_init), jax.tree.leaves(by_apply), strict=True):
        np.testing.assert_array_equal(a, b)


def test_scaled_weight_norm_preserves_norm_through_relu_layers():
    """Arpit et al. 2019: with gain 2 and fan_in = fan_out, E||relu(W x)||^2 = ||x||^2 at initialisation;
    plain weight norm (g = 1) halves it at every layer."""
    x = _x((256, 256), loc=0.0, scale=1.0)

    def energy_ratio(layer):
        h = x
        for depth in range(10):
            h = jax.nn.relu(layer.apply(layer.init(jax.random.key(depth), h), h))
        return float(jnp.mean(jnp.sum(h**2, -1)) / jnp.mean(jnp.sum(x**2, -1)))

    assert 0.4 < energy_ratio(jn.ScaledWeightNormDense(256, use_bias=False)) < 2.5
    assert energy_ratio(jn.WeightNormDense(256, use_bias=False, g_init="ones")) < 0.01  # about 2**-10


@pytest.mark.parametrize("groups", [1, 4, 16])
def test_scaled_weight_norm_grouped_conv_uses_the_groups_fans(groups):
    """A grouped / depthwise conv's kernel is (*window, in / G, out): the fan-out read from that shape
    was window * out, G times too large, so each layer scaled the signal's energy by about 1 / G
    (depthwise, 5 layers: 2.7e-5). fan_out is window * out / G: the energy ratio is the same at every G
    (0.9 with the zero padding's border), linen and NNX alike, and their kernels agree."""
    x = _x((8, 12, 12, 16), loc=0.0, scale=1.0)
    layer = jn.ScaledWeightNormConv(16, (3, 3), feature_group_count=groups, use_bias=False)
    variables = layer.init(KEY, x)
    y = layer.apply(variables, x)
    ratio = float(jnp.sum(jax.nn.relu(y) ** 2) / jnp.sum(x**2))
    assert 0.6 < ratio < 1.2, ratio
    v = np.asarray(variables["params"]["kernel"], np.float64)
    fan_in = fan_out = 9 * 16 // groups
    kernel = v / np.sqrt(np.sum(v**2, axis=(0, 1, 2))) * np.sqrt(2.0 * fan_in / fan_out)
    reference = jax.lax.conv_general_dilated(
        x, jnp.asarray(kernel, jnp.float32), (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
        feature_group_count=groups,
    )
    np.testing.assert_allclose(y, reference, rtol=1e-4, atol=1e-5)
    module = jnnx.ScaledWeightNormConv(16, 16, (3, 3), feature_group_count=groups, use_bias=False,
                                       rngs=nnx.Rngs(0))
    module.kernel[...] = variables["params"]["kernel"]
    np.testing.assert_allclose(module(x), y, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="feature_group_count=3 must divide the kernel's 16 output features"):
        F.scaled_weight_norm(jnp.ones((3, 3, 1, 16)), 1.0, feature_group_count=3)


def test_bounded_weight_norm_rho_is_a_constant():
    x = _x((4, 5))
    layer = jn.BoundedWeightNormDense(3)
    v = layer.init(KEY, x)
    assert set(v) == {"params", "constants"}
    _close(v["constants"]["rho"], F.unit_norm(v["params"]["kernel"]))
    params = jax.tree.map(lambda a: 5 * a, v["params"])  # scaling v changes nothing
    _close(layer.apply({**v, "params": params}, x), layer.apply(v, x), 1e-5)
    scalar = jn.BoundedWeightNormDense(3, per_unit=False).init(KEY, x)
    assert scalar["constants"]["rho"].shape == ()


def test_ws_conv_kernel_is_standardized():
    x = _x((2, 6, 6, 4))
    layer = jn.WSConv(8, (3, 3), use_bias=False)
    v = layer.init(KEY, x)
    w = F.weight_standardization(v["params"]["kernel"], gain=v["params"]["gain"])
    flat = w.reshape(-1, 8)
    _close(flat.mean(0), 0.0, 1e-6)
    _close(flat.var(0) * flat.shape[0], 1.0, 1e-4)
    y_plain = fnn.Conv(8, (3, 3), use_bias=False).apply({"params": {"kernel": w}}, x)
    _close(layer.apply(v, x), y_plain, 1e-5)


def test_normprop_keeps_activations_normalized():
    x = _x((2048, 128), loc=0.0, scale=1.0)
    h = x
    for depth in range(3):
        layer = jn.NormPropDense(128, kernel_init=fnn.initializers.orthogonal())
        h = layer.apply(layer.init(jax.random.key(depth), h), h)
    assert abs(float(h.mean())) < 0.05 and abs(float(h.std()) - 1) < 0.1
