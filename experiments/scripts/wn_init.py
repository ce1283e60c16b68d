"""Survey: weight norm with and without data-dependent initialization (Salimans & Kingma 2016, Sec. 3).

Weight norm ``W = g v / ||v||`` leaves the activation scale to ``g``: initialized as the plain
layer (``g = ||v||``, Xavier here) the signal of a deep ReLU MLP shrinks layer after layer; the
data-dependent initialization sets ``g`` and the bias from one batch so every pre-activation starts
with zero mean and unit variance (``jaxnorm.nn.WeightNormDense(g_init="data")``). The slides show
that the data-dependent init matters for deep nets. A ``--depth``-hidden-layer, 256-unit weight-norm
MLP on Fashion-MNIST (offline), SGD momentum 0.9, lr ``--lr`` cosine, batch 128, ``--epochs``
epochs, ``g_init`` in {"norm" (plain init), "ones" (flax's g = 1), "data" (init batch of 512
training images)}; prints test accuracy (mean ± std over seeds) and the logit RMS at init.

    python experiments/scripts/wn_init.py [--depth 16] [--seeds 0 1] [--epochs 2]
"""

from __future__ import annotations

import argparse
import os
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from experiments.scripts.grid import fmt
from experiments.scripts.small_loop import run
from jaxnorm import data
from jaxnorm import nn as jnn


class WNMLP(nn.Module):
    """``depth`` x (weight-normed Dense -> ReLU), then a weight-normed classifier."""

    depth: int
    g_init: str
    width: int = 256

    @nn.compact
    def __call__(self, x, *, train: bool):
        del train
        x = x.reshape((x.shape[0], -1))
        init = nn.initializers.xavier_uniform()
        for i in range(self.depth):
            x = nn.relu(jnn.WeightNormDense(self.width, g_init=self.g_init, kernel_init=init,
                                            name=f"dense_{i}")(x))
        return jnn.WeightNormDense(10, g_init=self.g_init, kernel_init=init, name="head")(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=16)
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.02)
    args = parser.parse_args()

    test = data.load("fashion_mnist", "test", batch_size=1000, train=False)
    eval_batches = [(jnp.asarray(b["image"]), jnp.asarray(b["label"])) for b in test.epoch(0)]
    init = next(iter(data.load("fashion_mnist", "train[:512]", batch_size=512, train=False).epoch(0)))
    init_x = jnp.asarray(init["image"])
    results: dict[str, list[float]] = {}
    logit_rms: dict[str, list[float]] = {}
    for seed in args.seeds:
        train = data.load("fashion_mnist", "train", batch_size=128, train=True, seed=seed)
        batches = [(jnp.asarray(b["image"]), jnp.asarray(b["label"]))
                   for e in range(args.epochs) for b in train.epoch(e)]
        tx = optax.sgd(optax.cosine_decay_schedule(args.lr, len(batches)), momentum=0.9)
        for g_init in ("norm", "ones", "data"):
            model = WNMLP(depth=args.depth, g_init=g_init)
            variables = model.init(jax.random.key(seed), init_x, train=False)
            logits = model.apply(variables, init_x, train=False)
            logit_rms.setdefault(g_init, []).append(float(jnp.sqrt(jnp.mean(logits**2))))
            acc, _, _ = run(model, tx, batches, eval_batches, seed, init_batch=init_x)
            results.setdefault(g_init, []).append(acc)
        print(f"seed {seed}: " + ", ".join(f"{k} {100 * v[-1]:.2f}%" for k, v in results.items()), flush=True)
    print(f"| g_init (depth {args.depth}) | logit RMS at init | test acc (%) |\n| --- | --- | --- |")
    for name, accs in results.items():
        print(f"| {name} | {fmt(logit_rms[name], 1, 3)} | {fmt(accs, 100)} |")


if __name__ == "__main__":
    main()
