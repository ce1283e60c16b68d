"""Scale-invariance diagnostics: pure functions returning pytrees a training loop can log.

Per-unit weight norms, effective learning rate, angular update, ``<w, g>`` and predicted norm
growth (:mod:`.norms`); the rotational-equilibrium angle (:mod:`.equilibrium`);
input-span projection (:mod:`.input_span`); generalized-Gaussian shape fit
(:mod:`.ggd`); top Hessian eigenvalue (:mod:`.hessian`); gradient predictiveness
(:mod:`.predictiveness`).
"""

from jaxnorm.diagnostics.equilibrium import EQUILIBRIUM_OPTIMIZERS, equilibrium_angular_update
from jaxnorm.diagnostics.ggd import GeneralizedGaussianFit, fit_generalized_gaussian
from jaxnorm.diagnostics.hessian import HessianEigen, hessian_top_eigenvalue, hvp
from jaxnorm.diagnostics.input_span import InputSpanProjection, conv_patches, input_span_projection
from jaxnorm.diagnostics.norms import (
    angular_update,
    effective_learning_rate,
    per_unit,
    predicted_norm_growth,
    unit_norms,
    weight_gradient_inner,
)
from jaxnorm.diagnostics.predictiveness import GradientPredictiveness, gradient_predictiveness

__all__ = [
    "EQUILIBRIUM_OPTIMIZERS",
    "GeneralizedGaussianFit",
    "GradientPredictiveness",
    "HessianEigen",
    "InputSpanProjection",
    "angular_update",
    "conv_patches",
    "effective_learning_rate",
    "equilibrium_angular_update",
    "fit_generalized_gaussian",
    "gradient_predictiveness",
    "hessian_top_eigenvalue",
    "hvp",
    "input_span_projection",
    "per_unit",
    "predicted_norm_growth",
    "unit_norms",
    "weight_gradient_inner",
]
