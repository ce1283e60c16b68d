"""The experiments command line: listing, config errors, a smoke run and a short real run.

The runs read Fashion-MNIST offline (Debian package dataset-fashion-mnist, prepared by
``jaxnorm.data``); they are skipped where it is not installed.
"""

import json
import os
import subprocess
import sys

import pytest
from fmnist import needs_fmnist

from experiments import __main__ as cli
from jaxnorm.train import experiment


def test_list_shows_every_config_with_its_description():
    proc = subprocess.run(
        [sys.executable, "-m", "experiments", "list"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(cli.__file__))),
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    names = [line.split()[0] for line in lines]
    assert "fmnist_norms" in names
    assert sorted(names) == sorted(cli.available())
    assert all(len(line.split(None, 1)) == 2 for line in lines)  # every config has a description


def test_unknown_config_lists_the_choices(capsys):
    assert cli.main(["experiments", "fmnist_norm"]) == 2
    err = capsys.readouterr().err
    assert "unknown config 'fmnist_norm'" in err and "fmnist_norms" in err


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("--config.model.norm=gn", "config.model.norm is set by the sweep"),
        ("--config.dataset.name=svhn", "config.dataset.name must be one of"),
        ("--config.optimizer.name=lamb", "optimizer.name must be one of"),
        ("--config.parallel=dp", "parallel mode must be one of"),
        ("--config.precision=fp8", "precision must be one of"),
        ("--config.no_such_key=1", "no_such_key"),
        ("--config.sweep.key=model.dept", "did you mean config.model.kwargs.depth?"),
    ],
)
def test_bad_configs_fail_before_training_with_the_choices(capsys, override, message):
    assert cli.main(["experiments", "fmnist_norms", override]) == 2
    assert message in capsys.readouterr().err


def test_bad_norm_error_lists_valid_norms(capsys):
    assert cli.main(["experiments", "fmnist_norms", "--config.sweep.grid=('bn', 'l3bn')"]) == 2
    err = capsys.readouterr().err
    assert "run 'l3bn'" in err and "'linfbn'" in err and "'gn'" in err
    args = ["experiments", "fmnist_norms", "--config.sweep.key=", "--config.model.norm=l3bn"]
    assert cli.main(args) == 2
    assert "config.model.norm must be one of" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(cli.available()))
def test_every_config_builds_and_validates(name):
    config = cli.load_config(name, [])
    base = experiment.experiment_defaults()
    base.update(config)
    for _, run_config in experiment.expand_sweep(base):
        experiment.validate(run_config)


@needs_fmnist
def test_quick_smoke_run_writes_table_metrics_and_plots(tmp_path, capsys):
    args = [
        "experiments",
        "fmnist_norms",
        "--config.quick=True",
        "--config.quick_steps=4",
        "--config.quick_examples=256",
        "--config.sweep.grid=('bn', 'gn')",
        f"--config.workdir={tmp_path / 'exp'}",
    ]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "| run" in out and "| bn " in out and "| gn " in out
    quick_dir = tmp_path / "exp_quick"  # quick runs never share the real run's workdir
    results = json.loads((quick_dir / "results.json").read_text())
    assert set(results) == {"bn", "gn"}
    assert results["bn"]["steps"] == 4.0
    for name in ("accuracy.png", "loss.png", "weight_norms.png", "results.md"):
        assert (quick_dir / name).is_file()
    for run in ("bn", "gn"):
        assert (quick_dir / run / "metrics.jsonl").is_file()


@needs_fmnist
def test_short_real_run_reaches_stated_accuracy(tmp_path):
    """The config's BN MLP on 4096 Fashion-MNIST images for 150 steps: > 75% on 2048 test images."""
    overrides = [
        "--config.sweep.key=",
        "--config.num_steps=150",
        "--config.optimizer.warmup_steps=20",
        "--config.dataset.train_split=train[:4096]",
        "--config.dataset.eval_split=test[:2048]",
        "--config.dataset.eval_batch_size=1024",
        "--config.checkpoint_every=0",
        "--config.progress=False",
        "--config.plots=False",
    ]
    result = experiment.run(cli.load_config("fmnist_norms", overrides), str(tmp_path))
    assert result.summary["eval_accuracy"] > 0.75


