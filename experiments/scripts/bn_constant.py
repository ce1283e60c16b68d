"""Norm matters, suppl. Fig. 1: sweep L1 batch norm's constant C_L1; L∞ BN, paper vs exact constant.

L1 batch norm divides by ``sigma_hat = C * mean|x - mu|``; Hoffer et al. (2018, suppl. Sec. 2,
Fig. 1) find ``C = sqrt(pi/2)`` (which makes sigma_hat an unbiased estimate of the std for Gaussian
input) optimal, nearby values degrading ResNet-56 / CIFAR-10 and ResNet-18 / ImageNet. jaxnorm's
``BatchNorm(p=1)`` uses ``sqrt(pi/2)``; a constant C is obtained exactly by multiplying its
normalized output by ``sqrt(pi/2) / C`` (before the learned scale and bias). For L∞ BN the paper's
``C(n)`` is compared with the exact ``1 / E[max of n |N(0,1)|]`` (``calibration="exact"``).

In a plain Dense -> BN -> ReLU stack the next BN undoes any constant, so the constant can only matter
where the normalized branch meets an unnormalized path. The script therefore trains a residual MLP
on Fashion-MNIST (offline): ``h <- relu(h + BN(Dense(h)))`` for ``--blocks`` blocks of ``--width``
units after a Dense stem, as in a post-activation ResNet block, with the library's training loop
(SGD momentum 0.9, lr 0.1 cosine, weight decay 5e-4, batch 128). ``--arch plain`` drops the
shortcut. Prints a Markdown table (mean ± std over seeds) and writes ``<out>/bn_constant.png``.

    python experiments/scripts/bn_constant.py [--epochs 3] [--seeds 0 1 2] [--out experiments/figures]
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import flax.linen as nn
import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from experiments.scripts.common import fmt
from jaxnorm import nn as jnn
from jaxnorm.functional.stats import L1_CONSTANT
from jaxnorm.train import experiment, loop


class ResidualMLP(nn.Module):
    """Dense stem, then ``blocks`` x ``h <- relu(h + factor * BN(Dense(h)))``, then a classifier.

    ``factor`` rescales the normalized activations before BN's learned scale; for ``p=1`` it turns
    the sqrt(pi/2) constant into ``sqrt(pi/2) / factor``. ``residual=False`` drops ``h +``.
    """

    p: int | str = 1
    factor: float = 1.0
    calibration: str = "paper"
    blocks: int = 6
    width: int = 256
    residual: bool = True
    num_classes: int = 10

    @nn.compact
    def __call__(self, x, *, train: bool):
        h = nn.relu(nn.Dense(self.width, name="stem")(x.reshape((x.shape[0], -1))))
        for i in range(self.blocks):
            y = nn.Dense(self.width, use_bias=False, name=f"dense_{i}")(h)
            y = jnn.BatchNorm(
                p=self.p,
                calibration=self.calibration,
                use_scale=False,
                use_bias=False,
                momentum=0.9,
                name=f"bn_{i}",
            )(y, use_running_average=not train)
            y = self.factor * y
            y = y * self.param(f"scale_{i}", nn.initializers.ones, (self.width,))
            y = y + self.param(f"bias_{i}", nn.initializers.zeros, (self.width,))
            h = nn.relu(h + y if self.residual else y)
        return nn.Dense(self.num_classes, name="head")(h)


def variants() -> dict[str, dict]:
    """``{name: ResidualMLP kwargs}``: the C_L1 sweep, then L∞ paper vs exact, then L2."""
    out = {}
    for c in (0.8, 1.0, L1_CONSTANT, 1.5, 2.0):
        label = "sqrt(pi/2)" if c == L1_CONSTANT else f"{c:g}"
        out[f"L1, C={label}"] = {"p": 1, "factor": L1_CONSTANT / c}
    out["Linf, paper C(n)"] = {"p": "inf", "calibration": "paper"}
    out["Linf, exact"] = {"p": "inf", "calibration": "exact"}
    out["L2"] = {"p": 2}
    return out


def base_config(epochs: float, warmup: int):
    config = experiment.experiment_defaults()
    config.update(
        {"num_epochs": epochs, "log_every": 50, "progress": False, "plots": False, "checkpoint_every": 0}
    )
    config.dataset.batch_size = 128
    config.optimizer.update(
        {
            "name": "momentum",
            "learning_rate": 0.1,
            "momentum": 0.9,
            "schedule": "cosine",
            "warmup_steps": warmup,
            "weight_decay": 5e-4,
            "weight_decay_mask": "kernels",
        }
    )
    return config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=float, default=3.0)
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--warmup", type=int, default=100, help="warmup steps")
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--arch", choices=("residual", "plain"), default="residual")
    parser.add_argument("--out", default="experiments/figures")
    args = parser.parse_args()

    rows = [
        "| variant | seeds | test acc (%) | best test acc (%) | train loss |",
        "| --- | --- | --- | --- | --- |",
    ]
    curves = {}
    for name, kwargs in variants().items():
        accs, bests, losses, runs = [], [], [], []
        for seed in args.seeds:
            config = base_config(args.epochs, args.warmup)
            config.seed = seed
            train_data, eval_data = experiment.build_data(config)
            model = ResidualMLP(blocks=args.blocks, residual=args.arch == "residual", **kwargs)
            result = loop.train(config, model=model, train_data=train_data, eval_data=eval_data)
            s = result.summary
            accs.append(s["eval_accuracy"])
            bests.append(s["best_eval_accuracy"])
            losses.append(s["train_loss"])
            runs.append([(r["step"], r["accuracy"]) for r in result.history if r["split"] == "eval"])
            print(f"{name} seed {seed}: test acc {100 * s['eval_accuracy']:.2f}%", flush=True)
        curves[name] = runs
        rows.append(f"| {name} | {len(accs)} | {fmt(accs, 100)} | {fmt(bests, 100)} | {fmt(losses, 1, 3)} |")
    print("\n".join(rows))

    l1 = [(k, v) for k, v in variants().items() if v["p"] == 1]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    cs = [L1_CONSTANT / v["factor"] for _, v in l1]
    final = np.array([[r[-1][1] for r in curves[k]] for k, _ in l1]) * 100
    axes[0].errorbar(cs, final.mean(1), yerr=final.std(1), marker="o", capsize=3)
    axes[0].axvline(math.sqrt(math.pi / 2), ls=":", c="gray", label="sqrt(pi/2)")
    axes[0].set(
        xscale="log",
        xlabel="C_L1",
        ylabel="final test accuracy (%)",
        title=f"L1 BN constant sweep ({args.arch} MLP, {args.blocks} blocks)",
    )
    axes[0].legend()
    for name, runs in curves.items():
        steps = [s for s, _ in runs[0]]
        axes[1].plot(steps, np.mean([[a for _, a in r] for r in runs], 0) * 100, marker=".", label=name)
    axes[1].set(xlabel="step", ylabel="test accuracy (%)", title="mean test accuracy over seeds")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "bn_constant.png")
    fig.savefig(path, dpi=80)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
