"""Property-based fuzz of the normalization core at its edges (issue 14, "Every edge defined").

Functions (batch / ghost batch / layer / group / instance / RMS norm, the weight normalizations) and the
linen and NNX modules, x p (2, 1, "inf", top-k) x dtypes (float32, bfloat16, float16, float64: x64 is
switched on only inside a ``with float64():`` block) x inputs a new user meets: constant channels / rows
(inexact constants such as 12345.678 and 1.2345678e6), zeros, one non-zero element, huge (1e19, 1e30 in
float32; near the maximum in float16), tiny (subnormal) values, empty and one-element masks.

Properties:

1. finite input -> finite output and finite gradients (of a fixed weighted sum of the outputs, with
   respect to the input and to the parameters);
2. a constant channel / row / group / weight unit normalizes to exactly 0, at every p, in every dtype;
3. a channel / row whose mask keeps no element is not amplified (``|y| <= |x|`` up to 1 %), never NaN, and
   the running statistics of ``BatchNorm`` are left unchanged for it; a one-element mask gives 0 at the kept
   element;
4. agreement with an independent float64 NumPy oracle on ordinary Gaussian input (written below from the
   definitions of README / docs/functional.md, not from jaxnorm's code);
5. ``BatchNorm``'s running statistics are averaged in float32 for bfloat16 / float16 input: equal, to
   float32 precision, to those of the float32 input with the same values;
6. ``unit_norm`` and the weight normalizations: finite gradient at a zero unit, exact on float32 kernels
   with entries of 1e20 (whose squares overflow float32);
7. linen and NNX ``InstanceNorm`` agree bit for bit in float16 (as flax.linen and flax.nnx do).

Compilation dominates the run time: every (function, p, mask or not) pair is jitted once (``_compiled``)
and retraced only per dtype, so the shapes are fixed per function and hypothesis varies the values.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Callable

import flax.linen as fnn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import jaxnorm.functional as F
import jaxnorm.nn as jn
import jaxnorm.nnx as jnnx

KEY = jax.random.key(0)


def fuzz(max_examples):
    """Small, deterministic hypothesis budgets (compilation, not execution, is the cost). No shrinking:
    the strategies are short lists already, and shrinking a failure would compile new cases."""
    return settings(max_examples=max_examples, deadline=None, derandomize=True, database=None,
                    phases=(Phase.explicit, Phase.generate), report_multiple_bugs=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors])


@contextlib.contextmanager
def float64():
    """``jax_enable_x64`` on inside the block only (never globally)."""
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", previous)


def dtype_context(dtype_name):
    return float64() if dtype_name == "float64" else contextlib.nullcontext()


DTYPES = ("float32", "bfloat16", "float16", "float64")


def np_dtype(name):
    return jnp.dtype(name)


def finfo_max(name):
    return float(jnp.finfo(np_dtype(name)).max)


# ---------------------------------------------------------------------------------------------------
# float64 NumPy oracle (from the documented definitions)

L1 = math.sqrt(math.pi / 2)


def linf_c(n):
    """The paper's C(n) = (1 + sqrt(pi ln 4)) / (2 sqrt(2 ln n)); n < 2 counts as 2."""
    return (1 + math.sqrt(math.pi * math.log(4))) / (2 * math.sqrt(2 * math.log(max(n, 2))))


def sigma_hat(values, p, topk=None):
    """The calibrated Lp dispersion of a 1-D float64 sample (biased std for p = 2)."""
    d = np.abs(values - values.mean())
    if p == 2:
        return math.sqrt(np.mean(d**2))
    if p == 1:
        return L1 * np.mean(d)
    top = np.sort(d)[-topk:].mean() if topk else d.max()
    return linf_c(values.size) * top


def oracle_centered(x, groups, p, topk, epsilon, mask=None):
    """(x - mu_G) / sqrt(sigma_hat_G^2 + epsilon) on every group G (boolean arrays of x's shape)."""
    x = np.asarray(x, np.float64)
    keep = np.ones(x.shape, bool) if mask is None else np.broadcast_to(np.asarray(mask), x.shape)
    y = np.full(x.shape, np.nan)
    for g in groups:
        kept = x[g & keep]
        if kept.size == 0:
            continue
        s = sigma_hat(kept, p, topk)
        y[g] = (x[g] - kept.mean()) / math.sqrt(s * s + epsilon)
    return y


def oracle_rms(x, groups, epsilon, scale, mask=None):
    x = np.asarray(x, np.float64)
    keep = np.ones(x.shape, bool) if mask is None else np.broadcast_to(np.asarray(mask), x.shape)
    y = np.full(x.shape, np.nan)
    for g in groups:
        kept = x[g & keep]
        if kept.size:
            y[g] = x[g] / math.sqrt(np.mean(kept**2) + epsilon)
    return y * np.asarray(scale, np.float64)


def oracle_fans(shape):
    window = math.prod(shape[:-2])
    return shape[-2] * window, shape[-1] * window


def unit_norms(w, epsilon=0.0):
    w = np.asarray(w, np.float64).reshape(-1, np.shape(w)[-1])
    return np.sqrt((w**2).sum(0) + epsilon)


def oracle_weight(name, w, params):
    w = np.asarray(w, np.float64)
    flat = w.reshape(-1, w.shape[-1])
    if name == "unit_norm":
        return unit_norms(w)
    if name == "weight_norm":
        return np.asarray(params["g"], np.float64) * w / unit_norms(w, 1e-12)
    if name == "scaled_weight_norm":
        fan_in, fan_out = oracle_fans(w.shape)
        g = np.asarray(params["g"], np.float64)
        return g * math.sqrt(2.0 * fan_in / fan_out) * w / unit_norms(w, 1e-12)
    if name in ("bounded_weight_norm", "project_to_norm"):
        return np.asarray(params["rho"], np.float64) * w / unit_norms(w, 1e-12)
    if name == "weight_standardization":
        fan_in = flat.shape[0]
        mean, var = flat.mean(0), flat.var(0)
        return (w - mean) / np.sqrt(np.maximum(fan_in * var, 1e-5)) * np.asarray(params["gain"], np.float64)
    raise AssertionError(name)


