"""Plots of a run's metrics (matplotlib, Agg backend): accuracy, loss, weight norms.

``plot_run`` draws one run; ``plot_runs`` overlays several runs of one experiment (e.g. BN vs L1-BN vs
L∞-BN vs GN). Accuracy and loss get one panel for training (smoothed) and one for evaluation, each
zoomed on the range the curves reach after their first quarter (where runs differ), with the run's
settings (:func:`settings_title`) as the figure title. Files are written next to the metrics as PNGs;
the functions return their paths.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

Records = Sequence[Mapping[str, Any]]


def _series(records: Records, split: str, key: str) -> tuple[list[int], list[float]]:
    rows = [r for r in records if r.get("split") == split and isinstance(r.get(key), int | float)]
    return [r["step"] for r in rows], [float(r[key]) for r in rows]


def _smooth(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


_LINESTYLES = ("-", "--", ":", "-.", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)))


def _color(i: int) -> Any:
    return plt.get_cmap("tab10")(i % 10)


_LEGEND_INSIDE = 8  # a longer legend goes to the right of the axes, where it hides no line
_TITLE_WIDTH = 70  # characters per line of a one-panel figure's title at fontsize "small"


def _finish(fig, ax, ylabel: str, path: str, *, log: bool = False, fontsize: str = "small") -> str:
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    handles = ax.get_legend_handles_labels()[0]
    if len(handles) > _LEGEND_INSIDE:
        ax.legend(fontsize=fontsize, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    elif handles:
        ax.legend(fontsize=fontsize)
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight")  # "tight": the canvas takes in a legend outside the axes
    plt.close(fig)
    return path


LENGTH_KEYS = frozenset({"num_epochs", "num_steps"})
"""The config keys that set a run's length (``num_steps`` if positive, else ``num_epochs``)."""


def settings_title(config: Mapping[str, Any], *, varied: str = "") -> str:
    """One line naming a run's settings: model, norm, optimizer, learning rate and schedule, weight
    decay, dataset and batch size, length, precision, seed (those the config has). ``varied``: a
    dotted key that differs between the plotted runs (a sweep's key); it is named instead of its value,
    and a varied length key (:data:`LENGTH_KEYS`) drops the length, whichever of the two sets it."""
    model = config.get("model") or {}
    opt = config.get("optimizer") or {}
    dataset = config.get("dataset") or {}
    steps = config.get("num_steps") or 0
    parts = [
        ("model.name", model.get("name", "")),
        ("model.norm", model.get("norm", "")),
        ("optimizer.name", opt.get("name", "")),
        ("optimizer.learning_rate", f"lr {opt['learning_rate']}" if "learning_rate" in opt else ""),
        ("optimizer.schedule", opt.get("schedule", "")),
        ("optimizer.weight_decay", f"wd {opt['weight_decay']}" if opt.get("weight_decay") else ""),
        ("dataset.name", dataset.get("name", "")),
        ("dataset.batch_size", f"batch {dataset['batch_size']}" if "batch_size" in dataset else ""),
        ("length", f"{steps} steps" if steps else f"{config.get('num_epochs', '')} epochs"),
        ("precision", str(config.get("precision", ""))),
        ("seed", f"seed {config.get('seed', '')}"),
    ]
    hidden = "length" if varied in LENGTH_KEYS else varied
    text = " · ".join(str(value) for key, value in parts if value and key != hidden)
    return f"{text} · runs differ in {varied}" if varied else text


def _zoom(ax, series: list[list[float]]) -> None:
    """Y limits from the values after each curve's first quarter (the early transient would
    otherwise squeeze the part where runs differ into a few pixels)."""
    tails = [v for values in series for v in values[len(values) // 4 :]]
    if len(tails) >= 2:
        lo, hi = min(tails), max(tails)
        pad = 0.08 * (hi - lo) or 0.01 * (abs(hi) or 1.0)
        ax.set_ylim(lo - pad, hi + pad)


def _metric_figure(runs: Mapping[str, Records], key: str, ylabel: str, path: str, title: str) -> str:
    """Two panels, train (smoothed) and eval of ``key``; one color and line style per run."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, split in zip(axes, ("train", "eval"), strict=True):
        drawn = []
        for i, (name, records) in enumerate(runs.items()):
            steps, values = _series(records, split, key)
            if not values:
                continue
            if split == "train":
                values = _smooth(values, max(1, len(values) // 50))
            style = _LINESTYLES[i % len(_LINESTYLES)]
            marker = "o" if split == "eval" and len(values) <= 30 else None
            ax.plot(
                steps,
                values,
                color=_color(i),
                linestyle=style,
                marker=marker,
                markersize=3,
                label=name or split,
            )
            drawn.append(values)
        _zoom(ax, drawn)
        ax.set_title(f"{split} {ylabel}" + (" (smoothed)" if split == "train" else ""), fontsize="medium")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize="small")
    if title:
        fig.suptitle(title, fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


_MAX_LAYERS_NAMED = 6  # beyond this many kernels a run's lines are drawn thin, with one legend entry


def _weight_norm_figure(runs: Mapping[str, Records], path: str, title: str) -> str | None:
    """Mean per-unit weight norm of every kernel: one color per run; one line style and legend entry per
    layer, or, for deep models (more than 6 kernels), thin lines and one legend entry per run."""
    fig, ax = plt.subplots(figsize=(6, 4))
    drawn = False
    for i, (name, records) in enumerate(runs.items()):
        keys = sorted({k for r in records for k in r if k.startswith("wnorm/")})
        named = len(keys) <= _MAX_LAYERS_NAMED
        for j, key in enumerate(keys):
            steps, values = _series(records, "train", key)
            layer = key[len("wnorm/") :].removesuffix("/kernel")
            if named:
                style, label = dict(linestyle=_LINESTYLES[j % len(_LINESTYLES)]), f"{name} {layer}"
            else:
                label = f"{name} ({len(keys)} kernels)" if j == 0 else None
                style = dict(linewidth=0.6, alpha=0.6)
            ax.plot(steps, values, color=_color(i), label=label.strip() if label else None, **style)
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    if title:
        ax.set_title("\n".join(textwrap.wrap(title, _TITLE_WIDTH)), fontsize="small")
    return _finish(fig, ax, "mean per-unit weight norm", path, log=True, fontsize="x-small")


def plot_runs(runs: Mapping[str, Records], out_dir: str, *, title: str = "") -> list[str]:
    """Overlays ``runs`` (name -> metrics records); writes ``accuracy.png``, ``loss.png`` and
    ``weight_norms.png`` (when norms were logged) into ``out_dir``, titled ``title`` (e.g.
    :func:`settings_title`); returns the paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = [
        _metric_figure(runs, "accuracy", "accuracy", os.path.join(out_dir, "accuracy.png"), title),
        _metric_figure(runs, "loss", "cross-entropy loss", os.path.join(out_dir, "loss.png"), title),
    ]
    norms = _weight_norm_figure(runs, os.path.join(out_dir, "weight_norms.png"), title)
    return paths + ([norms] if norms else [])


def plot_run(records: Records, out_dir: str, *, title: str = "") -> list[str]:
    """:func:`plot_runs` for one run."""
    return plot_runs({"": records}, out_dir, title=title)
