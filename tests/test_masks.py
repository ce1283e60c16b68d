"""scale_invariant_mask: kernels feeding BatchNorm, checked against a numerical oracle."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

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
    for path in [("stem", "kernel"), ("s0b1_conv2", "kernel"), ("proj1", "kernel"), ("head", "kernel")]:
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


@pytest.mark.parametrize(
    ("name", "norm", "rows", "invariant"),
    [
        ("mlp", "bn", 16, True),
        ("mlp", "l1bn", 16, True),
        ("mlp", "linfbn", 16, True),
        ("mlp", "topk", 16, True),  # one lax.top_k over the rows
        ("mlp", "topk", 512, True),  # two stages: top_k of block maxima, a gather, top_k again
        ("mlp", "gn", 16, False),
        # VGG-11 (~50 s of a loaded 2-core CI run): the MLP cases keep the quick coverage
        pytest.param("vgg11", "bn", 16, True, marks=pytest.mark.slow),
    ],
)
def test_library_models_match_the_numerical_oracle(name, norm, rows, invariant):
    """jaxnorm's own BN (conditioned one-pass moments under lax.cond, optimization barriers,
    custom JVPs, stop_gradient, top-k's gather) is traced through: hidden kernels are found scale
    invariant exactly where the numerical oracle says so."""
    from jaxnorm import models as library

    kwargs = {"depth": 2, "width": 16} if name == "mlp" else {"width_multiplier": 0.125}
    model = library.create(name, num_classes=4, norm=norm, **kwargs)
    x = jax.random.normal(jax.random.key(1), (rows, 8, 8, 3)) * 2.0 + 1.0
    variables = model.init(jax.random.key(0), x[:1], train=False)
    fn = _train_fn(model)
    mask = _paths(scale_invariant_mask(fn, variables, x))
    hidden = [p for p in mask if p[-1] == "kernel" and p[0] != "head"]
    assert hidden and all(mask[p] == invariant for p in hidden)
    assert not mask[("head", "kernel")]
    for path in (hidden[0], hidden[-1], ("head", "kernel")):
        assert _invariant(fn, variables, x, path) == mask[path]


def test_gather_that_mixes_units_is_not_invariant():
    """Each row picks a different unit: scaling one unit changes only some entries of a column."""
    rows = jax.random.randint(jax.random.key(2), (32, 1), 0, 4)

    def fn(variables, x):
        h = x @ variables["params"]["dense"]["kernel"]
        picked = jnp.take_along_axis(h, rows, axis=1)
        return (picked - picked.mean(0)) * jax.lax.rsqrt(picked.var(0) + 1e-5)

    variables = {"params": {"dense": {"kernel": jax.random.normal(jax.random.key(3), (5, 4))}}}
    x = jax.random.normal(jax.random.key(4), (32, 5))
    mask = _paths(scale_invariant_mask(fn, variables, x))
    assert mask == {("dense", "kernel"): False}
    assert not _invariant(fn, variables, x, ("dense", "kernel"))
