"""Optimizers from a config: a registry of optax optimizers, LR schedules and weight-decay masks.

``make_optimizer(config, total_steps)`` turns the ``optimizer`` block of an experiment config into an
``optax.GradientTransformation``::

    name: sgd | momentum | nesterov | adam | adamw | adamp | sgdp | adamwn
    learning_rate, momentum, b1, b2, eps
    adamp / sgdp: delta, wd_ratio, nesterov, projection_mask (cosine | kernels | hidden_kernels |
      scale_invariant); adamwn: target_norm, per_unit
    schedule: constant | step | cosine | linear | quadratic ; warmup_steps, boundaries (fractions of the
      run), decay_factor, end_value
    weight_decay, weight_decay_mask: all | kernels | hidden_kernels | bn_scales | last_layer | last_kernel
    grad_clip_norm (0 = off), accumulate_steps (optax.MultiSteps)
    wrappers: names from WRAPPERS, applied in order; wrapper_kwargs: {name: {kwarg: value}}
      (a wrapper's ``mask``: kernels | hidden_kernels | scale_invariant)

Weight decay is the L2 penalty added to the gradient (as in the papers: Hoffer et al. 2018 Sec. 2 and
the ENorm paper train with SGD + L2) for every optimizer except ``adamw`` (Loshchilov & Hutter 2019),
``adamp`` / ``sgdp`` (Heo et al. 2021, Algs. 1-2: decoupled, times ``wd_ratio`` on projected kernels)
and ``adamwn`` (Loshchilov 2023: decoupled, towards norm ``target_norm``), where it is decoupled.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import traverse_util

from jaxnorm import optim
from jaxnorm.train.config_checks import check_optimizer_options

PyTree = Any

OPTIMIZERS = ("sgd", "momentum", "nesterov", "adam", "adamw", "adamp", "sgdp", "adamwn")
SCHEDULES = ("constant", "step", "cosine", "linear", "quadratic")
WEIGHT_DECAY_MASKS = (
    "all",
    "kernels",
    "hidden_kernels",
    "bn_scales",
    "kernels_and_bn_scales",
    "last_layer",
    "last_kernel",
)
MASKS = ("kernels", "hidden_kernels", "scale_invariant")
"""Values of a wrapper's ``mask`` kwarg: every kernel (rank >= 2 leaf), every kernel but the
classifier's (``weight_decay_mask('hidden_kernels')``: e.g. the magnitude-preserving layers of a
``norm='mp'`` model, which the tracer does not count as scale invariant), or the scale-invariant ones
(kernels whose units feed a BatchNorm, found by tracing the model; the training loop supplies them)."""
PROJECTION_MASKS = ("cosine", *MASKS)
"""Values of ``adamp`` / ``sgdp``'s ``projection_mask`` and of the ``radial_projection`` wrapper's
``mask``: ``cosine`` is the paper's test (Heo et al. Sec. 3.2), the others project the kernels they
select on every step and no other."""
DECAY_TO_NORM_MASKS = ("kernels", "hidden_kernels", "last_kernel")
"""The ``weight_decay_mask`` values ``adamwn`` accepts: its per-unit norms need kernels (rank >= 2)."""


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
        scales: dict[int, float] = {}
        for b in boundaries:  # boundaries that round to the same step both decay there (a dict kept one)
            step = max(1, round(b * decay_steps))
            scales[step] = scales.get(step, 1.0) * factor
        main = optax.piecewise_constant_schedule(lr, scales)
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
    directions); ``bn_scales``: the ``scale`` leaves of normalization layers (BN gammas);
    ``kernels_and_bn_scales``: both (Liu et al.'s placement of WD, Supp. B.2); ``last_layer``:
    the leaves of the classifier, the module named ``head`` that owns a kernel (every jaxnorm model
    names its classifier so; in other models the last kernel owner in natural name order, flax's
    ``Dense_0 ... Dense_N``: pass a bool tree where that is not the classifier); ``last_kernel``: that
    module's kernel only (the classifier's share of ``kernels``); ``hidden_kernels``: ``kernels``
    without ``last_kernel`` (the hidden layers' kernels).
    The classifier is found by name, not position: JAX rebuilds a dict with sorted keys (gradients,
    trees under ``jit``), so the "last" module of ResNet's ``{head, stage*, stem}`` was ``stem``.
    """
    _choice(name, WEIGHT_DECAY_MASKS, "optimizer.weight_decay_mask")

    def mask(params: PyTree) -> PyTree:
        flat = traverse_util.flatten_dict(params)
        if name == "all":
            sel = {k: True for k in flat}
        elif name == "kernels":
            sel = {k: v.ndim >= 2 for k, v in flat.items()}
        elif name in ("bn_scales", "kernels_and_bn_scales"):
            kernels = name == "kernels_and_bn_scales"
            sel = {k: (k[-1] == "scale" and v.ndim == 1) or (kernels and v.ndim > 1) for k, v in flat.items()}
        else:
            last = _classifier(flat, name)
            if name == "last_kernel":
                sel = {k: k[:-1] == last and flat[k].ndim >= 2 for k in flat}
            elif name == "hidden_kernels":
                sel = {k: k[:-1] != last and flat[k].ndim >= 2 for k in flat}
            else:
                sel = {k: k[: len(last)] == last for k in flat}
        return traverse_util.unflatten_dict(sel)

    return mask


