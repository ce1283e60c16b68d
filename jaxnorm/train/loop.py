"""The training loop: one function, :func:`train`, used by every experiment.

``train(config, model=..., train_data=..., eval_data=...)`` builds the optimizer from
``config.optimizer``, places the state for the chosen parallelism, resumes from the newest checkpoint
in ``workdir`` if there is one, then for every step: feeds the global batch, applies the step, streams
per-step metrics to ``workdir/metrics.jsonl`` (fetched from the device every ``log_every`` steps so
the host never waits on each step), evaluates with the running statistics, saves checkpoints every
``checkpoint_every`` steps and on SIGTERM, and draws the plots at the end. A run that records unit
norms (the ``record_norms`` wrapper) also leaves ``workdir/recorded_norms.npz``, the reference of a
later ``wd_mimicry`` run.

Config keys read here (defaults in :func:`default_config`): ``seed``, ``num_steps`` (or
``num_epochs``), ``optimizer``, ``precision``, ``parallel``, ``log_every``, ``eval_every`` (0: end of
each epoch), ``checkpoint_every``, ``max_to_keep``, ``weight_norms``, ``log_grad_norm``,
``log_angular_update`` (``angle/<layer>`` per step and, for SGD / momentum / AdamW with weight decay,
the rotational-equilibrium prediction ``angle_eq``), ``init_examples`` (the first training images
``model.init`` sees: a data-dependent init gets a real batch, more than one batch if asked),
``implicit_enorm`` (``weight`` > 0: train implicit ENorm's log-scales under its penalty,
:mod:`jaxnorm.train.params_hooks`), ``progress``, ``tensorboard``,
``plots``, ``on_existing`` (what to do with a workdir that holds a run: ``resume`` | ``extend`` |
``restart`` | ``error``, see :mod:`jaxnorm.train.run_record`).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import jax
import ml_collections
import numpy as np

from jaxnorm.train import plots
from jaxnorm.train.checkpoint import Checkpointer, StopSignal, process_flags, sync_processes
from jaxnorm.train.config_checks import (
    check_accumulation,
    check_init_examples,
    check_known_keys,
    check_loop_settings,
    python_scalars,
)
from jaxnorm.train.data import BatchSource
from jaxnorm.train.metrics import (
    MetricsWriter,
    equilibrium_angle,
    progress_bar,
    read_jsonl,
    weight_norm_metrics,
)
from jaxnorm.train.norm_records import recorded_norms, save_recorded_norms
from jaxnorm.train.precision import initial_loss_scale
from jaxnorm.train.run_checks import (
    agreed_by_every_process,
    check_batch_norm_axis,
    check_eval_source_complete,
    check_one_experiment,
    check_padded_training,
    check_parallel_mode,
    check_source_processes,
)
from jaxnorm.train.run_record import (
    RUN_FILE,
    SUMMARY_FILE,
    RunPlan,
    WorkdirLock,
    discard_run,
    experiment_digest,
    now,
    plan_run,
    read_json,
    run_identity,
    write_json,
)
from jaxnorm.train.setup import batch_stats_transport, build_optimizer, params_hook_for, with_enorm_spec
from jaxnorm.train.sharding import DataParallel
from jaxnorm.train.state import TrainState, create_train_state
from jaxnorm.train.step import make_eval_step, make_train_step

PyTree = Any
__all__ = ["RunResult", "default_config", "evaluate", "total_steps", "train", "with_enorm_spec"]


class RunResult(NamedTuple):
    """What :func:`train` returns.

    Attributes:
      state: the final state, one host (NumPy) copy.
      history: every metrics record of the run (train records per step, eval records).
      summary: final numbers: ``train_loss``, ``train_accuracy`` (mean over the last epoch, or over
        the second half of a run shorter than two epochs), ``eval_loss``, ``eval_accuracy``,
        ``best_eval_accuracy`` (the best finite one; NaN when none is), ``steps``, ``skipped_steps``
        (float16: the steps whose update overflowed and was skipped), ``seconds`` (wall time of the
        step loop, this session), ``images_per_second`` (training throughput after the first,
        compiling step; evaluation and checkpoint writing excluded; absent when the session timed no
        step), ``preempted``, ``resumed_from_step`` (when this session continued a run), ``recorded``
        (``True`` when the run had already finished: nothing was trained and the numbers, timings
        included, are the recorded ones).
      preempted: the run stopped early on SIGTERM / preemption (a checkpoint was saved).
    """

    state: TrainState
    history: list[dict[str, Any]]
    summary: dict[str, float]
    preempted: bool


def default_config() -> ml_collections.ConfigDict:
    """The loop's settings with their defaults (experiment configs override them)."""
    return ml_collections.ConfigDict(
        {
            "seed": 0,
            "num_steps": 0,
            "num_epochs": 1.0,
            "precision": "float32",
            "parallel": "jit",
            "log_every": 50,
            "eval_every": 0,
            "checkpoint_every": 0,
            "max_to_keep": 2,
            "weight_norms": True,
            "log_grad_norm": False,
            "log_angular_update": False,
            "progress": True,
            "tensorboard": False,
            "plots": True,
            "on_existing": "resume",
            "init_examples": 1,
            "implicit_enorm": {"weight": 0.0, "lr_factor": 1.0},
            "optimizer": {
                "name": "momentum",
                "learning_rate": 0.1,
                "momentum": 0.9,
                "schedule": "constant",
                "weight_decay": 0.0,
                "weight_decay_mask": "kernels",
                "grad_clip_norm": 0.0,
                "accumulate_steps": 1,
                "transport_batch_stats": True,
            },
        }
    )


