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
from jaxnorm.enorm.spec import unwrap_variables
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
      A tree with the structure of the params (``variables["params"]`` for a variables dict; for an
      ``nnx.State`` of params, an ``nnx.State`` of bools without ``Variable`` wrappers), usable as
      ``mask=`` of ``optax.masked`` or :func:`jaxnorm.optim.weight_rescaling`.

    NNX: pass ``nnx.state(model, nnx.Param)`` (or the params of ``nnx.split(model, nnx.Param, ...)``)
    and an ``apply_fn`` that merges them with the rest of the state taken as pure arrays, e.g.
    ``lambda p, x: nnx.merge(graphdef, p, nnx.as_pure(rest))(x)`` with the model in training mode.

    Limitations: a bias added between the kernel and the BN (which the BN's mean subtraction
    cancels) is not recognised; build such layers with ``use_bias=False``.
    """
    flags = scale_invariant_kernels(apply_fn, variables, *args, **kwargs)
    params, _ = unwrap_variables(variables)
    return pure(jax.tree_util.tree_map_with_path(
        lambda path, _: flags.get(tuple(getattr(k, "key", getattr(k, "idx", k)) for k in path),
                                  False),
        params,
    ))
