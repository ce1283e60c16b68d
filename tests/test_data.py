"""Data: augmentations against brute-force oracles, pipelines on tfds mock data, real Fashion-MNIST."""

import hashlib
import re
from pathlib import Path

import numpy as np
import pytest

tfds = pytest.importorskip("tensorflow_datasets")

from jaxnorm import data  # noqa: E402
from jaxnorm.data import augment, fashion_mnist, tfds_io  # noqa: E402

FASHION_SOURCE = Path(fashion_mnist.DEFAULT_SOURCE_DIR)


@pytest.fixture(autouse=True)
def fresh_array_cache():
    """Mock data and real data share cache keys: start and end every test with an empty cache."""
    tfds_io.read_arrays.cache_clear()
    yield
    tfds_io.read_arrays.cache_clear()


def mock(num_examples):
    return tfds.testing.mock_data(num_examples=num_examples)


def epochs_equal(a, b):
    return all(np.array_equal(x[k], y[k]) for x, y in zip(a, b, strict=True) for k in x)


# ---------------------------------------------------------------- augmentations (pure NumPy)

def test_random_crop_is_a_window_of_the_padded_image():
    rng = np.random.default_rng(0)
    images = rng.integers(1, 256, size=(16, 6, 5, 2), dtype=np.uint8)  # no zeros: padding shows
    crops = augment.random_crop(images, np.random.default_rng(1), size=4, padding=2)
    assert crops.shape == (16, 4, 4, 2) and crops.dtype == np.uint8
    padded = np.pad(images, ((0, 0), (2, 2), (2, 2), (0, 0)))
    offsets = set()
    for b in range(16):  # brute force: the crop equals exactly one window
        hits = [(i, j) for i in range(10 - 4 + 1) for j in range(9 - 4 + 1)
                if np.array_equal(padded[b, i:i + 4, j:j + 4], crops[b])]
        assert hits
        offsets.add(hits[0])
    assert len(offsets) > 4  # offsets vary across the batch


def test_random_flip_mirrors_about_half():
    images = np.arange(200 * 3 * 4).reshape(200, 3, 4, 1).astype(np.uint8)
    out = augment.random_flip(images, np.random.default_rng(0))
    flipped = np.array([np.array_equal(o, i[:, ::-1]) for o, i in zip(out, images, strict=True)])
    kept = np.array([np.array_equal(o, i) for o, i in zip(out, images, strict=True)])
    assert np.all(flipped ^ kept)
    assert 70 < flipped.sum() < 130


def test_center_crop_and_augment_shapes():
    images = np.zeros((3, 32, 32, 3), np.uint8)
    images[:, 2:30, 2:30] = 1
    assert np.all(augment.center_crop(images, 28) == 1)
    rng = np.random.default_rng(0)
    assert augment.apply("crop_flip", images, rng, train=True).shape == (3, 32, 32, 3)
    assert augment.apply("cifar_nv_crop", images, rng, train=True).shape == (3, 28, 28, 3)
    assert augment.apply("cifar_nv_crop", images, rng, train=False).shape == (3, 28, 28, 3)
    assert augment.apply("crop_flip", images, rng, train=False) is images
    with pytest.raises(ValueError, match="size"):
        augment.random_crop(images, rng, size=40, padding=2)
    with pytest.raises(ValueError, match="augment"):
        augment.apply("mixup", images, rng, train=True)


@pytest.mark.parametrize("name", ["crop_flip", "colour_crop_flip", "cifar_nv_crop"])
@pytest.mark.parametrize("shape", [(9, 7), (6, 20), (20, 6)], ids=str)
def test_crops_of_non_square_images_keep_their_shape(name, shape):
    """The crops took ``size = H`` for both sides: 9x7 images came out 9x9 (half of the new columns zero
    padding), 6x20 as 6x6, 20x6 raised about a ``size`` the user never passed (fuzz of 2026-12-02).
    Oracle: each training crop is a window of the zero-padded image of the expected size."""
    h, w = shape
    images = np.random.default_rng(0).integers(1, 256, (4, h, w, 3), dtype=np.uint8)
    cut = 4 if name == "cifar_nv_crop" else 0
    for train in (True, False):
        out = augment.apply(name, images, np.random.default_rng(1), train=train)
        assert out.shape == (4, h - cut, w - cut, 3)
    crops = augment.random_crop(images, np.random.default_rng(2), size=(h, w), padding=3)
    padded = np.pad(images, ((0, 0), (3, 3), (3, 3), (0, 0)))
    for crop, full in zip(crops, padded, strict=True):
        windows = np.lib.stride_tricks.sliding_window_view(full, (h, w), axis=(0, 1))
        assert np.any(np.all(np.moveaxis(windows, 2, -1).reshape(-1, h, w, 3) == crop, axis=(1, 2, 3)))
    assert augment.center_crop(images, (h - 2, w - 2)).shape == (4, h - 2, w - 2, 3)


