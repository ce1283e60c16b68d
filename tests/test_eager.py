"""Eager calls (a notebook, no ``jit``) compile once: the second call of a norm with the same shapes and
options compiles nothing (jaxnorm.functional.eager). Before, every call re-traced and re-compiled the
statistics' ``lax.cond`` / ``platform_dependent`` branches."""

from __future__ import annotations

import contextlib
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxnorm.functional as F
import jaxnorm.nn as jn
import jaxnorm.nnx as jnnx
from jaxnorm.functional.eager import compiled_when_concrete

Z = jnp.asarray(np.random.default_rng(0).normal(1.0, 3.0, (32, 8)), jnp.float32)
IMG = jnp.asarray(np.random.default_rng(1).normal(size=(2, 4, 4, 8)), jnp.float32)
MASK = jnp.arange(32)[:, None] < 20


@contextlib.contextmanager
def compilations():
    """The messages of the XLA compilations that run inside the block."""
    messages: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            if "Compiling" in record.getMessage():
                messages.append(record.getMessage())

    handler, logger = Collect(), logging.getLogger("jax")
    logger.addHandler(handler)
    try:
        with jax.log_compiles():
            yield messages
    finally:
        logger.removeHandler(handler)


FUNCTIONS = {
    "batch_norm-p2": lambda: F.batch_norm(Z),
    "batch_norm-p1": lambda: F.batch_norm(Z, p=1),
    "batch_norm-inf": lambda: F.batch_norm(Z, p="inf"),
    "batch_norm-top4": lambda: F.batch_norm(Z, p="inf", topk=4),
    "batch_norm-masked": lambda: F.batch_norm(Z, p=1, mask=MASK),
    "batch_moments": lambda: F.batch_moments(Z, p=2),
    "layer_norm-last": lambda: F.layer_norm(IMG),
    "layer_norm-multi": lambda: F.layer_norm(IMG, axis=(1, 2, 3), p=1),
    "group_norm": lambda: F.group_norm(IMG, num_groups=4),
    "instance_norm": lambda: F.instance_norm(IMG, p="inf"),
    "rms_norm": lambda: F.rms_norm(IMG),
}


def _linen(module, x):
    variables = module.init(jax.random.key(0), x)
    return lambda: module.apply(variables, x, mutable=["batch_stats"])


MODULES = {
    "linen.BatchNorm": lambda: _linen(jn.BatchNorm(use_running_average=False), Z),
    "linen.BatchNorm-p1": lambda: _linen(jn.BatchNorm(use_running_average=False, p=1), Z),
    "linen.LayerNorm": lambda: _linen(jn.LayerNorm(), IMG),
    "linen.GroupNorm": lambda: _linen(jn.GroupNorm(num_groups=4, p="inf"), IMG),
    "nnx.BatchNorm": lambda: (lambda m: lambda: m(Z))(jnnx.BatchNorm(8, rngs=nnx.Rngs(0))),
    "nnx.LayerNorm": lambda: (lambda m: lambda: m(IMG))(jnnx.LayerNorm(8, rngs=nnx.Rngs(0))),
}


@pytest.mark.parametrize("name", FUNCTIONS)
def test_second_eager_call_of_a_function_compiles_nothing(name):
    call = FUNCTIONS[name]
    first = jax.block_until_ready(call())
    with compilations() as compiled:
        second = jax.block_until_ready(call())
    assert compiled == [], f"{name}: the second eager call compiled {len(compiled)} computations"
    jax.tree.map(np.testing.assert_array_equal, first, second)


@pytest.mark.parametrize("name", MODULES)
def test_second_eager_call_of_a_module_compiles_nothing(name):
    call = MODULES[name]()
    jax.block_until_ready(call())
    with compilations() as compiled:
        jax.block_until_ready(call())
    assert compiled == [], f"{name}: the second eager call compiled {len(compiled)} computations"


def test_eager_result_equals_the_jitted_one():
    """The compiled statistics give what the same function gives under ``jit``."""
    for name, call in FUNCTIONS.items():
        for eager, jitted in zip(jax.tree.leaves(call()), jax.tree.leaves(jax.jit(call)()), strict=True):
            np.testing.assert_allclose(eager, jitted, rtol=2e-6, atol=2e-6, err_msg=name)


def test_compiled_when_concrete_traces_inside_a_trace_and_falls_back_on_unhashable_statics():
    calls = []

    @compiled_when_concrete(static_argnames=("axes",))
    def total(x, axes):
        calls.append(type(x))
        return jnp.sum(x, axis=axes)

    x = jnp.ones((3, 4))
    assert float(total(x, (0, 1))) == 12 and float(total(x, axes=(0, 1))) == 12
    assert len(calls) == 1  # the second concrete call hit the compiled cache: no trace
    assert issubclass(calls[0], jax.core.Tracer)
    assert float(total(x, [0, 1])) == 12  # a list is unhashable: called as it is
    assert len(calls) == 2 and not issubclass(calls[1], jax.core.Tracer)
    jaxpr = jax.make_jaxpr(lambda x: total(x, (0,)))(x)
    assert "jit" not in {e.primitive.name for e in jaxpr.jaxpr.eqns}  # inlined in the trace
    assert float(jax.grad(lambda x: total(x, (0, 1)))(x).sum()) == 12


GRADIENTS = {
    "batch_norm-p2": lambda x: F.batch_norm(x),
    "batch_norm-p1": lambda x: F.batch_norm(x, p=1),
    "batch_norm-masked": lambda x: F.batch_norm(x, p=1, mask=MASK),
    "layer_norm-last": lambda x: F.layer_norm(x),
}


@pytest.mark.parametrize("name", GRADIENTS)
def test_second_eager_gradient_compiles_nothing_and_equals_the_jitted_one(name):
    """An eager ``grad`` (a notebook's training step without ``jit``): its tracers carry concrete values,
    so the statistics still run compiled, and the gradient is the one ``jit(grad)`` gives."""
    weights = jnp.cos(jnp.arange(Z.size, dtype=jnp.float32).reshape(Z.shape))
    grad = jax.grad(lambda x: jnp.sum(GRADIENTS[name](x) * weights))
    first = jax.block_until_ready(grad(Z))
    with compilations() as compiled:
        second = jax.block_until_ready(grad(Z))
    assert compiled == [], f"{name}: the second eager gradient compiled {len(compiled)} computations"
    np.testing.assert_array_equal(first, second)
    np.testing.assert_allclose(first, jax.jit(grad)(Z), rtol=1e-5, atol=1e-5)
