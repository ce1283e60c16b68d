"""The loop end to end on a small BN network: learning, metrics, plots, checkpoints, exact resume."""

import os
import shutil
import signal

import flax.linen as nn
import jax
import numpy as np
import pytest

from jaxnorm.train import ArraySource, Checkpointer, read_jsonl, train


class Net(nn.Module):
    @nn.compact
    def __call__(self, x, train):
        x = nn.Conv(8, (3, 3))(x)
        x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
        x = nn.relu(x).mean((1, 2))
        return nn.Dense(3)(x)


def _data(n=320, seed=0):
    """Three classes told apart by the mean of one channel each: learnable in a few dozen steps."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n).astype(np.int32)
    x = rng.normal(size=(n, 6, 6, 3)).astype(np.float32)
    x[np.arange(n), :, :, y] += 1.5
    return {"image": x, "label": y}


CONFIG = {
    "num_steps": 12,
    "log_every": 5,
    "eval_every": 6,
    "checkpoint_every": 4,
    "progress": False,
    "optimizer": {
        "name": "momentum",
        "learning_rate": 0.2,
        "schedule": "step",
        "boundaries": (0.5,),
        "weight_decay": 1e-3,
    },
}


def _sources():
    data = _data()
    train_src = ArraySource(data, 64, seed=3)  # 5 steps per epoch: resume crosses epochs
    eval_src = ArraySource(_data(100, 1), 32, shuffle=False, drop_remainder=False)
    return train_src, eval_src


def _leaves_equal(a, b):
    return all(jax.tree.leaves(jax.tree.map(np.array_equal, a, b)))


def test_loop_learns_and_writes_metrics_and_plots(tmp_path):
    train_src, eval_src = _sources()
    config = {**CONFIG, "num_steps": 40, "checkpoint_every": 0, "tensorboard": True, "log_grad_norm": True}
    result = train(config, model=Net(), train_data=train_src, eval_data=eval_src, workdir=str(tmp_path))
    assert result.summary["eval_accuracy"] > 0.9
    assert not result.preempted
    records = read_jsonl(tmp_path / "metrics.jsonl")
    train_records = [r for r in records if r["split"] == "train"]
    assert [r["step"] for r in train_records] == list(range(1, 41))
    assert [r["step"] for r in records if r["split"] == "eval"] == [6, 12, 18, 24, 30, 36, 40]
    assert {"loss", "accuracy", "lr", "grad_norm"} <= set(train_records[0])
    assert "wnorm/Conv_0/kernel" in train_records[-1] and "eff_lr/Dense_0/kernel" in train_records[-1]
    assert train_records[0]["lr"] == pytest.approx(0.2) and train_records[-1]["lr"] == pytest.approx(0.02)
    for name in ("accuracy.png", "loss.png", "weight_norms.png"):
        assert (tmp_path / name).stat().st_size > 1000
    assert os.listdir(tmp_path / "tensorboard")
    assert Checkpointer(str(tmp_path / "checkpoints")).latest_step() == 40  # final save


class CrashAt:
    """A source that fails (or signals SIGTERM) when it is about to deliver global step ``at``."""

    def __init__(self, source, at, action):
        self.source, self.at, self.action = source, at, action
        self.steps_per_epoch = source.steps_per_epoch
        self.global_batch_size = source.global_batch_size

    def epoch(self, epoch, start=0):
        for i, batch in enumerate(self.source.epoch(epoch, start), start):
            if epoch * self.steps_per_epoch + i == self.at:
                if self.action == "crash":
                    raise RuntimeError("simulated crash")
                os.kill(os.getpid(), signal.SIGTERM)
            yield batch


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted 12-step run with checkpoints every 4 steps."""
    workdir = tmp_path_factory.mktemp("ref")
    train_src, eval_src = _sources()
    result = train(CONFIG, model=Net(), train_data=train_src, eval_data=eval_src, workdir=str(workdir))
    return result, read_jsonl(workdir / "metrics.jsonl")


