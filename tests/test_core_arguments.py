"""Malformed arguments of the normalization core: every one is refused up front, by name (issue 14).

Acceptance tests of issue 14's "Every argument of every public function and module validated up front,
with an error that names it and says what is expected (types, ranges, shapes; NumPy integer scalars
accepted where Python ints are)".

1. ``MALFORMED``: one row per (callable, args, kwargs, expected exception types, argument name). Each
   call must raise a ``ValueError`` or ``TypeError`` whose message names the argument (a raw JAX or Python
   error such as "math domain error" or a broadcasting failure does not). Rows are written as a new user
   would call the public API: ``jaxnorm``, ``jaxnorm.functional``, ``jaxnorm.nn`` (constructed and
   ``init``-ed: the error must come at ``init``, not later) and ``jaxnorm.nnx`` (the constructor alone:
   NNX's ``init`` is the constructor), plus a few rows whose error depends on the input's shape and so
   can only come at an NNX module's first call.
2. ``ACCEPTED``: well-formed arguments that must keep working: NumPy integer scalars where Python ints
   are expected (``np.int64(2)`` from a config array), ``float("inf")``, the closed ends of the ranges
   (``momentum`` 0 and 1, ``epsilon=0``), giving the same result as the canonical spelling.
3. Flax parity: ``InstanceNorm`` with feature axes that include the batch axis raises flax's error
   (type and message); ``BatchNorm`` on complex input gives what flax gives (flax accepts it).

Only public names are used (the modules under ``jaxnorm.functional`` are being reorganised).
"""

import math
import re

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
_rng = np.random.default_rng(0)
X2 = jnp.asarray(_rng.normal(size=(16, 4)), jnp.float32)  # (batch, features)
X3 = jnp.asarray(_rng.normal(size=(4, 6, 4)), jnp.float32)  # (batch, length, channels)
X4 = jnp.asarray(_rng.normal(size=(4, 5, 5, 6)), jnp.float32)  # (batch, h, w, channels)
XI = jnp.arange(64, dtype=jnp.int32).reshape(16, 4)  # an integer activation
V2 = jnp.asarray(_rng.normal(size=(6, 4)), jnp.float32)  # Dense kernel (in, out)
W4 = jnp.asarray(_rng.normal(size=(3, 3, 2, 4)), jnp.float32)  # Conv kernel HWIO
VI = jnp.arange(24, dtype=jnp.int32).reshape(6, 4)
BAD_MASK = jnp.ones((16, 3), bool)  # does not broadcast to (16, 4)
NAN = float("nan")

BOTH = (ValueError, TypeError)


def linen(cls, x=X2, call=None, **fixed):
    """A callable ``kwargs -> variables``: construct the linen module and ``init`` it on ``x``."""

    def build(**kwargs):
        module = cls(**fixed, **kwargs)
        return module.init(KEY, x, **(call or {}))

    build.__name__ = f"nn.{cls.__name__}.init"
    return build


def linen_bn(x=X2, call=None, **fixed):
    return linen(jn.BatchNorm, x, call, use_running_average=False, **fixed)


def nnx_new(cls, *args, **fixed):
    """A callable ``kwargs -> module``: the NNX constructor alone (errors must come here)."""

    def build(**kwargs):
        return cls(*args, **fixed, **kwargs, rngs=nnx.Rngs(0))

    build.__name__ = f"nnx.{cls.__name__}"
    return build


def nnx_call(cls, x, *args, **fixed):
    """A callable ``kwargs -> output``: construct the NNX module and call it once (shape-dependent errors)."""

    def build(**kwargs):
        return cls(*args, **fixed, **kwargs, rngs=nnx.Rngs(0))(x)

    build.__name__ = f"nnx.{cls.__name__}(x)"
    return build


def nnx_bn_evaluation(mask):
    """NNX BatchNorm in evaluation, called with ``mask`` (unused there, checked all the same)."""
    return jnnx.BatchNorm(4, use_running_average=True, rngs=nnx.Rngs(0))(X2, mask=mask)


def vmapped_bn(**kwargs):
    """batch_norm under a named vmap axis (for options that cannot be combined with ``axis_name``)."""
    return jax.vmap(lambda xl: F.batch_norm(xl, axis_name="d", **kwargs), axis_name="d")(X2.reshape(2, 8, 4))


def _short(value):
    """A readable test id for an argument: arrays as ``dtype[shape]``."""
    if hasattr(value, "shape") and hasattr(value, "dtype") and np.ndim(value) > 0:
        return f"{jnp.dtype(value.dtype).name}{list(value.shape)}"
    if isinstance(value, type):
        return value.__name__
    return repr(value)


def case(fn, args, kwargs, name, exc=BOTH):
    first = args[:1] if args and not hasattr(args[0], "shape") else ()
    parts = [_short(a) for a in first + tuple(args[1:])] + [f"{k}={_short(v)}" for k, v in kwargs.items()]
    label = f"{getattr(fn, '__name__', fn)}({', '.join(parts)})"
    if args and hasattr(args[0], "dtype") and not jnp.issubdtype(args[0].dtype, jnp.floating):
        label += f"-{jnp.dtype(args[0].dtype).name}"
    return pytest.param(fn, args, kwargs, exc, name, id=label)


