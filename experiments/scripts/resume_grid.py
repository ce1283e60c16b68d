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
learning rate chosen on the validation split by a first sweep, for a second sweep on the test split. A
setting that tells selection runs apart (the optimizer of ``cifar10_enorm_nv.sh``) must be a grid key of
both sweeps: :func:`select` refuses to pool runs that differ in it, and an incomplete selection.

A JSONL line: ``{"key", "config", "variant", "grid": {key: value}, "sets": [...], "seed", "code" (git
describe), "run_config" (the resolved config the run trained with), "eval_accuracy",
"best_eval_accuracy", "train_loss", ..., "final_l2", "curve"}`` (the loop's run summary and
:func:`common.run_one`'s extras; ``"analysis"`` for a config with ``ANALYSIS``).

What is refused, before any run trains (each would record something else than was asked): a ``--set``
or ``--grid`` key the config does not have (model options aside, which the model checks), a ``--set``
key a selected variant sets itself (the variant's value would win: use ``--grid``, applied after the
variants), a key that ``--grid`` and ``--set`` or ``--select`` both set, ``seed`` / ``quick*`` /
``sweep.*`` in ``--set`` or ``--grid`` (a grid run sets or ignores them: ``--grid seed=0,1,2`` trained
every run with the ``--seeds`` seed), a repeated seed or grid value (``1`` and ``1.0`` too), an empty
one, a ``--select`` file whose runs were evaluated on a test split, and a finished run whose recorded
``run_config`` differs from what the config gives now (the config was edited: record the new runs in
another file). A dict given with ``--set`` or ``--grid`` merges into the config's dict (and the
variant's) instead of replacing it. A run
is the same run whatever the order of the ``--set`` items and their execution-only settings
(:data:`experiments.scripts.records.EXECUTION_SETS`, e.g. ``checkpoint_every``), so a rerun with
another checkpoint interval trains nothing. ``--dry-run`` checks every run and lists them, ``done``
or ``todo``. Values of ``--grid`` split at top-level commas (``model.kwargs={'width': 8, 'stem':
'cifar'}`` is one value); a key too long for a directory name gets a hashed workdir name.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, NamedTuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from experiments.scripts.common import (
    apply_sets,
    check_run_key,
    check_set_conflicts,
    command_line,
    load_module,
    run_config,
    run_one,
    select_seeds,
    select_variants,
)
from experiments.scripts.records import (
    as_recorded,
    check_no_repeated_runs,
    diverged,
    parse_set,
    parse_value,
    read_records,
    result_sets,
    run_identity,
    split_values,
)
from jaxnorm import data
from jaxnorm.train import experiment
from jaxnorm.train.run_record import config_dict, config_differences

MAX_WORKDIR_NAME = 240
"""Bytes of a run's workdir name (file systems allow 255): a longer run key is cut and hashed."""


def parse_grid(items: Sequence[str]) -> list[tuple[str, list[Any]]]:
    """``["key=v1,v2", ...]`` -> ``[(key, [v1, v2]), ...]`` (values as Python literals where they parse,
    split at top-level commas: ``model.kwargs={'width': 8, 'stem': 'cifar'}`` is one value); a key
    given twice or a value repeated (``0.1,1e-1``) raises ``ValueError``: it would run one run twice."""
    grid = []
    for item in items:
        key, _, values = item.partition("=")
        if not key or not values:
            raise ValueError(f"--grid expects key=v1,v2,..., got {item!r}")
        if key in (k for k, _ in grid):
            raise ValueError(f"--grid {key} is given twice; list its values once: --grid {key}=v1,v2,...")
        check_run_key(key, f"--grid {item}")
        texts = split_values(values)
        if any(not text.strip() for text in texts):
            raise ValueError(f"--grid {item}: an empty value (a stray comma?)")
        parsed = [parse_value(value) for value in texts]
        repeated = any(a == b for i, a in enumerate(parsed) for b in parsed[i + 1 :])
        if repeated or len({repr(v) for v in parsed}) != len(parsed):  # 1 and 1.0 train the same run
            raise ValueError(f"--grid {item}: a value is repeated ({parsed}); each value runs once")
        grid.append((key, parsed))
    return grid


def check_grid_conflicts(
    set_items: Sequence[str], grid: Sequence[tuple[str, list[Any]]], select: str | None
) -> None:
    """``ValueError`` for a ``--grid`` key that a ``--set`` item or ``--select`` sets too (or that lies
    inside or around one): the grid's value would win over ``--set`` while the record's ``sets`` still
    said the other, and ``--select`` would replace the grid's values."""
    set_keys = [parse_set(item)[0] for item in set_items]
    chosen = select.rpartition(":")[2] if select else ""
    for key, _ in grid:
        for other, option in [*((k, "--set") for k in set_keys), *([(chosen, "--select")] if chosen else [])]:
            if key == other or key.startswith(other + ".") or other.startswith(key + "."):
                raise ValueError(f"--grid {key} and {option} {other} set the same setting; give it once")


def run_key(config_name: str, variant: str, grid: dict[str, Any], sets: Sequence[str], seed: int) -> str:
    """A stable name of one run: what names it in the JSONL file and its workdir."""
    parts = [config_name, variant, *(f"{k}={v}" for k, v in grid.items()), *sets, f"seed={seed}"]
    return "__".join(p.replace("/", "_").replace(" ", "") for p in parts)


def workdir_name(key: str) -> str:
    """``key`` as a directory name: itself, or cut with a hash of the whole when it is longer than
    :data:`MAX_WORKDIR_NAME` bytes."""
    if len(key.encode()) <= MAX_WORKDIR_NAME:
        return key
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return key.encode()[: MAX_WORKDIR_NAME - 18].decode(errors="ignore") + "__" + digest


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


def read_runs(path: str) -> list[dict[str, Any]]:
    """The finished runs of the JSONL file ``path`` (none if it does not exist)."""
    return read_records(path) if os.path.exists(path) else []


def select(path: str, key: str, variant: str, point: dict[str, Any], *, config: str | None = None) -> Any:
    """The value of ``key`` whose runs of ``variant`` (of config ``config``, when given) at ``point``
    (other grid keys) in the JSONL file ``path`` have the best mean final ``eval_accuracy`` (a run that
    diverged counts as 0, :func:`~experiments.scripts.records.diverged`, whatever accuracy it recorded;
    a tie goes to the value first in the file).

    ``ValueError`` when there are no such runs, when they differ in a setting ``point`` does not fix
    (another grid key, a ``--set`` value such as the optimizer: the choice would pool them; make it a
    grid key of both sweeps), when a run is recorded twice, or when the selection is incomplete (a
    value of ``key`` another variant ran is missing for this one, or the values have different numbers
    of seeds)."""
    every = [
        r
        for r in read_runs(path)
        if key in r["grid"] and (config is None or r.get("config", config) == config)
    ]
    at_point = lambda r: all(
        as_recorded(r["grid"].get(k)) == as_recorded(v) for k, v in point.items() if k != key
    )
    here = [r for r in every if at_point(r)]  # every variant's runs at this point
    runs = [r for r in here if r["variant"] == variant]
    if not runs:
        raise ValueError(f"--select: no runs of {variant!r} at {point} with {key!r} in {path}")
    where = f"--select {path}: the runs of {variant!r} at {point}"
    check_selection_split(runs, where)
    check_no_repeated_runs(runs, where)
    _check_one_setting(runs, key, point, where)
    scores: dict[str, list[float]] = {}
    for r in runs:
        acc = 0.0 if diverged(r) else float(r["eval_accuracy"])
        scores.setdefault(as_recorded(r["grid"][key]), []).append(acc)
    values = {as_recorded(r["grid"][key]): r["grid"][key] for r in here}
    if set(values) != set(scores) or len({len(s) for s in scores.values()}) > 1:
        counts = {values[v]: len(scores.get(v, ())) for v in sorted(values)}
        raise ValueError(
            f"{where} are incomplete (runs per value of {key}: {counts}); finish the selection sweep first"
        )
    best = max(scores, key=lambda v: sum(scores[v]) / len(scores[v]))
    return values[best]


def check_selection_split(runs: Sequence[dict[str, Any]], where: str) -> None:
    """``ValueError`` when a selection run was evaluated on a test split (its recorded
    ``run_config.dataset.eval_split`` names ``test``: a value chosen there and then reported on the
    test split is chosen on the test set) or on examples it trained on (``train`` with
    ``validation``: :func:`jaxnorm.data.splits_overlap`). Runs recorded without ``run_config`` are
    taken as they are."""
    for r in runs:
        dataset = r.get("run_config", {}).get("dataset", {})
        split = str(dataset.get("eval_split", ""))
        trained = str(dataset.get("train_split", ""))
        known = bool(split and trained) and dataset.get("name") in data.names()
        overlap = known and data.splits_overlap(dataset["name"], trained, split)
        if "test" in split or overlap:
            seen = f"{split!r}, part of its train split {trained!r}" if overlap else repr(split)
            raise ValueError(
                f"{where} were evaluated on {seen}: a selection must be made on a validation split "
                "(--set dataset.train_split=train_minus_validation dataset.eval_split=validation)"
            )


def _check_one_setting(runs: Sequence[dict[str, Any]], key: str, point: dict[str, Any], where: str) -> None:
    """``ValueError`` when ``runs`` differ in a grid key other than ``key`` and those of ``point``, or
    in a result ``--set`` value: a selection over them would pool settings."""
    settings = (
        ("grid", lambda r: {k: as_recorded(v) for k, v in r["grid"].items() if k != key and k not in point}),
        ("--set", lambda r: result_sets(r.get("sets", ()))),
    )
    for field, of in settings:
        keys = {k for r in runs for k in of(r)}
        varying = sorted(k for k in keys if len({of(r).get(k) for r in runs}) > 1)
        if varying:
            raise ValueError(
                f"{where} differ in {field} {varying}; the choice would pool them: make it a --grid key "
                "of both sweeps, or select from one file per setting"
            )


def check_recorded(record: dict[str, Any], config) -> None:
    """``ValueError`` when a finished run's recorded config differs from the one this sweep would run
    (the config file was edited since): its numbers are not this run's. A run recorded before configs
    were (no ``"run_config"``) is taken as it is."""
    if "run_config" not in record:
        return
    new = config_dict(config)
    differences = config_differences(record["run_config"], new)
    for length in ("num_epochs", "num_steps"):
        if record["run_config"].get(length) != new.get(length):
            differences[length] = (record["run_config"].get(length), new.get(length))
    if differences:
        changes = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in sorted(differences.items()))
        raise ValueError(
            f"{record['key']} is recorded with another config ({changes}); the config changed since "
            "that run: record the new runs in another --jsonl file"
        )


