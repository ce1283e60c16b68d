"""Checks of an experiment config that run before any data is loaded, with one-line messages.

Every message names the offending key as ``config.<dotted.key>`` and, for an unknown key, suggests
the closest valid one among *all* dotted keys of the config (``batch_size`` -> ``dataset.batch_size``),
not only the siblings. :func:`check_run` holds the checks of one run of a sweep that need no data:
the experiment runner calls it (through ``validate``) for every run before the first one trains.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from jaxnorm.functional.checks import is_int, is_real
from jaxnorm.train.sharding import MODES

MODEL_KWARGS = "model.kwargs"
"""Where a run's model options live; ``--config.model.<option>`` is a shorthand for it."""


def _is_node(value: Any) -> bool:
    """A nested part of a config: a mapping or a ``ConfigDict`` (which is not a ``Mapping``)."""
    return isinstance(value, Mapping) or (hasattr(value, "items") and hasattr(value, "unlocked"))


def dotted_items(config: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(dotted key, value)`` for every leaf of ``config`` (nested mappings are walked), in order."""
    for key, value in config.items():
        path = f"{prefix}{key}"
        if _is_node(value) and len(value):
            yield from dotted_items(value, path + ".")
        else:
            yield path, value


def dotted_keys(config: Mapping[str, Any]) -> list[str]:
    """Every dotted key of ``config``: its leaves and the nodes above them."""
    keys = []
    for path, _ in dotted_items(config):
        parts = path.split(".")
        keys.extend(".".join(parts[: i + 1]) for i in range(len(parts)))
    return list(dict.fromkeys(keys))


def closest(key: str, candidates: Sequence[str]) -> list[str]:
    """The candidates ``key`` most likely meant: the whole key compared first, then its last part
    against each candidate's last part (so a key given at the wrong level is still found)."""
    leaf = key.rsplit(".", 1)[-1]
    same_leaf = [c for c in candidates if c.rsplit(".", 1)[-1] == leaf]
    if same_leaf:
        return same_leaf
    whole = difflib.get_close_matches(key, candidates, n=1, cutoff=0.75)
    if whole:
        return whole
    leaves = {c.rsplit(".", 1)[-1]: c for c in candidates}
    near = difflib.get_close_matches(leaf, list(leaves), n=1, cutoff=0.7)
    return [c for c in candidates if c.rsplit(".", 1)[-1] in near]


def suggestion(key: str, candidates: Sequence[str]) -> str:
    """``"; did you mean config.a.b?"`` (or ``" or "``-joined choices), or ``""`` if nothing is close."""
    matches = closest(key, candidates)
    if not matches:
        return ""
    return "; did you mean " + " or ".join(f"config.{m}" for m in matches) + "?"


def lookup(config: Mapping[str, Any], key: str) -> Any:
    """The value at dotted ``key``; ``KeyError`` (one line, with a suggestion) if there is none."""
    node: Any = config
    for i, part in enumerate(key.split(".")):
        if not _is_node(node) or part not in node:
            missing = ".".join(key.split(".")[: i + 1])
            raise KeyError(f"the config has no key config.{missing}{suggestion(key, dotted_keys(config))}")
        node = node[part]
    return node


def model_option_names(model_name: str) -> tuple[str, ...]:
    """Every keyword option model ``model_name`` accepts in ``config.model.kwargs`` (its own options
    and the normalization options), sorted; ``ValueError`` for an unknown model."""
    from jaxnorm import models

    return tuple(sorted({*models.model_options(model_name), *models.NORM_OPTIONS}))


def settable_keys(config: Mapping[str, Any], model_name: str | None = None) -> list[str]:
    """Every dotted key of ``config`` plus ``model.kwargs.<option>`` for each option of the model
    (``model_name``, default ``config.model.name``; none for an unknown model): the keys an override
    or a sweep may set."""
    keys = dotted_keys(config)
    if "model" not in config:
        return keys
    try:
        options = model_option_names(model_name or config.model.name)
    except ValueError:
        return keys
    return list(dict.fromkeys(keys + [f"{MODEL_KWARGS}.{o}" for o in options]))


def check_model_options(config: Mapping[str, Any]) -> None:
    """Raises ``ValueError`` naming ``config.model.kwargs.<option>`` for an option the model does
    not take, with the closest valid option."""
    from jaxnorm import models

    name = config.model.name
    if name not in models.names():
        raise ValueError(
            f"config.model.name must be one of {list(models.names())}, got {name!r}"
            f"{suggestion_for_choice(name, models.names(), 'model.name')}"
        )
    if config.model.norm not in models.NORMS:
        raise ValueError(
            f"config.model.norm must be one of {list(models.NORMS)}, got {config.model.norm!r}"
            f"{suggestion_for_choice(config.model.norm, models.NORMS, 'model.norm')}"
        )
    valid = model_option_names(name)
    for option, value in dict(config.model.get("kwargs", {}) or {}).items():
        _check_norm_option_type(option, value)
        if option not in valid:
            near = difflib.get_close_matches(option, valid, n=1, cutoff=0.6)
            hint = f"; did you mean config.{MODEL_KWARGS}.{near[0]}?" if near else ""
            raise ValueError(
                f"config.{MODEL_KWARGS}.{option}: model {name!r} has no option {option!r}{hint} "
                f"(valid: {', '.join(valid)})"
            )


def _check_norm_option_type(option: str, value: Any) -> None:
    """Raises unless ``value`` has the type of the normalization option's default (an int passes for
    a float); options whose default is ``None`` or a callable are not checked here."""
    import inspect

    from jaxnorm import models

    parameter = inspect.signature(models.norm_layers).parameters.get(option)
    if parameter is None or option == "norm" or parameter.default is None:
        return
    expected = type(parameter.default)
    if expected not in (int, float, str, bool):
        return
    ok = isinstance(value, expected) and not (expected is not bool and isinstance(value, bool))
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if not ok:
        raise ValueError(
            f"config.{MODEL_KWARGS}.{option} must be a {expected.__name__} (default "
            f"{parameter.default!r}), got {value!r}"
        )


def suggestion_for_choice(value: Any, choices: Sequence[str], key: str) -> str:
    """``"; did you mean config.<key>='<closest choice>'?"``, or ``""`` if no choice is close."""
    near = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1, cutoff=0.6)
    return f"; did you mean config.{key}={near[0]!r}?" if near else ""


