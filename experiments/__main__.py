"""Command line: ``python -m experiments <config> [--config.key=value ...]``.

``<config>`` is a file name in ``experiments/configs/`` (without ``.py``) or a path to a config
file; overrides use ml_collections' syntax (``--config.optimizer.learning_rate=0.05``,
``--config.sweep.grid="('bn', 'gn')"``). ``python -m experiments list`` shows every config with its
one-line description; ``python -m experiments show <config> [overrides]`` (or ``<config> --help``)
prints every key with its resolved value and the model options. ``--config.model.<option>=value``
sets any option the model takes. Config errors are one ``error: ...`` line on stderr (exit status 2)
naming the key and the closest valid one. A run killed or stopped with SIGTERM resumes when the same
command is run again.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
from collections.abc import Sequence
from typing import Any

from experiments.scripts.records import parse_value

CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
USAGE = (
    "usage: python -m experiments <config> [--config.key=value ...]\n"
    "       python -m experiments show <config> [--config.key=value ...]   (every key and value)\n"
    "       python -m experiments list"
)


def available() -> dict[str, str]:
    """``{config name: one-line description}`` for every file in ``experiments/configs``."""
    configs = {}
    for filename in sorted(os.listdir(CONFIG_DIR)):
        if filename.endswith(".py") and not filename.startswith("_"):
            with open(os.path.join(CONFIG_DIR, filename)) as f:
                doc = ast.get_docstring(ast.parse(f.read())) or ""
            configs[filename[:-3]] = doc.strip().splitlines()[0] if doc.strip() else ""
    return configs


def listing() -> str:
    """The text ``python -m experiments list`` prints."""
    configs = available()
    width = max(map(len, configs), default=0)
    return "\n".join(f"{name.ljust(width)}  {doc}" for name, doc in configs.items())


def resolve(name: str) -> str:
    """The config file for ``name`` (a config name or a path); unknown names list the choices."""
    if name.endswith(".py") and os.path.isfile(name):
        return name
    configs = available()
    if name not in configs:
        raise ValueError(f"unknown config {name!r}; valid choices: {', '.join(configs)}")
    return os.path.join(CONFIG_DIR, name + ".py")


def _split_override(override: str) -> tuple[str, str | None]:
    """``"--config.a.b=v"`` -> ``("a.b", "v")``; ``"--config.a.b"`` -> ``("a.b", None)``."""
    body = override[len("--config.") :]
    key, sep, value = body.partition("=")
    return key, (value if sep else None)


def _model_name(config, overrides: Sequence[str]) -> str:
    """The model the overrides leave in ``config.model.name``."""
    name = config.model.name
    for override in overrides:
        key, value = _split_override(override)
        if key == "model.name" and value is not None:
            name = value.strip("'\"")
    return name


def _check_keys(config, overrides: Sequence[str]) -> tuple[list[str], dict[str, Any]]:
    """Splits ``overrides`` into those ml_collections applies and ``{model option: value}`` (a
    ``model.<option>`` or ``model.kwargs.<option>`` the config does not list yet, checked against the
    model's options); raises ``ValueError`` (one line, closest valid key) for any other unknown key."""
    from jaxnorm.train.config_checks import MODEL_KWARGS, settable_keys, suggestion

    flagged, options = [], {}
    candidates = settable_keys(config, _model_name(config, overrides) if "model" in config else None)
    for override in overrides:
        key, value = _split_override(override)
        if _has_key(config, key):
            flagged.append(override)
            continue
        parts = key.split(".")
        if parts[0] == "model" and parts[:-1] in (["model"], ["model", "kwargs"]):
            if f"{MODEL_KWARGS}.{parts[-1]}" in candidates:
                if value is None:
                    raise ValueError(f"--config.{key}: give a value, e.g. --config.{key}=...")
                options[parts[-1]] = parse_value(value)
                continue
        raise ValueError(f"the config has no key config.{key}{suggestion(key, candidates)}")
    return flagged, options


def _has_key(config, key: str) -> bool:
    from jaxnorm.train.config_checks import lookup

    try:
        lookup(config, key)
    except KeyError:
        return False
    return True


def _apply_overrides(config, overrides: Sequence[str]):
    """``config`` with the ml_collections ``overrides`` applied (typed by each key's current value);
    a value of the wrong type raises one line naming the key and its expected type."""
    from absl import flags
    from ml_collections import config_flags

    argv = ["experiments", *overrides]
    flag_values = flags.FlagValues()
    config_flags.DEFINE_config_dict(
        "config", config, flag_values=flag_values, lock_config=True, sys_argv=argv
    )
    try:
        flag_values(argv)
    except flags.Error as e:
        key, value = _split_override(_failed_override(str(e), overrides))
        from jaxnorm.train.config_checks import lookup

        current = lookup(config, key) if key else None
        reason = " ".join(str(e).split(": ", 1)[-1].split())
        if hasattr(current, "unlocked"):  # a nested ConfigDict
            expected = f"a nested config: set its keys, e.g. --config.{key}.<key>=value"
        else:
            expected = f"expected {type(current).__name__}, like the current value {current!r}"
        raise ValueError(f"config.{key}={value!r}: {reason} ({expected})") from None
    return flag_values.config


def _failed_override(message: str, overrides: Sequence[str]) -> str:
    """The override an absl error message is about (the first one it quotes)."""
    for override in overrides:
        if override in message or override.split("=", 1)[0] + "=" in message:
            return override
    return overrides[0] if overrides else "--config."


def load_config(name: str, overrides: Sequence[str]):
    """The ConfigDict of config ``name`` with ``--config.key=value`` overrides applied.

    Keys are checked against every dotted key of the config (an unknown one gets the closest valid
    key, wherever it sits); ``--config.model.<option>=value`` and ``--config.model.kwargs.<option>=value``
    set any option the model takes (checked against the model), even one the config does not list.
    Every error is a ``ValueError`` with a one-line message.
    """
    bad = [o for o in overrides if not o.startswith("--config.")]
    if bad:
        raise ValueError(f"overrides must look like --config.key=value, got {' '.join(bad)}")
    path = resolve(name)
    spec = importlib.util.spec_from_file_location(f"experiments_config_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    flagged, options = _check_keys(config, overrides)
    config = _apply_overrides(config, flagged)
    if options:
        _set_model_options(config, options)
    _check_overrides_apply(config, overrides, options)
    return config


def _check_overrides_apply(config, overrides: Sequence[str], options: dict[str, Any]) -> None:
    """``ValueError`` for an override that would be discarded: one setting given twice (the model
    option shorthand ``--config.model.depth`` beside ``--config.model.kwargs.depth``: the shorthand won
    whatever the order), or a setting the sweep sets in every run (``config.sweep.key``), given
    directly, through the shorthand, or inside a dict around it."""
    from jaxnorm.train.config_checks import MODEL_KWARGS

    keys = {}
    for override in overrides:
        key = _split_override(override)[0]
        parts = key.split(".")
        if len(parts) == 2 and parts[0] == "model" and parts[1] in options:  # the shorthand
            key = f"{MODEL_KWARGS}.{parts[1]}"
        if key in keys:
            flag = override.split("=", 1)[0]
            raise ValueError(f"{flag} and {keys[key]} set config.{key} twice; give it once")
        keys[key] = override.split("=", 1)[0]
    swept = config.sweep.key if "sweep" in config else ""
    for key, flag in keys.items():
        if swept and (key == swept or key.startswith(swept + ".") or swept.startswith(key + ".")):
            raise ValueError(
                f"{flag}: config.{swept} is set by the sweep (config.sweep.key={swept!r}), which replaces "
                "it in every run; override --config.sweep.grid=... instead, or turn the sweep off with "
                "--config.sweep.key="
            )


def _set_model_options(config, options: dict[str, Any]) -> None:
    """Adds ``options`` to ``config.model.kwargs`` after checking the model takes each of them."""
    from jaxnorm.train.config_checks import check_model_options

    with config.unlocked():
        kwargs = dict(config.model.get("kwargs", {}) or {})
        config.model.kwargs = {**kwargs, **options}
    check_model_options(config)


def show(config) -> str:
    """Every key of ``config`` with its resolved value (experiment defaults, overrides and ``quick``
    applied), one ``key = value`` line each (the text of ``python -m experiments show``), then the
    model's options and the sweep's runs."""
    from jaxnorm.train.config_checks import dotted_items, model_option_names
    from jaxnorm.train.experiment import apply_quick, experiment_defaults

    base = experiment_defaults()
    base.update(config)
    if base.quick:  # the values the smoke test runs with
        base = apply_quick(base)
    lines = [f"{key} = {value!r}" for key, value in dotted_items(base)]
    try:
        options = model_option_names(base.model.name)
        lines.append(
            f"# model {base.model.name!r} takes (--config.model.<option>=value): {', '.join(options)}"
        )
    except ValueError:
        pass
    if base.sweep.key:
        lines.append(f"# runs: {', '.join(str(v) for v in (base.sweep.names or base.sweep.grid))}")
    return "\n".join(lines)


def check_datasets(config) -> None:
    """Raises ``DatasetNotFoundError`` (saying how to get it) unless the dataset of every run of the
    sweep is prepared: a look at files, before any run starts."""
    from jaxnorm import data
    from jaxnorm.train.experiment import expand_sweep, experiment_defaults

    base = experiment_defaults()
    base.update(config)
    for _, run in expand_sweep(base):
        if run.dataset.name in data.names():  # an unknown name: validate() lists the choices
            data.check_prepared(run.dataset.name, run.dataset.data_dir or None)


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())


def main(argv: Sequence[str]) -> int:
    """Entry point; returns the exit status (0 done, 2 a config or usage error)."""
    if len(argv) < 2 or argv[1] in ("-h", "--help", "help"):
        print(USAGE + "\n\nconfigs:\n" + listing())
        return 0 if len(argv) >= 2 else 2
    if argv[1] == "list":
        print(listing())
        return 0
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow (under TFDS) start-up chatter
    from jaxnorm.data import DatasetNotFoundError

    command, args = ("show", argv[2:]) if argv[1] == "show" else ("run", argv[1:])
    if not args:
        print(f"error: name a config: {USAGE.splitlines()[0]} ('list' shows them)", file=sys.stderr)
        return 2
    helping = any(a in ("-h", "--help") for a in args[1:])
    overrides = [a for a in args[1:] if a not in ("-h", "--help")]
    try:
        config = load_config(args[0], overrides)
        if command == "show" or helping:
            print((USAGE + "\n\n" if helping else "") + show(config))
            return 0
        from jaxnorm.train.experiment import run_experiment

        check_datasets(config)
        run_experiment(config)
    except (ValueError, DatasetNotFoundError) as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
