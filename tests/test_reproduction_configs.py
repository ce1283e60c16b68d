"""The reproduction configs (experiments/configs, REPRODUCTION.md) load, build and train two steps.

Every config with ``VARIANTS`` is checked for each variant: the overrides name real config fields
and ``jaxnorm.train.experiment.validate`` builds its model and optimizer. One variant per training
mechanism (ENorm wrapper, WRS, BWN, float16 loss scaling, the L1-constant module) runs two steps on
a slice of Fashion-MNIST (skipped where the dataset is not installed).
"""

import copy
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import __main__ as cli
from experiments.scripts import bn_constant, grid
from jaxnorm.train import experiment

REPRO_CONFIGS = (
    "fmnist_enorm_depth",
    "fmnist_norm_matters",
    "fmnist_wrs",
    "fmnist_small_batch",
    "cifar10_enorm_fc",
    "cifar10_enorm_nv",
    "cifar10_resnet56_norm_matters",
    "cifar10_wrs",
)


def _fashion_mnist_available():
    from jaxnorm import data

    try:
        data.load("fashion_mnist", "test[:8]", batch_size=8, train=False)
    except data.DatasetNotFoundError:
        return False
    return True


needs_fmnist = pytest.mark.skipif(
    not _fashion_mnist_available(), reason="Fashion-MNIST not installed (dataset-fashion-mnist)"
)


def _variant_config(name, variant):
    module = grid.load_module(name)
    config = experiment.experiment_defaults()
    config.update(copy.deepcopy(module.get_config()))
    for key, value in module.VARIANTS[variant].items():
        grid.set_dotted(config, key, value)
    with config.unlocked():
        config.sweep.key = ""
    return config


@pytest.mark.parametrize("name", REPRO_CONFIGS)
def test_config_loads_and_every_variant_builds(name):
    assert name in cli.available()
    config = cli.load_config(name, [])
    for _, run_config in experiment.expand_sweep(config):  # the `python -m experiments` sweep
        experiment.validate(run_config)
    module = grid.load_module(name)
    assert module.VARIANTS and module.SEEDS
    for variant, overrides in module.VARIANTS.items():
        config = _variant_config(name, variant)
        for key, value in overrides.items():  # the override landed where it was meant to
            node = config
            for part in key.split("."):
                node = node[part]
            assert node == value or tuple(node) == tuple(value), (variant, key)
        experiment.validate(config)


def test_set_dotted_rejects_unknown_parent_fields():
    config = experiment.experiment_defaults()
    with pytest.raises(ValueError, match=r"no field 'optimiser\.learning_rate'"):
        grid.set_dotted(config, "optimiser.learning_rate", 0.1)


@needs_fmnist
@pytest.mark.parametrize(
    ("name", "variant"),
    [
        ("fmnist_enorm_depth", "enorm-1.2"),
        ("fmnist_wrs", "adamw+wrs"),
        pytest.param("fmnist_norm_matters", "bwn+meanbn", marks=pytest.mark.slow),
        pytest.param("fmnist_norm_matters", "l1bn-fp16", marks=pytest.mark.slow),
    ],
)
def test_variant_trains_two_steps(name, variant):
    config = _variant_config(name, variant)
    with config.unlocked():
        config.quick, config.quick_steps, config.quick_examples = True, 2, 64
    config = experiment.apply_quick(config)
    result = grid.run_one(config, {}, seed=0)
    assert result["steps"] == 2
    assert math.isfinite(result["train_loss"]) and 0.0 <= result["eval_accuracy"] <= 1.0
    assert result["final_l2"] > 0 and result["norms"]


def test_fmt_reports_mean_std_and_divergence():
    assert grid.fmt([0.5, 0.7], 100) == "60.00 ± 10.00"
    assert "1 diverged" in grid.fmt([0.5, float("nan")], 100)


def test_l1_constant_factor_gives_the_swept_constant(x64):
    """factor = sqrt(pi/2) / C makes the block's BN output (x - mean) / (C * mean|x - mean|)."""
    c = 1.5
    x = np.random.default_rng(0).normal(size=(64, 16)) * 3.0 + 1.0
    kwargs = bn_constant.variants()[f"L1, C={c:g}"]
    module = bn_constant.ResidualMLP(blocks=1, width=16, residual=False, **kwargs)
    variables = module.init(jax.random.key(0), jnp.asarray(x[:2]), train=False)
    params = jax.tree_util.tree_map(np.asarray, variables["params"])
    _, inter = module.apply(
        variables, jnp.asarray(x), train=True, mutable=["batch_stats", "intermediates"],
        capture_intermediates=lambda mdl, _: mdl.name == "bn_0")
    h = np.maximum(x @ params["stem"]["kernel"] + params["stem"]["bias"], 0.0)
    dev = h @ params["dense_0"]["kernel"]
    dev = dev - dev.mean(0)
    expected = dev / (c * np.abs(dev).mean(0))
    got = kwargs["factor"] * np.asarray(inter["intermediates"]["bn_0"]["__call__"][0])
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_wrs_state_wrapper_rescales_weights_every_tau_updates(monkeypatch):
    import jaxnorm.optim
    from experiments.scripts import wrs_state
    from jaxnorm.train import optimizers

    monkeypatch.setattr(optimizers, "WRAPPERS", dict(optimizers.WRAPPERS))
    monkeypatch.setattr(jaxnorm.optim, "weight_rescaling_with_state", None, raising=False)
    wrs_state.register()
    tx, _ = optimizers.make_optimizer(
        {"name": "momentum", "learning_rate": 0.1, "wrappers": ("wrs_state",),
         "wrapper_kwargs": {"wrs_state": {"tau": 2}}}, 10)
    params = {"w": jnp.full((3, 2), 2.0)}
    state = tx.init(params)
    grads = {"w": jnp.ones((3, 2))}
    norms = []
    for _ in range(2):
        updates, state = tx.update(grads, state, params)
        params = jax.tree_util.tree_map(jnp.add, params, updates)
        norms.append(np.linalg.norm(np.asarray(params["w"]), axis=0))
    assert not np.allclose(norms[0], 1.0)
    np.testing.assert_allclose(norms[1], 1.0, rtol=1e-6)