_SLICE = re.compile(r"^(\w+)\[(-?\d*)(%?):(-?\d*)(%?)\]$")


def split_size(dataset: str, split: str) -> int | None:
    """Examples in ``split`` of ``dataset`` from the catalog alone (no data read): plain splits,
    ``validation`` / ``train_minus_validation`` and ``[a:b]`` slices (counts or percents);
    ``None`` where it cannot tell (other TFDS split syntax)."""
    from jaxnorm.data import catalog

    spec = catalog.spec(dataset)
    info = spec.info
    sizes = {info.train_split: info.num_train_examples, info.eval_split: info.num_eval_examples}
    if spec.num_validation:
        sizes["validation"] = spec.num_validation
        sizes["train_minus_validation"] = info.num_train_examples - spec.num_validation
    if split in sizes:
        return sizes[split]
    match = _SLICE.match(split.replace(" ", ""))
    if not match or match.group(1) not in sizes:
        return None
    n = sizes[match.group(1)]

    def bound(text: str, percent: str, default: int) -> int:
        if not text:
            return default
        value = int(text) * n // 100 if percent else int(text)
        return max(0, min(n, value + n if value < 0 else value))

    start, stop = bound(match.group(2), match.group(3), 0), bound(match.group(4), match.group(5), n)
    return max(0, stop - start)


def planned_steps(config: Mapping[str, Any]) -> int | None:
    """The run length in steps as the loop will compute it (``num_steps``, or ``num_epochs`` times
    the steps per epoch of the train split); ``None`` where the split's size is unknown here."""
    steps = int(config.get("num_steps", 0) or 0)
    if steps > 0:
        return steps
    examples = split_size(config.dataset.name, config.dataset.train_split)
    if examples is None:
        return None
    per_epoch = examples // int(config.dataset.batch_size)
    return round(float(config.get("num_epochs", 1.0)) * per_epoch)


