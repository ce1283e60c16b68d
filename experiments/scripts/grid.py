"""Run a reproduction config's variants over several seeds; print mean ± std and plot the curves.

A reproduction config is an ordinary experiment config (``get_config()``, runnable with
``python -m experiments <name>``) that also defines ``VARIANTS``: ``{variant name: {dotted config
key: value}}`` (e.g. ``{"enorm-1.2": {"optimizer.wrappers": ("enorm",), ...}}``) and ``SEEDS``.
Each (variant, seed) run trains in memory (no checkpoints) with the library's training loop; the
script prints a Markdown table (final and best test accuracy, final train loss, total l2 norm of
the kernels at the end: mean ± std over seeds) and saves the mean test-accuracy curves to
``<out>/<config>.png``. Variants run in the order of ``VARIANTS``; a ``wd_mimicry`` variant names
its reference variant (``wrapper_kwargs.wd_mimicry.reference``), whose recorded norms of the same
seed it reads. A config with ``ANALYSIS`` also gets that analysis's numbers per run, its table and
its figure (``<out>/<config>_analysis.png``; :mod:`experiments.scripts.analyses`). The helpers live in
:mod:`experiments.scripts.common`.

    python experiments/scripts/grid.py fmnist_enorm_depth [--seeds 0 1 2] [--only a b]
        [--set optimizer.learning_rate=0.05 ...] [--out experiments/figures]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from experiments.scripts.common import (
    apply_sets,
    check_set_conflicts,
    command_line,
    load_module,
    plot,
    report,
    run_one,
    select_seeds,
    select_variants,
    table,
)


def main(argv: Sequence[str] | None = None, module=None) -> None:
    """Command line; ``module`` replaces the config module loaded by name (scripts that build variants)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--seeds", type=int, nargs="*")
    parser.add_argument("--only", nargs="*", help="run only these variants")
    parser.add_argument("--set", nargs="*", default=[], help="key=value overrides for every run")
    parser.add_argument("--out", default="experiments/figures")
    parser.add_argument("--json", default="", help="also write every run's numbers here")
    args = parser.parse_args(argv)

    module = module or load_module(args.config)
    base = module.get_config()
    apply_sets(base, args.set)
    seeds = select_seeds(module, args.seeds)
    variants = select_variants(module.VARIANTS, args.only, in_only_order=False)
    check_set_conflicts(args.set, variants, has_grid=False)
    config_name = os.path.splitext(os.path.basename(args.config))[0]
    results: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="grid_records_") as records:  # recorded norms per seed
        for name, overrides in variants.items():
            results[name] = []
            for seed in seeds:
                r = run_one(
                    base,
                    overrides,
                    seed,
                    os.path.join(records, f"seed{seed}"),
                    name,
                    analysis=getattr(module, "ANALYSIS", ""),
                )
                # which run it is, in the record itself (the file's list position only implied the seed)
                results[name].append({**r, "seed": seed, "config": config_name, "sets": list(args.set)})
                print(
                    f"{name} seed {seed}: test acc {100 * r['eval_accuracy']:.2f}%, {r['seconds']:.0f} s",
                    flush=True,
                )
    print(table(results))
    name = os.path.splitext(os.path.basename(args.config))[0]
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{name}.png")
    plot(results, base.description[:70], path)
    print(f"wrote {path}")
    for line in report(module, results, args.out, name):
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    command_line(main)
