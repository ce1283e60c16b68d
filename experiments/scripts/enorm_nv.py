"""ENorm CIFAR-NV batch-size tables (Stock et al. Tables 2, 3, 5, 6) on Fashion-MNIST: every cell, one figure.

Runs the ``fmnist_enorm_nv`` variants (baseline, BN, GN, ENorm-1, ENorm-1.2; baseline and ENorm
with the paper's BatchNorm after the classifier) for every batch size, with SGD without momentum
(Tables 2 / 5) and with momentum 0.9 (Tables 3 / 6), over ``--seeds``; prints one Markdown table
per optimizer (rows: batch sizes, columns: variants, test accuracy mean ± std over the n seeds) and
plots test accuracy against the batch size (``<out>/fmnist_enorm_nv.png``). ``--json`` saves every
cell as ``{seed: accuracy}``; ``--merge`` counts a seed found in several files once.

The BatchNorm after the classifier makes the network a non-chain for
:func:`jaxnorm.enorm.chain`, so the ENorm junctions are found once with
:func:`jaxnorm.enorm.discover` (8 junctions: the hidden units of the 8 convs, the last one
consumed by the classifier) and passed to the ``enorm`` wrapper as its ``spec``.

    python experiments/scripts/enorm_nv.py [--batch-sizes 8 32 128] [--optimizers sgd momentum]
        [--seeds 0] [--only bn enorm-1.2] [--set num_epochs=3] [--json runs/enorm_nv_s0.json]
    python experiments/scripts/enorm_nv.py --merge runs/enorm_nv_s0.json runs/enorm_nv_s1.json
        # no training: the tables and figure of runs saved with --json (e.g. one seed per session)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from experiments.scripts import common
from experiments.scripts.records import diverged
from jaxnorm import data
from jaxnorm.enorm import discover
from jaxnorm.train import experiment
from jaxnorm.train.sharding import DataParallel

CONFIG = "fmnist_enorm_nv"
OPTIMIZERS = {"sgd": 0.0, "momentum": 0.9}
"""Optimizer name -> momentum (Tables 2 / 5: none; Tables 3 / 6: 0.9)."""

Cell = dict[int, float] | list[float]
"""One table cell's test accuracies: ``{seed: accuracy}``, or a bare list (``--json`` files written
before seed ids were saved)."""
Results = dict[str, dict[int, dict[str, Cell]]]
"""optimizer -> batch size -> variant -> cell."""


def enorm_spec(config) -> tuple:
    """The ENorm junctions of ``config``'s model (with its final BN), found by tracing it."""
    model = experiment.build_model(config, data.info(config.dataset.name).num_classes, DataParallel("jit"))
    x = jnp.zeros((2, *data.info(config.dataset.name).image_shape), jnp.float32)
    variables = model.init(jax.random.key(0), x, train=False)
    spec = discover(
        lambda p, x: model.apply({**variables, "params": p}, x, train=False), variables["params"], x
    )
    return tuple(spec)


def cell_overrides(batch_size: int, optimizer: str, lr_of) -> dict[str, Any]:
    """The config keys of one table cell (batch size, optimizer)."""
    lr = lr_of(batch_size, OPTIMIZERS[optimizer])
    return {
        "dataset.batch_size": batch_size,
        "optimizer.name": optimizer,
        "optimizer.momentum": OPTIMIZERS[optimizer],
        "optimizer.learning_rate": lr,
    }


def with_spec(overrides: Mapping[str, Any], spec: tuple) -> dict[str, Any]:
    """``overrides`` with the discovered spec added to an ENorm wrapper's kwargs."""
    out = dict(overrides)
    if "enorm" in tuple(out.get("optimizer.wrappers", ())):
        kwargs = dict(out["optimizer.wrapper_kwargs"]["enorm"])
        out["optimizer.wrapper_kwargs"] = {"enorm": {**kwargs, "spec": spec}}
    return out


def accuracies(cell: Cell) -> list[float]:
    """A cell's test accuracies, one per seed (the values of ``{seed: accuracy}``)."""
    return list(cell.values()) if isinstance(cell, Mapping) else list(cell)


def fmt_cell(cell: Cell) -> str:
    """``mean ± std (n=k)`` of a cell's accuracies in %, ``k`` the number of seeds."""
    accs = accuracies(cell)
    return f"{common.fmt(accs, 100)} (n={len(accs)})"


def tables(results: Results) -> str:
    """One Markdown table per optimizer: batch sizes x variants, test accuracy (%) mean ± std (n seeds)."""
    out = []
    for optimizer, by_batch in results.items():
        variants = list(next(iter(by_batch.values())))
        out += [
            f"{optimizer} (momentum {OPTIMIZERS[optimizer]:g}):",
            "",
            "| batch | " + " | ".join(variants) + " |",
            "| --- |" + " --- |" * len(variants),
        ]
        for batch, accs in by_batch.items():
            out.append(f"| {batch} | " + " | ".join(fmt_cell(accs[v]) for v in variants) + " |")
        out.append("")
    return "\n".join(out)


