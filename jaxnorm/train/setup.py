"""The optimizer a run config names, prepared for one model: what :func:`train` needs before its loop.

Some optimizer wrappers need more than the config: ``enorm`` a spec of the network's rescaling
symmetries (traced with :func:`jaxnorm.enorm.discover` when the params are not a plain chain),
``teleportation`` the symmetries of both training and inference mode (:func:`teleportation_spec`), the
Norm-matters wrappers masked ``"scale_invariant"`` the model's scale-invariant kernels (traced on a
batch), and ``wd_mimicry`` the norms a reference run recorded. :func:`build_optimizer` resolves them
and calls :func:`jaxnorm.train.optimizers.make_optimizer`. :func:`params_hook_for` builds the
run's params hook (implicit ENorm) on the model's junctions. :func:`batch_stats_transport` gives the step
the map that moves BatchNorm running statistics with the kernels a rescaling wrapper divides.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
import optax

from jaxnorm.train.norm_records import load_recorded_norms, resolve_reference
from jaxnorm.train.optimizers import make_optimizer, needs_scale_invariant_mask
from jaxnorm.train.params_hooks import (
    ParamsHook,
    check_implicit_enorm,
    implicit_enorm_enabled,
    implicit_enorm_hook,
)

PyTree = Any


def build_optimizer(
    optimizer: Mapping[str, Any],
    *,
    model: Any,
    images: jax.Array,
    schedule_steps: int,
    axis_name: str | None = None,
    invariance_model: Any = None,
    workdir: str | None = None,
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """``(tx, schedule)`` for the ``optimizer`` config block on ``model``.

    Args:
      optimizer: the config's ``optimizer`` block.
      model: the linen module being trained.
      images: one batch of inputs (shapes only; the first :data:`TRACE_EXAMPLES` are the tracing sample).
      schedule_steps: the run length the learning-rate schedule spans.
      axis_name, invariance_model: see :func:`scale_invariant_mask_for`.
      workdir: the run directory, against which ``wd_mimicry``'s reference name is resolved.
    """
    mask = (
        scale_invariant_mask_for(model, images, axis_name, invariance_model)
        if needs_scale_invariant_mask(optimizer)
        else None
    )
    return make_optimizer(
        with_teleportation_spec(with_enorm_spec(optimizer, model, images[:TRACE_EXAMPLES]), model, images),
        schedule_steps,
        scale_invariant_mask=mask,
        reference_norms=reference_norms(optimizer, workdir),
    )


TRACE_EXAMPLES = 2
"""Examples of the first batch the set-up's traces initialise the model on: one example would fail
weight norm's data-dependent initialisation, which needs two values per unit of a Dense layer."""


def tracing_variables(model: Any, images: jax.Array) -> PyTree:
    """``model.init`` in inference mode on the first :data:`TRACE_EXAMPLES` examples of ``images``: the
    variables the set-up traces the network with (their values matter only for their structure)."""
    return model.init(jax.random.PRNGKey(0), images[:TRACE_EXAMPLES], train=False)


def with_enorm_spec(optimizer: Mapping[str, Any], model: Any, sample: jax.Array) -> Mapping[str, Any]:
    """``optimizer`` with the ``enorm`` wrapper's spec discovered from ``model`` where it needs one.

    Without a spec, :func:`jaxnorm.optim.enorm` reads the params as a plain Dense / Conv chain
    (:func:`jaxnorm.enorm.chain`); networks that are not one (a BatchNorm after the classifier,
    residual blocks) get their junctions from :func:`jaxnorm.enorm.discover`, traced in inference
    mode on ``sample``. Chains and explicit specs are left as they are, except that a chain is
    written out when ``c`` is a ``{"hidden": ..., "last": ...}`` mapping (the wrapper expands it
    over the junctions, :func:`jaxnorm.train.optimizers.resolve_enorm_c`).
    """
    wrapper_kwargs = dict(optimizer.get("wrapper_kwargs", {}) or {})
    enorm_kwargs = dict(wrapper_kwargs.get("enorm", {}) or {})
    if "enorm" not in tuple(optimizer.get("wrappers", ()) or ()) or enorm_kwargs.get("spec") is not None:
        return optimizer
    from jaxnorm.enorm import chain, discover

    c = enorm_kwargs.get("c", 1.0)
    per_part = isinstance(c, Mapping) or hasattr(c, "unlocked")  # {"hidden": ..., "last": ...}
    variables = tracing_variables(model, sample)
    try:
        spec = chain(variables["params"])
        if not per_part:
            return optimizer
    except ValueError:
        spec = discover(
            lambda params, x: model.apply({**variables, "params": params}, x, train=False),
            variables["params"],
            sample,
        )
    enorm_kwargs["spec"] = spec
    return {**dict(optimizer), "wrapper_kwargs": {**wrapper_kwargs, "enorm": enorm_kwargs}}