@pytest.mark.parametrize("action", ["crash", "sigterm"])
def test_kill_and_resume_is_bit_identical(tmp_path, reference, action):
    ref_result, ref_records = reference
    train_src, eval_src = _sources()
    workdir = str(tmp_path / "run")
    # step index 7 is the 8th batch: a crash there loses steps 5..7 (last checkpoint: 4);
    # SIGTERM there lets step 8 finish and checkpoints it.
    crashing = CrashAt(train_src, 7, action)
    if action == "crash":
        with pytest.raises(RuntimeError, match="simulated crash"):
            train(CONFIG, model=Net(), train_data=crashing, eval_data=eval_src, workdir=workdir)
        assert Checkpointer(workdir + "/checkpoints").latest_step() == 4
    else:
        stopped = train(CONFIG, model=Net(), train_data=crashing, eval_data=eval_src, workdir=workdir)
        assert stopped.preempted and int(stopped.state.step) == 8
        assert Checkpointer(workdir + "/checkpoints").latest_step() == 8
        assert not _leaves_equal(stopped.state.params, ref_result.state.params)
    resumed = train(CONFIG, model=Net(), train_data=train_src, eval_data=eval_src, workdir=workdir)
    assert int(resumed.state.step) == 12 and not resumed.preempted
    assert _leaves_equal(resumed.state, ref_result.state)
    # the metrics file reads as one run: every step once, same numbers
    run_records = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    assert [(r["step"], r["split"]) for r in run_records] == [(r["step"], r["split"]) for r in ref_records]
    assert [r["loss"] for r in run_records] == [r["loss"] for r in ref_records]


def test_bad_parallel_mode_lists_choices():
    from jaxnorm.train import DataParallel

    with pytest.raises(ValueError, match=r"parallel mode must be one of \('jit', 'pmap'\)"):
        DataParallel("shard_map")


class BNNet(nn.Module):
    """Conv -> BN -> ReLU -> pool -> Dense, no biases: the conv's units are scale invariant."""

    axis_name: str | None = None

    @nn.compact
    def __call__(self, x, train):
        x = nn.Conv(8, (3, 3), use_bias=False)(x)
        x = nn.BatchNorm(use_running_average=not train, momentum=0.9, axis_name=self.axis_name)(x)
        x = nn.relu(x).mean((1, 2))
        return nn.Dense(3, use_bias=False)(x)


def _directions(kernel):
    kernel = np.asarray(kernel, np.float64).reshape(-1, kernel.shape[-1])
    return kernel / np.linalg.norm(kernel, axis=0)


def test_wd_mimicry_run_follows_the_recorded_reference_run(tmp_path):
    """Norm matters Sec. 2 through the loop: the reference run (WD on every kernel) leaves
    recorded_norms.npz; a run without WD on the conv, with wd_mimicry naming the reference by its
    sibling directory, moves the conv's unit directions as the reference did (plain SGD and
    step_decay = lr * wd make the two runs' directions equal); without mimicry they differ."""
    lr, wd = 0.2, 0.5
    base = {**CONFIG, "num_steps": 10, "checkpoint_every": 0, "plots": False, "eval_every": 0}
    sgd = {"name": "sgd", "learning_rate": lr, "schedule": "constant", "weight_decay": wd}
    runs = {
        "wd": {**sgd, "weight_decay_mask": "kernels", "wrappers": ("record_norms",)},
        "mimic": {
            **sgd,
            "weight_decay_mask": "last_kernel",
            "wrappers": ("wd_mimicry",),
            "wrapper_kwargs": {"wd_mimicry": {"reference": "wd", "step_decay": lr * wd}},
        },
        "no_wd": {**sgd, "weight_decay_mask": "last_kernel"},
    }
    kernels = {}
    for name, optimizer in runs.items():
        train_src, _ = _sources()
        result = train(
            {**base, "optimizer": optimizer},
            model=BNNet(),
            train_data=train_src,
            workdir=str(tmp_path / name),
        )
        kernels[name] = result.state.params["Conv_0"]["kernel"]
    with np.load(tmp_path / "wd" / "recorded_norms.npz") as saved:
        assert saved.files == ["Conv_0/kernel"]  # the scale-invariant kernel only, not the classifier
        assert saved["Conv_0/kernel"].shape == (10, 8)
        assert np.all(np.diff(saved["Conv_0/kernel"][:, 0]) < 0)  # WD shrinks the norms
    ref = _directions(kernels["wd"])
    np.testing.assert_allclose(_directions(kernels["mimic"]), ref, atol=1e-4)
    assert np.max(np.abs(_directions(kernels["no_wd"]) - ref)) > 1e-2
    assert not (tmp_path / "mimic" / "recorded_norms.npz").exists()