MALFORMED = [
    # --- p: only 1, 2, "inf" (and float("inf"))
    case(F.batch_norm, (X2,), dict(p=3), "p"),
    case(F.batch_norm, (X2,), dict(p=0), "p"),
    case(F.batch_norm, (X2,), dict(p=1.5), "p"),
    case(F.batch_norm, (X2,), dict(p="two"), "p"),
    case(F.batch_norm, (X2,), dict(p=None), "p"),
    case(F.batch_norm, (X2,), dict(p=True), "p"),
    case(F.batch_stats, (X2,), dict(p=-1), "p"),
    case(F.batch_moments, (X2,), dict(p=float("-inf")), "p"),
    case(F.layer_norm, (X2,), dict(p=3), "p"),
    case(F.group_norm, (X4, 2), dict(p=4), "p"),
    case(F.instance_norm, (X4,), dict(p=0.5), "p"),
    case(linen_bn(), (), dict(p=3), "p"),
    case(linen(jn.LayerNorm), (), dict(p="l1"), "p"),
    case(linen(jn.GroupNorm, X4, num_groups=2), (), dict(p=3), "p"),
    case(linen(jn.InstanceNorm, X4), (), dict(p=3), "p"),
    case(nnx_new(jnnx.BatchNorm, 4), (), dict(p=3), "p"),
    case(nnx_new(jnnx.LayerNorm, 4), (), dict(p=3), "p"),
    case(nnx_new(jnnx.GroupNorm, 6, 2), (), dict(p=3), "p"),
    case(nnx_new(jnnx.InstanceNorm, 6), (), dict(p=3), "p"),
    # --- axes: out of range, None where a feature axis is required, repeated
    case(F.batch_norm, (X2,), dict(axis=2), "axis"),
    case(F.batch_norm, (X2,), dict(axis=None), "axis"),
    case(F.batch_stats, (X2,), dict(axis=(1, 1)), "axis"),
    case(F.batch_stats, (X2,), dict(axis=1.0), "axis"),
    case(F.layer_norm, (X2,), dict(axis=-3), "axis"),
    case(F.layer_norm, (X2,), dict(axis=None), "axis"),
    case(F.layer_norm, (X2,), dict(axis=()), "axis"),  # an empty reduction: every element maps to 0
    case(F.rms_norm, (X2,), dict(axis=5), "axis"),
    case(F.rms_norm, (X2,), dict(axis=None), "axis"),
    case(F.rms_norm, (X2,), dict(axis=()), "axis"),  # x / sqrt(x^2 + eps): about sign(x)
    case(linen_bn(), (), dict(axis=3), "axis"),
    case(linen_bn(), (), dict(axis=None), "axis"),
    case(linen(jn.LayerNorm), (), dict(reduction_axes=4), "reduction_axes"),
    case(linen(jn.LayerNorm), (), dict(feature_axes=4), "feature_axes"),
    case(linen(jn.RMSNorm), (), dict(reduction_axes=4), "reduction_axes"),
    case(linen(jn.GroupNorm, X4, num_groups=2), (), dict(reduction_axes=7), "reduction_axes"),
    case(nnx_call(jnnx.BatchNorm, X2, 4), (), dict(axis=3), "axis"),
    case(nnx_call(jnnx.LayerNorm, X2, 4), (), dict(reduction_axes=4), "reduction_axes"),
    case(nnx_call(jnnx.RMSNorm, X2, 4), (), dict(reduction_axes=4), "reduction_axes"),
    # --- num_groups / group_size
    case(F.group_norm, (X4, 4), {}, "num_groups"),
    case(F.group_norm, (X4, 0), {}, "num_groups"),
    case(F.group_norm, (X4, 2.5), {}, "num_groups"),
    case(F.group_norm, (X4, None), {}, "num_groups"),
    case(F.group_norm, (X4, "2"), {}, "num_groups"),
    case(linen(jn.GroupNorm, X4), (), dict(num_groups=0), "num_groups"),
    case(nnx_new(jnnx.GroupNorm, 6), (), dict(num_groups=0), "num_groups"),
    case(linen(jn.GroupNorm, X4), (), dict(num_groups=4), "num_groups"),
    case(linen(jn.GroupNorm, X4), (), dict(num_groups=None, group_size=4), "group_size"),
    case(linen(jn.GroupNorm, X4), (), dict(num_groups=None, group_size=None), "num_groups|group_size"),
    case(linen(jn.GroupNorm, X4), (), dict(num_groups=2, group_size=3), "num_groups|group_size"),
    case(nnx_new(jnnx.GroupNorm, 6), (), dict(num_groups=4), "num_groups"),
    case(nnx_new(jnnx.GroupNorm, 6), (), dict(num_groups=2.5), "num_groups"),
    case(nnx_new(jnnx.GroupNorm, 6), (), dict(num_groups=None, group_size=4), "group_size"),
    # --- topk: a positive int, at most the reduction size, only with p="inf"
    case(F.batch_norm, (X2,), dict(p="inf", topk=17), "topk"),
    case(F.batch_norm, (X2,), dict(p="inf", topk=2.5), "topk"),
    case(F.batch_norm, (X2,), dict(p="inf", topk=0), "topk"),
    case(F.batch_stats, (X2,), dict(p="inf", topk=-3), "topk"),
    case(F.batch_norm, (X2,), dict(p=2, topk=3), "topk"),
    case(F.batch_norm, (X2,), dict(p="inf", topk=True), "topk"),
    case(F.batch_norm, (X2,), dict(p="inf", topk=5, virtual_batch_size=4), "topk"),
    case(linen_bn(), (), dict(p="inf", topk=17), "topk"),
    case(linen_bn(), (), dict(p="inf", topk=2.5), "topk"),
    case(nnx_new(jnnx.BatchNorm, 4), (), dict(p="inf", topk=2.5), "topk"),
    case(nnx_new(jnnx.BatchNorm, 4), (), dict(p="inf", topk=0), "topk"),
    case(nnx_new(jnnx.BatchNorm, 4), (), dict(p=1, topk=3), "topk"),
    case(F.expected_topk_abs_normal, (10,), dict(k=2.5), "k"),
    case(F.expected_topk_abs_normal, (10,), dict(k=0), "k"),
    case(F.expected_topk_abs_normal, (10,), dict(k=-1), "k"),
    # --- calibration
    case(F.batch_norm, (X2,), dict(p=2, calibration="exact"), "calibration"),
    case(F.batch_norm, (X2,), dict(p="inf", calibration="unbiased"), "calibration"),
    case(linen_bn(), (), dict(p="inf", calibration="bogus"), "calibration"),
    case(nnx_new(jnnx.BatchNorm, 4), (), dict(p="inf", calibration="bogus"), "calibration"),
    # --- epsilon: a finite number >= 0
    case(F.batch_norm, (X2,), dict(epsilon=-1e-5), "epsilon"),
    case(F.batch_norm, (X2,), dict(p=1, epsilon=NAN), "epsilon"),
    case(F.batch_norm, (X2,), dict(epsilon="1e-5"), "epsilon"),
    case(F.layer_norm, (X2,), dict(epsilon=-1.0), "epsilon"),
    case(F.group_norm, (X4, 2), dict(epsilon=-1.0), "epsilon"),
    case(F.instance_norm, (X4,), dict(epsilon=NAN), "epsilon"),
    case(F.rms_norm, (X2,), dict(epsilon=-1.0), "epsilon"),
    case(F.normalize, (X2, X2.mean(0), X2.var(0)), dict(epsilon=-1.0), "epsilon"),
    case(F.unit_norm, (V2,), dict(epsilon=-1.0), "epsilon"),
    case(F.project_to_norm, (V2, 1.0), dict(epsilon=-1.0), "epsilon"),
    case(F.weight_norm, (V2, 1.0), dict(epsilon=-1.0), "epsilon"),
    case(F.weight_norm, (V2, 1.0), dict(epsilon=NAN), "epsilon"),
    case(F.scaled_weight_norm, (V2, 1.0), dict(epsilon=-1.0), "epsilon"),
    case(F.bounded_weight_norm, (V2, 1.0), dict(epsilon=-1.0), "epsilon"),
    case(F.weight_standardization, (W4,), dict(epsilon=-1.0), "epsilon"),
    case(F.weight_norm_data_init, (X2,), dict(epsilon=-1.0), "epsilon"),
    case(linen_bn(), (), dict(epsilon=-1.0), "epsilon"),
    case(linen(jn.LayerNorm), (), dict(epsilon=NAN), "epsilon"),
    case(linen(jn.RMSNorm), (), dict(epsilon=-1.0), "epsilon"),
    case(linen(jn.InstanceNorm, X4), (), dict(epsilon=-1.0), "epsilon"),
    case(nnx_new(jnnx.BatchNorm, 4), (), dict(epsilon=-1.0), "epsilon"),
    case(nnx_new(jnnx.LayerNorm, 4), (), dict(epsilon=NAN), "epsilon"),
    case(nnx_new(jnnx.GroupNorm, 6, 2), (), dict(epsilon=-1.0), "epsilon"),
    case(nnx_new(jnnx.RMSNorm, 4), (), dict(epsilon=-1.0), "epsilon"),
    case(nnx_new(jnnx.InstanceNorm, 6), (), dict(epsilon=-1.0), "epsilon"),
    case(linen(jn.WeightNormDense, X2, features=3), (), dict(epsilon=-1.0), "epsilon"),
    case(nnx_new(jnnx.WeightNormDense, 4, 3), (), dict(epsilon=-1.0), "epsilon"),
    case(linen(jn.WSConv, X4, features=3, kernel_size=(3, 3)), (), dict(epsilon=-1.0), "epsilon"),
    case(nnx_new(jnnx.WSConv, 6, 3, (3, 3)), (), dict(epsilon=-1.0), "epsilon"),
    # --- momentum in [0, 1]
    case(linen_bn(), (), dict(momentum=1.5), "momentum"),
    case(linen_bn(), (), dict(momentum=-0.1), "momentum"),
    case(linen_bn(), (), dict(momentum=NAN), "momentum"),
    case(nnx_new(jnnx.BatchNorm, 4), (), dict(momentum=1.5), "momentum"),
    case(nnx_new(jnnx.BatchNorm, 4), (), dict(momentum=-0.1), "momentum"),
    # --- boolean flags
    case(F.batch_norm, (X2,), dict(mean_only="no"), "mean_only"),
    case(F.batch_moments, (X2,), dict(mean_only=1), "mean_only"),
    case(F.batch_norm, (X2,), dict(use_fast_variance="no"), "use_fast_variance"),
    case(F.batch_moments, (X2,), dict(keepdims="yes"), "keepdims"),
    case(F.layer_norm, (X2,), dict(use_fast_variance="no"), "use_fast_variance"),
    case(linen_bn(), (), dict(mean_only="no"), "mean_only"),
    case(nnx_new(jnnx.BatchNorm, 4), (), dict(mean_only="no"), "mean_only"),
    # --- ghost batches
    case(F.batch_norm, (X2,), dict(virtual_batch_size=3), "virtual_batch_size"),
    case(F.batch_norm, (X2,), dict(virtual_batch_size=0), "virtual_batch_size"),
    case(F.batch_norm, (X2,), dict(virtual_batch_size=2.5), "virtual_batch_size"),
    case(F.batch_norm, (X2,), dict(virtual_batch_size=4, axis=(0, 1)), "virtual_batch_size|axis"),
    case(vmapped_bn, (), dict(virtual_batch_size=4), "virtual_batch_size|axis_name"),
    case(linen_bn(), (), dict(virtual_batch_size=3), "virtual_batch_size"),
    case(nnx_new(jnnx.BatchNorm, 4), (), dict(virtual_batch_size=0), "virtual_batch_size"),
    case(nnx_new(jnnx.BatchNorm, 4), (), dict(virtual_batch_size=2.5), "virtual_batch_size"),
    # --- dtypes
    case(F.batch_norm, (XI,), {}, "x", TypeError),
    case(F.batch_stats, (XI,), dict(p=1), "x", TypeError),
    case(F.layer_norm, (XI,), {}, "x", TypeError),
    case(F.rms_norm, (XI,), {}, "x", TypeError),
    case(F.group_norm, (XI.reshape(4, 4, 4), 2), {}, "x", TypeError),
    case(F.unit_norm, (VI,), {}, "w", TypeError),
    case(F.weight_norm, (VI, 1.0), {}, "v", TypeError),
    case(F.weight_standardization, (VI,), {}, "w", TypeError),
    case(F.weight_norm_data_init, (XI,), {}, "pre_activations", TypeError),
    case(F.normprop_relu, (XI,), {}, "u", TypeError),
    # --- an axis_name that no enclosing pmap / shard_map / vmap binds
    case(F.batch_norm, (X2,), dict(axis_name="batch"), "axis_name", (ValueError, TypeError, NameError)),
    case(F.layer_norm, (X2,), dict(axis_name="model"), "axis_name", (ValueError, TypeError, NameError)),
    # --- masks
    case(F.batch_norm, (X2,), dict(mask=BAD_MASK), "mask"),
    case(F.batch_norm, (X2,), dict(mask=jnp.ones((16, 4), jnp.float32)), "mask"),
    case(F.layer_norm, (X2,), dict(mask=BAD_MASK), "mask"),
    case(F.group_norm, (X4, 2), dict(mask=jnp.ones((4, 5, 5, 4), bool)), "mask"),
    case(F.instance_norm, (X4,), dict(mask=jnp.ones((3, 5, 5, 6), bool)), "mask"),
    case(F.rms_norm, (X2,), dict(mask=BAD_MASK), "mask"),
    case(linen_bn(call=dict(mask=BAD_MASK)), (), {}, "mask"),
    case(linen(jn.LayerNorm, call=dict(mask=BAD_MASK)), (), {}, "mask"),
    # --- shapes of scale / bias / g / rho / gain
    case(F.rms_norm, (X2,), dict(scale=jnp.ones(3)), "scale"),
    case(F.normalize, (X2, X2.mean(0), X2.var(0)), dict(scale=jnp.ones(3)), "scale"),
    case(F.normalize, (X2, X2.mean(0), X2.var(0)), dict(bias=jnp.ones((2, 4))), "bias"),
    case(F.normalize, (X2, jnp.zeros(3), X2.var(0)), {}, "mean"),
    case(F.normalize, (X2, X2.mean(0), jnp.ones(3)), {}, "var"),
    case(F.normalize, (X2, X2.mean(0), X2.var(0)), dict(dtype=jnp.int32), "dtype"),
    case(F.weight_norm, (V2, jnp.ones(3)), {}, "g"),
    case(F.scaled_weight_norm, (V2, jnp.ones(5)), {}, "g"),
    case(F.bounded_weight_norm, (V2, jnp.ones(3)), {}, "rho"),
    case(F.project_to_norm, (V2, jnp.ones(3)), {}, "rho"),
    case(F.weight_standardization, (W4,), dict(gain=jnp.ones(3)), "gain"),
    # --- gain / rho values
    case(F.scaled_weight_norm, (V2, 1.0), dict(gain=0.0), "gain"),
    case(F.scaled_weight_norm, (V2, 1.0), dict(gain=-2.0), "gain"),
    case(F.scaled_weight_norm, (V2, 1.0), dict(gain=NAN), "gain"),
    case(F.scaled_weight_norm, (V2, 1.0), dict(gain="2"), "gain"),
    case(F.bounded_weight_norm, (V2, 0.0), {}, "rho"),
    case(F.project_to_norm, (V2, NAN), {}, "rho"),
    case(F.bounded_weight_norm, (V2, -1.0), {}, "rho"),
    case(F.project_to_norm, (V2, -1.0), {}, "rho"),
    case(linen(jn.ScaledWeightNormDense, X2, features=3), (), dict(gain=0.0), "gain"),
    case(linen(jn.ScaledWeightNormDense, X2, features=3), (), dict(gain=-2.0), "gain"),
    case(nnx_new(jnnx.ScaledWeightNormDense, 4, 3), (), dict(gain=-2.0), "gain"),
    case(linen(jn.WeightNormDense, X2, features=3), (), dict(g_init="bogus"), "g_init"),
    case(nnx_new(jnnx.WeightNormDense, 4, 3), (), dict(g_init="bogus"), "g_init"),
    # --- inputs of the wrong rank
    case(F.instance_norm, (X2,), {}, "x|input"),
    case(F.group_norm, (jnp.ones(6), 2), {}, "x|input"),
    case(F.weight_standardization, (jnp.ones(4),), {}, "w"),
    case(F.unit_norm, (jnp.ones(4),), {}, "w"),
    case(F.weight_norm, (jnp.ones(4), 1.0), {}, "v"),
    case(F.fans, ((5,),), {}, "shape"),
    case(F.linf_constant, ("a",), {}, "n"),
    case(F.scaled_weight_norm, (jnp.ones((3, 0)), 1.0), {}, "v|shape"),  # a kernel without units
    case(F.batch_norm, (jnp.ones((1, 4)),), {}, "batch|x"),
    # --- module flags and parameter dtypes (flax takes any value's truthiness, and integer parameters;
    # these were accepted before, 'no' as True; a zero size raised ZeroDivisionError)
    case(linen(jn.LayerNorm), (), dict(use_bias="no"), "use_bias", TypeError),
    case(linen(jn.RMSNorm), (), dict(use_scale=1), "use_scale", TypeError),
    case(linen(jn.GroupNorm, X4, num_groups=2), (), dict(param_dtype=jnp.int32), "param_dtype", TypeError),
    case(linen(jn.BatchNorm), (), dict(use_running_average="no"), "use_running_average", TypeError),
    case(nnx_new(jnnx.LayerNorm, 4), (), dict(use_scale="no"), "use_scale", TypeError),
    case(nnx_new(jnnx.RMSNorm, 4), (), dict(param_dtype=jnp.int8), "param_dtype", TypeError),
    # --- an integer compute dtype (accepted before for every layer but BatchNorm: the output was
    # truncated to integers; flax raises at the first call, ours at init / construction)
    *(
        case(build, (), dict(dtype=jnp.int32), "dtype", TypeError)
        for build in (
            linen_bn(),
            linen(jn.LayerNorm),
            linen(jn.RMSNorm),
            linen(jn.GroupNorm, X4, num_groups=2),
            linen(jn.InstanceNorm, X4),
            linen(jn.WeightNormDense, X2, features=3),
            linen(jn.WSConv, X4, features=3, kernel_size=(3, 3)),
            nnx_new(jnnx.BatchNorm, 4),
            nnx_new(jnnx.LayerNorm, 4),
            nnx_new(jnnx.RMSNorm, 4),
            nnx_new(jnnx.GroupNorm, 6, num_groups=2),
            nnx_new(jnnx.InstanceNorm, 6),
            nnx_new(jnnx.WeightNormDense, 4, 3),
            nnx_new(jnnx.WSConv, 2, 3, kernel_size=(3, 3)),
        )
    ),
    # --- module arguments the module fuzz of 2026-12-02 found accepted, or refused with a raw error
    case(nnx_new(jnnx.LayerNorm, 0), (), {}, "num_features"),
    case(nnx_new(jnnx.LayerNorm, -3), (), {}, "num_features"),
    case(nnx_new(jnnx.BatchNorm, 8.0), (), {}, "num_features", TypeError),
    case(nnx_new(jnnx.RMSNorm, 0), (), {}, "num_features"),
    case(F.bounded_weight_norm_rho, (V2.at[:, 1].set(0),), {}, "v"),  # a zero unit: rho 0 for ever
    case(nnx_new(jnnx.WeightNormDense, 6, 3), (), dict(data_init_epsilon=-1.0), "data_init_epsilon"),
    case(linen(jn.WeightNormDense, X2, features=3), (), dict(data_init_epsilon=-1.0), "data_init_epsilon"),
    case(linen(jn.WSConv, X4, features=4, kernel_size=(3, 3)), (), dict(feature_group_count=0),
         "feature_group_count"),
    case(linen(jn.WSConv, X4, features=4, kernel_size=(3, 3)), (), dict(strides=0), "strides"),
    case(linen(jn.WSConv, X4, features=4, kernel_size=(3, 3)), (), dict(input_dilation=0), "input_dilation"),
    case(linen(jn.WSConv, X4, features=4, kernel_size=(3, 3)), (), dict(kernel_dilation=(1,)),
         "kernel_dilation"),
    case(linen(jn.WSConv, X4, features=4), (), dict(kernel_size=3), "kernel_size"),  # as flax.linen
    case(linen(jn.WSConv, X2, features=4), (), dict(kernel_size=(3, 3)), "x"),  # 1 spatial axis, 2 asked
    case(nnx_new(jnnx.WSConv, 2, 3, kernel_size=(3, 3)), (), dict(strides=(1, 0)), "strides"),
    case(nnx_new(jnnx.WSConv, 2, 3, kernel_size=(3, 3)), (), dict(padding=(1, 1, 1)), "padding"),
    case(linen(jn.LayerNorm, X3), (), dict(reduction_axes=()), "reduction_axes"),
    case(linen(jn.RMSNorm), (), dict(use_fast_variance="no"), "use_fast_variance", TypeError),
    case(linen(jn.LayerNorm), (), dict(force_float32_reductions="no"), "force_float32_reductions", TypeError),
    case(linen_bn(), (), dict(force_float32_reductions=None), "force_float32_reductions", TypeError),
    case(nnx_new(jnnx.LayerNorm, 4), (), dict(use_fast_variance="no"), "use_fast_variance", TypeError),
    case(nnx_new(jnnx.RMSNorm, 4), (), dict(use_fast_variance="no"), "use_fast_variance", TypeError),
    case(linen(jn.BatchNorm, call=dict(mask=BAD_MASK)), (), dict(use_running_average=True), "mask"),
    case(linen(jn.BatchNorm, call=dict(mask=jnp.ones((16, 4), jnp.int32))), (),
         dict(use_running_average=True), "mask"),
    case(nnx_bn_evaluation, (BAD_MASK,), {}, "mask"),
    case(F.layers.group_norm_layer, (X4,), dict(scale=None, bias=None, num_groups=2, dtype="int8"), "dtype",
         TypeError),
    case(nnx_new(jnnx.BatchNorm, 4), (), dict(use_running_average="no"), "use_running_average", TypeError),
    case(
        nnx_call(jnnx.BatchNorm, X2, 4, use_running_average=None), (), {}, "use_running_average", ValueError
    ),
    case(linen(jn.BoundedWeightNormDense, X2, features=3), (), dict(per_unit="no"), "per_unit", TypeError),
    case(nnx_new(jnnx.BoundedWeightNormDense, 4, 3), (), dict(per_unit="no"), "per_unit", TypeError),
    case(linen(jn.WSConv, X4, features=3, kernel_size=(3, 3)), (), dict(use_gain=1), "use_gain", TypeError),
    case(nnx_new(jnnx.WSConv, 4, 3, (3, 3)), (), dict(use_gain="yes"), "use_gain", TypeError),
    case(linen(jn.WeightNormDense, X2), (), dict(features=0), "features", ValueError),
    case(linen(jn.WeightNormConv, X4, features=3), (), dict(kernel_size=(0, 3)), "kernel_size", ValueError),
    case(nnx_new(jnnx.WeightNormDense, 4), (), dict(out_features=0), "out_features", ValueError),
    case(nnx_new(jnnx.WeightNormDense, 4, 3), (), dict(use_bias="no"), "use_bias", TypeError),
    # --- magnitude-preserving blocks (EDM2)
    case(F.mp_weight, (V2,), dict(gain=0.0), "gain"),
    case(F.mp_weight, (V2,), dict(gain=jnp.ones((V2.shape[0], 1))), "gain"),  # scaled input rows
    case(F.mp_weight, (V2,), dict(epsilon=-1.0), "epsilon"),
    case(F.mp_weight, (jnp.ones(4),), {}, "v"),
    case(F.mp_weight, (VI,), {}, "v", TypeError),
    case(F.mp_normalize, (V2,), dict(epsilon=NAN), "epsilon"),
    case(F.mp_normalize, (jnp.ones((3, 0)),), {}, "v"),
    case(F.mp_silu, (XI,), {}, "x", TypeError),
    case(F.mp_sum, (X2, X2), dict(t=1.5), "t"),
    case(F.mp_sum, (X2, X2), dict(t="0.3"), "t"),
    case(F.mp_sum, (X2, V2), {}, "a and b"),
    case(F.mp_sum, (XI, XI), {}, "a", TypeError),
    case(F.mp_concat, (X2, X2), dict(t=-0.1), "t"),
    case(F.mp_concat, (X2, X2), dict(axis=2), "axis"),
    case(F.mp_concat, (X2, X3), {}, "a and b"),
    case(F.mp_concat, (X2, V2), dict(axis=-1), "a and b"),
]

