"""What the experiment scripts share: config modules, overrides, one run over the loop, tables, plots.

A reproduction config is an ordinary experiment config (``get_config()``, runnable with ``python -m
experiments <name>``) that also defines ``VARIANTS`` (``{variant name: {dotted config key: value}}``)
and ``SEEDS``, and optionally ``ANALYSIS``: the name of an analysis in
:data:`experiments.scripts.analyses.ANALYSES`, run on every finished run (its numbers go into the
run's record under ``"analysis"``) and, where it has one, its own table and figure over all runs.
``grid.py`` (in memory) and ``resume_grid.py`` (checkpointed, one JSON line per run) both run
variants with :func:`run_one`.
"""

from __future__ import annotations

import copy
import importlib.util
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

from experiments.__main__ import resolve
from experiments.scripts.records import parse_set
from jaxnorm.train import experiment
from jaxnorm.train.config_checks import dotted_keys, lookup, settable_keys, suggestion
from jaxnorm.train.norm_records import recorded_norms, save_recorded_norms


def command_line(main: Any) -> None:
    """Runs a script's ``main()``; a ``ValueError`` (a bad argument, config or results file, named in its
    message) is one ``error: ...`` line on stderr and exit status 2, as ``python -m experiments`` does,
    instead of a traceback."""
    try:
        main()
    except ValueError as e:
        print("error: " + " ".join(str(e).split()), file=sys.stderr)
        raise SystemExit(2) from None