def test_a_square_crop_draws_as_before():
    """``size=(h, w)`` of a square image draws the offsets the old ``size=h`` drew: runs stay the same."""
    images = np.random.default_rng(0).integers(0, 256, (8, 32, 32, 3), dtype=np.uint8)
    one = augment.random_crop(images, np.random.default_rng(3), size=32, padding=4)
    pair = augment.random_crop(images, np.random.default_rng(3), size=(32, 32), padding=4)
    assert np.array_equal(one, pair)


@pytest.mark.parametrize(("images", "labels", "stats", "match"), [
    (np.full((10, 4, 4, 1), 0.5, np.float32), np.arange(10), {}, "images must be a uint8"),
    (np.zeros((10, 4, 4), np.uint8), np.arange(10), {}, "images must be a uint8"),
    (np.zeros((10, 4, 4, 1), np.uint8), np.arange(10.0), {}, "labels must be 10 integers"),
    (np.zeros((10, 4, 4, 1), np.uint8), np.arange(9), {}, "labels must be 10 integers"),
    (np.zeros((10, 4, 4, 1), np.uint8), np.arange(10), {"std": (0.0,)}, "std must be 1 finite number"),
    (np.zeros((10, 4, 4, 1), np.uint8), np.arange(10), {"mean": (0.5, 0.5)}, "mean must be 1 finite"),
    (np.zeros((10, 4, 4, 1), np.uint8), np.arange(10), {"mean": (np.nan,)}, "mean must be 1 finite"),
], ids=["float images", "rank 3", "float labels", "label count", "zero std", "mean length", "nan mean"])
def test_array_dataset_refuses_what_it_would_standardise_wrongly(images, labels, stats, match):
    """Float images in [0, 1] were divided by 255 again (every pixel about -mean/std, no error); a zero
    std gave Inf/NaN; float labels passed through although batches promise int32 (fuzz of 2026-12-02)."""
    args = dict(mean=(0.5,), std=(0.25,), batch_size=2, train=True, seed=0, augment="none",
                drop_remainder=True, process_index=0, process_count=1) | stats
    with pytest.raises(ValueError, match=match):
        data.ArrayDataset(images, labels, **args)
    ok = data.ArrayDataset(np.zeros((10, 4, 4, 1), np.uint8), np.arange(10, dtype=np.int64),
                           **(args | {"mean": 0.5, "std": 0.25}))
    assert next(iter(ok.epoch(0)))["label"].dtype == np.int32


def test_imagenet_takes_augment_none_as_its_error_message_says():
    assert data.resolve_augment("imagenet2012", "none") == "none"
    with pytest.raises(ValueError, match="does not apply"):
        data.resolve_augment("imagenet2012", "crop_flip")


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    (dict(train="no"), TypeError, "train must be True or False"),
    (dict(train=True, drop_remainder="no"), TypeError, "drop_remainder must be True or False"),
    (dict(train=True, data_dir=3), TypeError, "data_dir must be a path"),
    (dict(name=["fashion_mnist"], train=True), ValueError, "name must be one of"),
])
def test_load_names_a_bad_flag_before_reading(kwargs, error, match, monkeypatch):
    """``train='no'`` was checked only after the split was read, as ``shuffle``; ``data_dir=3`` raised
    pathlib's own TypeError; a list name "unhashable type"."""
    def no_read(*args, **kw):
        raise AssertionError("the split was read before the arguments were checked")

    monkeypatch.setattr(tfds_io, "read_arrays", no_read)
    args = dict(name="fashion_mnist", split="test", batch_size=10) | kwargs
    with pytest.raises(error, match=match):
        data.load(args.pop("name"), args.pop("split"), **args)


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(padding=-1), "padding must be an integer >= 0"),
    (dict(padding=1.5), "padding must be an integer >= 0"),
    (dict(padding=True), "padding must be an integer >= 0"),
    (dict(size=3.5), "size must be an integer"),
])
def test_random_crop_checks_its_arguments(kwargs, match):
    images = np.zeros((2, 4, 4, 1), np.uint8)
    args = dict(size=4, padding=1) | kwargs
    with pytest.raises(ValueError, match=match):
        augment.random_crop(images, np.random.default_rng(0), **args)
    crops = augment.random_crop(images, np.random.default_rng(0), size=np.int64(4), padding=np.int32(0))
    assert crops.shape == (2, 4, 4, 1)


