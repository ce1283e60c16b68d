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
        ValueError,
        match=r"wrapper_kwargs\.wrs\.mask must be one of \('kernels', 'hidden_kernels', 'scale_invariant'\)",
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


def _bn_params():
    key = jax.random.key(0)
    k1, k2, k3 = jax.random.split(key, 3)
    return {
        "dense_0": {"kernel": jax.random.normal(k1, (6, 4))},
        "dense_0_norm": {"scale": jnp.full(4, 1.5), "bias": jnp.full(4, 0.3)},
        "head": {"kernel": jax.random.normal(k2, (4, 3)), "bias": jax.random.normal(k3, (3,))},
    }


def _grads(params, seed=1):
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return treedef.unflatten([jax.random.normal(k, p.shape) for k, p in zip(keys, leaves, strict=True)])


def _run(tx, params, steps=3):
    state = tx.init(params)
    for t in range(steps):
        updates, state = tx.update(_grads(params, t), state, params)
        params = optax.apply_updates(params, updates)
    return params


@pytest.mark.parametrize("name", ["adamp", "sgdp"])
def test_radial_optimizers_decay_only_the_weight_decay_mask(name):
    # AdamP / SGDP act leaf by leaf, so the registry's run with weight decay on the kernels equals, per
    # leaf, a run with decay on every leaf (kernels) and one without decay (the other leaves).
    config = {"name": name, "learning_rate": 0.05, "weight_decay": 0.3, "weight_decay_mask": "kernels"}
    tx, _ = opt.make_optimizer(config, 10)
    got = _run(tx, _bn_params())
    build = optim_fn(name)
    decayed, plain = _run(build(0.05, 0.3), _bn_params()), _run(build(0.05, 0.0), _bn_params())
    for path in (("dense_0", "kernel"), ("head", "kernel")):
        np.testing.assert_allclose(_at(got, path), _at(decayed, path), rtol=1e-6)
    for path in (("dense_0_norm", "scale"), ("dense_0_norm", "bias"), ("head", "bias")):
        np.testing.assert_allclose(_at(got, path), _at(plain, path), rtol=1e-6)
    assert not np.allclose(_at(decayed, ("dense_0_norm", "scale")), _at(plain, ("dense_0_norm", "scale")))


def optim_fn(name):
    from jaxnorm import optim

    if name == "adamp":
        return lambda lr, wd: optim.adamp(lr, weight_decay=wd)
    return lambda lr, wd: optim.sgdp(lr, momentum=0.9, weight_decay=wd)


def _at(tree, path):
    for key in path:
        tree = tree[key]
    return np.asarray(tree)


def test_adamwn_is_adamw_at_target_zero_and_pulls_to_the_target_norm():
    params = _bn_params()
    adamw = {"name": "adamw", "learning_rate": 0.01, "weight_decay": 0.5}
    adamwn = {**adamw, "name": "adamwn", "target_norm": 0.0}
    a, b = _run(opt.make_optimizer(adamw, 10)[0], params), _run(opt.make_optimizer(adamwn, 10)[0], params)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7), a, b)
    # zero gradients: ||w_j|| - r shrinks by (1 - lr wd) per step, every unit of every kernel
    tx, _ = opt.make_optimizer({**adamwn, "target_norm": 2.0, "learning_rate": 0.1}, 10)
    w = np.asarray(params["dense_0"]["kernel"], np.float64)
    state, p = tx.init(params), params
    for _ in range(3):
        updates, state = tx.update(jax.tree.map(jnp.zeros_like, p), state, p)
        p = optax.apply_updates(p, updates)
    expected = 2.0 + (np.linalg.norm(w, axis=0) - 2.0) * (1 - 0.1 * 0.5) ** 3
    np.testing.assert_allclose(np.linalg.norm(p["dense_0"]["kernel"], axis=0), expected, rtol=1e-5)