def load_module(name: str):
    """The config module ``name`` (a config name or a path); it must define ``VARIANTS``."""
    path = resolve(name)
    spec = importlib.util.spec_from_file_location(f"grid_config_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "VARIANTS"):
        raise ValueError(f"config {name!r} defines no VARIANTS; grid.py needs {{name: overrides}}")
    return module


def apply_sets(config, items: Sequence[str]) -> None:
    """Apply ``--set key=value`` items to ``config`` (values are Python literals where they parse); a
    key that is no field of ``config`` or of the experiment defaults, nor a model option, raises
    ``ValueError`` with the closest valid key (a misspelt key would otherwise train with the default)."""
    for item in items:
        key, value = parse_set(item)
        check_run_key(key, f"--set {item}")
        check_known_key(config, key, "--set")
        set_dotted(config, key, value, merge=True)


UNSWEPT_KEYS = ("seed", "quick", "quick_steps", "quick_examples", "sweep")
"""Keys a run of ``grid.py`` / ``resume_grid.py`` sets itself or never reads: the seed (``--seeds``), the
command line's quick mode and its own sweep. Given with ``--set`` or ``--grid`` they were recorded with
each run and ignored (``--grid seed=0,1,2`` trained every run with the ``--seeds`` seed)."""


def check_run_key(key: str, where: str) -> None:
    """``ValueError`` naming ``where`` for a key in :data:`UNSWEPT_KEYS` (or under ``sweep``)."""
    if key in UNSWEPT_KEYS or key.startswith("sweep."):
        hint = "give seeds with --seeds, which sets each run's seed" if key == "seed" else (
            "the grid scripts run every run in full and have no sweep of their own: set num_steps or "
            "dataset.train_split for a short run, --grid for several values"
        )
        raise ValueError(f"{where}: {key} is not a setting of a grid run; {hint}")


FREE_FORM_KEYS = ("model.kwargs.", "optimizer.wrapper_kwargs.")
"""Dotted prefixes of dicts whose keys a run may add: model options (checked against the model) and
optimizer wrappers' arguments (checked by the wrapper when the run is validated)."""


def check_known_key(config, key: str, option: str) -> None:
    """``ValueError`` naming ``option`` unless ``key`` is a field of ``config`` or of the experiment
    defaults, or lies in a dict of :data:`FREE_FORM_KEYS` (checked when the run is validated)."""
    if key.startswith(FREE_FORM_KEYS):
        return
    defaults = experiment.experiment_defaults()
    for candidate in (config, defaults):
        try:
            lookup(candidate, key)
            return
        except KeyError:
            continue
    known = settable_keys(config) + dotted_keys(defaults)
    raise ValueError(f"{option} {key}: the config has no key config.{key}{suggestion(key, known)}")


def check_set_conflicts(
    set_items: Sequence[str], variants: Mapping[str, Mapping[str, Any]], *, has_grid: bool = True
) -> None:
    """``ValueError`` when a variant sets what a ``--set`` item sets too: the same key, a key inside a
    ``--set`` dict that the dict gives (``--set model.kwargs={'width': 8}`` and a variant's
    ``model.kwargs.width``; its other keys merge), or a dict around a ``--set`` key (the variant's dict
    would replace it). The variant's own value would win, silently, in its runs. ``has_grid``: the
    script takes ``--grid`` (applied after the variants), which the message suggests."""
    for item in set_items:
        key, value = parse_set(item)
        for name, overrides in variants.items():
            for own, own_value in overrides.items():
                inside = own.startswith(key + ".")
                if inside and not (isinstance(value, Mapping) and own[len(key) + 1 :].split(".")[0] in value):
                    continue  # the variant's key is not in the --set dict: the two merge
                if own == key or inside or key.startswith(own + "."):
                    specific = max(own, key, key=len)
                    instead = f"override it for every variant with --grid {specific}=..., or " * has_grid
                    raise ValueError(
                        f"--set {item}: variant {name!r} sets {own}={own_value!r} itself, and a variant's "
                        f"own settings win over --set; {instead}leave the variant out with --only"
                    )


def select_variants(
    variants: Mapping[str, Mapping[str, Any]], only: Sequence[str] | None, *, in_only_order: bool = True
) -> dict[str, Mapping[str, Any]]:
    """The ``variants`` named in ``only`` (all of them for ``None`` or empty), in ``only``'s order or,
    with ``in_only_order=False``, in ``variants``' (where a variant reads another's records, e.g. a
    ``wd_mimicry`` reference); ``ValueError`` listing the valid names for an unknown or repeated one."""
    if only is not None and not only:
        raise ValueError("--only is given without variants; leave it out to run every variant")
    names = list(only) if only else list(variants)
    unknown = [n for n in names if n not in variants]
    if unknown:
        raise ValueError(f"--only: unknown variants {unknown}; the config has {list(variants)}")
    if len(set(names)) != len(names):
        raise ValueError(f"--only names a variant more than once: {names}")
    order = names if in_only_order else [n for n in variants if n in names]
    return {n: variants[n] for n in order}


def select_seeds(module, seeds: Sequence[int] | None) -> list[int]:
    """``seeds`` (``--seeds``), or the config's ``SEEDS`` (default ``(0,)``) when none are given;
    ``ValueError`` for a repeated seed, which would run one run twice."""
    if seeds is not None and not seeds:
        raise ValueError("--seeds is given without seeds; leave it out for the config's SEEDS")
    chosen = list(seeds) if seeds else list(getattr(module, "SEEDS", (0,)))
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"--seeds repeats a seed: {chosen}")
    return chosen


def set_dotted(config, key: str, value: Any, *, merge: bool = False) -> None:
    """``config.<key> = value`` for a dotted ``key``; unknown parent fields raise ``ValueError``, as does
    a value of the wrong type (naming the key). ``merge=True`` (``--set`` and ``--grid``): a dict
    ``value`` for a key that holds a dict is merged into it, recursively (``model.kwargs={'depth': 4}``
    keeps the config's ``width`` and a variant's ``num_groups``; until 2026-12-02 it replaced the whole
    dict, silently dropping them). A variant's own dict replaces (``optimizer.wrapper_kwargs={...}``
    in a config file says all of them)."""
    *parents, leaf = key.split(".")
    node = config
    for part in parents:
        if part not in node:
            raise ValueError(f"config has no field {key!r}")
        node = node[part]
    if merge and isinstance(value, Mapping) and leaf in node and hasattr(node[leaf], "to_dict"):
        value = merged(node[leaf].to_dict(), value)
    with node.unlocked():
        try:
            node[leaf] = value
        except TypeError as e:  # ml_collections: "Could not override field ... cannot be casted"
            raise ValueError(f"config.{key}={value!r}: {e}") from None


