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
import numpy as np
import optax

from jaxnorm.enorm.balance import (
    check_c,
    check_cycles,
    check_max_scale,
    check_p,
    enorm_balance,
    multipliers,
)
from jaxnorm.enorm.spec import ChainMemory, Junction
from jaxnorm.optim import landing
from jaxnorm.optim.arguments import check_static
from jaxnorm.optim.rescaling import check_inner, check_steps, check_updates, pure_transform
from jaxnorm.optim.state import check_rescaling_law, rescale_state

__all__ = ["MAX_STEP_SCALE", "EnormState", "enorm"]

PyTree = Any

# Per update, a junction is rescaled by at most this factor (an entry by at most its square).
MAX_STEP_SCALE = 16.0


class EnormState(NamedTuple):
    """State of :func:`enorm`: the step count and the wrapped optimizer's state."""

    count: jax.Array
    inner_state: optax.OptState


def enorm(
    inner: optax.GradientTransformation,
    spec: Sequence[Junction] | None = None,
    *,
    p: float | str = 2,
    c: float | Sequence[float] = 1.0,
    cycles: int = 1,
    every: int = 1,
    count_biases: bool = False,
    max_scale: float | None = MAX_STEP_SCALE,
) -> optax.GradientTransformation:
    """Wrap ``inner``: apply it, run ENorm on the resulting params, rescale its state (Eq. 10).

    The returned updates are ``balanced(params + inner_updates) - params``, computed in at least
    float32 (:func:`jaxnorm.optim.landing.to_target`), so that ``optax.apply_updates`` lands on the
    balanced params exactly in every dtype (a bfloat16 update ``7 w`` for a scale 8 would round).
    Balancing happens after updates number ``every``, ``2 * every``, ...; between them the wrapper
    is ``inner``.

    Args:
      inner: the optimizer, e.g. ``optax.sgd(0.1, momentum=0.9)``, ``optax.adam(1e-3)``,
        ``optax.adamw``, a ``optax.chain`` of them, ``optax.inject_hyperparams(...)``.
      spec: junctions (see :func:`jaxnorm.enorm.discover`); ``None`` infers a chain.
      p, c, cycles, count_biases: as in :func:`jaxnorm.enorm.enorm_balance` (``c``: one number,
        or one per junction of the spec, in spec order).
      every: balance after every ``every``-th update (>= 1).
      max_scale: the largest factor by which one update rescales a junction
        (:data:`MAX_STEP_SCALE` = 16: a weight entry, producer of one junction and consumer of
        another, moves by at most 256x); a larger imbalance (e.g. at init) is removed over several
        updates, each still not increasing the ENorm objective (box-constrained cycles, see
        :func:`jaxnorm.enorm.enorm_balance`). The bound is what makes the update land: optax adds
        ``balanced - params`` to ``params`` in float32 (at least), which is exact for bfloat16 /
        float16 params only if no entry moves by more than ``2^12`` (power-of-two scales), and
        within ``2^-16`` relative for float32 params only if no entry shrinks by more than ``2^8``
        (a float32 kernel ~1e20 balanced against one ~1 in one update would land on rounding
        noise). ``None``: unbounded (exact balancing per update, for float64 or moderate scales).

    Returns:
      An ``optax.GradientTransformation`` whose ``update`` requires ``params``.

    Works on any params container :func:`jaxnorm.enorm.enorm_balance` takes, natively: a params
    dict, a ``FrozenDict``, an ``nnx.State`` of arrays (what ``nnx.Optimizer(model, tx,
    wrt=nnx.Param)`` hands to optax) or of ``nnx.Variable`` objects (``nnx.state(model, nnx.Param)``).
    ``inner``'s state is built on the params as given (an ``nnx.State`` momentum for ``nnx.State``
    params), the Eq. 10 multipliers have the same structure, and the returned updates have the
    structure and container type of the incoming updates.

    Raises:
      TypeError: ``inner`` is not an optax transformation; (at ``init``) a params leaf that is not
        floating.
      ValueError: (at construction) bad ``every``, ``p``, ``c``, ``cycles``, ``count_biases``;
        (at ``init``) a spec that does not fit the params; ``update`` called without params or
        with updates whose structure or shapes differ from the params'.
      TypeError: (at ``init``) a state of ``inner`` whose transformation under rescaling is not
        known; register it with :func:`jaxnorm.optim.state.register_state_rule`.

    References:
      Stock et al. 2019, Alg. 2 and Sec. 3.6 Eq. 10.
    """
    check_inner(inner, "enorm")
    check_static("enorm", p=p, max_scale=max_scale, count_biases=count_biases)
    check_steps(every, "every", "enorm")
    check_cycles(cycles, "enorm")
    check_c(c, "enorm", per_junction=True)
    p = check_p(p, "enorm")
    max_scale = check_max_scale(max_scale, "enorm")
    if not isinstance(count_biases, bool | np.bool_):
        raise ValueError(f"enorm: count_biases must be True or False, got {count_biases!r}")

    with_extra_args = optax.with_extra_args_support(inner)

    remembered_chain = ChainMemory()  # the call order of init's params, for update under jit

    def junctions(params: PyTree) -> Sequence[Junction]:
        return remembered_chain(params) if spec is None else spec

    def init_fn(params: PyTree) -> EnormState:
        _check_floating(params)
        the_spec = junctions(params)
        jax.eval_shape(lambda x: enorm_balance(x, the_spec, p=p, c=c, cycles=0), params)  # validate
        inner_state = inner.init(params)
        rescale_state(inner_state, jax.tree.map(lambda _: None, params))  # unknown states raise
        check_rescaling_law(inner, params, "enorm")  # known types holding other quantities raise
        return EnormState(count=jnp.zeros([], jnp.int32), inner_state=inner_state)

    def update_fn(updates: PyTree, state: EnormState, params: PyTree | None = None, **extra_args):
        check_updates(updates, params, "enorm")
        the_spec = junctions(params)
        # optax's extra arguments (value=loss for reduce_on_plateau, ...) go on to the inner optimizer
        updates, inner_state = with_extra_args.update(updates, state.inner_state, params, **extra_args)
        stepped = optax.apply_updates(params, updates)
        count = optax.safe_int32_increment(state.count)

        fired = count % every == 0
        # cycles = 0 on the other updates: a loop of no iteration, no norm computed, scales 1
        balanced, scales = enorm_balance(
            stepped,
            the_spec,
            p=p,
            c=c,
            cycles=cycles if every == 1 else jnp.where(fired, cycles, 0),
            return_scales=True,
            count_biases=count_biases,
            max_scale=max_scale,
        )
        factors = multipliers(stepped, the_spec, scales)
        inner_state = rescale_state(inner_state, factors)

        def leaf_update(w: jax.Array, u: jax.Array, b: jax.Array, m: jax.Array | None) -> jax.Array:
            if m is None:  # outside the spec: the inner update as it is
                return u
            target = landing.to_target(w, u, b)
            return target if every == 1 else jnp.where(fired, target, u.astype(target.dtype))

        new_updates = jax.tree.map(
            leaf_update, params, updates, balanced, factors, is_leaf=lambda x: x is None
        )
        return new_updates, EnormState(count=count, inner_state=inner_state)

    return pure_transform(init_fn, update_fn)


def _check_floating(params: PyTree) -> None:
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        if not jnp.issubdtype(jnp.result_type(leaf), jnp.inexact):
            raise TypeError(
                f"enorm: params{jax.tree_util.keystr(path)} has dtype {jnp.result_type(leaf)}; ENorm "
                "rescales every leaf of the chain, which needs floating params"
            )
