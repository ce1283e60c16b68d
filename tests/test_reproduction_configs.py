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
from fmnist import needs_fmnist

from experiments import __main__ as cli
from experiments.scripts import bn_constant, enorm_nv, grid, implicit_enorm
from jaxnorm.train import experiment

REPRO_CONFIGS = (
    "fmnist_enorm_depth",
    "fmnist_norm_matters",
    "fmnist_wrs",
    "fmnist_small_batch",
    "fmnist_enorm_nv",
    "fmnist_wd_time",
    "fmnist_effective_lr",
    "fmnist_wrs_conv",
    "cifar10_enorm_fc",
    "cifar10_enorm_nv",
    "cifar10_resnet56_norm_matters",
    "cifar10_wrs",
    "cifar10_vgg11_norm_matters",
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
        variables,
        jnp.asarray(x),
        train=True,
        mutable=["batch_stats", "intermediates"],
        capture_intermediates=lambda mdl, _: mdl.name == "bn_0",
    )
    h = np.maximum(x @ params["stem"]["kernel"] + params["stem"]["bias"], 0.0)
    dev = h @ params["dense_0"]["kernel"]
    dev = dev - dev.mean(0)
    expected = dev / (c * np.abs(dev).mean(0))
    got = kwargs["factor"] * np.asarray(inter["intermediates"]["bn_0"]["__call__"][0])
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_wrs_state_wrapper_rescales_weights_every_tau_updates():
    from jaxnorm.train import optimizers

    tx, _ = optimizers.make_optimizer(
        {
            "name": "momentum",
            "learning_rate": 0.1,
            "wrappers": ("wrs_state",),
            "wrapper_kwargs": {"wrs_state": {"tau": 2}},
        },
        10,
    )
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


def test_enorm_nv_spec_covers_every_hidden_conv():
    """With the BN after the classifier the net is no chain; discover finds the 8 conv junctions."""
    config = experiment.experiment_defaults()
    config.update(grid.load_module("fmnist_enorm_nv").get_config())
    with config.unlocked():
        config.model.kwargs.widths = (4, 4, 4)
        config.model.kwargs.final_bn = True
    spec = enorm_nv.enorm_spec(config)
    assert len(spec) == 8
    assert [j.producers[-1][0] for j in spec] == [(f"conv_{i}", "kernel") for i in range(8)]
    assert spec[-1].consumers[0][0] == ("head", "kernel")
    overrides = enorm_nv.with_spec(grid.load_module("fmnist_enorm_nv").VARIANTS["enorm-1.2"], spec)
    assert overrides["optimizer.wrapper_kwargs"]["enorm"] == {"c": 1.2, "spec": spec}


@needs_fmnist
def test_enorm_nv_enorm_variant_trains_two_steps():
    module = grid.load_module("fmnist_enorm_nv")
    base = module.get_config()
    with base.unlocked():
        base.model.kwargs.widths = (4, 4, 4)
    full = experiment.experiment_defaults()
    full.update(base)
    overrides = {
        **enorm_nv.cell_overrides(8, "momentum", module.learning_rate),
        **enorm_nv.with_spec(module.VARIANTS["enorm-1.2"], enorm_nv.enorm_spec(full)),
        "num_steps": 2,
        "dataset.train_split": "train[:64]",
        "dataset.eval_split": "test[:64]",
    }
    result = grid.run_one(base, overrides, seed=0)
    assert result["steps"] == 2 and math.isfinite(result["train_loss"])


def test_implicit_imbalance_matches_numpy_and_vanishes_after_balancing(x64):
    from jaxnorm.enorm import chain, enorm_balance

    rng = np.random.default_rng(0)
    params = {
        "dense_0": {"kernel": rng.normal(size=(5, 4)) * 3, "bias": rng.normal(size=4)},
        "dense_1": {"kernel": rng.normal(size=(4, 6)), "bias": rng.normal(size=6)},
        "head": {"kernel": rng.normal(size=(6, 2)) * 0.5, "bias": rng.normal(size=2)},
    }
    spec = chain(params)
    expected = []
    for a, b in (("dense_0", "dense_1"), ("dense_1", "head")):
        incoming = np.linalg.norm(params[a]["kernel"], axis=0)
        outgoing = np.linalg.norm(params[b]["kernel"], axis=1)
        expected.append(np.abs(np.log(outgoing / incoming)))
    got = implicit_enorm.imbalance(jax.tree.map(jnp.asarray, params), spec)
    np.testing.assert_allclose(got, np.mean(np.concatenate(expected)), rtol=1e-5)
    balanced = enorm_balance(jax.tree.map(jnp.asarray, params), spec, cycles=200)
    assert implicit_enorm.imbalance(balanced, spec) < 1e-4