def test_colour_crop_flip_needs_rgb_images():
    """Saturation and hue exist for RGB only (as TF's adjust_saturation / adjust_hue): a 1-channel
    dataset with colour_crop_flip is refused where it is made, naming augment and the channels."""
    grey = np.zeros((10, 4, 4, 1), np.uint8)
    args = dict(mean=(0.5,), std=(0.5,), batch_size=4, seed=0, augment="colour_crop_flip",
                drop_remainder=True, process_index=0, process_count=1)
    for train in (True, False):
        with pytest.raises(ValueError, match=r"augment='colour_crop_flip'.*1 channel"):
            data.ArrayDataset(grey, np.arange(10), train=train, **args)
    with pytest.raises(ValueError, match="images must be RGB"):
        augment.random_colour(grey, np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"augment='colour_crop_flip'.*1 channel"):
        data.resolve_augment("mnist", "colour_crop_flip")
    assert data.resolve_augment("cifar10", "colour_crop_flip") == "colour_crop_flip"


def test_random_colour_matches_tensorflow_distort_color():
    """:func:`random_colour` is TF's Inception distort_color (ordering 0): tf.image's adjust_brightness,
    adjust_saturation, adjust_hue, adjust_contrast with the same factors, nothing clipped between them,
    clipped to [0, 1] at the end. Agreement to the uint8 level but where float64 and TF's float32
    round a value on either side of a rounding boundary."""
    pytest.importorskip("tensorflow")
    tf = tfds_io.tensorflow()
    images = np.random.default_rng(0).integers(0, 256, (64, 8, 8, 3)).astype(np.uint8)
    images[:8] = np.clip(images[:8].astype(int) + 160, 0, 255)  # bright images: brightness pushes past 1
    images[8:16] //= 8  # dark ones: past 0
    out = augment.random_colour(images, np.random.default_rng(5))
    rng, b, jitter = np.random.default_rng(5), len(images), augment.COLOUR_JITTER  # the same draws, in order
    brightness = rng.uniform(-jitter["brightness"], jitter["brightness"], b)
    saturation = rng.uniform(*jitter["saturation"], b)
    hue = rng.uniform(-jitter["hue"], jitter["hue"], b)
    contrast = rng.uniform(*jitter["contrast"], b)
    expected = []
    for k in range(b):
        x = tf.image.convert_image_dtype(images[k], tf.float32)
        x = tf.image.adjust_brightness(x, brightness[k])
        x = tf.image.adjust_saturation(x, saturation[k])
        x = tf.image.adjust_hue(x, hue[k])
        x = tf.image.adjust_contrast(x, contrast[k])
        expected.append(np.round(np.clip(x.numpy(), 0.0, 1.0) * 255.0))
    diff = np.abs(out.astype(np.float64) - np.array(expected))
    assert diff.max() <= 1.0
    assert (diff > 0).mean() < 1e-3


def test_standardize_matches_float64():
    images = np.random.default_rng(0).integers(0, 256, size=(4, 3, 3, 3), dtype=np.uint8)
    mean, std = np.array([0.4, 0.5, 0.6]), np.array([0.2, 0.25, 0.3])
    expected = (images.astype(np.float64) / 255 - mean) / std
    out = data.standardize(images, mean.astype(np.float32), std.astype(np.float32))
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- catalog and errors

def test_info():
    assert set(data.names()) == {
        "fashion_mnist", "mnist", "cifar10", "cifar10_jpeg", "cifar100", "imagenet2012"}
    assert data.info("cifar10_jpeg") == data.info("cifar10")  # same classes, shapes and splits
    assert data.info("cifar100") == data.DatasetInfo(
        100, (32, 32, 3), "train", "test", 50_000, 10_000)
    assert data.info("imagenet2012").eval_split == "validation"
    with pytest.raises(ValueError, match="cifar10"):
        data.info("svhn")