def total_steps(config: Mapping[str, Any], steps_per_epoch: int) -> int:
    """``num_steps`` if positive, else ``round(num_epochs * steps_per_epoch)``."""
    steps = int(config.get("num_steps", 0) or 0)
    if steps <= 0:
        steps = round(float(config.get("num_epochs", 1.0)) * steps_per_epoch)
    if steps < 1:
        raise ValueError("the run has no steps: set num_steps > 0 or num_epochs > 0")
    return steps


def _batches(source: BatchSource, start_step: int) -> Iterator[Mapping[str, np.ndarray]]:
    """This process's batches from ``start_step`` on, epoch after epoch."""
    epoch, start = divmod(start_step, source.steps_per_epoch)
    while True:
        yield from source.epoch(epoch, start)
        epoch, start = epoch + 1, 0


def evaluate(parallel: DataParallel, eval_step, state: TrainState, source: BatchSource) -> dict[str, float]:
    """Loss and accuracy over one pass of ``source`` with the running statistics."""
    totals = None
    for batch in source.epoch(0):
        sums = eval_step(state, parallel.shard_batch(batch))
        totals = sums if totals is None else jax.tree.map(lambda a, b: a + b, totals, sums)
    if totals is None:
        raise ValueError("the eval source yielded no batch")
    totals = parallel.to_host(totals)
    count = float(totals["count"])
    return {"loss": float(totals["loss_sum"]) / count, "accuracy": float(totals["correct"]) / count}


