"""Per-example L2 normalization over any axes, with its derivative written out: instance norm
(Ulyanov et al. 2016), layer norm over several axes (Ba, Kiros & Hinton 2016, Sec. 3) and group norm
(Wu & He, ECCV 2018, Eq. 1-3) at ``p = 2`` without a mask or a mapped axis.

``y = xhat * scale + bias`` with ``xhat = (x - mu) * rsqrt(sigma_hat^2 + epsilon)`` over a group (the
``axes`` of one example, merged over the channels of a channel group). Its derivative
(Ba et al. 2016, Sec. 3, differentiated) is

    d xhat = (dx - m(dx)) / s - xhat * m(xhat * dx) / s,    s = sqrt(sigma_hat^2 + epsilon),

``m`` the group mean: two group reductions of the cotangent in the backward pass, where autodiff of the
statistics would differentiate through the mean twice and through the unit the statistics may be kept
in (:mod:`jaxnorm.functional.units`). The statistics are those of every other norm
(:func:`~jaxnorm.functional.dispersion.dispersion_statistics`: exact means of constant groups, huge
groups in a unit), so the output is the one :func:`~jaxnorm.functional.normalize.normalize` gives.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxnorm.functional.dispersion import dispersion_statistics
from jaxnorm.functional.moments import ChannelGroups, group_reduce
from jaxnorm.functional.options import BatchOptions
from jaxnorm.functional.platform import distinct, no_copy
from jaxnorm.functional.tangents import instantiate_zeros
from jaxnorm.functional.units import inverse_std, unit_deviations

__all__ = ["L2Groups", "l2_normalize"]


class L2Groups(NamedTuple):
    """The groups of a per-example L2 normalization: the ``axes`` of one example, merged over the
    channels of ``groups`` (group norm), the ``epsilon`` added to ``sigma_hat^2``, and whether the
    one-pass moments are used (``use_fast_variance``)."""

    axes: tuple[int, ...]
    groups: ChannelGroups | None
    epsilon: float
    use_fast_variance: bool = True

    def mean(self, values: jnp.ndarray) -> jnp.ndarray:
        """``m(values)``: the keepdims mean over a group (channel groups have equal counts, so the mean
        of the channel means)."""
        return group_reduce(jnp.mean(values, self.axes, keepdims=True), self.groups, jnp.mean)


def _statistics(x: jnp.ndarray, g: L2Groups):
    options = BatchOptions(p=2, use_fast_variance=g.use_fast_variance)
    statistics = dispersion_statistics(x, g.axes, options, groups=g.groups)
    return statistics.mean, inverse_std(statistics, g.epsilon), statistics.unit


@functools.partial(jax.custom_jvp, nondiff_argnums=(3,))
def l2_normalize(x: jnp.ndarray, scale: jnp.ndarray, bias: jnp.ndarray, g: L2Groups) -> jnp.ndarray:
    """``(x - mu) * rsqrt(sigma_hat^2 + epsilon) * scale + bias`` over the groups ``g``, in the statistics
    dtype (float32 or wider), ``scale`` and ``bias`` broadcasting against ``x``; the deviations taken in
    the groups' unit, ``(x * unit - mu * unit) * rsqrt(var + epsilon * unit^2)`` (``var`` that of
    ``x * unit``). Custom JVP: the formula of the module docstring (:func:`_l2_normalize_jvp`)."""
    mean, inv, unit = _statistics(x, g)
    return unit_deviations(x.astype(mean.dtype), mean, unit) * (inv * scale) + bias


def _l2_normalize_jvp(g: L2Groups, primals, tangents):
    x, scale, bias = primals
    x_dot, scale_dot, bias_dot = (instantiate_zeros(t) for t in tangents)
    mean, inv, unit = _statistics(x, g)
    wide = x.astype(mean.dtype)
    y = unit_deviations(wide, mean, unit) * (inv * scale) + bias
    # XLA:CPU's copies of the statistics pay on float32 input and cost on bfloat16 (docs/benchmarks.md,
    # "Per-example L2 derivative"): half-precision input takes the plain form on every platform
    copies = distinct if x.dtype == wide.dtype else no_copy
    y_dot = _tangent(g, copies, wide, mean, inv, unit, scale, x_dot.astype(wide.dtype), scale_dot)
    return y, y_dot + bias_dot


l2_normalize.defjvp(_l2_normalize_jvp, symbolic_zeros=True)


def _tangent(g: L2Groups, copies, wide, mean, inv, unit, scale, x_dot, scale_dot) -> jnp.ndarray:
    """``d(xhat * scale)`` with the deviations in the groups' unit ``u`` (``1 / s = inv * u``):
    ``inv * (dx u - m(dx u)) * scale + xhat * (dscale - inv * scale * m(xhat * dx u))``, exact at every
    magnitude. Grouped so that the transpose reduces the cotangent to per-group sums only (one
    ``sum(ct * xhat)`` serves the scale and the mean term) and subtracts no group sum (whose negation
    XLA:CPU computes in a kernel of its own, which it then does not fuse into the final pass).
    ``copies`` is :func:`~jaxnorm.functional.platform.distinct` on XLA:CPU for float32 input: each
    full-size use of ``xhat`` and of the unit recomputed from its own copy of the statistics, where
    XLA:CPU would otherwise write a shared ``x * u - mu * u`` (or a broadcast unit) to memory; the
    identity on GPU and TPU."""

    def xhat(tag: int) -> jnp.ndarray:
        tag_unit = copies(unit, tag)
        return unit_deviations(wide, copies(mean, tag), tag_unit) * copies(inv, tag)

    x_dot = x_dot * copies(unit, 4)
    factor = inv * scale
    return (
        x_dot * copies(factor, 3)
        + g.mean(x_dot) * (-factor)
        + xhat(1) * (scale_dot + (-factor) * g.mean(xhat(2) * x_dot))
    )
