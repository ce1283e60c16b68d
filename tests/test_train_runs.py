"""What a run directory is and what a restart may do with it (issue 16): run records, resume only the
same experiment, explicit extension with an honest schedule, recorded results of finished runs,
fallback from an unreadable checkpoint, records and progress output."""

import io
import json
import os
import re
import shutil
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest

import jaxnorm.nn as jnn
from jaxnorm.train import ArraySource, Checkpointer, read_jsonl, train
from jaxnorm.train.metrics import progress_bar

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_train_loop import CONFIG, CrashAt, Net, _data, _sources

SHORT = {**CONFIG, "num_steps": 8, "eval_every": 4, "plots": False}


def _train(config, workdir, data=None):
    train_src, eval_src = _sources()
    return train(config, model=Net(), train_data=data or train_src, eval_data=eval_src, workdir=str(workdir))


def _same(a, b):
    return all(jax.tree.leaves(jax.tree.map(np.array_equal, a, b)))


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """An 8-step run with checkpoints at 4 and 8."""
    workdir = tmp_path_factory.mktemp("finished")
    return workdir, _train(SHORT, workdir)


def test_run_json_records_config_versions_devices_and_sessions(finished):
    workdir, _ = finished
    record = json.loads((workdir / "run.json").read_text())
    assert record["config"]["optimizer"]["learning_rate"] == 0.2
    assert record["total_steps"] == record["schedule_steps"] == 8
    session = record["sessions"][0]
    assert session["versions"]["jax"] == jax.__version__
    assert {"flax", "optax", "orbax-checkpoint"} <= set(session["versions"])
    assert session["devices"] and session["process_count"] == 1
    assert "started" in session and "git_commit" in session
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["steps"] == 8.0 and summary["preempted"] is False and summary["seconds"] > 0


def test_another_experiment_in_the_workdir_is_an_error_naming_the_keys(finished, tmp_path):
    """Issue 16.1: the old loop resumed any workdir whatever the config."""
    workdir, _ = finished
    other = {**SHORT, "seed": 5, "optimizer": {**SHORT["optimizer"], "learning_rate": 0.1}}
    with pytest.raises(ValueError) as e:
        _train(other, workdir)
    message = str(e.value)
    assert "optimizer.learning_rate: 0.2 -> 0.1" in message and "seed: 0 -> 5" in message
    assert "on_existing='restart'" in message and "another workdir" in message


class NormNet(nn.Module):
    """Net with jaxnorm's BatchNorm of order ``p``: the same parameter shapes at every ``p``."""

    p: object = 2

    @nn.compact
    def __call__(self, x, train):
        x = nn.Conv(8, (3, 3))(x)
        x = jnn.BatchNorm(use_running_average=not train, momentum=0.9, p=self.p)(x)
        return nn.Dense(3)(nn.relu(x).mean((1, 2)))


def test_another_model_or_data_of_the_same_config_is_another_experiment(tmp_path):
    """``train(model=...)``: the config does not say which model; a workdir of an L2-BN run resumed
    with an L1-BN model of the same parameter shapes (or another batch size) was continued from the L2
    run's weights, and a finished one returned its results as the L1 model's."""
    train_src, eval_src = _sources()
    run = lambda model, data=train_src: train(
        SHORT, model=model, train_data=data, eval_data=eval_src, workdir=str(tmp_path)
    )
    first = run(NormNet(p=2))
    with pytest.raises(ValueError, match=r"holds a different experiment \(model: .*p = 2.* -> .*p = 1"):
        run(NormNet(p=1))
    batch_size_changed = r"train_data: {.*'global_batch_size': 64, .* -> {.*'global_batch_size': 32,"
    with pytest.raises(ValueError, match=batch_size_changed):
        run(NormNet(p=2), ArraySource(_data(), 32, seed=3))
    again = run(NormNet(p=2))  # the same model, another instance: the recorded run
    assert again.summary["recorded"] and again.summary["train_loss"] == first.summary["train_loss"]
    record = json.loads((tmp_path / "run.json").read_text())
    del record["identity"]  # a run recorded before identities were: resumed as before
    (tmp_path / "run.json").write_text(json.dumps(record))
    assert run(NormNet(p=1)).summary["recorded"]


