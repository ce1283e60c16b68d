"""jaxnorm: normalization for deep networks in JAX.

Layers, one way: arrays -> pure functions (:mod:`jaxnorm.functional`) -> Flax modules (:mod:`jaxnorm.nn`
for linen, :mod:`jaxnorm.nnx` for NNX) and optax transformations (:mod:`jaxnorm.optim`) -> models,
data and the training loop (:mod:`jaxnorm.models`, :mod:`jaxnorm.data`, :mod:`jaxnorm.train`, imported
on demand since they need the experiment extras).

The activation and weight normalizations of :mod:`jaxnorm.functional` and ENorm's
:func:`enorm_balance` are also available at the top level.
"""

from jaxnorm import diagnostics, enorm, functional, nn, nnx, optim
from jaxnorm.enorm import enorm_balance
from jaxnorm.functional import (
    batch_moments,
    batch_norm,
    batch_stats,
    bounded_weight_norm,
    group_norm,
    instance_norm,
    layer_norm,
    normprop_relu,
    rms_norm,
    scaled_weight_norm,
    unit_norm,
    weight_norm,
    weight_norm_data_init,
    weight_standardization,
)

__version__ = "0.1.0"

__all__ = [
    "batch_moments",
    "batch_norm",
    "batch_stats",
    "bounded_weight_norm",
    "diagnostics",
    "enorm",
    "enorm_balance",
    "functional",
    "group_norm",
    "instance_norm",
    "layer_norm",
    "nn",
    "nnx",
    "normprop_relu",
    "optim",
    "rms_norm",
    "scaled_weight_norm",
    "unit_norm",
    "weight_norm",
    "weight_norm_data_init",
    "weight_standardization",
]
