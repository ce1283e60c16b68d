"""The functional core: pure, jit-able normalization functions on arrays (no Flax, no optax).

One concept per module: :mod:`.calibration` (Gaussian constants), :mod:`.moments` (mean / M2, shifted
sums, Chan merge, channel groups), :mod:`.collectives` (the cross-device reduction), :mod:`.options`
(:class:`~.options.BatchOptions`, the statistics' options as one value), :mod:`.reduction` (what a
dispersion reduces, exact means, extremes), :mod:`.dispersion` (sigma_hat per p behind one table:
:mod:`.dispersion_l2`, :mod:`.dispersion_l1`, :mod:`.dispersion_linf`, :mod:`.dispersion_topk`),
:mod:`.units` (statistics of huge and tiny groups kept in a unit), :mod:`.batch` (batch statistics and
batch norm), :mod:`.normalize` (the normalization and affine map every norm ends in),
:mod:`.per_example` (layer / group / instance / RMS norm), :mod:`.last_axis` (their fused kernels over
the last axis), :mod:`.complex_norm` (complex input, as flax), :mod:`.normprop` (NormProp's ReLU),
:mod:`.weight` (weight-space normalizations),
:mod:`.magnitude` (EDM2's magnitude-preserving blocks), :mod:`.platform` (the XLA:CPU-only scheduling
forms), :mod:`.layers` (the Flax modules' forward passes). ``stats`` and ``activation`` are
compatibility re-exports of the first ones.
"""

from jaxnorm.functional.batch import batch_moments, batch_norm, batch_stats
from jaxnorm.functional.calibration import L1_CONSTANT, expected_topk_abs_normal, linf_constant
from jaxnorm.functional.magnitude import MP_SILU_SCALE, mp_concat, mp_normalize, mp_silu, mp_sum, mp_weight
from jaxnorm.functional.normalize import normalize
from jaxnorm.functional.normprop import RELU_MEAN, RELU_STD, normprop_relu
from jaxnorm.functional.per_example import group_norm, instance_norm, layer_norm, rms_norm
from jaxnorm.functional.weight import (
    bounded_weight_norm,
    bounded_weight_norm_rho,
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
    "MP_SILU_SCALE",
    "RELU_MEAN",
    "RELU_STD",
    "batch_moments",
    "batch_norm",
    "batch_stats",
    "bounded_weight_norm",
    "bounded_weight_norm_rho",
    "expected_topk_abs_normal",
    "fans",
    "group_norm",
    "instance_norm",
    "layer_norm",
    "linf_constant",
    "mp_concat",
    "mp_normalize",
    "mp_silu",
    "mp_sum",
    "mp_weight",
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