def train(
    config: Mapping[str, Any],
    *,
    model: Any,
    train_data: BatchSource,
    eval_data: BatchSource | None = None,
    workdir: str | None = None,
    parallel: DataParallel | None = None,
    invariance_model: Any = None,
) -> RunResult:
    """Trains ``model`` (a flax linen module) on ``train_data`` as ``config`` says.

    Args:
      config: loop settings (see :func:`default_config`); missing keys take the defaults.
      model: a linen module called as ``model.apply(variables, x, train=bool, mutable=[...])``;
        under ``parallel="pmap"`` its BN layers must use ``axis_name="batch"``.
      train_data, eval_data: batch sources (:mod:`jaxnorm.train.data`).
      workdir: where ``run.json``, ``metrics.jsonl``, ``checkpoints/``, ``summary.json`` and the
        plots go; ``None`` keeps nothing on disk (no checkpoints, no plots).
      parallel: a :class:`DataParallel`; default one built from ``config.parallel``.
      invariance_model: under ``parallel="pmap"`` with an optimizer wrapper masked ``"scale_invariant"``,
        ``model`` without cross-device statistics (BN ``axis_name=None``; the same parameters), on
        which the mask is traced. Unused otherwise.

    Returns:
      A :class:`RunResult`. A ``workdir`` that holds the same experiment is resumed from its newest
      restorable checkpoint; one that holds another experiment is an error unless
      ``config.on_existing`` says otherwise (:mod:`jaxnorm.train.run_record`). A run that had already
      finished is not trained again: its recorded summary is returned, marked ``recorded``.
    """
    cfg = default_config()
    with agreed_by_every_process("the run's checks"):
        check_known_keys(config, cfg)
        cfg.update(python_scalars(dict(config)))
        check_loop_settings(cfg)
        if parallel is not None:
            check_parallel_mode(cfg.parallel, parallel.mode, explicit="parallel" in config)
            cfg.parallel = parallel.mode  # what run.json records
        parallel = parallel or DataParallel(cfg.parallel)
        parallel.check_batch_size(train_data.global_batch_size)
        check_source_processes(train_data, "train_data")
        if eval_data is not None:
            parallel.check_batch_size(eval_data.global_batch_size, "eval batch_size")
            check_source_processes(eval_data, "eval_data")
            check_eval_source_complete(eval_data)
    steps = total_steps(cfg, train_data.steps_per_epoch)
    check_accumulation(cfg.optimizer, steps)
    # the identity (its fingerprints read the whole data once) serves the run record and the processes'
    # agreement: a single-process run without a workdir needs neither
    multi_process = jax.process_count() > 1
    identity = run_identity(model, train_data, eval_data) if workdir is not None or multi_process else None
    if multi_process:
        with agreed_by_every_process("the experiment's agreement"):
            check_one_experiment(experiment_digest(cfg, identity, steps))
    lock = WorkdirLock(workdir if jax.process_index() == 0 else None)
    with agreed_by_every_process(f"the lock of {workdir}"):
        lock.acquire()
    try:
        return _train_session(
            cfg, model, train_data, eval_data, workdir, parallel, invariance_model, steps, identity
        )
    finally:
        lock.release()


def _train_session(
    cfg: ml_collections.ConfigDict,
    model: Any,
    train_data: BatchSource,
    eval_data: BatchSource | None,
    workdir: str | None,
    parallel: DataParallel,
    invariance_model: Any,
    steps: int,
    identity: dict[str, Any] | None,
) -> RunResult:
    """The session of :func:`train` after its checks, under the workdir's lock: plan, init, restore,
    train, write the outputs."""
    primary = jax.process_index() == 0
    report = print if primary else _silent
    plan = _open_workdir(workdir, cfg, steps, primary, identity) if workdir is not None else None
    images = _first_images(train_data)
    hook = params_hook_for(cfg, model, images)
    tx, schedule = build_optimizer(
        cfg.optimizer,
        model=model,
        images=images,
        schedule_steps=plan.schedule_steps if plan else steps,
        axis_name=parallel.axis_name,
        invariance_model=invariance_model,
        workdir=workdir,
    )
    init_images = _init_images(train_data, images, cfg.init_examples)
    state = parallel.init_state(
        lambda: create_train_state(
            model.init if hook is None else hook.wrap_init(model.init),
            tx,
            jax.random.PRNGKey(cfg.seed),
            init_images,
            loss_scale=initial_loss_scale(cfg.precision),
        )
    )
    check_padded_training(train_data, state.model_state)
    if parallel.axis_name is not None:
        check_batch_norm_axis(model, parallel.unreplicate(state).variables, images, parallel.axis_name)
    ckpt = None
    if workdir is not None:
        ckpt = Checkpointer(
            f"{workdir}/checkpoints", every_steps=cfg.checkpoint_every, max_to_keep=cfg.max_to_keep
        )
        restored = ckpt.restore_newest(parallel.checkpoint_view(state), report=report, primary=primary)
        if restored is not None:
            state = parallel.restore_layout(restored[0])
    start = int(parallel.to_host(state.step))
    if start:
        report(_resume_message(workdir, start, steps, plan))
    if start >= steps:
        ckpt.close()
        return _recorded_result(workdir, parallel.to_host(state), steps, train_data.steps_per_epoch, report)
    transport = batch_stats_transport(
        cfg.optimizer,
        model=model,
        images=images,
        opt_state=state.opt_state,
        axis_name=parallel.axis_name,
        invariance_model=invariance_model,
    )
    run_steps = _make_steps(model, tx, schedule, cfg, parallel, transport, hook)
    result = _loop(cfg, parallel, run_steps, state, train_data, eval_data, workdir, ckpt, start, steps)
    if result.summary.get("skipped_steps") and not result.preempted:
        report(_skipped_message(int(result.summary["skipped_steps"]), steps, cfg.optimizer))
    if workdir is not None and primary:
        _write_outputs(workdir, cfg, result)
    return result


