"""Compatibility re-exports: batch norm now lives in :mod:`.batch`, layer / group / instance / RMS norm
in :mod:`.per_example`, NormProp in :mod:`.normprop`.

Kept because code outside the package imports ``jaxnorm.functional.activation`` (e.g. ``normprop_relu``);
new code imports from those modules or from :mod:`jaxnorm.functional`.
"""

from jaxnorm.functional.batch import batch_norm, normalize_batch
from jaxnorm.functional.normalize import normalize
from jaxnorm.functional.normprop import RELU_MEAN, RELU_STD, normprop_relu
from jaxnorm.functional.per_example import group_norm, instance_norm, layer_norm, per_example_norm, rms_norm

__all__ = [
    "RELU_MEAN",
    "RELU_STD",
    "batch_norm",
    "group_norm",
    "instance_norm",
    "layer_norm",
    "normalize",
    "normalize_batch",
    "normprop_relu",
    "per_example_norm",
    "rms_norm",
]
