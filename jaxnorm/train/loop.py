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
``progress``, ``tensorboard``, ``plots``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import jax
import ml_collections
import numpy as np

from jaxnorm.train import plots
from jaxnorm.train.checkpoint import Checkpointer, StopSignal
from jaxnorm.train.data import BatchSource
from jaxnorm.train.metrics import MetricsWriter, progress_bar, weight_norm_metrics
from jaxnorm.train.norm_records import (
    load_recorded_norms,
    recorded_norms,
    resolve_reference,
    save_recorded_norms,
)
from jaxnorm.train.optimizers import make_optimizer, needs_scale_invariant_mask
from jaxnorm.train.precision import initial_loss_scale
from jaxnorm.train.sharding import DataParallel
from jaxnorm.train.state import TrainState, create_train_state
from jaxnorm.train.step import make_eval_step, make_train_step

PyTree = Any


class RunResult(NamedTuple):
    """What :func:`train` returns.

    Attributes:
      state: the final state, one host (NumPy) copy.
      history: every metrics record of the run (train records per step, eval records).
      summary: final numbers: ``train_loss``, ``train_accuracy`` (mean over the last epoch or last
        ``log_every`` steps), ``eval_loss``, ``eval_accuracy``, ``best_eval_accuracy``, ``steps``,
        ``seconds`` (wall time of the step loop, this session), ``images_per_second`` (training
        throughput after the first, compiling step; evaluation and checkpoint writing excluded).
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
            "progress": True,
            "tensorboard": False,
            "plots": True,
            "optimizer": {
                "name": "momentum",
                "learning_rate": 0.1,
                "momentum": 0.9,
                "schedule": "constant",
                "weight_decay": 0.0,
                "weight_decay_mask": "kernels",
                "accumulate_steps": 1,
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


def with_enorm_spec(optimizer: Mapping[str, Any], model: Any, sample: jax.Array) -> Mapping[str, Any]:
    """``optimizer`` with the ``enorm`` wrapper's spec discovered from ``model`` where it needs one.

    Without a spec, :func:`jaxnorm.optim.enorm` reads the params as a plain Dense / Conv chain
    (:func:`jaxnorm.enorm.chain`); networks that are not one (a BatchNorm after the classifier,
    residual blocks) get their junctions from :func:`jaxnorm.enorm.discover`, traced in inference
    mode on ``sample``. Chains and explicit specs are left as they are.
    """
    wrapper_kwargs = dict(optimizer.get("wrapper_kwargs", {}) or {})
    enorm_kwargs = dict(wrapper_kwargs.get("enorm", {}) or {})
    if "enorm" not in tuple(optimizer.get("wrappers", ()) or ()) or enorm_kwargs.get("spec") is not None:
        return optimizer
    from jaxnorm.enorm import chain, discover

    variables = model.init(jax.random.PRNGKey(0), sample, train=False)
    try:
        chain(variables["params"])
        return optimizer
    except ValueError:
        pass
    enorm_kwargs["spec"] = discover(
        lambda params, x: model.apply({**variables, "params": params}, x, train=False),
        variables["params"],
        sample,
    )
    return {**dict(optimizer), "wrapper_kwargs": {**wrapper_kwargs, "enorm": enorm_kwargs}}


def _scale_invariant_mask(
    model: Any, images: jax.Array, axis_name: str | None, invariance_model: Any = None
) -> PyTree:
    """The model's scale-invariant kernels (their units feed a BatchNorm), traced in training mode
    on a batch of ``images`` (only the shapes are used: a full batch satisfies the statistics'
    size checks, e.g. top-k's k). Under pmap (``axis_name`` set) the trace runs on
    ``invariance_model``, the same network with per-device statistics."""
    from jaxnorm.optim import scale_invariant_mask

    if axis_name is not None:
        if invariance_model is None:
            raise ValueError(
                "optimizer wrappers with mask 'scale_invariant' under parallel='pmap' need "
                "train(..., invariance_model=...), the same network without the BN axis_name: the BN "
                "layers merge their moments across devices in one stacked collective, which the tracer "
                "of jaxnorm.optim.scale_invariant_mask cannot follow (the experiment runner "
                "passes it); or use parallel='jit' (sharded, the main path) or mask 'kernels'"
            )
        model = invariance_model
    variables = model.init(jax.random.PRNGKey(0), images[:1], train=False)
    mask = scale_invariant_mask(
        lambda v, x: model.apply(v, x, train=True, mutable=["batch_stats"])[0], variables, images
    )
    if not any(jax.tree.leaves(mask)):
        raise ValueError(
            "optimizer wrappers with mask 'scale_invariant': no kernel of this model is scale invariant "
            "(none feeds a BatchNorm, or jaxnorm.optim.scale_invariant_mask cannot follow the model); "
            "use mask 'kernels'"
        )
    return mask


def _reference_norms(optimizer: Mapping[str, Any], workdir: str | None) -> PyTree | None:
    """The recorded norms the ``wd_mimicry`` wrapper names, loaded; ``None`` without that wrapper."""
    if "wd_mimicry" not in tuple(optimizer.get("wrappers", ()) or ()):
        return None
    kwargs = dict((dict(optimizer.get("wrapper_kwargs", {}) or {})).get("wd_mimicry", {}) or {})
    if "reference" not in kwargs:
        raise ValueError("optimizer.wrapper_kwargs.wd_mimicry.reference: name the reference run or file")
    return load_recorded_norms(resolve_reference(kwargs["reference"], workdir))


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
      workdir: where ``metrics.jsonl``, ``checkpoints/`` and the plots go; ``None`` keeps nothing on
        disk (no checkpoints, no plots).
      parallel: a :class:`DataParallel`; default one built from ``config.parallel``.
      invariance_model: under ``parallel="pmap"`` with an optimizer wrapper masked ``"scale_invariant"``,
        ``model`` without cross-device statistics (BN ``axis_name=None``; the same parameters), on
        which the mask is traced. Unused otherwise.

    Returns:
      A :class:`RunResult`. If ``workdir`` holds checkpoints the run resumes from the newest one.
    """
    cfg = default_config()
    cfg.update(dict(config))
    parallel = parallel or DataParallel(cfg.parallel)
    parallel.check_batch_size(train_data.global_batch_size)
    if eval_data is not None:
        parallel.check_batch_size(eval_data.global_batch_size, "eval batch_size")
    primary = jax.process_index() == 0
    steps = total_steps(cfg, train_data.steps_per_epoch)
    accumulate = int(cfg.optimizer.get("accumulate_steps", 1))
    first_epoch = train_data.epoch(0)
    first_images = next(first_epoch)["image"]
    sample = first_images[:1]
    if hasattr(first_epoch, "close"):  # stop a prefetching pipeline's worker
        first_epoch.close()
    tx, schedule = make_optimizer(
        with_enorm_spec(cfg.optimizer, model, sample),
        steps,
        scale_invariant_mask=(
            _scale_invariant_mask(model, first_images, parallel.axis_name, invariance_model)
            if needs_scale_invariant_mask(cfg.optimizer)
            else None
        ),
        reference_norms=_reference_norms(cfg.optimizer, workdir),
    )
    rng = jax.random.PRNGKey(cfg.seed)
    loss_scale = initial_loss_scale(cfg.precision)
    state = parallel.init_state(
        lambda: create_train_state(model.init, tx, rng, sample, loss_scale=loss_scale)
    )
    ckpt = None
    if workdir is not None:
        ckpt = Checkpointer(
            f"{workdir}/checkpoints", every_steps=cfg.checkpoint_every, max_to_keep=cfg.max_to_keep
        )
        if ckpt.latest_step() is not None:
            state = parallel.restore_layout(ckpt.restore(parallel.unreplicate(state)))
    start = int(parallel.to_host(state.step))

    step_fn = parallel.compile_train_step(
        make_train_step(
            model.apply,
            tx,
            schedule=schedule,
            accumulate_steps=accumulate,
            precision=cfg.precision,
            axis_name=parallel.axis_name,
            grad_norm=cfg.log_grad_norm,
        )
    )
    eval_fn = parallel.compile_eval_step(
        make_eval_step(model.apply, precision=cfg.precision, axis_name=parallel.axis_name)
    )
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
            if s == pending[-1][0] and cfg.weight_norms:
                record.update(weight_norm_metrics(parallel.unreplicate(params_state.params), record["lr"]))
            writer.write(s, record)
            history.append({"step": s, "split": "train", **record})
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
                state, metrics = step_fn(state, parallel.shard_batch(next(batches)))
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
                        bar.set_postfix(loss=f"{history[-1]['loss']:.4f}")
                if eval_data is not None and (s % eval_every == 0 or s == steps):
                    if pending:
                        flush(state)
                    t_eval = time.perf_counter()
                    result = evaluate(parallel, eval_fn, state, eval_data)
                    excluded_seconds += time.perf_counter() - t_eval
                    writer.write(s, result, split="eval")
                    history.append({"step": s, "split": "eval", **result})
                if bar is not None:
                    bar.update(1)
                if ckpt is not None:
                    t_save = time.perf_counter()
                    stopping = stop.requested or ckpt.reached_preemption(s)
                    ckpt.maybe_save(s, parallel.unreplicate(state), force=stopping or s == steps)
                    excluded_seconds += time.perf_counter() - t_save
                    if stopping:
                        preempted = s < steps
                        break
                elif stop.requested:
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
    summary = _summary(history, train_data.steps_per_epoch, cfg.log_every)
    summary["seconds"] = t_end - t_start
    summary["images_per_second"] = timed_images / train_seconds if timed_images else 0.0
    host_state = parallel.to_host(state)
    if workdir is not None and primary and not preempted:
        if cfg.plots:
            plots.plot_run(history, workdir)
        norms = recorded_norms(host_state.opt_state)
        if norms is not None:
            save_recorded_norms(workdir, norms)
    return RunResult(host_state, history, summary, preempted)


def _summary(history: list[dict[str, Any]], steps_per_epoch: int, log_every: int) -> dict[str, float]:
    train = [r for r in history if r["split"] == "train"]
    evals = [r for r in history if r["split"] == "eval"]
    last = train[-max(steps_per_epoch, min(log_every, len(train))) :]
    summary = {"steps": float(train[-1]["step"]) if train else 0.0}
    if last:
        summary["train_loss"] = float(np.mean([r["loss"] for r in last]))
        summary["train_accuracy"] = float(np.mean([r["accuracy"] for r in last]))
    if evals:
        summary["eval_loss"] = evals[-1]["loss"]
        summary["eval_accuracy"] = evals[-1]["accuracy"]
        summary["best_eval_accuracy"] = max(r["accuracy"] for r in evals)
    return summary