def merged(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``update`` merged in: dicts in both are merged recursively, anything else replaced."""
    out = dict(base)
    for key, value in update.items():
        old = out.get(key)
        out[key] = merged(old, value) if isinstance(old, Mapping) and isinstance(value, Mapping) else value
    return out


def kernel_l2(params) -> float:
    """The l2 norm of all kernels (leaves with ``ndim >= 2``) taken together."""
    leaves = [x for x in jax.tree_util.tree_leaves(params) if np.ndim(x) >= 2]
    return float(jnp.sqrt(sum(jnp.sum(jnp.asarray(x, jnp.float32) ** 2) for x in leaves)))


def hidden_norm_curve(history: Sequence[Mapping[str, Any]]) -> list[tuple[int, float]]:
    """``[(step, mean unit norm)]``: the logged ``wnorm/<kernel>`` averaged over the hidden kernels
    (the classifier ``head`` excluded), at every logged training step."""
    curve = []
    for r in history:
        keys = [k for k in r if k.startswith("wnorm/") and not k.startswith("wnorm/head")]
        if r["split"] == "train" and keys:
            # float(): a non-finite norm is recorded as its string ("nan", "inf")
            curve.append((int(r["step"]), float(np.mean([float(r[k]) for k in keys]))))
    return curve


def eval_curve(history: Sequence[Mapping[str, Any]]) -> list[tuple[int, float]]:
    """``[(step, test accuracy)]`` at every evaluation, as floats: a diverged evaluation is recorded as
    the string "nan" (``metrics._jsonable``), which the plots and the analysis would multiply."""
    return [(r["step"], float(r["accuracy"])) for r in history if r["split"] == "eval"]


def train_loss_curve(history: Sequence[Mapping[str, Any]]) -> list[tuple[int, float]]:
    """``[(step, mean train loss)]`` at every evaluation: the training loss averaged over the steps
    since the previous evaluation (with one evaluation per epoch, each epoch's mean train loss;
    non-finite where a step of it diverged)."""
    curve, since = [], []
    for r in history:
        if r["split"] == "train":
            since.append(float(r["loss"]))  # float(): a non-finite loss is recorded as "nan" / "inf"
        elif r["split"] == "eval" and since:
            curve.append((int(r["step"]), float(np.mean(since))))
            since = []
    return curve


def run_config(base, overrides: Mapping[str, Any], seed: int, grid: Mapping[str, Any] | None = None):
    """The run config of one (variant, seed): the experiment defaults, ``base``, the variant's
    ``overrides``, the ``grid`` point's values (keys checked as ``--grid``'s), the seed; no progress
    bar, no per-run plots, no sweep."""
    config = experiment.experiment_defaults()
    config.update(copy.deepcopy(base))
    for key, value in overrides.items():
        set_dotted(config, key, value)
    for key, value in (grid or {}).items():
        check_known_key(config, key, "--grid")
        set_dotted(config, key, value, merge=True)
    with config.unlocked():
        config.seed = seed
        config.progress = False
        config.plots = False
        config.sweep.key = ""
    return config


def run_one(
    base,
    overrides: Mapping[str, Any],
    seed: int,
    records: str | None = None,
    name: str = "",
    *,
    workdir: str | None = None,
    analysis: str = "",
    grid: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One run with the library's loop: its summary plus ``final_l2``, the test-accuracy ``curve``,
    the per-evaluation mean training loss ``train_curve`` (:func:`train_loss_curve`), the hidden
    ``norms`` curve and, with ``analysis`` (a name in
    :data:`experiments.scripts.analyses.ANALYSES`), that analysis's numbers under ``"analysis"``.

    ``workdir``: ``None`` trains in memory without checkpoints (``grid.py``); a directory trains with
    the config's checkpoints there, resuming a run it holds, and exits with
    :data:`jaxnorm.train.experiment.PREEMPTED_EXIT_CODE` when the run is preempted
    (``resume_grid.py``). ``records``: a directory for recorded unit norms (the ``record_norms``
    wrapper), saved as ``<records>/<name>/recorded_norms.npz``; a ``wd_mimicry`` reference that names
    a variant is read from there (run the reference variant first, with the same ``records``).
    """
    config = run_config(base, overrides, seed, grid)
    with config.unlocked():
        if workdir is None:
            config.checkpoint_every = 0
        mimicry = config.optimizer.get("wrapper_kwargs", {}).get("wd_mimicry", {})
        wrappers = tuple(config.optimizer.get("wrappers", ()))
        # a reference relative to nothing is the variant of that name in ``records``, never a
        # directory of that name where the script happens to run
        if records and "wd_mimicry" in wrappers and not os.path.isabs(mimicry.reference):
            mimicry.reference = os.path.join(records, mimicry.reference)
    experiment.validate(config)
    result = experiment.run(config, workdir)
    if workdir is not None and result.preempted:
        raise SystemExit(experiment.PREEMPTED_EXIT_CODE)
    norms = recorded_norms(result.state.opt_state)
    if records and norms is not None:
        save_recorded_norms(os.path.join(records, name), norms)
    evals = eval_curve(result.history)
    out = {
        **result.summary,
        "final_l2": kernel_l2(result.state.params),
        "curve": evals,
        "train_curve": train_loss_curve(result.history),
        "norms": hidden_norm_curve(result.history),
    }
    if analysis:
        from experiments.scripts.analyses import get_analysis

        out["analysis"] = get_analysis(analysis).analyze(config, result)
    return out


