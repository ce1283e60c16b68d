"""Running-statistics transport: BatchNorm's running mean / variance follow a kernel's rescaling.

Dividing the output units of a kernel that feeds a BatchNorm (no bias, no non-linearity between)
by ``s > 0``, ``w' = w / s`` as weight rescaling (WRS), BWN projections and norm schedules do,
leaves the *training-mode* output unchanged (BN divides by the batch's own scale) but not the
*eval-mode* one: the running statistics still describe the old scale. With ``x' = x / s``,

    (x' - mean / s) * rsqrt(var / s^2 + eps) = (x - mean) * rsqrt(var + eps s^2)

so mapping ``mean -> mean / s`` and ``var -> var / s^2`` keeps eval-mode outputs unchanged up to
BN's epsilon (exact for eps = 0; the relative change is about ``eps (s^2 - 1) / (2 var)``).

:func:`batch_stats_map` finds, by tracing the eval-mode function with the same tracer as
:func:`jaxnorm.enorm.discover` (powers of the scale tracked, as for scale-invariant kernels),
which running statistics scale with which kernel and with which power; a kernel is listed only
where the transport is exact in this sense (not where a bias, an activation, or anything that is
not positively homogeneous sits between the kernel and the BN). Units feeding several BNs (AdvProp
/ domain-specific BN: the same output normalised by each) map to the statistics of all of them;
units that also reach anything else (the function output, a layer without running statistics) can
not be compensated by the statistics, and the kernel is left out. Units may reach a BN through a
slice or a concatenation: a statistic then sees some of the kernel's units (``StatLink.index``).
:func:`transport_batch_stats` applies the map to a ``scales`` tree such as the one
``jaxnorm.optim.last_scales(opt_state)`` gives (one factor per output unit of the kernel).

ENorm itself never needs this: its rescaling of a kernel is compensated by its consumer weights,
so a junction cannot end in a BN (BN's normalization cancels a per-unit scale, so a unit feeding a
BN has no consumer and :func:`~jaxnorm.enorm.discover` leaves it out; the junctions it finds in BN
networks run from a BN's gamma / beta, through ReLU, into the next kernel, and no running
statistic is on that path).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxnorm.enorm.discover import input_links
from jaxnorm.enorm.spec import get_leaf
from jaxnorm.enorm.trees import split_params

__all__ = ["StatLink", "batch_stats_map", "transport_batch_stats"]

PyTree = Any
Path = tuple[Any, ...]


class StatLink(NamedTuple):
    """One running statistic that scales with a kernel's output units.

    Attributes:
      path: keys into the ``batch_stats`` collection (e.g. ``("BatchNorm_0", "mean")``).
      power: the statistic is divided by ``s ** power`` (1 for a mean, 2 for a variance).
      index: ``None`` where the statistic has one element per output unit of the kernel (element i
        belongs to unit i), else an int array of the statistic's shape giving each element's unit
        (-1: not scaled), e.g. ``[0, 1, 2]`` for a BN after the slice ``[:, :3]`` of 4 units or
        ``[0, 1, 2, -1]`` for 3 units concatenated with another kernel's one.
    """

    path: Path
    power: int | float
    index: np.ndarray | None


def batch_stats_map(
    apply_fn: Callable, variables: PyTree, *args: Any, **kwargs: Any
) -> dict[Path, tuple[StatLink, ...]]:
    """``{kernel_path: (StatLink, ...)}``: the running statistics that scale with each kernel.

    Args:
      apply_fn: e.g. ``model.apply``, in **eval mode** (BN reading its running averages: pass
        ``train=False`` or the equivalent); called as ``apply_fn(variables, *args, **kwargs)``.
        For NNX: ``lambda v, x: nnx.merge(graphdef, v["params"], v["batch_stats"], rest)(x)``
        after ``model.eval()`` and ``graphdef, params, stats, rest = nnx.split(model, nnx.Param,
        nnx.BatchStat, ...)``.
      variables: ``{"params": ..., "batch_stats": ...}`` (dicts, ``FrozenDict`` or ``nnx.State``).
      *args, **kwargs: example inputs (only shapes and dtypes matter) and Python options.

    Returns:
      For every params leaf of rank >= 2 whose output units (last axis) feed running statistics
      exactly (see the module docstring), the :class:`StatLink` of each: typically the mean with
      power 1 and the variance with power 2 of the BN right after it, of every BN where the units
      feed several. Kernels with no such statistic, or whose units also reach something that is
      not a running statistic, are absent.

    Raises:
      ValueError: ``variables`` without a ``"params"`` and a ``"batch_stats"`` collection.
    """
    if not (isinstance(variables, Mapping) and "params" in variables and "batch_stats" in variables):
        raise ValueError(
            "batch_stats_map: variables must hold a 'params' and a 'batch_stats' collection, got "
            f"{list(variables) if isinstance(variables, Mapping) else type(variables).__name__}"
        )
    out = {}
    for kernel, links in input_links(apply_fn, variables, *args, **kwargs).items():
        stats = tuple(StatLink(tuple(path[1:]), power, index)
                      for path, power, index in links if path[0] == "batch_stats")
        if stats and len(stats) == len(links):
            out[kernel] = stats
    return out


def _unit_scales(scales: PyTree, kernel: Path) -> jax.Array | None:
    """The factors at ``kernel`` in ``scales`` (one per output unit of the kernel), or None."""
    node = scales
    for key in kernel:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return None if node is None else jnp.asarray(node)


def _check_units(shape: tuple[int, ...], link: StatLink, stat: jax.Array, kernel: Path) -> None:
    """Raise where the kernel's factors (``shape``, one per output unit) cannot feed ``stat``."""
    units = int(np.prod(shape, dtype=np.int64))
    needed = stat.size if link.index is None else int(np.max(link.index, initial=-1)) + 1
    if units == needed or (link.index is not None and units > needed):
        return
    count = f"{needed}" if link.index is None else f"at least {needed}"
    raise ValueError(
        f"transport_batch_stats: scales at {'/'.join(map(str, kernel))} have shape {tuple(shape)}; "
        f"expected one factor per output unit ({count}, for {'/'.join(map(str, link.path))})"
    )


