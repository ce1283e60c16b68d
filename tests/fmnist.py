"""``needs_fmnist``: skip a test where the real Fashion-MNIST (Debian ``dataset-fashion-mnist``) is absent."""

import pytest


def _fashion_mnist_available() -> bool:
    from jaxnorm import data

    try:
        data.load("fashion_mnist", "test[:8]", batch_size=8, train=False)
    except data.DatasetNotFoundError:
        return False
    return True


needs_fmnist = pytest.mark.skipif(
    not _fashion_mnist_available(), reason="Fashion-MNIST not installed (dataset-fashion-mnist)"
)