def test_data_dir_option_and_environment_variable(monkeypatch, tmp_path):
    monkeypatch.setenv(data.DATA_DIR_ENV, str(tmp_path))
    assert data.resolve_data_dir() == tmp_path
    assert data.resolve_data_dir("/x/y") == Path("/x/y")
    monkeypatch.delenv(data.DATA_DIR_ENV)
    assert data.resolve_data_dir() == Path("~/tensorflow_datasets").expanduser()


def test_missing_dataset_names_the_download(tmp_path):
    with pytest.raises(data.DatasetNotFoundError, match="download_and_prepare"):
        data.load("cifar10", "train", batch_size=8, train=True, data_dir=tmp_path)


def test_missing_fashion_mnist_files_name_the_apt_package(tmp_path):
    with pytest.raises(data.DatasetNotFoundError, match="apt-get install dataset-fashion-mnist"):
        data.prepare_fashion_mnist(tmp_path / "tfds", source_dir=tmp_path / "nothing")


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(name="svhn"), "name"),
    (dict(augment="mixup"), "augment"),
    (dict(augment="inception_crop_flip"), "augment"),
    (dict(batch_size=10, process_count=4, process_index=0), "batch_size"),
    (dict(process_index=2, process_count=2), "process_index"),
    (dict(batch_size=True), "batch_size"),
    (dict(seed=-1), "seed"),
    (dict(seed=1.5), "seed"),
    (dict(prefetch_size=-1), "prefetch_size"),
    (dict(split=None), "split"),
    (dict(split="validation[:1shard]"), "split"),
    (dict(split="validation[:20000]"), "split"),
    (dict(name="fashion_mnist", augment="colour_crop_flip"), "augment='colour_crop_flip'.*1 channel"),
])
def test_bad_load_arguments(kwargs, match):
    """Refused before any data is read (cifar10 is not prepared here: a later check would raise
    DatasetNotFoundError instead)."""
    args = dict(name="cifar10", split="train", batch_size=8, train=True) | kwargs
    with pytest.raises(ValueError, match=match):
        data.load(**args)


# ---------------------------------------------------------------- pipelines on mock data

def test_cifar10_pipeline_on_mock_data():
    with mock(96):
        ds = data.load("cifar10", "train", batch_size=32, train=True, seed=3, prefetch_size=0)
        first, second = list(ds), list(ds)  # iterating twice gives epochs 0 and 1
        again = list(data.load("cifar10", "train", batch_size=32, train=True, seed=3))
        other_seed = list(data.load("cifar10", "train", batch_size=32, train=True, seed=4))
    assert ds.num_examples == 96 and ds.steps_per_epoch == 3 == len(first)
    batch = first[0]
    assert set(batch) == {"image", "label"}
    assert batch["image"].shape == (32, 32, 32, 3) and batch["image"].dtype == np.float32
    assert batch["label"].shape == (32,) and batch["label"].dtype == np.int32
    assert epochs_equal(first, again)  # deterministic given the seed
    assert not epochs_equal(first, second)  # a new shuffle and new crops each epoch
    assert not epochs_equal(first, other_seed)
    assert np.isfinite(batch["image"]).all()


def test_resuming_mid_epoch_gives_the_same_batches():
    with mock(96):
        ds = data.load("cifar10", "train", batch_size=16, train=True, seed=1)
        full = list(ds.epoch(2))
        tail = list(ds.epoch(2, start=4))
    assert epochs_equal(full[4:], tail)


def test_processes_split_every_global_batch():
    with mock(64):
        single = list(data.load("cifar100", "train", batch_size=16, train=True, seed=5,
                                process_index=0, process_count=1))
        parts = [list(data.load("cifar100", "train", batch_size=16, train=True, seed=5,
                                process_index=i, process_count=2)) for i in range(2)]
    for whole, a, b in zip(single, *parts, strict=True):
        assert a["image"].shape[0] == 8
        for key in whole:
            np.testing.assert_array_equal(np.concatenate([a[key], b[key]]), whole[key])


def test_cifar_nv_crops_and_eval_padding():
    with mock(50):
        train = data.load("cifar10", "train", batch_size=10, train=True, augment="cifar_nv_crop")
        test = data.load("cifar10", "test", batch_size=16, train=False, augment="cifar_nv_crop",
                         drop_remainder=False)
        test_batches = list(test)
        test_again = list(test)
        plain = data.load("cifar10", "test", batch_size=10, train=False)
    assert next(iter(train))["image"].shape == (10, 28, 28, 3)
    assert train.image_shape == (28, 28, 3)
    assert len(test_batches) == 4 and test_batches[0]["image"].shape == (16, 28, 28, 3)
    assert sum(b["mask"].sum() for b in test_batches) == 50
    assert test_batches[-1]["mask"].tolist() == [1.0] * 2 + [0.0] * 14
    assert epochs_equal(test_batches, test_again)  # evaluation is not shuffled or augmented
    assert plain.image_shape == (32, 32, 3)


