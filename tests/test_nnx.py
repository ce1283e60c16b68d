"""Tests of jaxnorm.nnx: equal to flax.nnx for p = 2, equal to the linen twins (jaxnorm.nn) for every
option, and the weight-layer contracts (trainable g, kernel never overwritten, g initialisations)."""

from __future__ import annotations

import inspect

import flax.linen as linen
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from hypothesis import given
from hypothesis import strategies as st
from multidevice import run_on_devices
from oracles import dispersion_sq

import jaxnorm.nn as jnn
import jaxnorm.nnx as jnnx

RTOL, ATOL = 1e-5, 1e-5


def _normal(seed, shape, loc=0.0, scale=1.0):
    return jax.random.normal(jax.random.key(seed), shape) * scale + loc


def _mask(seed, shape, p=0.7):
    """A random boolean mask that keeps at least the first two elements of every feature."""
    mask = np.array(jax.random.bernoulli(jax.random.key(seed), p, shape))
    mask[:2] = True
    return jnp.asarray(mask)


def _close(actual, expected, rtol=RTOL, atol=ATOL):
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=rtol, atol=atol)


def _random_init(key, shape, dtype=jnp.float32):
    return 1.0 + 0.3 * jax.random.normal(key, shape, dtype)


# --------------------------------------------------------------------------------------------------
# p = 2: equal to flax.nnx (same constructor, same attributes, same numbers)

FLAX_NAMED = ["BatchNorm", "LayerNorm", "GroupNorm", "InstanceNorm", "RMSNorm"]


@pytest.mark.parametrize("name", FLAX_NAMED)
def test_constructor_is_a_superset_of_flax(name):
    ours = inspect.signature(getattr(jnnx, name).__init__).parameters
    theirs = inspect.signature(getattr(nnx, name).__init__).parameters
    for arg, param in theirs.items():
        assert arg in ours, f"{name} lacks flax.nnx's argument {arg}"
        assert ours[arg].kind == param.kind, (name, arg)
        assert ours[arg].default == param.default, (name, arg, ours[arg].default, param.default)


SHAPE = (6, 3, 3, 8)
BN_CASES = [
    (dict(), False),
    (dict(momentum=0.9, epsilon=1e-3), True),
    (dict(use_bias=False), True),
    (dict(use_scale=False, use_fast_variance=False), False),
]


@pytest.mark.parametrize(("kwargs", "masked"), BN_CASES)
def test_batch_norm_equals_flax(kwargs, masked):
    shape = SHAPE
    ours = jnnx.BatchNorm(8, scale_init=_random_init, bias_init=_random_init, rngs=nnx.Rngs(0), **kwargs)
    theirs = nnx.BatchNorm(8, scale_init=_random_init, bias_init=_random_init, rngs=nnx.Rngs(0), **kwargs)
    for a, b in zip(jax.tree.leaves(nnx.state(ours)), jax.tree.leaves(nnx.state(theirs)), strict=True):
        np.testing.assert_array_equal(a, b)
    for step in range(3):
        x = _normal(step, shape, loc=3.0, scale=2.0)
        mask = _mask(10 + step, shape) if masked else None
        _close(ours(x, mask=mask), theirs(x, mask=mask))
        _close(ours.mean[...], theirs.mean[...])
        _close(ours.var[...], theirs.var[...])
    x = _normal(7, shape, loc=3.0, scale=2.0)
    _close(ours(x, use_running_average=True), theirs(x, use_running_average=True))
    assert jax.tree.structure(nnx.state(ours)) == jax.tree.structure(nnx.state(theirs))


def test_batch_norm_other_axis_and_eval_mode_equal_flax():
    x = _normal(0, (5, 4, 3), loc=-1.0, scale=3.0)
    ours, theirs = (m(4, axis=1, rngs=nnx.Rngs(0)) for m in (jnnx.BatchNorm, nnx.BatchNorm))
    _close(ours(x), theirs(x))
    ours.eval()
    theirs.eval()
    assert ours.use_running_average is True
    _close(ours(x), theirs(x))
    _close(ours.var[...], theirs.var[...])


