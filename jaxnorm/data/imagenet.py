"""ImageNet (ILSVRC 2012) as a streaming ``tf.data`` pipeline: Inception crops, flips, prefetch."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from jaxnorm.data import tfds_io
from jaxnorm.data.base import Batch, Dataset, check_batch_size, check_int, check_processes

IMAGE_SIZE = 224
CROP_PADDING = 32  # evaluation: central crop of 224 / (224 + 32) of the shorter side


def _inception_crop(tf, encoded, seed):
    """Random-resized crop (Szegedy et al. 2015, Sec. 6): area in [8%, 100%] of the image, aspect
    ratio in [3/4, 4/3], decoded straight from the JPEG, resized to 224 x 224."""
    shape = tf.image.extract_jpeg_shape(encoded)
    box = tf.constant([0.0, 0.0, 1.0, 1.0], tf.float32, [1, 1, 4])
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape, bounding_boxes=box, seed=seed, min_object_covered=0.1,
        aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.08, 1.0), max_attempts=10,
        use_image_if_no_bounding_boxes=True)
    window = tf.stack([begin[0], begin[1], size[0], size[1]])
    image = tf.image.decode_and_crop_jpeg(encoded, window, channels=3)
    return tf.image.resize(image, (IMAGE_SIZE, IMAGE_SIZE), method="bicubic")


def _center_crop(tf, encoded):
    """The central ``224 / 256`` of the shorter side, resized to 224 x 224."""
    shape = tf.image.extract_jpeg_shape(encoded)
    h, w = shape[0], shape[1]
    side = tf.cast(
        IMAGE_SIZE / (IMAGE_SIZE + CROP_PADDING) * tf.cast(tf.minimum(h, w), tf.float32),
        tf.int32)
    window = tf.stack([(h - side + 1) // 2, (w - side + 1) // 2, side, side])
    image = tf.image.decode_and_crop_jpeg(encoded, window, channels=3)
    return tf.image.resize(image, (IMAGE_SIZE, IMAGE_SIZE), method="bicubic")


class ImageNetDataset(Dataset):
    """``imagenet2012`` read by ``tf.data``; process ``i`` of ``n`` reads its own ``1/n`` of the
    split (``tfds.even_splits``). Epoch ``e`` shuffles with seed ``(seed, e)`` and every example's
    crop and flip use stateless random ops seeded by ``(seed, e, position)``, so an epoch is a
    deterministic function of ``(seed, e)``.

    With ``drop_remainder`` the shares are equal (``N // n`` each, the rest dropped) and an epoch is
    ``share // batch_size`` steps. Without it (evaluation) every example is read by exactly one
    process: the first ``N mod n`` processes read one more, every process runs
    ``ceil(ceil(N / n) / batch_size)`` steps (the same count everywhere: they meet in collectives)
    and fills its last batches up with masked copies of its own examples."""

    def __init__(
        self, split: str, *, data_dir: Path, mean: tuple[float, ...], std: tuple[float, ...],
        batch_size: int, train: bool, seed: int, augment: str, drop_remainder: bool,
        process_index: int, process_count: int, prefetch_size: int = 2,
        shuffle_buffer: int = 16_384,
    ) -> None:
        super().__init__()
        import tensorflow_datasets as tfds

        process_index, process_count = check_processes(process_index, process_count)
        batch_size = check_batch_size("batch_size", batch_size, process_count)
        seed = check_int("seed", seed)
        prefetch_size = check_int("prefetch_size", prefetch_size)
        shuffle_buffer = check_int("shuffle_buffer", shuffle_buffer, low=1)
        self.tf = tfds_io.tensorflow()
        self.builder = tfds_io.builder("imagenet2012", data_dir)
        shares = tfds.even_splits(split, n=process_count, drop_remainder=drop_remainder)
        self.split = shares[process_index]
        self.mean = np.asarray(mean, np.float32) * 255
        self.std = np.asarray(std, np.float32) * 255
        self.train, self.seed, self.augment = train, seed, augment
        self.drop_remainder = drop_remainder
        self.prefetch_size, self.shuffle_buffer = prefetch_size, shuffle_buffer
        self.global_batch_size = batch_size
        self.batch_size = batch_size // process_count
        self.num_examples = self._count(split)
        if self.num_examples < process_count:  # a process without examples: TFDS cannot read its share
            raise ValueError(
                f"split={split!r} has {self.num_examples} examples, fewer than the {process_count} processes")
        self.local_examples = self._count(self.split)
        self.steps_per_epoch = self._steps_per_epoch(shares[0])
        self.image_shape = (IMAGE_SIZE, IMAGE_SIZE, 3)

    def _steps_per_epoch(self, largest_share: str) -> int:
        """``local_examples // batch_size`` with ``drop_remainder`` (equal shares), else
        ``ceil(examples of largest_share / batch_size)``, the same on every process (``even_splits``
        gives the remainder to the first processes: share 0 is the largest)."""
        if self.drop_remainder:
            steps = self.local_examples // self.batch_size
        else:
            steps = -(-self._count(largest_share) // self.batch_size)
        if steps == 0:
            raise ValueError(
                f"batch_size={self.global_batch_size} exceeds the {self.num_examples} examples of the split")
        return steps

    def _count(self, split: str) -> int:
        """Examples in ``split`` (the dataset's known cardinality)."""
        count = int(tfds_io.as_dataset(self.builder, split).cardinality())
        if count < 0:
            raise ValueError(f"imagenet2012 split {split!r} has an unknown size")
        return count

    def _dataset(self, epoch: int):
        tf = self.tf
        import tensorflow_datasets as tfds

        epoch_seed = [self.seed, epoch]
        read_config = tfds.ReadConfig(
            shuffle_seed=int(np.random.default_rng(epoch_seed).integers(2**31)))
        ds = tfds_io.as_dataset(
            self.builder, self.split, shuffle_files=self.train, read_config=read_config,
            decoders={"image": tfds.decode.SkipDecoding()})
        if self.train:
            ds = ds.shuffle(self.shuffle_buffer, seed=read_config.shuffle_seed)
        augment = self.train and self.augment == "inception_crop_flip"
        mean, std = tf.constant(self.mean), tf.constant(self.std)

        def process(index, example):
            seed = tf.stack([tf.constant(self.seed, tf.int64) * 1_000_003 + epoch, index])
            if augment:
                image = _inception_crop(tf, example["image"], seed)
                image = tf.image.stateless_random_flip_left_right(image, seed + 1)
            else:
                image = _center_crop(tf, example["image"])
            image = (tf.cast(image, tf.float32) - mean) / std
            return {"image": image, "label": tf.cast(example["label"], tf.int32),
                    "mask": tf.ones((), tf.float32)}

        ds = ds.enumerate().map(process, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        if not self.drop_remainder:  # fill the last batches up with masked copies of real examples
            padding = self.steps_per_epoch * self.batch_size - self.local_examples
            copies = ds.map(lambda example: {**example, "mask": tf.zeros((), tf.float32)})
            ds = ds.concatenate(copies.repeat().take(padding))
        ds = ds.batch(self.batch_size, drop_remainder=True).take(self.steps_per_epoch)
        return ds.prefetch(self.prefetch_size or tf.data.AUTOTUNE)

    def epoch(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        epoch, start = self.check_position(epoch, start)  # here, not at the first batch
        return self._batches(epoch, start)

    def _batches(self, epoch: int, start: int) -> Iterator[Batch]:
        for batch in self._dataset(epoch).skip(start).as_numpy_iterator():
            if self.drop_remainder:
                batch.pop("mask")
            yield batch