_ARG = r"(?<![A-Za-z0-9_])({})(?![A-Za-z0-9_])"


def _name_pattern(name):
    """The argument's name as a word (``p`` must not match inside ``dtype``, ``shape`` or ``mean_only``)."""
    return _ARG.format(name)


@pytest.mark.parametrize(("fn", "args", "kwargs", "exc", "name"), MALFORMED)
def test_malformed_argument_raises_naming_it(fn, args, kwargs, exc, name):
    """The call raises ``ValueError``/``TypeError`` up front, naming the argument; linen modules at ``init``,
    NNX modules in their constructor (only shape-dependent errors wait for the first call)."""
    with pytest.raises(exc, match=_name_pattern(name)):
        jax.block_until_ready(fn(*args, **kwargs))


def test_topk_error_with_ghost_batches_names_them_and_the_callers_shape():
    """The reduction is per ghost batch: the message says so and shows ``x`` as passed, not the
    ``(num_ghosts, virtual_batch_size, ...)`` reshape it was measured on."""
    message = r"topk=5 .* ghost batch \(virtual_batch_size=4\) \(x.shape=\(16, 4\)"
    with pytest.raises(ValueError, match=message):
        F.batch_norm(X2, p="inf", topk=5, virtual_batch_size=4)


def test_malformed_table_covers_every_public_callable():
    """Every public function of the core and every normalization module (linen and NNX) has rows."""
    covered = {getattr(row.values[0], "__name__", "") for row in MALFORMED}
    functions = {n for n in F.__all__ if callable(getattr(F, n))} - {"linf_constant"}
    missing = {n for n in functions if n not in covered}
    modules = {f"nn.{n}.init" for n in ("BatchNorm", "LayerNorm", "GroupNorm", "RMSNorm", "InstanceNorm")}
    modules |= {f"nnx.{n}" for n in ("BatchNorm", "LayerNorm", "GroupNorm", "RMSNorm", "InstanceNorm")}
    missing |= modules - covered
    assert not missing, sorted(missing)
    assert len(MALFORMED) >= 60


