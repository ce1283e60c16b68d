"""scale_invariant_mask: kernels feeding BatchNorm, checked against a numerical oracle."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxnorm.optim import scale_invariant_mask
from tests import enorm_models as models


def _train_fn(model):
    return lambda v, x: model.apply(v, x, train=True, mutable=["batch_stats"])[0]


def _paths(tree):
    return {tuple(k.key for k in path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def _invariant(fn, variables, x, path, seed=0):
    """Numerical oracle: does scaling each output unit of the leaf at ``path`` by a random
    positive factor leave ``fn`` unchanged (up to BN's epsilon)?"""
    leaf = variables["params"][path[0]][path[1]]
    d = jnp.exp(jax.random.normal(jax.random.key(seed), (leaf.shape[-1],)))
    params = jax.tree.map(lambda v: v, variables["params"])
    params[path[0]] = dict(params[path[0]], **{path[1]: leaf * d})
    a, b = fn({**variables, "params": params}, x), fn(variables, x)
    return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b))) < 1e-3


def test_resnet_with_bn_train_mode():
    model = models.ResNetId(bn=True)
    variables, x = models.init(model, (4, 8, 8, 3))
    fn = _train_fn(model)
    mask = _paths(scale_invariant_mask(fn, variables, x))
    assert set(mask) == set(_paths(variables["params"]))
    convs = [p for p in mask if p[1] == "kernel" and p[0] != "head"]
    assert len(convs) == 10 and all(mask[p] for p in convs)
    assert not mask[("head", "kernel")]
    assert not any(mask[p] for p in mask if p[1] in ("scale", "bias"))
    for path in [("stem", "kernel"), ("s0b1_conv2", "kernel"), ("proj1", "kernel"),
                 ("head", "kernel")]:
        assert _invariant(fn, variables, x, path) == mask[path]


def test_eval_mode_is_not_invariant():
    model = models.ResNetId(bn=True)
    variables, x = models.init(model, (4, 8, 8, 3))
    mask = scale_invariant_mask(lambda v, x: model.apply(v, x), variables, x)
    assert not any(jax.tree.leaves(mask))


def test_mlp_bn_and_plain():
    model = models.BNMLP()
    variables, x = models.init(model, (6, 3))
    fn = _train_fn(model)
    mask = _paths(scale_invariant_mask(fn, variables, x))
    assert mask[("Dense_0", "kernel")] and not mask[("Dense_1", "kernel")]
    assert _invariant(fn, variables, x, ("Dense_0", "kernel"))
    assert not _invariant(fn, variables, x, ("Dense_1", "kernel"))
    plain = models.MLP()
    pv, px = models.init(plain, (6, 3))
    assert not any(jax.tree.leaves(scale_invariant_mask(plain.apply, pv, px)))


def test_layernorm_is_not_per_unit_invariant():
    model = models.LayerNormMLP()
    variables, x = models.init(model, (6, 3))
    mask = _paths(scale_invariant_mask(model.apply, variables, x))
    assert not mask[("Dense_0", "kernel")]
    assert not _invariant(model.apply, variables, x, ("Dense_0", "kernel"))
    np.testing.assert_equal(sorted(mask), sorted(_paths(variables["params"])))
