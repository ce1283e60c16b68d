"""Symmetry teleportation (jaxnorm.enorm.teleport, jaxnorm.optim.teleportation) against a float64
NumPy re-computation on a 2-layer ReLU net: the objective ||grad L(T_u w)||^2 from NumPy's own
backward pass at the rescaled params, its gradient in u (closed form and finite differences), the
whole projected-ascent trajectory; invariance of the loss; the optimizer-state transport (the one
table ENorm uses); the wrapper's cadence; NNX; argument errors."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.test_util import check_grads

from jaxnorm.enorm import chain, discover, multipliers, teleport, teleport_objective
from jaxnorm.optim import TeleportationState, rescale_state, teleportation
from tests import enorm_models as models

N, D, H, OUT = 12, 3, 5, 2


def _data(seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    params = {
        "Dense_0": {"kernel": rng.normal(size=(D, H)), "bias": 0.1 * rng.normal(size=(H,))},
        "Dense_1": {"kernel": rng.normal(size=(H, OUT)), "bias": 0.1 * rng.normal(size=(OUT,))},
    }
    x, y = rng.normal(size=(N, D)), rng.normal(size=(N, OUT))
    cast = lambda v: jnp.asarray(np.asarray(v, dtype))
    return jax.tree.map(cast, params), (cast(x), cast(y))


def loss_fn(params, batch):
    x, y = batch
    h = jax.nn.relu(x @ params["Dense_0"]["kernel"] + params["Dense_0"]["bias"])
    return jnp.mean((h @ params["Dense_1"]["kernel"] + params["Dense_1"]["bias"] - y) ** 2)


# ----------------------------------------------------------------------------------------------
# The float64 NumPy oracle: forward, backward, rescaling, objective, ascent.


def np_grads(params, batch):
    p = jax.tree.map(lambda v: np.asarray(v, np.float64), params)
    x, y = (np.asarray(v, np.float64) for v in batch)
    w1, b1, w2, b2 = (
        p["Dense_0"]["kernel"],
        p["Dense_0"]["bias"],
        p["Dense_1"]["kernel"],
        p["Dense_1"]["bias"],
    )
    h = x @ w1 + b1
    a = np.maximum(h, 0.0)
    r = a @ w2 + b2 - y
    dout = 2.0 * r / r.size
    dh = (dout @ w2.T) * (h > 0)
    return {
        "Dense_0": {"kernel": x.T @ dh, "bias": dh.sum(0)},
        "Dense_1": {"kernel": a.T @ dout, "bias": dout.sum(0)},
    }


def np_loss(params, batch):
    p = jax.tree.map(lambda v: np.asarray(v, np.float64), params)
    x, y = (np.asarray(v, np.float64) for v in batch)
    h = np.maximum(x @ p["Dense_0"]["kernel"] + p["Dense_0"]["bias"], 0.0)
    return np.mean((h @ p["Dense_1"]["kernel"] + p["Dense_1"]["bias"] - y) ** 2)


def np_rescale(params, s):
    p = jax.tree.map(lambda v: np.asarray(v, np.float64), params)
    return {
        "Dense_0": {"kernel": p["Dense_0"]["kernel"] * s, "bias": p["Dense_0"]["bias"] * s},
        "Dense_1": {"kernel": p["Dense_1"]["kernel"] / s[:, None], "bias": p["Dense_1"]["bias"]},
    }


def np_objective(params, batch, u):
    """||grad L(T_u w)||^2 by NumPy's backward pass at the rescaled params (no Eq. 10)."""
    g = np_grads(np_rescale(params, np.exp(u)), batch)
    return sum(float(np.sum(v**2)) for v in jax.tree.leaves(g))


def np_closed_form(params, batch):
    """(A, B, C): J(u) = sum_j A_j e^{-2u_j} + B_j e^{2u_j} + C (Eq. 10 applied by hand)."""
    g = np_grads(params, batch)
    a = np.sum(g["Dense_0"]["kernel"] ** 2, axis=0) + g["Dense_0"]["bias"] ** 2
    b = np.sum(g["Dense_1"]["kernel"] ** 2, axis=1)
    return a, b, float(np.sum(g["Dense_1"]["bias"] ** 2))


