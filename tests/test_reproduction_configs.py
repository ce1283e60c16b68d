"""The reproduction configs (experiments/configs, REPRODUCTION.md) load, build and train two steps.

Every config with ``VARIANTS`` is checked for each variant: the overrides name real config fields
and ``jaxnorm.train.experiment.validate`` builds its model and optimizer. One variant per training
mechanism (ENorm wrapper, WRS, BWN, float16 loss scaling, the L1-constant module) runs two steps on
a slice of Fashion-MNIST (skipped where the dataset is not installed).
"""

import copy
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fmnist import needs_fmnist

from experiments import __main__ as cli
from experiments import analysis
from experiments.scripts import analyses, bn_constant, common, enorm_nv
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
    "fmnist_beyond",
    "cifar10_enorm_fc",
    "cifar10_enorm_nv",
    "cifar10_resnet56_norm_matters",
    "cifar10_wrs",
    "cifar10_vgg11_norm_matters",
    "imagenet_enorm_resnet18",
    "fmnist_isp_sparsity",
    "fmnist_wn_init",
    "fmnist_hessian_lr",
    "fmnist_enorm_c_depth",
    "fmnist_implicit_enorm",
    "fmnist_swn_depth",
)


def _variant_config(name, variant):
    module = common.load_module(name)
    config = experiment.experiment_defaults()
    config.update(copy.deepcopy(module.get_config()))
    for key, value in module.VARIANTS[variant].items():
        common.set_dotted(config, key, value)
    with config.unlocked():
        config.sweep.key = ""
    return config


@pytest.mark.parametrize("name", REPRO_CONFIGS)
def test_config_loads_and_every_variant_builds(name):
    assert name in cli.available()
    config = cli.load_config(name, [])
    for _, run_config in experiment.expand_sweep(config):  # the `python -m experiments` sweep
        experiment.validate(run_config)
    module = common.load_module(name)
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
        common.set_dotted(config, "optimiser.learning_rate", 0.1)


@needs_fmnist
@pytest.mark.parametrize(
    ("name", "variant"),
    [
        ("fmnist_enorm_depth", "enorm-1.2"),
        ("fmnist_wrs", "adamw+wrs"),
        ("fmnist_beyond", "a/adamp, tracer mask"),
        ("fmnist_beyond", "b/mp + forced wn"),
        ("fmnist_beyond", "d/sgdm + teleport"),
        pytest.param("fmnist_norm_matters", "bwn+meanbn", marks=pytest.mark.slow),
        pytest.param("fmnist_norm_matters", "l1bn-fp16", marks=pytest.mark.slow),
    ],
)
def test_variant_trains_two_steps(name, variant):
    config = _variant_config(name, variant)
    with config.unlocked():
        config.quick, config.quick_steps, config.quick_examples = True, 2, 64
    config = experiment.apply_quick(config)
    result = common.run_one(config, {}, seed=0)
    assert result["steps"] == 2
    assert math.isfinite(result["train_loss"]) and 0.0 <= result["eval_accuracy"] <= 1.0
    assert result["final_l2"] > 0 and result["norms"]


def test_fmt_reports_mean_std_and_divergence():
    assert common.fmt([0.5, 0.7], 100) == "60.00 ± 10.00"
    assert "1 diverged" in common.fmt([0.5, float("nan")], 100)


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
    config.update(common.load_module("fmnist_enorm_nv").get_config())
    with config.unlocked():
        config.model.kwargs.widths = (4, 4, 4)
        config.model.kwargs.final_bn = True
    spec = enorm_nv.enorm_spec(config)
    assert len(spec) == 8
    assert [j.producers[-1][0] for j in spec] == [(f"conv_{i}", "kernel") for i in range(8)]
    assert spec[-1].consumers[0][0] == ("head", "kernel")
    overrides = enorm_nv.with_spec(common.load_module("fmnist_enorm_nv").VARIANTS["enorm-1.2"], spec)
    assert overrides["optimizer.wrapper_kwargs"]["enorm"] == {"c": 1.2, "spec": spec}


@needs_fmnist
def test_enorm_nv_enorm_variant_trains_two_steps():
    module = common.load_module("fmnist_enorm_nv")
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
    result = common.run_one(base, overrides, seed=0)
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
    got = analyses.imbalance(jax.tree.map(jnp.asarray, params), spec)
    np.testing.assert_allclose(got, np.mean(np.concatenate(expected)), rtol=1e-5)
    balanced = enorm_balance(jax.tree.map(jnp.asarray, params), spec, cycles=200)
    assert analyses.imbalance(balanced, spec) < 1e-4


