"""Run a reproduction config's variants over several seeds; print mean ± std and plot the curves.

A reproduction config is an ordinary experiment config (``get_config()``, runnable with
``python -m experiments <name>``) that also defines ``VARIANTS``: ``{variant name: {dotted config
key: value}}`` (e.g. ``{"enorm-1.2": {"optimizer.wrappers": ("enorm",), ...}}``) and ``SEEDS``.
Each (variant, seed) run trains in memory (no checkpoints) with the library's training loop; the
script prints a Markdown table (final and best test accuracy, final train loss, total l2 norm of
the kernels at the end: mean ± std over seeds) and saves the mean test-accuracy curves to
``<out>/<config>.png``. Variants run in the order of ``VARIANTS``; a ``wd_mimicry`` variant names
its reference variant (``wrapper_kwargs.wd_mimicry.reference``), whose recorded norms of the same
seed it reads.

    python experiments/scripts/grid.py fmnist_enorm_depth [--seeds 0 1 2] [--only a b]
        [--set optimizer.learning_rate=0.05 ...] [--out experiments/figures]
"""

from __future__ import annotations

import argparse
import ast
import copy
import importlib.util
import json
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from experiments.__main__ import resolve
from jaxnorm.train import experiment
from jaxnorm.train.norm_records import recorded_norms, save_recorded_norms