def test_sphere_projection_wrapper_puts_the_selected_units_on_the_sphere():
    config = {
        "name": "adam",
        "learning_rate": 0.1,
        "wrappers": ("sphere_projection",),
        "wrapper_kwargs": {"sphere_projection": {"target": "sqrt_fan_in", "mask": "hidden_kernels"}},
    }
    params = _run(opt.make_optimizer(config, 10)[0], _bn_params())
    np.testing.assert_allclose(np.linalg.norm(params["dense_0"]["kernel"], axis=0), np.sqrt(6), rtol=1e-5)
    assert not np.allclose(
        np.linalg.norm(params["head"]["kernel"], axis=0), 2.0, rtol=1e-2
    )  # classifier free
    config["wrapper_kwargs"] = {"sphere_projection": {"target": 2.0, "mask": "scale_invariant"}}
    mask = {"dense_0": {"kernel": False}, "dense_0_norm": {"scale": False, "bias": False}}
    mask["head"] = {"kernel": True, "bias": False}
    tx, _ = opt.make_optimizer(config, 10, scale_invariant_mask=mask)
    params = _run(tx, _bn_params())
    np.testing.assert_allclose(np.linalg.norm(params["head"]["kernel"], axis=0), 2.0, rtol=1e-5)


def test_radial_projection_wrapper_around_momentum_is_sgdp():
    from jaxnorm import optim

    config = {"name": "momentum", "learning_rate": 0.1, "momentum": 0.9, "wrappers": ("radial_projection",)}
    got = _run(opt.make_optimizer(config, 10)[0], _bn_params(), steps=4)
    expected = _run(optim.sgdp(0.1, momentum=0.9), _bn_params(), steps=4)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7), got, expected)


def test_decay_to_norm_wrapper_adds_the_pull_to_the_gradient():
    config = {
        "name": "sgd",
        "learning_rate": 0.5,
        "wrappers": ("decay_to_norm",),
        "wrapper_kwargs": {"decay_to_norm": {"weight_decay": 0.2, "target": 1.0}},
    }
    tx, _ = opt.make_optimizer(config, 10)
    params = _bn_params()
    updates, _ = tx.update(jax.tree.map(jnp.zeros_like, params), tx.init(params), params)
    w = np.asarray(params["dense_0"]["kernel"], np.float64)
    expected = -0.5 * 0.2 * (w - w / np.linalg.norm(w, axis=0))
    np.testing.assert_allclose(updates["dense_0"]["kernel"], expected, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(updates["head"]["bias"], 0.0)


def test_needs_scale_invariant_mask_for_the_new_entries():
    assert opt.needs_scale_invariant_mask({"name": "adamp", "projection_mask": "scale_invariant"})
    assert not opt.needs_scale_invariant_mask({"name": "adamp"})
    assert opt.needs_scale_invariant_mask(
        {
            "wrappers": ("sphere_projection",),
            "wrapper_kwargs": {"sphere_projection": {"mask": "scale_invariant"}},
        }
    )
    assert not opt.needs_scale_invariant_mask({"wrappers": ("sphere_projection", "decay_to_norm")})


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"name": "adamw", "delta": 0.1}, r"config\.optimizer\.delta is read only by optimizer\.name in"),
        ({"name": "adamp", "target_norm": 1.0}, r"config\.optimizer\.target_norm is read only by"),
        ({"name": "sgdp", "nesterov": 1}, r"config\.optimizer\.nesterov must be a bool"),
        ({"name": "adamp", "delta": "0.1"}, r"config\.optimizer\.delta must be a number"),
        ({"name": "adamp", "delta": -1.0}, r"optimizer \(name 'adamp'\): .*delta"),
        ({"name": "sgdp", "wd_ratio": 2.0}, r"optimizer \(name 'sgdp'\): .*wd_ratio"),
        ({"name": "adamp", "projection_mask": "convs"}, r"optimizer\.projection_mask must be one of"),
        ({"name": "adamwn", "weight_decay_mask": "all"}, r"optimizer\.weight_decay_mask \(adamwn"),
        ({"name": "adamwn", "target_norm": -1.0}, r"optimizer \(name 'adamwn'\): .*target"),
        (
            {"wrappers": ("sphere_projection",), "wrapper_kwargs": {"sphere_projection": {"target": -1}}},
            r"wrapper_kwargs\.sphere_projection: .*target",
        ),
        (
            {"wrappers": ("sphere_projection",), "wrapper_kwargs": {"sphere_projection": {"radius": 1}}},
            r"wrapper_kwargs\.sphere_projection: .*'radius'",
        ),
        (
            {"wrappers": ("radial_projection",), "wrapper_kwargs": {"radial_projection": {"mask": "all"}}},
            r"wrapper_kwargs\.radial_projection\.mask must be one of \('cosine'",
        ),
        ({"wrappers": ("decay_to_norm",)}, r"wrapper_kwargs\.decay_to_norm: .*'weight_decay'"),
        (
            {"wrappers": ("decay_to_norm",), "wrapper_kwargs": {"decay_to_norm": {"weight_decay": -1}}},
            r"wrapper_kwargs\.decay_to_norm: .*weight_decay",
        ),
    ],
)
def test_bad_scale_invariance_configs_name_the_key(config, message):
    with pytest.raises(ValueError, match=message):
        opt.make_optimizer(config, 10, checking=True)