def check_batch_sizes(config: Mapping[str, Any], num_devices: int, num_processes: int) -> None:
    """Raises unless both batch sizes are positive and split evenly over devices and processes, and
    the train batch fits in the train split."""
    ds = config.dataset
    for key in ("batch_size", "eval_batch_size"):
        size = ds[key]
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"config.dataset.{key} must be a positive int, got {size!r}")
        for count, what in ((num_devices, "devices"), (num_processes, "processes")):
            if size % count:
                raise ValueError(
                    f"config.dataset.{key}={size} must be divisible by the number of {what} ({count}); "
                    f"e.g. --config.dataset.{key}={max(count, size - size % count)}"
                )
    examples = split_size(ds.name, ds.train_split)
    if examples is not None and ds.batch_size > examples:
        raise ValueError(
            f"config.dataset.batch_size={ds.batch_size} exceeds the {examples} examples of "
            f"config.dataset.train_split={ds.train_split!r}"
        )


def check_run_length(config: Mapping[str, Any]) -> int | None:
    """Raises unless the run has steps and :func:`check_accumulation` accepts them; returns the run
    length in steps (``None`` if it is only known once the data is read)."""
    steps = planned_steps(config)
    if steps is not None and steps < 1:
        raise ValueError(
            f"the run has no steps: config.num_steps={config.get('num_steps', 0)}, "
            f"config.num_epochs={config.get('num_epochs', 1.0)}; set either one higher"
        )
    check_accumulation(config.optimizer, steps)
    return steps


def check_accumulation(optimizer: Mapping[str, Any], steps: int | None) -> None:
    """Raises unless ``optimizer.accumulate_steps`` is an int >= 1 that divides the run's ``steps``
    (else the last micro-steps are accumulated and never applied; a run shorter than one update
    trains nothing) and ``optimizer.warmup_steps`` is shorter than the run's updates (steps /
    accumulate_steps, what the schedule counts). ``steps=None``: the run length is not known yet."""
    accumulate = optimizer.get("accumulate_steps", 1)
    if isinstance(accumulate, bool) or not isinstance(accumulate, int | np.integer) or accumulate < 1:
        raise ValueError(f"config.optimizer.accumulate_steps must be an int >= 1, got {accumulate!r}")
    if steps is None:
        return
    if steps % accumulate:
        raise ValueError(
            f"the run's {steps} steps are not a multiple of config.optimizer.accumulate_steps={accumulate}: "
            f"the last {steps % accumulate} micro-steps would be accumulated and never applied"
        )
    updates = steps // int(accumulate)
    warmup = int(optimizer.get("warmup_steps", 0) or 0)
    if not 0 <= warmup < updates:
        counted = f"{updates} updates" + (f" of {accumulate} micro-steps" if accumulate > 1 else " steps")
        raise ValueError(
            f"config.optimizer.warmup_steps={warmup} must be in [0, {updates}) (the run has {counted})"
        )


def check_init_examples(count: Any, limit: int | None = None) -> None:
    """Raises ``ValueError`` naming ``config.init_examples`` unless it is an int >= 1 (and at most
    ``limit``, the examples of one epoch, where known)."""
    ok = not isinstance(count, bool) and isinstance(count, int | np.integer) and count >= 1
    if not ok or (limit is not None and count > limit):
        bound = f"[1, {limit}] (the examples of one epoch)" if limit is not None else ">= 1"
        raise ValueError(f"config.init_examples must be an int in {bound}, got {count!r}")


