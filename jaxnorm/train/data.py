"""Batch sources for the loop: deterministic per epoch, resumable mid-epoch, per-process slices.

A source gives, for epoch ``e`` and a starting batch ``i``, an iterator over this process's share of
each global batch. The loop asks for ``epoch(step // steps_per_epoch, step % steps_per_epoch)``, so the
data a step sees is a function of the step alone: this is what makes resume exact.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Protocol

import jax
import numpy as np

Batch = Mapping[str, np.ndarray]


class BatchSource(Protocol):
    """What the loop needs from a dataset."""

    steps_per_epoch: int
    global_batch_size: int

    def epoch(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        """This process's part of batches ``start, start + 1, ...`` of epoch ``epoch``."""
        ...


class ArraySource:
    """Batches from in-memory arrays, reshuffled each epoch with ``default_rng([seed, epoch])``.

    Args:
      arrays: ``{"image": (N, ...), "label": (N,)}`` (any keys; same first dimension).
      global_batch_size: examples per step over all processes.
      shuffle: reshuffle every epoch (train) or keep the order (eval).
      drop_remainder: drop the last partial batch; otherwise it is filled up with copies of example 0
        (real values: a model in training mode sees no artificial zeros) and a float ``mask`` key marks
        the real examples (eval).
      seed: the shuffling seed.
      process_index, process_count: this process's slice of every global batch (default: jax's).
    """

    def __init__(
        self,
        arrays: Mapping[str, np.ndarray],
        global_batch_size: int,
        *,
        shuffle: bool = True,
        drop_remainder: bool = True,
        seed: int = 0,
        process_index: int | None = None,
        process_count: int | None = None,
    ):
        sizes = {k: len(v) for k, v in arrays.items()}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"arrays must share their first dimension, got {sizes}")
        self.arrays = {k: np.asarray(v) for k, v in arrays.items()}
        self.num_examples = next(iter(sizes.values()))
        self.process_index = jax.process_index() if process_index is None else process_index
        self.process_count = jax.process_count() if process_count is None else process_count
        if global_batch_size < 1 or global_batch_size % self.process_count:
            raise ValueError(
                f"global_batch_size={global_batch_size} must be a positive multiple of the process "
                f"count ({self.process_count})"
            )
        if drop_remainder and self.num_examples < global_batch_size:
            raise ValueError(
                f"global_batch_size={global_batch_size} exceeds the {self.num_examples} examples"
            )
        self.global_batch_size = global_batch_size
        self.shuffle, self.drop_remainder, self.seed = shuffle, drop_remainder, seed
        n, b = self.num_examples, global_batch_size
        self.steps_per_epoch = n // b if drop_remainder else -(-n // b)

    def epoch(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        order = np.arange(self.num_examples)
        if self.shuffle:
            order = np.random.default_rng([self.seed, epoch]).permutation(self.num_examples)
        b = self.global_batch_size
        local = b // self.process_count
        for i in range(start, self.steps_per_epoch):
            idx = order[i * b : (i + 1) * b]
            real = len(idx)
            idx = np.pad(idx, (0, b - real))[self.process_index * local :][:local]
            batch = {k: v[idx] for k, v in self.arrays.items()}
            if not self.drop_remainder:
                mask = (np.arange(b) < real).astype(np.float32)
                batch["mask"] = mask[self.process_index * local :][:local]
            yield batch


class EpochFnSource:
    """Adapts ``make_epoch(epoch) -> iterable of local batches`` (e.g. a tf.data pipeline seeded by
    the epoch); mid-epoch starts skip batches."""

    def __init__(
        self,
        make_epoch: Callable[[int], Iterable[Batch]],
        steps_per_epoch: int,
        global_batch_size: int,
    ):
        self.make_epoch = make_epoch
        self.steps_per_epoch = steps_per_epoch
        self.global_batch_size = global_batch_size

    def epoch(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        batches = iter(self.make_epoch(epoch))
        return itertools.islice(batches, start, self.steps_per_epoch)