def test_another_eval_set_of_the_same_size_is_another_experiment(tmp_path):
    """The eval source was no part of a run's identity: a run resumed (or a finished one called again)
    with a test set where it had a validation set of the same size mixed both in one metrics.jsonl, or
    returned the validation accuracy as the test accuracy. The examples' fingerprint tells them apart;
    the eval batch size may change (the evaluation is exact at any)."""
    train_src, _ = _sources()
    evaluate_on = lambda seed, batch=32: ArraySource(
        _data(100, seed), batch, shuffle=False, drop_remainder=False
    )
    run = lambda eval_src: train(SHORT, model=NormNet(p=2), train_data=train_src, eval_data=eval_src,
                                 workdir=str(tmp_path))
    first = run(evaluate_on(1))
    assert run(evaluate_on(1, batch=50)).summary["eval_accuracy"] == first.summary["eval_accuracy"]
    with pytest.raises(ValueError, match=r"holds a different experiment \(eval_data: {'fingerprint'"):
        run(evaluate_on(2))
    assert evaluate_on(1).fingerprint == evaluate_on(1, batch=50).fingerprint != evaluate_on(2).fingerprint


def test_an_eval_source_that_would_leave_examples_out_is_refused(tmp_path):
    """ArraySource and jaxnorm.data.load drop the last partial batch by default: as eval data, 9,984 of
    Fashion-MNIST's 10,000 test images were evaluated at batch 256, without a word."""
    train_src, _ = _sources()
    with pytest.raises(ValueError, match=r"eval_data drops its last partial batch .* 96 of its 100 examples"):
        train(SHORT, model=NormNet(p=2), train_data=train_src, eval_data=ArraySource(_data(100, 1), 32),
              workdir=str(tmp_path))
    train(SHORT, model=NormNet(p=2), train_data=train_src, eval_data=ArraySource(_data(96, 1), 32))


def test_a_finished_run_reports_its_recorded_results_not_zero_timings(finished, capsys):
    """Issue 16.1: rerunning a finished run printed time 0.0 and images/s 0."""
    workdir, first = finished
    capsys.readouterr()
    again = _train({**SHORT, "progress": True}, workdir)  # execution keys may differ
    assert again.summary["recorded"] is True
    assert again.summary["seconds"] == pytest.approx(first.summary["seconds"])
    assert again.summary["images_per_second"] == pytest.approx(first.summary["images_per_second"])
    assert again.summary["eval_accuracy"] == first.summary["eval_accuracy"]
    assert "already finished its 8 steps" in capsys.readouterr().out
    assert _same(again.state, first.state)


def test_a_finished_run_without_its_summary_recomputes_the_last_epochs_train_loss(tmp_path):
    """A run killed after its final checkpoint but before summary.json: the recorded result's
    train_loss is again the mean over the last epoch (5 steps), not over the last 6 of 12 steps
    (the fallback took the run's length for the epoch's)."""
    config = {**SHORT, "num_steps": 12, "eval_every": 6}
    first = _train(config, tmp_path)
    (tmp_path / "summary.json").unlink()
    again = _train(config, tmp_path)
    assert again.summary["recorded"] is True
    assert again.summary["train_loss"] == pytest.approx(first.summary["train_loss"], rel=1e-12)
    assert again.summary["train_accuracy"] == pytest.approx(first.summary["train_accuracy"], rel=1e-12)


def test_restart_discards_the_old_run(finished, tmp_path):
    workdir, _ = finished
    fresh_dir = tmp_path / "copy"
    shutil.copytree(workdir, fresh_dir)
    other = {**SHORT, "seed": 5, "on_existing": "restart"}
    restarted = _train(other, fresh_dir)
    reference = _train({**SHORT, "seed": 5}, tmp_path / "new")
    assert _same(restarted.state, reference.state)
    steps = [r["step"] for r in read_jsonl(fresh_dir / "metrics.jsonl") if r["split"] == "train"]
    assert steps == list(range(1, 9))
    assert json.loads((fresh_dir / "run.json").read_text())["config"]["seed"] == 5


