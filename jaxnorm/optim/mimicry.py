"""Weight-decay mimicry (Hoffer et al., *Norm matters*, Sec. 2): train without WD at the WD run's
effective learning rate, from per-unit norms recorded in a reference run with WD.

For a unit followed by batch norm the direction moves by ``eta / ||w||**2`` per SGD step, so weight
decay acts on such units only through their norm (Hoffer et al., Sec. 2; Liu et al., Cor. 3.2).
Scaling each unit's update by ``||w_j(t)||**2 / ||w_ref,j(t)||**2``, with ``w_ref`` the reference
run's weights at the same step, gives the unit the reference's effective step
``eta / ||w_ref,j(t)||**2``: with SGD the directions then follow the reference run up to a relative
step difference of ``eta * lambda`` per step (WD shrinks the radial part by ``1 - eta * lambda``
while mimicry leaves it alone).

* :func:`record_norms` is an identity transformation whose state collects ``||w_j(t)||`` every
  ``every`` steps (jit-able, fixed-size buffer); put it in the reference run's chain.
* :func:`wd_mimicry` scales the updates of a run without WD by the ratio above; place it after the
  optimizer (``optax.chain(optax.sgd(lr), wd_mimicry(ref))``).
* :func:`reference_schedule` turns the recording into a schedule for
  :func:`jaxnorm.optim.norm_schedule`, which reproduces the reference norms exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxnorm.functional.weight import unit_norm
from jaxnorm.optim.arguments import check_static
from jaxnorm.optim.rescaling import MaskOrFn, check_steps, check_updates, pure_transform, resolve_mask
from jaxnorm.optim.state import register_state_rule

__all__ = [
    "NormRecordState",
    "WDMimicryState",
    "record_norms",
    "reference_schedule",
    "wd_mimicry",
]

PyTree = Any


class NormRecordState(NamedTuple):
    """State of :func:`record_norms`.

    Attributes:
      count: updates seen so far.
      norms: per selected kernel a ``(num_records, out)`` float32 buffer, row ``i`` holding the unit
        norms of the params passed to update ``i * every`` (before that update); ``None`` elsewhere.
        Rows not reached yet are zero; ``wd_mimicry`` and ``reference_schedule`` read a reference past its
        last written row as that row.
    """

    count: jnp.ndarray
    norms: PyTree


class WDMimicryState(NamedTuple):
    """State of :func:`wd_mimicry`: ``count``, the updates applied so far."""

    count: jnp.ndarray


# Recorded norms are data, not gradient statistics: a parameter rescaling leaves them alone.
register_state_rule(NormRecordState)


def _check_every(every: Any, fn_name: str) -> None:
    try:
        check_steps(every, "every", fn_name)
    except TypeError as err:
        raise ValueError(str(err)) from None


def record_norms(num_steps: int, *, every: int = 1, mask: MaskOrFn = None) -> optax.GradientTransformation:
    """Identity on the updates; records ``||w_j||`` of every selected unit in its state.

    Update ``t`` (``t = 0, 1, ...``) with ``t % every == 0`` stores the norms of the params it
    receives (the weights before that update, ``w(t)``) in row ``t // every``; updates past
    ``num_steps`` are not recorded. After training, ``state.norms`` (find it with
    ``optax.tree_utils.tree_get(opt_state, "norms")`` or by position in the chain) is the reference
    for :func:`wd_mimicry` and :func:`reference_schedule`.

    Args:
      num_steps: the number of updates of the reference run (buffer length ``ceil(num_steps / every)``).
      every: record every ``every``-th update.
      mask: bool tree or callable as in ``optax.masked``; default every leaf of rank >= 2.
    """
    check_static("record_norms", num_steps=num_steps, every=every)
    try:
        check_steps(num_steps, "num_steps", "record_norms")
    except TypeError as err:
        raise ValueError(str(err)) from None
    num_steps = int(num_steps)
    _check_every(every, "record_norms")
    every = int(every)
    rows = -(-num_steps // every)

    def init_fn(params):
        flags = resolve_mask(mask, params, "record_norms")
        norms = jax.tree.map(
            lambda flag, p: jnp.zeros((rows, p.shape[-1]), jnp.float32) if flag else None, flags, params
        )
        return NormRecordState(count=jnp.zeros([], jnp.int32), norms=norms)

    def update_fn(updates, state, params=None, **extra_args):
        del extra_args
        check_updates(updates, params, "record_norms")
        flags = resolve_mask(mask, params, "record_norms")
        row = state.count // every
        record = (state.count % every == 0) & (row < rows)

        def leaf(flag, buffer, p):
            if not flag:
                return buffer
            return jax.lax.cond(
                record,
                lambda b: b.at[row].set(unit_norm(p).astype(jnp.float32)),
                lambda b: b,
                buffer,
            )

        norms = jax.tree.map(leaf, flags, state.norms, params, is_leaf=lambda x: x is None)
        return updates, NormRecordState(count=optax.safe_increment(state.count), norms=norms)

    return pure_transform(init_fn, update_fn)


def _reference_row(reference: PyTree, index: jax.Array) -> PyTree:
    """Row ``index`` (:func:`_recorded_row`) of each recorded leaf; ``None`` (unrecorded) leaves stay."""
    return jax.tree.map(lambda r: _recorded_row(r, index), reference)


def _recorded_row(reference: Any, index: jax.Array) -> jax.Array:
    """Row ``index`` of one recorded ``(rows, out)`` leaf, clipped to its last written row. Rows after
    the last one with a non-zero entry were never written (a :func:`record_norms` buffer longer than the
    reference run); clipping there continues the reference's last norms, as past the end of a buffer of
    the run's own length. A zero row used to make ``wd_mimicry`` keep the plain update and
    ``reference_schedule`` leave the units unprojected, so the buffer's length decided the run."""
    return jnp.asarray(reference)[jnp.clip(index, 0, _last_written_row(reference))]


