"""The L2 dispersion, ``sigma_hat = sqrt(M2 / n)``: the biased standard deviation that flax and PyTorch
use (Ioffe & Szegedy, *Batch normalization*, ICML 2015, Alg. 1).

Count, mean and ``M2`` come from :func:`jaxnorm.functional.moments.local_moments` (stable shifted sums),
merged over the channels of a group and over devices with Chan et al.'s formula: one collective, an
all-gather of count, mean and M2 (:func:`jaxnorm.functional.collectives.gather_combine`).
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxnorm.functional.collectives import gather_combine
from jaxnorm.functional.moments import group_combine, local_moments
from jaxnorm.functional.options import BatchOptions
from jaxnorm.functional.reduction import Reduction, empty_statistics, masked_mean

__all__ = ["l2_statistics"]


def l2_statistics(r: Reduction, options: BatchOptions) -> tuple[jnp.ndarray, jnp.ndarray]:
    """``(mean, M2 / n)`` of ``r.x`` over ``r.axes``, keepdims; the variance itself, not the square of
    its root. A constant group has an exact mean and ``M2 = 0`` (the shifted-data pass of
    :func:`~jaxnorm.functional.moments.local_moments`)."""
    moments = local_moments(r.x, r.axes, mask=r.mask, with_m2=True, one_pass=options.use_fast_variance)
    moments = group_combine(moments, r.groups)
    if r.axis_name is not None:
        moments, _, _ = gather_combine(moments, r.axis_name, r.axis_index_groups)
    moments = masked_mean(moments, r.mask)
    var = moments.m2 / jnp.maximum(moments.count, 1)
    return moments.mean, empty_statistics(var, moments.count, r.mask)