# ---------------------------------------------------------------------------------------------------
# 2. Well-formed spellings that must be accepted, with the canonical result


def _conv(x=X4, **kwargs):
    """A weight-normalized linen conv, initialized and applied: its output."""
    module = jn.WeightNormConv(features=4, kernel_size=(3, 3), **kwargs)
    return module.apply(module.init(KEY, x), x)


def _nnx_conv(x=X4, **kwargs):
    return jnnx.WeightNormConv(6, 4, kernel_size=(3, 3), **kwargs, rngs=nnx.Rngs(0))(x)


ACCEPTED = [
    # (call, canonical call): both must run; results equal
    # NumPy integers in every convolution argument (they raised "'numpy.int64' object is not iterable")
    *(
        (f"{framework} {name}=np.int64({value})", lambda f=f, n=name, v=value: f(**{n: np.int64(v)}),
         lambda f=f, n=name, v=value: f(**{n: v}))
        for framework, f in (("nn conv", _conv), ("nnx conv", _nnx_conv))
        for name, value in (("strides", 2), ("kernel_dilation", 2), ("input_dilation", 1), ("padding", 1))
    ),
    (
        "nnx conv kernel_size=(np.int64(3), 3)",
        lambda: jnnx.WeightNormConv(6, 4, kernel_size=(np.int64(3), 3), rngs=nnx.Rngs(0))(X4),
        lambda: jnnx.WeightNormConv(6, 4, kernel_size=(3, 3), rngs=nnx.Rngs(0))(X4),
    ),
    ("p=np.int64(2)", lambda: F.batch_norm(X2, p=np.int64(2)), lambda: F.batch_norm(X2, p=2)),
    ("p=np.int64(1)", lambda: F.batch_norm(X2, p=np.int64(1)), lambda: F.batch_norm(X2, p=1)),
    ("p=np.float64(1)", lambda: F.layer_norm(X2, p=np.float64(1.0)), lambda: F.layer_norm(X2, p=1)),
    ("p=float(inf)", lambda: F.batch_norm(X2, p=float("inf")), lambda: F.batch_norm(X2, p="inf")),
    ("p=jnp.inf", lambda: F.group_norm(X4, 2, p=jnp.inf), lambda: F.group_norm(X4, 2, p="inf")),
    (
        "topk=np.int64(3)",
        lambda: F.batch_norm(X2, p="inf", topk=np.int64(3)),
        lambda: F.batch_norm(X2, p="inf", topk=3),
    ),
    ("topk=n", lambda: F.batch_norm(X2, p="inf", topk=16), lambda: F.batch_norm(X2, p="inf", topk=16)),
    ("num_groups=np.int64(3)", lambda: F.group_norm(X4, np.int64(3)), lambda: F.group_norm(X4, 3)),
    (
        "virtual_batch_size=np.int64(4)",
        lambda: F.batch_norm(X2, virtual_batch_size=np.int64(4)),
        lambda: F.batch_norm(X2, virtual_batch_size=4),
    ),
    ("axis=np.int64(-1)", lambda: F.batch_norm(X2, axis=np.int64(-1)), lambda: F.batch_norm(X2, axis=-1)),
    (
        "axis=np.int64 tuple",
        lambda: F.layer_norm(X4, axis=(np.int64(1), np.int64(2))),
        lambda: F.layer_norm(X4, axis=(1, 2)),
    ),
    (
        "k=np.int64(2)",
        lambda: F.expected_topk_abs_normal(10, k=np.int64(2)),
        lambda: F.expected_topk_abs_normal(10, k=2),
    ),
    ("epsilon=0 unit_norm", lambda: F.unit_norm(V2, epsilon=0.0), lambda: F.unit_norm(V2)),
    ("epsilon=0 batch_norm", lambda: F.batch_norm(X2, epsilon=0), lambda: (X2 - X2.mean(0)) / X2.std(0)),
    ("epsilon=np.float32", lambda: F.layer_norm(X2, epsilon=np.float32(1e-5)), lambda: F.layer_norm(X2)),
    (
        "mean_only=np.bool_",
        lambda: F.batch_norm(X2, mean_only=np.bool_(True)),
        lambda: F.batch_norm(X2, mean_only=True),
    ),
    (
        "gain=np.float64",
        lambda: F.scaled_weight_norm(V2, 1.0, gain=np.float64(2.0)),
        lambda: F.scaled_weight_norm(V2, 1.0, gain=2.0),
    ),
    (
        "gain=1/N",
        lambda: F.scaled_weight_norm(V2, 1.0, gain=1 / 3),
        lambda: F.scaled_weight_norm(V2, 1.0, gain=0.3333333333333333),
    ),
    (
        "rho per unit",
        lambda: F.bounded_weight_norm(V2, jnp.full(4, 2.0)),
        lambda: F.bounded_weight_norm(V2, 2.0),
    ),
    (
        "nn momentum=1",
        lambda: jn.BatchNorm(use_running_average=False, momentum=1.0).init(KEY, X2),
        lambda: jn.BatchNorm(use_running_average=False).init(KEY, X2),
    ),
    (
        "nn momentum=0",
        lambda: jn.BatchNorm(use_running_average=False, momentum=0.0).init(KEY, X2),
        lambda: jn.BatchNorm(use_running_average=False).init(KEY, X2),
    ),
    (
        "nn p=np.int64(1)",
        lambda: jn.BatchNorm(use_running_average=False, p=np.int64(1)).init(KEY, X2),
        lambda: jn.BatchNorm(use_running_average=False, p=1).init(KEY, X2),
    ),
    (
        "nn num_groups=np.int64(2)",
        lambda: jn.GroupNorm(num_groups=np.int64(2)).init(KEY, X4),
        lambda: jn.GroupNorm(num_groups=2).init(KEY, X4),
    ),
    (
        "nnx num_groups=np.int64(2)",
        lambda: jnnx.GroupNorm(6, np.int64(2), rngs=nnx.Rngs(0))(X4),
        lambda: jnnx.GroupNorm(6, 2, rngs=nnx.Rngs(0))(X4),
    ),
    (
        "nnx topk=np.int64(3)",
        lambda: jnnx.BatchNorm(4, p="inf", topk=np.int64(3), rngs=nnx.Rngs(0))(X2),
        lambda: jnnx.BatchNorm(4, p="inf", topk=3, rngs=nnx.Rngs(0))(X2),
    ),
]


