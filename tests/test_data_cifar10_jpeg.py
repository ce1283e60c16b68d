"""CIFAR-10 (JPEG q75 copy): the archive in ../shared/data prepared as TFDS's ``cifar10_jpeg`` and loaded."""

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest

tfds = pytest.importorskip("tensorflow_datasets")

from jaxnorm import data  # noqa: E402
from jaxnorm.data import cifar10_jpeg, tfds_io  # noqa: E402

ARCHIVE = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "cifar10-jpeg.tar.gz"


def _archive(path: Path, per_class: dict[str, int]) -> Path:
    """A small archive of the real layout with ``per_class[split]`` blank JPEG-named files per class."""
    with tarfile.open(path, "w:gz") as tar:
        for split, n in per_class.items():
            for name in cifar10_jpeg.CLASS_NAMES:
                for i in range(n):
                    info = tarfile.TarInfo(f"cifar10-jpeg/{split}/{name}/{i:04d}.jpg")
                    info.size = 1
                    tar.addfile(info, io.BytesIO(b"x"))
    return path


def test_archive_argument_errors(tmp_path, monkeypatch):
    monkeypatch.delenv(cifar10_jpeg.ARCHIVE_ENV, raising=False)
    with pytest.raises(data.DatasetNotFoundError, match="archive must name"):
        data.prepare_cifar10_jpeg(data_dir=tmp_path)
    with pytest.raises(data.DatasetNotFoundError, match=r"archive=.*is not a file"):
        data.prepare_cifar10_jpeg(tmp_path / "nothing.tar.gz", tmp_path)
    short = _archive(tmp_path / "short.tar.gz", {"train": 2, "test": 1})
    with pytest.raises(ValueError, match=r"not the CIFAR-10 JPEG copy.*test/airplane: 1"):
        data.prepare_cifar10_jpeg(short, tmp_path / "tfds")
    assert not (tmp_path / "tfds" / "cifar10_jpeg").exists()  # nothing written


def test_missing_dataset_names_the_archive(tmp_path, monkeypatch):
    monkeypatch.delenv(cifar10_jpeg.ARCHIVE_ENV, raising=False)
    with pytest.raises(data.DatasetNotFoundError, match="prepare_cifar10_jpeg"):
        data.check_prepared("cifar10_jpeg", tmp_path)
    with pytest.raises(data.DatasetNotFoundError, match="prepare_cifar10_jpeg"):
        data.load("cifar10_jpeg", "train", batch_size=8, train=True, data_dir=tmp_path)