def _link_factor(s: jax.Array, link: StatLink, stat: jax.Array, kernel: Path) -> jax.Array:
    """The factor of each element ``j`` of ``stat``: ``s[index[j]]`` (1 where ``index[j] = -1``), or
    ``s`` itself where ``link.index`` is None (then ``stat`` has one element per kernel unit).
    The kernel's unit count is the size of ``s`` (scales mirror the params), not the statistic's:
    a statistic may see some of the units only (a slice before the BN)."""
    _check_units(s.shape, link, stat, kernel)
    s = s.reshape(-1)
    if link.index is None:
        return s.reshape(stat.shape)
    ext = jnp.concatenate([s, jnp.ones((1,), s.dtype)])
    return ext[np.where(link.index < 0, s.size, link.index)]


def transport_batch_stats(
    batch_stats: PyTree, scales: PyTree, stats_map: Mapping[Path, tuple[StatLink, ...]]
) -> PyTree:
    """The running statistics after the kernels were rescaled by ``w_new = w_old / s``.

    Every statistic linked to a kernel (``stats_map`` from :func:`batch_stats_map`) becomes
    ``stat[j] / s[index[j]] ** power`` per element (mean / s, var / s^2; ``s[j]`` where the link's
    index is None, unchanged where ``index[j] = -1``), computed in float32 or wider and cast back
    to the statistic's dtype. The kernel's unit count is that of its ``scales`` entry, which may
    exceed the statistic's (a slice before the BN).

    Args:
      batch_stats: the ``batch_stats`` collection (dict, ``FrozenDict`` or ``nnx.State``).
      scales: a params-shaped tree (dict or ``nnx.State``): at a kernel's path, one factor per
        output unit (shape ``(n,)`` or any shape of n elements, e.g. ``(1, 1, 1, n)``); ``None`` or
        absent for kernels left as they were.
      stats_map: ``{kernel_path: (StatLink, ...)}``.

    Returns:
      ``batch_stats`` with the linked statistics transported, in the same container.

    Raises:
      ValueError: a statistic path missing from ``batch_stats``, a scale with the wrong number of
        factors (not the statistic's size where the index is None, too few for the index).
    """
    stats, rebuild = split_params(batch_stats)
    scales = split_params(scales)[0] if scales is not None else {}
    new = jax.tree.map(lambda x: x, stats)
    for kernel, links in stats_map.items():
        for link in links:
            stat = jnp.asarray(get_leaf(stats, link.path, "transport_batch_stats"))
            s = _unit_scales(scales, tuple(kernel))
            if s is None:
                continue
            dtype = jnp.promote_types(stat.dtype, jnp.float32)
            factor = _link_factor(s.astype(dtype), link, stat, tuple(kernel))
            node = new
            for key in link.path[:-1]:
                node = node[key]
            value = node[link.path[-1]]
            node[link.path[-1]] = (jnp.asarray(value, dtype) / factor ** link.power).astype(stat.dtype)
    return rebuild(new)
