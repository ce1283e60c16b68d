"""``resume_grid.py`` (a sweep that survives stops) and the configs ported from hand-written loops.

The resume test trains a tiny config (a 1 x 16 MLP on 256 Fashion-MNIST images, 1 epoch of 4 steps)
through the command line: a finished run is one JSON line, a rerun skips it, ``--select`` takes the
best value of an earlier JSONL per variant. The ported configs (issue 17) each build, pass the
config checks for every variant, and their analysis runs on a 2-step run.
"""

from __future__ import annotations

import json
import math
import textwrap

import pytest
from fmnist import needs_fmnist

from experiments.scripts import analyses, common, resume_grid
from jaxnorm.train import experiment

TINY = textwrap.dedent(
    '''
    """A tiny config for the resume_grid test."""

    from jaxnorm.train.experiment import experiment_defaults

    SEEDS = (0,)
    VARIANTS = {"none": {"model.norm": "none"}, "bn": {"model.norm": "bn"}}


    def get_config():
        config = experiment_defaults()
        config.model.name = "mlp"
        config.model.kwargs = {"depth": 1, "width": 16}
        config.dataset.name = "fashion_mnist"
        config.dataset.train_split = "train[:256]"
        config.dataset.eval_split = "test[:128]"
        config.dataset.batch_size = 64
        config.dataset.eval_batch_size = 128
        config.num_epochs = 1.0
        config.log_every = 2
        config.checkpoint_every = 2
        config.optimizer.learning_rate = 0.05
        return config
    '''
)


def _lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


@needs_fmnist
def test_resume_grid_records_skips_finished_runs_and_selects_from_an_earlier_sweep(
    tmp_path, capsys, monkeypatch
):
    config = tmp_path / "tiny_config.py"
    config.write_text(TINY)
    first = tmp_path / "select.jsonl"
    args = [str(config), "--jsonl", str(first), "--workdir", str(tmp_path / "runs"), "--seeds", "0",
            "--set", "dataset.eval_split=validation[:128]"]  # a selection is made on validation data
    resume_grid.main([*args, "--grid", "optimizer.learning_rate=0.001,0.2"])
    records = _lines(first)
    assert [(r["variant"], r["grid"]["optimizer.learning_rate"]) for r in records] == [
        ("none", 0.001),
        ("bn", 0.001),
        ("none", 0.2),
        ("bn", 0.2),
    ]
    for r in records:  # the JSONL format the running sweeps rely on
        assert {
            "key",
            "config",
            "variant",
            "grid",
            "sets",
            "seed",
            "code",
            "eval_accuracy",
            "final_l2",
            "curve",
        } <= set(r)
        assert r["steps"] == 4.0 and r["config"] == "tiny_config" and "analysis" not in r
    assert len({r["key"] for r in records}) == 4

    capsys.readouterr()
    resume_grid.main([*args, "--grid", "optimizer.learning_rate=0.001,0.2"])  # every run done: nothing trains
    assert "==" not in capsys.readouterr().out
    assert len(_lines(first)) == 4

    # --select: per variant, the learning rate with the best eval accuracy in the first JSONL
    best = {
        v: max((r for r in records if r["variant"] == v), key=lambda r: r["eval_accuracy"])["grid"]
        for v in ("none", "bn")
    }
    second = tmp_path / "test.jsonl"
    select = [str(config), "--jsonl", str(second), "--workdir", str(tmp_path / "runs2"), "--seeds", "0"]
    resume_grid.main([*select, "--select", f"{first}:optimizer.learning_rate", "--only", "bn"])
    (chosen,) = _lines(second)
    assert chosen["variant"] == "bn" and chosen["grid"] == best["bn"]


