"""ENorm Annex C / Fig. 8: implicit ENorm (learned rescalings under a norm penalty) in the FC depth sweep.

Implicit ENorm reparametrizes every weight as ``D_{k-1}^-1 W_k D_k`` with learnable ``D = exp(u)``
and trains ``(W, u)`` jointly on ``CE + lambda * sum_k ||D_{k-1}^-1 W_k D_k||^2``
(``jaxnorm.enorm.apply_log_scales`` / ``implicit_penalty``); the function does not depend on
``u``, which only follows the penalty. Stock et al. (Fig. 8) find it better than the baseline but
below explicit ENorm, more so for deep nets. Setting of ``fmnist_enorm_depth`` (Fashion-MNIST,
``depth`` x 256 ReLU MLP without normalization, Xavier, SGD without momentum, batch 256, lr 0.05
decayed linearly to 0, 3 epochs): the baseline with weight decay 1e-3 on the kernels (penalty
``5e-4 ||W||^2``) against implicit ENorm with the same penalty on the rescaled weights. Compare
with the explicit ENorm rows of ``grid.py fmnist_enorm_depth``.

    python experiments/scripts/implicit_enorm.py [--depths 2 8] [--seeds 0 1 2]
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
from jaxnorm import data, models
from jaxnorm.enorm import apply_log_scales, chain, implicit_penalty, init_log_scales


def train(model, batches, eval_batches, seed: int, *, implicit: bool, lam: float, lr: float) -> float:
    """Test accuracy after SGD on ``CE + lam * penalty`` (implicit: on the rescaled weights)."""
    params = model.init(jax.random.key(seed), batches[0][0][:2], train=False)["params"]
    spec = chain(params)
    trainable = {"params": params, "log_scales": init_log_scales(params, spec)}
    schedule = optax.linear_schedule(lr, 0.0, len(batches))
    tx = optax.sgd(schedule)
    opt = tx.init(trainable)

    def effective(t):
        return apply_log_scales(t["params"], spec, t["log_scales"]) if implicit else t["params"]

    def loss_fn(t, x, y):
        logits = model.apply({"params": effective(t)}, x, train=True)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        u = t["log_scales"] if implicit else jax.lax.stop_gradient(t["log_scales"])
        return ce + lam * implicit_penalty(t["params"], spec, u)

    @jax.jit
    def step(t, opt, x, y):
        grads = jax.grad(loss_fn)(t, x, y)
        updates, opt = tx.update(grads, opt, t)
        return optax.apply_updates(t, updates), opt

    @jax.jit
    def correct(t, x, y):
        return jnp.sum(jnp.argmax(model.apply({"params": effective(t)}, x, train=False), -1) == y)

    for x, y in batches:
        trainable, opt = step(trainable, opt, x, y)
    return sum(int(correct(trainable, x, y)) for x, y in eval_batches) / sum(len(y) for _, y in eval_batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", type=int, nargs="*", default=[2, 8])
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--wd", type=float, default=1e-3)
    args = parser.parse_args()

    test = data.load("fashion_mnist", "test", batch_size=1000, train=False)
    eval_batches = [(jnp.asarray(b["image"]), jnp.asarray(b["label"])) for b in test.epoch(0)]
    rows = ["| depth | baseline (WD) | implicit ENorm |", "| --- | --- | --- |"]
    for depth in args.depths:
        model = models.create("mlp", num_classes=10, norm="none", depth=depth, width=256)
        accs = {"baseline": [], "implicit": []}
        for seed in args.seeds:
            train_data = data.load("fashion_mnist", "train", batch_size=256, train=True, seed=seed)
            batches = [(jnp.asarray(b["image"]), jnp.asarray(b["label"]))
                       for e in range(args.epochs) for b in train_data.epoch(e)]
            for name in accs:
                accs[name].append(train(model, batches, eval_batches, seed, implicit=name == "implicit",
                                        lam=args.wd / 2, lr=args.lr))
            line = ", ".join(f"{k} {100 * v[-1]:.2f}%" for k, v in accs.items())
            print(f"depth {depth} seed {seed}: {line}", flush=True)
        rows.append(f"| {depth} | {fmt(accs['baseline'], 100)} | {fmt(accs['implicit'], 100)} |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
