"""Training speed of each CIFAR-10 experiment config, and the wall time of its paper protocol.

Usage::

    python benchmarks/configs.py [--quick] [--steps 200] [--runs cifar10_wrs:sgdm+wd,...] [--set KEY=VAL ...]

Each run is the config as ``experiments/scripts/resume_grid.py`` builds it (the experiment defaults,
the config, the variant's settings, the ``--set`` overrides; model, width, optimizer and wrappers,
batch size, precision and augmentation all the config's own), trained by the one loop
(``jaxnorm.train.experiment.run``) for ``--steps`` updates on **in-memory uint8 images of the
dataset's shape** (random pixels, random labels) through the same ``ArrayDataset`` that
``jaxnorm.data.load`` returns: after its one-time read of the split, the real run feeds its batches
the same way, so the step time is the config's. It prints, per run, the loop's own throughput clock
(after the first, compiling step; evaluation excluded), milliseconds per update, the time of the
first step plus the final evaluation (compilation, mostly), and the hours the config's stated
protocol (``num_epochs`` over the 50,000 CIFAR-10 training images) takes at that speed.

This measures; it reproduces nothing (the pixels are random). The anchor is the loop's own
throughput, not a second implementation: ``benchmarks/train.py`` compares the loop with a
hand-written flax + optax step.
"""

from __future__ import annotations

import argparse
import importlib
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's experiments package

from _timing import machine_lines, positive_count

from experiments.scripts.common import apply_sets, run_config
from jaxnorm import data
from jaxnorm.train import experiment

RUNS: tuple[str, ...] = (
    "cifar10_enorm_fc:baseline",
    "cifar10_enorm_fc:enorm-1",
    "cifar10_enorm_nv:baseline",
    "cifar10_enorm_nv:enorm-1",
    "cifar10_resnet18:",
    "cifar10_resnet56_norm_matters:l2bn",
    "cifar10_resnet56_norm_matters:l1bn",
    "cifar10_vgg11_norm_matters:wd",
    "cifar10_wrs:sgdm+wd",
    "cifar10_wrs:sgdm+wrs",
    "cifar10_wrs:resnet18 sgdm+wrs",
)
"""Default ``config:variant`` pairs (an empty variant: the config as it stands)."""

EVAL_EXAMPLES = 1000


def synthetic_split(name: str, examples: int, *, batch_size: int, train: bool, augment: str, seed: int):
    """An ``ArrayDataset`` of ``examples`` random uint8 images of dataset ``name``'s shape."""
    info = data.info(name)
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (examples, *info.image_shape), dtype=np.uint8)
    labels = rng.integers(0, info.num_classes, examples).astype(np.int64)
    channels = info.image_shape[-1]
    return data.ArrayDataset(
        images, labels, mean=(0.5,) * channels, std=(0.25,) * channels, batch_size=batch_size,
        train=train, seed=seed, augment=augment, drop_remainder=train, process_index=0, process_count=1)


def build(run: str, steps: int, sets: Sequence[str]):
    """The run config of ``config:variant``, set to train ``steps`` updates in memory."""
    config_name, _, variant = run.partition(":")
    module = importlib.import_module(f"experiments.configs.{config_name}")
    variants = getattr(module, "VARIANTS", {})
    if variant and variant not in variants:
        raise SystemExit(f"--runs: {config_name} has no variant {variant!r}; it has {sorted(variants)}")
    base = module.get_config()
    protocol_epochs = float(base.num_epochs)
    config = run_config(base, variants.get(variant, {}), seed=0)
    apply_sets(config, sets)
    with config.unlocked():
        config.num_steps = steps
        config.eval_every = 0
        config.checkpoint_every = 0
    return config, protocol_epochs


def time_run(run: str, steps: int, sets: Sequence[str]) -> dict:
    config, protocol_epochs = build(run, steps, sets)
    experiment.validate(config)
    ds = config.dataset
    augment = data.resolve_augment(ds.name, ds.augment or None)
    batch = int(ds.batch_size)
    datasets = (
        synthetic_split(ds.name, (steps + 1) * batch, batch_size=batch, train=True, augment=augment, seed=0),
        synthetic_split(ds.name, EVAL_EXAMPLES, batch_size=int(ds.eval_batch_size), train=False,
                        augment=augment, seed=1),
    )
    start = time.perf_counter()
    result = experiment.run(config, None, datasets=datasets)
    total = time.perf_counter() - start
    if result.preempted or "images_per_second" not in result.summary:
        raise SystemExit(f"{run}: stopped after {result.summary['steps']} of {steps} steps (SIGTERM?); "
                         "no throughput to report")
    ips = float(result.summary["images_per_second"])
    step_s = batch / ips
    per_epoch = math.ceil(data.info(ds.name).num_train_examples / batch)
    return {
        "run": run, "model": config.model.name, "batch": batch, "precision": config.precision,
        "images_per_second": ips, "ms_per_step": 1e3 * step_s,
        "overhead_s": total - (steps - 1) * step_s,
        "protocol_epochs": protocol_epochs,
        "protocol_hours": protocol_epochs * per_epoch * step_s / 3600,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="updates per run (200; --quick: 20)")
    parser.add_argument("--runs", default=",".join(RUNS),
                        help="comma-separated config:variant pairs (default: a representative set)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="overrides for every run, e.g. model.kwargs.width_multiplier=0.25")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 20 steps of the first two runs")
    args = parser.parse_args(argv)
    steps = positive_count(parser, "--steps", args.steps, 20 if args.quick else 200, unit="steps")
    if steps < 3:
        parser.error(f"--steps must be at least 3 (one compiling step, then timed ones), got {steps}")
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    if args.quick and args.runs == parser.get_default("runs"):
        runs = runs[:2]
    print("\n".join(machine_lines([f"steps per run: {steps}; overrides: {args.set or 'none'}"])))
    print("| config:variant | model | batch | precision | images/s | ms/step | first step + eval s "
          "| protocol epochs | protocol hours |")
    print("|---|---|---|---|---|---|---|---|---|")
    for run in runs:
        r = time_run(run, steps, args.set)
        print(f"| {r['run']} | {r['model']} | {r['batch']} | {r['precision']} | {r['images_per_second']:.0f} "
              f"| {r['ms_per_step']:.2f} | {r['overhead_s']:.1f} | {r['protocol_epochs']:g} "
              f"| {r['protocol_hours']:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
