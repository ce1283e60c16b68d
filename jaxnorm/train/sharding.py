"""Data parallelism: ``jax.jit`` + ``NamedSharding`` (default) or ``jax.pmap``, single- or multi-host.

Both modes keep one replica of the train state per device and split the global batch along its first
axis; both compute BN statistics over the global batch:

* ``jit``: one 1-D mesh ``("data",)`` over every device of every process; the batch is one global array
  sharded along ``"data"``, the state is replicated. The step is written for one device and XLA inserts
  the all-reduces (gradients, BN moments, metrics).
* ``pmap``: the step runs per device on its shard; it averages gradients and metrics with
  ``lax.pmean(axis_name="batch")`` and the model's BN layers reduce their moments over the same axis.

Multi-host: call :func:`initialize_distributed` first (a thin wrapper of ``jax.distributed.initialize``);
each process then feeds its own ``global_batch / process_count`` examples.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxnorm.functional.checks import is_int

PyTree = Any

MODES = ("jit", "pmap")
DATA_AXIS = "data"
PMAP_AXIS = "batch"


def initialize_distributed(
    coordinator_address: str,
    num_processes: int,
    process_id: int,
    *,
    local_device_ids: list[int] | None = None,
    cpu_collectives: str = "gloo",
) -> None:
    """Joins a multi-process JAX run (``jax.distributed.initialize``).

    On CPU, cross-process collectives need an implementation: ``cpu_collectives`` (``"gloo"``) is set
    before initialising. On TPU pods and GPU clusters the arguments may be left to auto-detection by
    calling ``jax.distributed.initialize()`` directly instead.
    """
    if num_processes < 1 or not 0 <= process_id < num_processes:
        raise ValueError(
            f"need num_processes >= 1 and 0 <= process_id < num_processes, got "
            f"num_processes={num_processes}, process_id={process_id}"
        )
    jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
    jax.distributed.initialize(
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
        local_device_ids=local_device_ids,
    )


def _checked_devices(devices: Any) -> list[jax.Device]:
    """``devices`` as a list; ``ValueError`` for none, a repeated one, or (several processes) a list that
    leaves out a process: each process would then train its own model on its share of the batches
    (``jax.local_devices()`` in a two-process run) and exit 0."""
    devices = list(devices)
    if not devices:
        raise ValueError("devices must name at least one device")
    if len(set(devices)) != len(devices):
        raise ValueError(f"devices names a device more than once: {devices}")
    covered = {d.process_index for d in devices}
    if covered != set(range(jax.process_count())):
        raise ValueError(
            f"devices must include devices of every one of the {jax.process_count()} processes, got devices "
            f"of processes {sorted(covered)}: a run spans every process (default: jax.devices())"
        )
    per_process = {p: sum(d.process_index == p for d in devices) for p in covered}
    if len(set(per_process.values())) > 1:
        raise ValueError(
            f"devices must give every process as many devices, got {per_process} (process: devices): "
            "the global batch is split evenly over processes"
        )
    return devices


class DataParallel:
    """Places states and batches and compiles steps for one parallelism ``mode``.

    Args:
      mode: ``"jit"`` (``NamedSharding`` over a ``("data",)`` mesh) or ``"pmap"``.
      devices: the global devices to use (default: all, in ``jax.devices()`` order).
    """

    def __init__(self, mode: str = "jit", devices: list[jax.Device] | None = None):
        if mode not in MODES:
            raise ValueError(f"parallel mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.devices = _checked_devices(jax.devices() if devices is None else devices)
        self.local_devices = [d for d in self.devices if d.process_index == jax.process_index()]
        self.mesh = Mesh(np.asarray(self.devices), (DATA_AXIS,))
        self.replicated = NamedSharding(self.mesh, P())
        self.batch_sharding = NamedSharding(self.mesh, P(DATA_AXIS))
        self._local_mesh = Mesh(np.asarray(self.local_devices), (PMAP_AXIS,))
        self._stacked = NamedSharding(self._local_mesh, P(PMAP_AXIS))

    @property
    def axis_name(self) -> str | None:
        """The collective axis name the step and the model's BN layers need (``None`` under jit)."""
        return PMAP_AXIS if self.mode == "pmap" else None

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    def check_batch_size(self, global_batch_size: int, what: str = "batch_size") -> None:
        """Raises unless ``global_batch_size`` is an int >= 1 that splits evenly over the devices."""
        if not is_int(global_batch_size) or global_batch_size < 1:
            raise ValueError(f"{what} must be an int >= 1, got {global_batch_size!r}")
        if global_batch_size % self.num_devices:
            raise ValueError(
                f"{what}={global_batch_size} must be divisible by the number of devices ({self.num_devices})"
            )

    # ----------------------------------------------------------------- state
    def init_state(self, init_fn: Callable[[], PyTree]) -> PyTree:
        """Runs ``init_fn`` (no arguments, pure) and places its result replicated on every device."""
        if self.mode == "jit":
            return jax.jit(init_fn, out_shardings=self.replicated)()
        return self.place_state(jax.jit(init_fn)())

    def place_state(self, state: PyTree) -> PyTree:
        """Puts a host / single-copy state on the devices in this mode's layout."""
        if self.mode == "jit":
            return jax.tree.map(self._replicate_global, state)
        n = len(self.local_devices)
        return jax.tree.map(
            lambda x: jax.device_put(np.broadcast_to(np.asarray(x), (n, *np.shape(x))), self._stacked),
            state,
        )

    def restore_layout(self, restored: PyTree) -> PyTree:
        """A state restored into :meth:`checkpoint_view`'s layout -> this mode's placed layout."""
        if self.mode == "jit":
            return restored
        return self.place_state(jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), restored))

    def checkpoint_view(self, state: PyTree) -> PyTree:
        """One copy of a placed state as global arrays replicated over every device of every process:
        what a checkpoint saves and restores into. Under jit that is the state itself; under pmap
        each device's own copy becomes its shard of one global array (no host copy), since a
        multi-process checkpoint cannot save the process-local arrays pmap works on."""
        if self.mode == "jit":
            return state
        return jax.tree.map(self._global_from_stacked, state)

    def _global_from_stacked(self, x: jax.Array) -> jax.Array:
        by_device = {s.device: s.data for s in x.addressable_shards}
        arrays = [by_device[d].reshape(by_device[d].shape[1:]) for d in self.local_devices]
        return jax.make_array_from_single_device_arrays(x.shape[1:], self.replicated, arrays)

    def _replicate_global(self, x: Any) -> jax.Array:
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, self.replicated, lambda idx: x[idx])

    def unreplicate(self, state: PyTree) -> PyTree:
        """One copy of a placed state (still on device under jit; device 0's copy under pmap)."""
        if self.mode == "jit":
            return state
        return jax.tree.map(lambda x: x.addressable_shards[0].data[0], state)

    def to_host(self, tree: PyTree) -> PyTree:
        """A NumPy copy of one replica of ``tree`` (states and metrics)."""
        return jax.device_get(self.unreplicate(tree))

    # ----------------------------------------------------------------- data
    def shard_batch(self, local_batch: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
        """This process's part of the global batch -> the step's input layout."""
        if self.mode == "jit":
            if jax.process_count() == 1:  # the whole batch is local: one (cheaper) transfer
                return jax.device_put(dict(local_batch), self.batch_sharding)
            return {
                k: jax.make_array_from_process_local_data(self.batch_sharding, np.asarray(v))
                for k, v in local_batch.items()
            }
        n = len(self.local_devices)
        out = {}
        for k, v in local_batch.items():
            v = np.asarray(v)
            if v.shape[0] % n:
                raise ValueError(
                    f"batch[{k!r}] has {v.shape[0]} examples, not divisible by {n} local devices"
                )
            out[k] = jax.device_put(v.reshape(n, v.shape[0] // n, *v.shape[1:]), self._stacked)
        return out

    # ----------------------------------------------------------------- steps
    def compile_train_step(self, step_fn: Callable, *, donate: bool = True) -> Callable:
        """``step_fn(state, batch) -> (state, metrics)`` compiled for this mode."""
        donate_argnums = (0,) if donate else ()
        if self.mode == "jit":
            return jax.jit(
                step_fn,
                in_shardings=(self.replicated, self.batch_sharding),
                out_shardings=(self.replicated, self.replicated),
                donate_argnums=donate_argnums,
            )
        return jax.pmap(step_fn, axis_name=PMAP_AXIS, donate_argnums=donate_argnums, devices=self.devices)

    def compile_eval_step(self, eval_fn: Callable) -> Callable:
        """``eval_fn(state, batch) -> sums`` compiled for this mode."""
        if self.mode == "jit":
            return jax.jit(
                eval_fn,
                in_shardings=(self.replicated, self.batch_sharding),
                out_shardings=self.replicated,
            )
        return jax.pmap(eval_fn, axis_name=PMAP_AXIS, devices=self.devices)
