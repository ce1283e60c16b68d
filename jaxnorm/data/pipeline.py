"""Datasets as re-iterable epochs of standardised NHWC float32 batches: :func:`load`.

Every batch is a function of ``(seed, epoch, step)`` alone, so a run is reproducible and a resumed
run sees the same batches as an uninterrupted one. ``batch_size`` is the global batch; process
``process_index`` of ``process_count`` gets its contiguous ``batch_size / process_count`` slice of
every global batch (in-memory datasets), or its own ``1 / process_count`` of the files
(ImageNet), so the processes of a multi-host run together see each global batch once.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from jaxnorm.data import augment as augment_lib
from jaxnorm.data import catalog, tfds_io
from jaxnorm.data.paths import resolve_data_dir
from jaxnorm.data.prefetch import prefetch

Batch = dict[str, np.ndarray]


def standardize(images: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """uint8 -> float32 ``(x / 255 - mean) / std`` per channel."""
    out = images.astype(np.float32)
    out *= np.float32(1 / 255) / std
    out -= (mean / std).astype(np.float32)
    return out


class Dataset(abc.ABC):
    """One split as epochs of batches ``{"image": float32 (b, H, W, C), "label": int32 (b,)}``.

    Iterating the object yields the next epoch (0, 1, 2, ...); :meth:`epoch` gives any epoch from
    any step. Without ``drop_remainder`` the last batch is zero-padded to full size and every
    batch carries a float32 ``"mask"`` (1 for real examples).

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