def test_enorm_nv_merge_concatenates_seeds_per_cell(tmp_path):
    import json

    first = {"sgd": {"8": {"bn": [0.8], "enorm-1": [0.7]}}}
    second = {"sgd": {"8": {"bn": [0.9], "enorm-1": [0.6]}, "32": {"bn": [0.5]}}}
    paths = []
    for i, results in enumerate((first, second)):
        paths.append(tmp_path / f"s{i}.json")
        paths[-1].write_text(json.dumps(results))
    merged = enorm_nv.merge([str(p) for p in paths])
    assert merged == {"sgd": {8: {"bn": [0.8, 0.9], "enorm-1": [0.7, 0.6]}, 32: {"bn": [0.5]}}}
    assert "| 8 | 85.00 ± 5.00 | 65.00 ± 5.00 |" in enorm_nv.tables({"sgd": {8: merged["sgd"][8]}})


@needs_fmnist
def test_cifar_nv_enorm_variant_with_final_bn_trains_through_the_loop():
    """`python -m experiments` / grid.py with no spec: the training loop discovers the junctions of
    the non-chain network (BN after the classifier) instead of failing in ``chain``."""
    base = grid.load_module("cifar10_enorm_nv").get_config()
    with base.unlocked():
        base.dataset.name = "fashion_mnist"
        base.dataset.augment = ""
        base.model.kwargs.widths = (4, 4, 4)
    variant = grid.load_module("cifar10_enorm_nv").VARIANTS["enorm-1.2"]
    overrides = {
        **variant,
        "num_steps": 2,
        "dataset.batch_size": 8,
        "dataset.train_split": "train[:64]",
        "dataset.eval_split": "test[:64]",
    }
    result = grid.run_one(base, overrides, seed=0)
    assert result["steps"] == 2 and math.isfinite(result["train_loss"])


@pytest.mark.slow  # 75 s on 2 cores; the mimicry chain itself: test_train_loop.py (FMNIST reference run)
def test_cifar10_vgg11_norm_matters_sweep_runs_on_mock_cifar(tmp_path):
    """The paper-setting config's sweep on TFDS mock CIFAR-10 with a narrow VGG11 (three of its six
    runs, in order): the reference leaves its recorded norms (the convs only) and the mimicry run
    finds them as its sibling ``wd``."""
    import tensorflow_datasets as tfds

    from jaxnorm.data import tfds_io

    config = cli.load_config("cifar10_vgg11_norm_matters", [])
    picked = (0, 2, 4)
    with config.unlocked():
        config.quick, config.quick_steps, config.quick_examples = True, 3, 64
        config.model.kwargs = {"width_multiplier": 0.0625}
        config.workdir = str(tmp_path / "exp")  # a quick run writes <workdir>_quick
        config.plots = False
        config.sweep.grid = tuple(config.sweep.grid[i] for i in picked)
        config.sweep.names = tuple(config.sweep.names[i] for i in picked)
    tfds_io.read_arrays.cache_clear()
    try:
        with tfds.testing.mock_data(num_examples=64):
            results = experiment.run_experiment(config, print_fn=lambda *_: None)
    finally:
        tfds_io.read_arrays.cache_clear()
    assert list(results) == ["wd", "no_wd_mimicry", "norm_schedule"]
    assert all(r["steps"] == 3 and math.isfinite(r["train_loss"]) for r in results.values())
    with np.load(tmp_path / "exp_quick" / "wd" / "recorded_norms.npz") as saved:
        assert sorted(saved.files) == [f"conv_{i}/kernel" for i in range(8)]  # not the classifier
        assert saved["conv_0/kernel"].shape == (1, 4)  # 3 updates recorded every 10: one row; 64 / 16
    assert not (tmp_path / "exp_quick" / "no_wd_mimicry" / "recorded_norms.npz").exists()