def check_hooks(config: Mapping[str, Any]) -> None:
    """Checks the loop's hooks before any data is read, each error naming its key:
    ``init_examples`` (an int >= 1, at most the train split's size), ``implicit_enorm`` (its keys
    and values; not combined with optimizer wrappers, which would rescale or project the params
    under the log-scales, nor with weight decay on ``all`` params, which would decay them), and the
    ``enorm`` wrapper's ``c`` and ``start``, the ``teleportation`` wrapper's kwargs and its place
    (the last wrapper)."""
    from jaxnorm.train.optimizers import check_enorm_c, check_teleportation_kwargs, check_teleportation_last
    from jaxnorm.train.params_hooks import check_implicit_enorm, implicit_enorm_enabled

    limit = None
    if "dataset" in config:
        limit = split_size(config.dataset.name, config.dataset.train_split)
    check_init_examples(config.get("init_examples", 1), limit)
    block = config.get("implicit_enorm", None)
    check_implicit_enorm(block)
    optimizer = config.get("optimizer", {}) or {}
    wrappers = tuple(optimizer.get("wrappers", ()) or ())
    if implicit_enorm_enabled(block):
        if wrappers:
            raise ValueError(
                f"config.implicit_enorm.weight > 0 with config.optimizer.wrappers={wrappers}: implicit "
                "ENorm trains its log-scales by gradient; use it without optimizer wrappers"
            )
        if (
            float(optimizer.get("weight_decay", 0.0) or 0.0) > 0
            and optimizer.get("weight_decay_mask") == "all"
        ):
            raise ValueError(
                "config.optimizer.weight_decay_mask='all' with config.implicit_enorm.weight > 0 would decay "
                "the log-scales too; use 'kernels' (or weight_decay=0: the penalty is the decay)"
            )
    if "enorm" in wrappers:
        kwargs = dict((dict(optimizer.get("wrapper_kwargs", {}) or {})).get("enorm", {}) or {})
        check_enorm_c(kwargs.get("c", 1.0))
        start = kwargs.get("start", 0)
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise ValueError(
                f"config.optimizer.wrapper_kwargs.enorm.start must be an int >= 0, got {start!r}"
            )
    if "teleportation" in wrappers:
        check_teleportation_last(wrappers)
        check_teleportation_kwargs(
            dict((dict(optimizer.get("wrapper_kwargs", {}) or {})).get("teleportation", {}) or {})
        )


OPTIMIZER_OPTIONS: dict[str, tuple[str, ...]] = {
    "delta": ("adamp", "sgdp"),
    "wd_ratio": ("adamp", "sgdp"),
    "nesterov": ("adamp", "sgdp"),
    "projection_mask": ("adamp", "sgdp"),
    "target_norm": ("adamwn",),
    "per_unit": ("adamwn",),
}
"""Options of the ``optimizer`` block that only some optimizers read: option -> those ``name`` values
(AdamP / SGDP: Heo et al. 2021; AdamWN: Loshchilov 2023). Set for another optimizer they would be
ignored silently, so :func:`check_optimizer_options` refuses them."""


OPTIMIZER_KEYS = (
    "name", "learning_rate", "momentum", "b1", "b2", "eps",
    "schedule", "warmup_steps", "boundaries", "decay_factor", "end_value",
    "weight_decay", "weight_decay_mask", "grad_clip_norm", "accumulate_steps", "transport_batch_stats",
    "wrappers", "wrapper_kwargs", *OPTIMIZER_OPTIONS,
)  # fmt: skip
"""Every key the ``optimizer`` block may hold (``jaxnorm.train.optimizers``' module docstring)."""
EXPERIMENT_KEYS = ("description", "workdir", "model", "dataset", "sweep", "distributed", "quick",
                   "quick_steps", "quick_examples")  # fmt: skip
"""The top-level keys an experiment config adds to the loop's (``experiment_defaults``); ``train``
accepts them in its config and leaves them to the experiment runner."""


def python_scalars(config: Any) -> Any:
    """``config`` with every NumPy scalar (``np.int64(100)``, ``np.float32(0.1)``, e.g. from
    ``np.logspace``) replaced by its Python value, nested mappings, lists and tuples walked: a
    ``ConfigDict`` refuses to override an ``int`` with ``np.int64`` or a ``float`` with ``np.float32``."""
    if isinstance(config, np.generic):
        return config.item()
    if _is_node(config):
        return {key: python_scalars(value) for key, value in config.items()}
    if type(config) in (list, tuple):  # a NamedTuple (an ENorm spec's junctions) is left as it is
        return type(config)(python_scalars(value) for value in config)
    return config