def test_norm_schedule_wrappers_hold_and_grow_the_scale_invariant_norms():
    """norm_schedule holds the conv's units at rho; norm_schedule_from_lr sets them to
    sqrt(lr_0 / lr(t)) while the classifier is left to the optimizer."""
    base = {**CONFIG, "num_steps": 6, "checkpoint_every": 0, "plots": False, "eval_every": 0}
    step = {
        "name": "sgd",
        "learning_rate": 0.2,
        "schedule": "step",
        "boundaries": (0.5,),
        "decay_factor": 0.25,
    }
    norms = {}
    for name, wrapper, kwargs in (
        ("hold", "norm_schedule", {"rho": 2.0}),
        ("trade", "norm_schedule_from_lr", {}),
    ):
        train_src, _ = _sources()
        optimizer = {**step, "wrappers": (wrapper,), "wrapper_kwargs": {wrapper: kwargs}}
        params = train({**base, "optimizer": optimizer}, model=BNNet(), train_data=train_src).state.params
        conv = np.asarray(params["Conv_0"]["kernel"]).reshape(-1, 8)
        norms[name] = (
            np.linalg.norm(conv, axis=0),
            np.linalg.norm(np.asarray(params["Dense_0"]["kernel"]), axis=0),
        )
    np.testing.assert_allclose(norms["hold"][0], 2.0, rtol=1e-5)
    np.testing.assert_allclose(norms["trade"][0], np.sqrt(0.2 / 0.05), rtol=1e-5)
    assert not np.allclose(norms["trade"][1], norms["trade"][1][0])  # the classifier is not projected


def test_scale_invariant_wrapper_under_pmap_traces_the_per_device_twin():
    """Under pmap the BN merges moments across devices, which the invariance tracer cannot follow;
    the loop traces ``invariance_model`` instead and norm_schedule holds the conv's units at rho."""
    from jaxnorm.train import DataParallel

    base = {**CONFIG, "num_steps": 4, "checkpoint_every": 0, "plots": False, "eval_every": 0}
    optimizer = {
        "name": "sgd",
        "learning_rate": 0.2,
        "wrappers": ("norm_schedule",),
        "wrapper_kwargs": {"norm_schedule": {"rho": 2.0}},
    }
    train_src, _ = _sources()
    result = train(
        {**base, "optimizer": optimizer},
        model=BNNet(axis_name="batch"),
        train_data=train_src,
        parallel=DataParallel("pmap"),
        invariance_model=BNNet(),
    )
    conv = np.asarray(result.state.params["Conv_0"]["kernel"]).reshape(-1, 8)
    np.testing.assert_allclose(np.linalg.norm(conv, axis=0), 2.0, rtol=1e-5)


def test_scale_invariant_mask_errors_instead_of_selecting_nothing():
    """The loop's mask for the Norm-matters wrappers: the conv of a BN net; a clear error under pmap
    and for a net without BN, rather than a mask that silently selects no kernel."""
    from jaxnorm.train.setup import scale_invariant_mask_for

    images = _data(8)["image"]
    expected = {
        "Conv_0": {"kernel": True},
        "Dense_0": {"kernel": False},
        "BatchNorm_0": {"scale": False, "bias": False},
    }
    assert scale_invariant_mask_for(BNNet(), images, None) == expected
    with pytest.raises(ValueError, match=r"under parallel='pmap' need train\(\.\.\., invariance_model="):
        scale_invariant_mask_for(BNNet(axis_name="batch"), images, "batch")
    assert scale_invariant_mask_for(BNNet(axis_name="batch"), images, "batch", BNNet()) == expected

    class NoBN(nn.Module):
        @nn.compact
        def __call__(self, x, train):
            return nn.Dense(3)(nn.relu(nn.Conv(8, (3, 3))(x)).mean((1, 2)))

    with pytest.raises(ValueError, match="no kernel of this model is scale invariant"):
        scale_invariant_mask_for(NoBN(), images, None)


