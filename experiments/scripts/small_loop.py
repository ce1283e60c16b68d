"""A minimal in-memory training loop for the scripts that need more control than the library's
loop gives them (every batch kept in memory, one jitted step, accuracy at the end)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def hidden_kernels(params):
    """Mask: kernels of the hidden (BN-followed, scale-invariant) layers; not the classifier."""
    return {k: jax.tree_util.tree_map(lambda x, k=k: x.ndim >= 2 and k != "head", v)
            for k, v in params.items()}


def run(model, tx, batches, eval_batches, seed: int, init_batch=None):
    """Trains with ``tx``; returns (test accuracy, final params, final optimizer state).

    ``init_batch`` (default: two images) is what ``model.init`` sees (data-dependent inits).
    """
    init_x = batches[0][0][:2] if init_batch is None else init_batch
    variables = model.init(jax.random.key(seed), init_x, train=False)
    params, stats = variables["params"], variables.get("batch_stats", {})
    opt = tx.init(params)

    def collections(p, s):
        return {"params": p, **({"batch_stats": s} if s else {})}

    @jax.jit
    def step(params, stats, opt, x, y):
        def loss_fn(p):
            logits, new = model.apply(collections(p, stats), x, train=True, mutable=["batch_stats"])
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
            return loss, new.get("batch_stats", {})

        (_, new_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), new_stats, opt

    @jax.jit
    def correct(params, stats, x, y):
        logits = model.apply(collections(params, stats), x, train=False)
        return jnp.sum(jnp.argmax(logits, -1) == y)

    for x, y in batches:
        params, stats, opt = step(params, stats, opt, x, y)
    hits = sum(int(correct(params, stats, x, y)) for x, y in eval_batches)
    return hits / sum(len(y) for _, y in eval_batches), params, opt
