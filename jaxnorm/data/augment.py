"""NumPy augmentations of uint8 NHWC batches, one random draw per example from a given Generator."""

from __future__ import annotations

import numpy as np


def random_crop(images: np.ndarray, rng: np.random.Generator, *, size: int,
                padding: int) -> np.ndarray:
    """Zero-pad by ``padding`` pixels on each side, then take a random ``size x size`` crop.

    Each example gets its own offset, uniform over the ``H + 2 padding - size + 1`` positions per
    axis (torchvision's ``RandomCrop(size, padding)``; He et al. 2016, Sec. 4.2, with size 32 and
    padding 4).

    Args:
      images: ``(B, H, W, C)``.
      rng: the source of the offsets.
      size: crop height and width (at most ``min(H, W) + 2 padding``).
      padding: zero border added first.
    """
    b, h, w, _ = images.shape
    if not 0 < size <= min(h, w) + 2 * padding:
        raise ValueError(
            f"size must lie in [1, {min(h, w) + 2 * padding}] for {h}x{w} images with "
            f"padding={padding}, got {size}")
    padded = np.pad(images, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
    top = rng.integers(0, h + 2 * padding - size + 1, size=b)
    left = rng.integers(0, w + 2 * padding - size + 1, size=b)
    # A strided view of every window, (B, H', W', C, size, size): one gather picks each crop.
    windows = np.lib.stride_tricks.sliding_window_view(padded, (size, size), axis=(1, 2))
    return np.moveaxis(windows[np.arange(b), top, left], 1, -1)


def random_flip(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Mirror each example horizontally with probability 1/2."""
    flip = rng.random(images.shape[0]) < 0.5
    out = images.copy()
    out[flip] = images[flip, :, ::-1]
    return out


def center_crop(images: np.ndarray, size: int) -> np.ndarray:
    """The central ``size x size`` window (offsets rounded down, as torchvision's ``CenterCrop``)."""
    _, h, w, _ = images.shape
    if not 0 < size <= min(h, w):
        raise ValueError(f"size must lie in [1, {min(h, w)}] for {h}x{w} images, got {size}")
    top, left = (h - size) // 2, (w - size) // 2
    return images[:, top:top + size, left:left + size]


def apply(name: str, images: np.ndarray, rng: np.random.Generator, *, train: bool) -> np.ndarray:
    """Augmentation ``name`` (see :data:`jaxnorm.data.catalog.AUGMENTATIONS`) of a uint8 batch.

    ``crop_flip``: random crop of the 4-pixel-padded image at the original size, then a flip
    (training only). ``cifar_nv_crop``: random ``(H - 4)``-pixel crops of the 2-pixel-padded
    image and a flip for training, the central crop of that size for evaluation: 28 x 28 on CIFAR
    (Stock et al. 2019, Sec. 6.2). ``none``: the images as they are.
    """
    h = images.shape[1]
    if name == "crop_flip":
        return random_flip(random_crop(images, rng, size=h, padding=4), rng) if train else images
    if name == "cifar_nv_crop":
        if not train:
            return center_crop(images, h - 4)
        return random_flip(random_crop(images, rng, size=h - 4, padding=2), rng)
    if name == "none":
        return images
    raise ValueError(
        f"augment must be one of ['cifar_nv_crop', 'crop_flip', 'none'] for in-memory datasets, "
        f"got {name!r}")