class DataInitNet(nn.Module):
    """Weight norm with Salimans & Kingma's data-dependent init: the params depend on init's batch."""

    @nn.compact
    def __call__(self, x, train):
        from jaxnorm import nn as jnn

        h = jnn.WeightNormDense(5, g_init="data")(x.reshape(x.shape[0], -1))
        return nn.Dense(3)(nn.relu(h))


def test_init_examples_gives_data_dependent_inits_a_real_batch():
    """``init_examples`` first examples of the first batch reach ``model.init``: with 64 of them the
    data-dependent init standardises the first layer's pre-activations over those 64 (mean 0, std 1
    per unit, Sec. 3 of Salimans & Kingma); with the default 1 weight norm refuses. Bad values are named."""
    train_src, _ = _sources()
    first = next(iter(train_src.epoch(0)))["image"]
    config = {"num_steps": 1, "progress": False, "optimizer": {"name": "sgd", "learning_rate": 0.0}}
    model = DataInitNet()

    def hidden(n):
        params = train({**config, "init_examples": n}, model=model, train_data=train_src).state.params
        pre = model.apply({"params": params}, first[:64], train=False, capture_intermediates=True)
        return np.asarray(pre[1]["intermediates"]["WeightNormDense_0"]["__call__"][0], np.float64)

    h = hidden(64)
    np.testing.assert_allclose(h.mean(0), 0.0, atol=1e-4)
    np.testing.assert_allclose(h.std(0), 1.0, rtol=1e-3)
    assert np.abs(hidden(8).std(0) - 1).max() > 0.05  # standardised over 8 examples, not these 64
    with pytest.raises(ValueError, match="at least 2 examples"):
        hidden(1)  # the default: weight norm's own error, not a silently degenerate init
    for bad in (0, 321, True):  # (a float is refused by ml_collections: the field is an int)
        with pytest.raises(ValueError, match=r"config.init_examples must be an int in \[1, 320\]"):
            train({**config, "init_examples": bad}, model=model, train_data=train_src)


def test_init_examples_beyond_one_batch_reads_the_first_batches_of_the_first_epoch():
    """``init_examples`` larger than the batch (64): model.init sees the first two batches of epoch 0
    (the data init standardises over those 128 examples, not over the first batch alone)."""
    train_src, _ = _sources()
    batches = train_src.epoch(0)
    first_two = np.concatenate([next(batches)["image"], next(batches)["image"]])
    config = {"num_steps": 1, "progress": False, "init_examples": 128}
    config["optimizer"] = {"name": "sgd", "learning_rate": 0.0}
    model = DataInitNet()
    params = train(config, model=model, train_data=train_src).state.params
    pre = model.apply({"params": params}, first_two, train=False, capture_intermediates=True)
    h = np.asarray(pre[1]["intermediates"]["WeightNormDense_0"]["__call__"][0], np.float64)
    np.testing.assert_allclose(h.mean(0), 0.0, atol=1e-4)
    np.testing.assert_allclose(h.std(0), 1.0, rtol=1e-3)
    assert np.abs(h[:64].std(0) - 1).max() > 0.01  # not the first batch's standardisation