def _json_files(tmp_path, *saved) -> list[str]:
    import json

    paths = []
    for i, results in enumerate(saved):
        paths.append(tmp_path / f"s{i}.json")
        paths[-1].write_text(json.dumps(results))
    return [str(p) for p in paths]


def test_enorm_nv_merge_unites_seeds_per_cell(tmp_path):
    first = {"sgd": {"8": {"bn": {"0": 0.8}, "enorm-1": {"0": 0.7}}}}
    second = {"sgd": {"8": {"bn": {"1": 0.9}, "enorm-1": {"1": 0.6}}, "32": {"bn": [0.5]}}}
    merged = enorm_nv.merge(_json_files(tmp_path, first, second))
    assert merged == {"sgd": {8: {"bn": {0: 0.8, 1: 0.9}, "enorm-1": {0: 0.7, 1: 0.6}}, 32: {"bn": [0.5]}}}
    table = enorm_nv.tables({"sgd": {8: merged["sgd"][8]}})
    assert "| 8 | 85.00 ± 5.00 (n=2) | 65.00 ± 5.00 (n=2) |" in table


def test_enorm_nv_merge_counts_a_seed_in_two_files_once(tmp_path):
    """Seed 1 in both files: 80.00 ± 8.16 over seeds 0, 1, 2, not 82.50 ± 8.29 over 4 values."""
    first = {"sgd": {"8": {"bn": {"0": 0.8, "1": 0.9}}}}
    second = {"sgd": {"8": {"bn": {"1": 0.9, "2": 0.7}}}}
    merged = enorm_nv.merge(_json_files(tmp_path, first, second))
    assert merged["sgd"][8]["bn"] == {0: 0.8, 1: 0.9, 2: 0.7}
    assert "| 8 | 80.00 ± 8.16 (n=3) |" in enorm_nv.tables(merged)
    conflicting = {"sgd": {"8": {"bn": {"1": 0.5}}}}
    with pytest.raises(ValueError, match="seed 1 has accuracies"):
        enorm_nv.merge(_json_files(tmp_path, first, conflicting))


def test_enorm_nv_merge_refuses_overlapping_files_without_seed_ids(tmp_path):
    """Bare lists (files written before seed ids were saved) may hold the same seed: refused, naming
    the files, where another file has the same cell; a cell in one file only is read as it is."""
    paths = _json_files(tmp_path, {"sgd": {"8": {"bn": [0.8, 0.9]}}}, {"sgd": {"8": {"bn": {"2": 0.7}}}},
                        {"sgd": {"32": {"bn": [0.6]}}})
    with pytest.raises(ValueError, match=f"{paths[0]}, {paths[1]} hold the same cell"):
        enorm_nv.merge(paths[:2])
    assert enorm_nv.merge([paths[0], paths[2]]) == {"sgd": {8: {"bn": [0.8, 0.9]}, 32: {"bn": [0.6]}}}


@needs_fmnist
def test_cifar_nv_enorm_variant_with_final_bn_trains_through_the_loop():
    """`python -m experiments` / grid.py with no spec: the training loop discovers the junctions of
    the non-chain network (BN after the classifier) instead of failing in ``chain``."""
    base = common.load_module("cifar10_enorm_nv").get_config()
    with base.unlocked():
        base.dataset.name = "fashion_mnist"
        base.dataset.augment = ""
        base.model.kwargs.widths = (4, 4, 4)
    variant = common.load_module("cifar10_enorm_nv").VARIANTS["enorm-1.2"]
    overrides = {
        **variant,
        "num_steps": 2,
        "dataset.batch_size": 8,
        "dataset.train_split": "train[:64]",
        "dataset.eval_split": "test[:64]",
    }
    result = common.run_one(base, overrides, seed=0)
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


def _resolved(name, variant=None):
    """The config ``name`` (with grid.py variant ``variant`` applied) over the experiment defaults."""
    if variant is not None:
        return _variant_config(name, variant)
    config = experiment.experiment_defaults()
    config.update(common.load_module(name).get_config())
    return config


