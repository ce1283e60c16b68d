"""Metrics: a JSONL stream (one record per line, written as it comes), optional TensorBoard, tqdm,
and per-layer weight-norm / effective-learning-rate summaries.

Effective learning rate: for a scale-invariant weight w (followed by BN), SGD with learning rate eta
moves the direction w / ||w|| as SGD with eta / ||w||^2 would on the unit sphere (van Laarhoven 2017,
Eq. 8; Hoffer et al. 2018, "Norm matters", Sec. 3). Per layer we report the mean per-unit norm and
``lr / mean(||w_u||^2)`` over that layer's output units u.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import traverse_util

PyTree = Any


def layer_unit_norms(params: PyTree) -> dict[str, tuple[jax.Array, jax.Array]]:
    """Per kernel (every leaf with ``ndim >= 2``): ``(mean ||w_u||, mean ||w_u||^2)`` over units u.

    A unit is one index of the last axis (Dense ``(in, out)``, Conv HWIO); its norm is over all other
    axes. Keys are the ``/``-joined parameter paths.
    """
    out = {}
    for path, w in traverse_util.flatten_dict(params).items():
        if w.ndim < 2:
            continue
        sq = jnp.sum(jnp.square(w.astype(jnp.float32)).reshape(-1, w.shape[-1]), axis=0)
        out["/".join(map(str, path))] = (jnp.sqrt(sq).mean(), sq.mean())
    return out


_layer_unit_norms = jax.jit(layer_unit_norms)


def weight_norm_metrics(params: PyTree, lr: float) -> dict[str, float]:
    """``{"wnorm/<layer>": mean unit norm, "eff_lr/<layer>": lr / mean unit norm^2}`` as floats."""
    norms = jax.device_get(_layer_unit_norms(params))
    out = {}
    for name, (mean_norm, mean_sq) in norms.items():
        out[f"wnorm/{name}"] = float(mean_norm)
        out[f"eff_lr/{name}"] = float(lr / mean_sq) if mean_sq > 0 else math.inf
    return out


def _jsonable(value: Any) -> Any:
    value = value.item() if hasattr(value, "item") else value
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class MetricsWriter:
    """Appends ``{"step": s, "split": ..., **metrics}`` records to ``path`` (JSON lines).

    Args:
      path: the ``.jsonl`` file; its directory is created.
      tensorboard_dir: if set, scalars also go to TensorBoard (needs ``tensorflow``).
      resume_step: when resuming, records with ``step > resume_step`` (written after the checkpoint
        that is being resumed) are dropped so the file reads as one uninterrupted run.
      enabled: ``False`` on non-primary processes of a multi-host run (nothing written).

    Attributes:
      previous: on resume, the records kept from before the checkpoint.
    """

    def __init__(
        self,
        path: str,
        *,
        tensorboard_dir: str | None = None,
        resume_step: int | None = None,
        enabled: bool = True,
    ):
        self.path = path
        self.enabled = enabled
        self.previous: list[dict[str, Any]] = []
        self._tb = None
        if not enabled:
            return
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        if resume_step is None:
            open(path, "w").close()
        elif os.path.exists(path):
            self.previous = [r for r in read_jsonl(path) if r.get("step", 0) <= resume_step]
            with open(path, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in self.previous)
        self._file = open(path, "a")
        if tensorboard_dir:
            try:
                import tensorflow as tf
            except ImportError as e:
                raise ImportError("tensorboard logging needs tensorflow (pip install tensorflow-cpu)") from e
            self._tf = tf
            self._tb = tf.summary.create_file_writer(tensorboard_dir)
            # The metadata TensorBoard's scalars plugin reads; written directly so that the
            # `tensorboard` package itself is not needed to log.
            self._tb_metadata = tf.compat.v1.SummaryMetadata(
                plugin_data=tf.compat.v1.SummaryMetadata.PluginData(plugin_name="scalars")
            )

    def write(self, step: int, metrics: Mapping[str, Any], *, split: str = "train") -> None:
        """Writes one record now (flushed, so a killed run keeps everything written so far)."""
        if not self.enabled:
            return
        record = {"step": int(step), "split": split}
        record.update({k: _jsonable(v) for k, v in metrics.items()})
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None:
            with self._tb.as_default():
                for k, v in record.items():
                    if k not in ("step", "split") and isinstance(v, int | float):
                        self._tf.summary.write(
                            f"{split}/{k}",
                            self._tf.constant(v, self._tf.float32),
                            step=int(step),
                            metadata=self._tb_metadata,
                        )
            self._tb.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        self._file.close()
        if self._tb is not None:
            self._tb.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_jsonl(path: str) -> list[dict[str, Any]]:
    """All records of a metrics file (a truncated last line, from a kill, is skipped)."""
    records = []
    with open(path) as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


def progress_bar(*, total: int, initial: int, enabled: bool) -> Any:
    """A tqdm bar over ``total`` steps starting at ``initial`` (``None`` when disabled)."""
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, dynamic_ncols=True, leave=False, unit="step")
