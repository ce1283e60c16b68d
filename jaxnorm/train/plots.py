"""Plots of a run's metrics (matplotlib, Agg backend): accuracy, loss, weight norms.

``plot_run`` draws one run; ``plot_runs`` overlays several runs of one experiment (e.g. BN vs L1-BN vs
L∞-BN vs GN). Files are written next to the metrics as PNGs; the functions return their paths.
"""

from __future__ import annotations

import os
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


def _finish(fig, ax, ylabel: str, path: str, *, log: bool = False, fontsize: str = "small") -> str:
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=fontsize)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _metric_figure(runs: Mapping[str, Records], key: str, ylabel: str, path: str) -> str:
    """Train (smoothed line) and eval (markers) of ``key``, one color per run."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (name, records) in enumerate(runs.items()):
        steps, values = _series(records, "train", key)
        if values:
            window = max(1, len(values) // 50)
            ax.plot(steps, _smooth(values, window), color=_color(i), alpha=0.6, label=f"{name} train".strip())
        steps, values = _series(records, "eval", key)
        if values:
            ax.plot(steps, values, "o--", color=_color(i), label=f"{name} eval".strip())
    return _finish(fig, ax, ylabel, path)


def _weight_norm_figure(runs: Mapping[str, Records], path: str) -> str | None:
    """Mean per-unit weight norm of every kernel: one color per run, one line style per layer."""
    fig, ax = plt.subplots(figsize=(6, 4))
    drawn = False
    for i, (name, records) in enumerate(runs.items()):
        keys = sorted({k for r in records for k in r if k.startswith("wnorm/")})
        for j, key in enumerate(keys):
            steps, values = _series(records, "train", key)
            layer = key[len("wnorm/") :].removesuffix("/kernel")
            ax.plot(
                steps,
                values,
                color=_color(i),
                linestyle=_LINESTYLES[j % len(_LINESTYLES)],
                label=f"{name} {layer}".strip(),
            )
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    return _finish(fig, ax, "mean per-unit weight norm", path, log=True, fontsize="x-small")


def plot_runs(runs: Mapping[str, Records], out_dir: str) -> list[str]:
    """Overlays ``runs`` (name -> metrics records); writes ``accuracy.png``, ``loss.png`` and
    ``weight_norms.png`` (when norms were logged) into ``out_dir``; returns the paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = [
        _metric_figure(runs, "accuracy", "accuracy", os.path.join(out_dir, "accuracy.png")),
        _metric_figure(runs, "loss", "cross-entropy loss", os.path.join(out_dir, "loss.png")),
    ]
    norms = _weight_norm_figure(runs, os.path.join(out_dir, "weight_norms.png"))
    return paths + ([norms] if norms else [])


def plot_run(records: Records, out_dir: str) -> list[str]:
    """:func:`plot_runs` for one run."""
    return plot_runs({"": records}, out_dir)
