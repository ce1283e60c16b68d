"""``needs_fmnist``: skip a test where the real Fashion-MNIST (Debian ``dataset-fashion-mnist``) is absent.

Decided from files alone (:func:`jaxnorm.data.check_prepared`): this module is imported when pytest
collects, in every xdist worker, where loading a batch (TensorFlow's import and a TFDS read) cost each
worker about ten seconds of CPU before any test ran. The first test that loads the dataset prepares it.
"""

import pytest

from jaxnorm import data


def _fashion_mnist_available() -> bool:
    try:
        data.check_prepared("fashion_mnist")
    except data.DatasetNotFoundError:
        return False
    return True


needs_fmnist = pytest.mark.skipif(
    not _fashion_mnist_available(), reason="Fashion-MNIST not installed (dataset-fashion-mnist)"
)
