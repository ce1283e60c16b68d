"""Offline Fashion-MNIST: prepare TFDS's ``fashion_mnist`` from the Debian package's files.

Debian's ``dataset-fashion-mnist`` package installs the original IDX files (Xiao et al. 2017)
at ``/usr/share/datasets/fashion-mnist``, recompressed: the images and labels are the same
bytes once decompressed, but the ``.gz`` files differ from the ones TFDS registered, so TFDS's
own checksums reject them. :func:`prepare_fashion_mnist` runs TFDS's ``fashion_mnist`` builder
with ``DownloadConfig(manual_dir=source_dir)`` and this module's recorded checksums of the
Debian files (:data:`DEBIAN_CHECKSUMS`), through a subclass of the builder: the installed TFDS is
never modified, and the prepared dataset is the ordinary ``fashion_mnist`` that
``tfds.builder("fashion_mnist", data_dir=...)`` reads.
"""

from __future__ import annotations

import fcntl
import functools
import os
import tempfile
import urllib.parse
from pathlib import Path

from jaxnorm.data.paths import DatasetNotFoundError, resolve_data_dir

DEFAULT_SOURCE_DIR = "/usr/share/datasets/fashion-mnist"
APT_PACKAGE = "dataset-fashion-mnist"

DEBIAN_CHECKSUMS: dict[str, tuple[int, str]] = {
    # file name: (size in bytes, sha256), recorded from dataset-fashion-mnist
    # 0.0~git20200523.55506a9-1 (Debian); decompressed, the same IDX data as the upstream files.
    "train-images-idx3-ubyte.gz": (
        26421856, "b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7"),
    "train-labels-idx1-ubyte.gz": (
        29491, "0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056"),
    "t10k-images-idx3-ubyte.gz": (
        4422079, "cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa"),
    "t10k-labels-idx1-ubyte.gz": (
        5125, "8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05"),
}


@functools.cache
def _builder_class():
    """TFDS's ``FashionMNIST`` builder with the Debian files' checksums (not registered)."""
    import tensorflow_datasets as tfds
    from tensorflow_datasets.image_classification.mnist import FashionMNIST

    url_infos = {
        urllib.parse.urljoin(FashionMNIST.URL, filename): tfds.download.checksums.UrlInfo(
            size=size, checksum=checksum, filename=filename)
        for filename, (size, checksum) in DEBIAN_CHECKSUMS.items()
    }

    class DebianFashionMNIST(FashionMNIST, skip_registration=True):
        """Writes the ordinary ``fashion_mnist``; only the expected checksums differ."""

        name = "fashion_mnist"

    # Shadows TFDS's class property that reads the registered checksums file.
    DebianFashionMNIST.url_infos = url_infos
    return DebianFashionMNIST


def is_prepared(data_dir: str | os.PathLike | None = None) -> bool:
    """Whether TFDS's ``fashion_mnist`` is prepared in ``data_dir``."""
    import tensorflow_datasets as tfds

    builder = tfds.builder("fashion_mnist", data_dir=str(resolve_data_dir(data_dir)))
    return builder.is_prepared()


def prepare_fashion_mnist(
    data_dir: str | os.PathLike | None = None, source_dir: str | os.PathLike = DEFAULT_SOURCE_DIR,
) -> Path:
    """Prepare TFDS's ``fashion_mnist`` in ``data_dir`` from the IDX files in ``source_dir``.

    Nothing is downloaded. Idempotent: a prepared dataset is left as it is.

    Args:
      data_dir: TFDS data directory (default ``$JAXNORM_DATA_DIR`` or ``~/tensorflow_datasets``).
      source_dir: directory holding the four ``*-ubyte.gz`` files of the Debian package
        ``dataset-fashion-mnist``.

    Returns:
      The data directory.

    Raises:
      DatasetNotFoundError: ``source_dir`` lacks the files (install the apt package).
      tfds NonMatchingChecksumError: the files are not the recorded Debian ones.
    """
    import tensorflow_datasets as tfds

    data_dir = resolve_data_dir(data_dir)
    source = Path(source_dir)
    missing = [f for f in DEBIAN_CHECKSUMS if not (source / f).is_file()]
    if missing:
        raise DatasetNotFoundError(
            f"fashion_mnist is not prepared in {data_dir} and source_dir={str(source)!r} lacks "
            f"{missing}: install the Debian package ({'apt-get install ' + APT_PACKAGE}), or "
            f"let TFDS download it (tfds.builder('fashion_mnist', data_dir=...)"
            ".download_and_prepare()) where the internet is reachable")
    data_dir.mkdir(parents=True, exist_ok=True)
    # Processes of one multi-host run on a machine may all call this: one prepares, the others
    # wait for it and then find the dataset prepared.
    with open(data_dir / ".fashion_mnist.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        builder = _builder_class()(data_dir=str(data_dir))
        if not builder.is_prepared():
            config = tfds.download.DownloadConfig(manual_dir=str(source))
            # Extracted copies go to a scratch directory, not next to the dataset.
            with tempfile.TemporaryDirectory(prefix="jaxnorm_fashion_mnist_") as scratch:
                builder.download_and_prepare(download_dir=scratch, download_config=config)
    return data_dir