@pytest.mark.skipif(not ARCHIVE.is_file(), reason=f"{ARCHIVE} is absent")
def test_real_archive_is_prepared_and_loads_as_cifar10_jpeg(tmp_path, monkeypatch):
    """Prepared from ../shared/data (by ``load`` itself, through ``$JAXNORM_CIFAR10_JPEG``): 50,000 /
    10,000 images, 5,000 / 1,000 per class, the archive's JPEG bytes stored unchanged, the copy's own
    statistics standardising it, and never readable under the name ``cifar10``."""
    tfds_io.read_arrays.cache_clear()
    monkeypatch.setenv(cifar10_jpeg.ARCHIVE_ENV, str(ARCHIVE))
    data.check_prepared("cifar10_jpeg", tmp_path)  # the archive is there: no error
    train = data.load("cifar10_jpeg", "train", batch_size=1000, train=False, data_dir=tmp_path)
    assert cifar10_jpeg.is_prepared(tmp_path) and not (tmp_path / "downloads").exists()
    assert train.num_examples == 50_000
    # per-channel sums in float64, batch by batch (the whole set as float64 would be 1.2 GB)
    count, total, squares, labels = 0, np.zeros(3), np.zeros(3), []
    for batch in train:
        assert batch["image"].shape[1:] == (32, 32, 3)
        pixels = batch["image"].reshape(-1, 3).astype(np.float64)
        count += len(batch["image"])
        total, squares = total + pixels.sum(0), squares + (pixels**2).sum(0)
        labels.append(batch["label"])
    assert count == 50_000 and np.bincount(np.concatenate(labels)).tolist() == [5000] * 10
    mean = total / (count * 32 * 32)
    std = np.sqrt(squares / (count * 32 * 32) - mean**2)
    assert np.abs(mean).max() < 1e-3
    assert np.abs(std - 1).max() < 2e-3
    test = data.load("cifar10_jpeg", "test", batch_size=1000, train=False, data_dir=tmp_path)
    assert np.bincount(np.concatenate([b["label"] for b in test])).tolist() == [1000] * 10
    assert data.load("cifar10_jpeg", "validation", batch_size=1000, train=False,
                     data_dir=tmp_path).num_examples == 10_000

    builder = tfds.builder("cifar10_jpeg", data_dir=str(tmp_path))
    stored = builder.as_dataset(split="test", shuffle_files=False,
                                decoders={"image": tfds.decode.SkipDecoding()})
    example = next(iter(tfds.as_numpy(stored)))
    key = example["id"].decode()
    with tarfile.open(ARCHIVE) as tar:
        original = tar.extractfile(f"cifar10-jpeg/test/{key}").read()
    assert example["image"] == original  # the JPEG bytes, not a re-encoding
    assert cifar10_jpeg.CLASS_NAMES[example["label"]] == key.split("/")[0]

    assert data.prepare_cifar10_jpeg(ARCHIVE, tmp_path) == tmp_path  # idempotent
    with pytest.raises(data.DatasetNotFoundError):
        data.load("cifar10", "train", batch_size=8, train=True, data_dir=tmp_path)
    tfds_io.read_arrays.cache_clear()


# ---------------------------------------------------------------- ImageNet's pipeline on cifar10_jpeg

def _imagenet_eval(split: str, process_index: int, process_count: int, local_batch: int):
    """``ImageNetDataset`` evaluation of ``split`` of the prepared ``cifar10_jpeg`` (JPEGs, as ImageNet's):
    ``(steps_per_epoch, label counts of the real examples)`` of one process."""
    from jaxnorm.data import imagenet

    ds = imagenet.ImageNetDataset(
        split, data_dir=data.resolve_data_dir(None), mean=(0.5,) * 3, std=(0.25,) * 3,
        batch_size=local_batch * process_count, train=False, seed=0, augment="none",
        drop_remainder=False, process_index=process_index, process_count=process_count,
        prefetch_size=1)
    batches = list(ds.epoch(0))
    assert len(batches) == ds.steps_per_epoch
    labels = np.concatenate([b["label"][b["mask"] == 1] for b in batches])
    return ds.steps_per_epoch, np.bincount(labels, minlength=10)


@pytest.mark.skipif(not cifar10_jpeg.is_prepared(), reason="cifar10_jpeg is not prepared")
def test_imagenet_multiprocess_eval_counts_every_example_once(monkeypatch):
    """Padded multi-process evaluation: every example of the split is counted by exactly one process
    (``N mod n`` were dropped) and all processes run the same number of steps. Local batches 37 and 71
    make the shorter shares (333 of 1000 for 3 processes, 142 for 7) need one step fewer."""
    builder = tfds_io.builder
    monkeypatch.setattr(tfds_io, "builder", lambda name, data_dir: builder(cifar10_jpeg.NAME, data_dir))
    split = "test[:1000]"
    _, expected = _imagenet_eval(split, 0, 1, 64)
    assert expected.sum() == 1000
    for process_count, local_batch in ((1, 64), (3, 37), (7, 71)):
        runs = [_imagenet_eval(split, k, process_count, local_batch) for k in range(process_count)]
        assert len({steps for steps, _ in runs}) == 1, (process_count, [steps for steps, _ in runs])
        np.testing.assert_array_equal(sum(counts for _, counts in runs), expected, err_msg=f"{process_count}")
    with pytest.raises(ValueError, match="fewer than the 3 processes"):  # one process would read nothing
        _imagenet_eval("test[:2]", 2, 3, 1)