@pytest.mark.parametrize(("label", "call", "canonical"), ACCEPTED, ids=[a[0] for a in ACCEPTED])
def test_wellformed_spelling_is_accepted(label, call, canonical):
    got, want = call(), canonical()
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------------
# 3. Flax parity: InstanceNorm's batch-axis error, complex BatchNorm


def _flax_instance_norm_error():
    with pytest.raises(ValueError) as info:
        fnn.InstanceNorm(feature_axes=(0, -1)).init(KEY, X3)
    return str(info.value)


FLAX_INSTANCE_MESSAGE = "channel axes cannot include the leading dimension"


def test_flax_instance_norm_message_is_what_we_match():
    """Guard: the message matched below is flax's (if flax rewords it, update FLAX_INSTANCE_MESSAGE)."""
    assert FLAX_INSTANCE_MESSAGE in _flax_instance_norm_error()


@pytest.mark.parametrize("feature_axes", [0, (0, -1), (0,)])
def test_linen_instance_norm_rejects_batch_axis_like_flax(feature_axes):
    with pytest.raises(ValueError, match=re.escape(FLAX_INSTANCE_MESSAGE)):
        jn.InstanceNorm(feature_axes=feature_axes).init(KEY, X3)


def test_linen_instance_norm_rejects_negative_batch_axis_like_flax():
    """``-3`` on a rank-3 input is the batch axis."""
    with pytest.raises(ValueError, match=re.escape(FLAX_INSTANCE_MESSAGE)):
        jn.InstanceNorm(feature_axes=(-3, -1)).init(KEY, X3)