CLASSIFIER = "head"
"""The module name of the classifier that the ``last_layer`` / ``last_kernel`` / ``hidden_kernels`` masks
select (jaxnorm's models: :mod:`jaxnorm.models.norms`)."""


def _classifier(flat: dict[tuple, Any], name: str) -> tuple:
    """The classifier's module path: the one module named :data:`CLASSIFIER` that owns a kernel (a leaf of
    rank >= 2); in a model without one, the last kernel owner in natural name order (flax's automatic
    names ``Dense_0 ... Dense_11`` by their numbers), whatever the order of the dict's keys."""
    owners = {k[:-1] for k, v in flat.items() if v.ndim >= 2}
    if not owners:
        raise ValueError(f"weight_decay_mask={name!r}: the params have no kernel")
    heads = [o for o in owners if o and o[-1] == CLASSIFIER]
    if len(heads) > 1:
        raise ValueError(
            f"weight_decay_mask={name!r}: the params have {len(heads)} modules named {CLASSIFIER!r} that "
            f"own a kernel ({['/'.join(map(str, o)) for o in sorted(heads)]}); choose another mask"
        )
    if heads:
        return heads[0]

    def natural(path: tuple) -> tuple:
        return tuple(tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(p))) for p in path)

    return max(owners, key=natural)


class WrapperContext(NamedTuple):
    """What a wrapper may need beyond its kwargs.

    Attributes:
      schedule: the learning-rate schedule of the base optimizer (over updates).
      base_learning_rate: the config's ``learning_rate`` (the schedule's peak).
      total_updates: the number of optimizer updates of the run.
      scale_invariant_mask: the model's scale-invariant kernels (a bool tree), for ``mask:
        scale_invariant``; ``None`` when the model is not known.
      reference_norms: the recorded norms ``wd_mimicry`` follows; ``None`` when not loaded.
      checking: only check the config (no model, no reference run yet): wrappers that need what is
        missing check their kwargs and leave the optimizer unchanged.
    """

    schedule: optax.Schedule
    base_learning_rate: float
    total_updates: int
    scale_invariant_mask: PyTree | None = None
    reference_norms: PyTree | None = None
    checking: bool = False