def test_angular_update_records_and_the_equilibrium_prediction():
    """``log_angular_update``: every train record holds ``angle/<kernel>``, the mean angle the units
    turned in that update (checked against jaxnorm.diagnostics.angular_update on the params before and
    after one step), and ``angle_eq`` = sqrt(2 lr wd / (1 + momentum)) at the record's lr."""
    from jaxnorm import diagnostics

    train_src, _ = _sources()
    config = {**CONFIG, "num_steps": 3, "log_every": 1, "checkpoint_every": 0, "log_angular_update": True}
    runs = {n: train({**config, "num_steps": n}, model=Net(), train_data=train_src) for n in (1, 2)}
    records = [r for r in runs[2].history if r.get("split") == "train"]
    assert [r["step"] for r in records] == [1, 2]  # a record's step counts the updates made
    before, after = runs[1].state.params, runs[2].state.params  # the params around update 2
    expected = diagnostics.angular_update(before, after)["Conv_0"]["kernel"].mean()
    assert records[1]["angle/Conv_0/kernel"] == pytest.approx(float(expected), rel=1e-4)
    assert records[1]["angle/Dense_0/kernel"] > 0
    for record in records:
        lr, opt = record["lr"], CONFIG["optimizer"]
        assert record["angle_eq"] == pytest.approx(np.sqrt(2 * lr * opt["weight_decay"] / 1.9), rel=1e-12)


class _CrashingSource(ArraySource):
    """An ``ArraySource`` that raises when asked for global step ``crash_at`` (a crash mid-run)."""

    crash_at = None

    def batch(self, order, epoch, step):
        if self.crash_at is not None and epoch * self.steps_per_epoch + step == self.crash_at:
            raise RuntimeError("simulated crash")
        return super().batch(order, epoch, step)


def test_a_run_resumed_after_a_crash_keeps_every_metrics_record(tmp_path):
    """``log_every`` 4, a checkpoint every step, a crash reading step 7: the records of steps 5 and 6
    were still waiting for their flush when their checkpoints were written, so the resumed run (from
    step 6) had no records of them (metrics.jsonl steps 1-4, 7, 8; its summary's train loss off).
    Records are flushed before each checkpoint now."""
    from jaxnorm import models

    rng = np.random.default_rng(0)
    data = {"image": rng.normal(size=(200, 6)).astype(np.float32), "label": rng.integers(0, 3, 200)}
    data["label"] = data["label"].astype(np.int32)
    config = {"num_steps": 8, "progress": False, "weight_norms": False, "plots": False,
              "checkpoint_every": 1, "log_every": 4, "optimizer": {"name": "momentum", "learning_rate": 0.2}}

    def run(workdir, crash_at=None):
        source = _CrashingSource(data, 64, seed=0)
        source.crash_at = crash_at
        model = models.create("mlp", num_classes=3, norm="bn", depth=2, width=16)
        return train(config, model=model, train_data=source, workdir=str(workdir))

    reference = run(tmp_path / "a")
    with pytest.raises(RuntimeError, match="simulated crash"):
        run(tmp_path / "b", crash_at=6)
    resumed = run(tmp_path / "b")
    assert resumed.summary["resumed_from_step"] == 6
    steps = [r["step"] for r in read_jsonl(str(tmp_path / "b" / "metrics.jsonl")) if r["split"] == "train"]
    assert steps == list(range(1, 9))
    assert resumed.summary["train_loss"] == pytest.approx(reference.summary["train_loss"], rel=1e-6)


def test_float16_checkpoint_written_before_the_skip_count_resumes(tmp_path):
    """A float16 checkpoint whose loss scale has no ``skipped`` count (written before the count
    existed) resumes to the same end as an uninterrupted run; its ``lr`` is then read at the loop's
    step, as before."""
    config = {**CONFIG, "precision": "float16"}
    train_src, eval_src = _sources()
    reference = train(config, model=Net(), train_data=train_src, eval_data=eval_src)
    assert reference.summary["skipped_steps"] == 0
    workdir = str(tmp_path / "run")
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(config, model=Net(), train_data=CrashAt(train_src, 7, "crash"), eval_data=eval_src,
              workdir=workdir)
    state = Checkpointer(workdir + "/checkpoints").restore(jax.tree.map(np.asarray, reference.state), 4)
    old = jax.device_get(state)._replace(loss_scale=state.loss_scale._replace(skipped=None))
    shutil.rmtree(os.path.join(workdir, "checkpoints", "4"))
    ckpt = Checkpointer(workdir + "/checkpoints")
    ckpt.save(4, old)
    ckpt.close()
    resumed = train(config, model=Net(), train_data=train_src, eval_data=eval_src, workdir=workdir)
    assert resumed.state.loss_scale.skipped is None
    assert _leaves_equal(resumed.state.params, reference.state.params)


