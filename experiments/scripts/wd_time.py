"""Time-dependence of WD and WRS (Liu et al. Fig. 7): each applied for the whole run, only early, only late.

Runs the ``fmnist_wd_time`` setting (see that config) with: no regularizer; weight decay (L2,
inside the momentum, on the kernels) for the whole run, only before the first learning-rate decay
("early"), only from it to the end ("late"); the same three windows for WRS (every kernel's units
set to unit l2 norm after every ``tau``-th update inside the window). The switch is by optimizer
step, through the optimizer registry's ``window`` wrapper (``jaxnorm.train.optimizers.WRAPPERS``:
``optax.transforms.conditionally_transform`` around the weight decay, before the optimizer, or
around the WRS, after it). Prints mean ± std over seeds and plots the curves
(``<out>/fmnist_wd_time.png``; dashed lines: the learning-rate decays).

    python experiments/scripts/wd_time.py [--seeds 0 1] [--only none "wd (early)"] [--set num_epochs=60]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from experiments.scripts import common
from jaxnorm import data

CONFIG = "fmnist_wd_time"


def variants(module, base) -> tuple[dict[str, dict[str, Any]], list[int]]:
    """All runs: the config's whole-run ones plus early / late WD and WRS; and the LR-decay steps."""
    steps_per_epoch = data.load(
        base.dataset.name, base.dataset.train_split, batch_size=int(base.dataset.batch_size), train=True
    ).steps_per_epoch
    total = round(float(base.num_epochs) * steps_per_epoch)
    decays = [max(1, round(b * total)) for b in base.optimizer.boundaries]
    windows = {"early": (0, decays[0]), "late": (decays[0], total)}
    out = dict(module.VARIANTS)
    for label, (start, end) in windows.items():
        for kind, kwargs in (("wd", {"weight_decay": module.WEIGHT_DECAY}), ("wrs", {"tau": module.TAU})):
            out[f"{kind} ({label})"] = {
                "optimizer.wrappers": ("window",),
                "optimizer.wrapper_kwargs": {"window": {"kind": kind, "start": start, "end": end, **kwargs}},
            }
    order = ["none", *(f"{kind} ({w})" for kind in ("wd", "wrs") for w in ("whole run", "early", "late"))]
    return {k: out[k] for k in order}, decays


def plot(results, decays: Sequence[int], path: str) -> None:
    """Test accuracy over training (mean over seeds), WD left, WRS right; dashed: LR decays."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4), sharey=True)
    for ax, kind in zip(axes, ("wd", "wrs"), strict=True):
        for name, runs in results.items():
            if name != "none" and not name.startswith(kind):
                continue
            steps = np.array([s for s, _ in runs[0]["curve"]])
            acc = np.array([[a for _, a in r["curve"]] for r in runs]) * 100
            ax.plot(steps, acc.mean(0), marker=".", label=name)
        for d in decays:
            ax.axvline(d, color="k", ls="--", lw=0.8)
        ax.set(xlabel="step", ylabel="test accuracy (%)", title=f"{kind.upper()} applied in a window")
        ax.legend(fontsize=7)
    lows = [min(a for _, a in r["curve"][len(r["curve"]) // 3 :]) for runs in results.values() for r in runs]
    axes[0].set_ylim(100 * min(lows) - 0.5, None)
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="*")
    parser.add_argument("--only", nargs="*", help="run only these variants")
    parser.add_argument("--set", nargs="*", default=[], help="key=value overrides for every run")
    parser.add_argument("--out", default="experiments/figures")
    args = parser.parse_args(argv)

    module = common.load_module(CONFIG)
    base = module.get_config()
    common.apply_sets(base, args.set)
    runs, decays = variants(module, base)
    seeds = args.seeds if args.seeds else list(module.SEEDS)
    chosen = common.select_variants(runs, args.only, in_only_order=False)
    common.check_set_conflicts(args.set, runs, has_grid=False)
    results: dict[str, list[dict[str, Any]]] = {}
    for name, overrides in chosen.items():
        results[name] = []
        for seed in seeds:
            r = common.run_one(base, overrides, seed)
            results[name].append(r)
            print(
                f"{name} seed {seed}: test acc {100 * r['eval_accuracy']:.2f}%, best "
                f"{100 * r['best_eval_accuracy']:.2f}%, train loss {r['train_loss']:.3f}, "
                f"{r['seconds']:.0f} s",
                flush=True,
            )
    print(f"learning-rate decays at steps {decays}")
    print(common.table(results))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{CONFIG}.png")
    plot(results, decays, path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