def load_module(name: str):
    """The config module ``name`` (a config name or a path)."""
    path = resolve(name)
    spec = importlib.util.spec_from_file_location(f"grid_config_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "VARIANTS"):
        raise ValueError(f"config {name!r} defines no VARIANTS; grid.py needs {{name: overrides}}")
    return module


def apply_sets(config, items) -> None:
    """Apply ``--set key=value`` items to ``config``; values are Python literals where they parse."""
    for item in items:
        key, value = item.split("=", 1)
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            pass
        set_dotted(config, key, value)


def set_dotted(config, key: str, value: Any) -> None:
    """``config.<key> = value`` for a dotted ``key``; unknown fields raise ``ValueError``."""
    *parents, leaf = key.split(".")
    node = config
    for part in parents:
        if part not in node:
            raise ValueError(f"config has no field {key!r}")
        node = node[part]
    with node.unlocked():
        node[leaf] = value


def kernel_l2(params) -> float:
    """The l2 norm of all kernels (leaves with ``ndim >= 2``) taken together."""
    leaves = [x for x in jax.tree_util.tree_leaves(params) if np.ndim(x) >= 2]
    return float(jnp.sqrt(sum(jnp.sum(jnp.asarray(x, jnp.float32) ** 2) for x in leaves)))


def run_one(base, overrides: Mapping[str, Any], seed: int, records: str | None = None,
            name: str = "") -> dict[str, Any]:
    """One run in memory: its summary plus ``final_l2`` and the test-accuracy curve.

    ``records``: a directory for recorded unit norms (the ``record_norms`` wrapper), saved as
    ``<records>/<name>/recorded_norms.npz``; a ``wd_mimicry`` reference that names a variant is
    read from there (run the reference variant first, with the same ``records``).
    """
    config = experiment.experiment_defaults()
    config.update(copy.deepcopy(base))
    for key, value in overrides.items():
        set_dotted(config, key, value)
    with config.unlocked():
        config.seed = seed
        config.progress = False
        config.checkpoint_every = 0
        config.plots = False
        config.sweep.key = ""
        mimicry = config.optimizer.get("wrapper_kwargs", {}).get("wd_mimicry", {})
        wrappers = tuple(config.optimizer.get("wrappers", ()))
        if records and "wd_mimicry" in wrappers and not os.path.exists(mimicry.reference):
            mimicry.reference = os.path.join(records, mimicry.reference)
    experiment.validate(config)
    result = experiment.run(config, None)
    norms = recorded_norms(result.state.opt_state)
    if records and norms is not None:
        save_recorded_norms(os.path.join(records, name), norms)
    evals = [(r["step"], r["accuracy"]) for r in result.history if r["split"] == "eval"]
    return {**result.summary, "final_l2": kernel_l2(result.state.params), "curve": evals,
            "norms": hidden_norm_curve(result.history)}


def hidden_norm_curve(history: Sequence[Mapping[str, Any]]) -> list[tuple[int, float]]:
    """``[(step, mean unit norm)]``: the logged ``wnorm/<kernel>`` averaged over the hidden kernels
    (the classifier ``head`` excluded), at every logged training step."""
    curve = []
    for r in history:
        keys = [k for k in r if k.startswith("wnorm/") and not k.startswith("wnorm/head")]
        if r["split"] == "train" and keys:
            curve.append((int(r["step"]), float(np.mean([r[k] for k in keys]))))
    return curve


def fmt(values: Sequence[float], scale: float = 1.0, digits: int = 2) -> str:
    """``mean ± std`` (std over seeds, ddof=0) of ``values * scale``."""
    v = np.asarray(values, float) * scale
    if not np.all(np.isfinite(v)):
        return f"{np.nanmean(v):.{digits}f} ({int(np.sum(~np.isfinite(v)))} diverged)"
    return f"{v.mean():.{digits}f} ± {v.std():.{digits}f}"


def table(results: Mapping[str, list[dict[str, Any]]]) -> str:
    """A Markdown table of the variants, mean ± std over seeds (accuracies in %)."""
    rows = ["| variant | seeds | test acc (%) | best test acc (%) | train loss | final kernel l2 |",
            "| --- | --- | --- | --- | --- | --- |"]
    for name, runs in results.items():
        rows.append(
            f"| {name} | {len(runs)} | {fmt([r['eval_accuracy'] for r in runs], 100)} | "
            f"{fmt([r['best_eval_accuracy'] for r in runs], 100)} | "
            f"{fmt([r['train_loss'] for r in runs], 1, 3)} | {fmt([r['final_l2'] for r in runs], 1, 1)} |")
    return "\n".join(rows)


def plot(results: Mapping[str, list[dict[str, Any]]], title: str, path: str) -> None:
    """Left: mean test accuracy over training, one line per variant (band: min..max over seeds).
    Right: mean per-unit l2 norm of the hidden kernels over training (first seed)."""
    fig, (ax, ax_norm) = plt.subplots(1, 2, figsize=(12, 4))
    for name, runs in results.items():
        steps = np.array([s for s, _ in runs[0]["curve"]])
        acc = np.array([[a for _, a in r["curve"]] for r in runs]) * 100
        line = ax.plot(steps, acc.mean(0), marker=".", label=name)[0]
        ax.fill_between(steps, acc.min(0), acc.max(0), color=line.get_color(), alpha=0.15)
        if runs[0]["norms"]:
            norm_steps, norms = zip(*runs[0]["norms"], strict=True)
            ax_norm.plot(norm_steps, norms, color=line.get_color(), label=name)
    ax.set(xlabel="step", ylabel="test accuracy (%)", title=title)
    ax.legend(fontsize=7)
    ax_norm.set(xlabel="step", ylabel="mean unit ||w|| (hidden kernels)", yscale="log",
                title="weight-norm dynamics (seed 0)")
    fig.tight_layout()
    fig.savefig(path, dpi=80)


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
    seeds = args.seeds if args.seeds else list(getattr(module, "SEEDS", (0,)))
    variants = {k: v for k, v in module.VARIANTS.items() if not args.only or k in args.only}
    results: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="grid_records_") as records:  # recorded norms per seed
        for name, overrides in variants.items():
            results[name] = []
            for seed in seeds:
                r = run_one(base, overrides, seed, os.path.join(records, f"seed{seed}"), name)
                results[name].append(r)
                print(f"{name} seed {seed}: test acc {100 * r['eval_accuracy']:.2f}%, "
                      f"{r['seconds']:.0f} s", flush=True)
    print(table(results))
    name = os.path.splitext(os.path.basename(args.config))[0]
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{name}.png")
    plot(results, base.description[:70], path)
    print(f"wrote {path}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main()
