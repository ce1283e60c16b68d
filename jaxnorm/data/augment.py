"""NumPy augmentations of uint8 NHWC batches, one random draw per example from a given Generator."""

from __future__ import annotations

import concurrent.futures
import functools
import os

import numpy as np

from jaxnorm.data.base import check_int


def _images(images: np.ndarray) -> tuple[int, int, int]:
    """``(B, H, W)`` of an NHWC batch; ``ValueError`` naming ``images`` for another rank."""
    shape = np.shape(images)
    if len(shape) != 4:
        raise ValueError(f"images must be a (batch, height, width, channels) array, got shape {shape}")
    return shape[0], shape[1], shape[2]


def _crop_size(size: object, limits: tuple[int, int], context: str) -> tuple[int, int]:
    """``(height, width)`` of a crop given as one integer (a square) or a pair, each in ``[1, limit]``;
    ``ValueError`` naming ``size``, the limits and ``context`` (the images and padding) otherwise."""
    pair = tuple(size) if isinstance(size, tuple | list) else (size, size)
    try:
        if len(pair) != 2:
            raise ValueError
        return tuple(check_int("size", n, low=1, high=limit) for n, limit in zip(pair, limits, strict=True))
    except ValueError:
        raise ValueError(
            f"size must be an integer or a (height, width) pair of integers in [1, {limits[0]}] x "
            f"[1, {limits[1]}] for {context}, got {size!r}"
        ) from None