@pytest.mark.parametrize("feature_axes", [0, (0, -1)])
def test_nnx_instance_norm_rejects_batch_axis_in_constructor(feature_axes):
    """A non-negative 0 is the batch axis whatever the input: the constructor can tell (flax.nnx only
    raises at the first call; the error is the same)."""
    with pytest.raises(ValueError, match=re.escape(FLAX_INSTANCE_MESSAGE)):
        jnnx.InstanceNorm(6, feature_axes=feature_axes, rngs=nnx.Rngs(0))


def test_nnx_instance_norm_rejects_negative_batch_axis_at_call():
    with pytest.raises(ValueError, match=re.escape(FLAX_INSTANCE_MESSAGE)):
        jnnx.InstanceNorm(4, feature_axes=(-3, -1), rngs=nnx.Rngs(0))(X3)


@pytest.mark.parametrize("framework", ["linen", "nnx"])
def test_instance_norm_without_spatial_axes_says_so(framework):
    """An input of only batch and features has nothing to normalize; the error named ``reduction_axes``,
    which InstanceNorm does not take (a helper's module fuzz)."""
    x = jnp.ones((8, 6))
    message = "InstanceNorm: x of shape (8, 6) has no axis to normalize over besides the batch axis 0"
    with pytest.raises(ValueError, match=re.escape(message)):
        if framework == "linen":
            jn.InstanceNorm().init(KEY, x)
        else:
            jnnx.InstanceNorm(6, rngs=nnx.Rngs(0))(x)


def _complex_input():
    rng = np.random.default_rng(3)
    return jnp.asarray(rng.normal(size=(16, 4)) + 1j * rng.normal(1.0, 2.0, size=(16, 4)), jnp.complex64)


def test_linen_batch_norm_complex_input_like_flax():
    """flax.linen.BatchNorm accepts complex input (complex mean, real variance E|x - mu|^2): so does ours,
    with the same output, running statistics and evaluation output."""
    xc = _complex_input()
    ours, theirs = jn.BatchNorm(use_running_average=False), fnn.BatchNorm(use_running_average=False)
    v_ours, v_theirs = ours.init(KEY, xc), theirs.init(KEY, xc)

    def kinds(tree):
        return jax.tree.map(lambda a: (a.shape, a.dtype), tree)

    assert kinds(v_ours) == kinds(v_theirs)
    y_ours, s_ours = ours.apply(v_ours, xc, mutable=["batch_stats"])
    y_theirs, s_theirs = theirs.apply(v_theirs, xc, mutable=["batch_stats"])
    assert y_ours.dtype == y_theirs.dtype
    np.testing.assert_allclose(y_ours, y_theirs, rtol=1e-5, atol=1e-5)
    for a, b in zip(jax.tree.leaves(s_ours), jax.tree.leaves(s_theirs), strict=True):
        assert a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    e_ours = jn.BatchNorm(use_running_average=True).apply({**v_ours, **s_ours}, xc)
    e_theirs = fnn.BatchNorm(use_running_average=True).apply({**v_theirs, **s_theirs}, xc)
    np.testing.assert_allclose(e_ours, e_theirs, rtol=1e-5, atol=1e-5)


def test_nnx_batch_norm_complex_input_like_flax():
    xc = _complex_input()
    ours = jnnx.BatchNorm(4, rngs=nnx.Rngs(0))
    theirs = nnx.BatchNorm(4, rngs=nnx.Rngs(0))
    y_ours, y_theirs = ours(xc), theirs(xc)
    assert y_ours.dtype == y_theirs.dtype
    np.testing.assert_allclose(y_ours, y_theirs, rtol=1e-5, atol=1e-5)
    for name in ("mean", "var"):
        a, b = getattr(ours, name)[...], getattr(theirs, name)[...]
        assert a.dtype == b.dtype, name
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


