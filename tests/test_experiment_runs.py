"""The experiment runner's records (issue 16): quick runs in their own workdir, a changed config is
refused for every run of a sweep before any trains, preemption exits with its own code and marks the
results partial, finished runs are reported from their records."""

import json

import numpy as np
import pytest

from jaxnorm.train import experiment
from jaxnorm.train.loop import RunResult


def _fake_run(preempt_at=None):
    calls = []

    def run(config, workdir):
        calls.append(workdir)
        preempted = preempt_at is not None and len(calls) == preempt_at
        summary = {"steps": 3.0, "eval_accuracy": 0.5, "seconds": 1.0, "preempted": preempted}
        history = [{"step": 1, "split": "train", "loss": 1.0, "accuracy": 0.5}]
        return RunResult(type("S", (), {"step": np.int32(3)})(), history, summary, preempted)

    return run, calls


def _config(tmp_path):
    config = experiment.experiment_defaults()
    config.update(
        {"workdir": str(tmp_path), "sweep": {"key": "model.norm", "grid": ("bn", "gn")}, "num_steps": 3}
    )
    return config


def test_preemption_writes_partial_results_and_exits_with_its_own_code(tmp_path, monkeypatch):
    """Issue 16.7: SIGTERM exited 0 and wrote "final" results of a partial run."""
    run, calls = _fake_run(preempt_at=1)
    monkeypatch.setattr(experiment, "run", run)
    with pytest.raises(SystemExit) as e:
        experiment.run_experiment(_config(tmp_path), print_fn=lambda *a: None)
    assert e.value.code == experiment.PREEMPTED_EXIT_CODE != 0
    assert isinstance(e.value, experiment.Preempted) and len(calls) == 1
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["bn"]["preempted"] is True
    assert "| bn (partial) " in (tmp_path / "results.md").read_text()


def test_a_changed_config_fails_for_every_run_before_any_trains(tmp_path, monkeypatch):
    """A sweep over existing run directories: a changed key is reported before the first run trains."""
    gn = tmp_path / "gn"
    (gn / "checkpoints" / "3").mkdir(parents=True)
    config = _config(tmp_path)
    recorded = experiment.expand_sweep(config)[1][1].to_dict()
    recorded["seed"] = 7
    (gn / "run.json").write_text(json.dumps({"config": recorded, "total_steps": 3}))
    run, calls = _fake_run()
    monkeypatch.setattr(experiment, "run", run)
    with pytest.raises(ValueError, match=r"run 'gn': .* holds a different experiment \(seed: 7 -> 0\)"):
        experiment.run_experiment(config, print_fn=lambda *a: None)
    assert calls == []


def test_results_table_marks_recorded_runs():
    table = experiment.results_table({"bn": {"eval_accuracy": 0.9, "seconds": 6.4, "recorded": True}})
    assert "| bn (recorded) | 0.9000" in table and "6.4" in table


def test_quick_smoke_run_never_meets_the_real_run(tmp_path, monkeypatch):
    """Issue 16.1: the docs' `--config.quick=True` then real-run sequence made the real run resume the
    smoke test's checkpoint. The smoke test now writes <workdir>_quick."""
    run, calls = _fake_run()
    monkeypatch.setattr(experiment, "run", run)
    config = _config(tmp_path / "exp")
    config.quick = True
    experiment.run_experiment(config, print_fn=lambda *a: None)
    assert calls == [str(tmp_path / "exp_quick" / "bn"), str(tmp_path / "exp_quick" / "gn")]
    assert (tmp_path / "exp_quick" / "results.json").is_file() and not (tmp_path / "exp").exists()
