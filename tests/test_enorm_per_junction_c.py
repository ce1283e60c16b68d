"""A per-junction asymmetry c in ENorm: ``enorm_balance(c=[c_0, ..., c_{J-1}])`` and ``optim.enorm``.

Oracle: at the fixed point of the cycles every junction j satisfies ``||outgoing_j|| = c_j
||incoming_j||`` (Stock et al. 2019, Sec. 3.7), checked in float64 NumPy; one cycle with per-junction
c equals cycles run junction by junction with each one's scalar c (block coordinate descent in spec
order).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxnorm import optim
from jaxnorm.enorm import Junction, chain, enorm_balance


def _params(seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    shapes = [(5, 4), (4, 6), (6, 3), (3, 2)]
    params = {}
    for i, (a, b) in enumerate(shapes):
        params[f"dense_{i}"] = {
            "kernel": jnp.asarray(rng.normal(size=(a, b)) * rng.uniform(0.3, 3.0), dtype),
            "bias": jnp.asarray(rng.normal(size=b), dtype),
        }
    return params


def test_fixed_point_has_each_junctions_own_ratio(x64):
    params = _params()
    cs = (1.3, 1.0, 0.8)
    balanced = enorm_balance(params, c=cs, cycles=400)
    for k, c in enumerate(cs):
        incoming = np.linalg.norm(np.asarray(balanced[f"dense_{k}"]["kernel"]), axis=0)
        outgoing = np.linalg.norm(np.asarray(balanced[f"dense_{k + 1}"]["kernel"]), axis=1)
        np.testing.assert_allclose(outgoing, c * incoming, rtol=1e-9)


def test_one_cycle_equals_junction_by_junction_scalar_cycles(x64):
    params = _params(1)
    spec = chain(params)
    cs = [1.2, 1.2, 1.0]
    got = enorm_balance(params, spec, c=cs)
    expected = params
    for junction, c in zip(spec, cs, strict=True):
        expected = enorm_balance(expected, (junction,), c=c)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-13)
    same = enorm_balance(params, spec, c=np.array([1.1, 1.1, 1.1]))
    scalar = enorm_balance(params, spec, c=1.1)
    for a, b in zip(jax.tree.leaves(same), jax.tree.leaves(scalar), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_optim_enorm_takes_a_per_junction_c():
    params = _params(2, np.float32)
    tx = optim.enorm(optax.sgd(0.0), c=(1.5, 1.5, 1.0), max_scale=None, cycles=50)
    state = tx.init(params)
    updates, _ = tx.update(jax.tree.map(jnp.zeros_like, params), state, params)
    balanced = optax.apply_updates(params, updates)
    for k, c in enumerate((1.5, 1.5, 1.0)):
        incoming = np.linalg.norm(np.asarray(balanced[f"dense_{k}"]["kernel"]), axis=0)
        outgoing = np.linalg.norm(np.asarray(balanced[f"dense_{k + 1}"]["kernel"]), axis=1)
        np.testing.assert_allclose(outgoing, c * incoming, rtol=1e-3)


@pytest.mark.parametrize(
    ("c", "match"),
    [
        ((1.2, 1.0), "c has 2 values for the 3 junctions"),
        ((1.2, 0.0, 1.0), r"c\[1\]: c must be > 0"),
        ((), "empty sequence"),
        ((1.2, float("nan"), 1.0), r"c\[1\]"),
    ],
)
def test_bad_per_junction_c_names_it(c, match):
    with pytest.raises(ValueError, match=match):
        enorm_balance(_params(dtype=np.float32), c=c)
    with pytest.raises(ValueError, match=match):
        optim.enorm(optax.sgd(0.1), c=c).init(_params(dtype=np.float32))


def test_a_one_junction_spec_accepts_one_c():
    params = _params(dtype=np.float32)
    spec = (Junction(((("dense_0", "kernel"), 1), (("dense_0", "bias"), 0)), ((("dense_1", "kernel"), 0),)),)
    a = enorm_balance(params, spec, c=[1.2])
    b = enorm_balance(params, spec, c=1.2)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
