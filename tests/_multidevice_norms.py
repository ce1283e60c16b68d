"""Worker for test_norms_multidevice.py: run with 8 simulated CPU devices, print max errors as JSON.

Each case computes batch statistics of one global batch on 8 devices — ``pmap`` and ``shard_map`` with an
``axis_name``, plain ``jit`` over a ``NamedSharding``-sharded batch — and compares them with the
single-device statistics of the same global batch, in float64, with unequal masks per device.
"""

import json
import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxnorm.functional as F
import jaxnorm.nn as jn

jax.config.update("jax_enable_x64", True)
assert jax.device_count() == 8, jax.devices()

rng = np.random.default_rng(0)
x = rng.normal(3.0, 2.0, (8 * 6, 5, 4))
# Unequal numbers of unmasked elements per device: device d keeps about (d + 1) / 9 of its elements.
keep = np.repeat(np.arange(1, 9) / 9.0, 6)[:, None, None]
mask = rng.random(x.shape) < keep
mask[::6, 0, :] = True  # at least one element per device and feature
mesh = Mesh(np.array(jax.devices()), ("d",))
sharded = NamedSharding(mesh, P("d"))
errors = {}


def max_err(got, want):
    return max(float(np.max(np.abs(np.asarray(g) - np.asarray(w)))) for g, w in zip(got, want, strict=True))


# topk=40 exceeds a device's 30 elements per feature (and most devices' unmasked counts): the k largest
# deviations then come from the candidates of several devices.
for p, topk in [(2, None), (1, None), ("inf", None), ("inf", 3), ("inf", 40)]:
    for masked in (False, True):
        m = mask if masked else np.ones_like(mask)
        kwargs = {"p": p, "topk": topk}
        want = F.batch_moments(jnp.asarray(x), mask=jnp.asarray(m), **kwargs)
        name = f"p={p},topk={topk},masked={masked}"

        pmapped = jax.pmap(
            lambda a, b, kw=kwargs: F.batch_moments(a, mask=b, axis_name="d", **kw), axis_name="d"
        )(x.reshape(8, 6, 5, 4), m.reshape(8, 6, 5, 4))
        errors[f"pmap {name}"] = max_err(
            [pmapped[0][i] for i in range(8)] + [pmapped[1][i] for i in range(8)],
            [want[0]] * 8 + [want[1]] * 8,
        )

        mapped = jax.jit(
            jax.shard_map(
                lambda a, b, kw=kwargs: F.batch_moments(a, mask=b, axis_name="d", **kw),
                mesh=mesh,
                in_specs=(P("d"), P("d")),
                out_specs=P(),
            )
        )(jax.device_put(x, sharded), jax.device_put(m, sharded))
        errors[f"shard_map {name}"] = max_err(mapped, want)

        global_jit = jax.jit(lambda a, b, kw=kwargs: F.batch_moments(a, mask=b, **kw))(
            jax.device_put(x, sharded), jax.device_put(m, sharded)
        )
        errors[f"jit-sharded {name}"] = max_err(global_jit, want)

# Gradients: under pmap, the gradient of the sum of the devices' losses equals the single-device
# gradient of the global loss (the collectives' transposes carry the cotangents across devices).
weights = rng.normal(size=x.shape)
for p, topk in [(2, None), (1, None), ("inf", None), ("inf", 3), ("inf", 40)]:
    kwargs = {"p": p, "topk": topk, "mask": jnp.asarray(mask)}
    want = jax.grad(lambda a, kw=kwargs: jnp.sum(F.batch_norm(a, **kw) * weights))(jnp.asarray(x))

    def device_loss(a, m, w, p=p, topk=topk):
        return jnp.sum(F.batch_norm(a, p=p, topk=topk, mask=m, axis_name="d") * w)

    got = jax.pmap(jax.grad(device_loss), axis_name="d")(
        x.reshape(8, 6, 5, 4), mask.reshape(8, 6, 5, 4), weights.reshape(8, 6, 5, 4)
    )
    errors[f"pmap gradient p={p},topk={topk},masked=True"] = max_err([got.reshape(x.shape)], [want])

# axis_index_groups: two groups of four devices, each with the statistics of its half of the batch.
groups = [[0, 1, 2, 3], [4, 5, 6, 7]]
grouped = jax.pmap(lambda a: F.batch_moments(a, p=1, axis_name="d", axis_index_groups=groups), axis_name="d")(
    x.reshape(8, 6, 5, 4)
)
halves = [F.batch_moments(jnp.asarray(x[:24]), p=1), F.batch_moments(jnp.asarray(x[24:]), p=1)]
errors["pmap axis_index_groups"] = max_err(
    [grouped[0][0], grouped[0][7], grouped[1][0], grouped[1][7]],
    [halves[0][0], halves[1][0], halves[0][1], halves[1][1]],
)

