"""In-memory datasets: :class:`ArraySource`, the one implementation of shuffling, padding, masking
and per-process slicing of arrays held in memory, and :class:`ArrayDataset`, its form for uint8
image splits (MNIST, Fashion-MNIST, CIFAR) with augmentation and standardisation.

Epoch ``e`` visits the examples in the order ``default_rng([seed, e]).permutation(N)`` (shuffled) or
in stored order; the per-batch ``transform`` of step ``i`` draws from ``default_rng([seed, e, i])``
and sees the whole global batch, so every batch is a function of ``(seed, e, i)`` alone, whatever the
process count. Padding (``drop_remainder=False``): the last global batch is filled up with copies of
its own real examples, in order, marked 0 in the float32 ``"mask"`` key (real values: a model in
training mode sees no artificial zeros; the mask keeps the copies out of the metrics).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Iterator, Mapping

import numpy as np

from jaxnorm.data import augment as augment_lib
from jaxnorm.data.base import Batch, Dataset, check_batch_size, check_int, check_processes
from jaxnorm.data.prefetch import prefetch
from jaxnorm.functional.checks import check_bool

Transform = Callable[[Batch, np.random.Generator], Batch]
"""``transform(global batch, rng) -> global batch``: per-batch processing (augmentation, scaling)."""


def standardize(images: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """uint8 -> float32 ``(x / 255 - mean) / std`` per channel."""
    out = images.astype(np.float32)
    out *= np.float32(1 / 255) / std
    out -= (mean / std).astype(np.float32)
    return out


def padded_indices(order: np.ndarray, step: int, global_batch_size: int) -> tuple[np.ndarray, int]:
    """The example indices of batch ``step`` of an epoch visiting ``order``, filled up to the global
    batch size with copies of its own examples (cyclically), and the number of real ones."""
    idx = order[step * global_batch_size : (step + 1) * global_batch_size]
    return np.resize(idx, global_batch_size), len(idx)


class ArraySource(Dataset):
    """Batches from in-memory arrays (any keys sharing their first dimension).

    Args:
      arrays: ``{"image": (N, ...), "label": (N,)}`` (any keys; same first dimension).
      global_batch_size: examples per step over all processes (a multiple of ``process_count``).
      shuffle: reshuffle every epoch (train) or keep the stored order (eval).
      drop_remainder: drop the last partial batch; otherwise fill it up with masked copies and add
        a float ``"mask"`` to every batch (eval).
      seed: the shuffling (and ``transform``) seed, an integer >= 0.
      process_index, process_count: this process's contiguous slice of every global batch
        (default: jax's).
      transform: optional per-batch processing of the global batch (see :data:`Transform`).
      prefetch_size: batches prepared ahead on a background thread (0: on demand).

    Every integer argument accepts Python and NumPy integers and refuses bools; a bad one raises
    ``ValueError`` naming it here, at construction.
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
        transform: Transform | None = None,
        prefetch_size: int = 0,
    ):
        super().__init__()
        sizes = {k: len(v) for k, v in arrays.items()}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"arrays must share their first dimension, got {sizes}")
        if process_index is None or process_count is None:
            import jax

            process_index = jax.process_index() if process_index is None else process_index
            process_count = jax.process_count() if process_count is None else process_count
        process_index, process_count = check_processes(process_index, process_count)
        global_batch_size = check_batch_size("global_batch_size", global_batch_size, process_count)
        seed = check_int("seed", seed)
        prefetch_size = check_int("prefetch_size", prefetch_size)
        # "no" would read as True
        shuffle, drop_remainder = check_bool(shuffle, "shuffle"), check_bool(drop_remainder, "drop_remainder")
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be a callable (batch -> batch) or None, got {transform!r}")
        self.arrays = {k: np.asarray(v) for k, v in arrays.items()}
        self.num_examples = next(iter(sizes.values()))
        self.process_index, self.process_count = process_index, process_count
        self.global_batch_size = global_batch_size
        self.batch_size = global_batch_size // process_count
        self.shuffle, self.drop_remainder, self.seed = shuffle, drop_remainder, seed
        self.transform, self.prefetch_size = transform, prefetch_size
        n, b = self.num_examples, global_batch_size
        self.steps_per_epoch = n // b if drop_remainder else -(-n // b)
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"batch size {b} exceeds the {n} examples (use drop_remainder=False or a smaller batch)"
            )
        probe = self._process({k: v[:1] for k, v in self.arrays.items()}, np.random.default_rng(0))
        self.image_shape = tuple(probe["image"].shape[1:]) if "image" in probe else ()

    @functools.cached_property
    def fingerprint(self) -> str | None:
        """A digest of the examples: BLAKE2b (16 hex digits) over every array's key, dtype, shape and
        bytes, in key order, computed once, when first asked (one pass over the arrays). A resumed run
        compares it (:func:`jaxnorm.train.run_record.run_identity`), so that two sources of one size,
        e.g. a validation and a test set, are told apart. ``None`` for arrays of Python objects (their
        bytes are addresses). The ``transform`` is not part of it."""
        if any(array.dtype.hasobject for array in self.arrays.values()):
            return None
        digest = hashlib.blake2b(digest_size=8)
        for key in sorted(self.arrays):
            array = np.ascontiguousarray(self.arrays[key])
            digest.update(f"{key}:{array.dtype.str}:{array.shape};".encode())
            digest.update(array.reshape(-1).view(np.uint8).data if array.size else b"")
        return digest.hexdigest()

    def _process(self, batch: Batch, rng: np.random.Generator) -> Batch:
        return dict(self.transform(batch, rng)) if self.transform is not None else batch

    def order(self, epoch: int) -> np.ndarray:
        """The order in which epoch ``epoch`` visits the examples."""
        if self.shuffle:
            return np.random.default_rng([self.seed, epoch]).permutation(self.num_examples)
        return np.arange(self.num_examples)

    def batch(self, order: np.ndarray, epoch: int, step: int) -> Batch:
        """This process's slice of global batch ``step`` of ``epoch`` (visiting ``order``)."""
        idx, real = padded_indices(order, step, self.global_batch_size)
        mine = slice(self.process_index * self.batch_size, (self.process_index + 1) * self.batch_size)
        if self.transform is None:  # gather this process's rows only
            local = {k: v[idx[mine]] for k, v in self.arrays.items()}
        else:  # the transform sees the global batch: its random draws do not depend on the process count
            rng = np.random.default_rng([self.seed, epoch, step])
            batch = self._process({k: v[idx] for k, v in self.arrays.items()}, rng)
            local = {k: v[mine] for k, v in batch.items()}
        if not self.drop_remainder:
            local["mask"] = (np.arange(self.global_batch_size) < real).astype(np.float32)[mine]
        return local

    def epoch(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        epoch, start = self.check_position(epoch, start)
        order = self.order(epoch)
        return prefetch(
            lambda step: self.batch(order, epoch, step),
            range(start, self.steps_per_epoch),
            self.prefetch_size,
        )


def _image_split(images: object, labels: object) -> tuple[np.ndarray, np.ndarray]:
    """``(images, int32 labels)`` of an image split; ``ValueError`` naming the argument unless the
    images are a uint8 ``(N, H, W, C)`` array (:func:`standardize` divides by 255: float images in
    ``[0, 1]`` would be divided again, silently) and the labels ``N`` integers."""
    images, labels = np.asarray(images), np.asarray(labels)
    if images.ndim != 4 or images.dtype != np.uint8:
        raise ValueError(
            "images must be a uint8 (N, height, width, channels) array of values in [0, 255], got "
            f"{images.dtype} of shape {images.shape}; for float images in [0, 1] pass "
            "np.round(images * 255).astype(np.uint8), or use ArraySource, which does not standardise"
        )
    if labels.shape != images.shape[:1] or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(
            f"labels must be {images.shape[0]} integers (one per image), got {labels.dtype} of shape "
            f"{labels.shape}"
        )
    return images, labels.astype(np.int32, copy=False)


def _channel_statistic(name: str, value: object, channels: int, *, positive: bool) -> np.ndarray:
    """``value`` as float32 ``(channels,)``; ``ValueError`` naming it unless it is ``channels`` finite
    numbers or one for every channel (``> 0`` where ``positive``: a zero ``std`` made every pixel Inf
    or NaN)."""
    array = np.asarray(value)
    array = np.broadcast_to(array, (channels,)) if array.ndim == 0 else array
    low = " > 0" if positive else ""
    if (
        array.shape != (channels,)
        or not np.issubdtype(array.dtype, np.number)
        or np.issubdtype(array.dtype, np.complexfloating)
        or not np.all(np.isfinite(array))
        or (positive and not np.all(array > 0))
    ):
        raise ValueError(
            f"{name} must be {channels} finite number(s){low}, one per channel, got {value!r}"
        )
    return array.astype(np.float32)


class ArrayDataset(ArraySource):
    """A uint8 image split held in memory (MNIST, Fashion-MNIST, CIFAR), as :func:`jaxnorm.data.load`
    returns it: an :class:`ArraySource` over ``{"image", "label"}`` whose transform applies the
    augmentation (training) or evaluation crop, then standardises with ``mean`` / ``std``.
    ``augment="colour_crop_flip"`` needs RGB images: other channel counts raise ``ValueError`` here,
    for evaluation too (the augmentation does not apply to such a dataset)."""

    def __init__(
        self,
        images: np.ndarray,
        labels: np.ndarray,
        *,
        mean: tuple[float, ...],
        std: tuple[float, ...],
        batch_size: int,
        train: bool,
        seed: int,
        augment: str,
        drop_remainder: bool,
        process_index: int,
        process_count: int,
        prefetch_size: int = 2,
    ) -> None:
        images, labels = _image_split(images, labels)
        augment_lib.check_channels(augment, images.shape[-1])
        self.images, self.labels = images, labels
        self.mean = _channel_statistic("mean", mean, images.shape[-1], positive=False)
        self.std = _channel_statistic("std", std, images.shape[-1], positive=True)
        self.train, self.augment = train, augment
        super().__init__(
            {"image": images, "label": labels},
            batch_size,
            shuffle=train,
            drop_remainder=drop_remainder,
            seed=seed,
            process_index=process_index,
            process_count=process_count,
            transform=self._augment_and_standardize,
            prefetch_size=prefetch_size,
        )

    def _augment_and_standardize(self, batch: Batch, rng: np.random.Generator) -> Batch:
        images = augment_lib.apply(self.augment, batch["image"], rng, train=self.train)
        return {"image": standardize(images, self.mean, self.std), "label": batch["label"]}