# ---------------------------------------------------------------------------------------------------
# Groups: the sets of elements that share one statistic (or one weight unit)


def _idx(shape):
    return np.indices(shape)


def per_last(shape):
    """Batch norm / weight units: every element with the same last index."""
    last = _idx(shape)[-1]
    return [last == j for j in range(shape[-1])]


def per_ghost(v):
    def groups(shape):
        i = _idx(shape)
        return [(i[0] // v == b) & (i[-1] == j) for b in range(shape[0] // v) for j in range(shape[-1])]

    return groups


def per_row(shape):
    """Layer / RMS norm over the last axis of a 2-D input."""
    first = _idx(shape)[0]
    return [first == r for r in range(shape[0])]


def per_group(num_groups):
    def groups(shape):
        i = _idx(shape)
        size = shape[-1] // num_groups
        return [(i[0] == b) & (i[-1] // size == g) for b in range(shape[0]) for g in range(num_groups)]

    return groups


def per_instance(shape):
    i = _idx(shape)
    return [(i[0] == b) & (i[-1] == c) for b in range(shape[0]) for c in range(shape[-1])]


# ---------------------------------------------------------------------------------------------------
# What is fuzzed: functions and modules, one fixed shape each


ALL_P = (2, 1, "inf", "topk")
P3 = (2, 1, "inf")


@dataclasses.dataclass(frozen=True)
class Spec:
    name: str
    shape: tuple
    groups: Callable  # shape -> list of boolean arrays
    ps: tuple  # the p values (None: no p argument); "topk" means p="inf", topk=TOPK
    make: Callable  # p -> (fn(x, params, mask) -> y, params)
    centered: bool = True  # a constant group maps to exactly 0
    maskable: bool = False
    epsilon: float = 1e-5
    kind: str = "activation"  # "activation", "weight" or "module"
    dtypes: tuple | None = None  # None: float32, one half type (alternating over p), float64 for f64_ps
    f64_ps: tuple = ALL_P


TOPK = 3
BN_SHAPE = (16, 4, 4)  # (batch, length, features): 64 elements per feature, as the issue's example
ROW_SHAPE = (4, 16)  # rows of 16, as the issue's layer-norm example
IMG_SHAPE = (2, 4, 4, 4)  # instances of 16, groups of 32 elements
KERNEL_SHAPE = (3, 3, 4, 4)  # HWIO: fan_in 36, fan_out 36, 4 units
def p_kwargs(p):
    return dict(p="inf", topk=TOPK) if p == "topk" else dict(p=p)


def _fixed(shape, seed, low=0.5, high=1.5):
    return np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32)


def _fn(fn, **params):
    return lambda p: (fn(p), {k: jnp.asarray(v) for k, v in params.items()})


FUNCTION_SPECS = [
    Spec("batch_norm", BN_SHAPE, per_last, ALL_P, maskable=True,
         make=_fn(lambda p: lambda x, q, m: F.batch_norm(x, mask=m, **p_kwargs(p)))),
    Spec("ghost_batch_norm", BN_SHAPE, per_ghost(8), (2, "inf"), f64_ps=(),
         make=_fn(lambda p: lambda x, q, m: F.batch_norm(x, virtual_batch_size=8, **p_kwargs(p)))),
    Spec("layer_norm", ROW_SHAPE, per_row, P3, maskable=True,
         make=_fn(lambda p: lambda x, q, m: F.layer_norm(x, p=p, mask=m))),
    Spec("group_norm", IMG_SHAPE, per_group(2), P3, maskable=True, f64_ps=(2,),
         make=_fn(lambda p: lambda x, q, m: F.group_norm(x, 2, p=p, mask=m))),
    Spec("instance_norm", IMG_SHAPE, per_instance, P3, maskable=True, f64_ps=(1,),
         make=_fn(lambda p: lambda x, q, m: F.instance_norm(x, p=p, mask=m))),
    Spec("rms_norm", ROW_SHAPE, per_row, (None,), maskable=True, centered=False, epsilon=1e-6, dtypes=DTYPES,
         make=_fn(lambda p: lambda x, q, m: F.rms_norm(x, mask=m, scale=q["scale"]), scale=_fixed(16, 1))),
]

WEIGHT_SPECS = [
    Spec("unit_norm", KERNEL_SHAPE, per_last, (None,), centered=False, kind="weight", dtypes=DTYPES,
         make=_fn(lambda p: lambda w, q, m: F.unit_norm(w))),
    Spec("weight_norm", KERNEL_SHAPE, per_last, (None,), centered=False, kind="weight",
         dtypes=("float32", "float16", "float64"),
         make=_fn(lambda p: lambda w, q, m: F.weight_norm(w, q["g"]), g=_fixed(4, 2))),
    Spec("scaled_weight_norm", KERNEL_SHAPE, per_last, (None,), centered=False, kind="weight",
         dtypes=("float32", "bfloat16", "float64"),
         make=_fn(lambda p: lambda w, q, m: F.scaled_weight_norm(w, q["g"], gain=2.0), g=_fixed(4, 3))),
    Spec("bounded_weight_norm", KERNEL_SHAPE, per_last, (None,), centered=False, kind="weight",
         dtypes=("float32", "float16"),
         make=_fn(lambda p: lambda w, q, m: F.bounded_weight_norm(w, q["rho"]), rho=_fixed(4, 4))),
    Spec("project_to_norm", KERNEL_SHAPE, per_last, (None,), centered=False, kind="weight",
         dtypes=("float32", "bfloat16"),
         make=_fn(lambda p: lambda w, q, m: F.project_to_norm(w, q["rho"]), rho=_fixed(4, 5))),
    Spec("weight_standardization", KERNEL_SHAPE, per_last, (None,), kind="weight", dtypes=DTYPES,
         make=_fn(lambda p: lambda w, q, m: F.weight_standardization(w, gain=q["gain"]), gain=_fixed(4, 6))),
]


def _linen(module_fn, shape):
    """A linen module in training mode: fn(x, params, mask) -> y, with the params of ``init``."""

    def make(p):
        module = module_fn(p)
        variables = module.init(KEY, jnp.zeros(shape, jnp.float32))
        rest = {k: v for k, v in variables.items() if k != "params"}

        def fn(x, params, mask):
            kwargs = {} if mask is None else dict(mask=mask)
            if rest:
                kwargs["mutable"] = list(rest)
                return module.apply({"params": params, **rest}, x, **kwargs)[0]
            return module.apply({"params": params}, x, **kwargs)

        return fn, variables["params"]

    return make


def _nnx(module_fn):
    """An NNX module (training mode): fn(x, params, mask) -> y, params its nnx.Param state."""

    def make(p):
        graphdef, params, rest = nnx.split(module_fn(p), nnx.Param, ...)

        def fn(x, state, mask):  # the state travels as an argument: NNX variables are made in the trace
            model = nnx.merge(graphdef, *state)
            return model(x) if mask is None else model(x, mask=mask)

        return fn, (params, rest)

    return make


def _p_only(p):
    return {} if p is None else dict(p=p)


MODULE_SPECS = [
    Spec("nn.BatchNorm", BN_SHAPE, per_last, (2, 1), kind="module", maskable=True,
         make=_linen(lambda p: jn.BatchNorm(use_running_average=False, p=p), BN_SHAPE)),
    Spec("nn.LayerNorm", ROW_SHAPE, per_row, ("inf",), kind="module", epsilon=1e-6,
         make=_linen(lambda p: jn.LayerNorm(p=p), ROW_SHAPE)),
    Spec("nn.GroupNorm", IMG_SHAPE, per_group(2), (2,), kind="module", epsilon=1e-6,
         make=_linen(lambda p: jn.GroupNorm(num_groups=2, p=p), IMG_SHAPE)),
    Spec("nn.InstanceNorm", IMG_SHAPE, per_instance, (1,), kind="module", epsilon=1e-6,
         make=_linen(lambda p: jn.InstanceNorm(p=p), IMG_SHAPE)),
    Spec("nn.RMSNorm", ROW_SHAPE, per_row, (None,), kind="module", centered=False, epsilon=1e-6,
         make=_linen(lambda p: jn.RMSNorm(), ROW_SHAPE)),
    Spec("nnx.BatchNorm", BN_SHAPE, per_last, (2, "inf"), kind="module", maskable=True,
         make=_nnx(lambda p: jnnx.BatchNorm(4, p=p, rngs=nnx.Rngs(0)))),
    Spec("nnx.LayerNorm", ROW_SHAPE, per_row, (1,), kind="module", epsilon=1e-6,
         make=_nnx(lambda p: jnnx.LayerNorm(16, p=p, rngs=nnx.Rngs(0)))),
    Spec("nnx.GroupNorm", IMG_SHAPE, per_group(2), ("inf",), kind="module", epsilon=1e-6,
         make=_nnx(lambda p: jnnx.GroupNorm(4, num_groups=2, p=p, rngs=nnx.Rngs(0)))),
    Spec("nnx.InstanceNorm", IMG_SHAPE, per_instance, (2,), kind="module", epsilon=1e-6,
         make=_nnx(lambda p: jnnx.InstanceNorm(4, p=p, rngs=nnx.Rngs(0)))),
    Spec("nnx.RMSNorm", ROW_SHAPE, per_row, (None,), kind="module", centered=False, epsilon=1e-6,
         make=_nnx(lambda p: jnnx.RMSNorm(16, rngs=nnx.Rngs(0)))),
]

STATISTIC_SPECS = [
    # the statistics themselves, (mean, sigma_hat) and (mean, sigma_hat^2) stacked: finite output and
    # gradients on every kind of input (a huge group's were inf / NaN through its variance in the unit)
    Spec("batch_stats", BN_SHAPE, per_last, ALL_P, centered=False, kind="statistic",
         dtypes=("float32", "float64"),
         make=_fn(lambda p: lambda x, q, m: jnp.stack(F.batch_stats(x, mask=m, **p_kwargs(p))))),
    Spec("batch_moments", BN_SHAPE, per_last, ALL_P, centered=False, kind="statistic", dtypes=("float32",),
         make=_fn(lambda p: lambda x, q, m: jnp.stack(F.batch_moments(x, mask=m, **p_kwargs(p))))),
]
SPECS = {s.name: s for s in FUNCTION_SPECS + WEIGHT_SPECS + MODULE_SPECS + STATISTIC_SPECS}


def _cases():
    """(name, p, dtype). Each compiled (function, p, dtype) costs ~1 s, so not every triple is run: every
    function at every p in float32, in one half type (bfloat16 and float16 alternate over p: both share
    one code path, float32 statistics) and in float64 (for most); the modules (thin layers over the
    functions) in one dtype each, rotating through the four."""
    cases, turn = [], 0
    for spec in SPECS.values():
        if spec.kind == "statistic":  # no normalized output: the finiteness test alone (STATISTIC_CASES)
            continue
        for i, p in enumerate(spec.ps):
            if spec.kind == "module":
                cases.append((spec.name, p, DTYPES[turn % len(DTYPES)]))
                turn += 1
            elif spec.dtypes is not None:
                cases.extend((spec.name, p, d) for d in spec.dtypes)
            else:
                half = ("bfloat16", "float16")[i % 2]
                wide = ("float64",) if p in spec.f64_ps else ()
                cases.extend((spec.name, p, d) for d in ("float32", half, *wide))
    return cases


CASES = _cases()
CASE_IDS = [f"{n}-p={p}-{d}" for n, p, d in CASES]
STATISTIC_CASES = [(s.name, p, d) for s in STATISTIC_SPECS for p in s.ps for d in s.dtypes]


@functools.cache
def _made(name, p):
    return SPECS[name].make(p)


@functools.cache
def _compiled(name, p, masked):
    """jit(value_and_grad) of sum(y * r) with respect to (x, params); one per (spec, p, masked), traced
    once per dtype."""
    fn, _ = _made(name, p)

    def loss(x, params, mask):
        y = fn(x, params, mask if masked else None)
        r = jnp.asarray(np.random.default_rng(99).normal(size=y.shape), jnp.float32)
        return jnp.sum(y.astype(jnp.float32) * r), y

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))


def run(name, p, x, mask=None):
    """(y, dL/dx, dL/dparams) for the spec at p on x (already in its dtype)."""
    _, params = _made(name, p)
    if x.dtype == jnp.float64 and SPECS[name].kind != "module":  # float64 parameters for float64 input
        params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), params)
    (_, y), (gx, gp) = _compiled(name, p, mask is not None)(x, params, mask)
    return y, gx, gp