def test_a_workdir_without_run_record_is_not_resumed_blindly(finished, tmp_path):
    legacy = tmp_path / "legacy"
    shutil.copytree(finished[0], legacy)
    os.remove(legacy / "run.json")
    with pytest.raises(ValueError, match=r"no readable run\.json"):
        _train(SHORT, legacy)


def test_on_existing_error_and_bad_values(finished):
    workdir, _ = finished
    with pytest.raises(ValueError, match=r"already holds a run \(config.on_existing='error'\)"):
        _train({**SHORT, "on_existing": "error"}, workdir)
    choices = r"\('resume', 'extend', 'restart', 'error'\)"
    with pytest.raises(ValueError, match=r"on_existing must be one of " + choices):
        _train({**SHORT, "on_existing": "continue"}, workdir)


def test_extension_is_explicit_and_keeps_the_schedule(tmp_path):
    """Issue 16.1: raising num_steps silently restarted the cosine schedule (the lr jumped back up).
    Now it needs on_existing='extend', and past the original 8 steps the lr holds the schedule's end
    value; the first 8 steps are untouched."""
    cosine = {
        **SHORT,
        "optimizer": {"name": "momentum", "learning_rate": 0.2, "schedule": "cosine", "end_value": 0.01},
    }
    _train(cosine, tmp_path)
    before = [r["lr"] for r in read_jsonl(tmp_path / "metrics.jsonl") if r["split"] == "train"]
    longer = {**cosine, "num_steps": 12}
    with pytest.raises(ValueError, match=r"run of 8 steps and this config asks for 12.*on_existing='extend'"):
        _train(longer, tmp_path)
    extended = _train({**longer, "on_existing": "extend"}, tmp_path)
    lrs = [r["lr"] for r in extended.history if r["split"] == "train"]
    assert [r["step"] for r in extended.history if r["split"] == "train"] == list(range(1, 13))
    assert lrs[:8] == before
    np.testing.assert_allclose(lrs[8:], 0.01, rtol=1e-5)  # the cosine's end value, held
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["total_steps"] == 12 and record["schedule_steps"] == 8 and len(record["sessions"]) == 2
    with pytest.raises(ValueError, match="run of 12 steps and this config asks for 8"):
        _train(cosine, tmp_path)  # shorter is not an extension


def _truncate_metadata(step_dir):
    metadata = [os.path.join(d, f) for d, _, files in os.walk(step_dir) for f in files if f == "_METADATA"]
    assert metadata
    for path in metadata:
        open(path, "w").close()


def _empty(step_dir):
    shutil.rmtree(step_dir)
    os.makedirs(step_dir)


@pytest.mark.parametrize("damage", [_truncate_metadata, _empty], ids=["truncated metadata", "empty dir"])
def test_unreadable_newest_checkpoint_falls_back_to_the_previous_one(finished, tmp_path, capsys, damage):
    """Issue 16.3: a truncated metadata file in the newest checkpoint stopped the run with a
    TensorStore traceback although the previous checkpoint was intact. An empty newest directory (a
    copy cut short) made the intact previous one fail too (orbax's manager, once it had failed on the
    empty one, could not restore the next: "no checkpoint can be restored (steps [8, 4])"); each
    failure now gets a fresh manager."""
    workdir = tmp_path / "run"
    shutil.copytree(finished[0], workdir)
    os.remove(workdir / "summary.json")  # as if killed right after the last save
    damage(workdir / "checkpoints" / "8")
    capsys.readouterr()
    resumed = _train(SHORT, workdir)
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "cannot be restored" in line]
    assert len(lines) == 1 and "checkpoints/8 " in lines[0] and "falling back" in lines[0]
    assert "resuming from step 4 of 8" in out
    assert _same(resumed.state, finished[1].state)
    assert Checkpointer(str(workdir / "checkpoints")).latest_step() == 8
    assert (workdir / "checkpoints" / "unreadable-8").is_dir()


