"""Norm matters, Sec. 2: weight decay on BN units acts only through the effective learning rate.

Hoffer et al. (2018) train a BN network with weight decay while recording every unit's weight
norm, then train the same network **without** weight decay but with each unit's step scaled by
``||w_j(t)||^2 / ||w_ref,j(t)||^2`` (the reference's effective step ``eta / ||w_ref||^2``) and
recover the WD run's accuracy, where plain training without WD falls short (their Fig. 1 / suppl.
Sec. 1, VGG11 + BN on CIFAR-10). Here: a 3 x 256 ReLU MLP with BN on Fashion-MNIST (offline),
SGD momentum 0.9, lr 0.1 cosine, batch 128, ``--epochs`` epochs, weight decay ``--wd`` on the
hidden kernels (the scale-invariant ones; the classifier gets none in every run), three runs per
seed: WD (reference, ``jaxnorm.optim.record_norms``), no WD, and no WD +
``jaxnorm.optim.wd_mimicry`` of the reference. Prints test accuracy (mean ± std over seeds) and
the hidden kernels' mean unit norm at the end.

    python experiments/scripts/wd_mimicry.py [--seeds 0 1 2] [--epochs 3] [--wd 5e-3]
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from experiments.scripts.grid import fmt
from jaxnorm import data, models
from jaxnorm.optim import record_norms, wd_mimicry


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


def mean_unit_norm(params) -> float:
    norms = [np.linalg.norm(np.asarray(v["kernel"]), axis=0).mean()
             for k, v in params.items() if k != "head" and "kernel" in v]
    return float(np.mean(norms))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--wd", type=float, default=5e-3)
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()

    model = models.create("mlp", num_classes=10, norm="bn", depth=3, width=256)
    test = data.load("fashion_mnist", "test", batch_size=1000, train=False)
    eval_batches = [(jnp.asarray(b["image"]), jnp.asarray(b["label"])) for b in test.epoch(0)]
    results = {"wd (reference)": [], "no wd": [], "no wd + mimicry": []}
    norms = {k: [] for k in results}
    for seed in args.seeds:
        train = data.load("fashion_mnist", "train", batch_size=128, train=True, seed=seed)
        batches = [(jnp.asarray(b["image"]), jnp.asarray(b["label"]))
                   for e in range(args.epochs) for b in train.epoch(e)]
        steps = len(batches)
        schedule = optax.cosine_decay_schedule(args.lr, steps)
        sgd = optax.sgd(schedule, momentum=0.9)
        mask = hidden_kernels
        ref_tx = optax.chain(record_norms(steps, mask=mask), optax.add_decayed_weights(args.wd, mask), sgd)
        acc, params, opt = run(model, ref_tx, batches, eval_batches, seed)
        results["wd (reference)"].append(acc)
        norms["wd (reference)"].append(mean_unit_norm(params))
        reference = opt[0].norms
        mimic = optax.chain(sgd, wd_mimicry(reference, mask=mask))
        for name, tx in (("no wd", sgd), ("no wd + mimicry", mimic)):
            acc, params, _ = run(model, tx, batches, eval_batches, seed)
            results[name].append(acc)
            norms[name].append(mean_unit_norm(params))
        print(f"seed {seed}: " + ", ".join(f"{k} {100 * v[-1]:.2f}%" for k, v in results.items()), flush=True)
    print("| run | test acc (%) | final mean unit norm (hidden) |\n| --- | --- | --- |")
    for name, accs in results.items():
        print(f"| {name} | {fmt(accs, 100)} | {fmt(norms[name], 1, 2)} |")


if __name__ == "__main__":
    main()
