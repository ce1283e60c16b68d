"""The CPU-only scheduling forms of the functional core, chosen per platform in this one place.

XLA:CPU writes an elementwise expression of ``x`` to memory when two consumers share it (a reduction and
the output pass, or two reductions), where recomputing it inside each would be cheaper; XLA:GPU and TPU
fuse such producers into every consumer themselves. :func:`distinct` and :func:`separate_reads` give
XLA:CPU separate HLO values (``optimization_barrier``) and are the identity on every other platform: the
barrier is in the CPU branch of :func:`jax.lax.platform_dependent` only, so a lowering for ``cuda`` or
``tpu`` contains none.
Their measured effect on CPU is in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

__all__ = ["distinct", "no_copy", "per_platform", "separate_reads"]


def _on_cpu_only(barrier, values):
    """``barrier(values)`` when lowered for CPU, ``values`` unchanged on every other platform."""
    return lax.platform_dependent(values, cpu=barrier, default=lambda v: v)


def distinct(stat: jnp.ndarray, tag: int = 0) -> jnp.ndarray:
    """The same small statistic as a separate HLO value on CPU (the identity elsewhere).

    A reduction over ``x - distinct(mean)`` then shares no full-size temporary with another consumer's
    ``x - mean``, which XLA:CPU would write to memory rather than recompute in each. Different ``tag``
    values give copies that are distinct from each other too.
    """
    return _on_cpu_only(lambda s: lax.optimization_barrier((s,) * (tag + 1))[tag], stat)


def no_copy(stat: jnp.ndarray, tag: int = 0) -> jnp.ndarray:
    """:func:`distinct`'s plain form on every platform: ``stat`` itself, for a kernel that takes its
    copies as an argument and makes none where they do not pay (half-precision input, a pass that
    measures faster without)."""
    return stat


def separate_reads(x: jnp.ndarray, num: int) -> tuple[jnp.ndarray, ...]:
    """``num`` aliases of a half-precision ``x`` that XLA:CPU widens to float32 separately, one per
    reduction, instead of writing one shared float32 copy to memory (the identity elsewhere, and for
    ``x`` of float32 or wider, where there is nothing to widen)."""
    if x.dtype == jnp.promote_types(x.dtype, jnp.float32):
        return (x,) * num
    return _on_cpu_only(lambda v: lax.optimization_barrier(v), (x,) * num)


def per_platform(cpu_form, default_form, *args):
    """``cpu_form(*args)`` when lowered for CPU, ``default_form(*args)`` on every other platform.

    For the two places where XLA:CPU's fast form and the form GPU/TPU fuse differ in numerics, not only
    in scheduling: last-axis RMS norm (:func:`jaxnorm.functional.rms_norm`), whose default form keeps
    rows of mean square beyond the dtype's maximum in a unit and whose CPU form, XLA:CPU's one fused
    kernel, gives zeros there, as flax's does; and :func:`jaxnorm.functional.normalize` with
    ``scaled_deviations=False``, whose CPU form folds the unit into the inverse instead of scaling the
    deviations, exact except within a factor ``n`` of the dtype's maximum (measurements in
    ``docs/benchmarks.md``). Elsewhere the two forms give the same values and differ in whether a
    conditional skips work that ordinary input does not need (:func:`jaxnorm.functional.moments.mean_m2_unit`,
    :func:`jaxnorm.functional.units.refinement_where_needed`): XLA:CPU runs one branch, GPU and TPU lower
    the branch-free form."""
    return lax.platform_dependent(*args, cpu=cpu_form, default=default_form)
