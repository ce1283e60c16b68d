"""The training state: one NamedTuple that is the whole of a run's mutable state.

Everything that must survive a kill-and-resume lives here (parameters, the model's other variable
collections such as BN running statistics, the optimizer state, the step counter, the PRNG key and the
loss scale), so that checkpointing this tuple and the data position (a function of ``step``) is enough
for a resumed run to be bit-identical to an uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxnorm.train.precision import LossScale, no_loss_scale

PyTree = Any


class TrainState(NamedTuple):
    """State of a training run (a pytree).

    Attributes:
      step: int32 scalar, the loop's steps so far (micro-steps when accumulating), skipped ones included
        (``loss_scale.skipped`` counts those, float16 only).
      params: the ``"params"`` collection of the model.
      model_state: every other variable collection of the model (e.g. ``{"batch_stats": ...}``).
      opt_state: the optax state of ``tx``.
      rng: a raw ``uint32[2]`` PRNG key; the step's key is ``fold_in(rng, step)``.
      loss_scale: dynamic loss scale (scale 1 and never adjusted unless training in float16).
    """

    step: jax.Array
    params: PyTree
    model_state: Mapping[str, PyTree]
    opt_state: optax.OptState
    rng: jax.Array
    loss_scale: LossScale

    @property
    def variables(self) -> dict[str, PyTree]:
        """The flax variables dict ``{"params": ..., **model_state}`` for ``model.apply``."""
        return {"params": self.params, **self.model_state}


def create_train_state(
    init_fn: Callable[..., Mapping[str, PyTree]],
    tx: optax.GradientTransformation,
    rng: jax.Array,
    sample_input: jax.Array,
    *,
    loss_scale: LossScale | None = None,
) -> TrainState:
    """Initialises a :class:`TrainState` (pure; jit it with ``out_shardings`` to place it).

    Args:
      init_fn: ``model.init``; called as ``init_fn({"params": k1, "dropout": k2}, sample_input,
        train=False)``.
      tx: the optax transformation.
      rng: a raw ``uint32[2]`` PRNG key.
      sample_input: one input batch (only its shape and dtype matter).
      loss_scale: initial loss scale; ``None`` means scale 1 (no scaling).

    Returns:
      The initial state, ``step = 0``.
    """
    init_rng, param_rng, dropout_rng = jax.random.split(rng, 3)
    variables = dict(init_fn({"params": param_rng, "dropout": dropout_rng}, sample_input, train=False))
    if "params" not in variables:
        raise ValueError(f"init_fn returned no 'params' collection; got {sorted(variables)}")
    params = variables.pop("params")
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        model_state=variables,
        opt_state=tx.init(params),
        rng=init_rng,
        loss_scale=no_loss_scale() if loss_scale is None else loss_scale,
    )
