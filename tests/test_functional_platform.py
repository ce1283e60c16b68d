"""Platform-honest kernels: no normalization or gradient lowered for GPU or TPU contains an optimization
barrier (the CPU-only forms of ``jaxnorm.functional.platform`` stay in the CPU lowering)."""

import jax
import jax.numpy as jnp
import pytest

import jaxnorm.functional as F

X2 = (16, 8)
X4 = (4, 5, 5, 8)
W = (3, 3, 4, 8)

NORMS = {
    "batch p=2": (lambda x: F.batch_norm(x), X2),
    "batch p=1": (lambda x: F.batch_norm(x, p=1), X2),
    "batch p=inf": (lambda x: F.batch_norm(x, p="inf"), X2),
    "batch topk": (lambda x: F.batch_norm(x, p="inf", topk=3), X2),
    "batch conv p=2": (lambda x: F.batch_norm(x), X4),
    "batch masked p=1": (lambda x: F.batch_norm(x, p=1, mask=jnp.arange(16)[:, None] < 12), X2),
    "ghost batch": (lambda x: F.batch_norm(x, virtual_batch_size=4), X2),
    "mean-only batch": (lambda x: F.batch_norm(x, mean_only=True), X2),
    "layer p=2": (lambda x: F.layer_norm(x), X2),
    "layer p=1": (lambda x: F.layer_norm(x, p=1), X2),
    "layer p=inf conv": (lambda x: F.layer_norm(x, p="inf", axis=(1, 2, 3)), X4),
    "group p=2": (lambda x: F.group_norm(x, 2), X4),
    "group p=1": (lambda x: F.group_norm(x, 2, p=1), X4),
    "group p=inf": (lambda x: F.group_norm(x, 2, p="inf"), X4),
    "instance p=2": (lambda x: F.instance_norm(x), X4),
    "instance p=inf": (lambda x: F.instance_norm(x, p="inf"), X4),
    "rms": (lambda x: F.rms_norm(x), X2),
    "rms conv": (lambda x: F.rms_norm(x, axis=(1, 2, 3)), X4),
    "weight norm": (lambda w: F.weight_norm(w, 2.0), W),
    "scaled weight norm": (lambda w: F.scaled_weight_norm(w, 1.0), W),
    "bounded weight norm": (lambda w: F.bounded_weight_norm(w, 1.0), W),
    "weight standardization": (lambda w: F.weight_standardization(w), W),
    "unit norm": (lambda w: F.unit_norm(w), W),
}


def _lowered(fn, shape, dtype, platform):
    x = jnp.zeros(shape, dtype)
    weights = jnp.cos(jnp.arange(shape[-1], dtype=jnp.float32))

    def loss(x):
        return jnp.sum(fn(x).astype(jnp.float32) * weights)

    forward = jax.jit(fn).trace(x).lower(lowering_platforms=(platform,)).as_text()
    backward = jax.jit(jax.grad(loss)).trace(x).lower(lowering_platforms=(platform,)).as_text()
    return forward, backward


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("platform", ["cuda", "tpu"])
@pytest.mark.parametrize("name", sorted(NORMS))
def test_no_optimization_barrier_on_accelerators(name, platform, dtype):
    fn, shape = NORMS[name]
    forward, backward = _lowered(fn, shape, dtype, platform)
    assert "optimization_barrier" not in forward, f"{name} forward lowered for {platform}"
    assert "optimization_barrier" not in backward, f"{name} gradient lowered for {platform}"


def test_cpu_lowering_keeps_its_scheduling_form():
    """Guard that the test above can fail: the CPU lowering of L1 batch norm's gradient has barriers."""
    _, backward = _lowered(NORMS["batch p=1"][0], X2, jnp.float32, "cpu")
    assert "optimization_barrier" in backward
