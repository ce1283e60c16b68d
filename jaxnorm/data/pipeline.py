"""Datasets as re-iterable epochs of standardised NHWC float32 batches: :func:`load`.

Every batch is a function of ``(seed, epoch, step)`` alone, so a run is reproducible and a resumed
run sees the same batches as an uninterrupted one. ``batch_size`` is the global batch; process
``process_index`` of ``process_count`` gets its contiguous ``batch_size / process_count`` slice of
every global batch (in-memory datasets), or its own ``1 / process_count`` of the files
(ImageNet), so the processes of a multi-host run together see each global batch once.
"""

from __future__ import annotations

import os
import re
from typing import Any

from jaxnorm.data import catalog, tfds_io
from jaxnorm.data.arrays import ArrayDataset, standardize
from jaxnorm.data.base import Batch, Dataset, check_batch_size, check_int, check_processes
from jaxnorm.data.imagenet import ImageNetDataset
from jaxnorm.data.paths import resolve_data_dir
from jaxnorm.functional.checks import check_bool

__all__ = [
    "DERIVED_SPLITS",
    "ArrayDataset",
    "Batch",
    "Dataset",
    "load",
    "splits_overlap",
    "standardize",
    "tfds_split",
]


DERIVED_SPLITS = ("validation", "train_minus_validation")
"""The splits jaxnorm carves from ``train`` (where the catalog records a validation size)."""

_PART = re.compile(r"^(?P<name>[\w-]+)(?:\[(?P<selector>[^\]]*)\])?$")
_BOUND = re.compile(r"^(?P<value>-?[\d.]+)?(?P<unit>%|shard)?$")


def tfds_split(name: str, split: str) -> str:
    """The TFDS split string for ``split``, with ``validation`` / ``train_minus_validation`` (and
    slices of them) rewritten as slices of ``train``.

    ``validation`` is ``train[-V:]`` and ``train_minus_validation`` ``train[:-V]`` (``V`` the
    catalog's validation size, 10,000). A slice of one, ``validation[a:b]``, follows TFDS's slice
    rules on that split: absolute indices (negative from its end) or percentages of its catalog size
    (``V``; ``train_minus_validation``: the catalog's train size minus ``V``), percentages rounded to
    the closest index as TFDS does; the result is the same examples as a slice of ``train``
    (``validation[:50%]`` -> ``train[-10000:-5000]``). Parts joined by ``+`` are resolved one by
    one. Everything else (ImageNet's own ``validation`` included) is passed to TFDS as it is.

    Raises:
      ValueError: naming ``split``: not a string, ``train_minus_validation`` of a dataset without a
        carved validation split, a shard slice or single index of a derived split, a bound out of
        range, or a slice of a derived split that selects no examples.
    """
    if not isinstance(split, str):
        raise ValueError(f"split must be a TFDS split string such as 'train', got {split!r}")
    spec = catalog.spec(name)
    return "+".join(_resolve_part(name, spec, part.strip(), split) for part in split.split("+"))


def _resolve_part(name: str, spec, part: str, split: str) -> str:
    """One ``+``-separated part of ``split`` (see :func:`tfds_split`)."""
    match = _PART.match(part)
    if not match or match["name"] not in DERIVED_SPLITS:
        return part
    derived, selector = match["name"], match["selector"]
    n_val, train = spec.num_validation, spec.info.train_split
    if not n_val:
        if derived == "validation":
            return part  # the dataset's own validation split (ImageNet)
        raise ValueError(f"split={split!r}: {name} has no validation split carved from train")
    if selector is None:
        return f"{train}[-{n_val}:]" if derived == "validation" else f"{train}[:-{n_val}]"
    size = n_val if derived == "validation" else spec.info.num_train_examples - n_val
    where = f"split={split!r}" if part == split.strip() else f"split={split!r} (in {part!r})"
    start, stop = _slice_bounds(selector, size, where)
    if derived == "validation":  # train[-V + start : -V + stop]
        return f"{train}[{start - n_val}:{stop - n_val or ''}]"
    return f"{train}[{start or ''}:{stop if stop < size else -n_val}]"


def splits_overlap(name: str, first: str, second: str) -> bool:
    """Whether two splits of dataset ``name`` share examples of its train split (``validation`` is part
    of ``train``; ``train[:100]`` and ``train[50:]`` share 50). Parts of other splits (``test``) are
    taken as disjoint from the train split's; a train slice whose bounds are no ``[start:stop]``
    (shards, a single index) counts as all of train."""
    ranges = [_train_ranges(name, split) for split in (first, second)]
    return any(a < d and c < b for a, b in ranges[0] for c, d in ranges[1])