def all_finite(tree):
    return all(np.all(np.isfinite(np.asarray(leaf, np.float64))) for leaf in jax.tree.leaves(tree))


@functools.cache
def groups_of(name):
    spec = SPECS[name]
    return tuple(spec.groups(spec.shape))


F16_SAFE = float(jnp.finfo(jnp.float16).max) / 2


def assert_finite(name, p, x, out, mask=None, what=""):
    """Output and gradients finite. In float16, only where the value itself is representable: where the
    same computation on the float32 copy of x stays below half the float16 maximum (e.g. a weight
    norm's gradient g / sqrt(epsilon) = 1e6 at a zero unit cannot be a float16 number)."""
    y, gx, gp = out
    y64, gx64 = np.asarray(y, np.float64), np.asarray(gx, np.float64)
    if x.dtype == jnp.float16:
        y_ref, gx_ref, _ = run(name, p, x.astype(jnp.float32), mask)
        y64 = np.where(np.abs(np.asarray(y_ref, np.float64)) < F16_SAFE, y64, 0.0)
        gx64 = np.where(np.abs(np.asarray(gx_ref, np.float64)) < F16_SAFE, gx64, 0.0)
    assert np.all(np.isfinite(y64)), f"non-finite output on {what}"
    assert np.all(np.isfinite(gx64)), f"non-finite input gradient on {what}"
    assert all_finite(gp), f"non-finite parameter gradient on {what}"


