"""A sweep that survives being stopped: every finished run is one JSON line; a rerun skips those.

For long sweeps on a shared machine (the CIFAR-10 reproductions of REPRODUCTION.md): the runs are
the product of the config's ``VARIANTS`` (``--only``), every ``--grid key=v1,v2,...`` and the seeds.
Each run trains with the library's loop in its own workdir ``<workdir>/<run key>`` with checkpoints
(``checkpoint_every`` of the config or ``--set``), so a run killed half-way resumes from its last
checkpoint; a finished run appends one line to ``--jsonl`` and is never run again. Runs go depth-first
in the order given (grid keys outermost, in the order of the ``--grid`` options, then variants, then seeds).

    python experiments/scripts/resume_grid.py cifar10_enorm_fc --jsonl experiments/results/x.jsonl \\
        --workdir runs/x --only baseline bn --seeds 0 \\
        --grid model.kwargs.depth=2,8,16 --grid optimizer.learning_rate=0.001,0.01,0.1 \\
        --set dataset.name=cifar10_jpeg num_epochs=5 checkpoint_every=500

``--select FILE:KEY`` takes ``KEY``'s value per variant (and per point of the other grid keys) from
the finished runs in ``FILE``: the value with the best mean final ``eval_accuracy`` over seeds, e.g. the
learning rate chosen on the validation split by a first sweep, for a second sweep on the test split.

A JSONL line: ``{"config", "variant", "grid": {key: value}, "sets": [...], "seed", "code" (git
describe), "eval_accuracy", "best_eval_accuracy", "train_loss", ..., "final_l2", "curve"}``
(the loop's run summary and :func:`common.run_one`'s extras; ``"analysis"`` for a config with
``ANALYSIS``).
"""

from __future__ import annotations

import argparse
import ast
import itertools
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from experiments.scripts.common import apply_sets, load_module, run_one


def parse_grid(items: Sequence[str]) -> list[tuple[str, list[Any]]]:
    """``["key=v1,v2", ...]`` -> ``[(key, [v1, v2]), ...]`` (values as Python literals where they parse)."""
    grid = []
    for item in items:
        key, _, values = item.partition("=")
        if not key or not values:
            raise ValueError(f"--grid expects key=v1,v2,..., got {item!r}")
        parsed = []
        for value in values.split(","):
            try:
                parsed.append(ast.literal_eval(value))
            except (ValueError, SyntaxError):
                parsed.append(value)
        grid.append((key, parsed))
    return grid


def run_key(config_name: str, variant: str, grid: dict[str, Any], sets: Sequence[str], seed: int) -> str:
    """A stable name of one run: what identifies it in the JSONL file and names its workdir."""
    parts = [config_name, variant, *(f"{k}={v}" for k, v in grid.items()), *sets, f"seed={seed}"]
    return "__".join(p.replace("/", "_").replace(" ", "") for p in parts)


def code_version() -> str:
    """``git describe --always --dirty`` of this checkout ("" outside git): which code made a run."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        out = subprocess.run(
            ["git", "-C", root, "describe", "--always", "--dirty"], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return ""
    return out.stdout.strip()


def done_keys(path: str) -> set[str]:
    if not os.path.exists(path):
        return set()
    with open(path) as f:
        return {json.loads(line)["key"] for line in f if line.strip()}


def select(path: str, key: str, variant: str, point: dict[str, Any]) -> Any:
    """The value of ``key`` whose runs of ``variant`` at ``point`` (other grid keys) in the JSONL file
    ``path`` have the best mean final ``eval_accuracy`` (NaN counts as 0)."""
    scores: dict[str, list[float]] = {}
    values: dict[str, Any] = {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            grid = r["grid"]
            if r["variant"] != variant or key not in grid:
                continue
            if any(grid.get(k) != v for k, v in point.items() if k != key):
                continue
            acc = float(r["eval_accuracy"])
            scores.setdefault(repr(grid[key]), []).append(acc if acc == acc else 0.0)
            values[repr(grid[key])] = grid[key]
    if not scores:
        raise ValueError(f"--select: no runs of {variant!r} at {point} with {key!r} in {path}")
    best = max(scores, key=lambda v: sum(scores[v]) / len(scores[v]))
    return values[best]


def run_resumable(
    base, overrides, grid: dict[str, Any], seed: int, workdir: str, analysis: str = ""
) -> dict[str, Any]:
    """One run with checkpoints in ``workdir`` (resumed if it holds one of the same config)."""
    return run_one(base, {**overrides, **grid}, seed, workdir=workdir, analysis=analysis)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--jsonl", required=True, help="finished runs, one JSON line each (appended)")
    parser.add_argument("--workdir", required=True, help="run directories with checkpoints")
    parser.add_argument("--seeds", type=int, nargs="*")
    parser.add_argument("--only", nargs="*", help="run only these variants, in this order")
    parser.add_argument("--grid", action="append", default=[], help="key=v1,v2,... (repeatable)")
    parser.add_argument("--set", nargs="*", default=[], help="key=value overrides for every run")
    parser.add_argument("--select", default="", help="FILE:KEY: KEY's best value per variant from FILE")
    args = parser.parse_args(argv)

    module = load_module(args.config)
    base = module.get_config()
    apply_sets(base, args.set)
    config_name = os.path.splitext(os.path.basename(args.config))[0]
    seeds = args.seeds if args.seeds else list(getattr(module, "SEEDS", (0,)))
    names = args.only if args.only else list(module.VARIANTS)
    unknown = [n for n in names if n not in module.VARIANTS]
    if unknown:
        raise ValueError(f"--only: unknown variants {unknown}; the config has {list(module.VARIANTS)}")
    grid = parse_grid(args.grid)
    done = done_keys(args.jsonl)
    os.makedirs(os.path.dirname(os.path.abspath(args.jsonl)), exist_ok=True)
    for values in itertools.product(*(v for _, v in grid)):
        point = dict(zip((k for k, _ in grid), values, strict=True))
        for name in names:
            run_point = dict(point)
            if args.select:
                path, _, select_key = args.select.rpartition(":")
                run_point[select_key] = select(path, select_key, name, point)
            for seed in seeds:
                key = run_key(config_name, name, run_point, args.set, seed)
                if key in done:
                    continue
                print(f"== {key}", flush=True)
                summary = run_resumable(
                    base,
                    module.VARIANTS[name],
                    run_point,
                    seed,
                    os.path.join(args.workdir, key),
                    getattr(module, "ANALYSIS", ""),
                )
                record = {
                    "key": key,
                    "config": config_name,
                    "variant": name,
                    "grid": run_point,
                    "sets": list(args.set),
                    "seed": seed,
                    "code": code_version(),
                    **summary,
                }
                with open(args.jsonl, "a") as f:
                    f.write(json.dumps(record, default=float) + "\n")
                print(
                    f"   test acc {100 * summary['eval_accuracy']:.2f}%, "
                    f"{summary.get('seconds', float('nan')):.0f} s",
                    flush=True,
                )


if __name__ == "__main__":
    main()
