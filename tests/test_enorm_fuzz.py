"""Hypothesis fuzz of jaxnorm.enorm and jaxnorm.optim.enorm (issue 15).

Random ReLU MLPs and CNNs (hidden layers of width 1 included), residual networks whose spec comes
from ``discover``, dtypes float32 / bfloat16 / float16, and degenerate kernels (a zero unit, a zero
layer, entries ~1e20 or ~1e-20, or the nearest the dtype holds). Properties, checked against a
float64 NumPy forward pass of the params as stored:

- the function is unchanged within the dtype's tolerance (``enorm_balance``, ``check``, the
  ``optim.enorm`` step, which must land on ``enorm_balance`` of the plainly stepped params);
- the objective ``sum_k ||W_k||_p^p`` (float64) does not increase;
- no NaN / Inf appears in params, scales or optimizer state;
- running statistics mapped by ``transport_batch_stats`` keep eval-mode outputs;
- bad arguments raise a ``ValueError`` / ``TypeError`` naming the argument.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from flax.core import FrozenDict
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from jaxnorm import optim
from jaxnorm.enorm import (
    Junction,
    batch_stats_map,
    chain,
    check,
    discover,
    enorm_balance,
    transport_batch_stats,
)

DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16}
DTYPE_NAMES = tuple(sorted(DTYPES))
CONTAINERS = {"dict": dict, "frozen": FrozenDict, "state": nnx.State}
KINDS = ["normal", "normal", "zero_unit", "zero_layer", "huge", "tiny"]
# entries of "huge" / "tiny" kernels: far from 1 but inside the dtype's normal range
HUGE = {"f32": 1e20, "bf16": 1e20, "f16": 3e2}
TINY = {"f32": 1e-20, "bf16": 1e-20, "f16": 1e-2}
# relative output deviation accepted: float32 rounds each rescaled entry (2^-24); bf16 / f16 use
# power-of-two scales (exact), so only the float32 forward pass rounds
RTOL = {"f32": 2e-5, "bf16": 1e-5, "f16": 1e-5}


def fuzz(n: int) -> settings:
    """Hypothesis settings for a fuzz test of ``n`` examples (deadline off: each compiles)."""
    return settings(max_examples=n, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------------------------------------
# Networks: params dicts built directly (no flax init), one forward for jnp and NumPy.


def _conv_same(x, k, xp):
    """Stride-1 SAME convolution, NHWC input, HWIO kernel, as shifted matmuls."""
    kh, kw = k.shape[:2]
    ph, pw = (kh - 1) // 2, (kw - 1) // 2
    h, w = x.shape[1], x.shape[2]
    xpad = xp.pad(x, ((0, 0), (ph, kh - 1 - ph), (pw, kw - 1 - pw), (0, 0)))
    out = 0.0
    for i in range(kh):
        for j in range(kw):
            out = out + xpad[:, i : i + h, j : j + w, :] @ k[i, j]
    return out


def forward(params, x, arch, xp=jnp):
    """``arch``: ("mlp", n) Dense_0..n-1; ("cnn", n_conv, n_dense, pool); ("res", blocks)."""
    relu = lambda v: xp.maximum(v, 0.0)
    dense = lambda name, v: v @ params[name]["kernel"] + params[name].get("bias", 0.0)
    if arch[0] == "mlp":
        for i in range(arch[1] - 1):
            x = relu(dense(f"Dense_{i}", x))
        return dense(f"Dense_{arch[1] - 1}", x)
    if arch[0] == "cnn":
        _, n_conv, n_dense, pool = arch
        for i in range(n_conv):
            layer = params[f"Conv_{i}"]
            x = relu(_conv_same(x, layer["kernel"], xp) + layer.get("bias", 0.0))
            if pool and i == 0:
                n, h, w, c = x.shape
                x = x.reshape(n, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))
        x = x.reshape(x.shape[0], -1)
        for i in range(n_dense - 1):
            x = relu(dense(f"Dense_{i}", x))
        return dense(f"Dense_{n_dense - 1}", x)
    x = relu(dense("stem", x))  # residual MLP: identity shortcuts share the stream's units
    for b in range(arch[1]):
        h = relu(dense(f"block{b}_a", x))
        x = relu(x + dense(f"block{b}_b", h))
    return dense("head", x)


def _np64(params):
    return jax.tree.map(lambda v: np.asarray(jnp.asarray(v, jnp.float32), np.float64), params)


def outputs64(params, x, arch):
    return forward(_np64(params), np.asarray(x, np.float64), arch, np)


def rel_dev(a, b):
    scale = float(np.max(np.abs(b), initial=0.0))
    diff = float(np.max(np.abs(a - b), initial=0.0))
    return diff / scale if scale > 0 else diff


def _degrade(w, kind, dtype_name, rng):
    if kind == "zero_unit":
        w[..., rng.integers(w.shape[-1])] = 0.0
    elif kind == "zero_layer":
        w[...] = 0.0
    elif kind == "huge":
        w *= HUGE[dtype_name]
    elif kind == "tiny":
        w *= TINY[dtype_name]
    return w


@st.composite
def networks(draw, archs=("mlp", "cnn"), dtypes=DTYPE_NAMES, hidden=1, containers=tuple(CONTAINERS)):
    """``(params, x, arch, dtype_name)`` of a random ReLU network with degenerate layers; hidden
    widths (and channels) from ``hidden`` up; params as a dict, a ``FrozenDict`` or an ``nnx.State``."""
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    dtype_name = draw(st.sampled_from(dtypes))
    use_bias = draw(st.booleans())
    kind = draw(st.sampled_from(archs))
    layers = []  # (name, kernel shape)
    if kind == "mlp":
        widths = [draw(st.integers(1, 4)), *draw(st.lists(st.integers(hidden, 5), min_size=1, max_size=4))]
        widths.append(draw(st.integers(1, 3)))
        layers = [(f"Dense_{i}", (a, b)) for i, (a, b) in enumerate(itertools.pairwise(widths))]
        arch, x_shape = ("mlp", len(layers)), (3, widths[0])
    elif kind == "cnn":
        n_conv, n_dense, pool = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.booleans())
        chans = [draw(st.integers(1, 2))] + [draw(st.integers(hidden, 3)) for _ in range(n_conv)]
        size = 4
        layers = [
            (f"Conv_{i}", (draw(st.sampled_from([1, 3])), 3, chans[i], chans[i + 1])) for i in range(n_conv)
        ]
        flat = (size // 2 if pool else size) ** 2 * chans[-1]
        dense = [flat] + [draw(st.integers(hidden, 4)) for _ in range(n_dense - 1)] + [2]
        layers += [(f"Dense_{i}", (a, b)) for i, (a, b) in enumerate(itertools.pairwise(dense))]
        arch, x_shape = ("cnn", n_conv, n_dense, pool), (2, size, size, chans[0])
    else:
        width, blocks = draw(st.integers(hidden, 4)), draw(st.integers(1, 2))
        layers = [("stem", (3, width))]
        for b in range(blocks):
            inner = draw(st.integers(hidden, 4))
            layers += [(f"block{b}_a", (width, inner)), (f"block{b}_b", (inner, width))]
        layers.append(("head", (width, 2)))
        arch, x_shape = ("res", blocks), (3, 3)
    # one degenerate layer (maybe), never the last of a plain chain only
    bad = draw(st.integers(0, len(layers) - 1))
    bad_kind = draw(st.sampled_from(KINDS))
    dtype = DTYPES[dtype_name]
    params = {}
    for i, (name, shape) in enumerate(layers):
        fan_in = int(np.prod(shape[:-1]))
        w = rng.normal(size=shape) / math.sqrt(fan_in)
        if i == bad:
            w = _degrade(w, bad_kind, dtype_name, rng)
        params[name] = {"kernel": jnp.asarray(w, dtype)}
        if use_bias:
            b = 0.1 * rng.normal(size=shape[-1])
            if i == bad and bad_kind in ("huge", "tiny"):
                b *= HUGE[dtype_name] if bad_kind == "huge" else TINY[dtype_name]
            params[name]["bias"] = jnp.asarray(b, dtype)
    x = jnp.asarray(rng.normal(size=x_shape), jnp.float32)
    return CONTAINERS[draw(st.sampled_from(containers))](params), x, arch, dtype_name


def objective64(params, spec, p):
    """``sum_k ||W_k||_p^p`` over the spec's non-bias leaves, in float64 (p = inf: sum of maxima)."""
    pure, seen = _np64(params), {}
    for junction in spec:
        for entry in (*junction.producers, *junction.consumers):
            if entry[0][-1] != "bias":
                seen[tuple(entry[0])] = None
    total = 0.0
    for path in seen:
        leaf = pure
        for key in path:
            leaf = leaf[key]
        total += float(np.max(np.abs(leaf))) if p == "inf" else float(np.sum(np.abs(leaf) ** p))
    return total


