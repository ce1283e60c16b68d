"""Experiments from configs: build the model and data by name, run a sweep, print a results table.

An experiment config is the loop's config (:func:`jaxnorm.train.loop.default_config`) plus::

    model:   name (jaxnorm.models.names()), norm (jaxnorm.models.NORMS), kwargs (model options)
    dataset: name (jaxnorm.data.names()), train_split, eval_split, batch_size, eval_batch_size,
             augment ("" = the dataset's default), data_dir ("" = $JAXNORM_DATA_DIR or TFDS's)
    sweep:   key (a dotted config key, e.g. "model.norm"), grid (its values), names (optional labels)
    workdir: where each run writes <workdir>/<run name>/ and the experiment its table and plots
    distributed: coordinator_address ("" = single process; "auto" = jax.distributed.initialize()'s
             cluster auto-detection, e.g. on TPU pods), num_processes, process_id
    quick:   a smoke-test size (``quick_steps`` steps on ``quick_examples`` examples)

:func:`run_experiment` validates every run of the sweep before training any, so a bad value fails
at once with the valid choices.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping
from typing import Any

import jax
import ml_collections

from jaxnorm.train import config_checks, plots
from jaxnorm.train.loop import RunResult, default_config, train
from jaxnorm.train.optimizers import make_optimizer
from jaxnorm.train.precision import compute_dtype
from jaxnorm.train.run_record import check_workdir
from jaxnorm.train.sharding import DataParallel, initialize_distributed

TABLE_COLUMNS = (
    ("eval_accuracy", "eval acc", "{:.4f}"),
    ("best_eval_accuracy", "best eval acc", "{:.4f}"),
    ("train_loss", "train loss", "{:.4f}"),
    ("eval_loss", "eval loss", "{:.4f}"),
    ("seconds", "time (s)", "{:.1f}"),
    ("images_per_second", "images/s", "{:.0f}"),
)


def experiment_defaults() -> ml_collections.ConfigDict:
    """Defaults of an experiment config (the loop's plus model, dataset, sweep, workdir, quick)."""
    config = default_config()
    config.update(
        {
            "description": "",
            "workdir": "runs/experiment",
            "model": {"name": "mlp", "norm": "bn", "kwargs": {}},
            "dataset": {
                "name": "fashion_mnist",
                "train_split": "train",
                "eval_split": "test",
                "batch_size": 128,
                "eval_batch_size": 1000,
                "augment": "",
                "data_dir": "",
            },
            "sweep": {"key": "", "grid": (), "names": ()},
            "distributed": {"coordinator_address": "", "num_processes": 1, "process_id": 0},
            "quick": False,
            "quick_steps": 10,
            "quick_examples": 512,
        }
    )
    return config


def _set_dotted(config: ml_collections.ConfigDict, key: str, value: Any) -> None:
    """Sets ``config.<key>`` (a dotted key) to ``value``. ``model.kwargs.<option>`` may name any
    option the model takes, listed in the config or not; another unknown key raises ``ValueError``
    naming ``config.sweep.key`` and the closest valid key."""
    *parents, leaf = key.split(".")
    if parents == ["model", "kwargs"] and leaf not in (config.model.get("kwargs", {}) or {}):
        if f"{config_checks.MODEL_KWARGS}.{leaf}" in config_checks.settable_keys(config):
            with config.unlocked():
                config.model.kwargs = {**dict(config.model.get("kwargs", {}) or {}), leaf: value}
            return
    try:
        config_checks.lookup(config, key)
    except KeyError as e:
        candidates = config_checks.settable_keys(config)
        raise ValueError(
            f"config.sweep.key={key!r}: the config has no key config.{key}"
            f"{config_checks.suggestion(key, candidates)}"
        ) from e
    node = config
    for part in parents:
        node = node[part]
    with node.unlocked():
        try:
            node[leaf] = value
        except TypeError as e:  # ml_collections: "... cannot be casted to type <class 'int'>"
            raise ValueError(f"config.sweep.grid: the value {value!r} for config.{key}: {e}") from None


def expand_sweep(config: ml_collections.ConfigDict) -> list[tuple[str, ml_collections.ConfigDict]]:
    """The runs of an experiment: ``[(name, run config)]`` (one run when there is no sweep)."""
    sweep = config.sweep
    if not sweep.key:
        return [(config.model.norm if "model" in config else "run", config)]
    values, names = tuple(sweep.grid), tuple(sweep.names or ())
    if not values:
        raise ValueError(f"config.sweep.grid is empty for sweep.key={sweep.key!r}")
    if names and len(names) != len(values):
        raise ValueError(f"config.sweep.names has {len(names)} entries for {len(values)} sweep.grid")
    runs = []
    for i, value in enumerate(values):
        run = copy.deepcopy(config)
        _set_dotted(run, sweep.key, value)
        runs.append((str(names[i]) if names else str(value), run))
    if len({n for n, _ in runs}) != len(runs):
        raise ValueError(f"config.sweep gives duplicate run names {[n for n, _ in runs]}")
    for name, _ in runs:  # each names a directory under the workdir: 'a/' would share a's, '/x' leave it
        parts = name.split("/")
        if os.path.isabs(name) or name != os.path.normpath(name) or ".." in parts or "." in parts:
            raise ValueError(
                f"config.sweep gives the run name {name!r}; a run name is a relative path inside the "
                "workdir ('sgdm' or 'c/sgdm': no leading, trailing or double '/', '.' or '..'): set "
                "config.sweep.names"
            )
        if len(name.encode()) > 255:
            raise ValueError(f"config.sweep gives a run name of {len(name.encode())} bytes (at most 255): "
                             "set config.sweep.names")
    return runs


def apply_quick(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The smoke-test version of ``config``: few steps on a slice of the data, no progress bar."""
    config = copy.deepcopy(config)
    n = int(config.quick_examples)
    for key in ("train_split", "eval_split"):
        split = str(config.dataset[key])
        if "[" in split or "+" in split:  # TFDS takes one slice per split: 'train[:64][:512]' is no split
            raise ValueError(
                f"config.quick=True takes the first {n} examples of each split, and config.dataset.{key}="
                f"{split!r} is already a slice; give the unsliced split, or a short run with num_steps"
            )
    with config.unlocked():
        config.num_steps = int(config.quick_steps)
        config.log_every = max(1, config.num_steps // 2)
        config.eval_every = 0
        config.progress = False
        config.dataset.train_split = f"{config.dataset.train_split}[:{n}]"
        config.dataset.eval_split = f"{config.dataset.eval_split}[:{n}]"
        config.dataset.batch_size = min(config.dataset.batch_size, n // 2)
        config.dataset.eval_batch_size = min(config.dataset.eval_batch_size, n // 2)
        warmup = int(config.optimizer.get("warmup_steps", 0))
        config.optimizer.warmup_steps = min(warmup, config.num_steps // 2)
    return config


def build_model(
    config: Mapping[str, Any], num_classes: int, parallel: DataParallel, *, cross_device: bool = True
):
    """``jaxnorm.models.create`` from ``config.model`` (``axis_name`` added under pmap, unless
    ``cross_device`` is False: the same network with per-device statistics)."""
    from jaxnorm import models

    kwargs = dict(config.model.get("kwargs", {}) or {})
    if parallel.axis_name is not None and cross_device:
        kwargs["axis_name"] = parallel.axis_name
    try:
        return models.create(config.model.name, num_classes=num_classes, norm=config.model.norm, **kwargs)
    except (ValueError, TypeError) as e:
        raise ValueError(f"config.model: {e}") from e


def build_data(config: Mapping[str, Any]):
    """``(train, eval)`` datasets from ``config.dataset`` via ``jaxnorm.data.load``."""
    from jaxnorm import data

    ds = config.dataset
    common = {"seed": int(config.seed), "data_dir": ds.data_dir or None}
    try:
        train_data = data.load(
            ds.name,
            ds.train_split,
            batch_size=int(ds.batch_size),
            train=True,
            augment=ds.augment or None,
            **common,
        )
        eval_data = data.load(
            ds.name,
            ds.eval_split,
            batch_size=int(ds.eval_batch_size),
            train=False,
            drop_remainder=False,
            augment=ds.augment or None,
            **common,
        )
    except ValueError as e:
        raise ValueError(f"config.dataset: {e}") from e
    return train_data, eval_data


def validate(config: ml_collections.ConfigDict) -> None:
    """Checks everything about a run config that needs no data, with one-line messages naming the
    key: precision, parallelism, dataset name, augmentation and availability, model name and options,
    batch sizes against the device and process counts, run length against ``warmup_steps``, the
    loop's hooks (``init_examples``, ``implicit_enorm``, the ``enorm`` wrapper's ``c``), the optimizer,
    and that the eval split holds no training example (:func:`jaxnorm.data.splits_overlap`). The
    experiment runner calls it for every run of a sweep before any of them trains (whether the dataset
    is prepared: :func:`jaxnorm.data.check_prepared`, which the command line runs first)."""
    from jaxnorm import data

    compute_dtype(config.precision)
    parallel = DataParallel(config.parallel)
    ds = config.dataset
    if ds.name not in data.names():
        raise ValueError(
            f"config.dataset.name must be one of {list(data.names())}, got {ds.name!r}"
            + config_checks.suggestion_for_choice(ds.name, data.names(), "dataset.name")
        )
    try:
        data.resolve_augment(ds.name, ds.augment or None)
    except ValueError as e:
        raise ValueError(f"config.dataset.augment: {e}") from e
    if data.splits_overlap(ds.name, ds.train_split, ds.eval_split):
        raise ValueError(
            f"config.dataset.eval_split={ds.eval_split!r} shares examples with config.dataset.train_split="
            f"{ds.train_split!r} (validation is the end of train): its accuracy would be measured on "
            "training examples; train on 'train_minus_validation' to evaluate on 'validation', or "
            "evaluate on 'test'"
        )
    config_checks.check_known_keys(config, default_config())
    config_checks.check_loop_settings(config)
    config_checks.check_model_options(config)
    config_checks.check_batch_sizes(config, parallel.num_devices, jax.process_count())
    steps = config_checks.check_run_length(config)
    config_checks.check_hooks(config)
    build_model(config, data.info(ds.name).num_classes, parallel)
    make_optimizer(config.optimizer, steps or 10**9, checking=True)  # 10**9: length known once read


def run(
    config: ml_collections.ConfigDict, workdir: str | None, *, datasets: tuple[Any, Any] | None = None
) -> RunResult:
    """One run of ``config`` (a run config, no sweep) in ``workdir``. ``datasets``: ``(train, eval)``
    sources to train and evaluate on instead of reading ``config.dataset`` (``benchmarks/configs.py``
    feeds in-memory arrays of the dataset's shape); ``config.dataset.name`` still sets the class count."""
    from jaxnorm import data

    parallel = DataParallel(config.parallel)
    train_data, eval_data = build_data(config) if datasets is None else datasets
    num_classes = data.info(config.dataset.name).num_classes
    model = build_model(config, num_classes, parallel)
    invariance_model = None
    if parallel.axis_name is not None:  # the scale-invariance tracer cannot follow cross-device BN
        invariance_model = build_model(config, num_classes, parallel, cross_device=False)
    return train(
        config,
        model=model,
        train_data=train_data,
        eval_data=eval_data,
        workdir=workdir,
        parallel=parallel,
        invariance_model=invariance_model,
    )


def results_table(results: Mapping[str, Mapping[str, Any]]) -> str:
    """A Markdown table: one row per run, the summary columns of :data:`TABLE_COLUMNS`. A run that
    had already finished (nothing trained; its recorded numbers) is marked ``(recorded)``, a run
    stopped by preemption ``(partial)``."""
    header = ["run", *(label for _, label, _ in TABLE_COLUMNS)]
    rows = [header, ["---"] * len(header)]
    for name, summary in results.items():
        mark = " (recorded)" if summary.get("recorded") else " (partial)" if summary.get("preempted") else ""
        cells = [name + mark]
        for key, _, fmt in TABLE_COLUMNS:
            # float(): a non-finite number is recorded as its string ("nan"; metrics._jsonable)
            cells.append(fmt.format(float(summary[key])) if key in summary else "-")
        rows.append(cells)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return "\n".join(
        "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows
    )


def _maybe_initialize_distributed(config: Mapping[str, Any]) -> None:
    address = config.get("coordinator_address", "")
    if not address or jax.distributed.is_initialized():
        return
    if address == "auto":
        jax.distributed.initialize()
    else:
        initialize_distributed(address, int(config.num_processes), int(config.process_id))


PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL: stopped early, run the same command again to resume


class Preempted(SystemExit):
    """Raised by :func:`run_experiment` after a run stopped on SIGTERM / preemption, once the partial
    results are written: the command exits with :data:`PREEMPTED_EXIT_CODE`, so a scheduler can tell
    a preempted job from a finished one. ``results`` holds the partial ``{run name: summary}``."""

    def __init__(self, results: dict[str, dict[str, Any]]):
        super().__init__(PREEMPTED_EXIT_CODE)
        self.results = results


def run_experiment(config: ml_collections.ConfigDict, *, print_fn=print) -> dict[str, dict[str, Any]]:
    """Runs every run of ``config``'s sweep; writes ``results.json``, ``results.md`` and the
    overlaid plots into ``config.workdir``; prints and returns ``{run name: summary}``.

    A quick run (``config.quick``) goes to ``<workdir>_quick``, so that a smoke test never leaves a
    checkpoint that the real run would meet. If a run is preempted, the results so far are written
    (marked ``preempted``) and :class:`Preempted` is raised."""
    base = experiment_defaults()
    base.update(config)
    _maybe_initialize_distributed(base.distributed)
    workdir = base.workdir
    if base.quick:
        base = apply_quick(base)
        workdir = workdir.rstrip("/") + "_quick"
    runs = expand_sweep(base)
    for name, run_config in runs:
        try:
            validate(run_config)
            check_workdir(os.path.join(workdir, name), run_config)
        except ValueError as e:
            raise ValueError(f"run {name!r}: {e}") from e
    results, histories = {}, {}
    preempted = False
    for name, run_config in runs:
        print_fn(f"== {name}")
        result = run(run_config, os.path.join(workdir, name))
        results[name] = result.summary
        histories[name] = result.history
        if result.preempted:
            print_fn(f"stopped at step {int(result.state.step)}; run the same command to resume")
            preempted = True
            break
    table = results_table(results)
    if jax.process_index() == 0:
        os.makedirs(workdir, exist_ok=True)
        with open(os.path.join(workdir, "results.json"), "w") as f:
            json.dump(results, f, indent=2)
        with open(os.path.join(workdir, "results.md"), "w") as f:
            f.write(table + "\n")
        title = plots.settings_title(base, varied=base.sweep.key)
        paths = plots.plot_runs(histories, workdir, title=title)
        print_fn(table)
        print_fn("plots: " + ", ".join(paths))
    if preempted:
        raise Preempted(results)
    return results
