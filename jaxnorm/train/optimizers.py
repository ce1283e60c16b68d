"""Optimizers from a config: a registry of optax optimizers, LR schedules and weight-decay masks.

``make_optimizer(config, total_steps)`` turns the ``optimizer`` block of an experiment config into an
``optax.GradientTransformation``::

    name: sgd | momentum | nesterov | adam | adamw
    learning_rate, momentum, b1, b2, eps
    schedule: constant | step | cosine | linear | quadratic ; warmup_steps, boundaries (fractions of the
      run), decay_factor, end_value
    weight_decay, weight_decay_mask: all | kernels | bn_scales | last_layer
    grad_clip_norm (0 = off), accumulate_steps (optax.MultiSteps)
    wrappers: names from WRAPPERS, applied in order; wrapper_kwargs: {name: {kwarg: value}}

Weight decay is the L2 penalty added to the gradient (as in the papers: Hoffer et al. 2018 Sec. 2 and
the ENorm paper train with SGD + L2) for every optimizer except ``adamw``, where it is decoupled
(Loshchilov & Hutter 2019).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

import jax
import optax
from flax import traverse_util

PyTree = Any

OPTIMIZERS = ("sgd", "momentum", "nesterov", "adam", "adamw")
SCHEDULES = ("constant", "step", "cosine", "linear", "quadratic")
WEIGHT_DECAY_MASKS = ("all", "kernels", "bn_scales", "last_layer")
# name -> (attribute of jaxnorm.optim, how it combines with the base optimizer)
WRAPPERS = {
    "wrs": ("weight_rescaling", "append"),
    # WRS wrapping the optimizer, whose state (momentum, Adam moments) is rescaled with the weights
    "wrs_state": ("weight_rescaling", "inner"),
    "bwn": ("bwn_projection", "append"),
    "enorm": ("enorm", "wrap"),
}


def _choice(value: str, choices, what: str) -> str:
    if value not in choices:
        raise ValueError(f"{what} must be one of {tuple(choices)}, got {value!r}")
    return value


def make_schedule(config: Mapping[str, Any], total_steps: int) -> optax.Schedule:
    """The learning-rate schedule over ``total_steps`` optimizer updates.

    ``step``: multiply by ``decay_factor`` at each of ``boundaries`` (fractions of the run, e.g.
    ``(0.5, 0.75)``); ``cosine``: half-cosine to ``end_value``; ``linear`` / ``quadratic``:
    ``end + (lr - end) * (1 - t)^power`` with power 1 / 2. A linear warmup from 0 over ``warmup_steps``
    precedes any of them.
    """
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    lr = float(config.get("learning_rate", 0.1))
    name = _choice(config.get("schedule", "constant"), SCHEDULES, "optimizer.schedule")
    warmup = int(config.get("warmup_steps", 0))
    if not 0 <= warmup < total_steps:
        raise ValueError(f"optimizer.warmup_steps must be in [0, {total_steps}), got {warmup}")
    end = float(config.get("end_value", 0.0))
    decay_steps = total_steps - warmup
    if name == "constant":
        main = optax.constant_schedule(lr)
    elif name == "step":
        boundaries = tuple(config.get("boundaries", (0.5, 0.75)))
        if not all(0.0 < b < 1.0 for b in boundaries):
            raise ValueError(f"optimizer.boundaries must be fractions of the run in (0, 1), got {boundaries}")
        factor = float(config.get("decay_factor", 0.1))
        main = optax.piecewise_constant_schedule(
            lr, {max(1, round(b * decay_steps)): factor for b in boundaries}
        )
    elif name == "cosine":
        main = optax.cosine_decay_schedule(lr, decay_steps, alpha=end / lr if lr else 0.0)
    else:
        power = 1.0 if name == "linear" else 2.0
        main = optax.polynomial_schedule(lr, end, power, decay_steps)
    if warmup == 0:
        return main
    return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), main], [warmup])


def weight_decay_mask(name: str) -> Callable[[PyTree], PyTree]:
    """A function ``params -> bool tree`` selecting the leaves that get weight decay.

    ``all``: every leaf; ``kernels``: every leaf with ``ndim >= 2`` (Dense / Conv kernels, weight-norm
    directions); ``bn_scales``: the ``scale`` leaves of normalization layers (BN gammas); ``last_layer``:
    the leaves of the last module (in creation order) that owns a kernel, i.e. the classifier.
    """
    _choice(name, WEIGHT_DECAY_MASKS, "optimizer.weight_decay_mask")

    def mask(params: PyTree) -> PyTree:
        flat = traverse_util.flatten_dict(params)
        if name == "all":
            sel = {k: True for k in flat}
        elif name == "kernels":
            sel = {k: v.ndim >= 2 for k, v in flat.items()}
        elif name == "bn_scales":
            sel = {k: k[-1] == "scale" and v.ndim == 1 for k, v in flat.items()}
        else:
            owners = [k[:-1] for k, v in flat.items() if v.ndim >= 2]
            if not owners:
                raise ValueError("weight_decay_mask='last_layer': the params have no kernel")
            last = owners[-1]
            sel = {k: k[: len(last)] == last for k in flat}
        return traverse_util.unflatten_dict(sel)

    return mask


def _base(config: Mapping[str, Any], schedule: optax.Schedule) -> optax.GradientTransformation:
    name = _choice(config.get("name", "momentum"), OPTIMIZERS, "optimizer.name")
    wd = float(config.get("weight_decay", 0.0))
    mask = weight_decay_mask(config.get("weight_decay_mask", "kernels"))
    b1, b2 = float(config.get("b1", 0.9)), float(config.get("b2", 0.999))
    eps = float(config.get("eps", 1e-8))
    if name == "adamw":
        return optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=wd, mask=mask)
    if name == "adam":
        core = optax.adam(schedule, b1=b1, b2=b2, eps=eps)
    else:
        momentum = None if name == "sgd" else float(config.get("momentum", 0.9))
        core = optax.sgd(schedule, momentum=momentum, nesterov=name == "nesterov")
    if wd == 0.0:
        return core
    return optax.chain(optax.add_decayed_weights(wd, mask), core)


def _wrapper(name: str) -> tuple[Callable[..., Any], str]:
    attr, how = WRAPPERS[_choice(name, WRAPPERS, "optimizer.wrappers entry")]
    optim = importlib.import_module("jaxnorm.optim")
    fn = getattr(optim, attr, None)
    if fn is None:
        raise ValueError(
            f"optimizer wrapper {name!r} needs jaxnorm.optim.{attr}, which this installation lacks"
        )
    return fn, how


def make_optimizer(
    config: Mapping[str, Any], total_steps: int
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """Builds ``(tx, schedule)`` from an optimizer config (see the module docstring).

    ``total_steps`` counts micro-steps; with ``accumulate_steps = k`` the schedule runs over
    ``total_steps // k`` updates and ``tx`` is ``optax.MultiSteps(..., every_k_schedule=k)``.
    """
    accumulate = int(config.get("accumulate_steps", 1))
    if accumulate < 1:
        raise ValueError(f"optimizer.accumulate_steps must be >= 1, got {accumulate}")
    schedule = make_schedule(config, max(1, total_steps // accumulate))
    tx = _base(config, schedule)
    clip = float(config.get("grad_clip_norm", 0.0))
    if clip > 0:
        tx = optax.chain(optax.clip_by_global_norm(clip), tx)
    wrapper_kwargs = dict(config.get("wrapper_kwargs", {}) or {})
    for name in tuple(config.get("wrappers", ()) or ()):
        fn, how = _wrapper(name)
        kwargs = dict(wrapper_kwargs.get(name, {}) or {})
        if how == "wrap":
            tx = fn(tx, **kwargs)
        elif how == "inner":
            tx = fn(inner=tx, rescale_state=True, **kwargs)
        else:
            tx = optax.chain(tx, fn(**kwargs))
    if accumulate > 1:
        tx = optax.MultiSteps(tx, every_k_schedule=accumulate).gradient_transformation()
    return tx, schedule


def learning_rate(schedule: optax.Schedule, step: jax.Array, accumulate_steps: int = 1) -> jax.Array:
    """The learning rate in effect at micro-step ``step``."""
    return schedule(step // accumulate_steps)