LAYER_CASES = [
    ("LayerNorm", dict(), False),
    ("LayerNorm", dict(reduction_axes=(1, 2, 3), epsilon=1e-4), True),
    ("InstanceNorm", dict(), True),
    ("GroupNorm", dict(num_groups=4), False),
    ("GroupNorm", dict(num_groups=None, group_size=2, use_bias=False), True),
    ("RMSNorm", dict(), True),
    ("RMSNorm", dict(reduction_axes=(2, 3), use_scale=False), False),
]


@pytest.mark.parametrize(("name", "kwargs", "masked"), LAYER_CASES)
def test_layer_modules_equal_flax(name, kwargs, masked):
    shape = SHAPE
    inits = dict(scale_init=_random_init)
    if name != "RMSNorm":
        inits["bias_init"] = _random_init
    ours = getattr(jnnx, name)(shape[-1], rngs=nnx.Rngs(0), **inits, **kwargs)
    theirs = getattr(nnx, name)(shape[-1], rngs=nnx.Rngs(0), **inits, **kwargs)
    x = _normal(1, shape, loc=2.0, scale=1.5)
    mask = _mask(2, shape) if masked else None
    _close(ours(x, mask=mask), theirs(x, mask=mask))
    assert jax.tree.structure(nnx.state(ours)) == jax.tree.structure(nnx.state(theirs))


@pytest.mark.parametrize("name", ["BatchNorm", "LayerNorm", "GroupNorm", "RMSNorm"])
@pytest.mark.parametrize("dtype", [None, jnp.bfloat16])
def test_bf16_inputs_give_flax_dtypes_and_values(name, dtype):
    x = _normal(3, SHAPE, loc=2.0, scale=1.5).astype(jnp.bfloat16)
    kwargs = dict(dtype=dtype, **({"num_groups": 4} if name == "GroupNorm" else {}))
    ours = getattr(jnnx, name)(8, rngs=nnx.Rngs(0), **kwargs)
    theirs = getattr(nnx, name)(8, rngs=nnx.Rngs(0), **kwargs)
    y, y_flax = ours(x), theirs(x)
    assert y.dtype == y_flax.dtype == (dtype or jnp.float32)
    _close(y.astype(jnp.float32), y_flax.astype(jnp.float32), 1e-2, 1e-2)