def test_pmap_model_twin_has_per_device_statistics():
    """Under pmap the runner builds the model with the BN axis_name, and a twin without it for the
    scale-invariance tracer: same parameters, and the twin runs outside pmap."""
    import jax
    import jax.numpy as jnp
    import ml_collections

    from jaxnorm.train import DataParallel

    config = ml_collections.ConfigDict({"model": {"name": "mlp", "norm": "bn", "kwargs": {}}})
    parallel = DataParallel("pmap")
    x = jnp.ones((4, 28, 28, 1))
    model = experiment.build_model(config, 10, parallel)
    twin = experiment.build_model(config, 10, parallel, cross_device=False)
    variables = twin.init(jax.random.PRNGKey(0), x, train=False)
    model_variables = model.init(jax.random.PRNGKey(0), x, train=False)
    assert jax.tree.structure(variables) == jax.tree.structure(model_variables)
    twin.apply(variables, x, train=True, mutable=["batch_stats"])
    with pytest.raises(ValueError, match=r"axis_name=.batch. is not bound"):  # unbound axis name outside pmap
        model.apply(variables, x, train=True, mutable=["batch_stats"])


# ----------------------------------------------------------------- discovery and one-line errors
REPO = os.path.dirname(os.path.dirname(os.path.abspath(cli.__file__)))


