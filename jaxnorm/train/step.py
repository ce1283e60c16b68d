"""The train and eval steps: pure functions of ``(state, batch)``, jit- and pmap-able.

Loss: mean softmax cross-entropy over the (global) batch. Under ``jax.jit`` with a sharded global batch
the means, and the BN statistics inside the model, are global reductions that XLA turns into
all-reduces. Under ``jax.pmap`` each device sees its shard; pass ``axis_name`` so that gradients and
metrics are averaged over devices (the model's BN layers must get the same ``axis_name``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax

from jaxnorm.train.metrics import layer_angular_updates
from jaxnorm.train.params_hooks import ParamsHook
from jaxnorm.train.precision import (
    adjust_loss_scale,
    all_finite,
    applied_steps,
    cast_floating,
    compute_dtype,
)
from jaxnorm.train.state import TrainState

PyTree = Any
Batch = Mapping[str, jax.Array]
StepFn = Callable[[TrainState, Batch], tuple[TrainState, dict[str, jax.Array]]]


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Per-example softmax cross-entropy with integer labels, in at least float32."""
    dtype = jnp.promote_types(logits.dtype, jnp.float32)
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(dtype), labels)


def correct_predictions(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Per example: 1.0 where the largest logit is the label's, 0.0 where it is not, and NaN where the
    largest logit is undefined: a NaN logit, or a tie at +inf (``-inf`` logits, as log-probabilities
    hold, are fine). ``argmax`` of NaN logits is class 0, so a diverged model would otherwise score the
    share of class 0 in the data (10 % on a balanced 10-class split) and pass for a trained one; with
    NaN its accuracy is NaN, as its loss is."""
    top = jnp.max(logits, axis=-1)
    tied_at_inf = (top == jnp.inf) & (jnp.sum(logits == jnp.inf, axis=-1) > 1)
    undefined = jnp.any(jnp.isnan(logits), axis=-1) | tied_at_inf
    hit = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
    return jnp.where(undefined, jnp.nan, hit)


def _pmean(x: PyTree, axis_name: str | None) -> PyTree:
    return x if axis_name is None else jax.lax.pmean(x, axis_name)


def _apply(apply_fn, variables, images, *, train: bool, rngs=None):
    """Runs the model; returns ``(logits, updated non-param collections)``."""
    mutable = [k for k in variables if k != "params"] if train else False
    if train and mutable:
        return apply_fn(variables, images, train=True, mutable=mutable, rngs=rngs)
    out = apply_fn(variables, images, train=train, rngs=rngs)
    return out, {}


def _compute_variables(params: PyTree, model_state: Mapping[str, PyTree], dtype: jnp.dtype) -> dict:
    """The variables the forward pass sees: ``params`` cast to the compute ``dtype``; the other
    collections (BN running statistics) left in their own dtype (float32), so that the running
    averages are updated at float32 precision: a bf16 running mean with momentum 0.99 cannot move
    by less than about 0.4 % of its value per step."""
    if dtype != jnp.float32:
        params = cast_floating(params, dtype)
    return {"params": params, **model_state}


def make_train_step(
    apply_fn: Callable[..., Any],
    tx: optax.GradientTransformation,
    *,
    schedule: optax.Schedule | None = None,
    accumulate_steps: int = 1,
    precision: str = "float32",
    axis_name: str | None = None,
    grad_norm: bool = False,
    stats_transport: Callable[[PyTree, PyTree], PyTree] | None = None,
    angular_update: bool = False,
    params_hook: ParamsHook | None = None,
) -> StepFn:
    """Returns ``train_step(state, batch) -> (new_state, metrics)``.

    Args:
      apply_fn: ``model.apply``.
      tx: the optax transformation that ``state.opt_state`` belongs to.
      schedule: the LR schedule, only to report ``lr`` in the metrics: the rate of the optimizer's
        own update count, which a step skipped for overflow (float16) does not advance.
      accumulate_steps: micro-steps per update (to report the LR of the current update).
      precision: ``float32``, ``bfloat16`` or ``float16``: the dtype of activations and of the params
        copy used in the forward pass; master params, optimizer state and BN statistics stay float32
        (the statistics are passed to the model uncast, so their running averages update in float32).
        ``float16`` scales the loss dynamically and skips updates whose gradients overflow.
      axis_name: the pmap axis name, or ``None`` under jit.
      grad_norm: also report the global gradient norm (off by default: it is one more reduction
        over every gradient).
      stats_transport: ``(batch_stats, new opt_state) -> batch_stats``, applied to the updated
        running statistics after the optimizer's update (e.g. :func:`jaxnorm.train.setup.
        batch_stats_transport`: BN statistics follow the kernels a rescaling wrapper divided).
      angular_update: also report ``angle/<layer>``, the mean angle (radians) the units of every
        kernel turned in this update (:func:`jaxnorm.train.metrics.layer_angular_updates`).
      params_hook: a :class:`jaxnorm.train.params_hooks.ParamsHook`: the model is applied with
        ``effective(params)``, ``penalty(params)`` is added to the loss that is differentiated, and
        the gradient goes through ``scale_grads`` before the optimizer (e.g. implicit ENorm).

    A float ``"mask"`` in the batch (0 for the padding copies of a partial last batch) weighs the loss,
    its gradient and the metrics: they are those of the real examples (:func:`_mean_over_examples`).

    Metrics: ``loss`` (the cross-entropy; without the hook's penalty), ``accuracy``, ``lr`` (with
    ``schedule``), ``grad_norm`` (if asked; of the unscaled gradient), ``loss_scale`` and
    ``skipped_steps`` (float16 only; the steps skipped for overflow so far, this one included),
    ``penalty`` (with ``params_hook``).
    """
    dtype = compute_dtype(precision)
    scaled = precision == "float16"

    def loss_fn(params, model_state, batch, rng, scale):
        seen = params if params_hook is None else params_hook.effective(params)
        variables = _compute_variables(seen, model_state, dtype)
        images = batch["image"]
        if dtype != jnp.float32:
            images = images.astype(dtype)
        logits, new_model_state = _apply(apply_fn, variables, images, train=True, rngs={"dropout": rng})
        weights = batch.get("mask")
        loss = _mean_over_examples(cross_entropy(logits, batch["label"]), weights, axis_name)
        correct = correct_predictions(logits, batch["label"])
        accuracy = _mean_over_examples(correct, weights, axis_name)
        penalty = jnp.zeros((), jnp.float32) if params_hook is None else params_hook.penalty(params)
        total = loss + penalty
        return (total * scale if scaled else total), (loss, accuracy, new_model_state, penalty)

    def train_step(state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
        rng = jax.random.fold_in(state.rng, state.step)
        if axis_name is not None:
            rng = jax.random.fold_in(rng, jax.lax.axis_index(axis_name))
        grad_fn = jax.grad(loss_fn, has_aux=True)
        grads, (loss, accuracy, new_model_state, penalty) = grad_fn(
            state.params, state.model_state, batch, rng, state.loss_scale.scale
        )
        grads = _pmean(grads, axis_name)
        if params_hook is not None:
            grads = params_hook.scale_grads(grads)
        new_model_state = _pmean(new_model_state, axis_name)
        # BN statistics are kept in the dtype they were created in (float32).
        new_model_state = (
            jax.tree.map(
                lambda new, old: new.astype(old.dtype), dict(new_model_state), dict(state.model_state)
            )
            if new_model_state
            else state.model_state
        )
        if scaled:
            grads = jax.tree.map(lambda g: g / state.loss_scale.scale, grads)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        if stats_transport is not None and "batch_stats" in new_model_state:
            new_model_state = {
                **new_model_state,
                "batch_stats": stats_transport(new_model_state["batch_stats"], opt_state),
            }
        loss_scale = state.loss_scale
        if scaled:
            finite = all_finite(grads)
            keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)
            params = keep(params, state.params)
            opt_state = keep(opt_state, state.opt_state)
            new_model_state = keep(new_model_state, state.model_state)
            loss_scale = adjust_loss_scale(loss_scale, finite)
        metrics = {"loss": loss, "accuracy": accuracy}
        if params_hook is not None:
            metrics["penalty"] = penalty
        if grad_norm:
            metrics["grad_norm"] = optax.tree.norm(grads)
        if angular_update:
            metrics.update(layer_angular_updates(state.params, params))
        if scaled:
            metrics["loss_scale"] = state.loss_scale.scale
        metrics = _pmean(metrics, axis_name)
        if scaled and loss_scale.skipped is not None:
            metrics["skipped_steps"] = loss_scale.skipped
        if schedule is not None:
            update = applied_steps(state.step, state.loss_scale) // accumulate_steps
            metrics["lr"] = jnp.asarray(schedule(update), jnp.float32)
        new_state = TrainState(
            step=state.step + 1,
            params=params,
            model_state=new_model_state,
            opt_state=opt_state,
            rng=state.rng,
            loss_scale=loss_scale,
        )
        return new_state, metrics

    return train_step


def _mean_over_examples(values: jax.Array, mask: jax.Array | None, axis_name: str | None) -> jax.Array:
    """The mean of per-example ``values`` over the real examples of the global batch: ``mask`` (1 = real,
    0 = a padding copy of a partial last batch, :class:`jaxnorm.data.ArraySource` with
    ``drop_remainder=False``) weighs them. Across the devices of ``axis_name`` the sum is divided by the
    devices' mean count, so the ``pmean`` of the losses (and of their gradients) that the step takes is
    the global weighted mean; that mean count is below 1 where the batch holds fewer real examples than
    there are devices, and is not rounded up (it was: the loss divided by the devices, not the count)."""
    if mask is None:
        return values.mean()
    weights = mask.astype(values.dtype)
    count = weights.sum()
    if axis_name is not None:
        count = jax.lax.pmean(count, axis_name)
    return (values * weights).sum() / jnp.where(count > 0, count, 1)


def make_eval_step(
    apply_fn: Callable[..., Any],
    *,
    precision: str = "float32",
    axis_name: str | None = None,
    params_hook: ParamsHook | None = None,
) -> Callable[[TrainState, Batch], dict[str, jax.Array]]:
    """Returns ``eval_step(state, batch) -> sums`` using the running statistics (``train=False``);
    with ``params_hook`` the model is applied with ``params_hook.effective(state.params)``.

    ``batch`` may carry a float ``mask`` (1 = real example, 0 = padding). The result holds sums
    (``loss_sum``, ``correct``, ``count``) so that batches combine exactly; under pmap they are psummed.
    """
    dtype = compute_dtype(precision)

    def eval_step(state: TrainState, batch: Batch) -> dict[str, jax.Array]:
        params = state.params if params_hook is None else params_hook.effective(state.params)
        variables = _compute_variables(params, state.model_state, dtype)
        images = batch["image"]
        if dtype != jnp.float32:
            images = images.astype(dtype)
        logits, _ = _apply(apply_fn, variables, images, train=False)
        mask = batch.get("mask")
        if mask is None:
            mask = jnp.ones(batch["label"].shape, jnp.float32)
        sums = {
            "loss_sum": (cross_entropy(logits, batch["label"]) * mask).sum(),
            # padding rows (mask 0) count 0, even where their logits are NaN
            "correct": jnp.where(mask > 0, correct_predictions(logits, batch["label"]) * mask, 0).sum(),
            "count": mask.sum(),
        }
        return sums if axis_name is None else jax.lax.psum(sums, axis_name)

    return eval_step