def _skipped_message(skipped: int, steps: int, optimizer: ml_collections.ConfigDict) -> str:
    """The end-of-run line of a float16 run some of whose updates overflowed."""
    accumulate = int(optimizer.get("accumulate_steps", 1))
    updates = steps // accumulate
    applied = (steps - skipped) // accumulate
    return (
        f"float16: {skipped} of {steps} steps overflowed and were skipped: {applied} of {updates} "
        "updates applied, the learning-rate schedule ended at its update "
        f"{applied} (docs/training.md, 'Mixed precision')"
    )


def _silent(*args: Any, **kwargs: Any) -> None:
    """The report function of non-primary processes."""


def _open_workdir(
    workdir: str, cfg: ml_collections.ConfigDict, steps: int, primary: bool, identity: dict[str, Any]
) -> RunPlan:
    """Checks ``workdir`` against the run record (raising for another experiment: config, model or
    data), discards the old run's outputs where there is nothing to continue or on
    ``on_existing='restart'``, and writes the updated record; every process decides alike."""
    with agreed_by_every_process(f"the checks of {workdir}"):
        plan = plan_run(workdir, cfg, steps, identity)
    sync_processes("jaxnorm_run_planned")  # every process has read the old record
    if primary:
        # nothing to continue ("new": no checkpoint) or discarded: an earlier run's summary, metrics,
        # recorded norms and TensorBoard would pass for this one's (a finished run's summary.json was
        # returned as the result of another experiment run in its workdir after its checkpoints went)
        if plan.action in ("new", "restart"):
            discard_run(workdir)
        write_json(f"{workdir}/{RUN_FILE}", plan.record)
    sync_processes("jaxnorm_run_recorded")
    return plan


def _resume_message(workdir: str, start: int, steps: int, plan: RunPlan | None) -> str:
    message = f"resuming from step {start} of {steps} in {workdir}"
    if plan is not None and plan.action == "extend":
        message += (
            f" (extended from {plan.recorded_steps} steps; the learning rate holds the schedule's "
            f"value at step {plan.schedule_steps})"
        )
    return message


def _first_images(source: BatchSource) -> np.ndarray:
    """The first batch's images (the model's init and the optimizer's tracing sample)."""
    first_epoch = source.epoch(0)
    images = next(first_epoch)["image"]
    if hasattr(first_epoch, "close"):  # stop a prefetching pipeline's worker
        first_epoch.close()
    return images


def _init_images(source: BatchSource, images: np.ndarray, count: Any) -> np.ndarray:
    """The first ``count`` training images: what ``model.init`` sees (data-dependent
    initialisations such as weight norm's, Salimans & Kingma 2016 Sec. 2.2, use them); more than
    one batch holds are read from the first batches of the first epoch. More than one image needs a
    single process: each process's batches differ, and so would its initial params."""
    limit = source.steps_per_epoch * len(images)
    check_init_examples(count, limit)
    if count > 1 and jax.process_count() > 1:
        raise ValueError(
            f"config.init_examples={count} with {jax.process_count()} processes: each process would init "
            "on its own examples and the initial params would differ; use 1 (data-independent init)"
        )
    count = int(count)
    if count <= len(images):
        return images[:count]
    parts, have = [], 0
    first_epoch = source.epoch(0)
    for batch in first_epoch:
        parts.append(batch["image"])
        have += len(batch["image"])
        if have >= count:
            break
    if hasattr(first_epoch, "close"):  # stop a prefetching pipeline's worker
        first_epoch.close()
    return np.concatenate(parts)[:count]


