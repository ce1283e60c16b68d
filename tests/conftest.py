"""Shared fixtures: float64 mode for oracle tests, a hypothesis profile sized for CI, and one XLA
compilation cache for the whole suite.

The suite compiles the same programs many times over (every ``train()`` call builds and jits its own
step; subprocess tests start new interpreters): JAX's persistent compilation cache, shared by the
xdist workers and inherited by subprocesses through the environment, compiles each once. On 2 cores
it cut tests/test_train_runs.py from 166 s to 67 s. The cache is keyed by the program, the compile
options and the jax/jaxlib versions, so it never serves a stale executable;
``JAX_COMPILATION_CACHE_DIR`` set outside chooses another directory (or ``""`` to turn it off).
"""

import os
import tempfile

os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"jaxnorm-tests-xla-cache-{os.getuid()}")
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")

import jax  # after the cache settings, which JAX reads when it is imported
import pytest
from hypothesis import settings

if os.environ["JAX_COMPILATION_CACHE_DIR"]:  # also where a plugin imported JAX before this file
    jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
    jax.config.update(
        "jax_persistent_cache_min_compile_time_secs",
        float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]),
    )

settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True)
settings.load_profile("ci")


@pytest.fixture
def x64():
    """Run the test with ``jax_enable_x64`` on (float64 oracles), restoring the previous value after."""
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", previous)
