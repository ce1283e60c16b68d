"""Shared fixtures: float64 mode for oracle tests, and a hypothesis profile sized for CI."""

import jax
import pytest
from hypothesis import settings

settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True)
settings.load_profile("ci")


@pytest.fixture
def x64():
    """Run the test with ``jax_enable_x64`` on (float64 oracles), restoring the previous value after."""
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", previous)