def check_known_keys(config: Mapping[str, Any], loop_defaults: Mapping[str, Any]) -> None:
    """Raises ``ValueError`` naming ``config.<key>`` for a key neither the loop (``loop_defaults``, its
    own keys and those of its ``implicit_enorm`` block), the ``optimizer`` block (:data:`OPTIMIZER_KEYS`)
    nor an experiment (:data:`EXPERIMENT_KEYS`) reads: the command line refuses such a key, and from
    Python a misspelt one (``learning_rat``) used to be ignored, so the run trained with the default."""
    known = {
        "": (*loop_defaults, *EXPERIMENT_KEYS),
        "optimizer.": OPTIMIZER_KEYS,
        "implicit_enorm.": tuple(loop_defaults["implicit_enorm"]),
    }
    candidates = [prefix + key for prefix, keys in known.items() for key in keys]
    for prefix, keys in known.items():
        block = config.get(prefix[:-1]) or {} if prefix else config
        if not _is_node(block):
            raise ValueError(f"config.{prefix[:-1]} must be a mapping, got {block!r}")
        for key in block.keys():
            if key not in keys:
                raise ValueError(
                    f"config.{prefix}{key} is not a key of the training loop's config"
                    + (suggestion(prefix + key, candidates) or f"; the keys are {sorted(keys)}")
                )


def check_optimizer_options(optimizer: Mapping[str, Any]) -> None:
    """Raises ``ValueError`` naming ``config.optimizer.<option>`` for an option that the chosen
    optimizer does not read (:data:`OPTIMIZER_OPTIONS`), or whose value has the wrong type."""
    name = optimizer.get("name", "momentum")
    for option, readers in OPTIMIZER_OPTIONS.items():
        if option not in optimizer:
            continue
        if name not in readers:
            raise ValueError(
                f"config.optimizer.{option} is read only by optimizer.name in {readers}, got name {name!r}; "
                "remove it or change the optimizer"
            )
        value = optimizer[option]
        if option in ("nesterov", "per_unit") and not isinstance(value, bool):
            raise ValueError(f"config.optimizer.{option} must be a bool, got {value!r}")
        if option in ("delta", "wd_ratio", "target_norm") and (
            isinstance(value, bool) or not isinstance(value, int | float)
        ):
            raise ValueError(f"config.optimizer.{option} must be a number, got {value!r}")
        if option == "projection_mask" and not isinstance(value, str):
            raise ValueError(f"config.optimizer.{option} must be a mask name (a str), got {value!r}")


def check_loop_settings(config: Mapping[str, Any]) -> None:
    """Raises ``ValueError`` naming ``config.<key>`` for a loop setting or optimizer number out of range:
    each of these was accepted and changed the run without a word (a negative ``num_steps`` fell back
    to ``num_epochs``, ``max_to_keep=0`` kept no checkpoint, so a preempted run restarted from step 0, a
    negative learning rate ran gradient ascent, a negative ``grad_clip_norm`` turned clipping off) or
    failed inside the loop (``log_every=0``)."""
    minimum = {"num_steps": 0, "seed": 0, "eval_every": 0, "checkpoint_every": 0, "log_every": 1,
               "max_to_keep": 1}
    if "quick_steps" in config:  # an experiment's quick mode: 0 steps would fall back to num_epochs
        minimum.update(quick_steps=1, quick_examples=4)  # 4: batches of 2, which BatchNorm needs
    for key, low in minimum.items():
        value = config.get(key, low)
        if not is_int(value) or value < low:
            raise ValueError(f"config.{key} must be an int >= {low}, got {value!r}")
    if config.get("parallel", "jit") not in MODES:  # a value the loop would not read
        raise ValueError(f"config.parallel must be 'jit' or 'pmap', got {config.get('parallel')!r}")
    epochs = config.get("num_epochs", 1.0)
    if not is_real(epochs) or not np.isfinite(epochs) or epochs < 0:
        raise ValueError(f"config.num_epochs must be a finite number >= 0, got {epochs!r}")
    optimizer = config.get("optimizer", {}) or {}
    for key in ("learning_rate", "weight_decay", "grad_clip_norm"):
        value = optimizer.get(key, 0.0)
        if value is None and key == "grad_clip_norm":
            continue
        if not is_real(value) or not np.isfinite(value) or value < 0:
            raise ValueError(f"config.optimizer.{key} must be a finite number >= 0, got {value!r}")
    for key in ("momentum", "b1", "b2"):  # momentum 1.5 trained (to a loss of 25) without a word
        value = optimizer.get(key, 0.0)
        if not is_real(value) or not 0.0 <= value < 1.0:
            raise ValueError(f"config.optimizer.{key} must be a number in [0, 1), got {value!r}")
