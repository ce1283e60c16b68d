"""Unit norms recorded in one run and read by another: the reference of weight-decay mimicry.

A run whose optimizer holds :func:`jaxnorm.optim.record_norms` (the ``record_norms`` wrapper of
:mod:`jaxnorm.train.optimizers`) leaves ``recorded_norms.npz`` in its workdir: one ``(T, out)``
float32 array per recorded kernel, keyed by the kernel's params path joined with ``/``. A later run
with the ``wd_mimicry`` wrapper names that file, or the run's directory, or, inside an experiment's
sweep, the run's name (its sibling directory), as ``reference``.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np

from jaxnorm.optim.mimicry import NormRecordState

__all__ = ["FILENAME", "load_recorded_norms", "recorded_norms", "resolve_reference", "save_recorded_norms"]

PyTree = Any
FILENAME = "recorded_norms.npz"


def recorded_norms(opt_state: PyTree) -> PyTree | None:
    """``NormRecordState.norms`` of the one :func:`jaxnorm.optim.record_norms` in ``opt_state``;
    ``None`` when there is none. Raises ``ValueError`` if there are several."""
    records = [
        s
        for s in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, NormRecordState))
        if isinstance(s, NormRecordState)
    ]
    if len(records) > 1:
        raise ValueError(
            f"the optimizer state holds {len(records)} record_norms states, expected at most one"
        )
    return records[0].norms if records else None


def _key(path: tuple) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def save_recorded_norms(path: str, norms: PyTree) -> str:
    """Writes the recorded leaves of ``norms`` (``None`` elsewhere) to ``path`` (a ``.npz`` file,
    or a directory that receives :data:`FILENAME`); returns the file's path."""
    if os.path.isdir(path) or not path.endswith(".npz"):
        os.makedirs(path, exist_ok=True)
        path = os.path.join(path, FILENAME)
    flat = jax.tree_util.tree_flatten_with_path(norms)[0]
    if not flat:
        raise ValueError("save_recorded_norms: norms holds no recorded kernel")
    if any("/" in str(getattr(k, "key", k)) for p, _ in flat for k in p):
        raise ValueError("save_recorded_norms: a params key contains '/', which the file format uses")
    arrays = {_key(p): np.asarray(leaf, np.float32) for p, leaf in flat}
    np.savez(path, **arrays)
    return path


def load_recorded_norms(path: str) -> dict[str, Any]:
    """The recorded norms saved by :func:`save_recorded_norms`, as nested dicts of arrays under the
    kernels' params paths (what :func:`jaxnorm.optim.wd_mimicry` takes as ``reference_norms``)."""
    tree: dict[str, Any] = {}
    with np.load(path) as data:
        for key in data.files:
            *parents, leaf = key.split("/")
            node = tree
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = np.asarray(data[key])
    return tree


def resolve_reference(reference: str, workdir: str | None) -> str:
    """The recorded-norms file that ``reference`` names.

    ``reference`` is a ``.npz`` file, a run directory holding :data:`FILENAME`, or a path relative to
    the parent of ``workdir`` (the sibling runs of an experiment's sweep: the run's name). A sibling
    run is looked for first, then the path as given (absolute, or relative to the current directory):
    a directory of the run's name where the command runs no longer shadows the sweep's own run.
    """
    if not isinstance(reference, str) or not reference:
        raise ValueError(f"wd_mimicry: reference must name a recorded-norms file or run, got {reference!r}")
    bases = ([os.path.dirname(os.path.abspath(workdir))] if workdir else []) + [""]
    tried = []
    for base in bases:
        candidate = os.path.join(base, reference)
        for path in (candidate, os.path.join(candidate, FILENAME)):
            tried.append(path)
            if os.path.isfile(path):
                return path
    raise ValueError(
        f"wd_mimicry: reference {reference!r} has no recorded norms; looked for {tried}. Run the "
        f"reference (with the record_norms wrapper) first"
    )