def test_tensorboard_holds_each_step_once_after_a_crash_and_resume(tmp_path):
    """Issue 16.7: metrics.jsonl was trimmed on resume, TensorBoard kept the replayed steps twice."""
    import tensorflow as tf

    config = {**SHORT, "tensorboard": True}
    train_src, _ = _sources()
    with pytest.raises(RuntimeError, match="simulated crash"):
        _train(config, tmp_path, CrashAt(train_src, 7, "crash"))  # steps 5, 6 logged, checkpoint 4
    _train(config, tmp_path)
    seen = []
    for name in sorted(os.listdir(tmp_path / "tensorboard")):
        for event in tf.compat.v1.train.summary_iterator(str(tmp_path / "tensorboard" / name)):
            seen += [(v.tag, event.step) for v in event.summary.value if v.tag == "train/loss"]
    assert sorted(seen) == [("train/loss", s) for s in range(1, 9)]


def test_preemption_marks_the_summary_partial(tmp_path):
    train_src, _ = _sources()
    stopped = _train(SHORT, tmp_path, CrashAt(train_src, 5, "sigterm"))
    assert stopped.preempted and stopped.summary["preempted"] is True
    assert json.loads((tmp_path / "summary.json").read_text())["preempted"] is True
    resumed = _train(SHORT, tmp_path)
    assert resumed.summary["resumed_from_step"] == 6 and resumed.summary["preempted"] is False


def test_a_preempted_and_resumed_run_writes_the_records_of_an_uninterrupted_one(finished, tmp_path):
    """The flush at a preemption (step 6) added ``wnorm/*`` / ``eff_lr/*`` to that step's record, which
    an uninterrupted run does not have there (found 2026-12-02): weight norms are recorded at the
    ``log_every`` steps and the last step only, whatever flushed the records."""
    train_src, _ = _sources()
    _train(SHORT, tmp_path, CrashAt(train_src, 5, "sigterm"))
    _train(SHORT, tmp_path)

    def shape(workdir):
        return [(r["step"], r["split"], sorted(k for k in r if k != "wall_time"))
                for r in read_jsonl(str(workdir / "metrics.jsonl"))]

    reference = shape(finished[0])
    assert shape(tmp_path) == reference
    norm_steps = [step for step, _, keys in reference if any(k.startswith("wnorm/") for k in keys)]
    assert norm_steps == [5, 8]  # log_every 5 and the end; not the evaluation / checkpoint at 4


def test_records_carry_timestamps_and_train_loss_skips_the_first_steps(tmp_path):
    """Issue 16.7: on a run shorter than an epoch the train loss averaged every step from step 1.
    Now: the last epoch, or the second half of a shorter run."""
    config = {**SHORT, "num_steps": 4, "checkpoint_every": 0}
    result = _train(config, tmp_path)  # 5 steps per epoch: a 4-step run averages steps 3 and 4
    train_records = [r for r in result.history if r["split"] == "train"]
    assert result.summary["train_loss"] == pytest.approx(np.mean([r["loss"] for r in train_records[2:]]))
    for record in read_jsonl(tmp_path / "metrics.jsonl"):
        assert record["wall_time"] > 1.7e9


def test_progress_in_a_log_is_plain_lines():
    """Issue 16.7: tqdm wrote carriage-return updates into non-tty logs."""
    log = io.StringIO()
    bar = progress_bar(total=100, initial=0, enabled=True, stream=log)
    for _ in range(100):
        bar.update(1)
    bar.set_postfix(loss="0.1234")
    bar.close()
    text = log.getvalue()
    assert "\r" not in text and text.splitlines() == ["step 100/100 (100%) loss=0.1234"]


@pytest.mark.parametrize("wrappers", [("wrs",), ("bwn",)])
def test_weight_norm_data_init_trains_with_a_rescaling_wrapper(wrappers):
    """The set-up traced the model by initialising it on one example, which weight norm's
    data-dependent init refuses (two values per Dense unit): with a rescaling wrapper (its BN
    transport trace) a run with init_examples=64 failed naming the batch of one."""
    from jaxnorm import models

    train_src, _ = _sources()
    model = models.create("mlp", num_classes=3, norm="wn", depth=2, width=16, g_init="data")
    config = {**SHORT, "init_examples": 64, "eval_every": 0}
    config["optimizer"] = {**SHORT["optimizer"], "wrappers": wrappers}
    result = train(config, model=model, train_data=train_src)
    assert np.isfinite(result.summary["train_loss"])