def test_eval_padding_is_masked_copies_of_real_examples():
    """The last partial batch is filled up with copies of its own real examples (mask 0), the same in
    every source: no zero images, labels of real classes."""
    with mock(50):
        test = data.load("cifar10", "test", batch_size=16, train=False, drop_remainder=False)
        last = list(test)[-1]
    real = int(last["mask"].sum())
    assert real == 2
    for i in range(real, 16):
        np.testing.assert_array_equal(last["image"][i], last["image"][i % real])
        assert last["label"][i] == last["label"][i % real]


# ---------------------------------------------------------------- one in-memory source
def test_one_in_memory_source_for_the_loop_and_the_pipelines():
    from jaxnorm import train

    assert train.ArraySource is data.ArraySource
    assert issubclass(data.ArrayDataset, data.ArraySource)
    assert "EpochFnSource" not in train.__all__ and not hasattr(train, "EpochFnSource")


@pytest.mark.parametrize("shuffle", [False, True])
def test_array_source_pads_with_masked_copies_and_splits_over_processes(shuffle):
    arrays = {"image": np.arange(10.0)[:, None] + 1, "label": np.arange(10)}
    whole = list(data.ArraySource(arrays, 4, shuffle=shuffle, drop_remainder=False, seed=2,
                                  process_index=0, process_count=1).epoch(3))
    parts = [list(data.ArraySource(arrays, 4, shuffle=shuffle, drop_remainder=False, seed=2,
                                   process_index=i, process_count=2).epoch(3)) for i in range(2)]
    assert [b["mask"].tolist() for b in whole] == [[1.0] * 4, [1.0] * 4, [1.0, 1.0, 0.0, 0.0]]
    last = whole[-1]
    np.testing.assert_array_equal(last["image"][2:], last["image"][:2])  # copies, not zeros
    seen = np.concatenate([b["label"][b["mask"] > 0] for b in whole])
    assert sorted(seen.tolist()) == list(range(10))  # every example once
    for full, a, b in zip(whole, *parts, strict=True):
        for key in full:
            np.testing.assert_array_equal(np.concatenate([a[key], b[key]]), full[key])


@pytest.mark.parametrize("prefetch_size", [0, 2])
def test_epoch_and_start_are_checked_when_called(prefetch_size):
    """start lies in [0, steps_per_epoch] (steps_per_epoch: the empty rest of a finished epoch, where a
    run resumes at an epoch's end); epoch >= 0; both integers (NumPy ones too, not bools). A bad one
    raises when epoch() is called, before any batch; a negative start once yielded copies of example 0."""
    arrays = {"image": np.arange(10.0)[:, None], "label": np.arange(10)}
    src = data.ArraySource(arrays, 4, seed=0, process_index=0, process_count=1, prefetch_size=prefetch_size)
    full = list(src.epoch(0))
    assert src.steps_per_epoch == 2
    assert epochs_equal(list(src.epoch(np.int64(0), start=np.int32(1))), full[1:])
    assert list(src.epoch(0, start=2)) == []
    for start in (-1, -2, 3, 1.5, True, None):
        with pytest.raises(ValueError, match=r"start must be an integer in \[0, 2\]"):
            src.epoch(0, start=start)
    for epoch in (-1, 1.5, True, None):
        with pytest.raises(ValueError, match="epoch must be an integer >= 0"):
            src.epoch(epoch)


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(seed=-1), "seed"),
    (dict(seed=None), "seed"),
    (dict(prefetch_size=-1), "prefetch_size"),
    (dict(prefetch_size=1.5), "prefetch_size"),
    (dict(global_batch_size=True), "global_batch_size"),
    (dict(global_batch_size=4.0), "global_batch_size"),
    (dict(process_count=0), "process_count"),
    (dict(process_index=True, process_count=2), "process_index"),
])
def test_bad_array_source_arguments_are_refused_at_construction(kwargs, match):
    arrays = {"image": np.zeros((10, 1)), "label": np.arange(10)}
    args = dict(global_batch_size=4, process_index=0, process_count=1) | kwargs
    with pytest.raises(ValueError, match=match):
        data.ArraySource(arrays, **args)
    ok = data.ArraySource(arrays, np.int64(4), seed=np.uint32(3), prefetch_size=np.int8(1),
                          process_index=np.int64(0), process_count=np.int64(1))
    assert (ok.global_batch_size, ok.seed, ok.steps_per_epoch) == (4, 3, 2)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"shuffle": "no"}, "shuffle must be True or False, got 'no'"),
        ({"drop_remainder": None}, "drop_remainder must be True or False, got None"),
        ({"transform": 3}, "transform must be a callable"),
    ],
)
def test_array_source_flags_and_transform_are_checked(kwargs, match):
    """``shuffle="no"`` shuffled (a non-empty string is truthy); ``drop_remainder=None`` padded."""
    arrays = {"image": np.zeros((10, 1)), "label": np.arange(10)}
    with pytest.raises(TypeError, match=match):
        data.ArraySource(arrays, 4, **kwargs)
    assert not data.ArraySource(arrays, 4, shuffle=np.bool_(False)).shuffle


