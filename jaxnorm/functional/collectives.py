"""The one cross-device reduction of the statistics: per-device moments and extras gathered in one
collective and merged exactly (unequal counts, ``axis_index_groups``)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax

from jaxnorm.functional.moments import Moments, combine_moments

__all__ = [
    "AxisIndexGroups",
    "axis_size",
    "gather_combine",
    "gather_invariant",
    "psum_flat",
]


AxisIndexGroups = Sequence[Sequence[int]] | None


def axis_size(axis_name: str | Sequence[str] | None, axis_index_groups: AxisIndexGroups) -> int:
    """How many devices share the statistics: 1 without ``axis_name``, else the size of the mapped axis
    (or of a group of ``axis_index_groups``)."""
    if axis_name is None:
        return 1
    return len(axis_index_groups[0]) if axis_index_groups is not None else lax.axis_size(axis_name)


def gather_invariant(x, axis_name: str | Sequence[str], axis_index_groups: AxisIndexGroups = None):
    """Stack each array of the pytree ``x`` from every device of ``axis_name`` (or of this device's
    group) on a new axis 0, in one collective.

    The arrays travel as one flat vector, in one ``psum`` of one-hot slots rather than ``all_gather``:
    the same bytes on the wire, and the result is known to be replicated, so ``shard_map(...,
    out_specs=P())`` accepts statistics computed from it. The arrays must be finite (a slot of another
    device holds ``0 * x``) and share one dtype.
    """
    index = lax.axis_index(axis_name)
    size = axis_size(axis_name, axis_index_groups)
    if axis_index_groups is not None:
        position = [0] * sum(len(group) for group in axis_index_groups)
        for group in axis_index_groups:
            for slot, device in enumerate(group):
                position[device] = slot
        index = jnp.asarray(position)[index]
    leaves, treedef = jax.tree.flatten(x)
    flat = _flat(leaves)
    onehot = (jnp.arange(size) == index).astype(flat.dtype)[:, None]
    gathered = lax.psum(onehot * flat[None], axis_name, axis_index_groups=axis_index_groups)
    return jax.tree.unflatten(treedef, _unflat(gathered, leaves, (size,)))


def _flat(leaves: list[jnp.ndarray]) -> jnp.ndarray:
    return jnp.concatenate([jnp.ravel(a) for a in leaves])


def _unflat(flat: jnp.ndarray, leaves: list[jnp.ndarray], lead: tuple[int, ...] = ()) -> list[jnp.ndarray]:
    """Split ``flat`` (``lead`` axes, then the concatenated leaves) back into arrays shaped as ``leaves``."""
    offsets = list(itertools.accumulate(a.size for a in leaves))[:-1]
    parts = jnp.split(flat, offsets, axis=len(lead))
    return [part.reshape(*lead, *a.shape) for part, a in zip(parts, leaves, strict=True)]


def psum_flat(x, axis_name: str | Sequence[str], axis_index_groups: AxisIndexGroups = None):
    """Sum each array of the pytree ``x`` over the devices of ``axis_name`` in one collective: the arrays
    (of one dtype) travel as one flat vector, where ``lax.psum`` of a pytree binds one ``psum`` per
    array."""
    leaves, treedef = jax.tree.flatten(x)
    total = lax.psum(_flat(leaves), axis_name, axis_index_groups=axis_index_groups)
    return jax.tree.unflatten(treedef, _unflat(total, leaves))


def gather_combine(
    moments: Moments, axis_name, axis_index_groups, extra: tuple[jnp.ndarray, ...] = ()
) -> tuple[Moments, jnp.ndarray, tuple[jnp.ndarray, ...]]:
    """Gather per-device moments and the ``extra`` arrays in one collective; merge the moments exactly
    (Chan et al.). Returns the merged moments, the per-device counts and the gathered ``extra``, each
    stacked on a new axis 0 (devices)."""
    count = jnp.broadcast_to(moments.count, moments.mean.shape)
    parts = [count, moments.mean] + ([] if moments.m2 is None else [moments.m2])
    gathered, gathered_extra = gather_invariant((jnp.stack(parts), extra), axis_name, axis_index_groups)
    # a scalar count (no mask) is every device's: the merge then knows that no device's part is empty
    merge_count = moments.count if jnp.ndim(moments.count) == 0 else gathered[:, 0]
    merged = combine_moments(
        Moments(merge_count, gathered[:, 1], None if moments.m2 is None else gathered[:, 2]), 0
    )
    squeeze = lambda a: None if a is None else a[0]
    return Moments(*map(squeeze, merged)), gathered[:, 0], gathered_extra