def _entry_key(entry: tuple) -> tuple:
    """A hashable form of a junction entry ``(path, axis[, index])``."""
    if len(entry) == 2:
        return tuple(entry)
    index = np.asarray(entry[2])
    return (entry[0], entry[1], index.shape, index.tobytes())


def _junction_key(junction: Any) -> tuple:
    return (
        frozenset(_entry_key(e) for e in junction.producers),
        frozenset(_entry_key(e) for e in junction.consumers),
    )


def teleportation_spec(model: Any, images: jax.Array) -> tuple:
    """The junctions the ``teleportation`` wrapper may move: those :func:`jaxnorm.enorm.discover`
    finds both in training mode (BatchNorm on batch statistics, the logits only; traced on the batch
    ``images``) and in inference mode (running statistics; on its first example).

    Teleportation needs the *training* loss unchanged, so that the gradient at the teleported point
    is ``g / m``, and the evaluated function unchanged too. On a network without normalization both
    traces give the ReLU chain. On a BN network the inference-mode trace also offers the kernels
    feeding a BN (a symmetry of the running-statistics affine map only, not of the training loss:
    BN divides their scale out, so the next layer would see the compensation alone); the training-mode
    trace offers BN's gamma / beta -> the next kernel, a symmetry in both modes. Raises
    ``ValueError`` naming the wrapper when no junction is left (e.g. ``norm='mp'``, weight norm)."""
    from jaxnorm.enorm import discover

    variables = tracing_variables(model, images)
    rngs = {"dropout": jax.random.PRNGKey(0)}

    def train_fn(params, x):
        out = model.apply({**variables, "params": params}, x, train=True, mutable=["batch_stats"], rngs=rngs)
        return out[0]

    def eval_fn(params, x):
        return model.apply({**variables, "params": params}, x, train=False)

    trained = discover(train_fn, variables["params"], images)
    evaluated = {_junction_key(j) for j in discover(eval_fn, variables["params"], images[:1])}
    spec = tuple(j for j in trained if _junction_key(j) in evaluated)
    if not spec:
        raise ValueError(
            "optimizer wrapper 'teleportation': jaxnorm.enorm.discover finds no rescaling symmetry of "
            "this model in both training and inference mode (it needs ReLU-like units between two "
            "layers, e.g. norm='none', or BN gamma / beta before a ReLU); remove the wrapper"
        )
    return spec


def with_teleportation_spec(optimizer: Mapping[str, Any], model: Any, images: jax.Array) -> Mapping[str, Any]:
    """``optimizer`` with the ``teleportation`` wrapper's spec from :func:`teleportation_spec`
    where the config gives none."""
    wrapper_kwargs = dict(optimizer.get("wrapper_kwargs", {}) or {})
    kwargs = dict(wrapper_kwargs.get("teleportation", {}) or {})
    if "teleportation" not in tuple(optimizer.get("wrappers", ()) or ()) or kwargs.get("spec") is not None:
        return optimizer
    kwargs["spec"] = teleportation_spec(model, images)
    return {**dict(optimizer), "wrapper_kwargs": {**wrapper_kwargs, "teleportation": kwargs}}


def params_hook_for(config: Mapping[str, Any], model: Any, images: jax.Array) -> ParamsHook | None:
    """The :class:`jaxnorm.train.params_hooks.ParamsHook` the run ``config`` asks for, or ``None``:
    implicit ENorm (``config.implicit_enorm.weight > 0``) over the model's junctions (a chain, or
    :func:`jaxnorm.enorm.discover` traced in inference mode on the first :data:`TRACE_EXAMPLES` of
    ``images``)."""
    block = config.get("implicit_enorm", None)
    check_implicit_enorm(block)
    if not implicit_enorm_enabled(block):
        return None
    from jaxnorm.enorm import chain, discover

    sample = images[:TRACE_EXAMPLES]
    variables = tracing_variables(model, sample)
    try:
        spec = chain(variables["params"])
    except ValueError:
        spec = discover(
            lambda params, x: model.apply({**variables, "params": params}, x, train=False),
            variables["params"],
            sample,
        )
    return implicit_enorm_hook(dict(block), spec)