def _mask(name: str, context: WrapperContext, wrapper: str, key: str | None = None) -> Any:
    """A wrapper's ``mask`` kwarg as a mask: ``None`` (every kernel), the hidden kernels (a function
    of the params) or the scale-invariant tree. ``key``: the config key read (default the wrapper's
    ``wrapper_kwargs.<wrapper>.mask``; ``wrapper`` is then ``optimizer.<name>``)."""
    where = f"optimizer.wrapper_kwargs.{wrapper}.mask" if key is None else f"optimizer.{key}"
    _choice(name, MASKS, where)
    if name == "kernels":
        return None
    if name == "hidden_kernels":
        return weight_decay_mask("hidden_kernels")
    if context.scale_invariant_mask is None and not context.checking:
        what = f"optimizer wrapper {wrapper!r}" if key is None else where
        raise ValueError(
            f"{what} with mask 'scale_invariant' needs the model's scale-invariant "
            "kernels: train through jaxnorm.train.train, or pass scale_invariant_mask= to make_optimizer"
        )
    return context.scale_invariant_mask


def _radial_base(name, config, schedule, wd, mask, context):
    """AdamP / SGDP (Heo et al. 2021) with the registry's options (``delta``, ``wd_ratio``,
    ``nesterov``, ``projection_mask``); their decoupled decay acts on ``weight_decay_mask``'s leaves."""
    selection = _choice(
        config.get("projection_mask", "cosine"), PROJECTION_MASKS, "optimizer.projection_mask"
    )
    projection = None if selection == "cosine" else _mask(selection, context, name, "projection_mask")
    common = {
        "weight_decay": wd,
        "delta": float(config.get("delta", 0.1)),
        "wd_ratio": float(config.get("wd_ratio", 0.1)),
        "nesterov": config.get("nesterov", False),
        "mask": projection,
        "decay_mask": mask,
    }
    b1, b2 = float(config.get("b1", 0.9)), float(config.get("b2", 0.999))
    eps = float(config.get("eps", 1e-8))
    try:
        if name == "adamp":
            return optim.adamp(schedule, b1=b1, b2=b2, eps=eps, **common)
        return optim.sgdp(schedule, momentum=float(config.get("momentum", 0.9)), **common)
    except (ValueError, TypeError) as err:
        raise ValueError(f"optimizer (name {name!r}): {err}") from err


def _base(
    config: Mapping[str, Any], schedule: optax.Schedule, context: WrapperContext
) -> optax.GradientTransformation:
    name = _choice(config.get("name", "momentum"), OPTIMIZERS, "optimizer.name")
    wd = float(config.get("weight_decay", 0.0))
    mask_name = config.get("weight_decay_mask", "kernels")
    mask = weight_decay_mask(mask_name)
    b1, b2 = float(config.get("b1", 0.9)), float(config.get("b2", 0.999))
    eps = float(config.get("eps", 1e-8))
    if name == "adamw":
        return optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=wd, mask=mask)
    if name in ("adamp", "sgdp"):
        return _radial_base(name, config, schedule, wd, mask, context)
    if name == "adamwn":
        _choice(mask_name, DECAY_TO_NORM_MASKS, "optimizer.weight_decay_mask (adamwn: kernels only)")
        try:
            return optim.adamwn(
                schedule,
                float(config.get("target_norm", 0.0)),
                b1=b1,
                b2=b2,
                eps=eps,
                weight_decay=wd,
                per_unit=config.get("per_unit", True),
                mask=mask,
            )
        except (ValueError, TypeError) as err:
            raise ValueError(f"optimizer (name 'adamwn'): {err}") from err
    if name == "adam":
        core = optax.adam(schedule, b1=b1, b2=b2, eps=eps)
    else:
        momentum = None if name == "sgd" else float(config.get("momentum", 0.9))
        core = optax.sgd(schedule, momentum=momentum, nesterov=name == "nesterov")
    if wd == 0.0:
        return core
    return optax.chain(optax.add_decayed_weights(wd, mask), core)


def _wrs(tx, context, *, tau: int = 20, mask: str = "kernels"):
    return optax.chain(tx, optim.weight_rescaling(tau, mask=_mask(mask, context, "wrs")))


def _wrs_state(tx, context, *, tau: int = 20, mask: str = "kernels"):
    return optim.weight_rescaling(tau, mask=_mask(mask, context, "wrs_state"), inner=tx, rescale_state=True)