def test_prefetch_checks_its_size_when_called():
    from jaxnorm.data.prefetch import prefetch

    for size in (-1, 1.5, True):
        with pytest.raises(ValueError, match="size must be an integer >= 0"):
            prefetch(lambda i: i, range(3), size)
    assert list(prefetch(lambda i: i, range(3), np.int64(2))) == [0, 1, 2]


def test_eval_metrics_are_exact_with_a_last_partial_batch():
    """Loss and accuracy over 100 examples in batches of 32 (4 examples in the last) equal the
    one-batch numbers: the mask keeps the padding copies out."""
    import flax.linen as nn
    import jax
    import optax

    from jaxnorm.train import ArraySource, DataParallel, create_train_state, evaluate, make_eval_step

    rng = np.random.default_rng(0)
    arrays = {"image": rng.normal(size=(100, 4, 4, 1)).astype(np.float32),
              "label": rng.integers(0, 3, 100).astype(np.int32)}

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x, train=False):
            return nn.Dense(3)(x.reshape(len(x), -1))

    model = Net()
    state = create_train_state(model.init, optax.sgd(0.1), jax.random.PRNGKey(0), arrays["image"][:1])
    parallel = DataParallel("jit")
    eval_step = parallel.compile_eval_step(make_eval_step(model.apply))
    state = parallel.place_state(state)
    batched = evaluate(parallel, eval_step, state, ArraySource(arrays, 32, shuffle=False,
                                                               drop_remainder=False))
    whole = evaluate(parallel, eval_step, state, ArraySource(arrays, 100, shuffle=False))
    assert batched["accuracy"] == pytest.approx(whole["accuracy"], abs=1e-7)
    assert batched["loss"] == pytest.approx(whole["loss"], rel=1e-5)


def test_no_import_cycle_in_the_data_package():
    """No module of jaxnorm.data imports (at any level, function bodies included) one that imports
    it back, directly or through others."""
    import ast

    package = Path(data.__file__).parent
    graph = {}
    for path in package.glob("*.py"):
        if path.name == "__init__.py":
            continue
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("jaxnorm.data"):
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                imported.update(n.rsplit(".", 1)[-1] for n in names if n.count(".") == 2)
        graph[path.stem] = imported & {p.stem for p in package.glob("*.py")}

    def reaches(start, target, seen=()):
        return any(n == target or (n not in seen and reaches(n, target, (*seen, n)))
                   for n in graph.get(start, ()))

    assert [m for m in graph if reaches(m, m)] == []


def test_validation_split_is_carved_from_train():
    assert data.pipeline.tfds_split("cifar10", "validation") == "train[-10000:]"
    assert data.pipeline.tfds_split("cifar10", "train_minus_validation") == "train[:-10000]"
    assert data.pipeline.tfds_split("mnist", "test") == "test"
    assert data.pipeline.tfds_split("imagenet2012", "validation") == "validation"
    with pytest.raises(ValueError, match="validation"):
        data.pipeline.tfds_split("imagenet2012", "train_minus_validation")


