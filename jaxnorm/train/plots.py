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


def _metric_figure(runs: Mapping[str, Records], key: str, ylabel: str, path: str) -> str:
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, records in runs.items():
        steps, values = _series(records, "train", key)
        if values:
            window = max(1, len(values) // 50)
            ax.plot(steps, _smooth(values, window), alpha=0.8, label=f"{name} train".strip())
        steps, values = _series(records, "eval", key)
        if values:
            ax.plot(steps, values, "o-", label=f"{name} eval".strip())
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _weight_norm_figure(runs: Mapping[str, Records], path: str) -> str | None:
    fig, ax = plt.subplots(figsize=(6, 4))
    drawn = False
    for name, records in runs.items():
        keys = sorted({k for r in records for k in r if k.startswith("wnorm/")})
        for key in keys:
            steps, values = _series(records, "train", key)
            label = f"{name} {key[len('wnorm/') :]}".strip()
            ax.plot(steps, values, label=label)
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("step")
    ax.set_ylabel("mean per-unit weight norm")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


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