# ---------------------------------------------------------------------------------------------------
# Inputs

INEXACT_CONSTANTS = (12345.678, 1.2345678e6, -3.3, 0.1, 7.0, -2.7e4, 1e-3, 333.3333)
HUGE = {
    "float32": (1e17, 1e19, 1e30), "bfloat16": (1e19, 1e30), "float16": (3e4, 6e4), "float64": (1e150, 1e300)
}
TINY = {"float32": (1e-40, 3e-45), "bfloat16": (1e-39,), "float16": (1e-7, 6e-8), "float64": (1e-310,)}
KINDS = ("normal", "constant_all", "constant_group", "zeros", "zero_group", "one_nonzero", "huge",
         "huge_group", "tiny", "tiny_group")


def constants_for(dtype_name):
    top = finfo_max(dtype_name) / 4
    return tuple(c for c in INEXACT_CONSTANTS if abs(c) < top)


def make_input(spec, dtype_name, kind, seed, value):
    """A degenerate input of the spec's shape: ``value`` indexes the kind's magnitude / constant lists.

    Returns (x in the dtype, the boolean array of the degenerate group or None)."""
    rng = np.random.default_rng(seed)
    shape = spec.shape
    groups = groups_of(spec.name)
    group = groups[rng.integers(len(groups))]
    x = rng.normal(size=shape) * 2.0 + 0.5
    consts, huge, tiny = constants_for(dtype_name), HUGE[dtype_name], TINY[dtype_name]
    top = finfo_max(dtype_name)
    degenerate = None
    if kind == "constant_all":
        x[...] = consts[value % len(consts)]
        degenerate = np.ones(shape, bool)
    elif kind == "constant_group":
        x[group] = consts[value % len(consts)]
        degenerate = group
    elif kind == "zeros":
        x[...] = 0.0
        degenerate = np.ones(shape, bool)
    elif kind == "zero_group":
        x[group] = 0.0
        degenerate = group
    elif kind == "one_nonzero":
        x[...] = 0.0
        x.flat[rng.integers(x.size)] = (1 if value % 2 else -1) * 10.0 ** rng.integers(-3, 4)
    elif kind == "huge":
        x = np.clip(x * huge[value % len(huge)], -top, top)
    elif kind == "huge_group":
        x[group] = np.clip(x[group] * huge[value % len(huge)], -top, top)
    elif kind == "tiny":
        x = x * tiny[value % len(tiny)]
    elif kind == "tiny_group":
        x[group] = x[group] * tiny[value % len(tiny)]
    xd = jnp.asarray(x.astype(np.float64), np_dtype(dtype_name))
    if degenerate is not None:  # constants are constant in the dtype too (the cast rounds every copy alike)
        assert np.all(np.isfinite(np.asarray(xd, np.float64)))
    return xd, degenerate


# ---------------------------------------------------------------------------------------------------
# 1 + 2. Finite in -> finite out and gradients; constant groups -> exactly 0


KIND_FAMILIES = {
    "ordinary": ("normal", "one_nonzero"),
    "constant": ("constant_all", "constant_group", "zeros", "zero_group"),
    "extreme": ("huge", "huge_group", "tiny", "tiny_group"),
}


def _kind_values(family, dtype_name, value):
    """The (kind, value) pairs one example checks: every constant for the constant kinds."""
    for kind in KIND_FAMILIES[family]:
        if kind.startswith("constant"):
            yield from ((kind, v) for v in range(len(constants_for(dtype_name))))
        else:
            yield kind, value


@pytest.mark.parametrize("family", list(KIND_FAMILIES))
@pytest.mark.parametrize(
    ("name", "p", "dtype_name"),
    CASES + STATISTIC_CASES,
    ids=CASE_IDS + [f"{n}-p={p}-{d}" for n, p, d in STATISTIC_CASES],
)
@fuzz(3)
@given(seed=st.integers(0, 2**16), value=st.integers(0, 7))
def test_finite_output_and_gradients_and_constant_is_zero(name, p, dtype_name, family, seed, value):
    """Finite output and gradients on every kind of the family; constants (and zeros) give exactly 0."""
    spec = SPECS[name]
    with dtype_context(dtype_name):
        for kind, index in _kind_values(family, dtype_name, value):
            x, degenerate = make_input(spec, dtype_name, kind, seed, index)
            out = run(name, p, x)
            assert_finite(name, p, x, out, what=f"{kind} {dtype_name} input")
            y64 = np.asarray(out[0], np.float64)
            if degenerate is not None and spec.centered:
                bad = np.abs(y64[degenerate])
                assert np.all(bad == 0), f"{kind} in {dtype_name} gives |y| up to {bad.max():.3g}, not 0"