def test_show_prints_every_key_with_its_resolved_value(capsys):
    args = ["experiments", "show", "fmnist_norms", "--config.optimizer.learning_rate=0.05"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    config = cli.load_config("fmnist_norms", [])
    from jaxnorm.train.config_checks import dotted_items

    for key, _ in dotted_items(config):
        assert f"\n{key} = " in "\n" + out, key
    assert "optimizer.learning_rate = 0.05" in out
    assert "dataset.batch_size = 128" in out and "model.kwargs.depth = 3" in out
    assert "bn_momentum" in out  # the model options it can also set
    assert cli.main(["experiments", "show", "fmnist_norms", "--config.quick=True"]) == 0
    assert "num_steps = 10" in capsys.readouterr().out  # resolved: the smoke test's values


def test_help_after_a_config_shows_its_keys(capsys):
    assert cli.main(["experiments", "fmnist_norms", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage:") and "optimizer.warmup_steps = 100" in out


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("--config.optimizer.lerning_rate=0.1", "did you mean config.optimizer.learning_rate?"),
        ("--config.batch_size=64", "did you mean config.dataset.batch_size?"),
        ("--config.eval_split=test", "did you mean config.dataset.eval_split?"),
        ("--config.model.bn_mometum=0.8", "did you mean config.model.kwargs.bn_momentum?"),
        ("--config.model.kwargs.widht=8", "did you mean config.model.kwargs.width?"),
        ("--config.num_steps=1.5", "config.num_steps='1.5'"),
        ("--config.optimizer.learning_rate=fast", "config.optimizer.learning_rate='fast'"),
        ("--config.dataset.batch_size=0", "config.dataset.batch_size must be a positive int"),
        ("--config.model.bn_momentum=2x", "config.model.kwargs.bn_momentum must be a float"),
    ],
)
def test_config_errors_are_one_line_naming_the_key(capsys, override, message):
    assert cli.main(["experiments", "fmnist_norms", override]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "\\" not in err  # no escaped quotes or newlines
    assert message in err


def test_model_options_not_in_the_config_are_set_by_dotted_keys():
    config = cli.load_config(
        "fmnist_norms", ["--config.model.bn_momentum=0.8", "--config.model.kwargs.final_bn=True"]
    )
    assert config.model.kwargs.bn_momentum == 0.8 and config.model.kwargs.final_bn is True
    assert config.model.kwargs.depth == 3  # the listed options stay
    with pytest.raises(ValueError, match=r"did you mean config\.model\.kwargs\.depth"):
        cli.load_config("fmnist_norms", ["--config.model.kwargs.dept=2"])


def test_a_sweep_reaches_model_options_not_in_the_config():
    config = cli.load_config(
        "fmnist_norms", ["--config.sweep.key=model.kwargs.bn_momentum", "--config.sweep.grid=(0.9, 0.99)"]
    )
    runs = experiment.expand_sweep(config)
    assert [run.model.kwargs.bn_momentum for _, run in runs] == [0.9, 0.99]


def test_a_missing_dataset_is_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("JAXNORM_DATA_DIR", str(tmp_path))
    args = ["experiments", "fmnist_norms", "--config.dataset.name=mnist", f"--config.workdir={tmp_path}/w"]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: dataset 'mnist' is not prepared") and err.count("\n") == 1


# ----------------------------------------------------------------- checks before any data is read
def test_warmup_longer_than_the_run_fails_in_validate():
    config = cli.load_config("fmnist_norms", ["--config.sweep.key=", "--config.optimizer.warmup_steps=5000"])
    with pytest.raises(ValueError, match=r"config.optimizer.warmup_steps=5000 must be in \[0, 3744\)"):
        experiment.validate(config)


def test_batch_that_does_not_fit_the_split_fails_in_validate():
    config = cli.load_config(
        "fmnist_norms", ["--config.sweep.key=", "--config.dataset.train_split=train[:100]"]
    )
    with pytest.raises(ValueError, match="exceeds the 100 examples"):
        experiment.validate(config)


@pytest.mark.parametrize(
    ("train_split", "eval_split"),
    [("train", "validation"), ("train", "train[-10000:]"), ("train[:100]", "train[50:]")],
)
def test_an_eval_split_that_holds_training_examples_fails_in_validate(train_split, eval_split):
    """validation is train[-10000:]: a run trained on train and evaluated on validation reported its
    accuracy on training examples, and a learning rate chosen that way passed --select."""
    splits = [f"--config.dataset.train_split={train_split}", f"--config.dataset.eval_split={eval_split}"]
    config = cli.load_config("fmnist_norms", ["--config.sweep.key=", *splits])
    with pytest.raises(ValueError, match=r"config.dataset.eval_split=.* shares examples with"):
        experiment.validate(config)


def test_which_splits_share_training_examples():
    from jaxnorm import data

    overlap = lambda a, b: data.splits_overlap("fashion_mnist", a, b)
    assert overlap("train", "validation") and overlap("validation[:50%]", "train[-6000:]")
    assert not overlap("train_minus_validation", "validation") and not overlap("train", "test")
    assert not overlap("train[:512]", "validation[:512]") and not overlap("train[:50]+test", "train[50:100]")
    assert overlap("train[:50]+test", "train[49:100]")


def test_sweep_checks_every_run_before_any_trains(tmp_path):
    """On 4 devices a batch of 126 cannot be split: the sweep stops before its first run trains (today
    the 128 run trained first, after loading the data)."""
    env = {
        **os.environ,
        "PYTHONPATH": REPO,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
        "JAX_PLATFORMS": "cpu",
    }
    args = [
        "--config.quick=True",
        "--config.quick_steps=2",
        "--config.sweep.key=dataset.batch_size",
        "--config.sweep.grid=(128, 126)",
        f"--config.workdir={tmp_path}",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "experiments", "fmnist_norms", *args],
        capture_output=True, text=True, timeout=120, cwd=REPO, env=env,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: run '126': config.dataset.batch_size=126 must be divisible")
    assert proc.stderr.count("\n") == 1
    assert not (tmp_path / "128").exists()  # nothing trained


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("num_steps=-3", r"config.num_steps must be an int >= 0, got -3"),  # fell back to num_epochs
        ("max_to_keep=0", r"config.max_to_keep must be an int >= 1"),  # kept no checkpoint: resumed at 0
        ("log_every=0", r"config.log_every must be an int >= 1"),  # ZeroDivisionError inside the loop
        ("seed=-1", r"config.seed must be an int >= 0"),  # failed later, naming config.dataset
        ("optimizer.learning_rate=-0.1", r"config.optimizer.learning_rate must be a finite number >= 0"),
        ("optimizer.weight_decay=-0.1", r"config.optimizer.weight_decay must be a finite number >= 0"),
        ("num_epochs=-1.0", r"config.num_epochs must be a finite number >= 0"),
    ],
)
def test_loop_settings_out_of_range_fail_in_validate(override, message):
    """Found by the training-engine fuzz of 2026-12-02: each was accepted and changed the run silently
    (gradient ascent at a negative learning rate, no checkpoint kept, a negative step count read as
    'use num_epochs') or failed inside the loop."""
    config = cli.load_config("fmnist_norms", ["--config.sweep.key=", f"--config.{override}"])
    with pytest.raises(ValueError, match=message):
        experiment.validate(config)


def test_a_misspelt_key_in_a_config_file_fails_in_validate():
    """A config file (not an override: the command line refuses those) with ``optimizer.learning_rat``
    ran at the default learning rate; ``validate`` names the key and the one meant."""
    config = cli.load_config("fmnist_norms", ["--config.sweep.key="])
    with config.optimizer.unlocked():
        config.optimizer.learning_rat = 0.5
    with pytest.raises(ValueError, match=r"optimizer\.learning_rat\b.*config\.optimizer\.learning_rate"):
        experiment.validate(config)


def test_experiment_keys_are_the_loop_keys_and_the_experiment_sections():
    """``train`` accepts an experiment's config: its known top-level keys are the loop's and these."""
    from jaxnorm.train.config_checks import EXPERIMENT_KEYS, OPTIMIZER_KEYS
    from jaxnorm.train.loop import default_config

    assert set(experiment.experiment_defaults()) == set(default_config()) | set(EXPERIMENT_KEYS)
    assert set(default_config().optimizer) <= set(OPTIMIZER_KEYS)