def _bwn(tx, context, *, rho: Any = None, mask: str = "kernels"):
    return optax.chain(tx, optim.bwn_projection(mask=_mask(mask, context, "bwn"), rho=rho))


ENORM_C_KEYS = ("hidden", "last")
"""Keys of a mapping ``c`` of the ``enorm`` wrapper: the hidden junctions (every junction but the
last, in spec order) and the last one (the units the classifier reads)."""


def check_enorm_c(c: Any) -> None:
    """Raises ``ValueError`` naming ``optimizer.wrapper_kwargs.enorm.c`` unless ``c`` is a number
    > 0, a sequence of them (one per junction), or a mapping ``{"hidden": c_h, "last": c_l}``
    (either key may be left out: 1.0) whose ``"last"`` may be ``None`` (that junction is not
    balanced, as in the authors' code, facebookresearch/enorm ``ENorm._step_fc``)."""
    what = "optimizer.wrapper_kwargs.enorm.c"
    from jaxnorm.enorm.balance import check_c

    if isinstance(c, Mapping) or hasattr(c, "unlocked"):
        unknown = [k for k in c if k not in ENORM_C_KEYS]
        if unknown or not c:
            raise ValueError(f"{what}: a mapping c takes the keys {ENORM_C_KEYS}, got {sorted(c)}")
        for key, value in c.items():
            if value is None and key == "last":
                continue
            check_c(value, f"{what}.{key}")
        return
    check_c(tuple(c) if isinstance(c, list) else c, what, per_junction=True)


def resolve_enorm_c(c: Any, spec: Sequence[Any]) -> tuple[Any, tuple[Any, ...]]:
    """``(c, spec)`` for :func:`jaxnorm.optim.enorm`: a mapping ``c`` expanded to one value per
    junction of ``spec`` (``"hidden"`` for all but the last, ``"last"`` for the last; a missing key
    means 1.0), the last junction dropped from the spec where ``"last"`` is ``None``; any other
    ``c`` returned as it is."""
    check_enorm_c(c)
    spec = tuple(spec)
    if not (isinstance(c, Mapping) or hasattr(c, "unlocked")):
        return c, spec
    hidden, last = float(c.get("hidden", 1.0)), c.get("last", 1.0)
    if last is None:
        return tuple([hidden] * (len(spec) - 1)), spec[:-1]
    return tuple([hidden] * (len(spec) - 1) + [float(last)]), spec


def _enorm(tx, context, *, c: Any = 1.0, start: int = 0, spec: Any = None, **kwargs):
    check_enorm_c(c)
    if isinstance(start, bool) or not isinstance(start, int) or start < 0:
        raise ValueError(f"optimizer.wrapper_kwargs.enorm.start must be an int >= 0, got {start!r}")
    if isinstance(c, Mapping) or hasattr(c, "unlocked"):
        if spec is None:
            if context.checking:
                return tx
            raise ValueError(
                "optimizer.wrapper_kwargs.enorm.c: a mapping c needs the network's junctions: train "
                "through jaxnorm.train.train (it resolves them), or pass wrapper_kwargs.enorm.spec"
            )
        c, spec = resolve_enorm_c(c, spec)
    if isinstance(c, list):
        c = tuple(c)
    balanced = optim.enorm(tx, spec, c=c, **kwargs)
    return balanced if start == 0 else _delayed(balanced, tx, start)


def _delayed(balanced: optax.GradientTransformation, inner: optax.GradientTransformation, start: int):
    """``balanced`` (an :func:`jaxnorm.optim.enorm` wrapper of ``inner``) that only plays ``inner``
    for its first ``start`` updates: balancing starts at update ``start + 1`` (its state, an
    :class:`jaxnorm.optim.EnormState`, counts every update)."""

    def update_fn(updates, state, params=None, **extra):
        def plain():
            new, inner_state = inner.update(updates, state.inner_state, params)
            return new, optim.EnormState(optax.safe_int32_increment(state.count), inner_state)

        def enorm():
            return balanced.update(updates, state, params)

        shapes = jax.eval_shape(enorm)
        cast = lambda out: jax.tree.map(lambda x, ref: jnp.asarray(x, ref.dtype), out, shapes)
        return jax.lax.cond(state.count >= start, lambda: cast(enorm()), lambda: cast(plain()))

    return optax.GradientTransformation(balanced.init, update_fn)


