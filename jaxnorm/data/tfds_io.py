"""Reading TFDS datasets: builders in a data directory, whole splits as NumPy arrays."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np

from jaxnorm.data import cifar10_jpeg, fashion_mnist
from jaxnorm.data.catalog import missing_error
from jaxnorm.data.paths import resolve_data_dir


@functools.cache
def tensorflow():
    """``tensorflow``, imported with every GPU hidden from it (JAX owns the accelerators)."""
    import tensorflow as tf

    try:
        tf.config.set_visible_devices([], "GPU")
    except RuntimeError:  # TF already initialised its devices elsewhere.
        pass
    return tf


def builder(name: str, data_dir: Path):
    """The prepared TFDS builder of ``name`` in ``data_dir``.

    ``fashion_mnist`` is prepared on the spot from the Debian package's files when they are
    installed (:func:`jaxnorm.data.prepare_fashion_mnist`), ``cifar10_jpeg`` from the archive that
    ``$JAXNORM_CIFAR10_JPEG`` names (:func:`jaxnorm.data.prepare_cifar10_jpeg`). Nothing is ever
    downloaded.
    """
    tensorflow()
    import tensorflow_datasets as tfds

    if name == cifar10_jpeg.NAME and not cifar10_jpeg.is_prepared(data_dir):
        if not _cifar10_jpeg_archive():
            raise missing_error(name, data_dir)  # TFDS has no builder of this name to say more
        cifar10_jpeg.prepare_cifar10_jpeg(_cifar10_jpeg_archive(), data_dir)
    ds_builder = tfds.builder(name, data_dir=str(data_dir))
    if (name == "fashion_mnist" and not ds_builder.is_prepared()
            and Path(fashion_mnist.DEFAULT_SOURCE_DIR).is_dir()):
        fashion_mnist.prepare_fashion_mnist(data_dir)
        ds_builder = tfds.builder(name, data_dir=str(data_dir))
    return ds_builder


def _cifar10_jpeg_archive() -> str | None:
    """The archive ``$JAXNORM_CIFAR10_JPEG`` names, if that file exists."""
    archive = os.environ.get(cifar10_jpeg.ARCHIVE_ENV)
    return archive if archive and Path(archive).expanduser().is_file() else None


def check_prepared(name: str, data_dir: str | os.PathLike | None = None) -> None:
    """Raises :class:`~jaxnorm.data.DatasetNotFoundError` (saying how to get it) unless ``name`` is
    prepared under ``data_dir`` (default: :func:`~jaxnorm.data.resolve_data_dir`'s) or, for
    ``fashion_mnist``, can be prepared offline. Looks at files only (no TensorFlow): runners call
    it before they load any data."""
    data_dir = resolve_data_dir(data_dir)
    if any((Path(data_dir) / name).glob("**/dataset_info.json")):
        return
    if name == "fashion_mnist" and Path(fashion_mnist.DEFAULT_SOURCE_DIR).is_dir():
        return
    if name == cifar10_jpeg.NAME and _cifar10_jpeg_archive():
        return
    raise missing_error(name, data_dir)


def as_dataset(ds_builder, split: str, **kwargs):
    """``ds_builder.as_dataset(split, ...)``, with the missing-dataset error that says what to do."""
    try:
        return ds_builder.as_dataset(split=split, **kwargs)
    except AssertionError as error:
        raise missing_error(ds_builder.name, ds_builder.data_dir) from error


def check_split(ds_builder, split: str) -> None:
    """``ValueError`` naming ``split`` where TFDS cannot read it (an unknown split or slice syntax) or
    it selects no examples (``test[5:3]``, ``test[:0]``), before TensorFlow reads anything: TensorFlow
    itself says "expected to contain -2 elements" or "Instruction [] corresponds to no data"."""
    if not ds_builder.info.splits:  # no recorded splits (tfds.testing.mock_data): TFDS reads as it can
        return
    try:
        count = ds_builder.info.splits[split].num_examples
    except (KeyError, ValueError) as error:
        raise ValueError(f"split={split!r} of {ds_builder.name}: {error}") from None
    if count <= 0:
        raise ValueError(f"split={split!r} of {ds_builder.name} selects no examples")


@functools.lru_cache(maxsize=8)
def read_arrays(name: str, split: str, data_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """Split ``split`` of ``name`` as read-only ``(uint8 images (N, H, W, C), int32 labels (N,))``,
    in TFDS's stored order. Cached: small datasets are read once per process."""
    import tensorflow_datasets as tfds

    tf = tensorflow()
    ds_builder = builder(name, data_dir)
    check_split(ds_builder, split)
    ds = as_dataset(ds_builder, split, shuffle_files=False)
    ds = ds.batch(8192).prefetch(tf.data.AUTOTUNE)
    chunks = list(tfds.as_numpy(ds))
    if not chunks:
        raise ValueError(f"split {split!r} of {name} is empty")
    images = np.concatenate([c["image"] for c in chunks]).astype(np.uint8, copy=False)
    labels = np.concatenate([c["label"] for c in chunks]).astype(np.int32, copy=False)
    images.setflags(write=False)
    labels.setflags(write=False)
    return images, labels