def test_cifar10_wrs_encodes_liu_et_al_settings():
    """Batch 100 (Supp. B.2), tau from Table S1 (40 for every VGG16 cell, ResNet-18 / C10: 20 SGDM,
    40 AdamW), WD 5e-4 on kernels and gammas for WD, on the gammas only for WRS, BWN with WD on the
    last layer, 200 epochs with decays at 60 / 120 / 160, AdamW + WRS 100 epochs; colour jitter, crops of
    the image padded to 38 x 38 and flips."""
    module = common.load_module("cifar10_wrs")
    taus = {}
    for variant in module.VARIANTS:
        config = _resolved("cifar10_wrs", variant)
        assert config.dataset.batch_size == 100, variant
        assert config.dataset.augment == "colour_crop_flip", variant
        assert config.optimizer.weight_decay == 5e-4, variant
        assert tuple(config.optimizer.boundaries) == (0.3, 0.6, 0.8), variant
        if "wrs" in tuple(config.optimizer.wrappers):
            taus[variant] = config.optimizer.wrapper_kwargs.wrs.tau
            assert config.optimizer.weight_decay_mask == "bn_scales", variant
        elif variant.endswith("bwn"):
            assert (config.model.norm, config.optimizer.weight_decay_mask) == ("bwn", "last_layer")
        else:
            assert config.optimizer.weight_decay_mask == "kernels_and_bn_scales", variant
        adamw_wrs = variant.endswith("adamw+wrs")
        assert config.num_epochs == (100.0 if adamw_wrs else 200.0), variant
        assert config.optimizer.name == ("adamw" if "adamw" in variant else "momentum"), variant
    assert taus == {
        "sgdm+wrs": 40,
        "adamw+wrs": 40,
        "resnet18 sgdm+wrs": 20,
        "resnet18 adamw+wrs": 40,
    }
    assert _resolved("cifar10_wrs", "resnet18 sgdm+wd").model.name == "resnet18"
    runs = dict(experiment.expand_sweep(cli.load_config("cifar10_wrs", [])))
    assert runs["sgdm+wrs"].optimizer.wrapper_kwargs.wrs.tau == 40
    assert runs["sgdm+wrs"].dataset.batch_size == 100


def test_cifar10_vgg11_norm_matters_runs_the_authors_80_epochs():
    """80 epochs, lr / 10 every 20 (StepLR(num_epochs // 4)), WD on every parameter in the reference
    and on the last layer (kernel and bias) elsewhere, batch 128 (eladhoffer/norm_matters)."""
    config = _resolved("cifar10_vgg11_norm_matters")
    assert config.num_epochs == 80.0 and config.dataset.batch_size == 128
    assert tuple(config.optimizer.boundaries) == (0.25, 0.5, 0.75)
    assert _resolved("cifar10_vgg11_norm_matters", "wd").optimizer.weight_decay_mask == "all"
    for variant in ("no_wd", "no_wd_mimicry", "lr_schedule", "norm_schedule", "constant_lr"):
        assert _resolved("cifar10_vgg11_norm_matters", variant).optimizer.weight_decay_mask == "last_layer"


def test_fmnist_effective_lr_keeps_the_masks_its_committed_runs_used():
    """The results JSON was produced with WD on every kernel (wd) / the classifier's kernel (others)."""
    masks = {
        v: _resolved("fmnist_effective_lr", v).optimizer.weight_decay_mask
        for v in common.load_module("fmnist_effective_lr").VARIANTS
    }
    assert masks == {"wd": "kernels", **{v: "last_kernel" for v in masks if v != "wd"}}
    assert _resolved("fmnist_effective_lr").num_epochs == 3.0


@pytest.mark.parametrize(
    ("name", "lrs", "groups", "epochs", "batch"),
    [
        ("cifar10_enorm_fc", (0.0005, 0.001, 0.005, 0.01, 0.05, 0.1), (5, 10, 20, 50), 60.0, 256),
        ("cifar10_enorm_nv", (0.01, 0.05, 0.1), (4, 8, 16, 32, 64), 128.0, 128),
    ],
)
def test_enorm_cifar_configs_sweep_the_papers_cross_validation_grids(name, lrs, groups, epochs, batch):
    """The built-in sweep is the paper's learning-rate grid, evaluated on the validation split; GN
    has one variant per group count of the paper's grid."""
    config = cli.load_config(name, [])
    assert config.sweep.key == "optimizer.learning_rate" and tuple(config.sweep.grid) == lrs
    assert (config.dataset.train_split, config.dataset.eval_split) == ("train_minus_validation", "validation")
    assert config.num_epochs == epochs and config.dataset.batch_size == batch
    variants = common.load_module(name).VARIANTS
    assert sorted(v["model.kwargs.num_groups"] for k, v in variants.items() if k.startswith("gn-")) == list(
        groups
    )