def _record_norms(tx, context, *, every: int = 1, mask: str = "scale_invariant"):
    record = optim.record_norms(context.total_updates, every=every, mask=_mask(mask, context, "record_norms"))
    return optax.chain(tx, record)


def _wd_mimicry(
    tx, context, *, reference: str, every: int = 1, step_decay: float = 0.0, mask: str = "scale_invariant"
):
    del reference  # a file or run name: the training loop loads it into context.reference_norms
    selected = _mask(mask, context, "wd_mimicry")
    if context.reference_norms is None:
        if context.checking:
            return tx
        raise ValueError(
            "optimizer wrapper 'wd_mimicry' needs the reference run's recorded norms: train through "
            "jaxnorm.train.train (it loads wrapper_kwargs.wd_mimicry.reference), or pass "
            "reference_norms= to make_optimizer"
        )
    mimic = optim.wd_mimicry(context.reference_norms, every=every, mask=selected, step_decay=step_decay)
    return optax.chain(tx, mimic)


def _norm_schedule(tx, context, *, rho: float = 1.0, mask: str = "scale_invariant"):
    return optax.chain(tx, optim.norm_schedule(rho, mask=_mask(mask, context, "norm_schedule")))


def _norm_schedule_from_lr(tx, context, *, mask: str = "scale_invariant"):
    trade = optim.norm_schedule_from_lr(
        context.schedule, context.base_learning_rate, mask=_mask(mask, context, "norm_schedule_from_lr")
    )
    return optax.chain(tx, trade)


def _window(
    tx,
    context,
    *,
    kind: str,
    start: int,
    end: int,
    weight_decay: float = 0.0,
    tau: int = 20,
    mask: str = "kernels",
):
    if not 0 <= start < end:
        raise ValueError(f"optimizer.wrapper_kwargs.window: need 0 <= start < end, got {start}, {end}")

    def active(count):
        return (count >= start) & (count < end)

    selected = _mask(mask, context, "window")
    if _choice(kind, ("wd", "wrs"), "optimizer.wrapper_kwargs.window.kind") == "wd":
        decay = optax.add_decayed_weights(
            weight_decay, weight_decay_mask("kernels") if selected is None else selected
        )
        return optax.chain(optax.transforms.conditionally_transform(decay, active), tx)
    wrs = optim.weight_rescaling(tau, mask=selected)
    return optax.chain(tx, optax.transforms.conditionally_transform(wrs, active))


def _sphere_projection(tx, context, *, target: Any = 1.0, unit_axis: int = -1, mask: str = "kernels"):
    selected = _mask(mask, context, "sphere_projection")
    try:
        sphere = optim.sphere_projection(target, unit_axis=unit_axis, mask=selected)
    except (ValueError, TypeError) as err:
        raise ValueError(f"optimizer.wrapper_kwargs.sphere_projection: {err}") from err
    return optax.chain(tx, sphere)


def _radial_projection(tx, context, *, delta: float = 0.1, eps: float = 1e-8, mask: str = "cosine"):
    _choice(mask, PROJECTION_MASKS, "optimizer.wrapper_kwargs.radial_projection.mask")
    selected = None if mask == "cosine" else _mask(mask, context, "radial_projection")
    try:
        return optim.radial_projection(tx, delta=delta, eps=eps, mask=selected)
    except (ValueError, TypeError) as err:
        raise ValueError(f"optimizer.wrapper_kwargs.radial_projection: {err}") from err