def plot(results: Results, path: str) -> None:
    """Test accuracy against the batch size, one panel per optimizer (error bars: std; a diverged run
    counts as 10 %)."""
    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 4), squeeze=False)
    for ax, (optimizer, by_batch) in zip(axes[0], results.items(), strict=True):
        batches = list(by_batch)
        for variant in next(iter(by_batch.values())):
            acc = [np.nan_to_num(np.asarray(accuracies(by_batch[b][variant])) * 100, nan=10.0)
                   for b in batches]
            ax.errorbar(batches, [a.mean() for a in acc], yerr=[a.std() for a in acc], marker="o", capsize=3,
                        label=variant)
        ax.set(
            xscale="log",
            xlabel="batch size",
            ylabel="test accuracy (%)",
            title=f"CIFAR-NV (narrow) on Fashion-MNIST, {optimizer}",
        )
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def saved_cells(path: str):
    """``(optimizer, batch, variant, cell)`` of every cell of a ``--json`` file."""
    with open(path) as f:
        saved = json.load(f)
    for optimizer, by_batch in saved.items():
        for batch, by_variant in by_batch.items():
            for variant, cell in by_variant.items():
                if isinstance(cell, Mapping):
                    cell = {int(seed): float(acc) for seed, acc in cell.items()}
                else:
                    cell = [float(acc) for acc in cell]
                yield optimizer, int(batch), variant, cell


def merge_cell(cell: Cell, new: Cell, paths: Sequence[str]) -> Cell:
    """The union by seed of two cells' ``{seed: accuracy}`` (a seed in both counted once); ``ValueError``
    naming ``paths`` (the files holding the cell) where a cell is a bare list (no seed ids: the same seed
    might be in both) or a seed's accuracies differ."""
    if not isinstance(cell, Mapping) or not isinstance(new, Mapping):
        raise ValueError(
            f"{', '.join(paths)} hold the same cell, and a file without seed ids (a bare list of "
            "accuracies) cannot be merged: a seed in two files would be counted twice. Rerun with --json "
            "to save seed ids, or write the cell as {seed: accuracy}")
    for seed, acc in new.items():
        if seed in cell and not (acc == cell[seed] or (np.isnan(acc) and np.isnan(cell[seed]))):
            raise ValueError(f"{', '.join(paths)}: seed {seed} has accuracies {cell[seed]} and {acc}")
    return {**cell, **new}


def merge(paths: Sequence[str]) -> Results:
    """The results saved by ``--json`` in ``paths``, each cell the union of its seeds over the files (a
    seed in several files counted once; see :func:`merge_cell` for the files it refuses)."""
    results: Results = {}
    holders: dict[tuple[str, int, str], list[str]] = {}
    for path in paths:
        for optimizer, batch, variant, cell in saved_cells(path):
            where = holders.setdefault((optimizer, batch, variant), [])
            where.append(path)
            by_variant = results.setdefault(optimizer, {}).setdefault(batch, {})
            by_variant[variant] = merge_cell(by_variant[variant], cell, where) if len(where) > 1 else cell
    return results


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int, nargs="*", default=[8, 32, 128])
    parser.add_argument("--optimizers", nargs="*", default=list(OPTIMIZERS), choices=list(OPTIMIZERS))
    parser.add_argument("--seeds", type=int, nargs="*", default=[0])
    parser.add_argument("--only", nargs="*", help="run only these variants")
    parser.add_argument("--set", nargs="*", default=[], help="key=value overrides for every run")
    parser.add_argument("--out", default="experiments/figures")
    parser.add_argument("--json", default="", help="also write the accuracies here, by seed")
    parser.add_argument("--merge", nargs="*", help="only tabulate and plot these --json files")
    args = parser.parse_args(argv)
    if args.merge:
        results = merge(args.merge)
        print(tables(results))
        os.makedirs(args.out, exist_ok=True)
        plot(results, os.path.join(args.out, f"{CONFIG}.png"))
        return

    module = common.load_module(CONFIG)
    base = module.get_config()
    common.apply_sets(base, args.set)
    full = experiment.experiment_defaults()
    full.update(base)
    for key, value in module.VARIANTS["enorm-1"].items():  # the ENorm nets (with the final BN)
        common.set_dotted(full, key, value)
    spec = enorm_spec(full)
    variants = common.select_variants(module.VARIANTS, args.only, in_only_order=False)
    common.check_set_conflicts(args.set, variants, has_grid=False)
    results: Results = {}
    for optimizer in args.optimizers:
        results[optimizer] = {}
        for batch in args.batch_sizes:
            cell = cell_overrides(batch, optimizer, module.learning_rate)
            results[optimizer][batch] = {}
            for name, overrides in variants.items():
                accs = results[optimizer][batch][name] = {}
                for seed in dict.fromkeys(args.seeds):  # a seed given twice is run (and counted) once
                    r = common.run_one(base, {**cell, **with_spec(overrides, spec)}, seed)
                    accs[seed] = float("nan") if diverged(r) else r["eval_accuracy"]
                    print(
                        f"{optimizer} batch {batch} {name} seed {seed}: test acc "
                        f"{100 * r['eval_accuracy']:.2f}%, train loss {r['train_loss']:.3f}, "
                        f"{r['seconds']:.0f} s",
                        flush=True,
                    )
    print(tables(results))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{CONFIG}.png")
    plot(results, path)
    print(f"wrote {path}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main()
