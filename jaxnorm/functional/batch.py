"""Batch statistics and batch normalization: Lp (Norm matters, Sec. 3), top-k, ghost batches
(Hoffer, Hubara & Soudry, *Train longer, generalize better*, NeurIPS 2017, Sec. 4), masks, mean-only
(Salimans & Kingma, *Weight normalization*, NeurIPS 2016, Sec. 2.2), cross-device statistics; and the
validated options value :class:`BatchOptions` (defined in :mod:`.options`), which travels down
unchanged from the public functions and the modules to the kernels.

References:
  Ioffe & Szegedy, *Batch normalization*, ICML 2015, Alg. 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax.numpy as jnp

from jaxnorm.functional.calibration import Calibration
from jaxnorm.functional.checks import (
    PNorm,
    canonical_axes,
    check_axis_name,
    check_bool,
    check_epsilon,
    check_floating,
    check_mask,
)
from jaxnorm.functional.collectives import AxisIndexGroups, axis_size
from jaxnorm.functional.dispersion import dispersion_statistics
from jaxnorm.functional.moments import stats_dtype, widened_float16
from jaxnorm.functional.normalize import normalize
from jaxnorm.functional.options import BatchOptions, check_batch_options
from jaxnorm.functional.units import Statistics, needs_tiny_unit, reported_sigma, true_variance

__all__ = [
    "BatchOptions",
    "batch_gives_statistics",
    "batch_moments",
    "batch_norm",
    "batch_statistics",
    "batch_statistics_with_unit",
    "batch_stats",
    "check_batch_options",
    "ghost_batches",
    "normalize_batch",
]


def _statistics_size(
    shape: tuple[int, ...], features: tuple[int, ...], virtual_batch_size: int | None
) -> int:
    """Elements per feature that batch statistics reduce over: every axis but ``features``, with axis 0
    cut into ghost batches of ``virtual_batch_size``."""
    batch = 1 if 0 in features else shape[0] if virtual_batch_size is None else virtual_batch_size
    return batch * math.prod(n for a, n in enumerate(shape) if a != 0 and a not in features)


def batch_gives_statistics(
    shape: tuple[int, ...],
    features: tuple[int, ...],
    virtual_batch_size: int | None = None,
    topk: int | None = None,
) -> bool:
    """Whether a batch of ``shape`` (feature axes ``features``) has the 2 elements per feature (per
    ghost batch of ``virtual_batch_size`` along axis 0) that :func:`batch_moments` needs, and at least
    ``topk`` of them where given."""
    if virtual_batch_size is not None and (virtual_batch_size < 1 or shape[0] % virtual_batch_size):
        return False  # (an invalid virtual_batch_size is reported by check_batch_options)
    return _statistics_size(shape, features, virtual_batch_size) >= max(2, topk or 0)


def ghost_batches(x: jnp.ndarray, virtual_batch_size: int) -> jnp.ndarray:
    """Split axis 0 of ``x`` into ghost batches: ``(B, ...) -> (B // v, v, ...)``."""
    return x.reshape(x.shape[0] // virtual_batch_size, virtual_batch_size, *x.shape[1:])


def batch_moments(
    x: jnp.ndarray,
    *,
    p: PNorm | float = 2,
    axis: int | Sequence[int] = -1,
    topk: int | None = None,
    mask: jnp.ndarray | None = None,
    axis_name: str | Sequence[str] | None = None,
    axis_index_groups: AxisIndexGroups = None,
    calibration: Calibration = "paper",
    virtual_batch_size: int | None = None,
    use_fast_variance: bool = True,
    mean_only: bool = False,
    keepdims: bool = False,
) -> tuple[jnp.ndarray, jnp.ndarray | None]:
    """Batch ``(mean, var)`` per feature, ``var = sigma_hat**2`` — what BatchNorm keeps as running stats.

    Reduces over every axis but ``axis`` (the feature axis or axes). Arguments as :func:`batch_stats`;
    ``mean_only=True`` returns ``(mean, None)``. With ``virtual_batch_size=v`` the leading (batch) axis
    is split into ``x.shape[0] // v`` ghost batches with statistics of their own, returned stacked on a
    new leading axis. Statistics are float32 (or float64) whatever ``x``'s dtype; a variance beyond the
    dtype's range (huge input) is returned as its largest finite number (:func:`batch_stats` gives the
    exact ``sigma_hat``).
    """
    check_floating(x, "x")
    options = check_batch_options(p, topk, calibration, virtual_batch_size, mean_only, use_fast_variance)
    return batch_statistics(
        x,
        options,
        axis=axis,
        mask=mask,
        axis_name=axis_name,
        axis_index_groups=axis_index_groups,
        keepdims=keepdims,
    )


def batch_statistics(
    x: jnp.ndarray,
    options: BatchOptions,
    *,
    axis: int | Sequence[int] = -1,
    mask: jnp.ndarray | None = None,
    axis_name: str | Sequence[str] | None = None,
    axis_index_groups: AxisIndexGroups = None,
    keepdims: bool = False,
) -> tuple[jnp.ndarray, jnp.ndarray | None]:
    """:func:`batch_moments` with the options as one validated value (:func:`check_batch_options`)."""
    statistics = batch_statistics_with_unit(
        x,
        options,
        axis=axis,
        mask=mask,
        axis_name=axis_name,
        axis_index_groups=axis_index_groups,
        keepdims=keepdims,
    )
    return statistics.mean, true_variance(statistics)


def batch_statistics_with_unit(
    x: jnp.ndarray,
    options: BatchOptions,
    *,
    axis: int | Sequence[int] = -1,
    mask: jnp.ndarray | None = None,
    axis_name: str | Sequence[str] | None = None,
    axis_index_groups: AxisIndexGroups = None,
    keepdims: bool = False,
) -> Statistics:
    """:func:`batch_statistics` as :class:`~jaxnorm.functional.units.Statistics`: with ``p = 2`` the
    variance of huge input is that of ``x * unit`` (what :func:`normalize_batch` takes)."""
    check_floating(x, "x")
    if not isinstance(options, BatchOptions):
        raise TypeError(f"options must be a BatchOptions (see check_batch_options), got {options!r}")
    check_axis_name(axis_name)
    keepdims = check_bool(keepdims, "keepdims")
    features = canonical_axes(axis, x.ndim, "axis")
    mask = check_mask(mask, x)
    given_shape = x.shape
    virtual_batch_size = options.virtual_batch_size
    size = _statistics_size(x.shape, features, virtual_batch_size)
    if virtual_batch_size is not None:
        if 0 in features:
            raise ValueError(
                "virtual_batch_size splits axis 0 (the batch axis), which must not be a feature axis"
            )
        if x.shape[0] % virtual_batch_size:
            raise ValueError(
                f"virtual_batch_size={virtual_batch_size} must divide the batch size x.shape[0]={x.shape[0]} "
                "(the batch this call sees: under pmap or shard_map, each device's own part)"
            )
        if axis_name is not None:
            raise ValueError(
                "virtual_batch_size (ghost batch norm) and axis_name are exclusive: ghost "
                "batches are formed from each device's local batch"
            )
        x = ghost_batches(x, virtual_batch_size)
        mask = None if mask is None else ghost_batches(mask, virtual_batch_size)
        features = (0, *(a + 1 for a in features))
    reduce_axes = tuple(a for a in range(x.ndim) if a not in features)
    if axis_name is None and size < 2:
        if virtual_batch_size is not None:
            raise ValueError(
                f"batch statistics need at least 2 elements per feature, and virtual_batch_size="
                f"{virtual_batch_size} leaves {size} per ghost batch (ghost batches of shape {x.shape[1:]}, "
                f"feature axis={axis!r}); use a larger virtual_batch_size"
            )
        raise ValueError(
            f"batch statistics need at least 2 elements per feature, got a reduction of size {size} "
            f"(x.shape={x.shape}, feature axis={axis!r}); use layer/group norm for single examples"
        )
    if options.topk is not None:
        devices = axis_size(axis_name, axis_index_groups)
        if options.topk > size * devices:
            across = "" if devices == 1 else f" x {devices} devices of axis_name={axis_name!r}"
            ghosts = "" if virtual_batch_size is None else f" per ghost batch ({virtual_batch_size=})"
            raise ValueError(
                f"topk={options.topk} exceeds the reduction size {size}{across}{ghosts} "
                f"(x.shape={given_shape}, axis={axis!r})"
            )
    statistics = dispersion_statistics(
        x, reduce_axes, options, mask=mask, axis_name=axis_name, axis_index_groups=axis_index_groups
    )
    if keepdims:
        return statistics
    return Statistics(*(None if a is None else jnp.squeeze(a, reduce_axes) for a in statistics))


def batch_stats(
    x: jnp.ndarray,
    *,
    p: PNorm | float = 2,
    axis: int | Sequence[int] = -1,
    topk: int | None = None,
    mask: jnp.ndarray | None = None,
    axis_name: str | Sequence[str] | None = None,
    axis_index_groups: AxisIndexGroups = None,
    calibration: Calibration = "paper",
    virtual_batch_size: int | None = None,
    use_fast_variance: bool = True,
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Per-feature batch ``(mean, sigma_hat)`` with the Lp dispersion of *Norm matters* (Sec. 3).

    ``sigma_hat`` is the std for ``p=2``, ``sqrt(pi/2) * mean|x - mu|`` for ``p=1``,
    ``C(n) * max|x - mu|`` for ``p='inf'`` and ``C(n) * mean of the top-k |x - mu|`` with ``topk=k``
    (suppl. Eq. 1); ``calibration='exact'`` replaces ``C(n)`` by ``1 / E[top-k mean of n |N(0,1)|]``
    (:func:`expected_topk_abs_normal`), unbiased on Gaussian data where the paper's constant is not.

    Args:
      x: floating input; statistics are float32 (or float64) whatever its dtype.
      p: 2, 1 or 'inf' (``float('inf')`` accepted).
      axis: the feature axis or axes, kept; every other axis is reduced.
      topk: with ``p='inf'``, average the ``topk`` largest deviations instead of taking the max.
      mask: boolean, broadcastable to ``x``; only True elements enter the statistics.
      axis_name: a mapped axis (``pmap``/``shard_map``) over which the statistics are global; exact for
        unequal numbers of unmasked elements per device. Under plain ``jit`` with a sharded global batch
        no axis name is needed.
      axis_index_groups: groups of devices along ``axis_name`` with separate statistics.
      calibration: 'paper' (default) or 'exact' for ``p='inf'``.
      virtual_batch_size: ghost batch norm — statistics per sub-batch of axis 0 (stacked on a new axis 0).
      use_fast_variance: one pass over the data (stable shifted sums, the default) or two passes.

    Returns:
      ``(mean, sigma_hat)``, each of the features' shape. Where ``sigma_hat`` is 0 (a constant feature)
      its gradient is 0. For ``p=1`` the gradient of ``|x - mu|`` takes the subgradient +1 above the mean
      and -1 at or below it (ties with the mean are the only elements where it differs from ``sign``).
    """
    check_floating(x, "x")
    options = check_batch_options(p, topk, calibration, virtual_batch_size, False, use_fast_variance)
    # tiny groups kept in a unit, as at epsilon = 0: a sigma_hat whose square underflows is still a float
    options = options._replace(tiny_groups=True)
    statistics = batch_statistics_with_unit(
        x, options, axis=axis, mask=mask, axis_name=axis_name, axis_index_groups=axis_index_groups
    )
    return statistics.mean, reported_sigma(statistics)


def batch_norm(
    x: jnp.ndarray,
    *,
    p: PNorm | float = 2,
    axis: int | Sequence[int] = -1,
    topk: int | None = None,
    epsilon: float = 1e-5,
    mask: jnp.ndarray | None = None,
    axis_name: str | Sequence[str] | None = None,
    axis_index_groups: AxisIndexGroups = None,
    calibration: Calibration = "paper",
    virtual_batch_size: int | None = None,
    mean_only: bool = False,
    use_fast_variance: bool = True,
) -> jnp.ndarray:
    """Batch normalization with the Lp dispersion of *Norm matters* (Hoffer et al. 2018, Sec. 3):

        y = (x - mu_B) / sqrt(sigma_hat_B^2 + epsilon)

    with ``mu_B`` and ``sigma_hat_B`` per feature over every axis but ``axis`` (see
    :func:`jaxnorm.functional.batch_stats` for ``p``, ``topk``, ``calibration``, ``mask``,
    ``axis_name``). ``virtual_batch_size`` normalizes each ghost batch of axis 0 with its own statistics
    (Hoffer et al. 2017, Sec. 4). ``mean_only=True`` is ``y = x - mu_B`` (Salimans & Kingma 2016,
    Sec. 2.2), the companion of bounded weight norm. Gradients flow through ``mu_B`` and ``sigma_hat_B``.
    """
    epsilon = check_epsilon(epsilon)
    check_floating(x, "x")
    options = check_batch_options(p, topk, calibration, virtual_batch_size, mean_only, use_fast_variance)
    options = options._replace(tiny_groups=needs_tiny_unit(epsilon, stats_dtype(x)))
    out_dtype, x = x.dtype, widened_float16(x)
    statistics = batch_statistics_with_unit(
        x,
        options,
        axis=axis,
        mask=mask,
        axis_name=axis_name,
        axis_index_groups=axis_index_groups,
        keepdims=True,
    )
    return normalize_batch(
        x,
        statistics.mean,
        statistics.var,
        virtual_batch_size=options.virtual_batch_size,
        epsilon=epsilon,
        dtype=out_dtype,
        unit=statistics.unit,
    )


def normalize_batch(
    x: jnp.ndarray,
    mean: jnp.ndarray,
    var: jnp.ndarray | None,
    *,
    virtual_batch_size: int | None,
    scale: jnp.ndarray | None = None,
    bias: jnp.ndarray | None = None,
    epsilon: float = 1e-5,
    dtype: jnp.dtype | None = None,
    unit: jnp.ndarray | None = None,
    scaled_deviations: bool = True,
) -> jnp.ndarray:
    """:func:`normalize` with keepdims batch statistics, per ghost batch when ``virtual_batch_size``
    is given (the statistics then carry the leading ghost axis of :func:`batch_moments`); ``unit`` and
    ``scaled_deviations`` as :func:`normalize`'s."""
    affine = dict(
        scale=scale, bias=bias, epsilon=epsilon, dtype=dtype, unit=unit, scaled_deviations=scaled_deviations
    )
    if virtual_batch_size is None:
        return normalize(x, mean, var, **affine)
    return normalize(ghost_batches(x, virtual_batch_size), mean, var, **affine).reshape(x.shape)