def _decay_to_norm(
    tx, context, *, weight_decay: float, target: float = 0.0, per_unit: bool = True, mask: str = "kernels"
):
    selected = _mask(mask, context, "decay_to_norm")
    try:
        decay = optim.decay_to_norm(weight_decay, target, per_unit=per_unit, mask=selected)
    except (ValueError, TypeError) as err:
        raise ValueError(f"optimizer.wrapper_kwargs.decay_to_norm: {err}") from err
    return optax.chain(decay, tx)


TELEPORTATION_KEYS = (
    "every",
    "until",
    "steps",
    "step_size",
    "objective",
    "max_scale",
    "power_of_two",
    "spec",
)
"""The kwargs of the ``teleportation`` wrapper (those of :func:`jaxnorm.optim.teleportation`;
``spec`` is filled in by the training loop, :func:`jaxnorm.train.setup.with_teleportation_spec`)."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(
        value, bool | np.bool_
    )


def check_teleportation_kwargs(kwargs: Mapping[str, Any]) -> None:
    """Raises ``ValueError`` naming ``optimizer.wrapper_kwargs.teleportation.<key>`` unless the
    ``teleportation`` wrapper's kwargs are: ``every`` an int >= 1 (required); ``until`` ``None`` or
    an int >= ``every`` (an earlier ``until`` never teleports); ``steps`` an int >= 0;
    ``step_size`` a finite number > 0; ``objective`` a name in :data:`jaxnorm.enorm.teleport.OBJECTIVES`
    (the training loop passes no batch to the optimizer, so a callable objective cannot be
    evaluated); ``max_scale`` ``None`` or a number > 1; ``power_of_two`` ``None`` or a bool; no
    other key (:data:`TELEPORTATION_KEYS`)."""
    from jaxnorm.enorm.teleport import OBJECTIVES

    what = "optimizer.wrapper_kwargs.teleportation"
    unknown = [k for k in kwargs if k not in TELEPORTATION_KEYS]
    if unknown:
        raise ValueError(f"{what} has no key {unknown[0]!r}; valid: {TELEPORTATION_KEYS}")
    if "every" not in kwargs:
        raise ValueError(f"{what}.every is required (an int >= 1: teleport on every every-th update)")
    every = kwargs["every"]
    if not _is_int(every) or every < 1:
        raise ValueError(f"{what}.every must be an int >= 1, got {every!r}")
    until = kwargs.get("until", None)
    if until is not None and (not _is_int(until) or until < every):
        raise ValueError(
            f"{what}.until must be None or an int >= every ({every}; earlier, it never teleports), "
            f"got {until!r}"
        )
    steps = kwargs.get("steps", 10)
    if not _is_int(steps) or steps < 0:
        raise ValueError(f"{what}.steps must be an int >= 0, got {steps!r}")
    step_size = kwargs.get("step_size", 0.1)
    if not _is_number(step_size) or not (math.isfinite(step_size) and step_size > 0):
        raise ValueError(f"{what}.step_size must be a finite number > 0, got {step_size!r}")
    objective = kwargs.get("objective", "grad_norm")
    if not isinstance(objective, str) or objective not in OBJECTIVES:
        raise ValueError(
            f"{what}.objective must be one of {OBJECTIVES} (the training loop passes no batch to the "
            f"optimizer, so a callable objective(params, batch) cannot be used here), got {objective!r}"
        )
    max_scale = kwargs.get("max_scale", 16.0)
    if max_scale is not None and (not _is_number(max_scale) or not max_scale > 1):
        raise ValueError(f"{what}.max_scale must be None or a number > 1, got {max_scale!r}")
    power_of_two = kwargs.get("power_of_two", None)
    if power_of_two is not None and not isinstance(power_of_two, bool | np.bool_):
        raise ValueError(f"{what}.power_of_two must be None, True or False, got {power_of_two!r}")


def _teleportation(tx, context, **kwargs):
    check_teleportation_kwargs(kwargs)
    spec = kwargs.pop("spec", None)
    try:
        return optim.teleportation(tx, None if spec is None else tuple(spec), **kwargs)
    except (ValueError, TypeError) as err:
        raise ValueError(f"optimizer.wrapper_kwargs.teleportation: {err}") from err


WRAPPERS: dict[str, Callable[..., optax.GradientTransformation]] = {
    "wrs": _wrs,
    "wrs_state": _wrs_state,
    "bwn": _bwn,
    "enorm": _enorm,
    "record_norms": _record_norms,
    "wd_mimicry": _wd_mimicry,
    "norm_schedule": _norm_schedule,
    "norm_schedule_from_lr": _norm_schedule_from_lr,
    "window": _window,
    "sphere_projection": _sphere_projection,
    "radial_projection": _radial_projection,
    "decay_to_norm": _decay_to_norm,
    "teleportation": _teleportation,
}
"""Optimizer wrappers by name: ``build(tx, context, **wrapper_kwargs) -> tx``.