def np_teleport(params, batch, steps, step_size, max_scale):
    a, b, c = np_closed_form(params, batch)
    value = lambda u: float(np.sum(a * np.exp(-2 * u) + b * np.exp(2 * u)) + c)
    grad = lambda u: -2 * a * np.exp(-2 * u) + 2 * b * np.exp(2 * u)
    u, best_u, best_v = np.zeros(H), np.zeros(H), -np.inf
    for _ in range(steps):
        if value(u) > best_v:
            best_u, best_v = u.copy(), value(u)
        u = np.clip(u + step_size * grad(u), -math.log(max_scale), math.log(max_scale))
    if value(u) > best_v:
        best_u, best_v = u.copy(), value(u)
    return np.exp(best_u), value(np.zeros(H)), best_v


# ----------------------------------------------------------------------------------------------
# teleport


def test_objective_matches_numpy_backward_pass(x64):
    params, batch = _data()
    spec = chain(params)
    for seed in range(3):
        u = np.random.default_rng(seed).normal(size=H)
        got = teleport_objective(params, loss_fn, batch, (jnp.asarray(u),), spec)
        np.testing.assert_allclose(got, np_objective(params, batch, u), rtol=1e-10)


def test_objective_gradient_matches_closed_form_and_finite_differences(x64):
    params, batch = _data(1)
    a, b, _ = np_closed_form(params, batch)
    grad = jax.grad(lambda u: teleport_objective(params, loss_fn, batch, (u,)))
    for seed in range(3):
        u = 0.5 * np.random.default_rng(seed).normal(size=H)
        got = np.asarray(grad(jnp.asarray(u)))
        np.testing.assert_allclose(got, -2 * a * np.exp(-2 * u) + 2 * b * np.exp(2 * u), rtol=1e-10)
        eps, fd = 1e-6, np.zeros(H)
        for j in range(H):
            e = np.zeros(H)
            e[j] = eps
            fd[j] = (np_objective(params, batch, u + e) - np_objective(params, batch, u - e)) / (2 * eps)
        np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-10)


def test_check_grads_objectives(x64):
    params, batch = _data(2)
    u = (0.3 * jnp.asarray(np.random.default_rng(0).normal(size=H)),)
    check_grads(lambda u: teleport_objective(params, loss_fn, batch, u), (u,), order=2, modes=("rev",))
    gnorm = lambda p, b: sum(jnp.sum(g**2) for g in jax.tree.leaves(jax.grad(loss_fn)(p, b)))
    check_grads(
        lambda u: teleport_objective(params, None, batch, u, objective=gnorm), (u,), order=1, modes=("rev",)
    )


@pytest.mark.parametrize("steps,step_size,max_scale", [(10, 0.1, 16.0), (25, 0.02, 4.0), (3, 1.0, 1e6)])
def test_trajectory_matches_numpy_and_loss_is_unchanged(x64, steps, step_size, max_scale):
    params, batch = _data(3)
    new, scales, (before, after) = teleport(
        params, loss_fn, batch, steps=steps, step_size=step_size, max_scale=max_scale, return_objective=True
    )
    want_s, want_before, want_after = np_teleport(params, batch, steps, step_size, max_scale)
    np.testing.assert_allclose(scales[0], want_s, rtol=1e-10)
    np.testing.assert_allclose([before, after], [want_before, want_after], rtol=1e-10)
    assert after > before  # the gradient norm grew
    np.testing.assert_allclose(np_loss(new, batch), np_loss(params, batch), rtol=1e-10)  # same loss
    # `after` is the gradient norm at the new params, by NumPy's backward pass there
    np.testing.assert_allclose(
        after, sum(np.sum(g**2) for g in jax.tree.leaves(np_grads(new, batch))), rtol=1e-10
    )
    for path, want in (
        ("Dense_0", np_rescale(params, want_s)["Dense_0"]),
        ("Dense_1", np_rescale(params, want_s)["Dense_1"]),
    ):
        for name in ("kernel", "bias"):
            np.testing.assert_allclose(new[path][name], want[name], rtol=1e-10)
    assert np.all(np.asarray(scales[0]) <= max_scale * (1 + 1e-12))
    assert np.all(np.asarray(scales[0]) >= (1 - 1e-12) / max_scale)


