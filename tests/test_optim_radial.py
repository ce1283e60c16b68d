"""AdamP / SGDP / radial_projection (Heo et al., ICLR 2021) against a float64 NumPy re-implementation of
the authors' algorithm (written per unit with loops, on the kernel-last layout), plus the properties the
paper is about: a projected update has no radial part, and on a scale-invariant loss the weight norm
grows far less than under Adam."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxnorm

OPT = jaxnorm.optim
RNG = np.random.default_rng(0)
PARAMS = {
    "a": RNG.normal(size=(6, 4)).astype(np.float32),  # gets gradients orthogonal to each unit: projected
    "b": RNG.normal(size=(3, 3, 2, 5)).astype(np.float32),  # random gradients
    "bias": RNG.normal(size=(4,)).astype(np.float32),
}


def orthogonal_grad(w, r):
    """``r`` minus its component along each unit ``w[..., j]`` (a scale-invariant loss's gradient)."""
    w2, r2 = w.reshape(-1, w.shape[-1]), r.reshape(-1, w.shape[-1])
    coef = (w2 * r2).sum(0) / (w2 * w2).sum(0)
    return (r2 - coef * w2).reshape(w.shape)


def gradients(params, step):
    rng = np.random.default_rng(100 + step)
    a = np.asarray(params["a"], np.float64)
    return {
        "a": orthogonal_grad(a, rng.normal(size=a.shape)),
        "b": rng.normal(size=params["b"].shape),
        "bias": rng.normal(size=params["bias"].shape),
    }


# --- the float64 oracle: the authors' code, written out per unit --------------------------------------


def _views(w):
    """(rows, dim) views: units (one row per output unit) and layer (one row)."""
    units = np.stack([w[..., j].ravel() for j in range(w.shape[-1])])
    return units, w.ravel()[None, :]


def _oracle_projection(w, g, u, delta, eps, mask):
    if w.ndim < 2 or mask is False:
        return u, False
    for view_index in (0, 1):
        if mask is True and view_index == 1:
            break
        wv, gv = _views(w)[view_index], _views(g)[view_index]
        cos = [
            abs(x @ y) / (max(np.linalg.norm(x), eps) * max(np.linalg.norm(y), eps))
            for x, y in zip(gv, wv, strict=True)
        ]
        if mask is True or max(cos) < delta / math.sqrt(wv.shape[1]):
            uv = _views(u)[view_index].copy()
            for row in range(wv.shape[0]):
                wn = wv[row] / (np.linalg.norm(wv[row]) + eps)
                uv[row] -= wn * (wn @ uv[row])
            if view_index == 0:
                out = np.stack([uv[j].reshape(w.shape[:-1]) for j in range(w.shape[-1])], axis=-1)
            else:
                out = uv.reshape(w.shape)
            return out, True
    return u, False


def oracle(
    kind,
    steps,
    lr,
    wd,
    nesterov,
    mask=None,
    momentum=0.9,
    b1=0.9,
    b2=0.999,
    eps=1e-8,
    delta=0.1,
    ratio=0.1,
    decay=None,
):
    params = {k: v.astype(np.float64) for k, v in PARAMS.items()}
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v2 = {k: np.zeros_like(v) for k, v in params.items()}
    for t in range(1, steps + 1):
        grads = gradients(params, t)
        for k in params:
            g = grads[k]
            if kind == "adamp":
                m[k] = b1 * m[k] + (1 - b1) * g
                v2[k] = b2 * v2[k] + (1 - b2) * g * g
                denom = np.sqrt(v2[k]) / math.sqrt(1 - b2**t) + eps
                step_size = lr / (1 - b1**t)
                perturb = (b1 * m[k] + (1 - b1) * g) / denom if nesterov else m[k] / denom
                factor = 1.0
            else:
                m[k] = momentum * m[k] + g
                perturb = g + momentum * m[k] if nesterov else m[k]
                step_size, factor = lr, 1.0 / (1 - momentum)
            leaf_mask = None if mask is None else mask[k]
            perturb, projected = _oracle_projection(params[k], g, perturb, delta, eps, leaf_mask)
            r = ratio if projected else 1.0
            leaf_wd = wd if decay is None or decay[k] else 0.0
            params[k] = params[k] * (1 - lr * leaf_wd * r * factor) - step_size * perturb
    return params


def run(tx, steps):
    params = {k: jnp.asarray(v) for k, v in PARAMS.items()}
    state = tx.init(params)
    update = jax.jit(tx.update)
    for t in range(1, steps + 1):
        grads = jax.tree.map(lambda g: jnp.asarray(g, jnp.float32), gradients(params, t))
        updates, state = update(grads, state, params)
        params = optax.apply_updates(params, updates)
    return params, state


MASK = {"a": True, "b": False, "bias": False}


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("mask", [None, MASK], ids=["cosine", "mask"])
@pytest.mark.parametrize("kind", ["adamp", "sgdp"])
def test_matches_float64_reimplementation_of_the_authors_algorithm(kind, mask, nesterov):
    lr, wd = (1e-2, 1e-2) if kind == "adamp" else (0.05, 1e-3)
    if kind == "adamp":
        tx = OPT.adamp(lr, weight_decay=wd, nesterov=nesterov, mask=mask)
    else:
        tx = OPT.sgdp(lr, momentum=0.9, weight_decay=wd, nesterov=nesterov, mask=mask)
    got, state = run(tx, 6)
    want = oracle(kind, 6, lr, wd, nesterov, mask)
    for k in want:
        np.testing.assert_allclose(np.asarray(got[k]), want[k], rtol=2e-5, atol=2e-6, err_msg=k)
    # 'a' gets scale-invariant gradients: projected per unit; 'bias' (rank 1) never.
    assert int(state.projected["a"]) == OPT.PROJECTED_UNITS
    assert int(state.projected["bias"]) == OPT.NOT_PROJECTED


@pytest.mark.parametrize("callable_mask", [False, True])
@pytest.mark.parametrize("kind", ["adamp", "sgdp"])
def test_decay_mask_limits_weight_decay_to_its_leaves(kind, callable_mask):
    decay = {"a": True, "b": False, "bias": True}
    decay_mask = (lambda params: decay) if callable_mask else decay
    lr, wd = (1e-2, 0.5) if kind == "adamp" else (0.05, 0.05)
    if kind == "adamp":
        tx = OPT.adamp(lr, weight_decay=wd, decay_mask=decay_mask)
    else:
        tx = OPT.sgdp(lr, momentum=0.9, weight_decay=wd, decay_mask=decay_mask)
    got, _ = run(tx, 5)
    want = oracle(kind, 5, lr, wd, False, decay=decay)
    everywhere = oracle(kind, 5, lr, wd, False)
    for k in want:
        np.testing.assert_allclose(np.asarray(got[k]), want[k], rtol=2e-5, atol=2e-6, err_msg=k)
    assert not np.allclose(want["b"], everywhere["b"], rtol=1e-4)  # the mask made a difference


@pytest.mark.parametrize("build", [OPT.adamp, lambda **kw: OPT.sgdp(0.1, **kw)])
def test_bad_decay_masks_are_refused(build):
    with pytest.raises(ValueError, match="decay_mask must be None, a callable or a bool tree"):
        build(decay_mask={})
    params = {k: jnp.asarray(v) for k, v in PARAMS.items()}
    with pytest.raises(ValueError, match="decay_mask does not match the params tree"):
        build(decay_mask={"a": True}).init(params)
    with pytest.raises(TypeError, match="decay_mask leaves must be Python bools"):
        build(decay_mask={"a": True, "b": 1.0, "bias": False}).init(params)


def test_cosine_test_leaves_random_gradients_alone():
    """With random gradients on a large kernel the cosine is far above delta/sqrt(d): no projection, so
    SGDP is SGD with momentum there (and the oracle agrees on that choice)."""
    _, state = run(OPT.sgdp(0.05, momentum=0.9), 3)
    assert int(state.projected["b"]) == OPT.NOT_PROJECTED


def test_projected_update_has_no_radial_part():
    w = jnp.asarray(RNG.normal(size=(7, 3)), jnp.float32)
    u = jnp.asarray(RNG.normal(size=(7, 3)), jnp.float32)
    out, choice = OPT.project_radial(w, u, u, delta=0.1, eps=1e-8, selected=True)
    assert int(choice) == OPT.PROJECTED_UNITS
    np.testing.assert_allclose(np.sum(np.asarray(out) * np.asarray(w), axis=0), 0.0, atol=1e-5)
    # the tangential part is kept exactly
    w64, u64 = np.asarray(w, np.float64), np.asarray(u, np.float64)
    tangential = u64 - w64 * (w64 * u64).sum(0) / (w64 * w64).sum(0)
    np.testing.assert_allclose(np.asarray(out), tangential, rtol=1e-5, atol=1e-6)


def test_radial_projection_of_sgd_is_sgdp():
    """The wrapper over optax.sgd(lr, momentum) is SGDP without weight decay, in both modes."""
    for mask in (None, MASK):
        wrapped, _ = run(OPT.radial_projection(optax.sgd(0.05, momentum=0.9), mask=mask), 5)
        direct, _ = run(OPT.sgdp(0.05, momentum=0.9, mask=mask), 5)
        for k in direct:
            np.testing.assert_allclose(np.asarray(wrapped[k]), np.asarray(direct[k]), rtol=1e-6, atol=1e-7)


def test_scale_invariant_loss_norm_grows_only_at_second_order():
    """Heo et al., Sec. 3: on a scale-invariant loss momentum inflates ||w|| through the radial part of
    its update; with the projection every update is orthogonal to w, so ||w_T||^2 - ||w_0||^2 is exactly
    the sum of ||u_t||^2 (Pythagoras, no weight decay), and far below Adam's growth."""
    target = jnp.asarray(RNG.normal(size=(16, 8)), jnp.float32)

    def loss(w):
        unit = w / jnp.linalg.norm(w, axis=0, keepdims=True)
        return jnp.sum((unit - target) ** 2)

    def growth(tx):
        w = jnp.asarray(np.random.default_rng(7).normal(size=(16, 8)), jnp.float32)
        start = float(jnp.sum(w * w))
        state = tx.init(w)

        @jax.jit
        def step(w, state):
            updates, state = tx.update(jax.grad(loss)(w), state, w)
            return optax.apply_updates(w, updates), state, jnp.sum(updates * updates)

        second_order = 0.0
        for _ in range(100):
            w, state, squared = step(w, state)
            second_order += float(squared)
        return float(jnp.sum(w * w)) - start, second_order

    projected, second_order = growth(OPT.adamp(0.02))
    np.testing.assert_allclose(projected, second_order, rtol=2e-3)
    sgd, sgd_second_order = growth(optax.sgd(0.5, momentum=0.9))
    assert sgd > 1.5 * sgd_second_order, (sgd, sgd_second_order)  # momentum's radial part: first order
    sgdp, sgdp_second_order = growth(OPT.sgdp(0.5, momentum=0.9))
    np.testing.assert_allclose(sgdp, sgdp_second_order, rtol=2e-3)


def test_nnx_optimizer_matches_pure_params():
    """Inside nnx.Optimizer (nnx.State of Variables in, as nnx.grad gives) the steps equal those on the
    same numbers as a pure dict."""
    model = nnx.Linear(6, 4, rngs=nnx.Rngs(0))
    x = jnp.asarray(RNG.normal(size=(8, 6)), jnp.float32)
    tx = OPT.adamp(1e-2, weight_decay=1e-2, mask=lambda p: jax.tree.map(lambda w: jnp.ndim(w) == 2, p))
    opt = nnx.Optimizer(model, tx, wrt=nnx.Param)
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    pure_state = tx.init(params)
    for _ in range(3):
        grads = nnx.grad(lambda m: jnp.sum(jnp.tanh(m(x))))(model)
        updates, pure_state = tx.update(nnx.to_pure_dict(grads), pure_state, params)
        params = optax.apply_updates(params, updates)
        opt.update(model, grads)
    got = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    for name in ("kernel", "bias"):
        np.testing.assert_allclose(got[name], params[name], rtol=1e-6, atol=1e-7)
    assert int(opt.opt_state.projected["kernel"]) == OPT.PROJECTED_UNITS


@pytest.mark.parametrize("scale", [0.0, 1e-30, 1e20])
def test_degenerate_kernels_give_finite_updates(scale):
    params = {"w": jnp.full((5, 3), scale, jnp.float32), "z": jnp.zeros((4, 2), jnp.bfloat16)}
    grads = {"w": jnp.ones((5, 3), jnp.float32), "z": jnp.zeros((4, 2), jnp.bfloat16)}
    for tx in (
        OPT.adamp(1e-3, weight_decay=0.1),
        OPT.sgdp(0.1, 0.9, weight_decay=0.1),
        OPT.adamp(1e-3, mask={"w": True, "z": True}),
    ):
        updates, _ = tx.update(grads, tx.init(params), params)
        for leaf in jax.tree.leaves(updates):
            assert bool(jnp.all(jnp.isfinite(leaf.astype(jnp.float32))))
        assert updates["z"].dtype == jnp.bfloat16


@pytest.mark.parametrize(
    ("build", "name"),
    [
        (lambda: OPT.adamp(-1.0), "learning_rate"),
        (lambda: OPT.adamp("0.1"), "learning_rate"),
        (lambda: OPT.adamp(b1=1.0), "b1"),
        (lambda: OPT.adamp(b2=-0.1), "b2"),
        (lambda: OPT.adamp(eps=0.0), "eps"),
        (lambda: OPT.adamp(weight_decay=-1e-4), "weight_decay"),
        (lambda: OPT.adamp(delta=0.0), "delta"),
        (lambda: OPT.adamp(wd_ratio=1.5), "wd_ratio"),
        (lambda: OPT.adamp(nesterov="yes"), "nesterov"),
        (lambda: OPT.sgdp(0.1, momentum=1.0), "momentum"),
        (lambda: OPT.sgdp(0.1, dampening=2.0), "dampening"),
        (lambda: OPT.sgdp(float("nan")), "learning_rate"),
        (lambda: OPT.sgdp(0.1, wd_ratio=-0.1), "wd_ratio"),
        (lambda: OPT.radial_projection("sgd"), "inner"),
        (lambda: OPT.radial_projection(optax.sgd(0.1), delta=-1), "delta"),
        (lambda: OPT.adamp(mask={"w": True}).init({"w": jnp.ones(3)}), "w|mask"),
        (lambda: OPT.sgdp(0.1, mask={"x": True}).init({"w": jnp.ones((2, 2))}), "mask"),
    ],
)
def test_bad_arguments_are_refused_by_name(build, name):
    with pytest.raises((ValueError, TypeError), match=name):
        build()


def test_numpy_scalars_accepted():
    a, _ = run(OPT.adamp(np.float32(1e-2), b1=np.float64(0.9), weight_decay=np.float32(0.0)), 2)
    b, _ = run(OPT.adamp(1e-2, b1=0.9), 2)
    for k in a:
        np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]))