@pytest.mark.parametrize(
    "bad",
    [
        {"num_steps": -3},
        {"max_to_keep": 0},
        {"log_every": 0},
        {"optimizer": {"name": "momentum", "learning_rate": -0.5}},
        {"optimizer": {"name": "momentum", "learning_rate": float("nan")}},
        {"optimizer": {"name": "momentum", "learning_rate": 0.1, "grad_clip_norm": -1.0}},
    ],
    ids=["num_steps", "max_to_keep", "log_every", "negative lr", "nan lr", "grad_clip_norm"],
)
def test_python_train_refuses_loop_settings_out_of_range(bad, tmp_path):
    """``train`` from Python ran these (gradient ascent, no checkpoint kept, clipping silently off, a
    negative step count read as one epoch); now the key is named before anything is written."""
    key = "optimizer" if "optimizer" in bad else next(iter(bad))
    with pytest.raises(ValueError, match=rf"config\.{key}"):
        _train({**SHORT, **bad}, tmp_path)
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize(
    "bad, key",
    [
        ({"optimizer": {"name": "momentum", "learning_rat": 0.5}}, "optimizer.learning_rat"),
        ({"num_step": 3}, "num_step"),
        ({"implicit_enorm": {"weigth": 1.0}}, "implicit_enorm.weigth"),
        ({"optimizer": "sgd"}, "optimizer"),
    ],
    ids=["optimizer key", "loop key", "implicit_enorm key", "optimizer not a mapping"],
)
def test_python_train_refuses_a_key_it_does_not_read(bad, key, tmp_path):
    """A misspelt key from Python was ignored: ``learning_rat=0.5`` trained at the default 0.1 without a
    word (the command line refuses such a key; ``experiment.validate`` now too)."""
    with pytest.raises(ValueError, match=rf"config\.{re.escape(key)}\b"):
        _train({**SHORT, **bad}, tmp_path)
    assert not os.listdir(tmp_path)


def test_python_train_takes_numpy_scalars_as_numbers(tmp_path):
    """``num_steps=np.int64(8)`` or a learning rate from ``np.logspace`` in float32 raised ml_collections'
    "cannot be casted to type <class 'int'>"; they now train as their Python values."""
    plain = {**SHORT, "optimizer": {**SHORT["optimizer"], "learning_rate": 0.25}}
    numpy = {**plain, "num_steps": np.int64(8), "eval_every": np.int32(4)}
    numpy["optimizer"] = {**plain["optimizer"], "learning_rate": np.float32(0.25)}
    expected = _train(plain, tmp_path / "plain")
    result = _train(numpy, tmp_path / "numpy")
    assert int(result.state.step) == 8
    assert _same(expected.state.params, result.state.params)


def test_grad_clip_norm_is_a_loop_default_so_the_command_line_takes_it():
    """``--config.optimizer.grad_clip_norm`` was refused by the command line (not among the defaults) although
    docs/training.md lists it; a run recorded before it was a default still resumes (absent == 0.0)."""
    from jaxnorm.train import default_config
    from jaxnorm.train.run_record import config_differences

    assert default_config().optimizer.grad_clip_norm == 0.0
    old = default_config().to_dict()
    del old["optimizer"]["grad_clip_norm"]
    assert config_differences(old, default_config()) == {}


def test_effective_learning_rate_of_a_diverged_layer_is_nan_not_inf():
    """A NaN kernel logged ``eff_lr`` = inf (``mean_sq > 0`` is False for NaN), as if it had shrunk to 0."""
    from jaxnorm.train.metrics import weight_norm_metrics

    params = {"a": {"kernel": np.full((3, 2), np.nan, np.float32)},
              "b": {"kernel": np.zeros((3, 2), np.float32)}, "c": {"kernel": np.ones((3, 2), np.float32)}}
    out = weight_norm_metrics(params, 0.1)
    assert np.isnan(out["eff_lr/a/kernel"]) and out["eff_lr/b/kernel"] == np.inf
    assert out["eff_lr/c/kernel"] == pytest.approx(0.1 / 3)
    assert np.isnan(weight_norm_metrics({"b": params["b"]}, 0.0)["eff_lr/b/kernel"])


