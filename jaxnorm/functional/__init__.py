"""The functional core: pure, jit-able normalization functions on arrays (no Flax, no optax).

Activation normalizations (:mod:`.activation`) reduce with the Lp statistics of :mod:`.stats`;
weight-space normalizations live in :mod:`.weight`.
"""

from jaxnorm.functional.activation import (
    RELU_MEAN,
    RELU_STD,
    batch_norm,
    group_norm,
    instance_norm,
    layer_norm,
    normalize,
    normprop_relu,
    rms_norm,
)
from jaxnorm.functional.stats import (
    L1_CONSTANT,
    batch_moments,
    batch_stats,
    expected_topk_abs_normal,
    linf_constant,
)
from jaxnorm.functional.weight import (
    bounded_weight_norm,
    fans,
    project_to_norm,
    scaled_weight_norm,
    unit_norm,
    weight_norm,
    weight_norm_data_init,
    weight_standardization,
)

__all__ = [
    "L1_CONSTANT",
    "RELU_MEAN",
    "RELU_STD",
    "batch_moments",
    "batch_norm",
    "batch_stats",
    "bounded_weight_norm",
    "expected_topk_abs_normal",
    "fans",
    "group_norm",
    "instance_norm",
    "layer_norm",
    "linf_constant",
    "normalize",
    "normprop_relu",
    "project_to_norm",
    "rms_norm",
    "scaled_weight_norm",
    "unit_norm",
    "weight_norm",
    "weight_norm_data_init",
    "weight_standardization",
]
