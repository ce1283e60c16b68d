"""ENorm as an optax wrapper: step, balance, and rescale the optimizer state (Stock et al. 2019, Alg. 2).

After ``inner``'s update the new params are balanced by ENorm cycles, ``w' = w * m`` with ``m`` the
per-leaf product of producer scales and inverse consumer scales. The gradient of the balanced
network is ``g' = g / m`` (Sec. 3.6, Eq. 10), so ``inner``'s statistics are transformed the same
way (:func:`jaxnorm.optim.state.rescale_state`): first moments (SGD momentum, Adam ``mu``) as
``x / m``, second moments (Adam ``nu``) as ``x / m**2``. The products ``mu * w`` and
``nu * w**2`` are invariant under the balancing step. The paper notes that not rescaling the
momentum "significantly decreases the effectiveness of ENorm" (Sec. 5).

References:
  Stock, Defossez, Gribonval, Jegou, Usunier. Equi-normalization of neural networks. ICLR 2019.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxnorm.enorm.balance import enorm_balance, multipliers
from jaxnorm.enorm.spec import Junction, chain
from jaxnorm.optim.state import rescale_state

__all__ = ["EnormState", "enorm"]

PyTree = Any


class EnormState(NamedTuple):
    """State of :func:`enorm`: the step count and the wrapped optimizer's state."""

    count: jax.Array
    inner_state: optax.OptState


def enorm(
    inner: optax.GradientTransformation,
    spec: Sequence[Junction] | None = None,
    *,
    p: float | str = 2,
    c: float = 1.0,
    cycles: int = 1,
    every: int = 1,
    count_biases: bool = False,
) -> optax.GradientTransformation:
    """Wrap ``inner``: apply it, run ENorm on the resulting params, rescale its state (Eq. 10).

    The returned updates are ``balanced(params + inner_updates) - params``, so
    ``optax.apply_updates`` yields the balanced params. Balancing happens after updates number
    ``every``, ``2 * every``, ...; between them the wrapper is ``inner``.

    Args:
      inner: the optimizer, e.g. ``optax.sgd(0.1, momentum=0.9)``, ``optax.adam(1e-3)``,
        ``optax.adamw``, a ``optax.chain`` of them, ``optax.inject_hyperparams(...)``.
      spec: junctions (see :func:`jaxnorm.enorm.discover`); ``None`` infers a chain.
      p, c, cycles, count_biases: as in :func:`jaxnorm.enorm.enorm_balance`.
      every: balance after every ``every``-th update (>= 1).

    Returns:
      An ``optax.GradientTransformation`` whose ``update`` requires ``params``.

    Raises:
      ValueError: bad ``every``, ``p``, ``c``, ``cycles``; ``update`` called without params.
      TypeError: (at ``init``) a state of ``inner`` whose transformation under rescaling is not
        known; register it with :func:`jaxnorm.optim.state.register_state_rule`.

    References:
      Stock et al. 2019, Alg. 2 and Sec. 3.6 Eq. 10.
    """
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"enorm: every must be an integer >= 1, got {every!r}")
    if isinstance(cycles, int) and cycles < 0:
        raise ValueError(f"enorm: cycles must be >= 0, got {cycles}")

    def junctions(params: PyTree) -> Sequence[Junction]:
        return chain(params) if spec is None else spec

    def init_fn(params: PyTree) -> EnormState:
        the_spec = junctions(params)
        jax.eval_shape(lambda x: enorm_balance(x, the_spec, p=p, c=c, cycles=0), params)  # validate
        inner_state = inner.init(params)
        rescale_state(inner_state, jax.tree.map(lambda _: None, params))  # unknown states raise
        return EnormState(count=jnp.zeros([], jnp.int32), inner_state=inner_state)

    def update_fn(updates: PyTree, state: EnormState, params: PyTree | None = None):
        if params is None:
            raise ValueError("enorm: update needs the params: tx.update(grads, state, params)")
        the_spec = junctions(params)
        updates, inner_state = inner.update(updates, state.inner_state, params)
        stepped = optax.apply_updates(params, updates)
        count = optax.safe_int32_increment(state.count)

        def balance(x: PyTree):
            return enorm_balance(x, the_spec, p=p, c=c, cycles=cycles, return_scales=True,
                                 count_biases=count_biases)

        if every == 1:
            balanced, scales = balance(stepped)
        else:
            shapes = jax.eval_shape(balance, stepped)[1]
            skip = lambda x: (x, tuple(jnp.ones(s.shape, s.dtype) for s in shapes))
            balanced, scales = jax.lax.cond(count % every == 0, balance, skip, stepped)
        inner_state = rescale_state(inner_state, multipliers(stepped, the_spec, scales))
        new_updates = jax.tree.map(lambda b, w: (b - w).astype(w.dtype), balanced, params)
        return new_updates, EnormState(count=count, inner_state=inner_state)

    return optax.GradientTransformation(init_fn, update_fn)
