"""What a sweep records and reuses (``resume_grid.py``, ``grid.py``, the analysis): a run counted once, a
setting applied or refused, a recorded result reused only for the config that made it.

Each of these was a silent wrong result found by a hunt over the runner: a rerun with another checkpoint
interval appended every run again (the analysis then counted seeds twice: p = 0.02 for 0.13), ``--select``
pooled SGD and momentum runs, ``--set`` lost to a variant's own value, a misspelt ``--set`` key trained
with the default, an edited config reused the old results, ``--config.optimizer.learning_rate`` was
dropped by a sweep over ``optimizer``, ``grid.py --only bm`` ran nothing and overwrote ``--json``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from fmnist import needs_fmnist
from test_experiments_resume import TINY

from experiments import __main__ as cli
from experiments import analysis
from experiments.scripts import common, grid, records, resume_grid


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def tiny(tmp_path):
    config = tmp_path / "tiny_config.py"
    config.write_text(TINY)
    return config


def _args(config, tmp_path, *extra):
    jsonl = tmp_path / "runs.jsonl"
    return [str(config), "--jsonl", str(jsonl), "--workdir", str(tmp_path / "runs"), *extra], jsonl


@needs_fmnist
def test_a_rerun_with_another_checkpoint_interval_or_set_order_trains_nothing(tiny, tmp_path, capsys):
    args, jsonl = _args(tiny, tmp_path, "--only", "bn", "--seeds", "0")
    resume_grid.main([*args, "--set", "checkpoint_every=2", "optimizer.momentum=0.9", "log_every=2"])
    first = _lines(jsonl)
    assert len(first) == 1 and first[0]["run_config"]["optimizer"]["momentum"] == 0.9
    capsys.readouterr()
    resume_grid.main([*args, "--set", "log_every=1", "optimizer.momentum=9e-1", "checkpoint_every=4"])
    assert "==" not in capsys.readouterr().out
    assert _lines(jsonl) == first


@needs_fmnist
def test_a_recorded_run_of_an_edited_config_is_refused(tiny, tmp_path):
    args, jsonl = _args(tiny, tmp_path, "--only", "bn", "--seeds", "0")
    resume_grid.main(args)
    tiny.write_text(TINY.replace("learning_rate = 0.05", "learning_rate = 0.01"))
    changed = r"recorded with another config \(optimizer.learning_rate: 0.05 -> 0.01\)"
    with pytest.raises(ValueError, match=changed):
        resume_grid.main([*args[:-1], "0", "1"])  # seeds 0 and 1: seed 0's line is the old config's
    assert len(_lines(jsonl)) == 1


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--seeds", "0", "0"], "--seeds repeats a seed"),
        (["--grid", "optimizer.learning_rate=0.1,1e-1"], "a value is repeated"),
        (["--grid", "optimizer.learning_rat=0.1,0.2"], "did you mean config.optimizer.learning_rate"),
        (["--set", "num_epoch=2"], "--set num_epoch: the config has no key config.num_epoch"),
        (["--set", "model.norm=gn"], "variant 'none' sets model.norm='none' itself"),
        (["--set", "seed=3"], "give seeds with --seeds"),
        (["--only", "bm"], "unknown variants \\['bm'\\]"),
    ],
)
def test_settings_that_would_run_something_else_than_asked_are_refused(tiny, tmp_path, extra, message):
    args, jsonl = _args(tiny, tmp_path, *extra)
    with pytest.raises(ValueError, match=message):
        resume_grid.main(args)
    assert not jsonl.exists()  # refused before any run


def test_grid_py_refuses_an_unknown_variant_before_writing_its_json(tiny, tmp_path):
    out = tmp_path / "results.json"
    out.write_text('{"bn": []}')
    with pytest.raises(ValueError, match="unknown variants"):
        grid.main([str(tiny), "--only", "bm", "--json", str(out), "--out", str(tmp_path)])
    assert out.read_text() == '{"bn": []}'
    with pytest.raises(ValueError, match=r"variant .none. sets model.norm=.none. itself.*leave the variant"):
        grid.main([str(tiny), "--set", "model.norm=gn", "--out", str(tmp_path)])


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _run(variant, seed, acc, grid=None, sets=()):
    return {"config": "c", "variant": variant, "grid": grid or {}, "sets": list(sets), "seed": seed,
            "eval_accuracy": acc}


def test_select_refuses_to_pool_settings_and_incomplete_or_repeated_selections(tmp_path):
    path = tmp_path / "select.jsonl"
    sgd, momentum = ["optimizer.name=sgd"], ["optimizer.name=momentum"]
    _write(path, [
        _run("a", 0, 0.5, {"lr": 0.3}, sgd), _run("a", 0, 0.4, {"lr": 0.01}, sgd),
        _run("a", 0, 0.1, {"lr": 0.3}, momentum), _run("a", 0, 0.6, {"lr": 0.01}, momentum),
    ])
    with pytest.raises(ValueError, match=r"differ in --set \['optimizer.name'\]"):
        resume_grid.select(str(path), "lr", "a", {})
    _write(path, [_run("a", 0, 0.5, {"lr": 0.3, "o": "sgd"}), _run("a", 0, 0.4, {"lr": 0.01, "o": "sgd"}),
                  _run("a", 0, 0.1, {"lr": 0.3, "o": "mom"}), _run("a", 0, 0.6, {"lr": 0.01, "o": "mom"})])
    with pytest.raises(ValueError, match=r"differ in grid \['o'\]"):
        resume_grid.select(str(path), "lr", "a", {})
    assert resume_grid.select(str(path), "lr", "a", {"o": "mom"}) == 0.01  # a grid key tells them apart
    assert resume_grid.select(str(path), "lr", "a", {"o": "sgd"}) == 0.3
    a_runs = [_run("a", 0, 0.5, {"lr": 0.3}), _run("a", 0, 0.4, {"lr": 0.01})]
    _write(path, [*a_runs, _run("b", 0, 0.5, {"lr": 0.3})])
    with pytest.raises(ValueError, match=r"incomplete \(runs per value of lr: \{0.01: 0, 0.3: 1\}"):
        resume_grid.select(str(path), "lr", "b", {})
    _write(path, [*a_runs, _run("a", 0, 0.5, {"lr": 0.3})])
    with pytest.raises(ValueError, match="recorded more than once"):
        resume_grid.select(str(path), "lr", "a", {})


def test_analysis_counts_a_seed_once_and_refuses_to_pool_settings(tmp_path, monkeypatch):
    monkeypatch.setattr(analysis, "RESULTS_DIR", str(tmp_path))
    analysis.load_results.cache_clear()
    try:
        a = [_run("bn", s, acc, {}, ["num_epochs=2", f"checkpoint_every={c}"])
             for s, acc, c in [(0, 0.6, 2), (1, 0.7, 2), (0, 0.6, 4)]]  # seed 0 appended again
        _write(tmp_path / "dup.jsonl", a)
        with pytest.raises(ValueError, match="recorded more than once"):
            analysis.group("dup:bn")
        _write(tmp_path / "mixed.jsonl", [_run("bn", 0, 0.6, {}, ["optimizer.name=sgd"]),
                                          _run("bn", 1, 0.7, {}, ["optimizer.name=momentum"])])
        with pytest.raises(ValueError, match="different --set values"):
            analysis.group("mixed:bn")
    finally:
        analysis.load_results.cache_clear()


@pytest.fixture
def results_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(analysis, "RESULTS_DIR", str(tmp_path))
    analysis.load_results.cache_clear()
    yield tmp_path
    analysis.load_results.cache_clear()


def _use(results_dir, name, rows):
    _write(results_dir / f"{name}.jsonl", rows)
    analysis.load_results.cache_clear()


def test_analysis_refuses_to_pool_configs(results_dir):
    """Runs of two configs in one results file were one group (vgg 0.9 / 0.8 and resnet 0.5 / 0.4 gave
    65.0 ± 23.8, n 4; fuzz of 2026-12-02); a seed under both configs was not even a repeat."""
    runs = [_run("a", 0, 0.9), _run("a", 1, 0.8), {**_run("a", 0, 0.5), "config": "resnet"}]
    _use(results_dir, "cfg", runs)
    with pytest.raises(ValueError, match=r"pool runs of the configs \['c', 'resnet'\]"):
        analysis.group("cfg:a")
    _use(results_dir, "one", runs[:2])
    assert analysis.group("one:a") == analysis.Group(85.0, pytest.approx(7.0710678), 2)


def test_equal_values_have_no_spread_whatever_their_rounding(results_dir):
    """np.std of three 90.1s is 1.4e-14, not 0: Welch's test then gave p < 0.001 for constant 90.1 vs
    constant 80.0 where constant 90.0 vs 80.0 gave 'p n/a' (no test possible)."""
    for value in (90.0, 90.1, 0.7 * 100, 1 / 3):
        g = analysis.from_values([value] * 3)
        assert g.std == 0.0 and g.mean == value
        assert np.isnan(analysis.welch(g, analysis.from_values([80.0] * 3))[1])
    with pytest.raises(ValueError, match="list of numbers"):
        analysis.from_values(["80", "81"])
    with pytest.raises(ValueError, match="list of numbers"):
        analysis.from_values([True, 0.9])


def test_p_values_never_print_on_the_wrong_side_of_0_05():
    """0.0496 printed as 'p = 0.05' (read as not significant), 0.0485 too: the write-up said p = 0.05
    for two differences with p < 0.05."""
    assert analysis.fmt_p(0.0485) == "p = 0.048" or analysis.fmt_p(0.0485) == "p = 0.049"
    assert analysis.fmt_p(0.0528) == "p = 0.053"
    assert analysis.fmt_p(0.04996) == "p < 0.05"
    assert analysis.fmt_p(0.0312) == "p = 0.03" and analysis.fmt_p(0.2) == "p = 0.20"
    for p in np.linspace(0.001, 0.2, 4001):
        text = analysis.fmt_p(float(p)).split()[-1]
        assert (p < 0.05) == (float(text) < 0.05 or analysis.fmt_p(float(p)) == "p < 0.05"), p


def test_sweep_table_keeps_int_and_float_points_apart_and_finds_nan_points(results_dir):
    """lr 1 and 1.0 were one row showing two of three runs (80.00 ± 14.14, n 2; oracle 3 runs over two
    recorded points); a NaN grid value showed 'pending (n 0)' although its runs exist."""
    _use(results_dir, "lr", [_run("a", 0, 0.9, {"lr": 1}), _run("a", 1, 0.7, {"lr": 1}),
                             _run("a", 0, 0.8, {"lr": 1.0}), _run("a", 0, 0.6, {"lr": float("nan")})])
    table = analysis.sweep_table("lr", "lr")
    rows = table.splitlines()[2:]
    assert len(rows) == 3
    assert "80.00 ± 14.14 (n 2)" in rows[0] and "80.00 (n 1)" in rows[1] and "60.00 (n 1)" in rows[2]
    assert "pending" not in table


def test_records_the_analysis_cannot_read_are_named(results_dir):
    """An accuracy in % (90.0: a mean of 4540), a preempted run, a half-written line of a running sweep
    (a JSONDecodeError without the file) and a summary group without its std were averaged or raised
    raw errors."""
    _use(results_dir, "pct", [_run("a", 0, 90.0)])
    with pytest.raises(ValueError, match=r"eval_accuracy must be a fraction in \[0, 1\], got 90.0"):
        analysis.group("pct:a")
    _use(results_dir, "pre", [{**_run("a", 0, 0.9), "preempted": True}])
    with pytest.raises(ValueError, match="preempted"):
        analysis.group("pre:a")
    (results_dir / "cut.jsonl").write_text(json.dumps(_run("a", 0, 0.9)) + "\n" + '{"variant": "a", "se')
    analysis.load_results.cache_clear()
    with pytest.raises(ValueError, match=r"cut.jsonl line 2 is no JSON record"):
        analysis.group("cut:a")
    (results_dir / "summary.json").write_text(json.dumps({"groups": {"g": {"mean": 80.0, "n": 3}}}))
    with pytest.raises(ValueError, match=r"no \['std_ddof0'\]"):
        analysis.group("summary:g")
    with pytest.raises(ValueError, match="batch size"):
        analysis.render("{linf:0}")


def test_mean_curves_need_the_same_evaluation_steps(results_dir):
    """Seeds evaluated at steps [10, 20] and [15, 30] were averaged position by position and labelled
    with the first seed's steps."""
    runs = {"a": [{"eval_accuracy": 0.5, "curve": [[10, 0.2], [20, 0.8]]},
                  {"eval_accuracy": 0.5, "curve": [[15, 0.4], [30, 0.9]]}]}
    (results_dir / "curves.json").write_text(json.dumps(runs))
    with pytest.raises(ValueError, match="different steps"):
        analysis.curve("curves:a")