@pytest.mark.parametrize("name", ["cifar10_enorm_nv", "fmnist_enorm_nv"])
def test_enorm_nv_variants_are_the_papers_nets(name):
    """Stock et al. Sec. 6.2: the baseline and ENorm nets have no BN but one after the classifier; the
    BN net has BN after every hidden conv. ``cifar10_enorm_nv``'s ENorm variants inherited the base
    config's ``norm='bn'`` (a BN after every conv under ENorm), which the checks accepted."""
    module = common.load_module(name)
    for variant in ("baseline", "enorm-1", "enorm-1.2"):
        config = _variant_config(name, variant)
        assert config.model.norm == "none", (variant, config.model.norm)
        assert config.model.kwargs.get("final_bn", False), variant
    assert _variant_config(name, "bn").model.norm == "bn"
    assert set(module.VARIANTS) >= {"baseline", "bn", "enorm-1", "enorm-1.2"}


def test_imagenet_table4_config_encodes_the_batch_size_rules():
    """Sec. 6.3: lr 0.1 B / 256, WD 1e-5 / 10^-4.5 / 1e-4 / 1e-4 for B = 32 / 64 / 128 / 256, 90
    epochs, type-C ResNet-18, final BN for baseline and ENorm, GN 32 groups."""
    module = common.load_module("imagenet_enorm_resnet18")
    assert len(module.VARIANTS) == 16
    expected_wd = {32: 1e-5, 64: 10**-4.5, 128: 1e-4, 256: 1e-4}
    for b, wd in expected_wd.items():
        config = _resolved("imagenet_enorm_resnet18", f"enorm-1 b{b}")
        assert config.dataset.batch_size == b
        assert math.isclose(config.optimizer.learning_rate, 0.1 * b / 256)
        assert math.isclose(config.optimizer.weight_decay, wd)
        assert config.model.kwargs.final_bn and config.optimizer.wrapper_kwargs.enorm.c == 1.0
    config = _resolved("imagenet_enorm_resnet18", "gn b64")
    assert config.model.kwargs.num_groups == 32 and not config.model.kwargs.final_bn
    assert config.num_epochs == 90.0 and config.model.kwargs.shortcut == "C"
    assert config.dataset.name == "imagenet2012" and config.model.kwargs.stem == "imagenet"


def test_experiments_show_accepts_the_imagenet_config(capsys):
    assert cli.main(["experiments", "show", "imagenet_enorm_resnet18"]) == 0
    assert "runs: bn, gn" in capsys.readouterr().out


@pytest.mark.parametrize("block", analysis.blocks())
def test_writeup_blocks_are_the_rendering_of_the_committed_results(block):
    """Every number of REPRODUCTION.md's summary (and other rendered blocks) comes from
    experiments/results: rerun ``python -m experiments.analysis --write`` after changing either."""
    assert analysis.committed(block) == analysis.rendered(block)


def test_transcribed_statistics_match_the_writeup_tables():
    """Each transcribed (mean, population std) appears in the section tables of REPRODUCTION.md."""
    with open(analysis.WRITEUP) as f:
        text = f.read()
    groups = analysis.load_results("writeup_transcribed")["groups"]
    for key, entry in groups.items():
        if "values" in entry:
            assert all(f"{v:.2f}" in text for v in entry["values"]), key
            continue
        forms = [f"{entry['mean']:.{d}f} ± {entry['std_ddof0']:.{d}f}" for d in (2, 3)]
        assert any(form in text for form in forms), (key, forms)


def test_welch_from_summaries_matches_scipy_on_the_values():
    from scipy import stats

    a, b = [88.1, 88.4, 88.0], [87.6, 87.9, 87.2, 87.5]
    ga, gb = analysis.from_values(a), analysis.from_values(b)
    np.testing.assert_allclose(ga.std, np.std(a, ddof=1))
    diff, p = analysis.welch(ga, gb)
    np.testing.assert_allclose(diff, np.mean(a) - np.mean(b))
    np.testing.assert_allclose(p, stats.ttest_ind(a, b, equal_var=False).pvalue, rtol=1e-10)
    pop = analysis.from_population_std(np.mean(a), np.std(a), 3)  # the write-up's ddof = 0 std
    np.testing.assert_allclose(pop.std, ga.std, rtol=1e-12)
    assert np.isnan(analysis.welch(analysis.from_values([1.0]), gb)[1])
    assert analysis.fmt_p(0.0004) == "p < 0.001" and analysis.fmt_p(0.0312) == "p = 0.03"


