"""Params hooks: extra trained leaves, a reparametrisation of the params the model sees, a loss term.

A :class:`ParamsHook` lets a run train more than the model's params and change what the model sees:
the train step computes the loss on ``effective(params)`` plus ``penalty(params)`` and scales the
gradient with ``scale_grads`` before the optimizer; evaluation uses ``effective(params)``. The one
hook the loop builds from its config is implicit ENorm (:func:`implicit_enorm_hook`, config block
``implicit_enorm``).

Implicit ENorm (Stock et al. 2019, Annex C): every weight is reparametrised as
``D_{k-1}^-1 W_k D_k`` with learnable ``D = exp(u)`` (one vector ``u`` per junction), and
``(W, u)`` are trained jointly on ``CE(f(x; D^-1 W D)) + lambda sum_k ||D_{k-1}^-1 W_k D_k||_2^2``
(:func:`jaxnorm.enorm.implicit_penalty`, biases not counted). The function does not depend on ``u``,
so ``u`` only follows the penalty. The log-scales live in the params tree under
:data:`LOG_SCALES` (``{"junction_<j>": (units,)}``, float32), so the optimizer, the checkpoints and
the resume handle them like any parameter; their gradient is multiplied by ``lr_factor`` (with SGD:
``u``'s learning rate is ``lr_factor`` times the weights'; Annex C did not tune the two speeds apart).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

PyTree = Any

LOG_SCALES = "implicit_enorm_log_scales"
"""The params key of implicit ENorm's log-scales ``u``."""

IMPLICIT_ENORM_KEYS = ("weight", "lr_factor")


class ParamsHook(NamedTuple):
    """What the train and eval steps do with the trained params.

    Attributes:
      init: model params -> trained params (adds the hook's own leaves).
      effective: trained params -> the params the model is applied with.
      penalty: trained params -> a scalar added to the loss.
      scale_grads: gradient of the trained params -> the gradient the optimizer sees.
    """

    init: Callable[[PyTree], PyTree]
    effective: Callable[[PyTree], PyTree]
    penalty: Callable[[PyTree], jax.Array]
    scale_grads: Callable[[PyTree], PyTree]

    def wrap_init(self, init_fn: Callable[..., Mapping[str, PyTree]]) -> Callable[..., dict[str, PyTree]]:
        """``model.init`` whose ``"params"`` carry the hook's leaves (for ``create_train_state``)."""

        def wrapped(*args: Any, **kwargs: Any) -> dict[str, PyTree]:
            variables = dict(init_fn(*args, **kwargs))
            variables["params"] = self.init(variables["params"])
            return variables

        return wrapped


def check_implicit_enorm(block: Mapping[str, Any] | None) -> None:
    """Raises ``ValueError`` naming ``config.implicit_enorm.<key>`` unless ``block`` holds only
    ``weight`` (the penalty's lambda, a number >= 0; 0 = off) and ``lr_factor`` (> 0)."""
    block = dict(block or {})
    unknown = sorted(k for k in block if k not in IMPLICIT_ENORM_KEYS)
    if unknown:
        raise ValueError(f"config.implicit_enorm has no key {unknown[0]!r}; valid: {IMPLICIT_ENORM_KEYS}")
    for key, lower, strict in (("weight", 0.0, False), ("lr_factor", 0.0, True)):
        value = block.get(key, 1.0 if key == "lr_factor" else 0.0)
        ok = isinstance(value, int | float) and not isinstance(value, bool) and value == value
        ok = ok and value != float("inf") and (value > lower if strict else value >= lower)
        if not ok:
            bound = "> 0" if strict else ">= 0"
            raise ValueError(f"config.implicit_enorm.{key} must be a finite number {bound}, got {value!r}")


def implicit_enorm_enabled(block: Mapping[str, Any] | None) -> bool:
    """Whether the ``implicit_enorm`` block turns the hook on (``weight > 0``)."""
    return float(dict(block or {}).get("weight", 0.0) or 0.0) > 0.0


def implicit_enorm_hook(block: Mapping[str, Any], spec: Sequence[Any]) -> ParamsHook:
    """The implicit-ENorm hook for the junctions ``spec`` (:func:`jaxnorm.enorm.chain` or
    :func:`jaxnorm.enorm.discover` of the model) and the config block ``{"weight": lambda,
    "lr_factor": f}``."""
    from jaxnorm.enorm import apply_log_scales, implicit_penalty, init_log_scales

    check_implicit_enorm(block)
    lam = float(block.get("weight", 0.0))
    factor = float(block.get("lr_factor", 1.0))
    spec = tuple(spec)

    def split(params: PyTree) -> tuple[PyTree, tuple[jax.Array, ...]]:
        model_params = {k: v for k, v in params.items() if k != LOG_SCALES}
        u = tuple(params[LOG_SCALES][f"junction_{j}"] for j in range(len(spec)))
        return model_params, u

    def init(params: PyTree) -> PyTree:
        u = init_log_scales(params, spec)
        return {**params, LOG_SCALES: {f"junction_{j}": x for j, x in enumerate(u)}}

    def effective(params: PyTree) -> PyTree:
        model_params, u = split(params)
        return apply_log_scales(model_params, spec, u)

    def penalty(params: PyTree) -> jax.Array:
        model_params, u = split(params)
        return lam * implicit_penalty(model_params, spec, u)

    def scale_grads(grads: PyTree) -> PyTree:
        scaled = jax.tree.map(lambda g: g * jnp.asarray(factor, g.dtype), grads[LOG_SCALES])
        return {**grads, LOG_SCALES: scaled}

    return ParamsHook(init, effective, penalty, scale_grads)


def model_params(params: PyTree) -> PyTree:
    """``params`` without a hook's own leaves (what a model-level analysis reads)."""
    if isinstance(params, Mapping) and LOG_SCALES in params:
        return {k: v for k, v in params.items() if k != LOG_SCALES}
    return params