def test_a_group_point_with_a_tuple_value():
    assert analysis.parse_point("w=(8, 16),lr=0.1") == {"w": (8, 16), "lr": 0.1}


def test_grid_values_split_at_top_level_commas_and_long_keys_fit_a_directory_name():
    (key, values), = resume_grid.parse_grid(["model.kwargs={'width': 8, 'stem': 'cifar'},{'width': 16}"])
    assert key == "model.kwargs" and values == [{"width": 8, "stem": "cifar"}, {"width": 16}]
    assert records.split_values("(0.5,0.75),(0.3,0.6),'a,b'") == ["(0.5,0.75)", "(0.3,0.6)", "'a,b'"]
    long = "cifar10__" + "__".join(f"optimizer.key{i}=0.001" for i in range(20))
    names = {resume_grid.workdir_name(long + s) for s in ("a", "b")}
    assert len(names) == 2 and all(len(n.encode()) <= 240 for n in names)
    short = "cifar10_wrs__sgdm+wd__seed=0"
    assert resume_grid.workdir_name(short) == short  # the keys of the committed sweeps keep their names


def test_a_nested_override_of_the_swept_key_is_refused(capsys):
    """cifar10_wrs sweeps config.optimizer: its grid replaced the whole optimizer in every run, and an
    override of optimizer.learning_rate was shown by `show` but trained with 0.1."""
    assert cli.main(["experiments", "cifar10_wrs", "--config.optimizer.learning_rate=0.05"]) == 2
    assert "config.optimizer is set by the sweep" in capsys.readouterr().err


