"""What identifies a run of a ``resume_grid.py`` sweep, shared by the sweep runner and the analysis.

A JSON line of a sweep records the config name, the variant, the ``--grid`` point, the ``--set`` items
and the seed. Two lines describe the same run when these agree, with the ``--set`` items compared as
values (``lr=0.1`` and ``lr=1e-1`` are one setting, their order is irrelevant) and without the settings
that change how a run is executed but not what it computes (:data:`EXECUTION_SETS`: checkpoint
interval, progress bar, ...). Only this module parses the command line's values, so the runner, the
selection of a hyper-parameter and the analysis agree on them.
"""

from __future__ import annotations

import ast
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

EXECUTION_SETS = (
    "checkpoint_every",
    "max_to_keep",
    "progress",
    "plots",
    "tensorboard",
    "log_every",
    "on_existing",
    "workdir",
    "description",
    "dataset.data_dir",
)
"""``--set`` keys (dotted prefixes) that leave a run's numbers unchanged: the execution keys of
:data:`jaxnorm.train.run_record.EXECUTION_KEYS` except the run's length, which a sweep compares."""


def parse_value(text: str) -> Any:
    """A Python literal if ``text`` is one (``4``, ``1e-3``, ``True``, ``(8, 16)``, ``{'width': 8}``),
    else the string itself."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def split_values(text: str) -> list[str]:
    """``text`` split at its top-level commas: ``"0.1,(1, 2),{'a': 1, 'b': 2}"`` -> three values (commas
    inside brackets, braces, parentheses or quotes do not split)."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def parse_set(item: str) -> tuple[str, Any]:
    """``"key=value"`` -> ``(key, parsed value)``; ``ValueError`` naming the item when it has no key."""
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise ValueError(f"--set expects key=value, got {item!r}")
    return key, parse_value(value)


def is_execution_set(key: str) -> bool:
    """Whether ``--set key=...`` leaves a run's numbers unchanged (:data:`EXECUTION_SETS`)."""
    return any(key == k or key.startswith(k + ".") for k in EXECUTION_SETS)


def result_sets(items: Iterable[str]) -> dict[str, str]:
    """``{key: repr(value)}`` of the ``--set`` items that change what a run computes."""
    out = {}
    for item in items:
        key, value = parse_set(item)
        if not is_execution_set(key):
            out[key] = as_recorded(value)
    return out


def read_records(path: str) -> list[dict[str, Any]]:
    """The JSON lines of ``path``, one record each (blank lines skipped); ``ValueError`` naming the file
    and line for one that is no JSON (cut short by a kill while it was appended, or still being
    written by a running sweep): json's own error named neither."""
    records = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(
                    f"{path} line {number} is no JSON record ({e}); remove or repair it: {line[:80]!r}"
                ) from None
    return records


def as_recorded(value: Any) -> str:
    """``value`` as a JSON line holds it, as a string: a tuple and the list it is recorded as compare
    equal (``('a',)`` on the command line, ``["a"]`` in the file)."""
    return repr(json.loads(json.dumps(value, default=float)))


_NON_FINITE = ("nan", "inf", "-inf")  # how a run's summary records a non-finite number (metrics._jsonable)


def diverged(run: Mapping[str, Any]) -> bool:
    """Whether a finished run diverged: its ``eval_accuracy``, ``train_loss`` or ``eval_loss`` is not
    a finite number (NaN or inf, or their strings). Runs recorded before the loop scored a NaN model as
    NaN hold the share of class 0 as ``eval_accuracy`` (``argmax`` of NaN logits is class 0), so the
    losses decide too."""
    for key in ("eval_accuracy", "train_loss", "eval_loss"):
        value = run.get(key)
        if isinstance(value, str) and value in _NON_FINITE:
            return True
        if isinstance(value, int | float) and not isinstance(value, bool) and not math.isfinite(value):
            return True
    return False


def run_identity(record: Mapping[str, Any]) -> tuple:
    """What makes two JSON lines the same run: config, variant, grid point (values :func:`as_recorded`),
    result ``--set`` items (:func:`result_sets`) and seed (a field a line lacks counts as empty)."""
    grid = tuple(sorted((k, as_recorded(v)) for k, v in record.get("grid", {}).items()))
    sets = tuple(sorted(result_sets(record.get("sets", ())).items()))
    return record.get("config", ""), record["variant"], grid, sets, record.get("seed")


def check_no_repeated_runs(runs: Sequence[Mapping[str, Any]], where: str) -> None:
    """``ValueError`` naming ``where`` when two of ``runs`` are the same run (:func:`run_identity`): a
    sweep rerun that appended a finished run again would count its seed twice."""
    seen: set[tuple] = set()
    for run in runs:
        identity = run_identity(run)
        if identity in seen:
            raise ValueError(
                f"{where}: the run {run['variant']!r} seed {run.get('seed')} at {run.get('grid', {})} is "
                "recorded more than once; remove the repeated line so that its seed counts once"
            )
        seen.add(identity)