* ``wrs``: weight rescaling every ``tau`` updates, after the optimizer, its state left alone (Liu et
  al. Sec. 5); ``wrs_state``: the same wrapping the optimizer, whose state is rescaled with the weights.
* ``bwn``: bounded-weight-norm projection (Norm matters Sec. 4); ``enorm``: ENorm cycles (Stock et
  al. Alg. 2), kwargs of :func:`jaxnorm.optim.enorm`; its ``c`` may also be one value per junction or
  ``{"hidden": c_h, "last": c_l}`` (``c_l = None``: the classifier's junction is not balanced, as in
  the authors' code; see :func:`resolve_enorm_c`), and ``start`` delays balancing by that many
  updates.
* ``record_norms``: record the unit norms (the reference of ``wd_mimicry``; the loop saves them to
  ``recorded_norms.npz``); ``wd_mimicry``: scale each unit's step by ``||w||^2 / ||w_ref||^2``,
  ``reference`` = that file, its run directory or a sibling run's name (Norm matters Sec. 2).
* ``norm_schedule``: hold unit norms at ``rho``; ``norm_schedule_from_lr``: constant step for the
  selected units, norms ``sqrt(lr_0 / lr(t))`` in place of the LR decay (Norm matters Sec. 2).
* ``window``: weight decay (``kind: wd``, inside the momentum) or WRS (``kind: wrs``) active only
  for updates ``start <= t < end`` (Liu et al. Fig. 7).
* ``sphere_projection``: every selected unit back to norm ``target`` after each update (a number or
  ``"sqrt_fan_in"``: nGPT Sec. 2.6, EDM2's forced weight normalization; ``unit_axis``).
* ``radial_projection``: AdamP's projection of the updates around the optimizer so far (Heo et al.
  Sec. 3.2); ``mask: cosine`` (default) is the paper's test, a mask name projects those kernels always.
* ``decay_to_norm``: ``weight_decay * (w - target w / ||w||)`` added to the gradient before the
  optimizer (Loshchilov 2023; the L2 placement of the other optimizers' decay; for the decoupled form
  use the optimizer ``adamwn``).
* ``teleportation``: symmetry teleportation (Zhao et al., NeurIPS 2022, Alg. 1) every ``every``
  updates up to ``until``: the params move along the network's rescaling symmetries to maximise the
  squared gradient norm at an unchanged loss, the optimizer's state is transported, then the
  optimizer steps (:func:`jaxnorm.optim.teleportation`; kwargs ``every``, ``until``, ``steps``,
  ``step_size``, ``objective`` (named only), ``max_scale``, ``power_of_two``). It wraps the whole
  optimizer, so it is the last wrapper; the loop discovers its junctions in training and inference
  mode (on a BN net: BN gamma / beta -> the next kernel; :func:`jaxnorm.train.setup.teleportation_spec`).

``mask`` (``kernels``, ``hidden_kernels`` or ``scale_invariant``) selects the kernels; the Norm-matters
wrappers default to the scale-invariant ones, the others to every kernel (Liu et al. rescale the
classifier too).
"""


def check_teleportation_last(wrappers: Sequence[str]) -> None:
    """Raises ``ValueError`` naming ``optimizer.wrappers`` unless ``teleportation``, if present, is
    the last entry: it reads the raw loss gradient from its input and transports the state of
    everything it wraps, and a later wrapper would be chained around it."""
    if "teleportation" in wrappers and wrappers[-1] != "teleportation":
        raise ValueError(
            f"optimizer.wrappers={tuple(wrappers)}: 'teleportation' must be the last wrapper (it wraps the "
            "whole optimizer and must see the raw loss gradient)"
        )


def _wrapper_kwargs(config: Mapping[str, Any], name: str) -> dict[str, Any]:
    return dict((dict(config.get("wrapper_kwargs", {}) or {})).get(name, {}) or {})


def needs_scale_invariant_mask(config: Mapping[str, Any]) -> bool:
    """Whether the optimizer (``adamp`` / ``sgdp``'s ``projection_mask``) or a wrapper of the config
    selects the scale-invariant kernels."""
    if config.get("name") in ("adamp", "sgdp") and config.get("projection_mask") == "scale_invariant":
        return True
    for name in tuple(config.get("wrappers", ()) or ()):
        build = WRAPPERS[_choice(name, WRAPPERS, "optimizer.wrappers entry")]
        default = inspect.signature(build).parameters.get("mask")
        mask = _wrapper_kwargs(config, name).get("mask", None if default is None else default.default)
        if mask == "scale_invariant":
            return True
    return False


def make_optimizer(
    config: Mapping[str, Any],
    total_steps: int,
    *,
    scale_invariant_mask: PyTree | None = None,
    reference_norms: PyTree | None = None,
    checking: bool = False,
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """Builds ``(tx, schedule)`` from an optimizer config (see the module docstring).

    ``total_steps`` counts micro-steps; with ``accumulate_steps = k`` the schedule runs over
    ``total_steps // k`` updates and ``tx`` is ``optax.MultiSteps(..., every_k_schedule=k)``.
    ``scale_invariant_mask`` (from :func:`jaxnorm.optim.scale_invariant_mask`) and ``reference_norms``
    (from :func:`jaxnorm.train.norm_records.load_recorded_norms`) serve the wrappers that need them
    (:class:`WrapperContext`); ``checking=True`` checks a config without them.
    """
    check_optimizer_options(config)
    accumulate = int(config.get("accumulate_steps", 1))
    if accumulate < 1:
        raise ValueError(f"optimizer.accumulate_steps must be >= 1, got {accumulate}")
    updates = max(1, total_steps // accumulate)
    schedule = make_schedule(config, updates)
    context = WrapperContext(
        schedule=schedule,
        base_learning_rate=float(config.get("learning_rate", 0.1)),
        total_updates=updates,
        scale_invariant_mask=scale_invariant_mask,
        reference_norms=reference_norms,
        checking=checking,
    )
    tx = _base(config, schedule, context)
    clip = float(config.get("grad_clip_norm", 0.0))
    if clip > 0:
        tx = optax.chain(optax.clip_by_global_norm(clip), tx)
    wrappers = tuple(config.get("wrappers", ()) or ())
    check_teleportation_last(wrappers)
    for name in wrappers:
        build = WRAPPERS[_choice(name, WRAPPERS, "optimizer.wrappers entry")]
        kwargs = _wrapper_kwargs(config, name)
        try:
            inspect.signature(build).bind(tx, context, **kwargs)
        except TypeError as err:
            raise ValueError(f"optimizer.wrapper_kwargs.{name}: {err}") from err
        tx = build(tx, context, **kwargs)
    if accumulate > 1:
        tx = optax.MultiSteps(tx, every_k_schedule=accumulate).gradient_transformation()
    return tx, schedule


def learning_rate(schedule: optax.Schedule, step: jax.Array, accumulate_steps: int = 1) -> jax.Array:
    """The learning rate in effect at micro-step ``step``."""
    return schedule(step // accumulate_steps)