def test_a_tuple_grid_value_is_the_same_run_as_its_recorded_list(tmp_path):
    """JSON records a tuple as a list: repr('()') never equalled repr('[]'), so a run of
    --grid optimizer.wrappers=('wrs',),() was never done and trained again on every invocation."""
    record = {"config": "c", "variant": "a", "grid": {"optimizer.wrappers": ("wrs",)}, "sets": [], "seed": 0}
    assert records.run_identity(record) == records.run_identity(json.loads(json.dumps(record)))
    path = tmp_path / "select.jsonl"
    wrs = [_run("a", 0, 0.5, {"lr": 0.1, "w": ("wrs",)}), _run("a", 0, 0.4, {"lr": 0.3, "w": ["wrs"]})]
    _write(path, wrs)
    assert resume_grid.select(str(path), "lr", "a", {"w": ("wrs",)}) == 0.1


def test_a_set_dict_merges_with_a_variants_key_it_does_not_give():
    """--set model.kwargs={'depth': 2, 'width': 100} with a variant's model.kwargs.num_groups merges (the
    runner refused it, and its advice, --grid model.kwargs=..., would have dropped num_groups); a dict
    that gives the variant's key too is refused, pointing to the variant's own key."""
    variants = {"gn-10": {"model.norm": "gn", "model.kwargs.num_groups": 10}}
    common.check_set_conflicts(["model.kwargs={'depth': 2, 'width': 100}"], variants)
    with pytest.raises(ValueError, match=r"--grid model.kwargs.num_groups=\.\.\."):
        common.check_set_conflicts(["model.kwargs={'depth': 2, 'num_groups': 4}"], variants)
    with pytest.raises(ValueError, match=r"--grid model.kwargs.width=\.\.\."):
        common.check_set_conflicts(["model.kwargs.width=8"], {"v": {"model.kwargs": {"stem": "cifar"}}})