def _recorded_result(
    workdir: str, host_state: TrainState, steps: int, steps_per_epoch: int, report
) -> RunResult:
    """The result of a run that had already finished: its records and recorded summary (with the
    timings of the session that trained it), marked ``recorded``; nothing is trained."""
    history = read_jsonl(f"{workdir}/metrics.jsonl") if os.path.exists(f"{workdir}/metrics.jsonl") else []
    summary = read_json(f"{workdir}/{SUMMARY_FILE}")
    if summary is None or summary.get("steps") != float(steps) or summary.get("preempted"):
        # no final summary (killed after the last checkpoint): the numbers, without timings
        summary = _summary(history, steps_per_epoch)
    report(f"{workdir} already finished its {steps} steps: reporting the recorded results, nothing trained")
    return RunResult(host_state, history, {**summary, "recorded": True}, False)


class _Steps(NamedTuple):
    train: Any
    eval: Any


def _make_steps(
    model,
    tx,
    schedule,
    cfg: ml_collections.ConfigDict,
    parallel: DataParallel,
    stats_transport=None,
    params_hook=None,
) -> _Steps:
    """The compiled train and eval steps."""
    train_step = make_train_step(
        model.apply,
        tx,
        schedule=schedule,
        accumulate_steps=int(cfg.optimizer.get("accumulate_steps", 1)),
        precision=cfg.precision,
        axis_name=parallel.axis_name,
        grad_norm=cfg.log_grad_norm,
        stats_transport=stats_transport,
        angular_update=cfg.log_angular_update,
        params_hook=params_hook,
    )
    eval_step = make_eval_step(
        model.apply, precision=cfg.precision, axis_name=parallel.axis_name, params_hook=params_hook
    )
    return _Steps(parallel.compile_train_step(train_step), parallel.compile_eval_step(eval_step))


def _loop(
    cfg: ml_collections.ConfigDict,
    parallel: DataParallel,
    run_steps: _Steps,
    state: TrainState,
    train_data: BatchSource,
    eval_data: BatchSource | None,
    workdir: str | None,
    ckpt: Checkpointer | None,
    start: int,
    steps: int,
) -> RunResult:
    """Steps ``start`` .. ``steps``: feed, step, log, evaluate, checkpoint, stop on SIGTERM."""
    primary = jax.process_index() == 0
    eval_every = cfg.eval_every or train_data.steps_per_epoch
    writer = MetricsWriter(
        f"{workdir}/metrics.jsonl" if workdir else "/dev/null",
        tensorboard_dir=f"{workdir}/tensorboard" if workdir and cfg.tensorboard else None,
        resume_step=start if start > 0 else None,
        enabled=primary and workdir is not None,
    )
    history: list[dict[str, Any]] = list(writer.previous)
    pending: list[tuple[int, dict[str, jax.Array]]] = []
    preempted = False

    def flush(params_state: TrainState) -> None:
        fetched = parallel.to_host([m for _, m in pending])
        for (s, _), m in zip(pending, fetched, strict=True):
            record = {k: float(v) for k, v in m.items()}
            # Weight norms at the log steps only: a flush for an evaluation, a checkpoint or a preemption
            # would add records an uninterrupted run of the same config does not have.
            if s == pending[-1][0] and cfg.weight_norms and (s % cfg.log_every == 0 or s == steps):
                record.update(weight_norm_metrics(parallel.unreplicate(params_state.params), record["lr"]))
            if cfg.log_angular_update and "lr" in record:
                predicted = equilibrium_angle(cfg.optimizer, record["lr"])
                if predicted is not None:
                    record["angle_eq"] = predicted
            history.append(writer.write(s, record))
        pending.clear()

    bar = progress_bar(total=steps, initial=start, enabled=cfg.progress and primary)
    if cfg.weight_norms:  # compile the norm summary now, not inside the timed steps
        weight_norm_metrics(parallel.unreplicate(state.params), 0.0)
    # Throughput clock: from the end of the first step (which compiles) to the end, minus
    # evaluation and checkpoint writing.
    t_start = time.perf_counter()
    timed_from, timed_images, excluded_seconds = t_start, 0, 0.0
    batches = _batches(train_data, start)
    try:
        with StopSignal() as stop:
            for step in range(start, steps):
                state, metrics = run_steps.train(state, parallel.shard_batch(next(batches)))
                if step == start:
                    jax.block_until_ready(metrics)
                    timed_from = time.perf_counter()
                else:
                    timed_images += train_data.global_batch_size
                s = step + 1
                pending.append((s, metrics))
                if s % cfg.log_every == 0 or s == steps:
                    flush(state)
                    if bar is not None:
                        # float(): a non-finite loss is recorded as its string ("nan"; metrics._jsonable)
                        bar.set_postfix(loss=f"{float(history[-1]['loss']):.4f}", refresh=False)
                if eval_data is not None and (s % eval_every == 0 or s == steps):
                    if pending:
                        flush(state)
                    t_eval = time.perf_counter()
                    result = evaluate(parallel, run_steps.eval, state, eval_data)
                    excluded_seconds += time.perf_counter() - t_eval
                    history.append(writer.write(s, result, split="eval"))
                if bar is not None:
                    bar.update(1)
                if ckpt is not None:
                    t_save = time.perf_counter()
                    stopping = _stop_agreed(stop.requested) or ckpt.reached_preemption(s)
                    if ckpt.saves_at(s, force=stopping or s == steps):
                        if pending:
                            flush(state)  # a run resumed from this checkpoint finds every record before it
                        ckpt.save(s, parallel.checkpoint_view(state))
                    excluded_seconds += time.perf_counter() - t_save
                    if stopping:
                        preempted = s < steps
                        break
                elif _stop_agreed(stop.requested):
                    preempted = s < steps
                    break
        if pending:
            flush(state)
        jax.block_until_ready(state)
        t_end = time.perf_counter()
    finally:  # also on errors: finish in-flight checkpoint writes, close files and the data
        batches.close()
        if bar is not None:
            bar.close()
        if ckpt is not None:
            ckpt.wait()
            ckpt.close()
        writer.close()
    train_seconds = t_end - timed_from - excluded_seconds
    summary: dict[str, Any] = _summary(history, train_data.steps_per_epoch)
    summary["seconds"] = t_end - t_start
    if timed_images:
        summary["images_per_second"] = timed_images / train_seconds
    if start:
        summary["resumed_from_step"] = start
    summary["preempted"] = preempted
    return RunResult(parallel.to_host(state), history, summary, preempted)


