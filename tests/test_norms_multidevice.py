"""Batch statistics across 8 simulated CPU devices equal those of the single-device global batch.

The devices are simulated in a subprocess (``--xla_force_host_platform_device_count=8`` must be set
before JAX starts), which prints the max error of every case; see ``_multidevice_norms.py``.
"""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from multidevice import run_on_devices

import jaxnorm.functional as F

WORKER = Path(__file__).with_name("_multidevice_norms.py")


@pytest.fixture(scope="module")
def errors():
    return json.loads(run_on_devices(WORKER, timeout=600).strip().splitlines()[-1])


def test_every_case_ran(errors):
    modes = {name.split()[0] for name in errors}
    assert {"pmap", "shard_map", "jit-sharded", "BatchNorm", "features"} <= modes
    assert sum(name.startswith("features") for name in errors) == 6  # 3 per-example norms x (y, gradient)
    assert sum(name.startswith("shard_map") for name in errors) == 10  # 5 norms x (masked, unmasked)
    assert sum(name.startswith("pmap gradient") for name in errors) == 5


def test_statistics_equal_global_batch(errors):
    bad = {name: err for name, err in errors.items() if not err < 1e-10}
    assert not bad, bad


_COLLECTIVES = {"psum", "pmax", "pmin", "all_gather", "all_to_all", "ppermute", "psum_scatter"}


def _collectives(jaxpr) -> list[str]:
    """The collectives of a jaxpr on the path ordinary input takes: nested jaxprs (custom JVPs, jits)
    included, and of a ``cond`` the branch with the fewest (the L2 statistics of huge input are taken
    again, with their own collective, only where the variance overflows)."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in _COLLECTIVES:
            found.append(eqn.primitive.name)
        if eqn.primitive.name == "cond":
            found += min((_collectives(b.jaxpr) for b in eqn.params["branches"]), key=len)
            continue
        for param in eqn.params.values():
            for sub in param if isinstance(param, tuple | list) else (param,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    found += _collectives(inner)
    return found


@pytest.mark.parametrize(
    ("p", "topk", "expected"), [(2, None, 1), ("inf", None, 1), ("inf", 3, 1), (1, None, 2)]
)
@pytest.mark.parametrize("masked", [False, True])
def test_cross_device_statistics_take_one_collective(p, topk, expected, masked):
    """L2 and L∞ (top-k too: the extremes that make the mean exact are among the gathered candidates)
    gather everything in one collective; L1's ``sum |x - mu|`` needs the global mean first, so it takes
    two (the mean's correction rides in the second)."""
    x = jnp.ones((6, 5, 4))
    mask = jnp.ones(x.shape, bool) if masked else None
    jaxpr = jax.make_jaxpr(
        lambda a: F.batch_moments(a, p=p, topk=topk, mask=mask, axis_name="d"), axis_env=[("d", 8)]
    )(x)
    assert _collectives(jaxpr.jaxpr) == ["psum"] * expected