def _last_written_row(reference: Any) -> int | jax.Array:
    """The index of the last row of ``reference`` with a non-zero entry (0 if none). A concrete
    reference (the usual case, closed over by the transformation) is read with NumPy, once per trace,
    so that a jitted update does not reduce the whole recording at every step; a traced one with jnp."""
    if isinstance(reference, jax.core.Tracer):
        written = jnp.any(reference != 0, axis=tuple(range(1, reference.ndim)))
        return jnp.max(jnp.where(written, jnp.arange(reference.shape[0]), 0))
    reference = np.asarray(reference)
    written = np.flatnonzero(np.any(reference != 0, axis=tuple(range(1, reference.ndim))))
    return int(written[-1]) if written.size else 0


def _lookup(tree: Any, path: tuple) -> Any:
    """The entry of nested mappings ``tree`` at a params leaf's key path; ``None`` where absent."""
    for key in path:
        name = getattr(key, "key", getattr(key, "idx", key))
        if not isinstance(tree, Mapping) or name not in tree:
            return None
        tree = tree[name]
    return tree


def _flatten_reference(reference: PyTree, params: PyTree, fn_name: str) -> list:
    """One reference entry per params leaf (flattened order).

    ``reference`` has the params' structure (``None`` on unrecorded leaves), or, for dict params,
    holds only the recorded leaves under their params paths (nested dicts, as
    :func:`jaxnorm.train.norm_records.load_recorded_norms` returns them).
    """
    treedef = jax.tree.structure(params)
    try:
        return treedef.flatten_up_to(reference)
    except (ValueError, TypeError) as err:
        mismatch = ValueError(
            f"{fn_name}: reference norms must have the params structure {treedef} (a (T, out) array per "
            f"selected kernel, None elsewhere) or hold the recorded kernels under their params paths, "
            f"got {jax.tree.structure(reference)}"
        )
        if not isinstance(reference, Mapping):
            raise mismatch from err
        paths = [path for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
        flat = [_lookup(reference, path) for path in paths]
        if sum(r is not None for r in flat) != len(jax.tree.leaves(reference)):
            raise mismatch from err
        return flat


def _fits(ref: Any, p: Any) -> bool:
    """Whether ``ref`` is a recording ``(T, out)`` for the kernel ``p`` (``out`` units on its last axis)."""
    return ref is not None and jnp.ndim(ref) == 2 and jnp.shape(ref)[1] == jnp.shape(p)[-1]


def _check_reference(reference: PyTree, params: PyTree, flags: PyTree, fn_name: str) -> list:
    flat = _flatten_reference(reference, params, fn_name)
    treedef = jax.tree.structure(params)
    for ref, flag, p in zip(flat, treedef.flatten_up_to(flags), treedef.flatten_up_to(params), strict=True):
        if flag and not _fits(ref, p):
            raise ValueError(
                f"{fn_name}: reference norms for a kernel of shape {jnp.shape(p)} must have shape "
                f"(T, {jnp.shape(p)[-1]}), got {None if ref is None else jnp.shape(ref)}"
            )
    return flat


def _reference_mask(reference: PyTree, mask: MaskOrFn, fn_name: str) -> MaskOrFn:
    """Default mask of the mimicry transforms: the leaves that have reference norms."""
    if mask is not None:
        return mask

    def select(params):
        flat = _flatten_reference(reference, params, fn_name)
        return jax.tree.structure(params).unflatten([r is not None for r in flat])

    return select


def wd_mimicry(
    reference_norms: PyTree,
    *,
    every: int = 1,
    mask: MaskOrFn = None,
    step_decay: float | Callable[[jax.Array], jax.Array] = 0.0,
) -> optax.GradientTransformation:
    """Scale each unit's update by ``||w_j(t)||**2 / ((1 - d_t) ||w_ref,j(t)||**2)`` (Norm matters,
    Sec. 2), ``d_t = step_decay``.

    Update ``t`` uses row ``min(t // every, T - 1)`` of the reference. Units whose reference norm is 0
    keep their update. Meant for a run without weight decay on scale-invariant units; place it after
    the optimizer in ``optax.chain``.

    With ``step_decay = 0`` (the paper's rule) the unit moves by the reference's first-order
    effective step ``eta / ||w_ref||**2``. An SGD step with weight decay, ``w - eta (g + lambda w)``,
    shrinks ``w`` by ``1 - eta lambda`` before adding ``-eta g``, so its direction moves by
    ``eta / ((1 - eta lambda) ||w||**2)``; passing ``step_decay = eta * lambda`` of the reference run
    (a number or a schedule of the count) makes plain SGD follow the reference's directions exactly
    (with ``every = 1``).

    Args:
      reference_norms: ``NormRecordState.norms`` of a reference run with WD (a ``(T, out)`` array
        per kernel, ``None`` elsewhere), e.g. from :func:`record_norms`.
      every: the recording interval used for the reference.
      mask: bool tree or callable as in ``optax.masked``; default: every leaf with reference norms.
      step_decay: ``eta * lambda`` of the reference run's steps (``0 <= step_decay < 1``), see above.

    References:
      Hoffer, Banner, Golan & Soudry, *Norm matters* (NeurIPS 2018), Sec. 2 and Supp. Sec. 1;
      Liu et al., Sec. 4.1 (the "scale lr" experiment).
    """
    _check_every(every, "wd_mimicry")
    every = int(every)
    if not callable(step_decay) and not 0.0 <= float(step_decay) < 1.0:
        raise ValueError(f"wd_mimicry: step_decay (eta * lambda) must be in [0, 1), got {step_decay!r}")
    select = _reference_mask(reference_norms, mask, "wd_mimicry")

    def init_fn(params):
        _check_reference(reference_norms, params, resolve_mask(select, params, "wd_mimicry"), "wd_mimicry")
        return WDMimicryState(count=jnp.zeros([], jnp.int32))

    def update_fn(updates, state, params=None, **extra_args):
        del extra_args
        check_updates(updates, params, "wd_mimicry")
        flags = resolve_mask(select, params, "wd_mimicry")
        flat_ref = _check_reference(reference_norms, params, flags, "wd_mimicry")
        treedef = jax.tree.structure(params)
        index = state.count // every
        decay = step_decay(state.count) if callable(step_decay) else step_decay
        new_updates = []
        for flag, p, u, ref in zip(
            treedef.flatten_up_to(flags),
            treedef.flatten_up_to(params),
            treedef.flatten_up_to(updates),
            flat_ref,
            strict=True,
        ):
            if flag:
                target = _recorded_row(ref, index)
                # the square of the quotient: squaring each norm first overflows from 1.8e19 and
                # underflows below 1.1e-19 (inf / inf, 0 / 0: NaN) where the ratio is ordinary
                ratio = jnp.square(unit_norm(p) / jnp.where(target > 0, target, 1.0))
                ratio = ratio / (1.0 - decay)
                u = (u * jnp.where(target > 0, ratio, 1.0)).astype(u.dtype)
            new_updates.append(u)
        return treedef.unflatten(new_updates), WDMimicryState(count=optax.safe_increment(state.count))

    return pure_transform(init_fn, update_fn)


def reference_schedule(
    reference_norms: PyTree, *, every: int = 1, final_params: PyTree | None = None
) -> Callable[[jax.Array], PyTree]:
    """A schedule for :func:`jaxnorm.optim.norm_schedule` that reproduces recorded norms.

    ``norm_schedule`` calls it with the count ``t`` before update ``t`` and projects the params that
    update produces, ``w(t + 1)``; so it returns row ``(t + 1) // every``: the reference's norms after
    the same number of steps. :func:`record_norms` sees the params before each update only, so a
    recording of ``T`` updates ends at ``w_ref(T - 1)``: pass the reference run's final params as
    ``final_params`` (with ``every=1``) to append their norms, ``w_ref(T)``, as the row of the last
    update (without it the last update is projected to the norms before the reference's last update,
    rows past the end clipped to the last). Use it with ``mask`` selecting the recorded kernels (leaves
    without a reference are ``None``).
    """
    _check_every(every, "reference_schedule")
    every = int(every)
    if final_params is not None:
        if every != 1:
            # the last update reads row T // every, which is the appended one only where every divides T
            raise ValueError(
                "reference_schedule: final_params needs a recording of every update (every=1), got "
                f"every={every}"
            )
        reference_norms = _append_final_norms(reference_norms, final_params)

    def schedule(count):
        return _reference_row(reference_norms, (count + 1) // every)

    return schedule


def _append_final_norms(reference: PyTree, final_params: PyTree) -> PyTree:
    """``reference`` (either layout of :func:`_flatten_reference`) in the params' structure, each
    recorded ``(T, out)`` array followed by the unit norms of the final params' kernel."""
    flat = _flatten_reference(reference, final_params, "reference_schedule")
    treedef = jax.tree.structure(final_params)
    appended = []
    for ref, p in zip(flat, treedef.flatten_up_to(final_params), strict=True):
        if ref is not None:
            if not _fits(ref, p):
                raise ValueError(
                    f"reference_schedule: final_params has a kernel of shape {jnp.shape(p)} where the "
                    f"reference norms have shape {jnp.shape(ref)}, expected (T, {jnp.shape(p)[-1]})"
                )
            ref = jnp.concatenate([jnp.asarray(ref), unit_norm(p).astype(jnp.asarray(ref).dtype)[None]])
        appended.append(ref)
    return treedef.unflatten(appended)
