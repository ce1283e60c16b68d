"""Checks of what ``train`` is handed besides its config: the data sources, the parallelism and the
model, each against the others. Every one of these combinations used to train without a word and give
other numbers than the same run on one device (found by the distributed-training fuzz of 2026-12-02)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from jaxnorm.train.checkpoint import process_flags, process_values

PyTree = Any


@contextlib.contextmanager
def agreed_by_every_process(what: str) -> Iterator[None]:
    """Runs the checks of the block on every process, and every process raises when one of them fails.

    A check that fails on one process only (its data source built as another process's share) used
    to raise there while the others went on to their first collective and waited for ever. The
    processes now exchange one flag after the block (an all-gather; nothing with one process): a
    failing process raises its own error, the others a ``ValueError`` naming it.
    """
    failure: Exception | None = None
    try:
        yield
    except Exception as error:  # every process must reach the exchange, whatever failed
        failure = error
    failed = process_flags(failure is not None)
    if failure is None and failed.any():
        raise ValueError(
            f"{what} failed on process(es) {np.flatnonzero(failed).tolist()} (see the error there); "
            f"process {jax.process_index()} stops too"
        )
    if failure is not None:
        raise failure


def check_one_experiment(digest: str) -> None:
    """``ValueError`` on every process when the processes of a run were started with different
    experiments (their :func:`~jaxnorm.train.run_record.experiment_digest`: the config's keys that
    change what is computed, the model, the data): each would train its own copy of the state,
    identical by construction only if the commands are, and ``run.json`` would record process 0's
    alone. Every process must call it (one all-gather); the loop does with more than one process."""
    # 16-bit pieces in int32: an all-gather without x64 holds no 64-bit integer
    pieces = np.asarray([int(digest[i : i + 4], 16) for i in range(0, len(digest), 4)], np.int32)
    digests = [tuple(row) for row in process_values(pieces).tolist()]
    if len(set(digests)) > 1:
        groups: dict[tuple, list[int]] = {}
        for index, value in enumerate(digests):
            groups.setdefault(value, []).append(index)
        raise ValueError(
            f"the processes {' / '.join(map(str, groups.values()))} were started with different "
            "experiments (config, model or data); start every process with the same command (only "
            "distributed.process_id may differ)"
        )


def check_source_processes(source: Any, what: str) -> None:
    """``ValueError`` naming ``what`` when a source says which share of each global batch it delivers
    (``process_index`` / ``process_count``, as :class:`jaxnorm.data.ArraySource`) and that is not this
    process's share: two processes with ``process_index=0`` both feed the first half of every batch,
    and the second half is never seen."""
    index, count = getattr(source, "process_index", None), getattr(source, "process_count", None)
    if index is None or count is None:
        return
    if (index, count) != (jax.process_index(), jax.process_count()):
        raise ValueError(
            f"{what} delivers the share of process {index} of {count}, but this is process "
            f"{jax.process_index()} of {jax.process_count()}: build it with "
            "process_index=jax.process_index(), process_count=jax.process_count() (jaxnorm.data's defaults)"
        )


def check_eval_source_complete(source: Any) -> None:
    """``ValueError`` when the eval source would leave examples out: it drops the last partial batch
    (``drop_remainder=True``, the default of :class:`jaxnorm.data.ArraySource` and of
    ``jaxnorm.data.load``) and its number of examples is no multiple of its batch, so the reported
    accuracy would be that of a subset (9,984 of Fashion-MNIST's 10,000 test images at batch 256). A
    source that does not say its size and whether it drops passes."""
    drops = getattr(source, "drop_remainder", False)
    count, batch = getattr(source, "num_examples", None), getattr(source, "global_batch_size", None)
    if drops is True and count is not None and batch and count % batch:
        raise ValueError(
            f"eval_data drops its last partial batch (drop_remainder=True): it would evaluate "
            f"{count - count % batch} of its {count} examples; build it with drop_remainder=False, "
            "which pads the last batch with masked copies (exact over every example)"
        )


def check_parallel_mode(configured: Any, mode: str, explicit: bool) -> None:
    """``ValueError`` when the config's ``parallel`` names another mode than the ``DataParallel`` the run
    was handed: the run record would say one and the run do the other. ``explicit``: the config sets
    ``parallel`` itself (otherwise it takes the handed mode)."""
    if explicit and configured != mode:
        raise ValueError(
            f"config.parallel={configured!r}, but train was handed a DataParallel of mode {mode!r}; "
            "give one of them"
        )


def check_padded_training(source: Any, model_state: PyTree) -> None:
    """``ValueError`` when training batches are filled up with copies of their examples
    (``drop_remainder=False`` and a last partial batch) and the model keeps batch statistics: the
    mask keeps the copies out of the loss, but not out of BatchNorm's statistics, which then weigh
    some examples several times (a last batch of one example and its copies has zero variance)."""
    pads = getattr(source, "drop_remainder", True) is False and (
        source.num_examples % source.global_batch_size != 0
    )
    if pads and "batch_stats" in model_state:
        raise ValueError(
            f"the training data pads its last batch ({source.num_examples} examples, batches of "
            f"{source.global_batch_size}, drop_remainder=False) and the model keeps batch statistics, "
            "which the copies would enter: train with drop_remainder=True"
        )


def check_batch_norm_axis(model: Any, variables: PyTree, images: np.ndarray, axis_name: str | None) -> None:
    """``ValueError`` when the step runs per device (``axis_name``: ``pmap``) and the model's BatchNorm
    layers take their statistics without that axis, i.e. per device (8 devices: statistics over an
    eighth of the batch, unlike the same run under ``jit`` or on one device). Tested by tracing one
    training step outside ``pmap``: BatchNorm that reduces over ``axis_name`` cannot trace there."""
    if axis_name is None or "batch_stats" not in variables:
        return
    rngs = {"dropout": jax.random.PRNGKey(0)}
    step = lambda v, x: model.apply(v, x, train=True, mutable=["batch_stats"], rngs=rngs)
    try:
        jax.eval_shape(step, variables, images[:2])
    except Exception:
        return  # must), or a model this trace cannot run: nothing to say about it here
    raise ValueError(
        f"parallel='pmap' runs the step per device, and the model's BatchNorm takes no axis_name, so its "
        f"statistics would be per device: create it with axis_name={axis_name!r} "
        "(jaxnorm.train.experiment.build_model does), or use ghost batch norm (virtual_batch_size) for "
        "statistics over a part of the batch"
    )
