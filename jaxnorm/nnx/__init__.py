"""flax.nnx modules over :mod:`jaxnorm.functional`: drop-in normalization layers and weight-space layers.

The NNX twins of :mod:`jaxnorm.nn`: the same class names and jaxnorm arguments, flax.nnx's constructors.
"""

from jaxnorm.functional.magnitude import mp_concat, mp_silu, mp_sum
from jaxnorm.nnx.normalization import BatchNorm, GroupNorm, InstanceNorm, LayerNorm, RMSNorm
from jaxnorm.nnx.weight import (
    BoundedWeightNormConv,
    BoundedWeightNormDense,
    Constant,
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
    "Constant",
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
