"""Liu et al. Fig. 5: weight decay makes BN weights sparse in the input span, not in parameter space.

Liu et al. (Sec. 4.2) project each BN-followed kernel onto the eigenvectors of its input covariance
(input-span projection, ISP, ``jaxnorm.diagnostics.input_span_projection``) and fit a generalized
Gaussian to the projected weights and to the raw weights
(``jaxnorm.diagnostics.fit_generalized_gaussian``): with weight decay the ISP's shape ``beta`` is
small (heavy-tailed, sparse: a few input-span directions carry the weight) while the raw weights
stay Gaussian-like (``beta`` near 2); without WD the ISP is less sparse. Here: a 3 x 256 ReLU MLP
with BN on Fashion-MNIST (offline), SGD momentum 0.9, lr 0.1 cosine, 3 epochs, trained without WD,
with WD 5e-3 on the hidden kernels and with WRS (tau 20); the inputs of hidden layers 1 and 2 are
their ReLU features on 2,000 training images. Prints ``beta`` (mean ± std over seeds) per layer.

    python experiments/scripts/isp_sparsity.py [--seeds 0 1] [--epochs 3]
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
from experiments.scripts.small_loop import hidden_kernels, run
from jaxnorm import data, models
from jaxnorm.diagnostics import fit_generalized_gaussian, input_span_projection
from jaxnorm.optim import weight_rescaling

LAYERS = ("dense_1", "dense_2")


def layer_inputs(model, params, x) -> dict[str, jax.Array]:
    """The ReLU features entering each layer of :data:`LAYERS` (BN in training mode on ``x``)."""
    stats = model.init(jax.random.key(0), x[:2], train=False)["batch_stats"]
    _, inter = model.apply({"params": params, "batch_stats": stats}, x, train=True,
                           mutable=["batch_stats", "intermediates"], capture_intermediates=True)
    inter = inter["intermediates"]
    return {name: jax.nn.relu(inter[f"dense_{int(name[-1]) - 1}_norm"]["__call__"][0]) for name in LAYERS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--wd", type=float, default=5e-3)
    args = parser.parse_args()

    model = models.create("mlp", num_classes=10, norm="bn", depth=3, width=256)
    test = data.load("fashion_mnist", "test", batch_size=1000, train=False)
    eval_batches = [(jnp.asarray(b["image"]), jnp.asarray(b["label"])) for b in test.epoch(0)]
    probe = next(iter(data.load("fashion_mnist", "train[:2000]", batch_size=2000, train=False).epoch(0)))
    probe = jnp.asarray(probe["image"])
    betas: dict[str, dict[str, list[float]]] = {}
    for seed in args.seeds:
        train = data.load("fashion_mnist", "train", batch_size=128, train=True, seed=seed)
        batches = [(jnp.asarray(b["image"]), jnp.asarray(b["label"]))
                   for e in range(args.epochs) for b in train.epoch(e)]
        sgd = optax.sgd(optax.cosine_decay_schedule(0.1, len(batches)), momentum=0.9)
        runs = {
            "no wd": sgd,
            "wd": optax.chain(optax.add_decayed_weights(args.wd, hidden_kernels), sgd),
            "wrs (tau 20)": optax.chain(sgd, weight_rescaling(20)),
        }
        for name, tx in runs.items():
            acc, params, _ = run(model, tx, batches, eval_batches, seed)
            feats = layer_inputs(model, params, probe)
            row = betas.setdefault(name, {"test acc": []})
            row["test acc"].append(acc)
            for layer in LAYERS:
                kernel = params[layer]["kernel"]
                isp = input_span_projection(kernel, feats[layer])
                row.setdefault(f"{layer} ISP", []).append(float(fit_generalized_gaussian(isp.projected).beta))
                row.setdefault(f"{layer} raw", []).append(float(fit_generalized_gaussian(kernel).beta))
            print(f"seed {seed} {name}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in row.items()), flush=True)
    keys = ["test acc"] + [f"{layer} {kind}" for layer in LAYERS for kind in ("ISP", "raw")]
    print("| run | " + " | ".join(k if k == "test acc" else f"beta {k}" for k in keys) + " |")
    print("| --- " * (len(keys) + 1) + "|")
    for name, row in betas.items():
        cells = [fmt(row["test acc"], 100)] + [fmt(row[k], 1, 3) for k in keys[1:]]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
