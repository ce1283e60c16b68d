"""flax.linen modules over :mod:`jaxnorm.functional`: drop-in normalization layers and weight-space layers."""

from jaxnorm.nn.normalization import BatchNorm, GroupNorm, InstanceNorm, LayerNorm, RMSNorm
from jaxnorm.nn.weight import (
    BoundedWeightNormConv,
    BoundedWeightNormDense,
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