@pytest.mark.parametrize(
    "net",
    [
        pytest.param("cnn", marks=pytest.mark.slow),  # float64 convolutions, second order: ~50 s to compile
        "mlp",
    ],
)
def test_loss_unchanged_on_discovered_cnn_and_mlp(x64, net):
    for model, shape in {
        "cnn": ((models.CNN(dtype=jnp.float64), (4, 12, 12, 3)),),
        "mlp": ((models.MLP(dtype=jnp.float64), (8, 3)),),
    }[net]:
        variables, x = models.init(model, shape, 0, jnp.float64)
        y = jnp.asarray(np.random.default_rng(0).normal(size=(shape[0], 3)))
        loss = jax.jit(lambda v, b, model=model: jnp.mean((model.apply(v, b[0]) - b[1]) ** 2))
        spec = discover(model.apply, variables, x)
        new, scales, (before, after) = teleport(
            variables, loss, (x, y), spec, step_size=0.05, return_objective=True
        )
        assert set(new) == set(variables)
        np.testing.assert_allclose(loss(new, (x, y)), loss(variables, (x, y)), rtol=1e-10)
        np.testing.assert_allclose(model.apply(new, x), model.apply(variables, x), rtol=1e-9, atol=1e-12)
        assert after > before
        g = jax.grad(loss)(new, (x, y))["params"]
        np.testing.assert_allclose(after, sum(jnp.sum(v**2) for v in jax.tree.leaves(g)), rtol=1e-9)
        assert any(float(jnp.max(jnp.abs(jnp.log(s)))) > 1e-3 for s in scales)


def test_callable_objective_autodiff_equals_eq10_route(x64):
    """The objective evaluated at the teleported params by autodiff (second-order) gives the same
    teleport as the closed form from the gradient at w (Eq. 10)."""
    params, batch = _data(4)
    gnorm = lambda p, b: sum(jnp.sum(g**2) for g in jax.tree.leaves(jax.grad(loss_fn)(p, b)))
    _, s_a = teleport(params, None, batch, objective=gnorm, steps=8, step_size=0.05)
    _, s_b = teleport(params, loss_fn, batch, steps=8, step_size=0.05)
    _, s_c = teleport(params, None, batch, steps=8, step_size=0.05, grads=jax.grad(loss_fn)(params, batch))
    np.testing.assert_allclose(s_a[0], s_b[0], rtol=1e-10)
    np.testing.assert_array_equal(s_b[0], s_c[0])


@settings(max_examples=12)  # each example runs an eager teleport (CI time)
@given(step_size=st.floats(1e-3, 50.0), steps=st.integers(0, 6), seed=st.integers(0, 5))
def test_objective_never_decreases(step_size, steps, seed):
    params, batch = _data(seed, np.float32)
    _, scales, (before, after) = teleport(
        params, loss_fn, batch, steps=steps, step_size=step_size, return_objective=True
    )
    assert np.isfinite(after) and after >= before
    assert all(np.all(np.isfinite(s)) and np.all(s > 0) for s in scales)


def test_steps_zero_and_degenerate_gradients_leave_params():
    params, batch = _data(0, np.float32)
    new, scales = teleport(params, loss_fn, batch, steps=0)
    np.testing.assert_array_equal(scales[0], np.ones(H))
    for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(a, b)
    for fill in (0.0, np.nan, np.inf):
        grads = jax.tree.map(lambda v, fill=fill: jnp.full_like(v, fill), params)
        new, scales = teleport(params, None, batch, grads=grads)
        np.testing.assert_array_equal(scales[0], np.ones(H))
        for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(params), strict=True):
            np.testing.assert_array_equal(a, b)


def test_overflowing_teleport_is_not_applied():
    """Huge consumer weights and a gradient only on the producers: unbounded ascent shrinks the
    units until the consumers overflow float32 while J stays finite; the teleport is refused."""
    params, batch = _data(0, np.float32)
    params["Dense_1"]["kernel"] = jnp.full((H, OUT), 1e30, jnp.float32)
    grads = jax.tree.map(jnp.zeros_like, params)
    grads["Dense_0"]["kernel"] = jnp.full((D, H), 1e-12, jnp.float32)
    kw = {"steps": 3, "step_size": 25 / (2 * D * 1e-24), "grads": grads}  # u_1 = -25: s ~ 1e-11
    new, scales = teleport(params, None, batch, max_scale=None, **kw)
    np.testing.assert_array_equal(scales[0], np.ones(H))
    for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(a, b)
    new, scales = teleport(params, None, batch, **kw)  # within the default box it moves
    np.testing.assert_allclose(scales[0], np.full(H, 1 / 16), rtol=1e-6)
    assert all(np.all(np.isfinite(v)) for v in jax.tree.leaves(new))