def test_a_wrapper_argument_the_config_does_not_list_yet_is_a_valid_key():
    module = common.load_module("fmnist_enorm_c_depth")
    overrides = module.VARIANTS["enorm-1.2, every junction"]
    grid_point = {"optimizer.wrapper_kwargs.enorm.cycles": 2}
    config = common.run_config(module.get_config(), overrides, 0, grid_point)
    assert config.optimizer.wrapper_kwargs.enorm.cycles == 2


def test_select_counts_the_values_run_at_its_own_point(tmp_path):
    """Depth 2 ran lr {0.1, 0.01}, depth 8 lr {0.1, 0.05}: selecting at depth 2 is complete."""
    path = tmp_path / "select.jsonl"
    _write(path, [_run("a", 0, 0.5, {"depth": 2, "lr": 0.1}), _run("a", 0, 0.4, {"depth": 2, "lr": 0.01}),
                  _run("a", 0, 0.5, {"depth": 8, "lr": 0.1}), _run("a", 0, 0.6, {"depth": 8, "lr": 0.05})])
    assert resume_grid.select(str(path), "lr", "a", {"depth": 2}) == 0.1
    assert resume_grid.select(str(path), "lr", "a", {"depth": 8}) == 0.05


@pytest.mark.parametrize(("items", "match"), [
    (["seed=0,1,2"], "seed is not a setting of a grid run; give seeds with --seeds"),
    (["quick=True,False"], "quick is not a setting of a grid run"),
    (["sweep.key=norm"], "sweep.key is not a setting"),
    (["optimizer.learning_rate=1,1.0"], "a value is repeated"),
    (["optimizer.learning_rate=0.1,"], "an empty value"),
])
def test_grid_keys_and_values_that_would_record_one_thing_and_train_another(items, match):
    """``--grid seed=0,1,2`` recorded seeds 1 and 2 and trained every run with the ``--seeds`` seed: a
    '3-seed' mean of one seed; 1 and 1.0 planned the same run twice (CLI fuzz of 2026-12-02)."""
    with pytest.raises(ValueError, match=match):
        resume_grid.parse_grid(items)


