"""Offline CIFAR-10 from a JPEG copy: prepare the TFDS dataset ``cifar10_jpeg`` from an archive.

The archive (``cifar10-jpeg.tar.gz``) holds the 60,000 CIFAR-10 images (Krizhevsky 2009) re-encoded as
JPEG quality 75 by a public copy of the data set, laid out as
``cifar10-jpeg/{train,test}/<class name>/NNNN.jpg`` (5,000 train and 1,000 test images per class; the
class names in sorted order are CIFAR-10's label indices 0-9). JPEG at q75 is lossy, so the pixels are
not the original binary release's: the dataset gets its own name, ``cifar10_jpeg``, and is never
presented as ``cifar10``. Report results on it as "CIFAR-10 (JPEG q75 copy)".

:func:`prepare_cifar10_jpeg` writes an ordinary prepared TFDS dataset (TFRecord shards, the JPEG bytes
stored as they are in the archive, no re-encoding) that ``tfds.builder("cifar10_jpeg", data_dir=...)``
reads back without this module (TFDS loads unregistered datasets from their files).
"""

from __future__ import annotations

import fcntl
import functools
import os
import tarfile
import tempfile
from pathlib import Path

from jaxnorm.data.paths import DatasetNotFoundError, resolve_data_dir

NAME = "cifar10_jpeg"
ARCHIVE_ENV = "JAXNORM_CIFAR10_JPEG"
"""Environment variable naming the archive; :func:`jaxnorm.data.load` prepares the dataset from it
when ``cifar10_jpeg`` is not prepared yet."""