ZERO_EPSILON = {
    "batch_norm": lambda x, m, p: F.batch_norm(x, mask=m, epsilon=0.0, **p_kwargs(p)),
    "ghost_batch_norm": lambda x, m, p: F.batch_norm(x, virtual_batch_size=4, epsilon=0.0, **p_kwargs(p)),
    "layer_norm": lambda x, m, p: F.layer_norm(x, mask=m, epsilon=0.0, **p_kwargs(p)),
    "layer_norm_axes": lambda x, m, p: F.layer_norm(x, axis=(0, 1), mask=m, epsilon=0.0, **p_kwargs(p)),
    "group_norm": lambda x, m, p: F.group_norm(x[None], 2, mask=None if m is None else m[None],
                                               epsilon=0.0, **p_kwargs(p))[0],
    "instance_norm": lambda x, m, p: F.instance_norm(x[None], mask=None if m is None else m[None],
                                                     epsilon=0.0, **p_kwargs(p))[0],
    "rms_norm": lambda x, m, p: F.rms_norm(x, mask=m, epsilon=0.0),
    "rms_norm_axes": lambda x, m, p: F.rms_norm(x, axis=(0, 1), mask=m, epsilon=0.0),
}
ZERO_EPSILON_PS = {
    "batch_norm": ALL_P, "ghost_batch_norm": (2, "topk"), "rms_norm": (2,), "rms_norm_axes": (2,)
}
"""p per function (the others: 2 and, alternately, 1 or inf)."""
ZERO_EPSILON_CASES = [
    (n, p) for i, n in enumerate(ZERO_EPSILON) for p in ZERO_EPSILON_PS.get(n, (2, (1, "inf")[i % 2]))
]
ZERO_EPSILON_KINDS = ("normal", "constant", "zero_row", "one_element_mask", "tiny-60", "tiny-63", "tiny-66")


@functools.cache
def _zero_epsilon_run(name, p, masked):
    fn = lambda x, m, r: jnp.sum(ZERO_EPSILON[name](x, m, p).astype(jnp.float32) * r)
    return jax.jit(lambda x, m, r: (ZERO_EPSILON[name](x, m, p), jax.grad(fn)(x, m, r)))