def test_jit_equals_eager():
    params, batch = _data(5, np.float32)
    eager = teleport(params, loss_fn, batch, steps=4)
    jitted = jax.jit(lambda p, b: teleport(p, loss_fn, b, steps=4))(params, batch)
    for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_half_precision_rescales_by_powers_of_two(dtype):
    params, batch = _data(6)
    params = jax.tree.map(lambda v: v.astype(dtype), params)
    batch = tuple(v.astype(dtype) for v in batch)
    new, scales = teleport(params, loss_fn, batch, step_size=0.5)
    log2 = np.log2(np.asarray(scales[0], np.float64))
    np.testing.assert_array_equal(log2, np.round(log2))
    assert np.any(log2 != 0) and np.all(np.abs(log2) <= 4)
    assert all(a.dtype == dtype for a in jax.tree.leaves(new))
    # exact rescaling: undoing it gives the params back bit for bit
    back = multipliers(params, chain(params), scales)
    undone = jax.tree.map(
        lambda w, m: w if m is None else (w.astype(jnp.float32) / m).astype(dtype),
        new,
        back,
        is_leaf=lambda v: v is None,
    )
    for a, b in zip(jax.tree.leaves(undone), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    # and the network computes the same numbers: every term is scaled by an exact power of two
    np.testing.assert_array_equal(np.float32(loss_fn(new, batch)), np.float32(loss_fn(params, batch)))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"steps": -1}, "steps must be >= 0"),
        ({"steps": 2.5}, "steps must be an integer"),
        ({"steps": True}, "steps must be an integer"),
        ({"step_size": 0.0}, "step_size must be a finite number > 0"),
        ({"step_size": -1.0}, "step_size"),
        ({"step_size": float("nan")}, "step_size"),
        ({"step_size": "big"}, "step_size"),
        ({"objective": "loss"}, "objective must be one of"),
        ({"objective": 3}, "objective"),
        ({"max_scale": 1.0}, "max_scale must be > 1"),
        ({"power_of_two": "yes"}, "power_of_two"),
        ({"return_objective": 1}, "return_objective"),
    ],
)
def test_bad_arguments(kwargs, match):
    params, batch = _data(0, np.float32)
    with pytest.raises(ValueError, match=match):
        teleport(params, loss_fn, batch, **kwargs)


def test_bad_call_arguments():
    params, batch = _data(0, np.float32)
    with pytest.raises(ValueError, match="loss_fn must be a callable"):
        teleport(params, None, batch)
    with pytest.raises(ValueError, match="grads must have the structure"):
        teleport(params, None, batch, grads={"Dense_0": params["Dense_0"]})
    with pytest.raises(ValueError, match="objective must return a scalar"):
        teleport(params, None, batch, objective=lambda p, b: p["Dense_0"]["bias"])
    with pytest.raises(ValueError, match="log_scales"):
        teleport_objective(params, loss_fn, batch, (jnp.zeros(H + 1),))


# ----------------------------------------------------------------------------------------------
# The optax wrapper


