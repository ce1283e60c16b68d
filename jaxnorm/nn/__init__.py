"""flax.linen modules over :mod:`jaxnorm.functional`: drop-in normalization layers and weight-space layers."""

from jaxnorm.functional.magnitude import mp_concat, mp_silu, mp_sum
from jaxnorm.nn.normalization import BatchNorm, GroupNorm, InstanceNorm, LayerNorm, RMSNorm
from jaxnorm.nn.weight import (
    BoundedWeightNormConv,
    BoundedWeightNormDense,
    MPConv,
    MPDense,
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
    "MPConv",
    "MPDense",
    "NormPropConv",
    "NormPropDense",
    "RMSNorm",
    "ScaledWeightNormConv",
    "ScaledWeightNormDense",
    "WSConv",
    "WeightNormConv",
    "WeightNormDense",
    "mp_concat",
    "mp_silu",
    "mp_sum",
]