COMPLEX_LAYERS = {
    # name: (constructor kwargs for linen and NNX, NNX num_features, input shape, mask)
    "LayerNorm": ({}, 6, (4, 3, 6), None),
    "LayerNorm-two-pass-masked": ({"use_fast_variance": False}, 6, (4, 3, 6), "mask"),
    "RMSNorm": ({}, 6, (4, 3, 6), None),
    "GroupNorm": ({"num_groups": 2}, 6, (2, 4, 3, 6), None),
    "GroupNorm-group-size-masked": ({"num_groups": None, "group_size": 3}, 6, (2, 4, 3, 6), "mask"),
    "InstanceNorm": ({}, 6, (2, 4, 3, 6), None),
}


@pytest.mark.parametrize("framework", ["linen", "nnx"])
@pytest.mark.parametrize("name", sorted(COMPLEX_LAYERS))
def test_per_example_norms_take_complex_input_like_flax(name, framework):
    """flax's LayerNorm, RMSNorm, GroupNorm and InstanceNorm accept complex input (complex mean, real
    variance ``E|x - mu|^2``; RMS: ``E|x|^2``): ours give the same numbers, bit for bit, and the same dtype
    (before: a TypeError)."""
    kwargs, features, shape, masked = COMPLEX_LAYERS[name]
    layer = name.split("-")[0]
    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.normal(size=shape) + 1j * rng.normal(0.5, 2.0, size=shape), jnp.complex64)
    mask = None if masked is None else jnp.asarray(rng.random(shape) < 0.7)
    if framework == "linen":
        ours, theirs = getattr(jn, layer)(**kwargs), getattr(fnn, layer)(**kwargs)
        variables = theirs.init(KEY, x)
        variables = jax.tree.map(lambda a: a * (1.5 - 0.5j) if a.ndim else a, variables)  # non-trivial affine
        y_ours = ours.apply(variables, x, mask=mask)
        y_theirs = theirs.apply(variables, x, mask=mask)
    else:
        y_ours = getattr(jnnx, layer)(features, **kwargs, rngs=nnx.Rngs(0))(x, mask=mask)
        y_theirs = getattr(nnx, layer)(features, **kwargs, rngs=nnx.Rngs(0))(x, mask=mask)
    assert y_ours.dtype == y_theirs.dtype == jnp.complex64
    np.testing.assert_array_equal(np.asarray(y_ours), np.asarray(y_theirs))


@pytest.mark.parametrize("framework", ["linen", "nnx"])
def test_complex_batch_norm_with_an_empty_mask_channel_is_defined(framework):
    """A feature that keeps no element of the mask: flax gives NaN output and NaN running statistics for
    complex input (a mean over no element); ours, as for real input, mean 0 and variance 1 (output
    ``x / sqrt(1 + eps)``), running statistics unchanged, the other features as flax (fails on f7e5cd2)."""
    xc = _complex_input()
    mask = np.ones(xc.shape, bool)
    mask[:, 1] = False
    mask[:3, 2] = False
    mask = jnp.asarray(mask)
    if framework == "linen":
        module = jn.BatchNorm(use_running_average=False)
        variables = module.init(KEY, xc)
        y, state = module.apply(variables, xc, mask=mask, mutable=["batch_stats"])
        before, after = variables["batch_stats"], state["batch_stats"]
        loss = lambda v: jnp.sum(jnp.abs(module.apply(v, xc, mask=mask, mutable=["batch_stats"])[0]))
        gradient = jax.grad(loss)(variables)["params"]
    else:
        module = jnnx.BatchNorm(4, rngs=nnx.Rngs(0))
        before = {"mean": module.mean[...], "var": module.var[...]}
        y = module(xc, mask=mask)
        after = {"mean": module.mean[...], "var": module.var[...]}
        gradient = nnx.grad(lambda m: jnp.sum(jnp.abs(m(xc, mask=mask))))(module)
    np.testing.assert_allclose(np.asarray(y[:, 1]), np.asarray(xc[:, 1]) / np.sqrt(1 + 1e-5), rtol=1e-6)
    for name in ("mean", "var"):
        assert after[name][1] == before[name][1], name
        assert bool(jnp.all(jnp.isfinite(after[name]))), name
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(gradient))
    theirs = fnn.BatchNorm(use_running_average=False)
    y_theirs, _ = theirs.apply(theirs.init(KEY, xc), xc, mask=mask, mutable=["batch_stats"])
    np.testing.assert_array_equal(np.asarray(y[:, [0, 2, 3]]), np.asarray(y_theirs[:, [0, 2, 3]]))


@pytest.mark.parametrize("layer", ["LayerNorm", "RMSNorm", "GroupNorm"])
def test_complex_per_example_norm_of_an_empty_mask_row_is_defined(layer):
    """A row that keeps no element: NaN in flax (complex input), ``x / sqrt(1 + eps)`` here, as for real
    input; finite gradient (fails on f7e5cd2)."""
    rng = np.random.default_rng(7)
    x = jnp.asarray(rng.normal(size=(4, 6)) + 1j * rng.normal(size=(4, 6)), jnp.complex64)
    mask = np.ones(x.shape, bool)
    mask[2] = False
    module = getattr(jn, layer)(**({"num_groups": 2} if layer == "GroupNorm" else {}))
    variables = module.init(KEY, x)
    y = module.apply(variables, x, mask=jnp.asarray(mask))
    np.testing.assert_allclose(np.asarray(y[2]), np.asarray(x[2]) / np.sqrt(1 + 1e-6), rtol=1e-6)
    grad = jax.grad(lambda v: jnp.sum(jnp.abs(module.apply(v, x, mask=jnp.asarray(mask)))))(variables)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grad))


def test_complex_batch_norm_across_devices_weighs_each_element_once():
    """With a mask across devices (here ``vmap`` with an axis name, 4 devices, one keeping nothing), the
    complex statistics are those of the global batch, as for real input (flax: each device's masked
    mean with equal weight, NaN for the empty device)."""
    rng = np.random.default_rng(8)
    x = jnp.asarray(rng.normal(size=(16, 3)) + 1j * rng.normal(1.0, 2.0, size=(16, 3)), jnp.complex64)
    mask = rng.random((16, 3)) < 0.6
    mask[:4] = False
    mask = jnp.asarray(mask)
    module = jn.BatchNorm(use_running_average=False, axis_name="d")
    variables = jn.BatchNorm(use_running_average=False).init(KEY, x)

    def apply(xs, ms):
        return module.apply(variables, xs, mask=ms, mutable=["batch_stats"])

    y, state = jax.vmap(apply, axis_name="d")(x.reshape(4, 4, 3), mask.reshape(4, 4, 3))
    y_one, state_one = jn.BatchNorm(use_running_average=False).apply(
        variables, x, mask=mask, mutable=["batch_stats"]
    )
    np.testing.assert_allclose(np.asarray(y).reshape(16, 3), np.asarray(y_one), rtol=1e-5, atol=1e-6)
    for name in ("mean", "var"):
        np.testing.assert_allclose(
            np.asarray(state["batch_stats"][name][0]), np.asarray(state_one["batch_stats"][name]), rtol=1e-5,
            atol=1e-7,
        )


def _psums(jaxpr) -> int:
    """The ``psum`` equations of a (closed) jaxpr, sub-jaxprs included."""
    count = 0
    for eqn in jaxpr.eqns:
        count += eqn.primitive.name == "psum"
        for sub in jax.core.jaxprs_in_params(eqn.params):
            count += _psums(sub)
    return count


