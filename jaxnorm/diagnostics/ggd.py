"""Maximum-likelihood fit of a generalized Gaussian to weight values (Liu et al., Sec. 4.2, Fig. 5-6).

The generalized Gaussian (generalized normal, Nadarajah 2005) has density

    p(x) = beta / (2 alpha Gamma(1 / beta)) * exp(-(|x - mu| / alpha)^beta).

``beta = 2`` is a Gaussian, ``beta = 1`` a Laplacian, ``beta < 2`` heavy-tailed / sparse weights,
``beta -> inf`` uniform (Liu et al. use ``beta`` to show that WD and WRS make early-layer kernels
sparse in their input span). For a fixed location, with ``y = |x - mu|``, ``S(b) = mean(y^b)`` and
``T(b) = mean(y^b log y)``, the maximum-likelihood scale is ``alpha = (beta S(beta))^(1 / beta)`` and
the shape solves (Varanasi & Aazhang, *Parametric generalized Gaussian density estimation*, JASA
1989, Eq. 2.6, multiplied by ``beta``)

    f(beta) = beta + psi(1 / beta) + log(beta S(beta)) - beta T(beta) / S(beta) = 0,

with ``f > 0`` where the profile likelihood still increases. The profile likelihood can have several
local maxima, so :func:`fit_generalized_gaussian` first locates the best of a log-spaced grid over
``beta_range`` and then bisects ``f`` in ``log beta`` next to it (jit-able, fixed iteration count), on
``y / max(y)`` so that ``y^beta`` cannot overflow (``beta`` does not depend on the scale of ``y``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxnorm.functional.checks import is_int

__all__ = ["GeneralizedGaussianFit", "fit_generalized_gaussian"]


class GeneralizedGaussianFit(NamedTuple):
    """``beta`` (shape), ``scale`` (alpha) and ``loc`` (mu) of a generalized Gaussian."""

    beta: jax.Array
    scale: jax.Array
    loc: jax.Array


def _shape_equation(beta: jax.Array, y: jax.Array, log_y: jax.Array, positive: jax.Array):
    """``f(beta)`` above and ``S(beta)``; ``y`` in ``[0, 1]``, zeros masked out of ``log y``."""
    y_beta = jnp.where(positive, jnp.exp(beta * log_y), 0.0)
    s = jnp.mean(y_beta)
    t = jnp.mean(y_beta * log_y)
    f = beta + jax.scipy.special.digamma(1.0 / beta) + jnp.log(beta * s) - beta * t / s
    return f, s


def _profile_nll(beta: jax.Array, y: jax.Array, log_y: jax.Array, positive: jax.Array) -> jax.Array:
    """Mean negative log-likelihood at the MLE scale, less the constant ``log(2 max|x - mu|)``:
    ``-log beta + log(beta S) / beta + log Gamma(1 / beta) + 1 / beta`` (``mean((y / alpha)^beta)
    = 1 / beta`` at ``alpha = (beta S)^(1 / beta)``)."""
    _, s = _shape_equation(beta, y, log_y, positive)
    inv = 1.0 / beta
    return -jnp.log(beta) + inv * jnp.log(beta * s) + jax.scipy.special.gammaln(inv) + inv


_GRID_POINTS = 128


def fit_generalized_gaussian(
    x: jax.Array,
    *,
    loc: float | jax.Array | None = 0.0,
    beta_range: tuple[float, float] = (0.05, 50.0),
    num_iters: int = 60,
) -> GeneralizedGaussianFit:
    """Maximum-likelihood generalized-Gaussian fit of all values of ``x`` (any shape).

    ``beta`` maximises the profile likelihood over ``beta_range``, which can have several local
    maxima (small samples, quantised values): the profile negative log-likelihood is evaluated on 128
    points evenly spaced in ``log beta``, and the root of ``f`` is bisected between the neighbours of
    the best point (kept only if it is at least as likely). ``x - mu`` is formed after both are
    multiplied by a power of two that brings them below 1/2, so it cannot overflow.

    Data with exact zeros (e.g. quantised or pruned kernels) have an unbounded likelihood as
    ``beta -> 0`` (a share ``p < 1`` of nonzero values adds ``log(p) / beta`` to the log-likelihood),
    so the MLE degenerates; this fit does not treat zeros apart and returns the best ``beta`` inside
    ``beta_range``, which is ``beta_range[0]`` once zeros are frequent enough. Fit ``x[x != 0]`` to
    describe the nonzero values.

    Args:
      x: samples, e.g. a kernel or its input-span projection; at least float32 is used.
      loc: the location ``mu``; ``0.0`` (default) for weights, a finite value, or ``None`` for the
        sample mean (the exact MLE of ``mu`` is the mean only for ``beta = 2``).
      beta_range: the bracket ``(low, high)`` searched, finite with ``0 < low < high``; the result
        lies in it (uniform data -> upper end).
      num_iters: bisection steps in ``log beta`` inside the best grid bracket, a positive int
        (Python or NumPy).

    Returns:
      :class:`GeneralizedGaussianFit` of scalars. All-zero ``x`` gives ``beta = beta_range[0]``,
      ``scale = 0``; ``x`` holding a NaN or an infinity gives NaN ``beta`` and ``scale``. ``scale``
      is infinite where it exceeds the float range of ``x`` (``beta`` is still finite).

    Raises:
      ValueError: ``beta_range``, ``num_iters`` or a concrete ``loc`` malformed, or ``x`` with fewer
        than 2 values.

    References:
      Liu et al., *The implicit biases of SGD on deep neural networks with batch normalization*,
      Sec. 4.2, Fig. 5; Nadarajah, *A generalized normal distribution*, J. Appl. Stat. 32 (2005);
      Varanasi & Aazhang (1989), Sec. 2.
    """
    low, high = _check_beta_range(beta_range)
    if not is_int(num_iters) or num_iters < 1:
        raise ValueError(f"fit_generalized_gaussian: num_iters must be a positive int, got {num_iters!r}")
    num_iters = int(num_iters)
    if loc is not None and not isinstance(loc, jax.core.Tracer):
        loc_value = np.asarray(loc)
        real = np.issubdtype(loc_value.dtype, np.integer) or np.issubdtype(loc_value.dtype, np.floating)
        if loc_value.shape != () or not real or not np.isfinite(loc_value):
            raise ValueError(f"fit_generalized_gaussian: loc must be None or a finite number, got {loc!r}")
    try:
        x = jnp.asarray(x)
    except (TypeError, ValueError):
        raise TypeError(f"fit_generalized_gaussian: x must be an array of real numbers, got {x!r}") from None
    kind = x.dtype
    if not (jnp.issubdtype(kind, jnp.floating) or jnp.issubdtype(kind, jnp.integer)):
        raise TypeError(f"fit_generalized_gaussian: x must hold real numbers, got dtype {kind}")
    if jnp.size(x) < 2:
        raise ValueError(f"fit_generalized_gaussian: x needs at least 2 values, got shape {jnp.shape(x)}")
    dtype = jnp.promote_types(kind, jnp.float32)
    values = jnp.ravel(x).astype(dtype)
    # Work on values * 2^-e, 2^e above twice the largest magnitude of the values and of mu (e clamped
    # so that 2^-e is a normal number): exact, and mean(x) and |x - mu| cannot overflow.
    bound = -jnp.finfo(dtype).minexp - 1
    magnitude = jnp.max(jnp.abs(values))
    if loc is not None:
        magnitude = jnp.maximum(magnitude, jnp.abs(jnp.asarray(loc, dtype)))
    exponent = jnp.clip(jnp.frexp(magnitude)[1] + 1, -bound, bound)
    shrunk = values * jnp.ldexp(jnp.ones((), dtype), -exponent)
    if loc is None:
        mu_shrunk = jnp.mean(shrunk)
        mu = jnp.ldexp(mu_shrunk, exponent)
    else:
        mu = jnp.asarray(loc, dtype)
        mu_shrunk = mu * jnp.ldexp(jnp.ones((), dtype), -exponent)
    deviations = jnp.abs(shrunk - mu_shrunk)  # |x - mu| 2^-e, at most 1
    largest = jnp.max(deviations)
    unit = largest > 0
    # y = deviations / largest, both first multiplied by 2^-e2 with 2^e2 just above ``largest``: the
    # division never needs the reciprocal of a number near the float range limits.
    shrink = jnp.ldexp(jnp.ones((), dtype), -jnp.clip(jnp.frexp(largest)[1], -bound, bound))
    y = (deviations * shrink) / jnp.where(unit, largest * shrink, 1.0)
    positive = y > 0
    log_y = jnp.where(positive, jnp.log(jnp.where(positive, y, 1.0)), 0.0)

    log_low, log_high = jnp.log(jnp.asarray(low, dtype)), jnp.log(jnp.asarray(high, dtype))
    log_grid = jnp.linspace(log_low, log_high, _GRID_POINTS, dtype=dtype)
    nll = jax.lax.map(lambda lb: _profile_nll(jnp.exp(lb), y, log_y, positive), log_grid)
    best = jnp.argmin(jnp.where(jnp.isnan(nll), jnp.inf, nll))

    def bisect(_, bracket):
        lo, hi = bracket
        mid = 0.5 * (lo + hi)
        f, _ = _shape_equation(jnp.exp(mid), y, log_y, positive)
        increasing = f > 0
        return jnp.where(increasing, mid, lo), jnp.where(increasing, hi, mid)

    bracket = (log_grid[jnp.maximum(best - 1, 0)], log_grid[jnp.minimum(best + 1, _GRID_POINTS - 1)])
    lo, hi = jax.lax.fori_loop(0, num_iters, bisect, bracket)
    refined = jnp.clip(jnp.exp(0.5 * (lo + hi)), low, high)
    on_grid = jnp.clip(jnp.exp(log_grid[best]), low, high)
    better = _profile_nll(refined, y, log_y, positive) <= nll[best]
    beta = jnp.where(better, refined, on_grid)
    beta = jnp.where(unit, beta, jnp.asarray(low, dtype))
    _, s = _shape_equation(beta, y, log_y, positive)
    scale = jnp.where(unit, jnp.ldexp(largest * (beta * s) ** (1.0 / beta), exponent), 0.0)
    # a NaN or infinite value (a diverged kernel) has no fit: NaN, not the all-zero answer
    finite = jnp.isfinite(magnitude) & jnp.isfinite(largest)
    beta, scale = (jnp.where(finite, v, jnp.nan) for v in (beta, scale))
    return GeneralizedGaussianFit(beta=beta, scale=scale, loc=mu)


def _check_beta_range(beta_range: object) -> tuple[float, float]:
    """``(low, high)``: two finite real numbers with ``0 < low < high``."""
    try:
        if isinstance(beta_range, str | bytes) or any(isinstance(b, bool | str) for b in beta_range):
            raise TypeError
        low, high = beta_range
        low, high = float(low), float(high)
    except (TypeError, ValueError):
        raise ValueError(
            f"fit_generalized_gaussian: beta_range must be a pair (low, high) of numbers, got {beta_range!r}"
        ) from None
    if not (math.isfinite(low) and math.isfinite(high) and 0 < low < high):
        raise ValueError(
            f"fit_generalized_gaussian: beta_range must be finite with 0 < low < high, got {beta_range!r}"
        )
    return low, high
