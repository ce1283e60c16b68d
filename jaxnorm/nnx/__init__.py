"""flax.nnx modules over :mod:`jaxnorm.functional`: drop-in normalization layers and weight-space layers.

The NNX twins of :mod:`jaxnorm.nn`: the same class names and jaxnorm arguments, flax.nnx's constructors.
"""

from jaxnorm.nnx.normalization import BatchNorm, GroupNorm, InstanceNorm, LayerNorm, RMSNorm
from jaxnorm.nnx.weight import (
    BoundedWeightNormConv,
    BoundedWeightNormDense,
    Constant,
    NormPropConv,
    NormPropDense,
    ScaledWeightNormConv,
    ScaledWeightNormDense,
    WeightNormConv,
    WeightNormDense,
    WSConv,
)

__all__ = [
    "BatchNorm",
    "BoundedWeightNormConv",
    "BoundedWeightNormDense",
    "Constant",
    "GroupNorm",
    "InstanceNorm",
    "LayerNorm",
    "NormPropConv",
    "NormPropDense",
    "RMSNorm",
    "ScaledWeightNormConv",
    "ScaledWeightNormDense",
    "WSConv",
    "WeightNormConv",
    "WeightNormDense",
]