def test_projection_mask_scale_invariant_needs_the_mask_outside_checking():
    config = {"name": "adamp", "projection_mask": "scale_invariant"}
    with pytest.raises(ValueError, match=r"optimizer\.projection_mask with mask 'scale_invariant' needs"):
        opt.make_optimizer(config, 10)
    opt.make_optimizer(config, 10, checking=True)


@pytest.mark.parametrize("model_name", ["resnet18", "wrn28_10", "vgg11", "mlp"])
def test_classifier_masks_select_the_head_of_every_model(model_name):
    """``last_layer`` / ``last_kernel`` / ``hidden_kernels`` select by the classifier's name: the "last
    module that owns a kernel" was read off the dict's key order, which JAX sorts whenever it rebuilds a
    tree (gradients, ``jit``): on ResNet / WRN (``{head, stage*, stem}``) the stem got the classifier's
    weight decay (cifar10_wrs's ResNet-18 BWN variant) and WRS skipped the stem."""
    from jaxnorm import models

    kwargs = {"width": 8} if model_name == "resnet18" else {}
    model = models.create(model_name, num_classes=10, norm="bn", **kwargs)
    shape = (1, 28, 28, 1) if model_name == "mlp" else (1, 32, 32, 3)
    params = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros(shape), train=False))["params"]
    rebuilt = jax.tree.map(lambda x: x, params)  # sorted keys, as under jit
    for tree in (params, rebuilt):
        flat = {"/".join(k.key for k in p): bool(v)
                for p, v in jax.tree_util.tree_leaves_with_path(opt.weight_decay_mask("last_kernel")(tree))}
        assert {k for k, v in flat.items() if v} == {"head/kernel"}, model_name
        hidden = opt.weight_decay_mask("hidden_kernels")(tree)
        assert not hidden["head"]["kernel"] and any(jax.tree.leaves(hidden))


def test_classifier_masks_without_a_head_take_the_last_auto_named_module():
    """Without a ``head``, flax's automatic names in natural order: ``Dense_11`` after ``Dense_9`` (the sorted
    keys put ``Dense_10`` and ``Dense_11`` before ``Dense_2``)."""
    params = {f"Dense_{i}": {"kernel": jnp.ones((3, 3)), "bias": jnp.zeros(3)} for i in range(12)}
    params["Conv_0"] = {"kernel": jnp.ones((3, 3, 1, 3))}
    for tree in (params, jax.tree.map(lambda x: x, params)):
        mask = opt.weight_decay_mask("last_kernel")(tree)
        assert [k for k, v in mask.items() if v["kernel"]] == ["Dense_11"]
    two_heads = {"a": {"head": {"kernel": jnp.ones((3, 2))}}, "b": {"head": {"kernel": jnp.ones((3, 2))}}}
    with pytest.raises(ValueError, match="2 modules named 'head'"):
        opt.weight_decay_mask("last_layer")(two_heads)


def test_step_boundaries_that_round_to_one_update_both_decay():
    """Boundaries (0.3, 0.6, 0.8) of a 3-update run round to updates 1, 2, 2: the dict of boundaries kept one
    of the two at update 2, and the run ended at lr / 100 instead of lr / 1000."""
    config = {"name": "sgd", "learning_rate": 1.0, "schedule": "step", "boundaries": (0.3, 0.6, 0.8)}
    _, schedule = opt.make_optimizer(config, 3)
    assert float(schedule(3)) == pytest.approx(1e-3)