def _finite(tree):
    return all(
        bool(np.all(np.isfinite(np.asarray(jnp.asarray(v, jnp.float32))))) for v in jax.tree.leaves(tree)
    )


def _assert_balanced_ok(params, balanced, scales, spec, x, arch, dtype_name, p):
    assert jax.tree.structure(balanced) == jax.tree.structure(params)
    for a, b in zip(jax.tree.leaves(balanced), jax.tree.leaves(params), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
    assert _finite(balanced), "NaN/Inf in the balanced params"
    assert all(bool(np.all(np.isfinite(s)) and np.all(np.asarray(s) > 0)) for s in scales)
    before, after = outputs64(params, x, arch), outputs64(balanced, x, arch)
    assert rel_dev(after, before) <= RTOL[dtype_name], (rel_dev(after, before), spec)
    if p != "inf":
        old, new = objective64(params, spec, p), objective64(balanced, spec, p)
        assert new <= old * (1 + 1e-5), (old, new)


# ---------------------------------------------------------------------------------------------
# enorm_balance: chains (bare call) and residual nets (discover).


@fuzz(14)
@given(net=networks(), p=st.sampled_from([2, 1, 3.0, "inf"]), cycles=st.integers(1, 3))
def test_fuzz_bare_chain(net, p, cycles):
    params, x, arch, dtype_name = net
    spec = chain(params)
    assert len(spec) == len(params) - 1
    balanced, scales = enorm_balance(params, p=p, cycles=cycles, return_scales=True)
    _assert_balanced_ok(params, balanced, scales, spec, x, arch, dtype_name, p)
    apply32 = lambda prm, v: forward(jax.tree.map(lambda w: w.astype(jnp.float32), prm), v, arch)
    if _finite(outputs64(params, x, arch)) and float(np.max(np.abs(outputs64(params, x, arch)))) < 1e30:
        check(apply32, params, balanced, x, rtol=1e-3)


@fuzz(8)
@given(
    net=networks(archs=("res", "cnn"), dtypes=("f16", "f32"), hidden=2, containers=("dict",)),
    p=st.sampled_from([2, "inf"]),
)
def test_fuzz_discover_spec(net, p):
    """discover's spec on residual MLPs and CNNs: the identity shortcuts' shared junction is found,
    and balancing with the spec keeps the function. (bfloat16 params and width-1 hidden layers:
    the two tests below.)"""
    params, x, arch, dtype_name = net
    spec = discover(lambda prm, v: forward(prm, v, arch), params, x)
    if arch[0] == "res":  # the stem and every block's second layer share the stream's units
        assert any(len(j.producers) >= 1 + arch[1] for j in spec), spec.report()
    balanced, scales = enorm_balance(params, spec, p=p, cycles=2, return_scales=True)
    _assert_balanced_ok(params, balanced, scales, spec, x, arch, dtype_name, p)


def _mlp(widths, dtype):
    rng = np.random.default_rng(0)
    return {
        f"Dense_{i}": {"kernel": jnp.asarray(rng.normal(size=(a, b)), dtype)}
        for i, (a, b) in enumerate(itertools.pairwise(widths))
    }


def test_discover_bfloat16_params():
    params = _mlp((3, 4, 2), jnp.bfloat16)
    spec = discover(lambda prm, v: forward(prm, v, ("mlp", 2)), params, jnp.ones((2, 3)))
    assert len(spec) == 1, spec.report()


def test_discover_width_one_hidden_layer():
    params = _mlp((3, 1, 2), jnp.float32)
    assert len(chain(params)) == 1
    spec = discover(lambda prm, v: forward(prm, v, ("mlp", 2)), params, jnp.ones((2, 3)))
    assert len(spec) == 1, spec.report()


# ---------------------------------------------------------------------------------------------
# optim.enorm: a step lands on enorm_balance of the plain step, state finite, function kept.

INNER = {
    "sgd": lambda: optax.sgd(1e-2),
    "momentum": lambda: optax.sgd(1e-2, momentum=0.9),
    "adam": lambda: optax.adam(1e-3),
}


@fuzz(8)
@given(net=networks(), inner=st.sampled_from(sorted(INNER)), every=st.sampled_from([1, 2]))
def test_fuzz_optim_enorm(net, inner, every):
    params, x, arch, dtype_name = net
    tx, plain = optim.enorm(INNER[inner](), cycles=2, every=every), INNER[inner]()
    grads = jax.tree.map(
        lambda w: jnp.cos(jnp.arange(w.size, dtype=jnp.float32).reshape(w.shape)).astype(w.dtype), params
    )
    state, plain_state = tx.init(params), plain.init(params)
    for k in range(1, 3):
        # eager: a jitted step may skip the float16 roundings of the inner step (XLA's excess
        # precision), so that its plain step differs from the reference by an ulp
        updates, state = tx.update(grads, state, params)
        plain_updates, plain_state = plain.update(grads, plain_state, params)
        stepped = optax.apply_updates(params, plain_updates)
        assume(_finite(stepped) and _finite(plain_state))  # optax's own float16 Adam can overflow
        new = optax.apply_updates(params, updates)
        fired = k % every == 0
        want = enorm_balance(stepped, cycles=2, max_scale=optim.MAX_STEP_SCALE) if fired else stepped
        for a, b, w in zip(*map(jax.tree.leaves, (new, want, params)), strict=True):
            assert a.dtype == b.dtype
            a, b, w = (np.asarray(v, np.float64) for v in (a, b, w))
            if dtype_name == "f32":  # lands within ~1 ulp of max(|balanced|, |params|)
                assert np.all(np.abs(a - b) <= 2.0**-22 * (np.abs(b) + np.abs(w))), np.max(np.abs(a - b))
            else:  # power-of-two scales: exact
                np.testing.assert_array_equal(a, b)
        assert _finite(new) and _finite(state), "NaN/Inf in params or optimizer state"
        dev = rel_dev(outputs64(new, x, arch), outputs64(stepped, x, arch))
        assert dev <= RTOL[dtype_name], dev
        # continue from the balanced point with the wrapped state (Eq. 10)
        params, plain_state = new, state.inner_state


# ---------------------------------------------------------------------------------------------
# Running statistics: kernel -> BN (eval mode) -> ReLU -> Dense.


def _bn_forward(variables, x, n_layers):
    params, stats = variables["params"], variables["batch_stats"]
    for i in range(n_layers):
        h = x @ params[f"Dense_{i}"]["kernel"]
        bn, st_ = params[f"BatchNorm_{i}"], stats[f"BatchNorm_{i}"]
        h = (h - st_["mean"]) * jax.lax.rsqrt(st_["var"] + 1e-12) * bn["scale"] + bn["bias"]
        x = jnp.maximum(h, 0.0)
    return x @ params["head"]["kernel"]


@fuzz(6)
@given(
    seed=st.integers(0, 2**16),
    widths=st.lists(st.integers(1, 4), min_size=1, max_size=2),
    log_s=st.floats(-6.0, 6.0),
    stats_dtype=st.sampled_from(["f32", "bf16"]),
)
def test_fuzz_transport(seed, widths, log_s, stats_dtype):
    rng = np.random.default_rng(seed)
    dims = [3, *widths]
    params, stats = {}, {}
    for i, (a, b) in enumerate(itertools.pairwise(dims)):
        params[f"Dense_{i}"] = {"kernel": jnp.asarray(rng.normal(size=(a, b)), jnp.float32)}
        params[f"BatchNorm_{i}"] = {
            "scale": jnp.asarray(1 + 0.1 * rng.normal(size=b), jnp.float32),
            "bias": jnp.asarray(0.1 * rng.normal(size=b), jnp.float32),
        }
        stats[f"BatchNorm_{i}"] = {
            "mean": jnp.asarray(rng.normal(size=b), DTYPES[stats_dtype]),
            "var": jnp.asarray(rng.uniform(0.5, 2.0, size=b), DTYPES[stats_dtype]),
        }
    params["head"] = {"kernel": jnp.asarray(rng.normal(size=(dims[-1], 2)), jnp.float32)}
    variables = {"params": params, "batch_stats": stats}
    x = jnp.asarray(rng.normal(size=(4, 3)), jnp.float32)
    apply = lambda v, inp: _bn_forward(v, inp, len(widths))
    stats_map = batch_stats_map(apply, variables, x)
    assert set(stats_map) == {(f"Dense_{i}", "kernel") for i in range(len(widths))}
    scales = {
        name: {
            "kernel": jnp.asarray(
                np.exp(log_s + rng.normal(size=params[name]["kernel"].shape[-1])), jnp.float32
            )
        }
        for name in params
        if name.startswith("Dense")
    }
    new_params = {
        k: ({"kernel": v["kernel"] / scales[k]["kernel"]} if k in scales else v) for k, v in params.items()
    }
    new_stats = transport_batch_stats(stats, scales, stats_map)
    assert _finite(new_stats)
    for a, b in zip(jax.tree.leaves(new_stats), jax.tree.leaves(stats), strict=True):
        assert a.dtype == b.dtype
    before = np.asarray(apply(variables, x), np.float64)
    after = np.asarray(apply({"params": new_params, "batch_stats": new_stats}, x), np.float64)
    assert rel_dev(after, before) <= (2e-5 if stats_dtype == "f32" else 2e-2)


# ---------------------------------------------------------------------------------------------
# Bad arguments: an error naming the argument, at construction / call / init.

MLP = {
    "Dense_0": {"kernel": jnp.ones((3, 4)), "bias": jnp.zeros(4)},
    "Dense_1": {"kernel": jnp.ones((4, 2)), "bias": jnp.zeros(2)},
}
BAD = {
    "p": [0, -1, float("nan"), "two", True, None, jnp.asarray(2.0), [2]],
    "c": [
        0,
        -1.0,
        float("nan"),
        float("inf"),
        "1",
        True,
        None,
        jnp.ones((2, 2)),
        (),
        (1.0, 0.0),
        np.float32(-2.0),
        jnp.asarray(0.0),
    ],
    "cycles": [2.5, -1, True, "1", None, jnp.asarray(1.5), np.int64(-3), jnp.asarray(-1)],
    "return_scales": [1, "yes", None],
    "count_biases": [0, "no", None],
    "power_of_two": [1, "yes"],
}


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(sorted(BAD)), data=st.data())
def test_fuzz_bad_arguments_enorm_balance(name, data):
    bad = data.draw(st.sampled_from(BAD[name]))
    with pytest.raises((ValueError, TypeError), match=name):
        enorm_balance(MLP, **{name: bad})


