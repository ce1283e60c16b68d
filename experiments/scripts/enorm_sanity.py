"""ENorm sanity checks without training (Stock et al. 2019, Annex A Figs. 6-7, Annex D.1 Fig. 9).

1. A randomly initialised ResNet-18 with type-C shortcuts and no normalization, at CIFAR shape
   (32 x 32 x 3, 10 classes), outputs the same class probabilities before and after balancing:
   the script prints the largest absolute probability difference over a batch (float32).
2. Successive ENorm cycles on that ResNet-18 (spec from ``jaxnorm.enorm.discover``): the total
   l2 norm of the weights decreases and converges (Fig. 9).
3. A 20-intermediary-layer 500 x 500 Xavier MLP, unbalanced by scaling layer 6 by 1.2 and layer 12
   by 0.8 (Annex A), is rebalanced by ENorm cycles without training (Figs. 6-7).

    python experiments/scripts/enorm_sanity.py --out experiments/figures

Writes ``enorm_sanity.png`` (three panels) and prints the numbers REPRODUCTION.md quotes.
"""

from __future__ import annotations

import argparse
import itertools
import os

import jax
import jax.numpy as jnp
import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from jaxnorm import models
from jaxnorm.enorm import chain, discover, enorm_balance


def total_l2(params) -> float:
    """The l2 norm of every weight kernel of ``params`` taken together (biases excluded)."""
    leaves = [x for x in jax.tree_util.tree_leaves(params) if x.ndim >= 2]
    return float(jnp.sqrt(sum(jnp.sum(x.astype(jnp.float32) ** 2) for x in leaves)))


def resnet_checks(cycles: int, batch: int) -> tuple[float, float, np.ndarray, int]:
    """Max probability difference, max logit difference, total l2 per cycle, junction count."""
    model = models.create("resnet18", num_classes=10, norm="none", shortcut="C", stem="cifar")
    x = jax.random.normal(jax.random.key(0), (batch, 32, 32, 3))
    variables = model.init(jax.random.key(1), x, train=False)

    def apply(v, inputs):
        return model.apply(v, inputs, train=False)

    spec = discover(apply, variables, x)
    history = [variables]
    for _ in range(cycles):
        history.append(enorm_balance(history[-1], spec))
    logits0, logits1 = apply(history[0], x), apply(history[-1], x)
    prob_diff = float(jnp.max(jnp.abs(jax.nn.softmax(logits0) - jax.nn.softmax(logits1))))
    logit_diff = float(jnp.max(jnp.abs(logits0 - logits1)) / jnp.max(jnp.abs(logits0)))
    norms = np.array([total_l2(v["params"]) for v in history])
    return prob_diff, logit_diff, norms, len(spec)


def unbalanced_mlp(depth: int, width: int, seed: int = 0) -> dict:
    """Annex A's network: 3072 -> ``depth`` x (width x width) -> 10, Xavier, layer 6 x 1.2, layer 12 x 0.8."""
    sizes = [3072] + [width] * (depth + 1) + [10]
    keys = jax.random.split(jax.random.key(seed), len(sizes) - 1)
    init = jax.nn.initializers.xavier_uniform()
    params = {}
    for k, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes)):
        kernel = init(keys[k], (fan_in, fan_out))
        if k == 6:
            kernel = kernel * 1.2
        if k == 12:
            kernel = kernel * 0.8
        params[f"dense_{k:02d}"] = {"kernel": kernel, "bias": jnp.zeros((fan_out,))}
    return params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="experiments/figures")
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()

    prob_diff, logit_diff, norms, junctions = resnet_checks(args.cycles, args.batch)
    print(f"resnet18-C (norm=none, 32x32x3): {junctions} junctions found by discover")
    print(f"  max |p_balanced - p| over {args.batch} images x 10 classes = {prob_diff:.2e}")
    print(f"  max |logit change| / max |logit| = {logit_diff:.2e}")
    steps = np.diff(norms)
    print(f"  total l2: {norms[0]:.3f} -> {norms[1]:.3f} (1 cycle) -> {norms[-1]:.3f} ({args.cycles} cycles);"
          f" monotone non-increasing: {bool(np.all(steps <= 1e-4 * norms[0]))};"
          f" last change {abs(steps[-1]):.2e}")

    params = unbalanced_mlp(depth=20, width=500)
    spec = chain(params)
    names = sorted(params)
    mlp_history = [params]
    for _ in range(args.cycles):
        mlp_history.append(enorm_balance(mlp_history[-1], spec))
    energy = np.array([[float(jnp.sum(p[n]["kernel"] ** 2)) for n in names] for p in mlp_history])
    x = jax.random.normal(jax.random.key(2), (8, 3072))

    def mlp(p):
        h = x
        for n in names[:-1]:
            h = jax.nn.relu(h @ p[n]["kernel"] + p[n]["bias"])
        return h @ p[names[-1]]["kernel"] + p[names[-1]]["bias"]

    out0, out1 = mlp(params), mlp(mlp_history[-1])
    drift = float(jnp.max(jnp.abs(out1 - out0)) / jnp.max(jnp.abs(out0)))
    inner = energy[:, 1:-1]  # the 500 x 500 layers
    print("mlp 20 x 500 (layer 6 x 1.2, layer 12 x 0.8):")
    print(f"  relative output change after {args.cycles} cycles: {drift:.2e}")
    print(f"  500x500 layer energies: spread (max/min) {inner[0].max() / inner[0].min():.3f} before,"
          f" {inner[-1].max() / inner[-1].min():.3f} after;"
          f" layer 6: {energy[0, 6]:.1f} -> {energy[-1, 6]:.1f},"
          f" layer 12: {energy[0, 12]:.1f} -> {energy[-1, 12]:.1f}")

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    axes[0].plot(range(len(norms)), norms, marker=".")
    axes[0].set(xlabel="ENorm cycle", ylabel="total l2 norm of the weights",
                title="(a) ResNet-18 type C, no training (Fig. 9)")
    for k, n in enumerate(names):
        col = np.linalg.norm(np.asarray(params[n]["kernel"]), axis=0)
        axes[1].scatter(np.full(col.shape, k), col, s=1, c="tab:red", alpha=0.3)
    axes[1].set(xlabel="layer", ylabel="column l2 norm", title="(b) 20-layer MLP before ENorm (Fig. 6)")
    colors = plt.cm.viridis_r(np.linspace(0.1, 1.0, len(energy)))
    for i, row in enumerate(energy):
        axes[2].plot(range(len(names)), row, c=colors[i], lw=0.8)
    axes[2].set(xlabel="layer", ylabel="||W_k||_2^2", yscale="log",
                title="(c) energy over cycles, darker = later (Fig. 7)")
    fig.tight_layout()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "enorm_sanity.png")
    fig.savefig(path, dpi=80)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