class LoudNet(Net):
    """``Net`` with logits scaled by 16: at the initial loss scale 2^15 its float16 gradients
    overflow at three of the first steps, so the loop skips those updates."""

    def __call__(self, x, train):
        return super().__call__(x, train) * 16.0


def test_float16_skips_are_counted_reported_and_the_lr_record_follows_the_updates(capsys):
    train_src, eval_src = _sources()
    result = train({**CONFIG, "precision": "float16"}, model=LoudNet(), train_data=train_src,
                   eval_data=eval_src)
    records = [r for r in result.history if r["split"] == "train"]
    skipped = [int(r["skipped_steps"]) for r in records]
    assert skipped[-1] == result.summary["skipped_steps"] == int(result.state.loss_scale.skipped) >= 2
    assert skipped[5] == skipped[-1], "the test needs the skips before the schedule's boundary"
    before = [0, *skipped[:-1]]  # skips before each step
    # the step schedule drops 0.2 -> 0.02 at update 6: the first record at 0.02 is the step whose
    # update is the 7th applied one
    steps = [r["step"] for r in records]
    expected = [0.2 if step - 1 - b < 6 else 0.02 for step, b in zip(steps, before, strict=True)]
    np.testing.assert_allclose([r["lr"] for r in records], expected, rtol=1e-6)
    assert f"{skipped[-1]} of 12 steps overflowed and were skipped" in capsys.readouterr().out


def test_weight_norm_plot_wraps_a_long_title_and_puts_a_long_legend_outside(tmp_path, monkeypatch):
    """The one-panel figure's title is the settings line (about 110 characters for a sweep): it was one line,
    cut at both edges of the 6-inch figure, and 16 legend entries (4 runs x 4 layers) covered the lines."""
    from jaxnorm.train import plots

    figures = []
    monkeypatch.setattr(plots.plt, "close", figures.append)
    layers = ("dense_0", "dense_1", "dense_2", "head")
    records = [
        {"split": "train", "step": s, **{f"wnorm/{k}/kernel": 1.0 + s for k in layers}} for s in (1, 2)
    ]
    title = plots.settings_title(
        {"model": {"name": "mlp", "norm": "bn"}, "optimizer": {"name": "momentum", "learning_rate": 0.1},
         "dataset": {"name": "fashion_mnist", "batch_size": 128}, "num_epochs": 8, "seed": 0},
        varied="model.norm",
    ) + " · with a long tail added to pass the width"
    paths = plots.plot_runs({n: records for n in "abcd"}, str(tmp_path), title=title)
    assert paths[-1].endswith("weight_norms.png") and os.path.exists(paths[-1])
    (ax,) = figures[-1].axes
    lines = ax.get_title().split("\n")
    assert len(lines) > 1 and max(map(len, lines)) <= 70
    figures[-1].canvas.draw()
    legend, axes_box = ax.get_legend().get_window_extent(), ax.get_window_extent()
    assert legend.x0 >= axes_box.x1  # right of the axes, over no line


class _Linear(nn.Module):
    """Without Net's relu, which XLA:CPU's max turns from NaN into 0."""

    @nn.compact
    def __call__(self, x, train):
        return nn.Dense(3)(x.reshape(x.shape[0], -1))


