"""Survey, the optimization view: top Hessian eigenvalue and largest stable SGD step, with and without BN.

Santurkar et al. (2018), as presented in Arpit's *Normalization techniques* slides (Sec. 7): batch
norm makes the loss landscape smoother, so gradient descent tolerates larger learning rates.
Plain gradient descent on a quadratic is stable for ``eta < 2 / lambda_max``. For a 3 x 256 ReLU
MLP on Fashion-MNIST (offline), without normalization and with BN, the script

1. trains ``--steps`` steps of plain SGD (batch 128) at each learning rate of ``--lrs`` and reports
   the final training loss (``diverged`` when it is not finite or exceeds the initial loss);
2. computes the top Hessian eigenvalue of the training loss on a fixed batch of 512 images
   (``jaxnorm.diagnostics.hessian_top_eigenvalue``, 30 Lanczos steps) at initialization and after
   the ``lr = 0.1`` run, and prints ``2 / lambda_max``. With BN the loss uses batch statistics,
   the function SGD actually descends.

    python experiments/scripts/hessian_lr.py [--steps 300] [--out experiments/figures]
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import matplotlib
import numpy as np
import optax

matplotlib.use("Agg")
import matplotlib.pyplot as plt

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from jaxnorm import data, models
from jaxnorm.diagnostics import hessian_top_eigenvalue


def make_loss(model):
    """``loss(params, batch_stats, images, labels)``: cross-entropy in training mode."""

    def loss(params, batch_stats, images, labels):
        variables = {"params": params, **({"batch_stats": batch_stats} if batch_stats else {})}
        logits, _ = model.apply(variables, images, train=True, mutable=["batch_stats"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    return loss


def train(model, variables, lr: float, batches) -> tuple[dict, list[float]]:
    """Plain SGD at ``lr`` over ``batches``; returns the final variables and the loss per step."""
    tx = optax.sgd(lr)
    params = variables["params"]
    stats = variables.get("batch_stats", {})
    opt = tx.init(params)

    @jax.jit
    def step(params, stats, opt, images, labels):
        def loss_fn(p):
            v = {"params": p, **({"batch_stats": stats} if stats else {})}
            logits, new = model.apply(v, images, train=True, mutable=["batch_stats"])
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean(), new

        (loss, new), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), new.get("batch_stats", {}), opt, loss

    losses = []
    for images, labels in batches:
        params, stats, opt, loss = step(params, stats, opt, images, labels)
        losses.append(float(loss))
        if not np.isfinite(losses[-1]):
            break
    return {"params": params, **({"batch_stats": stats} if stats else {})}, losses


def top_eigenvalue(model, variables, images, labels) -> float:
    loss = make_loss(model)
    eig = hessian_top_eigenvalue(loss, variables["params"], variables.get("batch_stats", {}), images, labels,
                                 key=jax.random.key(0), num_iters=30)
    return float(eig.eigenvalue)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lrs", type=float, nargs="*", default=[0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0])
    parser.add_argument("--out", default="experiments/figures")
    args = parser.parse_args()

    train_data = data.load("fashion_mnist", "train", batch_size=128, train=True, seed=0)
    batches = []
    for epoch in range(10):
        for b in train_data.epoch(epoch):
            batches.append((jnp.asarray(b["image"]), jnp.asarray(b["label"])))
            if len(batches) == args.steps:
                break
        if len(batches) == args.steps:
            break
    fixed = data.load("fashion_mnist", "train[:512]", batch_size=512, train=False)
    fixed = next(iter(fixed.epoch(0)))
    fixed_x, fixed_y = jnp.asarray(fixed["image"]), jnp.asarray(fixed["label"])

    rows = ["| model | lambda_max at init | 2 / lambda_max | lambda_max after lr 0.1 | largest stable lr |"
            " final loss per lr |", "| --- | --- | --- | --- | --- | --- |"]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for norm in ("none", "bn"):
        model = models.create("mlp", num_classes=10, norm=norm, depth=3, width=256)
        variables = model.init(jax.random.key(0), fixed_x[:2], train=False)
        lam0 = top_eigenvalue(model, variables, fixed_x, fixed_y)
        finals, stable, lam1 = [], [], float("nan")
        for lr in args.lrs:
            trained, losses = train(model, variables, lr, batches)
            ok = np.isfinite(losses[-1]) and len(losses) == len(batches) and losses[-1] < losses[0]
            finals.append(losses[-1] if ok else float("nan"))
            if ok:
                stable.append(lr)
            if lr == 0.1:
                lam1 = top_eigenvalue(model, trained, fixed_x, fixed_y)
            print(f"{norm} lr {lr:g}: final loss {losses[-1]:.4g}{'' if ok else ' (diverged)'}", flush=True)
        per_lr = ", ".join(f"{lr:g}: {f:.3f}" if np.isfinite(f) else f"{lr:g}: div." for lr, f in
                           zip(args.lrs, finals, strict=True))
        rows.append(f"| {norm} | {lam0:.3g} | {2 / lam0:.3g} | {lam1:.3g} | {max(stable, default=0):g} |"
                    f" {per_lr} |")
        ax.plot(args.lrs, finals, marker="o", label=f"{norm} (2/lambda_max at init = {2 / lam0:.2g})")
    print("\n".join(rows))
    ax.set(xscale="log", xlabel="SGD learning rate", ylabel=f"training loss after {args.steps} steps",
           title="3 x 256 MLP, Fashion-MNIST: missing points diverged")
    ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "hessian_lr.png")
    fig.savefig(path, dpi=80)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
