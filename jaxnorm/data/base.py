"""What every jaxnorm dataset is: :class:`Dataset`, re-iterable epochs of batches by ``(epoch, step)``.

The base of the in-memory sources (:mod:`jaxnorm.data.arrays`) and of ImageNet's tf.data pipeline
(:mod:`jaxnorm.data.imagenet`); :func:`jaxnorm.data.load` picks one. It satisfies the training loop's
``BatchSource`` protocol. Also the argument checks the package shares (:func:`check_int` and its
forms), so that every module refuses a bad integer the same way, at construction.
"""

from __future__ import annotations

import abc
import operator
from collections.abc import Iterator

import numpy as np

Batch = dict[str, np.ndarray]


def check_int(name: str, value: object, *, low: int = 0, high: int | None = None) -> int:
    """``value`` as a Python ``int`` if it is an integer in ``[low, high]`` (``high=None``: no upper
    bound); otherwise ``ValueError`` naming the argument ``name`` and the range expected.

    Python and NumPy integers are accepted (``operator.index``); bools, floats and anything else are
    refused, so ``True`` never passes for ``1``.
    """
    try:
        number = None if isinstance(value, bool | np.bool_) else operator.index(value)
    except TypeError:
        number = None
    if number is None or number < low or (high is not None and number > high):
        expected = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return number


def check_processes(process_index: object, process_count: object) -> tuple[int, int]:
    """``(process_index, process_count)`` as Python ints; ``ValueError`` naming the argument unless
    ``process_count`` is an integer >= 1 and ``process_index`` an integer in ``[0, process_count)``."""
    process_count = check_int("process_count", process_count, low=1)
    try:
        process_index = check_int("process_index", process_index, high=process_count - 1)
    except ValueError:
        raise ValueError(
            f"process_index must lie in [0, process_count={process_count}), got {process_index!r}"
        ) from None
    return process_index, process_count


def check_batch_size(name: str, batch_size: object, process_count: int) -> int:
    """``batch_size`` as a Python int; ``ValueError`` naming argument ``name`` unless it is a positive
    integer multiple of ``process_count``."""
    try:
        size = check_int(name, batch_size, low=1)
    except ValueError:
        size = None
    if size is None or size % process_count:
        raise ValueError(
            f"{name} must be a positive multiple of the process count ({process_count}), got {batch_size!r}"
        )
    return size


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
        """This process's batches ``start, start + 1, ..., steps_per_epoch - 1`` of epoch ``epoch``.

        ``epoch`` is an integer >= 0 and ``start`` an integer in ``[0, steps_per_epoch]``;
        ``start = steps_per_epoch`` gives an empty epoch (resuming at the end of one). Anything else
        raises ``ValueError`` when this is called, before any batch is made (see
        :meth:`check_position`).
        """

    def check_position(self, epoch: object, start: object) -> tuple[int, int]:
        """``(epoch, start)`` as Python ints; ``ValueError`` naming the argument unless ``epoch`` is an
        integer >= 0 and ``start`` an integer in ``[0, steps_per_epoch]``."""
        return (check_int("epoch", epoch),
                check_int("start", start, high=self.steps_per_epoch))

    def __iter__(self) -> Iterator[Batch]:
        epoch, self._next_epoch = self._next_epoch, self._next_epoch + 1
        return self.epoch(epoch)

    def __len__(self) -> int:
        return self.steps_per_epoch