def test_adamp_bias_correction_in_float64_under_x64(x64):
    """float64 params: a leaf the projection leaves alone gets optax.adam's update to its eps (the
    bias correction ``1 - b2**t`` was taken in float32: 7.7e-6 relative off at t = 1)."""
    params, grads = {"b": jnp.array([1.0, -2.0, 0.5])}, {"b": jnp.array([0.3, 0.01, -2.0])}
    got, _ = jaxnorm.optim.adamp(1e-2).update(grads, jaxnorm.optim.adamp(1e-2).init(params), params)
    want, _ = optax.adam(1e-2).update(grads, optax.adam(1e-2).init(params), params)
    assert got["b"].dtype == jnp.float64
    np.testing.assert_allclose(np.asarray(got["b"]), np.asarray(want["b"]), rtol=1e-12)


@pytest.mark.parametrize("make", [lambda: jaxnorm.optim.adamp(1e-2), lambda: jaxnorm.optim.sgdp(0.1, 0.9)])
def test_state_can_be_donated_to_jit(make):
    """``mu`` and ``nu`` used to be one array per leaf: ``jit(..., donate_argnums)`` of the state (a
    flax ``TrainState`` step) failed with "donate the same buffer twice"."""
    params = {"k": jnp.ones((4, 3))}
    tx = make()
    state = tx.init(params)
    step = jax.jit(lambda p, s, g: tx.update(g, s, p), donate_argnums=(1,))
    updates, _ = step(params, state, jax.tree.map(jnp.ones_like, params))
    assert np.isfinite(np.asarray(updates["k"])).all()
