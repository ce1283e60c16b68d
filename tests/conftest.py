"""Shared fixtures: float64 mode for oracle tests, a hypothesis profile sized for CI, and one XLA
compilation cache for the whole suite.

The suite compiles the same programs many times over (every ``train()`` call builds and jits its own
step; subprocess tests start new interpreters): JAX's persistent compilation cache, shared by the
xdist workers and inherited by subprocesses through the environment, compiles each once. On 2 cores
it cut tests/test_train_runs.py from 166 s to 67 s. The cache is keyed by the program, the compile
options and the jax/jaxlib versions, so it never serves a stale executable;
``JAX_COMPILATION_CACHE_DIR`` set outside chooses another directory (or ``""`` to turn it off).

Most of the suite's time is XLA:CPU compiling small programs, so it compiles with JAX's
``jax_disable_most_optimizations`` (``JAX_DISABLE_MOST_OPTIMIZATIONS=1``, inherited by subprocesses):
the same HLO programs, fused as usual, but LLVM's optimizations off, which cuts compilation by a third
to three quarters (tests/test_models.py's deep models: 37 s -> 10 s). The machine code then rounds
differently from what users run (no FMA contraction, no vectorized reductions, a different ``rsqrt``),
so the modules whose properties hold bit for bit at the edges (``USER_OPTIMIZATION_MODULES``: exact
zeros for constant input, finiteness at the ends of each dtype's range) are deselected from such a run
when ``test_user_optimization.py`` is in it, which runs them in a subprocess at JAX's default
optimization.
``JAX_DISABLE_MOST_OPTIMIZATIONS=0`` set outside runs everything at the default optimization.
"""

import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"jaxnorm-tests-xla-cache-{os.getuid()}")
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
import jax  # after the cache settings, which JAX reads when it is imported
import pytest
from hypothesis import settings

if os.environ["JAX_COMPILATION_CACHE_DIR"]:  # also where a plugin imported JAX before this file
    jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
    jax.config.update(
        "jax_persistent_cache_min_compile_time_secs",
        float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]),
    )

TRUE_TEXTS = ("1", "true", "t", "yes", "y", "on")
OPTIMIZATIONS_OFF = os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"].lower() in TRUE_TEXTS
"""Whether this run compiles with most XLA optimizations off (parsed as JAX parses it)."""
jax.config.update("jax_disable_most_optimizations", OPTIMIZATIONS_OFF)  # also where JAX was imported first

TESTS = Path(__file__).resolve().parent
USER_OPTIMIZATION_MODULES = (
    "test_core_fuzz.py",
    "test_functional_edges.py",
    "test_functional_overflow.py",
    "test_functional_weight_edges.py",
)
"""Modules run only at JAX's default optimization (by ``test_user_optimization.py`` in a run that has
turned optimizations off): their properties depend on how the machine code rounds."""

settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True)
settings.load_profile("ci")


@pytest.fixture
def accelerator_forms(monkeypatch):
    """``accelerator_forms(*modules)`` switches the ``per_platform`` choice of ``modules`` (default: every
    module of ``jaxnorm.functional``) to its GPU / TPU form, and their ``distinct`` / ``separate_reads``
    to the identity they are there, on this CPU. JAX keeps the traces of jitted
    and custom-JVP functions, so they are dropped at the switch and when the test ends: neither form's
    trace may serve the other."""

    def default(cpu, default_form, *args):
        return default_form(*args)

    from jaxnorm.functional.platform import no_copy

    plain = {
        "per_platform": default,
        # the scheduling forms are the identity off CPU (numerically they are the identity everywhere)
        "distinct": no_copy,
        "separate_reads": lambda x, num: (x,) * num,
    }

    def switch(*modules):
        if not modules:
            modules = [m for name, m in list(sys.modules.items())
                       if name.startswith("jaxnorm.functional") and hasattr(m, "per_platform")]
            modules += [m for name, m in list(sys.modules.items())
                        if name.startswith("jaxnorm.functional") and hasattr(m, "distinct")
                        and m not in modules]
        for module in modules:
            for name, form in plain.items():
                if hasattr(module, name) and not module.__name__.endswith(".platform"):
                    monkeypatch.setattr(module, name, form)
        jax.clear_caches()

    yield switch
    jax.clear_caches()


@pytest.fixture
def x64():
    """Run the test with ``jax_enable_x64`` on (float64 oracles), restoring the previous value after."""
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", previous)


def pytest_report_header(config):
    state = "off (JAX_DISABLE_MOST_OPTIMIZATIONS=1)" if OPTIMIZATIONS_OFF else "on"
    return f"jaxnorm: most XLA optimizations {state}"


LONG_FIRST = (
    "test_user_optimization.py::",
    "test_data_cifar10_jpeg.py::test_real_archive",
    "test_data.py::test_real_fashion_mnist",
    "test_readme.py::",
    "test_enorm_fuzz.py::",
    "test_train_sigkill.py::",
    "test_distributed.py::",
    "test_benchmarks.py::",
)
"""Tests of 10-100 s each (``--durations``), run first: with ``-n 2`` they then overlap each other and the
many short tests, instead of one of them running alone at the end while the other worker is idle."""


def _long_first(items):
    def rank(item):
        name = f"{item.path.name}::{item.name}"
        return next((i for i, prefix in enumerate(LONG_FIRST) if name.startswith(prefix)), len(LONG_FIRST))

    items.sort(key=rank)  # stable: the order within each rank, and of all other tests, is kept


def pytest_collection_modifyitems(config, items):
    """Long tests first; without optimizations, leave the edge modules to ``test_user_optimization.py``
    where it runs too."""
    _long_first(items)
    if not OPTIMIZATIONS_OFF or not any(item.path.name == "test_user_optimization.py" for item in items):
        return
    elsewhere = [item for item in items if item.path.name in USER_OPTIMIZATION_MODULES]
    if elsewhere:
        config.hook.pytest_deselected(items=elsewhere)
        items[:] = [item for item in items if item.path.name not in USER_OPTIMIZATION_MODULES]
