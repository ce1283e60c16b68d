"""Optimizer registry: schedules against closed forms, weight-decay masks, wrappers, accumulation."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxnorm.train import optimizers as opt


def _lrs(config, total, steps):
    schedule = opt.make_schedule(config, total)
    return np.array([float(schedule(s)) for s in steps])


def test_step_schedule_decays_at_fractions():
    config = {"learning_rate": 0.1, "schedule": "step", "boundaries": (0.5, 0.75), "decay_factor": 0.1}
    lrs = _lrs(config, 100, [0, 49, 50, 74, 75, 99])
    np.testing.assert_allclose(lrs, [0.1, 0.1, 0.01, 0.01, 0.001, 0.001], rtol=1e-6)


@pytest.mark.parametrize(
    ("name", "oracle"),
    [
        ("cosine", lambda t, lr, end: end + (lr - end) * 0.5 * (1 + math.cos(math.pi * t))),
        ("linear", lambda t, lr, end: end + (lr - end) * (1 - t)),
        ("quadratic", lambda t, lr, end: end + (lr - end) * (1 - t) ** 2),
    ],
)
def test_decay_schedules_match_closed_forms(name, oracle):
    lr, end, total, warmup = 0.2, 0.002, 60, 10
    config = {"learning_rate": lr, "schedule": name, "end_value": end, "warmup_steps": warmup}
    steps = [0, 5, 10, 25, 40, 59, 60]
    expected = [
        lr * s / warmup if s < warmup else oracle(min((s - warmup) / (total - warmup), 1), lr, end)
        for s in steps
    ]
    np.testing.assert_allclose(_lrs(config, total, steps), expected, rtol=1e-5, atol=1e-7)


def _params():
    return {
        "conv_0": {"kernel": jnp.ones((3, 3, 2, 4)), "bias": jnp.ones(4)},
        "bn_0": {"scale": jnp.ones(4), "bias": jnp.ones(4)},
        "head": {"kernel": jnp.ones((4, 10)), "bias": jnp.ones(10)},
        "final_bn": {"scale": jnp.ones(10), "bias": jnp.ones(10)},
    }


@pytest.mark.parametrize(
    ("name", "selected"),
    [
        (
            "all",
            {
                "conv_0/kernel",
                "conv_0/bias",
                "bn_0/scale",
                "bn_0/bias",
                "head/kernel",
                "head/bias",
                "final_bn/scale",
                "final_bn/bias",
            },
        ),
        ("kernels", {"conv_0/kernel", "head/kernel"}),
        ("bn_scales", {"bn_0/scale", "final_bn/scale"}),
        ("kernels_and_bn_scales", {"conv_0/kernel", "head/kernel", "bn_0/scale", "final_bn/scale"}),
        ("last_layer", {"head/kernel", "head/bias"}),
        ("last_kernel", {"head/kernel"}),
        ("hidden_kernels", {"conv_0/kernel"}),
    ],
)
def test_weight_decay_masks(name, selected):
    mask = opt.weight_decay_mask(name)(_params())
    flat = {"/".join(k.key for k in path): v for path, v in jax.tree_util.tree_leaves_with_path(mask)}
    assert {k for k, v in flat.items() if v} == selected


def test_weight_decay_applies_only_to_masked_leaves():
    config = {"name": "sgd", "learning_rate": 1.0, "weight_decay": 0.5, "weight_decay_mask": "bn_scales"}
    tx, _ = opt.make_optimizer(config, 10)
    params = _params()
    zeros = jax.tree.map(jnp.zeros_like, params)
    updates, _ = tx.update(zeros, tx.init(params), params)
    assert float(updates["bn_0"]["scale"][0]) == pytest.approx(-0.5)
    assert float(jnp.abs(updates["conv_0"]["kernel"]).max()) == 0.0


@pytest.mark.parametrize("name", opt.OPTIMIZERS)
def test_every_optimizer_minimises_a_quadratic(name):
    tx, _ = opt.make_optimizer({"name": name, "learning_rate": 0.05, "weight_decay": 1e-4}, 200)
    params = {"w": jnp.array([3.0, -2.0])}
    state = tx.init(params)
    for _ in range(200):
        grads = jax.grad(lambda p: jnp.sum(p["w"] ** 2))(params)
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
    assert float(jnp.abs(params["w"]).max()) < 0.5


def test_nesterov_differs_from_momentum():
    def first_two_steps(name):
        tx, _ = opt.make_optimizer({"name": name, "learning_rate": 0.1}, 10)
        params, state = {"w": jnp.ones(())}, None
        state = tx.init(params)
        for _ in range(2):
            updates, state = tx.update({"w": jnp.ones(())}, state, params)
            params = optax.apply_updates(params, updates)
        return float(params["w"])

    # momentum 0.9: 1 - 0.1 - 0.19 = 0.71; nesterov: 1 - 0.19 - 0.271 = 0.539
    assert first_two_steps("momentum") == pytest.approx(0.71)
    assert first_two_steps("nesterov") == pytest.approx(0.539)


def test_accumulation_averages_micro_batches():
    tx, _ = opt.make_optimizer({"name": "sgd", "learning_rate": 1.0, "accumulate_steps": 2}, 10)
    params = {"w": jnp.zeros(())}
    state = tx.init(params)
    u1, state = tx.update({"w": jnp.array(1.0)}, state, params)
    assert float(u1["w"]) == 0.0
    u2, state = tx.update({"w": jnp.array(3.0)}, state, params)
    assert float(u2["w"]) == pytest.approx(-2.0)


def test_schedule_counts_updates_not_micro_steps():
    config = {"learning_rate": 1.0, "schedule": "linear", "accumulate_steps": 4}
    _, schedule = opt.make_optimizer(config, 40)
    assert float(opt.learning_rate(schedule, jnp.array(20), 4)) == pytest.approx(0.5)


def test_wrapper_wrs_is_chained_last():
    config = {
        "name": "sgd",
        "learning_rate": 0.1,
        "wrappers": ("wrs",),
        "wrapper_kwargs": {"wrs": {"tau": 1}},
    }
    tx, _ = opt.make_optimizer(config, 10)
    params = {"dense": {"kernel": jnp.full((3, 2), 2.0)}}
    updates, _ = tx.update({"dense": {"kernel": jnp.ones((3, 2))}}, tx.init(params), params)
    new = optax.apply_updates(params, updates)
    np.testing.assert_allclose(jnp.linalg.norm(new["dense"]["kernel"], axis=0), 1.0, rtol=1e-5)


def test_wrapper_wrs_state_rescales_the_momentum():
    config = {
        "name": "momentum",
        "learning_rate": 0.1,
        "momentum": 0.9,
        "wrappers": ("wrs_state",),
        "wrapper_kwargs": {"wrs_state": {"tau": 1}},
    }
    tx, _ = opt.make_optimizer(config, 10)
    params = {"dense": {"kernel": jnp.full((3, 2), 2.0)}}
    grads = {"dense": {"kernel": jnp.ones((3, 2))}}
    updates, state = tx.update(grads, tx.init(params), params)
    new = optax.apply_updates(params, updates)
    norms = jnp.linalg.norm(new["dense"]["kernel"], axis=0)
    np.testing.assert_allclose(norms, 1.0, rtol=1e-5)
    # w' = w / s with s the pre-rescaling norm: the momentum (a gradient accumulator) is multiplied by s
    s = jnp.linalg.norm(params["dense"]["kernel"] - 0.1 * grads["dense"]["kernel"], axis=0)
    trace = jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, optax.TraceState))
    trace = next(t for t in trace if isinstance(t, optax.TraceState)).trace["dense"]["kernel"]
    np.testing.assert_allclose(trace, grads["dense"]["kernel"] * s, rtol=1e-5)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"name": "lamb"}, "optimizer.name must be one of"),
        ({"schedule": "exp"}, "optimizer.schedule must be one of"),
        ({"weight_decay_mask": "bias"}, "optimizer.weight_decay_mask must be one of"),
        ({"wrappers": ("lars",)}, "optimizer.wrappers entry must be one of"),
        ({"schedule": "step", "boundaries": (30,)}, "fractions of the run"),
        ({"accumulate_steps": 0}, "accumulate_steps must be >= 1"),
        ({"warmup_steps": 10}, "warmup_steps must be in"),
    ],
)
def test_bad_configs_name_the_choice(config, message):
    with pytest.raises(ValueError, match=message):
        opt.make_optimizer(config, 10)


def test_bad_wrapper_configs_give_clear_errors():
    with pytest.raises(ValueError, match=r"optimizer\.wrappers entry must be one of .*'wrs'"):
        opt.make_optimizer({"wrappers": ("wrss",)}, 10)
    with pytest.raises(ValueError, match=r"wrapper_kwargs\.wrs: .*'taus'"):
        opt.make_optimizer({"wrappers": ("wrs",), "wrapper_kwargs": {"wrs": {"taus": 3}}}, 10)
    with pytest.raises(
        ValueError, match=r"wrapper_kwargs\.wrs\.mask must be one of \('kernels', 'scale_invariant'\)"
    ):
        opt.make_optimizer({"wrappers": ("wrs",), "wrapper_kwargs": {"wrs": {"mask": "convs"}}}, 10)
    with pytest.raises(
        ValueError, match=r"'norm_schedule' with mask 'scale_invariant' needs .*scale_invariant_mask="
    ):
        opt.make_optimizer({"wrappers": ("norm_schedule",)}, 10)
    mimic = {"wrappers": ("wd_mimicry",), "wrapper_kwargs": {"wd_mimicry": {"reference": "wd"}}}
    with pytest.raises(ValueError, match=r"'wd_mimicry' needs the reference run's recorded norms"):
        opt.make_optimizer(mimic, 10, scale_invariant_mask={"w": True})
    with pytest.raises(ValueError, match=r"wrapper_kwargs\.wd_mimicry: .*'reference'"):
        opt.make_optimizer({"wrappers": ("wd_mimicry",)}, 10, checking=True)
    # checking: a config whose model and reference run do not exist yet passes
    opt.make_optimizer(mimic, 10, checking=True)


def _window_sgd(**window):
    config = {
        "name": "sgd",
        "learning_rate": 1.0,
        "wrappers": ("window",),
        "wrapper_kwargs": {"window": window},
    }
    return opt.make_optimizer(config, 10)[0]


def test_window_wrapper_wd_acts_only_inside_its_window():
    tx = _window_sgd(kind="wd", start=1, end=3, weight_decay=0.1)
    params = {"dense": {"kernel": jnp.ones((2, 3)), "bias": jnp.ones(3)}}
    state = tx.init(params)
    kernels = []
    for _ in range(4):
        zero = jax.tree.map(jnp.zeros_like, params)
        updates, state = tx.update(zero, state, params)
        params = optax.apply_updates(params, updates)
        kernels.append(float(params["dense"]["kernel"][0, 0]))
    np.testing.assert_allclose(kernels, [1.0, 0.9, 0.81, 0.81], rtol=1e-6)
    np.testing.assert_array_equal(params["dense"]["bias"], 1.0)  # not a kernel: no decay


def test_window_wrapper_wrs_rescales_only_inside_its_window():
    tx = _window_sgd(kind="wrs", start=2, end=3, tau=1)
    params = {"w": jnp.full((3, 2), 2.0)}
    state = tx.init(params)
    norms = []
    for _ in range(4):
        updates, state = tx.update({"w": jnp.ones((3, 2))}, state, params)
        params = optax.apply_updates(params, updates)
        norms.append(float(jnp.linalg.norm(params["w"][:, 0])))
    # w = 2 - k per element outside the window; update 2 (inside) rescales w = -1 to -1/sqrt(3).
    np.testing.assert_allclose(norms, [np.sqrt(3), 0.0, 1.0, np.sqrt(3) + 1], rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match=r"window\.kind must be one of \('wd', 'wrs'\)"):
        _window_sgd(kind="l1", start=0, end=1)
    with pytest.raises(ValueError, match="start < end"):
        _window_sgd(kind="wd", start=3, end=3)