def random_crop(
    images: np.ndarray, rng: np.random.Generator, *, size: int | tuple[int, int], padding: int
) -> np.ndarray:
    """Zero-pad by ``padding`` pixels on each side, then take a random ``size`` crop.

    Each example gets its own offset, uniform over the ``H + 2 padding - height + 1`` positions
    (and likewise along the width; torchvision's ``RandomCrop(size, padding)``; He et al. 2016,
    Sec. 4.2, with size 32 and padding 4).

    Args:
      images: ``(B, H, W, C)``.
      rng: the source of the offsets.
      size: the crop's ``(height, width)``, each in ``[1, H + 2 padding]`` / ``[1, W + 2 padding]``;
        one integer is a square crop.
      padding: zero border added first, an integer >= 0.
    """
    b, h, w = _images(images)
    padding = check_int("padding", padding)
    height, width = _crop_size(
        size, (h + 2 * padding, w + 2 * padding), f"{h}x{w} images with padding={padding}"
    )
    padded = np.pad(images, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
    top = rng.integers(0, h + 2 * padding - height + 1, size=b)
    left = rng.integers(0, w + 2 * padding - width + 1, size=b)
    # A strided view of every window, (B, H', W', C, height, width): one gather picks each crop.
    windows = np.lib.stride_tricks.sliding_window_view(padded, (height, width), axis=(1, 2))
    return np.moveaxis(windows[np.arange(b), top, left], 1, -1)


def random_flip(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Mirror each example horizontally with probability 1/2."""
    _images(images)
    flip = rng.random(images.shape[0]) < 0.5
    out = images.copy()
    out[flip] = images[flip, :, ::-1]
    return out


def center_crop(images: np.ndarray, size: int | tuple[int, int]) -> np.ndarray:
    """The central ``size`` window, ``(height, width)`` or one integer for a square (offsets rounded
    down, as torchvision's ``CenterCrop``)."""
    _, h, w = _images(images)
    height, width = _crop_size(size, (h, w), f"{h}x{w} images")
    top, left = (h - height) // 2, (w - width) // 2
    return images[:, top : top + height, left : left + width]


COLOUR_JITTER = {"brightness": 32.0 / 255.0, "saturation": (0.5, 1.5), "hue": 0.2, "contrast": (0.5, 1.5)}
"""Ranges of :func:`random_colour`: TensorFlow's Inception ``distort_color`` (ordering 0), whose
``tf.image.random_*`` calls Liu et al. name without values (Supp. B.2)."""

COLOUR_AUGMENTATIONS = ("colour_crop_flip",)
"""Augmentations that jitter saturation and hue, which exist for RGB images only (TensorFlow's
``adjust_saturation`` / ``adjust_hue`` likewise require 3 channels)."""


def check_channels(augment: str, channels: int) -> None:
    """``ValueError`` naming ``augment`` if it jitters colour (:data:`COLOUR_AUGMENTATIONS`) and the
    images do not have 3 (RGB) channels: called where a dataset is made, before any batch."""
    if augment in COLOUR_AUGMENTATIONS and channels != 3:
        raise ValueError(
            f"augment={augment!r} needs RGB images (3 channels): its saturation and hue jitter is "
            f"defined on RGB only; got images with {channels} channel(s) (use 'crop_flip' or 'none')"
        )


def rgb_to_hsv(rgb: np.ndarray) -> np.ndarray:
    """HSV of RGB values (last axis), hue in ``[0, 1)``: ``tf.image.rgb_to_hsv``'s formula.

    Values outside ``[0, 1]`` (between the steps of :func:`random_colour`) follow TF too: value is the
    largest channel, saturation ``chroma / value`` (above 1 where a channel is negative), 0 where
    ``value <= 0``."""
    r, g, b = np.moveaxis(rgb, -1, 0)
    value = rgb.max(axis=-1)
    chroma = value - rgb.min(axis=-1)
    safe = np.where(chroma > 0, chroma, 1.0)
    hue = np.where(
        value == r, (g - b) / safe, np.where(value == g, 2.0 + (b - r) / safe, 4.0 + (r - g) / safe)
    )
    hue = np.where(chroma > 0, (hue / 6.0) % 1.0, 0.0)
    saturation = np.where(value > 0, chroma / np.where(value > 0, value, 1.0), 0.0)
    return np.stack([hue, saturation, value], axis=-1)


def hsv_to_rgb(hsv: np.ndarray) -> np.ndarray:
    """Inverse of :func:`rgb_to_hsv`: channel ``n`` (5, 3, 1 for R, G, B) is
    ``v - v s clip(min(k, 4 - k), 0, 1)`` with ``k = (n + 6 h) mod 6``."""
    h, s, v = np.moveaxis(hsv, -1, 0)
    k = (np.array([5.0, 3.0, 1.0]).reshape((3,) + (1,) * h.ndim) + 6.0 * h) % 6.0
    return np.stack(list(v - v * s * np.clip(np.minimum(k, 4.0 - k), 0.0, 1.0)), axis=-1)


def random_colour(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Random brightness, saturation, hue and contrast, in that order, each example its own draw.

    With ``x`` in ``[0, 1]`` (:data:`COLOUR_JITTER` gives the ranges; draws in the order
    ``delta_b``, ``f_s``, ``delta_h``, ``f_c``, one per example each): ``x + delta_b``; saturation
    times ``f_s`` (clipped to ``[0, 1]``) and hue plus ``delta_h`` (mod 1) in HSV;
    ``(x - mean) f_c + mean`` per channel (``mean`` over the image); clipped to ``[0, 1]`` only at
    the end and rounded back to uint8. This is TensorFlow's Inception ``distort_color`` (ordering 0)
    with ``tf.image.adjust_brightness / adjust_saturation / adjust_hue / adjust_contrast``: the
    values between the steps are not clipped, so a brightened pixel may exceed 1 (HSV value > 1)
    and a darkened one go below 0 (saturation ``chroma / value``, clipped to 1 like TF's; grey
    where ``value <= 0``). One HSV round trip does saturation and hue together (TF makes two; the
    round trip is exact for the values the saturation step leaves). The arithmetic is float64 (the
    factors' dtype) where TF's is float32: the two differ by far less than half a uint8 level, so the
    results agree except where a value lands on a rounding boundary (then by one level). The four
    draws are taken first; the examples then run in tasks of :data:`COLOUR_CHUNK` on up to 4 threads
    (the same result as one task).

    Args:
      images: uint8 ``(B, H, W, 3)``: RGB only.
      rng: the source of the four factors.
    """
    if images.ndim != 4 or images.shape[-1] != 3:
        raise ValueError(f"images must be RGB, of shape (B, H, W, 3), got shape {images.shape}")
    b = images.shape[0]
    # the four draws in TF's order, each one per example: the same values whichever examples share a task
    factors = np.stack([
        rng.uniform(-COLOUR_JITTER["brightness"], COLOUR_JITTER["brightness"], b),
        rng.uniform(*COLOUR_JITTER["saturation"], b),
        rng.uniform(-COLOUR_JITTER["hue"], COLOUR_JITTER["hue"], b),
        rng.uniform(*COLOUR_JITTER["contrast"], b),
    ], axis=1)
    out = np.empty_like(images)

    def jitter(start: int) -> None:
        stop = start + COLOUR_CHUNK
        out[start:stop] = _jitter(images[start:stop], factors[start:stop])

    starts = range(0, b, COLOUR_CHUNK)
    if len(starts) > 1:
        list(_colour_pool().map(jitter, starts))
    else:
        jitter(0)
    return out


COLOUR_CHUNK = 16
"""Examples per task of :func:`random_colour`'s thread pool (NumPy releases the GIL in its array loops,
so the tasks run in parallel; each example's result is the same whatever its task)."""


@functools.cache
def _colour_pool() -> concurrent.futures.ThreadPoolExecutor:
    """The threads of :func:`random_colour`: at most 4, at most the usable cores."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(4, cores)),
                                                 thread_name_prefix="jaxnorm-colour")


def _jitter(images: np.ndarray, factors: np.ndarray) -> np.ndarray:
    """:func:`random_colour` of ``images`` with the per-example ``(delta_b, f_s, delta_h, f_c)`` rows of
    ``factors``."""
    per_example = (len(images), 1, 1, 1)
    x = images.astype(np.float32) / 255.0
    x = x + factors[:, 0].reshape(per_example)
    hsv = rgb_to_hsv(x)
    hsv[..., 1] = np.clip(hsv[..., 1] * factors[:, 1, None, None], 0.0, 1.0)
    hsv[..., 0] = (hsv[..., 0] + factors[:, 2, None, None]) % 1.0
    x = hsv_to_rgb(hsv)
    mean = x.mean(axis=(1, 2), keepdims=True)
    x = (x - mean) * factors[:, 3].reshape(per_example) + mean
    return np.round(np.clip(x, 0.0, 1.0) * 255.0).astype(np.uint8)


def apply(name: str, images: np.ndarray, rng: np.random.Generator, *, train: bool) -> np.ndarray:
    """Augmentation ``name`` (see :data:`jaxnorm.data.catalog.AUGMENTATIONS`) of a uint8 batch.

    ``crop_flip``: random crop of the 4-pixel-padded image at the original height and width, then a
    flip (training only). ``cifar_nv_crop``: random ``(H - 4) x (W - 4)`` crops of the 2-pixel-padded
    image and a flip for training, the central crop of that size for evaluation: 28 x 28 on CIFAR
    (Stock et al. 2019, Sec. 6.2). ``colour_crop_flip``: Liu et al.'s CIFAR recipe (Supp. B.2):
    :func:`random_colour`, a random crop of the image zero-padded to ``H + 6`` (32 -> 38), a flip
    (training only). ``none``: the images as they are.
    """
    _, h, w = _images(images)
    if name == "crop_flip":
        return random_flip(random_crop(images, rng, size=(h, w), padding=4), rng) if train else images
    if name == "colour_crop_flip":
        if not train:
            return images
        return random_flip(random_crop(random_colour(images, rng), rng, size=(h, w), padding=3), rng)
    if name == "cifar_nv_crop":
        if min(h, w) <= 4:
            raise ValueError(
                f"augment='cifar_nv_crop' crops 4 pixels off images larger than 4x4, got {h}x{w}"
            )
        if not train:
            return center_crop(images, (h - 4, w - 4))
        return random_flip(random_crop(images, rng, size=(h - 4, w - 4), padding=2), rng)
    if name == "none":
        return images
    raise ValueError(
        f"augment must be one of ['cifar_nv_crop', 'colour_crop_flip', 'crop_flip', 'none'] for "
        f"in-memory datasets, "
        f"got {name!r}"
    )