OPTIMIZERS = {
    "sgd": lambda: optax.sgd(0.05),
    "momentum": lambda: optax.sgd(0.05, momentum=0.9),
    "adam": lambda: optax.adam(1e-2),
    "inject": lambda: optax.inject_hyperparams(optax.adamw)(learning_rate=1e-2, weight_decay=1e-3),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_wrapper_is_teleport_then_inner_step_with_enorm_state_transport(x64, name):
    """A teleporting update = teleport (on the incoming gradient), transport inner's state with
    rescale_state(multipliers(...)) (the table jaxnorm.optim.enorm uses), inner step at T(w) on g/m."""
    params, batch = _data(7)
    spec = chain(params)
    kw = {"steps": 6, "step_size": 0.05}
    inner, tx = OPTIMIZERS[name](), teleportation(OPTIMIZERS[name](), every=2, **kw)
    inner_state, state = inner.init(params), tx.init(params)
    ref, got = params, params
    for step in range(1, 5):
        g = jax.grad(loss_fn)(got, batch)
        updates, state = tx.update(g, state, got)
        new = optax.apply_updates(got, updates)
        if step % 2 == 0:
            moved, scales = teleport(ref, loss_fn, batch, spec, **kw)
            m = multipliers(ref, spec, scales)
            inner_state = rescale_state(inner_state, m)
            g_ref = jax.tree.map(
                lambda a, f: a if f is None else a / f,
                jax.grad(loss_fn)(ref, batch),
                m,
                is_leaf=lambda v: v is None,
            )
            np.testing.assert_allclose(state.junction_scales[0], scales[0], rtol=1e-12)
            assert not np.allclose(scales[0], 1.0)
        else:
            moved, g_ref = ref, jax.grad(loss_fn)(ref, batch)
        u, inner_state = inner.update(g_ref, inner_state, moved)
        ref = optax.apply_updates(moved, u)
        for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(ref), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-14)
        for a, b in zip(jax.tree.leaves(state.inner_state), jax.tree.leaves(inner_state), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-14)
        got = new


def test_momentum_times_weight_is_invariant_under_the_transport(x64):
    """Eq. 10: mu * w is the same before and after a teleport (mu / m times w * m)."""
    params, batch = _data(8)
    tx = teleportation(optax.sgd(0.05, momentum=0.9), every=2, steps=5, step_size=0.05)
    state = tx.init(params)
    g = jax.grad(loss_fn)(params, batch)
    _, state = tx.update(g, state, params)  # step 1: plain, fills the momentum
    mu_before = state.inner_state[0].trace
    spec = chain(params)
    moved, scales = teleport(params, loss_fn, batch, spec, steps=5, step_size=0.05)
    mu_after = rescale_state(state.inner_state, multipliers(params, spec, scales))[0].trace
    for a, w, b, v in zip(*map(jax.tree.leaves, (mu_before, params, mu_after, moved)), strict=True):
        np.testing.assert_allclose(a * w, b * v, rtol=1e-12, atol=1e-16)


@pytest.mark.parametrize("every,until", [(1, None), (3, None), (2, 5)])
def test_wrapper_cadence(every, until):
    params, batch = _data(9, np.float32)
    inner = optax.adam(1e-2)
    tx = teleportation(optax.adam(1e-2), every=every, until=until, step_size=0.05)
    state = tx.init(params)

    @jax.jit
    def step(p, s):
        g = jax.grad(loss_fn)(p, batch)
        u, s_new = tx.update(g, s, p)
        u_plain, _ = inner.update(g, s.inner_state, p)
        return optax.apply_updates(p, u), s_new, u, u_plain

    for k in range(1, 9):
        params, new_state, u, u_plain = step(params, state)
        assert int(new_state.count) == k
        if k % every == 0 and (until is None or k <= until):  # teleports: moves off inner's update
            assert float(new_state.objective[1]) > float(new_state.objective[0]) > 0
            assert any(
                not np.allclose(a, b)
                for a, b in zip(jax.tree.leaves(u), jax.tree.leaves(u_plain), strict=True)
            )
        else:  # inner's update bit for bit, the record of the last teleport kept
            for a, b in zip(jax.tree.leaves(u), jax.tree.leaves(u_plain), strict=True):
                np.testing.assert_array_equal(a, b)
            for a, b in zip(jax.tree.leaves(new_state[2:]), jax.tree.leaves(state[2:]), strict=True):
                np.testing.assert_array_equal(a, b)
        state = new_state


