"""Command line: ``python -m experiments <config> [--config.key=value ...]``.

``<config>`` is a file name in ``experiments/configs/`` (without ``.py``) or a path to a config
file; overrides use ml_collections' syntax (``--config.optimizer.learning_rate=0.05``,
``--config.sweep.grid="('bn', 'gn')"``). ``python -m experiments list`` shows every config with its
one-line description. A run killed or stopped with SIGTERM resumes when the same command is run again.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
from collections.abc import Sequence

CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
USAGE = "usage: python -m experiments <config> [--config.key=value ...]\n       python -m experiments list"


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


def load_config(name: str, overrides: Sequence[str]):
    """The ConfigDict of config ``name`` with ``--config.key=value`` overrides applied."""
    from absl import flags
    from ml_collections import config_flags

    bad = [o for o in overrides if not o.startswith("--config.")]
    if bad:
        raise ValueError(f"overrides must look like --config.key=value, got {bad}")
    path = resolve(name)
    spec = importlib.util.spec_from_file_location(f"experiments_config_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    argv = ["experiments", *overrides]
    flag_values = flags.FlagValues()
    try:
        config_flags.DEFINE_config_dict(
            "config", module.get_config(), flag_values=flag_values, lock_config=True, sys_argv=argv
        )
        flag_values(argv)
    except flags.Error as e:
        raise ValueError(str(e)) from e
    except (AttributeError, KeyError) as e:
        field = str(e).strip("\"'")
        raise ValueError(f"the config has no field {field!r} (in {list(overrides)})") from e
    config = flag_values.config
    swept = config.sweep.key if "sweep" in config else ""
    if swept and any(o.startswith(f"--config.{swept}=") for o in overrides):
        raise ValueError(
            f"config.{swept} is set by the sweep (config.sweep.key={swept!r}); override "
            f"--config.sweep.grid=... instead, or turn the sweep off with --config.sweep.key="
        )
    return config


def main(argv: Sequence[str]) -> int:
    """Entry point; returns the exit status."""
    if len(argv) < 2 or argv[1] in ("-h", "--help", "help"):
        print(USAGE + "\n\nconfigs:\n" + listing())
        return 0 if len(argv) >= 2 else 2
    if argv[1] == "list":
        print(listing())
        return 0
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow (under TFDS) start-up chatter
    from jaxnorm.train.experiment import run_experiment

    try:
        config = load_config(argv[1], argv[2:])
        run_experiment(config)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