def fmt(values: Sequence[float], scale: float = 1.0, digits: int = 2) -> str:
    """``mean ± std`` (std over seeds, ddof=0) of ``values * scale``."""
    v = np.asarray(values, float) * scale
    if not np.all(np.isfinite(v)):
        return f"{np.nanmean(v):.{digits}f} ({int(np.sum(~np.isfinite(v)))} diverged)"
    return f"{v.mean():.{digits}f} ± {v.std():.{digits}f}"


def table(results: Mapping[str, list[dict[str, Any]]]) -> str:
    """A Markdown table of the variants, mean ± std over seeds (accuracies in %)."""
    rows = [
        "| variant | seeds | test acc (%) | best test acc (%) | train loss | final kernel l2 |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, runs in results.items():
        rows.append(
            f"| {name} | {len(runs)} | {fmt([r['eval_accuracy'] for r in runs], 100)} | "
            f"{fmt([r['best_eval_accuracy'] for r in runs], 100)} | "
            f"{fmt([r['train_loss'] for r in runs], 1, 3)} | {fmt([r['final_l2'] for r in runs], 1, 1)} |"
        )
    return "\n".join(rows)


def first_seed_label(results: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    """``"seed k"``, ``k`` the ``"seed"`` of every variant's first run (``runs[0]``, the one that
    single-seed panels and columns show): ``"seeds a, b"`` where variants differ, ``"first seed"``
    where the records carry no seed."""
    seeds = list(dict.fromkeys(runs[0].get("seed") for runs in results.values() if runs))
    if not seeds or None in seeds:
        return "first seed"
    return f"seed {seeds[0]}" if len(seeds) == 1 else "seeds " + ", ".join(map(str, seeds))


def plot(results: Mapping[str, list[dict[str, Any]]], title: str, path: str) -> None:
    """Left: mean test accuracy over training, one line per variant (band: min..max over seeds).
    Right: mean per-unit l2 norm of the hidden kernels over training (each variant's first run,
    labelled with its seed: :func:`first_seed_label`)."""
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
    ax_norm.set(
        xlabel="step",
        ylabel="mean unit ||w|| (hidden kernels)",
        yscale="log",
        title=f"weight-norm dynamics ({first_seed_label(results)})",
    )
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def report(module, results: Mapping[str, list[dict[str, Any]]], out: str, config_name: str) -> list[str]:
    """The config's own analysis table and figure (``ANALYSIS``'s ``report`` / ``figure``), if any:
    the printed lines (the figure written to ``<out>/<config_name>_analysis.png``)."""
    name = getattr(module, "ANALYSIS", "")
    if not name:
        return []
    from experiments.scripts.analyses import get_analysis

    chosen = get_analysis(name)
    lines = [chosen.report(results)] if chosen.report is not None else []
    if chosen.figure is not None:
        os.makedirs(out, exist_ok=True)
        path = os.path.join(out, f"{config_name}_analysis.png")
        chosen.figure(results, path)
        lines.append(f"wrote {path}")
    return lines
