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
import shutil
import socket
import sys
import time
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


def layer_angular_updates(params: PyTree, new_params: PyTree) -> dict[str, jax.Array]:
    """``{"angle/<layer>": mean over units of the angle (radians) each unit turned}`` for every kernel
    (``ndim >= 2``), between ``params`` and ``new_params`` (:func:`jaxnorm.diagnostics.angular_update`);
    jit-able, so the train step computes it on device."""
    from jaxnorm.diagnostics import angular_update

    angles = angular_update(params, new_params)
    flat = traverse_util.flatten_dict(angles) if isinstance(angles, dict) else {}
    return {"angle/" + "/".join(map(str, path)): a.mean() for path, a in flat.items() if a is not None}


def equilibrium_angle(optimizer: Mapping[str, Any], lr: float) -> float | None:
    """The rotational-equilibrium angle per step (:func:`jaxnorm.diagnostics.equilibrium_angular_update`)
    for the loop's ``optimizer`` block at learning rate ``lr``: SGD / heavy-ball momentum with L2
    weight decay, AdamW with decoupled decay; ``None`` for other optimizers or without weight decay."""
    from jaxnorm.diagnostics import equilibrium_angular_update

    name, wd = optimizer.get("name", "momentum"), float(optimizer.get("weight_decay", 0.0) or 0.0)
    if wd <= 0 or name not in ("sgd", "momentum", "adamw"):
        return None
    if name == "adamw":
        return equilibrium_angular_update(lr, wd, momentum=float(optimizer.get("b1", 0.9)), optimizer="adamw")
    beta = float(optimizer.get("momentum", 0.9)) if name == "momentum" else 0.0
    return equilibrium_angular_update(lr, wd, momentum=beta)


def _effective_lr(lr: float, mean_sq: float) -> float:
    """``lr / mean_sq``: NaN for a NaN norm (a diverged layer; it read as inf), inf for a zero layer at
    ``lr > 0``, NaN at ``lr = 0`` (0 / 0)."""
    if mean_sq > 0 or math.isnan(mean_sq):
        return lr / mean_sq
    return math.inf if lr > 0 else math.nan


def weight_norm_metrics(params: PyTree, lr: float) -> dict[str, float]:
    """``{"wnorm/<layer>": mean unit norm, "eff_lr/<layer>": lr / mean unit norm^2}`` as floats."""
    norms = jax.device_get(_layer_unit_norms(params))
    out = {}
    for name, (mean_norm, mean_sq) in norms.items():
        out[f"wnorm/{name}"] = float(mean_norm)
        out[f"eff_lr/{name}"] = _effective_lr(lr, float(mean_sq))
    return out


def _jsonable(value: Any) -> Any:
    value = value.item() if hasattr(value, "item") else value
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class _EventFile:
    """A TensorBoard event file written record by record: one ``Event`` protocol buffer per metrics
    record, its numbers as ``<split>/<name>`` scalars, appended with TensorFlow's TFRecord writer.

    Building the protos in Python costs microseconds per record; ``tf.summary.write`` costs an eager
    TensorFlow op per scalar, which on a small model is a large fraction of the step. Everything
    written before a resume is rewritten from the JSONL records kept, so the directory never holds a
    step twice (TensorBoard shows every event file of a directory as one run).
    """

    def __init__(self, directory: str):
        try:
            import tensorflow as tf
        except ImportError as e:
            raise ImportError("tensorboard logging needs tensorflow (pip install tensorflow-cpu)") from e
        self._tf = tf
        shutil.rmtree(directory, ignore_errors=True)
        os.makedirs(directory)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.jaxnorm"
        self._writer = tf.io.TFRecordWriter(os.path.join(directory, name))
        self._append(tf.compat.v1.Event(wall_time=time.time(), file_version="brain.Event:2"))
        self._unflushed = 0

    def _append(self, event: Any) -> None:
        self._writer.write(event.SerializeToString())

    def write(self, record: Mapping[str, Any]) -> None:
        summary = self._tf.compat.v1.Summary
        values = [
            summary.Value(tag=f"{record['split']}/{k}", simple_value=float(v))
            for k, v in record.items()
            if k not in ("step", "split", "wall_time") and isinstance(v, int | float)
        ]
        event = self._tf.compat.v1.Event(
            wall_time=record.get("wall_time", time.time()),
            step=int(record["step"]),
            summary=summary(value=values),
        )
        self._append(event)
        self._unflushed += 1
        if self._unflushed >= 100 or record["split"] != "train":
            self.flush()

    def flush(self) -> None:
        self._writer.flush()
        self._unflushed = 0

    def close(self) -> None:
        self._writer.close()


class MetricsWriter:
    """Appends ``{"step": s, "split": ..., **metrics}`` records to ``path`` (JSON lines).

    Every record carries ``wall_time`` (Unix seconds when it was written).

    Args:
      path: the ``.jsonl`` file; its directory is created.
      tensorboard_dir: if set, scalars also go to TensorBoard (needs ``tensorflow``; viewing them
        needs the ``tensorboard`` package).
      resume_step: when resuming, records with ``step > resume_step`` (written after the checkpoint
        that is being resumed) are dropped so the file reads as one uninterrupted run; the
        TensorBoard directory is rewritten from the kept records, so it never holds a step twice.
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
            self._tb = _EventFile(tensorboard_dir)
            for record in self.previous:
                self._tb.write(record)

    def write(self, step: int, metrics: Mapping[str, Any], *, split: str = "train") -> dict[str, Any]:
        """Writes one record now (the JSONL file is flushed, so a killed run keeps everything
        written so far); returns the record."""
        record = {"step": int(step), "split": split, "wall_time": round(time.time(), 3)}
        record.update({k: _jsonable(v) for k, v in metrics.items()})
        if not self.enabled:
            return record
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None:
            self._tb.write(record)
        return record

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


def progress_bar(*, total: int, initial: int, enabled: bool, stream: Any = None) -> Any:
    """A tqdm bar over ``total`` steps starting at ``initial`` on ``stream`` (default stderr);
    ``None`` when disabled.

    On a terminal the bar redraws in place; when ``stream`` is not a terminal (a log file, a batch
    job's output) a carriage-return bar would fill the log with partial lines, so a
    :class:`LogProgress` prints one plain line at most every minute instead.
    """
    if not enabled:
        return None
    stream = sys.stderr if stream is None else stream
    if not (hasattr(stream, "isatty") and stream.isatty()):
        return LogProgress(total=total, initial=initial, stream=stream)
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, file=stream, dynamic_ncols=True, leave=False, unit="step")


class LogProgress:
    """Progress for logs: ``step s/total (p%) <postfix>`` lines, at most one per ``interval``
    seconds and one at the end; the subset of tqdm's interface the loop uses."""

    def __init__(self, *, total: int, initial: int, stream: Any, interval: float = 60.0):
        self.total, self.n, self.stream, self.interval = total, initial, stream, interval
        self._postfix = ""
        self._last = time.monotonic()

    def set_postfix(self, refresh: bool = True, **values: Any) -> None:
        self._postfix = " ".join(f"{k}={v}" for k, v in values.items())

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.monotonic() - self._last >= self.interval:
            self._print()

    def _print(self) -> None:
        self._last = time.monotonic()
        pct = 100.0 * self.n / max(self.total, 1)
        self.stream.write(f"step {self.n}/{self.total} ({pct:.0f}%) {self._postfix}".rstrip() + "\n")
        self.stream.flush()

    def close(self) -> None:
        self._print()