# The BatchNorm module under pmap: outputs and running statistics of the global batch.
bn = jn.BatchNorm(use_running_average=False, axis_name="d", momentum=0.5, p="inf")
variables = bn.init(jax.random.key(0), x[:6])
y_global, stats_global = bn.clone(axis_name=None).apply(variables, jnp.asarray(x), mutable=["batch_stats"])
y_pmap, stats_pmap = jax.pmap(lambda a: bn.apply(variables, a, mutable=["batch_stats"]), axis_name="d")(
    x.reshape(8, 6, 5, 4)
)
errors["BatchNorm module pmap outputs"] = max_err([y_pmap.reshape(y_global.shape)], [y_global])
errors["BatchNorm module pmap running stats"] = max_err(
    [stats_pmap["batch_stats"]["mean"][3], stats_pmap["batch_stats"]["var"][5]],
    [stats_global["batch_stats"]["mean"], stats_global["batch_stats"]["var"]],
)

# Huge input (float64 variance overflows beyond 1e154): on one device only, and everywhere. Every device
# finds the overflow after the merge and recomputes the statistics in a unit (jaxnorm.functional.units);
# outputs, and gradients relative to their largest entry, equal the single device's.
for where in ("one device", "everywhere"):
    big = x.copy()
    big[18:24 if where == "one device" else None] *= 1e200
    for masked in (False, True):
        m = jnp.asarray(mask if masked else np.ones_like(mask))
        want_y = F.batch_norm(jnp.asarray(big), mask=m)
        want_g = jax.grad(lambda a, m=m: jnp.sum(F.batch_norm(a, mask=m) * weights))(jnp.asarray(big))
        name = f"huge ({where}) masked={masked}"
        y_sm = jax.jit(
            jax.shard_map(
                lambda a, b: F.batch_norm(a, mask=b, axis_name="d"),
                mesh=mesh,
                in_specs=(P("d"), P("d")),
                out_specs=P("d"),
            )
        )(jax.device_put(big, sharded), jax.device_put(m, sharded))
        errors[f"{name} shard_map outputs"] = max_err([y_sm], [want_y])

        def device_loss(a, b, w):
            return jnp.sum(F.batch_norm(a, mask=b, axis_name="d") * w)

        got = jax.pmap(jax.grad(device_loss), axis_name="d")(
            big.reshape(8, 6, 5, 4), m.reshape(8, 6, 5, 4), weights.reshape(8, 6, 5, 4)
        )
        scale = float(np.max(np.abs(np.asarray(want_g))))
        errors[f"{name} pmap gradient (relative)"] = max_err([got.reshape(x.shape) / scale], [want_g / scale])
        assert np.all(np.isfinite(np.asarray(want_y))) and scale > 0

# Per-example norms with the features sharded over the devices (axis_name), unequal masks, one device
# keeping no element of some rows: outputs and gradients those of the unsharded features.
features = rng.normal(1.0, 2.0, (6, 8 * 3))
feature_mask = rng.random(features.shape) < np.repeat(np.arange(1, 9) / 9.0, 3)[None]
feature_mask[:, :3] = False  # device 0 keeps nothing
feature_mask[0] = False  # a row kept by no device
feature_weights = rng.normal(size=features.shape)
per_example = {
    "rms_norm": lambda a, m, **kw: F.rms_norm(a, mask=m, **kw),
    "layer_norm": lambda a, m, **kw: F.layer_norm(a, mask=m, **kw),
    "layer_norm p=1": lambda a, m, **kw: F.layer_norm(a, mask=m, p=1, **kw),
}
for name, norm in per_example.items():
    fm = jnp.asarray(feature_mask)
    want_y = norm(jnp.asarray(features), fm)
    want_g = jax.grad(lambda a, n=norm, m=fm: jnp.sum(n(a, m) * feature_weights))(jnp.asarray(features))
    split = lambda a: np.moveaxis(np.asarray(a).reshape(6, 8, 3), 1, 0)
    y = jax.pmap(lambda a, m, n=norm: n(a, m, axis_name="d"), axis_name="d")(split(features), split(fm))
    g = jax.pmap(
        jax.grad(lambda a, m, w, n=norm: jnp.sum(n(a, m, axis_name="d") * w)), axis_name="d"
    )(split(features), split(fm), split(feature_weights))
    join = lambda a: np.moveaxis(np.asarray(a), 0, 1).reshape(6, 24)
    errors[f"features pmap {name} outputs"] = max_err([join(y)], [want_y])
    errors[f"features pmap {name} gradient"] = max_err([join(g)], [want_g])

# GroupNorm / LayerNorm under a sharded batch need no collective and must not change.
y_gn = jax.jit(lambda a: F.group_norm(a, 2))(jax.device_put(x, sharded))
errors["jit-sharded group_norm"] = max_err([y_gn], [F.group_norm(jnp.asarray(x), 2)])

print(json.dumps(errors))