OPTIM_BAD = {
    "every": [0, -2, 1.5, True, "2", 2**31, float("inf")],
    "inner": ["sgd", None, optax.sgd, 3],
    **{k: BAD[k] for k in ("p", "c", "cycles", "count_biases")},
}


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(sorted(OPTIM_BAD)), data=st.data())
def test_fuzz_bad_arguments_optim_enorm(name, data):
    bad = data.draw(st.sampled_from(OPTIM_BAD[name]))
    kwargs = {} if name == "inner" else {name: bad}
    with pytest.raises((ValueError, TypeError), match=name):
        optim.enorm(bad if name == "inner" else optax.sgd(0.1), **kwargs)  # at construction


@st.composite
def bad_specs(draw):
    """A spec entry that does not fit MLP: ``(junction, words the message must contain)``."""
    good_p, good_c = (("Dense_0", "kernel"), 1), (("Dense_1", "kernel"), 0)
    case = draw(st.sampled_from(["path", "axis", "units", "empty", "not_junction", "leaf", "flat"]))
    if case == "path":
        return [Junction(((("Dense_7", "kernel"), 1),), (good_c,))], "does not exist"
    if case == "axis":
        axis = draw(st.sampled_from([2, -3, 7, 1.0]))
        return [Junction(((("Dense_0", "kernel"), axis),), (good_c,))], "axis"
    if case == "units":
        return [Junction((good_p,), ((("Dense_1", "kernel"), 1),))], "units"
    if case == "empty":
        return [Junction((), (good_c,))], "producer"
    if case == "not_junction":
        return [(good_p, good_c)], "Junction"
    if case == "leaf":
        return [Junction(((("Dense_0",), 0),), (good_c,))], "not an array leaf"
    return Junction((good_p,), (good_c,)), "sequence of Junction"


