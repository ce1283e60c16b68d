"""Datasets through ``tensorflow_datasets``: ``jaxnorm.data.load(name, split, ...)``.

Offline Fashion-MNIST: :func:`prepare_fashion_mnist` builds TFDS's ``fashion_mnist`` from the
Debian package ``dataset-fashion-mnist``; :func:`load` calls it when needed. Offline CIFAR-10 (JPEG q75
copy): :func:`prepare_cifar10_jpeg` builds the dataset ``cifar10_jpeg`` from its archive. :class:`ArraySource`
serves any in-memory arrays the same way (the training loop's ``jaxnorm.train.ArraySource``).
"""

from jaxnorm.data.arrays import ArrayDataset, ArraySource, standardize
from jaxnorm.data.augment import center_crop, random_crop, random_flip
from jaxnorm.data.base import Dataset
from jaxnorm.data.catalog import AUGMENTATIONS, DatasetInfo, info, names, resolve_augment
from jaxnorm.data.cifar10_jpeg import prepare_cifar10_jpeg
from jaxnorm.data.fashion_mnist import prepare_fashion_mnist
from jaxnorm.data.paths import DATA_DIR_ENV, DatasetNotFoundError, resolve_data_dir
from jaxnorm.data.pipeline import load, splits_overlap
from jaxnorm.data.tfds_io import check_prepared

__all__ = [
    "AUGMENTATIONS",
    "DATA_DIR_ENV",
    "ArrayDataset",
    "ArraySource",
    "Dataset",
    "DatasetInfo",
    "DatasetNotFoundError",
    "center_crop",
    "check_prepared",
    "info",
    "load",
    "names",
    "prepare_cifar10_jpeg",
    "prepare_fashion_mnist",
    "random_crop",
    "random_flip",
    "resolve_augment",
    "resolve_data_dir",
    "splits_overlap",
    "standardize",
]