def test_analysis_rejects_bad_references_naming_them():
    with pytest.raises(ValueError, match="'<results file>:<group>'"):
        analysis.group("no_colon")
    with pytest.raises(ValueError, match="no group 'nope'"):
        analysis.group("writeup_transcribed:nope")
    with pytest.raises(ValueError, match="no results file"):
        analysis.group("missing_file:x")
    with pytest.raises(ValueError, match="two group references"):
        analysis.render("{d:writeup_transcribed:norm_matters/l2bn}")
    with pytest.raises(ValueError, match="n must be an int >= 2"):
        analysis.from_population_std(1.0, 0.1, 1)
    # a sweep's misspelt grid key read as "pending", a missing grid point pooled depths 2/8/16
    with pytest.raises(ValueError, match=r"no grid key \['model.kwargs.dpth'\]"):
        analysis.group("cifar10_enorm_fc_test:bn@model.kwargs.dpth=8")
    with pytest.raises(ValueError, match=r"would pool runs of different \['model.kwargs.depth'\]"):
        analysis.group("cifar10_enorm_fc_test:bn")
    assert analysis.group("cifar10_enorm_fc_test:bn@model.kwargs.depth=8").n == 3


def test_per_epoch_fields_read_each_runs_curves():
    """``#acc@N`` / ``#loss@N``: the N-th evaluation's test accuracy and the mean train loss since
    the previous one; at the last epoch they equal the run summary's ``eval_accuracy`` and
    ``train_loss`` (the loop's mean over the last epoch)."""
    runs = analysis.load_results("fmnist_beyond")["d/sgd"]
    final = analysis.group("fmnist_beyond:d/sgd#acc@5")
    np.testing.assert_allclose(final, analysis.group("fmnist_beyond:d/sgd"), rtol=1e-12)
    loss = analysis.group("fmnist_beyond:d/sgd#loss@5")
    np.testing.assert_allclose(loss.mean, np.mean([r["train_loss"] for r in runs]), rtol=1e-6)
    first = analysis.group("fmnist_beyond:d/sgd#acc@1")
    np.testing.assert_allclose(first.mean, 100 * np.mean([r["curve"][0][1] for r in runs]), rtol=1e-12)
    with pytest.raises(ValueError, match="'acc@N' or 'loss@N'"):
        analysis.group("fmnist_beyond:d/sgd#acc1")
    with pytest.raises(ValueError, match="the run has 5 evaluations, not 6"):
        analysis.group("fmnist_beyond:d/sgd#loss@6")
    history = [
        {"split": "train", "step": 1, "loss": 2.0},
        {"split": "train", "step": 2, "loss": 1.0},
        {"split": "eval", "step": 2, "accuracy": 0.5},
        {"split": "train", "step": 3, "loss": "nan"},
        {"split": "train", "step": 4, "loss": 0.5},
        {"split": "eval", "step": 4, "accuracy": 0.6},
    ]
    curve = common.train_loss_curve(history)
    assert curve[0] == (2, 1.5) and curve[1][0] == 4 and math.isnan(curve[1][1])


def test_norm_schedule_dips_come_from_the_untransported_running_statistics():
    """The rerun without the BN-statistics transport dips by 10-13 points right after the norm jumps,
    with it by under one point; the final evaluations agree."""
    dips = [
        a - b
        for (_, a), (_, b) in zip(
            analysis.curve("fmnist_effective_lr_no_transport:norm_schedule"),
            analysis.curve("fmnist_effective_lr:lr_schedule"),
            strict=True,
        )
    ]
    assert -14 < dips[0] < -10 and -14 < dips[1] < -10 and abs(dips[2]) < 0.5
    moved = [
        a - b
        for (_, a), (_, b) in zip(
            analysis.curve("fmnist_effective_lr:norm_schedule"),
            analysis.curve("fmnist_effective_lr:lr_schedule"),
            strict=True,
        )
    ]
    assert max(abs(d) for d in moved) < 1.0


def test_linf_constant_overestimates_sigma_by_about_1_4():
    """C(n) E max|x - mean| / sigma on Gaussian batches of 128: the quadrature and a Monte Carlo agree."""
    from jaxnorm.functional import linf_constant

    ratio = analysis.linf_overestimate(128)
    assert 1.39 < ratio < 1.41
    z = np.random.default_rng(0).standard_normal((4000, 128))
    mc = np.mean(np.abs(z - z.mean(1, keepdims=True)).max(1)) * float(linf_constant(128))
    np.testing.assert_allclose(mc, ratio, rtol=0.01)