class PlannedRun(NamedTuple):
    """One run of the sweep: its JSON line so far, its resolved config, its variant's overrides, and
    whether the JSONL file already holds it."""

    record: dict[str, Any]
    config: Any
    overrides: dict[str, Any]
    finished: bool


def plan_runs(args: argparse.Namespace, module, base) -> list[PlannedRun]:
    """Every run of the sweep in order, each config built and validated, each finished one checked
    against its recorded config (before any run trains). With ``--dry-run`` a variant whose
    ``--select`` cannot be made yet is reported and left out."""
    config_name = os.path.splitext(os.path.basename(args.config))[0]
    seeds = select_seeds(module, args.seeds)
    variants = select_variants(module.VARIANTS, args.only)
    check_set_conflicts(args.set, variants)
    grid = parse_grid(args.grid)
    check_grid_conflicts(args.set, grid, args.select)
    done = {run_identity(r): r for r in read_runs(args.jsonl)}
    plan = []
    for values in itertools.product(*(v for _, v in grid)):
        point = dict(zip((k for k, _ in grid), values, strict=True))
        for name, overrides in variants.items():
            run_point = dict(point)
            if args.select:
                path, _, select_key = args.select.rpartition(":")
                try:
                    run_point[select_key] = select(path, select_key, name, point, config=config_name)
                except ValueError as e:
                    if not args.dry_run:
                        raise
                    print(f"wait {name} at {point}: {e}")
                    continue
            for seed in seeds:
                config = run_config(base, overrides, seed, run_point)
                experiment.validate(config)
                record = {
                    "key": run_key(config_name, name, run_point, args.set, seed),
                    "config": config_name,
                    "variant": name,
                    "grid": run_point,
                    "sets": list(args.set),
                    "seed": seed,
                }
                recorded = done.get(run_identity(record))
                if recorded is not None:
                    check_recorded(recorded, config)
                plan.append(PlannedRun(record, config, dict(overrides), recorded is not None))
    return plan


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
    parser.add_argument("--dry-run", action="store_true", help="check every run and list them; train none")
    args = parser.parse_args(argv)

    module = load_module(args.config)
    base = module.get_config()
    apply_sets(base, args.set)
    plan = plan_runs(args, module, base)
    if args.dry_run:
        for run in plan:
            print(f"{'done' if run.finished else 'todo'} {run.record['key']}")
        return
    os.makedirs(os.path.dirname(os.path.abspath(args.jsonl)), exist_ok=True)
    trained = set()
    for run in plan:
        identity = run_identity(run.record)
        if run.finished or identity in trained:
            continue
        print(f"== {run.record['key']}", flush=True)
        summary = run_one(
            base,
            run.overrides,
            run.record["seed"],
            workdir=os.path.join(args.workdir, workdir_name(run.record["key"])),
            analysis=getattr(module, "ANALYSIS", ""),
            grid=run.record["grid"],
        )
        record = {**run.record, "code": code_version(), "run_config": config_dict(run.config), **summary}
        with open(args.jsonl, "a") as f:
            f.write(json.dumps(record, default=float) + "\n")
        trained.add(identity)
        seconds = summary.get("seconds", float("nan"))
        print(f"   test acc {100 * summary['eval_accuracy']:.2f}%, {seconds:.0f} s", flush=True)


if __name__ == "__main__":
    command_line(main)
