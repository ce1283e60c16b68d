"""Norm matters, Sec. 2: a weight-norm schedule at a constant learning rate replaces learning-rate decay.

For units followed by batch norm the direction moves by ``eta / ||w||^2`` per SGD step, so dividing
the learning rate by ``c`` is the same as multiplying the unit norms by ``sqrt(c)`` (Hoffer et al.
2018, Sec. 2 and suppl. Sec. 1). A 3 x 256 ReLU MLP with BN on Fashion-MNIST (offline), SGD
momentum 0.9, batch 128, ``--epochs`` epochs, three runs per seed, which differ only in the
hidden kernels (every other parameter, BN's scale / bias and the classifier, gets the same cosine
schedule ``lr0 -> lr0 / 100`` in all three):

* **lr schedule**: hidden kernels with the cosine schedule, unit norms held at 1
  (``jaxnorm.optim.norm_schedule(1.0)``): effective step ``lr(t)``;
* **norm schedule**: constant ``lr0``, unit norms ``sqrt(lr0 / lr(t))`` (``norm_schedule``):
  effective step ``lr0 / ||w||^2 = lr(t)``, the same;
* **constant**: constant ``lr0``, unit norms held at 1: no decay of the effective step.

The claim holds if the norm-schedule run matches the lr-schedule run and the constant run differs.

    python experiments/scripts/norm_schedule.py [--seeds 0 1] [--epochs 3]
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import optax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from experiments.scripts.grid import fmt
from experiments.scripts.wd_mimicry import hidden_kernels, run
from jaxnorm import data, models
from jaxnorm.optim import norm_schedule


def labels(params):
    """``"hidden"`` for the hidden (BN-followed) kernels, ``"rest"`` for every other leaf."""
    return jax.tree_util.tree_map(lambda flag: "hidden" if flag else "rest", hidden_kernels(params))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()

    model = models.create("mlp", num_classes=10, norm="bn", depth=3, width=256)
    test = data.load("fashion_mnist", "test", batch_size=1000, train=False)
    eval_batches = [(jnp.asarray(b["image"]), jnp.asarray(b["label"])) for b in test.epoch(0)]
    results: dict[str, list[float]] = {}
    for seed in args.seeds:
        train = data.load("fashion_mnist", "train", batch_size=128, train=True, seed=seed)
        batches = [(jnp.asarray(b["image"]), jnp.asarray(b["label"]))
                   for e in range(args.epochs) for b in train.epoch(e)]
        lr = optax.cosine_decay_schedule(args.lr, len(batches), alpha=0.01)
        rest = optax.sgd(lr, momentum=0.9)

        def norms(count, lr=lr):  # the norms after update `count`: sqrt(lr0 / lr(count + 1))
            return jnp.sqrt(args.lr / lr(count + 1))

        hidden = {
            "lr schedule": optax.chain(optax.sgd(lr, momentum=0.9), norm_schedule(1.0)),
            "norm schedule, constant lr": optax.chain(optax.sgd(args.lr, momentum=0.9), norm_schedule(norms)),
            "constant lr and norm": optax.chain(optax.sgd(args.lr, momentum=0.9), norm_schedule(1.0)),
        }
        for name, tx in hidden.items():
            full = optax.multi_transform({"hidden": tx, "rest": rest}, labels)
            acc, _, _ = run(model, full, batches, eval_batches, seed)
            results.setdefault(name, []).append(acc)
        print(f"seed {seed}: " + ", ".join(f"{k} {100 * v[-1]:.2f}%" for k, v in results.items()), flush=True)
    print("| hidden kernels | test acc (%) |\n| --- | --- |")
    for name, accs in results.items():
        print(f"| {name} | {fmt(accs, 100)} |")


if __name__ == "__main__":
    main()
