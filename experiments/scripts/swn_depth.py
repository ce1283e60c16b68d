"""Survey: scaled weight norm keeps forward and backward norms stable with depth; plain weight norm does not.

Arpit, Campos & Bengio (2019), in Arpit's *Normalization techniques* slides: with weight norm
``W = g v / ||v||`` and ``g = 1`` every unit's weight vector has norm 1, so each ReLU layer
changes the activation scale by a factor that depends on the layer's fan-in and fan-out;
scaled weight norm multiplies by ``sqrt(gain * fan_in / fan_out)`` (gain 2 before a ReLU, 1/N
at the end of each of N residual branches) and keeps the activation and gradient norms of order
one at any depth. No training: at initialization, on a batch of 256 Fashion-MNIST images, the
script measures for MLPs of ``--depths`` hidden layers (width 256) with ``wn`` and ``swn``

* forward: the RMS of the logits, and per layer the RMS of the hidden activations (depth 32);
* backward: the ratio of the gradient norms (cross-entropy loss) of the first and last hidden
  layers' direction params ``v`` (for ResNet-56: the stem and the last block's convolutions);

and the same for ResNet-56 (width 16, option-A shortcuts) with ``wn`` and ``swn``.

    python experiments/scripts/swn_depth.py [--out experiments/figures]
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import matplotlib
import optax

matplotlib.use("Agg")
import matplotlib.pyplot as plt

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from jaxnorm import data, models


def rms(x) -> float:
    return float(jnp.sqrt(jnp.mean(jnp.square(x))))


def kernel_grad_norm(tree) -> float:
    """The l2 norm of every ``kernel`` leaf (weight norm's direction ``v``) in a module's subtree."""
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    leaves = [v for path, v in flat if getattr(path[-1], "key", None) == "kernel"]
    return float(jnp.sqrt(sum(jnp.sum(jnp.square(v)) for v in leaves)))


def measure(model, x, y, first: str, last: str):
    """(logit RMS, per-module output RMS list, ||grad v_first|| / ||grad v_last||)."""
    variables = model.init(jax.random.key(0), x[:2], train=False)

    def loss(params):
        logits = model.apply({**variables, "params": params}, x, train=False)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    grads = jax.grad(loss)(variables["params"])
    logits, inter = model.apply(variables, x, train=False, capture_intermediates=True)
    per_layer = [rms(v["__call__"][0]) for k, v in inter["intermediates"].items() if k.startswith("dense_")]
    ratio = kernel_grad_norm(grads[first]) / kernel_grad_norm(grads[last])
    return rms(logits), per_layer, ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", type=int, nargs="*", default=[2, 4, 8, 16, 32])
    parser.add_argument("--out", default="experiments/figures")
    args = parser.parse_args()

    batch = next(iter(data.load("fashion_mnist", "train[:256]", batch_size=256, train=False).epoch(0)))
    x, y = jnp.asarray(batch["image"]), jnp.asarray(batch["label"])
    rows = ["| model | depth | logit RMS | ‖∇v first‖ / ‖∇v last‖ |", "| --- | --- | --- | --- |"]
    profiles = {}
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for norm in ("wn", "swn"):
        logit_rms, ratios = [], []
        for depth in args.depths:
            model = models.create("mlp", num_classes=10, norm=norm, depth=depth, width=256)
            out, per_layer, ratio = measure(model, x, y, "dense_0", f"dense_{depth - 1}")
            logit_rms.append(out)
            ratios.append(ratio)
            profiles[(norm, depth)] = per_layer
            rows.append(f"| MLP {norm} | {depth} | {out:.3g} | {ratio:.3g} |")
        axes[0].semilogy(args.depths, logit_rms, marker="o", label=norm)
        axes[1].semilogy(args.depths, ratios, marker="o", label=norm)
        deepest = profiles[(norm, args.depths[-1])]
        axes[2].semilogy(range(len(deepest)), deepest, marker=".", label=f"{norm}, depth {args.depths[-1]}")
    for norm in ("wn", "swn"):
        model = models.create("resnet56", num_classes=10, norm=norm)
        out, _, ratio = measure(model, x, y, "stem", "stage2_block8")
        rows.append(f"| ResNet-56 {norm} | 56 | {out:.3g} | {ratio:.3g} (stem / last block) |")
    print("\n".join(rows))
    axes[0].set(xlabel="hidden layers", ylabel="logit RMS", title="forward: output scale at init")
    axes[1].set(xlabel="hidden layers", ylabel="||grad v_first|| / ||grad v_last||",
                title="backward: first / last layer gradient")
    axes[2].set(xlabel="layer", ylabel="activation RMS", title="forward: per-layer activation RMS")
    for ax in axes:
        ax.legend()
    fig.tight_layout()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "swn_depth.png")
    fig.savefig(path, dpi=80)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