@pytest.mark.parametrize(("name", "p"), ZERO_EPSILON_CASES, ids=[f"{n}-p={p}" for n, p in ZERO_EPSILON_CASES])
@fuzz(2)
@given(seed=st.integers(0, 2**16))
def test_epsilon_zero_is_finite_on_degenerate_input(name, p, seed):
    """``epsilon=0`` (exact scale invariance) on every kind of degenerate (8, 64) input: constant rows,
    a zero row, a mask that keeps one element per row, and ordinary data scaled by ``2^-k`` down to
    ``2^-66`` (variances near and below the smallest normal float32): output and input gradient finite,
    and the constant rows exactly 0. Before the floor was a select and tiny variances were lifted
    (:func:`jaxnorm.functional.units.lift_tiny`), these gradients were NaN / Inf."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=(8, 64)) + 3.0
    r = jnp.asarray(rng.normal(size=base.shape), jnp.float32)
    for kind in ZERO_EPSILON_KINDS:
        x, mask = base.copy(), None
        if kind == "constant":
            x[...] = INEXACT_CONSTANTS[seed % len(INEXACT_CONSTANTS)]
        elif kind == "zero_row":
            x[seed % 8] = 0.0
        elif kind == "one_element_mask":
            mask = jnp.asarray(np.arange(64) == seed % 64) & jnp.ones(base.shape, bool)
        elif kind.startswith("tiny"):
            x = x * 2.0 ** int(kind[4:])
        xd = jnp.asarray(x, jnp.float32)
        y, g = (np.asarray(a, np.float64) for a in _zero_epsilon_run(name, p, mask is not None)(xd, mask, r))
        what = f"{name} p={p} {kind}"
        assert np.all(np.isfinite(y)) and np.all(np.isfinite(g)), what
        if kind == "constant" and not name.startswith("rms"):
            assert np.all(y == 0), what


@pytest.mark.parametrize(("name", "p"), ZERO_EPSILON_CASES, ids=[f"{n}-p={p}" for n, p in ZERO_EPSILON_CASES])
def test_float16_gradient_is_the_float32_gradient_rounded_once(name, p):
    """float16 input of spread ~1e-5 at ``epsilon=0``: ``1 / sigma_hat`` ~ 1e5, so the input gradient's
    parts (through the deviations, the mean and the dispersion) exceed float16's range where their sum
    need not. The gradient is the float32 one (same values widened, same float16 cotangent) rounded once:
    no NaN, +-inf only where the float32 value is beyond float16's range. Before the input was widened once
    (:func:`jaxnorm.functional.moments.widened_float16`), each part was cast on its own: ``inf - inf``,
    NaN in about half of the entries."""
    rng = np.random.default_rng(3)
    x16 = jnp.asarray(rng.normal(size=(8, 64)) * 1e-5 + 3e-5, jnp.float16)
    r = jnp.asarray(rng.normal(size=x16.shape), jnp.float16).astype(jnp.float32)
    _, g16 = _zero_epsilon_run(name, p, False)(x16, None, r)
    _, g32 = _zero_epsilon_run(name, p, False)(x16.astype(jnp.float32), None, r)
    g16, g32 = np.asarray(g16, np.float64), np.asarray(g32, np.float64)
    assert not np.any(np.isnan(g16)), f"{name} p={p}: {np.isnan(g16).sum()} NaN entries"
    beyond = np.abs(g32) > 65520  # rounds to inf in float16
    assert 0 < beyond.sum() < beyond.size, "the case must mix representable and overflowing entries"
    np.testing.assert_array_equal(g16[beyond], np.sign(g32[beyond]) * np.inf)
    np.testing.assert_allclose(g16[~beyond], g32[~beyond], rtol=2**-10, atol=1e-3)


# ---------------------------------------------------------------------------------------------------
# 3. Empty and one-element masks


MASK_DTYPES = ("float32", "bfloat16", "float16")
MASK_PS = {"layer_norm": (1, "inf"), "group_norm": (2, "inf"), "instance_norm": (1, "inf")}
MASK_CASES = [(s.name, p) for s in FUNCTION_SPECS if s.maskable for p in MASK_PS.get(s.name, s.ps)]
MASK_CASES = [(n, p, MASK_DTYPES[i % 3]) for i, (n, p) in enumerate(MASK_CASES)]


@pytest.mark.parametrize(("name", "p", "dtype_name"), MASK_CASES,
                         ids=[f"{n}-p={p}-{d}" for n, p, d in MASK_CASES])
@fuzz(4)
@given(seed=st.integers(0, 2**16))
def test_empty_and_one_element_masks(name, p, dtype_name, seed):
    """The group whose mask keeps nothing is not amplified (no ``x / sqrt(epsilon)``) and finite; with one
    kept element, that element maps to 0 (except for RMS norm, which does not centre). Other groups match
    the oracle with the mask. Each example tries both masks at three scales (large values make an
    inexact mean of the one kept element visible)."""
    for one in (False, True):
        for scale in (1.0, 1e-3, 1e3):
            _check_masked(name, p, dtype_name, seed, one, scale)


def _check_masked(name, p, dtype_name, seed, one, scale):
    spec = SPECS[name]
    rng = np.random.default_rng(seed)
    groups = groups_of(name)
    g = groups[rng.integers(len(groups))]
    x = rng.normal(size=spec.shape) * scale + 0.3 * scale
    mask = rng.random(spec.shape) < 0.8
    for other in groups:  # every other group keeps at least TOPK + 1 elements
        kept = np.flatnonzero(other)[: TOPK + 1]
        mask.flat[kept] = True
    mask[g] = False
    kept_at = None
    if one:
        kept_at = np.flatnonzero(g)[rng.integers(g.sum())]
        mask.flat[kept_at] = True
    xd, mask_d = jnp.asarray(x, np_dtype(dtype_name)), jnp.asarray(mask)
    out = run(name, p, xd, mask_d)
    assert_finite(name, p, xd, out, mask_d, what="an empty / one-element mask" if one else "an empty mask")
    y64, xr = np.asarray(out[0], np.float64), np.asarray(xd, np.float64)
    if kept_at is None:
        gain = np.abs(param(name, p, "scale")).max() if "scale" in _made(name, p)[1] else 1.0
        bound = 1.01 * max(gain, 1.0) * np.abs(xr[g]).max() + 1e-6
        assert np.abs(y64[g]).max() <= bound, (
            f"empty-mask group amplified: max |y| {np.abs(y64[g]).max():.3g} "
            f"vs max |x| {np.abs(xr[g]).max():.3g}")
    elif spec.centered:
        assert y64.flat[kept_at] == 0, f"the one kept element gives {y64.flat[kept_at]}, not 0 ({scale=})"
    pk = p_kwargs(p) if p is not None else {}
    others = np.zeros(spec.shape, bool)
    for other in groups:
        if not (other & g).any():
            others |= other
    if spec.centered:
        want = oracle_centered(xr, groups, pk.get("p"), pk.get("topk"), spec.epsilon, mask)
    else:
        want = oracle_rms(xr, groups, spec.epsilon, param(name, p, "scale"), mask)
    tol = {"bfloat16": 3e-2, "float16": 4e-3}.get(dtype_name, 1e-4)
    np.testing.assert_allclose(y64[others], want[others], rtol=tol, atol=tol)


@pytest.mark.parametrize(("framework", "p"), [("linen", 2), ("linen", 1), ("nnx", "inf"), ("nnx", 2)])
@fuzz(6)
@given(seed=st.integers(0, 2**16), one=st.booleans())
def test_batch_norm_running_statistics_skip_an_empty_channel(framework, p, seed, one):
    """A channel whose mask keeps nothing keeps its running mean and variance (bit for bit); the others
    move towards the masked batch statistics. With one kept element its mean moves and stays finite."""
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=BN_SHAPE) * 2 + 1, jnp.float32)
    mask = np.ones(BN_SHAPE, bool)
    j = int(rng.integers(BN_SHAPE[-1]))
    mask[..., j] = False
    if one:
        mask[0, 0, j] = True
    mask = jnp.asarray(mask)
    start_mean = rng.normal(size=4).astype(np.float32)
    start_var = rng.uniform(0.5, 2, size=4).astype(np.float32)
    mean, var = _bn_masked_update(framework, p, x, mask, jnp.asarray(start_mean), jnp.asarray(start_var))
    assert np.all(np.isfinite(mean)) and np.all(np.isfinite(var)) and np.all(var >= 0)
    if not one:
        assert mean[j] == start_mean[j] and var[j] == start_var[j], (
            f"empty channel's running stats moved: mean {start_mean[j]} -> {mean[j]}, "
            f"var {start_var[j]} -> {var[j]}")
    others = [k for k in range(4) if k != j]
    assert np.all(mean[others] != start_mean[others])


@functools.cache
def _bn_step(framework, p):
    if framework == "linen":
        module = jn.BatchNorm(use_running_average=False, p=p)
        params = module.init(KEY, jnp.zeros(BN_SHAPE))["params"]

        @jax.jit
        def step(x, mask, mean, var):
            _, upd = module.apply({"params": params, "batch_stats": {"mean": mean, "var": var}}, x,
                                  mask=mask, mutable=["batch_stats"])
            return upd["batch_stats"]["mean"], upd["batch_stats"]["var"]

        return step
    graphdef, state = nnx.split(jnnx.BatchNorm(4, p=p, rngs=nnx.Rngs(0)))

    @jax.jit
    def step(state, x, mask, mean, var):
        model = nnx.merge(graphdef, state)
        model.mean[...] = mean
        model.var[...] = var
        model(x, mask=mask)
        return model.mean[...], model.var[...]

    return functools.partial(step, state)


def _bn_masked_update(framework, p, x, mask, mean, var):
    out = _bn_step(framework, p)(x, mask, mean, var)
    return np.asarray(out[0]), np.asarray(out[1])


# ---------------------------------------------------------------------------------------------------
# 4. Agreement with the float64 oracle on ordinary input




def param(name, p, key):
    """A parameter of the spec as a float64 NumPy array (dicts of linen, nnx.State of NNX)."""
    params = _made(name, p)[1]
    params = params[0] if isinstance(params, tuple) else params
    return np.asarray(jax.tree.leaves(params[key])[0], np.float64)


def oracle(name, p, x):
    spec = SPECS[name]
    keys = _made(name, p)[1]
    params = {k: param(name, p, k) for k in (keys[0] if isinstance(keys, tuple) else keys)}
    x = np.asarray(x, np.float64)
    groups = spec.groups(spec.shape)
    if spec.kind == "weight":
        return oracle_weight(name, x, params)
    if name.endswith("RMSNorm") or name == "rms_norm":
        return oracle_rms(x, groups, spec.epsilon, params["scale"])
    pk = p_kwargs(p)
    y = oracle_centered(x, groups, pk["p"], pk.get("topk"), spec.epsilon)
    if spec.kind == "module":  # scale 1, bias 0 at init
        y = y * params["scale"].reshape(-1) + params["bias"].reshape(-1)
    return y


@pytest.mark.parametrize(("name", "p", "dtype_name"), CASES, ids=CASE_IDS)
@fuzz(4)
@given(seed=st.integers(0, 2**16), loc=st.sampled_from((0.0, 2.5, -30.0)),
       scale=st.sampled_from((0.5, 1.0, 4.0)))
def test_matches_float64_oracle(name, p, dtype_name, seed, loc, scale):
    spec = SPECS[name]
    x = np.random.default_rng(seed).normal(loc, scale, spec.shape)
    with dtype_context(dtype_name):
        xd = jnp.asarray(x, np_dtype(dtype_name))
        y, _, _ = run(name, p, xd)
        want = oracle(name, p, np.asarray(xd, np.float64))  # the oracle sees the values actually passed
    tol = {"float64": 1e-9, "float32": 1e-4, "float16": 4e-3, "bfloat16": 3e-2}[dtype_name]
    if spec.kind == "activation" or spec.kind == "module":
        tol = max(tol, 1e-4 * (1 + abs(loc) / scale)) if dtype_name != "float64" else tol
    np.testing.assert_allclose(np.asarray(y, np.float64), want, rtol=tol, atol=tol)


# ---------------------------------------------------------------------------------------------------
# 5. BatchNorm running statistics averaged in float32 for half-precision input


@functools.cache
def _bn_train_loop(framework, p, steps):
    """``steps`` training-mode calls of BatchNorm (momentum 0.99) on the same batch, jitted once."""
    if framework == "linen":
        module = jn.BatchNorm(use_running_average=False, p=p)

        def loop(x):
            variables = module.init(KEY, x)

            def body(_, stats):
                _, upd = module.apply({"params": variables["params"], "batch_stats": stats}, x,
                                      mutable=["batch_stats"])
                return upd["batch_stats"]

            stats = jax.lax.fori_loop(0, steps, body, variables["batch_stats"])
            return stats["mean"], stats["var"]

        return jax.jit(loop)

    def loop(x):
        model = jnnx.BatchNorm(4, p=p, rngs=nnx.Rngs(0))
        graphdef, state = nnx.split(model)

        def body(_, state):
            m = nnx.merge(graphdef, state)
            m(x)
            return nnx.state(m)

        state = jax.lax.fori_loop(0, steps, body, state)
        m = nnx.merge(graphdef, state)
        return m.mean[...], m.var[...]

    return jax.jit(loop)


F32_STAT_CASES = [("linen", 2, "bfloat16"), ("linen", "inf", "float16"),
                  ("nnx", 2, "float16"), ("nnx", 1, "bfloat16")]


@pytest.mark.parametrize(("framework", "p", "dtype_name"), F32_STAT_CASES)
@fuzz(3)
@given(seed=st.integers(0, 2**16), loc=st.sampled_from((5.0, -40.0, 0.3)))
def test_running_statistics_averaged_in_float32(framework, dtype_name, p, seed, loc):
    """bf16 / f16 input: after 60 updates the running mean and variance equal those of the float32 input
    holding the same values to float32 precision (rtol 1e-5), not to the input's (~1e-2 / 1e-3)."""
    x = jnp.asarray(np.random.default_rng(seed).normal(loc, 2.0, BN_SHAPE), np_dtype(dtype_name))
    loop = _bn_train_loop(framework, p, 60)
    mean_h, var_h = loop(x)
    mean_f, var_f = loop(x.astype(jnp.float32))
    assert mean_h.dtype == var_h.dtype == jnp.float32
    np.testing.assert_allclose(mean_h, mean_f, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(var_h, var_f, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------------
# 6. unit_norm and the weight normalizations at zero units and huge entries


@fuzz(8)
@given(dtype_name=st.sampled_from(DTYPES), seed=st.integers(0, 2**16), units=st.integers(1, 4))
def test_unit_norm_gradient_at_a_zero_unit_is_finite(dtype_name, seed, units):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=KERNEL_SHAPE)
    w[..., :units] = 0.0
    with dtype_context(dtype_name):
        wd = jnp.asarray(w, np_dtype(dtype_name))
        norms, grad = _unit_norm_value_and_grad(wd)
        assert np.all(np.isfinite(np.asarray(grad, np.float64))), "unit_norm's gradient at a zero unit"
        np.testing.assert_array_equal(np.asarray(norms)[:units], 0.0)
        np.testing.assert_allclose(np.asarray(norms, np.float64), unit_norms(np.asarray(wd, np.float64)),
                                   rtol=1e-2 if dtype_name == "bfloat16" else 1e-3)


@jax.jit
def _unit_norm_value_and_grad(w):
    norms = F.unit_norm(w)
    return norms, jax.grad(lambda w: F.unit_norm(w).sum())(w)


@fuzz(10)
@given(seed=st.integers(0, 2**16), exponent=st.sampled_from((19, 20, 26, 30, 35)),
       name=st.sampled_from(["unit_norm", "weight_norm", "scaled_weight_norm", "bounded_weight_norm",
                             "project_to_norm", "weight_standardization"]))
def test_weight_functions_exact_on_huge_float32_kernels(seed, exponent, name):
    """Entries of 1e19 .. 1e35 in float32 (squares overflow): finite, and equal to the float64 oracle."""
    w = np.random.default_rng(seed).normal(size=KERNEL_SHAPE) * 10.0**exponent
    wd = jnp.asarray(w, jnp.float32)
    y, gx, gp = run(name, None, wd)
    want = oracle_weight(name, np.asarray(wd, np.float64), jax.tree.map(np.asarray, _made(name, None)[1]))
    y64 = np.asarray(y, np.float64)
    assert np.all(np.isfinite(y64)) and all_finite(gx) and all_finite(gp)
    np.testing.assert_allclose(y64, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


def test_unit_norm_of_1e20_kernel():
    """The issue's example: float32 entries of 1e20 (|x| >= 1e19 came out as zeros)."""
    w = np.full((3, 5), 1e20, np.float32)
    w[:, 1] = -3e20
    got, grad = _unit_norm_value_and_grad(jnp.asarray(w))
    np.testing.assert_allclose(np.asarray(got, np.float64), unit_norms(w), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(grad), w / unit_norms(w), rtol=1e-5)


# ---------------------------------------------------------------------------------------------------
# 2'. The issue's constant examples, exactly


@functools.partial(jax.jit, static_argnames="p")
def _issue_constants(p):
    c, row = 12345.678, 1.2345678e6
    return (F.batch_norm(jnp.full((64, 4), c), p=p), F.layer_norm(jnp.full((3, 16), row), p=p),
            F.group_norm(jnp.full((2, 4, 4, 6), c), 3, p=p), F.instance_norm(jnp.full((2, 4, 4, 6), -c), p=p),
            F.weight_standardization(jnp.full((3, 3, 4, 2), c)))


@pytest.mark.parametrize("p", P3)
def test_issue_constant_examples_are_exactly_zero(p):
    """``batch_norm(jnp.full((64, 4), 12345.678), p=1)`` gave max |y| 0.49, a layer-norm row of 1.2345678e6
    gave 1.0; with group, instance norm and weight standardization of constants: all exactly 0."""
    for label, y in zip(("batch_norm", "layer_norm", "group_norm", "instance_norm", "weight_standardization"),
                        _issue_constants(p), strict=True):
        assert float(jnp.abs(y).max()) == 0.0, label


# ---------------------------------------------------------------------------------------------------
# 7. linen and NNX InstanceNorm agree bit for bit in float16


@functools.cache
def _instance_norms(p, module_dtype):
    """jitted (flax linen, flax NNX, jaxnorm linen, jaxnorm NNX) InstanceNorm outputs, init-time params."""
    dt = None if module_dtype is None else jnp.dtype(module_dtype)

    def nnx_call(cls, **kwargs):
        graphdef, state = nnx.split(cls(4, dtype=dt, rngs=nnx.Rngs(0), **kwargs))
        return jax.jit(lambda state, x: nnx.merge(graphdef, state)(x)), state

    flax_nnx, flax_state = nnx_call(nnx.InstanceNorm)
    ours_nnx, ours_state = nnx_call(jnnx.InstanceNorm, p=p)
    flax_linen, ours_linen = fnn.InstanceNorm(dtype=dt), jn.InstanceNorm(dtype=dt, p=p)
    return (jax.jit(lambda x: flax_linen.init_with_output(KEY, x)[0]),
            functools.partial(flax_nnx, flax_state),
            jax.jit(lambda x: ours_linen.init_with_output(KEY, x)[0]),
            functools.partial(ours_nnx, ours_state))


@pytest.mark.parametrize("module_dtype", [None, "float16"])
@pytest.mark.parametrize("p", [2, "inf"])
@fuzz(4)
@given(seed=st.integers(0, 2**16), loc=st.sampled_from((0.0, 3.0, -100.0)),
       scale=st.sampled_from((0.1, 1.0, 50.0)))
def test_linen_and_nnx_instance_norm_agree_bitwise_in_float16(p, module_dtype, seed, loc, scale):
    """float16 input (and module dtype None or float16): jaxnorm's linen and NNX InstanceNorm give the
    same bits, as flax.linen's and flax.nnx's do (checked too, so that the requirement stays fair)."""
    x = jnp.asarray(np.random.default_rng(seed).normal(loc, scale, IMG_SHAPE), jnp.float16)
    flax_linen, flax_nnx, ours_linen, ours_nnx = (f(x) for f in _instance_norms(p, module_dtype))
    assert flax_linen.dtype == flax_nnx.dtype, "flax's own twins differ"
    assert bool(jnp.all(flax_linen == flax_nnx)), "flax's own twins differ"
    assert ours_linen.dtype == ours_nnx.dtype
    np.testing.assert_array_equal(np.asarray(ours_linen, np.float32), np.asarray(ours_nnx, np.float32))
    if p == 2:
        assert ours_linen.dtype == flax_linen.dtype


# ---------------------------------------------------------------------------------------------------
# p = 2 on huge activations (the sums of squares overflow the dtype; the statistics keep such groups in
# a unit, jaxnorm.functional.units; the float64-oracle comparison is tests/test_functional_overflow.py)


P2_CASES = [(n, d) for n, p, d in CASES if p == 2 and SPECS[n].centered]


@pytest.mark.parametrize(("name", "dtype_name"), P2_CASES, ids=[f"{n}-{d}" for n, d in P2_CASES])
def test_p2_huge_input_is_finite(name, dtype_name):
    """Huge input at p = 2 on fixed examples (everywhere, or in one group): finite output and gradient
    (instance norm gave NaN before its statistics kept huge groups in a unit)."""
    spec = SPECS[name]
    with dtype_context(dtype_name):
        for kind in ("huge", "huge_group"):
            for index in range(len(HUGE[dtype_name])):
                x, _ = make_input(spec, dtype_name, kind, 0, index)
                assert_finite(name, 2, x, run(name, 2, x), what=f"{kind} {dtype_name} input")
