"""What every jaxnorm dataset is: :class:`Dataset`, re-iterable epochs of batches by ``(epoch, step)``.

The base of the in-memory sources (:mod:`jaxnorm.data.arrays`) and of ImageNet's tf.data pipeline
(:mod:`jaxnorm.data.imagenet`); :func:`jaxnorm.data.load` picks one. It satisfies the training loop's
``BatchSource`` protocol.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator

import numpy as np

Batch = dict[str, np.ndarray]


class Dataset(abc.ABC):
    """One split as epochs of batches ``{"image": float32 (b, H, W, C), "label": int32 (b,)}``.

    Iterating the object yields the next epoch (0, 1, 2, ...); :meth:`epoch` gives any epoch from
    any step. Without ``drop_remainder`` the last batch is filled up to full size with masked
    copies of real examples and every batch carries a float32 ``"mask"`` (1 for real examples, 0
    for the copies), which excludes the copies from the evaluation metrics.

    Attributes:
      num_examples: examples in the split (all processes).
      global_batch_size: examples per step over all processes.
      batch_size: this process's examples per step.
      steps_per_epoch: batches per epoch.
      image_shape: shape of one output image.
    """

    num_examples: int
    global_batch_size: int
    batch_size: int
    steps_per_epoch: int
    image_shape: tuple[int, ...]

    def __init__(self) -> None:
        self._next_epoch = 0

    @abc.abstractmethod
    def epoch(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        """This process's batches ``start, start + 1, ...`` of epoch ``epoch``."""

    def __iter__(self) -> Iterator[Batch]:
        epoch, self._next_epoch = self._next_epoch, self._next_epoch + 1
        return self.epoch(epoch)

    def __len__(self) -> int:
        return self.steps_per_epoch