def test_wrapper_in_chain_with_callable_objective_and_batch():
    params, batch = _data(10, np.float32)
    gnorm = lambda p, b: sum(jnp.sum(g**2) for g in jax.tree.leaves(jax.grad(loss_fn)(p, b)))
    tx = optax.chain(teleportation(optax.sgd(0.05), every=1, objective=gnorm, steps=4, step_size=0.05))
    state = tx.init(params)
    g = jax.grad(loss_fn)(params, batch)
    updates, state = tx.update(g, state, params, batch=batch)
    ref = teleportation(optax.sgd(0.05), every=1, steps=4, step_size=0.05)
    ref_updates, ref_state = ref.update(g, ref.init(params), params)
    np.testing.assert_allclose(state[0].junction_scales[0], ref_state.junction_scales[0], rtol=1e-4)
    # float32 through two differently written objectives: 2e-4 relative on an entry of 0.013 on some
    # CPUs, so the tolerance is relative to the update's scale
    for a, b in zip(jax.tree.leaves(updates), jax.tree.leaves(ref_updates), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * float(np.max(np.abs(b))))
    with pytest.raises(ValueError, match="needs the batch"):
        tx.update(g, state, params)
    with pytest.raises(ValueError, match="needs the params"):
        tx.update(g, state)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"every": 0}, ValueError, "every"),
        ({"every": 1.5}, ValueError, "every"),
        ({"every": 2, "until": 0}, ValueError, "until"),
        ({"every": 1, "steps": -1}, ValueError, "steps must be >= 0"),
        ({"every": 1, "step_size": 0.0}, ValueError, "step_size"),
        ({"every": 1, "step_size": -0.1}, ValueError, "step_size"),
        ({"every": 1, "objective": "sharpness"}, ValueError, "objective must be one of"),
        ({"every": 1, "max_scale": 0.5}, ValueError, "max_scale"),
        ({"every": 1, "power_of_two": 1}, ValueError, "power_of_two"),
    ],
)
def test_wrapper_bad_arguments_at_construction(kwargs, error, match):
    with pytest.raises(error, match=match):
        teleportation(optax.sgd(0.1), **kwargs)
    with pytest.raises(TypeError, match="inner"):
        teleportation("sgd", every=1)
    with pytest.raises(TypeError):
        teleportation(optax.sgd(0.1))  # every is required


class Net(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(D, H, rngs=rngs)
        self.l2 = nnx.Linear(H, OUT, rngs=rngs)

    def __call__(self, x):
        return self.l2(jax.nn.relu(self.l1(x)))


def _pure_loss(params, batch):
    x, y = batch
    h = jax.nn.relu(x @ params["l1"]["kernel"] + params["l1"]["bias"])
    return jnp.mean((h @ params["l2"]["kernel"] + params["l2"]["bias"] - y) ** 2)


@pytest.mark.parametrize("name", ["momentum", "adam"])
def test_nnx_optimizer_matches_pure_dict(name):
    _, batch = _data(11, np.float32)
    model = Net(nnx.Rngs(0))
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    tx = lambda: teleportation(OPTIMIZERS[name](), every=2, steps=5, step_size=0.05)
    optimizer = nnx.Optimizer(model, tx(), wrt=nnx.Param)
    ref_tx = tx()
    ref_state = ref_tx.init(params)

    @nnx.jit
    def nnx_step(model, optimizer):
        grads = nnx.grad(lambda m: jnp.mean((m(batch[0]) - batch[1]) ** 2))(model)
        optimizer.update(model, grads)

    for _ in range(4):
        nnx_step(model, optimizer)
        g = jax.grad(_pure_loss)(params, batch)
        u, ref_state = ref_tx.update(g, ref_state, params)
        params = optax.apply_updates(params, u)
    got = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(params), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    state = optimizer.opt_state
    assert isinstance(nnx.as_pure(state), TeleportationState) or hasattr(state, "junction_scales")
    np.testing.assert_allclose(nnx.as_pure(state.junction_scales)[0], ref_state.junction_scales[0], rtol=1e-5)
    assert not np.allclose(ref_state.junction_scales[0], 1.0)


def test_teleport_on_nnx_state_keeps_the_container(x64):
    model = Net(nnx.Rngs(1))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    _, batch = _data(12)
    loss = lambda p, b: jnp.mean((nnx.merge(graphdef, p, rest)(b[0]) - b[1]) ** 2)
    batch = tuple(v.astype(jnp.float32) for v in batch)
    new, scales = teleport(params, loss, batch, step_size=0.05)
    assert isinstance(new, nnx.State)
    np.testing.assert_allclose(loss(new, batch), loss(params, batch), rtol=1e-5)
    assert not np.allclose(scales[0], 1.0)