def _stop_agreed(requested: bool) -> bool:
    """Whether any process was asked to stop (SIGTERM): every process stops after the same step. A
    signal that reached one process only made it leave the loop for a checkpoint save the others never
    joined, and both waited for ever (found 2026-12-02). One small all-gather per step, with several
    processes only."""
    return bool(process_flags(requested).any())


def _write_outputs(workdir: str, cfg: ml_collections.ConfigDict, result: RunResult) -> None:
    """``summary.json`` (partial after a preemption), and for a finished run the plots and the
    recorded norms."""
    write_json(f"{workdir}/{SUMMARY_FILE}", {**result.summary, "written": now()})
    if result.preempted:
        return
    if cfg.plots:
        plots.plot_run(result.history, workdir, title=plots.settings_title(cfg))
    norms = recorded_norms(result.state.opt_state)
    if norms is not None:
        save_recorded_norms(workdir, norms)


def _summary(history: list[dict[str, Any]], steps_per_epoch: int) -> dict[str, Any]:
    """The run's final numbers. ``train_loss`` / ``train_accuracy``: the mean over the last epoch's
    steps, or over the second half of the steps when the run is shorter than two epochs (so that the
    first steps of a short run never count)."""
    train = [r for r in history if r["split"] == "train"]
    evals = [r for r in history if r["split"] == "eval"]
    summary: dict[str, Any] = {"steps": float(train[-1]["step"]) if train else 0.0}
    if train and "skipped_steps" in train[-1]:
        summary["skipped_steps"] = train[-1]["skipped_steps"]
    if train:
        last = train[-min(steps_per_epoch, max(1, len(train) // 2)) :]
        # float(): a non-finite value is recorded as its string ("nan", "inf"; metrics._jsonable)
        summary["train_loss"] = float(np.mean([float(r["loss"]) for r in last]))
        summary["train_accuracy"] = float(np.mean([float(r["accuracy"]) for r in last]))
    if evals:
        summary["eval_loss"] = float(evals[-1]["loss"])
        summary["eval_accuracy"] = float(evals[-1]["accuracy"])
        finite = [a for a in (float(r["accuracy"]) for r in evals) if math.isfinite(a)]
        summary["best_eval_accuracy"] = max(finite, default=math.nan)
    return summary