def test_complex_batch_norm_with_a_mask_takes_the_mask_counts_once_across_devices():
    """The mask's counts feed the masked means and the running update: the update takes no collective
    of its own (it used to take the counts again, one more ``psum``)."""
    from jaxnorm.functional.layers import complex_batch_norm_layer

    x = jnp.ones((4, 4, 3), jnp.complex64)
    mask = jnp.ones((4, 4, 3), bool)
    stats = {"running_mean": jnp.zeros(3, jnp.complex64), "running_var": jnp.ones(3)}

    def psums(update):
        def layer(xs, ms):
            return complex_batch_norm_layer(xs, **stats, scale=None, bias=None, use_running_average=False,
                                            update_running_stats=update, axis_name="d", mask=ms)

        return _psums(jax.make_jaxpr(jax.vmap(layer, axis_name="d"))(x, mask).jaxpr)

    assert psums(True) == psums(False) >= 2


def test_complex_per_example_norm_p1_is_refused_by_name():
    with pytest.raises(TypeError, match="p=2 only"):
        jn.LayerNorm(p=1).init(KEY, _complex_input())


def test_complex_batch_norm_p1_is_refused_by_name_or_defined():
    """p != 2 has no complex definition in Norm matters: either a named error or finite output, never NaN."""
    xc = _complex_input()
    try:
        y = jn.BatchNorm(use_running_average=False, p=1).init_with_output(KEY, xc)[0]
    except (ValueError, TypeError) as error:
        assert re.search(_name_pattern("p|x"), str(error)), str(error)
    else:
        assert bool(jnp.all(jnp.isfinite(y))), "complex L1 batch norm gave non-finite output"


def test_issue_examples_are_in_the_table():
    """The examples quoted in issue 14 are rows of MALFORMED."""
    ids = " ".join(row.id for row in MALFORMED)
    for example in (
        "momentum=1.5",
        "epsilon=-1.0",
        "mean_only='no'",
        "gain=0.0",
        "gain=-2.0",
        "k=2.5",
        "axis=None",
        "scale=float32[3]",
    ):
        assert example in ids, example
    assert math.isfinite(float(F.expected_topk_abs_normal(10, k=2)))


@pytest.mark.parametrize("framework", ["linen", "nnx"])
def test_batch_norm_evaluation_of_float64_input_like_flax(x64, framework):
    """Evaluation of float64 input from float32 running statistics, bit for bit with flax: flax.nnx
    promotes the statistics to float64 (float64-accurate; before, jaxnorm.nnx took their rsqrt in float32,
    ~6e-8 off), flax.linen takes their rsqrt in float32 (and so does jaxnorm.nn)."""
    x = jnp.asarray(np.random.default_rng(0).normal(2.0, 1.0, (8, 5)), jnp.float64)
    mean = jnp.asarray([0.1, -0.2, 0.3, 1.7, -3.1], jnp.float32)
    var = jnp.asarray([0.3, 0.7, 1.1, 2.9, 0.013], jnp.float32)
    if framework == "linen":
        ours, theirs = jn.BatchNorm(use_running_average=True), fnn.BatchNorm(use_running_average=True)
        variables = {**theirs.init(KEY, x), "batch_stats": {"mean": mean, "var": var}}
        y, want = ours.apply(variables, x), theirs.apply(variables, x)
    else:
        ours = jnnx.BatchNorm(5, use_running_average=True, rngs=nnx.Rngs(0))
        theirs = nnx.BatchNorm(5, use_running_average=True, rngs=nnx.Rngs(0))
        for layer in (ours, theirs):
            layer.mean[...], layer.var[...] = mean, var
        y, want = ours(x), theirs(x)
        oracle = (np.asarray(x) - np.asarray(mean, np.float64)) / np.sqrt(np.asarray(var, np.float64) + 1e-5)
        np.testing.assert_allclose(np.asarray(y), oracle, rtol=1e-13)
    assert y.dtype == want.dtype == jnp.float64
    np.testing.assert_array_equal(np.asarray(y), np.asarray(want))


@pytest.mark.parametrize(
    "layer, kwargs", [("LayerNorm", {}), ("GroupNorm", {"num_groups": 2}), ("RMSNorm", {})]
)
def test_complex_input_with_a_module_dtype_like_flax(x64, layer, kwargs):
    """flax takes complex statistics in ``promote_types(dtype, float32)``: a complex128 ``dtype`` on
    complex64 input gives flax's numbers bit for bit; a real ``dtype`` (flax would discard the imaginary
    part) raises a TypeError naming ``dtype``."""
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(2, 8)) + 1j * rng.normal(size=(2, 8)) + 0.5, jnp.complex64)
    ours, theirs = getattr(jn, layer)(**kwargs, dtype=jnp.complex128), getattr(fnn, layer)(
        **kwargs, dtype=jnp.complex128
    )
    variables = theirs.init(KEY, x)
    y, want = ours.apply(variables, x), theirs.apply(variables, x)
    assert y.dtype == want.dtype == jnp.complex128
    np.testing.assert_array_equal(np.asarray(y), np.asarray(want))
    with pytest.raises(TypeError, match="dtype"):
        getattr(jn, layer)(**kwargs, dtype=jnp.float32).init(KEY, x)


def _kernel_with_a_zero_unit(key, shape, dtype=jnp.float32):
    return fnn.initializers.lecun_normal()(key, shape, dtype).at[..., 1].set(0)


@pytest.mark.parametrize("framework", ["linen", "nnx"])
def test_bounded_weight_norm_of_a_zero_initial_unit_is_refused_naming_it(framework):
    """Bounded weight norm fixes each unit's norm at its initial one: a zero unit of the initial kernel
    would output 0 for ever. Its init raised "rho must be finite and > 0" about a rho the user never
    passed; now the units and the layer are named, at init / construction."""
    with pytest.raises(ValueError, match=r"BoundedWeightNormDense: .*units \[1\] have norm 0.*kernel_init"):
        if framework == "linen":
            jn.BoundedWeightNormDense(3, kernel_init=_kernel_with_a_zero_unit).init(KEY, V2)
        else:
            jnnx.BoundedWeightNormDense(4, 3, kernel_init=_kernel_with_a_zero_unit, rngs=nnx.Rngs(0))


def test_linen_topk_batch_norm_inits_on_one_devices_batch():
    """``init`` drops ``axis_name``; with ``topk`` above one device's elements per feature it raised,
    although training on the global batch under the mapped axis is well defined. It now normalizes that
    batch with the initial running statistics, and training gives the global batch's numbers."""
    x = jnp.asarray(np.random.default_rng(2).normal(size=(8, 3)) * 2 + 1, jnp.float32)
    per_device = x.reshape(4, 2, 3)
    module = jn.BatchNorm(use_running_average=False, p="inf", topk=3, axis_name="d")
    variables = module.init(KEY, per_device[0])  # 2 elements per feature < topk = 3
    train = lambda xl: module.apply(variables, xl, mutable=["batch_stats"])
    y, _ = jax.vmap(train, axis_name="d")(per_device)
    np.testing.assert_allclose(y.reshape(8, 3), F.batch_norm(x, p="inf", topk=3), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="topk"):  # without axis_name the batch is all there is
        jn.BatchNorm(use_running_average=False, p="inf", topk=3).init(KEY, per_device[0])
