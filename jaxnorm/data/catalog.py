"""What jaxnorm knows about each dataset: classes, shapes, splits, per-channel statistics."""

from __future__ import annotations

from typing import NamedTuple

from jaxnorm.data.augment import check_channels
from jaxnorm.data.paths import DatasetNotFoundError


class DatasetInfo(NamedTuple):
    """Facts about a dataset (as stored by TFDS, before augmentation).

    Attributes:
      num_classes: label count.
      image_shape: ``(height, width, channels)`` of the stored images (ImageNet: the model input
        size, 224 x 224 x 3, since its images vary in size).
      train_split: the split to train on.
      eval_split: the split the papers report (the test set; ImageNet: its validation set).
      num_train_examples: examples in ``train_split``.
      num_eval_examples: examples in ``eval_split``.
    """

    num_classes: int
    image_shape: tuple[int, int, int]
    train_split: str
    eval_split: str
    num_train_examples: int
    num_eval_examples: int


class _Spec(NamedTuple):
    info: DatasetInfo
    mean: tuple[float, ...]  # per channel, on the [0, 1] scale, over the full train split
    std: tuple[float, ...]
    num_validation: int  # examples carved from the end of train for split="validation"
    default_augment: str  # augmentation of train batches when augment=None
    how_to_get: str


_SPECS: dict[str, _Spec] = {
    "fashion_mnist": _Spec(
        DatasetInfo(10, (28, 28, 1), "train", "test", 60_000, 10_000),
        (0.2860,), (0.3530,), 10_000, "none",
        "offline: `apt-get install dataset-fashion-mnist`, then "
        "jaxnorm.data.prepare_fashion_mnist() (load() calls it when the files are there); "
        "online: tfds.builder('fashion_mnist').download_and_prepare()"),
    "mnist": _Spec(
        DatasetInfo(10, (28, 28, 1), "train", "test", 60_000, 10_000),
        (0.1307,), (0.3081,), 10_000, "none",
        "tfds.builder('mnist', data_dir=...).download_and_prepare() (downloads 11 MB from "
        "storage.googleapis.com/cvdf-datasets/mnist)"),
    "cifar10": _Spec(
        DatasetInfo(10, (32, 32, 3), "train", "test", 50_000, 10_000),
        (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616), 10_000, "crop_flip",
        "tfds.builder('cifar10', data_dir=...).download_and_prepare() (downloads 163 MB from "
        "www.cs.toronto.edu/~kriz)"),
    "cifar10_jpeg": _Spec(
        DatasetInfo(10, (32, 32, 3), "train", "test", 50_000, 10_000),
        (0.4868, 0.4822, 0.4414), (0.2451, 0.2425, 0.2605), 10_000, "crop_flip",
        "offline: jaxnorm.data.prepare_cifar10_jpeg('<path>/cifar10-jpeg.tar.gz', data_dir) (or set "
        "$JAXNORM_CIFAR10_JPEG to the archive and load() prepares it); this is CIFAR-10 re-encoded as "
        "JPEG q75, not the original 'cifar10'"),
    "cifar100": _Spec(
        DatasetInfo(100, (32, 32, 3), "train", "test", 50_000, 10_000),
        (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762), 10_000, "crop_flip",
        "tfds.builder('cifar100', data_dir=...).download_and_prepare() (downloads 161 MB from "
        "www.cs.toronto.edu/~kriz)"),
    "imagenet2012": _Spec(
        DatasetInfo(1000, (224, 224, 3), "train", "validation", 1_281_167, 50_000),
        (0.485, 0.456, 0.406), (0.229, 0.224, 0.225), 0, "inception_crop_flip",
        "manual download: put ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar (from "
        "image-net.org) in <data_dir>/downloads/manual, then "
        "tfds.builder('imagenet2012', data_dir=...).download_and_prepare()"),
}

AUGMENTATIONS: tuple[str, ...] = (
    "none", "crop_flip", "cifar_nv_crop", "colour_crop_flip", "inception_crop_flip")
"""Augmentation names: ``crop_flip`` = random crop of the padded image (4 pixels) + horizontal
flip (He et al. 2016, Sec. 4.2); ``cifar_nv_crop`` = random 28 x 28 crops of the 2-pixel-padded
image + flip, center 28 x 28 crops for evaluation (Stock et al. 2019, Sec. 6.2);
``colour_crop_flip`` = random brightness / saturation / hue / contrast, a crop of the 3-pixel-padded
image (38 x 38 on CIFAR) + flip (Liu et al., Supp. B.2);
``inception_crop_flip`` = ImageNet random-resized crops + flip (Szegedy et al. 2015)."""


def resolve_augment(name: str, augment: str | None) -> str:
    """The augmentation dataset ``name`` uses for ``augment`` (``None``: its default); ``ValueError``
    for an unknown one or one that does not apply to this dataset (``inception_crop_flip`` off
    ImageNet, ``colour_crop_flip`` on the 1-channel (Fashion-)MNIST)."""
    augment = spec(name).default_augment if augment is None else augment
    if not isinstance(augment, str) or augment not in AUGMENTATIONS:
        raise ValueError(f"augment must be one of {sorted(AUGMENTATIONS)}, got {augment!r}")
    imagenet = name == "imagenet2012"
    if (augment == "inception_crop_flip") != imagenet and not (imagenet and augment == "none"):
        raise ValueError(
            f"augment={augment!r} does not apply to {name}: ImageNet uses "
            "'inception_crop_flip' (or 'none'), the others 'none', 'crop_flip', 'cifar_nv_crop', "
            "'colour_crop_flip'")
    check_channels(augment, spec(name).info.image_shape[-1])
    return augment


def names() -> tuple[str, ...]:
    """The dataset names :func:`jaxnorm.data.load` accepts."""
    return tuple(_SPECS)


def spec(name: str) -> _Spec:
    """Everything recorded about ``name``; ``ValueError`` listing the names if unknown."""
    if not isinstance(name, str) or name not in _SPECS:
        raise ValueError(f"name must be one of {sorted(_SPECS)}, got {name!r}")
    return _SPECS[name]


def info(name: str) -> DatasetInfo:
    """The :class:`DatasetInfo` of dataset ``name``."""
    return spec(name).info


def missing_error(name: str, data_dir: object) -> DatasetNotFoundError:
    """The error for a dataset that is not prepared in ``data_dir``: it says how to get it."""
    return DatasetNotFoundError(
        f"dataset {name!r} is not prepared in data_dir={str(data_dir)!r}; to get it: "
        f"{spec(name).how_to_get}. The data directory is the data_dir argument, else "
        "$JAXNORM_DATA_DIR, else ~/tensorflow_datasets.")