@pytest.mark.parametrize("name", ["BatchNorm", "LayerNorm", "GroupNorm", "RMSNorm", "InstanceNorm"])
@pytest.mark.parametrize("half", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("eval_mode", [False, True])
def test_half_precision_params_and_inputs_give_flax_dtypes(name, half, eval_mode):
    """param_dtype and x in half precision, dtype=None: flax.nnx.BatchNorm promotes (x, mean, var,
    scale, bias), so its float32 running statistics make the output float32; jaxnorm's BatchNorm
    promoted (x, scale, bias) only and returned the half dtype, rounded (up to 0.007 off)."""
    x = _normal(3, SHAPE, loc=2.0, scale=1.5).astype(half)
    kwargs = dict(param_dtype=half, **({"num_groups": 4} if name == "GroupNorm" else {}))
    if name == "BatchNorm":
        kwargs["use_running_average"] = eval_mode
    ours = getattr(jnnx, name)(8, rngs=nnx.Rngs(0), **kwargs)
    theirs = getattr(nnx, name)(8, rngs=nnx.Rngs(0), **kwargs)
    y, y_flax = ours(x), theirs(x)
    assert y.dtype == y_flax.dtype
    _close(y.astype(jnp.float32), y_flax.astype(jnp.float32), 1e-2, 1e-2)


def test_group_norm_reduction_axes_match_numpy_and_linen():
    """flax.nnx 0.12's GroupNorm mis-broadcasts custom ``reduction_axes`` (it disagrees with this oracle
    and with flax.linen), so jaxnorm follows flax.linen there."""
    x = _normal(1, SHAPE, loc=2.0, scale=1.5)
    ours = jnnx.GroupNorm(8, num_groups=2, reduction_axes=(2, 3), rngs=nnx.Rngs(0))
    grouped = np.asarray(x, np.float64).reshape(6, 3, 3, 2, 4)
    mean = grouped.mean(axis=(2, 4), keepdims=True)
    var = grouped.var(axis=(2, 4), keepdims=True)
    _close(ours(x), ((grouped - mean) / np.sqrt(var + 1e-6)).reshape(x.shape))
    theirs = linen.GroupNorm(num_groups=2, reduction_axes=(2, 3))
    _close(ours(x), theirs.apply(theirs.init(jax.random.key(0), x), x))


# --------------------------------------------------------------------------------------------------
# Every option: equal to the linen twin with the same variables


def _load(module: nnx.Module, variables) -> None:
    """Copy linen ``variables`` into ``module``: the names must be the same attribute names."""
    flat = {name: value for collection in variables.values() for name, value in collection.items()}
    assert set(flat) == set(nnx.state(module).keys())
    for name, value in flat.items():
        getattr(module, name)[...] = value


def _perturb(variables, seed):
    """Random parameters (not the initial constants), so that scale and bias matter."""
    leaves, tree = jax.tree.flatten(variables["params"])
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    noisy = [leaf + 0.3 * jax.random.normal(k, leaf.shape) for leaf, k in zip(leaves, keys, strict=True)]
    return {**variables, "params": jax.tree.unflatten(tree, noisy)}


BN_OPTIONS = [
    (dict(p=2), True),
    (dict(p=1), False),
    (dict(p=1, momentum=0.8, epsilon=1e-3, use_bias=False), True),
    (dict(p="inf"), True),
    (dict(p=float("inf"), calibration="exact"), False),
    (dict(p="inf", topk=3), True),
    (dict(p=1, virtual_batch_size=2), False),
    (dict(p="inf", topk=2, virtual_batch_size=3), False),
    (dict(p=2, mean_only=True), True),
]


@pytest.mark.parametrize(("options", "masked"), BN_OPTIONS, ids=str)
def test_batch_norm_equals_linen_twin(options, masked):
    shape = SHAPE
    twin = jnn.BatchNorm(**options)
    variables = _perturb(twin.init(jax.random.key(0), jnp.ones(shape), use_running_average=False), 1)
    ours = jnnx.BatchNorm(8, rngs=nnx.Rngs(0), **options)
    _load(ours, variables)
    for step in range(3):
        x = _normal(step, shape, loc=1.0, scale=2.0)
        mask = _mask(10 + step, shape) if masked else None
        y_twin, updates = twin.apply(variables, x, False, mask=mask, mutable=["batch_stats"])
        variables = {**variables, **updates}
        _close(ours(x, mask=mask), y_twin, 1e-6, 1e-6)
        _close(ours.mean[...], variables["batch_stats"]["mean"], 1e-6, 1e-7)
        _close(ours.var[...], variables["batch_stats"]["var"], 1e-6, 1e-7)
    x = _normal(9, shape)
    _close(ours(x, use_running_average=True), twin.apply(variables, x, use_running_average=True), 1e-6, 1e-6)


LAYER_TWINS = [
    ("LayerNorm", dict(reduction_axes=(1, 2, 3))),
    ("InstanceNorm", dict()),
    ("GroupNorm", dict(num_groups=4)),
]


@pytest.mark.parametrize(("name", "kwargs"), LAYER_TWINS)
@pytest.mark.parametrize(("p", "masked"), [(2, False), (1, True), ("inf", True)])
def test_layer_modules_equal_linen_twin(name, kwargs, p, masked):
    shape = SHAPE
    x = _normal(0, shape, loc=1.0, scale=2.0)
    mask = _mask(1, shape) if masked else None
    twin = getattr(jnn, name)(p=p, **kwargs)
    variables = _perturb(twin.init(jax.random.key(0), x), 2)
    ours = getattr(jnnx, name)(8, p=p, rngs=nnx.Rngs(0), **kwargs)
    _load(ours, variables)
    _close(ours(x, mask=mask), twin.apply(variables, x, mask=mask), 1e-6, 1e-6)


def test_rms_norm_equals_linen_twin():
    x = _normal(0, SHAPE, loc=1.0)
    mask = _mask(1, x.shape)
    twin = jnn.RMSNorm(reduction_axes=(1, 2, 3))
    variables = _perturb(twin.init(jax.random.key(0), x), 3)
    ours = jnnx.RMSNorm(8, reduction_axes=(1, 2, 3), rngs=nnx.Rngs(0))
    _load(ours, variables)
    _close(ours(x, mask=mask), twin.apply(variables, x, mask=mask), 1e-6, 1e-6)


# --------------------------------------------------------------------------------------------------
# BatchNorm against an independent float64 NumPy oracle (running statistics for p != 2)


@pytest.mark.parametrize(("p", "topk"), [(1, None), ("inf", None), ("inf", 2)])
def test_batch_norm_running_stats_match_numpy(x64, p, topk):
    rng = np.random.default_rng(0)
    bn = jnnx.BatchNorm(3, momentum=0.9, p=p, topk=topk, param_dtype=jnp.float64, rngs=nnx.Rngs(0))
    bn.mean = nnx.BatchStat(jnp.zeros(3, jnp.float64))
    bn.var = nnx.BatchStat(jnp.ones(3, jnp.float64))
    ra_mean, ra_var = np.zeros(3), np.ones(3)
    for _ in range(3):
        x = rng.normal(2.0, 3.0, size=(10, 3))
        y = bn(jnp.asarray(x))
        mean = x.mean(0)
        var = np.array([dispersion_sq(x[:, c] - mean[c], p, topk) for c in range(3)])
        _close(y, (x - mean) / np.sqrt(var + 1e-5), 1e-10, 1e-10)
        ra_mean, ra_var = 0.9 * ra_mean + 0.1 * mean, 0.9 * ra_var + 0.1 * var
        _close(bn.mean[...], ra_mean, 1e-10, 1e-12)
        _close(bn.var[...], ra_var, 1e-10, 1e-12)


# --------------------------------------------------------------------------------------------------
# Weight-space layers

X_DENSE = _normal(0, (16, 10), loc=0.5, scale=2.0)
X_CONV = _normal(1, (4, 7, 7, 4), loc=0.5, scale=2.0)

WEIGHT_CASES = [
    ("WeightNormDense", (), dict(), X_DENSE),
    ("WeightNormDense", (), dict(g_init="ones", use_bias=False), X_DENSE),
    ("ScaledWeightNormDense", (), dict(gain=1.0), X_DENSE),
    ("BoundedWeightNormDense", (), dict(per_unit=False), X_DENSE),
    ("NormPropDense", (), dict(), X_DENSE),
    ("NormPropDense", (), dict(activation=False), X_DENSE),
    ("WeightNormConv", ((3, 3),), dict(strides=2, padding="VALID"), X_CONV),
    ("ScaledWeightNormConv", ((3, 3),), dict(feature_group_count=2, gain=0.5), X_CONV),
    ("BoundedWeightNormConv", ((2, 2),), dict(kernel_dilation=2), X_CONV),
    ("WSConv", ((3, 3),), dict(padding=1), X_CONV),
    ("WSConv", ((3, 3),), dict(use_gain=False), X_CONV),
    ("NormPropConv", ((3, 3),), dict(input_dilation=2, padding=1), X_CONV),
]
WEIGHT_IDS = [f"{name}-{sorted(kwargs)}" for name, _, kwargs, _ in WEIGHT_CASES]


def _weight_pair(name, window, kwargs, x, seed=0):
    """The NNX layer and its linen twin (``features`` / ``kernel_size`` keywords) on input ``x``."""
    ours = getattr(jnnx, name)(x.shape[-1], 6, *window, rngs=nnx.Rngs(seed), **kwargs)
    twin_kwargs = dict(kwargs, features=6, **({"kernel_size": window[0]} if window else {}))
    return ours, getattr(jnn, name)(**twin_kwargs)


@pytest.mark.parametrize(("name", "window", "kwargs", "x"), WEIGHT_CASES, ids=WEIGHT_IDS)
def test_weight_layers_equal_linen_twin(name, window, kwargs, x):
    ours, twin = _weight_pair(name, window, kwargs, x)
    variables = _perturb(twin.init(jax.random.key(0), x), 4)
    _load(ours, variables)
    _close(ours(x), twin.apply(variables, x), 1e-6, 1e-6)


@pytest.mark.parametrize(("name", "window", "kwargs", "x"), WEIGHT_CASES, ids=WEIGHT_IDS)
def test_weight_layers_train_their_gains_and_keep_the_kernel(name, window, kwargs, x):
    layer, _ = _weight_pair(name, window, kwargs, x)
    kernel = np.array(layer.kernel[...])
    rho = np.array(layer.rho[...]) if hasattr(layer, "rho") else None
    target = _normal(5, layer(x).shape)
    np.testing.assert_array_equal(layer.kernel[...], kernel)

    def loss_fn(model):
        return jnp.mean((model(x) - target) ** 2)

    @nnx.jit
    def step(model, optimizer):
        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss, grads, loss_fn(model)

    loss0, grads, loss1 = step(layer, nnx.Optimizer(layer, optax.sgd(1e-2), wrt=nnx.Param))
    assert float(loss1) < float(loss0)
    gains = [name for name in ("scale", "gain") if isinstance(getattr(layer, name, None), nnx.Param)]
    assert gains or name.startswith("Bounded") or not kwargs.get("use_gain", True)
    for gain in [*gains, "kernel"]:
        assert float(jnp.max(jnp.abs(grads[gain][...]))) > 0
    assert not np.array_equal(layer.kernel[...], kernel)
    if rho is not None:
        np.testing.assert_array_equal(layer.rho[...], rho)


@pytest.mark.parametrize(
    ("ours", "plain"),
    [
        (lambda r: jnnx.WeightNormDense(10, 6, rngs=r), lambda r: nnx.Linear(10, 6, rngs=r)),
        (lambda r: jnnx.WeightNormConv(4, 6, (3, 3), 2, rngs=r), lambda r: nnx.Conv(4, 6, (3, 3), 2, rngs=r)),
        (lambda r: jnnx.WeightNormConv(4, 6, (2, 2), padding="VALID", feature_group_count=2, rngs=r),
         lambda r: nnx.Conv(4, 6, (2, 2), padding="VALID", feature_group_count=2, rngs=r)),
    ],
)
def test_g_init_norm_equals_plain_layer_at_init(ours, plain):
    layer, reference = ours(nnx.Rngs(3)), plain(nnx.Rngs(3))
    x = X_DENSE if isinstance(reference, nnx.Linear) else X_CONV
    np.testing.assert_array_equal(layer.kernel[...], reference.kernel[...])
    _close(layer(x), reference(x), 1e-6, 1e-6)


@pytest.mark.parametrize("shape", [(7, 7, 4), (2, 3, 7, 7, 4)])
def test_conv_batch_axes_as_nnx_conv(shape):
    layer, reference = (cls(4, 6, (3, 3), rngs=nnx.Rngs(3)) for cls in (jnnx.WeightNormConv, nnx.Conv))
    x = _normal(2, shape)
    y = layer(x)
    assert y.shape == reference(x).shape == (*shape[:-1], 6)
    _close(y, reference(x), 1e-6, 1e-6)


def test_g_init_ones_is_flax_convention():
    layer = jnnx.WeightNormDense(10, 6, g_init="ones", rngs=nnx.Rngs(0))
    np.testing.assert_array_equal(layer.scale[...], np.ones(6))
    kernel = layer(jnp.eye(10)) - layer.bias[...]
    _close(jnp.linalg.norm(kernel, axis=0), np.ones(6))


@pytest.mark.parametrize(
    ("make", "x"),
    [
        (lambda: jnnx.WeightNormDense(10, 6, rngs=nnx.Rngs(0)), X_DENSE),
        (lambda: jnnx.WeightNormConv(4, 6, (3, 3), rngs=nnx.Rngs(0)), X_CONV),
    ],
)
def test_data_init_standardizes_pre_activations_and_matches_linen(make, x):
    layer = make()
    kernel = np.array(layer.kernel[...])
    y = nnx.jit(lambda m, x: m.data_init(x))(layer, x)
    axes = tuple(range(y.ndim - 1))
    _close(jnp.mean(y, axes), np.zeros(6), atol=1e-5)
    _close(jnp.var(y, axes), np.ones(6), rtol=1e-4)
    _close(layer(x), y)
    np.testing.assert_array_equal(layer.kernel[...], kernel)
    assert isinstance(layer.scale, nnx.Param)

    twin = jnn.WeightNormConv(6, (3, 3), g_init="data") \
        if x.ndim == 4 else jnn.WeightNormDense(6, g_init="data")
    variables = twin.init(jax.random.key(0), x)
    fresh = make()
    fresh.kernel[...] = variables["params"]["kernel"]
    fresh.data_init(x)
    _close(fresh.scale[...], variables["params"]["scale"], 1e-6, 1e-6)
    _close(fresh.bias[...], variables["params"]["bias"], 1e-6, 1e-6)


@given(st.lists(st.floats(1e-3, 1e3), min_size=6, max_size=6))
@pytest.mark.parametrize("name", ["WeightNormDense", "BoundedWeightNormDense", "NormPropDense"])
def test_weight_layers_are_invariant_to_rescaling_each_direction(name, scales):
    """``W(c v) = W(v)`` for every per-unit ``c > 0``: only the direction of ``v`` matters."""
    layer = getattr(jnnx, name)(10, 6, rngs=nnx.Rngs(0))
    y = layer(X_DENSE)
    layer.kernel[...] = layer.kernel[...] * jnp.asarray(scales, jnp.float32)
    _close(layer(X_DENSE), y, 1e-5, 1e-5)


def test_bounded_weight_norm_rho_is_a_fixed_constant():
    layer = jnnx.BoundedWeightNormDense(10, 6, rngs=nnx.Rngs(0))
    assert isinstance(layer.rho, jnnx.Constant) and not isinstance(layer.rho, nnx.Param)
    assert "rho" not in nnx.state(layer, nnx.Param)
    _close(layer.rho[...], jnp.linalg.norm(layer.kernel[...], axis=0))
    layer.kernel[...] = 3.0 * layer.kernel[...]
    effective = layer(jnp.eye(10)) - layer.bias[...]
    _close(jnp.linalg.norm(effective, axis=0), layer.rho[...])


# --------------------------------------------------------------------------------------------------
# A small network: nnx.jit, value_and_grad, optax, running statistics, eval mode


class _Net(nnx.Module):
    def __init__(self, rngs):
        self.conv = jnnx.WeightNormConv(4, 8, (3, 3), rngs=rngs)
        self.bn = jnnx.BatchNorm(8, p="inf", topk=4, rngs=rngs)
        self.dense = jnnx.ScaledWeightNormDense(8, 3, gain=1.0, rngs=rngs)

    def __call__(self, x):
        h = jax.nn.relu(self.bn(self.conv(x)))
        return self.dense(jnp.mean(h, axis=(1, 2)))


def test_training_step_under_jit_updates_params_and_running_stats():
    model = _Net(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    labels = jnp.arange(4) % 3

    @nnx.jit
    def train_step(model, optimizer, x):
        def loss_fn(model):
            return optax.softmax_cross_entropy_with_integer_labels(model(x), labels).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    mean0 = np.array(model.bn.mean[...])
    losses = [float(train_step(model, optimizer, X_CONV)) for _ in range(3)]
    assert losses[-1] < losses[0]
    assert not np.allclose(model.bn.mean[...], mean0)
    model.eval()
    y_eval = nnx.jit(lambda m, x: m(x))(model, X_CONV)
    assert bool(jnp.all(jnp.isfinite(y_eval)))
    mean_after = np.array(model.bn.mean[...])
    model(X_CONV)
    np.testing.assert_array_equal(model.bn.mean[...], mean_after)


def test_bf16_inputs_keep_float32_statistics():
    x = _normal(0, (8, 4, 4, 6), loc=1000.0, scale=0.01)
    bn = jnnx.BatchNorm(6, epsilon=1e-10, rngs=nnx.Rngs(0))
    y = bn(x)
    _close(jnp.std(y, axis=(0, 1, 2)), np.ones(6), rtol=1e-2)
    bn16 = jnnx.BatchNorm(6, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    y16 = bn16(x.astype(jnp.bfloat16))
    # float32, as flax.nnx (it promotes x with its float32 running statistics)
    assert y16.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(y16)))
    assert bn16.var.dtype == jnp.float32
    assert bn.var.dtype == jnp.float32


def test_axis_name_under_vmap_gives_global_statistics():
    x = _normal(0, (4, 6, 5), loc=2.0)
    ours = jnnx.BatchNorm(5, axis_name="batch", rngs=nnx.Rngs(0))
    theirs = jnnx.BatchNorm(5, rngs=nnx.Rngs(0))
    y = nnx.jit(nnx.vmap(lambda m, x: m(x), in_axes=(None, 0), axis_name="batch"))(ours, x)
    _close(y, theirs(x.reshape(24, 5)).reshape(x.shape))
    _close(ours.var[...], theirs.var[...])


_PMAP_SCRIPT = """
import jax, jax.numpy as jnp, numpy as np
from flax import nnx
import jaxnorm.nnx as jnnx

assert jax.device_count() == 8
x = jax.random.normal(jax.random.key(0), (8, 4, 3, 5)) * 2.0 + 1.0
mask = np.zeros((8, 4, 3, 5), bool)
for d in range(8):
    mask[d, : 1 + d % 4] = True  # the devices hold 1 to 4 unmasked examples
mask = jnp.asarray(mask)
for p in (2, 1, "inf"):
    graph, state = nnx.split(jnnx.BatchNorm(5, axis_name="devices", p=p, momentum=0.5, rngs=nnx.Rngs(0)))

    def step(state, x, mask):
        model = nnx.merge(graph, state)
        return model(x, mask=mask), nnx.state(model)

    y, new_state = jax.pmap(step, axis_name="devices", in_axes=(None, 0, 0))(state, x, mask)
    reference = jnnx.BatchNorm(5, p=p, momentum=0.5, rngs=nnx.Rngs(0))
    y_ref = reference(x.reshape(32, 3, 5), mask=mask.reshape(32, 3, 5)).reshape(x.shape)
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5)
    for name in ("mean", "var"):
        for d in range(8):
            np.testing.assert_allclose(new_state[name][...][d], getattr(reference, name)[...],
                                       rtol=1e-5, atol=1e-6)
print("ok")
"""


def test_pmap_with_unequal_masks_gives_global_batch_statistics():
    """8 simulated devices: statistics over ``axis_name`` equal the single-device global batch."""
    assert run_on_devices(_PMAP_SCRIPT).strip().endswith("ok")


# --------------------------------------------------------------------------------------------------
# Bad input


def test_bad_input_raises_clear_errors():
    with pytest.raises(ValueError, match="num_features=5"):
        jnnx.BatchNorm(5, rngs=nnx.Rngs(0))(jnp.ones((4, 6)))
    with pytest.raises(ValueError, match="num_features=5"):
        jnnx.LayerNorm(5, rngs=nnx.Rngs(0))(jnp.ones((4, 6)))
    with pytest.raises(ValueError, match="use_running_average"):
        jnnx.BatchNorm(6, use_running_average=None, rngs=nnx.Rngs(0))(jnp.ones((4, 6)))
    with pytest.raises(ValueError, match="p"):
        jnnx.BatchNorm(6, p=3, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="num_groups=4"):
        jnnx.GroupNorm(6, num_groups=4, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="topk"):
        jnnx.BatchNorm(6, p="inf", topk=9, rngs=nnx.Rngs(0))(jnp.ones((4, 6)))
    # options are checked at construction, not at the first training call
    with pytest.raises(ValueError, match="topk applies to p='inf'"):
        jnnx.BatchNorm(6, topk=2, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="calibration must be"):
        jnnx.BatchNorm(6, p="inf", calibration="nonsense", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="virtual_batch_size must be a positive int"):
        jnnx.BatchNorm(6, virtual_batch_size=0, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="virtual_batch_size"):
        jnnx.BatchNorm(6, virtual_batch_size=3, rngs=nnx.Rngs(0))(jnp.ones((4, 6)))
    with pytest.raises(ValueError, match="mask"):
        jnnx.BatchNorm(6, rngs=nnx.Rngs(0))(jnp.ones((4, 6)), mask=jnp.ones((3, 6), bool))
    with pytest.raises(TypeError, match="floating"):
        jnnx.LayerNorm(6, rngs=nnx.Rngs(0))(jnp.ones((4, 6), jnp.int32))
    with pytest.raises(TypeError, match="floating"):
        jnnx.RMSNorm(6, rngs=nnx.Rngs(0))(jnp.ones((4, 6), jnp.int32))
    with pytest.raises(ValueError, match="at least 2 elements"):
        jnnx.BatchNorm(6, rngs=nnx.Rngs(0))(jnp.ones((1, 6)))
    with pytest.raises(ValueError, match="axis"):
        jnnx.BatchNorm(6, axis=2, rngs=nnx.Rngs(0))(jnp.ones((4, 6)))
    with pytest.raises(ValueError, match="data_init"):
        jnnx.WeightNormDense(4, 3, g_init="data", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="kernel_size"):
        jnnx.WSConv(4, 3, (3, 3, 3), rngs=nnx.Rngs(0))(jnp.ones((5, 5, 4)))
    with pytest.raises(ValueError, match="in_features=4"):
        jnnx.WeightNormDense(4, 3, rngs=nnx.Rngs(0))(jnp.ones((2, 5)))
    with pytest.raises(ValueError, match="in_features=4"):
        jnnx.NormPropConv(4, 3, (3, 3), rngs=nnx.Rngs(0))(jnp.ones((2, 5, 5, 3)))
    with pytest.raises(ValueError, match="feature_group_count"):
        jnnx.WeightNormConv(4, 3, (3, 3), feature_group_count=2, rngs=nnx.Rngs(0))


def test_nnx_and_linen_export_the_same_layers():
    assert set(jnn.__all__) | {"Constant"} == set(jnnx.__all__)
    assert isinstance(jnnx.BatchNorm(3, rngs=nnx.Rngs(0)), nnx.Module)
    assert not isinstance(jnnx.BatchNorm(3, rngs=nnx.Rngs(0)), linen.Module)


def test_nnx_view_sets_eval_mode_as_flax():
    """flax 0.12's eval copy ``nnx.view(model, use_running_average=True)`` calls each module's
    ``set_view``; jaxnorm's BatchNorm had none: beside a flax BatchNorm the view silently stayed in
    training mode (batch statistics, running mean overwritten), alone it raised."""

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.theirs = nnx.BatchNorm(4, rngs=rngs)
            self.ours = jnnx.BatchNorm(4, rngs=rngs)

    x = _normal(0, (8, 4), loc=3.0, scale=2.0)
    net = Net(nnx.Rngs(0))
    view = nnx.view(net, use_running_average=True)
    assert view.ours.use_running_average is True and net.ours.use_running_average is False
    before = np.asarray(net.ours.mean[...]).copy()
    _close(view.ours(x), view.theirs(x))
    np.testing.assert_array_equal(net.ours.mean[...], before)
    alone = nnx.view(jnnx.BatchNorm(4, rngs=nnx.Rngs(0)), use_running_average=True)
    assert alone.use_running_average is True


def test_flax_call_signatures_and_attributes():
    """flax.nnx.RMSNorm takes ``mask`` positionally; flax.nnx.GroupNorm has ``feature_axis = -1``."""
    x = _normal(0, (4, 6))
    mask = jnp.arange(6) < 4
    ours, theirs = jnnx.RMSNorm(6, rngs=nnx.Rngs(0)), nnx.RMSNorm(6, rngs=nnx.Rngs(0))
    _close(ours(x, jnp.broadcast_to(mask, x.shape)), theirs(x, jnp.broadcast_to(mask, x.shape)))
    assert jnnx.GroupNorm(8, num_groups=2, rngs=nnx.Rngs(0)).feature_axis == nnx.GroupNorm(
        8, num_groups=2, rngs=nnx.Rngs(0)
    ).feature_axis == -1