def scale_invariant_mask_for(
    model: Any, images: jax.Array, axis_name: str | None, invariance_model: Any = None
) -> PyTree:
    """The model's scale-invariant kernels (their units feed a BatchNorm), traced in training mode
    on a batch of ``images`` (only the shapes are used: a full batch satisfies the statistics'
    size checks, e.g. top-k's k). Under pmap (``axis_name`` set) the trace runs on
    ``invariance_model``, the same network with per-device statistics."""
    from jaxnorm.optim import scale_invariant_mask

    if axis_name is not None:
        if invariance_model is None:
            raise ValueError(
                "optimizer wrappers with mask 'scale_invariant' under parallel='pmap' need "
                "train(..., invariance_model=...), the same network without the BN axis_name: the BN "
                "layers merge their moments across devices in one stacked collective, which the tracer "
                "of jaxnorm.optim.scale_invariant_mask cannot follow (the experiment runner "
                "passes it); or use parallel='jit' (sharded, the main path) or mask 'kernels'"
            )
        model = invariance_model
    variables = tracing_variables(model, images)
    mask = scale_invariant_mask(
        lambda v, x: model.apply(v, x, train=True, mutable=["batch_stats"])[0], variables, images
    )
    if not any(jax.tree.leaves(mask)):
        raise ValueError(
            "optimizer wrappers with mask 'scale_invariant': no kernel of this model is scale invariant "
            "(none feeds a BatchNorm, or jaxnorm.optim.scale_invariant_mask cannot follow the model); "
            "use mask 'kernels'"
        )
    return mask


def batch_stats_transport(
    optimizer: Mapping[str, Any],
    *,
    model: Any,
    images: jax.Array,
    opt_state: PyTree,
    axis_name: str | None = None,
    invariance_model: Any = None,
) -> Callable[[PyTree, PyTree], PyTree] | None:
    """``transport(batch_stats, opt_state) -> batch_stats`` that keeps BatchNorm's running statistics
    in step with the kernels a rescaling wrapper (``wrs``, ``wrs_state``, ``bwn``, ``norm_schedule``,
    ``norm_schedule_from_lr``, a ``window`` of WRS) divided by ``s`` at the last update: the linked
    running mean becomes ``mean / s`` and the variance ``var / s**2``, so eval-mode outputs do not
    jump at a rescaling step (:func:`jaxnorm.enorm.transport_batch_stats`; the links are traced once
    by :func:`jaxnorm.enorm.batch_stats_map` in eval mode on one example). ``None`` (nothing to do)
    when ``optimizer.transport_batch_stats`` is off, no wrapper rescales (``opt_state`` holds no
    rescaling state) or no kernel feeds a BatchNorm exactly. Under pmap the trace runs on
    ``invariance_model`` (the network without the BN ``axis_name``)."""
    if not optimizer.get("transport_batch_stats", True):
        return None
    from jaxnorm.enorm import batch_stats_map, transport_batch_stats
    from jaxnorm.optim import last_scales

    try:
        last_scales(opt_state)
    except ValueError:  # no wrapper rescales the kernels
        return None
    if axis_name is not None and invariance_model is not None:
        model = invariance_model
    variables = tracing_variables(model, images)
    if "batch_stats" not in variables:
        return None
    stats_map = batch_stats_map(lambda v, x: model.apply(v, x, train=False), dict(variables), images[:1])
    if not stats_map:
        return None

    def transport(stats: PyTree, state: PyTree) -> PyTree:
        # ones on a micro-step that only accumulated: the kernels did not move, nor do the statistics
        return transport_batch_stats(stats, last_scales(state), stats_map)

    return transport


def reference_norms(optimizer: Mapping[str, Any], workdir: str | None) -> PyTree | None:
    """The recorded norms the ``wd_mimicry`` wrapper names, loaded; ``None`` without that wrapper."""
    if "wd_mimicry" not in tuple(optimizer.get("wrappers", ()) or ()):
        return None
    kwargs = dict((dict(optimizer.get("wrapper_kwargs", {}) or {})).get("wd_mimicry", {}) or {})
    if "reference" not in kwargs:
        raise ValueError("optimizer.wrapper_kwargs.wd_mimicry.reference: name the reference run or file")
    return load_recorded_norms(resolve_reference(kwargs["reference"], workdir))