def test_set_quick_and_an_empty_seed_or_variant_list_are_refused():
    config = common.experiment.experiment_defaults()
    with pytest.raises(ValueError, match="quick is not a setting of a grid run"):
        common.apply_sets(config, ["quick=True"])
    with pytest.raises(ValueError, match="--seeds is given without seeds"):
        common.select_seeds(None, [])
    with pytest.raises(ValueError, match="--only is given without variants"):
        common.select_variants({"a": {}}, [])


def test_a_key_given_by_grid_and_set_or_select_is_refused():
    grid = resume_grid.parse_grid(["optimizer.learning_rate=0.1,0.01"])
    with pytest.raises(ValueError, match=r"--grid optimizer\.learning_rate and --set optimizer\.learning_r"):
        resume_grid.check_grid_conflicts(["optimizer.learning_rate=0.5"], grid, None)
    with pytest.raises(ValueError, match="and --set optimizer"):
        resume_grid.check_grid_conflicts(["optimizer={'learning_rate': 0.5}"], grid, None)
    with pytest.raises(ValueError, match=r"and --select optimizer\.learning_rate"):
        resume_grid.check_grid_conflicts([], grid, "sel.jsonl:optimizer.learning_rate")
    resume_grid.check_grid_conflicts(["num_epochs=2"], grid, "sel.jsonl:optimizer.momentum")


def test_a_dict_from_set_or_grid_merges_into_the_config_and_the_variant():
    """``--grid model.kwargs={'depth': 4}`` on a variant that sets ``num_groups=16`` trained with the
    config's width dropped and 32 groups; ``--set optimizer={'learning_rate': 0.02}`` reset the optimizer
    to the loop's defaults (CLI fuzz of 2026-12-02). A variant's own dict still replaces."""
    base = common.experiment.experiment_defaults()
    base.model.kwargs = {"width": 256, "depth": 2}
    base.optimizer.name = "sgd"
    common.apply_sets(base, ["optimizer={'learning_rate': 0.02}"])
    assert base.optimizer.name == "sgd" and base.optimizer.learning_rate == 0.02
    config = common.run_config(base, {"model.kwargs.num_groups": 16}, 0, {"model.kwargs": {"depth": 4}})
    assert config.model.kwargs.to_dict() == {"width": 256, "depth": 4, "num_groups": 16}
    replaced = common.run_config(base, {"model.kwargs": {"depth": 4}}, 0)
    assert replaced.model.kwargs.to_dict() == {"depth": 4}
    with pytest.raises(ValueError, match=r"config.num_steps=1.5"):
        common.apply_sets(base, ["num_steps=1.5"])


def test_select_refuses_runs_evaluated_on_a_test_split(tmp_path):
    """A selection file whose runs were evaluated on ``test[:256]`` chose the learning rate the test
    sweep then reported: a choice made on the test set."""
    path = tmp_path / "sel.jsonl"
    on_test = {"run_config": {"dataset": {"eval_split": "test[:256]"}}}
    _write(path, [{**_run("a", 0, 0.5, {"lr": 0.1}), **on_test},
                  {**_run("a", 0, 0.6, {"lr": 0.01}), **on_test}])
    with pytest.raises(ValueError, match=r"evaluated on 'test\[:256\]': a selection must be made on"):
        resume_grid.select(str(path), "lr", "a", {})
    on_validation = {"run_config": {"dataset": {"eval_split": "validation"}}}
    _write(path, [{**_run("a", 0, 0.5, {"lr": 0.1}), **on_validation},
                  {**_run("a", 0, 0.6, {"lr": 0.01}), **on_validation}])
    assert resume_grid.select(str(path), "lr", "a", {}) == 0.01
    trained_on_it = {"run_config": {"dataset": {"name": "fashion_mnist", "train_split": "train",
                                                "eval_split": "validation"}}}
    _write(path, [{**_run("a", 0, 0.5, {"lr": 0.1}), **trained_on_it},
                  {**_run("a", 0, 0.6, {"lr": 0.01}), **trained_on_it}])
    with pytest.raises(ValueError, match=r"evaluated on 'validation', part of its train split 'train'"):
        resume_grid.select(str(path), "lr", "a", {})