def test_jsonl_sweep_groups_and_tables(tmp_path, monkeypatch):
    """A resume_grid.py JSONL sweep: groups per variant and grid point, a table per point, pending cells."""
    runs = [
        {"variant": v, "grid": {"depth": d, "lr": lr}, "seed": s, "eval_accuracy": acc}
        for v, d, lr, s, acc in [
            ("bn", 2, 0.1, 0, 0.50),
            ("bn", 2, 0.1, 1, 0.52),
            ("enorm", 2, 0.01, 0, 0.55),
            ("enorm", 2, 0.01, 1, 0.57),
            ("bn", 8, 0.1, 0, 0.40),
        ]
    ]
    (tmp_path / "sweep.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
    monkeypatch.setattr(analysis, "RESULTS_DIR", str(tmp_path))
    analysis.load_results.cache_clear()
    try:
        g = analysis.group("sweep:bn@depth=2")
        np.testing.assert_allclose([g.mean, g.std, g.n], [51.0, np.std([50, 52], ddof=1), 2])
        assert analysis.group("sweep:bn@depth=2,lr=0.01").n == 0  # no such runs: pending, not an error
        assert analysis.render("{m:sweep:enorm@depth=8}") == "pending"
        assert analysis.render("{d:sweep:enorm@depth=2|sweep:bn@depth=2}").startswith("+5.00, p = ")
        assert analysis.render("{d:sweep:enorm@depth=8|sweep:bn@depth=8}") == "pending (n 0/1)"
        table = analysis.render("{sweep:sweep|depth|lr}").splitlines()
        assert table[0] == "| depth | bn | enorm |"
        assert table[2] == "| 2 | 51.00 ± 1.41 (n 2, lr 0.1) | 56.00 ± 1.41 (n 2, lr 0.01) |"
        assert table[3] == "| 8 | 40.00 (n 1, lr 0.1) | pending (n 0) |"
        with pytest.raises(ValueError, match="key=value"):
            analysis.group("sweep:bn@depth")
        with pytest.raises(ValueError, match="NAME\\|ROW_KEYS"):
            analysis.render("{sweep:sweep}")
    finally:
        analysis.load_results.cache_clear()


def _seeded_runs(seeds, **analysis) -> list[dict]:
    """grid.py's run records of one variant (``"seed"`` in each), as common.plot and the reports read them."""
    return [{"seed": seed, "eval_accuracy": 0.8, "train_loss": 0.5, "curve": [(1, 0.5), (2, 0.8)],
             "norms": [(1, 1.0), (2, 1.5)], "analysis": analysis} for seed in seeds]


def test_single_seed_labels_name_the_seed_drawn(tmp_path, monkeypatch):
    """``--seeds 1 2``: the norm panel and the single-seed report columns show runs[0], seed 1; they
    were labelled "(seed 0)"."""
    figures = []
    monkeypatch.setattr(common.plt, "close", figures.append)
    results = {"bn": _seeded_runs([1, 2]), "gn": _seeded_runs([1, 2])}
    common.plot(results, "title", str(tmp_path / "plot.png"))
    assert figures[-1].axes[1].get_title() == "weight-norm dynamics (seed 1)"
    units = {"first": 1.0, "last": 2.0, "head": 3.0, "diverged_at": None}
    assert "classifier (seed 1) |" in analyses.unit_norms_report({"bn": _seeded_runs([1, 2], **units)})
    implicit = analyses.implicit_report({"bn": _seeded_runs([1, 2], mean_abs_u=0.1, imbalance=0.2)})
    assert "mean abs(u) (seed 1)" in implicit and "seed 0" not in implicit
    assert common.first_seed_label({"a": _seeded_runs([3]), "b": _seeded_runs([0])}) == "seeds 3, 0"
    assert common.first_seed_label({"a": [{"eval_accuracy": 0.8}]}) == "first seed"


def test_a_diverged_evaluation_enters_the_curves_as_a_float_nan():
    """grid.py stored a diverged run's curve as [(2, 'nan'), ...]: its plot multiplied the string and
    raised before --json wrote any result of the grid."""
    history = [{"split": "train", "step": 1, "loss": "nan"}, {"split": "eval", "step": 2, "accuracy": "nan"},
               {"split": "eval", "step": 4, "accuracy": 0.5}]
    curve = common.eval_curve(history)
    assert math.isnan(curve[0][1]) and curve[1] == (4, 0.5)