def test_slices_of_derived_splits_are_slices_of_train():
    """validation = train[-10000:], train_minus_validation = train[:-10000]: a slice of either (TFDS's
    rules: absolute, negative from the end, or percent of the split, rounded to the closest) is the
    same examples as a slice of train; '+' joins parts."""
    split = data.pipeline.tfds_split
    assert split("fashion_mnist", "validation[:50%]") == "train[-10000:-5000]"
    assert split("fashion_mnist", "validation[50%:]") == "train[-5000:]"
    assert split("fashion_mnist", "validation[-100:]") == "train[-100:]"
    assert split("fashion_mnist", "validation[10:20]") == "train[-9990:-9980]"
    assert split("cifar10", "validation[33.3%:66.7%]") == "train[-6670:-3330]"
    assert split("cifar10", "train_minus_validation[:50%]") == "train[:20000]"
    assert split("fashion_mnist", "train_minus_validation[-10:]") == "train[49990:-10000]"
    assert split("cifar10", "test + validation[:1%]") == "test+train[-10000:-9900]"
    assert split("imagenet2012", "validation[:10%]") == "validation[:10%]"  # TFDS's own split
    for bad in ("validation[:1shard]", "validation[5]", "validation[:20000]", "validation[-101%:]",
                "validation[10:10]", "validation[1.5:]", "train_minus_validation[a:]"):
        with pytest.raises(ValueError, match="split="):
            split("cifar10", bad)


def test_imagenet_pipeline_on_mock_data():
    with mock(12):
        ds = data.load("imagenet2012", "train", batch_size=4, train=True, seed=0)
        first = list(ds.epoch(0))
        again = list(ds.epoch(0))
        second = list(ds.epoch(1))
        evaluation = list(data.load("imagenet2012", "validation", batch_size=8, train=False,
                                    drop_remainder=False))
        tail = list(ds.epoch(0, start=np.int64(2)))
        assert list(ds.epoch(0, start=3)) == []  # resuming at the end of the epoch
        for start in (-1, 4, 1.5):  # refused when epoch() is called, not at the first batch
            with pytest.raises(ValueError, match="start"):
                ds.epoch(0, start=start)
        with pytest.raises(ValueError, match="epoch"):
            ds.epoch(-1)
    assert epochs_equal(first[2:], tail)
    assert len(first) == 3
    assert first[0]["image"].shape == (4, 224, 224, 3) and first[0]["image"].dtype == np.float32
    assert first[0]["label"].dtype == np.int32
    assert epochs_equal(first, again)
    assert not epochs_equal(first, second)
    assert [b["mask"].sum() for b in evaluation] == [8, 4]


# ---------------------------------------------------------------- real Fashion-MNIST (offline)

needs_fashion = pytest.mark.skipif(
    not FASHION_SOURCE.is_dir(), reason="apt-get install dataset-fashion-mnist")


@needs_fashion
def test_recorded_checksums_are_the_installed_files():
    for name, (size, sha256) in fashion_mnist.DEBIAN_CHECKSUMS.items():
        content = (FASHION_SOURCE / name).read_bytes()
        assert len(content) == size
        assert hashlib.sha256(content).hexdigest() == sha256


@pytest.fixture(scope="module")
def fashion_dir(tmp_path_factory):
    """The default data directory where Fashion-MNIST is not prepared there yet (a fresh machine, as in CI:
    this test prepares it, and the other tests that read it find it prepared instead of preparing it
    again, about half a minute of CPU each time); a fresh temporary directory otherwise, so that the
    preparation is exercised on every machine."""
    if not FASHION_SOURCE.is_dir():
        pytest.skip("apt-get install dataset-fashion-mnist")
    default = data.resolve_data_dir(None)
    if not (default / "fashion_mnist").exists():
        return default
    return tmp_path_factory.mktemp("tfds")


@needs_fashion
def test_real_fashion_mnist_is_prepared_offline_and_loads(fashion_dir):
    ds = data.load("fashion_mnist", "train", batch_size=500, train=True, data_dir=fashion_dir)
    assert (fashion_dir / "fashion_mnist").is_dir()
    assert not (fashion_dir / "downloads").exists()  # extracted files went to a scratch dir
    assert ds.num_examples == 60_000 and ds.steps_per_epoch == 120
    batches = list(ds.epoch(0))  # one pass (an epoch holds every example once)
    labels = np.concatenate([b["label"] for b in batches])
    assert np.bincount(labels).tolist() == [6000] * 10  # each label once per epoch
    images = np.concatenate([b["image"] for b in batches])
    assert images.shape == (60_000, 28, 28, 1)
    # The recorded per-channel statistics standardise the training set.
    assert abs(images.mean()) < 1e-3 and abs(images.std() - 1) < 1e-3
    builder = tfds.builder("fashion_mnist", data_dir=str(fashion_dir))
    assert builder.info.splits["test"].num_examples == 10_000
    validation = data.load("fashion_mnist", "validation", batch_size=1000, train=False,
                           data_dir=fashion_dir)
    assert validation.num_examples == 10_000
    halves = [data.load("fashion_mnist", f"validation{part}", batch_size=1000, train=False,
                        data_dir=fashion_dir) for part in ("[:50%]", "[50%:]")]
    assert [h.num_examples for h in halves] == [5000, 5000]
    np.testing.assert_array_equal(np.concatenate([h.images for h in halves]), validation.images)
    np.testing.assert_array_equal(np.concatenate([h.labels for h in halves]), validation.labels)
    assert data.prepare_fashion_mnist(fashion_dir) == fashion_dir  # idempotent