def _train_ranges(name: str, split: str) -> list[tuple[int, int]]:
    """The ``[start, stop)`` ranges of ``name``'s train split that ``split`` reads."""
    info = catalog.spec(name).info
    whole = (0, info.num_train_examples)
    ranges = []
    for part in tfds_split(name, split).split("+"):
        match = _PART.match(part.strip())
        if not match or match["name"] != info.train_split:
            continue
        try:
            selector = match["selector"]
            ranges.append(whole if selector is None else _slice_bounds(selector, whole[1], split))
        except ValueError:
            ranges.append(whole)
    return ranges


def _slice_bounds(selector: str, size: int, where: str) -> tuple[int, int]:
    """``[start, stop)`` within a split of ``size`` examples of the TFDS slice ``selector``."""
    bounds = selector.split(":")
    matches = [_BOUND.match(b.strip()) for b in bounds]
    if len(bounds) != 2 or not all(matches):
        raise ValueError(
            f"{where}: a derived split takes a slice [start:stop] of absolute indices or percentages")
    units = {m["unit"] for m in matches if m["unit"]}
    if "shard" in units:
        raise ValueError(f"{where}: shard slices of a derived split are unsupported (it is part of train)")
    percent = "%" in units
    resolved = []
    for m, default in zip(matches, (0, size), strict=True):
        if m["value"] is None:
            resolved.append(default)
            continue
        try:
            value = float(m["value"]) if percent else int(m["value"])
        except ValueError:
            raise ValueError(f"{where}: {m['value']!r} is not a slice bound") from None
        limit = 100 if percent else size
        if abs(value) > limit:
            raise ValueError(f"{where}: bound {m.group(0)!r} lies outside the split's {size} examples")
        index = round(value * size / 100.0) if percent else value
        resolved.append(index + size if index < 0 else index)
    start, stop = resolved
    if start >= stop:
        raise ValueError(f"{where} selects no examples of the split's {size}")
    return start, stop


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
        ``"train_minus_validation"`` the rest; both slice like TFDS splits
        (``"validation[:50%]"``, see :func:`tfds_split`). ImageNet's ``"validation"`` is TFDS's own.
      batch_size: the global batch size (a multiple of ``process_count``).
      train: shuffle every epoch and apply the training augmentation.
      seed: the shuffling / augmentation seed, an integer >= 0; batches depend only on
        ``(seed, epoch, step)``.
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

    Every argument is checked before any data is read; integers may be Python or NumPy ones, never
    bools.

    Returns:
      A :class:`Dataset`.

    Raises:
      ValueError: unknown name, an augmentation that does not apply (``colour_crop_flip`` needs RGB
        images), a malformed split of a derived split, a negative seed or prefetch size, or an
        inconsistent batch / process setting; the message names the argument.
      TypeError: ``train`` or ``drop_remainder`` not a bool, ``data_dir`` not a path.
      DatasetNotFoundError: the dataset is not prepared; the message names the apt package or
        the download it needs.
    """
    spec = catalog.spec(name)
    augment = catalog.resolve_augment(name, augment)
    train, drop_remainder = check_bool(train, "train"), check_bool(drop_remainder, "drop_remainder")
    if process_index is None or process_count is None:
        import jax

        process_index = jax.process_index() if process_index is None else process_index
        process_count = jax.process_count() if process_count is None else process_count
    process_index, process_count = check_processes(process_index, process_count)
    batch_size = check_batch_size("batch_size", batch_size, process_count)
    seed = check_int("seed", seed)
    prefetch_size = check_int("prefetch_size", prefetch_size)
    split = tfds_split(name, split)
    data_dir = resolve_data_dir(data_dir)
    common: dict[str, Any] = dict(
        batch_size=batch_size, train=train, seed=seed, drop_remainder=drop_remainder,
        process_index=process_index, process_count=process_count, prefetch_size=prefetch_size)
    if name == "imagenet2012":
        return ImageNetDataset(split, data_dir=data_dir, mean=spec.mean, std=spec.std,
                               augment=augment, **common)
    images, labels = tfds_io.read_arrays(name, split, data_dir)
    return ArrayDataset(images, labels, mean=spec.mean, std=spec.std, augment=augment, **common)
