"""Which kernels are scale invariant: the mask for weight rescaling (WRS) and norm projections.

A kernel whose output units each feed a BatchNorm normalization computes a function invariant to
scaling any unit's incoming weight vector: ``BN(d x) = BN(x)`` up to BN's epsilon (Liu et al.,
Thm 3.1; Hoffer et al., Sec. 2). Those are the leaves that :func:`jaxnorm.optim.weight_rescaling`
and the BWN projection should touch. The mask is computed by the same jaxpr tracer that finds
ENorm's junctions (:mod:`jaxnorm.enorm.discover`), with powers of the scale tracked so that
``(x - mean) * rsqrt(var + eps)`` is recognised as degree 0.

References:
  Liu, Cui, Wan, Mao, Chan. The implicit biases of SGD on deep neural networks with batch
  normalization. Thm 3.1.
  Hoffer, Banner, Golan, Soudry. Norm matters. NeurIPS 2018, Sec. 2.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from jaxnorm.enorm.discover import scale_invariant_kernels
from jaxnorm.enorm.trees import is_variables
from jaxnorm.optim.rescaling import pure

__all__ = ["scale_invariant_mask"]

PyTree = Any


def scale_invariant_mask(apply_fn: Callable, variables: PyTree, *args: Any, **kwargs: Any) -> PyTree:
    """A params-shaped tree of bools: True for kernels (rank >= 2) whose output units are each
    scale invariant (they feed a BatchNorm normalization), False for every other leaf.

    Args:
      apply_fn: the function whose invariance matters, called as
        ``apply_fn(variables, *args, **kwargs)``. BN must normalise with batch statistics
        (training mode) and only the predictions should be returned, e.g.
        ``lambda v, x: model.apply(v, x, train=True, mutable=["batch_stats"])[0]``.
      variables: a params tree or a Flax variables dict.
      *args, **kwargs: example inputs (of arrays only shapes and dtypes matter); Python values such
        as ``train=False`` are passed as they are.

    Returns:
      A tree of bools in the container the params came in: for a variables dict, the structure
      and container of ``variables["params"]``; for a params dict or ``FrozenDict``, the same;
      for an ``nnx.State`` of params (with or without ``Variable`` wrappers), an ``nnx.State``
      of bools without ``Variable`` wrappers, the pytree ``nnx.Optimizer`` passes to optax. It is
      usable as ``mask=`` of ``optax.masked`` and of every :mod:`jaxnorm.optim` transform.

    NNX: pass ``nnx.state(model, nnx.Param)`` (or the params of ``nnx.split(model, nnx.Param, ...)``)
    and an ``apply_fn`` that merges them with the rest of the state taken as pure arrays, e.g.
    ``lambda p, x: nnx.merge(graphdef, p, nnx.as_pure(rest))(x)`` with the model in training mode.

    Limitations: a bias added between the kernel and the BN (which the BN's mean subtraction
    cancels) is not recognised; build such layers with ``use_bias=False``. An ``epsilon`` is neglected
    only where it is added to a squared statistic (``sqrt(var + eps)``, not ``std + eps``). Any
    constant added to a square or mean square is taken for BN's ``epsilon`` and
    neglected, so ``h * rsqrt(h^2 + 1)`` (ISRU) or an RMS over the batch with a large ``epsilon``
    reads as invariant although it is not: check a mask over such activations by hand.
    """
    flags = scale_invariant_kernels(apply_fn, variables, *args, **kwargs)
    params = variables["params"] if is_variables(variables) else variables
    return jax.tree_util.tree_map_with_path(lambda path, _: flags.get(_path_keys(path), False), pure(params))


def _path_keys(path: tuple) -> tuple:
    """A ``jax.tree_util`` key path as the tuple of plain keys the tracer uses (``("l1", "kernel")``,
    ``("layers", 0, "kernel")``)."""
    return tuple(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k))) for k in path)