class ArrayDataset(Dataset):
    """A split held in memory as uint8 (MNIST, Fashion-MNIST, CIFAR); batches built with NumPy.

    Epoch ``e`` visits the examples in the order ``default_rng([seed, e]).permutation(N)``
    (training) or in stored order (evaluation); the augmentation of step ``i`` draws from
    ``default_rng([seed, e, i])``.
    """

    def __init__(
        self, images: np.ndarray, labels: np.ndarray, *, mean: tuple[float, ...],
        std: tuple[float, ...], batch_size: int, train: bool, seed: int, augment: str,
        drop_remainder: bool, process_index: int, process_count: int, prefetch_size: int = 2,
    ) -> None:
        super().__init__()
        self.images, self.labels = images, labels
        self.mean = np.asarray(mean, np.float32)
        self.std = np.asarray(std, np.float32)
        self.train, self.seed, self.augment = train, seed, augment
        self.drop_remainder = drop_remainder
        self.process_index, self.process_count = process_index, process_count
        self.prefetch_size = prefetch_size
        self.num_examples = len(images)
        self.global_batch_size = batch_size
        self.batch_size = batch_size // process_count
        if drop_remainder:
            self.steps_per_epoch = self.num_examples // batch_size
        else:
            self.steps_per_epoch = -(-self.num_examples // batch_size)
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"batch_size={batch_size} exceeds the {self.num_examples} examples of the split "
                "(use drop_remainder=False or a smaller batch)")
        probe = augment_lib.apply(augment, images[:1], np.random.default_rng(0), train=train)
        self.image_shape = probe.shape[1:]

    def _order(self, epoch: int) -> np.ndarray:
        if self.train:
            return np.random.default_rng([self.seed, epoch]).permutation(self.num_examples)
        return np.arange(self.num_examples)

    def _batch(self, order: np.ndarray, epoch: int, step: int) -> Batch:
        b, local = self.global_batch_size, self.batch_size
        idx = order[step * b:(step + 1) * b]
        real = len(idx)
        idx = np.pad(idx, (0, b - real))
        mine = slice(self.process_index * local, (self.process_index + 1) * local)
        rng = np.random.default_rng([self.seed, epoch, step])
        images = augment_lib.apply(self.augment, self.images[idx], rng, train=self.train)[mine]
        batch = {"image": standardize(images, self.mean, self.std),
                 "label": self.labels[idx[mine]]}
        if not self.drop_remainder:
            mask = (np.arange(b) < real).astype(np.float32)[mine]
            batch["image"] *= mask[:, None, None, None]
            batch["label"] = np.where(mask > 0, batch["label"], 0).astype(np.int32)
            batch["mask"] = mask
        return batch

    def epoch(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        order = self._order(epoch)
        return prefetch(lambda step: self._batch(order, epoch, step),
                        range(start, self.steps_per_epoch), self.prefetch_size)


def tfds_split(name: str, split: str) -> str:
    """The TFDS split string for ``split`` (resolving ``validation`` / ``train_minus_validation``)."""
    spec = catalog.spec(name)
    n_val = spec.num_validation
    if split == "validation" and n_val:
        return f"{spec.info.train_split}[-{n_val}:]"
    if split == "train_minus_validation":
        if not n_val:
            raise ValueError(f"{name} has no validation split carved from train")
        return f"{spec.info.train_split}[:-{n_val}]"
    return split


def load(
    name: str, split: str, *, batch_size: int, train: bool, seed: int = 0,
    data_dir: str | os.PathLike | None = None, augment: str | None = None,
    drop_remainder: bool = True, process_index: int | None = None,
    process_count: int | None = None, prefetch_size: int = 2,
) -> Dataset:
    """A dataset split as re-iterable, deterministic epochs of standardised batches.

    Args:
      name: one of :func:`jaxnorm.data.names` (``fashion_mnist``, ``mnist``, ``cifar10``,
        ``cifar100``, ``imagenet2012``).
      split: a TFDS split (``"train"``, ``"test"``, slices such as ``"train[:5000]"``), or
        ``"validation"`` = the last 10,000 training examples (MNIST, Fashion-MNIST, CIFAR; as
        Stock et al. 2019, Sec. 6.2, hold out 10,000 CIFAR images) with
        ``"train_minus_validation"`` the rest. ImageNet's ``"validation"`` is TFDS's own.
      batch_size: the global batch size (a multiple of ``process_count``).
      train: shuffle every epoch and apply the training augmentation.
      seed: the shuffling / augmentation seed; batches depend only on ``(seed, epoch, step)``.
      data_dir: TFDS data directory (default ``$JAXNORM_DATA_DIR`` or ``~/tensorflow_datasets``).
      augment: one of :data:`jaxnorm.data.catalog.AUGMENTATIONS`; ``None`` = the dataset's default
        (``crop_flip`` for CIFAR, ``inception_crop_flip`` for ImageNet, ``none`` for
        (Fashion-)MNIST). Evaluation batches are only center-cropped where the augmentation
        changes the image size (``cifar_nv_crop``; ImageNet).
      drop_remainder: drop the last partial batch; otherwise pad it and add a ``"mask"``.
      process_index, process_count: this process's share (default: ``jax.process_index()``,
        ``jax.process_count()``).
      prefetch_size: batches prepared ahead on a background thread (0: none).

    Returns:
      A :class:`Dataset`.

    Raises:
      ValueError: unknown name, augmentation, or an inconsistent batch / process setting.
      DatasetNotFoundError: the dataset is not prepared; the message names the apt package or
        the download it needs.
    """
    spec = catalog.spec(name)
    augment = catalog.resolve_augment(name, augment)
    if process_index is None or process_count is None:
        import jax

        process_index = jax.process_index() if process_index is None else process_index
        process_count = jax.process_count() if process_count is None else process_count
    if not 0 <= process_index < process_count:
        raise ValueError(
            f"process_index must lie in [0, process_count={process_count}), got {process_index}")
    if not isinstance(batch_size, int) or batch_size < 1 or batch_size % process_count:
        raise ValueError(
            f"batch_size must be a positive multiple of process_count={process_count}, "
            f"got {batch_size!r}")
    data_dir = resolve_data_dir(data_dir)
    split = tfds_split(name, split)
    common: dict[str, Any] = dict(
        batch_size=batch_size, train=train, seed=seed, drop_remainder=drop_remainder,
        process_index=process_index, process_count=process_count, prefetch_size=prefetch_size)
    if name == "imagenet2012":
        from jaxnorm.data.imagenet import ImageNetDataset

        return ImageNetDataset(split, data_dir=data_dir, mean=spec.mean, std=spec.std,
                               augment=augment, **common)
    images, labels = tfds_io.read_arrays(name, split, data_dir)
    return ArrayDataset(images, labels, mean=spec.mean, std=spec.std, augment=augment, **common)