def test_a_cut_jsonl_line_is_named_with_its_file(tmp_path):
    path = tmp_path / "runs.jsonl"
    path.write_text(json.dumps(_run("a", 0, 0.5)) + "\n" + '{"variant": "a", "se')
    with pytest.raises(ValueError, match=r"runs.jsonl line 2 is no JSON record"):
        resume_grid.read_runs(str(path))


@needs_fmnist
def test_grid_py_json_records_say_which_run_they_are(tiny, tmp_path):
    """grid.py's JSON records held no seed or config: only their position in the list implied the seed."""
    out = tmp_path / "grid.json"
    grid.main([str(tiny), "--only", "bn", "--seeds", "1", "--set", "num_steps=2",
               "--out", str(tmp_path / "figures"), "--json", str(out)])
    (record,) = json.loads(out.read_text())["bn"]
    assert (record["seed"], record["config"], record["sets"]) == (1, "tiny_config", ["num_steps=2"])


def test_the_grid_scripts_report_a_bad_argument_in_one_line(tiny, tmp_path):
    """A refused argument was a traceback; it is one ``error:`` line and exit status 2, as in
    ``python -m experiments``."""
    import subprocess
    import sys

    script = str(Path(resume_grid.__file__))
    done = subprocess.run([sys.executable, script, str(tiny), "--jsonl", str(tmp_path / "x.jsonl"),
                           "--workdir", str(tmp_path / "runs"), "--grid", "seed=0,1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: --grid seed=0,1: seed is not a setting of a grid run; give seeds with --seeds, which sets "
        "each run's seed"
    ]


def test_a_diverged_run_is_no_seed_of_its_group_whatever_accuracy_it_recorded(results_dir, tmp_path):
    """Runs recorded before the loop scored a NaN model as NaN hold the share of class 0 (``argmax`` of
    NaN logits) as eval_accuracy: 0.1016 in cifar10_enorm_fc_select, 0.10 in fmnist_beyond, where a
    group of seeds 0.87 / 0.88 / diverged printed 61.70 ± 44.78. The losses mark them diverged."""
    nan_run = {**_run("a", 2, 0.1), "train_loss": float("nan"), "eval_loss": "nan"}
    _use(results_dir, "div", [_run("a", 0, 0.87), _run("a", 1, 0.88), nan_run])
    g = analysis.group("div:a")
    assert (g.mean, g.n, g.diverged) == (pytest.approx(87.5), 2, 1)
    assert analysis.fmt_group(g) == "87.50 ± 0.71 (1 of 3 diverged)"
    assert analysis.fmt_group(analysis.from_values([float("nan")])) == "diverged"
    with pytest.raises(ValueError, match="diverged seeds"):
        analysis.welch(g, analysis.from_values([80.0, 81.0]))
    # the write-up names the divergence instead of a difference (an all-diverged group was "pending")
    _use(results_dir, "all", [{**nan_run, "seed": s} for s in range(3)])
    assert analysis.fmt_difference("all:a", "div:a") == "n/a (diverged: 3 of 3 / 1 of 3)"
    # an epoch's accuracy is that of a diverged model where the loss up to it is not finite
    curve_run = {**_run("b", 0, 0.1), "curve": [[10, 0.1]], "train_curve": [[10, float("nan")]]}
    assert np.isnan(analysis.run_field(curve_run, "acc@1", "x"))
    # --select: a diverged run counts 0 (its 0.1016 beat a rate whose runs reached 0.1010)
    path = tmp_path / "select.jsonl"
    _write(path, [{**nan_run, "grid": {"lr": 0.1}}, _run("a", 2, 0.101, {"lr": 0.01})])
    assert resume_grid.select(str(path), "lr", "a", {}) == 0.01