CLASS_NAMES: tuple[str, ...] = (
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
"""CIFAR-10's classes in label order (0-9), which is also their sorted order."""

SPLIT_SIZES = {"train": 50_000, "test": 10_000}


def _members(archive: Path, split: str):
    """``(key, class index, JPEG bytes)`` of every image of ``split`` in the archive, in archive order."""
    with tarfile.open(archive, "r:*") as tar:
        for member in tar:
            parts = Path(member.name).parts
            if not member.isfile() or len(parts) < 3 or parts[-3] != split:
                continue
            class_name, file_name = parts[-2], parts[-1]
            if class_name not in CLASS_NAMES or not file_name.lower().endswith((".jpg", ".jpeg")):
                continue
            yield f"{class_name}/{file_name}", CLASS_NAMES.index(class_name), tar.extractfile(member).read()


@functools.cache
def _builder_class():
    """A TFDS builder writing ``cifar10_jpeg`` from the archive in ``manual_dir`` (not registered)."""
    import io

    import tensorflow_datasets as tfds

    class Cifar10Jpeg(tfds.core.GeneratorBasedBuilder, skip_registration=True):
        """CIFAR-10 (JPEG q75 copy): 32x32 RGB, 10 classes, train 50,000 / test 10,000."""

        name = NAME
        VERSION = tfds.core.Version("1.0.0")
        MANUAL_DOWNLOAD_INSTRUCTIONS = "Put cifar10-jpeg.tar.gz in the manual directory."

        def _info(self):
            return self.dataset_info_from_configs(
                description=__doc__.split("\n\n")[0],
                features=tfds.features.FeaturesDict({
                    "image": tfds.features.Image(shape=(32, 32, 3), encoding_format="jpeg"),
                    "label": tfds.features.ClassLabel(names=list(CLASS_NAMES)),
                    "id": tfds.features.Text(),
                }),
                supervised_keys=("image", "label"),
            )

        def _split_generators(self, dl_manager):
            archive = Path(dl_manager.manual_dir) / "cifar10-jpeg.tar.gz"
            return {split: self._generate_examples(archive, split) for split in SPLIT_SIZES}

        def _generate_examples(self, archive, split):
            for key, label, jpeg in _members(archive, split):
                # A file object: TFDS stores its bytes as the encoded image, without re-encoding.
                yield key, {"image": io.BytesIO(jpeg), "label": label, "id": key}

    # Shadows TFDS's class property, which resolves this module through importlib_resources (a package
    # this project does not need otherwise) to look for a checksums file next to it; there is none.
    Cifar10Jpeg.code_path = None
    return Cifar10Jpeg


def is_prepared(data_dir: str | os.PathLike | None = None) -> bool:
    """Whether ``cifar10_jpeg`` is prepared in ``data_dir`` (looks at files only)."""
    return any((resolve_data_dir(data_dir) / NAME).glob("**/dataset_info.json"))


def prepare_cifar10_jpeg(
    archive: str | os.PathLike | None = None, data_dir: str | os.PathLike | None = None,
) -> Path:
    """Prepare the TFDS dataset ``cifar10_jpeg`` in ``data_dir`` from the JPEG archive ``archive``.

    Nothing is downloaded. Idempotent: a prepared dataset is left as it is. Reads the archive as a
    stream (nothing is extracted to disk) and checks that every split has its 5,000 / 1,000 images per
    class before anything is written.

    Args:
      archive: path of ``cifar10-jpeg.tar.gz`` (default: ``$JAXNORM_CIFAR10_JPEG``).
      data_dir: TFDS data directory (default ``$JAXNORM_DATA_DIR`` or ``~/tensorflow_datasets``).

    Returns:
      The data directory.

    Raises:
      DatasetNotFoundError: no archive given and ``$JAXNORM_CIFAR10_JPEG`` unset, or no file there.
      ValueError: the archive does not have CIFAR-10's layout and image counts.
    """
    import tensorflow_datasets as tfds

    data_dir = resolve_data_dir(data_dir)
    if archive is None:
        archive = os.environ.get(ARCHIVE_ENV)
        if not archive:
            raise DatasetNotFoundError(
                f"archive must name cifar10-jpeg.tar.gz (or set ${ARCHIVE_ENV}), got None")
    archive = Path(archive).expanduser()
    if not archive.is_file():
        raise DatasetNotFoundError(f"archive={str(archive)!r} is not a file")
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / f".{NAME}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_prepared(data_dir):
            return data_dir
        _check_layout(archive)
        # The builder reads the archive from a manual directory: a scratch one holding a link to it,
        # with TFDS's download scratch beside it, so nothing but the dataset lands in data_dir.
        with tempfile.TemporaryDirectory(prefix="jaxnorm_cifar10_jpeg_") as scratch:
            manual_dir = Path(scratch) / "manual"
            manual_dir.mkdir()
            (manual_dir / "cifar10-jpeg.tar.gz").symlink_to(archive.resolve())
            _builder_class()(data_dir=str(data_dir)).download_and_prepare(
                download_dir=str(Path(scratch) / "downloads"),
                download_config=tfds.download.DownloadConfig(manual_dir=str(manual_dir)))
    return data_dir


def _check_layout(archive: Path) -> None:
    """``ValueError`` unless the archive holds 5,000 train and 1,000 test JPEGs of each class."""
    counts: dict[tuple[str, str], int] = {}
    with tarfile.open(archive, "r:*") as tar:
        for member in tar:
            parts = Path(member.name).parts
            if member.isfile() and len(parts) >= 3 and parts[-3] in SPLIT_SIZES:
                key = (parts[-3], parts[-2])
                counts[key] = counts.get(key, 0) + 1
    expected = {(s, c): n // len(CLASS_NAMES) for s, n in SPLIT_SIZES.items() for c in CLASS_NAMES}
    if counts != expected:
        wrong = sorted(k for k in expected.keys() | counts.keys() if counts.get(k) != expected.get(k))
        raise ValueError(
            f"archive={str(archive)!r} is not the CIFAR-10 JPEG copy: expected "
            f"{{train,test}}/<class>/*.jpg with 5000 / 1000 images per class; differing: "
            + ", ".join(f"{s}/{c}: {counts.get((s, c), 0)}" for s, c in wrong[:5]))
