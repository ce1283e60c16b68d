"""Batch sources for the loop: deterministic per epoch, resumable mid-epoch, per-process slices.

A source gives, for epoch ``e`` and a starting batch ``i``, an iterator over this process's share of
each global batch. The loop asks for ``epoch(step // steps_per_epoch, step % steps_per_epoch)``, so the
data a step sees is a function of the step alone: this is what makes resume exact.
:class:`ArraySource` (from :mod:`jaxnorm.data.arrays`, the one in-memory source) serves arrays;
:func:`jaxnorm.data.load` datasets are sources too.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol

import numpy as np

from jaxnorm.data.arrays import ArraySource

Batch = Mapping[str, np.ndarray]

__all__ = ["ArraySource", "Batch", "BatchSource"]


class BatchSource(Protocol):
    """What the loop needs from a dataset."""

    steps_per_epoch: int
    global_batch_size: int

    def epoch(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        """This process's part of batches ``start, start + 1, ...`` of epoch ``epoch``."""
        ...