def test_hsv_round_trip_matches_colorsys():
    import colorsys

    rng = np.random.default_rng(0)
    rgb = rng.random((40, 3, 3, 3))
    rgb[0, 0, 0] = 0.5  # grey: no chroma, hue 0
    rgb[1, 0, 0] = 0.0  # black: saturation 0
    hsv = augment.rgb_to_hsv(rgb)
    oracle = np.array([colorsys.rgb_to_hsv(*p) for p in rgb.reshape(-1, 3)]).reshape(hsv.shape)
    np.testing.assert_allclose(hsv, oracle, atol=1e-12)
    np.testing.assert_allclose(augment.hsv_to_rgb(hsv), rgb, atol=1e-12)


def test_colour_crop_flip_is_identity_at_zero_ranges_and_jitters_otherwise(monkeypatch):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (16, 32, 32, 3), dtype=np.uint8)
    still = {"brightness": 0.0, "saturation": (1.0, 1.0), "hue": 0.0, "contrast": (1.0, 1.0)}
    monkeypatch.setattr(augment, "COLOUR_JITTER", still)
    # the HSV round trip errs far below 0.5 / 255: identity after rounding
    np.testing.assert_array_equal(augment.random_colour(images, rng), images)
    monkeypatch.undo()
    jittered = augment.random_colour(images, np.random.default_rng(2))
    assert jittered.dtype == np.uint8 and jittered.shape == images.shape
    shift = jittered.astype(float).mean(axis=(1, 2, 3)) - images.astype(float).mean(axis=(1, 2, 3))
    assert np.abs(shift).max() > 1.0  # every draw differs per example
    assert np.std(shift) > 0.5
    again = augment.random_colour(images, np.random.default_rng(2))
    np.testing.assert_array_equal(jittered, again)  # a function of the Generator's state only
    out = augment.apply("colour_crop_flip", images, np.random.default_rng(3), train=True)
    assert out.shape == images.shape and out.dtype == np.uint8
    assert augment.apply("colour_crop_flip", images, rng, train=False) is images


@pytest.mark.parametrize("batch", [1, 15, 16, 17, 100])
def test_random_colour_is_the_same_in_tasks_of_any_size(monkeypatch, batch):
    """:func:`random_colour` runs its examples in tasks of ``COLOUR_CHUNK`` on a thread pool: every
    example, and the Generator's state after the call, are those of one task over the whole batch (the
    four draws are taken first, in TF's order, each one per example)."""
    images = np.random.default_rng(7).integers(0, 256, (batch, 8, 8, 3), dtype=np.uint8)
    results = []
    for chunk in (batch, 16, 3):
        monkeypatch.setattr(augment, "COLOUR_CHUNK", chunk)
        rng = np.random.default_rng(11)
        results.append((augment.random_colour(images, rng), rng.uniform()))
    for out, after in results[1:]:
        np.testing.assert_array_equal(out, results[0][0])
        assert after == results[0][1]
    rng = np.random.default_rng(11)
    rng.uniform(size=4 * batch)  # the four per-example draws and nothing else
    assert rng.uniform() == results[0][1]


@pytest.mark.parametrize(("split", "match"), [
    ("test[5:3]", "selects no examples"),  # TensorFlow: "expected to contain -2 elements"
    ("test[:0]", "selects no examples"),  # TFDS: "Instruction [] corresponds to no data!"
    ("tset", "Unknown split 'tset'"),
])
def test_a_split_that_selects_nothing_is_named_before_reading(fashion_dir, split, match):
    with pytest.raises(ValueError, match=rf"split={re.escape(repr(split))} of fashion_mnist.*{match}"):
        data.load("fashion_mnist", split, batch_size=10, train=False, data_dir=fashion_dir)