def test_padded_training_batches_with_batch_statistics_are_refused(tmp_path):
    """``drop_remainder=False`` training data: the copies that fill the last batch are masked out of the
    loss but entered BatchNorm's statistics (a last batch of one example and its copies has zero
    variance: the step was garbage, and differed with the device count). Distributed fuzz, 2026-12-02."""
    from jaxnorm import models

    data = _data(193)
    padded = ArraySource(data, 64, seed=0, drop_remainder=False)
    bn = models.create("mlp", num_classes=3, norm="bn", depth=1, width=8)
    with pytest.raises(ValueError, match=r"pads its last batch \(193 examples, batches of 64"):
        train({**SHORT, "num_steps": 2}, model=bn, train_data=padded)
    plain = models.create("mlp", num_classes=3, norm="none", depth=1, width=8)
    assert train({**SHORT, "num_steps": 2, "eval_every": 0}, model=plain, train_data=padded).state.step == 2
    even = ArraySource(_data(192), 64, seed=0, drop_remainder=False)  # nothing to pad
    assert train({**SHORT, "num_steps": 2, "eval_every": 0}, model=bn, train_data=even).state.step == 2


def test_config_parallel_and_the_handed_parallelism_agree():
    """A ``DataParallel`` handed to ``train`` made ``config.parallel`` unread: 'tpu-bogus' passed and
    run.json recorded 'jit' for a pmap run."""
    from jaxnorm.train import DataParallel

    train_src, _ = _sources()
    with pytest.raises(ValueError, match=r"config\.parallel must be 'jit' or 'pmap', got 'tpu-bogus'"):
        train({**SHORT, "parallel": "tpu-bogus"}, model=Net(), train_data=train_src)
    with pytest.raises(ValueError, match=r"config\.parallel='pmap', but train was handed a DataParallel"):
        train({**SHORT, "parallel": "pmap"}, model=Net(), train_data=train_src, parallel=DataParallel("jit"))


def test_a_run_with_eval_data_resumed_without_it_is_another_experiment(tmp_path):
    """Called once with eval_data=None, a run evaluated on set A recorded an identity without eval data,
    and then accepted set B, returning A's recorded accuracy as B's."""
    train_src, _ = _sources()
    evaluate_on = lambda seed: ArraySource(_data(100, seed), 50, shuffle=False, drop_remainder=False)
    run = lambda eval_src: train(SHORT, model=NormNet(p=2), train_data=train_src, eval_data=eval_src,
                                 workdir=str(tmp_path))
    run(evaluate_on(1))
    with pytest.raises(ValueError, match=r"holds a different experiment \(eval_data: {.*} -> None\)"):
        run(None)


def test_a_config_holding_a_function_is_the_same_experiment_in_every_session():
    """repr() of a function holds its address, another in every process and session: a config with an
    initializer (model.kwargs.kernel_init) made two processes of one run refuse each other, and a
    workdir refuse its own run on resume."""
    from jaxnorm.train.run_record import config_dict, experiment_digest

    init = jax.nn.initializers.he_normal()
    config = {"model": {"kwargs": {"kernel_init": init, "sizes": frozenset({3, 1, 2})}}}
    assert " at 0x" not in json.dumps(config_dict(config))
    assert config_dict(config)["model"]["kwargs"]["sizes"] == [1, 2, 3]
    again = {"kernel_init": jax.nn.initializers.he_normal(), "sizes": frozenset({1, 2, 3})}
    assert experiment_digest(config, None, 10) == experiment_digest({"model": {"kwargs": again}}, None, 10)


def test_a_workdir_on_a_filesystem_without_flock_trains_with_a_warning(tmp_path, monkeypatch, capsys):
    """NFS without lockd or Lustre mounted noflock answer flock with ENOLCK / ENOSYS: the lock stopped
    every run there; it is skipped with a warning."""
    import errno

    from jaxnorm.train import run_record

    def no_flock(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(run_record.fcntl, "flock", no_flock)
    train_src, eval_src = _sources()
    result = train(SHORT, model=NormNet(p=2), train_data=train_src, eval_data=eval_src, workdir=str(tmp_path))
    assert result.summary["steps"] > 0 and "cannot be locked" in capsys.readouterr().out