def test_select_takes_the_best_mean_over_seeds_and_names_missing_runs(tmp_path):
    path = tmp_path / "runs.jsonl"
    rows = [
        ("a", 0.1, 0, 0.80),
        ("a", 0.1, 1, 0.60),  # mean 0.70
        ("a", 0.01, 0, 0.75),
        ("a", 0.01, 1, 0.74),  # mean 0.745: chosen
        ("b", 0.1, 0, float("nan")),  # NaN counts as 0
        ("b", 0.01, 0, 0.1),
    ]
    path.write_text(
        "".join(
            json.dumps({"variant": v, "grid": {"lr": lr}, "seed": s, "eval_accuracy": acc}) + "\n"
            for v, lr, s, acc in rows
        )
    )
    assert resume_grid.select(str(path), "lr", "a", {}) == 0.01
    assert resume_grid.select(str(path), "lr", "b", {}) == 0.01
    with pytest.raises(ValueError, match="no runs of 'c'"):
        resume_grid.select(str(path), "lr", "c", {})


PORTED = {
    "fmnist_isp_sparsity": ("wd", "isp_sparsity"),
    "fmnist_wn_init": ("data", "wn_init"),
    "fmnist_hessian_lr": ("bn lr 0.1", "hessian_lr"),
    "fmnist_enorm_c_depth": ("enorm-1.2, last junction skipped", "unit_norms"),
    "fmnist_implicit_enorm": ("implicit, u lr x1000", "implicit_enorm"),
    "fmnist_swn_depth": ("MLP swn depth 4", "swn_depth"),
}


@pytest.mark.parametrize("name", sorted(PORTED))
def test_ported_config_builds_and_every_variant_passes_the_checks(name):
    module = common.load_module(name)
    assert module.ANALYSIS == PORTED[name][1] and module.ANALYSIS in analyses.ANALYSES
    for variant, overrides in module.VARIANTS.items():
        config = common.run_config(module.get_config(), overrides, 0)
        try:
            experiment.validate(config)
        except ValueError as e:
            raise AssertionError(f"{name} / {variant}: {e}") from e


# the three heaviest (25-50 s each on a loaded 2-core CI run) run with the slow suite
SLOW_PORTED = {"fmnist_hessian_lr", "fmnist_swn_depth", "fmnist_wn_init"}


@needs_fmnist
@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=[pytest.mark.slow] if n in SLOW_PORTED else []) for n in sorted(PORTED)]
)
def test_ported_config_analysis_runs_on_a_two_step_run(name):
    variant, analysis = PORTED[name]
    module = common.load_module(name)
    base = module.get_config()
    common.apply_sets(
        base,
        [
            "num_steps=2",
            "dataset.train_split=train[:512]",
            "dataset.eval_split=test[:128]",
            "dataset.eval_batch_size=128",
            "log_every=1",
        ],
    )
    if name == "fmnist_wn_init":
        common.apply_sets(base, ["init_examples=256", "dataset.batch_size=128"])  # two batches
    result = common.run_one(base, module.VARIANTS[variant], 0, analysis=module.ANALYSIS)
    numbers = {k: v for k, v in result["analysis"].items() if isinstance(v, float)}
    assert numbers and all(math.isfinite(v) for v in numbers.values()), result["analysis"]
    table = analyses.get_analysis(analysis).report({variant: [result]})
    assert variant.split()[0] in table and table.count("\n") >= 2


def test_unknown_analysis_is_named():
    with pytest.raises(ValueError, match="ANALYSIS must be one of"):
        analyses.get_analysis("nope")


def test_hidden_norm_curve_reads_a_diverged_runs_string_nans():
    history = [
        {"split": "train", "step": 1, "wnorm/dense_0/kernel": 1.0, "wnorm/head/kernel": 9.0},
        {"split": "train", "step": 2, "wnorm/dense_0/kernel": "nan", "wnorm/head/kernel": "nan"},
        {"split": "eval", "step": 2, "accuracy": 0.1},
    ]
    curve = common.hidden_norm_curve(history)
    assert curve[0] == (1, 1.0) and curve[1][0] == 2 and math.isnan(curve[1][1])
