"""Platform-honest kernels: no normalization or gradient lowered for GPU or TPU contains an optimization
barrier (the CPU-only forms of ``jaxnorm.functional.platform`` stay in the CPU lowering)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
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


BRANCH_FREE_ON_ACCELERATORS = {
    "batch p=2": lambda x: F.batch_norm(x),
    "instance p=2": lambda x: F.instance_norm(x),
    "layer p=2 axes": lambda x: F.layer_norm(x, axis=(1, 2, 3)),
    # epsilon = 0: the groups whose variance underflows are taken in underflow_unit, as sibling sums
    "batch p=2 epsilon=0": lambda x: F.batch_norm(x, epsilon=0.0),
    "instance p=2 epsilon=0": lambda x: F.instance_norm(x, epsilon=0.0),
}


@pytest.mark.parametrize("name", sorted(BRANCH_FREE_ON_ACCELERATORS))
def test_accelerator_form_of_the_l2_statistics_has_no_conditional(accelerator_forms, name):
    """XLA:GPU turns a data-dependent conditional into selects between both branches, so the careful
    pass and the unit of the L2 statistics ran on every call there (5 reads of the input in BatchNorm's
    forward pass, flax's 2). Their GPU / TPU form takes both in two fused passes and no conditional
    (the jaxpr had 2 conds before)."""
    accelerator_forms()
    fn = BRANCH_FREE_ON_ACCELERATORS[name]
    x = jnp.ones(X4)

    def loss(x):
        return jnp.sum(fn(x) * jnp.arange(x.size, dtype=x.dtype).reshape(x.shape))

    for jaxpr in (jax.make_jaxpr(fn)(x), jax.make_jaxpr(jax.grad(loss))(x)):
        assert " cond[" not in str(jaxpr), name


def _data_dependent_cases(text: str) -> list[str]:
    """The ``stablehlo.case`` ops of a lowering whose index is neither a constant nor the result of a case
    (``lax.platform_dependent`` lowers to a case on the constant platform index that picks the index of
    a second case; XLA folds both)."""
    static = set(re.findall(r"(%[\w#.]+)(?::\d+)? = (?:stablehlo\.constant|\"stablehlo\.case\")", text))
    return [i for i in re.findall(r'"stablehlo\.case"\((%[\w#.]+)\)', text) if i not in static]


@pytest.mark.parametrize("platform", ["cuda", "tpu"])
@pytest.mark.parametrize("name", sorted(BRANCH_FREE_ON_ACCELERATORS))
def test_accelerator_lowering_of_the_l2_statistics_has_no_data_dependent_case(name, platform):
    """The lowering for GPU / TPU itself (no patching): every conditional left switches on the constant
    platform index (the old careful-pass and unit conds switched on the data)."""
    forward, backward = _lowered(BRANCH_FREE_ON_ACCELERATORS[name], X4, jnp.float32, platform)
    assert _data_dependent_cases(forward) == [] and _data_dependent_cases(backward) == [], name
    cpu_forward, _ = _lowered(BRANCH_FREE_ON_ACCELERATORS[name], X4, jnp.float32, "cpu")
    assert _data_dependent_cases(cpu_forward), "the check finds the CPU form's conds"


def _inputs():
    rng = np.random.default_rng(3)
    ordinary = rng.normal(0.5, 2.0, X4)
    cases = {
        "ordinary": ordinary,
        "cancellation": rng.normal(1000.0, 0.01, X4),
        "constant": np.full(X4, 12345.678),
        "one huge channel 1e19": np.concatenate([ordinary[..., :4] * 1e19, ordinary[..., 4:]], -1),
        "huge 1e26": ordinary * 1e26,
        "near max": np.clip(ordinary * 1e38, -3e38, 3e38),
        "tiny": ordinary * 1e-30,
    }
    return {k: jnp.asarray(v.astype(np.float32)) for k, v in cases.items()}


@pytest.mark.parametrize("case", sorted(_inputs()))
@pytest.mark.parametrize("name", sorted(BRANCH_FREE_ON_ACCELERATORS))
def test_accelerator_form_of_the_l2_statistics_matches_the_cpu_form(accelerator_forms, name, case):
    """The branch-free GPU / TPU form and XLA:CPU's branching form give the same outputs and input
    gradients (both exact: the careful pass where needed, the unit for overflowing groups) on ordinary,
    ill-conditioned, constant, huge, near-maximum and tiny input."""
    fn = BRANCH_FREE_ON_ACCELERATORS[name]
    x = _inputs()[case]
    cotangent = jnp.asarray(np.random.default_rng(4).normal(size=X4).astype(np.float32))

    def outputs():
        # a new function for each form: jax.jit(fn) would reuse the first form's trace
        y, vjp = jax.vjp(jax.jit(lambda v: fn(v)), x)
        return np.asarray(y), np.asarray(vjp(cotangent)[0])

    cpu_y, cpu_dx = outputs()
    accelerator_forms()
    y, dx = outputs()
    assert np.all(np.isfinite(y)) and np.all(np.isfinite(dx)), case
    np.testing.assert_allclose(y, cpu_y, rtol=2e-5, atol=2e-5 if case != "cancellation" else 2e-2)
    if case == "constant" and "epsilon=0" in name:
        # no gradient to compare: with epsilon = 0 a constant group's is rsqrt of its variance, 0 (then
        # the floor's, 2^63) or the rounding noise of sum d^2 - (sum d)^2 / n (1e-13 here), which depends
        # on how XLA orders the sums; both forms give an output of exactly 0
        return
    scale = np.max(np.abs(cpu_dx)) + 1e-30
    atol = 1e-4 if case != "cancellation" else 2e-2
    np.testing.assert_allclose(dx / scale, cpu_dx / scale, rtol=0, atol=atol)


REFINED_NORMS = {
    "batch p=2": lambda x: F.batch_norm(x),
    "batch p=1": lambda x: F.batch_norm(x, p=1),
    "instance p=2": lambda x: F.instance_norm(x),
    "group p=inf": lambda x: F.group_norm(x, 4, p="inf"),
    "rms axes": lambda x: F.rms_norm(x, axis=(1, 2, 3)),
}


@pytest.mark.parametrize("name", sorted(REFINED_NORMS))
def test_cpu_per_element_kernels_hold_no_unit_refinement(name):
    """The huge unit's refinement (``units.refinement``: finiteness tests and selects per group) stays out
    of XLA:CPU's per-element kernels, behind a conditional: written as a select after the statistics, XLA
    fused it into the normalization's kernel, recomputed for every element (forward 2x slower). No fused
    computation that writes a full-size array holds an ``is-finite``."""
    if jax.default_backend() != "cpu":
        pytest.skip("XLA:CPU's fusion")
    x = jnp.ones((8, 4, 4, 16), jnp.float32)
    text = jax.jit(REFINED_NORMS[name]).lower(x).compile().as_text()
    full = "f32[8,4,4,16]"
    computations = re.split(r"\n(?=\S.*\{\n)", text)
    heads = [(c, c.split("\n")[0]) for c in computations]
    per_element = [c for c, head in heads if "fused" in head and "-> " + full in head]
    assert per_element, name
    assert not any("is-finite" in c for c in per_element), name