@settings(max_examples=20, deadline=None)
@given(case=bad_specs())
def test_fuzz_bad_spec(case):
    spec, words = case
    with pytest.raises(ValueError, match=words):
        enorm_balance(MLP, spec)
    with pytest.raises(ValueError, match=words):
        optim.enorm(optax.sgd(0.1), spec).init(MLP)  # at init, not at the first update


@settings(max_examples=12, deadline=None)
@given(rtol=st.sampled_from([-1.0, float("nan"), "0.1", True, None, [0.1]]))
def test_fuzz_bad_rtol(rtol):
    apply = lambda prm, v: forward(prm, v, ("mlp", 2))
    x = jnp.ones((2, 3))
    if rtol is None:  # the default: accepted
        assert check(apply, MLP, MLP, x, rtol=rtol) == 0.0
        return
    with pytest.raises(ValueError, match="rtol"):
        check(apply, MLP, MLP, x, rtol=rtol)


def test_numpy_scalars_accepted():
    """NumPy scalars are ordinary values for every argument (no error, same numbers)."""
    apply = lambda prm, v: forward(prm, v, ("mlp", 2))
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda v: jnp.asarray(rng.normal(size=v.shape), jnp.float32), MLP)
    a = enorm_balance(
        params, p=np.float32(2.0), c=np.float64(1.5), cycles=np.int64(2), return_scales=np.bool_(False)
    )
    b = enorm_balance(params, p=2, c=1.5, cycles=2)
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(u, v)
    assert check(apply, params, params, jnp.ones((2, 3)), rtol=np.float32(1e-3)) == 0.0
    optim.enorm(optax.sgd(0.1), p=np.int64(2), c=np.float32(1.0), cycles=np.int32(1), every=np.int64(3))


def test_transport_and_map_arguments():
    stats = {"BatchNorm_0": {"mean": jnp.zeros(4), "var": jnp.ones(4)}}
    with pytest.raises(ValueError, match="variables"):
        batch_stats_map(lambda v, x: x, {"params": MLP}, jnp.ones((2, 3)))
    from jaxnorm.enorm import StatLink

    stats_map = {("Dense_0", "kernel"): (StatLink(("BatchNorm_0", "mean"), 1, None),)}
    with pytest.raises(ValueError, match="scales"):
        transport_batch_stats(stats, {"Dense_0": {"kernel": jnp.ones(3)}}, stats_map)
    bad_map = {("Dense_0", "kernel"): (StatLink(("BatchNorm_9", "mean"), 1, None),)}
    with pytest.raises(ValueError, match="BatchNorm_9"):
        transport_batch_stats(stats, {"Dense_0": {"kernel": jnp.ones(4)}}, bad_map)