def test_a_diverged_run_scores_nan_and_still_writes_its_summary_table_and_plots(tmp_path, capsys):
    """``argmax`` of NaN logits is class 0, so a NaN model scored the share of class 0 as its accuracy
    (0.088 on a Fashion-MNIST slice, 0.10 in committed results) and passed for a trained seed; and
    the progress line and the results table formatted the recorded "nan" with ``:.4f`` and crashed,
    writing no summary."""
    from jaxnorm.train import experiment

    _, eval_src = _sources()
    data = _data()
    data["image"][5] = np.nan  # one example: its gradient makes every parameter NaN in its step
    train_src = ArraySource(data, 64, seed=3)
    config = {**CONFIG, "num_steps": 10, "checkpoint_every": 0, "progress": True, "eval_every": 5}
    result = train(config, model=_Linear(), train_data=train_src, eval_data=eval_src, workdir=str(tmp_path))
    records = read_jsonl(tmp_path / "metrics.jsonl")
    last_train = [r for r in records if r["split"] == "train"][-1]
    assert last_train["loss"] == "nan" and last_train["accuracy"] == "nan"
    assert np.isnan(result.summary["eval_accuracy"]) and np.isnan(result.summary["best_eval_accuracy"])
    assert "nan" in experiment.results_table({"run": result.summary})
    assert (tmp_path / "summary.json").exists() and (tmp_path / "accuracy.png").exists()
    assert "loss=nan" in capsys.readouterr().err


@pytest.mark.parametrize("num_steps", [0, 300])
@pytest.mark.parametrize("varied", ["num_epochs", "num_steps"])
def test_settings_title_of_a_length_sweep_states_no_length(varied, num_steps):
    """Runs differing in num_epochs (or num_steps) have no common length: the title used to state the
    base config's ("8.0 epochs · ... runs differ in num_epochs"); other sweeps keep it."""
    from jaxnorm.train import plots

    config = {"model": {"name": "mlp"}, "dataset": {"name": "fashion_mnist", "batch_size": 128},
              "num_epochs": 8.0, "num_steps": num_steps, "seed": 0}
    title = plots.settings_title(config, varied=varied)
    settings, _, differ = title.partition(" · runs differ in ")
    assert "epochs" not in settings and "steps" not in settings and differ == varied, title
    length = "300 steps" if num_steps else "8.0 epochs"
    assert length in plots.settings_title(config, varied="dataset.batch_size")


def test_a_new_run_in_a_workdir_without_checkpoints_leaves_nothing_of_the_old_one(tmp_path):
    """A finished run's checkpoints deleted (to free disk), another experiment started in its
    workdir: with no checkpoint the plan was "new", and the old summary.json (and recorded norms,
    TensorBoard) stayed, so a rerun after a kill between the final checkpoint and the summary
    returned the old experiment's numbers as the new one's ``recorded`` result."""
    train_src, eval_src = _sources()
    base = {**CONFIG, "checkpoint_every": 0, "plots": False}
    train(base, model=Net(), train_data=train_src, eval_data=eval_src, workdir=str(tmp_path))
    assert (tmp_path / "summary.json").exists()
    shutil.rmtree(tmp_path / "checkpoints")
    other = {**base, "optimizer": {**base["optimizer"], "learning_rate": 0.01}, "checkpoint_every": 4}
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(other, model=Net(), train_data=CrashAt(train_src, 6, "crash"), eval_data=eval_src,
              workdir=str(tmp_path))
    assert not (tmp_path / "summary.json").exists()
    steps = [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl") if r["split"] == "train"]
    assert steps == [1, 2, 3, 4, 5, 6]  # the new run's, up to the crash


def test_a_second_session_on_a_workdir_in_use_is_refused(tmp_path):
    """Two sessions of one run started at once (a requeued job while the first still runs) both
    trained to the end and wrote every step twice into one metrics.jsonl; the lock makes the second
    raise, naming the holder, and the operating system frees it when the holder ends."""
    from jaxnorm.train.run_record import WorkdirLock

    first = WorkdirLock(str(tmp_path))
    first.acquire()
    train_src, eval_src = _sources()
    config = {**CONFIG, "checkpoint_every": 0, "plots": False}
    in_use = rf"{tmp_path} is in use by another session of this run \(pid {os.getpid()}"
    with pytest.raises(ValueError, match=in_use):
        train(config, model=Net(), train_data=train_src, eval_data=eval_src, workdir=str(tmp_path))
    assert not (tmp_path / "run.json").exists()  # the second session touched nothing
    first.release()
    assert train(config, model=Net(), train_data=train_src, workdir=str(tmp_path)).summary["steps"] == 12
