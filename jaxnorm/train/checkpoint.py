"""Checkpoints with orbax: every N steps, on SIGTERM, and exact resume.

The whole run state is the :class:`~jaxnorm.train.state.TrainState`; the data position is a function
of ``state.step`` (see :mod:`jaxnorm.train.loop`), so restoring the latest checkpoint and continuing
gives the same parameters, bit for bit on CPU, as a run that was never interrupted.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

PyTree = Any


class Checkpointer:
    """An ``orbax.checkpoint.CheckpointManager`` for one run directory.

    Args:
      directory: where step directories go (created).
      every_steps: save when ``step % every_steps == 0`` (0 = only when forced: SIGTERM, end of run).
      max_to_keep: newest checkpoints kept.
    """

    def __init__(self, directory: str, *, every_steps: int = 0, max_to_keep: int = 2):
        if every_steps < 0:
            raise ValueError(f"checkpoint every_steps must be >= 0, got {every_steps}")
        self.every_steps = every_steps
        self.directory = os.path.abspath(directory)
        self._max_to_keep = max_to_keep
        self._manager = self._new_manager()

    def _new_manager(self) -> ocp.CheckpointManager:
        return ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=self._max_to_keep, create=True),
        )

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def saves_at(self, step: int, *, force: bool = False) -> bool:
        """Whether :meth:`maybe_save` at ``step`` (with ``force``) writes a checkpoint."""
        due = self.every_steps > 0 and step % self.every_steps == 0
        return (due or force) and step != self._manager.latest_step()

    def maybe_save(self, step: int, state: PyTree, *, force: bool = False) -> bool:
        """Saves ``state`` as step ``step`` if due (or ``force``); returns whether it saved."""
        if not self.saves_at(step, force=force):
            return False
        self.save(step, state)
        return True

    def save(self, step: int, state: PyTree) -> None:
        """Saves ``state`` as step ``step`` now (the caller has checked :meth:`saves_at`)."""
        self._manager.save(step, args=ocp.args.StandardSave(state), force=True)

    def restore(self, target: PyTree, step: int | None = None) -> PyTree:
        """Restores step ``step`` (default: latest) into the structure, dtypes and shardings of
        ``target`` (a state or its ``jax.ShapeDtypeStruct`` tree)."""
        step = self._manager.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
        return self._manager.restore(step, args=ocp.args.StandardRestore(abstract))

    def all_steps(self) -> list[int]:
        """The steps of the checkpoints present, oldest first."""
        return sorted(self._manager.all_steps())

    def restore_newest(
        self, target: PyTree, *, report=print, primary: bool = True
    ) -> tuple[PyTree, int] | None:
        """Restores the newest checkpoint that can be restored: ``(state, step)``, ``None`` if there is
        no checkpoint.

        A newer checkpoint that fails to restore (e.g. truncated metadata after a crash of the disk
        or of a copy) is named in one line through ``report`` and set aside as
        ``unreadable-<step>`` (on the ``primary`` process), so that the run continues from the
        previous one and can later save that step again. If no checkpoint restores, raises
        ``RuntimeError`` naming them all.
        """
        failed = []
        for step in reversed(self.all_steps()):
            try:
                state = self.restore(target, step)
            except Exception as e:  # whatever broke this checkpoint: try the previous one
                reason = (str(e).strip().splitlines() or [""])[0][:200]
                report(
                    f"checkpoint {self.directory}/{step} cannot be restored ({type(e).__name__}: "
                    f"{reason}); falling back to the previous one"
                )
                failed.append(step)
                # a fresh manager: one that failed on a step (an empty one) could not restore the next
                self._manager.close()
                self._manager = self._new_manager()
                continue
            if failed:
                self._set_aside(failed, primary)
            return state, step
        if failed:
            raise RuntimeError(f"no checkpoint in {self.directory} can be restored (steps {failed})")
        return None

    def _set_aside(self, steps: list[int], primary: bool) -> None:
        if primary:
            for step in steps:
                os.replace(
                    os.path.join(self.directory, str(step)),
                    os.path.join(self.directory, f"unreadable-{step}"),
                )
        sync_processes("jaxnorm_checkpoint_set_aside")
        self._manager.reload()

    def reached_preemption(self, step: int) -> bool:
        """Whether the cluster (multi-host preemption service) asks to stop at ``step``."""
        return bool(self._manager.reached_preemption(step))

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.close()


def sync_processes(name: str) -> None:
    """A barrier across the processes of a multi-process run (nothing with one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def process_flags(flag: bool) -> np.ndarray:
    """``flag`` of every process of a multi-process run, in process order (one small all-gather;
    ``[flag]`` with one process): what lets every process take the same decision."""
    return process_values(np.asarray(flag))


def process_values(value: np.ndarray) -> np.ndarray:
    """The small array ``value`` of every process, stacked in process order (one all-gather; shape
    ``(process_count, *value.shape)``)."""
    value = np.asarray(value)
    if jax.process_count() == 1:
        return value[None]
    from jax.experimental import multihost_utils

    gathered = multihost_utils.process_allgather(value)
    return np.asarray(gathered).reshape(jax.process_count(), *value.shape)


class StopSignal:
    """Context manager that turns SIGTERM (and SIGINT if asked) into a flag the loop polls.

    The first signal sets :attr:`requested`; the loop then saves a checkpoint and returns. Handlers
    are only installed from the main thread and are restored on exit.
    """

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM,)):
        self.signals = signals
        self.requested = False
        self._previous: dict[int, Any] = {}

    def _handle(self, signum, frame) -> None:
        self.requested = True

    def __enter__(self) -> StopSignal:
        if threading.current_thread() is threading.main_thread():
            for s in self.signals:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()
