"""Datasets as re-iterable epochs of standardised NHWC float32 batches: :func:`load`.

Every batch is a function of ``(seed, epoch, step)`` alone, so a run is reproducible and a resumed
run sees the same batches as an uninterrupted one. ``batch_size`` is the global batch; process
``process_index`` of ``process_count`` gets its contiguous ``batch_size / process_count`` slice of
every global batch (in-memory datasets), or its own ``1 / process_count`` of the files
(ImageNet), so the processes of a multi-host run together see each global batch once.
"""

from __future__ import annotations

import os
from typing import Any

from jaxnorm.data import catalog, tfds_io
from jaxnorm.data.arrays import ArrayDataset, standardize
from jaxnorm.data.base import Batch, Dataset
from jaxnorm.data.imagenet import ImageNetDataset
from jaxnorm.data.paths import resolve_data_dir

__all__ = ["ArrayDataset", "Batch", "Dataset", "load", "standardize", "tfds_split"]


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
        ``cifar10_jpeg`` (CIFAR-10 re-encoded as JPEG q75, prepared offline by
        :func:`jaxnorm.data.prepare_cifar10_jpeg`), ``cifar100``, ``imagenet2012``).
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
      drop_remainder: drop the last partial batch; otherwise fill it up with masked copies of its
        real examples and add a float ``"mask"`` (0 for the copies) to every batch.
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
        return ImageNetDataset(split, data_dir=data_dir, mean=spec.mean, std=spec.std,
                               augment=augment, **common)
    images, labels = tfds_io.read_arrays(name, split, data_dir)
    return ArrayDataset(images, labels, mean=spec.mean, std=spec.std, augment=augment, **common)