def test_grad_clip_norm_from_the_command_line():
    overrides = ["--config.sweep.key=", "--config.optimizer.grad_clip_norm=1.0"]
    config = cli.load_config("fmnist_norms", overrides)
    assert config.optimizer.grad_clip_norm == 1.0
    experiment.validate(config)


@pytest.mark.parametrize(("override", "message"), [
    # momentum 1.5 trained, to a loss of 25
    ("optimizer.momentum=1.5", r"config.optimizer.momentum must be a number in \[0, 1\)"),
    ("optimizer.momentum=-1.0", r"config.optimizer.momentum must be a number in \[0, 1\)"),
    ("quick_steps=0", r"config.quick_steps must be an int >= 1"),  # fell back to num_epochs: no smoke test
])
def test_optimizer_momentum_and_quick_mode_out_of_range_fail_in_validate(override, message):
    config = cli.load_config("fmnist_norms", ["--config.sweep.key=", f"--config.{override}"])
    with pytest.raises(ValueError, match=message):
        experiment.validate(config)


@pytest.mark.parametrize("name", ["/tmp/escaped", "a/", "../up", "a//b", "."])
def test_sweep_run_names_stay_inside_the_workdir(name):
    """An absolute name wrote its run outside the workdir; 'a' and 'a/' shared one directory, found only
    after the first had trained (CLI fuzz of 2026-12-02). 'c/sgdm' (a nested name) stays allowed."""
    config = experiment.experiment_defaults()
    with config.unlocked():
        config.sweep.key, config.sweep.grid, config.sweep.names = "seed", (0, 1), (name, "c/sgdm")
    with pytest.raises(ValueError, match="a run name is a relative path inside the workdir"):
        experiment.expand_sweep(config)
    config.sweep.names = ("b", "c/sgdm")
    assert [n for n, _ in experiment.expand_sweep(config)] == ["b", "c/sgdm"]


@pytest.mark.parametrize("override", [
    "--config.model.depth=5", "--config.model.kwargs={'depth': 5}", "--config.model.kwargs.depth=5"
])
def test_an_override_of_a_swept_setting_is_refused_in_every_spelling(override):
    """Only the literal ``--config.model.kwargs.depth`` was refused; the shorthand and a dict around it
    were discarded by the sweep without a word (CLI fuzz of 2026-12-02)."""
    sweep = ["--config.sweep.key=model.kwargs.depth", "--config.sweep.grid=(2, 4)", "--config.sweep.names=()"]
    with pytest.raises(ValueError, match=r"config.model.kwargs.depth is set by the sweep"):
        cli.load_config("fmnist_enorm_depth", [*sweep, override])


def test_the_model_option_shorthand_beside_its_long_form_is_refused():
    """``--config.model.width=8 --config.model.kwargs.width=16`` trained width 8 whatever the order."""
    for order in (1, -1):
        overrides = ["--config.model.width=8", "--config.model.kwargs.width=16"][::order]
        with pytest.raises(ValueError, match=r"set config.model.kwargs.width twice"):
            cli.load_config("fmnist_enorm_depth", overrides)


def test_a_sweep_value_of_the_wrong_type_is_a_value_error_naming_the_grid():
    """A TypeError from ml_collections escaped the command line, which reports ValueErrors in one line."""
    overrides = ["--config.sweep.key=num_steps", "--config.sweep.grid=(1.5, 2)", "--config.sweep.names=()"]
    config = cli.load_config("fmnist_norms", overrides)
    with pytest.raises(ValueError, match=r"config.sweep.grid: the value 1.5 for config.num_steps"):
        experiment.expand_sweep(config)


def test_quick_mode_on_a_sliced_split_is_named():
    """``train[:64]`` in quick mode became 'train[:64][:512]', a TFDS parse error that did not say quick."""
    config = cli.load_config("fmnist_norms", ["--config.sweep.key=", "--config.quick=True",
                                              "--config.dataset.train_split=train[:64]"])
    with pytest.raises(ValueError, match=r"config.quick=True .* config.dataset.train_split='train\[:64\]'"):
        experiment.apply_quick(config)
    config = cli.load_config("fmnist_norms", ["--config.sweep.key=", "--config.quick_examples=3"])
    with pytest.raises(ValueError, match=r"config\.quick_examples must be an int >= 4"):
        experiment.validate(config)
